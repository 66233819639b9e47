//! Normalizations.

use super::norm_host::{bn_bwd_host, bn_host_ok, chan_vec, BnMoments, ChanAffine};
use crate::kernel::kbail;
use crate::kernel::{
    BwdArgs, Extras, Inputs, KResult, Kernel, KernelCtx, KernelError, KernelRegistry, Outs,
};
use crate::kernels::common::{
    chan_shape, compute_dtype, float_out, fsum, fsum_keepdim, grad0, host_unfold, sum_to, want,
};
use candle_core::{DType, Tensor};

// ---------------------------------------------------------------------------------------------
// Normalizations

/// Mean and inverse standard deviation over `dims` (keepdim), in `x`'s dtype.
fn moments(x: &Tensor, dims: &[usize], eps: f64) -> KResult<(Tensor, Tensor)> {
    let cnt: usize = dims.iter().map(|&d| x.dims()[d]).product();
    if cnt == 0 {
        kbail!("normalization over an empty set of elements");
    }
    let inv = 1.0 / cnt as f64;
    let mean = fsum_keepdim(x, dims)?.affine(inv, 0.0)?;
    let xc = x.broadcast_sub(&mean)?;
    let var = fsum_keepdim(&xc.sqr()?, dims)?.affine(inv, 0.0)?;
    let r = var.affine(1.0, eps)?.sqrt()?.recip()?;
    Ok((mean, r))
}

/// `dx = r * (g - mean(g) - xhat * mean(g * xhat))` over `dims`.
fn norm_dx(xhat: &Tensor, r: &Tensor, g: &Tensor, dims: &[usize]) -> KResult<Tensor> {
    let cnt: usize = dims.iter().map(|&d| g.dims()[d]).product();
    let inv = 1.0 / cnt.max(1) as f64;
    let mg = fsum_keepdim(g, dims)?.affine(inv, 0.0)?;
    let mgx = fsum_keepdim(&(g * xhat)?, dims)?.affine(inv, 0.0)?;
    let t = g.broadcast_sub(&mg)?.sub(&xhat.broadcast_mul(&mgx)?)?;
    Ok(t.broadcast_mul(r)?)
}

/// The statistics as the `stats` extra: mean and inverse std, flat, in f32.
fn stats_extra(mean: &Tensor, r: &Tensor) -> KResult<Vec<Tensor>> {
    Ok(vec![
        mean.flatten_all()?.to_dtype(DType::F32)?,
        r.flatten_all()?.to_dtype(DType::F32)?,
    ])
}

/// Saved statistics back in compute dtype and keepdim `shape`.
fn stats_from(v: &[Tensor], dt: DType, shape: &[usize]) -> KResult<(Tensor, Tensor)> {
    match v {
        [m, r] => Ok((
            m.to_dtype(dt)?.reshape(shape)?,
            r.to_dtype(dt)?.reshape(shape)?,
        )),
        _ => kbail!("the stats extra must hold mean and inverse std"),
    }
}

/// Statistics for the forward: the saved ones when they are exact (computed in the same
/// dtype), otherwise computed here.
fn fwd_stats(xc: &Tensor, dims: &[usize], eps: f64, ex: &Extras) -> KResult<(Tensor, Tensor)> {
    if let Some(v) = ex.get("stats") {
        if xc.dtype() == DType::F32 {
            let mut shape = xc.dims().to_vec();
            for &d in dims {
                shape[d] = 1;
            }
            return stats_from(v, DType::F32, &shape);
        }
    }
    if dims == all_but_1(xc.rank()).as_slice() {
        return bn_moments(xc, eps);
    }
    moments(xc, dims, eps)
}

fn eps_attr(cx: &KernelCtx) -> KResult<f64> {
    Ok(cx.attrs.float_or("epsilon", 1e-5)? as f64)
}

/// Per-channel parameter `t` (C elements) as `[1, C, 1, ...]` in dtype `dt`.
fn per_chan(t: &Tensor, c: usize, rank: usize, dt: DType) -> KResult<Tensor> {
    if t.elem_count() != c {
        kbail!(
            "per-channel input has {} elements for {c} channels",
            t.elem_count()
        );
    }
    Ok(t.to_dtype(dt)?.reshape(chan_shape(c, rank))?)
}

fn all_but_1(rank: usize) -> Vec<usize> {
    (0..rank).filter(|&d| d != 1).collect()
}

fn bn_training(cx: &KernelCtx) -> KResult<bool> {
    if cx.opset >= 14 {
        Ok(cx.attrs.int_or("training_mode", 0)? != 0)
    } else {
        Ok(cx.outputs.len() > 1)
    }
}

