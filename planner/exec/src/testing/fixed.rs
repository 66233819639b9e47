//! Value runs on fixed inputs (the layout, index and resize tests): [`In`] inputs, float ones
//! in one float type, output gradients [`Seeds::Ones`](super::Seeds::Ones); results compared
//! to within 1e-3.

use super::{args_in, assert_allclose, run_values, In, Seeds};
use candle_core::Device;
use onnx_protobuf::attribute_proto::AttributeType;
use onnx_protobuf::{AttributeProto, TensorProto};
use remat_planner::tensor::DType;

/// Fixed float values (an activation).
pub fn fl(shape: &[usize], v: &[f64]) -> In {
    In::Floats(shape.to_vec(), v.to_vec())
}

/// Floats 0, 1, 2, ... of `shape`.
pub fn iota(shape: &[usize]) -> In {
    let n: usize = shape.iter().product();
    fl(shape, &(0..n).map(|i| i as f64).collect::<Vec<_>>())
}

/// A 1-D float32 constant (scales, ROIs).
pub fn f32s(v: &[f64]) -> In {
    In::Const(DType::F32, vec![v.len()], v.to_vec())
}

/// A 1-D int64 constant (axes, shapes, pads).
pub fn c64(v: &[i64]) -> In {
    In::Const(
        DType::I64,
        vec![v.len()],
        v.iter().map(|&x| x as f64).collect(),
    )
}

/// A scalar int64 constant.
pub fn scalar(v: i64) -> In {
    In::Const(DType::I64, vec![], vec![v as f64])
}

/// A 1-D tensor attribute of ONNX type `dtype` (7 = int64, 11 = double).
pub fn tensor_attr(name: &str, dtype: i32, v: &[i64]) -> AttributeProto {
    let mut t = TensorProto::new();
    t.data_type = dtype;
    t.dims = vec![v.len() as i64];
    if dtype == 11 {
        t.double_data = v.iter().map(|&x| x as f64).collect();
    } else {
        t.int64_data = v.to_vec();
    }
    let mut a = AttributeProto::new();
    a.name = name.into();
    a.type_ = AttributeType::TENSOR.into();
    a.t = Some(t).into();
    a
}

/// Forward and (when `backward`) the backward with all-ones output gradients, with float
/// inputs and outputs in `ft`: the values of the outputs and of the input gradients.
#[allow(clippy::too_many_arguments)]
pub fn fwd_bwd(
    op: &'static str,
    opset: i64,
    attrs: &[AttributeProto],
    inputs: Vec<In>,
    n_out: usize,
    seed: u64,
    ft: DType,
    backward: bool,
) -> (Vec<Vec<f64>>, Vec<Option<Vec<f64>>>) {
    let args = args_in(inputs, ft, seed).unwrap_or_else(|e| panic!("{op}: {e}"));
    let v = run_values(
        &Device::Cpu,
        op,
        opset,
        attrs,
        &args,
        n_out,
        seed,
        backward.then_some(Seeds::Ones),
    )
    .unwrap_or_else(|e| panic!("{op} in {ft:?}: {e}"));
    (
        v.outputs.into_iter().map(|o| o.1).collect(),
        v.grads.into_iter().map(|g| g.map(|g| g.1)).collect(),
    )
}

/// Runs an op's forward on fixed inputs (no gradient) in f64 and returns every output's
/// values.
pub fn run_with(
    op: &'static str,
    opset: i64,
    attrs: Vec<AttributeProto>,
    inputs: Vec<In>,
    n_out: usize,
    seed: u64,
) -> Vec<Vec<f64>> {
    fwd_bwd(op, opset, &attrs, inputs, n_out, seed, DType::F64, false).0
}

/// The values of output 0 of an op's forward in f64.
pub fn run(op: &'static str, opset: i64, attrs: Vec<AttributeProto>, inputs: Vec<In>) -> Vec<f64> {
    run_with(op, opset, attrs, inputs, 1, 7).remove(0)
}

/// Equal to within 1e-3 (absolute).
pub fn close(got: &[f64], want: &[f64]) {
    assert_allclose(got, want, 1e-3, 0.0);
}
