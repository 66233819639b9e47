//! Reading the ONNX protobuf: parsing, typed attribute getters and tensor decoding. Raw
//! protobuf fields only: `onnx-protobuf`'s `as_value()` helpers panic on malformed input and
//! must never see untrusted bytes.

use crate::error::{PlannerError, Result};
use crate::tensor::{bytes_of, keep_value, numel, DType, Data, Tensor};
use onnx_protobuf::attribute_proto::AttributeType;
use onnx_protobuf::{AttributeProto, GraphProto, Message, ModelProto, TensorProto};

/// Parses a model, mapping protobuf errors and rejecting a model without a graph.
pub fn parse_model(bytes: &[u8]) -> Result<ModelProto> {
    // The protobuf library accepts a message cut where one of its fields ends even when the
    // graph's declared length runs past the end of the bytes (a truncated upload would be
    // imported without its last nodes, initializers or outputs): every top-level field must
    // end within the bytes.
    graph_bytes(bytes)?;
    let model = ModelProto::parse_from_bytes(bytes).map_err(|e| PlannerError::Malformed {
        what: format!("not a valid ONNX protobuf: {e}"),
    })?;
    if model.graph.is_none() {
        return Err(PlannerError::Malformed {
            what: "the protobuf has no graph (is this an ONNX model?)".into(),
        });
    }
    Ok(model)
}

/// Checks what [`parse_model`] would refuse first without building the model: that `bytes` are
/// a well-formed protobuf with a graph, whose nodes and value infos parse. The tensors'
/// bytes (initializers, sparse initializers) are stepped over, not copied, so a service can
/// refuse a body that is no model before it stores the bytes without holding the model twice;
/// a tensor malformed inside is refused by the import ([`parse_model`]).
pub fn check_model_bytes(bytes: &[u8]) -> Result<()> {
    let Some(graph) = graph_bytes(bytes)? else {
        return Err(PlannerError::Malformed {
            what: "the protobuf has no graph (is this an ONNX model?)".into(),
        });
    };
    fields(graph, &mut |field, body| {
        let Some(body) = body else { return Ok(()) };
        let parsed = match field {
            GRAPH_NODE => onnx_protobuf::NodeProto::parse_from_bytes(body).map(drop),
            GRAPH_INPUT | GRAPH_OUTPUT | GRAPH_VALUE_INFO => {
                onnx_protobuf::ValueInfoProto::parse_from_bytes(body).map(drop)
            }
            _ => Ok(()),
        };
        parsed.map_err(|e| format!("graph field {field}: {e}"))
    })
    .map_err(not_protobuf)
}

fn not_protobuf(what: String) -> PlannerError {
    PlannerError::Malformed {
        what: format!("not a valid ONNX protobuf: {what}"),
    }
}

/// Walks the top-level fields of a `ModelProto` (each must end within `bytes`) and answers the
/// graph's bytes, if it has a graph.
fn graph_bytes(bytes: &[u8]) -> Result<Option<&[u8]>> {
    let mut graph = None;
    fields(bytes, &mut |field, body| {
        if field == MODEL_GRAPH {
            graph = Some(body.ok_or("the graph field is not a message")?);
        }
        Ok(())
    })
    .map_err(not_protobuf)?;
    Ok(graph)
}

/// `ModelProto.graph`, and the `GraphProto` fields [`check_model_bytes`] parses.
const MODEL_GRAPH: u32 = 7;
const GRAPH_NODE: u32 = 1;
const GRAPH_INPUT: u32 = 11;
const GRAPH_OUTPUT: u32 = 12;
const GRAPH_VALUE_INFO: u32 = 13;

