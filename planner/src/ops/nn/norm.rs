//! Normalizations: BatchNormalization, InstanceNormalization, LayerNormalization,
//! GroupNormalization, LRN, LpNormalization, MeanVarianceNormalization.

use super::common::nchw;
use crate::error::Result;
use crate::ops::array::common::same_as_input;
use crate::ops::rule::{first, Ctx, GradRule, OpSpec, Registry, Saved};
use crate::tensor::{bytes_of, DType, Fact};

/// Batch-norm style ops: output 0 like the input, other outputs small per-channel vectors.
fn norm_infer(cx: &Ctx) -> Result<Vec<Fact>> {
    let x = cx.input(0)?;
    let c = x.shape.get(1).copied().unwrap_or(1);
    let mut out = vec![Fact::new(x.dtype, x.shape.clone())];
    for _ in 1..cx.n_outputs {
        out.push(Fact::new(x.dtype, vec![c]));
    }
    Ok(out)
}

/// BatchNormalization: X and its four per-channel inputs (scale, bias, running mean and
/// variance), each of shape `[C]`.
fn batch_norm_infer(cx: &Ctx) -> Result<Vec<Fact>> {
    if cx.inputs.len() != 5 {
        return Err(cx.err(format!(
            "takes 5 inputs (X, scale, B, input_mean, input_var), got {}",
            cx.inputs.len()
        )));
    }
    per_channel_infer(cx, &["scale", "B", "input_mean", "input_var"])
}

/// InstanceNormalization: X, scale and B, the last two of shape `[C]`.
fn instance_norm_infer(cx: &Ctx) -> Result<Vec<Fact>> {
    per_channel_infer(cx, &["scale", "B"])
}

/// X and the required inputs after it, named `names`, each of shape `[C]`.
fn per_channel_infer(cx: &Ctx, names: &[&str]) -> Result<Vec<Fact>> {
    let x = cx.input(0)?;
    let c = x.shape.get(1).copied().unwrap_or(1);
    let because = format!("X {:?} has {c} channels", x.shape);
    for (i, name) in names.iter().enumerate().map(|(k, n)| (k + 1, n)) {
        cx.input(i)?;
        cx.expect_shape(i, name, &[c], &because)?;
    }
    norm_infer(cx)
}

/// GroupNormalization: `num_groups` must be at least 1 and divide the channels.
fn group_norm_infer(cx: &Ctx) -> Result<Vec<Fact>> {
    let x = cx.input(0)?;
    let c = x.shape.get(1).copied().unwrap_or(1);
    let g = cx.attrs.int_or("num_groups", 1)?;
    if g < 1 || c % g as u64 != 0 {
        return Err(cx.attrs.err(
            "num_groups",
            format!("must be at least 1 and divide the {c} channels of X, got {g}"),
        ));
    }
    // Scale and bias are per channel (opset 21; `[C, 1, 1]` as the fused decomposition has
    // it) or per group (opset 18): C or G values.
    for (i, name) in [(1, "scale"), (2, "bias")] {
        if let Some(p) = cx
            .opt(i)
            .filter(|p| p.numel() != c && p.numel() != g as u64)
        {
            let or = if g as u64 == c {
                String::new()
            } else {
                format!(", or {g} as opset 18 had it")
            };
            return Err(cx.err(format!(
                "input {name} has shape {:?}; X {:?} has {c} channels in {g} groups, so it must hold {c} values{or}",
                p.shape, x.shape
            )));
        }
    }
    norm_infer(cx).map(|mut v| {
        v.truncate(1);
        v
    })
}

fn bn_training(cx: &Ctx) -> bool {
    if cx.opset >= 14 {
        cx.attrs.int_or("training_mode", 0).unwrap_or(0) != 0
    } else {
        cx.n_outputs > 1
    }
}

fn stats_bytes(n: u64) -> u64 {
    // Mean and inverse standard deviation, kept in fp32.
    bytes_of(DType::F32, n.saturating_mul(2))
}

fn batch_norm_grad(cx: &Ctx, _: &[Fact], _: &[bool]) -> GradRule {
    let x = cx.opt(0);
    let c = x.and_then(|x| x.shape.get(1).copied()).unwrap_or(1);
    let mut s = vec![Saved::Input(0)];
    if bn_training(cx) {
        s.push(Saved::Extra {
            tag: "stats",
            bytes: stats_bytes(c),
            cost: 2.0 * x.map(|x| x.numel() as f64).unwrap_or(0.0),
        });
    }
    GradRule::saves(s, 2.0)
}

fn instance_norm_grad(cx: &Ctx, _: &[Fact], _: &[bool]) -> GradRule {
    let x = cx.opt(0);
    let nc = x
        .map(|x| crate::tensor::prod_sat(&x.shape[..x.rank().min(2)]))
        .unwrap_or(1);
    GradRule::saves(
        vec![
            Saved::Input(0),
            Saved::Extra {
                tag: "stats",
                bytes: stats_bytes(nc),
                cost: 2.0 * x.map(|x| x.numel() as f64).unwrap_or(0.0),
            },
        ],
        2.0,
    )
}

