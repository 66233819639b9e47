//! Kernels of the elementwise family (see `crate::kernel` for the contract): unary activations
//! and math, broadcasting binary and variadic arithmetic, comparisons, logic and bitwise ops,
//! `Where`. One forward and one backward function per group of ops, dispatching on `cx.op`.
//!
//! Float ops run on candle ops (CPU and CUDA). Integer arithmetic that can fail (division and
//! remainder by zero, integer powers) and the bitwise ops, which candle lacks, run as host
//! loops over the values.

use crate::kernel::KernelRegistry;

mod binary;
mod unary;
mod unary_host;

pub fn register(r: &mut KernelRegistry) {
    unary::register(r);
    binary::register(r);
}

#[cfg(test)]
mod tests {

    use crate::testing::int;

    use remat_planner::tensor::DType as OD;

    use crate::testing::typed::{fwd1, run, V};

    use onnx_protobuf::AttributeProto;

    /// Models run in f32 (sometimes f16): forward and backward of every differentiable op
    /// agree with the f64 run.
    #[test]
    fn single_and_half_precision_match_double() {
        let xs: Vec<f64> = (0..12).map(|i| -1.73 + 0.31 * i as f64).collect();
        let pos: Vec<f64> = (0..12).map(|i| 0.4 + 0.13 * i as f64).collect();
        let unit: Vec<f64> = (0..12).map(|i| -0.9 + 0.15 * i as f64).collect();
        /// Op, opset, attributes, and the inputs in f64, f32 and f16.
        type Row = (
            &'static str,
            i64,
            Vec<AttributeProto>,
            Vec<V>,
            Vec<V>,
            Vec<V>,
        );
        let cases: Vec<Row> = {
            let mut v = vec![];
            let mk = |f: &dyn Fn(OD) -> Vec<V>| (f(OD::F64), f(OD::F32), f(OD::F16));
            for op in super::unary::UNARY {
                let data = match *op {
                    "Sqrt" | "Log" | "Reciprocal" | "Acosh" => {
                        if *op == "Acosh" {
                            pos.iter().map(|p| p + 1.0).collect()
                        } else {
                            pos.clone()
                        }
                    }
                    "Asin" | "Acos" | "Atanh" | "Tan" => unit.clone(),
                    _ => xs.clone(),
                };
                let (a, b, c) = mk(&|d| vec![V::T(d, vec![3, 4], data.clone())]);
                v.push((*op, 17, vec![], a, b, c));
            }
            let two = |d: OD, x: &Vec<f64>, y: Vec<f64>, ys: Vec<usize>| {
                vec![V::T(d, vec![3, 4], x.clone()), V::T(d, ys, y)]
            };
            for op in [
                "Add", "Sub", "Mul", "Div", "PRelu", "Mod", "Max", "Min", "Sum", "Mean",
            ] {
                let (a, b, c) = mk(&|d| two(d, &xs, vec![0.5, 1.5, 2.5, 3.5], vec![4]));
                let attrs = if op == "Mod" {
                    vec![int("fmod", 1)]
                } else {
                    vec![]
                };
                v.push((op, 14, attrs, a, b, c));
            }
            let (a, b, c) = mk(&|d| two(d, &pos, vec![0.5, -1.5, 2.0, 3.0], vec![4]));
            v.push(("Pow", 15, vec![], a, b, c));
            let (a, b, c) =
                mk(&|d| vec![V::T(d, vec![3, 4], xs.clone()), V::C(d, vec![], vec![3.0])]);
            v.push(("Pow", 15, vec![], a, b, c));
            let (a, b, c) = mk(&|d| {
                vec![
                    V::T(OD::Bool, vec![4], vec![1.0, 0.0, 0.0, 1.0]),
                    V::T(d, vec![3, 4], xs.clone()),
                    V::T(d, vec![], vec![0.5]),
                ]
            });
            v.push(("Where", 16, vec![], a, b, c));
            for op in [
                "ReduceSum",
                "ReduceMean",
                "ReduceSumSquare",
                "ReduceL1",
                "ReduceL2",
                "ReduceLogSum",
                "ReduceLogSumExp",
                "ReduceMax",
                "ReduceMin",
                "ReduceProd",
            ] {
                let (a, b, c) = mk(&|d| {
                    vec![
                        V::T(d, vec![3, 4], pos.clone()),
                        V::C(OD::I64, vec![1], vec![1.0]),
                    ]
                });
                v.push((op, 18, vec![], a, b, c));
            }
            v
        };
        for (op, opset, attrs, d64, d32, d16) in cases {
            let (y64, g64) =
                run(op, opset, &attrs, d64, true).unwrap_or_else(|e| panic!("{op} f64: {e}"));
            for (name, data, tol) in [("f32", d32, 1e-5), ("f16", d16, 2e-2)] {
                let (y, g) = run(op, opset, &attrs, data, true)
                    .unwrap_or_else(|e| panic!("{op} {name}: {e}"));
                let near = |a: &[f64], b: &[f64], what: &str| {
                    let scale = b.iter().fold(1.0f64, |m, v| m.max(v.abs()));
                    for (p, q) in a.iter().zip(b) {
                        assert!(
                            (p - q).abs() <= tol * scale,
                            "{op} {name} {what}: {a:?} vs {b:?}"
                        );
                    }
                };
                for (a, b) in y.iter().zip(&y64) {
                    assert_eq!(a.0, b.0, "{op} {name}");
                    near(&a.1, &b.1, "output");
                }
                assert_eq!(g.len(), g64.len(), "{op} {name}");
                for (a, b) in g.iter().zip(&g64) {
                    match (a, b) {
                        (Some(a), Some(b)) => near(&a.1, &b.1, "gradient"),
                        (None, None) => {}
                        _ => panic!("{op} {name}: gradients differ in presence"),
                    }
                }
            }
        }
    }

    /// Models run in f32 (sometimes f16): every float kernel runs there too.
    #[test]
    fn low_precision_types() {
        let x = || V::T(OD::F32, vec![4], vec![-1.5, -0.2, 0.3, 2.0]);
        let h = || V::T(OD::F16, vec![4], vec![-1.5, -0.2, 0.3, 2.0]);
        for op in [
            "Relu",
            "Sigmoid",
            "Tanh",
            "Gelu",
            "Swish",
            "HardSwish",
            "Erf",
            "Neg",
            "Abs",
        ] {
            let a = fwd1(op, 17, &[], vec![x()]);
            let b = fwd1(op, 17, &[], vec![h()]);
            for (p, q) in a.iter().zip(&b) {
                assert!((p - q).abs() < 1e-2, "{op}: {a:?} vs {b:?}");
            }
        }
        let y = fwd1("Pow", 15, &[], vec![x(), V::C(OD::F32, vec![], vec![2.0])]);
        for (p, q) in y.iter().zip([2.25, 0.04, 0.09, 4.0]) {
            assert!((p - q).abs() < 1e-6, "{y:?}");
        }
    }
}
