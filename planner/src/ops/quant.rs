//! QuantizeLinear and DequantizeLinear.

use super::rule::{first, Ctx, OpSpec, Registry};
use crate::error::Result;
use crate::tensor::{DType, Fact};

/// The scale (input 1) is one value, or one per slice along `axis` (per-axis quantization);
/// the zero point (input 2) has the scale's shape. Blocked quantization (`block_size`, opset
/// 21) gives both X's rank.
fn check_scale(cx: &Ctx) -> Result<()> {
    let x = cx.input(0)?;
    let scale = cx.input(1)?;
    let (s, z) = if cx.op == "QuantizeLinear" {
        ("y_scale", "y_zero_point")
    } else {
        ("x_scale", "x_zero_point")
    };
    if cx.attrs.int_or("block_size", 0)? != 0 {
        return Ok(());
    }
    if scale.numel() != 1 {
        let axis = cx.axis(cx.attrs.int_or("axis", 1)?, x.rank())?;
        let because = format!("it is per axis {axis} of X {:?}", x.shape);
        cx.expect_shape(1, s, &[x.shape[axis]], &because)?;
        cx.expect_shape(2, z, &scale.shape, &format!("{s} is {:?}", scale.shape))?;
    } else if let Some(zp) = cx.opt(2).filter(|zp| zp.numel() != 1) {
        return Err(cx.err(format!(
            "input {z} has shape {:?}; {s} is one value, so it must be one value too",
            zp.shape
        )));
    }
    Ok(())
}

pub fn register(r: &mut Registry) {
    r.insert(
        "QuantizeLinear",
        OpSpec {
            infer: |cx| {
                let x = cx.input(0)?;
                check_scale(cx)?;
                // The zero point's type, else `output_dtype` (opset 21), else uint8.
                let attr = match cx.attrs.int("output_dtype")?.filter(|&d| d != 0) {
                    None => None,
                    Some(d) => Some(DType::from_onnx(d).ok_or_else(|| {
                        cx.attrs
                            .err("output_dtype", format!("unknown data type {d}"))
                    })?),
                };
                let dtype = match (cx.opt(2).map(|z| z.dtype), attr) {
                    (Some(z), Some(a)) if z != a => {
                        return Err(cx.attrs.err(
                            "output_dtype",
                            format!("{a:?} differs from the zero point's type {z:?}"),
                        ))
                    }
                    (Some(z), _) => z,
                    (None, Some(a)) => a,
                    (None, None) => DType::U8,
                };
                Ok(vec![Fact::new(dtype, x.shape.clone())])
            },
            diff_in: first,
            ..OpSpec::DEFAULT
        },
    );
    r.insert(
        "DequantizeLinear",
        OpSpec {
            infer: |cx| {
                let x = cx.input(0)?;
                check_scale(cx)?;
                let dtype = cx.input(1)?.dtype;
                Ok(vec![Fact::new(dtype, x.shape.clone())])
            },
            diff_in: first,
            ..OpSpec::DEFAULT
        },
    );
}
