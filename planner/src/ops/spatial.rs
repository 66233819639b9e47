//! Less common spatial ops (`LpPool`, `GlobalLpPool`, `MaxUnpool`, `RoiAlign`, `Col2Im`,
//! `CenterCropPad`, `AffineGrid`) and the training losses exporters write when the loss is
//! part of the graph (`SoftmaxCrossEntropyLoss`, `NegativeLogLikelihoodLoss`).

use super::nn::{global_pool_infer, nchw, pool_flops, pool_infer};
use super::{first, nonneg, nothing_saved, Ctx, GradRule, OpSpec, Registry, Saved};
use crate::error::Result;
use crate::tensor::{bytes_of, DType, Fact};

fn save_x_and_y(_: &Ctx, _: &[Fact], _: &[bool]) -> GradRule {
    GradRule::saves(vec![Saved::Input(0), Saved::Output(0)], 2.0)
}

/// A constant 1-D integer input.
fn const_vec(cx: &Ctx, i: usize, what: &str) -> Result<Vec<i64>> {
    cx.const_ints(i)?
        .ok_or_else(|| cx.err(format!("{what} (input {i}) is required")))
}

fn as_dims(cx: &Ctx, v: &[i64], what: &str) -> Result<Vec<u64>> {
    v.iter()
        .map(|&d| {
            u64::try_from(d)
                .ok()
                .filter(|&d| d > 0)
                .ok_or_else(|| cx.err(format!("{what} must be positive, got {v:?}")))
        })
        .collect()
}

fn max_unpool_infer(cx: &Ctx) -> Result<Vec<Fact>> {
    let x = nchw(cx)?;
    let idx = cx.input(1)?;
    if idx.shape != x.shape {
        return Err(cx.err(format!(
            "indices shape {:?} differs from X's {:?}",
            idx.shape, x.shape
        )));
    }
    if cx.opt(2).is_some() {
        let shape = as_dims(cx, &const_vec(cx, 2, "output_shape")?, "output_shape")?;
        if shape.len() != x.rank() {
            return Err(cx.err(format!(
                "output_shape {shape:?} does not have X's rank {}",
                x.rank()
            )));
        }
        return Ok(vec![cx.fact(x.dtype, shape)?]);
    }
    let n = x.rank() - 2;
    let kernel = match cx.attrs.ints("kernel_shape")? {
        Some(k) => nonneg(cx, "kernel_shape", k)?,
        None => {
            return Err(cx
                .attrs
                .err("kernel_shape", "required attribute is missing"))
        }
    };
    let strides = match cx.attrs.ints("strides")? {
        Some(s) => nonneg(cx, "strides", s)?,
        None => vec![1; n],
    };
    let pads = match cx.attrs.ints("pads")? {
        Some(p) => nonneg(cx, "pads", p)?,
        None => vec![0; 2 * n],
    };
    if kernel.len() != n || strides.len() != n || pads.len() != 2 * n {
        return Err(cx.err(format!(
            "kernel_shape/strides/pads lengths ({}, {}, {}) do not match {n} spatial dims",
            kernel.len(),
            strides.len(),
            pads.len()
        )));
    }
    let mut shape = x.shape[..2].to_vec();
    for i in 0..n {
        let full = (x.shape[i + 2].saturating_sub(1))
            .saturating_mul(strides[i])
            .saturating_add(kernel[i]);
        let out = full
            .checked_sub(pads[i].saturating_add(pads[i + n]))
            .filter(|&o| o > 0)
            .ok_or_else(|| cx.err(format!("pads {pads:?} leave no output on axis {i}")))?;
        shape.push(out);
    }
    Ok(vec![cx.fact(x.dtype, shape)?])
}

fn roi_align_infer(cx: &Ctx) -> Result<Vec<Fact>> {
    let x = nchw(cx)?;
    let rois = cx.input(1)?;
    let batch = cx.input(2)?;
    if x.rank() != 4 || rois.rank() != 2 || rois.shape[1] != 4 || batch.rank() != 1 {
        return Err(cx.err(format!(
            "expects X [N, C, H, W], rois [R, 4], batch_indices [R]; got {:?}, {:?}, {:?}",
            x.shape, rois.shape, batch.shape
        )));
    }
    if batch.shape[0] != rois.shape[0] {
        return Err(cx.err(format!(
            "{} rois but {} batch indices",
            rois.shape[0], batch.shape[0]
        )));
    }
    let h = cx.attrs.int_or("output_height", 1)?;
    let w = cx.attrs.int_or("output_width", 1)?;
    let hw = as_dims(cx, &[h, w], "output_height/output_width")?;
    Ok(vec![cx.fact(
        x.dtype,
        vec![rois.shape[0], x.shape[1], hw[0], hw[1]],
    )?])
}

