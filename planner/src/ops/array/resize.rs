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
