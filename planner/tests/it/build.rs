//! A tiny ONNX model builder for tests, on the protobuf types.

use onnx_protobuf::attribute_proto::AttributeType;
use onnx_protobuf::tensor_shape_proto::{dimension, Dimension};
use onnx_protobuf::type_proto::{Tensor as TypeTensor, Value as TypeValue};
use onnx_protobuf::{
    AttributeProto, GraphProto, Message, ModelProto, NodeProto, OperatorSetIdProto, TensorProto,
    TensorShapeProto, TypeProto, ValueInfoProto,
};

pub const F32: i32 = 1;
pub const I64: i32 = 7;
pub const BOOL: i32 = 9;

/// A dim of a declared input: fixed, symbolic, or neither (no value and no name).
#[derive(Clone, Copy, Debug)]
pub enum D {
    V(i64),
    P(&'static str),
    U,
}

pub fn value_info(name: &str, elem: i32, dims: &[D]) -> ValueInfoProto {
    let mut shape = TensorShapeProto::new();
    for d in dims {
        let mut dim = Dimension::new();
        dim.value = match d {
            D::V(v) => Some(dimension::Value::DimValue(*v)),
            D::P(p) => Some(dimension::Value::DimParam(p.to_string())),
            D::U => None,
        };
        shape.dim.push(dim);
    }
    let mut tt = TypeTensor::new();
    tt.elem_type = elem;
    tt.shape = Some(shape).into();
    let mut tp = TypeProto::new();
    tp.value = Some(TypeValue::TensorType(tt));
    let mut v = ValueInfoProto::new();
    v.name = name.into();
    v.type_ = Some(tp).into();
    v
}

pub fn tensor_f32(name: &str, dims: &[i64], values: &[f32]) -> TensorProto {
    let mut t = TensorProto::new();
    t.name = name.into();
    t.dims = dims.to_vec();
    t.data_type = F32;
    t.raw_data = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    t
}

pub fn tensor_i64(name: &str, dims: &[i64], values: &[i64]) -> TensorProto {
    let mut t = TensorProto::new();
    t.name = name.into();
    t.dims = dims.to_vec();
    t.data_type = I64;
    t.int64_data = values.to_vec();
    t
}

pub fn tensor_bool(name: &str, v: bool) -> TensorProto {
    let mut t = TensorProto::new();
    t.name = name.into();
    t.data_type = BOOL;
    t.int32_data = vec![i32::from(v)];
    t
}

fn attr(name: &str, ty: AttributeType) -> AttributeProto {
    let mut a = AttributeProto::new();
    a.name = name.into();
    a.type_ = ty.into();
    a
}
pub fn a_int(name: &str, v: i64) -> AttributeProto {
    let mut a = attr(name, AttributeType::INT);
    a.i = v;
    a
}
pub fn a_ints(name: &str, v: &[i64]) -> AttributeProto {
    let mut a = attr(name, AttributeType::INTS);
    a.ints = v.to_vec();
    a
}
pub fn a_float(name: &str, v: f32) -> AttributeProto {
    let mut a = attr(name, AttributeType::FLOAT);
    a.f = v;
    a
}
pub fn a_floats(name: &str, v: &[f32]) -> AttributeProto {
    let mut a = attr(name, AttributeType::FLOATS);
    a.floats = v.to_vec();
    a
}
pub fn a_str(name: &str, v: &str) -> AttributeProto {
    let mut a = attr(name, AttributeType::STRING);
    a.s = v.as_bytes().to_vec();
    a
}
pub fn a_tensor(name: &str, t: TensorProto) -> AttributeProto {
    let mut a = attr(name, AttributeType::TENSOR);
    a.t = Some(t).into();
    a
}
pub fn a_graph(name: &str, g: GraphProto) -> AttributeProto {
    let mut a = attr(name, AttributeType::GRAPH);
    a.g = Some(g).into();
    a
}

/// A graph under construction.
#[derive(Clone, Default)]
pub struct G {
    pub graph: GraphProto,
    pub opset: i64,
}

impl G {
    pub fn new(opset: i64) -> G {
        G {
            graph: GraphProto::new(),
            opset,
        }
    }

    pub fn input(mut self, name: &str, elem: i32, dims: &[D]) -> G {
        self.graph.input.push(value_info(name, elem, dims));
        self
    }

    pub fn output(mut self, name: &str) -> G {
        let mut v = ValueInfoProto::new();
        v.name = name.into();
        self.graph.output.push(v);
        self
    }

    pub fn init(mut self, t: TensorProto) -> G {
        self.graph.initializer.push(t);
        self
    }

    /// A float initializer of zeros.
    pub fn weight(self, name: &str, dims: &[i64]) -> G {
        let n: i64 = dims.iter().product();
        self.init(tensor_f32(name, dims, &vec![0.0; n as usize]))
    }

    pub fn ints(self, name: &str, values: &[i64]) -> G {
        self.init(tensor_i64(name, &[values.len() as i64], values))
    }

    pub fn node(
        mut self,
        op: &str,
        name: &str,
        inputs: &[&str],
        outputs: &[&str],
        attrs: Vec<AttributeProto>,
    ) -> G {
        let mut n = NodeProto::new();
        n.op_type = op.into();
        n.name = name.into();
        n.input = inputs.iter().map(|s| s.to_string()).collect();
        n.output = outputs.iter().map(|s| s.to_string()).collect();
        n.attribute = attrs;
        self.graph.node.push(n);
        self
    }

    pub fn node_in(
        mut self,
        domain: &str,
        op: &str,
        name: &str,
        inputs: &[&str],
        outputs: &[&str],
    ) -> G {
        self = self.node(op, name, inputs, outputs, vec![]);
        if let Some(n) = self.graph.node.last_mut() {
            n.domain = domain.into();
        }
        self
    }

    pub fn model(&self) -> ModelProto {
        let mut m = ModelProto::new();
        m.ir_version = 8;
        m.producer_name = "remat-tests".into();
        let mut o = OperatorSetIdProto::new();
        o.version = self.opset;
        m.opset_import.push(o);
        m.graph = Some(self.graph.clone()).into();
        m
    }

    pub fn bytes(&self) -> Vec<u8> {
        self.model().write_to_bytes().unwrap_or_default()
    }
}

/// An MLP `x[batch, 4] → Gemm(W1: 8×4, transB) → Relu → Gemm(W2: 3×8, transB) → y`, with
/// weights as graph inputs (exported without parameters).
pub fn mlp() -> G {
    G::new(17)
        .input("x", F32, &[D::P("batch"), D::V(4)])
        .input("w1", F32, &[D::V(8), D::V(4)])
        .input("b1", F32, &[D::V(8)])
        .input("w2", F32, &[D::V(3), D::V(8)])
        .node(
            "Gemm",
            "fc1",
            &["x", "w1", "b1"],
            &["h"],
            vec![a_int("transB", 1)],
        )
        .node("Relu", "relu", &["h"], &["r"], vec![])
        .node(
            "Gemm",
            "fc2",
            &["r", "w2"],
            &["y"],
            vec![a_int("transB", 1)],
        )
        .output("y")
}

pub fn dims(pairs: &[(&str, u64)]) -> remat_planner::ImportOptions {
    let mut o = remat_planner::ImportOptions::default();
    for (k, v) in pairs {
        o.dims.insert(k.to_string(), *v);
    }
    o
}
