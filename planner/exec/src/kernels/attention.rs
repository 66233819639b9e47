//! Kernels of the transformer family: `Attention` (opset 23, and the fused scaled
//! dot-product attention of `remat_planner::fuse` with its kᵀ input), `RMSNormalization` and
//! `RotaryEmbedding` (see `exec::kernel` for the contract).
//!
//! Attention keeps no probability matrix: its `stats` extra is the per-row log-sum-exp in
//! f32 (`[batch, q heads, q seq]`), and the backward rebuilds the probabilities from q, k,
//! the mask and the statistics, as the fused kernels of PyTorch do. Grouped-query attention
//! never copies K or V per query head: the query heads of one key/value head are folded
//! into its rows, so one batched matmul serves the whole group and its backward sums over
//! the group by itself. Half-precision inputs compute in f32.

use super::common::{compute_dtype, sum_to, want};
use crate::kernel::kbail;
use crate::kernel::{
    to_candle, BwdArgs, Extras, Inputs, KResult, Kernel, KernelCtx, KernelError, KernelRegistry,
};
use candle_core::{DType, Tensor, D};

// ---------------------------------------------------------------------------------------
// Attention

struct Attn {
    batch: usize,
    q_heads: usize,
    kv_heads: usize,
    q_seq: usize,
    past: usize,
    total: usize,
    head: usize,
    v_head: usize,
    four_d: bool,
    key_transposed: bool,
    scale: f64,
    causal: bool,
    /// Opset 25's sliding window: a query at position p sees keys j with
    /// `p - left <= j <= p + right`; -1 leaves a side unbounded.
    left: i64,
    right: i64,
    softcap: f64,
    mode: i64,
}

impl Attn {
    fn reps(&self) -> usize {
        self.q_heads / self.kv_heads
    }
}

fn attn_cfg(cx: &KernelCtx) -> KResult<Attn> {
    let q = cx.in_shape(0)?;
    let k = cx.in_shape(1)?;
    let v = cx.in_shape(2)?;
    if cx.opt(6).is_some() {
        kbail!("input 6 (nonpad_kv_seqlen) is not supported");
    }
    let key_transposed = cx
        .attrs
        .int_or(remat_planner::ops::attention::KEY_TRANSPOSED, 0)?
        != 0;
    let four_d = q.len() == 4;
    let get = |s: &[usize], i: usize| s.get(i).copied().unwrap_or(0);
    let (batch, q_heads, kv_heads, q_seq, kv_seq, head, v_head) = if four_d {
        let (kseq, khead) = if key_transposed {
            (get(&k, 3), get(&k, 2))
        } else {
            (get(&k, 2), get(&k, 3))
        };
        let _ = khead;
        (
            get(&q, 0),
            get(&q, 1),
            get(&k, 1),
            get(&q, 2),
            kseq,
            get(&q, 3),
            get(&v, 3),
        )
    } else {
        if key_transposed {
            kbail!("a transposed key needs 4-D inputs");
        }
        let heads = |name: &str| -> KResult<usize> {
            match cx.attrs.int(name)? {
                Some(h) if h > 0 => Ok(h as usize),
                h => kbail!("attribute {name:?} = {h:?} is not supported"),
            }
        };
        let (qh, kvh) = (heads("q_num_heads")?, heads("kv_num_heads")?);
        (
            get(&q, 0),
            qh,
            kvh,
            get(&q, 1),
            get(&k, 1),
            get(&q, 2) / qh,
            get(&v, 2) / kvh,
        )
    };
    if kv_heads == 0 || q_heads % kv_heads != 0 {
        kbail!("{q_heads} query heads are not a multiple of {kv_heads} key/value heads");
    }
    let past = if cx.opt(4).is_some() {
        cx.in_shape(4)?.get(2).copied().unwrap_or(0)
    } else {
        0
    };
    let scale = match cx.attrs.float("scale")? {
        Some(s) => s as f64,
        None => 1.0 / (head.max(1) as f64).sqrt(),
    };
    let softcap = cx.attrs.float_or("softcap", 0.0)? as f64;
    if softcap < 0.0 {
        kbail!("attribute \"softcap\" = {softcap} is not supported");
    }
    let mode = cx.attrs.int_or("qk_matmul_output_mode", 0)?;
    match mode {
        0 | 3 => {}
        1 | 2 if softcap == 0.0 => {}
        m => kbail!(
            "attribute \"qk_matmul_output_mode\" = {m} is not supported with softcap {softcap}"
        ),
    }
    Ok(Attn {
        batch,
        q_heads,
        kv_heads,
        q_seq,
        past,
        total: past + kv_seq,
        head,
        v_head,
        four_d,
        key_transposed,
        scale,
        causal: cx.attrs.int_or("is_causal", 0)? != 0,
        left: window(cx, "left_window_size")?,
        right: window(cx, "right_window_size")?,
        softcap,
        mode,
    })
}

/// A window attribute: -1 (unbounded, the default) or a number of keys.
fn window(cx: &KernelCtx, name: &str) -> KResult<i64> {
    match cx.attrs.int_or(name, -1)? {
        w if w >= -1 => Ok(w),
        w => kbail!("attribute {name:?} = {w} must be -1 or nonnegative"),
    }
}

/// `[batch, seq, heads · size]` → `[batch, heads, seq, size]`.
fn split_heads(t: &Tensor, heads: usize) -> KResult<Tensor> {
    let (b, s, hidden) = t.dims3()?;
    Ok(t.reshape((b, s, heads, hidden / heads))?
        .transpose(1, 2)?
        .contiguous()?)
}

/// `[batch, heads, seq, size]` → `[batch, seq, heads · size]`.
fn merge_heads(t: &Tensor) -> KResult<Tensor> {
    let (b, h, s, d) = t.dims4()?;
    Ok(t.transpose(1, 2)?.contiguous()?.reshape((b, s, h * d))?)
}

/// Q `[batch, q heads, q seq, head]`, K and V with the past `[batch, kv heads, total, ·]`,
/// all in the compute type.
fn qkv(
    a: &Attn,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    past: Option<(&Tensor, &Tensor)>,
) -> KResult<(Tensor, Tensor, Tensor)> {
    let ct = compute_dtype(q.dtype());
    let (q, k, v) = if a.four_d {
        let k = if a.key_transposed {
            k.transpose(2, 3)?.contiguous()?
        } else {
            k.clone()
        };
        (q.clone(), k, v.clone())
    } else {
        (
            split_heads(q, a.q_heads)?,
            split_heads(k, a.kv_heads)?,
            split_heads(v, a.kv_heads)?,
        )
    };
    let (k, v) = match past {
        Some((pk, pv)) => (Tensor::cat(&[pk, &k], 2)?, Tensor::cat(&[pv, &v], 2)?),
        None => (k, v),
    };
    Ok((q.to_dtype(ct)?, k.to_dtype(ct)?, v.to_dtype(ct)?))
}

