//! SoftmaxCrossEntropyLoss and NegativeLogLikelihoodLoss.

use crate::kernel::kbail;
use crate::kernel::{
    BwdArgs, Extras, Inputs, KResult, Kernel, KernelCtx, KernelError, KernelRegistry,
};
use crate::kernels::common::{grads_out, set};
use candle_core::{DType, Tensor};

// Losses

struct Loss {
    reduction: String,
    ignore: Option<i64>,
    classes: usize,
}

fn loss_cfg(cx: &KernelCtx) -> KResult<Loss> {
    let reduction = cx
        .attrs
        .string("reduction")?
        .unwrap_or_else(|| "mean".into());
    if !matches!(reduction.as_str(), "none" | "sum" | "mean") {
        kbail!("attribute \"reduction\" = {reduction:?} is not supported");
    }
    Ok(Loss {
        reduction,
        ignore: cx.attrs.int("ignore_index")?,
        classes: cx.in_shape(0)?.get(1).copied().unwrap_or(0),
    })
}

/// Labels as `[N, 1, d...]` indices safe to gather (ignored ones at 0), and the per-element
/// weight `[N, d...]` (class weight, 0 where ignored), in `dtype`.
fn label_weights(
    l: &Loss,
    labels: &Tensor,
    weights: Option<&Tensor>,
    dtype: DType,
) -> KResult<(Tensor, Tensor)> {
    let lab = labels.to_dtype(DType::I64)?;
    let keep = match l.ignore {
        Some(i) => lab.ne(i as f64)?,
        None => lab.ones_like()?.to_dtype(DType::U8)?,
    };
    let safe = keep.where_cond(&lab, &lab.zeros_like()?)?;
    if safe.elem_count() > 0 {
        let lo = safe.min_all()?.to_scalar::<i64>()?;
        let hi = safe.max_all()?.to_scalar::<i64>()?;
        if lo < 0 || hi as usize >= l.classes {
            kbail!(
                "labels in [{lo}, {hi}] fall outside the {} classes",
                l.classes
            );
        }
    }
    let keep_f = keep.to_dtype(dtype)?;
    let w = match weights {
        Some(w) => {
            (w.to_dtype(dtype)?
                .index_select(&safe.flatten_all()?, 0)?
                .reshape(safe.dims())?
                * keep_f)?
        }
        None => keep_f,
    };
    Ok((safe.unsqueeze(1)?, w))
}

/// The reduced loss from per-element `-w·log p` values and weights.
fn reduce_loss(l: &Loss, per: &Tensor, w: &Tensor) -> KResult<Tensor> {
    Ok(match l.reduction.as_str() {
        "none" => per.clone(),
        "sum" => per.sum_all()?,
        _ => (per.sum_all()? / w.sum_all()?)?,
    })
}

/// `d loss / d (-w·log p)` per element: the incoming gradient spread by the reduction.
fn per_element_grad(l: &Loss, dy: &Tensor, w: &Tensor) -> KResult<Tensor> {
    Ok(match l.reduction.as_str() {
        "none" => dy.clone(),
        "sum" => dy.broadcast_as(w.dims())?.contiguous()?,
        _ => dy
            .broadcast_div(&w.sum_all()?)?
            .broadcast_as(w.dims())?
            .contiguous()?,
    })
}

fn weights_input<'a>(cx: &KernelCtx, xs: &'a [Option<Tensor>]) -> KResult<Option<&'a Tensor>> {
    if cx.opt(2).is_some() {
        Ok(Some(xs.named(2, "weights")?))
    } else {
        Ok(None)
    }
}

fn nll_from_logp(
    cx: &KernelCtx,
    logp: &Tensor,
    labels: &Tensor,
    weights: Option<&Tensor>,
) -> KResult<Tensor> {
    let l = loss_cfg(cx)?;
    let (idx, w) = label_weights(&l, labels, weights, logp.dtype())?;
    let picked = logp
        .contiguous()?
        .gather(&idx.contiguous()?, 1)?
        .squeeze(1)?;
    let per = (picked * &w)?.neg()?;
    reduce_loss(&l, &per, &w)
}

