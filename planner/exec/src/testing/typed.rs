//! Value runs with typed inputs (the elementwise and reduction tests): each input a run-time
//! tensor or an import-time constant of an explicit ONNX type; output gradients
//! [`Seeds::Saw`](super::Seeds::Saw); results compared to within 1e-9.

use super::{assert_allclose, run_values, Arg, Flat, Seeds};
use crate::kernel::{to_candle, KResult};
use candle_core::{Device, Tensor};
use onnx_protobuf::AttributeProto;
use remat_planner::tensor::{DType as OD, Data, Fact, Tensor as PTensor};

/// One input of a value test: a run-time tensor, or a constant known at import.
pub enum V {
    T(OD, Vec<usize>, Vec<f64>),
    C(OD, Vec<usize>, Vec<f64>),
    None,
}

fn arg(v: V) -> KResult<Arg> {
    Ok(match v {
        V::T(d, s, x) => {
            let shape: Vec<u64> = s.iter().map(|&d| d as u64).collect();
            let t = Tensor::from_vec(x, s, &Device::Cpu)?.to_dtype(to_candle(d)?)?;
            Arg {
                fact: Some(Fact::new(d, shape)),
                value: Some(t),
                grad: d.is_float(),
            }
        }
        V::C(d, s, x) => {
            let shape: Vec<u64> = s.iter().map(|&d| d as u64).collect();
            let t = Tensor::from_vec(x.clone(), s, &Device::Cpu)?.to_dtype(to_candle(d)?)?;
            Arg {
                fact: Some(Fact::with_value(PTensor::new(d, shape, Data::F(x)))),
                value: Some(t),
                grad: false,
            }
        }
        V::None => Arg::none(),
    })
}

/// Runs an op's forward (shapes from its shape rule) on concrete values and returns its
/// outputs as `f64`s with their shapes.
pub fn fwd(
    op: &'static str,
    opset: i64,
    attrs: &[AttributeProto],
    inputs: Vec<V>,
) -> KResult<Vec<Flat>> {
    Ok(run(op, opset, attrs, inputs, false)?.0)
}

/// Forward, then (with `backward`) the backward with every input and output visible and
/// fixed output gradients; run-time float inputs get gradients where differentiable.
pub fn run(
    op: &'static str,
    opset: i64,
    attrs: &[AttributeProto],
    inputs: Vec<V>,
    backward: bool,
) -> KResult<(Vec<Flat>, Vec<Option<Flat>>)> {
    let args = inputs.into_iter().map(arg).collect::<KResult<Vec<_>>>()?;
    let v = run_values(
        &Device::Cpu,
        op,
        opset,
        attrs,
        &args,
        1,
        1,
        backward.then_some(Seeds::Saw),
    )?;
    Ok((v.outputs, v.grads))
}

/// The values of the single output.
pub fn fwd1(op: &'static str, opset: i64, attrs: &[AttributeProto], inputs: Vec<V>) -> Vec<f64> {
    match fwd(op, opset, attrs, inputs) {
        Ok(mut v) if !v.is_empty() => v.swap_remove(0).1,
        Ok(_) => panic!("{op}: no output"),
        Err(e) => panic!("{op}: {e}"),
    }
}

/// Equal to within 1e-9 (absolute and relative); NaN matches NaN.
pub fn close(got: &[f64], want: &[f64]) {
    assert_allclose(got, want, 1e-9, 1e-9);
}
