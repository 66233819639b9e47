//! The kernel registry: forward, extra and backward kernels per op type, in the same
//! families as the shape rules of `crate::ops`.

use super::kernel::{KResult, KernelCtx, KernelError, KernelRegistry};
use candle_core::Tensor;
use std::sync::OnceLock;

#[macro_use]
mod host;
pub(crate) use host::pool;
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

/// Input `i` of a kernel, if the node has it.
fn get(xs: &[Option<Tensor>], i: usize) -> Option<&Tensor> {
    xs.get(i).and_then(|t| t.as_ref())
}

/// Input `i`, which the op requires (`what` names it in the error).
fn req<'a>(xs: &'a [Option<Tensor>], i: usize, what: &str) -> KResult<&'a Tensor> {
    get(xs, i)
        .ok_or_else(|| KernelError::new(format!("{what} (input {i}) is required but missing")))
}

/// Whether the node has input `i` (an optional input may be left out).
fn present(cx: &KernelCtx, i: usize) -> bool {
    cx.inputs.get(i).is_some_and(|f| f.is_some())
}
