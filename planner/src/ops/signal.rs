//! Signal-processing ops of audio front ends: `STFT`, `DFT`, the window generators
//! (`HannWindow`, `HammingWindow`, `BlackmanWindow`) and `MelWeightMatrix`.
//!
//! `STFT` and `DFT` are linear in the signal: their backward keeps nothing of it, only the
//! window when the signal needs a gradient. The window is not trained (PyTorch's
//! `torch.stft` windows are buffers), so it takes no gradient even when it is a `Constant`
//! that the parameter rule would otherwise count as trainable. The generators take no
//! gradient.

use super::rule::{none, Ctx, GradRule, OpSpec, Registry, Saved};
use crate::error::Result;
use crate::tensor::{DType, Fact};

/// A required scalar integer input known at import time.
fn scalar_input(cx: &Ctx, i: usize, what: &str) -> Result<Option<i64>> {
    match cx.const_ints(i)? {
        None => Ok(None),
        Some(v) if v.len() == 1 => Ok(v.first().copied()),
        Some(v) => Err(cx.err(format!(
            "{what} (input {i}) must be a scalar, got {} values",
            v.len()
        ))),
    }
}

fn positive(cx: &Ctx, v: i64, what: &str) -> Result<u64> {
    u64::try_from(v)
        .ok()
        .filter(|&x| x > 0)
        .ok_or_else(|| cx.err(format!("{what} must be positive, got {v}")))
}

/// The floating-point type an `output_datatype` attribute names (default float).
fn output_dtype(cx: &Ctx) -> Result<DType> {
    let code = cx.attrs.int_or("output_datatype", 1)?;
    match DType::from_onnx(code) {
        Some(d) if d.is_float() => Ok(d),
        _ => Err(cx.attrs.err(
            "output_datatype",
            format!("{code} is not a floating-point type"),
        )),
    }
}

/// Shape facts of an STFT: (batch, frames, bins, frame length).
fn stft_dims(cx: &Ctx) -> Result<(u64, u64, u64, u64)> {
    let x = cx.input(0)?;
    // PyTorch's exporter writes a real signal as [batch, length], without the trailing 1.
    let real_2d = x.rank() == 2;
    if !real_2d && (x.rank() != 3 || !(x.shape[2] == 1 || x.shape[2] == 2)) {
        return Err(cx.err(format!(
            "signal must be [batch, length, 1 or 2] or [batch, length], got {:?}",
            x.shape
        )));
    }
    let step = scalar_input(cx, 1, "frame_step")?
        .ok_or_else(|| cx.err("frame_step (input 1) is required"))?;
    let step = positive(cx, step, "frame_step")?;
    let window = cx.opt(2);
    if let Some(w) = window {
        if w.rank() != 1 {
            return Err(cx.err(format!("window must be 1-D, got {:?}", w.shape)));
        }
    }
    let len = match (scalar_input(cx, 3, "frame_length")?, window) {
        (Some(l), w) => {
            let l = positive(cx, l, "frame_length")?;
            if let Some(w) = w {
                if w.shape[0] != l {
                    return Err(cx.err(format!(
                        "window length {} differs from frame_length {l}",
                        w.shape[0]
                    )));
                }
            }
            l
        }
        (None, Some(w)) => positive(cx, w.shape[0] as i64, "window length")?,
        (None, None) => return Err(cx.err("needs a window or a frame_length")),
    };
    let signal = x.shape[1];
    if signal < len {
        return Err(cx.err(format!(
            "signal length {signal} is shorter than the frame length {len}"
        )));
    }
    let frames = (signal - len) / step + 1;
    let onesided = cx.attrs.int_or("onesided", 1)? != 0;
    let bins = if onesided { len / 2 + 1 } else { len };
    Ok((x.shape[0], frames, bins, len))
}

fn stft_infer(cx: &Ctx) -> Result<Vec<Fact>> {
    let (batch, frames, bins, _) = stft_dims(cx)?;
    Ok(vec![
        cx.fact(cx.input(0)?.dtype, vec![batch, frames, bins, 2])?
    ])
}

/// FFT cost: 5·n·log2(n) per transformed row.
fn fft(n: u64, rows: f64) -> f64 {
    let n = n.max(2) as f64;
    5.0 * n * n.log2() * rows
}

fn stft_flops(cx: &Ctx, _: &[Fact]) -> f64 {
    stft_dims(cx)
        .map(|(b, frames, _, len)| fft(len, (b * frames) as f64) + (b * frames * len) as f64)
        .unwrap_or(0.0)
}

/// Linear in the signal: the backward multiplies by the window again.
fn stft_grad(_: &Ctx, _: &[Fact], needs: &[bool]) -> GradRule {
    let s = if needs.first() == Some(&true) {
        vec![Saved::Input(2)]
    } else {
        vec![]
    };
    GradRule::saves(s, 1.0)
}

