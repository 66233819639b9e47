//! Det.

use super::rule::{GradRule, OpSpec, Registry, Saved};
use crate::tensor::Fact;

pub fn register(r: &mut Registry) {
    r.insert(
        "Det",
        OpSpec {
            infer: |cx| {
                let x = cx.input(0)?;
                if x.rank() < 2 {
                    return Err(cx.err("needs a rank >= 2 input"));
                }
                Ok(vec![Fact::new(x.dtype, x.shape[..x.rank() - 2].to_vec())])
            },
            grad: |_, _, _| GradRule::saves(vec![Saved::Input(0), Saved::Output(0)], 3.0),
            ..OpSpec::DEFAULT
        },
    );
}