/// The additive bias (mask and causal) broadcastable to `[batch, q heads, q seq, total]`.
fn bias(cx: &KernelCtx, a: &Attn, mask: Option<&Tensor>, ct: DType) -> KResult<Option<Tensor>> {
    let mut out = match mask {
        None => None,
        Some(m) => {
            let m = if m.dtype() == DType::U8 {
                let zeros = Tensor::zeros(m.dims(), ct, cx.device)?;
                let ninf = Tensor::full(f32::NEG_INFINITY, m.dims(), cx.device)?.to_dtype(ct)?;
                m.where_cond(&zeros, &ninf)?
            } else {
                m.to_dtype(ct)?
            };
            // A mask shorter than the keys is padded with "masked".
            let last = m.dim(D::Minus1)?;
            let m = if last < a.total {
                let mut shape = m.dims().to_vec();
                if let Some(l) = shape.last_mut() {
                    *l = a.total - last;
                }
                let pad = Tensor::full(f32::NEG_INFINITY, shape, cx.device)?.to_dtype(ct)?;
                Tensor::cat(&[&m, &pad], D::Minus1)?
            } else if last > a.total {
                kbail!(
                    "the mask covers {last} key positions, more than the {} keys",
                    a.total
                );
            } else {
                m
            };
            Some(m)
        }
    };
    if a.causal || a.left >= 0 || a.right >= 0 {
        // Query i sits at position p = past + i; key j is hidden when it lies in p's future
        // (causal) or outside the window.
        let mut v = vec![0f32; a.q_seq * a.total];
        for i in 0..a.q_seq {
            let p = (a.past + i) as i64;
            for j in 0..a.total {
                let j64 = j as i64;
                let hidden = (a.causal && j64 > p)
                    || (a.left >= 0 && p - j64 > a.left)
                    || (a.right >= 0 && j64 - p > a.right);
                if hidden {
                    if let Some(x) = v.get_mut(i * a.total + j) {
                        *x = f32::NEG_INFINITY;
                    }
                }
            }
        }
        let c = Tensor::from_vec(v, (a.q_seq, a.total), cx.device)?.to_dtype(ct)?;
        out = Some(match out {
            Some(m) => m.broadcast_add(&c)?,
            None => c,
        });
    }
    Ok(out)
}

/// Scores `[batch, q heads, q seq, total]` after scale, softcap and bias, and the softcap's
/// tanh (for its derivative).
fn scores(
    a: &Attn,
    q: &Tensor,
    k: &Tensor,
    bias: Option<&Tensor>,
) -> KResult<(Tensor, Tensor, Option<Tensor>)> {
    let qg = q.reshape((a.batch, a.kv_heads, a.reps() * a.q_seq, a.head))?;
    let raw = qg
        .matmul(&k.transpose(2, 3)?.contiguous()?)?
        .affine(a.scale, 0.0)?
        .reshape((a.batch, a.q_heads, a.q_seq, a.total))?;
    let (s, th) = if a.softcap > 0.0 {
        let th = raw.affine(1.0 / a.softcap, 0.0)?.tanh()?;
        (th.affine(a.softcap, 0.0)?, Some(th))
    } else {
        (raw.clone(), None)
    };
    let s = match bias {
        Some(b) => s.broadcast_add(b)?,
        None => s,
    };
    Ok((raw, s, th))
}

/// Softmax over the last dim and the log-sum-exp of each row; rows with every key masked
/// get zero probabilities (and a log-sum-exp of -inf).
fn softmax_lse(s: &Tensor) -> KResult<(Tensor, Tensor)> {
    let m = s.max_keepdim(D::Minus1)?;
    let m = m.eq(f64::NEG_INFINITY)?.where_cond(&m.zeros_like()?, &m)?;
    let e = s.broadcast_sub(&m)?.exp()?;
    let sum = e.sum_keepdim(D::Minus1)?;
    let lse = (m + sum.log()?)?;
    let safe = sum.eq(0.0)?.where_cond(&sum.ones_like()?, &sum)?;
    Ok((e.broadcast_div(&safe)?, lse))
}

fn attention_mask(xs: &[Option<Tensor>]) -> Option<&Tensor> {
    xs.opt(3)
}

fn past(xs: &[Option<Tensor>]) -> KResult<Option<(&Tensor, &Tensor)>> {
    match (xs.opt(4), xs.opt(5)) {
        (None, None) => Ok(None),
        (Some(k), Some(v)) => Ok(Some((k, v))),
        _ => kbail!("past_key and past_value must be given together"),
    }
}

fn attention_forward(
    cx: &KernelCtx,
    xs: &[Option<Tensor>],
    _: &Extras,
) -> KResult<Vec<Option<Tensor>>> {
    let a = attn_cfg(cx)?;
    let q0 = xs.named(0, "Q")?;
    let dt = q0.dtype();
    let (q, k, v) = qkv(&a, q0, xs.named(1, "K")?, xs.named(2, "V")?, past(xs)?)?;
    let b = bias(cx, &a, attention_mask(xs), q.dtype())?;
    let (raw, s, _) = scores(&a, &q, &k, b.as_ref())?;
    let (p, _) = softmax_lse(&s)?;
    let pg = p.reshape((a.batch, a.kv_heads, a.reps() * a.q_seq, a.total))?;
    let y = pg
        .matmul(&v)?
        .reshape((a.batch, a.q_heads, a.q_seq, a.v_head))?;
    let y = if a.four_d { y } else { merge_heads(&y)? };
    let mut out = vec![Some(y.to_dtype(dt)?)];
    for kk in 1..cx.outputs.len() {
        if !want(cx, kk) {
            out.push(None);
            continue;
        }
        out.push(Some(match kk {
            1 => k.to_dtype(dt)?,
            2 => v.to_dtype(dt)?,
            3 => match a.mode {
                0 => raw.to_dtype(dt)?,
                3 => p.to_dtype(dt)?,
                _ => s.to_dtype(dt)?,
            },
            _ => kbail!("Attention has no output {kk}"),
        }));
    }
    Ok(out)
}

