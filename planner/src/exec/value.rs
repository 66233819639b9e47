//! Conversions between the planner's small constant tensors and candle tensors.

use super::kernel::{to_candle, KResult};
use crate::tensor::{Data, Tensor as PTensor};
use candle_core::{Device, Tensor};

/// A planner constant on `dev`, in the candle type that holds its ONNX type.
pub fn from_planner(t: &PTensor, dev: &Device) -> KResult<Tensor> {
    let shape: Vec<usize> = t.shape.iter().map(|&d| d as usize).collect();
    let want = to_candle(t.dtype)?;
    let out = match &t.data {
        Data::F(v) => Tensor::from_vec(v.clone(), shape, dev)?,
        Data::I(v) => Tensor::from_vec(v.clone(), shape, dev)?,
    };
    Ok(out.to_dtype(want)?)
}
