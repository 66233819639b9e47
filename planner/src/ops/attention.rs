//! Transformer ops of opset 23: `Attention`, `RMSNormalization`, `RotaryEmbedding`.
//!
//! Saved tensors follow PyTorch's fused kernels, which is what an exporter's `Attention`
//! comes from (`scaled_dot_product_attention`): the backward of flash / memory-efficient
//! attention keeps q, k, v, the output and the per-row log-sum-exp (fp32), never the
//! probability matrix. `rms_norm` keeps its input and the per-row inverse RMS.
//! `RotaryEmbedding` is linear in x; its backward keeps only the cos/sin caches.

use super::rule::{first, Ctx, GradRule, OpSpec, Registry, Saved};
use crate::error::Result;
use crate::tensor::{bytes_of, prod_sat, DType, Fact};

/// Attribute the attention fusion (`crate::fuse`) sets on the `Attention` it writes: its K
/// input is kᵀ (`[batch, heads, head size, kv seq]`), as the exporters' decomposition has it.
pub const KEY_TRANSPOSED: &str = "remat.key_transposed";

struct Attn {
    batch: u64,
    q_heads: u64,
    kv_heads: u64,
    q_seq: u64,
    /// Past plus new key/value positions.
    total: u64,
    head: u64,
    v_head: u64,
    four_d: bool,
}

fn heads_attr(cx: &Ctx, name: &str) -> Result<u64> {
    match cx.attrs.int(name)? {
        Some(h) if h > 0 => Ok(h as u64),
        Some(h) => Err(cx.attrs.err(name, format!("must be positive, got {h}"))),
        None => Err(cx.attrs.err(
            name,
            "required when Q, K and V are 3-D [batch, seq, hidden]",
        )),
    }
}

fn split_heads(cx: &Ctx, what: &str, hidden: u64, heads: u64) -> Result<u64> {
    if !hidden.is_multiple_of(heads) {
        return Err(cx.err(format!(
            "{what} hidden size {hidden} is not a multiple of {heads} heads"
        )));
    }
    Ok(hidden / heads)
}

fn attn_dims(cx: &Ctx) -> Result<Attn> {
    let (q, k, v) = (cx.input(0)?, cx.input(1)?, cx.input(2)?);
    let four_d = match (q.rank(), k.rank(), v.rank()) {
        (4, 4, 4) => true,
        (3, 3, 3) => false,
        _ => {
            return Err(cx.err(format!(
                "Q, K and V must all be 3-D or all 4-D, got {:?}, {:?}, {:?}",
                q.shape, k.shape, v.shape
            )))
        }
    };
    let (batch, q_heads, kv_heads, q_seq, kv_seq, head, k_head, v_head) = if four_d {
        // The attention fusion passes kᵀ ([batch, heads, head size, kv seq]).
        let kt = cx.attrs.int_or(KEY_TRANSPOSED, 0)? != 0;
        let (k_seq, k_head) = if kt {
            (k.shape[3], k.shape[2])
        } else {
            (k.shape[2], k.shape[3])
        };
        if k_seq != v.shape[2] || k.shape[1] != v.shape[1] {
            return Err(cx.err(format!(
                "K {:?} and V {:?} differ in heads or sequence length",
                k.shape, v.shape
            )));
        }
        (
            q.shape[0], q.shape[1], k.shape[1], q.shape[2], k_seq, q.shape[3], k_head, v.shape[3],
        )
    } else {
        let qh = heads_attr(cx, "q_num_heads")?;
        let kvh = heads_attr(cx, "kv_num_heads")?;
        if k.shape[1] != v.shape[1] {
            return Err(cx.err(format!(
                "K {:?} and V {:?} differ in sequence length",
                k.shape, v.shape
            )));
        }
        (
            q.shape[0],
            qh,
            kvh,
            q.shape[1],
            k.shape[1],
            split_heads(cx, "Q", q.shape[2], qh)?,
            split_heads(cx, "K", k.shape[2], kvh)?,
            split_heads(cx, "V", v.shape[2], kvh)?,
        )
    };
    if k.shape[0] != batch || v.shape[0] != batch {
        return Err(cx.err(format!(
            "batch sizes differ: Q {:?}, K {:?}, V {:?}",
            q.shape, k.shape, v.shape
        )));
    }
    if head != k_head {
        return Err(cx.err(format!("Q head size {head} differs from K's {k_head}")));
    }
    if kv_heads == 0 || !q_heads.is_multiple_of(kv_heads) {
        return Err(cx.err(format!(
            "{q_heads} query heads are not a multiple of {kv_heads} key/value heads"
        )));
    }
    let past = match (cx.opt(4), cx.opt(5)) {
        (None, None) => 0,
        (Some(pk), Some(pv)) => {
            if pk.rank() != 4
                || pk.shape[..2] != [batch, kv_heads]
                || pk.shape[3] != head
                || pv.rank() != 4
                || pv.shape[..3] != pk.shape[..3]
                || pv.shape[3] != v_head
            {
                return Err(cx.err(format!(
                    "past_key {:?} / past_value {:?} do not match batch {batch}, {kv_heads} heads, head sizes {head}/{v_head}",
                    pk.shape, pv.shape
                )));
            }
            pk.shape[2]
        }
        _ => return Err(cx.err("past_key and past_value must be given together")),
    };
    Ok(Attn {
        batch,
        q_heads,
        kv_heads,
        q_seq,
        total: past.saturating_add(kv_seq),
        head,
        v_head,
        four_d,
    })
}