fn attention_extra(cx: &KernelCtx, tag: &str, xs: &[Option<Tensor>]) -> KResult<Vec<Tensor>> {
    if tag != "stats" {
        kbail!("Attention has no extra value {tag:?}");
    }
    let a = attn_cfg(cx)?;
    let (q, k, _) = qkv(
        &a,
        xs.named(0, "Q")?,
        xs.named(1, "K")?,
        xs.named(2, "V")?,
        past(xs)?,
    )?;
    let b = bias(cx, &a, attention_mask(xs), q.dtype())?;
    let (_, s, _) = scores(&a, &q, &k, b.as_ref())?;
    let (_, lse) = softmax_lse(&s)?;
    Ok(vec![lse.squeeze(D::Minus1)?.to_dtype(DType::F32)?])
}

fn attention_backward(cx: &KernelCtx, g: &BwdArgs) -> KResult<Vec<Option<Tensor>>> {
    let a = attn_cfg(cx)?;
    let q0 = g.input(0)?;
    let dt = q0.dtype();
    let pst = if cx.opt(4).is_some() || cx.opt(5).is_some() {
        Some((g.input(4)?, g.input(5)?))
    } else {
        None
    };
    let (q, k, v) = qkv(&a, q0, g.input(1)?, g.input(2)?, pst)?;
    let ct = q.dtype();
    let mask = if cx.opt(3).is_some() {
        Some(g.input(3)?)
    } else {
        None
    };
    let b = bias(cx, &a, mask, ct)?;
    let (_, s, th) = scores(&a, &q, &k, b.as_ref())?;
    let lse = g
        .extra("stats")?
        .first()
        .ok_or_else(|| KernelError::new("the stats extra is empty"))?
        .to_dtype(ct)?
        .unsqueeze(D::Minus1)?;
    if lse.dims() != [a.batch, a.q_heads, a.q_seq, 1] {
        kbail!(
            "the stats extra has shape {:?}, expected {:?}",
            lse.dims(),
            [a.batch, a.q_heads, a.q_seq]
        );
    }
    // Fully masked rows (lse = -inf) get zero probabilities; renormalizing removes the
    // rounding of the f32 statistics.
    let lse = lse.eq(f64::NEG_INFINITY)?.where_cond(
        &Tensor::full(f32::INFINITY, lse.dims(), cx.device)?.to_dtype(ct)?,
        &lse,
    )?;
    let e = s.broadcast_sub(&lse)?.exp()?;
    let sum = e.sum_keepdim(D::Minus1)?;
    let sum = sum.eq(0.0)?.where_cond(&sum.ones_like()?, &sum)?;
    let p = e.broadcast_div(&sum)?;

    let rows = a.reps() * a.q_seq;
    let grouped = |t: &Tensor, n: usize| -> KResult<Tensor> {
        Ok(t.reshape((a.batch, a.kv_heads, rows, n))?)
    };
    let y = g.output(0)?;
    let y = if a.four_d {
        y.clone()
    } else {
        split_heads(y, a.q_heads)?
    };
    let dy = g.grad(cx, 0)?;
    let dy = if a.four_d {
        dy
    } else {
        split_heads(&dy, a.q_heads)?
    };
    let (y, dy) = (
        y.to_dtype(ct)?.contiguous()?,
        dy.to_dtype(ct)?.contiguous()?,
    );
    let (yg, dyg) = (grouped(&y, a.v_head)?, grouped(&dy, a.v_head)?);
    let pg = grouped(&p, a.total)?;
    let mut dv = pg.transpose(2, 3)?.contiguous()?.matmul(&dyg)?;
    let dp = dyg.matmul(&v.transpose(2, 3)?.contiguous()?)?;
    let dsum = (&dyg * &yg)?.sum_keepdim(D::Minus1)?;
    let mut ds = (&pg * dp.broadcast_sub(&dsum)?)?;
    if let Some(th) = th {
        ds = (ds * grouped(&th, a.total)?.sqr()?.affine(-1.0, 1.0)?)?;
    }
    let ds = ds.affine(a.scale, 0.0)?;
    let qg = grouped(&q, a.head)?;
    let dq = ds
        .matmul(&k)?
        .reshape((a.batch, a.q_heads, a.q_seq, a.head))?;
    let mut dk = ds.transpose(2, 3)?.contiguous()?.matmul(&qg)?;
    // Gradients reaching present_key / present_value.
    if want(cx, 1) {
        if let Some(t) = g.grads.get(1).and_then(|t| t.as_ref()) {
            dk = (dk + t.to_dtype(ct)?)?;
        }
    }
    if want(cx, 2) {
        if let Some(t) = g.grads.get(2).and_then(|t| t.as_ref()) {
            dv = (dv + t.to_dtype(ct)?)?;
        }
    }
    let kv_seq = a.total - a.past;
    let new_k = dk.narrow(2, a.past, kv_seq)?;
    let new_v = dv.narrow(2, a.past, kv_seq)?;
    let (dq, new_k, new_v) = if a.four_d {
        let nk = if a.key_transposed {
            new_k.transpose(2, 3)?.contiguous()?
        } else {
            new_k
        };
        (dq, nk, new_v)
    } else {
        (
            merge_heads(&dq)?,
            merge_heads(&new_k)?,
            merge_heads(&new_v)?,
        )
    };
    let mut out: Vec<Option<Tensor>> = vec![None; cx.inputs.len()];
    for (i, slot) in out.iter_mut().enumerate() {
        if !g.need(i) {
            continue;
        }
        let t = match i {
            0 => dq.clone(),
            1 => new_k.clone(),
            2 => new_v.clone(),
            4 => dk.narrow(2, 0, a.past)?,
            5 => dv.narrow(2, 0, a.past)?,
            _ => kbail!("input {i} of Attention takes no gradient"),
        };
        *slot = Some(t.to_dtype(dt)?);
    }
    Ok(out)
}

// ---------------------------------------------------------------------------------------
// RMSNormalization

fn rms_axis(cx: &KernelCtx) -> KResult<usize> {
    let rank = cx.input(0)?.shape.len();
    Ok(cx.axis(cx.attrs.int_or("axis", -1)?, rank)?)
}

/// The inverse RMS over the dims from `axis`, keepdim, in the compute type.
fn inv_rms(cx: &KernelCtx, x: &Tensor, axis: usize) -> KResult<Tensor> {
    let eps = cx.attrs.float_or("epsilon", 1e-5)? as f64;
    let axes: Vec<usize> = (axis..x.rank()).collect();
    Ok(x.sqr()?
        .mean_keepdim(axes)?
        .affine(1.0, eps)?
        .sqrt()?
        .recip()?)
}