fn bn_extra(cx: &KernelCtx, tag: &str, xs: &[Option<Tensor>]) -> KResult<Vec<Tensor>> {
    if tag != "stats" {
        kbail!("no extra value {tag:?}");
    }
    let x = xs.req(0)?;
    let xc = x.to_dtype(compute_dtype(x.dtype()))?;
    let (m, r) = bn_moments(&xc, eps_attr(cx)?)?;
    stats_extra(&m, &r)
}

fn bn_fwd(cx: &KernelCtx, xs: &[Option<Tensor>], ex: &Extras) -> KResult<Vec<Option<Tensor>>> {
    let x = xs.req(0)?;
    let dt = compute_dtype(x.dtype());
    let rank = x.rank();
    if rank < 2 {
        kbail!("input must be [N, C, ...]");
    }
    let c = x.dim(1)?;
    let eps = eps_attr(cx)?;
    let xc = x.to_dtype(dt)?;
    let scale = per_chan(xs.req(1)?, c, rank, dt)?;
    let bias = per_chan(xs.req(2)?, c, rank, dt)?;
    let mut outs: Vec<Option<Tensor>> = vec![None; cx.outputs.len().max(1)];
    if bn_training(cx)? {
        let dims = all_but_1(rank);
        let (m, r) = fwd_stats(&xc, &dims, eps, ex)?;
        let a = scale.broadcast_mul(&r)?;
        let b = bias.broadcast_sub(&m.broadcast_mul(&a)?)?;
        let y = bn_affine(&xc, &a, &b)?;
        outs[0] = Some(y.to_dtype(x.dtype())?);
        if cx.outputs.len() > 1 {
            let momentum = cx.attrs.float_or("momentum", 0.9)? as f64;
            // Biased batch variance, as the ONNX reference computes it.
            let var = r.sqr()?.recip()?.affine(1.0, -eps)?;
            let m1 = m.flatten_all()?;
            let v1 = var.flatten_all()?;
            let run_m = per_chan(xs.req(3)?, c, 1, dt)?.flatten_all()?;
            let run_v = per_chan(xs.req(4)?, c, 1, dt)?.flatten_all()?;
            let new_m = (run_m.affine(momentum, 0.0)? + m1.affine(1.0 - momentum, 0.0)?)?;
            let new_v = (run_v.affine(momentum, 0.0)? + v1.affine(1.0 - momentum, 0.0)?)?;
            let vals = [new_m, new_v, m1, v1];
            for (k, v) in vals.into_iter().enumerate() {
                if want(cx, k + 1) {
                    outs[k + 1] = Some(v.to_dtype(float_out(cx, k + 1, x.dtype())?)?);
                }
            }
        }
    } else {
        let m = per_chan(xs.req(3)?, c, rank, dt)?;
        let v = per_chan(xs.req(4)?, c, rank, dt)?;
        let a = scale.broadcast_mul(&v.affine(1.0, eps)?.sqrt()?.recip()?)?;
        let b = bias.broadcast_sub(&m.broadcast_mul(&a)?)?;
        let y = bn_affine(&xc, &a, &b)?;
        outs[0] = Some(y.to_dtype(x.dtype())?);
        for (k, src) in [(1usize, 3usize), (2, 4)] {
            if want(cx, k) {
                outs[k] = Some(xs.req(src)?.clone());
            }
        }
    }
    Ok(outs)
}

