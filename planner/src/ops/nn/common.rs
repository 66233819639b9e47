//! Helpers the neural-network ops share.

use crate::error::Result;
use crate::ops::rule::{Ctx, GradRule, Saved};
use crate::tensor::Fact;

pub(in crate::ops) fn prod(v: &[u64]) -> f64 {
    v.iter().map(|&x| x as f64).product()
}

/// Input 0 as `[N, C, spatial...]`.
pub(in crate::ops) fn nchw<'a>(cx: &Ctx<'a>) -> Result<&'a Fact> {
    let x = cx.input(0)?;
    if x.rank() < 3 {
        return Err(cx.err(format!(
            "input must be [N, C, spatial...], got shape {:?}",
            x.shape
        )));
    }
    Ok(x)
}
/// Backward of a product-like op (conv, matmul): the weight-like operand is saved when the
/// data operand needs a gradient and vice versa.
pub(in crate::ops) fn product_grad(_: &Ctx, _: &[Fact], needs: &[bool]) -> GradRule {
    let mut s = vec![];
    if needs.get(1) == Some(&true) {
        s.push(Saved::Input(0));
    }
    if needs.first() == Some(&true) {
        s.push(Saved::Input(1));
    }
    GradRule::saves(s, 2.0)
}
pub(in crate::ops) fn in_elems(cx: &Ctx, _: &[Fact]) -> f64 {
    cx.in_numel(0)
}
