//! Kernels of the reduction family (see `exec::kernel` for the contract): the `Reduce*` ops
//! over a set of axes (an attribute, or input 1 from opset 18 and for `ReduceSum` from
//! opset 13; `keepdims`; `noop_with_empty_axes`) and `ArgMax` / `ArgMin`.
//!
//! Reductions run with the reduced axes kept (size 1) and are reshaped to the output shape,
//! so `keepdims` costs nothing and the backward broadcasts the incoming gradient back over
//! the kept axes. With `noop_with_empty_axes` and no axes nothing is reduced, but the op's
//! elementwise part still applies (`ReduceSumSquare` squares, `ReduceL1` takes `|x|`), as
//! the ONNX specification says.

use super::common::{mask, need_float, scalar_like, scale};
use crate::kernel::kbail;
use crate::kernel::{BwdArgs, Extras, Inputs, KResult, Kernel, KernelCtx, KernelRegistry};
use candle_core::{DType, Tensor};
use remat_planner::tensor::DType as PDType;

/// The reduced axes, sorted; empty when the op reduces nothing (`noop_with_empty_axes`, or a
/// rank-0 input).
fn reduce_axes(cx: &KernelCtx, rank: usize) -> KResult<Vec<usize>> {
    let axes_as_input = cx.opset >= 18 || (cx.op == "ReduceSum" && cx.opset >= 13);
    let axes = if axes_as_input {
        cx.const_ints(1)?
    } else {
        cx.attrs.ints("axes")?.map(|a| a.to_vec())
    };
    match axes {
        Some(a) if !a.is_empty() => {
            let mut out: Vec<usize> = Vec::with_capacity(a.len());
            for v in a {
                let ax = cx.axis(v, rank)?;
                if out.contains(&ax) {
                    kbail!("axis {v} appears twice in the reduced axes");
                }
                out.push(ax);
            }
            out.sort_unstable();
            Ok(out)
        }
        _ => {
            if axes_as_input && cx.attrs.int_or("noop_with_empty_axes", 0)? != 0 {
                Ok(vec![])
            } else {
                Ok((0..rank).collect())
            }
        }
    }
}

/// `x`'s shape with the reduced axes set to 1.
fn kept_shape(dims: &[usize], axes: &[usize]) -> Vec<usize> {
    dims.iter()
        .enumerate()
        .map(|(i, &d)| if axes.contains(&i) { 1 } else { d })
        .collect()
}

/// Number of elements reduced into each output element.
fn group_len(dims: &[usize], axes: &[usize]) -> usize {
    axes.iter().filter_map(|&a| dims.get(a)).product()
}

fn sum(x: &Tensor, axes: &[usize]) -> KResult<Tensor> {
    if axes.is_empty() {
        return Ok(x.clone());
    }
    Ok(x.sum_keepdim(axes.to_vec())?)
}

/// The max (or min) of an empty set, as opset 18 defines it: -inf (+inf) for floats, else the
/// least (greatest) value of the type (`dtype`, the ONNX type: int8 is held in u8 as its bit
/// pattern, bool in u8 as 0/1).
fn empty_extremum(x: &Tensor, axes: &[usize], max: bool, dtype: PDType) -> KResult<Tensor> {
    let shape = kept_shape(x.dims(), axes);
    let n: usize = shape.iter().product();
    if x.dtype().is_float() {
        let v = if max {
            f64::NEG_INFINITY
        } else {
            f64::INFINITY
        };
        return Ok(Tensor::full(v, shape, x.device())?.to_dtype(x.dtype())?);
    }
    let (lo, hi): (i64, i64) = match dtype {
        PDType::Bool => (0, 1),
        PDType::U8 => (0, 255),
        PDType::I8 => (128, 127), // -128 as its bit pattern
        PDType::I16 => (i64::from(i16::MIN), i64::from(i16::MAX)),
        PDType::U16 => (0, i64::from(u16::MAX)),
        PDType::I32 => (i64::from(i32::MIN), i64::from(i32::MAX)),
        PDType::U32 => (0, i64::from(u32::MAX)),
        PDType::I64 => (i64::MIN, i64::MAX),
        other => kbail!("the reduction of an empty {other:?} tensor has no maximum or minimum"),
    };
    let v = vec![if max { lo } else { hi }; n];
    Ok(Tensor::from_vec(v, shape, x.device())?.to_dtype(x.dtype())?)
}