fn layer_norm_axis(cx: &Ctx) -> Result<usize> {
    let x = cx.input(0)?;
    cx.axis(cx.attrs.int_or("axis", -1)?, x.rank())
}

fn layer_norm_infer(cx: &Ctx) -> Result<Vec<Fact>> {
    let x = cx.input(0)?;
    let axis = layer_norm_axis(cx)?;
    for (i, name) in [(1, "Scale"), (2, "B")] {
        cx.expect_broadcast_to(i, name, &x.shape[axis..], "the normalized dims")?;
    }
    let mut stat = x.shape[..axis].to_vec();
    stat.extend(std::iter::repeat_n(1, x.rank() - axis));
    let mut out = vec![Fact::new(x.dtype, x.shape.clone())];
    for _ in 1..cx.n_outputs {
        out.push(Fact::new(DType::F32, stat.clone()));
    }
    Ok(out)
}

fn layer_norm_grad(cx: &Ctx, _: &[Fact], _: &[bool]) -> GradRule {
    let outer = match (cx.opt(0), layer_norm_axis(cx)) {
        (Some(x), Ok(axis)) => crate::tensor::prod_sat(&x.shape[..axis]),
        _ => 1,
    };
    GradRule::saves(
        vec![
            Saved::Input(0),
            Saved::Extra {
                tag: "stats",
                bytes: stats_bytes(outer),
                cost: 2.0 * cx.in_numel(0),
            },
        ],
        2.0,
    )
}

fn group_norm_grad(cx: &Ctx, _: &[Fact], _: &[bool]) -> GradRule {
    let n = cx
        .opt(0)
        .and_then(|x| x.shape.first().copied())
        .unwrap_or(1);
    let g = cx.attrs.int_or("num_groups", 1).unwrap_or(1).max(1) as u64;
    GradRule::saves(
        vec![
            Saved::Input(0),
            Saved::Extra {
                tag: "stats",
                bytes: stats_bytes(n.saturating_mul(g)),
                cost: 2.0 * cx.in_numel(0),
            },
        ],
        2.0,
    )
}
fn lrn_infer(cx: &Ctx) -> Result<Vec<Fact>> {
    let x = nchw(cx)?;
    match cx.attrs.int("size")? {
        Some(s) if s >= 1 => {}
        Some(s) => return Err(cx.attrs.err("size", format!("must be positive, got {s}"))),
        None => return Err(cx.attrs.err("size", "required attribute is missing")),
    }
    Ok(vec![Fact::new(x.dtype, x.shape.clone())])
}

pub(super) fn register(r: &mut Registry) {
    r.insert(
        "BatchNormalization",
        OpSpec {
            infer: batch_norm_infer,
            flops: |cx, _| 5.0 * cx.in_numel(0),
            diff_in: |_, i| i < 3,
            diff_out: first,
            grad: batch_norm_grad,
            ..OpSpec::DEFAULT
        },
    );
    r.insert(
        "InstanceNormalization",
        OpSpec {
            infer: instance_norm_infer,
            flops: |cx, _| 5.0 * cx.in_numel(0),
            grad: instance_norm_grad,
            ..OpSpec::DEFAULT
        },
    );
    r.insert(
        "LayerNormalization",
        OpSpec {
            infer: layer_norm_infer,
            flops: |cx, _| 5.0 * cx.in_numel(0),
            diff_out: first,
            grad: layer_norm_grad,
            ..OpSpec::DEFAULT
        },
    );
    r.insert(
        "GroupNormalization",
        OpSpec {
            infer: group_norm_infer,
            flops: |cx, _| 5.0 * cx.in_numel(0),
            grad: group_norm_grad,
            ..OpSpec::DEFAULT
        },
    );
    r.insert(
        "LRN",
        OpSpec {
            infer: lrn_infer,
            flops: |cx, _| {
                cx.in_numel(0) * (cx.attrs.int_or("size", 1).unwrap_or(1).max(1) as f64 + 3.0)
            },
            grad: |_, _, _| GradRule::saves(vec![Saved::Input(0), Saved::Output(0)], 2.0),
            ..OpSpec::DEFAULT
        },
    );
    for op in ["LpNormalization", "MeanVarianceNormalization"] {
        r.insert(
            op,
            OpSpec {
                infer: |cx| {
                    let p = cx.attrs.int_or("p", 2)?;
                    if cx.op == "LpNormalization" && p != 1 && p != 2 {
                        return Err(cx.attrs.err("p", format!("must be 1 or 2, got {p}")));
                    }
                    same_as_input(cx)
                },
                flops: |cx, _| 4.0 * cx.in_numel(0),
                grad: |_, _, _| GradRule::saves(vec![Saved::Input(0), Saved::Output(0)], 2.0),
                ..OpSpec::DEFAULT
            },
        );
    }
}
