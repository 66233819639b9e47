//! Helpers the layout and shape ops share: folding small constants, views' indices.

use crate::error::Result;
use crate::ops::rule::{Ctx, GradRule, Saved};
use crate::tensor::{numel, strides, DType, Data, Fact, Tensor};

/// Output 0 = input 0 with another shape, keeping a known value.
pub(in crate::ops) fn reshaped(cx: &Ctx, shape: Vec<u64>) -> Result<Vec<Fact>> {
    let x = cx.input(0)?;
    if numel(&shape) != Some(x.numel()) {
        return Err(cx.err(format!(
            "cannot reshape {:?} ({} elements) to {shape:?}",
            x.shape,
            x.numel()
        )));
    }
    Ok(vec![match &x.value {
        Some(v) => Fact::with_value(v.reshaped(shape)),
        None => Fact::new(x.dtype, shape),
    }])
}

/// Gathers elements of a small known tensor by flat index into a new tensor.
pub(in crate::ops) fn pick(
    t: &Tensor,
    shape: Vec<u64>,
    idx: impl Iterator<Item = usize>,
) -> Option<Tensor> {
    let data = match &t.data {
        Data::I(v) => Data::I(idx.map(|i| v.get(i).copied()).collect::<Option<_>>()?),
        Data::F(v) => Data::F(idx.map(|i| v.get(i).copied()).collect::<Option<_>>()?),
    };
    Some(Tensor {
        dtype: t.dtype,
        shape,
        data,
    })
}

/// Row-major coordinates of every element of `shape`.
pub(in crate::ops) fn coords(shape: &[u64]) -> impl Iterator<Item = Vec<u64>> + '_ {
    let n = numel(shape).unwrap_or(0);
    let st = strides(shape);
    (0..n).map(move |mut flat| {
        st.iter()
            .map(|&s| {
                let c = flat.checked_div(s).unwrap_or(0);
                flat -= c * s;
                c
            })
            .collect()
    })
}

pub(in crate::ops) fn small(dtype: DType, shape: &[u64]) -> bool {
    numel(shape).is_some_and(|n| crate::tensor::keep_value(dtype, n))
}
pub(in crate::ops) fn same_as_input(cx: &Ctx) -> Result<Vec<Fact>> {
    let x = cx.input(0)?;
    Ok(vec![Fact::new(x.dtype, x.shape.clone())])
}

pub(in crate::ops) fn save_indices(_: &Ctx, _: &[Fact], _: &[bool]) -> GradRule {
    GradRule::saves(vec![Saved::Input(1)], 1.0)
}
