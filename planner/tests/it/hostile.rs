//! Random graphs of registry ops with random (often invalid) attributes, constant inputs and
//! dims: import returns `Ok` or a `PlannerError`, never panics.

use crate::build::*;
use onnx_protobuf::AttributeProto;
use proptest::prelude::*;
use remat_planner::{inspect, ImportOptions};

const OPS: &[&str] = &[
    "Relu",
    "Add",
    "Mul",
    "Div",
    "Pow",
    "MatMul",
    "Gemm",
    "Conv",
    "ConvTranspose",
    "MaxPool",
    "AveragePool",
    "GlobalAveragePool",
    "BatchNormalization",
    "LayerNormalization",
    "Softmax",
    "Reshape",
    "Flatten",
    "Transpose",
    "Squeeze",
    "Unsqueeze",
    "Concat",
    "Split",
    "Slice",
    "Gather",
    "Expand",
    "Tile",
    "Pad",
    "Resize",
    "ReduceMean",
    "ReduceSum",
    "ArgMax",
    "Cast",
    "Shape",
    "ConstantOfShape",
    "Range",
    "Where",
    "Equal",
    "TopK",
    "OneHot",
    "Einsum",
    "LSTM",
    "DepthToSpace",
    "CumSum",
    "Trilu",
    "Clip",
    "Dropout",
    "Sum",
    "Max",
    "GatherElements",
    "ScatterND",
    "NonZero",
    "Upsample",
    "InstanceNormalization",
    "GroupNormalization",
    "LRN",
    "STFT",
    "DFT",
    "HannWindow",
    "MelWeightMatrix",
    "Attention",
    "RMSNormalization",
    "RotaryEmbedding",
    "LpPool",
    "GlobalLpPool",
    "MaxUnpool",
    "RoiAlign",
    "Col2Im",
    "CenterCropPad",
    "AffineGrid",
    "SoftmaxCrossEntropyLoss",
    "NegativeLogLikelihoodLoss",
    "HardSigmoid",
    "SpaceToDepth",
    "Mod",
    "BitShift",
    "QuantizeLinear",
    "ReduceMax",
    "LpNormalization",
];

const ATTRS: &[&str] = &[
    "axis",
    "axes",
    "perm",
    "pads",
    "kernel_shape",
    "strides",
    "dilations",
    "group",
    "to",
    "keepdims",
    "transA",
    "transB",
    "split",
    "blocksize",
    "hidden_size",
    "num_outputs",
    "k",
    "starts",
    "ends",
    "training_mode",
    "num_groups",
    "allowzero",
    "ceil_mode",
    "output_padding",
    "onesided",
    "inverse",
    "q_num_heads",
    "kv_num_heads",
    "num_heads",
    "output_height",
    "output_width",
    "output_datatype",
    "output_dtype",
    "left_window_size",
    "right_window_size",
    "fmod",
    "stash_type",
    "block_size",
];

fn int_value() -> impl Strategy<Value = i64> {
    prop_oneof![
        8 => -3i64..6,
        1 => Just(i64::MAX),
        1 => Just(i64::MIN),
        1 => Just(1 << 40),
        1 => Just(-(1 << 40)),
    ]
}

fn attr() -> impl Strategy<Value = AttributeProto> {
    (
        proptest::sample::select(ATTRS),
        prop_oneof![int_value().prop_map(Some), Just(None),],
        proptest::collection::vec(int_value(), 0..5),
    )
        .prop_map(|(name, single, list)| match single {
            Some(v) => a_int(name, v),
            None => a_ints(name, &list),
        })
}

#[derive(Debug, Clone)]
struct NodeSpec {
    op: &'static str,
    inputs: Vec<usize>,
    consts: Vec<Vec<i64>>,
    attrs: Vec<AttributeProto>,
    outputs: usize,
}

fn node() -> impl Strategy<Value = NodeSpec> {
    (
        proptest::sample::select(OPS),
        proptest::collection::vec(0usize..64, 1..3),
        proptest::collection::vec(proptest::collection::vec(int_value(), 0..5), 0..3),
        proptest::collection::vec(attr(), 0..4),
        1usize..3,
    )
        .prop_map(|(op, inputs, consts, attrs, outputs)| NodeSpec {
            op,
            inputs,
            consts,
            attrs,
            outputs,
        })
}