fn col2im_infer(cx: &Ctx) -> Result<Vec<Fact>> {
    let x = cx.input(0)?;
    let image = as_dims(cx, &const_vec(cx, 1, "image_shape")?, "image_shape")?;
    let block = as_dims(cx, &const_vec(cx, 2, "block_shape")?, "block_shape")?;
    if x.rank() != 3 || image.len() != block.len() || image.is_empty() {
        return Err(cx.err(format!(
            "expects input [N, C·prod(block), L] and image_shape/block_shape of one length; got {:?}, {image:?}, {block:?}",
            x.shape
        )));
    }
    let per = block.iter().try_fold(1u64, |a, &b| a.checked_mul(b));
    let c = per
        .filter(|&p| p > 0 && x.shape[1].is_multiple_of(p))
        .map(|p| x.shape[1] / p)
        .ok_or_else(|| {
            cx.err(format!(
                "dim 1 ({}) is not a multiple of the block size {block:?}",
                x.shape[1]
            ))
        })?;
    let mut shape = vec![x.shape[0], c];
    shape.extend(image);
    Ok(vec![cx.fact(x.dtype, shape)?])
}

fn center_crop_pad_infer(cx: &Ctx) -> Result<Vec<Fact>> {
    let x = cx.input(0)?;
    let sizes = as_dims(cx, &const_vec(cx, 1, "shape")?, "shape")?;
    let axes: Vec<usize> = match cx.attrs.ints("axes")? {
        Some(a) => cx.axes(a, x.rank())?,
        None => (0..x.rank()).collect(),
    };
    if axes.len() != sizes.len() {
        return Err(cx.err(format!(
            "shape has {} values for {} axes",
            sizes.len(),
            axes.len()
        )));
    }
    let mut shape = x.shape.clone();
    for (a, s) in axes.into_iter().zip(sizes) {
        shape[a] = s;
    }
    Ok(vec![cx.fact(x.dtype, shape)?])
}

fn affine_grid_infer(cx: &Ctx) -> Result<Vec<Fact>> {
    let theta = cx.input(0)?;
    let size = as_dims(cx, &const_vec(cx, 1, "size")?, "size")?;
    let spatial = size.len().saturating_sub(2);
    if !(spatial == 2 || spatial == 3)
        || theta.shape != [size[0], spatial as u64, spatial as u64 + 1]
    {
        return Err(cx.err(format!(
            "theta {:?} does not match size {size:?} (expects [N, 2, 3] with [N, C, H, W] or [N, 3, 4] with [N, C, D, H, W])",
            theta.shape
        )));
    }
    let mut shape = vec![size[0]];
    shape.extend(&size[2..]);
    shape.push(spatial as u64);
    Ok(vec![cx.fact(theta.dtype, shape)?])
}

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

pub fn register(r: &mut Registry) {
    r.insert(
        "LpPool",
        OpSpec {
            infer: pool_infer,
            flops: pool_flops,
            grad: save_x_and_y,
            ..OpSpec::DEFAULT
        },
    );
    r.insert(
        "GlobalLpPool",
        OpSpec {
            infer: global_pool_infer,
            flops: |cx, _| 2.0 * cx.in_numel(0),
            grad: save_x_and_y,
            ..OpSpec::DEFAULT
        },
    );
    r.insert(
        "MaxUnpool",
        OpSpec {
            infer: max_unpool_infer,
            diff_in: first,
            grad: |_, _, _| GradRule::saves(vec![Saved::Input(1)], 1.0),
            ..OpSpec::DEFAULT
        },
    );
    r.insert(
        "RoiAlign",
        OpSpec {
            infer: roi_align_infer,
            flops: |cx, out| {
                let s = cx.attrs.int_or("sampling_ratio", 0).unwrap_or(0).max(2) as f64;
                out.first()
                    .map(|y| y.numel() as f64 * s * s * 4.0)
                    .unwrap_or(0.0)
            },
            diff_in: first,
            // The sampling table comes from the boxes; max mode also needs X to find the
            // winning sample of each cell.
            grad: |cx, _, _| {
                let mut saved = vec![Saved::Input(1), Saved::Input(2)];
                if cx.attrs.string("mode").ok().flatten().as_deref() == Some("max") {
                    saved.push(Saved::Input(0));
                }
                GradRule::saves(saved, 1.0)
            },
            ..OpSpec::DEFAULT
        },
    );
    r.insert(
        "Col2Im",
        OpSpec {
            infer: col2im_infer,
            diff_in: first,
            grad: nothing_saved,
            ..OpSpec::DEFAULT
        },
    );
    r.insert(
        "CenterCropPad",
        OpSpec {
            infer: center_crop_pad_infer,
            diff_in: first,
            grad: nothing_saved,
            ..OpSpec::DEFAULT
        },
    );
    r.insert(
        "AffineGrid",
        OpSpec {
            infer: affine_grid_infer,
            diff_in: first,
            grad: nothing_saved,
            ..OpSpec::DEFAULT
        },
    );
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