/// Max (or min) over `axes`, one axis at a time.
fn extremum(x: &Tensor, axes: &[usize], max: bool) -> KResult<Tensor> {
    if x.elem_count() == 0 && !axes.is_empty() {
        kbail!("the reduction of an empty tensor has no maximum or minimum");
    }
    let mut y = x.clone();
    for &a in axes {
        y = if max {
            y.max_keepdim(a)?
        } else {
            y.min_keepdim(a)?
        };
    }
    Ok(y)
}

/// `x` with the reduced axes moved last, contiguous, and the number of groups and their length.
fn grouped(x: &Tensor, axes: &[usize]) -> KResult<(Tensor, Vec<usize>)> {
    let rank = x.rank();
    let perm: Vec<usize> = (0..rank)
        .filter(|a| !axes.contains(a))
        .chain(axes.iter().copied())
        .collect();
    Ok((x.permute(perm.clone())?.contiguous()?, perm))
}

/// ReduceProd on the host: products of each group of reduced elements.
fn prod(x: &Tensor, axes: &[usize]) -> KResult<Tensor> {
    let kshape = kept_shape(x.dims(), axes);
    let len = group_len(x.dims(), axes);
    let (xp, _) = grouped(x, axes)?;
    if x.dtype().is_float() {
        let v = xp.to_dtype(DType::F64)?.flatten_all()?.to_vec1::<f64>()?;
        let out: Vec<f64> = if len == 0 {
            vec![1.0; kshape.iter().product()]
        } else {
            v.chunks(len).map(|c| c.iter().product()).collect()
        };
        Ok(Tensor::from_vec(out, kshape, x.device())?.to_dtype(x.dtype())?)
    } else {
        let v = xp.to_dtype(DType::I64)?.flatten_all()?.to_vec1::<i64>()?;
        let out: Vec<i64> = if len == 0 {
            vec![1; kshape.iter().product()]
        } else {
            v.chunks(len)
                .map(|c| c.iter().fold(1i64, |p, &q| p.wrapping_mul(q)))
                .collect()
        };
        Ok(Tensor::from_vec(out, kshape, x.device())?.to_dtype(x.dtype())?)
    }
}

fn reduce_fwd(cx: &KernelCtx, xs: &[Option<Tensor>], _: &Extras) -> KResult<Vec<Option<Tensor>>> {
    let x0 = xs.req(0)?;
    let axes = reduce_axes(cx, x0.rank())?;
    let float = x0.dtype().is_float();
    // Sums of half-precision values accumulate in f32 (as PyTorch does).
    let widen = matches!(x0.dtype(), DType::F16 | DType::BF16)
        && !matches!(cx.op, "ReduceMax" | "ReduceMin" | "ReduceProd");
    let wide = if widen {
        x0.to_dtype(DType::F32)?
    } else {
        x0.clone()
    };
    let x = &wide;
    let y = match cx.op {
        "ReduceSum" => sum(x, &axes)?,
        "ReduceMean" => {
            let n = group_len(x.dims(), &axes);
            if n == 0 {
                kbail!("ReduceMean over an empty axis has no mean");
            }
            let s = sum(x, &axes)?;
            if float {
                scale(&s, 1.0 / n as f64)?
            } else {
                s.broadcast_div(&scalar_like(&s, n as f64)?)?
            }
        }
        "ReduceSumSquare" => sum(&(x * x)?, &axes)?,
        "ReduceL1" => sum(&x.abs()?, &axes)?,
        "ReduceL2" => {
            need_float(cx, x)?;
            sum(&x.sqr()?, &axes)?.sqrt()?
        }
        "ReduceLogSum" => {
            need_float(cx, x)?;
            sum(x, &axes)?.log()?
        }
        "ReduceLogSumExp" if x.elem_count() == 0 && !axes.is_empty() => {
            need_float(cx, x)?;
            // ln Σ over nothing: ln 0.
            empty_extremum(x, &axes, true, cx.input(0)?.dtype)?
        }
        "ReduceLogSumExp" => {
            need_float(cx, x)?;
            logsumexp(x, &axes)?
        }
        "ReduceMax" | "ReduceMin" if x.elem_count() == 0 && !axes.is_empty() => {
            empty_extremum(x, &axes, cx.op == "ReduceMax", cx.input(0)?.dtype)?
        }
        "ReduceMax" => extremum(x, &axes, true)?,
        "ReduceMin" => extremum(x, &axes, false)?,
        "ReduceProd" => prod(x, &axes)?,
        other => kbail!("no reduction kernel for {other}"),
    };
    Ok(vec![Some(
        y.to_dtype(x0.dtype())?.reshape(cx.out_shape(0)?)?,
    )])
}

