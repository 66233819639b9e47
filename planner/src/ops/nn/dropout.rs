//! Dropout.

use crate::error::Result;
use crate::ops::rule::{first, Ctx, GradRule, OpSpec, Registry, Saved};
use crate::tensor::{bytes_of, DType, Fact};

/// Dropout is active in the training graph when its ratio is positive (the training graph
/// models training, whatever mode the model was exported in). A ratio input that is not a
/// constant counts as active.
fn dropout_active(cx: &Ctx) -> bool {
    if cx.opset < 12 {
        return cx.attrs.float_or("ratio", 0.5).unwrap_or(0.5) > 0.0;
    }
    match cx.opt(1) {
        None => true,
        Some(f) => match &f.value {
            Some(v) => v.as_f64().first().copied().unwrap_or(0.5) > 0.0,
            None => true,
        },
    }
}

fn dropout_infer(cx: &Ctx) -> Result<Vec<Fact>> {
    // A ratio known at import must be a probability in [0, 1): 1 would drop everything and
    // scale by infinity, and anything else is not a probability.
    let ratio = if cx.opset < 12 {
        Some(f64::from(cx.attrs.float_or("ratio", 0.5)?))
    } else {
        cx.opt(1)
            .and_then(|f| f.value.as_ref())
            .and_then(|v| v.as_f64().first().copied())
    };
    if let Some(r) = ratio.filter(|r| !(0.0..1.0).contains(r)) {
        return Err(cx.err(format!("ratio {r} is not a probability in [0, 1)")));
    }
    let x = cx.input(0)?;
    let mut out = vec![Fact::new(x.dtype, x.shape.clone())];
    if cx.n_outputs > 1 {
        out.push(Fact::new(DType::Bool, x.shape.clone()));
    }
    Ok(out)
}

fn dropout_grad(cx: &Ctx, _: &[Fact], _: &[bool]) -> GradRule {
    if !dropout_active(cx) {
        return GradRule::saves(vec![], 0.0);
    }
    let n = cx.opt(0).map(|x| x.numel()).unwrap_or(0);
    GradRule {
        saved: vec![Saved::Extra {
            tag: "mask",
            bytes: bytes_of(DType::Bool, n),
            cost: n as f64,
        }],
        bwd_factor: 1.0,
        replay_rng: true,
    }
}

pub(super) fn register(r: &mut Registry) {
    r.insert(
        "Dropout",
        OpSpec {
            infer: dropout_infer,
            flops: |cx, _| {
                if dropout_active(cx) {
                    cx.in_numel(0)
                } else {
                    0.0
                }
            },
            diff_in: first,
            diff_out: first,
            grad: dropout_grad,
            view: |cx| if dropout_active(cx) { None } else { Some(0) },
            random: true,
        },
    );
}
