//! Bad input gets a structured error naming what is wrong.

use crate::build::*;
use remat_planner::{inspect, load, ImportOptions, PlannerError};

#[test]
fn random_and_empty_bytes_are_malformed() {
    for bytes in [&b""[..], b"\xff\xff\xff\xff", b"hello world, not a model"] {
        match load(bytes, &ImportOptions::default()) {
            Err(PlannerError::Malformed { .. }) => {}
            other => panic!("{bytes:?}: expected Malformed, got {other:?}"),
        }
    }
}

#[test]
fn opset_out_of_range_is_reported() {
    let g = G { opset: 7, ..mlp() };
    assert!(matches!(
        load(&g.bytes(), &dims(&[("batch", 1)])),
        Err(PlannerError::UnsupportedOpset { version: 7, .. })
    ));
    let g = G { opset: 29, ..mlp() };
    assert!(matches!(
        load(&g.bytes(), &dims(&[("batch", 1)])),
        Err(PlannerError::UnsupportedOpset {
            version: 29,
            min: 9,
            max: 28
        })
    ));
    // The newest opset the `onnx` package writes by default imports.
    let g = G { opset: 28, ..mlp() };
    load(&g.bytes(), &dims(&[("batch", 1)])).expect("opset 28 imports");
}

#[test]
fn unbound_dims_are_all_listed_and_unknown_or_zero_dims_rejected() {
    let g = G::new(17)
        .input("a", F32, &[D::P("batch"), D::P("seq")])
        .input("b", F32, &[D::P("batch"), D::P("seq")])
        .node("Add", "add", &["a", "b"], &["c"], vec![])
        .output("c");
    match load(&g.bytes(), &ImportOptions::default()) {
        Err(PlannerError::UnboundDims { names }) => assert_eq!(names, vec!["batch", "seq"]),
        other => panic!("expected UnboundDims, got {other:?}"),
    }
    match load(&g.bytes(), &dims(&[("batch", 2), ("seq", 3), ("heads", 4)])) {
        Err(PlannerError::UnknownDim { name, known }) => {
            assert_eq!(name, "heads");
            assert_eq!(known, vec!["batch", "seq"]);
        }
        other => panic!("expected UnknownDim, got {other:?}"),
    }
    assert!(matches!(
        load(&g.bytes(), &dims(&[("batch", 0), ("seq", 3)])),
        Err(PlannerError::InvalidDim { .. })
    ));
    // Past i64::MAX the error shows the value given, not a clamped one.
    let e = load(&g.bytes(), &dims(&[("batch", u64::MAX), ("seq", 3)]))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("18446744073709551615") && e.contains("at most 9223372036854775807"),
        "{e}"
    );
    let neg = G::new(17)
        .input("a", F32, &[D::V(-3)])
        .node("Relu", "r", &["a"], &["c"], vec![])
        .output("c");
    match load(&neg.bytes(), &ImportOptions::default()) {
        Err(PlannerError::InvalidDim { what, value, .. }) => {
            assert!(what.contains("\"a\""));
            assert_eq!(value, "-3");
        }
        other => panic!("expected InvalidDim, got {other:?}"),
    }
}

#[test]
fn cycles_and_dangling_inputs_name_the_nodes() {
    let cyc = G::new(17)
        .input("x", F32, &[D::V(2)])
        .node("Add", "a", &["x", "q"], &["p"], vec![])
        .node("Relu", "b", &["p"], &["q"], vec![])
        .output("q");
    match load(&cyc.bytes(), &ImportOptions::default()) {
        Err(PlannerError::Cycle { nodes }) => assert_eq!(nodes, vec!["a", "b"]),
        other => panic!("expected Cycle, got {other:?}"),
    }
    let dangling = G::new(17)
        .input("x", F32, &[D::V(2)])
        .node("Add", "a", &["x", "ghost"], &["p"], vec![])
        .output("p");
    match load(&dangling.bytes(), &ImportOptions::default()) {
        Err(PlannerError::DanglingInput { node, input }) => {
            assert_eq!((node.as_str(), input.as_str()), ("a", "ghost"))
        }
        other => panic!("expected DanglingInput, got {other:?}"),
    }
}

