//! Kernels of the neural-network family (see `crate::kernel` for the contract): convolutions,
//! matrix products, normalizations, pooling, softmax, dropout, einsum.
//!
//! Convolutions are 2-D at the core (1-D as 2-D with a unit height, 3-D as a sum of 2-D
//! convolutions over the kernel depth). On the CPU they unfold the input on the host (im2col
//! and col2im as candle custom ops, one pass over contiguous memory) and multiply with
//! candle's matmul: forward `W · cols`, data gradient `col2im(Wᵀ · dY)`, weight gradient
//! `dY · colsᵀ`. On other devices they run on candle ops only: `conv2d` forward, the data
//! gradient as a `conv2d` of the stride-dilated gradient with the flipped, transposed kernel,
//! the weight gradient as one product of the gradient with columns built from strided
//! windows. A test checks that both paths agree.
//!
//! Pooling works on strided windows of the padded input in any number of spatial dims (2-D
//! max pooling finds its argmax on the host on the CPU). Normalization statistics are
//! computed in f32 (f64 when the data is f64) and saved as f32, as the gradient rules declare.

use crate::kernel::KernelRegistry;

mod conv;
mod conv_host;
mod dropout;
mod einsum;
mod matmul;
mod norm;
mod norm_host;
mod pool;
mod pool_host;
mod softmax;

pub fn register(r: &mut KernelRegistry) {
    conv::register(r);
    matmul::register(r);
    norm::register(r);
    pool::register(r);
    softmax::register(r);
    dropout::register(r);
    einsum::register(r);
}

#[cfg(test)]
mod tests {
    use crate::testing::random_in;
    use crate::testing::{int, ints};
    use remat_planner::tensor::DType;

    /// Op, opset, attributes, input shapes, output count.
    type FwdCase = (
        &'static str,
        i64,
        Vec<onnx_protobuf::AttributeProto>,
        Vec<Vec<usize>>,
        usize,
    );

    /// Models run in f32 and f16: the kernels give the f64 results there too, forward and
    /// backward (statistics in f32, saved extras used by the forward).
    #[test]
    fn f32_and_f16_match_f64() {
        let v = |s: &[usize]| s.to_vec();
        let cases: Vec<FwdCase> = vec![
            (
                "Conv",
                17,
                vec![ints("pads", &[1, 1, 1, 1]), ints("strides", &[2, 2])],
                vec![v(&[2, 3, 9, 9]), v(&[4, 3, 3, 3]), v(&[4])],
                1,
            ),
            (
                "Conv",
                17,
                vec![ints("pads", &[1, 1, 1, 1, 1, 1])],
                vec![v(&[1, 2, 3, 5, 5]), v(&[3, 2, 3, 3, 3])],
                1,
            ),
            (
                "BatchNormalization",
                15,
                vec![int("training_mode", 1)],
                vec![v(&[4, 3, 5, 5]), v(&[3]), v(&[3]), v(&[3]), v(&[3])],
                3,
            ),
            (
                "LayerNormalization",
                17,
                vec![],
                vec![v(&[4, 16]), v(&[16]), v(&[16])],
                3,
            ),
            (
                "GroupNormalization",
                21,
                vec![int("num_groups", 2)],
                vec![v(&[2, 4, 3, 3]), v(&[4]), v(&[4])],
                1,
            ),
            (
                "InstanceNormalization",
                6,
                vec![],
                vec![v(&[2, 3, 4, 4]), v(&[3]), v(&[3])],
                1,
            ),
            (
                "MaxPool",
                12,
                vec![
                    ints("kernel_shape", &[3, 3]),
                    ints("strides", &[2, 2]),
                    ints("pads", &[1, 1, 1, 1]),
                ],
                vec![v(&[2, 3, 9, 9])],
                2,
            ),
            (
                "AveragePool",
                19,
                vec![ints("kernel_shape", &[2, 2])],
                vec![v(&[2, 3, 6, 6])],
                1,
            ),
            (
                "Gemm",
                13,
                vec![int("transB", 1)],
                vec![v(&[4, 8]), v(&[5, 8]), v(&[5])],
                1,
            ),
            ("MatMul", 13, vec![], vec![v(&[2, 3, 8]), v(&[8, 4])], 1),
            ("Softmax", 13, vec![], vec![v(&[3, 7])], 1),
            ("LogSoftmax", 13, vec![], vec![v(&[3, 7])], 1),
            ("GlobalAveragePool", 13, vec![], vec![v(&[2, 3, 4, 4])], 1),
        ];
        for (op, opset, attrs, shapes, n_out) in cases {
            let want = random_in(op, opset, &attrs, &shapes, n_out, DType::F64);
            for (dt, tol) in [(DType::F32, 1e-4), (DType::F16, 5e-2)] {
                let got = random_in(op, opset, &attrs, &shapes, n_out, dt);
                // Outputs, then at least one gradient.
                assert!(
                    want.len() > n_out && got.len() == want.len(),
                    "{op} in {dt:?}"
                );
                for (k, (a, b)) in want.iter().zip(&got).enumerate() {
                    let scale = a.iter().map(|x| x.abs()).fold(1.0, f64::max);
                    let err = a
                        .iter()
                        .zip(b)
                        .map(|(x, y)| (x - y).abs())
                        .fold(0.0, f64::max)
                        / scale;
                    assert!(err < tol, "{op} result {k} in {dt:?}: relative error {err}");
                }
            }
        }
    }
}