fn attention_infer(cx: &Ctx) -> Result<Vec<Fact>> {
    let a = attn_dims(cx)?;
    let dt = cx.input(0)?.dtype;
    let y = if a.four_d {
        vec![a.batch, a.q_heads, a.q_seq, a.v_head]
    } else {
        vec![a.batch, a.q_seq, a.q_heads.saturating_mul(a.v_head)]
    };
    let mut out = vec![cx.fact(dt, y)?];
    if cx.n_outputs > 1 {
        out.push(cx.fact(dt, vec![a.batch, a.kv_heads, a.total, a.head])?);
    }
    if cx.n_outputs > 2 {
        out.push(cx.fact(dt, vec![a.batch, a.kv_heads, a.total, a.v_head])?);
    }
    if cx.n_outputs > 3 {
        out.push(cx.fact(dt, vec![a.batch, a.q_heads, a.q_seq, a.total])?);
    }
    Ok(out)
}

fn attention_flops(cx: &Ctx, _: &[Fact]) -> f64 {
    attn_dims(cx)
        .map(|a| {
            let rows = a.batch as f64 * a.q_heads as f64 * a.q_seq as f64 * a.total as f64;
            2.0 * rows * (a.head + a.v_head) as f64 + 5.0 * rows
        })
        .unwrap_or(0.0)
}

fn attention_grad(cx: &Ctx, _: &[Fact], _: &[bool]) -> GradRule {
    let lse = attn_dims(cx)
        .map(|a| prod_sat(&[a.batch, a.q_heads, a.q_seq]))
        .unwrap_or(0);
    let mut saved = vec![
        Saved::Input(0),
        Saved::Input(1),
        Saved::Input(2),
        Saved::Output(0),
        Saved::Extra {
            tag: "stats",
            bytes: bytes_of(DType::F32, lse),
            cost: 0.0,
        },
    ];
    // The backward rebuilds the probabilities, so it needs the mask (PyTorch's fused
    // kernels keep `attn_bias`) and the past keys and values that the scores cover.
    for i in 3..6 {
        if cx.opt(i).is_some() {
            saved.push(Saved::Input(i));
        }
    }
    GradRule::saves(saved, 2.5)
}

fn rms_axis(cx: &Ctx) -> Result<usize> {
    let x = cx.input(0)?;
    cx.axis(cx.attrs.int_or("axis", -1)?, x.rank())
}

