//! The executor's constants: parameter and buffer values from the model file where it has
//! them (initializers and `Constant` nodes, read from the raw fields), a seeded initialization
//! where it does not, and the generated data inputs.

use super::kernel::{to_candle, KResult, KernelError, Rng};
use super::value::from_planner;
use candle_core::{Device, Tensor};
use remat_planner::model::{Model, ValueId, ValueKind};
use remat_planner::onnx::{decode_tensor_values, parse_model};
use remat_planner::tensor::{DType, Tensor as PTensor};
use std::collections::HashMap;

/// Tensor values stored in the file, by value name (top-level initializers and the `value`
/// of top-level `Constant` nodes).
pub fn stored_tensors(bytes: &[u8]) -> crate::error::Result<HashMap<String, PTensor>> {
    let proto = parse_model(bytes)?;
    let mut out = HashMap::new();
    let Some(g) = proto.graph.as_ref() else {
        return Ok(out);
    };
    for t in &g.initializer {
        if let Some(v) = decode_tensor_values(t, &t.name)? {
            out.insert(t.name.clone(), v);
        }
    }
    for n in &g.node {
        if n.op_type != "Constant" || n.output.len() != 1 {
            continue;
        }
        if let Some(a) = n.attribute.iter().find(|a| a.name == "value") {
            if let Some(t) = a.t.as_ref() {
                if let Some(v) = decode_tensor_values(t, &n.output[0])? {
                    out.insert(n.output[0].clone(), v);
                }
            }
        }
    }
    Ok(out)
}