#[test]
fn every_unsupported_node_is_reported_at_once() {
    let mut body = G::new(17).node("Identity", "inner", &["x"], &["y"], vec![]);
    body.graph.output.push(value_info("y", F32, &[D::V(2)]));
    let g = G::new(17)
        .input("x", F32, &[D::V(2)])
        .input("c", BOOL, &[])
        .node("FancyOp", "fancy", &["x"], &["a"], vec![])
        .node_in("com.microsoft", "FusedGemm", "contrib", &["x"], &["b"])
        .node(
            "Loop",
            "loop",
            &["", "c", "x"],
            &["l"],
            vec![a_graph("body", body.graph.clone())],
        )
        .node(
            "If",
            "branchy",
            &["c"],
            &["i"],
            vec![
                a_graph("then_branch", body.graph.clone()),
                a_graph("else_branch", body.graph),
            ],
        )
        .node("Relu", "after", &["a"], &["r"], vec![])
        .output("r")
        .output("b")
        .output("l")
        .output("i");
    let r =
        inspect(&g.bytes(), &ImportOptions::default()).expect("inspect reports unsupported nodes");
    let got: Vec<(&str, &str, &str)> = r
        .unsupported
        .iter()
        .map(|u| (u.node.as_str(), u.op_type.as_str(), u.domain.as_str()))
        .collect();
    assert_eq!(
        got,
        vec![
            ("fancy", "FancyOp", ""),
            ("contrib", "FusedGemm", "com.microsoft"),
            ("loop", "Loop", ""),
            ("branchy", "If", ""),
        ]
    );
    assert_eq!(r.params_bytes, None);
    assert_eq!(r.training, None);
    match load(&g.bytes(), &ImportOptions::default()) {
        Err(PlannerError::Unsupported { nodes }) => assert_eq!(nodes.len(), 4),
        other => panic!("expected Unsupported, got {other:?}"),
    }
}

#[test]
fn data_dependent_shapes_name_the_node() {
    let g = G::new(17)
        .input("x", F32, &[D::V(4)])
        .node("NonZero", "nz", &["x"], &["i"], vec![])
        .output("i");
    match load(&g.bytes(), &ImportOptions::default()) {
        Err(PlannerError::DataDependent { node, op_type, .. }) => {
            assert_eq!((node.as_str(), op_type.as_str()), ("nz", "NonZero"))
        }
        other => panic!("expected DataDependent, got {other:?}"),
    }
    let reshape = G::new(17)
        .input("x", F32, &[D::V(4)])
        .input("s", I64, &[D::V(1)])
        .node("Reshape", "rs", &["x", "s"], &["y"], vec![])
        .output("y");
    assert!(matches!(
        load(&reshape.bytes(), &ImportOptions::default()),
        Err(PlannerError::DataDependent { .. })
    ));
}

#[test]
fn shape_and_attribute_errors_name_node_and_attribute() {
    let g = G::new(17)
        .input("a", F32, &[D::V(2), D::V(3)])
        .input("b", F32, &[D::V(4)])
        .node("Add", "bad_add", &["a", "b"], &["c"], vec![])
        .output("c");
    match load(&g.bytes(), &ImportOptions::default()) {
        Err(PlannerError::Shape { node, op_type, .. }) => {
            assert_eq!((node.as_str(), op_type.as_str()), ("bad_add", "Add"))
        }
        other => panic!("expected Shape, got {other:?}"),
    }
    let conv = G::new(17)
        .input("x", F32, &[D::V(1), D::V(2), D::V(5), D::V(5)])
        .weight("w", &[4, 2, 3, 3])
        .node("Conv", "conv", &["x", "w"], &["y"], vec![a_int("group", 0)])
        .output("y");
    match load(&conv.bytes(), &ImportOptions::default()) {
        Err(PlannerError::Attribute {
            node, attribute, ..
        }) => {
            assert_eq!((node.as_str(), attribute.as_str()), ("conv", "group"))
        }
        other => panic!("expected Attribute, got {other:?}"),
    }
    let wrong_type = G::new(17)
        .input("x", F32, &[D::V(2), D::V(3)])
        .node("Transpose", "t", &["x"], &["y"], vec![a_str("perm", "1,0")])
        .output("y");
    assert!(matches!(
        load(&wrong_type.bytes(), &ImportOptions::default()),
        Err(PlannerError::Attribute { .. })
    ));
}

