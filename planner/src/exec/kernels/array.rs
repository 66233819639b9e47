//! Kernels of the layout and shape ops (`crate::ops::array`): views, concatenation and
//! slicing, gathers and scatters, padding and resizing, the shape sources, and the random,
//! quantization and small normalization ops registered with them (see `exec::kernel` for the
//! contract).
//!
//! Ops that move elements without arithmetic (gathers, reflect padding, nearest resizing,
//! reversals) compute an index list on the host from the shapes and move the data with
//! candle's `index_select`; their backward sends the gradient back with `index_add`, so both
//! run on the tensors' device for every element type. Linear and cubic resizing are weighted
//! sums of such gathers, one axis at a time; integer nearest upsampling is a broadcast.
//! A few rare ops run host loops over the values (correct on any device through the copy):
//! TopK's ordering, GridSample, Det, mul/max/min scatter reductions, integer CumSum, the
//! random draws (from `Rng::new(cx.seed)`, so that a recomputation replays them).

use crate::exec::kernel::{
    to_candle, BwdArgs, Extras, KResult, Kernel, KernelCtx, KernelError, KernelRegistry, Rng,
};
use crate::exec::value::from_planner;
use crate::kbail;
use crate::ops::Ctx;
use crate::tensor::DType;
use candle_core::{DType as CD, Device, Tensor};

type Outs = KResult<Vec<Option<Tensor>>>;

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

/// Input tensor `i` of a forward call.
fn inp(xs: &[Option<Tensor>], i: usize) -> KResult<&Tensor> {
    xs.get(i)
        .and_then(|t| t.as_ref())
        .ok_or_else(|| KernelError::new(format!("input {i} is required but missing")))
}

/// The shape-rule context of a kernel context (to share the shape rules' attribute parsing).
fn sctx<'a>(cx: &'a KernelCtx) -> Ctx<'a> {
    Ctx {
        node: cx.node,
        op: cx.op,
        opset: cx.opset,
        attrs: cx.attrs,
        inputs: cx.inputs,
        n_outputs: cx.outputs.len(),
    }
}

/// All elements of `t` as `i64`, row-major.
fn host_i64(t: &Tensor) -> KResult<Vec<i64>> {
    Ok(t.to_dtype(CD::I64)?.flatten_all()?.to_vec1::<i64>()?)
}

/// All elements of `t` as `f64`, row-major.
fn host_f64(t: &Tensor) -> KResult<Vec<f64>> {
    Ok(t.to_dtype(CD::F64)?.flatten_all()?.to_vec1::<f64>()?)
}

/// Integer values of input `i`: the constant known at import, else the run-time tensor.
fn ints_in(cx: &KernelCtx, xs: &[Option<Tensor>], i: usize) -> KResult<Option<Vec<i64>>> {
    match cx.inputs.get(i).and_then(|f| f.as_ref()) {
        None => Ok(None),
        Some(f) => match &f.value {
            Some(v) => Ok(Some(v.as_i64())),
            None => match xs.get(i).and_then(|t| t.as_ref()) {
                Some(t) => Ok(Some(host_i64(t)?)),
                None => Err(KernelError::new(format!("input {i} is missing"))),
            },
        },
    }
}

/// A 1-D `i64` index tensor.
fn ids(v: Vec<i64>, dev: &Device) -> KResult<Tensor> {
    let n = v.len();
    Ok(Tensor::from_vec(v, n, dev)?)
}

/// Normalizes possibly negative indices against an axis of size `d`, rejecting those out of range.
fn norm_indices(v: &mut [i64], d: usize, what: &str) -> KResult<()> {
    let d = d as i64;
    for x in v.iter_mut() {
        let n = if *x < 0 { *x + d } else { *x };
        if n < 0 || n >= d {
            kbail!("{what} {x} is out of range for an axis of size {d}");
        }
        *x = n;
    }
    Ok(())
}

/// The candle dtype of output `k`.
fn out_dtype(cx: &KernelCtx, k: usize) -> KResult<CD> {
    let f = cx
        .outputs
        .get(k)
        .and_then(|f| f.as_ref())
        .ok_or_else(|| KernelError::new(format!("output {k} is not in the graph")))?;
    to_candle(f.dtype)
}

/// The candle dtype of input `i`.
fn in_dtype(cx: &KernelCtx, i: usize) -> KResult<CD> {
    to_candle(cx.input(i)?.dtype)
}

/// `t` filled with `v` (any element type).
fn full(v: f64, shape: &[usize], dt: CD, dev: &Device) -> KResult<Tensor> {
    Ok(Tensor::full(v, shape, dev)?.to_dtype(dt)?)
}

/// Row-major strides.
fn strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1usize; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * shape[i + 1];
    }
    s
}

/// Sums a gradient over the broadcast dimensions back to `shape`.
fn sum_to(g: &Tensor, shape: &[usize]) -> KResult<Tensor> {
    let mut g = g.clone();
    let r = g.rank();
    if shape.len() > r {
        kbail!(
            "cannot reduce a gradient of shape {:?} to {shape:?}",
            g.dims()
        );
    }
    let lead = r - shape.len();
    if lead > 0 {
        g = g.sum((0..lead).collect::<Vec<_>>())?;
    }
    let dims: Vec<usize> = shape
        .iter()
        .enumerate()
        .filter(|&(i, &d)| d == 1 && g.dims().get(i).is_some_and(|&gd| gd != 1))
        .map(|(i, _)| i)
        .collect();
    if !dims.is_empty() {
        g = g.sum_keepdim(dims)?;
    }
    Ok(g.reshape(shape)?)
}

/// A backward result with a gradient for input 0 only (when it needs one).
fn grad0(cx: &KernelCtx, a: &BwdArgs, f: impl FnOnce() -> KResult<Tensor>) -> Outs {
    let mut v = vec![None; cx.inputs.len()];
    if a.need(0) {
        if let Some(slot) = v.first_mut() {
            *slot = Some(f()?);
        }
    }
    Ok(v)
}

/// Moves elements of `x` along `axis` to the positions `idx` lists (`index_select`).
fn select(x: &Tensor, idx: &[i64], axis: usize) -> KResult<Tensor> {
    Ok(x.contiguous()?
        .index_select(&ids(idx.to_vec(), x.device())?, axis)?)
}

/// The transpose of [`select`]: a tensor of `d` entries along `axis` receiving `g`'s slices.
fn unselect(g: &Tensor, idx: &[i64], axis: usize, d: usize) -> KResult<Tensor> {
    let mut shape = g.dims().to_vec();
    if let Some(s) = shape.get_mut(axis) {
        *s = d;
    }
    let z = Tensor::zeros(shape, g.dtype(), g.device())?;
    Ok(z.index_add(&ids(idx.to_vec(), g.device())?, &g.contiguous()?, axis)?)
}

// ---------------------------------------------------------------------------------------------
// Views: Identity, Reshape, Flatten, Squeeze, Unsqueeze, Transpose, Expand
// ---------------------------------------------------------------------------------------------

fn identity_fwd(_: &KernelCtx, xs: &[Option<Tensor>], _: &Extras) -> Outs {
    Ok(vec![Some(inp(xs, 0)?.clone())])
}

fn identity_bwd(cx: &KernelCtx, a: &BwdArgs) -> Outs {
    grad0(cx, a, || a.grad(cx, 0))
}

/// Reshape, Flatten, Squeeze, Unsqueeze: the shape rule already knows the output shape.
fn reshape_fwd(cx: &KernelCtx, xs: &[Option<Tensor>], _: &Extras) -> Outs {
    Ok(vec![Some(inp(xs, 0)?.reshape(cx.out_shape(0)?)?)])
}

fn reshape_bwd(cx: &KernelCtx, a: &BwdArgs) -> Outs {
    grad0(cx, a, || Ok(a.grad(cx, 0)?.reshape(cx.in_shape(0)?)?))
}

fn perm_of(cx: &KernelCtx) -> KResult<Vec<usize>> {
    let rank = cx.input(0)?.rank();
    match cx.attrs.ints("perm")? {
        Some(p) => {
            let p = sctx(cx).axes(p, rank)?;
            if p.len() != rank {
                kbail!("attribute \"perm\" has {} entries for rank {rank}", p.len());
            }
            Ok(p)
        }
        None => Ok((0..rank).rev().collect()),
    }
}

/// Transpose and Expand return contiguous tensors: candle's matmul and several other ops
/// reject arbitrary strided (or stride-0 broadcast) layouts.
fn transpose_fwd(cx: &KernelCtx, xs: &[Option<Tensor>], _: &Extras) -> Outs {
    let p = perm_of(cx)?;
    Ok(vec![Some(inp(xs, 0)?.permute(p)?.contiguous()?)])
}

fn transpose_bwd(cx: &KernelCtx, a: &BwdArgs) -> Outs {
    let p = perm_of(cx)?;
    let mut inv = vec![0; p.len()];
    for (k, &q) in p.iter().enumerate() {
        if let Some(s) = inv.get_mut(q) {
            *s = k;
        }
    }
    grad0(cx, a, || Ok(a.grad(cx, 0)?.permute(inv)?.contiguous()?))
}

fn expand_fwd(cx: &KernelCtx, xs: &[Option<Tensor>], _: &Extras) -> Outs {
    let x = inp(xs, 0)?;
    let out = cx.out_shape(0)?;
    if out.len() < x.rank() {
        kbail!("cannot expand {:?} to {out:?}", x.dims());
    }
    let mut padded = vec![1; out.len() - x.rank()];
    padded.extend(x.dims());
    Ok(vec![Some(
        x.reshape(padded)?.broadcast_as(out)?.contiguous()?,
    )])
}

fn expand_bwd(cx: &KernelCtx, a: &BwdArgs) -> Outs {
    grad0(cx, a, || sum_to(&a.grad(cx, 0)?, &cx.in_shape(0)?))
}

// ---------------------------------------------------------------------------------------------
// Slice, Split, Concat
// ---------------------------------------------------------------------------------------------

/// Per axis: first index, step, count (the shape rule's own reading of the inputs).
fn slice_plan(cx: &KernelCtx) -> KResult<Vec<(i64, i64, u64)>> {
    let shape = cx.input(0)?.shape.clone();
    Ok(crate::ops::array::slice_ranges(&sctx(cx), &shape)?)
}

fn slice_fwd(cx: &KernelCtx, xs: &[Option<Tensor>], _: &Extras) -> Outs {
    let mut x = inp(xs, 0)?.clone();
    let shape = cx.in_shape(0)?;
    for (a, &(s, step, n)) in slice_plan(cx)?.iter().enumerate() {
        let d = shape.get(a).copied().unwrap_or(0);
        let n = n as usize;
        if step == 1 {
            if s != 0 || n != d {
                x = x.narrow(a, s as usize, n)?;
            }
        } else {
            let idx: Vec<i64> = (0..n as i64).map(|j| s + j * step).collect();
            x = select(&x, &idx, a)?;
        }
    }
    Ok(vec![Some(x.contiguous()?)])
}

fn slice_bwd(cx: &KernelCtx, a: &BwdArgs) -> Outs {
    grad0(cx, a, || {
        let mut g = a.grad(cx, 0)?;
        let shape = cx.in_shape(0)?;
        for (ax, &(s, step, n)) in slice_plan(cx)?.iter().enumerate().rev() {
            let d = shape.get(ax).copied().unwrap_or(0);
            let n = n as usize;
            if step == 1 {
                if s != 0 || n != d {
                    let s = s as usize;
                    g = g.pad_with_zeros(ax, s, d.saturating_sub(s + n))?;
                }
            } else {
                let idx: Vec<i64> = (0..n as i64).map(|j| s + j * step).collect();
                g = unselect(&g, &idx, ax, d)?;
            }
        }
        Ok(g)
    })
}

/// Split: the axis and the size of every output along it.
fn split_plan(cx: &KernelCtx, xs: Option<&[Option<Tensor>]>) -> KResult<(usize, Vec<usize>)> {
    let shape = cx.in_shape(0)?;
    let axis = cx.axis(cx.attrs.int_or("axis", 0)?, shape.len())?;
    let d = shape.get(axis).copied().unwrap_or(0);
    let n = cx.outputs.len().max(1);
    let given = if cx.opset < 13 {
        cx.attrs.ints("split")?.map(|s| s.to_vec())
    } else {
        match xs {
            Some(xs) => ints_in(cx, xs, 1)?,
            None => cx.const_ints(1)?,
        }
    };
    let sizes: Vec<usize> = match given {
        Some(s) => {
            if s.iter().any(|&v| v < 0) {
                kbail!("split {s:?} has a negative size");
            }
            s.iter().map(|&v| v as usize).collect()
        }
        None => {
            let chunk = d.div_ceil(n);
            (0..n)
                .map(|i| chunk.min(d.saturating_sub(i * chunk)))
                .collect()
        }
    };
    if sizes.len() != n || sizes.iter().sum::<usize>() != d {
        kbail!("split {sizes:?} does not divide axis {axis} of size {d} into {n} outputs");
    }
    Ok((axis, sizes))
}

fn split_fwd(cx: &KernelCtx, xs: &[Option<Tensor>], _: &Extras) -> Outs {
    let x = inp(xs, 0)?;
    let (axis, sizes) = split_plan(cx, Some(xs))?;
    let mut off = 0;
    let mut out = vec![];
    for (k, &n) in sizes.iter().enumerate() {
        let present = cx.outputs.get(k).is_some_and(|f| f.is_some());
        out.push(if present {
            Some(x.narrow(axis, off, n)?.contiguous()?)
        } else {
            None
        });
        off += n;
    }
    Ok(out)
}

fn split_bwd(cx: &KernelCtx, a: &BwdArgs) -> Outs {
    grad0(cx, a, || {
        let (axis, sizes) = split_plan(cx, None)?;
        let shape = cx.in_shape(0)?;
        let dt = in_dtype(cx, 0)?;
        let mut parts = vec![];
        for (k, &n) in sizes.iter().enumerate() {
            let g = match a.grads.get(k).and_then(|g| g.as_ref()) {
                Some(g) => g.clone(),
                None => {
                    let mut s = shape.clone();
                    if let Some(d) = s.get_mut(axis) {
                        *d = n;
                    }
                    Tensor::zeros(s, dt, cx.device)?
                }
            };
            parts.push(g);
        }
        Ok(Tensor::cat(&parts, axis)?)
    })
}

fn concat_axis(cx: &KernelCtx) -> KResult<usize> {
    let axis = cx
        .attrs
        .int("axis")?
        .ok_or_else(|| KernelError::new("attribute \"axis\" is required"))?;
    cx.axis(axis, cx.input(0)?.rank())
}

fn concat_fwd(cx: &KernelCtx, xs: &[Option<Tensor>], _: &Extras) -> Outs {
    let axis = concat_axis(cx)?;
    let parts: Vec<&Tensor> = (0..xs.len()).map(|i| inp(xs, i)).collect::<KResult<_>>()?;
    Ok(vec![Some(Tensor::cat(&parts, axis)?)])
}

fn concat_bwd(cx: &KernelCtx, a: &BwdArgs) -> Outs {
    let axis = concat_axis(cx)?;
    let g = a.grad(cx, 0)?;
    let mut off = 0;
    let mut v = vec![];
    for i in 0..cx.inputs.len() {
        let n = cx.in_shape(i)?.get(axis).copied().unwrap_or(0);
        v.push(if a.need(i) {
            Some(g.narrow(axis, off, n)?.contiguous()?)
        } else {
            None
        });
        off += n;
    }
    Ok(v)
}

// ---------------------------------------------------------------------------------------------
// Gather, GatherElements
// ---------------------------------------------------------------------------------------------

fn gather_axis(cx: &KernelCtx) -> KResult<usize> {
    cx.axis(cx.attrs.int_or("axis", 0)?, cx.input(0)?.rank())
}

fn gather_fwd(cx: &KernelCtx, xs: &[Option<Tensor>], _: &Extras) -> Outs {
    let x = inp(xs, 0)?;
    let axis = gather_axis(cx)?;
    let mut idx = host_i64(inp(xs, 1)?)?;
    norm_indices(&mut idx, x.dims().get(axis).copied().unwrap_or(0), "index")?;
    Ok(vec![Some(
        select(x, &idx, axis)?.reshape(cx.out_shape(0)?)?,
    )])
}

fn gather_bwd(cx: &KernelCtx, a: &BwdArgs) -> Outs {
    grad0(cx, a, || {
        let shape = cx.in_shape(0)?;
        let axis = gather_axis(cx)?;
        let d = shape.get(axis).copied().unwrap_or(0);
        let mut idx = host_i64(a.input(1)?)?;
        norm_indices(&mut idx, d, "index")?;
        let mut gs = shape[..axis].to_vec();
        gs.push(idx.len());
        gs.extend(&shape[axis + 1..]);
        let g = a.grad(cx, 0)?.reshape(gs)?;
        unselect(&g, &idx, axis, d)
    })
}

/// Flat positions in the data of every index of an elements-wise gather or scatter.
fn element_positions(
    data: &[usize],
    ind_shape: &[usize],
    axis: usize,
    idx: &[i64],
) -> KResult<Vec<i64>> {
    if ind_shape.len() != data.len() {
        kbail!("indices of shape {ind_shape:?} do not match data of shape {data:?}");
    }
    for (k, (&i, &d)) in ind_shape.iter().zip(data).enumerate() {
        if k != axis && i > d {
            kbail!("indices of shape {ind_shape:?} exceed data of shape {data:?}");
        }
    }
    let d = data.get(axis).copied().unwrap_or(0) as i64;
    let ds = strides(data);
    let is = strides(ind_shape);
    let mut out = Vec::with_capacity(idx.len());
    for (flat, &v) in idx.iter().enumerate() {
        let v = if v < 0 { v + d } else { v };
        if v < 0 || v >= d {
            kbail!("index {v} is out of range for axis {axis} of size {d}");
        }
        let mut rem = flat;
        let mut pos = 0i64;
        for k in 0..ind_shape.len() {
            let c = rem / is[k];
            rem -= c * is[k];
            let c = if k == axis { v as usize } else { c };
            pos += (c * ds[k]) as i64;
        }
        out.push(pos);
    }
    Ok(out)
}

fn gather_elements_fwd(cx: &KernelCtx, xs: &[Option<Tensor>], _: &Extras) -> Outs {
    let x = inp(xs, 0)?;
    let ind = inp(xs, 1)?;
    let axis = gather_axis(cx)?;
    let pos = element_positions(x.dims(), ind.dims(), axis, &host_i64(ind)?)?;
    let y = select(&x.flatten_all()?, &pos, 0)?.reshape(ind.dims())?;
    Ok(vec![Some(y)])
}

fn gather_elements_bwd(cx: &KernelCtx, a: &BwdArgs) -> Outs {
    grad0(cx, a, || {
        let shape = cx.in_shape(0)?;
        let ind = a.input(1)?;
        let axis = gather_axis(cx)?;
        let pos = element_positions(&shape, ind.dims(), axis, &host_i64(ind)?)?;
        let n = shape.iter().product();
        let g = a.grad(cx, 0)?.flatten_all()?;
        Ok(unselect(&g, &pos, 0, n)?.reshape(shape)?)
    })
}

// ---------------------------------------------------------------------------------------------
// Cast, CastLike
// ---------------------------------------------------------------------------------------------

fn cast_fwd(cx: &KernelCtx, xs: &[Option<Tensor>], _: &Extras) -> Outs {
    let x = inp(xs, 0)?;
    let to = cx
        .outputs
        .first()
        .and_then(|f| f.as_ref())
        .ok_or_else(|| KernelError::new("output 0 is not in the graph"))?
        .dtype;
    let y = if to == DType::Bool {
        x.ne(&x.zeros_like()?)?
    } else {
        x.to_dtype(to_candle(to)?)?
    };
    Ok(vec![Some(y)])
}

fn cast_bwd(cx: &KernelCtx, a: &BwdArgs) -> Outs {
    grad0(cx, a, || Ok(a.grad(cx, 0)?.to_dtype(in_dtype(cx, 0)?)?))
}

// ---------------------------------------------------------------------------------------------
// Pad
// ---------------------------------------------------------------------------------------------

#[derive(Clone, Copy, PartialEq, Debug)]
enum PadMode {
    Constant,
    Reflect,
    Edge,
    Wrap,
}

struct PadPlan {
    mode: PadMode,
    /// Per padded axis: (axis, before, after); negative values crop.
    axes: Vec<(usize, i64, i64)>,
}

