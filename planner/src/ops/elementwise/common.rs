//! Helpers the elementwise ops share: boolean values, FLOPs per element, spec builders.

use crate::error::Result;
use crate::ops::rule::{none, Ctx, GradRule, OpSpec};
use crate::tensor::Fact;

pub(super) fn b(x: bool) -> i64 {
    i64::from(x)
}
pub(super) fn bf(x: bool) -> f64 {
    if x {
        1.0
    } else {
        0.0
    }
}
pub(super) fn per_elem(k: f64) -> impl Fn(&[Fact]) -> f64 {
    move |out: &[Fact]| out.iter().map(|f| f.numel() as f64).sum::<f64>() * k
}
/// Whether input `i` is present and computed at run time (not a constant known at import).
pub(super) fn computed(cx: &Ctx, i: usize) -> bool {
    cx.opt(i).is_some_and(|f| f.value.is_none())
}

/// An elementwise op from its shape rule, FLOPs and gradient rule (the other fields default).
pub(super) fn spec(
    infer: fn(&Ctx) -> Result<Vec<Fact>>,
    flops: fn(&Ctx, &[Fact]) -> f64,
    grad: fn(&Ctx, &[Fact], &[bool]) -> GradRule,
) -> OpSpec {
    OpSpec {
        infer,
        flops,
        grad,
        ..OpSpec::DEFAULT
    }
}

/// A comparison or logic op: boolean outputs, no gradient.
pub(super) fn logic(infer: fn(&Ctx) -> Result<Vec<Fact>>) -> OpSpec {
    OpSpec {
        infer,
        diff_in: none,
        diff_out: none,
        ..OpSpec::DEFAULT
    }
}