fn rms_infer(cx: &Ctx) -> Result<Vec<Fact>> {
    let x = cx.input(0)?;
    let axis = rms_axis(cx)?;
    cx.input(1)?;
    cx.expect_broadcast_to(1, "scale", &x.shape[axis..], "the normalized dims")?;
    Ok(vec![Fact::new(x.dtype, x.shape.clone())])
}

/// Keeps X and the inverse RMS per row; and, when the scale takes a gradient, the normalized
/// `X·rms⁻¹` that its gradient multiplies (in X's type), as PyTorch does: `F.rms_norm` on CPU
/// and the eager RMSNorm of Llama-style models are `x·rsqrt(mean(x²)+ε)·weight`, whose last
/// multiplication saves the normalized tensor for the weight's gradient (the Llama fixture
/// through the opset 23 exporter was 12.9% under PyTorch's figure without it).
fn rms_grad(cx: &Ctx, _: &[Fact], needs: &[bool]) -> GradRule {
    let rows = match (cx.opt(0), rms_axis(cx)) {
        (Some(x), Ok(axis)) => prod_sat(&x.shape[..axis]),
        _ => 1,
    };
    let mut saved = vec![
        Saved::Input(0),
        Saved::Extra {
            tag: "stats",
            bytes: bytes_of(DType::F32, rows),
            cost: 2.0 * cx.in_numel(0),
        },
    ];
    if needs.get(1).copied().unwrap_or(false) {
        if let Some(x) = cx.opt(0) {
            saved.push(Saved::Extra {
                tag: "normalized",
                bytes: bytes_of(x.dtype, prod_sat(&x.shape)),
                cost: 3.0 * cx.in_numel(0),
            });
        }
    }
    GradRule::saves(saved, 2.0)
}

fn rotary_infer(cx: &Ctx) -> Result<Vec<Fact>> {
    let x = cx.input(0)?;
    if x.rank() != 3 && x.rank() != 4 {
        return Err(cx.err(format!(
            "X must be [batch, seq, hidden] or [batch, heads, seq, head], got {:?}",
            x.shape
        )));
    }
    if x.rank() == 3 {
        let heads = heads_attr(cx, "num_heads")?;
        split_heads(cx, "X", x.shape[2], heads)?;
    }
    for (i, what) in [(1, "cos_cache"), (2, "sin_cache")] {
        let c = cx
            .input(i)
            .map_err(|_| cx.err(format!("{what} (input {i}) is required")))?;
        if c.rank() != 2 && c.rank() != 3 {
            return Err(cx.err(format!("{what} must be 2-D or 3-D, got {:?}", c.shape)));
        }
    }
    Ok(vec![Fact::new(x.dtype, x.shape.clone())])
}

pub fn register(r: &mut Registry) {
    r.insert(
        "Attention",
        OpSpec {
            infer: attention_infer,
            flops: attention_flops,
            // Q, K, V and the past states; the mask takes no gradient.
            diff_in: |_, i| i != 3,
            diff_out: |_, i| i < 3,
            grad: attention_grad,
            ..OpSpec::DEFAULT
        },
    );
    r.insert(
        "RMSNormalization",
        OpSpec {
            infer: rms_infer,
            flops: |cx, _| 4.0 * cx.in_numel(0),
            diff_in: |_, i| i < 2,
            diff_out: first,
            grad: rms_grad,
            ..OpSpec::DEFAULT
        },
    );
    r.insert(
        "RotaryEmbedding",
        OpSpec {
            infer: rotary_infer,
            flops: |cx, _| 3.0 * cx.in_numel(0),
            diff_in: first,
            // The cos/sin caches, and the position ids that index them.
            grad: |cx, _, _| {
                let mut saved = vec![Saved::Input(1), Saved::Input(2)];
                if cx.opt(3).is_some() {
                    saved.push(Saved::Input(3));
                }
                GradRule::saves(saved, 1.0)
            },
            ..OpSpec::DEFAULT
        },
    );
}
