//! MatMul and Gemm.

use super::common::{prod, product_grad};
use crate::error::Result;
use crate::ops::rule::{Ctx, OpSpec, Registry};
use crate::tensor::{broadcast, Fact};

fn matmul_shape(cx: &Ctx, a: &[u64], b: &[u64]) -> Result<(Vec<u64>, f64)> {
    if a.is_empty() || b.is_empty() {
        return Err(cx.err("MatMul operands must have rank >= 1"));
    }
    let (a2, squeeze_m) = if a.len() == 1 {
        (vec![1, a[0]], true)
    } else {
        (a.to_vec(), false)
    };
    let (b2, squeeze_n) = if b.len() == 1 {
        (vec![b[0], 1], true)
    } else {
        (b.to_vec(), false)
    };
    let (m, k) = (a2[a2.len() - 2], a2[a2.len() - 1]);
    let (k2, n) = (b2[b2.len() - 2], b2[b2.len() - 1]);
    if k != k2 {
        return Err(cx.err(format!("inner dimensions differ: {a:?} x {b:?}")));
    }
    let batch = broadcast(&a2[..a2.len() - 2], &b2[..b2.len() - 2])
        .ok_or_else(|| cx.err(format!("batch dims of {a:?} and {b:?} do not broadcast")))?;
    let flops = 2.0 * prod(&batch) * m as f64 * n as f64 * k as f64;
    let mut shape = batch;
    if !squeeze_m {
        shape.push(m);
    }
    if !squeeze_n {
        shape.push(n);
    }
    Ok((shape, flops))
}

fn matmul_infer(cx: &Ctx) -> Result<Vec<Fact>> {
    let a = cx.input(0)?;
    let b = cx.input(1)?;
    let (shape, _) = matmul_shape(cx, &a.shape, &b.shape)?;
    Ok(vec![cx.fact(a.dtype, shape)?])
}

fn matmul_flops(cx: &Ctx, _: &[Fact]) -> f64 {
    match (cx.opt(0), cx.opt(1)) {
        (Some(a), Some(b)) => matmul_shape(cx, &a.shape, &b.shape)
            .map(|r| r.1)
            .unwrap_or(0.0),
        _ => 0.0,
    }
}

fn gemm_dims(cx: &Ctx) -> Result<(u64, u64, u64)> {
    let a = cx.input(0)?;
    let b = cx.input(1)?;
    if a.rank() != 2 || b.rank() != 2 {
        return Err(cx.err(format!(
            "Gemm operands must be 2-D, got {:?} and {:?}",
            a.shape, b.shape
        )));
    }
    let ta = cx.attrs.int_or("transA", 0)? != 0;
    let tb = cx.attrs.int_or("transB", 0)? != 0;
    let (m, k) = if ta {
        (a.shape[1], a.shape[0])
    } else {
        (a.shape[0], a.shape[1])
    };
    let (k2, n) = if tb {
        (b.shape[1], b.shape[0])
    } else {
        (b.shape[0], b.shape[1])
    };
    if k != k2 {
        return Err(cx.err(format!(
            "inner dimensions differ: A {:?} (transA {ta}) x B {:?} (transB {tb})",
            a.shape, b.shape
        )));
    }
    Ok((m, n, k))
}

fn gemm_infer(cx: &Ctx) -> Result<Vec<Fact>> {
    let (m, n, _) = gemm_dims(cx)?;
    if let Some(c) = cx.opt(2) {
        if broadcast(&c.shape, &[m, n]).as_deref() != Some(&[m, n][..]) {
            return Err(cx.err(format!(
                "C of shape {:?} does not broadcast to [{m}, {n}]",
                c.shape
            )));
        }
    }
    Ok(vec![cx.fact(cx.input(0)?.dtype, vec![m, n])?])
}

pub(super) fn register(r: &mut Registry) {
    r.insert(
        "MatMul",
        OpSpec {
            infer: matmul_infer,
            flops: matmul_flops,
            grad: product_grad,
            ..OpSpec::DEFAULT
        },
    );
    r.insert(
        "Gemm",
        OpSpec {
            infer: gemm_infer,
            flops: |cx, _| {
                gemm_dims(cx)
                    .map(|(m, n, k)| 2.0 * m as f64 * n as f64 * k as f64 + (m * n) as f64)
                    .unwrap_or(0.0)
            },
            grad: product_grad,
            ..OpSpec::DEFAULT
        },
    );
}
