//! The executor: runs a training step (forward, loss, backward) following a solver schedule,
//! measures it, and checks its gradients.

pub mod alloc;
pub mod kernel;
pub mod kernels;
pub mod run;
#[cfg(test)]
pub mod testing;
pub mod validate;
pub mod value;
pub mod weights;
