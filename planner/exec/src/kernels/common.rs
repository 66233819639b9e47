//! Helpers the kernel families share: the sum of a broadcast gradient, reductions over merged
//! dims, dtype and attribute conversions, index lists, host copies of small tensors.

use crate::kernel::kbail;
use crate::kernel::{to_candle, BwdArgs, KResult, KernelCtx, KernelError, Outs};
use candle_core::{DType, Device, Tensor};
use remat_planner::tensor::DType as PDType;

// ---------------------------------------------------------------------------------------------
// Small helpers

/// The dtype statistics are computed in: f64 for f64 data, f32 otherwise.
pub(super) fn compute_dtype(d: DType) -> DType {
    if d == DType::F64 {
        DType::F64
    } else {
        DType::F32
    }
}

/// Sums a gradient of a broadcast result back to the shape of the operand that was broadcast
/// (ONNX multidirectional broadcasting: leading axes and axes of size 1). Runs of adjacent
/// reduced dims are merged first ([`fsum_keepdim`]); half-precision sums accumulate in f32.
pub(super) fn sum_to(g: &Tensor, shape: &[usize]) -> KResult<Tensor> {
    let dims = g.dims();
    if dims == shape {
        return Ok(g.clone());
    }
    if shape.len() > dims.len() {
        kbail!("gradient of shape {dims:?} cannot be summed to shape {shape:?}");
    }
    let lead = dims.len() - shape.len();
    let mut axes: Vec<usize> = (0..lead).collect();
    for (i, &d) in shape.iter().enumerate() {
        let gd = dims[lead + i];
        if d == 1 && gd != 1 {
            axes.push(lead + i);
        } else if d != gd {
            kbail!("gradient of shape {dims:?} cannot be summed to shape {shape:?}");
        }
    }
    let s = if axes.is_empty() {
        g.clone()
    } else if matches!(g.dtype(), DType::F16 | DType::BF16) {
        fsum_keepdim(&g.to_dtype(DType::F32)?, &axes)?.to_dtype(g.dtype())?
    } else {
        fsum_keepdim(g, &axes)?
    };
    Ok(s.reshape(shape)?)
}

/// Sum over `dims` keeping them as unit dims. Runs of adjacent reduced (and kept) dims are
/// merged first, so that candle reduces contiguous rows (a strided reduction over several
/// dims is two orders of magnitude slower on the CPU).
pub(super) fn fsum_keepdim(t: &Tensor, dims: &[usize]) -> KResult<Tensor> {
    let shape = t.dims().to_vec();
    let mut merged: Vec<(usize, bool)> = vec![];
    for (i, &d) in shape.iter().enumerate() {
        let r = dims.contains(&i);
        match merged.last_mut() {
            Some((s, rr)) if *rr == r => *s *= d,
            _ => merged.push((d, r)),
        }
    }
    let sizes: Vec<usize> = merged.iter().map(|m| m.0).collect();
    let mut v = t.contiguous()?.reshape(sizes)?;
    for (j, m) in merged.iter().enumerate().rev() {
        if m.1 {
            v = v.sum_keepdim(j)?;
        }
    }
    let keep: Vec<usize> = shape
        .iter()
        .enumerate()
        .map(|(i, &d)| if dims.contains(&i) { 1 } else { d })
        .collect();
    Ok(v.reshape(keep)?)
}

/// Sum over `dims`, dropping them.
pub(super) fn fsum(t: &Tensor, dims: &[usize]) -> KResult<Tensor> {
    let kept: Vec<usize> = t
        .dims()
        .iter()
        .enumerate()
        .filter(|(i, _)| !dims.contains(i))
        .map(|(_, &d)| d)
        .collect();
    Ok(fsum_keepdim(t, dims)?.reshape(kept)?)
}

/// Shape `[1, c, 1, ...]` of rank `rank` (a per-channel vector broadcast over NCHW data).
pub(super) fn chan_shape(c: usize, rank: usize) -> Vec<usize> {
    let mut s = vec![1; rank.max(1)];
    s[usize::from(rank > 1)] = c;
    s
}

/// Output dtype of a float output whose rule type is `k`'s fact (f64 when the data is f64).
pub(super) fn float_out(cx: &KernelCtx, k: usize, data: DType) -> KResult<DType> {
    if data == DType::F64 {
        return Ok(DType::F64);
    }
    match cx.outputs.get(k).and_then(|f| f.as_ref()) {
        Some(f) => to_candle(f.dtype),
        None => Ok(data),
    }
}

pub(super) fn want(cx: &KernelCtx, k: usize) -> bool {
    cx.outputs.get(k).map(|f| f.is_some()).unwrap_or(false)
}

