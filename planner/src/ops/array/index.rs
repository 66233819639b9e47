//! Gathers, scatters and ordered scans: Gather, GatherElements, GatherND, ScatterND,
//! ScatterElements, Scatter, TopK, CumSum.

use super::common::{pick, same_as_input, save_indices, small};
use crate::error::Result;
use crate::ops::rule::{first, Ctx, GradRule, OpSpec, Registry, Saved};
use crate::tensor::{prod_sat, DType, Fact};

fn gather_infer(cx: &Ctx) -> Result<Vec<Fact>> {
    let x = cx.input(0)?;
    let ind = cx.input(1)?;
    let axis = cx.axis(cx.attrs.int_or("axis", 0)?, x.rank())?;
    let mut shape = x.shape[..axis].to_vec();
    shape.extend(&ind.shape);
    shape.extend(&x.shape[axis + 1..]);
    let d = x.shape[axis] as i64;
    indices_in_range(cx, ind, axis, d)?;
    if let (Some(v), Some(iv), true) = (&x.value, &ind.value, small(x.dtype, &shape)) {
        let idx: Vec<i64> = iv.as_i64();
        let idx: Vec<u64> = idx
            .iter()
            .map(|&i| if i < 0 { (i + d) as u64 } else { i as u64 })
            .collect();
        let outer = prod_sat(&x.shape[..axis]);
        let inner = prod_sat(&x.shape[axis + 1..]);
        let flat = (0..outer).flat_map(|o| {
            let idx = &idx;
            idx.iter().flat_map(move |&i| {
                (0..inner).map(move |k| ((o * d as u64 + i) * inner + k) as usize)
            })
        });
        if let Some(t) = pick(v, shape.clone(), flat) {
            return Ok(vec![Fact::with_value(t)]);
        }
    }
    Ok(vec![cx.fact(x.dtype, shape)?])
}

/// Indices known at import (a constant) are checked whatever the data: the executor would
/// fail on them.
fn indices_in_range(cx: &Ctx, ind: &Fact, axis: usize, d: i64) -> Result<()> {
    if let Some(iv) = &ind.value {
        if let Some(bad) = iv.as_i64().iter().find(|&&i| i < -d || i >= d) {
            return Err(cx.err(format!(
                "index {bad} out of range for axis {axis} of size {d}"
            )));
        }
    }
    Ok(())
}

/// GatherElements, ScatterElements and Scatter: indices of the data's rank along `axis`.
fn elements_infer(cx: &Ctx) -> Result<Vec<Fact>> {
    let x = cx.input(0)?;
    let ind = cx.input(1)?;
    let axis = cx.axis(cx.attrs.int_or("axis", 0)?, x.rank())?;
    if ind.rank() != x.rank() {
        return Err(cx.err(format!(
            "indices {:?} and data {:?} differ in rank",
            ind.shape, x.shape
        )));
    }
    indices_in_range(cx, ind, axis, x.shape[axis] as i64)?;
    if cx.op == "GatherElements" {
        return Ok(vec![Fact::new(x.dtype, ind.shape.clone())]);
    }
    if let Some(u) = cx.opt(2).filter(|u| u.shape != ind.shape) {
        return Err(cx.err(format!(
            "updates {:?} differ in shape from indices {:?}",
            u.shape, ind.shape
        )));
    }
    same_as_input(cx)
}

/// ScatterND: each row of indices (its last dim) addresses a slice of the data; constant rows
/// are checked against the data's dims.
fn scatter_nd_infer(cx: &Ctx) -> Result<Vec<Fact>> {
    let x = cx.input(0)?;
    let ind = cx.input(1)?;
    let k = *ind
        .shape
        .last()
        .ok_or_else(|| cx.err("indices must have rank >= 1"))? as usize;
    if k == 0 || k > x.rank() {
        return Err(cx.err(format!(
            "indices {:?} address {k} dims of data {:?}",
            ind.shape, x.shape
        )));
    }
    if let Some(iv) = &ind.value {
        for (j, &i) in iv.as_i64().iter().enumerate() {
            let d = x.shape[j % k] as i64;
            if i < -d || i >= d {
                return Err(cx.err(format!(
                    "index {i} out of range for axis {} of size {d}",
                    j % k
                )));
            }
        }
    }
    same_as_input(cx)
}

