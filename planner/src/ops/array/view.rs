//! Views and layout ops: Identity, Reshape, Flatten, Squeeze, Unsqueeze, Transpose, Expand,
//! Slice, Split, Concat, Tile, Trilu, DepthToSpace, SpaceToDepth, Cast, CastLike,
//! ReverseSequence.

use super::common::{coords, pick, reshaped, same_as_input, save_indices, small};
use crate::error::Result;
use crate::ops::rule::{first, nonneg, view0, zero_flops, Ctx, OpSpec, Registry};
use crate::tensor::{numel, prod_sat, strides, DType, Data, Fact, Tensor};

fn reshape_infer(cx: &Ctx) -> Result<Vec<Fact>> {
    let x = cx.input(0)?;
    if let Some(s) = cx.opt(1).filter(|s| s.dtype != DType::I64) {
        return Err(cx.err(format!("input shape is {:?}; it must be int64", s.dtype)));
    }
    let spec = cx
        .const_ints(1)?
        .ok_or_else(|| cx.err("shape input is missing"))?;
    let allowzero = cx.attrs.int_or("allowzero", 0)? != 0;
    let mut shape = Vec::with_capacity(spec.len());
    let mut infer_at = None;
    for (i, &d) in spec.iter().enumerate() {
        match d {
            -1 => {
                if infer_at.replace(i).is_some() {
                    return Err(cx.err(format!("shape {spec:?} has more than one -1")));
                }
                shape.push(1);
            }
            0 if !allowzero => shape.push(*x.shape.get(i).ok_or_else(|| {
                cx.err(format!(
                    "shape {spec:?} copies dim {i} that the input {:?} lacks",
                    x.shape
                ))
            })?),
            d if d < 0 => return Err(cx.err(format!("invalid dim {d} in shape {spec:?}"))),
            d => shape.push(d as u64),
        }
    }
    if let Some(i) = infer_at {
        let known = numel(&shape).unwrap_or(0);
        if known == 0 || x.numel() % known != 0 {
            return Err(cx.err(format!(
                "cannot reshape {:?} to {spec:?}: {} elements do not divide",
                x.shape,
                x.numel()
            )));
        }
        shape[i] = x.numel() / known;
    }
    reshaped(cx, shape)
}

fn flatten_infer(cx: &Ctx) -> Result<Vec<Fact>> {
    let x = cx.input(0)?;
    let a = cx.attrs.int_or("axis", 1)?;
    let r = x.rank() as i64;
    let a = if a < 0 { a + r } else { a };
    if a < 0 || a > r {
        return Err(cx.attrs.err("axis", format!("out of range for rank {r}")));
    }
    let a = a as usize;
    let outer = prod_sat(&x.shape[..a]);
    let inner = prod_sat(&x.shape[a..]);
    reshaped(cx, vec![outer, inner])
}

fn squeeze_axes(cx: &Ctx) -> Result<Option<Vec<i64>>> {
    if cx.opset < 13 {
        Ok(cx.attrs.ints("axes")?.map(|a| a.to_vec()))
    } else {
        cx.const_ints(1)
    }
}

fn squeeze_infer(cx: &Ctx) -> Result<Vec<Fact>> {
    let x = cx.input(0)?;
    let shape = match squeeze_axes(cx)? {
        None => x.shape.iter().copied().filter(|&d| d != 1).collect(),
        Some(axes) => {
            let axes = cx.axes(&axes, x.rank())?;
            for &a in &axes {
                if x.shape[a] != 1 {
                    return Err(cx.err(format!(
                        "cannot squeeze axis {a} of size {} (shape {:?})",
                        x.shape[a], x.shape
                    )));
                }
            }
            x.shape
                .iter()
                .enumerate()
                .filter(|(i, _)| !axes.contains(i))
                .map(|(_, &d)| d)
                .collect()
        }
    };
    reshaped(cx, shape)
}

fn unsqueeze_infer(cx: &Ctx) -> Result<Vec<Fact>> {
    let x = cx.input(0)?;
    let axes = squeeze_axes(cx)?.ok_or_else(|| cx.err("axes are required"))?;
    let rank = x.rank() + axes.len();
    let axes = cx.axes(&axes, rank)?;
    let mut src = x.shape.iter();
    let shape = (0..rank)
        .map(|i| {
            if axes.contains(&i) {
                1
            } else {
                src.next().copied().unwrap_or(1)
            }
        })
        .collect();
    reshaped(cx, shape)
}