fn pad_plan(cx: &KernelCtx, xs: &[Option<Tensor>]) -> KResult<PadPlan> {
    let rank = cx.input(0)?.rank();
    let mode = match cx.attrs.string("mode")?.as_deref().unwrap_or("constant") {
        "constant" => PadMode::Constant,
        "reflect" => PadMode::Reflect,
        "edge" => PadMode::Edge,
        "wrap" => PadMode::Wrap,
        m => kbail!("attribute \"mode\" = {m:?} is not supported"),
    };
    let pads = if cx.opset < 11 {
        cx.attrs.ints("pads")?.map(|p| p.to_vec())
    } else {
        ints_in(cx, xs, 1)?
    }
    .ok_or_else(|| KernelError::new("pads are required"))?;
    let axes: Vec<usize> = match if cx.opset >= 18 {
        ints_in(cx, xs, 3)?
    } else {
        None
    } {
        Some(a) => sctx(cx).axes(&a, rank)?,
        None => (0..rank).collect(),
    };
    if pads.len() != 2 * axes.len() {
        kbail!("pads {pads:?} do not match {} axes", axes.len());
    }
    let n = axes.len();
    let axes = axes
        .iter()
        .enumerate()
        .filter_map(|(k, &a)| {
            let (b, e) = (pads.get(k).copied()?, pads.get(k + n).copied()?);
            (b != 0 || e != 0).then_some((a, b, e))
        })
        .collect();
    Ok(PadPlan { mode, axes })
}

fn pad_value(cx: &KernelCtx, xs: &[Option<Tensor>]) -> KResult<f64> {
    if cx.opset < 11 {
        return Ok(f64::from(cx.attrs.float_or("value", 0.0)?));
    }
    match xs.get(2).and_then(|t| t.as_ref()) {
        Some(t) if t.elem_count() > 0 => Ok(host_f64(t)?.first().copied().unwrap_or(0.0)),
        _ => Ok(0.0),
    }
}

/// Source index of output position `p` (relative to the original start) along an axis of
/// size `d`, for the non-constant modes.
fn pad_source(mode: PadMode, p: i64, d: i64) -> i64 {
    match mode {
        PadMode::Edge | PadMode::Constant => p.clamp(0, d - 1),
        PadMode::Wrap => p.rem_euclid(d),
        PadMode::Reflect => {
            if d == 1 {
                0
            } else {
                let m = p.rem_euclid(2 * (d - 1));
                if m < d {
                    m
                } else {
                    2 * (d - 1) - m
                }
            }
        }
    }
}

fn pad_indices(mode: PadMode, b: i64, e: i64, d: usize) -> KResult<Vec<i64>> {
    let d = d as i64;
    if d == 0 {
        kbail!("cannot pad an empty axis in mode {mode:?}");
    }
    Ok((-b..d + e).map(|p| pad_source(mode, p, d)).collect())
}

fn pad_fwd(cx: &KernelCtx, xs: &[Option<Tensor>], _: &Extras) -> Outs {
    let plan = pad_plan(cx, xs)?;
    let value = pad_value(cx, xs)?;
    let mut x = inp(xs, 0)?.clone();
    for &(a, b, e) in &plan.axes {
        let d = x.dims().get(a).copied().unwrap_or(0);
        if plan.mode == PadMode::Constant {
            let lo = (-b).max(0) as usize;
            let hi = (-e).max(0) as usize;
            if lo + hi > d {
                kbail!("pads ({b}, {e}) crop more than axis {a} of size {d}");
            }
            if lo + hi > 0 {
                x = x.narrow(a, lo, d - lo - hi)?;
            }
            let mut parts = vec![];
            let block = |n: usize| -> KResult<Tensor> {
                let mut s = x.dims().to_vec();
                if let Some(v) = s.get_mut(a) {
                    *v = n;
                }
                full(value, &s, x.dtype(), x.device())
            };
            if b > 0 {
                parts.push(block(b as usize)?);
            }
            parts.push(x.clone());
            if e > 0 {
                parts.push(block(e as usize)?);
            }
            if parts.len() > 1 {
                x = Tensor::cat(&parts, a)?;
            }
        } else {
            x = select(&x, &pad_indices(plan.mode, b, e, d)?, a)?;
        }
    }
    Ok(vec![Some(x.contiguous()?)])
}

fn pad_bwd(cx: &KernelCtx, a: &BwdArgs) -> Outs {
    grad0(cx, a, || {
        let plan = pad_plan(cx, a.inputs)?;
        let shape = cx.in_shape(0)?;
        let mut g = a.grad(cx, 0)?;
        for &(ax, b, e) in plan.axes.iter().rev() {
            let d = shape.get(ax).copied().unwrap_or(0);
            if plan.mode == PadMode::Constant {
                let lo = (-b).max(0) as usize;
                let hi = (-e).max(0) as usize;
                let kept = d.saturating_sub(lo + hi);
                g = g.narrow(ax, b.max(0) as usize, kept)?;
                if lo + hi > 0 {
                    g = g.pad_with_zeros(ax, lo, hi)?;
                }
            } else {
                g = unselect(&g, &pad_indices(plan.mode, b, e, d)?, ax, d)?;
            }
        }
        Ok(g)
    })
}

// ---------------------------------------------------------------------------------------------
// Resize, Upsample
// ---------------------------------------------------------------------------------------------

#[derive(Clone, Copy, PartialEq)]
enum Interp {
    Nearest,
    Linear,
    Cubic,
}

/// One resized axis: every output position reads `taps` sources (index and weight lists, one
/// entry per output position); nearest has one tap of weight 1.
struct AxisMap {
    axis: usize,
    taps: Vec<(Vec<i64>, Vec<f64>)>,
}

/// The factor `k` when a one-tap map repeats every source `k` times (`src[i] = i / k`): an
/// integer nearest upsampling, run as a broadcast instead of a gather.
fn repeat_factor(m: &AxisMap, d: usize) -> Option<usize> {
    let [(src, _)] = m.taps.as_slice() else {
        return None;
    };
    let k = src.len().checked_div(d)?;
    (k > 1 && src.len() == d * k && src.iter().enumerate().all(|(i, &s)| s == (i / k) as i64))
        .then_some(k)
}

/// `(kh, kw)` when the maps upsample only the last two axes of a 4-D float tensor by powers
/// of two: candle's `upsample_nearest2d` (exact for such factors) and a sum pool then apply.
fn pow2_upsample(maps: &[AxisMap], dims: &[usize], dt: CD) -> Option<(usize, usize)> {
    if dims.len() != 4 || !dt.is_float() || maps.is_empty() {
        return None;
    }
    let mut k = [1usize; 2];
    for m in maps {
        let slot = k.get_mut(m.axis.checked_sub(2)?)?;
        *slot = repeat_factor(m, dims.get(m.axis).copied()?)?;
    }
    k.iter()
        .all(|f| f.is_power_of_two())
        .then_some((k[0], k[1]))
}

/// Repeats every entry of `x` along `axis` `k` times.
fn repeat_interleave(x: &Tensor, axis: usize, k: usize) -> KResult<Tensor> {
    let mut wide = x.dims().to_vec();
    wide.insert(axis + 1, k);
    let mut out = x.dims().to_vec();
    if let Some(d) = out.get_mut(axis) {
        *d *= k;
    }
    Ok(x.unsqueeze(axis + 1)?
        .broadcast_as(wide)?
        .contiguous()?
        .reshape(out)?)
}

/// ONNX's cubic convolution coefficients for the taps at -1, 0, 1, 2 around `t` in [0, 1).
fn cubic_coeffs(t: f64, a: f64) -> [f64; 4] {
    let far = |x: f64| ((a * x - 5.0 * a) * x + 8.0 * a) * x - 4.0 * a;
    let near = |x: f64| ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0;
    [far(t + 1.0), near(t), near(1.0 - t), far(2.0 - t)]
}

fn resize_plan(cx: &KernelCtx) -> KResult<Vec<AxisMap>> {
    let in_shape = cx.in_shape(0)?;
    let out_shape = cx.out_shape(0)?;
    let rank = in_shape.len();
    if out_shape.len() != rank {
        kbail!("cannot resize {in_shape:?} to {out_shape:?}");
    }
    let legacy = cx.op == "Upsample" || cx.opset < 11;
    let mode = cx.attrs.string("mode")?.unwrap_or_else(|| "nearest".into());
    let interp = match mode.as_str() {
        "nearest" => Interp::Nearest,
        "linear" | "bilinear" => Interp::Linear,
        "cubic" if !legacy => Interp::Cubic,
        m => kbail!("attribute \"mode\" = {m:?} is not supported"),
    };
    let (coord, nearest) = if legacy {
        ("asymmetric".to_string(), "floor".to_string())
    } else {
        (
            cx.attrs
                .string("coordinate_transformation_mode")?
                .unwrap_or_else(|| "half_pixel".into()),
            cx.attrs
                .string("nearest_mode")?
                .unwrap_or_else(|| "round_prefer_floor".into()),
        )
    };
    let cubic_a = f64::from(cx.attrs.float_or("cubic_coeff_a", -0.75)?);
    let exclude_outside = cx.attrs.int_or("exclude_outside", 0)? != 0;
    if cx.attrs.int_or("antialias", 0)? != 0 {
        kbail!("attribute \"antialias\" = 1 is not supported");
    }
    if let Some(p) = cx.attrs.string("keep_aspect_ratio_policy")? {
        if p != "stretch" {
            kbail!("attribute \"keep_aspect_ratio_policy\" = {p:?} is not supported");
        }
    }
    // Scales per axis: the given ones when scales are the input, else output / input.
    let axes: Vec<usize> = match cx.attrs.ints("axes")? {
        Some(a) => sctx(cx).axes(a, rank)?,
        None => (0..rank).collect(),
    };
    let given: Option<Vec<f64>> = if cx.op == "Upsample" && cx.opset < 9 {
        cx.attrs
            .floats("scales")?
            .map(|s| s.iter().map(|&f| f64::from(f)).collect())
    } else if legacy {
        cx.const_floats(1)?
    } else {
        let sizes = cx.const_ints(3)?.filter(|s| !s.is_empty());
        if sizes.is_some() {
            None
        } else {
            cx.const_floats(2)?
        }
    }
    .filter(|s| !s.is_empty());
    let mut scales: Vec<f64> = in_shape
        .iter()
        .zip(&out_shape)
        .map(|(&i, &o)| if i == 0 { 1.0 } else { o as f64 / i as f64 })
        .collect();
    if let Some(g) = given {
        if g.len() != axes.len() {
            kbail!("scales {g:?} do not match {} axes", axes.len());
        }
        for (k, &a) in axes.iter().enumerate() {
            if let (Some(s), Some(&v)) = (scales.get_mut(a), g.get(k)) {
                *s = v;
            }
        }
    }
    let n_taps = match interp {
        Interp::Nearest => 1,
        Interp::Linear => 2,
        Interp::Cubic => 4,
    };
    let mut maps = vec![];
    for a in 0..rank {
        let (di, dout) = (in_shape[a], out_shape[a]);
        let scale = scales[a];
        if di == 0 || dout == 0 || scale <= 0.0 {
            if di != dout {
                kbail!("cannot resize axis {a} from {di} to {dout}");
            }
            continue;
        }
        let (fi, fo) = (di as f64, dout as f64);
        let mut taps: Vec<(Vec<i64>, Vec<f64>)> =
            vec![(Vec::with_capacity(dout), Vec::with_capacity(dout)); n_taps];
        let last = di as i64 - 1;
        for i in 0..dout {
            let x = i as f64;
            let src = match coord.as_str() {
                "half_pixel" => (x + 0.5) / scale - 0.5,
                "pytorch_half_pixel" => {
                    if dout > 1 {
                        (x + 0.5) / scale - 0.5
                    } else {
                        0.0
                    }
                }
                "align_corners" => {
                    if dout == 1 {
                        0.0
                    } else {
                        x * (fi - 1.0) / (fo - 1.0)
                    }
                }
                "asymmetric" => x / scale,
                "tf_half_pixel_for_nn" => (x + 0.5) / scale,
                "half_pixel_symmetric" => {
                    let adj = fo / (scale * fi);
                    let center = fi / 2.0;
                    center * (1.0 - adj) + (x + 0.5) / scale - 0.5
                }
                m => {
                    kbail!("attribute \"coordinate_transformation_mode\" = {m:?} is not supported")
                }
            };
            let f = src.floor();
            let t = src - f;
            let f = f as i64;
            // (source, weight) per tap; out-of-range sources read the edge.
            let row: Vec<(i64, f64)> = match interp {
                Interp::Nearest => {
                    let r = match nearest.as_str() {
                        "round_prefer_floor" => {
                            if t == 0.5 {
                                f
                            } else {
                                src.round() as i64
                            }
                        }
                        "round_prefer_ceil" => {
                            if t == 0.5 {
                                f + 1
                            } else {
                                src.round() as i64
                            }
                        }
                        "floor" => f,
                        "ceil" => src.ceil() as i64,
                        m => kbail!("attribute \"nearest_mode\" = {m:?} is not supported"),
                    };
                    vec![(r, 1.0)]
                }
                Interp::Linear => vec![(f, 1.0 - t), (f + 1, t)],
                Interp::Cubic => {
                    let c = cubic_coeffs(t, cubic_a);
                    let mut row: Vec<(i64, f64)> =
                        (0..4).map(|k| (f - 1 + k, c[k as usize])).collect();
                    if exclude_outside {
                        for e in row.iter_mut() {
                            if e.0 < 0 || e.0 > last {
                                e.1 = 0.0;
                            }
                        }
                        let sum: f64 = row.iter().map(|e| e.1).sum();
                        if sum != 0.0 {
                            for e in row.iter_mut() {
                                e.1 /= sum;
                            }
                        }
                    }
                    row
                }
            };
            for (tap, (src, w)) in taps.iter_mut().zip(row) {
                tap.0.push(src.clamp(0, last));
                tap.1.push(w);
            }
        }
        // Skip axes the mapping leaves unchanged.
        let identity = dout == di
            && (0..dout).all(|i| {
                let mut acc = 0.0;
                for (src, w) in &taps {
                    if src[i] == i as i64 {
                        acc += w[i];
                    } else if w[i] != 0.0 {
                        return false;
                    }
                }
                acc == 1.0
            });
        if !identity {
            maps.push(AxisMap { axis: a, taps });
        }
    }
    Ok(maps)
}

/// Interpolation weights along `axis`, shaped to broadcast against a tensor of `rank`.
fn axis_weights(w: &[f64], axis: usize, rank: usize, dt: CD, dev: &Device) -> KResult<Tensor> {
    let mut shape = vec![1; rank];
    if let Some(s) = shape.get_mut(axis) {
        *s = w.len();
    }
    Ok(Tensor::from_vec(w.to_vec(), shape, dev)?.to_dtype(dt)?)
}

fn resize_fwd(cx: &KernelCtx, xs: &[Option<Tensor>], _: &Extras) -> Outs {
    let mut x = inp(xs, 0)?.clone();
    let maps = resize_plan(cx)?;
    if let Some((kh, kw)) = pow2_upsample(&maps, x.dims(), x.dtype()) {
        let (_, _, h, w) = x.dims4()?;
        return Ok(vec![Some(x.upsample_nearest2d(h * kh, w * kw)?)]);
    }
    for m in &maps {
        let d = x.dims().get(m.axis).copied().unwrap_or(0);
        if let Some(k) = repeat_factor(m, d) {
            x = repeat_interleave(&x, m.axis, k)?;
            continue;
        }
        let mut acc: Option<Tensor> = None;
        for (src, w) in &m.taps {
            let mut t = select(&x, src, m.axis)?;
            if m.taps.len() > 1 {
                t = t.broadcast_mul(&axis_weights(w, m.axis, x.rank(), x.dtype(), x.device())?)?;
            }
            acc = Some(match acc {
                Some(a) => (a + t)?,
                None => t,
            });
        }
        if let Some(a) = acc {
            x = a;
        }
    }
    Ok(vec![Some(x)])
}

fn resize_bwd(cx: &KernelCtx, a: &BwdArgs) -> Outs {
    grad0(cx, a, || {
        let shape = cx.in_shape(0)?;
        let mut g = a.grad(cx, 0)?;
        let maps = resize_plan(cx)?;
        if let Some((kh, kw)) = pow2_upsample(&maps, &shape, g.dtype()) {
            let sum = g.avg_pool2d_with_stride((kh, kw), (kh, kw))?;
            return Ok(sum.affine((kh * kw) as f64, 0.0)?);
        }
        for m in maps.iter().rev() {
            let d = shape.get(m.axis).copied().unwrap_or(0);
            if let Some(k) = repeat_factor(m, d) {
                let mut wide = g.dims().to_vec();
                if let Some(v) = wide.get_mut(m.axis) {
                    *v = d;
                }
                wide.insert(m.axis + 1, k);
                g = g.reshape(wide)?.sum(m.axis + 1)?;
                continue;
            }
            let mut acc: Option<Tensor> = None;
            for (src, w) in &m.taps {
                let gw = if m.taps.len() > 1 {
                    g.broadcast_mul(&axis_weights(w, m.axis, g.rank(), g.dtype(), g.device())?)?
                } else {
                    g.clone()
                };
                let t = unselect(&gw, src, m.axis, d)?;
                acc = Some(match acc {
                    Some(a) => (a + t)?,
                    None => t,
                });
            }
            if let Some(a) = acc {
                g = a;
            }
        }
        Ok(g)
    })
}

// ---------------------------------------------------------------------------------------------
// CumSum
// ---------------------------------------------------------------------------------------------

/// Cumulative sum along `axis` (float tensors with candle ops, integers on the host).
fn cumsum(x: &Tensor, axis: usize, exclusive: bool, reverse: bool) -> KResult<Tensor> {
    let d = x.dims().get(axis).copied().unwrap_or(0);
    if d == 0 {
        return Ok(x.clone());
    }
    if x.dtype().is_float() {
        let mut t = x.contiguous()?;
        if reverse {
            t = t.flip(&[axis])?;
        }
        let mut y = t.cumsum(axis)?.contiguous()?;
        if exclusive {
            y = y
                .narrow(axis, 0, d - 1)?
                .pad_with_zeros(axis, 1, 0)?
                .contiguous()?;
        }
        if reverse {
            y = y.flip(&[axis])?;
        }
        Ok(y.contiguous()?)
    } else {
        let v = host_i64(x)?;
        let outer: usize = x.dims()[..axis].iter().product();
        let inner: usize = x.dims()[axis + 1..].iter().product();
        let mut out = vec![0i64; v.len()];
        for o in 0..outer {
            for i in 0..inner {
                let mut acc = 0i64;
                for s in 0..d {
                    let j = if reverse { d - 1 - s } else { s };
                    let p = (o * d + j) * inner + i;
                    let val = v.get(p).copied().unwrap_or(0);
                    if exclusive {
                        out[p] = acc;
                        acc = acc.wrapping_add(val);
                    } else {
                        acc = acc.wrapping_add(val);
                        out[p] = acc;
                    }
                }
            }
        }
        Ok(Tensor::from_vec(out, x.dims(), x.device())?.to_dtype(x.dtype())?)
    }
}

fn cumsum_axis(cx: &KernelCtx, xs: &[Option<Tensor>]) -> KResult<usize> {
    let a = ints_in(cx, xs, 1)?
        .and_then(|v| v.first().copied())
        .ok_or_else(|| KernelError::new("input 1 (axis) is required"))?;
    cx.axis(a, cx.input(0)?.rank())
}

fn cumsum_flags(cx: &KernelCtx) -> KResult<(bool, bool)> {
    Ok((
        cx.attrs.int_or("exclusive", 0)? != 0,
        cx.attrs.int_or("reverse", 0)? != 0,
    ))
}

fn cumsum_fwd(cx: &KernelCtx, xs: &[Option<Tensor>], _: &Extras) -> Outs {
    let axis = cumsum_axis(cx, xs)?;
    let (ex, rev) = cumsum_flags(cx)?;
    Ok(vec![Some(cumsum(inp(xs, 0)?, axis, ex, rev)?)])
}

fn cumsum_bwd(cx: &KernelCtx, a: &BwdArgs) -> Outs {
    grad0(cx, a, || {
        let axis = cumsum_axis(cx, a.inputs)?;
        let (ex, rev) = cumsum_flags(cx)?;
        cumsum(&a.grad(cx, 0)?, axis, ex, !rev)
    })
}

// ---------------------------------------------------------------------------------------------
// Shape sources: Shape, Size, Constant, ConstantOfShape, Range
// ---------------------------------------------------------------------------------------------