/// `m + ln Σ e^{x − m}` with `m` the maximum (0 where it is infinite), so that it never
/// overflows.
fn logsumexp(x: &Tensor, axes: &[usize]) -> KResult<Tensor> {
    if axes.is_empty() {
        return Ok(x.clone());
    }
    let m = extremum(x, axes, true)?;
    let finite = m.abs()?.lt(f64::INFINITY)?;
    let m = finite.where_cond(&m, &m.zeros_like()?)?;
    let s = sum(&x.broadcast_sub(&m)?.exp()?, axes)?;
    Ok((s.log()? + m)?)
}

fn reduce_bwd(cx: &KernelCtx, a: &BwdArgs) -> KResult<Vec<Option<Tensor>>> {
    let mut out: Vec<Option<Tensor>> = vec![None; cx.inputs.len().max(1)];
    if !a.need(0) {
        return Ok(out);
    }
    let xdims = cx.in_shape(0)?;
    let axes = reduce_axes(cx, xdims.len())?;
    let kshape = kept_shape(&xdims, &axes);
    let g = a.grad(cx, 0)?.reshape(kshape.as_slice())?;
    let dt = g.dtype();
    let gb = g.broadcast_as(xdims.as_slice())?;
    let y = || -> KResult<Tensor> { Ok(a.output(0)?.reshape(kshape.as_slice())?) };
    let dx = match cx.op {
        "ReduceSum" => gb.contiguous()?,
        "ReduceMean" => {
            let n = group_len(&xdims, &axes);
            scale(&gb, 1.0 / n.max(1) as f64)?
        }
        "ReduceSumSquare" => scale(&(a.input(0)? * gb)?, 2.0)?,
        "ReduceL1" => (a.input(0)?.sign()? * gb)?,
        "ReduceL2" => {
            // x / y, zero where y = 0.
            let y = y()?;
            let zero = y.eq(0.0)?;
            let inv = zero.where_cond(&y.zeros_like()?, &y.recip()?)?;
            (a.input(0)?.broadcast_mul(&inv)? * gb)?
        }
        "ReduceLogSum" => gb.broadcast_mul(&y()?.neg()?.exp()?)?,
        "ReduceLogSumExp" => (a.input(0)?.broadcast_sub(&y()?)?.exp()? * gb)?,
        "ReduceMax" | "ReduceMin" => {
            // To the elements equal to the extremum, shared evenly on ties.
            let hits = mask(&a.input(0)?.broadcast_eq(&y()?)?, dt)?;
            let count = sum(&hits, &axes)?;
            (hits * gb.broadcast_div(&count)?)?
        }
        "ReduceProd" => prod_grad(a.input(0)?, &g, &axes)?,
        other => kbail!("no reduction backward for {other}"),
    };
    out[0] = Some(dx);
    Ok(out)
}

