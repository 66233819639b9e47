//! Layout and shape ops: reshapes and views, concatenation and slicing, gathers and
//! scatters, the shape-arithmetic sources (`Shape`, `Constant`, `ConstantOfShape`, `Range`),
//! padding and resizing. Small integer tensors are folded so that exporters' shape chains
//! (`Shape` → `Gather` → `Concat` → `Reshape`) resolve to constants.

use super::rule::Registry;

pub(super) mod common;
mod index;
mod pad;
pub mod resize;
mod source;
pub mod view;

pub fn register(r: &mut Registry) {
    view::register(r);
    index::register(r);
    pad::register(r);
    resize::register(r);
    source::register(r);
}
