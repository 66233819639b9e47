//! Less common spatial ops (`LpPool`, `GlobalLpPool`, `MaxUnpool`, `RoiAlign`, `Col2Im`,
//! `CenterCropPad`, `AffineGrid`, `GridSample`) and the training losses exporters write when the loss is
//! part of the graph (`SoftmaxCrossEntropyLoss`, `NegativeLogLikelihoodLoss`).

use super::rule::Registry;

pub(super) mod common;
mod grid;
mod loss;
mod pool;
mod roi;

pub fn register(r: &mut Registry) {
    pool::register(r);
    roi::register(r);
    grid::register(r);
    loss::register(r);
}
