//! Softmax, LogSoftmax, Hardmax.

use crate::error::Result;
use crate::ops::rule::{save_y, Ctx, OpSpec, Registry};
use crate::tensor::Fact;

fn softmax_infer(cx: &Ctx) -> Result<Vec<Fact>> {
    let x = cx.input(0)?;
    let default = if cx.opset >= 13 { -1 } else { 1 };
    cx.axis(cx.attrs.int_or("axis", default)?, x.rank())?;
    Ok(vec![Fact::new(x.dtype, x.shape.clone())])
}

pub(super) fn register(r: &mut Registry) {
    for op in ["Softmax", "LogSoftmax"] {
        r.insert(
            op,
            OpSpec {
                infer: softmax_infer,
                flops: |cx, _| 5.0 * cx.in_numel(0),
                grad: save_y,
                ..OpSpec::DEFAULT
            },
        );
    }
    r.insert(
        "Hardmax",
        OpSpec {
            infer: softmax_infer,
            diff_in: crate::ops::rule::none,
            ..OpSpec::DEFAULT
        },
    );
}