/// Output 0 from the value the shape rule folded.
fn folded_fwd(cx: &KernelCtx, _: &[Option<Tensor>], _: &Extras) -> Outs {
    let f = cx
        .outputs
        .first()
        .and_then(|f| f.as_ref())
        .ok_or_else(|| KernelError::new("output 0 is not in the graph"))?;
    match &f.value {
        Some(v) => Ok(vec![Some(from_planner(v, cx.device)?)]),
        None => kbail!(
            "the value of this {} ({:?}, shape {:?}) is not kept at import",
            cx.op,
            f.dtype,
            f.shape
        ),
    }
}

/// Constant: the folded value, else the `value` tensor attribute decoded in full (constants
/// above the import's folding limit keep only their shape in the facts).
fn constant_fwd(cx: &KernelCtx, xs: &[Option<Tensor>], e: &Extras) -> Outs {
    if cx
        .outputs
        .first()
        .is_some_and(|f| f.as_ref().is_some_and(|f| f.value.is_some()))
    {
        return folded_fwd(cx, xs, e);
    }
    let Some(t) = cx.attrs.tensor("value")? else {
        return folded_fwd(cx, xs, e);
    };
    let d = crate::onnx::decode_tensor(t, cx.node)?;
    let n = d.shape.iter().product::<u64>() as usize;
    let data = crate::onnx::decode_values(t, d.dtype, n).ok_or_else(|| {
        KernelError::new(format!(
            "the value of this Constant ({:?}, shape {:?}) is not stored inline",
            d.dtype, d.shape
        ))
    })?;
    if data.len() != n {
        kbail!(
            "the Constant holds {} values for shape {:?}",
            data.len(),
            d.shape
        );
    }
    let pt = crate::tensor::Tensor {
        dtype: d.dtype,
        shape: d.shape,
        data,
    };
    Ok(vec![Some(from_planner(&pt, cx.device)?)])
}

fn shape_fwd(cx: &KernelCtx, xs: &[Option<Tensor>], e: &Extras) -> Outs {
    if cx
        .outputs
        .first()
        .is_some_and(|f| f.as_ref().is_some_and(|f| f.value.is_some()))
    {
        return folded_fwd(cx, xs, e);
    }
    let shape = cx.in_shape(0)?;
    let r = shape.len() as i64;
    let clamp = |v: i64| (if v < 0 { v + r } else { v }).clamp(0, r) as usize;
    let start = clamp(cx.attrs.int_or("start", 0)?);
    let end = clamp(cx.attrs.int_or("end", r)?).max(start);
    let dims: Vec<i64> = shape[start..end].iter().map(|&d| d as i64).collect();
    Ok(vec![Some(ids(dims, cx.device)?)])
}

fn size_fwd(cx: &KernelCtx, _: &[Option<Tensor>], _: &Extras) -> Outs {
    let n: usize = cx.in_shape(0)?.iter().product();
    Ok(vec![Some(Tensor::new(n as i64, cx.device)?)])
}

fn constant_of_shape_fwd(cx: &KernelCtx, _: &[Option<Tensor>], _: &Extras) -> Outs {
    let fill = match cx.attrs.tensor("value")? {
        Some(t) => crate::onnx::decode_tensor(t, cx.node)?
            .value
            .and_then(|v| v.data.get_f64(0))
            .unwrap_or(0.0),
        None => 0.0,
    };
    let shape = cx.out_shape(0)?;
    Ok(vec![Some(full(
        fill,
        &shape,
        out_dtype(cx, 0)?,
        cx.device,
    )?)])
}

fn range_fwd(cx: &KernelCtx, xs: &[Option<Tensor>], _: &Extras) -> Outs {
    let n = cx.out_shape(0)?.first().copied().unwrap_or(0);
    let dt = out_dtype(cx, 0)?;
    let y = if dt.is_float() {
        let s = host_f64(inp(xs, 0)?)?.first().copied().unwrap_or(0.0);
        let d = host_f64(inp(xs, 2)?)?.first().copied().unwrap_or(0.0);
        let v: Vec<f64> = (0..n).map(|k| s + k as f64 * d).collect();
        Tensor::from_vec(v, n, cx.device)?.to_dtype(dt)?
    } else {
        let s = host_i64(inp(xs, 0)?)?.first().copied().unwrap_or(0);
        let d = host_i64(inp(xs, 2)?)?.first().copied().unwrap_or(0);
        let v: Vec<i64> = (0..n as i64)
            .map(|k| s.wrapping_add(k.wrapping_mul(d)))
            .collect();
        Tensor::from_vec(v, n, cx.device)?.to_dtype(dt)?
    };
    Ok(vec![Some(y)])
}

// ---------------------------------------------------------------------------------------------
// Tile, Trilu, DepthToSpace, SpaceToDepth, ReverseSequence
// ---------------------------------------------------------------------------------------------

fn tile_reps(cx: &KernelCtx, xs: &[Option<Tensor>]) -> KResult<Vec<usize>> {
    let reps =
        ints_in(cx, xs, 1)?.ok_or_else(|| KernelError::new("input 1 (repeats) is required"))?;
    if reps.len() != cx.input(0)?.rank() || reps.iter().any(|&r| r < 0) {
        kbail!("repeats {reps:?} do not match rank {}", cx.input(0)?.rank());
    }
    Ok(reps.iter().map(|&r| r as usize).collect())
}

fn tile_fwd(cx: &KernelCtx, xs: &[Option<Tensor>], _: &Extras) -> Outs {
    let reps = tile_reps(cx, xs)?;
    Ok(vec![Some(inp(xs, 0)?.repeat(reps)?.contiguous()?)])
}

fn tile_bwd(cx: &KernelCtx, a: &BwdArgs) -> Outs {
    grad0(cx, a, || {
        let reps = tile_reps(cx, a.inputs)?;
        let shape = cx.in_shape(0)?;
        // Output index rep * d + j: view as (r0, d0, r1, d1, ...) and sum the repetitions.
        let mut split = vec![];
        for (&r, &d) in reps.iter().zip(&shape) {
            split.push(r);
            split.push(d);
        }
        let g = a.grad(cx, 0)?.reshape(split)?;
        let rep_axes: Vec<usize> = (0..reps.len()).map(|k| 2 * k).collect();
        Ok(g.sum(rep_axes)?.reshape(shape)?)
    })
}

/// Trilu's keep mask over the last two dims, broadcast to the input's shape.
fn trilu_mask(cx: &KernelCtx, xs: &[Option<Tensor>]) -> KResult<Tensor> {
    let shape = cx.in_shape(0)?;
    let r = shape.len();
    if r < 2 {
        kbail!("Trilu needs a rank >= 2 input, got {shape:?}");
    }
    let k = ints_in(cx, xs, 1)?
        .and_then(|v| v.first().copied())
        .unwrap_or(0);
    let upper = cx.attrs.int_or("upper", 1)? != 0;
    let (rows, cols) = (shape[r - 2], shape[r - 1]);
    let mut m = Vec::with_capacity(rows * cols);
    for i in 0..rows as i64 {
        for j in 0..cols as i64 {
            let keep = if upper { j - i >= k } else { j - i <= k };
            m.push(u8::from(keep));
        }
    }
    Ok(Tensor::from_vec(m, (rows, cols), cx.device)?
        .broadcast_as(shape)?
        .contiguous()?)
}

fn trilu_fwd(cx: &KernelCtx, xs: &[Option<Tensor>], _: &Extras) -> Outs {
    let x = inp(xs, 0)?;
    let m = trilu_mask(cx, xs)?;
    Ok(vec![Some(
        m.where_cond(&x.contiguous()?, &x.zeros_like()?)?,
    )])
}

fn trilu_bwd(cx: &KernelCtx, a: &BwdArgs) -> Outs {
    grad0(cx, a, || {
        let g = a.grad(cx, 0)?.contiguous()?;
        let m = trilu_mask(cx, a.inputs)?;
        Ok(m.where_cond(&g, &g.zeros_like()?)?)
    })
}

/// DepthToSpace / SpaceToDepth as reshape → permute → reshape: the intermediate shape, the
/// permutation and whether the op runs forward (`to_space`).
fn depth_plan(cx: &KernelCtx) -> KResult<(Vec<usize>, Vec<usize>)> {
    let s = cx.in_shape(0)?;
    let b = cx.attrs.int("blocksize")?.unwrap_or(0);
    if s.len() != 4 || b < 1 {
        kbail!("needs a 4-D input and a positive \"blocksize\", got {s:?} and {b}");
    }
    let b = b as usize;
    let (n, c, h, w) = (s[0], s[1], s[2], s[3]);
    if cx.op == "DepthToSpace" {
        let c2 = c / (b * b);
        match cx.attrs.string("mode")?.as_deref().unwrap_or("DCR") {
            "DCR" => Ok((vec![n, b, b, c2, h, w], vec![0, 3, 4, 1, 5, 2])),
            "CRD" => Ok((vec![n, c2, b, b, h, w], vec![0, 1, 4, 2, 5, 3])),
            m => kbail!("attribute \"mode\" = {m:?} is not supported"),
        }
    } else {
        Ok((vec![n, c, h / b, b, w / b, b], vec![0, 3, 5, 1, 2, 4]))
    }
}

fn depth_fwd(cx: &KernelCtx, xs: &[Option<Tensor>], _: &Extras) -> Outs {
    let (mid, perm) = depth_plan(cx)?;
    let y = inp(xs, 0)?
        .reshape(mid)?
        .permute(perm)?
        .contiguous()?
        .reshape(cx.out_shape(0)?)?;
    Ok(vec![Some(y)])
}

fn depth_bwd(cx: &KernelCtx, a: &BwdArgs) -> Outs {
    grad0(cx, a, || {
        let (mid, perm) = depth_plan(cx)?;
        let permuted: Vec<usize> = perm
            .iter()
            .map(|&p| mid.get(p).copied().unwrap_or(1))
            .collect();
        let mut inv = vec![0; perm.len()];
        for (k, &p) in perm.iter().enumerate() {
            if let Some(s) = inv.get_mut(p) {
                *s = k;
            }
        }
        Ok(a.grad(cx, 0)?
            .reshape(permuted)?
            .permute(inv)?
            .contiguous()?
            .reshape(cx.in_shape(0)?)?)
    })
}

/// ReverseSequence: the flat source of every output element.
fn reverse_positions(cx: &KernelCtx, lens: &[i64]) -> KResult<Vec<i64>> {
    let shape = cx.in_shape(0)?;
    let r = shape.len();
    let ba = cx.axis(cx.attrs.int_or("batch_axis", 1)?, r)?;
    let ta = cx.axis(cx.attrs.int_or("time_axis", 0)?, r)?;
    if ba == ta {
        kbail!("attributes \"batch_axis\" and \"time_axis\" are both {ba}");
    }
    let (nb, nt) = (shape[ba], shape[ta]);
    if lens.len() != nb {
        kbail!(
            "sequence_lens has {} entries for a batch of {nb}",
            lens.len()
        );
    }
    if let Some(bad) = lens.iter().find(|&&l| l < 0 || l as usize > nt) {
        kbail!("sequence length {bad} is out of range for a time axis of {nt}");
    }
    let st = strides(&shape);
    let n: usize = shape.iter().product();
    let mut out = Vec::with_capacity(n);
    for flat in 0..n {
        let b = flat / st[ba] % nb;
        let t = flat / st[ta] % nt;
        let l = lens[b] as usize;
        let src = if t < l { l - 1 - t } else { t };
        out.push((flat + src * st[ta] - t * st[ta]) as i64);
    }
    Ok(out)
}

fn reverse_fwd(cx: &KernelCtx, xs: &[Option<Tensor>], _: &Extras) -> Outs {
    let x = inp(xs, 0)?;
    let pos = reverse_positions(cx, &host_i64(inp(xs, 1)?)?)?;
    Ok(vec![Some(
        select(&x.flatten_all()?, &pos, 0)?.reshape(x.dims())?,
    )])
}

fn reverse_bwd(cx: &KernelCtx, a: &BwdArgs) -> Outs {
    grad0(cx, a, || {
        let lens = ints_in(cx, a.inputs, 1)?
            .ok_or_else(|| KernelError::new("the backward needs input 1 (sequence_lens)"))?;
        let pos = reverse_positions(cx, &lens)?;
        let shape = cx.in_shape(0)?;
        let n = shape.iter().product();
        Ok(unselect(&a.grad(cx, 0)?.flatten_all()?, &pos, 0, n)?.reshape(shape)?)
    })
}

// ---------------------------------------------------------------------------------------------
// GatherND, ScatterND, ScatterElements
// ---------------------------------------------------------------------------------------------

/// GatherND / ScatterND rows: the data viewed as `[rows, slice]` and, per index tuple, the row it
/// addresses.
struct NdPlan {
    rows: usize,
    slice: usize,
    picks: Vec<i64>,
}

fn nd_plan(data: &[usize], ind_shape: &[usize], idx: &[i64], batch: usize) -> KResult<NdPlan> {
    let k = ind_shape.last().copied().unwrap_or(0);
    if ind_shape.is_empty() || batch + k > data.len() || batch >= ind_shape.len() {
        kbail!("indices {ind_shape:?} with batch_dims {batch} do not index data {data:?}");
    }
    if data[..batch] != ind_shape[..batch] {
        kbail!("batch dims of indices {ind_shape:?} and data {data:?} differ");
    }
    let bsize: usize = data[..batch].iter().product();
    let indexed = &data[batch..batch + k];
    let per_batch: usize = indexed.iter().product();
    let slice: usize = data[batch + k..].iter().product();
    let tuples: usize = ind_shape[..ind_shape.len() - 1].iter().product();
    let per_b = tuples.checked_div(bsize).unwrap_or(0);
    let st = strides(indexed);
    let mut picks = Vec::with_capacity(tuples);
    for t in 0..tuples {
        let b = t.checked_div(per_b).unwrap_or(0);
        let mut row = b * per_batch;
        for j in 0..k {
            let v = idx.get(t * k + j).copied().unwrap_or(0);
            let d = indexed[j] as i64;
            let v = if v < 0 { v + d } else { v };
            if v < 0 || v >= d {
                kbail!("index {v} is out of range for a dim of size {d}");
            }
            row += v as usize * st[j];
        }
        picks.push(row as i64);
    }
    Ok(NdPlan {
        rows: bsize * per_batch,
        slice,
        picks,
    })
}

fn gather_nd_plan(cx: &KernelCtx, ind: &Tensor) -> KResult<NdPlan> {
    let b = cx.attrs.int_or("batch_dims", 0)?;
    let b = usize::try_from(b)
        .map_err(|_| KernelError::new("attribute \"batch_dims\" must be non-negative"))?;
    nd_plan(&cx.in_shape(0)?, ind.dims(), &host_i64(ind)?, b)
}

fn gather_nd_fwd(cx: &KernelCtx, xs: &[Option<Tensor>], _: &Extras) -> Outs {
    let x = inp(xs, 0)?;
    let p = gather_nd_plan(cx, inp(xs, 1)?)?;
    let y = select(&x.reshape((p.rows, p.slice))?, &p.picks, 0)?.reshape(cx.out_shape(0)?)?;
    Ok(vec![Some(y)])
}

fn gather_nd_bwd(cx: &KernelCtx, a: &BwdArgs) -> Outs {
    grad0(cx, a, || {
        let p = gather_nd_plan(cx, a.input(1)?)?;
        let g = a.grad(cx, 0)?.reshape((p.picks.len(), p.slice))?;
        Ok(unselect(&g, &p.picks, 0, p.rows)?.reshape(cx.in_shape(0)?)?)
    })
}

#[derive(Clone, Copy, PartialEq)]
enum Reduction {
    None,
    Add,
    Mul,
    Max,
    Min,
}

fn reduction(cx: &KernelCtx) -> KResult<Reduction> {
    match cx.attrs.string("reduction")?.as_deref().unwrap_or("none") {
        "none" => Ok(Reduction::None),
        "add" => Ok(Reduction::Add),
        "mul" => Ok(Reduction::Mul),
        "max" => Ok(Reduction::Max),
        "min" => Ok(Reduction::Min),
        m => kbail!("attribute \"reduction\" = {m:?} is not supported"),
    }
}

/// Per hit row, the update rows that land on it (in order).
fn row_hits(rows: usize, picks: &[i64]) -> Vec<Vec<usize>> {
    let mut hits = vec![vec![]; rows];
    for (t, &p) in picks.iter().enumerate() {
        if let Some(h) = hits.get_mut(p as usize) {
            h.push(t);
        }
    }
    hits
}

/// Mul / max / min scatters on the host (`[rows, slice]` data, `[picks, slice]` updates).
fn scatter_reduce_host(
    data: &Tensor,
    picks: &[i64],
    upd: &Tensor,
    red: Reduction,
) -> KResult<Tensor> {
    let (rows, slice) = data.dims2()?;
    let mut out = host_f64(data)?;
    let u = host_f64(upd)?;
    for (t, &p) in picks.iter().enumerate() {
        for j in 0..slice {
            let (Some(o), Some(&v)) = (out.get_mut(p as usize * slice + j), u.get(t * slice + j))
            else {
                kbail!("update {t} does not fit the data");
            };
            *o = match red {
                Reduction::Mul => *o * v,
                Reduction::Max => o.max(v),
                Reduction::Min => o.min(v),
                Reduction::None | Reduction::Add => v,
            };
        }
    }
    Ok(Tensor::from_vec(out, (rows, slice), data.device())?.to_dtype(data.dtype())?)
}

/// Gradients of a mul / max / min scatter from the data, the updates and `g`. Max and min
/// share the gradient evenly between the values equal to the result (as PyTorch's amax).
fn scatter_reduce_bwd(
    data: &Tensor,
    picks: &[i64],
    upd: &Tensor,
    g: &Tensor,
    red: Reduction,
) -> KResult<(Tensor, Tensor)> {
    let (rows, slice) = data.dims2()?;
    let dv = host_f64(data)?;
    let u = host_f64(upd)?;
    let gv = host_f64(g)?;
    if dv.len() != rows * slice || gv.len() != rows * slice || u.len() != picks.len() * slice {
        kbail!("scatter gradient: data, updates and gradient do not match");
    }
    let mut dd = gv.clone();
    let mut du = vec![0.0; u.len()];
    for (r, ts) in row_hits(rows, picks).iter().enumerate() {
        if ts.is_empty() {
            continue;
        }
        for j in 0..slice {
            let k = r * slice + j;
            let ups: Vec<f64> = ts.iter().map(|&t| u[t * slice + j]).collect();
            match red {
                Reduction::Mul => {
                    dd[k] = gv[k] * ups.iter().product::<f64>();
                    for (q, &t) in ts.iter().enumerate() {
                        let others: f64 = ups
                            .iter()
                            .enumerate()
                            .filter(|&(w, _)| w != q)
                            .map(|(_, &v)| v)
                            .product();
                        du[t * slice + j] = gv[k] * dv[k] * others;
                    }
                }
                _ => {
                    let best = ups.iter().fold(dv[k], |m, &v| {
                        if red == Reduction::Max {
                            m.max(v)
                        } else {
                            m.min(v)
                        }
                    });
                    let n = ups.iter().filter(|&&v| v == best).count() + usize::from(dv[k] == best);
                    let share = gv[k] / n.max(1) as f64;
                    dd[k] = if dv[k] == best { share } else { 0.0 };
                    for (q, &t) in ts.iter().enumerate() {
                        du[t * slice + j] = if ups[q] == best { share } else { 0.0 };
                    }
                }
            }
        }
    }
    let dt = g.dtype();
    Ok((
        Tensor::from_vec(dd, (rows, slice), g.device())?.to_dtype(dt)?,
        Tensor::from_vec(du, (picks.len(), slice), g.device())?.to_dtype(dt)?,
    ))
}

/// Rows of a `[rows, slice]` view hit by `picks`, as a `[rows, 1]` mask.
fn hit_mask(rows: usize, picks: &[i64], dev: &Device) -> KResult<Tensor> {
    let mut m = vec![0u8; rows];
    for &p in picks {
        if let Some(v) = m.get_mut(p as usize) {
            *v = 1;
        }
    }
    Ok(Tensor::from_vec(m, (rows, 1), dev)?)
}

/// Writes (or adds) `upd` (`[picks, slice]`) into the rows `picks` of `data` (`[rows, slice]`).
fn scatter_rows(data: &Tensor, picks: &[i64], upd: &Tensor, red: Reduction) -> KResult<Tensor> {
    let (rows, slice) = data.dims2()?;
    let id = ids(picks.to_vec(), data.device())?;
    let upd = upd.contiguous()?;
    match red {
        Reduction::Mul | Reduction::Max | Reduction::Min => {
            scatter_reduce_host(data, picks, &upd, red)
        }
        Reduction::Add => Ok(data.contiguous()?.index_add(&id, &upd, 0)?),
        Reduction::None => {
            let placed = Tensor::zeros((rows, slice), data.dtype(), data.device())?
                .index_add(&id, &upd, 0)?;
            let hit = hit_mask(rows, picks, data.device())?.broadcast_as((rows, slice))?;
            Ok(hit.where_cond(&placed, &data.contiguous()?)?)
        }
    }
}