fn transpose_infer(cx: &Ctx) -> Result<Vec<Fact>> {
    let x = cx.input(0)?;
    let perm: Vec<usize> = match cx.attrs.ints("perm")? {
        Some(p) => {
            let p = cx.axes(p, x.rank())?;
            if p.len() != x.rank() {
                return Err(cx.attrs.err(
                    "perm",
                    format!("length {} differs from rank {}", p.len(), x.rank()),
                ));
            }
            p
        }
        None => (0..x.rank()).rev().collect(),
    };
    let shape: Vec<u64> = perm.iter().map(|&p| x.shape[p]).collect();
    if let Some(v) = &x.value {
        let st = strides(&x.shape);
        let idx = coords(&shape).map(|c| {
            perm.iter()
                .enumerate()
                .map(|(k, &p)| c[k] * st[p])
                .sum::<u64>() as usize
        });
        if let Some(t) = pick(v, shape.clone(), idx) {
            return Ok(vec![Fact::with_value(t)]);
        }
    }
    Ok(vec![Fact::new(x.dtype, shape)])
}

fn concat_infer(cx: &Ctx) -> Result<Vec<Fact>> {
    let x = cx.input(0)?;
    let axis = cx.axis(
        cx.attrs
            .int("axis")?
            .ok_or_else(|| cx.attrs.err("axis", "required attribute is missing"))?,
        x.rank(),
    )?;
    let mut shape = x.shape.clone();
    shape[axis] = 0;
    for (i, f) in cx.inputs.iter().enumerate() {
        let f = f
            .as_ref()
            .ok_or_else(|| cx.err(format!("input {i} is missing")))?;
        if f.rank() != x.rank()
            || f.shape
                .iter()
                .zip(&x.shape)
                .enumerate()
                .any(|(k, (a, b))| k != axis && a != b)
        {
            return Err(cx.err(format!(
                "input {i} of shape {:?} does not match {:?} outside axis {axis}",
                f.shape, x.shape
            )));
        }
        shape[axis] = shape[axis].saturating_add(f.shape[axis]);
    }
    let values: Option<Vec<&Tensor>> = cx
        .inputs
        .iter()
        .map(|f| f.as_ref().and_then(|f| f.value.as_deref()))
        .collect();
    if let (Some(values), true) = (values, small(x.dtype, &shape)) {
        let outer = prod_sat(&shape[..axis]);
        let inner = prod_sat(&shape[axis + 1..]);
        let mut ints = vec![];
        let mut floats = vec![];
        for o in 0..outer {
            for v in &values {
                let chunk = v.shape[axis] * inner;
                let start = (o * chunk) as usize;
                let end = start + chunk as usize;
                match &v.data {
                    Data::I(d) => ints.extend(d.get(start..end).unwrap_or(&[])),
                    Data::F(d) => floats.extend(d.get(start..end).unwrap_or(&[])),
                }
            }
        }
        let data = if x.dtype.is_float() {
            Data::F(if floats.is_empty() {
                ints.iter().map(|&i| i as f64).collect()
            } else {
                floats
            })
        } else {
            Data::I(if ints.is_empty() {
                floats.iter().map(|&f| f as i64).collect()
            } else {
                ints
            })
        };
        if data.len() as u64 == numel(&shape).unwrap_or(0) {
            return Ok(vec![Fact::with_value(Tensor::new(x.dtype, shape, data))]);
        }
    }
    Ok(vec![cx.fact(x.dtype, shape)?])
}