fn bn_bwd(cx: &KernelCtx, a: &BwdArgs) -> KResult<Vec<Option<Tensor>>> {
    let x = a.input(0)?;
    let dt = compute_dtype(x.dtype());
    let rank = x.rank();
    let c = x.dim(1)?;
    let eps = eps_attr(cx)?;
    let g = a.grad(cx, 0)?.to_dtype(dt)?;
    let dims = all_but_1(rank);
    let cs = chan_shape(c, rank);
    let training = bn_training(cx)?;
    let (m, r) = if training {
        stats_from(a.extra("stats")?, dt, &cs)?
    } else {
        let m = per_chan(a.input(3)?, c, rank, dt)?;
        let v = per_chan(a.input(4)?, c, rank, dt)?;
        (m, v.affine(1.0, eps)?.sqrt()?.recip()?)
    };
    if training
        && host_unfold(x.device())
        && x.dtype() == dt
        && matches!(dt, DType::F32 | DType::F64)
    {
        return bn_bwd_host(cx, a, &g, &m, &r);
    }
    // Per-channel sums: S_g = sum dY, S_gx = sum dY (x - mean); then every gradient is a
    // per-channel affine map (few passes over the data).
    let xc = x.to_dtype(dt)?.broadcast_sub(&m)?;
    let sg = fsum_keepdim(&g, &dims)?;
    let sgx = if training || a.need(1) {
        Some(fsum_keepdim(&(&g * &xc)?, &dims)?)
    } else {
        None
    };
    let mut out = vec![None; a.inputs.len()];
    if a.need(0) {
        let scale = per_chan(a.input(1)?, c, rank, dt)?;
        let k = scale.broadcast_mul(&r)?;
        let dx = match (&sgx, training) {
            (Some(sgx), true) => {
                let cnt: usize = dims.iter().map(|&d| x.dims()[d]).product();
                let inv = 1.0 / cnt.max(1) as f64;
                // dx = k (g - S_g / M - (x - mean) r^2 S_gx / M)
                let bx = k
                    .broadcast_mul(&r.sqr()?)?
                    .broadcast_mul(sgx)?
                    .affine(-inv, 0.0)?;
                let c0 = k.broadcast_mul(&sg)?.affine(-inv, 0.0)?;
                g.broadcast_mul(&k)?
                    .add(&xc.broadcast_mul(&bx)?)?
                    .broadcast_add(&c0)?
            }
            _ => g.broadcast_mul(&k)?,
        };
        out[0] = Some(dx.to_dtype(x.dtype())?);
    }
    if a.need(1) {
        if let Some(sgx) = &sgx {
            let ds = sgx.broadcast_mul(&r)?;
            out[1] = Some(ds.to_dtype(x.dtype())?.reshape(cx.in_shape(1)?)?);
        }
    }
    if a.need(2) {
        out[2] = Some(sg.to_dtype(x.dtype())?.reshape(cx.in_shape(2)?)?);
    }
    Ok(out)
}

/// Accumulator lanes of the host reductions: independent partial sums, so that the adds
/// Batch statistics over all dims but the channels: mean and inverse std, keepdim-shaped.
fn bn_moments(xc: &Tensor, eps: f64) -> KResult<(Tensor, Tensor)> {
    if !bn_host_ok(xc) {
        return moments(xc, &all_but_1(xc.rank()), eps);
    }
    let (n, c) = (xc.dim(0)?, xc.dim(1)?);
    let s: usize = xc.dims()[2..].iter().product();
    let op = BnMoments { n, c, s, eps };
    let v = xc.contiguous()?.apply_op1_no_bwd(&op)?;
    let cs = chan_shape(c, xc.rank());
    Ok((
        v.narrow(0, 0, c)?.reshape(cs.clone())?,
        v.narrow(0, c, c)?.reshape(cs)?,
    ))
}

/// `x · a + b` with per-channel `a`, `b` (keepdim-shaped): one host pass on the CPU.
fn bn_affine(x: &Tensor, a: &Tensor, b: &Tensor) -> KResult<Tensor> {
    if bn_host_ok(x) {
        let c = x.dim(1)?;
        let s: usize = x.dims()[2..].iter().product();
        let (av, bv) = (chan_vec(a)?, chan_vec(b)?);
        if av.len() == c && bv.len() == c {
            let op = ChanAffine { c, s, a: av, b: bv };
            return Ok(x.contiguous()?.apply_op1_no_bwd(&op)?);
        }
    }
    Ok(x.broadcast_mul(a)?.broadcast_add(b)?)
}

// InstanceNormalization: per-(n, c) statistics over the spatial dims.

fn in_dims(rank: usize) -> Vec<usize> {
    (2..rank).collect()
}

fn in_extra(cx: &KernelCtx, tag: &str, xs: &[Option<Tensor>]) -> KResult<Vec<Tensor>> {
    if tag != "stats" {
        kbail!("no extra value {tag:?}");
    }
    let x = xs.req(0)?;
    if x.rank() < 3 {
        kbail!("input must be [N, C, spatial...]");
    }
    let xc = x.to_dtype(compute_dtype(x.dtype()))?;
    let (m, r) = moments(&xc, &in_dims(x.rank()), eps_attr(cx)?)?;
    stats_extra(&m, &r)
}

