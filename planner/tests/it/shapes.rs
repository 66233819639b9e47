//! Shape inference and constant folding of exporters' shape arithmetic, per opset.

use crate::build::*;
use remat_planner::{load, ImportOptions, Model};

fn out_shape(model: &Model, k: usize) -> Vec<u64> {
    let v = model.outputs[k];
    model.values[v]
        .fact
        .as_ref()
        .map(|f| f.shape.clone())
        .unwrap_or_default()
}

fn load_ok(g: &G, opts: &ImportOptions) -> Model {
    load(&g.bytes(), opts).unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn shape_gather_concat_reshape_chain_folds() {
    // Reshape x[batch, 3, 4] to [batch, 12] through Shape → Gather → Unsqueeze → Concat.
    let g = G::new(13)
        .input("x", F32, &[D::P("batch"), D::V(3), D::V(4)])
        .init(tensor_i64("zero", &[], &[0]))
        .ints("axes0", &[0])
        .ints("minus1", &[-1])
        .node("Shape", "shape", &["x"], &["s"], vec![])
        .node(
            "Gather",
            "g",
            &["s", "zero"],
            &["b"],
            vec![a_int("axis", 0)],
        )
        .node("Unsqueeze", "u", &["b", "axes0"], &["b1"], vec![])
        .node(
            "Concat",
            "cat",
            &["b1", "minus1"],
            &["target"],
            vec![a_int("axis", 0)],
        )
        .node("Reshape", "rs", &["x", "target"], &["y"], vec![])
        .node("Relu", "relu", &["y"], &["z"], vec![])
        .output("z");
    let m = load_ok(&g, &dims(&[("batch", 5)]));
    assert_eq!(out_shape(&m, 0), vec![5, 12]);
    let folded: Vec<&str> = m
        .graph
        .node_weights()
        .filter(|n| n.folded)
        .map(|n| n.name.as_str())
        .collect();
    assert_eq!(folded, vec!["shape", "g", "u", "cat"]);
}

#[test]
fn range_where_equal_cast_constant_of_shape_fold() {
    // Expand x[1, n] to [3, n] where 3 comes from Where(Equal(s, -1), 1, s) over a Range
    // length cast through float.
    let g = G::new(17)
        .input("x", F32, &[D::V(1), D::P("n")])
        .init(tensor_i64("start", &[], &[0]))
        .init(tensor_i64("limit", &[], &[3]))
        .init(tensor_i64("delta", &[], &[1]))
        .ints("neg", &[-1])
        .ints("one", &[1])
        .ints("two", &[2])
        .node(
            "Range",
            "range",
            &["start", "limit", "delta"],
            &["r"],
            vec![],
        )
        .node("Shape", "rshape", &["r"], &["rs"], vec![])
        .node("Cast", "tofloat", &["rs"], &["rsf"], vec![a_int("to", 1)])
        .node("Cast", "toint", &["rsf"], &["rsi"], vec![a_int("to", 7)])
        .node("Shape", "xshape", &["x"], &["xs"], vec![])
        .node("Slice", "last", &["xs", "one", "two"], &["n"], vec![])
        .node("Equal", "eq", &["rsi", "neg"], &["isneg"], vec![])
        .node(
            "Where",
            "where",
            &["isneg", "one", "rsi"],
            &["rows"],
            vec![],
        )
        .node(
            "Concat",
            "cat",
            &["rows", "n"],
            &["target"],
            vec![a_int("axis", 0)],
        )
        .node("ConstantOfShape", "zeros", &["target"], &["z"], vec![])
        .node("Expand", "expand", &["x", "target"], &["e"], vec![])
        .node("Add", "add", &["e", "z"], &["y"], vec![])
        .output("y");
    let m = load_ok(&g, &dims(&[("n", 7)]));
    assert_eq!(out_shape(&m, 0), vec![3, 7]);
}

#[test]
fn huge_constant_of_shape_is_not_materialized() {
    let g = G::new(17)
        .input("x", F32, &[D::V(1)])
        .ints("shape", &[1_000_000, 1_000_000])
        .node("ConstantOfShape", "huge", &["shape"], &["c"], vec![])
        .node("Add", "add", &["x", "c"], &["y"], vec![])
        .output("y");
    let start = std::time::Instant::now();
    let m = load_ok(&g, &ImportOptions::default());
    assert_eq!(out_shape(&m, 0), vec![1_000_000, 1_000_000]);
    let c = m
        .values
        .iter()
        .find(|v| v.name == "c")
        .and_then(|v| v.fact.clone());
    assert!(
        c.is_some_and(|f| f.value.is_none()),
        "the huge constant must not be held"
    );
    // A functional guard, not a benchmark: materializing 10^12 floats would never finish.
    assert!(start.elapsed().as_secs() < 30);
}

#[test]
fn constant_if_folds_to_its_branch() {
    let mut then_g = G::new(17).node("Relu", "r", &["x"], &["t"], vec![]);
    then_g.graph.output.push(value_info("t", F32, &[]));
    let mut else_g = G::new(17).node("Neg", "n", &["x"], &["e"], vec![]);
    else_g.graph.output.push(value_info("e", F32, &[]));
    let g = G::new(17)
        .input("x", F32, &[D::V(2), D::V(3)])
        .init(tensor_bool("cond", false))
        .node(
            "If",
            "choose",
            &["cond"],
            &["y"],
            vec![
                a_graph("then_branch", then_g.graph),
                a_graph("else_branch", else_g.graph),
            ],
        )
        .output("y");
    let m = load_ok(&g, &ImportOptions::default());
    assert_eq!(out_shape(&m, 0), vec![2, 3]);
    let ops: Vec<(&str, &str)> = m
        .graph
        .node_weights()
        .map(|n| (n.name.as_str(), n.op_type.as_str()))
        .collect();
    assert_eq!(ops, vec![("choose/n", "Neg")]);
}

/// Squeeze/Unsqueeze axes, Clip bounds, Split sizes, Slice bounds and Pad pads moved from
/// attributes to inputs across opsets; each form gives the same shapes.
#[test]
fn attribute_and_input_forms_agree_across_opsets() {
    let old = G::new(11)
        .input("x", F32, &[D::V(1), D::V(6), D::V(8)])
        .node("Squeeze", "sq", &["x"], &["a"], vec![a_ints("axes", &[0])])
        .node(
            "Unsqueeze",
            "us",
            &["a"],
            &["b"],
            vec![a_ints("axes", &[2])],
        )
        .node(
            "Split",
            "sp",
            &["b"],
            &["c", "d"],
            vec![a_int("axis", 0), a_ints("split", &[2, 4])],
        )
        .node("Clip", "clip", &["d"], &["e"], vec![])
        .node("Pad", "pad", &["e", "pads"], &["f"], vec![])
        .ints("pads", &[0, 0, 1, 0, 0, 2])
        .node(
            "ReduceMean",
            "mean",
            &["f"],
            &["g"],
            vec![a_ints("axes", &[1]), a_int("keepdims", 0)],
        )
        .output("c")
        .output("g");
    let new = G::new(18)
        .input("x", F32, &[D::V(1), D::V(6), D::V(8)])
        .ints("ax0", &[0])
        .ints("ax1", &[1])
        .ints("ax2", &[2])
        .ints("sizes", &[2, 4])
        .ints("pads", &[0, 0, 1, 0, 0, 2])
        .init(tensor_f32("lo", &[], &[0.0]))
        .node("Squeeze", "sq", &["x", "ax0"], &["a"], vec![])
        .node("Unsqueeze", "us", &["a", "ax2"], &["b"], vec![])
        .node(
            "Split",
            "sp",
            &["b", "sizes"],
            &["c", "d"],
            vec![a_int("axis", 0)],
        )
        .node("Clip", "clip", &["d", "lo"], &["e"], vec![])
        .node("Pad", "pad", &["e", "pads"], &["f"], vec![])
        .node(
            "ReduceMean",
            "mean",
            &["f", "ax1"],
            &["g"],
            vec![a_int("keepdims", 0)],
        )
        .output("c")
        .output("g");
    let a = load_ok(&old, &ImportOptions::default());
    let b = load_ok(&new, &ImportOptions::default());
    assert_eq!(out_shape(&a, 0), vec![2, 8, 1]);
    // [4, 8, 1] padded on the last axis by 1 + 2, then averaged over axis 1.
    assert_eq!(out_shape(&a, 1), vec![4, 4]);
    assert_eq!(
        (out_shape(&b, 0), out_shape(&b, 1)),
        (out_shape(&a, 0), out_shape(&a, 1))
    );

    let split18 = G::new(18)
        .input("x", F32, &[D::V(7), D::V(2)])
        .node(
            "Split",
            "sp",
            &["x"],
            &["p", "q"],
            vec![a_int("num_outputs", 2)],
        )
        .output("p")
        .output("q");
    let m = load_ok(&split18, &ImportOptions::default());
    assert_eq!(
        (out_shape(&m, 0), out_shape(&m, 1)),
        (vec![4, 2], vec![3, 2])
    );

    let slice9 = G::new(9)
        .input("x", F32, &[D::V(10), D::V(4)])
        .node(
            "Slice",
            "sl",
            &["x"],
            &["y"],
            vec![
                a_ints("starts", &[1]),
                a_ints("ends", &[i64::MAX]),
                a_ints("axes", &[0]),
            ],
        )
        .output("y");
    assert_eq!(
        out_shape(&load_ok(&slice9, &ImportOptions::default()), 0),
        vec![9, 4]
    );
    let slice13 = G::new(13)
        .input("x", F32, &[D::V(10), D::V(4)])
        .ints("st", &[-1])
        .ints("en", &[i64::MIN])
        .ints("ax", &[0])
        .ints("step", &[-3])
        .node(
            "Slice",
            "sl",
            &["x", "st", "en", "ax", "step"],
            &["y"],
            vec![],
        )
        .output("y");
    assert_eq!(
        out_shape(&load_ok(&slice13, &ImportOptions::default()), 0),
        vec![4, 4]
    );
}

#[test]
fn conv_pool_resize_shapes() {
    let g = G::new(9)
        .input("x", F32, &[D::P("batch"), D::V(3), D::V(32), D::V(32)])
        .weight("w", &[16, 3, 3, 3])
        .init(tensor_f32("scales", &[4], &[1.0, 1.0, 2.0, 2.0]))
        .node(
            "Conv",
            "conv",
            &["x", "w"],
            &["c"],
            vec![a_ints("strides", &[2, 2]), a_ints("pads", &[1, 1, 1, 1])],
        )
        .node(
            "MaxPool",
            "pool",
            &["c"],
            &["p"],
            vec![
                a_ints("kernel_shape", &[3, 3]),
                a_ints("strides", &[2, 2]),
                a_int("ceil_mode", 1),
            ],
        )
        .node("Upsample", "up", &["p", "scales"], &["u"], vec![])
        .node(
            "ConvTranspose",
            "deconv",
            &["u", "wt"],
            &["d"],
            vec![
                a_ints("strides", &[2, 2]),
                a_ints("output_padding", &[1, 1]),
                a_ints("pads", &[1, 1, 1, 1]),
            ],
        )
        .weight("wt", &[16, 4, 3, 3])
        .node("GlobalAveragePool", "gap", &["d"], &["g"], vec![])
        .output("d")
        .output("g");
    let m = load_ok(&g, &dims(&[("batch", 2)]));
    // conv: 16×16; pool (ceil): 8×8; upsample: 16×16; deconv: 2·15 + 1 + 3 − 2 = 32.
    assert_eq!(out_shape(&m, 0), vec![2, 4, 32, 32]);
    assert_eq!(out_shape(&m, 1), vec![2, 4, 1, 1]);
}

#[test]
fn model_local_functions_are_inlined_with_attribute_references() {
    use onnx_protobuf::{FunctionProto, NodeProto};
    let mut f = FunctionProto::new();
    f.name = "ScaledRelu".into();
    f.domain = "local".into();
    f.input = vec!["a".into()];
    f.output = vec!["b".into()];
    f.attribute_proto = vec![a_float("alpha", 2.0)];
    let mut relu = NodeProto::new();
    relu.op_type = "Relu".into();
    relu.name = "relu".into();
    relu.input = vec!["a".into()];
    relu.output = vec!["r".into()];
    let mut k = NodeProto::new();
    k.op_type = "Constant".into();
    k.name = "k".into();
    k.output = vec!["c".into()];
    let mut reference = a_float("value_float", 0.0);
    reference.ref_attr_name = "alpha".into();
    k.attribute = vec![reference];
    let mut mul = NodeProto::new();
    mul.op_type = "Mul".into();
    mul.name = "mul".into();
    mul.input = vec!["r".into(), "c".into()];
    mul.output = vec!["b".into()];
    f.node = vec![relu, k, mul];

    let g = G::new(18)
        .input("x", F32, &[D::V(2), D::V(3)])
        .weight("w", &[3, 3])
        .node("MatMul", "mm", &["x", "w"], &["h"], vec![])
        .node_in("local", "ScaledRelu", "call", &["h"], &["y"])
        .output("y");
    let mut model = g.model();
    model.functions.push(f);
    let bytes = onnx_protobuf::Message::write_to_bytes(&model).unwrap_or_default();
    let m = load(&bytes, &ImportOptions::default()).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(out_shape(&m, 0), vec![2, 3]);
    let c = m
        .values
        .iter()
        .find(|v| v.name == "c")
        .and_then(|v| v.fact.clone());
    let alpha = c.and_then(|f| f.value).map(|t| t.as_f64());
    assert_eq!(alpha, Some(vec![2.0]));
    let t = m.training_graph().unwrap_or_else(|e| panic!("{e}"));
    let ids: Vec<&str> = t.nodes.iter().map(|n| n.id.as_str()).collect();
    assert_eq!(
        ids,
        vec![
            "i:x",
            "f:mm",
            "f:call/relu",
            "f:call/mul",
            "loss",
            "b:call/mul",
            "b:call/relu",
            "b:mm"
        ]
    );
}