fn split_infer(cx: &Ctx) -> Result<Vec<Fact>> {
    let x = cx.input(0)?;
    let axis = cx.axis(cx.attrs.int_or("axis", 0)?, x.rank())?;
    let n = cx.n_outputs.max(1) as u64;
    let split: Vec<u64> = match if cx.opset < 13 {
        cx.attrs.ints("split")?.map(|s| s.to_vec())
    } else {
        cx.const_ints(1)?
    } {
        Some(s) => nonneg(cx, "split", &s)?,
        None => {
            let d = x.shape[axis];
            if let Some(k) = cx.attrs.int("num_outputs")? {
                if k < 1 || k as u64 != n {
                    return Err(cx
                        .attrs
                        .err("num_outputs", format!("is {k}; the node has {n} output(s)")));
                }
            }
            // Equal parts (opset 18: the last one may be smaller), none empty.
            if n > d || (cx.opset < 18 && !d.is_multiple_of(n)) {
                return Err(cx.err(format!(
                    "axis {axis} of size {d} does not split into {n} {}parts",
                    if cx.opset < 18 {
                        "equal "
                    } else {
                        "non-empty "
                    }
                )));
            }
            let chunk = d.div_ceil(n);
            (0..n)
                .map(|i| chunk.min(d.saturating_sub(i * chunk)))
                .collect()
        }
    };
    if split.len() != cx.n_outputs
        || split.iter().fold(0u64, |a, &b| a.saturating_add(b)) != x.shape[axis]
    {
        return Err(cx.err(format!(
            "split {split:?} does not divide axis {axis} of size {} into {} outputs",
            x.shape[axis], cx.n_outputs
        )));
    }
    Ok(split
        .into_iter()
        .map(|s| {
            let mut shape = x.shape.clone();
            shape[axis] = s;
            Fact::new(x.dtype, shape)
        })
        .collect())
}

struct SliceSpec {
    starts: Vec<i64>,
    ends: Vec<i64>,
    axes: Vec<usize>,
    steps: Vec<i64>,
}

fn slice_spec(cx: &Ctx, rank: usize) -> Result<SliceSpec> {
    let (starts, ends, axes, steps) = if cx.opset < 10 {
        (
            cx.attrs.ints("starts")?.map(|v| v.to_vec()),
            cx.attrs.ints("ends")?.map(|v| v.to_vec()),
            cx.attrs.ints("axes")?.map(|v| v.to_vec()),
            None,
        )
    } else {
        (
            cx.const_ints(1)?,
            cx.const_ints(2)?,
            cx.const_ints(3)?,
            cx.const_ints(4)?,
        )
    };
    let starts = starts.ok_or_else(|| cx.err("starts are required"))?;
    let ends = ends.ok_or_else(|| cx.err("ends are required"))?;
    let axes = match axes {
        Some(a) => cx.axes(&a, rank)?,
        None => cx.axes(&(0..starts.len() as i64).collect::<Vec<_>>(), rank)?,
    };
    let steps = steps.unwrap_or_else(|| vec![1; starts.len()]);
    if ends.len() != starts.len() || axes.len() != starts.len() || steps.len() != starts.len() {
        return Err(cx.err("starts, ends, axes and steps differ in length"));
    }
    if steps.contains(&0) {
        return Err(cx.err("slice step 0"));
    }
    Ok(SliceSpec {
        starts,
        ends,
        axes,
        steps,
    })
}

/// Per axis: the first index, the step and the count.
pub fn slice_ranges(cx: &Ctx, shape: &[u64]) -> Result<Vec<(i64, i64, u64)>> {
    let spec = slice_spec(cx, shape.len())?;
    let mut r: Vec<(i64, i64, u64)> = shape.iter().map(|&d| (0, 1, d)).collect();
    for k in 0..spec.axes.len() {
        let a = spec.axes[k];
        let d = shape[a] as i64;
        let step = spec.steps[k];
        let clamp = |v: i64, lo: i64, hi: i64| v.max(lo).min(hi);
        let norm = |v: i64| if v < 0 { v.saturating_add(d) } else { v };
        let (s, e) = if step > 0 {
            (
                clamp(norm(spec.starts[k]), 0, d),
                clamp(norm(spec.ends[k]), 0, d),
            )
        } else {
            (
                clamp(norm(spec.starts[k]), 0, d - 1),
                clamp(norm(spec.ends[k]), -1, d - 1),
            )
        };
        let (s128, e128, st128) = (i128::from(s), i128::from(e), i128::from(step));
        let count = if step > 0 && e > s {
            (e128 - s128 + st128 - 1) / st128
        } else if step < 0 && s > e {
            (s128 - e128 - st128 - 1) / -st128
        } else {
            0
        };
        let count = i64::try_from(count).unwrap_or(0);
        r[a] = (s, step, count as u64);
    }
    Ok(r)
}

