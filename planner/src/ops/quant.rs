//! QuantizeLinear and DequantizeLinear.

use super::rule::{first, OpSpec, Registry};
use crate::tensor::{DType, Fact};

pub fn register(r: &mut Registry) {
    r.insert(
        "QuantizeLinear",
        OpSpec {
            infer: |cx| {
                let x = cx.input(0)?;
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
                let dtype = cx.input(1)?.dtype;
                Ok(vec![Fact::new(dtype, x.shape.clone())])
            },
            diff_in: first,
            ..OpSpec::DEFAULT
        },
    );
}