/// Gradients of a row scatter: (d data, d updates) from `g` (`[rows, slice]`).
fn scatter_rows_bwd(g: &Tensor, picks: &[i64], add: bool) -> KResult<(Tensor, Tensor)> {
    let (rows, slice) = g.dims2()?;
    let g = g.contiguous()?;
    let dd = if add {
        g.clone()
    } else {
        let hit = hit_mask(rows, picks, g.device())?.broadcast_as((rows, slice))?;
        hit.where_cond(&g.zeros_like()?, &g)?
    };
    Ok((dd, select(&g, picks, 0)?))
}

/// Scatter plan: `[rows, slice]`, the picked rows, and the updates' shape.
fn scatter_plan(cx: &KernelCtx, ind: &Tensor) -> KResult<NdPlan> {
    let data = cx.in_shape(0)?;
    let idx = host_i64(ind)?;
    if cx.op == "ScatterND" {
        nd_plan(&data, ind.dims(), &idx, 0)
    } else {
        let axis = cx.axis(cx.attrs.int_or("axis", 0)?, data.len())?;
        let picks = element_positions(&data, ind.dims(), axis, &idx)?;
        Ok(NdPlan {
            rows: data.iter().product(),
            slice: 1,
            picks,
        })
    }
}

fn scatter_fwd(cx: &KernelCtx, xs: &[Option<Tensor>], _: &Extras) -> Outs {
    let x = inp(xs, 0)?;
    let upd = inp(xs, 2)?;
    let p = scatter_plan(cx, inp(xs, 1)?)?;
    let y = scatter_rows(
        &x.reshape((p.rows, p.slice))?,
        &p.picks,
        &upd.reshape((p.picks.len(), p.slice))?,
        reduction(cx)?,
    )?;
    Ok(vec![Some(y.reshape(x.dims())?)])
}

fn scatter_bwd(cx: &KernelCtx, a: &BwdArgs) -> Outs {
    let p = scatter_plan(cx, a.input(1)?)?;
    let g = a.grad(cx, 0)?.reshape((p.rows, p.slice))?;
    let red = reduction(cx)?;
    let (dd, du) = match red {
        Reduction::None | Reduction::Add => scatter_rows_bwd(&g, &p.picks, red == Reduction::Add)?,
        _ => scatter_reduce_bwd(
            &a.input(0)?.reshape((p.rows, p.slice))?,
            &p.picks,
            &a.input(2)?.reshape((p.picks.len(), p.slice))?,
            &g,
            red,
        )?,
    };
    let mut v = vec![None; cx.inputs.len()];
    if a.need(0) {
        if let Some(slot) = v.get_mut(0) {
            *slot = Some(dd.reshape(cx.in_shape(0)?)?);
        }
    }
    if a.need(2) {
        if let Some(slot) = v.get_mut(2) {
            *slot = Some(du.reshape(cx.in_shape(2)?)?);
        }
    }
    Ok(v)
}

// ---------------------------------------------------------------------------------------------
// TopK
// ---------------------------------------------------------------------------------------------

fn topk_fwd(cx: &KernelCtx, xs: &[Option<Tensor>], _: &Extras) -> Outs {
    let x = inp(xs, 0)?;
    let shape = x.dims().to_vec();
    let axis = cx.axis(cx.attrs.int_or("axis", -1)?, shape.len())?;
    let k = cx.out_shape(0)?.get(axis).copied().unwrap_or(0);
    let largest = cx.attrs.int_or("largest", 1)? != 0;
    let d = shape[axis];
    let outer: usize = shape[..axis].iter().product();
    let inner: usize = shape[axis + 1..].iter().product();
    let v = host_f64(x)?;
    let mut idx = vec![0i64; outer * k * inner];
    let mut order: Vec<usize> = Vec::with_capacity(d);
    for o in 0..outer {
        for i in 0..inner {
            order.clear();
            order.extend(0..d);
            let at = |j: usize| v[(o * d + j) * inner + i];
            // Stable: equal values keep the lower index first.
            if largest {
                order.sort_by(|&p, &q| at(q).total_cmp(&at(p)));
            } else {
                order.sort_by(|&p, &q| at(p).total_cmp(&at(q)));
            }
            for (r, &j) in order.iter().take(k).enumerate() {
                idx[(o * k + r) * inner + i] = j as i64;
            }
        }
    }
    let mut out_shape = shape.clone();
    out_shape[axis] = k;
    let it = Tensor::from_vec(idx, out_shape, x.device())?;
    let values = x.contiguous()?.gather(&it, axis)?;
    let present = |k: usize| cx.outputs.get(k).is_some_and(|f| f.is_some());
    Ok(vec![present(0).then_some(values), present(1).then_some(it)])
}

fn topk_bwd(cx: &KernelCtx, a: &BwdArgs) -> Outs {
    grad0(cx, a, || {
        let shape = cx.in_shape(0)?;
        let axis = cx.axis(cx.attrs.int_or("axis", -1)?, shape.len())?;
        let idx = a.output(1)?.to_dtype(CD::I64)?.contiguous()?;
        let g = a.grad(cx, 0)?.contiguous()?;
        let z = Tensor::zeros(shape, g.dtype(), g.device())?;
        Ok(z.scatter_add(&idx, &g, axis)?)
    })
}

// ---------------------------------------------------------------------------------------------
// OneHot, EyeLike, NonZero
// ---------------------------------------------------------------------------------------------

fn onehot_fwd(cx: &KernelCtx, xs: &[Option<Tensor>], _: &Extras) -> Outs {
    let ind = inp(xs, 0)?;
    let out = cx.out_shape(0)?;
    let axis = cx.axis(cx.attrs.int_or("axis", -1)?, out.len())?;
    let depth = out[axis] as i64;
    // Indices in [-depth, depth) count from the end when negative; others select nothing.
    let idx: Vec<i64> = host_i64(ind)?
        .into_iter()
        .map(|v| {
            let v = if v < 0 { v + depth } else { v };
            if (0..depth).contains(&v) {
                v
            } else {
                -1
            }
        })
        .collect();
    let it = Tensor::from_vec(idx, ind.dims(), cx.device)?.unsqueeze(axis)?;
    let mut ar_shape = vec![1; out.len()];
    ar_shape[axis] = depth as usize;
    let ar = Tensor::arange(0i64, depth, cx.device)?.reshape(ar_shape)?;
    let mask = it.broadcast_eq(&ar)?.contiguous()?;
    let values = inp(xs, 2)?.flatten_all()?;
    if values.elem_count() != 2 {
        kbail!(
            "values must hold [off, on], got {} elements",
            values.elem_count()
        );
    }
    let off = values
        .narrow(0, 0, 1)?
        .reshape(())?
        .broadcast_as(out.as_slice())?;
    let on = values
        .narrow(0, 1, 1)?
        .reshape(())?
        .broadcast_as(out.as_slice())?;
    Ok(vec![Some(
        mask.where_cond(&on.contiguous()?, &off.contiguous()?)?,
    )])
}

fn eyelike_fwd(cx: &KernelCtx, _: &[Option<Tensor>], _: &Extras) -> Outs {
    let shape = cx.out_shape(0)?;
    if shape.len() != 2 {
        kbail!("EyeLike needs a 2-D input, got {shape:?}");
    }
    let k = cx.attrs.int_or("k", 0)?;
    let (r, c) = (shape[0], shape[1]);
    let v: Vec<f64> = (0..r as i64)
        .flat_map(|i| (0..c as i64).map(move |j| if j - i == k { 1.0 } else { 0.0 }))
        .collect();
    Ok(vec![Some(
        Tensor::from_vec(v, (r, c), cx.device)?.to_dtype(out_dtype(cx, 0)?)?,
    )])
}

fn nonzero_fwd(cx: &KernelCtx, xs: &[Option<Tensor>], _: &Extras) -> Outs {
    let x = inp(xs, 0)?;
    let shape = x.dims().to_vec();
    let st = strides(&shape);
    let nz: Vec<usize> = host_f64(x)?
        .iter()
        .enumerate()
        .filter(|(_, &v)| v != 0.0)
        .map(|(i, _)| i)
        .collect();
    let r = shape.len();
    let mut data = Vec::with_capacity(r * nz.len());
    for k in 0..r {
        data.extend(nz.iter().map(|&f| (f / st[k] % shape[k]) as i64));
    }
    let want = cx.out_shape(0)?;
    if want != [r, nz.len()] {
        kbail!(
            "the input has {} non-zero elements, the shape rule expected {want:?}",
            nz.len()
        );
    }
    Ok(vec![Some(Tensor::from_vec(
        data,
        (r, nz.len()),
        cx.device,
    )?)])
}

// ---------------------------------------------------------------------------------------------
// LpNormalization, MeanVarianceNormalization
// ---------------------------------------------------------------------------------------------

fn lp_params(cx: &KernelCtx) -> KResult<(usize, i64)> {
    let axis = cx.axis(cx.attrs.int_or("axis", -1)?, cx.input(0)?.rank())?;
    let p = cx.attrs.int_or("p", 2)?;
    if p != 1 && p != 2 {
        kbail!("attribute \"p\" = {p} is not supported (1 or 2)");
    }
    Ok((axis, p))
}

fn lp_norm(x: &Tensor, axis: usize, p: i64) -> KResult<Tensor> {
    Ok(if p == 1 {
        x.abs()?.sum_keepdim(axis)?
    } else {
        x.sqr()?.sum_keepdim(axis)?.sqrt()?
    })
}

fn lp_fwd(cx: &KernelCtx, xs: &[Option<Tensor>], _: &Extras) -> Outs {
    let x = inp(xs, 0)?;
    let (axis, p) = lp_params(cx)?;
    Ok(vec![Some(x.broadcast_div(&lp_norm(x, axis, p)?)?)])
}

fn lp_bwd(cx: &KernelCtx, a: &BwdArgs) -> Outs {
    grad0(cx, a, || {
        let (axis, p) = lp_params(cx)?;
        let x = a.input(0)?;
        let y = a.output(0)?;
        let g = a.grad(cx, 0)?;
        let n = lp_norm(x, axis, p)?;
        // dx = (g - dn/dx * sum(g * y)) / n, with dn/dx = y (p = 2) or sign(x) (p = 1).
        let s = (&g * y)?.sum_keepdim(axis)?;
        let dn = if p == 1 { x.sign()? } else { y.clone() };
        Ok((g - dn.broadcast_mul(&s)?)?.broadcast_div(&n)?)
    })
}

fn mvn_axes(cx: &KernelCtx) -> KResult<Vec<usize>> {
    let rank = cx.input(0)?.rank();
    match cx.attrs.ints("axes")? {
        Some(a) => Ok(sctx(cx).axes(a, rank)?),
        None => Ok(sctx(cx).axes(&[0, 2, 3], rank)?),
    }
}

const MVN_EPS: f64 = 1e-9;

/// The type MVN computes in: f32 for the 16-bit types (whose range loses the epsilon).
fn wide(t: &Tensor) -> KResult<Tensor> {
    Ok(match t.dtype() {
        CD::F16 | CD::BF16 => t.to_dtype(CD::F32)?,
        _ => t.clone(),
    })
}

/// The centred input and the standard deviation per group, in [`wide`] precision.
fn mvn_parts(x: &Tensor, axes: &[usize]) -> KResult<(Tensor, Tensor)> {
    let x = wide(x)?;
    let xc = x.broadcast_sub(&x.mean_keepdim(axes)?)?;
    let std = xc.sqr()?.mean_keepdim(axes)?.sqrt()?;
    Ok((xc, std))
}

fn mvn_fwd(cx: &KernelCtx, xs: &[Option<Tensor>], _: &Extras) -> Outs {
    let axes = mvn_axes(cx)?;
    let x = inp(xs, 0)?;
    let (xc, std) = mvn_parts(x, &axes)?;
    let y = xc.broadcast_div(&std.affine(1.0, MVN_EPS)?)?;
    Ok(vec![Some(y.to_dtype(x.dtype())?)])
}

fn mvn_bwd(cx: &KernelCtx, a: &BwdArgs) -> Outs {
    grad0(cx, a, || {
        let axes = mvn_axes(cx)?;
        let (xc, std) = mvn_parts(a.input(0)?, &axes)?;
        let g0 = a.grad(cx, 0)?;
        let g = wide(&g0)?;
        let d = std.affine(1.0, MVN_EPS)?;
        // y = xc / (s + eps): dx = (g - mean g) / d - xc * mean(g * xc) / (d² s).
        let gc = g.broadcast_sub(&g.mean_keepdim(axes.as_slice())?)?;
        let m = (&g * &xc)?.mean_keepdim(axes.as_slice())?;
        // A constant group (s = 0) has xc = 0: its std term vanishes (no 0 / 0).
        let den = d.sqr()?.mul(&std)?;
        let ratio = std.gt(0.0)?.where_cond(&m.div(&den)?, &m.zeros_like()?)?;
        let term = xc.broadcast_mul(&ratio)?;
        Ok((gc.broadcast_div(&d)? - term)?.to_dtype(g0.dtype())?)
    })
}

// ---------------------------------------------------------------------------------------------
// RandomNormal(Like), RandomUniform(Like), Bernoulli
// ---------------------------------------------------------------------------------------------

