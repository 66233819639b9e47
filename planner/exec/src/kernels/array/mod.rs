//! Kernels of the layout and shape ops (`remat_planner::ops::array`): views, concatenation and
//! slicing, gathers and scatters, padding and resizing, and the shape sources (see
//! `crate::kernel` for the contract).
//!
//! Ops that move elements without arithmetic (gathers, reflect padding, nearest resizing,
//! reversals) compute an index list on the host from the shapes and move the data with
//! candle's `index_select`; their backward sends the gradient back with `index_add`, so both
//! run on the tensors' device for every element type. Linear and cubic resizing are weighted
//! sums of such gathers, one axis at a time; integer nearest upsampling is a broadcast.
//! A few rare ops run host loops over the values (correct on any device through the copy):
//! TopK's ordering, mul/max/min scatter reductions, integer CumSum.

use crate::kernel::KernelRegistry;

mod index;
mod pad;
pub(super) mod resize;
mod source;
mod view;

pub fn register(r: &mut KernelRegistry) {
    view::register(r);
    index::register(r);
    pad::register(r);
    resize::register(r);
    source::register(r);
}

#[cfg(test)]
mod tests {
    use crate::testing::fixed::{c64, close, fl, fwd_bwd, iota, run, run_with, scalar};
    use crate::testing::{int, ints, string, In};
    use remat_planner::tensor::DType;