fn log_softmax(x: &Tensor) -> KResult<Tensor> {
    let m = x.max_keepdim(1)?;
    let s = x.broadcast_sub(&m)?;
    let lse = s.exp()?.sum_keepdim(1)?.log()?;
    Ok(s.broadcast_sub(&lse)?)
}

fn sce_forward(cx: &KernelCtx, xs: &[Option<Tensor>], ex: &Extras) -> KResult<Vec<Option<Tensor>>> {
    let scores = xs.named(0, "scores")?;
    let logp = match ex.get("log_prob").and_then(|v| v.first()) {
        Some(t) => t.reshape(scores.dims())?,
        None => log_softmax(scores)?,
    };
    let loss = nll_from_logp(cx, &logp, xs.named(1, "labels")?, weights_input(cx, xs)?)?;
    let mut out = vec![Some(loss)];
    if cx.outputs.len() > 1 {
        out.push(if cx.outputs.get(1).is_some_and(|f| f.is_some()) {
            Some(logp)
        } else {
            None
        });
    }
    Ok(out)
}

fn sce_extra(cx: &KernelCtx, tag: &str, xs: &[Option<Tensor>]) -> KResult<Vec<Tensor>> {
    if tag != "log_prob" {
        kbail!("{} has no extra value {tag:?}", cx.op);
    }
    Ok(vec![log_softmax(xs.named(0, "scores")?)?])
}

fn sce_backward(cx: &KernelCtx, g: &BwdArgs) -> KResult<Vec<Option<Tensor>>> {
    let mut out = grads_out(cx);
    if !g.need(0) {
        return Ok(out);
    }
    let logp = match g.outputs.get(1).and_then(|t| t.as_ref()) {
        Some(t) => t.clone(),
        None => g
            .extra("log_prob")?
            .first()
            .ok_or_else(|| KernelError::new("the log_prob extra is empty"))?
            .reshape(cx.in_shape(0)?)?,
    };
    let l = loss_cfg(cx)?;
    let weights = if cx.opt(2).is_some() {
        Some(g.input(2)?)
    } else {
        None
    };
    let (idx, w) = label_weights(&l, g.input(1)?, weights, logp.dtype())?;
    let coef = (per_element_grad(&l, &g.grad(cx, 0)?, &w)? * &w)?.unsqueeze(1)?;
    // d/dscores of -log p[label] = softmax - onehot(label).
    let onehot = logp.zeros_like()?.scatter_add(
        &idx.contiguous()?,
        &idx.ones_like()?.to_dtype(logp.dtype())?,
        1,
    )?;
    let d = (logp.exp()? - onehot)?.broadcast_mul(&coef)?;
    set(&mut out, 0, d);
    Ok(out)
}

fn nll_forward(cx: &KernelCtx, xs: &[Option<Tensor>], _: &Extras) -> KResult<Vec<Option<Tensor>>> {
    let loss = nll_from_logp(
        cx,
        xs.named(0, "input")?,
        xs.named(1, "target")?,
        weights_input(cx, xs)?,
    )?;
    Ok(vec![Some(loss)])
}

fn nll_backward(cx: &KernelCtx, g: &BwdArgs) -> KResult<Vec<Option<Tensor>>> {
    let mut out = grads_out(cx);
    if !g.need(0) {
        return Ok(out);
    }
    let l = loss_cfg(cx)?;
    let shape = cx.in_shape(0)?;
    let dy = g.grad(cx, 0)?;
    let weights = if cx.opt(2).is_some() {
        Some(g.input(2)?)
    } else {
        None
    };
    let (idx, w) = label_weights(&l, g.input(1)?, weights, dy.dtype())?;
    let coef = (per_element_grad(&l, &dy, &w)? * &w)?.neg()?.unsqueeze(1)?;
    let d = Tensor::zeros(shape, dy.dtype(), cx.device)?.scatter_add(
        &idx.contiguous()?,
        &coef.contiguous()?,
        1,
    )?;
    set(&mut out, 0, d);
    Ok(out)
}

