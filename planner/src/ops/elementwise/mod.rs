//! Elementwise ops: unary activations and math, broadcasting binary and variadic ops,
//! comparisons and logic, `Where`. Small constant inputs are folded.

use super::rule::Registry;

mod binary;
pub(super) mod common;
mod unary;

pub fn register(r: &mut Registry) {
    unary::register(r);
    binary::register(r);
}
