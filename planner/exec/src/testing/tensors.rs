//! Value runs on candle tensors (the attention, recurrent, signal and spatial tests): inputs
//! are tensors, those listed in `consts` constants known at import (boolean masks as `u8`
//! tensors); output gradients [`Seeds::Sine`](super::Seeds::Sine); results compared to within
//! `tol · (1 + |want|)`.

use super::{assert_allclose, run_values, Arg, Harness, Seeds};
use crate::kernel::{Extras, KResult, KernelError};
use crate::kernels::registry;
use candle_core::{Device, Tensor};
use onnx_protobuf::AttributeProto;
use remat_planner::tensor::{DType, Data, Fact, Tensor as PTensor};

fn planner_dtype(d: candle_core::DType) -> DType {
    match d {
        candle_core::DType::F64 => DType::F64,
        candle_core::DType::F32 => DType::F32,
        candle_core::DType::F16 => DType::F16,
        candle_core::DType::I64 => DType::I64,
        candle_core::DType::I32 => DType::I32,
        _ => DType::Bool,
    }
}

/// The inputs as the kernel sees them: dtype and shape, the value of those listed in
/// `consts`; run-time float inputs take a gradient.
fn args_of(inputs: &[Option<Tensor>], consts: &[usize]) -> KResult<Vec<Arg>> {
    let mut args = vec![];
    for (i, t) in inputs.iter().enumerate() {
        let Some(t) = t else {
            args.push(Arg::none());
            continue;
        };
        let d = planner_dtype(t.dtype());
        let shape: Vec<u64> = t.dims().iter().map(|&x| x as u64).collect();
        let is_const = consts.contains(&i);
        let fact = if is_const {
            let flat = t.flatten_all()?;
            let data = if d.is_float() {
                Data::F(flat.to_dtype(candle_core::DType::F64)?.to_vec1::<f64>()?)
            } else {
                Data::I(flat.to_dtype(candle_core::DType::I64)?.to_vec1::<i64>()?)
            };
            Fact::with_value(PTensor::new(d, shape, data))
        } else {
            Fact::new(d, shape)
        };
        args.push(Arg {
            fact: Some(fact),
            value: Some(t.clone()),
            grad: !is_const && d.is_float(),
        });
    }
    Ok(args)
}

/// Runs only the forward of `op` on the CPU (no extras: the kernel computes what it needs);
/// inputs listed in `consts` are constants known at import. The outputs as the kernel
/// returns them.
pub fn forward(
    op: &'static str,
    opset: i64,
    attrs: &[AttributeProto],
    inputs: &[Option<Tensor>],
    consts: &[usize],
    n_outputs: usize,
) -> KResult<Vec<Tensor>> {
    let facts: Vec<Option<Fact>> = args_of(inputs, consts)?
        .into_iter()
        .map(|a| a.fact)
        .collect();
    let h = Harness::new(op, opset, attrs, &facts, n_outputs)?;
    (h.kernel()?.forward)(&h.cx(&Device::Cpu, 1), inputs, &Extras::new())?
        .into_iter()
        .map(|t| t.ok_or_else(|| KernelError::new("missing output")))
        .collect()
}

/// Forward and backward of `op` with float inputs cast to `dtype` (everything visible to the
/// backward; no backward when the op has none), results in f64: outputs, then the gradients
/// of the inputs that take one.
pub fn in_dtype(
    op: &'static str,
    opset: i64,
    attrs: &[AttributeProto],
    inputs: &[Option<Tensor>],
    consts: &[usize],
    n_outputs: usize,
    dtype: candle_core::DType,
) -> KResult<Vec<Tensor>> {
    let inputs: Vec<Option<Tensor>> = inputs
        .iter()
        .enumerate()
        .map(|(i, t)| match t {
            Some(t) if t.dtype().is_float() && !consts.contains(&i) => t.to_dtype(dtype).map(Some),
            other => Ok(other.clone()),
        })
        .collect::<candle_core::Result<_>>()?;
    let args = args_of(&inputs, consts)?;
    let has_backward = registry().get(op).is_some_and(|k| k.backward.is_some());
    let v = run_values(
        &Device::Cpu,
        op,
        opset,
        attrs,
        &args,
        n_outputs,
        1,
        has_backward.then_some(Seeds::Sine),
    )?;
    let tensor = |(shape, values): (Vec<usize>, Vec<f64>)| -> KResult<Tensor> {
        Ok(Tensor::from_vec(values, shape, &Device::Cpu)?)
    };
    v.outputs
        .into_iter()
        .chain(v.grads.into_iter().flatten())
        .map(tensor)
        .collect()
}

/// Runs a case in f64 and in `dtype` and compares every output and gradient.
#[allow(clippy::too_many_arguments)]
pub fn same_in(
    op: &'static str,
    opset: i64,
    attrs: &[AttributeProto],
    inputs: &[Option<Tensor>],
    consts: &[usize],
    n_outputs: usize,
    dtype: candle_core::DType,
    tol: f64,
) {
    let a = in_dtype(
        op,
        opset,
        attrs,
        inputs,
        consts,
        n_outputs,
        candle_core::DType::F64,
    )
    .unwrap_or_else(|e| panic!("{op} in f64: {e}"));
    let b = in_dtype(op, opset, attrs, inputs, consts, n_outputs, dtype)
        .unwrap_or_else(|e| panic!("{op} in {dtype:?}: {e}"));
    assert_eq!(a.len(), b.len(), "{op}: results differ in number");
    for (k, (x, y)) in a.iter().zip(&b).enumerate() {
        let (x, y) = (vals(x), vals(y));
        let scale = x.iter().fold(1e-3f64, |m, v| m.max(v.abs()));
        for (p, q) in x.iter().zip(&y) {
            let ok = (p - q).abs() <= tol * scale || (p.is_infinite() && p == q);
            assert!(ok, "{op} in {dtype:?}, result {k}: {q} vs {p} in f64");
        }
    }
}

/// An f64 tensor of `shape` on the CPU.
pub fn t(v: &[f64], shape: &[usize]) -> Tensor {
    Tensor::from_vec(v.to_vec(), shape, &Device::Cpu).unwrap()
}

/// The values of an f64 tensor, row-major.
pub fn vals(t: &Tensor) -> Vec<f64> {
    t.flatten_all().unwrap().to_vec1::<f64>().unwrap()
}

/// `sin(i a + b)` for `i < n`.
pub fn seq(n: usize, a: f64, b: f64) -> Vec<f64> {
    (0..n).map(|i| ((i as f64) * a + b).sin()).collect()
}

/// Equal to within `tol · (1 + |want|)`.
pub fn close(got: &[f64], want: &[f64], tol: f64) {
    assert_allclose(got, want, tol, tol);
}
