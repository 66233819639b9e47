//! Resize and Upsample.

use crate::error::Result;
use crate::ops::rule::{first, nonneg, Ctx, OpSpec, Registry};
use crate::tensor::Fact;

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
            match aspect_scale(cx, &x.shape, &axes, &sz)? {
                Some(scale) => {
                    for &a in &axes {
                        shape[a] = round_half_up(scale * x.shape[a] as f64);
                    }
                }
                None => {
                    for (k, &a) in axes.iter().enumerate() {
                        shape[a] = sz[k];
                    }
                }
            }
        }
        (_, Some(sc)) if !sc.is_empty() => {
            if sc.len() != axes.len() {
                return Err(cx.err(format!("scales {sc:?} do not match {} axes", axes.len())));
            }
            for (k, &a) in axes.iter().enumerate() {
                let v = (shape[a] as f64 * sc[k]).floor();
                // An axis resized to nothing (a scale of 0, or one that rounds a size to 0)
                // has no output to interpolate.
                if !(1.0..1e15).contains(&v) {
                    return Err(cx.err(format!(
                        "scale {} gives an invalid size for axis {a} of size {}",
                        sc[k], shape[a]
                    )));
                }
                shape[a] = v as u64;
            }
        }
        _ => return Err(cx.err("neither scales nor sizes is given")),
    }
    Ok(vec![cx.fact(x.dtype, shape)?])
}

/// Resize's `keep_aspect_ratio_policy` (opset 18) with `sizes` over `axes`: `None` for
/// `stretch` (each axis to its size), else the one scale of every axis, the least (`not_larger`)
/// or the greatest (`not_smaller`) of `sizes[k] / in[axes[k]]`; the output size of an axis is
/// then `round_half_up(scale * in)`, and the interpolation uses that scale.
pub fn aspect_scale(cx: &Ctx, input: &[u64], axes: &[usize], sizes: &[u64]) -> Result<Option<f64>> {
    let policy = cx.attrs.string("keep_aspect_ratio_policy")?;
    let pick: fn(f64, f64) -> f64 = match policy.as_deref().unwrap_or("stretch") {
        "stretch" => return Ok(None),
        "not_larger" => f64::min,
        "not_smaller" => f64::max,
        p => {
            return Err(cx.attrs.err(
                "keep_aspect_ratio_policy",
                format!("{p:?} is not \"stretch\", \"not_larger\" or \"not_smaller\""),
            ))
        }
    };
    let mut scale: Option<f64> = None;
    for (&a, &s) in axes.iter().zip(sizes) {
        let d = input[a];
        if d == 0 {
            return Err(cx.err(format!("axis {a} has size 0: no aspect ratio to keep")));
        }
        let r = s as f64 / d as f64;
        scale = Some(scale.map_or(r, |m| pick(m, r)));
    }
    Ok(scale)
}

/// The nearest integer, halves up (ONNX's `round_int` in Resize).
pub fn round_half_up(x: f64) -> u64 {
    (x + 0.5).floor().max(0.0) as u64
}

pub(super) fn register(r: &mut Registry) {
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
}