fn build(dims: &[i64], nodes: &[NodeSpec], opset: i64) -> G {
    let d: Vec<D> = dims.iter().map(|&x| D::V(x)).collect();
    let mut g = G::new(opset).input("x", F32, &d);
    let mut values = vec!["x".to_string()];
    for (k, n) in nodes.iter().enumerate() {
        let mut inputs: Vec<String> = n
            .inputs
            .iter()
            .map(|&i| values[i % values.len()].clone())
            .collect();
        for (c, v) in n.consts.iter().enumerate() {
            let name = format!("c{k}_{c}");
            g = g.ints(&name, v);
            inputs.push(name);
        }
        let outs: Vec<String> = (0..n.outputs).map(|o| format!("v{k}_{o}")).collect();
        let in_refs: Vec<&str> = inputs.iter().map(|s| s.as_str()).collect();
        let out_refs: Vec<&str> = outs.iter().map(|s| s.as_str()).collect();
        g = g.node(n.op, &format!("n{k}"), &in_refs, &out_refs, n.attrs.clone());
        values.extend(outs);
    }
    let last = values.last().cloned().unwrap_or_default();
    g.output(&last)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1024, ..ProptestConfig::default() })]
    #[test]
    fn random_graphs_never_panic(
        dims in proptest::collection::vec(1i64..6, 0..6),
        nodes in proptest::collection::vec(node(), 1..6),
        opset in 9i64..29,
    ) {
        let bytes = build(&dims, &nodes, opset).bytes();
        let result = std::panic::catch_unwind(|| inspect(&bytes, &Default::default()).map(|r| r.nodes));
        prop_assert!(result.is_ok(), "import panicked on {:?}", nodes);
    }
}

/// A declared dim in each way exporters write one: fixed, -1 (Paddle), neither value nor
/// name, `?` (Paddle), a name, or an invalid negative value.
fn dim() -> impl Strategy<Value = D> {
    prop_oneof![
        (1i64..6).prop_map(D::V),
        Just(D::V(-1)),
        Just(D::U),
        Just(D::P("?")),
        Just(D::P("")),
        Just(D::P("batch")),
        (-4i64..-1).prop_map(D::V),
    ]
}

/// The name remat binds a declared dim of input `x` by, if it is dynamic.
fn bound_name(axis: usize, d: &D) -> Option<String> {
    match d {
        D::V(-1) | D::U | D::P("?") | D::P("") => Some(format!("x:{axis}")),
        D::P(p) => Some(p.to_string()),
        D::V(_) => None,
    }
}

/// A stray binding as a user might type it: `INPUT:AXIS` (in range or not), the older
/// `INPUT.AXIS`, a name, `?`, or something malformed.
fn stray() -> impl Strategy<Value = String> {
    prop_oneof![
        (0usize..6).prop_map(|a| format!("x:{a}")),
        (0usize..3).prop_map(|a| format!("x.{a}")),
        Just("batch".to_string()),
        Just("?".to_string()),
        Just("x:".to_string()),
        Just(":0".to_string()),
        Just("x:-1".to_string()),
        Just("y:0".to_string()),
        Just("x:99999999999999999999".to_string()),
        Just("x:0:1".to_string()),
    ]
}

/// A bound value: mostly small, sometimes 0 or huge.
fn dim_value() -> impl Strategy<Value = u64> {
    prop_oneof![8 => 1u64..6, 1 => Just(0u64), 1 => Just(u64::MAX), 1 => Just(1u64 << 40)]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]
    /// Dynamic dims of every kind, each bound (by its own name, mostly) or not, plus stray
    /// bindings now and then, under random graphs: `Ok` or a `PlannerError`, never a panic.
    #[test]
    fn dynamic_dims_and_their_bindings_never_panic(
        dims in proptest::collection::vec((dim(), proptest::bool::weighted(0.9), dim_value()), 0..5),
        strays in proptest::collection::vec((stray(), dim_value()), 0..2),
        nodes in proptest::collection::vec(node(), 1..4),
        opset in 9i64..29,
    ) {
        let declared: Vec<D> = dims.iter().map(|(d, _, _)| *d).collect();
        let mut g = build(&[], &nodes, opset);
        g.graph.input[0] = value_info("x", F32, &declared);
        let bytes = g.bytes();
        let mut opts = ImportOptions::default();
        for (axis, (d, bind, value)) in dims.iter().enumerate() {
            if let (Some(name), true) = (bound_name(axis, d), *bind) {
                opts.dims.insert(name, *value);
            }
        }
        opts.dims.extend(strays);
        let result = std::panic::catch_unwind(|| inspect(&bytes, &opts).map(|r| r.nodes));
        prop_assert!(result.is_ok(), "import panicked on dims {:?}, nodes {:?}", declared, nodes);
    }
}