fn slice_infer(cx: &Ctx) -> Result<Vec<Fact>> {
    let x = cx.input(0)?;
    let ranges = slice_ranges(cx, &x.shape)?;
    let shape: Vec<u64> = ranges.iter().map(|r| r.2).collect();
    if let Some(v) = &x.value {
        let st = strides(&x.shape);
        let idx = coords(&shape).map(|c| {
            c.iter()
                .zip(&ranges)
                .zip(&st)
                .map(|((&ci, &(s, step, _)), &stride)| ((s + ci as i64 * step) as u64) * stride)
                .sum::<u64>() as usize
        });
        if let Some(t) = pick(v, shape.clone(), idx) {
            return Ok(vec![Fact::with_value(t)]);
        }
    }
    Ok(vec![Fact::new(x.dtype, shape)])
}
fn expand_infer(cx: &Ctx) -> Result<Vec<Fact>> {
    let x = cx.input(0)?;
    let target = cx
        .const_ints(1)?
        .ok_or_else(|| cx.err("shape input is missing"))?;
    let target = nonneg(cx, "shape", &target)?;
    let shape = crate::tensor::broadcast(&x.shape, &target)
        .ok_or_else(|| cx.err(format!("cannot expand {:?} to {target:?}", x.shape)))?;
    if let (Some(v), true) = (&x.value, small(x.dtype, &shape)) {
        let idx = crate::tensor::broadcast_index(&x.shape, &shape);
        if let Some(t) = pick(v, shape.clone(), idx.into_iter()) {
            return Ok(vec![Fact::with_value(t)]);
        }
    }
    Ok(vec![cx.fact(x.dtype, shape)?])
}

fn tile_infer(cx: &Ctx) -> Result<Vec<Fact>> {
    let x = cx.input(0)?;
    let reps = cx
        .const_ints(1)?
        .ok_or_else(|| cx.err("repeats input is missing"))?;
    let reps = nonneg(cx, "repeats", &reps)?;
    if reps.len() != x.rank() {
        return Err(cx.err(format!("repeats {reps:?} do not match rank {}", x.rank())));
    }
    let shape: Vec<u64> = x
        .shape
        .iter()
        .zip(&reps)
        .map(|(a, b)| a.saturating_mul(*b))
        .collect();
    if let (Some(v), true) = (&x.value, small(x.dtype, &shape)) {
        let st = strides(&x.shape);
        let xs = x.shape.clone();
        let idx = coords(&shape).map(|c| {
            c.iter()
                .zip(&xs)
                .zip(&st)
                .map(|((&ci, &d), &s)| (ci % d.max(1)) * s)
                .sum::<u64>() as usize
        });
        if let Some(t) = pick(v, shape.clone(), idx) {
            return Ok(vec![Fact::with_value(t)]);
        }
    }
    Ok(vec![cx.fact(x.dtype, shape)?])
}

fn cast_target(cx: &Ctx) -> Result<DType> {
    let to = cx
        .attrs
        .int("to")?
        .ok_or_else(|| cx.attrs.err("to", "required attribute is missing"))?;
    match DType::from_onnx(to) {
        Some(DType::String) => Err(cx.attrs.err(
            "to",
            "STRING is not supported: remat plans numeric tensors only",
        )),
        Some(d) => Ok(d),
        None => Err(cx.attrs.err("to", format!("unknown data type {to}"))),
    }
}

