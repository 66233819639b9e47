//! SoftmaxCrossEntropyLoss and NegativeLogLikelihoodLoss.

use crate::error::Result;
use crate::ops::rule::{first, Ctx, GradRule, OpSpec, Registry, Saved};
use crate::tensor::{bytes_of, DType, Fact};

/// Loss outputs: per-element `[N, d...]` with reduction `none`, a scalar otherwise; the
/// optional second output (log-probabilities) has the scores' shape.
fn loss_infer(cx: &Ctx) -> Result<Vec<Fact>> {
    let scores = cx.input(0)?;
    let labels = cx.input(1)?;
    if scores.rank() < 2 {
        return Err(cx.err(format!(
            "scores must be [N, C, d...], got {:?}",
            scores.shape
        )));
    }
    let mut per = vec![scores.shape[0]];
    per.extend(&scores.shape[2..]);
    if labels.shape != per {
        return Err(cx.err(format!(
            "labels shape {:?} does not match scores {:?} (expects {per:?})",
            labels.shape, scores.shape
        )));
    }
    if !labels.dtype.is_int() {
        return Err(cx.err(format!("labels must be integers, got {:?}", labels.dtype)));
    }
    if let Some(w) = cx.opt(2) {
        if w.shape != [scores.shape[1]] {
            return Err(cx.err(format!(
                "weights shape {:?} differs from the {} classes",
                w.shape, scores.shape[1]
            )));
        }
    }
    let reduction = cx
        .attrs
        .string("reduction")?
        .unwrap_or_else(|| "mean".into());
    let out = match reduction.as_str() {
        "none" => per,
        "mean" | "sum" => vec![],
        r => {
            return Err(cx
                .attrs
                .err("reduction", format!("unknown reduction {r:?}")))
        }
    };
    let mut facts = vec![cx.fact(scores.dtype, out)?];
    if cx.n_outputs > 1 && cx.op == "SoftmaxCrossEntropyLoss" {
        facts.push(cx.fact(scores.dtype, scores.shape.clone())?);
    }
    Ok(facts)
}

/// PyTorch's cross entropy is log_softmax (keeps its output) then nll_loss (keeps the
/// target).
fn cross_entropy_grad(cx: &Ctx, _: &[Fact], _: &[bool]) -> GradRule {
    let log_prob = if cx.n_outputs > 1 {
        Saved::Output(1)
    } else {
        let (dtype, n) = cx
            .opt(0)
            .map(|s| (s.dtype, s.numel()))
            .unwrap_or((DType::F32, 0));
        Saved::Extra {
            tag: "log_prob",
            bytes: bytes_of(dtype, n),
            cost: 5.0 * n as f64,
        }
    };
    GradRule::saves(vec![log_prob, Saved::Input(1)], 1.0)
}

pub(super) fn register(r: &mut Registry) {
    r.insert(
        "SoftmaxCrossEntropyLoss",
        OpSpec {
            infer: loss_infer,
            flops: |cx, _| 6.0 * cx.in_numel(0),
            diff_in: first,
            diff_out: first,
            grad: cross_entropy_grad,
            ..OpSpec::DEFAULT
        },
    );
    r.insert(
        "NegativeLogLikelihoodLoss",
        OpSpec {
            infer: loss_infer,
            flops: |cx, _| cx.in_numel(1),
            diff_in: first,
            diff_out: first,
            grad: |_, _, _| GradRule::saves(vec![Saved::Input(1)], 1.0),
            ..OpSpec::DEFAULT
        },
    );
}
