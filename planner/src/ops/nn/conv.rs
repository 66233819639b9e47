//! Conv and ConvTranspose.

use super::common::{nchw, prod, product_grad};
use crate::error::Result;
use crate::ops::rule::{nonneg, Ctx, OpSpec, Registry, Window};
use crate::tensor::Fact;

/// The `kernel_shape` attribute, which must be the weight's spatial dims (the executor runs
/// the weight), or those dims when it is not given.
fn kernel_of(cx: &Ctx, weight: &[u64]) -> Result<Vec<u64>> {
    let spatial = weight[2..].to_vec();
    match cx.attrs.ints("kernel_shape")? {
        Some(k) => {
            let k = nonneg(cx, "kernel_shape", k)?;
            if k != spatial {
                return Err(cx.attrs.err(
                    "kernel_shape",
                    format!("{k:?} does not match the weight {weight:?}"),
                ));
            }
            Ok(k)
        }
        None => Ok(spatial),
    }
}

/// The optional bias `B` (input 2) holds one value per output channel.
fn bias_per_channel(cx: &Ctx, channels: u64, weight: &[u64]) -> Result<()> {
    let because = format!("the weight {weight:?} gives {channels} output channels");
    cx.expect_shape(2, "B", &[channels], &because)
}

fn conv_infer(cx: &Ctx) -> Result<Vec<Fact>> {
    let x = nchw(cx)?;
    let w = cx.input(1)?;
    if w.rank() != x.rank() {
        return Err(cx.err(format!(
            "weight shape {:?} does not match input rank {}",
            w.shape,
            x.rank()
        )));
    }
    let group = cx.attrs.int_or("group", 1)?;
    if group < 1 {
        return Err(cx
            .attrs
            .err("group", format!("must be positive, got {group}")));
    }
    let group = group as u64;
    let kernel = kernel_of(cx, &w.shape)?;
    if x.shape[1] != w.shape[1].saturating_mul(group) {
        return Err(cx.err(format!(
            "input has {} channels but weight {:?} with group {group} expects {}",
            x.shape[1],
            w.shape,
            w.shape[1].saturating_mul(group)
        )));
    }
    bias_per_channel(cx, w.shape[0], &w.shape)?;
    let win = Window::read(cx, kernel)?;
    let mut shape = vec![x.shape[0], w.shape[0]];
    shape.extend(win.out_spatial(cx, &x.shape[2..])?);
    Ok(vec![cx.fact(x.dtype, shape)?])
}

fn conv_flops(cx: &Ctx, out: &[Fact]) -> f64 {
    let (Some(w), Some(y)) = (cx.opt(1), out.first()) else {
        return 0.0;
    };
    // Each output element: C/g * prod(kernel) multiply-adds.
    2.0 * y.numel() as f64 * prod(&w.shape[1..])
}

fn conv_transpose_infer(cx: &Ctx) -> Result<Vec<Fact>> {
    let x = nchw(cx)?;
    let w = cx.input(1)?;
    if w.rank() != x.rank() {
        return Err(cx.err(format!(
            "weight shape {:?} does not match input rank {}",
            w.shape,
            x.rank()
        )));
    }
    let group = cx.attrs.int_or("group", 1)?;
    if group < 1 {
        return Err(cx
            .attrs
            .err("group", format!("must be positive, got {group}")));
    }
    let group = group as u64;
    if x.shape[1] != w.shape[0] {
        return Err(cx.err(format!(
            "input has {} channels but weight {:?} expects {}",
            x.shape[1], w.shape, w.shape[0]
        )));
    }
    let kernel = kernel_of(cx, &w.shape)?;
    let n = kernel.len();
    if n != x.rank() - 2 {
        return Err(cx.attrs.err(
            "kernel_shape",
            format!("{n} dims for an input with {} spatial dims", x.rank() - 2),
        ));
    }
    let win = Window::read(cx, kernel)?;
    let out_pad = match cx.attrs.ints("output_padding")? {
        Some(p) => nonneg(cx, "output_padding", p)?,
        None => vec![0; n],
    };
    bias_per_channel(cx, w.shape[1].saturating_mul(group), &w.shape)?;
    let mut shape = vec![x.shape[0], w.shape[1].saturating_mul(group)];
    if let Some(os) = cx.attrs.ints("output_shape")? {
        let os = nonneg(cx, "output_shape", os)?;
        let spatial = if os.len() == n {
            os
        } else {
            os.iter().rev().take(n).rev().copied().collect()
        };
        shape.extend(spatial);
    } else {
        for i in 0..n {
            let input = x.shape[2 + i];
            let s = win.strides[i];
            let out = if win.auto_pad.starts_with("SAME") {
                input.saturating_mul(s)
            } else {
                let eff = (win.kernel[i].saturating_sub(1)).saturating_mul(win.dilations[i]) + 1;
                let full = s
                    .saturating_mul(input.saturating_sub(1))
                    .saturating_add(*out_pad.get(i).unwrap_or(&0))
                    .saturating_add(eff);
                let pads = win.pads[i] + win.pads[i + n];
                full.checked_sub(pads)
                    .filter(|&o| o > 0)
                    .ok_or_else(|| cx.err("pads exceed the output size"))?
            };
            shape.push(out);
        }
    }
    Ok(vec![cx.fact(x.dtype, shape)?])
}

fn conv_transpose_flops(cx: &Ctx, _: &[Fact]) -> f64 {
    let (Some(x), Some(w)) = (cx.opt(0), cx.opt(1)) else {
        return 0.0;
    };
    2.0 * x.numel() as f64 * prod(&w.shape[1..])
}

pub(super) fn register(r: &mut Registry) {
    r.insert(
        "Conv",
        OpSpec {
            infer: conv_infer,
            flops: conv_flops,
            grad: product_grad,
            ..OpSpec::DEFAULT
        },
    );
    r.insert(
        "ConvTranspose",
        OpSpec {
            infer: conv_transpose_infer,
            flops: conv_transpose_flops,
            grad: product_grad,
            ..OpSpec::DEFAULT
        },
    );
}