fn rms_forward(cx: &KernelCtx, xs: &[Option<Tensor>], _: &Extras) -> KResult<Vec<Option<Tensor>>> {
    let x = xs.named(0, "X")?;
    let scale = xs.named(1, "scale")?;
    let axis = rms_axis(cx)?;
    let ct = compute_dtype(x.dtype());
    let xc = x.to_dtype(ct)?;
    let r = inv_rms(cx, &xc, axis)?;
    let y = xc
        .broadcast_mul(&r)?
        .broadcast_mul(&scale.to_dtype(ct)?)?
        .to_dtype(x.dtype())?;
    Ok(vec![Some(y)])
}

/// `stats`: the inverse RMS per row (f32); `normalized`: `X·rms⁻¹` in X's type, kept when
/// the scale takes a gradient (see the planner's rule).
fn rms_extra(cx: &KernelCtx, tag: &str, xs: &[Option<Tensor>]) -> KResult<Vec<Tensor>> {
    let x = xs.named(0, "X")?;
    let axis = rms_axis(cx)?;
    let xc = x.to_dtype(compute_dtype(x.dtype()))?;
    let r = inv_rms(cx, &xc, axis)?;
    match tag {
        "stats" => Ok(vec![r.flatten_all()?.to_dtype(DType::F32)?]),
        "normalized" => Ok(vec![xc.broadcast_mul(&r)?.to_dtype(x.dtype())?]),
        _ => kbail!("RMSNormalization has no extra value {tag:?}"),
    }
}

fn rms_backward(cx: &KernelCtx, g: &BwdArgs) -> KResult<Vec<Option<Tensor>>> {
    let x = g.input(0)?;
    let dt = x.dtype();
    let ct = compute_dtype(dt);
    let axis = rms_axis(cx)?;
    let mut kshape: Vec<usize> = x.dims().get(..axis).unwrap_or(&[]).to_vec();
    kshape.extend(std::iter::repeat_n(1, x.rank() - axis));
    let r = g
        .extra("stats")?
        .first()
        .ok_or_else(|| KernelError::new("the stats extra is empty"))?;
    if r.elem_count() != kshape.iter().product::<usize>() {
        kbail!(
            "the stats extra has {} values for the rows of {:?}",
            r.elem_count(),
            x.dims()
        );
    }
    let r = r.to_dtype(ct)?.reshape(kshape)?;
    let dy = g.grad(cx, 0)?.to_dtype(ct)?;
    // In the compute type; the scale's gradient reads the kept normalized value when there is
    // one (X's type, as PyTorch keeps it).
    let xh = x.to_dtype(ct)?.broadcast_mul(&r)?;
    let mut out: Vec<Option<Tensor>> = vec![None; cx.inputs.len()];
    if g.need(1) {
        let sshape = cx.in_shape(1)?;
        let kept = match g.extras.get("normalized").and_then(|v| v.first()) {
            Some(k) if k.dims() == x.dims() => Some(k.to_dtype(ct)?),
            Some(k) => kbail!(
                "the normalized extra has shape {:?}, X {:?}",
                k.dims(),
                x.dims()
            ),
            None => None,
        };
        let ds = sum_to(&(&dy * kept.as_ref().unwrap_or(&xh))?, &sshape)?;
        if let Some(s) = out.get_mut(1) {
            *s = Some(ds.to_dtype(dt)?);
        }
    }
    if g.need(0) {
        let scale = g.input(1)?.to_dtype(ct)?;
        let gs = dy.broadcast_mul(&scale)?;
        let axes: Vec<usize> = (axis..x.rank()).collect();
        let m = (&gs * &xh)?.mean_keepdim(axes)?;
        let dx = gs.sub(&xh.broadcast_mul(&m)?)?.broadcast_mul(&r)?;
        if let Some(s) = out.get_mut(0) {
            *s = Some(dx.to_dtype(dt)?);
        }
    }
    Ok(out)
}

// ---------------------------------------------------------------------------------------
// RotaryEmbedding

/// Rotates `x` (its original layout) with `cos` and `sin` caches; `sign` = -1 applies the
/// inverse rotation (the backward).
fn rotary(
    cx: &KernelCtx,
    x: &Tensor,
    cos: &Tensor,
    sin: &Tensor,
    pos: Option<&Tensor>,
    sign: f64,
) -> KResult<Tensor> {
    let dims = x.dims().to_vec();
    // [batch, seq, heads, head]
    let xs = match dims.len() {
        4 => x.transpose(1, 2)?.contiguous()?,
        3 => {
            let heads = match cx.attrs.int("num_heads")? {
                Some(h) if h > 0 => h as usize,
                h => kbail!("attribute \"num_heads\" = {h:?} is not supported for 3-D input"),
            };
            let (b, s, hidden) = x.dims3()?;
            x.reshape((b, s, heads, hidden / heads))?
        }
        r => kbail!("X must be 3-D or 4-D, got rank {r}"),
    };
    let (b, s, _, head) = xs.dims4()?;
    let rot = match cx.attrs.int_or("rotary_embedding_dim", 0)? {
        0 => head,
        d if d > 0 && (d as usize) <= head && d % 2 == 0 => d as usize,
        d => {
            kbail!("attribute \"rotary_embedding_dim\" = {d} is not supported for head size {head}")
        }
    };
    let half = rot / 2;
    let interleaved = cx.attrs.int_or("interleaved", 0)? != 0;
    let ct = compute_dtype(x.dtype());
    let (cos, sin) = match pos {
        Some(p) => {
            let idx = p.to_dtype(DType::I64)?.flatten_all()?;
            let n = cos.dim(0)?;
            let max = idx.max_all()?.to_scalar::<i64>()?;
            let min = idx.min_all()?.to_scalar::<i64>()?;
            if min < 0 || max as usize >= n {
                kbail!("position_ids in [{min}, {max}] fall outside the {n} cached positions");
            }
            (
                cos.index_select(&idx, 0)?.reshape((b, s, ()))?,
                sin.index_select(&idx, 0)?.reshape((b, s, ()))?,
            )
        }
        None if cos.rank() == 2 => (cos.unsqueeze(0)?, sin.unsqueeze(0)?),
        None => (cos.clone(), sin.clone()),
    };
    if cos.dim(D::Minus1)? != half || sin.dim(D::Minus1)? != half {
        kbail!(
            "cos/sin caches have {} values per position, expected {half}",
            cos.dim(D::Minus1)?
        );
    }
    // [batch, seq, 1, half]
    let cos = cos.to_dtype(ct)?.unsqueeze(2)?;
    let sin = sin.to_dtype(ct)?.affine(sign, 0.0)?.unsqueeze(2)?;
    let xc = xs.to_dtype(ct)?;
    let xr = xc.narrow(3, 0, rot)?;
    let (x1, x2) = if interleaved {
        let p = xr.reshape((b, s, (), half, 2))?;
        (
            p.narrow(4, 0, 1)?.squeeze(4)?,
            p.narrow(4, 1, 1)?.squeeze(4)?,
        )
    } else {
        (xr.narrow(3, 0, half)?, xr.narrow(3, half, half)?)
    };
    let re = (x1.broadcast_mul(&cos)? - x2.broadcast_mul(&sin)?)?;
    let im = (x1.broadcast_mul(&sin)? + x2.broadcast_mul(&cos)?)?;
    let rotated = if interleaved {
        Tensor::stack(&[&re, &im], 4)?.reshape(xr.dims())?
    } else {
        Tensor::cat(&[&re, &im], 3)?
    };
    let full = if rot < head {
        Tensor::cat(&[&rotated, &xc.narrow(3, rot, head - rot)?], 3)?
    } else {
        rotated
    };
    let out = if dims.len() == 4 {
        full.transpose(1, 2)?.contiguous()?
    } else {
        full.reshape(dims)?
    };
    Ok(out.to_dtype(x.dtype())?)
}