/// Walks the fields of one protobuf message, handing `f` each field's number and, for a
/// length-delimited one, its bytes; any wire error (a bad tag, a length past the end) is the
/// answer.
fn fields<'a>(
    bytes: &'a [u8],
    f: &mut dyn FnMut(u32, Option<&'a [u8]>) -> std::result::Result<(), String>,
) -> std::result::Result<(), String> {
    use protobuf::rt::WireType;
    let mut is = protobuf::CodedInputStream::from_bytes(bytes);
    while let Some(tag) = is.read_raw_tag_or_eof().map_err(|e| e.to_string())? {
        let (field, wire) = (tag >> 3, tag & 7);
        let wire = WireType::new(wire)
            .filter(|_| field > 0)
            .ok_or_else(|| format!("bad tag {tag} at byte {}", is.pos()))?;
        if wire == WireType::LengthDelimited {
            let len = is.read_raw_varint32().map_err(|e| e.to_string())?;
            let start = is.pos() as usize;
            is.skip_raw_bytes(len).map_err(|e| e.to_string())?;
            f(field, bytes.get(start..start + len as usize))?;
        } else {
            is.skip_field(wire).map_err(|e| e.to_string())?;
            f(field, None)?;
        }
    }
    Ok(())
}

/// Typed attribute access for one node; every error names the node, op and attribute.
#[derive(Clone, Copy)]
pub struct Attrs<'a> {
    pub node: &'a str,
    pub op: &'a str,
    pub list: &'a [AttributeProto],
}

impl<'a> Attrs<'a> {
    pub fn err(&self, attribute: &str, message: impl Into<String>) -> PlannerError {
        PlannerError::Attribute {
            node: self.node.to_string(),
            op_type: self.op.to_string(),
            attribute: attribute.to_string(),
            message: message.into(),
        }
    }

    fn find(&self, name: &str, want: AttributeType) -> Result<Option<&'a AttributeProto>> {
        let Some(a) = self.list.iter().find(|a| a.name == name) else {
            return Ok(None);
        };
        match a.type_.enum_value() {
            Ok(t) if t == want => Ok(Some(a)),
            // Very old models leave the type unset; trust the field that is read.
            Ok(AttributeType::UNDEFINED) => Ok(Some(a)),
            Ok(t) => Err(self.err(name, format!("expected a {want:?} attribute, found {t:?}"))),
            Err(code) => Err(self.err(name, format!("unknown attribute type code {code}"))),
        }
    }

    pub fn has(&self, name: &str) -> bool {
        self.list.iter().any(|a| a.name == name)
    }

    pub fn int(&self, name: &str) -> Result<Option<i64>> {
        Ok(self.find(name, AttributeType::INT)?.map(|a| a.i))
    }

    pub fn int_or(&self, name: &str, default: i64) -> Result<i64> {
        Ok(self.int(name)?.unwrap_or(default))
    }

    pub fn float(&self, name: &str) -> Result<Option<f32>> {
        Ok(self.find(name, AttributeType::FLOAT)?.map(|a| a.f))
    }

    pub fn float_or(&self, name: &str, default: f32) -> Result<f32> {
        Ok(self.float(name)?.unwrap_or(default))
    }

    pub fn ints(&self, name: &str) -> Result<Option<&'a [i64]>> {
        Ok(self
            .find(name, AttributeType::INTS)?
            .map(|a| a.ints.as_slice()))
    }

    pub fn floats(&self, name: &str) -> Result<Option<&'a [f32]>> {
        Ok(self
            .find(name, AttributeType::FLOATS)?
            .map(|a| a.floats.as_slice()))
    }

    pub fn string(&self, name: &str) -> Result<Option<String>> {
        Ok(self
            .find(name, AttributeType::STRING)?
            .map(|a| String::from_utf8_lossy(&a.s).into_owned()))
    }

    pub fn tensor(&self, name: &str) -> Result<Option<&'a TensorProto>> {
        match self.find(name, AttributeType::TENSOR)? {
            None => Ok(None),
            Some(a) => match a.t.as_ref() {
                Some(t) => Ok(Some(t)),
                None => Err(self.err(name, "tensor attribute has no tensor")),
            },
        }
    }

    pub fn graph(&self, name: &str) -> Result<Option<&'a GraphProto>> {
        match self.find(name, AttributeType::GRAPH)? {
            None => Ok(None),
            Some(a) => match a.g.as_ref() {
                Some(g) => Ok(Some(g)),
                None => Err(self.err(name, "graph attribute has no graph")),
            },
        }
    }
}