fn cast_to(cx: &Ctx, dtype: DType) -> Result<Vec<Fact>> {
    let x = cx.input(0)?;
    Ok(vec![match &x.value {
        Some(v) => Fact::with_value(v.cast(dtype)),
        None => Fact::new(dtype, x.shape.clone()),
    }])
}
fn space_depth_infer(cx: &Ctx) -> Result<Vec<Fact>> {
    let x = cx.input(0)?;
    // DepthToSpace's `mode` (and SpaceToDepth's, from opset 28): how channels split into blocks.
    if let Some(m) = cx.attrs.string("mode")? {
        if m != "DCR" && m != "CRD" {
            return Err(cx
                .attrs
                .err("mode", format!("{m:?} is neither \"DCR\" nor \"CRD\"")));
        }
    }
    let b = cx
        .attrs
        .int("blocksize")?
        .ok_or_else(|| cx.attrs.err("blocksize", "required"))?;
    if b < 1 || x.rank() != 4 {
        return Err(cx.err(format!(
            "needs a 4-D input and a positive blocksize, got {:?} and {b}",
            x.shape
        )));
    }
    let b = b as u64;
    let bb = b
        .checked_mul(b)
        .ok_or_else(|| cx.attrs.err("blocksize", format!("{b} is too large")))?;
    let (n, c, h, w) = (x.shape[0], x.shape[1], x.shape[2], x.shape[3]);
    let shape = if cx.op == "DepthToSpace" {
        if c % bb != 0 {
            return Err(cx.err(format!("channels {c} not divisible by blocksize² {bb}")));
        }
        vec![n, c / bb, h.saturating_mul(b), w.saturating_mul(b)]
    } else {
        if h % b != 0 || w % b != 0 {
            return Err(cx.err(format!(
                "spatial dims {h}x{w} not divisible by blocksize {b}"
            )));
        }
        vec![n, c.saturating_mul(bb), h / b, w / b]
    };
    Ok(vec![cx.fact(x.dtype, shape)?])
}

pub(super) fn register(r: &mut Registry) {
    let view = |infer: fn(&Ctx) -> Result<Vec<Fact>>| OpSpec {
        infer,
        flops: zero_flops,
        diff_in: first,
        view: view0,
        ..OpSpec::DEFAULT
    };
    r.insert("Identity", view(|cx| Ok(vec![cx.input(0)?.clone()])));
    r.insert("Reshape", view(reshape_infer));
    r.insert("Flatten", view(flatten_infer));
    r.insert("Squeeze", view(squeeze_infer));
    r.insert("Unsqueeze", view(unsqueeze_infer));
    r.insert("Transpose", view(transpose_infer));
    r.insert("Expand", view(expand_infer));
    r.insert(
        "Slice",
        OpSpec {
            view: |cx| {
                let steps_positive = cx.opset < 10
                    || cx
                        .const_ints(4)
                        .ok()
                        .flatten()
                        .is_none_or(|s| s.iter().all(|&x| x > 0));
                steps_positive.then_some(0)
            },
            ..view(slice_infer)
        },
    );
    r.insert(
        "Split",
        OpSpec {
            infer: split_infer,
            ..view(split_infer)
        },
    );
    r.insert(
        "Concat",
        OpSpec {
            infer: concat_infer,
            ..OpSpec::DEFAULT
        },
    );
    r.insert(
        "Tile",
        OpSpec {
            infer: tile_infer,
            diff_in: first,
            ..OpSpec::DEFAULT
        },
    );
    r.insert(
        "Trilu",
        OpSpec {
            infer: same_as_input,
            diff_in: first,
            ..OpSpec::DEFAULT
        },
    );
    r.insert(
        "DepthToSpace",
        OpSpec {
            infer: space_depth_infer,
            ..OpSpec::DEFAULT
        },
    );
    r.insert(
        "SpaceToDepth",
        OpSpec {
            infer: space_depth_infer,
            ..OpSpec::DEFAULT
        },
    );
    r.insert(
        "Cast",
        OpSpec {
            infer: |cx| cast_to(cx, cast_target(cx)?),
            diff_in: first,
            view: |cx| match (cx.opt(0), cast_target(cx)) {
                (Some(x), Ok(t)) if x.dtype == t => Some(0),
                _ => None,
            },
            ..OpSpec::DEFAULT
        },
    );
    r.insert(
        "CastLike",
        OpSpec {
            infer: |cx| cast_to(cx, cx.input(1)?.dtype),
            diff_in: first,
            ..OpSpec::DEFAULT
        },
    );
    // The backward reverses the gradient with the same lengths: it keeps `sequence_lens`.
    r.insert(
        "ReverseSequence",
        OpSpec {
            infer: same_as_input,
            diff_in: first,
            grad: save_indices,
            ..OpSpec::DEFAULT
        },
    );
}
