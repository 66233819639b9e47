//! The one integration-test binary of `remat-solver` (one link of HiGHS for every test).
//!
//! Proptest keeps its regression seeds in `tests/proptest-regressions/<module>.txt`.

mod baselines;
mod bound;
mod cancel;
mod common;
mod ilp;
mod props;
mod sac_props;
mod store_all;
mod torch_graphs;
