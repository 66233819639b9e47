//! Helpers the spatial ops share.

use crate::error::Result;
use crate::ops::rule::{Ctx, GradRule, Saved};
use crate::tensor::Fact;

pub(super) fn save_x_and_y(_: &Ctx, _: &[Fact], _: &[bool]) -> GradRule {
    GradRule::saves(vec![Saved::Input(0), Saved::Output(0)], 2.0)
}

/// A constant 1-D integer input.
pub(super) fn const_vec(cx: &Ctx, i: usize, what: &str) -> Result<Vec<i64>> {
    cx.const_ints(i)?
        .ok_or_else(|| cx.err(format!("{what} (input {i}) is required")))
}

pub(super) fn as_dims(cx: &Ctx, v: &[i64], what: &str) -> Result<Vec<u64>> {
    v.iter()
        .map(|&d| {
            u64::try_from(d)
                .ok()
                .filter(|&d| d > 0)
                .ok_or_else(|| cx.err(format!("{what} must be positive, got {v:?}")))
        })
        .collect()
}
