//! The kernel registry: forward, extra and backward kernels per op type, in the same
//! families as the shape rules of `crate::ops`.

use super::kernel::KernelRegistry;
use std::sync::OnceLock;

#[macro_use]
mod host;
pub mod array;
pub mod attention;
pub mod elementwise;
pub mod nn;
pub mod reduce;
pub mod rnn;
pub mod signal;
pub mod spatial;

/// Every op with kernels.
pub fn registry() -> &'static KernelRegistry {
    static REG: OnceLock<KernelRegistry> = OnceLock::new();
    REG.get_or_init(|| {
        let mut r = KernelRegistry::new();
        elementwise::register(&mut r);
        reduce::register(&mut r);
        nn::register(&mut r);
        array::register(&mut r);
        rnn::register(&mut r);
        attention::register(&mut r);
        signal::register(&mut r);
        spatial::register(&mut r);
        r
    })
}
