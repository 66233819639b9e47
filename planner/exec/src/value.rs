//! Conversions between the planner's small constant tensors and candle tensors.

use super::kernel::{to_candle, KResult};
use candle_core::{Device, Tensor};
use remat_planner::tensor::{Data, Tensor as PTensor};

/// A planner constant on `dev`, in the candle type that holds its ONNX type.
pub fn from_planner(t: &PTensor, dev: &Device) -> KResult<Tensor> {
    let shape: Vec<usize> = t.shape.iter().map(|&d| d as usize).collect();
    let want = to_candle(t.dtype)?;
    let host = match &t.data {
        Data::F(v) => Tensor::from_vec(v.clone(), shape, &Device::Cpu)?,
        Data::I(v) => Tensor::from_vec(v.clone(), shape, &Device::Cpu)?,
    };
    on_device(host, want, dev)
}

/// A host tensor converted to `dtype` on the host, then moved to `dev`: candle's CUDA kernels
/// lack some conversions (to and from 32-bit integers) that its CPU has.
pub fn on_device(host: Tensor, dtype: candle_core::DType, dev: &Device) -> KResult<Tensor> {
    Ok(host.to_dtype(dtype)?.to_device(dev)?)
}
