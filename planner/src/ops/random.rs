//! Random draws: RandomNormal(Like), RandomUniform(Like), Bernoulli.

use super::rule::{none, nonneg, Ctx, OpSpec, Registry};
use crate::error::Result;
use crate::tensor::{DType, Fact};

pub fn register(r: &mut Registry) {
    fn random_infer(cx: &Ctx) -> Result<Vec<Fact>> {
        let dtype = match cx.attrs.int("dtype")? {
            Some(d) => DType::from_onnx(d).ok_or_else(|| cx.attrs.err("dtype", "unknown type"))?,
            None => cx.opt(0).map(|x| x.dtype).unwrap_or(DType::F32),
        };
        let shape = match cx.opt(0) {
            Some(x) => x.shape.clone(),
            None => {
                let s = cx
                    .attrs
                    .ints("shape")?
                    .ok_or_else(|| cx.attrs.err("shape", "required attribute is missing"))?;
                nonneg(cx, "shape", s)?
            }
        };
        Ok(vec![cx.fact(dtype, shape)?])
    }
    for op in [
        "RandomNormal",
        "RandomUniform",
        "RandomNormalLike",
        "RandomUniformLike",
        "Bernoulli",
    ] {
        r.insert(
            op,
            OpSpec {
                infer: random_infer,
                diff_in: none,
                diff_out: none,
                random: true,
                ..OpSpec::DEFAULT
            },
        );
    }
}
