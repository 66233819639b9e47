//! LpPool, GlobalLpPool, MaxUnpool.

use super::common::{as_dims, const_vec, save_x_and_y};
use crate::error::Result;
use crate::ops::nn::common::nchw;
use crate::ops::nn::pool::{global_pool_infer, pool_flops, pool_infer};
use crate::ops::rule::{first, nonneg, Ctx, GradRule, OpSpec, Registry, Saved, Window};
use crate::tensor::Fact;

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
    if kernel.len() != n {
        return Err(cx.attrs.err(
            "kernel_shape",
            format!("{} dims for an input with {n} spatial dims", kernel.len()),
        ));
    }
    let win = Window::read(cx, kernel)?;
    let (kernel, strides, pads) = (&win.kernel, &win.strides, &win.pads);
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

/// LpPool and GlobalLpPool: the norm's order `p` is at least 1.
fn lp_pool_infer(cx: &Ctx) -> Result<Vec<Fact>> {
    let p = cx.attrs.int_or("p", 2)?;
    if p < 1 {
        return Err(cx.attrs.err("p", format!("must be at least 1, got {p}")));
    }
    if cx.op == "LpPool" {
        pool_infer(cx)
    } else {
        global_pool_infer(cx)
    }
}

pub(super) fn register(r: &mut Registry) {
    r.insert(
        "LpPool",
        OpSpec {
            infer: lp_pool_infer,
            flops: pool_flops,
            grad: save_x_and_y,
            ..OpSpec::DEFAULT
        },
    );
    r.insert(
        "GlobalLpPool",
        OpSpec {
            infer: lp_pool_infer,
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
}