/// FNV-1a of a name, mixed with a seed: the per-node and per-value seeds.
pub fn seed_for(seed: u64, name: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325 ^ seed;
    for b in name.as_bytes() {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// A seeded value for a parameter or buffer the file does not store. Weights (rank ≥ 2) are
/// uniform in ±1/√fan_in like PyTorch's default; vectors named like a scale or a variance are
/// near one, other vectors (biases, means) near zero.
pub fn init_value(
    name: &str,
    dtype: DType,
    shape: &[usize],
    seed: u64,
    dev: &Device,
) -> KResult<Tensor> {
    let n: usize = shape.iter().product();
    let mut rng = Rng::new(seed_for(seed, name));
    let lower = name.to_ascii_lowercase();
    let data: Vec<f64> = if !dtype.is_float() {
        vec![0.0; n]
    } else if shape.len() >= 2 {
        let fan_in: usize = shape[1..].iter().product::<usize>().max(1);
        let b = 1.0 / (fan_in as f64).sqrt();
        (0..n).map(|_| rng.uniform(-b, b)).collect()
    } else if ["weight", "scale", "gamma", "var"]
        .iter()
        .any(|k| lower.contains(k))
    {
        (0..n).map(|_| rng.uniform(0.9, 1.1)).collect()
    } else {
        (0..n).map(|_| rng.uniform(-0.1, 0.1)).collect()
    };
    super::value::on_device(
        Tensor::from_vec(data, shape.to_vec(), &Device::Cpu)?,
        to_candle(dtype)?,
        dev,
    )
}

/// The upper bound (exclusive) for the values of an integer data input: the row count of the
/// tables it indexes (`Gather` data, directly or through casts and views), else 2.
pub fn int_input_range(model: &Model, v: ValueId) -> i64 {
    let mut best: Option<i64> = None;
    let mut todo = vec![v];
    let mut seen = std::collections::HashSet::new();
    while let Some(x) = todo.pop() {
        if !seen.insert(x) {
            continue;
        }
        for ix in model.graph.node_indices() {
            let node = &model.graph[ix];
            for (slot, inp) in node.inputs.iter().enumerate() {
                if *inp != Some(x) {
                    continue;
                }
                match node.op_type.as_str() {
                    "Gather" if slot == 1 => {
                        let axis = remat_planner::onnx::Attrs {
                            node: &node.name,
                            op: &node.op_type,
                            list: &node.attrs,
                        }
                        .int_or("axis", 0)
                        .unwrap_or(0);
                        if let Some(f) = node.inputs[0].and_then(|d| model.values[d].fact.as_ref())
                        {
                            let r = f.shape.len() as i64;
                            let a = if axis < 0 { axis + r } else { axis };
                            if let Some(&rows) =
                                usize::try_from(a).ok().and_then(|a| f.shape.get(a))
                            {
                                let rows = rows as i64;
                                best = Some(best.map_or(rows, |b| b.min(rows)));
                            }
                        }
                    }
                    "Cast" | "Reshape" | "Unsqueeze" | "Squeeze" | "Flatten" | "Identity"
                    | "Expand" | "Slice" => {
                        todo.extend(node.outputs.iter().flatten().copied());
                    }
                    _ => {}
                }
            }
        }
    }
    best.unwrap_or(2).max(1)
}

/// A generated data input: floats uniform in [-1, 1), integers uniform in [0, range).
pub fn input_value(model: &Model, v: ValueId, seed: u64, dev: &Device) -> KResult<Tensor> {
    let val = &model.values[v];
    let f = val
        .fact
        .as_ref()
        .ok_or_else(|| KernelError::new(format!("input {:?} has no known shape", val.name)))?;
    let shape: Vec<usize> = f.shape.iter().map(|&d| d as usize).collect();
    let n: usize = shape.iter().product();
    let mut rng = Rng::new(seed_for(seed, &val.name));
    if f.dtype.is_float() {
        let data: Vec<f64> = (0..n).map(|_| rng.uniform(-1.0, 1.0)).collect();
        super::value::on_device(
            Tensor::from_vec(data, shape, &Device::Cpu)?,
            to_candle(f.dtype)?,
            dev,
        )
    } else {
        let hi = if f.dtype == DType::Bool {
            2
        } else {
            int_input_range(model, v)
        };
        let data: Vec<i64> = (0..n)
            .map(|_| (rng.next_u64() % hi as u64) as i64)
            .collect();
        super::value::on_device(
            Tensor::from_vec(data, shape, &Device::Cpu)?,
            to_candle(f.dtype)?,
            dev,
        )
    }
}

/// How the constants were obtained.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct ConstSources {
    pub params_from_file: usize,
    pub params_seeded: usize,
    pub buffers_from_file: usize,
    pub buffers_seeded: usize,
}

/// Values of every non-activation value a live node may read: parameters, buffers,
/// constants (folded values or stored tensors), seeded where the file has none. Derived
/// values, and buffers and constants computed in-graph without a value at import, are
/// computed later by running their folded nodes.
pub fn constants(
    model: &Model,
    stored: &HashMap<String, PTensor>,
    seed: u64,
    dev: &Device,
) -> KResult<(HashMap<ValueId, Tensor>, ConstSources)> {
    let mut out = HashMap::new();
    let mut src = ConstSources::default();
    for (v, val) in model.values.iter().enumerate() {
        if !matches!(
            val.kind,
            ValueKind::Param | ValueKind::Buffer | ValueKind::Const
        ) {
            continue;
        }
        let Some(f) = val.fact.as_ref() else { continue };
        let shape: Vec<usize> = f.shape.iter().map(|&d| d as usize).collect();
        let from_file = stored.get(&val.name).filter(|t| t.shape == f.shape);
        let t = if let Some(t) = from_file {
            match val.kind {
                ValueKind::Param => src.params_from_file += 1,
                ValueKind::Buffer => src.buffers_from_file += 1,
                _ => {}
            }
            from_planner(t, dev)?
        } else if let Some(t) = f.value.as_deref() {
            from_planner(t, dev)?
        } else if val.producer.is_some_and(|(p, _)| model.graph[p].folded) {
            // Computed by folded nodes at run time. A constant whose folded producer gave no
            // value at import (a CumSum of constants: CumSum has no fold rule) is a buffer, or
            // a parameter, when a live node reads it; seeded at random instead, it gave
            // torch.diagonal's gather indices, CumSum(ConstantOfShape) - 1, wrong values.
            continue;
        } else {
            match val.kind {
                ValueKind::Param => src.params_seeded += 1,
                ValueKind::Buffer => src.buffers_seeded += 1,
                _ => {}
            }
            init_value(&val.name, f.dtype, &shape, seed, dev)?
        };
        out.insert(v, t);
    }
    Ok((out, src))
}