/// A standard normal draw (Box-Muller).
fn normal(rng: &mut Rng) -> f64 {
    let u1 = rng.uniform(f64::MIN_POSITIVE, 1.0);
    let u2 = rng.uniform(0.0, 1.0);
    (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
}

fn random_fwd(cx: &KernelCtx, xs: &[Option<Tensor>], _: &Extras) -> Outs {
    let shape = cx.out_shape(0)?;
    let dt = out_dtype(cx, 0)?;
    let n: usize = shape.iter().product();
    let mut rng = Rng::new(cx.seed);
    let f = |name: &str, d: f32| -> KResult<f64> { Ok(f64::from(cx.attrs.float_or(name, d)?)) };
    let v: Vec<f64> = match cx.op {
        "RandomNormal" | "RandomNormalLike" => {
            let (mean, scale) = (f("mean", 0.0)?, f("scale", 1.0)?);
            (0..n).map(|_| mean + scale * normal(&mut rng)).collect()
        }
        "RandomUniform" | "RandomUniformLike" => {
            let (lo, hi) = (f("low", 0.0)?, f("high", 1.0)?);
            (0..n).map(|_| rng.uniform(lo, hi)).collect()
        }
        "Bernoulli" => {
            let p = host_f64(inp(xs, 0)?)?;
            if p.len() != n {
                kbail!(
                    "probabilities hold {} elements for an output of {n}",
                    p.len()
                );
            }
            p.iter()
                .map(|&q| if rng.uniform(0.0, 1.0) < q { 1.0 } else { 0.0 })
                .collect()
        }
        op => kbail!("{op} is not a random op"),
    };
    Ok(vec![Some(
        Tensor::from_vec(v, shape, cx.device)?.to_dtype(dt)?,
    )])
}

// ---------------------------------------------------------------------------------------------
// QuantizeLinear, DequantizeLinear
// ---------------------------------------------------------------------------------------------

/// The range of an ONNX integer type.
fn int_range(d: DType) -> KResult<(f64, f64)> {
    Ok(match d {
        DType::U8 => (0.0, 255.0),
        DType::I8 => (-128.0, 127.0),
        DType::U16 => (0.0, 65535.0),
        DType::I16 => (-32768.0, 32767.0),
        DType::I32 => (-2147483648.0, 2147483647.0),
        DType::U32 => (0.0, 4294967295.0),
        other => kbail!("quantized type {other:?} is not supported"),
    })
}

/// Integer tensor values as floats of type `ft`, reading `int8` (held in `u8`) as signed.
fn int_values(t: &Tensor, d: DType, ft: CD) -> KResult<Tensor> {
    let v = t.to_dtype(ft)?;
    if d == DType::I8 {
        let neg = t.ge(128u8)?;
        return Ok(neg.where_cond(&v.affine(1.0, -256.0)?, &v)?);
    }
    Ok(v)
}

/// `scale`/`zero_point` shaped to broadcast against an input of `rank` (per-axis when 1-D).
fn quant_param(cx: &KernelCtx, t: &Tensor, rank: usize) -> KResult<Tensor> {
    if cx.attrs.int_or("block_size", 0)? != 0 {
        kbail!("attribute \"block_size\" (blocked quantization) is not supported");
    }
    if t.rank() == 0 || t.elem_count() == 1 {
        return Ok(t.flatten_all()?.reshape(())?);
    }
    if t.rank() != 1 {
        kbail!(
            "scale of shape {:?} is neither a scalar nor per-axis",
            t.dims()
        );
    }
    let axis = cx.axis(cx.attrs.int_or("axis", 1)?, rank)?;
    let mut shape = vec![1; rank];
    shape[axis] = t.elem_count();
    Ok(t.reshape(shape)?)
}

/// Round half to even.
fn round_even(v: &Tensor) -> KResult<Tensor> {
    let r = v.round()?;
    let even = v.affine(0.5, 0.0)?.round()?.affine(2.0, 0.0)?;
    let tie = (v - v.floor()?)?.eq(0.5)?;
    Ok(tie.where_cond(&even, &r)?)
}

fn quantize_fwd(cx: &KernelCtx, xs: &[Option<Tensor>], _: &Extras) -> Outs {
    let x = inp(xs, 0)?;
    let rank = x.rank();
    let ft = if x.dtype() == CD::F64 {
        CD::F64
    } else {
        CD::F32
    };
    let to = cx
        .outputs
        .first()
        .and_then(|f| f.as_ref())
        .ok_or_else(|| KernelError::new("output 0 is not in the graph"))?
        .dtype;
    let (lo, hi) = int_range(to)?;
    let scale = quant_param(cx, &inp(xs, 1)?.to_dtype(ft)?, rank)?;
    let mut q = round_even(&x.to_dtype(ft)?.broadcast_div(&scale)?)?;
    if let Some(zp) = xs.get(2).and_then(|t| t.as_ref()) {
        let zd = cx.input(2)?.dtype;
        q = q.broadcast_add(&quant_param(cx, &int_values(zp, zd, ft)?, rank)?)?;
    }
    let q = q
        .clamp(lo, hi)?
        .to_dtype(CD::I64)?
        .to_dtype(to_candle(to)?)?;
    Ok(vec![Some(q)])
}

/// The output is an integer tensor: no gradient reaches the input through it.
fn quantize_bwd(cx: &KernelCtx, a: &BwdArgs) -> Outs {
    grad0(cx, a, || {
        Ok(Tensor::zeros(cx.in_shape(0)?, in_dtype(cx, 0)?, cx.device)?)
    })
}

fn dequantize_fwd(cx: &KernelCtx, xs: &[Option<Tensor>], _: &Extras) -> Outs {
    let x = inp(xs, 0)?;
    let rank = x.rank();
    let dt = out_dtype(cx, 0)?;
    let ft = if dt == CD::F64 { CD::F64 } else { CD::F32 };
    let mut v = int_values(x, cx.input(0)?.dtype, ft)?;
    if let Some(zp) = xs.get(2).and_then(|t| t.as_ref()) {
        let zd = cx.input(2)?.dtype;
        v = v.broadcast_sub(&quant_param(cx, &int_values(zp, zd, ft)?, rank)?)?;
    }
    let scale = quant_param(cx, &inp(xs, 1)?.to_dtype(ft)?, rank)?;
    Ok(vec![Some(v.broadcast_mul(&scale)?.to_dtype(dt)?)])
}

/// d y / d x = scale (for an input read as real values).
fn dequantize_bwd(cx: &KernelCtx, a: &BwdArgs) -> Outs {
    grad0(cx, a, || {
        let g = a.grad(cx, 0)?;
        let scale = quant_param(cx, &a.input(1)?.to_dtype(g.dtype())?, g.rank())?;
        Ok(g.broadcast_mul(&scale)?.to_dtype(in_dtype(cx, 0)?)?)
    })
}

// ---------------------------------------------------------------------------------------------
// GridSample (4-D, host loops)
// ---------------------------------------------------------------------------------------------

#[derive(Clone, Copy, PartialEq)]
enum GridPad {
    Zeros,
    Border,
    Reflection,
}

#[derive(Clone, Copy, PartialEq)]
enum GridMode {
    Linear,
    Nearest,
    Cubic,
}

struct GridPlan {
    mode: GridMode,
    pad: GridPad,
    align: bool,
    /// N, C, H, W of the input; Ho, Wo of the grid.
    dims: [usize; 6],
}

fn grid_plan(cx: &KernelCtx) -> KResult<GridPlan> {
    let x = cx.in_shape(0)?;
    let g = cx.in_shape(1)?;
    if x.len() != 4 || g.len() != 4 || g[3] != 2 || g[0] != x[0] {
        kbail!("GridSample supports 4-D inputs with an [N, H, W, 2] grid, got {x:?} and {g:?}");
    }
    let mode = match cx.attrs.string("mode")?.as_deref().unwrap_or("bilinear") {
        "bilinear" | "linear" => GridMode::Linear,
        "nearest" => GridMode::Nearest,
        "bicubic" | "cubic" => GridMode::Cubic,
        m => kbail!("attribute \"mode\" = {m:?} is not supported"),
    };
    let pad = match cx
        .attrs
        .string("padding_mode")?
        .as_deref()
        .unwrap_or("zeros")
    {
        "zeros" => GridPad::Zeros,
        "border" => GridPad::Border,
        "reflection" => GridPad::Reflection,
        m => kbail!("attribute \"padding_mode\" = {m:?} is not supported"),
    };
    Ok(GridPlan {
        mode,
        pad,
        align: cx.attrs.int_or("align_corners", 0)? != 0,
        dims: [x[0], x[1], x[2], x[3], g[1], g[2]],
    })
}

/// Reflects `x` into [lo/2, hi/2] (PyTorch's `reflect_coordinates`), with d out / d x.
fn reflect(x: f64, twice_lo: f64, twice_hi: f64) -> (f64, f64) {
    if twice_lo == twice_hi {
        return (0.0, 0.0);
    }
    let min = twice_lo / 2.0;
    let span = (twice_hi - twice_lo) / 2.0;
    let (mut x, mut sign) = (x - min, 1.0);
    if x < 0.0 {
        x = -x;
        sign = -1.0;
    }
    let extra = x % span;
    let flips = (x / span).floor();
    if flips % 2.0 == 0.0 {
        (extra + min, sign)
    } else {
        (span - extra + min, -sign)
    }
}

/// Pixel coordinate of a normalized grid value along an axis of `size`, with d coord / d g.
fn unnormalize(p: &GridPlan, g: f64, size: usize) -> (f64, f64) {
    let s = size as f64;
    if p.align {
        ((g + 1.0) / 2.0 * (s - 1.0), (s - 1.0) / 2.0)
    } else {
        (((g + 1.0) * s - 1.0) / 2.0, s / 2.0)
    }
}

/// Source coordinate of a normalized grid value along an axis of `size` after the padding
/// mode, with d coord / d g.
fn grid_coord(p: &GridPlan, g: f64, size: usize) -> (f64, f64) {
    let s = size as f64;
    let (mut c, mut d) = unnormalize(p, g, size);
    let clip = |c: f64, d: f64| {
        if c <= 0.0 {
            (0.0, 0.0)
        } else if c >= s - 1.0 {
            (s - 1.0, 0.0)
        } else {
            (c, d)
        }
    };
    match p.pad {
        GridPad::Zeros => {}
        GridPad::Border => (c, d) = clip(c, d),
        GridPad::Reflection => {
            let (r, rd) = if p.align {
                reflect(c, 0.0, 2.0 * (s - 1.0))
            } else {
                reflect(c, -1.0, 2.0 * s - 1.0)
            };
            (c, d) = clip(r, d * rd);
        }
    }
    (c, d)
}

/// The pixel a bicubic tap at integer position `t` reads under the padding mode (`None`: zero).
fn cubic_tap(p: &GridPlan, t: i64, size: usize) -> Option<i64> {
    let last = size as i64 - 1;
    match p.pad {
        GridPad::Zeros => (0..=last).contains(&t).then_some(t),
        GridPad::Border => Some(t.clamp(0, last)),
        GridPad::Reflection => {
            let s = size as f64;
            let (r, _) = if p.align {
                reflect(t as f64, 0.0, 2.0 * (s - 1.0))
            } else {
                reflect(t as f64, -1.0, 2.0 * s - 1.0)
            };
            Some((r.round() as i64).clamp(0, last))
        }
    }
}

/// Derivatives of [`cubic_coeffs`] with respect to `t`.
fn cubic_coeffs_dt(t: f64, a: f64) -> [f64; 4] {
    let far = |x: f64| (3.0 * a * x - 10.0 * a) * x + 8.0 * a;
    let near = |x: f64| (3.0 * (a + 2.0) * x - 2.0 * (a + 3.0)) * x;
    [far(t + 1.0), near(t), -near(1.0 - t), -far(2.0 - t)]
}

/// Bilinear taps (y, x, weight, d weight / d cx, d weight / d cy) of a source point.
fn taps(cx: f64, cy: f64) -> [(i64, i64, f64, f64, f64); 4] {
    let (x0, y0) = (cx.floor(), cy.floor());
    let (wx, wy) = (cx - x0, cy - y0);
    let (x0, y0) = (x0 as i64, y0 as i64);
    [
        (y0, x0, (1.0 - wx) * (1.0 - wy), -(1.0 - wy), -(1.0 - wx)),
        (y0, x0 + 1, wx * (1.0 - wy), 1.0 - wy, -wx),
        (y0 + 1, x0, (1.0 - wx) * wy, -wy, 1.0 - wx),
        (y0 + 1, x0 + 1, wx * wy, wy, wx),
    ]
}

/// Runs GridSample on host data: the output, and when `g` is given the input and grid gradients.
fn grid_sample(
    p: &GridPlan,
    x: &[f64],
    grid: &[f64],
    g: Option<&[f64]>,
) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let [n, c, h, w, ho, wo] = p.dims;
    let mut y = vec![0.0; n * c * ho * wo];
    let (mut dx, mut dgrid) = if g.is_some() {
        (vec![0.0; x.len()], vec![0.0; grid.len()])
    } else {
        (vec![], vec![])
    };
    let at = |b: usize, ch: usize, yy: i64, xx: i64| -> Option<usize> {
        (yy >= 0 && xx >= 0 && (yy as usize) < h && (xx as usize) < w)
            .then(|| ((b * c + ch) * h + yy as usize) * w + xx as usize)
    };
    for b in 0..n {
        for i in 0..ho {
            for j in 0..wo {
                let gi = ((b * ho + i) * wo + j) * 2;
                let (gx, gy) = (
                    grid.get(gi).copied().unwrap_or(0.0),
                    grid.get(gi + 1).copied().unwrap_or(0.0),
                );
                let ((sx, dsx), (sy, dsy)) = if p.mode == GridMode::Cubic {
                    (unnormalize(p, gx, w), unnormalize(p, gy, h))
                } else {
                    (grid_coord(p, gx, w), grid_coord(p, gy, h))
                };
                let (mut dcx, mut dcy) = (0.0, 0.0);
                for ch in 0..c {
                    let yi = ((b * c + ch) * ho + i) * wo + j;
                    let go = g.and_then(|g| g.get(yi).copied()).unwrap_or(0.0);
                    if p.mode == GridMode::Cubic {
                        let (x0, y0) = (sx.floor(), sy.floor());
                        let (tx, ty) = (sx - x0, sy - y0);
                        let (cxw, cyw) = (cubic_coeffs(tx, -0.75), cubic_coeffs(ty, -0.75));
                        let (dxw, dyw) = (cubic_coeffs_dt(tx, -0.75), cubic_coeffs_dt(ty, -0.75));
                        for (q, (&wy, &dwy)) in cyw.iter().zip(&dyw).enumerate() {
                            let Some(yy) = cubic_tap(p, y0 as i64 - 1 + q as i64, h) else {
                                continue;
                            };
                            for (r, (&wx, &dwx)) in cxw.iter().zip(&dxw).enumerate() {
                                let Some(xx) = cubic_tap(p, x0 as i64 - 1 + r as i64, w) else {
                                    continue;
                                };
                                if let Some(k) = at(b, ch, yy, xx) {
                                    let v = x.get(k).copied().unwrap_or(0.0);
                                    y[yi] += wx * wy * v;
                                    if let Some(d) = dx.get_mut(k) {
                                        *d += go * wx * wy;
                                    }
                                    dcx += go * v * dwx * wy;
                                    dcy += go * v * wx * dwy;
                                }
                            }
                        }
                        continue;
                    }
                    if p.mode == GridMode::Nearest {
                        let (rx, ry) = (sx.round_ties_even() as i64, sy.round_ties_even() as i64);
                        if let Some(k) = at(b, ch, ry, rx) {
                            y[yi] = x.get(k).copied().unwrap_or(0.0);
                            if let Some(d) = dx.get_mut(k) {
                                *d += go;
                            }
                        }
                        continue;
                    }
                    for (ty, tx, wt, dwx, dwy) in taps(sx, sy) {
                        if let Some(k) = at(b, ch, ty, tx) {
                            let v = x.get(k).copied().unwrap_or(0.0);
                            y[yi] += wt * v;
                            if let Some(d) = dx.get_mut(k) {
                                *d += go * wt;
                            }
                            dcx += go * v * dwx;
                            dcy += go * v * dwy;
                        }
                    }
                }
                if let Some(d) = dgrid.get_mut(gi) {
                    *d = dcx * dsx;
                }
                if let Some(d) = dgrid.get_mut(gi + 1) {
                    *d = dcy * dsy;
                }
            }
        }
    }
    (y, dx, dgrid)
}

fn grid_fwd(cx: &KernelCtx, xs: &[Option<Tensor>], _: &Extras) -> Outs {
    let p = grid_plan(cx)?;
    let x = inp(xs, 0)?;
    let (y, _, _) = grid_sample(&p, &host_f64(x)?, &host_f64(inp(xs, 1)?)?, None);
    let [n, c, _, _, ho, wo] = p.dims;
    Ok(vec![Some(
        Tensor::from_vec(y, (n, c, ho, wo), cx.device)?.to_dtype(x.dtype())?,
    )])
}

fn grid_bwd(cx: &KernelCtx, a: &BwdArgs) -> Outs {
    let p = grid_plan(cx)?;
    let x = a.input(0)?;
    let grid = a.input(1)?;
    let g = host_f64(&a.grad(cx, 0)?)?;
    let (_, dx, dgrid) = grid_sample(&p, &host_f64(x)?, &host_f64(grid)?, Some(&g));
    let mut v = vec![None; cx.inputs.len()];
    if a.need(0) {
        if let Some(slot) = v.get_mut(0) {
            *slot = Some(Tensor::from_vec(dx, x.dims(), cx.device)?.to_dtype(x.dtype())?);
        }
    }
    if a.need(1) {
        if let Some(slot) = v.get_mut(1) {
            *slot = Some(Tensor::from_vec(dgrid, grid.dims(), cx.device)?.to_dtype(grid.dtype())?);
        }
    }
    Ok(v)
}

// ---------------------------------------------------------------------------------------------
// Det (host LU with partial pivoting)
// ---------------------------------------------------------------------------------------------

/// LU factorization of an `n × n` row-major matrix in place: the pivot rows, the
/// determinant's sign, and `false` when the matrix is singular.
fn lu(a: &mut [f64], n: usize) -> (Vec<usize>, f64, bool) {
    let mut piv: Vec<usize> = (0..n).collect();
    let mut sign = 1.0;
    for k in 0..n {
        let p = (k..n)
            .max_by(|&i, &j| a[i * n + k].abs().total_cmp(&a[j * n + k].abs()))
            .unwrap_or(k);
        if a[p * n + k] == 0.0 {
            return (piv, 0.0, false);
        }
        if p != k {
            for j in 0..n {
                a.swap(k * n + j, p * n + j);
            }
            piv.swap(k, p);
            sign = -sign;
        }
        for i in k + 1..n {
            let f = a[i * n + k] / a[k * n + k];
            a[i * n + k] = f;
            for j in k + 1..n {
                a[i * n + j] -= f * a[k * n + j];
            }
        }
    }
    (piv, sign, true)
}

/// The determinant of an `n × n` row-major matrix (overwritten by its LU factors).
fn det_of(m: &mut [f64], n: usize) -> f64 {
    let (_, sign, ok) = lu(m, n);
    if ok {
        sign * (0..n).map(|i| m[i * n + i]).product::<f64>()
    } else {
        0.0
    }
}

/// Matrix `b` of a batch of `n × n` matrices.
fn matrix(v: &[f64], b: usize, n: usize) -> KResult<&[f64]> {
    v.get(b * n * n..(b + 1) * n * n)
        .ok_or_else(|| KernelError::new(format!("matrix {b} is missing from the input")))
}

fn det_dims(cx: &KernelCtx) -> KResult<(usize, usize)> {
    let s = cx.in_shape(0)?;
    let r = s.len();
    if r < 2 || s[r - 1] != s[r - 2] {
        kbail!("Det needs square matrices, got {s:?}");
    }
    Ok((s[..r - 2].iter().product(), s[r - 1]))
}

fn det_fwd(cx: &KernelCtx, xs: &[Option<Tensor>], _: &Extras) -> Outs {
    let x = inp(xs, 0)?;
    let (batch, n) = det_dims(cx)?;
    let v = host_f64(x)?;
    let mut out = Vec::with_capacity(batch);
    for b in 0..batch {
        let mut m = matrix(&v, b, n)?.to_vec();
        out.push(det_of(&mut m, n));
    }
    Ok(vec![Some(
        Tensor::from_vec(out, cx.out_shape(0)?, cx.device)?.to_dtype(x.dtype())?,
    )])
}

/// d det / d A = det · A^-T.
fn det_bwd(cx: &KernelCtx, a: &BwdArgs) -> Outs {
    grad0(cx, a, || {
        let x = a.input(0)?;
        let (batch, n) = det_dims(cx)?;
        let v = host_f64(x)?;
        let d = host_f64(a.output(0)?)?;
        let g = host_f64(&a.grad(cx, 0)?)?;
        let mut out = vec![0.0; v.len()];
        if d.len() < batch || g.len() < batch {
            kbail!(
                "Det has {} outputs for {batch} matrices",
                d.len().min(g.len())
            );
        }
        for b in 0..batch {
            let mut m = matrix(&v, b, n)?.to_vec();
            let (piv, _, ok) = lu(&mut m, n);
            if !ok {
                // Singular: d det / d A is the cofactor matrix (no inverse to use).
                let a = matrix(&v, b, n)?;
                for i in 0..n {
                    for j in 0..n {
                        let mut minor: Vec<f64> = Vec::with_capacity((n - 1) * (n - 1));
                        for r in (0..n).filter(|&r| r != i) {
                            minor.extend((0..n).filter(|&c| c != j).map(|c| a[r * n + c]));
                        }
                        let sign = if (i + j) % 2 == 0 { 1.0 } else { -1.0 };
                        out[b * n * n + i * n + j] = g[b] * sign * det_of(&mut minor, n - 1);
                    }
                }
                continue;
            }
            let scale = g[b] * d[b];
            // Column j of A^-1 solves A x = e_j; with P A = L U.
            for j in 0..n {
                let mut col: Vec<f64> = piv.iter().map(|&p| f64::from(u8::from(p == j))).collect();
                for i in 0..n {
                    for k in 0..i {
                        col[i] -= m[i * n + k] * col[k];
                    }
                }
                for i in (0..n).rev() {
                    for k in i + 1..n {
                        col[i] -= m[i * n + k] * col[k];
                    }
                    col[i] /= m[i * n + i];
                }
                // (A^-T)[j][i] = (A^-1)[i][j] = col[i].
                for (i, &c) in col.iter().enumerate() {
                    out[b * n * n + j * n + i] = scale * c;
                }
            }
        }
        Ok(Tensor::from_vec(out, x.dims(), cx.device)?.to_dtype(x.dtype())?)
    })
}

// ---------------------------------------------------------------------------------------------
// Registry
// ---------------------------------------------------------------------------------------------

pub fn register(r: &mut KernelRegistry) {
    r.insert("Identity", Kernel::new(identity_fwd, Some(identity_bwd)));
    for op in ["Reshape", "Flatten", "Squeeze", "Unsqueeze"] {
        r.insert(op, Kernel::new(reshape_fwd, Some(reshape_bwd)));
    }
    r.insert("Transpose", Kernel::new(transpose_fwd, Some(transpose_bwd)));
    r.insert("Expand", Kernel::new(expand_fwd, Some(expand_bwd)));
    r.insert("Slice", Kernel::new(slice_fwd, Some(slice_bwd)));
    r.insert("Split", Kernel::new(split_fwd, Some(split_bwd)));
    r.insert("Concat", Kernel::new(concat_fwd, Some(concat_bwd)));
    r.insert("Gather", Kernel::new(gather_fwd, Some(gather_bwd)));
    r.insert(
        "GatherElements",
        Kernel::new(gather_elements_fwd, Some(gather_elements_bwd)),
    );
    r.insert("Cast", Kernel::new(cast_fwd, Some(cast_bwd)));
    r.insert("CastLike", Kernel::new(cast_fwd, Some(cast_bwd)));
    r.insert("Pad", Kernel::new(pad_fwd, Some(pad_bwd)));
    r.insert("Resize", Kernel::new(resize_fwd, Some(resize_bwd)));
    r.insert("Upsample", Kernel::new(resize_fwd, Some(resize_bwd)));
    r.insert("CumSum", Kernel::new(cumsum_fwd, Some(cumsum_bwd)));
    r.insert("Shape", Kernel::new(shape_fwd, None));
    r.insert("Size", Kernel::new(size_fwd, None));
    r.insert("Constant", Kernel::new(constant_fwd, None));
    r.insert("ConstantOfShape", Kernel::new(constant_of_shape_fwd, None));
    r.insert("Range", Kernel::new(range_fwd, None));
    r.insert("Tile", Kernel::new(tile_fwd, Some(tile_bwd)));
    r.insert("Trilu", Kernel::new(trilu_fwd, Some(trilu_bwd)));
    r.insert("DepthToSpace", Kernel::new(depth_fwd, Some(depth_bwd)));
    r.insert("SpaceToDepth", Kernel::new(depth_fwd, Some(depth_bwd)));
    r.insert("GatherND", Kernel::new(gather_nd_fwd, Some(gather_nd_bwd)));
    for op in ["ScatterND", "ScatterElements", "Scatter"] {
        r.insert(op, Kernel::new(scatter_fwd, Some(scatter_bwd)));
    }
    r.insert("TopK", Kernel::new(topk_fwd, Some(topk_bwd)));
    r.insert("OneHot", Kernel::new(onehot_fwd, None));
    r.insert("EyeLike", Kernel::new(eyelike_fwd, None));
    r.insert("NonZero", Kernel::new(nonzero_fwd, None));
    r.insert(
        "ReverseSequence",
        Kernel::new(reverse_fwd, Some(reverse_bwd)),
    );
    r.insert("LpNormalization", Kernel::new(lp_fwd, Some(lp_bwd)));
    r.insert(
        "MeanVarianceNormalization",
        Kernel::new(mvn_fwd, Some(mvn_bwd)),
    );
    register_more(r);
}

/// The ops of `crate::ops::array::register_more`.
fn register_more(r: &mut KernelRegistry) {
    for op in [
        "RandomNormal",
        "RandomUniform",
        "RandomNormalLike",
        "RandomUniformLike",
        "Bernoulli",
    ] {
        r.insert(op, Kernel::new(random_fwd, None));
    }
    r.insert(
        "QuantizeLinear",
        Kernel::new(quantize_fwd, Some(quantize_bwd)),
    );
    r.insert(
        "DequantizeLinear",
        Kernel::new(dequantize_fwd, Some(dequantize_bwd)),
    );
    r.insert("GridSample", Kernel::new(grid_fwd, Some(grid_bwd)));
    r.insert("Det", Kernel::new(det_fwd, Some(det_bwd)));
}

#[cfg(test)]
mod tests {
    use crate::exec::testing::{check, float, int, ints, string, Case, In};
    use crate::tensor::DType;