/// `v` as sizes; `what` names the attribute or input in the error (`attribute "strides"`,
/// `input 1 "size"`).
pub(super) fn usizes(cx: &KernelCtx, what: &str, v: &[i64]) -> KResult<Vec<usize>> {
    v.iter()
        .map(|&x| {
            usize::try_from(x).map_err(|_| {
                KernelError::new(format!(
                    "{what} value {x} must be non-negative (node {})",
                    cx.node
                ))
            })
        })
        .collect()
}

pub(super) fn ints_attr(
    cx: &KernelCtx,
    name: &str,
    n: usize,
    default: usize,
) -> KResult<Vec<usize>> {
    match cx.attrs.ints(name)? {
        Some(v) => {
            let v = usizes(cx, &format!("attribute {name:?}"), v)?;
            if v.len() != n {
                kbail!(
                    "attribute {name:?} has {} values for {n} spatial dims",
                    v.len()
                );
            }
            Ok(v)
        }
        None => Ok(vec![default; n]),
    }
}

/// Whether kernels on `dev` take their host paths (hand-written loops over contiguous
/// memory: im2col, the batch-norm passes, the max-pool argmax).
pub(super) fn host_unfold(dev: &Device) -> bool {
    dev.is_cpu()
}

/// All elements of `t` as `i64`, row-major.
pub(super) fn host_i64(t: &Tensor) -> KResult<Vec<i64>> {
    Ok(t.to_dtype(DType::I64)?.flatten_all()?.to_vec1::<i64>()?)
}

/// An int8 tensor (held in u8 as its bit pattern) as its signed values, in i64.
pub(super) fn i8_signed(t: &Tensor) -> KResult<Tensor> {
    let v: Vec<i64> = host_i64(t)?
        .iter()
        .map(|&x| i64::from(x as u8 as i8))
        .collect();
    Ok(Tensor::from_vec(v, t.dims(), t.device())?)
}

/// Signed int8 values (in i64) back to their u8 bit patterns, wrapping as int8 does.
pub(super) fn i8_pattern(t: &Tensor) -> KResult<Tensor> {
    let v: Vec<i64> = host_i64(t)?
        .iter()
        .map(|&x| i64::from(x as i8 as u8))
        .collect();
    ints_to(v, t.dims(), DType::U8, t)
}

/// All elements of `t` as `f64`, row-major.
pub(super) fn host_f64(t: &Tensor) -> KResult<Vec<f64>> {
    Ok(t.to_dtype(DType::F64)?.flatten_all()?.to_vec1::<f64>()?)
}

/// Integer values of input `i`: the constant known at import, else the run-time tensor.
pub(super) fn ints_in(
    cx: &KernelCtx,
    xs: &[Option<Tensor>],
    i: usize,
) -> KResult<Option<Vec<i64>>> {
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
pub(super) fn ids(v: Vec<i64>, dev: &Device) -> KResult<Tensor> {
    let n = v.len();
    Ok(Tensor::from_vec(v, n, dev)?)
}

/// Normalizes possibly negative indices against an axis of size `d`, rejecting those out of range.
pub(super) fn norm_indices(v: &mut [i64], d: usize, what: &str) -> KResult<()> {
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
pub(super) fn out_dtype(cx: &KernelCtx, k: usize) -> KResult<DType> {
    let f = cx
        .outputs
        .get(k)
        .and_then(|f| f.as_ref())
        .ok_or_else(|| KernelError::new(format!("output {k} is not in the graph")))?;
    to_candle(f.dtype)
}

/// The candle dtype of input `i`.
pub(super) fn in_dtype(cx: &KernelCtx, i: usize) -> KResult<DType> {
    to_candle(cx.input(i)?.dtype)
}

/// `t` filled with `v` (any element type).
pub(super) fn full(v: f64, shape: &[usize], dt: DType, dev: &Device) -> KResult<Tensor> {
    Ok(Tensor::full(v, shape, dev)?.to_dtype(dt)?)
}

/// Row-major strides.
pub(super) fn strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1usize; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * shape[i + 1];
    }
    s
}

/// A backward result with a gradient for input 0 only (when it needs one).
pub(super) fn grad0(cx: &KernelCtx, a: &BwdArgs, f: impl FnOnce() -> KResult<Tensor>) -> Outs {
    let mut v = vec![None; cx.inputs.len()];
    if a.need(0) {
        if let Some(slot) = v.first_mut() {
            *slot = Some(f()?);
        }
    }
    Ok(v)
}

/// Moves elements of `x` along `axis` to the positions `idx` lists (`index_select`).
pub(super) fn select(x: &Tensor, idx: &[i64], axis: usize) -> KResult<Tensor> {
    Ok(x.contiguous()?
        .index_select(&ids(idx.to_vec(), x.device())?, axis)?)
}