fn rotary_forward(
    cx: &KernelCtx,
    xs: &[Option<Tensor>],
    _: &Extras,
) -> KResult<Vec<Option<Tensor>>> {
    let y = rotary(
        cx,
        xs.named(0, "X")?,
        xs.named(1, "cos_cache")?,
        xs.named(2, "sin_cache")?,
        xs.opt(3),
        1.0,
    )?;
    Ok(vec![Some(y)])
}

fn rotary_backward(cx: &KernelCtx, g: &BwdArgs) -> KResult<Vec<Option<Tensor>>> {
    let mut out: Vec<Option<Tensor>> = vec![None; cx.inputs.len()];
    if g.need(0) {
        let pos = if cx.opt(3).is_some() {
            Some(g.input(3)?)
        } else {
            None
        };
        let dy = g.grad(cx, 0)?;
        let dx = rotary(cx, &dy, g.input(1)?, g.input(2)?, pos, -1.0)?;
        let want = to_candle(cx.input(0)?.dtype)?;
        if let Some(s) = out.get_mut(0) {
            *s = Some(dx.to_dtype(want)?);
        }
    }
    Ok(out)
}

pub fn register(r: &mut KernelRegistry) {
    r.insert(
        "Attention",
        Kernel {
            forward: attention_forward,
            extra: Some(attention_extra),
            backward: Some(attention_backward),
        },
    );
    r.insert(
        "RMSNormalization",
        Kernel {
            forward: rms_forward,
            extra: Some(rms_extra),
            backward: Some(rms_backward),
        },
    );
    r.insert(
        "RotaryEmbedding",
        Kernel::new(rotary_forward, Some(rotary_backward)),
    );
}

#[cfg(test)]
mod tests {
    use crate::kernel::{Extras, KResult, KernelCtx, KernelError};
    use crate::testing::{check, float, int, Case, In};
    use candle_core::{Device, Tensor};
    use remat_planner::onnx::Attrs;
    use remat_planner::ops::{registry as op_registry, Ctx};
    use remat_planner::tensor::{DType, Fact};

    use crate::testing::tensors::{close, forward, same_in, seq, t, vals};

    /// Attention by the ONNX reference's definition, one score at a time.
    #[test]
    fn attention_matches_a_naive_reference() {
        let (b, qh, kvh, sq, past, kv, d) = (1, 4, 2, 3, 2, 3, 2);
        let total = past + kv;
        let q = seq(b * qh * sq * d, 0.7, 0.1);
        let k = seq(b * kvh * kv * d, 0.3, 0.5);
        let v = seq(b * kvh * kv * d, 0.9, 0.2);
        let pk = seq(b * kvh * past * d, 0.4, 1.0);
        let pv = seq(b * kvh * past * d, 0.6, 2.0);
        let mask = seq(sq * total, 1.3, 0.0);
        let scale = 0.7f32 as f64;
        let ys = forward(
            "Attention",
            23,
            &[int("is_causal", 1), float("scale", scale as f32)],
            &[
                Some(t(&q, &[b, qh, sq, d])),
                Some(t(&k, &[b, kvh, kv, d])),
                Some(t(&v, &[b, kvh, kv, d])),
                Some(t(&mask, &[sq, total])),
                Some(t(&pk, &[b, kvh, past, d])),
                Some(t(&pv, &[b, kvh, past, d])),
            ],
            &[],
            3,
        )
        .unwrap();
        let key = |h: usize, j: usize, c: usize| {
            if j < past {
                pk[(h * past + j) * d + c]
            } else {
                k[(h * kv + j - past) * d + c]
            }
        };
        let val = |h: usize, j: usize, c: usize| {
            if j < past {
                pv[(h * past + j) * d + c]
            } else {
                v[(h * kv + j - past) * d + c]
            }
        };
        let mut want = vec![];
        for h in 0..qh {
            let kh = h / (qh / kvh);
            for i in 0..sq {
                let mut s = vec![];
                for j in 0..total {
                    let dot: f64 = (0..d)
                        .map(|c| q[(h * sq + i) * d + c] * key(kh, j, c))
                        .sum();
                    let causal = if j > i + past { f64::NEG_INFINITY } else { 0.0 };
                    s.push(dot * scale + mask[i * total + j] + causal);
                }
                let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let e: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
                let z: f64 = e.iter().sum();
                for c in 0..d {
                    want.push((0..total).map(|j| e[j] / z * val(kh, j, c)).sum::<f64>());
                }
            }
        }
        close(&vals(&ys[0]), &want, 1e-12);
        // present_key is past then new keys.
        let pres: Vec<f64> = (0..kvh)
            .flat_map(|h| (0..total).flat_map(move |j| (0..d).map(move |c| (h, j, c))))
            .map(|(h, j, c)| key(h, j, c))
            .collect();
        close(&vals(&ys[1]), &pres, 0.0);
    }

    /// Rotary embedding by the ONNX reference's definition.
    #[test]
    fn rotary_matches_a_naive_reference() {
        let (b, h, s, d) = (1, 2, 3, 4);
        let x = seq(b * h * s * d, 0.5, 0.3);
        let cos = seq(b * s * d / 2, 0.8, 1.0);
        let sin = seq(b * s * d / 2, 0.2, 0.4);
        for interleaved in [0, 1] {
            let y = forward(
                "RotaryEmbedding",
                23,
                &[int("interleaved", interleaved)],
                &[
                    Some(t(&x, &[b, h, s, d])),
                    Some(t(&cos, &[b, s, d / 2])),
                    Some(t(&sin, &[b, s, d / 2])),
                ],
                &[],
                1,
            )
            .unwrap();
            let mut want = vec![0.0; x.len()];
            for hh in 0..h {
                for p in 0..s {
                    let base = (hh * s + p) * d;
                    for c in 0..d / 2 {
                        let (i1, i2) = if interleaved == 1 {
                            (base + 2 * c, base + 2 * c + 1)
                        } else {
                            (base + c, base + c + d / 2)
                        };
                        let (co, si) = (cos[p * d / 2 + c], sin[p * d / 2 + c]);
                        want[i1] = co * x[i1] - si * x[i2];
                        want[i2] = si * x[i1] + co * x[i2];
                    }
                }
            }
            close(&vals(&y[0]), &want, 1e-12);
        }
    }