    fn c64(v: &[i64]) -> In {
        In::Const(
            DType::I64,
            vec![v.len()],
            v.iter().map(|&x| x as f64).collect(),
        )
    }
    /// A one-element tensor attribute of ONNX type `dtype` (7 = int64, 11 = double).
    fn tensor_attr(name: &str, dtype: i32, v: &[i64]) -> onnx_protobuf::AttributeProto {
        let mut t = onnx_protobuf::TensorProto::new();
        t.data_type = dtype;
        t.dims = vec![v.len() as i64];
        if dtype == 11 {
            t.double_data = v.iter().map(|&x| x as f64).collect();
        } else {
            t.int64_data = v.to_vec();
        }
        let mut a = onnx_protobuf::AttributeProto::new();
        a.name = name.into();
        a.type_ = onnx_protobuf::attribute_proto::AttributeType::TENSOR.into();
        a.t = Some(t).into();
        a
    }
    fn scalar(v: i64) -> In {
        In::Const(DType::I64, vec![], vec![v as f64])
    }

    #[test]
    fn views() {
        check(&Case::new("Identity", 17, vec![In::Rand(vec![2, 3])]));
        let x = || In::Rand(vec![2, 3, 4]);
        check(&Case::new("Reshape", 17, vec![x(), c64(&[0, -1, 2])]));
        check(&Case::new("Reshape", 17, vec![x(), c64(&[4, 6])]).attr(int("allowzero", 1)));
        check(
            &Case::new("Reshape", 17, vec![In::Rand(vec![0, 3]), c64(&[3, 0])])
                .attr(int("allowzero", 1)),
        );
        for axis in [0, 2, -1] {
            check(&Case::new("Flatten", 13, vec![x()]).attr(int("axis", axis)));
        }
        let y = || In::Rand(vec![2, 1, 3, 1]);
        check(&Case::new("Squeeze", 13, vec![y(), c64(&[1, -1])]));
        check(&Case::new("Squeeze", 13, vec![y()]));
        check(&Case::new("Squeeze", 11, vec![y()]).attr(ints("axes", &[3])));
        check(&Case::new("Unsqueeze", 13, vec![x(), c64(&[0, -1])]));
        check(&Case::new("Unsqueeze", 11, vec![x()]).attr(ints("axes", &[1])));
        check(&Case::new("Transpose", 13, vec![x()]).attr(ints("perm", &[2, 0, 1])));
        check(&Case::new("Transpose", 13, vec![x()]));
        check(&Case::new(
            "Expand",
            13,
            vec![In::Rand(vec![3, 1]), c64(&[2, 3, 4])],
        ));
        check(&Case::new(
            "Expand",
            13,
            vec![In::Rand(vec![1]), c64(&[2, 2])],
        ));
        check(&Case::new(
            "Expand",
            13,
            vec![In::Rand(vec![2, 1, 4]), c64(&[1, 3, 1])],
        ));
    }

    #[test]
    fn slice() {
        let x = || In::Rand(vec![4, 5, 6]);
        // Negative start, end past the end, default axes and steps.
        check(&Case::new(
            "Slice",
            13,
            vec![x(), c64(&[-3, 1]), c64(&[i64::MAX, 4])],
        ));
        // Axes, steps > 1, negative axis.
        check(&Case::new(
            "Slice",
            13,
            vec![x(), c64(&[1, 0]), c64(&[5, 6]), c64(&[-1, 1]), c64(&[2, 3])],
        ));
        // Negative steps: reversal and a strided reversal with clamped bounds.
        check(&Case::new(
            "Slice",
            13,
            vec![
                x(),
                c64(&[-1, 10]),
                c64(&[i64::MIN, 0]),
                c64(&[0, 2]),
                c64(&[-1, -2]),
            ],
        ));
        // Empty result.
        check(&Case::new(
            "Slice",
            13,
            vec![x(), c64(&[3]), c64(&[1]), c64(&[0])],
        ));
        // Opset < 10: attributes.
        check(
            &Case::new("Slice", 9, vec![x()])
                .attr(ints("starts", &[1, -2]))
                .attr(ints("ends", &[3, 100]))
                .attr(ints("axes", &[0, 2])),
        );
    }

    #[test]
    fn split_concat() {
        let x = || In::Rand(vec![2, 5, 3]);
        check(
            &Case::new("Split", 13, vec![x(), c64(&[1, 4])])
                .attr(int("axis", 1))
                .outputs(2),
        );
        check(
            &Case::new("Split", 11, vec![x()])
                .attr(ints("split", &[2, 3]))
                .attr(int("axis", -2))
                .outputs(2),
        );
        check(
            &Case::new("Split", 18, vec![x()])
                .attr(int("axis", 1))
                .attr(int("num_outputs", 3))
                .outputs(3),
        );
        check(&Case::new("Split", 13, vec![x()]).outputs(2));
        check(
            &Case::new(
                "Concat",
                13,
                vec![
                    In::Rand(vec![2, 1, 3]),
                    In::Rand(vec![2, 4, 3]),
                    In::Param(vec![2, 2, 3]),
                ],
            )
            .attr(int("axis", 1)),
        );
        check(
            &Case::new(
                "Concat",
                13,
                vec![In::Rand(vec![2, 3]), In::Rand(vec![2, 2])],
            )
            .attr(int("axis", -1)),
        );
        check(
            &Case::new(
                "Concat",
                13,
                vec![
                    In::Ints(DType::I64, vec![2], vec![1, 2]),
                    In::Ints(DType::I64, vec![1], vec![3]),
                ],
            )
            .attr(int("axis", 0)),
        );
    }

    #[test]
    fn gather() {
        let x = || In::Rand(vec![4, 3, 2]);
        check(&Case::new(
            "Gather",
            13,
            vec![x(), In::Ints(DType::I64, vec![2, 2], vec![0, -1, 2, 0])],
        ));
        check(
            &Case::new(
                "Gather",
                13,
                vec![x(), In::Ints(DType::I32, vec![], vec![-1])],
            )
            .attr(int("axis", 1)),
        );
        check(&Case::new("Gather", 13, vec![x(), c64(&[1, 1, 0])]).attr(int("axis", -1)));
        check(&Case::new(
            "Gather",
            13,
            vec![
                In::Ints(DType::I64, vec![3], vec![7, 8, 9]),
                In::Ints(DType::I64, vec![2], vec![2, 0]),
            ],
        ));
        check(
            &Case::new(
                "GatherElements",
                13,
                vec![
                    In::Rand(vec![2, 3]),
                    In::Ints(DType::I64, vec![2, 2], vec![0, 2, -1, 1]),
                ],
            )
            .attr(int("axis", 1)),
        );
        check(&Case::new(
            "GatherElements",
            13,
            vec![
                In::Rand(vec![3, 2]),
                In::Ints(DType::I64, vec![2, 2], vec![2, 0, 0, 0]),
            ],
        ));
    }

    #[test]
    fn cast() {
        let x = || In::Rand(vec![2, 3]);
        check(&Case::new("Cast", 13, vec![x()]).attr(int("to", 11)));
        check(&Case::new("Cast", 13, vec![x()]).attr(int("to", 9)));
        check(&Case::new("Cast", 13, vec![x()]).attr(int("to", 7)));
        check(
            &Case::new(
                "Cast",
                13,
                vec![In::Ints(DType::I64, vec![3], vec![0, 2, -1])],
            )
            .attr(int("to", 9)),
        );
        check(
            &Case::new("Cast", 13, vec![In::Ints(DType::Bool, vec![2], vec![0, 1])])
                .attr(int("to", 11)),
        );
        check(&Case::new(
            "CastLike",
            15,
            vec![x(), In::Ints(DType::I32, vec![1], vec![0])],
        ));
        check(&Case::new(
            "CastLike",
            15,
            vec![x(), In::Floats(vec![1], vec![0.0])],
        ));
    }

    #[test]
    fn pad() {
        let x = || In::Rand(vec![2, 3, 4]);
        let value = || In::Const(DType::F32, vec![], vec![0.5]);
        check(&Case::new(
            "Pad",
            13,
            vec![x(), c64(&[0, 1, 2, 1, 0, 3]), value()],
        ));
        check(&Case::new("Pad", 13, vec![x(), c64(&[0, -1, 2, 1, 1, -3])]));
        for mode in ["reflect", "edge"] {
            check(
                &Case::new("Pad", 13, vec![x(), c64(&[1, 2, 3, 0, 2, 3])])
                    .attr(string("mode", mode)),
            );
        }
        check(
            &Case::new("Pad", 19, vec![x(), c64(&[0, 2, 5, 0, 1, 1])]).attr(string("mode", "wrap")),
        );
        check(
            &Case::new("Pad", 2, vec![x()])
                .attr(ints("pads", &[1, 0, 0, 0, 2, 1]))
                .attr(float("value", -1.0)),
        );
        check(
            &Case::new(
                "Pad",
                18,
                vec![x(), c64(&[1, 2, 0, 1]), In::None, c64(&[-1, 1])],
            )
            .attr(string("mode", "reflect")),
        );
        check(&Case::new(
            "Pad",
            13,
            vec![In::Ints(DType::I64, vec![2], vec![4, 5]), c64(&[1, 1])],
        ));
    }

    fn f32s(v: &[f64]) -> In {
        In::Const(DType::F32, vec![v.len()], v.to_vec())
    }

    #[test]
    fn resize() {
        let x = || In::Rand(vec![1, 2, 3, 4]);
        // Nearest, as the exporters write it.
        check(
            &Case::new(
                "Resize",
                13,
                vec![x(), In::None, f32s(&[1.0, 1.0, 2.0, 2.0])],
            )
            .attr(string("coordinate_transformation_mode", "asymmetric"))
            .attr(string("nearest_mode", "floor")),
        );
        check(&Case::new(
            "Resize",
            13,
            vec![x(), In::None, f32s(&[1.0, 1.0, 1.5, 0.5])],
        ));
        // Integer nearest upsampling: power-of-two fast path (one or both axes), and others.
        check(&Case::new(
            "Resize",
            13,
            vec![x(), In::None, f32s(&[1.0, 1.0, 1.0, 4.0])],
        ));
        check(&Case::new(
            "Resize",
            13,
            vec![x(), In::None, f32s(&[1.0, 1.0, 3.0, 1.0])],
        ));
        check(&Case::new(
            "Resize",
            13,
            vec![In::Rand(vec![2, 3, 2]), In::None, f32s(&[1.0, 2.0, 2.0])],
        ));
        check(
            &Case::new(
                "Resize",
                13,
                vec![x(), In::None, In::None, c64(&[1, 2, 5, 7])],
            )
            .attr(string(
                "coordinate_transformation_mode",
                "pytorch_half_pixel",
            ))
            .attr(string("nearest_mode", "round_prefer_ceil")),
        );
        // Linear with the transformations of bilinear / align_corners.
        for ctm in [
            "half_pixel",
            "align_corners",
            "pytorch_half_pixel",
            "asymmetric",
        ] {
            check(
                &Case::new(
                    "Resize",
                    13,
                    vec![x(), f32s(&[]), f32s(&[1.0, 1.0, 2.0, 1.5])],
                )
                .attr(string("mode", "linear"))
                .attr(string("coordinate_transformation_mode", ctm)),
            );
        }
        check(
            &Case::new(
                "Resize",
                13,
                vec![x(), In::None, In::None, c64(&[1, 2, 2, 3])],
            )
            .attr(string("mode", "linear"))
            .attr(string("coordinate_transformation_mode", "align_corners")),
        );
        check(
            &Case::new("Resize", 18, vec![x(), In::None, f32s(&[3.0, 0.5])])
                .attr(string("mode", "linear"))
                .attr(ints("axes", &[2, 3])),
        );
        check(&Case::new(
            "Resize",
            10,
            vec![x(), f32s(&[1.0, 1.0, 2.0, 3.0])],
        ));
        check(&Case::new(
            "Upsample",
            9,
            vec![x(), f32s(&[1.0, 1.0, 2.0, 2.0])],
        ));
        check(
            &Case::new("Upsample", 7, vec![x()])
                .attr(crate::exec::testing::floats(
                    "scales",
                    &[1.0, 1.0, 2.0, 2.0],
                ))
                .attr(string("mode", "linear")),
        );
    }

    #[test]
    fn cumsum() {
        let x = || In::Rand(vec![3, 4]);
        for (ex, rev) in [(0, 0), (1, 0), (0, 1), (1, 1)] {
            check(
                &Case::new("CumSum", 14, vec![x(), scalar(1)])
                    .attr(int("exclusive", ex))
                    .attr(int("reverse", rev)),
            );
        }
        check(&Case::new("CumSum", 14, vec![x(), scalar(-2)]).attr(int("reverse", 1)));
        check(
            &Case::new(
                "CumSum",
                14,
                vec![
                    In::Ints(DType::I64, vec![2, 3], vec![1, 2, 3, 4, 5, 6]),
                    scalar(1),
                ],
            )
            .attr(int("exclusive", 1)),
        );
    }

    #[test]
    fn sources() {
        check(&Case::new("Shape", 15, vec![In::Rand(vec![2, 3, 4])]).attr(int("start", 1)));
        check(&Case::new("Size", 13, vec![In::Rand(vec![2, 3, 4])]));
        check(&Case::new("Constant", 13, vec![]).attr(ints("value_ints", &[3, 4])));
        // Above the folding limit: decoded from the attribute (raw little-endian f64).
        let n = 5000;
        let mut t = onnx_protobuf::TensorProto::new();
        t.data_type = 11;
        t.dims = vec![n as i64];
        t.raw_data = (0..n).flat_map(|i| (i as f64).to_le_bytes()).collect();
        let mut a = onnx_protobuf::AttributeProto::new();
        a.name = "value".into();
        a.type_ = onnx_protobuf::attribute_proto::AttributeType::TENSOR.into();
        a.t = Some(t).into();
        check(&Case::new("Constant", 13, vec![]).attr(a.clone()));
        let y = run("Constant", 13, vec![a], vec![]);
        assert_eq!(y.len(), n);
        assert_eq!(y[4321], 4321.0);
        check(
            &Case::new("ConstantOfShape", 13, vec![c64(&[2, 3])]).attr(tensor_attr(
                "value",
                7,
                &[5],
            )),
        );
        check(
            &Case::new("ConstantOfShape", 13, vec![c64(&[3])]).attr(tensor_attr("value", 11, &[2])),
        );
        check(&Case::new(
            "Range",
            13,
            vec![scalar(2), scalar(11), scalar(3)],
        ));
        check(&Case::new(
            "Range",
            13,
            vec![
                In::Const(DType::F32, vec![], vec![1.0]),
                In::Const(DType::F32, vec![], vec![-2.0]),
                In::Const(DType::F32, vec![], vec![-0.75]),
            ],
        ));
    }
    #[test]
    fn tile_trilu_depth() {
        check(&Case::new(
            "Tile",
            13,
            vec![In::Rand(vec![2, 3]), c64(&[2, 3])],
        ));
        check(&Case::new(
            "Tile",
            13,
            vec![In::Rand(vec![2, 1, 3]), c64(&[1, 4, 1])],
        ));
        let x = || In::Rand(vec![2, 3, 4]);
        check(&Case::new("Trilu", 14, vec![x()]));
        check(&Case::new("Trilu", 14, vec![x(), scalar(-1)]).attr(int("upper", 0)));
        check(&Case::new("Trilu", 14, vec![x(), scalar(2)]));
        let y = || In::Rand(vec![1, 8, 2, 3]);
        check(&Case::new("DepthToSpace", 13, vec![y()]).attr(int("blocksize", 2)));
        check(
            &Case::new("DepthToSpace", 13, vec![y()])
                .attr(int("blocksize", 2))
                .attr(string("mode", "CRD")),
        );
        check(
            &Case::new("SpaceToDepth", 13, vec![In::Rand(vec![2, 2, 4, 6])])
                .attr(int("blocksize", 2)),
        );
    }

    #[test]
    fn scatter_gather_nd() {
        let x = || In::Rand(vec![3, 4, 2]);
        check(&Case::new(
            "GatherND",
            13,
            vec![x(), In::Ints(DType::I64, vec![2, 2], vec![0, 1, -1, 3])],
        ));
        check(&Case::new(
            "GatherND",
            13,
            vec![x(), In::Ints(DType::I64, vec![2, 1, 1], vec![2, 0])],
        ));
        check(
            &Case::new(
                "GatherND",
                13,
                vec![x(), In::Ints(DType::I64, vec![3, 1], vec![1, 3, 0])],
            )
            .attr(int("batch_dims", 1)),
        );
        check(&Case::new(
            "ScatterND",
            13,
            vec![
                x(),
                In::Ints(DType::I64, vec![2, 1], vec![2, 0]),
                In::Rand(vec![2, 4, 2]),
            ],
        ));
        check(
            &Case::new(
                "ScatterND",
                16,
                vec![
                    x(),
                    In::Ints(DType::I64, vec![3, 2], vec![0, 1, 0, 1, 2, -1]),
                    In::Rand(vec![3, 2]),
                ],
            )
            .attr(string("reduction", "add")),
        );
        let d = || In::Rand(vec![3, 3]);
        check(&Case::new(
            "ScatterElements",
            13,
            vec![
                d(),
                In::Ints(DType::I64, vec![2, 3], vec![1, 0, 2, 0, 2, 1]),
                In::Rand(vec![2, 3]),
            ],
        ));
        check(
            &Case::new(
                "ScatterElements",
                16,
                vec![
                    d(),
                    In::Ints(DType::I64, vec![1, 2], vec![1, -1]),
                    In::Rand(vec![1, 2]),
                ],
            )
            .attr(int("axis", 1))
            .attr(string("reduction", "add")),
        );
        for red in ["mul", "max", "min"] {
            check(
                &Case::new(
                    "ScatterElements",
                    18,
                    vec![
                        d(),
                        In::Ints(DType::I64, vec![2, 2], vec![1, 1, 0, 2]),
                        In::Rand(vec![2, 2]),
                    ],
                )
                .attr(int("axis", 1))
                .attr(string("reduction", red)),
            );
            check(
                &Case::new(
                    "ScatterND",
                    18,
                    vec![
                        x(),
                        In::Ints(DType::I64, vec![3, 1], vec![2, 0, 2]),
                        In::Rand(vec![3, 4, 2]),
                    ],
                )
                .attr(string("reduction", red)),
            );
        }
        check(
            &Case::new(
                "Scatter",
                9,
                vec![
                    d(),
                    In::Ints(DType::I64, vec![1, 2], vec![2, 0]),
                    In::Param(vec![1, 2]),
                ],
            )
            .attr(int("axis", 1)),
        );
    }

    #[test]
    fn topk_onehot_misc() {
        let x = || In::Rand(vec![3, 5]);
        check(&Case::new("TopK", 11, vec![x(), c64(&[2])]).outputs(2));
        check(
            &Case::new("TopK", 11, vec![In::Rand(vec![4, 3]), c64(&[3])])
                .attr(int("axis", 0))
                .attr(int("largest", 0))
                .outputs(2),
        );
        check(&Case::new("TopK", 1, vec![x()]).attr(int("k", 1)).outputs(2));
        let vals = In::Const(DType::F32, vec![2], vec![-1.0, 3.0]);
        check(&Case::new(
            "OneHot",
            11,
            vec![
                In::Ints(DType::I64, vec![2, 2], vec![0, -1, 2, 7]),
                scalar(4),
                vals.clone(),
            ],
        ));
        check(
            &Case::new(
                "OneHot",
                11,
                vec![
                    In::Ints(DType::I32, vec![3], vec![1, 0, 2]),
                    scalar(3),
                    c64(&[0, 1]),
                ],
            )
            .attr(int("axis", 0)),
        );
        check(&Case::new("EyeLike", 9, vec![In::Rand(vec![3, 4])]).attr(int("k", 1)));
        check(&Case::new("EyeLike", 9, vec![In::Rand(vec![3, 2])]).attr(int("dtype", 7)));
        check(&Case::new(
            "NonZero",
            13,
            vec![In::Const(
                DType::I64,
                vec![2, 3],
                vec![0.0, 1.0, 0.0, 2.0, 0.0, 3.0],
            )],
        ));
        let lens = || In::Ints(DType::I64, vec![3], vec![2, 4, 1]);
        check(&Case::new(
            "ReverseSequence",
            10,
            vec![In::Rand(vec![4, 3, 2]), lens()],
        ));
        check(
            &Case::new("ReverseSequence", 10, vec![In::Rand(vec![3, 4]), lens()])
                .attr(int("batch_axis", 0))
                .attr(int("time_axis", 1)),
        );
    }

