//! Kernels of the less common spatial ops and the in-graph losses: `LpPool`,
//! `GlobalLpPool`, `MaxUnpool`, `RoiAlign`, `Col2Im`, `CenterCropPad`, `AffineGrid`,
//! `GridSample`, `SoftmaxCrossEntropyLoss`, `NegativeLogLikelihoodLoss` (see `crate::kernel`
//! for the contract).
//!
//! Sliding windows of any rank, stride, dilation and padding (LpPool, Col2Im) gather the
//! window elements with one `index_select` over the zero-padded, flattened spatial dims;
//! their backward scatters back with `index_add`. The index tables are built on the host
//! from the shapes; RoiAlign's bilinear sampling table depends on the boxes, which are read
//! back from the device.

use crate::kernel::KernelRegistry;

mod grid;
mod loss;
mod pool;
mod roi;

pub fn register(r: &mut KernelRegistry) {
    pool::register(r);
    roi::register(r);
    grid::register(r);
    loss::register(r);
}

#[cfg(test)]
mod tests {
    use crate::testing::tensors::t;
    use crate::testing::{int, ints};

    use candle_core::{Device, Tensor};

    #[test]
    fn f32_agrees_with_f64() {
        use crate::testing::tensors::{same_in, seq};
        let dt = candle_core::DType::F32;
        let x = t(&seq(2 * 2 * 5 * 6, 0.7, 0.1), &[2, 2, 5, 6]);
        same_in(
            "LpPool",
            18,
            &[
                ints("kernel_shape", &[2, 3]),
                ints("strides", &[2, 1]),
                ints("pads", &[1, 1, 0, 1]),
            ],
            &[Some(x.clone())],
            &[],
            1,
            dt,
            1e-4,
        );
        same_in(
            "GlobalLpPool",
            2,
            &[int("p", 3)],
            &[Some(x.clone())],
            &[],
            1,
            dt,
            1e-4,
        );
        let rois = t(&[0.5, 1.0, 4.2, 3.9, 1.2, 0.3, 5.5, 4.4], &[2, 4]);
        let b = Tensor::from_vec(vec![1i64, 0], 2, &Device::Cpu).unwrap();
        same_in(
            "RoiAlign",
            16,
            &[int("output_height", 2), int("output_width", 2)],
            &[Some(x.clone()), Some(rois), Some(b)],
            &[1],
            1,
            dt,
            1e-4,
        );
        let labels = Tensor::from_vec(vec![1i64, -1, 0, 2], 4, &Device::Cpu).unwrap();
        let scores = t(&seq(12, 0.9, 0.4), &[4, 3]);
        let w = t(&[1.0, 2.0, 0.5], &[3]);
        same_in(
            "SoftmaxCrossEntropyLoss",
            13,
            &[int("ignore_index", -1)],
            &[Some(scores.clone()), Some(labels.clone()), Some(w)],
            &[2],
            2,
            dt,
            1e-4,
        );
        same_in(
            "NegativeLogLikelihoodLoss",
            13,
            &[int("ignore_index", -1)],
            &[Some(scores), Some(labels)],
            &[],
            1,
            dt,
            1e-4,
        );
        let theta = t(&seq(12, 0.5, 0.0), &[2, 2, 3]);
        let size = Tensor::from_vec(vec![2i64, 1, 3, 4], 4, &Device::Cpu).unwrap();
        same_in(
            "AffineGrid",
            20,
            &[],
            &[Some(theta), Some(size)],
            &[1],
            1,
            dt,
            1e-4,
        );
    }
}