fn in_fwd(cx: &KernelCtx, xs: &[Option<Tensor>], ex: &Extras) -> KResult<Vec<Option<Tensor>>> {
    let x = xs.req(0)?;
    let rank = x.rank();
    if rank < 3 {
        kbail!("input must be [N, C, spatial...]");
    }
    let dt = compute_dtype(x.dtype());
    let c = x.dim(1)?;
    let xc = x.to_dtype(dt)?;
    let (m, r) = fwd_stats(&xc, &in_dims(rank), eps_attr(cx)?, ex)?;
    let scale = per_chan(xs.req(1)?, c, rank, dt)?;
    let bias = per_chan(xs.req(2)?, c, rank, dt)?;
    let y = xc
        .broadcast_sub(&m)?
        .broadcast_mul(&r.broadcast_mul(&scale)?)?
        .broadcast_add(&bias)?;
    Ok(vec![Some(y.to_dtype(x.dtype())?)])
}

fn in_bwd(cx: &KernelCtx, a: &BwdArgs) -> KResult<Vec<Option<Tensor>>> {
    let x = a.input(0)?;
    let rank = x.rank();
    let dt = compute_dtype(x.dtype());
    let (n, c) = (x.dim(0)?, x.dim(1)?);
    let xc = x.to_dtype(dt)?;
    let mut sshape = vec![1; rank];
    sshape[0] = n;
    sshape[1] = c;
    let (m, r) = stats_from(a.extra("stats")?, dt, &sshape)?;
    let xhat = xc.broadcast_sub(&m)?.broadcast_mul(&r)?;
    let g = a.grad(cx, 0)?.to_dtype(dt)?;
    let mut out = vec![None; a.inputs.len()];
    if a.need(0) {
        let scale = per_chan(a.input(1)?, c, rank, dt)?;
        let dx = norm_dx(&xhat, &r, &g.broadcast_mul(&scale)?, &in_dims(rank))?;
        out[0] = Some(dx.to_dtype(x.dtype())?);
    }
    if a.need(1) {
        let ds = fsum(&(&g * &xhat)?, &all_but_1(rank))?;
        out[1] = Some(ds.to_dtype(x.dtype())?.reshape(cx.in_shape(1)?)?);
    }
    if a.need(2) {
        let db = fsum(&g, &all_but_1(rank))?;
        out[2] = Some(db.to_dtype(x.dtype())?.reshape(cx.in_shape(2)?)?);
    }
    Ok(out)
}

// LayerNormalization: statistics over the dims from `axis` on.

fn ln_axis(cx: &KernelCtx, rank: usize) -> KResult<usize> {
    Ok(cx.axis(cx.attrs.int_or("axis", -1)?, rank)?)
}

fn ln_extra(cx: &KernelCtx, tag: &str, xs: &[Option<Tensor>]) -> KResult<Vec<Tensor>> {
    if tag != "stats" {
        kbail!("no extra value {tag:?}");
    }
    let x = xs.req(0)?;
    let axis = ln_axis(cx, x.rank())?;
    let xc = x.to_dtype(compute_dtype(x.dtype()))?;
    let dims: Vec<usize> = (axis..x.rank()).collect();
    let (m, r) = moments(&xc, &dims, eps_attr(cx)?)?;
    stats_extra(&m, &r)
}

fn ln_fwd(cx: &KernelCtx, xs: &[Option<Tensor>], ex: &Extras) -> KResult<Vec<Option<Tensor>>> {
    let x = xs.req(0)?;
    let dt = compute_dtype(x.dtype());
    let axis = ln_axis(cx, x.rank())?;
    let dims: Vec<usize> = (axis..x.rank()).collect();
    let xc = x.to_dtype(dt)?;
    let (m, r) = fwd_stats(&xc, &dims, eps_attr(cx)?, ex)?;
    let mut y = xc.broadcast_sub(&m)?.broadcast_mul(&r)?;
    if let Some(s) = xs.opt(1) {
        y = y.broadcast_mul(&s.to_dtype(dt)?)?;
    }
    if let Some(b) = xs.opt(2) {
        y = y.broadcast_add(&b.to_dtype(dt)?)?;
    }
    let mut outs = vec![Some(y.to_dtype(x.dtype())?)];
    for (k, v) in [(1usize, &m), (2, &r)] {
        if k < cx.outputs.len() {
            outs.push(if want(cx, k) {
                Some(v.to_dtype(float_out(cx, k, x.dtype())?)?)
            } else {
                None
            });
        }
    }
    Ok(outs)
}