/// CumSum: the axis is a one-element integer tensor within the data's rank.
fn cumsum_infer(cx: &Ctx) -> Result<Vec<Fact>> {
    let x = cx.input(0)?;
    let a = cx.input(1)?;
    if !matches!(a.dtype, DType::I32 | DType::I64) || a.numel() != 1 {
        return Err(cx.err(format!(
            "input axis must be one int32 or int64 value, got {:?} of shape {:?}",
            a.dtype, a.shape
        )));
    }
    if let Some(&axis) = a
        .value
        .as_ref()
        .and_then(|v| v.as_i64().first().copied())
        .as_ref()
    {
        cx.axis(axis, x.rank())?;
    }
    same_as_input(cx)
}

fn gather_nd_infer(cx: &Ctx) -> Result<Vec<Fact>> {
    let x = cx.input(0)?;
    let ind = cx.input(1)?;
    let b = cx.attrs.int_or("batch_dims", 0)?;
    let k = *ind
        .shape
        .last()
        .ok_or_else(|| cx.err("indices must have rank >= 1"))?;
    let b = usize::try_from(b).map_err(|_| cx.attrs.err("batch_dims", "must be non-negative"))?;
    if b + k as usize > x.rank() || b >= ind.rank() {
        return Err(cx.err(format!(
            "indices {:?} with batch_dims {b} do not index data {:?}",
            ind.shape, x.shape
        )));
    }
    let mut shape = ind.shape[..ind.rank() - 1].to_vec();
    shape.extend(&x.shape[b + k as usize..]);
    Ok(vec![cx.fact(x.dtype, shape)?])
}
fn topk_infer(cx: &Ctx) -> Result<Vec<Fact>> {
    let x = cx.input(0)?;
    let axis = cx.axis(cx.attrs.int_or("axis", -1)?, x.rank())?;
    let k = if cx.opset < 10 {
        cx.attrs.int("k")?
    } else {
        cx.const_ints(1)?.and_then(|v| v.first().copied())
    }
    .ok_or_else(|| cx.err("k is required"))?;
    if k < 0 || k as u64 > x.shape[axis] {
        return Err(cx.err(format!(
            "k = {k} is out of range for axis of size {}",
            x.shape[axis]
        )));
    }
    let mut shape = x.shape.clone();
    shape[axis] = k as u64;
    Ok(vec![
        Fact::new(x.dtype, shape.clone()),
        Fact::new(DType::I64, shape),
    ])
}
/// Scatters: a plain or additive scatter routes the gradient by the indices alone; a mul, max
/// or min reduction also needs the data and the updates it combined.
fn scatter_grad(cx: &Ctx, _: &[Fact], _: &[bool]) -> GradRule {
    let plain = matches!(
        cx.attrs.string("reduction").ok().flatten().as_deref(),
        None | Some("none") | Some("add")
    );
    if plain {
        GradRule::saves(vec![Saved::Input(1)], 1.0)
    } else {
        GradRule::saves(vec![Saved::Input(0), Saved::Input(1), Saved::Input(2)], 1.0)
    }
}

pub(super) fn register(r: &mut Registry) {
    r.insert(
        "Gather",
        OpSpec {
            infer: gather_infer,
            diff_in: first,
            grad: save_indices,
            view: |cx| cx.opt(1).filter(|i| i.rank() == 0).map(|_| 0),
            ..OpSpec::DEFAULT
        },
    );
    r.insert(
        "GatherND",
        OpSpec {
            infer: gather_nd_infer,
            diff_in: first,
            grad: save_indices,
            ..OpSpec::DEFAULT
        },
    );
    r.insert(
        "GatherElements",
        OpSpec {
            infer: elements_infer,
            diff_in: first,
            grad: save_indices,
            ..OpSpec::DEFAULT
        },
    );
    // `Scatter` (opsets 9-10) is `ScatterElements` under its old name.
    for op in ["ScatterND", "ScatterElements", "Scatter"] {
        r.insert(
            op,
            OpSpec {
                infer: if op == "ScatterND" {
                    scatter_nd_infer
                } else {
                    elements_infer
                },
                diff_in: |_, i| i != 1,
                grad: scatter_grad,
                ..OpSpec::DEFAULT
            },
        );
    }
    r.insert(
        "CumSum",
        OpSpec {
            infer: cumsum_infer,
            diff_in: first,
            ..OpSpec::DEFAULT
        },
    );
    r.insert(
        "TopK",
        OpSpec {
            infer: topk_infer,
            flops: |cx, _| cx.in_numel(0) * 2.0,
            diff_in: first,
            diff_out: first,
            grad: |_, _, _| GradRule::saves(vec![Saved::Output(1)], 1.0),
            ..OpSpec::DEFAULT
        },
    );
}
