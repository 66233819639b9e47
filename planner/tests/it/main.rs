//! The one integration-test binary of `remat-planner`.

mod build;
mod errors;
mod exec;
mod fixtures;
mod fuzz;
mod hostile;
mod ops;
mod shapes;
mod training;

/// The executor's tests read the real heap peak.
#[global_allocator]
static ALLOC: remat_planner::exec::alloc::Counting = remat_planner::exec::alloc::Counting;