fn ln_bwd(cx: &KernelCtx, a: &BwdArgs) -> KResult<Vec<Option<Tensor>>> {
    let x = a.input(0)?;
    let dt = compute_dtype(x.dtype());
    let rank = x.rank();
    let axis = ln_axis(cx, rank)?;
    let dims: Vec<usize> = (axis..rank).collect();
    let mut sshape = x.dims().to_vec();
    for d in &mut sshape[axis..] {
        *d = 1;
    }
    let (m, r) = stats_from(a.extra("stats")?, dt, &sshape)?;
    let xhat = x.to_dtype(dt)?.broadcast_sub(&m)?.broadcast_mul(&r)?;
    let g = a.grad(cx, 0)?.to_dtype(dt)?;
    let mut out = vec![None; a.inputs.len()];
    if a.need(0) {
        let gs = match a.inputs.get(1).and_then(|t| t.as_ref()) {
            Some(s) => g.broadcast_mul(&s.to_dtype(dt)?)?,
            None if cx.inputs.get(1).map(|f| f.is_some()).unwrap_or(false) => {
                kbail!("the backward needs the scale (input 1), which is not resident")
            }
            None => g.clone(),
        };
        out[0] = Some(norm_dx(&xhat, &r, &gs, &dims)?.to_dtype(x.dtype())?);
    }
    if a.need(1) {
        let ds = sum_to(&(&g * &xhat)?, &cx.in_shape(1)?)?;
        out[1] = Some(ds.to_dtype(x.dtype())?);
    }
    if a.need(2) {
        out[2] = Some(sum_to(&g, &cx.in_shape(2)?)?.to_dtype(x.dtype())?);
    }
    Ok(out)
}

// GroupNormalization: statistics per (n, group); scale and bias per channel (opset 21 and
// the fused form) or per group (opset 18).

fn gn_groups(cx: &KernelCtx, c: usize) -> KResult<usize> {
    let g = cx
        .attrs
        .int("num_groups")?
        .ok_or_else(|| KernelError::new("attribute \"num_groups\" is required but missing"))?;
    if g < 1 || !c.is_multiple_of(g as usize) {
        kbail!("attribute \"num_groups\" = {g} does not divide {c} channels");
    }
    Ok(g as usize)
}

/// `x` as `[N, G, rest]`.
fn gn_view(x: &Tensor, g: usize) -> KResult<Tensor> {
    let n = x.dim(0)?;
    let rest = x.elem_count() / (n * g).max(1);
    Ok(x.contiguous()?.reshape((n, g, rest))?)
}

/// Scale or bias as a per-channel `[1, C, 1, ...]` tensor.
fn gn_param(t: &Tensor, c: usize, g: usize, rank: usize, dt: DType) -> KResult<Tensor> {
    let n = t.elem_count();
    let t = t.to_dtype(dt)?.flatten_all()?;
    let t = if n == c {
        t
    } else if n == g {
        t.reshape((g, 1))?
            .broadcast_as((g, c / g))?
            .contiguous()?
            .flatten_all()?
    } else {
        kbail!("scale and bias must have {c} (channels) or {g} (groups) elements, got {n}");
    };
    Ok(t.reshape(chan_shape(c, rank))?)
}

/// Per-channel gradient `[C]` summed back to a parameter of `n` elements and `shape`.
fn gn_param_grad(dc: &Tensor, c: usize, g: usize, shape: &[usize]) -> KResult<Tensor> {
    let n: usize = shape.iter().product();
    let t = if n == c {
        dc.clone()
    } else {
        dc.reshape((g, c / g))?.sum(1)?
    };
    Ok(t.reshape(shape)?)
}

fn gn_extra(cx: &KernelCtx, tag: &str, xs: &[Option<Tensor>]) -> KResult<Vec<Tensor>> {
    if tag != "stats" {
        kbail!("no extra value {tag:?}");
    }
    let x = xs.req(0)?;
    let g = gn_groups(cx, x.dim(1)?)?;
    let xg = gn_view(&x.to_dtype(compute_dtype(x.dtype()))?, g)?;
    let (m, r) = moments(&xg, &[2], eps_attr(cx)?)?;
    stats_extra(&m, &r)
}

fn gn_fwd(cx: &KernelCtx, xs: &[Option<Tensor>], ex: &Extras) -> KResult<Vec<Option<Tensor>>> {
    let x = xs.req(0)?;
    if x.rank() < 2 {
        kbail!("input must be [N, C, ...]");
    }
    let dt = compute_dtype(x.dtype());
    let (c, rank) = (x.dim(1)?, x.rank());
    let g = gn_groups(cx, c)?;
    let xg = gn_view(&x.to_dtype(dt)?, g)?;
    let (m, r) = fwd_stats(&xg, &[2], eps_attr(cx)?, ex)?;
    let mut y = xg.broadcast_sub(&m)?.broadcast_mul(&r)?.reshape(x.dims())?;
    if let Some(s) = xs.opt(1) {
        y = y.broadcast_mul(&gn_param(s, c, g, rank, dt)?)?;
    }
    if let Some(b) = xs.opt(2) {
        y = y.broadcast_add(&gn_param(b, c, g, rank, dt)?)?;
    }
    Ok(vec![Some(y.to_dtype(x.dtype())?)])
}

