//! Layout and shape ops: reshapes and views, concatenation and slicing, gathers and
//! scatters, the shape-arithmetic sources (`Shape`, `Constant`, `ConstantOfShape`, `Range`),
//! padding and resizing. Small integer tensors are folded so that exporters' shape chains
//! (`Shape` → `Gather` → `Concat` → `Reshape`) resolve to constants.

use super::{first, none, nonneg, view0, zero_flops, Ctx, GradRule, OpSpec, Registry, Saved};
use crate::error::Result;
use crate::onnx::decode_tensor;
use crate::tensor::{numel, prod_sat, strides, DType, Data, Fact, Tensor};

/// Output 0 = input 0 with another shape, keeping a known value.
fn reshaped(cx: &Ctx, shape: Vec<u64>) -> Result<Vec<Fact>> {
    let x = cx.input(0)?;
    if numel(&shape) != Some(x.numel()) {
        return Err(cx.err(format!(
            "cannot reshape {:?} ({} elements) to {shape:?}",
            x.shape,
            x.numel()
        )));
    }
    Ok(vec![match &x.value {
        Some(v) => Fact::with_value(v.reshaped(shape)),
        None => Fact::new(x.dtype, shape),
    }])
}

/// Gathers elements of a small known tensor by flat index into a new tensor.
fn pick(t: &Tensor, shape: Vec<u64>, idx: impl Iterator<Item = usize>) -> Option<Tensor> {
    let data = match &t.data {
        Data::I(v) => Data::I(idx.map(|i| v.get(i).copied()).collect::<Option<_>>()?),
        Data::F(v) => Data::F(idx.map(|i| v.get(i).copied()).collect::<Option<_>>()?),
    };
    Some(Tensor {
        dtype: t.dtype,
        shape,
        data,
    })
}

/// Row-major coordinates of every element of `shape`.
fn coords(shape: &[u64]) -> impl Iterator<Item = Vec<u64>> + '_ {
    let n = numel(shape).unwrap_or(0);
    let st = strides(shape);
    (0..n).map(move |mut flat| {
        st.iter()
            .map(|&s| {
                let c = flat.checked_div(s).unwrap_or(0);
                flat -= c * s;
                c
            })
            .collect()
    })
}

fn small(dtype: DType, shape: &[u64]) -> bool {
    numel(shape).is_some_and(|n| crate::tensor::keep_value(dtype, n))
}

