//! Ops that make tensors from attributes and shapes: Shape, Size, Constant, ConstantOfShape,
//! Range, OneHot, EyeLike, NonZero (never differentiable, always folded).

use super::common::coords;
use crate::error::Result;
use crate::onnx::decode_tensor;
use crate::ops::rule::{none, zero_flops, Ctx, OpSpec, Registry};
use crate::tensor::{numel, DType, Data, Fact, Tensor};

fn shape_infer(cx: &Ctx) -> Result<Vec<Fact>> {
    let x = cx.input(0)?;
    let r = x.rank() as i64;
    let clamp = |v: i64| (if v < 0 { v + r } else { v }).clamp(0, r) as usize;
    let start = clamp(cx.attrs.int_or("start", 0)?);
    let end = clamp(cx.attrs.int_or("end", r)?);
    let dims: Vec<i64> = x.shape[start..end.max(start)]
        .iter()
        .map(|&d| d as i64)
        .collect();
    Ok(vec![Fact::with_value(Tensor::ints(
        vec![dims.len() as u64],
        dims,
    ))])
}

/// A constant value from a `Constant` node's attributes.
fn constant_infer(cx: &Ctx) -> Result<Vec<Fact>> {
    let a = &cx.attrs;
    if let Some(t) = a.tensor("value")? {
        let d = decode_tensor(t, cx.node)?;
        return Ok(vec![match d.value {
            Some(v) => Fact::with_value(v),
            None => Fact::new(d.dtype, d.shape),
        }]);
    }
    if let Some(f) = a.float("value_float")? {
        return Ok(vec![Fact::with_value(Tensor::new(
            DType::F32,
            vec![],
            Data::F(vec![f64::from(f)]),
        ))]);
    }
    if let Some(f) = a.floats("value_floats")? {
        let v: Vec<f64> = f.iter().map(|&x| f64::from(x)).collect();
        return Ok(vec![Fact::with_value(Tensor::new(
            DType::F32,
            vec![v.len() as u64],
            Data::F(v),
        ))]);
    }
    if let Some(i) = a.int("value_int")? {
        return Ok(vec![Fact::with_value(Tensor::ints(vec![], vec![i]))]);
    }
    if let Some(i) = a.ints("value_ints")? {
        return Ok(vec![Fact::with_value(Tensor::ints(
            vec![i.len() as u64],
            i.to_vec(),
        ))]);
    }
    if a.has("value_string") || a.has("value_strings") {
        let n = a
            .list
            .iter()
            .find(|x| x.name == "value_strings")
            .map(|x| x.strings.len());
        return Ok(vec![Fact::new(
            DType::String,
            n.map(|n| vec![n as u64]).unwrap_or_default(),
        )]);
    }
    if a.has("sparse_value") {
        return Err(a.err("sparse_value", "sparse constants are not supported"));
    }
    Err(cx.err("Constant has no value attribute"))
}

fn constant_of_shape_infer(cx: &Ctx) -> Result<Vec<Fact>> {
    let dims = cx
        .const_ints(0)?
        .ok_or_else(|| cx.err("shape input is missing"))?;
    let mut shape = Vec::with_capacity(dims.len());
    for &d in &dims {
        if d < 0 {
            return Err(cx.err(format!("negative dimension {d} in shape {dims:?}")));
        }
        shape.push(d as u64);
    }
    let fill = match cx.attrs.tensor("value")? {
        Some(t) => {
            let d = decode_tensor(t, cx.node)?;
            if numel(&d.shape) != Some(1) {
                return Err(cx.attrs.err(
                    "value",
                    format!("has shape {:?}; it must hold one value", d.shape),
                ));
            }
            let v = d
                .value
                .as_ref()
                .and_then(|v| v.data.get_f64(0))
                .unwrap_or(0.0);
            (d.dtype, v)
        }
        None => (DType::F32, 0.0),
    };
    let n =
        numel(&shape).ok_or_else(|| cx.err(format!("shape {shape:?} has too many elements")))?;
    if crate::tensor::keep_value(fill.0, n) {
        let t = Tensor::new(fill.0, shape, Data::F(vec![fill.1; n as usize]));
        return Ok(vec![Fact::with_value(t)]);
    }
    Ok(vec![Fact::new(fill.0, shape)])
}

