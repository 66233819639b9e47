//! Neural-network ops: convolutions, normalizations, pooling, matrix products, softmax,
//! dropout, einsum.

use super::rule::Registry;

pub(super) mod common;
mod conv;
mod dropout;
mod einsum;
mod matmul;
mod norm;
pub(super) mod pool;
mod softmax;

pub fn register(r: &mut Registry) {
    conv::register(r);
    matmul::register(r);
    norm::register(r);
    pool::register(r);
    softmax::register(r);
    dropout::register(r);
    einsum::register(r);
}
