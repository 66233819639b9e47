//! `remat-solver`: checkpoint scheduling as pure optimization.
//!
//! A [`Problem`] is a DAG of values in a topological order; a [`Schedule`] is a sequence of
//! `Compute` / `Free` steps; [`simulate`] is the one function that validates a schedule and
//! scores it. Every algorithm returns a schedule and every figure comes from `simulate`.
//!
//! Architecture invariant: this crate knows nothing of ONNX, tensors or HTTP.
//!
//! The modules are layered, each using only those above it:
//! `problem`, `schedule` (and `io`) → `baselines`, `dp`, `search`, `ilp` → `budget` → `plan`.

pub mod error;
pub mod io;
pub mod problem;
pub mod schedule;

pub use error::{Result, SolverError};
pub use problem::{Node, NodeId, NodeKind, Problem};
pub use schedule::{simulate, store_all, store_all_peak, with_frees, Schedule, Stats, Step};

// Schedule generators: the baselines, the chain DP, the local search over retention horizons.
pub mod baselines;
pub mod dp;
pub mod search;
// The exact MILP (Checkmate) through good_lp + HiGHS.
#[cfg(feature = "highs")]
mod highs_run;
#[cfg(feature = "highs")]
pub mod ilp;
// Budget tools on top of the generators: the minimum feasible budget, peak descent, pruning.
pub mod budget;
// Algorithm choice, the plan report, the budget sweep.
pub mod plan;
#[cfg(test)]
mod testutil;
