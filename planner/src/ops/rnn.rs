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

/// R, B, sequence_lens, the initial states and LSTM's peepholes P, where given, have the
/// shapes the directions, gates, hidden size and batch make.
fn check_inputs(cx: &Ctx, d: &Dims) -> Result<()> {
    let (g, h) = (gates(cx.op), d.hidden);
    let because = format!(
        "{} direction(s), {g} gate(s), hidden size {h}, batch {}",
        d.dirs, d.batch
    );
    let state = if d.layout == 0 {
        [d.dirs, d.batch, h]
    } else {
        [d.batch, d.dirs, h]
    };
    cx.input(2)?;
    let mut want = vec![
        (2, "R", vec![d.dirs, g.saturating_mul(h), h]),
        (3, "B", vec![d.dirs, g.saturating_mul(h).saturating_mul(2)]),
        (4, "sequence_lens", vec![d.batch]),
        (5, "initial_h", state.to_vec()),
    ];
    if cx.op == "LSTM" {
        want.push((6, "initial_c", state.to_vec()));
        want.push((7, "P", vec![d.dirs, h.saturating_mul(3)]));
    }
    for (i, name, shape) in want {
        cx.expect_shape(i, name, &shape, &because)?;
    }
    Ok(())
}

fn rnn_infer(cx: &Ctx) -> Result<Vec<Fact>> {
    let d = dims(cx)?;
    check_inputs(cx, &d)?;
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

/// Values kept per step, in units of `batch · hidden`: the gate activations and the state(s)
/// the step started from; a GRU with `linear_before_reset` (PyTorch's form) keeps what
/// PyTorch's CPU cell keeps, three more (the executor's workspace, `exec::kernels::rnn`).
fn units_per_step(cx: &Ctx) -> Result<u64> {
    let states = if cx.op == "LSTM" { 2 } else { 1 };
    let lbr = cx.op == "GRU" && cx.attrs.int_or("linear_before_reset", 0)? != 0;
    Ok(gates(cx.op) + states + if lbr { 3 } else { 0 })
}

/// Bytes PyTorch's CPU LSTM keeps for the backward of one float32 direction (one layer, one
/// direction: what `torch.nn.LSTM` hands oneDNN at a time), beside the layer's input: the
/// direction's output sequence, its final hidden and cell states, and oneDNN's training
/// workspace. The workspace is oneDNN's (v3, the `ref` RNN primitive PyTorch uses for f32
/// training on every ISA): gates `[seq, batch, ld(4·hidden)]`, hidden outputs
/// `[seq, batch, ld(hidden)]`, then `[2, seq + 1, batch, ·]` arrays of layer states, cell
/// states and their gradients, each of its parts starting on a 4096-byte boundary, with
/// oneDNN's leading dimension `ld` (a multiple of 16 floats, plus 16 when a multiple of 256).
/// Measured to the byte against `MkldnnRnnLayerBackward0`'s saved workspace on 720 shapes
/// (`fixtures/lstm_workspace.py`; torch 2.15, oneDNN 3.13; `fixtures/README.md`, "LSTM and
/// GRU").
pub fn pytorch_cpu_lstm_bytes(seq: u64, batch: u64, input: u64, hidden: u64) -> u64 {
    const PAGE: u64 = 4096;
    let ld = |x: u64| {
        let l = x.div_ceil(16).saturating_mul(16);
        if l.is_multiple_of(256) {
            l.saturating_add(16)
        } else {
            l
        }
    };
    let page = |x: u64| x.div_ceil(PAGE).saturating_mul(PAGE);
    let f = |dims: &[u64]| crate::tensor::prod_sat(dims).saturating_mul(4);
    let steps = seq.saturating_add(1);
    let wide = ld(input.max(hidden));
    let parts = [
        f(&[seq, batch, ld(hidden.saturating_mul(4))]),
        f(&[seq, batch, ld(hidden)]),
        f(&[2, steps, batch, wide]),
        f(&[2, steps, batch, hidden]),
        f(&[2, steps, batch, wide]),
        f(&[2, steps, batch, wide]),
        f(&[2, steps, batch, hidden]),
    ];
    let workspace = parts
        .iter()
        .fold(0u64, |sum, &p| sum.saturating_add(page(p)));
    workspace.saturating_add(f(&[seq.saturating_add(2), batch, hidden]))
}

/// The backward keeps the input and a workspace: for a float32 LSTM the bytes PyTorch's CPU
/// LSTM keeps (`pytorch_cpu_lstm_bytes`), otherwise `units_per_step` per step; the executor
/// holds exactly these bytes (`exec::kernels::rnn`).
fn rnn_grad(cx: &Ctx, _: &[Fact], _: &[bool]) -> GradRule {
    let (Ok(d), Ok(units)) = (dims(cx), units_per_step(cx)) else {
        return GradRule::saves(vec![Saved::Input(0)], 2.0);
    };
    let dtype = cx
        .opt(0)
        .map(|x| x.dtype)
        .unwrap_or(crate::tensor::DType::F32);
    let bytes = if cx.op == "LSTM" && dtype == crate::tensor::DType::F32 {
        pytorch_cpu_lstm_bytes(d.seq, d.batch, d.input, d.hidden).saturating_mul(d.dirs)
    } else {
        let per = crate::tensor::prod_sat(&[d.seq, d.batch, d.hidden, d.dirs]);
        bytes_of(dtype, per.saturating_mul(units))
    };
    let mut saved = vec![
        Saved::Input(0),
        Saved::Extra {
            tag: "workspace",
            bytes,
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

#[cfg(test)]
mod tests {
    use super::pytorch_cpu_lstm_bytes;

    /// oneDNN's workspace as PyTorch saved it (`MkldnnRnnLayerBackward0._saved_result3`,
    /// torch 2.15 on this machine), plus the output and final states, 4·(seq + 2)·batch·hidden.
    #[test]
    fn lstm_bytes_match_pytorch_measurements() {
        // (seq, batch, input, hidden, workspace bytes measured)
        let measured = [
            (1, 1, 1, 1, 28_672),
            (1, 8, 128, 16, 65_536),
            (1, 2, 192, 96, 40_960),
            (5, 3, 7, 128, 143_360),
            (5, 8, 200, 96, 397_312),
            (32, 2, 64, 100, 421_888),
            (32, 2, 128, 96, 438_272),
            (50, 3, 128, 96, 1_011_712),
            (50, 8, 200, 256, 6_443_008),
        ];
        for (t, n, i, h, ws) in measured {
            assert_eq!(
                pytorch_cpu_lstm_bytes(t, n, i, h),
                ws + 4 * (t + 2) * n * h,
                "seq {t}, batch {n}, input {i}, hidden {h}"
            );
        }
        // Absurd sizes saturate instead of overflowing.
        assert_eq!(pytorch_cpu_lstm_bytes(u64::MAX, 2, 3, 4), u64::MAX);
    }
}