#[test]
fn lying_tensor_lengths_are_malformed() {
    let mut t = tensor_f32("w", &[4, 4], &[0.0; 16]);
    t.raw_data.truncate(10);
    let g = G::new(17)
        .input("x", F32, &[D::V(4)])
        .init(t)
        .node("MatMul", "mm", &["x", "w"], &["y"], vec![])
        .output("y");
    assert!(matches!(
        load(&g.bytes(), &ImportOptions::default()),
        Err(PlannerError::Malformed { .. })
    ));
}

#[test]
fn option_names_must_be_graph_inputs() {
    let mut o = dims(&[("batch", 2)]);
    o.params.push("nope".into());
    assert!(matches!(
        load(&mlp().bytes(), &o),
        Err(PlannerError::UnknownInput {
            which: "--param",
            ..
        })
    ));
}

#[test]
fn kernel_shape_longer_than_the_input_is_an_attribute_error() {
    let g = G::new(17)
        .input("x", F32, &[D::V(1), D::V(2), D::V(5), D::V(5)])
        .weight("w", &[2, 4, 3, 3])
        .node(
            "ConvTranspose",
            "deconv",
            &["x", "w"],
            &["y"],
            vec![a_ints("kernel_shape", &[3, 3, 3])],
        )
        .output("y");
    match load(&g.bytes(), &ImportOptions::default()) {
        Err(PlannerError::Attribute {
            node, attribute, ..
        }) => {
            assert_eq!(
                (node.as_str(), attribute.as_str()),
                ("deconv", "kernel_shape")
            )
        }
        other => panic!("expected Attribute, got {other:?}"),
    }
}