    #[test]
    fn normalizations() {
        check(&Case::new("LpNormalization", 1, vec![In::Rand(vec![3, 4])]));
        check(
            &Case::new("LpNormalization", 1, vec![In::Rand(vec![3, 4])])
                .attr(int("axis", 0))
                .attr(int("p", 1)),
        );
        check(
            &Case::new(
                "MeanVarianceNormalization",
                13,
                vec![In::Rand(vec![2, 3, 2, 2])],
            )
            .tol(1e-5),
        );
        check(
            &Case::new("MeanVarianceNormalization", 13, vec![In::Rand(vec![2, 5])])
                .attr(ints("axes", &[1]))
                .tol(1e-5),
        );
    }
    #[test]
    fn random() {
        for op in ["RandomNormal", "RandomUniform"] {
            check(
                &Case::new(op, 1, vec![])
                    .attr(ints("shape", &[2, 3]))
                    .attr(int("dtype", 11)),
            );
        }
        for op in ["RandomNormalLike", "RandomUniformLike"] {
            check(&Case::new(op, 1, vec![In::Rand(vec![4])]).attr(float("high", 3.0)));
        }
        check(&Case::new(
            "Bernoulli",
            15,
            vec![In::RandIn(vec![3, 3], 0.0, 1.0)],
        ));
        check(
            &Case::new("Bernoulli", 15, vec![In::RandIn(vec![3], 0.0, 1.0)]).attr(int("dtype", 9)),
        );
    }

    #[test]
    fn quantization() {
        let scale = || In::Const(DType::F32, vec![], vec![0.05]);
        check(&Case::new(
            "QuantizeLinear",
            13,
            vec![
                In::Rand(vec![2, 3]),
                scale(),
                In::Ints(DType::U8, vec![], vec![128]),
            ],
        ));
        check(&Case::new(
            "QuantizeLinear",
            13,
            vec![
                In::Rand(vec![2, 3]),
                scale(),
                In::Ints(DType::I8, vec![], vec![-3]),
            ],
        ));
        check(
            &Case::new(
                "QuantizeLinear",
                13,
                vec![
                    In::Rand(vec![2, 3]),
                    In::Const(DType::F32, vec![3], vec![0.1, 0.01, 1.0]),
                ],
            )
            .attr(int("axis", 1)),
        );
        check(&Case::new(
            "DequantizeLinear",
            13,
            vec![
                In::Ints(DType::U8, vec![2, 2], vec![0, 10, 200, 255]),
                In::Const(DType::F64, vec![], vec![0.5]),
                In::Ints(DType::U8, vec![], vec![100]),
            ],
        ));
        check(
            &Case::new(
                "DequantizeLinear",
                13,
                vec![
                    In::Ints(DType::I8, vec![2, 2], vec![-128, -1, 0, 127]),
                    In::Const(DType::F64, vec![2], vec![0.5, 2.0]),
                    In::Ints(DType::I8, vec![2], vec![-2, 3]),
                ],
            )
            .attr(int("axis", 0)),
        );
    }

    #[test]
    fn grid_sample() {
        let x = || In::Rand(vec![2, 2, 3, 4]);
        let g = || In::RandIn(vec![2, 3, 2, 2], -1.2, 1.2);
        for pad in ["zeros", "border", "reflection"] {
            for align in [0, 1] {
                check(
                    &Case::new("GridSample", 16, vec![x(), g()])
                        .attr(string("padding_mode", pad))
                        .attr(int("align_corners", align)),
                );
            }
        }
        check(&Case::new("GridSample", 16, vec![x(), g()]).attr(string("mode", "nearest")));
        for pad in ["zeros", "border", "reflection"] {
            check(
                &Case::new("GridSample", 16, vec![x(), g()])
                    .attr(string("mode", "bicubic"))
                    .attr(string("padding_mode", pad)),
            );
        }
        check(&Case::new("GridSample", 20, vec![x(), g()]).attr(string("mode", "linear")));
    }

    #[test]
    fn det() {
        check(&Case::new("Det", 11, vec![In::Rand(vec![3, 3])]));
        check(&Case::new("Det", 11, vec![In::Rand(vec![2, 4, 4])]).tol(1e-5));
        // A singular matrix (rank 2): the gradient is the cofactor matrix.
        let sing = [1.0, 2.0, 3.0, 2.0, 4.0, 6.5, 0.5, 1.0, 1.5];
        check(&Case::new(
            "Det",
            11,
            vec![In::Floats(vec![3, 3], sing.to_vec())],
        ));
    }
    /// Runs an op's forward on fixed inputs (no gradient check) and returns its outputs'
    /// values, to compare with ONNX's reference outputs.
    fn run_with(
        op: &'static str,
        opset: i64,
        attrs: Vec<onnx_protobuf::AttributeProto>,
        inputs: Vec<In>,
        n_out: usize,
        seed: u64,
    ) -> Vec<Vec<f64>> {
        fwd_bwd(op, opset, &attrs, inputs, n_out, seed, DType::F64, false).0
    }

    /// Forward and (when `backward`) the backward with all-ones output gradients, with float
    /// inputs and outputs in `ft`: the values of the outputs and of the input gradients.
    #[allow(clippy::too_many_arguments)]
    fn fwd_bwd(
        op: &'static str,
        opset: i64,
        attrs: &[onnx_protobuf::AttributeProto],
        inputs: Vec<In>,
        n_out: usize,
        seed: u64,
        ft: DType,
        backward: bool,
    ) -> (Vec<Vec<f64>>, Vec<Option<Vec<f64>>>) {
        use crate::exec::kernel::{to_candle, BwdArgs, Extras};
        use crate::exec::testing::Harness;
        use crate::tensor::{Data, Fact, Tensor as PTensor};
        use candle_core::{Device, Tensor};
        let dev = Device::Cpu;
        let cft = to_candle(ft).unwrap();
        let u64s = |s: &[usize]| s.iter().map(|&d| d as u64).collect::<Vec<u64>>();
        let mut facts = vec![];
        let mut vals = vec![];
        let mut float_in = vec![];
        for i in inputs {
            float_in.push(matches!(i, In::Floats(..)));
            match i {
                In::Floats(s, v) => {
                    facts.push(Some(Fact::new(ft, u64s(&s))));
                    vals.push(Some(
                        Tensor::from_vec(v, s, &dev).unwrap().to_dtype(cft).unwrap(),
                    ));
                }
                In::Const(d, s, v) => {
                    let d = if d.is_float() { ft } else { d };
                    let t = PTensor::new(d, u64s(&s), Data::F(v));
                    vals.push(Some(crate::exec::value::from_planner(&t, &dev).unwrap()));
                    facts.push(Some(Fact::with_value(t)));
                }
                In::Ints(d, s, v) => {
                    facts.push(Some(Fact::new(d, u64s(&s))));
                    let t = Tensor::from_vec(v, s, &dev).unwrap();
                    vals.push(Some(t.to_dtype(to_candle(d).unwrap()).unwrap()));
                }
                In::None => {
                    facts.push(None);
                    vals.push(None);
                }
                other => panic!("value tests take fixed inputs, not {other:?}"),
            }
        }
        let h = Harness::new(op, opset, attrs, &facts, n_out).unwrap();
        let (spec, kernel, scx) = (h.spec().unwrap(), h.kernel().unwrap(), h.shape_cx());
        let outs = &h.outs;
        let cx = h.cx(&dev, seed);
        let y = (kernel.forward)(&cx, &vals, &Extras::new()).unwrap();
        let host = |t: &Tensor| {
            t.to_dtype(candle_core::DType::F64)
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1::<f64>()
                .unwrap()
        };
        for (t, f) in y.iter().zip(outs) {
            assert_eq!(
                t.as_ref().unwrap().dtype(),
                to_candle(f.dtype).unwrap(),
                "{op} output dtype"
            );
        }
        let values = y.iter().map(|t| host(t.as_ref().unwrap())).collect();
        if !backward {
            return (values, vec![]);
        }
        let needs: Vec<bool> = (0..facts.len())
            .map(|i| float_in[i] && (spec.diff_in)(&scx, i))
            .collect();
        let grads: Vec<Option<Tensor>> = outs
            .iter()
            .enumerate()
            .map(|(k, f)| {
                (f.dtype.is_float() && (spec.diff_out)(&scx, k)).then(|| {
                    let shape: Vec<usize> = f.shape.iter().map(|&d| d as usize).collect();
                    Tensor::ones(shape, cft, &dev).unwrap()
                })
            })
            .collect();
        let g = (kernel.backward.unwrap())(
            &cx,
            &BwdArgs {
                inputs: &vals,
                outputs: &y,
                extras: &Extras::new(),
                grads: &grads,
                needs: &needs,
            },
        )
        .unwrap();
        for (t, v) in g.iter().zip(&vals) {
            if let (Some(t), Some(v)) = (t, v) {
                assert_eq!(t.dtype(), v.dtype(), "{op} gradient dtype");
                assert_eq!(t.dims(), v.dims(), "{op} gradient shape");
            }
        }
        (values, g.iter().map(|t| t.as_ref().map(host)).collect())
    }

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
            let has_bwd = crate::exec::kernels::registry()[op].backward.is_some();
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

    fn run(
        op: &'static str,
        opset: i64,
        attrs: Vec<onnx_protobuf::AttributeProto>,
        inputs: Vec<In>,
    ) -> Vec<f64> {
        run_with(op, opset, attrs, inputs, 1, 7).remove(0)
    }

    fn fl(shape: &[usize], v: &[f64]) -> In {
        In::Floats(shape.to_vec(), v.to_vec())
    }

    fn iota(shape: &[usize]) -> In {
        let n: usize = shape.iter().product();
        fl(shape, &(0..n).map(|i| i as f64).collect::<Vec<_>>())
    }

