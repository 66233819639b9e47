//! Kernels (see `exec::kernel` for the contract).

use crate::exec::kernel::KernelRegistry;

pub fn register(_r: &mut KernelRegistry) {}
