//! QuantizeLinear and DequantizeLinear.

use super::rule::{first, OpSpec, Registry};
use crate::tensor::{DType, Fact};

pub fn register(r: &mut Registry) {
    r.insert(
        "QuantizeLinear",
        OpSpec {
            infer: |cx| {
                let x = cx.input(0)?;
                let dtype = cx.opt(2).map(|z| z.dtype).unwrap_or(DType::U8);
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