    /// Float types other than f64 (what models run): same results as f64 within rounding,
    /// outputs and gradients in the input's type.
    #[test]
    fn f32_and_f16_match_f64() {
        let r = |n: usize, k: f64| -> Vec<f64> {
            (0..n)
                .map(|i| ((i as f64 * 0.37 + k).sin() * 2.0).round() / 2.0 + 0.25)
                .collect()
        };
        let x4 = || fl(&[1, 2, 3, 4], &r(24, 0.1));
        let m3 = || fl(&[3, 3], &r(9, 1.0));
        let sc = |v: &[f64]| In::Const(DType::F32, vec![v.len()], v.to_vec());
        #[allow(clippy::type_complexity)]
        let cases: Vec<(
            &'static str,
            i64,
            Vec<onnx_protobuf::AttributeProto>,
            Vec<In>,
            usize,
        )> = vec![
            ("Identity", 13, vec![], vec![x4()], 1),
            ("Reshape", 13, vec![], vec![x4(), c64(&[6, -1])], 1),
            (
                "Transpose",
                13,
                vec![ints("perm", &[0, 3, 1, 2])],
                vec![x4()],
                1,
            ),
            (
                "Expand",
                13,
                vec![],
                vec![fl(&[3, 1], &r(3, 0.0)), c64(&[2, 3, 4])],
                1,
            ),
            (
                "Slice",
                13,
                vec![],
                vec![
                    x4(),
                    c64(&[3, 0]),
                    c64(&[0, 3]),
                    c64(&[3, 2]),
                    c64(&[-1, 2]),
                ],
                1,
            ),
            (
                "Split",
                13,
                vec![int("axis", 3)],
                vec![x4(), c64(&[1, 3])],
                2,
            ),
            ("Concat", 13, vec![int("axis", 1)], vec![x4(), x4()], 1),
            (
                "Gather",
                13,
                vec![int("axis", 2)],
                vec![x4(), In::Ints(DType::I64, vec![2], vec![2, -3])],
                1,
            ),
            (
                "GatherElements",
                13,
                vec![int("axis", 0)],
                vec![
                    m3(),
                    In::Ints(DType::I64, vec![2, 3], vec![0, 1, 2, 2, 1, 0]),
                ],
                1,
            ),
            ("Cast", 13, vec![int("to", 1)], vec![m3()], 1),
            (
                "Pad",
                13,
                vec![],
                vec![
                    x4(),
                    c64(&[0, 0, 1, 2, 0, 0, 1, 0]),
                    In::Const(DType::F32, vec![], vec![1.5]),
                ],
                1,
            ),
            (
                "Pad",
                13,
                vec![string("mode", "reflect")],
                vec![x4(), c64(&[0, 0, 1, 2, 0, 0, 1, 0])],
                1,
            ),
            (
                "Resize",
                13,
                vec![string("mode", "linear")],
                vec![x4(), In::None, sc(&[1.0, 1.0, 2.0, 1.5])],
                1,
            ),
            (
                "Resize",
                13,
                vec![string("mode", "cubic")],
                vec![x4(), In::None, sc(&[1.0, 1.0, 2.0, 1.5])],
                1,
            ),
            (
                "Resize",
                13,
                vec![],
                vec![x4(), In::None, sc(&[1.0, 1.0, 2.0, 2.0])],
                1,
            ),
            (
                "CumSum",
                14,
                vec![int("exclusive", 1)],
                vec![x4(), scalar(3)],
                1,
            ),
            ("Tile", 13, vec![], vec![m3(), c64(&[2, 1])], 1),
            ("Trilu", 14, vec![], vec![m3()], 1),
            (
                "DepthToSpace",
                13,
                vec![int("blocksize", 2)],
                vec![fl(&[1, 4, 2, 3], &r(24, 0.3))],
                1,
            ),
            (
                "SpaceToDepth",
                13,
                vec![int("blocksize", 2)],
                vec![fl(&[1, 1, 2, 4], &r(8, 0.3))],
                1,
            ),
            (
                "GatherND",
                13,
                vec![],
                vec![m3(), In::Ints(DType::I64, vec![2, 2], vec![0, 1, 2, 2])],
                1,
            ),
            (
                "ScatterND",
                13,
                vec![],
                vec![
                    m3(),
                    In::Ints(DType::I64, vec![1, 1], vec![1]),
                    fl(&[1, 3], &r(3, 2.0)),
                ],
                1,
            ),
            (
                "ScatterElements",
                13,
                vec![],
                vec![
                    m3(),
                    In::Ints(DType::I64, vec![1, 2], vec![2, 0]),
                    fl(&[1, 2], &r(2, 2.0)),
                ],
                1,
            ),
            ("TopK", 11, vec![], vec![m3(), c64(&[2])], 2),
            (
                "ReverseSequence",
                10,
                vec![],
                vec![m3(), In::Ints(DType::I64, vec![3], vec![3, 1, 2])],
                1,
            ),
            ("LpNormalization", 1, vec![], vec![m3()], 1),
            (
                "MeanVarianceNormalization",
                13,
                vec![ints("axes", &[1])],
                vec![m3()],
                1,
            ),
            (
                "GridSample",
                16,
                vec![],
                vec![x4(), fl(&[1, 2, 2, 2], &r(8, 0.5))],
                1,
            ),
            ("Det", 11, vec![], vec![m3()], 1),
            (
                "QuantizeLinear",
                13,
                vec![],
                vec![m3(), sc(&[0.1]), In::Ints(DType::U8, vec![], vec![10])],
                1,
            ),
            (
                "DequantizeLinear",
                13,
                vec![],
                vec![
                    In::Ints(DType::U8, vec![2], vec![3, 200]),
                    sc(&[0.5]),
                    In::Ints(DType::U8, vec![], vec![10]),
                ],
                1,
            ),
            (
                "Range",
                13,
                vec![],
                vec![
                    In::Const(DType::F32, vec![], vec![0.5]),
                    In::Const(DType::F32, vec![], vec![3.0]),
                    In::Const(DType::F32, vec![], vec![0.5]),
                ],
                1,
            ),
        ];
        for (op, opset, attrs, inputs, n) in cases {
            let has_bwd = crate::kernels::registry()[op].backward.is_some();
            let (y64, g64) = fwd_bwd(op, opset, &attrs, inputs.clone(), n, 3, DType::F64, has_bwd);
            for (ft, tol) in [(DType::F32, 1e-4), (DType::F16, 2e-2)] {
                let (y, g) = fwd_bwd(op, opset, &attrs, inputs.clone(), n, 3, ft, has_bwd);
                let cmp = |a: &[f64], b: &[f64], what: &str| {
                    assert_eq!(a.len(), b.len(), "{op} {ft:?} {what}");
                    let scale = b.iter().fold(1.0f64, |m, v| m.max(v.abs()));
                    for (x, w) in a.iter().zip(b) {
                        assert!(
                            (x - w).abs() <= tol * scale,
                            "{op} {ft:?} {what}: {a:?} vs {b:?}"
                        );
                    }
                };
                for (a, b) in y.iter().zip(&y64) {
                    if op != "QuantizeLinear" || ft != DType::F16 {
                        cmp(a, b, "output");
                    }
                }
                for (a, b) in g.iter().zip(&g64) {
                    if let (Some(a), Some(b)) = (a, b) {
                        cmp(a, b, "gradient");
                    }
                }
            }
        }
    }
    #[test]
    fn values_slice_pad_gather() {
        let x = iota(&[10]);
        close(
            &run(
                "Slice",
                13,
                vec![],
                vec![
                    x.clone(),
                    c64(&[-2]),
                    c64(&[i64::MIN]),
                    c64(&[0]),
                    c64(&[-3]),
                ],
            ),
            &[8.0, 5.0, 2.0],
        );
        close(
            &run(
                "Slice",
                13,
                vec![],
                vec![x, c64(&[1]), c64(&[100]), c64(&[0]), c64(&[4])],
            ),
            &[1.0, 5.0, 9.0],
        );
        let v = || fl(&[3], &[1.0, 2.0, 3.0]);
        let pads = || c64(&[2, 1]);
        close(
            &run(
                "Pad",
                13,
                vec![string("mode", "reflect")],
                vec![v(), pads()],
            ),
            &[3.0, 2.0, 1.0, 2.0, 3.0, 2.0],
        );
        close(
            &run("Pad", 13, vec![string("mode", "edge")], vec![v(), pads()]),
            &[1.0, 1.0, 1.0, 2.0, 3.0, 3.0],
        );
        close(
            &run("Pad", 19, vec![string("mode", "wrap")], vec![v(), pads()]),
            &[2.0, 3.0, 1.0, 2.0, 3.0, 1.0],
        );
        let nine = In::Const(DType::F32, vec![], vec![9.0]);
        close(
            &run("Pad", 13, vec![], vec![v(), c64(&[1, -1]), nine]),
            &[9.0, 1.0, 2.0],
        );
        let data = || fl(&[3], &[10.0, 20.0, 30.0]);
        close(
            &run(
                "Gather",
                13,
                vec![],
                vec![data(), In::Ints(DType::I64, vec![2], vec![-1, 0])],
            ),
            &[30.0, 10.0],
        );
        close(
            &run(
                "GatherElements",
                13,
                vec![int("axis", 1)],
                vec![
                    iota(&[2, 3]),
                    In::Ints(DType::I64, vec![2, 2], vec![2, 0, -1, 1]),
                ],
            ),
            &[2.0, 0.0, 5.0, 4.0],
        );
        close(
            &run("Tile", 13, vec![], vec![fl(&[2], &[1.0, 2.0]), c64(&[2])]),
            &[1.0, 2.0, 1.0, 2.0],
        );
        close(
            &run(
                "Expand",
                13,
                vec![],
                vec![fl(&[2, 1], &[1.0, 2.0]), c64(&[2, 2])],
            ),
            &[1.0, 1.0, 2.0, 2.0],
        );
        close(
            &run(
                "Cast",
                13,
                vec![int("to", 9)],
                vec![fl(&[3], &[0.0, 0.5, -1.0])],
            ),
            &[0.0, 1.0, 1.0],
        );
        close(
            &run(
                "Transpose",
                13,
                vec![ints("perm", &[1, 0])],
                vec![iota(&[2, 3])],
            ),
            &[0.0, 3.0, 1.0, 4.0, 2.0, 5.0],
        );
        let split = run_with("Split", 13, vec![], vec![iota(&[5]), c64(&[2, 3])], 2, 7);
        close(&split[1], &[2.0, 3.0, 4.0]);
    }
    #[test]
    fn values_numeric() {
        // Round half to even, saturation, zero point.
        let scale = || In::Const(DType::F32, vec![], vec![1.0]);
        close(
            &run(
                "QuantizeLinear",
                13,
                vec![],
                vec![
                    fl(&[6], &[0.5, 1.5, 2.5, -0.5, 300.0, -3.0]),
                    scale(),
                    In::Ints(DType::U8, vec![], vec![0]),
                ],
            ),
            &[0.0, 2.0, 2.0, 0.0, 255.0, 0.0],
        );
        let q = run(
            "QuantizeLinear",
            13,
            vec![],
            vec![
                fl(&[3], &[-200.0, -2.5, 3.0]),
                scale(),
                In::Ints(DType::I8, vec![], vec![1]),
            ],
        );
        // int8 is held in u8 as two's complement: -128, -1, 4.
        close(&q, &[128.0, 255.0, 4.0]);
        close(
            &run(
                "DequantizeLinear",
                13,
                vec![],
                vec![
                    In::Ints(DType::I8, vec![3], vec![-128, -1, 4]),
                    In::Const(DType::F64, vec![], vec![0.5]),
                    In::Ints(DType::I8, vec![], vec![1]),
                ],
            ),
            &[-64.5, -1.0, 1.5],
        );
        close(
            &run("Det", 11, vec![], vec![fl(&[2, 2], &[1.0, 2.0, 3.0, 4.0])]),
            &[-2.0],
        );
        close(
            &run("Det", 11, vec![], vec![fl(&[2, 2], &[1.0, 2.0, 2.0, 4.0])]),
            &[0.0],
        );
        close(
            &run(
                "LpNormalization",
                1,
                vec![],
                vec![fl(&[2, 2], &[3.0, 4.0, 0.0, 2.0])],
            ),
            &[0.6, 0.8, 0.0, 1.0],
        );
        let m = run(
            "MeanVarianceNormalization",
            13,
            vec![ints("axes", &[1])],
            vec![fl(&[1, 4], &[1.0, 2.0, 3.0, 6.0])],
        );
        let std = (((1.0f64 - 3.0).powi(2) + 1.0 + 0.0 + 9.0) / 4.0).sqrt();
        close(&m, &[-2.0 / std, -1.0 / std, 0.0, 3.0 / std]);
        close(
            &run(
                "Range",
                13,
                vec![],
                vec![
                    In::Const(DType::F32, vec![], vec![1.0]),
                    In::Const(DType::F32, vec![], vec![-2.0]),
                    In::Const(DType::F32, vec![], vec![-0.75]),
                ],
            ),
            &[1.0, 0.25, -0.5, -1.25],
        );
        // GridSample with an identity grid (align_corners) reproduces the input.
        let grid: Vec<f64> = (0..2)
            .flat_map(|i| (0..3).flat_map(move |j| [j as f64 - 1.0, 2.0 * i as f64 - 1.0]))
            .collect();
        close(
            &run(
                "GridSample",
                16,
                vec![int("align_corners", 1)],
                vec![iota(&[1, 1, 2, 3]), fl(&[1, 2, 3, 2], &grid)],
            ),
            &[0.0, 1.0, 2.0, 3.0, 4.0, 5.0],
        );
    }
}