/// d ReduceProd: each element's gradient is `g` times the product of the other elements of
/// its group (prefix and suffix products, exact with zeros).
fn prod_grad(x: &Tensor, g: &Tensor, axes: &[usize]) -> KResult<Tensor> {
    let len = group_len(x.dims(), axes);
    let (xp, perm) = grouped(x, axes)?;
    let pdims = xp.dims().to_vec();
    let xv = xp.to_dtype(DType::F64)?.flatten_all()?.to_vec1::<f64>()?;
    let gv = g.to_dtype(DType::F64)?.flatten_all()?.to_vec1::<f64>()?;
    let mut dx = vec![0.0; xv.len()];
    if len > 0 {
        for ((c, d), gk) in xv.chunks(len).zip(dx.chunks_mut(len)).zip(&gv) {
            let mut prefix = 1.0;
            for (j, v) in c.iter().enumerate() {
                d[j] = prefix;
                prefix *= v;
            }
            let mut suffix = 1.0;
            for (j, v) in c.iter().enumerate().rev() {
                d[j] *= suffix * gk;
                suffix *= v;
            }
        }
    }
    let mut inv = vec![0; perm.len()];
    for (i, &p) in perm.iter().enumerate() {
        inv[p] = i;
    }
    Ok(Tensor::from_vec(dx, pdims, x.device())?
        .to_dtype(g.dtype())?
        .permute(inv)?
        .contiguous()?)
}

fn arg_fwd(cx: &KernelCtx, xs: &[Option<Tensor>], _: &Extras) -> KResult<Vec<Option<Tensor>>> {
    let x = xs.req(0)?;
    let axis = cx.axis(cx.attrs.int_or("axis", 0)?, x.rank())?;
    let last = cx.attrs.int_or("select_last_index", 0)? != 0;
    let len = x.dims().get(axis).copied().unwrap_or(0);
    if len == 0 {
        kbail!("{} over an empty axis has no index", cx.op);
    }
    let xx = if last { x.flip(&[axis])? } else { x.clone() };
    let idx = if cx.op == "ArgMax" {
        xx.argmax_keepdim(axis)?
    } else {
        xx.argmin_keepdim(axis)?
    };
    let mut idx = idx.to_dtype(DType::I64)?;
    if last {
        // The first index in the flipped tensor is the last one in the original.
        let top = Tensor::new((len - 1) as i64, x.device())?;
        idx = top.broadcast_sub(&idx)?;
    }
    let shape = cx.out_shape(0)?;
    Ok(vec![Some(idx.reshape(shape)?)])
}

pub fn register(r: &mut KernelRegistry) {
    let k = Kernel::new;
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
        r.insert(op, k(reduce_fwd, Some(reduce_bwd)));
    }
    for op in ["ArgMax", "ArgMin"] {
        r.insert(op, k(arg_fwd, None));
    }
}

#[cfg(test)]
mod tests {
    use crate::testing::typed::{close, fwd, fwd1, V};
    use crate::testing::{check, int, ints, Case, In};
    use remat_planner::tensor::DType as OD;

    const OPS: [&str; 10] = [
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
    ];

    fn x(s: &[usize]) -> In {
        // Positive, so that ReduceLogSum is defined; the others see no difference.
        In::RandIn(s.to_vec(), 0.2, 1.5)
    }
    fn axes(v: &[i64]) -> In {
        In::Const(
            OD::I64,
            vec![v.len()],
            v.iter().map(|&a| a as f64).collect(),
        )
    }

    #[test]
    fn axes_as_input() {
        for op in OPS {
            check(&Case::new(op, 18, vec![x(&[2, 3, 4]), axes(&[1])]));
            check(&Case::new(op, 18, vec![x(&[2, 3, 4]), axes(&[1])]).attr(int("keepdims", 0)));
            check(&Case::new(op, 18, vec![x(&[2, 3, 4]), axes(&[-1, 0])]));
            check(&Case::new(op, 18, vec![x(&[2, 3, 4]), axes(&[2, 0])]).attr(int("keepdims", 0)));
            // No axes: every axis, or none with noop_with_empty_axes.
            check(&Case::new(op, 18, vec![x(&[2, 3])]));
            check(&Case::new(op, 18, vec![x(&[2, 3]), In::None]).attr(int("keepdims", 0)));
            check(&Case::new(op, 18, vec![x(&[2, 3])]).attr(int("noop_with_empty_axes", 1)));
        }
        // Signed inputs where the op allows them.
        for op in [
            "ReduceSum",
            "ReduceMean",
            "ReduceSumSquare",
            "ReduceL1",
            "ReduceL2",
        ] {
            check(&Case::new(op, 18, vec![In::Rand(vec![3, 5]), axes(&[1])]));
        }
        for op in ["ReduceLogSumExp", "ReduceMax", "ReduceMin", "ReduceProd"] {
            check(&Case::new(
                op,
                18,
                vec![In::RandIn(vec![3, 5], -3.0, 3.0), axes(&[0])],
            ));
        }
        check(&Case::new(
            "ReduceSum",
            13,
            vec![x(&[2, 3, 4]), axes(&[1, 2])],
        ));
        check(
            &Case::new("ReduceSum", 13, vec![x(&[2, 3, 4]), In::None])
                .attr(int("noop_with_empty_axes", 1)),
        );
    }

