//! Pad.

use crate::error::Result;
use crate::ops::rule::{first, Ctx, OpSpec, Registry};
use crate::tensor::Fact;

fn pad_infer(cx: &Ctx) -> Result<Vec<Fact>> {
    let x = cx.input(0)?;
    let pads = if cx.opset < 11 {
        cx.attrs.ints("pads")?.map(|p| p.to_vec())
    } else {
        cx.const_ints(1)?
    }
    .ok_or_else(|| cx.err("pads are required"))?;
    let axes = if cx.opset >= 18 {
        cx.const_ints(3)?
    } else {
        None
    };
    let axes = match axes {
        Some(a) => cx.axes(&a, x.rank())?,
        None => (0..x.rank()).collect(),
    };
    if pads.len() != 2 * axes.len() {
        return Err(cx.err(format!("pads {pads:?} do not match {} axes", axes.len())));
    }
    let mut shape = x.shape.clone();
    for (k, &a) in axes.iter().enumerate() {
        let d = (shape[a] as i64)
            .checked_add(pads[k])
            .and_then(|d| d.checked_add(pads[k + axes.len()]))
            .unwrap_or(-1);
        if d < 0 {
            return Err(cx.err(format!("pads {pads:?} make axis {a} negative")));
        }
        shape[a] = d as u64;
    }
    Ok(vec![cx.fact(x.dtype, shape)?])
}

pub(super) fn register(r: &mut Registry) {
    r.insert(
        "Pad",
        OpSpec {
            infer: pad_infer,
            diff_in: first,
            ..OpSpec::DEFAULT
        },
    );
}
