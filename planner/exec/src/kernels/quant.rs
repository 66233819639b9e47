//! QuantizeLinear and DequantizeLinear.

use super::common::{grad0, in_dtype, out_dtype};
use crate::kernel::kbail;
use crate::kernel::{
    to_candle, BwdArgs, Extras, Inputs, KResult, Kernel, KernelCtx, KernelError, KernelRegistry,
    Outs,
};
use candle_core::{DType as CD, Tensor};
use remat_planner::tensor::DType;

/// The range of an ONNX integer type.
fn int_range(d: DType) -> KResult<(f64, f64)> {
    Ok(match d {
        DType::U8 => (0.0, 255.0),
        DType::I8 => (-128.0, 127.0),
        DType::U16 => (0.0, 65535.0),
        DType::I16 => (-32768.0, 32767.0),
        DType::I32 => (-2147483648.0, 2147483647.0),
        DType::U32 => (0.0, 4294967295.0),
        other => kbail!("quantized type {other:?} is not supported"),
    })
}

/// Integer tensor values as floats of type `ft`, reading `int8` (held in `u8`) as signed.
fn int_values(t: &Tensor, d: DType, ft: CD) -> KResult<Tensor> {
    let v = t.to_dtype(ft)?;
    if d == DType::I8 {
        let neg = t.ge(128u8)?;
        return Ok(neg.where_cond(&v.affine(1.0, -256.0)?, &v)?);
    }
    Ok(v)
}

/// `scale`/`zero_point` shaped to broadcast against an input of `rank` (per-axis when 1-D).
fn quant_param(cx: &KernelCtx, t: &Tensor, rank: usize) -> KResult<Tensor> {
    if cx.attrs.int_or("block_size", 0)? != 0 {
        kbail!("attribute \"block_size\" (blocked quantization) is not supported");
    }
    if t.rank() == 0 || t.elem_count() == 1 {
        return Ok(t.flatten_all()?.reshape(())?);
    }
    if t.rank() != 1 {
        kbail!(
            "scale of shape {:?} is neither a scalar nor per-axis",
            t.dims()
        );
    }
    let axis = cx.axis(cx.attrs.int_or("axis", 1)?, rank)?;
    let mut shape = vec![1; rank];
    shape[axis] = t.elem_count();
    Ok(t.reshape(shape)?)
}

/// Round half to even.
fn round_even(v: &Tensor) -> KResult<Tensor> {
    let r = v.round()?;
    let even = v.affine(0.5, 0.0)?.round()?.affine(2.0, 0.0)?;
    let tie = (v - v.floor()?)?.eq(0.5)?;
    Ok(tie.where_cond(&even, &r)?)
}

fn quantize_fwd(cx: &KernelCtx, xs: &[Option<Tensor>], _: &Extras) -> Outs {
    let x = xs.req(0)?;
    let rank = x.rank();
    let ft = if x.dtype() == CD::F64 {
        CD::F64
    } else {
        CD::F32
    };
    let to = cx
        .outputs
        .first()
        .and_then(|f| f.as_ref())
        .ok_or_else(|| KernelError::new("output 0 is not in the graph"))?
        .dtype;
    let (lo, hi) = int_range(to)?;
    let scale = quant_param(cx, &xs.req(1)?.to_dtype(ft)?, rank)?;
    let mut q = round_even(&x.to_dtype(ft)?.broadcast_div(&scale)?)?;
    if let Some(zp) = xs.get(2).and_then(|t| t.as_ref()) {
        let zd = cx.input(2)?.dtype;
        q = q.broadcast_add(&quant_param(cx, &int_values(zp, zd, ft)?, rank)?)?;
    }
    let q = q
        .clamp(lo, hi)?
        .to_dtype(CD::I64)?
        .to_dtype(to_candle(to)?)?;
    Ok(vec![Some(q)])
}

/// The output is an integer tensor: no gradient reaches the input through it.
fn quantize_bwd(cx: &KernelCtx, a: &BwdArgs) -> Outs {
    grad0(cx, a, || {
        Ok(Tensor::zeros(cx.in_shape(0)?, in_dtype(cx, 0)?, cx.device)?)
    })
}

fn dequantize_fwd(cx: &KernelCtx, xs: &[Option<Tensor>], _: &Extras) -> Outs {
    let x = xs.req(0)?;
    let rank = x.rank();
    let dt = out_dtype(cx, 0)?;
    let ft = if dt == CD::F64 { CD::F64 } else { CD::F32 };
    let mut v = int_values(x, cx.input(0)?.dtype, ft)?;
    if let Some(zp) = xs.get(2).and_then(|t| t.as_ref()) {
        let zd = cx.input(2)?.dtype;
        v = v.broadcast_sub(&quant_param(cx, &int_values(zp, zd, ft)?, rank)?)?;
    }
    let scale = quant_param(cx, &xs.req(1)?.to_dtype(ft)?, rank)?;
    Ok(vec![Some(v.broadcast_mul(&scale)?.to_dtype(dt)?)])
}

/// d y / d x = scale (for an input read as real values).
fn dequantize_bwd(cx: &KernelCtx, a: &BwdArgs) -> Outs {
    grad0(cx, a, || {
        let g = a.grad(cx, 0)?;
        let scale = quant_param(cx, &a.input(1)?.to_dtype(g.dtype())?, g.rank())?;
        Ok(g.broadcast_mul(&scale)?.to_dtype(in_dtype(cx, 0)?)?)
    })
}

pub fn register(r: &mut KernelRegistry) {
    r.insert(
        "QuantizeLinear",
        Kernel::new(quantize_fwd, Some(quantize_bwd)),
    );
    r.insert(
        "DequantizeLinear",
        Kernel::new(dequantize_fwd, Some(dequantize_bwd)),
    );
}

#[cfg(test)]
mod tests {

    use crate::testing::{check, int, Case, In};
    use remat_planner::tensor::DType;

    #[test]
    fn quantization() {
        let scale = || In::Const(DType::F32, vec![], vec![0.05]);
        check(&Case::new(
            "QuantizeLinear",
            13,
            vec![
                In::Rand(vec![2, 3]),
                scale(),
                In::Ints(DType::U8, vec![], vec![128]),
            ],
        ));
        check(&Case::new(
            "QuantizeLinear",
            13,
            vec![
                In::Rand(vec![2, 3]),
                scale(),
                In::Ints(DType::I8, vec![], vec![-3]),
            ],
        ));
        check(
            &Case::new(
                "QuantizeLinear",
                13,
                vec![
                    In::Rand(vec![2, 3]),
                    In::Const(DType::F32, vec![3], vec![0.1, 0.01, 1.0]),
                ],
            )
            .attr(int("axis", 1)),
        );
        check(&Case::new(
            "DequantizeLinear",
            13,
            vec![
                In::Ints(DType::U8, vec![2, 2], vec![0, 10, 200, 255]),
                In::Const(DType::F64, vec![], vec![0.5]),
                In::Ints(DType::U8, vec![], vec![100]),
            ],
        ));
        check(
            &Case::new(
                "DequantizeLinear",
                13,
                vec![
                    In::Ints(DType::I8, vec![2, 2], vec![-128, -1, 0, 127]),
                    In::Const(DType::F64, vec![2], vec![0.5, 2.0]),
                    In::Ints(DType::I8, vec![2], vec![-2, 3]),
                ],
            )
            .attr(int("axis", 0)),
        );
    }
}
