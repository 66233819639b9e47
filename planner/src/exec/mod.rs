//! The executor: runs a training step (forward, loss, backward) following a solver schedule,
//! measures it, and checks its gradients.

pub mod kernel;
pub mod kernels;
#[cfg(test)]
pub mod testing;
pub mod value;