fn gn_bwd(cx: &KernelCtx, a: &BwdArgs) -> KResult<Vec<Option<Tensor>>> {
    let x = a.input(0)?;
    let dt = compute_dtype(x.dtype());
    let (n, c, rank) = (x.dim(0)?, x.dim(1)?, x.rank());
    let g = gn_groups(cx, c)?;
    let (m, r) = stats_from(a.extra("stats")?, dt, &[n, g, 1])?;
    let xhat = gn_view(&x.to_dtype(dt)?, g)?
        .broadcast_sub(&m)?
        .broadcast_mul(&r)?;
    let gy = a.grad(cx, 0)?.to_dtype(dt)?;
    let mut out = vec![None; a.inputs.len()];
    if a.need(0) {
        let gs = match a.inputs.get(1).and_then(|t| t.as_ref()) {
            Some(s) => gy.broadcast_mul(&gn_param(s, c, g, rank, dt)?)?,
            None if cx.inputs.get(1).map(|f| f.is_some()).unwrap_or(false) => {
                kbail!("the backward needs the scale (input 1), which is not resident")
            }
            None => gy.clone(),
        };
        let dx = norm_dx(&xhat, &r, &gn_view(&gs, g)?, &[2])?;
        out[0] = Some(dx.reshape(x.dims())?.to_dtype(x.dtype())?);
    }
    if a.need(1) {
        let xh = xhat.reshape(x.dims())?;
        let dc = fsum(&(&gy * &xh)?, &all_but_1(rank))?;
        out[1] = Some(gn_param_grad(&dc, c, g, &cx.in_shape(1)?)?.to_dtype(x.dtype())?);
    }
    if a.need(2) {
        let dc = fsum(&gy, &all_but_1(rank))?;
        out[2] = Some(gn_param_grad(&dc, c, g, &cx.in_shape(2)?)?.to_dtype(x.dtype())?);
    }
    Ok(out)
}

// LRN: y = x / (bias + alpha / size * sum of squares over a channel window) ^ beta.

struct LrnAttrs {
    alpha: f64,
    beta: f64,
    bias: f64,
    size: usize,
}

fn lrn_attrs(cx: &KernelCtx) -> KResult<LrnAttrs> {
    let size = cx
        .attrs
        .int("size")?
        .ok_or_else(|| KernelError::new("attribute \"size\" is required but missing"))?;
    if size < 1 {
        kbail!("attribute \"size\" = {size} must be positive");
    }
    Ok(LrnAttrs {
        alpha: cx.attrs.float_or("alpha", 1e-4)? as f64,
        beta: cx.attrs.float_or("beta", 0.75)? as f64,
        bias: cx.attrs.float_or("bias", 1.0)? as f64,
        size: size as usize,
    })
}

/// Sum over the channel window `[c - lo, c + hi]` (zeros outside).
fn chan_window_sum(t: &Tensor, lo: usize, hi: usize) -> KResult<Tensor> {
    let c = t.dim(1)?;
    let p = t.pad_with_zeros(1, lo, hi)?;
    let mut acc = p.narrow(1, 0, c)?;
    for i in 1..=lo + hi {
        acc = (acc + p.narrow(1, i, c)?)?;
    }
    Ok(acc)
}

/// The denominator base `bias + alpha / size * window sum of x^2`.
fn lrn_base(x: &Tensor, p: &LrnAttrs) -> KResult<Tensor> {
    let lo = (p.size - 1) / 2;
    let hi = p.size - 1 - lo;
    Ok(chan_window_sum(&x.sqr()?, lo, hi)?.affine(p.alpha / p.size as f64, p.bias)?)
}

fn lrn_fwd(cx: &KernelCtx, xs: &[Option<Tensor>], _: &Extras) -> KResult<Vec<Option<Tensor>>> {
    let p = lrn_attrs(cx)?;
    let x = xs.req(0)?;
    let s = lrn_base(x, &p)?;
    Ok(vec![Some((x * s.powf(-p.beta)?)?)])
}