pub(super) fn register(r: &mut KernelRegistry) {
    r.insert(
        "SoftmaxCrossEntropyLoss",
        Kernel::with_extra(sce_forward, sce_extra, Some(sce_backward)),
    );
    r.insert(
        "NegativeLogLikelihoodLoss",
        Kernel::new(nll_forward, Some(nll_backward)),
    );
}

#[cfg(test)]
mod tests {
    use crate::testing::tensors::{close, forward, t, vals};
    use crate::testing::{check, int, string, Case, In};
    use candle_core::{Device, Tensor};
    use remat_planner::tensor::DType;

    #[test]
    fn softmax_cross_entropy() {
        let labels = In::Ints(DType::I64, vec![3], vec![2, 0, 3]);
        check(&Case::new(
            "SoftmaxCrossEntropyLoss",
            13,
            vec![In::Rand(vec![3, 4]), labels.clone()],
        ));
        check(
            &Case::new(
                "SoftmaxCrossEntropyLoss",
                13,
                vec![
                    In::Rand(vec![3, 4]),
                    In::Ints(DType::I64, vec![3], vec![2, -1, 3]),
                    In::Const(DType::F32, vec![4], vec![0.5, 1.0, 2.0, 1.5]),
                ],
            )
            .attr(int("ignore_index", -1))
            .outputs(2),
        );
        for reduction in ["none", "sum"] {
            check(
                &Case::new(
                    "SoftmaxCrossEntropyLoss",
                    13,
                    vec![
                        In::Rand(vec![2, 3, 2]),
                        In::Ints(DType::I32, vec![2, 2], vec![0, 2, 1, 1]),
                    ],
                )
                .attr(string("reduction", reduction)),
            );
        }
        // Value: mean of -log softmax at the labels, weighted.
        let s = [0.1, 0.5, -0.2, 0.3, 0.0, 0.9];
        let y = forward(
            "SoftmaxCrossEntropyLoss",
            13,
            &[],
            &[
                Some(t(&s, &[2, 3])),
                Some(Tensor::from_vec(vec![1i64, 2], 2, &Device::Cpu).unwrap()),
                Some(t(&[1.0, 2.0, 3.0], &[3])),
            ],
            &[],
            1,
        )
        .unwrap();
        let lse = |r: &[f64]| r.iter().map(|v| v.exp()).sum::<f64>().ln();
        let want = (2.0 * (lse(&s[..3]) - 0.5) + 3.0 * (lse(&s[3..]) - 0.9)) / 5.0;
        close(&vals(&y[0].reshape(1).unwrap()), &[want], 1e-12);
    }

    #[test]
    fn negative_log_likelihood() {
        check(&Case::new(
            "NegativeLogLikelihoodLoss",
            13,
            vec![
                In::Rand(vec![3, 4]),
                In::Ints(DType::I64, vec![3], vec![2, 0, 3]),
            ],
        ));
        check(
            &Case::new(
                "NegativeLogLikelihoodLoss",
                13,
                vec![
                    In::Rand(vec![2, 3, 2]),
                    In::Ints(DType::I64, vec![2, 2], vec![0, 5, 1, 2]),
                    In::Const(DType::F32, vec![3], vec![0.5, 1.0, 2.0]),
                ],
            )
            .attr(int("ignore_index", 5))
            .attr(string("reduction", "sum")),
        );
        let bad = Case::new(
            "NegativeLogLikelihoodLoss",
            13,
            vec![
                In::Rand(vec![2, 3]),
                In::Ints(DType::I64, vec![2], vec![0, 3]),
            ],
        );
        let err = crate::testing::check_on(&bad, &Device::Cpu).expect_err("label 3 of 3 classes");
        assert!(err.0.contains("labels"), "{}", err.0);
    }
}