/// A decoded initializer or constant: its type, shape and, when small enough and stored
/// inline, its values.
pub struct Decoded {
    pub dtype: DType,
    pub shape: Vec<u64>,
    pub value: Option<Tensor>,
}

fn malformed(what: String) -> PlannerError {
    PlannerError::Malformed { what }
}

/// Decodes a `TensorProto` from its raw fields. `what` names it in errors.
pub fn decode_tensor(t: &TensorProto, what: &str) -> Result<Decoded> {
    let dtype = DType::from_onnx(i64::from(t.data_type)).ok_or_else(|| {
        malformed(format!(
            "tensor {what:?} has unknown or undefined data type {}",
            t.data_type
        ))
    })?;
    let mut shape = Vec::with_capacity(t.dims.len());
    for &d in &t.dims {
        if d < 0 {
            return Err(PlannerError::InvalidDim {
                what: format!("tensor {what:?}"),
                value: d.to_string(),
                message: "tensor dimensions must be non-negative".into(),
            });
        }
        shape.push(d as u64);
    }
    let n = numel(&shape).ok_or_else(|| PlannerError::InvalidDim {
        what: format!("tensor {what:?}"),
        value: format!("{shape:?}"),
        message: "the element count of this shape overflows".into(),
    })?;
    let external = t.data_location.value() == 1 || !t.external_data.is_empty();
    if external || t.segment.is_some() {
        return Ok(Decoded {
            dtype,
            shape,
            value: None,
        });
    }
    // Check the inline data's length whatever its size: a lying tensor is malformed.
    let has_data = if !t.raw_data.is_empty() {
        let want = bytes_of(dtype, n);
        if t.raw_data.len() as u64 != want {
            return Err(malformed(format!(
                "tensor {what:?} of shape {shape:?} ({dtype:?}) needs {want} raw_data bytes but holds {}",
                t.raw_data.len()
            )));
        }
        true
    } else if let Some(stored) = typed_elements(t, dtype) {
        // 4-bit types pack two elements into each int32_data entry.
        let n = if dtype.bits() == 4 { n.div_ceil(2) } else { n };
        if stored != n {
            return Err(malformed(format!(
                "tensor {what:?} of shape {shape:?} ({dtype:?}) needs {n} elements but holds {stored}"
            )));
        }
        true
    } else {
        false
    };
    if n == 0 && dtype != DType::String {
        let data = if dtype.is_float() {
            Data::F(vec![])
        } else {
            Data::I(vec![])
        };
        return Ok(Decoded {
            dtype,
            value: Some(Tensor::new(dtype, shape.clone(), data)),
            shape,
        });
    }
    if !has_data || !keep_value(dtype, n) || dtype == DType::String {
        return Ok(Decoded {
            dtype,
            shape,
            value: None,
        });
    }
    let data = decode_values(t, dtype, n as usize);
    Ok(Decoded {
        dtype,
        value: data.map(|d| Tensor::new(dtype, shape.clone(), d)),
        shape,
    })
}

/// Elements stored in the typed fields; `None` when they are empty.
fn typed_elements(t: &TensorProto, dtype: DType) -> Option<u64> {
    let n = match dtype {
        DType::F32 => t.float_data.len() as u64,
        DType::C64 => t.float_data.len() as u64 / 2,
        DType::F64 => t.double_data.len() as u64,
        DType::C128 => t.double_data.len() as u64 / 2,
        DType::I64 => t.int64_data.len() as u64,
        DType::U32 | DType::U64 => t.uint64_data.len() as u64,
        DType::String => t.string_data.len() as u64,
        _ => t.int32_data.len() as u64,
    };
    (n > 0).then_some(n)
}

fn f16_to_f64(bits: u16) -> f64 {
    let sign = if bits & 0x8000 != 0 { -1.0 } else { 1.0 };
    let exp = i32::from((bits >> 10) & 0x1f);
    let frac = f64::from(bits & 0x3ff);
    match exp {
        0 => sign * frac * 2f64.powi(-24),
        31 => {
            if frac == 0.0 {
                sign * f64::INFINITY
            } else {
                f64::NAN
            }
        }
        _ => sign * (1.0 + frac / 1024.0) * 2f64.powi(exp - 15),
    }
}