fn lrn_bwd(cx: &KernelCtx, a: &BwdArgs) -> KResult<Vec<Option<Tensor>>> {
    let p = lrn_attrs(cx)?;
    let x = a.input(0)?;
    let y = a.output(0)?;
    let g = a.grad(cx, 0)?;
    let s = lrn_base(x, &p)?;
    let lo = (p.size - 1) / 2;
    let hi = p.size - 1 - lo;
    // dx_c = g_c s_c^-b - 2 a b / n x_c sum_{c' : c in window(c')} g_c' y_c' / s_c'
    let t = ((&g * y)? / &s)?;
    let back = chan_window_sum(&t, hi, lo)?;
    let dx = ((&g * s.powf(-p.beta)?)?
        - (x * back)?.affine(2.0 * p.alpha * p.beta / p.size as f64, 0.0)?)?;
    Ok(vec![Some(dx)])
}

// LpNormalization, MeanVarianceNormalization

fn lp_params(cx: &KernelCtx) -> KResult<(usize, i64)> {
    let axis = cx.axis(cx.attrs.int_or("axis", -1)?, cx.input(0)?.rank())?;
    let p = cx.attrs.int_or("p", 2)?;
    if p != 1 && p != 2 {
        kbail!("attribute \"p\" = {p} is not supported (1 or 2)");
    }
    Ok((axis, p))
}

/// The norm along `axis`, with 1 where it is 0: a zero vector normalizes to zeros (as ONNX's
/// reference has it), not to NaN.
fn lp_norm(x: &Tensor, axis: usize, p: i64) -> KResult<Tensor> {
    let n = if p == 1 {
        x.abs()?.sum_keepdim(axis)?
    } else {
        x.sqr()?.sum_keepdim(axis)?.sqrt()?
    };
    let zero = n.eq(0.0)?.to_dtype(n.dtype())?;
    Ok((n + zero)?)
}

fn lp_fwd(cx: &KernelCtx, xs: &[Option<Tensor>], _: &Extras) -> Outs {
    let x = xs.req(0)?;
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
        Some(a) => Ok(cx.rule.axes(a, rank)?),
        None => Ok(cx.rule.axes(&[0, 2, 3], rank)?),
    }
}

const MVN_EPS: f64 = 1e-9;

