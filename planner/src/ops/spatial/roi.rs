//! RoiAlign, Col2Im, CenterCropPad.

use super::common::{as_dims, const_vec};
use crate::error::Result;
use crate::ops::nn::common::nchw;
use crate::ops::rule::{first, nothing_saved, Ctx, GradRule, OpSpec, Registry, Saved};
use crate::tensor::Fact;

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

pub(super) fn register(r: &mut Registry) {
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
}
