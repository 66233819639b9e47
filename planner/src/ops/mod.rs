//! The op registry: one place per op holding its shape rule (with constant folding of small
//! integer tensors), FLOP cost and gradient rule. Families live in their own files or folders,
//! like tract: `elementwise/{unary, binary}`, `nn/{conv, matmul, norm, pool, softmax, dropout,
//! einsum}`, `array/{view, index, pad, resize, source}`, `reduce`, `rnn`, `signal` (STFT, DFT,
//! windows, mel matrix), `attention` (opset 23 Attention, RMSNormalization, RotaryEmbedding),
//! `spatial/{pool, roi, grid, loss}` (Lp pooling, MaxUnpool, RoiAlign, Col2Im, CenterCropPad,
//! AffineGrid, GridSample, in-graph losses), `random`, `quant`, `linalg`. The executor's kernels
//! (`remat-exec`, `kernels/`) sit at the same relative paths. `schema` checks a node against
//! its op's ONNX schema (input count, attribute types, enumerated values) before its rule runs.

use std::sync::OnceLock;

pub mod array;
pub mod attention;
pub mod elementwise;
pub mod linalg;
pub mod nn;
pub mod quant;
pub mod random;
pub mod reduce;
pub mod rnn;
pub mod rule;
pub mod schema;
pub mod signal;
pub mod spatial;

pub use rule::{
    all, first, no_view, none, nonneg, nothing_saved, out_elems, save_x, save_y, view0, window_out,
    zero_flops, Ctx, GradRule, OpSpec, Registry, Saved, Window, INPUT_COPY_TAGS,
};

/// The registry of every supported op of the default ONNX domain.
pub fn registry() -> &'static Registry {
    static REG: OnceLock<Registry> = OnceLock::new();
    REG.get_or_init(|| {
        let mut r = Registry::new();
        elementwise::register(&mut r);
        nn::register(&mut r);
        array::register(&mut r);
        random::register(&mut r);
        quant::register(&mut r);
        linalg::register(&mut r);
        reduce::register(&mut r);
        rnn::register(&mut r);
        signal::register(&mut r);
        attention::register(&mut r);
        spatial::register(&mut r);
        r
    })
}