    #[test]
    fn attention_4d_default_scale() {
        check(&Case::new(
            "Attention",
            23,
            vec![
                In::Rand(vec![2, 2, 3, 4]),
                In::Rand(vec![2, 2, 5, 4]),
                In::Rand(vec![2, 2, 5, 3]),
            ],
        ));
    }

    #[test]
    fn attention_grouped_causal_scaled_3d() {
        check(
            &Case::new(
                "Attention",
                23,
                vec![
                    In::Rand(vec![2, 4, 8]),
                    In::Rand(vec![2, 4, 4]),
                    In::Rand(vec![2, 4, 6]),
                ],
            )
            .attr(int("q_num_heads", 4))
            .attr(int("kv_num_heads", 2))
            .attr(int("is_causal", 1))
            .attr(float("scale", 0.3)),
        );
    }

    #[test]
    fn attention_bool_and_additive_masks() {
        // A boolean mask [q seq, total] with one fully masked row, shorter than the keys.
        let mut m = vec![1i64; 3 * 4];
        m[4..8].copy_from_slice(&[0, 0, 0, 0]);
        m[9] = 0;
        check(&Case::new(
            "Attention",
            23,
            vec![
                In::Rand(vec![1, 2, 3, 4]),
                In::Rand(vec![1, 2, 5, 4]),
                In::Rand(vec![1, 2, 5, 4]),
                In::Ints(DType::Bool, vec![3, 4], m),
            ],
        ));
        // An additive float mask broadcast over heads.
        check(
            &Case::new(
                "Attention",
                23,
                vec![
                    In::Rand(vec![2, 2, 3, 4]),
                    In::Rand(vec![2, 2, 5, 4]),
                    In::Rand(vec![2, 2, 5, 4]),
                    In::Const(
                        DType::F32,
                        vec![2, 1, 3, 5],
                        (0..30).map(|i| (i % 7) as f64 * -0.5).collect(),
                    ),
                ],
            )
            .attr(int("is_causal", 1)),
        );
    }

    #[test]
    fn attention_past_softcap_and_present_outputs() {
        check(
            &Case::new(
                "Attention",
                23,
                vec![
                    In::Rand(vec![1, 4, 2, 4]),
                    In::Rand(vec![1, 2, 3, 4]),
                    In::Rand(vec![1, 2, 3, 4]),
                    In::None,
                    In::Rand(vec![1, 2, 2, 4]),
                    In::Rand(vec![1, 2, 2, 4]),
                ],
            )
            .attr(int("is_causal", 1))
            .attr(float("softcap", 2.0))
            .outputs(4),
        );
    }

    #[test]
    fn attention_fused_key_transposed() {
        check(
            &Case::new(
                "Attention",
                17,
                vec![
                    In::Rand(vec![2, 2, 3, 4]),
                    In::Rand(vec![2, 2, 4, 5]),
                    In::Rand(vec![2, 2, 5, 4]),
                    In::Rand(vec![2, 2, 3, 5]),
                ],
            )
            .attr(int(remat_planner::ops::attention::KEY_TRANSPOSED, 1))
            .attr(float("scale", 0.25)),
        );
    }

    #[test]
    fn rms_normalization() {
        check(&Case::new(
            "RMSNormalization",
            23,
            vec![In::Rand(vec![2, 3, 4]), In::Param(vec![4])],
        ));
        check(
            &Case::new(
                "RMSNormalization",
                23,
                vec![In::Rand(vec![2, 3, 4]), In::Param(vec![3, 1])],
            )
            .attr(int("axis", 1))
            .attr(float("epsilon", 1e-3)),
        );
    }

    #[test]
    fn rotary_embedding() {
        // 4-D input, caches per batch and position, half split.
        check(&Case::new(
            "RotaryEmbedding",
            23,
            vec![
                In::Rand(vec![2, 2, 3, 4]),
                In::Rand(vec![2, 3, 2]),
                In::Rand(vec![2, 3, 2]),
            ],
        ));
        // 3-D input, interleaved, partial rotation, cached positions looked up by id.
        check(
            &Case::new(
                "RotaryEmbedding",
                23,
                vec![
                    In::Rand(vec![2, 3, 12]),
                    In::Const(
                        DType::F32,
                        vec![5, 2],
                        (0..10).map(|i| (i as f64 * 0.3).cos()).collect(),
                    ),
                    In::Const(
                        DType::F32,
                        vec![5, 2],
                        (0..10).map(|i| (i as f64 * 0.3).sin()).collect(),
                    ),
                    In::Ints(DType::I64, vec![2, 3], vec![0, 1, 2, 4, 3, 1]),
                ],
            )
            .attr(int("num_heads", 2))
            .attr(int("interleaved", 1))
            .attr(int("rotary_embedding_dim", 4)),
        );
    }

    #[test]
    fn f32_and_f16_agree_with_f64() {
        use candle_core::DType as C;
        let r = |n: usize, a: f64, shape: &[usize]| Some(t(&seq(n, a, 0.3), shape));
        let mask = Tensor::from_vec(
            vec![1u8, 1, 0, 1, 1, 1, 0, 0, 1, 1, 1, 1],
            (3, 4),
            &Device::Cpu,
        )
        .unwrap();
        let attn = [
            r(2 * 4 * 3 * 4, 0.7, &[2, 4, 3, 4]),
            r(2 * 2 * 4 * 4, 0.3, &[2, 2, 4, 4]),
            r(2 * 2 * 4 * 2, 0.9, &[2, 2, 4, 2]),
            Some(mask),
        ];
        for (dt, tol) in [(C::F32, 1e-4), (C::F16, 2e-2)] {
            same_in(
                "Attention",
                23,
                &[int("is_causal", 1)],
                &attn,
                &[],
                1,
                dt,
                tol,
            );
            same_in(
                "RMSNormalization",
                23,
                &[],
                &[r(24, 0.4, &[2, 3, 4]), r(4, 0.8, &[4])],
                &[],
                1,
                dt,
                tol,
            );
            same_in(
                "RotaryEmbedding",
                23,
                &[],
                &[
                    r(24, 0.4, &[1, 2, 3, 4]),
                    r(6, 0.8, &[1, 3, 2]),
                    r(6, 0.2, &[1, 3, 2]),
                ],
                &[],
                1,
                dt,
                tol,
            );
        }
    }