fn range_infer(cx: &Ctx) -> Result<Vec<Fact>> {
    let dtype = cx.input(0)?.dtype;
    let get = |i| -> Result<f64> {
        cx.const_floats(i)?
            .and_then(|v| v.first().copied())
            .ok_or_else(|| cx.err(format!("input {i} must be a scalar")))
    };
    let (start, limit, delta) = (get(0)?, get(1)?, get(2)?);
    if delta == 0.0 || !delta.is_finite() || !start.is_finite() || !limit.is_finite() {
        return Err(cx.err(format!("invalid range {start}..{limit} step {delta}")));
    }
    let n = ((limit - start) / delta).ceil().max(0.0);
    if n > 1e15 {
        return Err(cx.err(format!("range of {n} elements is too large")));
    }
    let n = n as u64;
    if crate::tensor::keep_value(dtype, n) {
        let v: Vec<f64> = (0..n).map(|i| start + i as f64 * delta).collect();
        return Ok(vec![Fact::with_value(Tensor::new(
            dtype,
            vec![n],
            Data::F(v),
        ))]);
    }
    Ok(vec![Fact::new(dtype, vec![n])])
}
fn onehot_infer(cx: &Ctx) -> Result<Vec<Fact>> {
    let ind = cx.input(0)?;
    let depth = cx
        .const_floats(1)?
        .and_then(|v| v.first().copied())
        .ok_or_else(|| cx.err("depth must be a scalar"))?;
    if !(1.0..1e12).contains(&depth) {
        return Err(cx.err(format!("invalid depth {depth}")));
    }
    let values = cx.input(2)?;
    let rank = ind.rank() + 1;
    let axis = cx.axis(cx.attrs.int_or("axis", -1)?, rank)?;
    let mut shape = ind.shape.clone();
    shape.insert(axis, depth as u64);
    Ok(vec![cx.fact(values.dtype, shape)?])
}
fn nonzero_infer(cx: &Ctx) -> Result<Vec<Fact>> {
    let x = cx.input(0)?;
    let v = x
        .value
        .as_ref()
        .ok_or_else(|| cx.data_dependent("the indices of non-zero elements depend on data"))?;
    let nz: Vec<Vec<u64>> = coords(&x.shape)
        .zip(v.as_f64())
        .filter(|(_, val)| *val != 0.0)
        .map(|(c, _)| c)
        .collect();
    let r = x.rank();
    let mut data = Vec::with_capacity(r * nz.len());
    for k in 0..r {
        data.extend(nz.iter().map(|c| c[k] as i64));
    }
    Ok(vec![Fact::with_value(Tensor::ints(
        vec![r as u64, nz.len() as u64],
        data,
    ))])
}

pub(super) fn register(r: &mut Registry) {
    // Shape sources: never differentiable, always folded.
    let source = |infer: fn(&Ctx) -> Result<Vec<Fact>>| OpSpec {
        infer,
        flops: zero_flops,
        diff_in: none,
        diff_out: none,
        ..OpSpec::DEFAULT
    };
    r.insert("Shape", source(shape_infer));
    r.insert(
        "Size",
        source(|cx| {
            let n = cx.input(0)?.numel();
            Ok(vec![Fact::with_value(Tensor::ints(vec![], vec![n as i64]))])
        }),
    );
    r.insert("Constant", source(constant_infer));
    r.insert("ConstantOfShape", source(constant_of_shape_infer));
    r.insert("Range", source(range_infer));
    r.insert("OneHot", source(onehot_infer));
    r.insert("NonZero", source(nonzero_infer));
    r.insert(
        "EyeLike",
        source(|cx| {
            let x = cx.input(0)?;
            let dtype = match cx.attrs.int("dtype")? {
                Some(d) => {
                    DType::from_onnx(d).ok_or_else(|| cx.attrs.err("dtype", "unknown type"))?
                }
                None => x.dtype,
            };
            Ok(vec![Fact::new(dtype, x.shape.clone())])
        }),
    );
}