/// (output shape, axis, dft length) of a DFT.
fn dft_dims(cx: &Ctx) -> Result<(Vec<u64>, usize, u64)> {
    let x = cx.input(0)?;
    let r = x.rank();
    if r < 2 || !(x.shape[r - 1] == 1 || x.shape[r - 1] == 2) {
        return Err(cx.err(format!(
            "input must be [batch, signal dims..., 1 or 2], got {:?}",
            x.shape
        )));
    }
    // Opset 20 moved `axis` from an attribute (default 1) to input 2 (default -2).
    let axis = if cx.opset >= 20 {
        scalar_input(cx, 2, "axis")?.unwrap_or(-2)
    } else {
        cx.attrs.int_or("axis", 1)?
    };
    // The last dim holds real/imaginary parts; the axis counts among the others.
    let a = cx.axis(axis, r)?;
    if a == 0 || a == r - 1 {
        return Err(cx.err(format!(
            "axis {axis} must name a signal dim (not the batch or the last dim) of {:?}",
            x.shape
        )));
    }
    let n = match scalar_input(cx, 1, "dft_length")? {
        Some(l) => positive(cx, l, "dft_length")?,
        None => x.shape[a],
    };
    let inverse = cx.attrs.int_or("inverse", 0)? != 0;
    let onesided = cx.attrs.int_or("onesided", 0)? != 0;
    if inverse && onesided {
        return Err(cx
            .attrs
            .err("onesided", "cannot be set together with inverse"));
    }
    let mut shape = x.shape.clone();
    shape[a] = if onesided { n / 2 + 1 } else { n };
    shape[r - 1] = 2;
    Ok((shape, a, n))
}

fn dft_infer(cx: &Ctx) -> Result<Vec<Fact>> {
    let (shape, _, _) = dft_dims(cx)?;
    Ok(vec![cx.fact(cx.input(0)?.dtype, shape)?])
}

fn dft_flops(cx: &Ctx, _: &[Fact]) -> f64 {
    dft_dims(cx)
        .map(|(shape, a, n)| {
            let rows: f64 = shape
                .iter()
                .enumerate()
                .filter(|&(i, _)| i != a && i + 1 != shape.len())
                .map(|(_, &d)| d as f64)
                .product();
            fft(n, rows)
        })
        .unwrap_or(0.0)
}

fn window_infer(cx: &Ctx) -> Result<Vec<Fact>> {
    let n = scalar_input(cx, 0, "size")?.ok_or_else(|| cx.err("size (input 0) is required"))?;
    let n = u64::try_from(n).map_err(|_| cx.err(format!("size must be non-negative, got {n}")))?;
    Ok(vec![cx.fact(output_dtype(cx)?, vec![n])?])
}

fn mel_infer(cx: &Ctx) -> Result<Vec<Fact>> {
    let mels = scalar_input(cx, 0, "num_mel_bins")?
        .ok_or_else(|| cx.err("num_mel_bins (input 0) is required"))?;
    let mels = positive(cx, mels, "num_mel_bins")?;
    let dft = scalar_input(cx, 1, "dft_length")?
        .ok_or_else(|| cx.err("dft_length (input 1) is required"))?;
    let dft = positive(cx, dft, "dft_length")?;
    for (i, what) in [
        (2, "sample_rate"),
        (3, "lower_edge_hertz"),
        (4, "upper_edge_hertz"),
    ] {
        cx.input(i)
            .map_err(|_| cx.err(format!("{what} (input {i}) is required")))?;
    }
    Ok(vec![cx.fact(output_dtype(cx)?, vec![dft / 2 + 1, mels])?])
}

pub fn register(r: &mut Registry) {
    r.insert(
        "STFT",
        OpSpec {
            infer: stft_infer,
            flops: stft_flops,
            diff_in: |_, i| i == 0,
            grad: stft_grad,
            ..OpSpec::DEFAULT
        },
    );
    r.insert(
        "DFT",
        OpSpec {
            infer: dft_infer,
            flops: dft_flops,
            diff_in: |_, i| i == 0,
            ..OpSpec::DEFAULT
        },
    );
    for op in ["HannWindow", "HammingWindow", "BlackmanWindow"] {
        r.insert(
            op,
            OpSpec {
                infer: window_infer,
                diff_in: none,
                diff_out: none,
                ..OpSpec::DEFAULT
            },
        );
    }
    r.insert(
        "MelWeightMatrix",
        OpSpec {
            infer: mel_infer,
            diff_in: none,
            diff_out: none,
            ..OpSpec::DEFAULT
        },
    );
}