/// The transpose of [`select`]: a tensor of `d` entries along `axis` receiving `g`'s slices.
pub(super) fn unselect(g: &Tensor, idx: &[i64], axis: usize, d: usize) -> KResult<Tensor> {
    let mut shape = g.dims().to_vec();
    if let Some(s) = shape.get_mut(axis) {
        *s = d;
    }
    let z = Tensor::zeros(shape, g.dtype(), g.device())?;
    Ok(z.index_add(&ids(idx.to_vec(), g.device())?, &g.contiguous()?, axis)?)
}

/// Errors unless `x` holds floating-point values.
pub(super) fn need_float(cx: &KernelCtx, x: &Tensor) -> KResult<()> {
    if !x.dtype().is_float() {
        kbail!(
            "{} is not supported on element type {:?} (floating point only)",
            cx.op,
            x.dtype()
        );
    }
    Ok(())
}

/// `k · x` for a float tensor.
pub(super) fn scale(x: &Tensor, k: f64) -> KResult<Tensor> {
    Ok(x.affine(k, 0.0)?)
}

/// `x + k` for a float tensor.
pub(super) fn shift(x: &Tensor, k: f64) -> KResult<Tensor> {
    Ok(x.affine(1.0, k)?)
}

/// A 0/1 mask (a comparison result) in the element type `dt`.
pub(super) fn mask(m: &Tensor, dt: DType) -> KResult<Tensor> {
    Ok(m.to_dtype(dt)?)
}

/// A scalar (rank 0) tensor of `v` in `x`'s element type and device.
pub(super) fn scalar_like(x: &Tensor, v: f64) -> KResult<Tensor> {
    Ok(Tensor::new(v, x.device())?.to_dtype(x.dtype())?)
}

/// `1 / (1 + e^-x)`.
pub(super) fn sigmoid(x: &Tensor) -> KResult<Tensor> {
    Ok(shift(&x.neg()?.exp()?, 1.0)?.recip()?)
}

/// `ln(1 + e^x)`, computed as `max(x, 0) + ln(1 + e^-|x|)` so that it never overflows.
pub(super) fn softplus(x: &Tensor) -> KResult<Tensor> {
    let t = shift(&x.abs()?.neg()?.exp()?, 1.0)?.log()?;
    Ok((x.relu()? + t)?)
}

/// Where `c` (a 0/1 mask) holds, `a`, else `b`; all three broadcast to `shape`.
pub(super) fn where_select(c: &Tensor, a: &Tensor, b: &Tensor, shape: &[usize]) -> KResult<Tensor> {
    Ok(c.broadcast_as(shape)?
        .where_cond(&a.broadcast_as(shape)?, &b.broadcast_as(shape)?)?)
}

/// Integer values back into a tensor of `dtype` and `shape` on `like`'s device.
pub(super) fn ints_to(
    v: Vec<i64>,
    shape: &[usize],
    dtype: DType,
    like: &Tensor,
) -> KResult<Tensor> {
    Ok(Tensor::from_vec(v, shape, like.device())?.to_dtype(dtype)?)
}

/// A float attribute with its default.
pub(super) fn fattr(cx: &KernelCtx, name: &str, default: f32) -> KResult<f64> {
    Ok(f64::from(cx.attrs.float_or(name, default)?))
}

/// The value of a constant scalar input (a one-element tensor known at import), if any.
pub(super) fn const_scalar(cx: &KernelCtx, i: usize) -> Option<f64> {
    let f = cx.inputs.get(i)?.as_ref()?;
    let v = f.value.as_ref()?.as_f64();
    match v.as_slice() {
        [x] => Some(*x),
        _ => None,
    }
}

/// The number of bits of an ONNX integer type (the candle type may be wider).
pub(super) fn int_bits(d: PDType) -> KResult<u32> {
    Ok(match d {
        PDType::Bool | PDType::U8 | PDType::I8 => 8,
        PDType::U16 | PDType::I16 => 16,
        PDType::U32 | PDType::I32 => 32,
        PDType::U64 | PDType::I64 => 64,
        other => kbail!("element type {other:?} is not an integer type"),
    })
}

pub(super) fn width_mask(bits: u32) -> u64 {
    if bits >= 64 {
        u64::MAX
    } else {
        (1u64 << bits) - 1
    }
}

/// One gradient slot per input, none filled yet.
pub(super) fn grads_out(cx: &KernelCtx) -> Vec<Option<Tensor>> {
    vec![None; cx.inputs.len()]
}

/// Fills gradient slot `i` (ignored when the node has no such input).
pub(super) fn set(out: &mut [Option<Tensor>], i: usize, t: Tensor) {
    if let Some(s) = out.get_mut(i) {
        *s = Some(t);
    }
}
