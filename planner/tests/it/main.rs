//! The one integration-test binary of `remat-planner`.

mod build;
mod errors;
mod fixtures;
mod fuzz;
mod hostile;
mod ops;
mod shapes;
mod training;