/// The type MVN computes in: f32 for the 16-bit types (whose range loses the epsilon).
pub(super) fn wide(t: &Tensor) -> KResult<Tensor> {
    Ok(match t.dtype() {
        DType::F16 | DType::BF16 => t.to_dtype(DType::F32)?,
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
    let x = xs.req(0)?;
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

pub(super) fn register(r: &mut KernelRegistry) {
    r.insert(
        "BatchNormalization",
        Kernel::with_extra(bn_fwd, bn_extra, Some(bn_bwd)),
    );
    r.insert(
        "InstanceNormalization",
        Kernel::with_extra(in_fwd, in_extra, Some(in_bwd)),
    );
    r.insert(
        "LayerNormalization",
        Kernel::with_extra(ln_fwd, ln_extra, Some(ln_bwd)),
    );
    r.insert(
        "GroupNormalization",
        Kernel::with_extra(gn_fwd, gn_extra, Some(gn_bwd)),
    );
    r.insert("LRN", Kernel::new(lrn_fwd, Some(lrn_bwd)));
    r.insert("LpNormalization", Kernel::new(lp_fwd, Some(lp_bwd)));
    r.insert(
        "MeanVarianceNormalization",
        Kernel::new(mvn_fwd, Some(mvn_bwd)),
    );
}

#[cfg(test)]
mod tests {
    use crate::testing::{check, float, int, ints, Case, In};
    use crate::testing::{p, r};
    use remat_planner::ops::Ctx;
    use remat_planner::tensor::DType;

    fn pos(c: usize) -> In {
        In::Const(
            DType::F32,
            vec![c],
            (0..c).map(|i| 0.5 + 0.25 * i as f64).collect(),
        )
    }
    fn small(c: usize) -> In {
        In::Const(
            DType::F32,
            vec![c],
            (0..c).map(|i| 0.1 * i as f64 - 0.1).collect(),
        )
    }

    #[test]
    fn batch_norm_training() {
        check(
            &Case::new(
                "BatchNormalization",
                15,
                vec![r(&[3, 2, 3, 3]), p(&[2]), p(&[2]), small(2), pos(2)],
            )
            .attr(int("training_mode", 1))
            .attr(float("momentum", 0.8))
            .outputs(3),
        );
        check(
            &Case::new(
                "BatchNormalization",
                9,
                vec![r(&[4, 3]), p(&[3]), p(&[3]), small(3), pos(3)],
            )
            .outputs(5),
        );
    }

    #[test]
    fn batch_norm_running_stats_follow_onnx() {
        use crate::kernel::{Extras, KernelCtx};
        use candle_core::{Device, Tensor};
        use remat_planner::onnx::Attrs;
        use remat_planner::tensor::Fact;
        let dev = Device::Cpu;
        let x = Tensor::new(&[[1.0f64, 3.0], [5.0, 7.0]], &dev).unwrap();
        let ones = Tensor::new(&[1.0f64, 1.0], &dev).unwrap();
        let zeros = Tensor::new(&[0.0f64, 0.0], &dev).unwrap();
        let attrs = vec![int("training_mode", 1), float("momentum", 0.9)];
        let f2 = Some(Fact::new(DType::F64, vec![2]));
        let inputs = vec![
            Some(Fact::new(DType::F64, vec![2, 2])),
            f2.clone(),
            f2.clone(),
            f2.clone(),
            f2.clone(),
        ];
        let outputs = vec![Some(Fact::new(DType::F64, vec![2, 2])), f2.clone(), f2];
        let cx = KernelCtx {
            rule: Ctx {
                node: "bn",
                op: "BatchNormalization",
                opset: 15,
                attrs: Attrs {
                    node: "bn",
                    op: "BatchNormalization",
                    list: &attrs,
                },
                inputs: &inputs,
                n_outputs: outputs.len(),
            },
            outputs: &outputs,
            device: &dev,
            seed: 1,
        };
        let xs = vec![
            Some(x),
            Some(ones.clone()),
            Some(zeros.clone()),
            Some(zeros),
            Some(ones),
        ];
        let y = super::bn_fwd(&cx, &xs, &Extras::new()).unwrap();
        let m = y[1].as_ref().unwrap().to_vec1::<f64>().unwrap();
        let v = y[2].as_ref().unwrap().to_vec1::<f64>().unwrap();
        // Batch means 3 and 5, biased variances 4 and 4 (momentum is an f32 attribute).
        assert!(
            (m[0] - 0.3).abs() < 1e-6 && (m[1] - 0.5).abs() < 1e-6,
            "{m:?}"
        );
        assert!(
            (v[0] - 1.3).abs() < 1e-6 && (v[1] - 1.3).abs() < 1e-6,
            "{v:?}"
        );
    }

    #[test]
    fn batch_norm_inference() {
        check(&Case::new(
            "BatchNormalization",
            15,
            vec![r(&[2, 3, 2, 2]), p(&[3]), p(&[3]), small(3), pos(3)],
        ));
    }

    #[test]
    fn instance_norm() {
        check(
            &Case::new(
                "InstanceNormalization",
                6,
                vec![r(&[2, 3, 3, 2]), p(&[3]), p(&[3])],
            )
            .tol(1e-5),
        );
    }

    #[test]
    fn layer_norm() {
        check(&Case::new(
            "LayerNormalization",
            17,
            vec![r(&[2, 3, 5]), p(&[5]), p(&[5])],
        ));
        check(
            &Case::new(
                "LayerNormalization",
                17,
                vec![r(&[2, 3, 4]), p(&[3, 4]), In::None],
            )
            .attr(int("axis", 1))
            .attr(float("epsilon", 1e-3))
            .outputs(3),
        );
        check(&Case::new("LayerNormalization", 17, vec![r(&[3, 6])]));
    }

    #[test]
    fn group_norm() {
        check(
            &Case::new(
                "GroupNormalization",
                21,
                vec![r(&[2, 4, 3, 2]), p(&[4]), p(&[4])],
            )
            .attr(int("num_groups", 2)),
        );
        check(
            &Case::new(
                "GroupNormalization",
                18,
                vec![r(&[2, 6, 5]), p(&[3]), p(&[3])],
            )
            .attr(int("num_groups", 3))
            .attr(float("epsilon", 1e-2)),
        );
        // The fused form: per-channel scale shaped [C, 1, 1], no bias.
        check(
            &Case::new(
                "GroupNormalization",
                17,
                vec![r(&[1, 4, 2, 3]), p(&[4, 1, 1])],
            )
            .attr(int("num_groups", 2)),
        );
    }

    #[test]
    fn lrn() {
        check(&Case::new("LRN", 13, vec![r(&[2, 5, 3, 3])]).attr(int("size", 3)));
        check(
            &Case::new("LRN", 13, vec![r(&[1, 6, 2, 2])])
                .attr(int("size", 4))
                .attr(float("alpha", 0.1))
                .attr(float("beta", 0.6))
                .attr(float("bias", 2.0)),
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
}
