//! Recurrent ops: LSTM, GRU and RNN (ONNX layouts 0 and 1, all directions).

use super::rule::{Ctx, GradRule, OpSpec, Registry, Saved};
use crate::error::Result;
use crate::tensor::{bytes_of, Fact};

struct Dims {
    seq: u64,
    batch: u64,
    input: u64,
    hidden: u64,
    dirs: u64,
    layout: i64,
}

fn gates(op: &str) -> u64 {
    match op {
        "LSTM" => 4,
        "GRU" => 3,
        _ => 1,
    }
}

fn dims(cx: &Ctx) -> Result<Dims> {
    let x = cx.input(0)?;
    let w = cx.input(1)?;
    if x.rank() != 3 || w.rank() != 3 {
        return Err(cx.err(format!(
            "X and W must be 3-D, got {:?} and {:?}",
            x.shape, w.shape
        )));
    }
    let layout = cx.attrs.int_or("layout", 0)?;
    let (seq, batch) = if layout == 0 {
        (x.shape[0], x.shape[1])
    } else {
        (x.shape[1], x.shape[0])
    };
    let dirs = match cx
        .attrs
        .string("direction")?
        .as_deref()
        .unwrap_or("forward")
    {
        "bidirectional" => 2,
        "forward" | "reverse" => 1,
        d => {
            return Err(cx
                .attrs
                .err("direction", format!("unknown direction {d:?}")))
        }
    };
    let hidden = match cx.attrs.int("hidden_size")? {
        Some(h) if h > 0 => h as u64,
        Some(h) => {
            return Err(cx
                .attrs
                .err("hidden_size", format!("must be positive, got {h}")))
        }
        None => w.shape[1] / gates(cx.op),
    };
    if w.shape[0] != dirs
        || Some(w.shape[1]) != gates(cx.op).checked_mul(hidden)
        || w.shape[2] != x.shape[2]
    {
        return Err(cx.err(format!(
            "W of shape {:?} does not match {dirs} direction(s), hidden size {hidden} and input size {}",
            w.shape, x.shape[2]
        )));
    }
    Ok(Dims {
        seq,
        batch,
        input: x.shape[2],
        hidden,
        dirs,
        layout,
    })
}

fn rnn_infer(cx: &Ctx) -> Result<Vec<Fact>> {
    let d = dims(cx)?;
    let dtype = cx.input(0)?.dtype;
    let (y, h) = if d.layout == 0 {
        (
            vec![d.seq, d.dirs, d.batch, d.hidden],
            vec![d.dirs, d.batch, d.hidden],
        )
    } else {
        (
            vec![d.batch, d.seq, d.dirs, d.hidden],
            vec![d.batch, d.dirs, d.hidden],
        )
    };
    let mut out = vec![cx.fact(dtype, y)?, cx.fact(dtype, h.clone())?];
    if cx.op == "LSTM" {
        out.push(cx.fact(dtype, h)?);
    }
    out.truncate(cx.n_outputs.max(1));
    Ok(out)
}

fn rnn_flops(cx: &Ctx, _: &[Fact]) -> f64 {
    dims(cx)
        .map(|d| {
            let g = gates(cx.op) as f64;
            let per_step = 2.0 * g * d.hidden as f64 * (d.input + d.hidden) as f64 * d.batch as f64;
            per_step * d.seq as f64 * d.dirs as f64
        })
        .unwrap_or(0.0)
}

/// The backward keeps the input and, per step, the gate activations and the hidden (and
/// cell) states: PyTorch's CPU LSTM saves this workspace.
fn rnn_grad(cx: &Ctx, _: &[Fact], _: &[bool]) -> GradRule {
    let Ok(d) = dims(cx) else {
        return GradRule::saves(vec![Saved::Input(0)], 2.0);
    };
    let dtype = cx
        .opt(0)
        .map(|x| x.dtype)
        .unwrap_or(crate::tensor::DType::F32);
    let states = if cx.op == "LSTM" { 2 } else { 1 };
    let per = crate::tensor::prod_sat(&[d.seq, d.batch, d.hidden, d.dirs]);
    let work = per.saturating_mul(gates(cx.op) + states);
    let mut saved = vec![
        Saved::Input(0),
        Saved::Extra {
            tag: "workspace",
            bytes: bytes_of(dtype, work),
            cost: rnn_flops(cx, &[]),
        },
    ];
    // Partial sequence lengths decide which steps pass their state through.
    if cx.opt(4).is_some() {
        saved.push(Saved::Input(4));
    }
    GradRule::saves(saved, 2.0)
}

pub fn register(r: &mut Registry) {
    for op in ["LSTM", "GRU", "RNN"] {
        r.insert(
            op,
            OpSpec {
                infer: rnn_infer,
                flops: rnn_flops,
                // X, W, R, B, initial states get gradients; sequence_lens does not.
                diff_in: |_, i| i != 4,
                grad: rnn_grad,
                ..OpSpec::DEFAULT
            },
        );
    }
}