    fn close(got: &[f64], want: &[f64]) {
        assert_eq!(got.len(), want.len(), "{got:?} vs {want:?}");
        for (g, w) in got.iter().zip(want) {
            assert!((g - w).abs() < 1e-3, "{got:?} vs {want:?}");
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
    fn values_resize() {
        let x = || fl(&[1, 1, 2, 2], &[1.0, 2.0, 3.0, 4.0]);
        let s2 = || f32s(&[1.0, 1.0, 2.0, 2.0]);
        // ONNX backend test resize_upsample_scales_linear.
        close(
            &run(
                "Resize",
                13,
                vec![string("mode", "linear")],
                vec![x(), In::None, s2()],
            ),
            &[
                1.0, 1.25, 1.75, 2.0, 1.5, 1.75, 2.25, 2.5, 2.5, 2.75, 3.25, 3.5, 3.0, 3.25, 3.75,
                4.0,
            ],
        );
        // resize_upsample_scales_linear_align_corners.
        let t = 1.0 / 3.0;
        close(
            &run(
                "Resize",
                13,
                vec![
                    string("mode", "linear"),
                    string("coordinate_transformation_mode", "align_corners"),
                ],
                vec![x(), In::None, s2()],
            ),
            &[
                1.0,
                1.0 + t,
                1.0 + 2.0 * t,
                2.0,
                1.0 + 2.0 * t,
                2.0,
                2.0 + t,
                2.0 + 2.0 * t,
                2.0 + t,
                2.0 + 2.0 * t,
                3.0,
                3.0 + t,
                3.0,
                3.0 + t,
                3.0 + 2.0 * t,
                4.0,
            ],
        );
        // resize_downsample_scales_nearest.
        close(
            &run(
                "Resize",
                13,
                vec![],
                vec![iota(&[1, 1, 2, 4]), In::None, f32s(&[1.0, 1.0, 0.6, 0.6])],
            ),
            &[0.0, 2.0],
        );
        // resize_upsample_sizes_nearest (half_pixel, round_prefer_floor).
        let y = run(
            "Resize",
            13,
            vec![],
            vec![x(), In::None, In::None, c64(&[1, 1, 7, 8])],
        );
        let row = |a: f64, b: f64| [a, a, a, a, b, b, b, b];
        let mut want = vec![];
        for r in 0..7 {
            want.extend(if r < 4 { row(1.0, 2.0) } else { row(3.0, 4.0) });
        }
        close(&y, &want);
        close(
            &run("Resize", 13, vec![], vec![x(), In::None, s2()]),
            &[
                1.0, 1.0, 2.0, 2.0, 1.0, 1.0, 2.0, 2.0, 3.0, 3.0, 4.0, 4.0, 3.0, 3.0, 4.0, 4.0,
            ],
        );
        close(
            &run(
                "Resize",
                13,
                vec![],
                vec![x(), In::None, f32s(&[1.0, 1.0, 1.0, 3.0])],
            ),
            &[1.0, 1.0, 1.0, 2.0, 2.0, 2.0, 3.0, 3.0, 3.0, 4.0, 4.0, 4.0],
        );
        // Exporters' nearest: asymmetric + floor, and the legacy Upsample.
        let z = run(
            "Resize",
            13,
            vec![
                string("coordinate_transformation_mode", "asymmetric"),
                string("nearest_mode", "floor"),
            ],
            vec![fl(&[1, 3], &[1.0, 2.0, 3.0]), In::None, f32s(&[1.0, 2.0])],
        );
        close(&z, &[1.0, 1.0, 2.0, 2.0, 3.0, 3.0]);
        close(
            &run(
                "Upsample",
                9,
                vec![],
                vec![fl(&[1, 2], &[1.0, 2.0]), f32s(&[1.0, 3.0])],
            ),
            &[1.0, 1.0, 1.0, 2.0, 2.0, 2.0],
        );
        // pytorch_half_pixel bilinear downsampling by 2 averages neighbours.
        close(
            &run(
                "Resize",
                13,
                vec![
                    string("mode", "linear"),
                    string("coordinate_transformation_mode", "pytorch_half_pixel"),
                ],
                vec![
                    fl(&[1, 4], &[1.0, 2.0, 3.0, 5.0]),
                    In::None,
                    f32s(&[1.0, 0.5]),
                ],
            ),
            &[1.5, 4.0],
        );
    }

    #[test]
    fn values_rearrange() {
        let v = || fl(&[3], &[1.0, 2.0, 3.0]);
        let ax = || scalar(0);
        close(
            &run("CumSum", 14, vec![], vec![v(), ax()]),
            &[1.0, 3.0, 6.0],
        );
        close(
            &run("CumSum", 14, vec![int("exclusive", 1)], vec![v(), ax()]),
            &[0.0, 1.0, 3.0],
        );
        close(
            &run("CumSum", 14, vec![int("reverse", 1)], vec![v(), ax()]),
            &[6.0, 5.0, 3.0],
        );
        close(
            &run(
                "CumSum",
                14,
                vec![int("exclusive", 1), int("reverse", 1)],
                vec![v(), ax()],
            ),
            &[5.0, 3.0, 0.0],
        );
        close(
            &run(
                "CumSum",
                14,
                vec![int("reverse", 1)],
                vec![In::Ints(DType::I32, vec![3], vec![1, 2, 3]), ax()],
            ),
            &[6.0, 5.0, 3.0],
        );
        // DepthToSpace, from the ONNX operator documentation.
        let dcr = run(
            "DepthToSpace",
            13,
            vec![int("blocksize", 2)],
            vec![iota(&[1, 8, 2, 3])],
        );
        close(
            &dcr[..12],
            &[
                0.0, 12.0, 1.0, 13.0, 2.0, 14.0, 24.0, 36.0, 25.0, 37.0, 26.0, 38.0,
            ],
        );
        let crd = run(
            "DepthToSpace",
            13,
            vec![int("blocksize", 2), string("mode", "CRD")],
            vec![iota(&[1, 8, 2, 3])],
        );
        close(
            &crd[..12],
            &[
                0.0, 6.0, 1.0, 7.0, 2.0, 8.0, 12.0, 18.0, 13.0, 19.0, 14.0, 20.0,
            ],
        );
        // SpaceToDepth inverts DepthToSpace (DCR).
        let back = run(
            "SpaceToDepth",
            13,
            vec![int("blocksize", 2)],
            vec![fl(&[1, 2, 4, 6], &dcr)],
        );
        close(&back, &(0..48).map(|i| i as f64).collect::<Vec<_>>());
        // ReverseSequence, from the ONNX documentation.
        close(
            &run(
                "ReverseSequence",
                10,
                vec![],
                vec![
                    iota(&[4, 4]),
                    In::Ints(DType::I64, vec![4], vec![4, 3, 2, 1]),
                ],
            ),
            &[
                12.0, 9.0, 6.0, 3.0, 8.0, 5.0, 2.0, 7.0, 4.0, 1.0, 10.0, 11.0, 0.0, 13.0, 14.0,
                15.0,
            ],
        );
        close(
            &run("Trilu", 14, vec![], vec![iota(&[3, 3]), scalar(1)]),
            &[0.0, 1.0, 2.0, 0.0, 0.0, 5.0, 0.0, 0.0, 0.0],
        );
        close(
            &run("Trilu", 14, vec![int("upper", 0)], vec![iota(&[2, 3])]),
            &[0.0, 0.0, 0.0, 3.0, 4.0, 0.0],
        );
    }

    #[test]
    fn values_index_ops() {
        let y = run_with(
            "TopK",
            11,
            vec![],
            vec![fl(&[4], &[3.0, 1.0, 3.0, 2.0]), c64(&[2])],
            2,
            7,
        );
        close(&y[0], &[3.0, 3.0]);
        close(&y[1], &[0.0, 2.0]);
        let y = run_with(
            "TopK",
            11,
            vec![int("largest", 0)],
            vec![fl(&[4], &[3.0, 1.0, 3.0, 2.0]), c64(&[3])],
            2,
            7,
        );
        close(&y[1], &[1.0, 3.0, 0.0]);
        close(
            &run(
                "OneHot",
                11,
                vec![],
                vec![
                    In::Ints(DType::I64, vec![3], vec![0, -1, 7]),
                    scalar(3),
                    c64(&[0, 1]),
                ],
            ),
            &[1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0],
        );
        // GatherND with batch_dims = 1 (ONNX example 5).
        close(
            &run(
                "GatherND",
                13,
                vec![int("batch_dims", 1)],
                vec![
                    iota(&[2, 2, 2]),
                    In::Ints(DType::I64, vec![2, 1], vec![1, 0]),
                ],
            ),
            &[2.0, 3.0, 4.0, 5.0],
        );
        // ScatterND (ONNX example 1).
        close(
            &run(
                "ScatterND",
                13,
                vec![],
                vec![
                    fl(&[8], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]),
                    In::Ints(DType::I64, vec![4, 1], vec![4, 3, 1, 7]),
                    fl(&[4], &[9.0, 10.0, 11.0, 12.0]),
                ],
            ),
            &[1.0, 11.0, 3.0, 10.0, 9.0, 6.0, 7.0, 12.0],
        );
        // ScatterElements (ONNX example 2), and its add reduction.
        let args = || {
            vec![
                fl(&[1, 5], &[1.0, 2.0, 3.0, 4.0, 5.0]),
                In::Ints(DType::I64, vec![1, 2], vec![1, 3]),
                fl(&[1, 2], &[1.1, 2.1]),
            ]
        };
        close(
            &run("ScatterElements", 13, vec![int("axis", 1)], args()),
            &[1.0, 1.1, 3.0, 2.1, 5.0],
        );
        close(
            &run(
                "ScatterElements",
                16,
                vec![int("axis", 1), string("reduction", "add")],
                args(),
            ),
            &[1.0, 3.1, 3.0, 6.1, 5.0],
        );
        // ScatterND reductions (ONNX examples: mul, and max / min on repeated indices).
        let nd = |red: &str, upd: &[f64]| {
            run(
                "ScatterND",
                18,
                vec![string("reduction", red)],
                vec![
                    fl(&[4], &[1.0, 2.0, 3.0, 4.0]),
                    In::Ints(DType::I64, vec![3, 1], vec![1, 1, 3]),
                    fl(&[3], upd),
                ],
            )
        };
        close(&nd("mul", &[3.0, 0.5, 2.0]), &[1.0, 3.0, 3.0, 8.0]);
        close(&nd("max", &[5.0, 1.0, 0.0]), &[1.0, 5.0, 3.0, 4.0]);
        close(&nd("min", &[5.0, 1.0, 0.0]), &[1.0, 1.0, 3.0, 0.0]);
        close(
            &run(
                "NonZero",
                13,
                vec![],
                vec![In::Const(DType::I64, vec![2, 2], vec![1.0, 0.0, 1.0, 1.0])],
            ),
            &[0.0, 1.0, 1.0, 0.0, 0.0, 1.0],
        );
        close(
            &run("EyeLike", 9, vec![int("k", -1)], vec![iota(&[3, 2])]),
            &[0.0, 0.0, 1.0, 0.0, 0.0, 1.0],
        );
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

    #[test]
    fn values_random() {
        let draw = |seed| {
            run_with(
                "RandomNormal",
                1,
                vec![
                    ints("shape", &[4000]),
                    float("mean", 2.0),
                    float("scale", 3.0),
                ],
                vec![],
                1,
                seed,
            )
            .remove(0)
        };
        let (a, b, c) = (draw(5), draw(5), draw(6));
        assert_eq!(a, b, "the same seed replays the same draws");
        assert_ne!(a, c);
        let mean = a.iter().sum::<f64>() / a.len() as f64;
        let sd = (a.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / a.len() as f64).sqrt();
        assert!(
            (mean - 2.0).abs() < 0.2 && (sd - 3.0).abs() < 0.2,
            "{mean} {sd}"
        );
        let u = run_with(
            "RandomUniform",
            1,
            vec![
                ints("shape", &[1000]),
                float("low", -1.0),
                float("high", 1.0),
            ],
            vec![],
            1,
            1,
        )
        .remove(0);
        assert!(u.iter().all(|v| (-1.0..1.0).contains(v)));
        let p = fl(&[4], &[0.0, 1.0, 0.0, 1.0]);
        close(
            &run("Bernoulli", 15, vec![], vec![p]),
            &[0.0, 1.0, 0.0, 1.0],
        );
    }
    #[test]
    fn every_array_op_has_kernels() {
        let mut ops = crate::ops::Registry::new();
        crate::ops::array::register(&mut ops);
        crate::ops::array::register_more(&mut ops);
        let kernels = crate::exec::kernels::registry();
        let mut missing: Vec<&str> = ops
            .keys()
            .filter(|op| !kernels.contains_key(*op))
            .copied()
            .collect();
        missing.sort();
        assert!(missing.is_empty(), "no kernels for {missing:?}");
    }
    /// Expected values computed with ONNX's reference evaluator (`onnx.reference`, onnx 1.23).
    #[test]
    fn values_onnx_reference() {
        let plus1: Vec<f64> = (1..=16).map(f64::from).collect();
        let y = run(
            "Resize",
            13,
            vec![string("mode", "cubic")],
            vec![
                fl(&[1, 1, 4, 4], &plus1),
                In::None,
                f32s(&[1.0, 1.0, 2.0, 2.0]),
            ],
        );
        close(
            &y[..8],
            &[
                0.47265625, 0.76953125, 1.24609375, 1.875, 2.28125, 2.91015625, 3.38671875,
                3.68359375,
            ],
        );
        let y = run(
            "Resize",
            13,
            vec![string("mode", "cubic"), int("exclude_outside", 1)],
            vec![
                fl(&[1, 1, 4, 4], &plus1),
                In::None,
                f32s(&[1.0, 1.0, 0.8, 0.8]),
            ],
        );
        close(&y[..3], &[1.4396355, 2.7560053, 4.0864201]);
        let y = run(
            "Resize",
            13,
            vec![string("nearest_mode", "round_prefer_ceil")],
            vec![iota(&[1, 5]), In::None, f32s(&[1.0, 1.7])],
        );
        close(&y, &[0.0, 0.0, 1.0, 2.0, 2.0, 3.0, 3.0, 4.0]);
        let v = || fl(&[1, 5], &[1.0, 2.0, 3.0, 5.0, 8.0]);
        let ctm = |m: &str| string("coordinate_transformation_mode", m);
        let y = run(
            "Resize",
            19,
            vec![string("mode", "linear"), ctm("half_pixel_symmetric")],
            vec![v(), In::None, f32s(&[1.0, 0.6])],
        );
        close(&y, &[1.3333334, 3.0, 7.0]);
        let y = run(
            "Resize",
            19,
            vec![string("mode", "linear"), ctm("half_pixel_symmetric")],
            vec![v(), In::None, In::None, c64(&[1, 7])],
        );
        close(
            &y,
            &[1.0, 1.5714285, 2.2857144, 3.0, 4.4285712, 6.2857141, 8.0],
        );
        let y = run(
            "Resize",
            19,
            vec![ctm("asymmetric"), string("nearest_mode", "ceil")],
            vec![v(), In::None, f32s(&[1.0, 1.6])],
        );
        close(&y, &[1.0, 2.0, 3.0, 3.0, 5.0, 8.0, 8.0, 8.0]);
        let y = run(
            "Resize",
            19,
            vec![string("mode", "cubic"), ctm("align_corners")],
            vec![v(), In::None, f32s(&[1.0, 1.6])],
        );
        close(
            &y,
            &[
                1.0, 1.475219, 2.1734695, 2.561224, 3.505835, 4.5349855, 6.4693847, 8.0,
            ],
        );
        let grid = [
            -1.3, -0.2, 0.35, 0.9, 1.2, 1.4, -0.6, -1.05, 0.1, 0.05, 0.95, -0.7,
        ];
        // Bicubic with border / reflection padding follows PyTorch (padding applied to each
        // tap, not to the sampling point as the ONNX reference does); zeros padding agrees.
        let cases: [(&str, &str, i64, [f64; 6]); 6] = [
            (
                "cubic",
                "zeros",
                0,
                [-0.148412, 7.482447, -0.055206, -0.24956, 6.129236, 1.784727],
            ),
            (
                "linear",
                "zeros",
                0,
                [0.0, 6.630001, 0.0, 0.1275, 6.0, 1.71],
            ),
            (
                "linear",
                "border",
                1,
                [3.2, 9.624999, 11.0, 0.6, 5.85, 4.125],
            ),
            (
                "linear",
                "reflection",
                0,
                [2.9, 10.2, 10.599999, 0.3, 6.0, 3.0],
            ),
            (
                "linear",
                "reflection",
                1,
                [3.65, 9.624999, 9.099999, 0.8, 5.85, 4.125],
            ),
            ("nearest", "zeros", 0, [0.0, 10.0, 0.0, 0.0, 6.0, 3.0]),
        ];
        for (mode, pad, align, want) in cases {
            let y = run(
                "GridSample",
                20,
                vec![
                    string("mode", mode),
                    string("padding_mode", pad),
                    int("align_corners", align),
                ],
                vec![iota(&[1, 1, 3, 4]), fl(&[1, 2, 3, 2], &grid)],
            );
            close(&y, &want);
        }
    }
    /// A table of cases whose expected outputs come from ONNX's reference evaluator
    /// (`onnx.reference`, onnx 1.23; inputs and attributes as listed).
    #[test]
    fn values_onnx_reference_table() {
        #[allow(clippy::type_complexity)]
        let cases: Vec<(
            &'static str,
            i64,
            Vec<onnx_protobuf::AttributeProto>,
            Vec<In>,
            usize,
            usize,
            Vec<f64>,
        )> = vec![
            (
                "Pad",
                13,
                vec![string("mode", "reflect")],
                vec![
                    fl(&[2, 3], &[-1.0, -0.5, 0.0, 0.5, 1.0, 1.5]),
                    In::Const(DType::I64, vec![4], vec![1.0, 2.0, 1.0, 0.0]),
                ],
                1,
                0,
                vec![
                    1.5, 1.0, 0.5, 1.0, 1.5, 0.0, -0.5, -1.0, -0.5, 0.0, 1.5, 1.0, 0.5, 1.0, 1.5,
                    0.0, -0.5, -1.0, -0.5, 0.0,
                ],
            ),
            (
                "Pad",
                13,
                vec![string("mode", "edge")],
                vec![
                    fl(&[2, 3], &[-1.0, -0.5, 0.0, 0.5, 1.0, 1.5]),
                    In::Const(DType::I64, vec![4], vec![0.0, 2.0, 1.0, 3.0]),
                ],
                1,
                0,
                vec![
                    -1.0, -1.0, -1.0, -0.5, 0.0, 0.0, 0.0, 0.0, 0.5, 0.5, 0.5, 1.0, 1.5, 1.5, 1.5,
                    1.5, 0.5, 0.5, 0.5, 1.0, 1.5, 1.5, 1.5, 1.5,
                ],
            ),
            (
                "SpaceToDepth",
                13,
                vec![int("blocksize", 2)],
                vec![fl(
                    &[1, 2, 4, 4],
                    &[
                        -1.0, -0.5, 0.0, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5, 5.0, 5.5,
                        6.0, 6.5, 7.0, 7.5, 8.0, 8.5, 9.0, 9.5, 10.0, 10.5, 11.0, 11.5, 12.0, 12.5,
                        13.0, 13.5, 14.0, 14.5,
                    ],
                )],
                1,
                0,
                vec![
                    -1.0, 0.0, 3.0, 4.0, 7.0, 8.0, 11.0, 12.0, -0.5, 0.5, 3.5, 4.5, 7.5, 8.5, 11.5,
                    12.5, 1.0, 2.0, 5.0, 6.0, 9.0, 10.0, 13.0, 14.0, 1.5, 2.5, 5.5, 6.5, 9.5, 10.5,
                    13.5, 14.5,
                ],
            ),
            (
                "OneHot",
                11,
                vec![int("axis", 0)],
                vec![
                    In::Ints(DType::I64, vec![3], vec![2, 0, -1]),
                    In::Const(DType::I64, vec![], vec![3.0]),
                    In::Const(DType::F32, vec![2], vec![-2.0, 5.0]),
                ],
                1,
                0,
                vec![-2.0, 5.0, -2.0, -2.0, -2.0, -2.0, 5.0, -2.0, 5.0],
            ),
            (
                "Trilu",
                14,
                vec![int("upper", 1)],
                vec![
                    fl(
                        &[3, 4],
                        &[-1.0, -0.5, 0.0, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5],
                    ),
                    In::Const(DType::I64, vec![], vec![-1.0]),
                ],
                1,
                0,
                vec![-1.0, -0.5, 0.0, 0.5, 1.0, 1.5, 2.0, 2.5, 0.0, 3.5, 4.0, 4.5],
            ),
            (
                "TopK",
                11,
                vec![int("axis", 0), int("largest", 0)],
                vec![
                    fl(
                        &[3, 4],
                        &[3.0, 1.0, 4.0, 1.0, 5.0, 9.0, 2.0, 6.0, 5.0, 3.0, 5.0, 8.0],
                    ),
                    In::Const(DType::I64, vec![1], vec![2.0]),
                ],
                2,
                0,
                vec![3.0, 1.0, 2.0, 1.0, 5.0, 3.0, 4.0, 6.0],
            ),
            (
                "TopK",
                11,
                vec![int("axis", 0), int("largest", 0)],
                vec![
                    fl(
                        &[3, 4],
                        &[3.0, 1.0, 4.0, 1.0, 5.0, 9.0, 2.0, 6.0, 5.0, 3.0, 5.0, 8.0],
                    ),
                    In::Const(DType::I64, vec![1], vec![2.0]),
                ],
                2,
                1,
                vec![0.0, 0.0, 1.0, 0.0, 1.0, 2.0, 0.0, 1.0],
            ),
            (
                "GatherND",
                13,
                vec![int("batch_dims", 1)],
                vec![
                    fl(
                        &[2, 3, 2],
                        &[-1.0, -0.5, 0.0, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5],
                    ),
                    In::Ints(DType::I64, vec![2, 1, 2], vec![0, 1, 2, 0]),
                ],
                1,
                0,
                vec![-0.5, 4.0],
            ),
            (
                "ScatterElements",
                13,
                vec![int("axis", 0)],
                vec![
                    fl(&[3, 2], &[-1.0, -0.5, 0.0, 0.5, 1.0, 1.5]),
                    In::Ints(DType::I64, vec![2, 2], vec![-1, 0, 0, 2]),
                    fl(&[2, 2], &[10.0, 20.0, 30.0, 40.0]),
                ],
                1,
                0,
                vec![30.0, 20.0, 0.0, 0.5, 10.0, 40.0],
            ),
            (
                "CumSum",
                14,
                vec![int("exclusive", 1), int("reverse", 1)],
                vec![
                    fl(&[3, 2], &[-1.0, -0.5, 0.0, 0.5, 1.0, 1.5]),
                    In::Const(DType::I64, vec![], vec![0.0]),
                ],
                1,
                0,
                vec![1.0, 2.0, 1.0, 1.5, 0.0, 0.0],
            ),
            (
                "QuantizeLinear",
                19,
                vec![int("axis", 0)],
                vec![
                    fl(&[2, 3], &[-1.0, -0.5, 0.0, 0.5, 1.0, 1.5]),
                    In::Const(DType::F32, vec![2], vec![0.5, 0.25]),
                    In::Ints(DType::U8, vec![2], vec![1, 2]),
                ],
                1,
                0,
                vec![0.0, 0.0, 1.0, 4.0, 6.0, 8.0],
            ),
            (
                "DequantizeLinear",
                19,
                vec![int("axis", 1)],
                vec![
                    In::Ints(DType::I8, vec![2, 2], vec![-3, 7, 120, -128]),
                    In::Const(DType::F32, vec![2], vec![0.5, 2.0]),
                    In::Ints(DType::I8, vec![2], vec![1, -2]),
                ],
                1,
                0,
                vec![-2.0, 18.0, 59.5, -252.0],
            ),
            (
                "ReverseSequence",
                10,
                vec![int("batch_axis", 0), int("time_axis", 1)],
                vec![
                    fl(
                        &[3, 4],
                        &[-1.0, -0.5, 0.0, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5],
                    ),
                    In::Ints(DType::I64, vec![3], vec![1, 4, 2]),
                ],
                1,
                0,
                vec![-1.0, -0.5, 0.0, 0.5, 2.5, 2.0, 1.5, 1.0, 3.5, 3.0, 4.0, 4.5],
            ),
            (
                "LpNormalization",
                1,
                vec![int("axis", 0), int("p", 2)],
                vec![fl(&[2, 3], &[-1.0, -0.5, 0.0, 0.5, 1.0, 1.5])],
                1,
                0,
                vec![
                    -0.8944271802902222,
                    -0.4472135901451111,
                    0.0,
                    0.4472135901451111,
                    0.8944271802902222,
                    1.0,
                ],
            ),
            (
                "MeanVarianceNormalization",
                13,
                vec![],
                vec![fl(&[2, 1, 2, 2], &[1.0, 4.0, 2.0, 8.0, 3.0, 3.0, 0.0, 9.0])],
                1,
                0,
                vec![
                    -0.9198662042617798,
                    0.08362419903278351,
                    -0.5853694081306458,
                    1.4216114282608032,
                    -0.2508726119995117,
                    -0.2508726119995117,
                    -1.2543630599975586,
                    1.756108283996582,
                ],
            ),
            (
                "EyeLike",
                9,
                vec![int("k", -1)],
                vec![fl(
                    &[3, 4],
                    &[-1.0, -0.5, 0.0, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5],
                )],
                1,
                0,
                vec![0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0],
            ),
            (
                "Tile",
                13,
                vec![],
                vec![
                    fl(&[2, 2], &[-1.0, -0.5, 0.0, 0.5]),
                    In::Const(DType::I64, vec![2], vec![1.0, 3.0]),
                ],
                1,
                0,
                vec![
                    -1.0, -0.5, -1.0, -0.5, -1.0, -0.5, 0.0, 0.5, 0.0, 0.5, 0.0, 0.5,
                ],
            ),
            (
                "Slice",
                13,
                vec![],
                vec![
                    fl(
                        &[4, 5],
                        &[
                            -1.0, -0.5, 0.0, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5, 5.0, 5.5,
                            6.0, 6.5, 7.0, 7.5, 8.0, 8.5,
                        ],
                    ),
                    In::Const(DType::I64, vec![2], vec![-1.0, 4.0]),
                    In::Const(DType::I64, vec![2], vec![-5.0, -100.0]),
                    In::Const(DType::I64, vec![2], vec![0.0, 1.0]),
                    In::Const(DType::I64, vec![2], vec![-2.0, -3.0]),
                ],
                1,
                0,
                vec![8.5, 7.0, 3.5, 2.0],
            ),
            (
                "Expand",
                13,
                vec![],
                vec![
                    fl(&[3, 1], &[-1.0, -0.5, 0.0]),
                    In::Const(DType::I64, vec![3], vec![2.0, 1.0, 4.0]),
                ],
                1,
                0,
                vec![
                    -1.0, -1.0, -1.0, -1.0, -0.5, -0.5, -0.5, -0.5, 0.0, 0.0, 0.0, 0.0, -1.0, -1.0,
                    -1.0, -1.0, -0.5, -0.5, -0.5, -0.5, 0.0, 0.0, 0.0, 0.0,
                ],
            ),
            (
                "Gather",
                13,
                vec![int("axis", 1)],
                vec![
                    fl(
                        &[3, 2, 2],
                        &[-1.0, -0.5, 0.0, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5],
                    ),
                    In::Ints(DType::I64, vec![2, 1], vec![1, -1]),
                ],
                1,
                0,
                vec![0.0, 0.5, 0.0, 0.5, 2.0, 2.5, 2.0, 2.5, 4.0, 4.5, 4.0, 4.5],
            ),
            (
                "Resize",
                13,
                vec![
                    string("mode", "linear"),
                    string("coordinate_transformation_mode", "pytorch_half_pixel"),
                ],
                vec![
                    fl(
                        &[1, 1, 3, 3],
                        &[-1.0, -0.5, 0.0, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0],
                    ),
                    In::None,
                    In::Const(
                        DType::F32,
                        vec![4],
                        vec![1.0, 1.0, 0.699999988079071, 1.7000000476837158],
                    ),
                ],
                1,
                0,
                vec![
                    -0.6785714030265808,
                    -0.48739495873451233,
                    -0.19327731430530548,
                    0.10084032267332077,
                    0.3214285969734192,
                    1.4642857313156128,
                    1.6554622650146484,
                    1.9495798349380493,
                    2.24369740486145,
                    2.4642858505249023,
                ],
            ),
            (
                "Resize",
                13,
                vec![
                    string("mode", "nearest"),
                    string("coordinate_transformation_mode", "half_pixel"),
                    string("nearest_mode", "round_prefer_floor"),
                ],
                vec![
                    fl(
                        &[1, 1, 2, 5],
                        &[-1.0, -0.5, 0.0, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5],
                    ),
                    In::None,
                    In::Const(DType::F32, vec![4], vec![1.0, 1.0, 2.5, 0.6000000238418579]),
                ],
                1,
                0,
                vec![
                    -1.0, 0.0, 1.0, -1.0, 0.0, 1.0, -1.0, 0.0, 1.0, 1.5, 2.5, 3.5, 1.5, 2.5, 3.5,
                ],
            ),
            (
                "Resize",
                13,
                vec![
                    string("mode", "cubic"),
                    float("cubic_coeff_a", -0.5),
                    int("exclude_outside", 1),
                ],
                vec![
                    fl(
                        &[1, 1, 4, 4],
                        &[
                            -1.0, -0.5, 0.0, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5, 5.0, 5.5,
                            6.0, 6.5,
                        ],
                    ),
                    In::None,
                    In::Const(DType::F32, vec![4], vec![1.0, 1.0, 0.75, 0.5]),
                ],
                1,
                0,
                vec![
                    -0.5884290337562561,
                    0.49980628490448,
                    2.2058823108673096,
                    3.2941176891326904,
                    5.0001935958862305,
                    6.088428974151611,
                ],
            ),
            (
                "DepthToSpace",
                13,
                vec![int("blocksize", 2), string("mode", "CRD")],
                vec![fl(
                    &[1, 8, 1, 2],
                    &[
                        -1.0, -0.5, 0.0, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5, 5.0, 5.5,
                        6.0, 6.5,
                    ],
                )],
                1,
                0,
                vec![
                    -1.0, 0.0, -0.5, 0.5, 1.0, 2.0, 1.5, 2.5, 3.0, 4.0, 3.5, 4.5, 5.0, 6.0, 5.5,
                    6.5,
                ],
            ),
            (
                "Range",
                13,
                vec![],
                vec![
                    In::Const(DType::I64, vec![], vec![10.0]),
                    In::Const(DType::I64, vec![], vec![1.0]),
                    In::Const(DType::I64, vec![], vec![-3.0]),
                ],
                1,
                0,
                vec![10.0, 7.0, 4.0],
            ),
        ];
        for (op, opset, attrs, inputs, n_out, k, want) in cases {
            let y = run_with(op, opset, attrs, inputs, n_out, 7);
            let got = &y[k];
            assert_eq!(got.len(), want.len(), "{op}: {got:?} vs {want:?}");
            for (g, w) in got.iter().zip(&want) {
                assert!((g - w).abs() < 1e-4, "{op}: {got:?} vs {want:?}");
            }
        }
        // L1 normalization divides by the sum of absolute values (the reference evaluator
        // omits the absolute value; the ONNX spec, ONNX Runtime and PyTorch take it).
        close(
            &run(
                "LpNormalization",
                1,
                vec![int("p", 1)],
                vec![fl(&[2, 2], &[3.0, -1.0, 1.0, 0.0])],
            ),
            &[0.75, -0.25, 1.0, 0.0],
        );
    }
}