fn reshape_infer(cx: &Ctx) -> Result<Vec<Fact>> {
    let x = cx.input(0)?;
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
pub(crate) fn slice_ranges(cx: &Ctx, shape: &[u64]) -> Result<Vec<(i64, i64, u64)>> {
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

fn gather_infer(cx: &Ctx) -> Result<Vec<Fact>> {
    let x = cx.input(0)?;
    let ind = cx.input(1)?;
    let axis = cx.axis(cx.attrs.int_or("axis", 0)?, x.rank())?;
    let mut shape = x.shape[..axis].to_vec();
    shape.extend(&ind.shape);
    shape.extend(&x.shape[axis + 1..]);
    if let (Some(v), Some(iv), true) = (&x.value, &ind.value, small(x.dtype, &shape)) {
        let d = x.shape[axis] as i64;
        let idx: Vec<i64> = iv.as_i64();
        if let Some(bad) = idx.iter().find(|&&i| i < -d || i >= d) {
            return Err(cx.err(format!(
                "index {bad} out of range for axis {axis} of size {d}"
            )));
        }
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
    DType::from_onnx(to).ok_or_else(|| cx.attrs.err("to", format!("unknown data type {to}")))
}

fn cast_to(cx: &Ctx, dtype: DType) -> Result<Vec<Fact>> {
    let x = cx.input(0)?;
    Ok(vec![match &x.value {
        Some(v) => Fact::with_value(v.cast(dtype)),
        None => Fact::new(dtype, x.shape.clone()),
    }])
}

fn shape_infer(cx: &Ctx) -> Result<Vec<Fact>> {
    let x = cx.input(0)?;
    let r = x.rank() as i64;
    let clamp = |v: i64| (if v < 0 { v + r } else { v }).clamp(0, r) as usize;
    let start = clamp(cx.attrs.int_or("start", 0)?);
    let end = clamp(cx.attrs.int_or("end", r)?);
    let dims: Vec<i64> = x.shape[start..end.max(start)]
        .iter()
        .map(|&d| d as i64)
        .collect();
    Ok(vec![Fact::with_value(Tensor::ints(
        vec![dims.len() as u64],
        dims,
    ))])
}

/// A constant value from a `Constant` node's attributes.
fn constant_infer(cx: &Ctx) -> Result<Vec<Fact>> {
    let a = &cx.attrs;
    if let Some(t) = a.tensor("value")? {
        let d = decode_tensor(t, cx.node)?;
        return Ok(vec![match d.value {
            Some(v) => Fact::with_value(v),
            None => Fact::new(d.dtype, d.shape),
        }]);
    }
    if let Some(f) = a.float("value_float")? {
        return Ok(vec![Fact::with_value(Tensor::new(
            DType::F32,
            vec![],
            Data::F(vec![f64::from(f)]),
        ))]);
    }
    if let Some(f) = a.floats("value_floats")? {
        let v: Vec<f64> = f.iter().map(|&x| f64::from(x)).collect();
        return Ok(vec![Fact::with_value(Tensor::new(
            DType::F32,
            vec![v.len() as u64],
            Data::F(v),
        ))]);
    }
    if let Some(i) = a.int("value_int")? {
        return Ok(vec![Fact::with_value(Tensor::ints(vec![], vec![i]))]);
    }
    if let Some(i) = a.ints("value_ints")? {
        return Ok(vec![Fact::with_value(Tensor::ints(
            vec![i.len() as u64],
            i.to_vec(),
        ))]);
    }
    if a.has("value_string") || a.has("value_strings") {
        let n = a
            .list
            .iter()
            .find(|x| x.name == "value_strings")
            .map(|x| x.strings.len());
        return Ok(vec![Fact::new(
            DType::String,
            n.map(|n| vec![n as u64]).unwrap_or_default(),
        )]);
    }
    if a.has("sparse_value") {
        return Err(a.err("sparse_value", "sparse constants are not supported"));
    }
    Err(cx.err("Constant has no value attribute"))
}

fn constant_of_shape_infer(cx: &Ctx) -> Result<Vec<Fact>> {
    let dims = cx
        .const_ints(0)?
        .ok_or_else(|| cx.err("shape input is missing"))?;
    let mut shape = Vec::with_capacity(dims.len());
    for &d in &dims {
        if d < 0 {
            return Err(cx.err(format!("negative dimension {d} in shape {dims:?}")));
        }
        shape.push(d as u64);
    }
    let fill = match cx.attrs.tensor("value")? {
        Some(t) => {
            let d = decode_tensor(t, cx.node)?;
            let v = d
                .value
                .as_ref()
                .and_then(|v| v.data.get_f64(0))
                .unwrap_or(0.0);
            (d.dtype, v)
        }
        None => (DType::F32, 0.0),
    };
    let n =
        numel(&shape).ok_or_else(|| cx.err(format!("shape {shape:?} has too many elements")))?;
    if crate::tensor::keep_value(fill.0, n) {
        let t = Tensor::new(fill.0, shape, Data::F(vec![fill.1; n as usize]));
        return Ok(vec![Fact::with_value(t)]);
    }
    Ok(vec![Fact::new(fill.0, shape)])
}

fn range_infer(cx: &Ctx) -> Result<Vec<Fact>> {
    let dtype = cx.input(0)?.dtype;
    let get = |i| -> Result<f64> {
        cx.const_floats(i)?
            .and_then(|v| v.first().copied())
            .ok_or_else(|| cx.err(format!("input {i} must be a scalar")))
    };
    let (start, limit, delta) = (get(0)?, get(1)?, get(2)?);
    if delta == 0.0 || !delta.is_finite() || !start.is_finite() || !limit.is_finite() {
        return Err(cx.err(format!("invalid range {start}..{limit} step {delta}")));
    }
    let n = ((limit - start) / delta).ceil().max(0.0);
    if n > 1e15 {
        return Err(cx.err(format!("range of {n} elements is too large")));
    }
    let n = n as u64;
    if crate::tensor::keep_value(dtype, n) {
        let v: Vec<f64> = (0..n).map(|i| start + i as f64 * delta).collect();
        return Ok(vec![Fact::with_value(Tensor::new(
            dtype,
            vec![n],
            Data::F(v),
        ))]);
    }
    Ok(vec![Fact::new(dtype, vec![n])])
}

fn pad_infer(cx: &Ctx) -> Result<Vec<Fact>> {
    let x = cx.input(0)?;
    let pads = if cx.opset < 11 {
        cx.attrs.ints("pads")?.map(|p| p.to_vec())
    } else {
        cx.const_ints(1)?
    }
    .ok_or_else(|| cx.err("pads are required"))?;
    let axes = if cx.opset >= 18 {
        cx.const_ints(3)?
    } else {
        None
    };
    let axes = match axes {
        Some(a) => cx.axes(&a, x.rank())?,
        None => (0..x.rank()).collect(),
    };
    if pads.len() != 2 * axes.len() {
        return Err(cx.err(format!("pads {pads:?} do not match {} axes", axes.len())));
    }
    let mut shape = x.shape.clone();
    for (k, &a) in axes.iter().enumerate() {
        let d = (shape[a] as i64)
            .checked_add(pads[k])
            .and_then(|d| d.checked_add(pads[k + axes.len()]))
            .unwrap_or(-1);
        if d < 0 {
            return Err(cx.err(format!("pads {pads:?} make axis {a} negative")));
        }
        shape[a] = d as u64;
    }
    Ok(vec![cx.fact(x.dtype, shape)?])
}

fn resize_infer(cx: &Ctx) -> Result<Vec<Fact>> {
    let x = cx.input(0)?;
    let (scales, sizes) = match (cx.op, cx.opset) {
        ("Upsample", v) if v < 9 => (
            cx.attrs
                .floats("scales")?
                .map(|s| s.iter().map(|&f| f64::from(f)).collect()),
            None,
        ),
        ("Upsample", _) | (_, 10) => (cx.const_floats(1)?, None),
        _ => (cx.const_floats(2)?, cx.const_ints(3)?),
    };
    let axes: Vec<usize> = match cx.attrs.ints("axes")? {
        Some(a) => cx.axes(a, x.rank())?,
        None => (0..x.rank()).collect(),
    };
    let mut shape = x.shape.clone();
    match (sizes, scales) {
        (Some(sz), _) if !sz.is_empty() => {
            if sz.len() != axes.len() {
                return Err(cx.err(format!("sizes {sz:?} do not match {} axes", axes.len())));
            }
            let sz = nonneg(cx, "sizes", &sz)?;
            for (k, &a) in axes.iter().enumerate() {
                shape[a] = sz[k];
            }
        }
        (_, Some(sc)) if !sc.is_empty() => {
            if sc.len() != axes.len() {
                return Err(cx.err(format!("scales {sc:?} do not match {} axes", axes.len())));
            }
            for (k, &a) in axes.iter().enumerate() {
                let v = (shape[a] as f64 * sc[k]).floor();
                if !(0.0..1e15).contains(&v) {
                    return Err(cx.err(format!("scale {} gives an invalid size", sc[k])));
                }
                shape[a] = v as u64;
            }
        }
        _ => return Err(cx.err("neither scales nor sizes is given")),
    }
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

fn onehot_infer(cx: &Ctx) -> Result<Vec<Fact>> {
    let ind = cx.input(0)?;
    let depth = cx
        .const_floats(1)?
        .and_then(|v| v.first().copied())
        .ok_or_else(|| cx.err("depth must be a scalar"))?;
    if !(1.0..1e12).contains(&depth) {
        return Err(cx.err(format!("invalid depth {depth}")));
    }
    let values = cx.input(2)?;
    let rank = ind.rank() + 1;
    let axis = cx.axis(cx.attrs.int_or("axis", -1)?, rank)?;
    let mut shape = ind.shape.clone();
    shape.insert(axis, depth as u64);
    Ok(vec![cx.fact(values.dtype, shape)?])
}

fn space_depth_infer(cx: &Ctx) -> Result<Vec<Fact>> {
    let x = cx.input(0)?;
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

fn nonzero_infer(cx: &Ctx) -> Result<Vec<Fact>> {
    let x = cx.input(0)?;
    let v = x
        .value
        .as_ref()
        .ok_or_else(|| cx.data_dependent("the indices of non-zero elements depend on data"))?;
    let nz: Vec<Vec<u64>> = coords(&x.shape)
        .zip(v.as_f64())
        .filter(|(_, val)| *val != 0.0)
        .map(|(c, _)| c)
        .collect();
    let r = x.rank();
    let mut data = Vec::with_capacity(r * nz.len());
    for k in 0..r {
        data.extend(nz.iter().map(|c| c[k] as i64));
    }
    Ok(vec![Fact::with_value(Tensor::ints(
        vec![r as u64, nz.len() as u64],
        data,
    ))])
}

fn same_as_input(cx: &Ctx) -> Result<Vec<Fact>> {
    let x = cx.input(0)?;
    Ok(vec![Fact::new(x.dtype, x.shape.clone())])
}

fn save_indices(_: &Ctx, _: &[Fact], _: &[bool]) -> GradRule {
    GradRule::saves(vec![Saved::Input(1)], 1.0)
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

pub fn register(r: &mut Registry) {
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
            infer: |cx| {
                let i = cx.input(1)?;
                Ok(vec![Fact::new(cx.input(0)?.dtype, i.shape.clone())])
            },
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
                infer: same_as_input,
                diff_in: |_, i| i != 1,
                grad: scatter_grad,
                ..OpSpec::DEFAULT
            },
        );
    }
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
        "Pad",
        OpSpec {
            infer: pad_infer,
            diff_in: first,
            ..OpSpec::DEFAULT
        },
    );
    for op in ["Resize", "Upsample"] {
        r.insert(
            op,
            OpSpec {
                infer: resize_infer,
                flops: |_, o| 4.0 * o.iter().map(|f| f.numel() as f64).sum::<f64>(),
                diff_in: first,
                ..OpSpec::DEFAULT
            },
        );
    }
    r.insert(
        "Trilu",
        OpSpec {
            infer: same_as_input,
            diff_in: first,
            ..OpSpec::DEFAULT
        },
    );
    r.insert(
        "CumSum",
        OpSpec {
            infer: same_as_input,
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
    // Shape sources: never differentiable, always folded.
    let source = |infer: fn(&Ctx) -> Result<Vec<Fact>>| OpSpec {
        infer,
        flops: zero_flops,
        diff_in: none,
        diff_out: none,
        ..OpSpec::DEFAULT
    };
    r.insert("Shape", source(shape_infer));
    r.insert(
        "Size",
        source(|cx| {
            let n = cx.input(0)?.numel();
            Ok(vec![Fact::with_value(Tensor::ints(vec![], vec![n as i64]))])
        }),
    );
    r.insert("Constant", source(constant_infer));
    r.insert("ConstantOfShape", source(constant_of_shape_infer));
    r.insert("Range", source(range_infer));
    r.insert("OneHot", source(onehot_infer));
    r.insert("NonZero", source(nonzero_infer));
    r.insert(
        "EyeLike",
        source(|cx| {
            let x = cx.input(0)?;
            let dtype = match cx.attrs.int("dtype")? {
                Some(d) => {
                    DType::from_onnx(d).ok_or_else(|| cx.attrs.err("dtype", "unknown type"))?
                }
                None => x.dtype,
            };
            Ok(vec![Fact::new(dtype, x.shape.clone())])
        }),
    );
}

/// Random sources and other ops whose output has the shape (and optionally the type) of an
/// input or of attributes: `RandomNormal(Like)`, `RandomUniform(Like)`, `Bernoulli`,
/// quantization, `ReverseSequence`, `GridSample`, `Det`, normalizations.
pub fn register_more(r: &mut Registry) {
    fn random_infer(cx: &Ctx) -> Result<Vec<Fact>> {
        let dtype = match cx.attrs.int("dtype")? {
            Some(d) => DType::from_onnx(d).ok_or_else(|| cx.attrs.err("dtype", "unknown type"))?,
            None => cx.opt(0).map(|x| x.dtype).unwrap_or(DType::F32),
        };
        let shape = match cx.opt(0) {
            Some(x) => x.shape.clone(),
            None => {
                let s = cx
                    .attrs
                    .ints("shape")?
                    .ok_or_else(|| cx.attrs.err("shape", "required attribute is missing"))?;
                nonneg(cx, "shape", s)?
            }
        };
        Ok(vec![cx.fact(dtype, shape)?])
    }
    for op in [
        "RandomNormal",
        "RandomUniform",
        "RandomNormalLike",
        "RandomUniformLike",
        "Bernoulli",
    ] {
        r.insert(
            op,
            OpSpec {
                infer: random_infer,
                diff_in: none,
                diff_out: none,
                random: true,
                ..OpSpec::DEFAULT
            },
        );
    }
    r.insert(
        "QuantizeLinear",
        OpSpec {
            infer: |cx| {
                let x = cx.input(0)?;
                let dtype = cx.opt(2).map(|z| z.dtype).unwrap_or(DType::U8);
                Ok(vec![Fact::new(dtype, x.shape.clone())])
            },
            diff_in: first,
            ..OpSpec::DEFAULT
        },
    );
    r.insert(
        "DequantizeLinear",
        OpSpec {
            infer: |cx| {
                let x = cx.input(0)?;
                let dtype = cx.input(1)?.dtype;
                Ok(vec![Fact::new(dtype, x.shape.clone())])
            },
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
    for op in ["LpNormalization", "MeanVarianceNormalization"] {
        r.insert(
            op,
            OpSpec {
                infer: same_as_input,
                flops: |cx, _| 4.0 * cx.in_numel(0),
                grad: |_, _, _| GradRule::saves(vec![Saved::Input(0), Saved::Output(0)], 2.0),
                ..OpSpec::DEFAULT
            },
        );
    }
    r.insert(
        "GridSample",
        OpSpec {
            infer: |cx| {
                let x = cx.input(0)?;
                let g = cx.input(1)?;
                if x.rank() < 3 || g.rank() != x.rank() {
                    return Err(cx.err(format!(
                        "input {:?} and grid {:?} do not match",
                        x.shape, g.shape
                    )));
                }
                let mut shape = x.shape[..2].to_vec();
                shape.extend(&g.shape[1..g.rank() - 1]);
                Ok(vec![cx.fact(x.dtype, shape)?])
            },
            flops: |_, o| 8.0 * o.iter().map(|f| f.numel() as f64).sum::<f64>(),
            grad: |_, _, _| GradRule::saves(vec![Saved::Input(0), Saved::Input(1)], 2.0),
            ..OpSpec::DEFAULT
        },
    );
    r.insert(
        "Det",
        OpSpec {
            infer: |cx| {
                let x = cx.input(0)?;
                if x.rank() < 2 {
                    return Err(cx.err("needs a rank >= 2 input"));
                }
                Ok(vec![Fact::new(x.dtype, x.shape[..x.rank() - 2].to_vec())])
            },
            grad: |_, _, _| GradRule::saves(vec![Saved::Input(0), Saved::Output(0)], 3.0),
            ..OpSpec::DEFAULT
        },
    );
}