    #[test]
    fn axes_as_attribute() {
        for op in OPS {
            if op == "ReduceSum" {
                check(&Case::new(op, 11, vec![x(&[2, 3, 4])]).attr(ints("axes", &[1])));
                continue;
            }
            check(&Case::new(op, 13, vec![x(&[2, 3, 4])]).attr(ints("axes", &[1])));
            check(
                &Case::new(op, 13, vec![x(&[2, 3, 4])])
                    .attr(ints("axes", &[-1, 0]))
                    .attr(int("keepdims", 0)),
            );
            check(&Case::new(op, 13, vec![x(&[2, 3, 4])]));
        }
    }

    #[test]
    fn values() {
        let t = || V::T(OD::F64, vec![2, 3], vec![1.0, -2.0, 3.0, 0.5, 4.0, -1.0]);
        let a = |v: &[i64]| {
            V::C(
                OD::I64,
                vec![v.len()],
                v.iter().map(|&a| a as f64).collect(),
            )
        };
        let cases: [(&str, [f64; 3], [f64; 2]); 10] = [
            ("ReduceSum", [1.5, 2.0, 2.0], [2.0, 3.5]),
            ("ReduceMean", [0.75, 1.0, 1.0], [2.0 / 3.0, 3.5 / 3.0]),
            ("ReduceSumSquare", [1.25, 20.0, 10.0], [14.0, 17.25]),
            ("ReduceL1", [1.5, 6.0, 4.0], [6.0, 5.5]),
            (
                "ReduceL2",
                [1.25f64.sqrt(), 20f64.sqrt(), 10f64.sqrt()],
                [14f64.sqrt(), 17.25f64.sqrt()],
            ),
            ("ReduceMax", [1.0, 4.0, 3.0], [3.0, 4.0]),
            ("ReduceMin", [0.5, -2.0, -1.0], [-2.0, -1.0]),
            ("ReduceProd", [0.5, -8.0, -3.0], [-6.0, -2.0]),
            (
                "ReduceLogSumExp",
                [
                    (1f64.exp() + 0.5f64.exp()).ln(),
                    ((-2f64).exp() + 4f64.exp()).ln(),
                    (3f64.exp() + (-1f64).exp()).ln(),
                ],
                [
                    (1f64.exp() + (-2f64).exp() + 3f64.exp()).ln(),
                    (0.5f64.exp() + 4f64.exp() + (-1f64).exp()).ln(),
                ],
            ),
            (
                "ReduceLogSum",
                [1.5f64.ln(), 2f64.ln(), 2f64.ln()],
                [2f64.ln(), 3.5f64.ln()],
            ),
        ];
        for (op, over0, over1) in cases {
            let y = fwd(op, 18, &[int("keepdims", 0)], vec![t(), a(&[0])]).unwrap();
            assert_eq!(y[0].0, vec![3], "{op}");
            close(&y[0].1, &over0);
            let y = fwd(op, 18, &[], vec![t(), a(&[-1])]).unwrap();
            assert_eq!(y[0].0, vec![2, 1], "{op}");
            close(&y[0].1, &over1);
        }
        // noop_with_empty_axes keeps the elementwise part.
        let noop = [int("noop_with_empty_axes", 1)];
        close(
            &fwd1("ReduceSumSquare", 18, &noop, vec![t()]),
            &[1.0, 4.0, 9.0, 0.25, 16.0, 1.0],
        );
        close(
            &fwd1("ReduceL1", 18, &noop, vec![t()]),
            &[1.0, 2.0, 3.0, 0.5, 4.0, 1.0],
        );
        close(
            &fwd1("ReduceMax", 18, &noop, vec![t()]),
            &[1.0, -2.0, 3.0, 0.5, 4.0, -1.0],
        );
        // Large values do not overflow LogSumExp.
        let big = V::T(OD::F64, vec![2], vec![1000.0, 1000.0]);
        close(
            &fwd1("ReduceLogSumExp", 13, &[], vec![big]),
            &[1000.0 + 2f64.ln()],
        );
        // Integers.
        let i = || V::T(OD::I64, vec![2, 2], vec![3.0, -4.0, 5.0, 2.0]);
        close(
            &fwd1("ReduceSum", 13, &[], vec![i(), a(&[1])]),
            &[-1.0, 7.0],
        );
        close(
            &fwd1("ReduceProd", 13, &[ints("axes", &[0])], vec![i()]),
            &[15.0, -8.0],
        );
        close(
            &fwd1("ReduceMax", 13, &[ints("axes", &[0])], vec![i()]),
            &[5.0, 2.0],
        );
        // Half precision accumulates in f32: in f16, 2048 + 1 rounds back to 2048 and the
        // sum of 2048 and 2999 ones would stay 2048; 5047 rounds to 5048 in f16.
        let mut h = vec![1.0; 3000];
        h[0] = 2048.0;
        let y = fwd1("ReduceSum", 13, &[], vec![V::T(OD::F16, vec![3000], h)]);
        close(&y, &[5048.0]);
        // Repeated and out-of-range axes are errors.
        assert!(fwd("ReduceSum", 13, &[], vec![t(), a(&[1, -1])]).is_err());
        assert!(fwd("ReduceSum", 13, &[], vec![t(), a(&[2])]).is_err());
    }