    /// Every node of these families in the exported fixture models runs through its
    /// kernels at the manifest's dims: extras of the declared bytes, outputs of the
    /// inferred shapes and types, and a backward from what the gradient rule saves.
    #[test]
    fn fixture_nodes_of_these_families_run() {
        use crate::kernel::{to_candle, BwdArgs, Rng};
        use remat_planner::model::ValueKind;
        use remat_planner::ops::Saved;
        const OPS: &[&str] = &[
            "LSTM",
            "GRU",
            "RNN",
            "Attention",
            "RMSNormalization",
            "RotaryEmbedding",
            "STFT",
            "DFT",
            "HannWindow",
            "HammingWindow",
            "BlackmanWindow",
            "MelWeightMatrix",
            "LpPool",
            "GlobalLpPool",
            "MaxUnpool",
            "RoiAlign",
            "Col2Im",
            "CenterCropPad",
            "AffineGrid",
            "SoftmaxCrossEntropyLoss",
            "NegativeLogLikelihoodLoss",
        ];
        let models: &[(&str, &[(&str, u64)])] = &[
            ("crnn_gru.legacy13.onnx", &[("batch", 2), ("width", 128)]),
            ("crnn_lstm.dynamo18.onnx", &[("batch", 2), ("width", 128)]),
            ("crnn_lstm.legacy11.onnx", &[("batch", 2), ("width", 128)]),
            ("crnn_lstm.legacy14.onnx", &[("batch", 2), ("width", 128)]),
            ("gpt2_sdpa.dynamo18.onnx", &[("batch", 2), ("seq", 32)]),
            ("gpt2_sdpa.dynamo23.onnx", &[("batch", 2), ("seq", 32)]),
            ("gpt2_sdpa.legacy14.onnx", &[("batch", 2), ("seq", 32)]),
            ("gpt2_sdpa.legacy18.onnx", &[("batch", 2), ("seq", 32)]),
            ("llama.dynamo18.onnx", &[("batch", 2), ("seq", 32)]),
            ("llama.dynamo23.onnx", &[("batch", 2), ("seq", 32)]),
            ("llama.legacy17.onnx", &[("batch", 2), ("seq", 32)]),
            ("logmel_cnn.dynamo18.onnx", &[("batch", 2)]),
            ("logmel_cnn.legacy17.onnx", &[("batch", 2)]),
            ("paddle_ocr_like.opset11.onnx", &[("x:0", 2), ("x:3", 128)]),
        ];
        let dev = Device::Cpu;
        let mut rng = Rng::new(3);
        let mut ran: Vec<String> = vec![];
        let mut failures: Vec<String> = vec![];
        for (file, dims) in models {
            let dir = std::env::var_os("CARGO_MANIFEST_DIR")
                .unwrap_or_else(|| env!("CARGO_MANIFEST_DIR").into());
            let path = std::path::Path::new(&dir)
                .join("../../fixtures/models/thirdparty")
                .join(file)
                .display()
                .to_string();
            let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
            let opts = remat_planner::ImportOptions {
                dims: dims.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
                ..Default::default()
            };
            let model =
                remat_planner::load(&bytes, &opts).unwrap_or_else(|e| panic!("{file}: {e}"));
            for n in model.graph.node_weights() {
                if n.folded || n.skipped || !OPS.contains(&n.op_type.as_str()) {
                    continue;
                }
                let op: &'static str = OPS.iter().copied().find(|o| *o == n.op_type).unwrap_or("");
                let res = (|| -> KResult<()> {
                    let fact_of = |v: &Option<usize>| v.and_then(|v| model.values[v].fact.clone());
                    let facts: Vec<Option<Fact>> = n.inputs.iter().map(fact_of).collect();
                    let out_facts: Vec<Option<Fact>> = n.outputs.iter().map(fact_of).collect();
                    let mut values: Vec<Option<Tensor>> = vec![];
                    let mut visible: Vec<bool> = vec![];
                    for (slot, (v, f)) in n.inputs.iter().zip(&facts).enumerate() {
                        let Some(f) = f else {
                            values.push(None);
                            visible.push(false);
                            continue;
                        };
                        let shape: Vec<usize> = f.shape.iter().map(|&d| d as usize).collect();
                        let count: usize = shape.iter().product();
                        let t = match &f.value {
                            Some(c) => crate::value::from_planner(c, &dev)?,
                            None if f.dtype.is_float() => {
                                let v: Vec<f64> =
                                    (0..count).map(|_| rng.uniform(-1.0, 1.0)).collect();
                                Tensor::from_vec(v, shape.clone(), &dev)?
                                    .to_dtype(to_candle(f.dtype)?)?
                            }
                            None => {
                                // Full sequence lengths, valid positions and labels, "attend" masks.
                                let fill = match (op, slot) {
                                    ("LSTM" | "GRU" | "RNN", 4) => facts[0]
                                        .as_ref()
                                        .and_then(|x| x.shape.first().copied())
                                        .unwrap_or(0)
                                        as i64,
                                    _ if f.dtype == DType::Bool => 1,
                                    _ => 0,
                                };
                                Tensor::from_vec(vec![fill; count], shape.clone(), &dev)?
                                    .to_dtype(to_candle(f.dtype)?)?
                            }
                        };
                        values.push(Some(t));
                        let kind = v.map(|v| model.values[v].kind);
                        visible.push(
                            f.value.is_some()
                                || !matches!(kind, Some(ValueKind::Data | ValueKind::Activation)),
                        );
                    }
                    let attrs = Attrs {
                        node: &n.name,
                        op,
                        list: &n.attrs,
                    };
                    let spec = op_registry()
                        .get(op)
                        .ok_or_else(|| KernelError::new("no shape rule"))?;
                    let scx = Ctx {
                        node: &n.name,
                        op,
                        opset: n.opset,
                        attrs: Attrs { ..attrs },
                        inputs: &facts,
                        n_outputs: n.outputs.len(),
                    };
                    let outs: Vec<Fact> = out_facts.iter().flatten().cloned().collect();
                    let needs: Vec<bool> = (0..facts.len())
                        .map(|i| {
                            facts[i]
                                .as_ref()
                                .is_some_and(|f| f.dtype.is_float() && f.value.is_none())
                                && (spec.diff_in)(&scx, i)
                        })
                        .collect();
                    let rule = (spec.grad)(&scx, &outs, &needs);
                    let cx = KernelCtx {
                        rule: Ctx {
                            node: &n.name,
                            op,
                            opset: n.opset,
                            attrs,
                            inputs: &facts,
                            n_outputs: out_facts.len(),
                        },
                        outputs: &out_facts,
                        device: &dev,
                        seed: 5,
                    };
                    let kernel = crate::kernels::registry()
                        .get(op)
                        .ok_or_else(|| KernelError::new("no kernel"))?;
                    let mut extras = Extras::new();
                    for sv in &rule.saved {
                        if let Saved::Extra { tag, bytes, .. } = sv {
                            let f = kernel
                                .extra
                                .ok_or_else(|| KernelError::new("no extra function"))?;
                            let e = f(&cx, tag, &values)?;
                            let got: usize = e
                                .iter()
                                .map(|t| t.elem_count() * t.dtype().size_in_bytes())
                                .sum();
                            if got as u64 != *bytes {
                                return Err(KernelError::new(format!(
                                    "extra {tag} holds {got} bytes, the rule {bytes}"
                                )));
                            }
                            extras.insert(tag.to_string(), e);
                        }
                    }
                    let y = (kernel.forward)(&cx, &values, &extras)?;
                    let mut seeds = vec![];
                    for (k, (t, f)) in y.iter().zip(&out_facts).enumerate() {
                        match (t, f) {
                            (Some(t), Some(f)) => {
                                let want: Vec<usize> =
                                    f.shape.iter().map(|&d| d as usize).collect();
                                if t.dims() != want.as_slice() || t.dtype() != to_candle(f.dtype)? {
                                    return Err(KernelError::new(format!(
                                        "output {k} is {:?} {:?}, the fact {want:?} {:?}",
                                        t.dims(),
                                        t.dtype(),
                                        f.dtype
                                    )));
                                }
                                seeds.push(
                                    (f.dtype.is_float() && (spec.diff_out)(&scx, k))
                                        .then(|| t.ones_like())
                                        .transpose()?,
                                );
                            }
                            (None, None) => seeds.push(None),
                            _ => {
                                return Err(KernelError::new(format!(
                                    "output {k} presence differs from the graph"
                                )))
                            }
                        }
                    }
                    if let (Some(bwd), true) = (kernel.backward, needs.iter().any(|&b| b)) {
                        let mut bin: Vec<Option<Tensor>> = values
                            .iter()
                            .zip(&visible)
                            .map(|(v, &vis)| if vis { v.clone() } else { None })
                            .collect();
                        let mut bout: Vec<Option<Tensor>> = vec![None; y.len()];
                        for sv in &rule.saved {
                            match sv {
                                Saved::Input(i) => bin[*i] = values.get(*i).cloned().flatten(),
                                Saved::Output(k) => bout[*k] = y.get(*k).cloned().flatten(),
                                Saved::Extra { .. } => {}
                            }
                        }
                        let g = bwd(
                            &cx,
                            &BwdArgs {
                                inputs: &bin,
                                outputs: &bout,
                                extras: &extras,
                                grads: &seeds,
                                needs: &needs,
                            },
                        )?;
                        for (i, need) in needs.iter().enumerate() {
                            let got = g.get(i).cloned().flatten();
                            match (need, got, &values[i]) {
                                (true, Some(t), Some(x))
                                    if t.dims() == x.dims() && t.dtype() == x.dtype() => {}
                                (false, None, _) => {}
                                (_, t, _) => {
                                    return Err(KernelError::new(format!(
                                        "gradient {i}: needed {need}, got {:?}",
                                        t.map(|t| (t.dims().to_vec(), t.dtype()))
                                    )))
                                }
                            }
                        }
                    }
                    Ok(())
                })();
                // The gradients of the node's configuration against finite differences
                // (in f64, the harness's inputs at the node's shapes), once per op and model.
                let res = res.and_then(|()| {
                    if ran.iter().any(|r| *r == format!("{file}:{op}")) {
                        return Ok(());
                    }
                    let mut inputs = vec![];
                    for (slot, v) in n.inputs.iter().enumerate() {
                        let f = v.and_then(|v| model.values[v].fact.clone());
                        let kind = v.map(|v| model.values[v].kind);
                        inputs.push(match f {
                            None => In::None,
                            Some(f) => {
                                let shape: Vec<usize> =
                                    f.shape.iter().map(|&d| d as usize).collect();
                                let count: usize = shape.iter().product();
                                match &f.value {
                                    Some(c) => In::Const(f.dtype, shape, c.as_f64()),
                                    // Parameters and values derived from them only are resident.
                                    None if f.dtype.is_float()
                                        && matches!(
                                            kind,
                                            Some(ValueKind::Param | ValueKind::Derived)
                                        ) =>
                                    {
                                        In::Param(shape)
                                    }
                                    None if f.dtype.is_float() => In::Rand(shape),
                                    None => {
                                        let fill = match (op, slot) {
                                            ("LSTM" | "GRU" | "RNN", 4) => n.inputs[0]
                                                .and_then(|x| model.values[x].fact.as_ref())
                                                .and_then(|x| x.shape.first().copied())
                                                .unwrap_or(0)
                                                as i64,
                                            _ if f.dtype == DType::Bool => 1,
                                            _ => 0,
                                        };
                                        In::Ints(f.dtype, shape, vec![fill; count])
                                    }
                                }
                            }
                        });
                    }
                    let mut case = Case::new(op, n.opset, inputs).outputs(n.outputs.len());
                    case.attrs = n.attrs.clone();
                    case.samples = 12;
                    crate::testing::check_on(&case, &dev)
                });
                match res {
                    Ok(()) => ran.push(format!("{file}:{op}")),
                    Err(e) => failures.push(format!(
                        "{file}: {} ({op}): {e}; input kinds {:?}",
                        n.name,
                        n.inputs
                            .iter()
                            .map(|v| v.map(|v| (
                                model.values[v].kind,
                                model.values[v]
                                    .producer
                                    .map(|(p, _)| model.graph[p].op_type.clone())
                            )))
                            .collect::<Vec<_>>()
                    )),
                }
            }
        }
        assert!(failures.is_empty(), "{}", failures.join("\n"));
        for op in [
            "LSTM",
            "GRU",
            "Attention",
            "STFT",
            "RMSNormalization",
            "RotaryEmbedding",
        ] {
            assert!(
                ran.iter().any(|r| r.ends_with(&format!(":{op}"))),
                "no fixture node of {op} ran: {ran:?}"
            );
        }
    }
}
