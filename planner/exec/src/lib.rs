//! `remat-exec`: the executor. It runs a training step (forward, loss, backward) of an imported
//! model following a solver schedule on candle-core tensors (CPU; CUDA behind the `cuda`
//! feature), keeps exactly the values the schedule keeps, measures every step's live bytes and
//! heap, and checks the gradients against the store-all run.
//!
//! The facade at the root is what callers need: [`Executor`] and [`ExecDevice`] to run a
//! schedule, [`validate()`] and [`Validation`] to prove a plan, [`Counting`] to install as the
//! binary's global allocator (a library cannot choose it) so the heap figures are measured.
//!
//! Architecture invariant: this crate knows nothing of HTTP or the plan store, and the
//! planner knows nothing of it (`cargo tree -p remat-planner` has no candle).

pub mod alloc;
#[cfg(test)]
mod conformance;
pub mod error;
pub mod kernel;
pub mod kernels;
pub mod run;
#[cfg(test)]
pub mod testing;
pub mod validate;
pub mod value;
pub mod weights;

pub use alloc::Counting;
pub use error::{ExecError, ExecFault, Result};
pub use run::{ExecDevice, Executor, RunResult};
pub use validate::{
    measured_costs, validate, validate_with, with_costs, ValidateOptions, Validation,
};
