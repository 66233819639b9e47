//! Reductions and arg-reductions. Small known inputs are folded (`ReduceProd` of a shape).

use super::rule::{none, save_x, Ctx, GradRule, OpSpec, Registry, Saved};
use crate::error::Result;
use crate::tensor::{strides, DType, Data, Fact, Tensor};

/// The reduced axes; `None` means the op is an identity (`noop_with_empty_axes`).
fn reduce_axes(cx: &Ctx, rank: usize) -> Result<Option<Vec<usize>>> {
    let axes_as_input = cx.opset >= 18 || (cx.op == "ReduceSum" && cx.opset >= 13);
    let axes = if axes_as_input {
        cx.const_ints(1)?
    } else {
        cx.attrs.ints("axes")?.map(|a| a.to_vec())
    };
    match axes {
        Some(a) if !a.is_empty() => Ok(Some(cx.axes(&a, rank)?)),
        _ => {
            if axes_as_input && cx.attrs.int_or("noop_with_empty_axes", 0)? != 0 {
                Ok(None)
            } else {
                Ok(Some((0..rank).collect()))
            }
        }
    }
}

fn reduce_infer(cx: &Ctx) -> Result<Vec<Fact>> {
    let x = cx.input(0)?;
    let Some(axes) = reduce_axes(cx, x.rank())? else {
        return Ok(vec![x.clone()]);
    };
    let keep = cx.attrs.int_or("keepdims", 1)? != 0;
    let mut shape = vec![];
    for (i, &d) in x.shape.iter().enumerate() {
        if axes.contains(&i) {
            if keep {
                shape.push(1);
            }
        } else {
            shape.push(d);
        }
    }
    if let Some(v) = &x.value {
        if let Some(t) = fold(cx.op, v, &axes, shape.clone()) {
            return Ok(vec![Fact::with_value(t)]);
        }
    }
    Ok(vec![Fact::new(x.dtype, shape)])
}

fn fold(op: &str, v: &Tensor, axes: &[usize], shape: Vec<u64>) -> Option<Tensor> {
    let st = strides(&v.shape);
    // Output index of each input element: its coordinates with reduced axes dropped.
    let kept: Vec<usize> = (0..v.shape.len()).filter(|a| !axes.contains(a)).collect();
    let kept_shape: Vec<u64> = kept.iter().map(|&a| v.shape[a]).collect();
    let kst = strides(&kept_shape);
    let n_out = kept_shape.iter().product::<u64>() as usize;
    let vals = v.as_f64();
    let mut acc: Vec<Vec<f64>> = vec![vec![]; n_out];
    for (flat, &x) in vals.iter().enumerate() {
        let mut rem = flat as u64;
        let mut out = 0u64;
        for (a, &s) in st.iter().enumerate() {
            let c = rem.checked_div(s).unwrap_or(0);
            rem -= c * s;
            if let Some(k) = kept.iter().position(|&q| q == a) {
                out += c * kst[k];
            }
        }
        acc.get_mut(out as usize)?.push(x);
    }
    let r: Vec<f64> = acc
        .iter()
        .map(|xs| match op {
            "ReduceSum" => Some(xs.iter().sum()),
            "ReduceProd" => Some(xs.iter().product()),
            "ReduceMax" => xs.iter().copied().reduce(f64::max),
            "ReduceMin" => xs.iter().copied().reduce(f64::min),
            "ReduceMean" => Some(xs.iter().sum::<f64>() / xs.len().max(1) as f64),
            _ => None,
        })
        .collect::<Option<_>>()?;
    Some(Tensor::new(v.dtype, shape, Data::F(r)))
}

fn arg_infer(cx: &Ctx) -> Result<Vec<Fact>> {
    let x = cx.input(0)?;
    let axis = cx.axis(cx.attrs.int_or("axis", 0)?, x.rank())?;
    let keep = cx.attrs.int_or("keepdims", 1)? != 0;
    let mut shape = x.shape.clone();
    if keep {
        shape[axis] = 1;
    } else {
        shape.remove(axis);
    }
    Ok(vec![Fact::new(DType::I64, shape)])
}

fn save_xy(_: &Ctx, _: &[Fact], _: &[bool]) -> GradRule {
    GradRule::saves(vec![Saved::Input(0), Saved::Output(0)], 1.0)
}

pub fn register(r: &mut Registry) {
    let red = |grad: fn(&Ctx, &[Fact], &[bool]) -> GradRule| OpSpec {
        infer: reduce_infer,
        flops: |cx, _| cx.in_numel(0),
        diff_in: super::rule::first,
        grad,
        ..OpSpec::DEFAULT
    };
    r.insert("ReduceMean", red(super::rule::nothing_saved));
    r.insert("ReduceSum", red(super::rule::nothing_saved));
    r.insert("ReduceSumSquare", red(save_x));
    r.insert("ReduceL1", red(save_x));
    r.insert("ReduceL2", red(save_xy));
    r.insert("ReduceMax", red(save_xy));
    r.insert("ReduceMin", red(save_xy));
    r.insert("ReduceProd", red(save_xy));
    r.insert("ReduceLogSumExp", red(save_xy));
    r.insert("ReduceLogSum", red(save_xy));
    for op in ["ArgMax", "ArgMin"] {
        r.insert(
            op,
            OpSpec {
                infer: arg_infer,
                flops: |cx, _| cx.in_numel(0),
                diff_in: none,
                diff_out: none,
                ..OpSpec::DEFAULT
            },
        );
    }
}