    /// ReduceProd's gradient is exact with zeros (the product of the other elements).
    #[test]
    fn prod_with_zeros() {
        let v = vec![0.5, 0.0, 2.0, 0.0, 0.0, 3.0, -1.5, 0.7, 1.2];
        check(&Case::new(
            "ReduceProd",
            18,
            vec![In::Floats(vec![3, 3], v.clone()), axes(&[1])],
        ));
        check(&Case::new(
            "ReduceProd",
            18,
            vec![In::Floats(vec![3, 3], v), axes(&[0])],
        ));
    }

    #[test]
    fn arg_extremes() {
        let t = || V::T(OD::F32, vec![2, 3], vec![1.0, 5.0, 5.0, 7.0, 0.0, 7.0]);
        let y = fwd("ArgMax", 13, &[int("axis", 1)], vec![t()]).unwrap();
        assert_eq!(y[0].0, vec![2, 1]);
        close(&y[0].1, &[1.0, 0.0]);
        let y = fwd(
            "ArgMax",
            13,
            &[
                int("axis", -1),
                int("select_last_index", 1),
                int("keepdims", 0),
            ],
            vec![t()],
        )
        .unwrap();
        assert_eq!(y[0].0, vec![2]);
        close(&y[0].1, &[2.0, 2.0]);
        close(&fwd1("ArgMin", 13, &[], vec![t()]), &[0.0, 1.0, 0.0]);
        close(
            &fwd1(
                "ArgMin",
                13,
                &[int("axis", 1), int("keepdims", 0)],
                vec![t()],
            ),
            &[0.0, 1.0],
        );
        let i = V::T(OD::I32, vec![4], vec![3.0, -4.0, 3.0, 2.0]);
        close(
            &fwd1("ArgMax", 13, &[int("select_last_index", 1)], vec![i]),
            &[2.0],
        );
        for op in ["ArgMax", "ArgMin"] {
            check(&Case::new(op, 13, vec![In::Rand(vec![3, 4])]).attr(int("axis", 1)));
            check(
                &Case::new(op, 13, vec![In::Rand(vec![3, 4])])
                    .attr(int("axis", -2))
                    .attr(int("keepdims", 0)),
            );
        }
        assert!(fwd("ArgMax", 13, &[int("axis", 2)], vec![t()]).is_err());
    }
}