/// The ops added for third-party models reject bad inputs with the node, op and reason.
#[test]
fn new_op_errors_name_the_node_and_the_problem() {
    // (op, opset, data inputs, initializers, node inputs, attributes, words the message holds)
    type Case = (
        &'static str,
        i64,
        Vec<(&'static str, Vec<i64>)>,
        Vec<onnx_protobuf::TensorProto>,
        Vec<&'static str>,
        Vec<onnx_protobuf::AttributeProto>,
        &'static str,
    );
    let cases: Vec<Case> = vec![
        (
            "STFT",
            17,
            vec![("s", vec![2, 100, 1])],
            vec![
                tensor_i64("st", &[], &[10]),
                tensor_f32("w", &[400], &[1.0; 400]),
            ],
            vec!["s", "st", "w"],
            vec![],
            "shorter than the frame length",
        ),
        (
            "STFT",
            17,
            vec![("s", vec![2, 100, 3])],
            vec![tensor_i64("st", &[], &[10])],
            vec!["s", "st"],
            vec![],
            "signal must be",
        ),
        (
            "DFT",
            17,
            vec![("s", vec![2, 8, 1])],
            vec![],
            vec!["s"],
            vec![a_int("inverse", 1), a_int("onesided", 1)],
            "onesided",
        ),
        (
            "Attention",
            23,
            vec![
                ("q", vec![2, 6, 5, 16]),
                ("k", vec![2, 4, 7, 16]),
                ("v", vec![2, 4, 7, 16]),
            ],
            vec![],
            vec!["q", "k", "v"],
            vec![],
            "not a multiple of 4 key/value heads",
        ),
        (
            "Attention",
            23,
            vec![
                ("q", vec![2, 5, 64]),
                ("k", vec![2, 7, 64]),
                ("v", vec![2, 7, 64]),
            ],
            vec![],
            vec!["q", "k", "v"],
            vec![],
            "q_num_heads",
        ),
        (
            "RMSNormalization",
            23,
            vec![("x", vec![2, 3, 4])],
            vec![tensor_f32("s", &[5], &[1.0; 5])],
            vec!["x", "s"],
            vec![],
            "does not broadcast",
        ),
        (
            "SoftmaxCrossEntropyLoss",
            13,
            vec![("s", vec![4, 10])],
            vec![tensor_i64("l", &[5], &[0; 5])],
            vec!["s", "l"],
            vec![],
            "labels shape",
        ),
        (
            "Col2Im",
            18,
            vec![("x", vec![2, 10, 9])],
            vec![
                tensor_i64("im", &[2], &[4, 4]),
                tensor_i64("bl", &[2], &[2, 2]),
            ],
            vec!["x", "im", "bl"],
            vec![],
            "not a multiple of the block size",
        ),
        (
            "AffineGrid",
            20,
            vec![("t", vec![2, 3, 4])],
            vec![tensor_i64("sz", &[4], &[2, 3, 5, 7])],
            vec!["t", "sz"],
            vec![],
            "does not match size",
        ),
    ];
    let mut failures = vec![];
    for (k, (op, opset, data, consts, inputs, attrs, words)) in cases.into_iter().enumerate() {
        let mut g = G::new(opset);
        for (n, s) in &data {
            let d: Vec<D> = s.iter().map(|&x| D::V(x)).collect();
            g = g.input(n, F32, &d);
        }
        for t in consts {
            g = g.init(t);
        }
        g = g.node(op, "bad", &inputs, &["y"], attrs).output("y");
        let opts = ImportOptions {
            inputs: data.iter().map(|(n, _)| n.to_string()).collect(),
            ..Default::default()
        };
        match load(&g.bytes(), &opts) {
            Err(e @ (PlannerError::Shape { .. } | PlannerError::Attribute { .. })) => {
                let msg = e.to_string();
                if !msg.contains("bad") || !msg.contains(op) || !msg.contains(words) {
                    failures.push(format!("case {k} ({op}): message {msg:?} lacks {words:?}"));
                }
            }
            other => failures.push(format!("case {k} ({op}): expected an error, got {other:?}")),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Attributes and constant inputs the executor would refuse are refused at import, naming the
/// node and what is wrong (they planned before, and only `remat validate` failed on them).
#[test]
fn attributes_and_constants_the_executor_would_refuse_are_refused_at_import() {
    let x = || G::new(17).input("x", F32, &[D::V(2), D::V(3), D::V(8), D::V(8)]);
    let cases: Vec<(G, &str)> = vec![
        (
            x().weight("w", &[4, 3, 3, 3])
                .node(
                    "Conv",
                    "conv",
                    &["x", "w"],
                    &["y"],
                    vec![a_ints("kernel_shape", &[5, 5])],
                )
                .output("y"),
            "does not match the weight",
        ),
        (
            x().weight("w", &[3, 4, 3, 3])
                .node(
                    "ConvTranspose",
                    "ct",
                    &["x", "w"],
                    &["y"],
                    vec![a_ints("strides", &[0, 0])],
                )
                .output("y"),
            "must be positive",
        ),
        (
            x().weight("s", &[3])
                .node("BatchNormalization", "bn", &["x", "s"], &["y"], vec![])
                .output("y"),
            "takes 5 inputs",
        ),
        (
            x().weight("s", &[3])
                .weight("b", &[3])
                .weight("m", &[3])
                .weight("v", &[4])
                .node(
                    "BatchNormalization",
                    "bn",
                    &["x", "s", "b", "m", "v"],
                    &["y"],
                    vec![],
                )
                .output("y"),
            "input_var has shape [4]",
        ),
        (
            x().weight("s", &[3])
                .weight("b", &[3])
                .node(
                    "GroupNormalization",
                    "gn",
                    &["x", "s", "b"],
                    &["y"],
                    vec![a_int("num_groups", 0)],
                )
                .output("y"),
            "num_groups",
        ),
        (
            x().ints("i", &[100])
                .node("Gather", "g", &["x", "i"], &["y"], vec![a_int("axis", 1)])
                .output("y"),
            "index 100 out of range for axis 1 of size 3",
        ),
        (
            x().init(tensor_f32("r", &[], &[2.0]))
                .node("Dropout", "do", &["x", "r"], &["y"], vec![])
                .output("y"),
            "ratio 2 is not a probability",
        ),
        (
            x().init(tensor_f32("roi", &[0], &[]))
                .init(tensor_f32("sc", &[4], &[1.0, 1.0, 0.0, 0.0]))
                .node("Resize", "rz", &["x", "roi", "sc"], &["y"], vec![])
                .output("y"),
            "scale 0 gives an invalid size",
        ),
    ];
    for (g, want) in cases {
        let e = load(&g.bytes(), &ImportOptions::default())
            .map(|_| ())
            .expect_err(want)
            .to_string();
        assert!(e.contains(want), "{want}: {e}");
    }
}

/// A model cut short (an interrupted upload or copy) is malformed wherever the cut falls. The
/// protobuf library alone accepts a cut where one of the graph's fields ends, and the import
/// would then go on without the graph's last nodes, initializers or outputs.
#[test]
fn a_truncated_model_is_malformed_even_where_the_protobuf_library_accepts_it() {
    use onnx_protobuf::{Message, ModelProto};
    let bytes = mlp().bytes();
    let mut lenient = 0;
    for cut in 1..bytes.len() {
        let short = &bytes[..cut];
        lenient += usize::from(ModelProto::parse_from_bytes(short).is_ok());
        match load(short, &dims(&[("batch", 1)])) {
            // Before the graph: "has no graph"; in it: "not a valid ONNX protobuf".
            Err(PlannerError::Malformed { what }) => assert!(
                what.contains("not a valid ONNX protobuf") || what.contains("has no graph"),
                "cut {cut}: {what}"
            ),
            other => panic!(
                "cut {cut} of {}: expected Malformed, got {other:?}",
                bytes.len()
            ),
        }
    }
    assert!(
        lenient > 0,
        "no cut the library accepts: the case this test is for is gone"
    );
}

/// A tensor of ONNX element type `elem` (an integer type) from `int32_data`.
fn tensor_i32s(name: &str, elem: i32, dims: &[i64], values: &[i32]) -> onnx_protobuf::TensorProto {
    let mut t = onnx_protobuf::TensorProto::new();
    t.name = name.into();
    t.dims = dims.to_vec();
    t.data_type = elem;
    t.int32_data = values.to_vec();
    t
}

/// Secondary inputs of the wrong shape, attributes of the wrong type or with no valid value,
/// and constant indices out of range: each planned before and failed only in the executor
/// (`remat validate`: "executor, node ..."). Now the import refuses each, naming the node, its
/// op and the input or attribute.
#[test]
fn inputs_and_attributes_only_the_executor_refused_are_refused_at_import() {
    let x = |opset| G::new(opset).input("x", F32, &[D::V(2), D::V(3), D::V(8), D::V(8)]);
    let seq = || G::new(17).input("s", F32, &[D::V(8), D::V(6), D::V(8)]);
    let one = |op: &str, attrs| x(17).node(op, "n", &["x"], &["y"], attrs).output("y");
    let cases: Vec<(G, &[&str])> = vec![
        (
            x(17)
                .weight("s", &[8])
                .weight("b", &[5])
                .node("LayerNormalization", "ln", &["x", "s", "b"], &["y"], vec![])
                .output("y"),
            &[
                "\"ln\" (LayerNormalization)",
                "input B of shape [5]",
                "normalized dims [8]",
            ],
        ),
        (
            x(17)
                .weight("s", &[3, 8])
                .node(
                    "LayerNormalization",
                    "ln",
                    &["x", "s"],
                    &["y"],
                    vec![a_int("axis", 1)],
                )
                .output("y"),
            &[
                "\"ln\" (LayerNormalization)",
                "input Scale of shape [3, 8]",
                "[3, 8, 8]",
            ],
        ),
        (
            x(17)
                .weight("w", &[4, 3, 3, 3])
                .weight("b", &[7])
                .node("Conv", "conv", &["x", "w", "b"], &["y"], vec![])
                .output("y"),
            &[
                "\"conv\" (Conv)",
                "input B has shape [7]",
                "4 output channels",
            ],
        ),
        (
            x(17)
                .weight("w", &[3, 4, 3, 3])
                .weight("b", &[7])
                .node("ConvTranspose", "ct", &["x", "w", "b"], &["y"], vec![])
                .output("y"),
            &[
                "\"ct\" (ConvTranspose)",
                "input B has shape [7]",
                "must be [4]",
            ],
        ),
        (
            x(17)
                .weight("s", &[5])
                .weight("b", &[3])
                .node(
                    "InstanceNormalization",
                    "in",
                    &["x", "s", "b"],
                    &["y"],
                    vec![],
                )
                .output("y"),
            &[
                "\"in\" (InstanceNormalization)",
                "input scale has shape [5]",
                "must be [3]",
            ],
        ),
        (
            x(21)
                .weight("s", &[5])
                .weight("b", &[3])
                .node(
                    "GroupNormalization",
                    "gn",
                    &["x", "s", "b"],
                    &["y"],
                    vec![a_int("num_groups", 3)],
                )
                .output("y"),
            &["\"gn\" (GroupNormalization)", "input scale has shape [5]"],
        ),
        (
            x(17)
                .weight("lo", &[3])
                .weight("hi", &[3])
                .node("Clip", "clip", &["x", "lo", "hi"], &["y"], vec![])
                .output("y"),
            &["\"clip\" (Clip)", "input min has shape [3]", "scalar"],
        ),
        (
            seq()
                .weight("W", &[1, 16, 8])
                .weight("R", &[1, 16, 4])
                .weight("B", &[1, 7])
                .node(
                    "LSTM",
                    "lstm",
                    &["s", "W", "R", "B"],
                    &["y"],
                    vec![a_int("hidden_size", 4)],
                )
                .output("y"),
            &[
                "\"lstm\" (LSTM)",
                "input B has shape [1, 7]",
                "must be [1, 32]",
            ],
        ),
        (
            seq()
                .weight("W", &[1, 16, 8])
                .weight("R", &[1, 16, 4])
                .weight("h0", &[1, 9, 4])
                .node(
                    "LSTM",
                    "lstm",
                    &["s", "W", "R", "", "", "h0"],
                    &["y"],
                    vec![a_int("hidden_size", 4)],
                )
                .output("y"),
            &[
                "\"lstm\" (LSTM)",
                "input initial_h has shape [1, 9, 4]",
                "must be [1, 6, 4]",
            ],
        ),
        (
            seq()
                .weight("W", &[1, 12, 8])
                .weight("R", &[1, 12, 5])
                .node(
                    "GRU",
                    "gru",
                    &["s", "W", "R"],
                    &["y"],
                    vec![a_int("hidden_size", 4)],
                )
                .output("y"),
            &[
                "\"gru\" (GRU)",
                "input R has shape [1, 12, 5]",
                "must be [1, 12, 4]",
            ],
        ),
        (
            x(17)
                .weight("sc", &[5])
                .node(
                    "QuantizeLinear",
                    "q",
                    &["x", "sc"],
                    &["y"],
                    vec![a_int("axis", 1)],
                )
                .output("y"),
            &[
                "\"q\" (QuantizeLinear)",
                "input y_scale has shape [5]",
                "must be [3]",
            ],
        ),
        (
            G::new(17)
                .input("q", 3, &[D::V(2), D::V(3), D::V(8)])
                .weight("sc", &[5])
                .init(tensor_i32s("z", 3, &[5], &[0; 5]))
                .node(
                    "DequantizeLinear",
                    "dq",
                    &["q", "sc", "z"],
                    &["y"],
                    vec![a_int("axis", 1)],
                )
                .output("y"),
            &[
                "\"dq\" (DequantizeLinear)",
                "input x_scale has shape [5]",
                "must be [3]",
            ],
        ),
        (
            x(17)
                .init(tensor_i64("i", &[2, 3, 1, 1], &[7; 6]))
                .node(
                    "GatherElements",
                    "ge",
                    &["x", "i"],
                    &["y"],
                    vec![a_int("axis", 1)],
                )
                .output("y"),
            &[
                "\"ge\" (GatherElements)",
                "index 7 out of range for axis 1 of size 3",
            ],
        ),
        (
            x(17)
                .init(tensor_i64("i", &[1, 2], &[5, 0]))
                .weight("u", &[1, 8, 8])
                .node("ScatterND", "snd", &["x", "i", "u"], &["y"], vec![])
                .output("y"),
            &[
                "\"snd\" (ScatterND)",
                "index 5 out of range for axis 0 of size 2",
            ],
        ),
        (
            x(17)
                .init(tensor_f32("a", &[], &[1.0]))
                .node("CumSum", "cs", &["x", "a"], &["y"], vec![])
                .output("y"),
            &[
                "\"cs\" (CumSum)",
                "input axis must be one int32 or int64 value",
            ],
        ),
        (
            x(17)
                .init(tensor_i64("a", &[], &[9]))
                .node("CumSum", "cs", &["x", "a"], &["y"], vec![])
                .output("y"),
            &["\"cs\" (CumSum)", "axis 9 is out of range for rank 4"],
        ),
        (
            one("Elu", vec![a_str("alpha", "x")]),
            &[
                "\"n\" (Elu)",
                "attribute \"alpha\"",
                "expected a FLOAT attribute, found STRING",
            ],
        ),
        (
            one("HardSigmoid", vec![a_int("alpha", 2)]),
            &["\"n\" (HardSigmoid)", "attribute \"alpha\"", "found INT"],
        ),
        (
            one("LeakyRelu", vec![a_str("alpha", "x")]),
            &["\"n\" (LeakyRelu)", "attribute \"alpha\"", "found STRING"],
        ),
        (
            one("LeakyRelu", vec![a_int("alpha", 1)]),
            &["\"n\" (LeakyRelu)", "attribute \"alpha\"", "found INT"],
        ),
        (
            x(17)
                .weight("s", &[3])
                .weight("b", &[3])
                .node(
                    "InstanceNormalization",
                    "in",
                    &["x", "s", "b"],
                    &["y"],
                    vec![a_str("epsilon", "e")],
                )
                .output("y"),
            &[
                "\"in\" (InstanceNormalization)",
                "attribute \"epsilon\"",
                "found STRING",
            ],
        ),
        (
            x(20)
                .node(
                    "Gelu",
                    "gelu",
                    &["x"],
                    &["y"],
                    vec![a_str("approximate", "fast")],
                )
                .output("y"),
            &[
                "\"gelu\" (Gelu)",
                "attribute \"approximate\"",
                "\"fast\" is not one of none, tanh",
            ],
        ),
        (
            x(17)
                .init(tensor_f32("sc", &[4], &[1.0, 1.0, 2.0, 2.0]))
                .node(
                    "Resize",
                    "rz",
                    &["x", "", "sc"],
                    &["y"],
                    vec![a_str("mode", "bogus")],
                )
                .output("y"),
            &[
                "\"rz\" (Resize)",
                "attribute \"mode\"",
                "\"bogus\" is not one of nearest",
            ],
        ),
        (
            x(17)
                .ints("p", &[0, 0, 1, 1, 0, 0, 1, 1])
                .node(
                    "Pad",
                    "pad",
                    &["x", "p"],
                    &["y"],
                    vec![a_str("mode", "bogus")],
                )
                .output("y"),
            &[
                "\"pad\" (Pad)",
                "attribute \"mode\"",
                "\"bogus\" is not one of constant",
            ],
        ),
        (
            one("LRN", vec![a_int("size", 0)]),
            &[
                "\"n\" (LRN)",
                "attribute \"size\"",
                "must be positive, got 0",
            ],
        ),
        (
            one(
                "LpPool",
                vec![a_ints("kernel_shape", &[2, 2]), a_int("p", 0)],
            ),
            &[
                "\"n\" (LpPool)",
                "attribute \"p\"",
                "must be at least 1, got 0",
            ],
        ),
        (
            one("LpNormalization", vec![a_int("p", 3)]),
            &[
                "\"n\" (LpNormalization)",
                "attribute \"p\"",
                "must be 1 or 2, got 3",
            ],
        ),
    ];
    check_refused(cases);
}

/// Each case's import fails with a message holding every one of its words.
fn check_refused(cases: Vec<(G, &[&str])>) {
    let mut failures = vec![];
    for (k, (g, words)) in cases.into_iter().enumerate() {
        match load(&g.bytes(), &ImportOptions::default()) {
            Ok(_) => failures.push(format!("case {k} ({words:?}): imported")),
            Err(e) => {
                let msg = e.to_string();
                if let Some(w) = words.iter().find(|w| !msg.contains(*w)) {
                    failures.push(format!("case {k}: {msg:?} lacks {w:?}"));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Graphs the ONNX checker refuses, which the import took with one reading picked silently
/// (the last of two initializers, one of two inputs), are refused naming what is wrong.
#[test]
fn graphs_the_onnx_checker_refuses_are_refused_by_name() {
    let x = |opset| G::new(opset).input("x", F32, &[D::V(2), D::V(3), D::V(8), D::V(8)]);
    let mm = || {
        G::new(17)
            .input("x", F32, &[D::V(2), D::V(8)])
            .weight("W", &[8, 8])
    };
    let dup_output = mm()
        .node("MatMul", "mm", &["x", "W"], &["y"], vec![])
        .output("y")
        .output("y");
    let cases: Vec<(G, &[&str])> = vec![
        (
            mm().weight("W", &[8, 8])
                .node("MatMul", "mm", &["x", "W"], &["y"], vec![])
                .output("y"),
            &["two initializers are named \"W\""],
        ),
        (
            mm().input("x", F32, &[D::V(2), D::V(8)])
                .node("MatMul", "mm", &["x", "W"], &["y"], vec![])
                .output("y"),
            &["graph input \"x\" is declared twice"],
        ),
        (dup_output, &["graph output \"y\" is declared twice"]),
        (
            mm().weight("B", &[8])
                .node("MatMul", "mm", &["x", "W", "B"], &["y"], vec![])
                .output("y"),
            &[
                "\"mm\" (MatMul)",
                "the node has 3 inputs; MatMul takes at most 2",
            ],
        ),
        (
            mm().input("W", F32, &[D::V(8), D::V(9)])
                .node("MatMul", "mm", &["x", "W"], &["y"], vec![])
                .output("y"),
            &[
                "graph input \"W\" is declared",
                "[8, 9]",
                "its initializer is F32 [8, 8]",
            ],
        ),
        (
            x(17)
                .node(
                    "Split",
                    "sp",
                    &["x"],
                    &["a", "b", "c", "d", "e"],
                    vec![a_int("axis", 1)],
                )
                .output("a"),
            &[
                "\"sp\" (Split)",
                "axis 1 of size 3 does not split into 5 equal parts",
            ],
        ),
        (
            x(18)
                .node(
                    "Split",
                    "sp",
                    &["x"],
                    &["y"],
                    vec![a_int("axis", 1), a_int("num_outputs", 0)],
                )
                .output("y"),
            &[
                "\"sp\" (Split)",
                "attribute \"num_outputs\"",
                "is 0; the node has 1 output",
            ],
        ),
        (
            x(17)
                .node("Where", "wh", &["x", "x", "x"], &["y"], vec![])
                .output("y"),
            &["\"wh\" (Where)", "input condition is F32; it must be bool"],
        ),
        (
            x(17)
                .init(tensor_f32("s", &[2], &[2.0, 192.0]))
                .node("Reshape", "rs", &["x", "s"], &["y"], vec![])
                .output("y"),
            &["\"rs\" (Reshape)", "input shape is F32; it must be int64"],
        ),
        (
            x(17)
                .ints("sh", &[2, 3])
                .node(
                    "ConstantOfShape",
                    "cos",
                    &["sh"],
                    &["c"],
                    vec![a_tensor("value", tensor_f32("v", &[2], &[1.0, 2.0]))],
                )
                .node("Mul", "mul", &["x", "c"], &["y"], vec![])
                .output("y"),
            &[
                "\"cos\" (ConstantOfShape)",
                "attribute \"value\"",
                "must hold one value",
            ],
        ),
        (
            x(17).node("", "relu1", &["x"], &["y"], vec![]).output("y"),
            &["node \"relu1\" has no op_type"],
        ),
        (
            x(17)
                .node("Cast", "c", &["x"], &["y"], vec![a_int("to", 8)])
                .output("y"),
            &[
                "\"c\" (Cast)",
                "attribute \"to\"",
                "STRING is not supported",
            ],
        ),
    ];
    check_refused(cases);
}
