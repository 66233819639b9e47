//! Pooling: MaxPool, AveragePool, GlobalAveragePool, GlobalMaxPool.

use super::common::{in_elems, nchw, prod};
use crate::error::Result;
use crate::ops::rule::{first, nonneg, save_x, Ctx, GradRule, OpSpec, Registry, Saved, Window};
use crate::tensor::{bytes_of, DType, Fact};

fn pool_kernel(cx: &Ctx) -> Result<Vec<u64>> {
    match cx.attrs.ints("kernel_shape")? {
        Some(k) => nonneg(cx, "kernel_shape", k),
        None => Err(cx
            .attrs
            .err("kernel_shape", "required attribute is missing")),
    }
}

pub(in crate::ops) fn pool_infer(cx: &Ctx) -> Result<Vec<Fact>> {
    let x = nchw(cx)?;
    let win = Window::read(cx, pool_kernel(cx)?)?;
    let mut shape = x.shape[..2].to_vec();
    shape.extend(win.out_spatial(cx, &x.shape[2..])?);
    let mut out = vec![cx.fact(x.dtype, shape.clone())?];
    if cx.n_outputs > 1 {
        out.push(Fact::new(DType::I64, shape));
    }
    Ok(out)
}

pub(in crate::ops) fn pool_flops(cx: &Ctx, out: &[Fact]) -> f64 {
    let k = pool_kernel(cx).map(|k| prod(&k)).unwrap_or(1.0);
    out.first().map(|y| y.numel() as f64 * k).unwrap_or(0.0)
}

fn max_pool_grad(cx: &Ctx, out: &[Fact], _: &[bool]) -> GradRule {
    let y = out.first().map(|y| y.numel()).unwrap_or(0);
    GradRule::saves(
        vec![
            Saved::Input(0),
            Saved::Extra {
                tag: "indices",
                bytes: bytes_of(DType::I64, y),
                cost: pool_flops(cx, out),
            },
        ],
        1.0,
    )
}

pub(in crate::ops) fn global_pool_infer(cx: &Ctx) -> Result<Vec<Fact>> {
    let x = nchw(cx)?;
    let mut shape = x.shape[..2].to_vec();
    shape.extend(std::iter::repeat_n(1, x.rank() - 2));
    Ok(vec![Fact::new(x.dtype, shape)])
}

pub(super) fn register(r: &mut Registry) {
    r.insert(
        "MaxPool",
        OpSpec {
            infer: pool_infer,
            flops: pool_flops,
            diff_out: first,
            grad: max_pool_grad,
            ..OpSpec::DEFAULT
        },
    );
    r.insert(
        "AveragePool",
        OpSpec {
            infer: pool_infer,
            flops: pool_flops,
            grad: save_x,
            ..OpSpec::DEFAULT
        },
    );
    r.insert(
        "GlobalAveragePool",
        OpSpec {
            infer: global_pool_infer,
            flops: in_elems,
            grad: save_x,
            ..OpSpec::DEFAULT
        },
    );
    r.insert(
        "GlobalMaxPool",
        OpSpec {
            infer: global_pool_infer,
            flops: in_elems,
            grad: |_, out, _| {
                let y = out.first().map(|y| y.numel()).unwrap_or(0);
                GradRule::saves(
                    vec![
                        Saved::Input(0),
                        Saved::Extra {
                            tag: "indices",
                            bytes: bytes_of(DType::I64, y),
                            cost: y as f64,
                        },
                    ],
                    1.0,
                )
            },
            ..OpSpec::DEFAULT
        },
    );
}