fn bf16_to_f64(bits: u16) -> f64 {
    f64::from(f32::from_bits(u32::from(bits) << 16))
}

pub fn decode_values(t: &TensorProto, dtype: DType, n: usize) -> Option<Data> {
    use DType::*;
    let raw = &t.raw_data;
    if !raw.is_empty() {
        let w = (dtype.bits() / 8) as usize;
        let chunk = |i: usize| raw.get(i * w..(i + 1) * w);
        let mut ints = Vec::with_capacity(n);
        let mut floats = Vec::with_capacity(n);
        for i in 0..n {
            let c = chunk(i)?;
            match dtype {
                F32 => floats.push(f64::from(f32::from_le_bytes(c.try_into().ok()?))),
                F64 => floats.push(f64::from_le_bytes(c.try_into().ok()?)),
                F16 => floats.push(f16_to_f64(u16::from_le_bytes(c.try_into().ok()?))),
                Bf16 => floats.push(bf16_to_f64(u16::from_le_bytes(c.try_into().ok()?))),
                I64 => ints.push(i64::from_le_bytes(c.try_into().ok()?)),
                U64 => ints.push(u64::from_le_bytes(c.try_into().ok()?) as i64),
                I32 => ints.push(i64::from(i32::from_le_bytes(c.try_into().ok()?))),
                U32 => ints.push(i64::from(u32::from_le_bytes(c.try_into().ok()?))),
                I16 => ints.push(i64::from(i16::from_le_bytes(c.try_into().ok()?))),
                U16 => ints.push(i64::from(u16::from_le_bytes(c.try_into().ok()?))),
                I8 => ints.push(i64::from(*c.first()? as i8)),
                U8 => ints.push(i64::from(*c.first()?)),
                Bool => ints.push(i64::from(*c.first()? != 0)),
                _ => return None,
            }
        }
        return Some(if dtype.is_float() {
            Data::F(floats)
        } else {
            Data::I(ints)
        });
    }
    Some(match dtype {
        F32 => Data::F(t.float_data.iter().take(n).map(|&x| f64::from(x)).collect()),
        F64 => Data::F(t.double_data.iter().take(n).copied().collect()),
        F16 => Data::F(
            t.int32_data
                .iter()
                .take(n)
                .map(|&x| f16_to_f64(x as u16))
                .collect(),
        ),
        Bf16 => Data::F(
            t.int32_data
                .iter()
                .take(n)
                .map(|&x| bf16_to_f64(x as u16))
                .collect(),
        ),
        I64 => Data::I(t.int64_data.iter().take(n).copied().collect()),
        U32 | U64 => Data::I(t.uint64_data.iter().take(n).map(|&x| x as i64).collect()),
        I32 | I16 | I8 | U16 | U8 | Bool => {
            Data::I(t.int32_data.iter().take(n).map(|&x| i64::from(x)).collect())
        }
        _ => return None,
    })
}

/// Decodes a tensor's values whatever their size (the executor's weights). `Ok(None)` when
/// the tensor has no inline data (external data, no data) or holds strings.
pub fn decode_tensor_values(t: &TensorProto, what: &str) -> Result<Option<Tensor>> {
    let d = decode_tensor(t, what)?;
    if let Some(v) = d.value {
        return Ok(Some(v));
    }
    let n = numel(&d.shape).unwrap_or(0);
    let external = t.data_location.value() == 1 || !t.external_data.is_empty();
    let inline = !t.raw_data.is_empty() || typed_elements(t, d.dtype).is_some();
    if external || !inline || d.dtype == DType::String {
        return Ok(None);
    }
    let n = usize::try_from(n).map_err(|_| malformed(format!("tensor {what:?} is too large")))?;
    Ok(decode_values(t, d.dtype, n).map(|data| Tensor::new(d.dtype, d.shape, data)))
}
