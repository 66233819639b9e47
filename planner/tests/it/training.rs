//! Training-graph derivation, the parameter rule and lowering.

use crate::build::*;
use remat_planner::{inspect, load, ImportOptions, ValueKind};
use remat_solver::{simulate, store_all, NodeKind};

fn ids(g: &remat_planner::TrainingGraph) -> Vec<&str> {
    g.nodes.iter().map(|n| n.id.as_str()).collect()
}

#[test]
fn mlp_training_graph_is_forward_loss_backward_with_saved_edges() {
    let m = load(&mlp().bytes(), &dims(&[("batch", 2)])).expect("mlp imports");
    let kinds: Vec<ValueKind> = m.inputs.iter().map(|&v| m.values[v].kind).collect();
    assert_eq!(
        kinds,
        vec![
            ValueKind::Data,
            ValueKind::Param,
            ValueKind::Param,
            ValueKind::Param
        ]
    );
    let t = m.training_graph().expect("training graph");
    assert_eq!(
        ids(&t),
        vec!["i:x", "f:fc1", "f:relu", "f:fc2", "loss", "b:fc2", "b:relu", "b:fc1"]
    );
    // Parameters: w1 8×4 + b1 8 + w2 3×8 floats.
    assert_eq!(t.params_bytes, (32 + 8 + 24) * 4);
    assert_eq!(t.fixed_bytes(), 2 * t.params_bytes);
    // Saved: x (fc1 keeps it for dW1) and relu's output (relu's backward and fc2's dW2).
    assert_eq!(t.saved_activation_bytes, (2 * 4 + 2 * 8) * 4);
    let by_id = |id: &str| t.nodes.iter().find(|n| n.id == id).expect(id);
    let dep_ids = |id: &str| -> Vec<&str> {
        by_id(id)
            .deps
            .iter()
            .map(|&d| t.nodes[d].id.as_str())
            .collect()
    };
    assert_eq!(dep_ids("b:fc2"), vec!["f:relu", "loss"]);
    assert_eq!(dep_ids("b:relu"), vec!["f:relu", "b:fc2"]);
    assert_eq!(dep_ids("b:fc1"), vec!["i:x", "b:relu"]);
    // fc1's backward produces only parameter gradients: no output bytes, required.
    assert_eq!(by_id("b:fc1").bytes, 0);
    assert!(by_id("b:fc1").required && by_id("b:fc2").required && !by_id("b:relu").required);
    assert_eq!(by_id("b:fc2").bytes, 2 * 8 * 4);
    // Costs are FLOPs: fc1 is 2·2·8·4 multiply-adds plus the bias.
    assert_eq!(by_id("f:fc1").cost, 2.0 * 2.0 * 8.0 * 4.0 + 16.0);
    assert_eq!(by_id("b:fc1").cost, 2.0 * by_id("f:fc1").cost);

    let p = t.to_problem();
    assert_eq!(p.len(), t.nodes.len());
    assert_eq!(p.fixed_bytes, t.fixed_bytes());
    assert_eq!(p.nodes[4].kind, NodeKind::Loss);
    let stats = simulate(&p, &store_all(&p)).expect("store-all is a valid schedule");
    assert!(stats.peak_bytes >= p.fixed_bytes + t.saved_activation_bytes);
}

#[test]
fn weights_as_initializers_constants_or_constant_subgraphs_are_parameters() {
    // The same MLP three ways: initializers, Paddle-style Constant nodes, and ONNX "light"
    // style ConstantOfShape of a constant shape.
    let init = G::new(17)
        .input("x", F32, &[D::P("batch"), D::V(4)])
        .weight("w1", &[8, 4])
        .node(
            "Gemm",
            "fc1",
            &["x", "w1"],
            &["h"],
            vec![a_int("transB", 1)],
        )
        .node("Relu", "relu", &["h"], &["y"], vec![])
        .output("y");
    let constant = G::new(17)
        .input("x", F32, &[D::P("batch"), D::V(4)])
        .node(
            "Constant",
            "w",
            &[],
            &["w1"],
            vec![a_tensor("value", tensor_f32("w", &[8, 4], &[0.5; 32]))],
        )
        .node(
            "Gemm",
            "fc1",
            &["x", "w1"],
            &["h"],
            vec![a_int("transB", 1)],
        )
        .node("Relu", "relu", &["h"], &["y"], vec![])
        .output("y");
    let light = G::new(9)
        .input("x", F32, &[D::P("batch"), D::V(4)])
        .node(
            "Constant",
            "shape",
            &[],
            &["s"],
            vec![a_tensor("value", tensor_i64("s", &[2], &[8, 4]))],
        )
        .node(
            "ConstantOfShape",
            "fill",
            &["s"],
            &["w1"],
            vec![a_tensor("value", tensor_f32("v", &[1], &[0.1]))],
        )
        .node(
            "Gemm",
            "fc1",
            &["x", "w1"],
            &["h"],
            vec![a_int("transB", 1)],
        )
        .node("Relu", "relu", &["h"], &["y"], vec![])
        .output("y");
    for g in [init, constant, light] {
        let r = inspect(&g.bytes(), &dims(&[("batch", 3)])).expect("imports");
        assert_eq!(r.params_bytes, Some(32 * 4));
        assert_eq!(r.saved_activation_bytes, Some(3 * 4 * 4 + 3 * 8 * 4));
    }
}

#[test]
fn parameter_rule_overrides() {
    // A static float input first: without data inputs found by rules 1-6, it is data (rule 7).
    let g = G::new(17)
        .input("x", F32, &[D::V(2), D::V(4)])
        .input("w", F32, &[D::V(4), D::V(4)])
        .node("MatMul", "mm", &["x", "w"], &["y"], vec![])
        .output("y");
    let m = load(&g.bytes(), &ImportOptions::default()).expect("imports");
    let kinds: Vec<ValueKind> = m.inputs.iter().map(|&v| m.values[v].kind).collect();
    assert_eq!(kinds, vec![ValueKind::Data, ValueKind::Param]);
    // --input w --param x swaps them.
    let opts = ImportOptions {
        params: vec!["x".into()],
        inputs: vec!["w".into()],
        ..Default::default()
    };
    let m = load(&g.bytes(), &opts).expect("imports");
    let kinds: Vec<ValueKind> = m.inputs.iter().map(|&v| m.values[v].kind).collect();
    assert_eq!(kinds, vec![ValueKind::Param, ValueKind::Data]);
    let t = m.training_graph().expect("training graph");
    assert_eq!(t.params_bytes, 2 * 4 * 4);
}

/// Rule 6: a static float input read as an op's activation operand is data, beside an
/// integer input (found by rule 4) that would otherwise leave it to rule 8: an MLP that
/// computes its own loss from labels, and an image tower beside token ids (CLIP).
#[test]
fn static_float_input_read_as_an_activation_is_data() {
    let mlp_with_labels = G::new(17)
        .input("x", F32, &[D::V(4), D::V(8)])
        .input("labels", I64, &[D::V(4)])
        .input("w", F32, &[D::V(3), D::V(8)])
        .node("Flatten", "flat", &["x"], &["xf"], vec![])
        .node("Gemm", "fc", &["xf", "w"], &["h"], vec![a_int("transB", 1)])
        .node(
            "SoftmaxCrossEntropyLoss",
            "ce",
            &["h", "labels"],
            &["loss"],
            vec![],
        )
        .output("loss");
    let m = load(&mlp_with_labels.bytes(), &ImportOptions::default()).expect("imports");
    let kinds: Vec<ValueKind> = m.inputs.iter().map(|&v| m.values[v].kind).collect();
    assert_eq!(
        kinds,
        vec![ValueKind::Data, ValueKind::Data, ValueKind::Param]
    );
    let t = m.training_graph().expect("training graph");
    assert!(ids(&t).contains(&"f:fc"), "{:?}", ids(&t));
    assert_eq!(t.params_bytes, 3 * 8 * 4);

    let two_towers = G::new(17)
        .input("ids", I64, &[D::V(2), D::V(5)])
        .input("pixels", F32, &[D::V(2), D::V(3), D::V(8), D::V(8)])
        .input("emb", F32, &[D::V(10), D::V(4)])
        .input("patch", F32, &[D::V(4), D::V(3), D::V(4), D::V(4)])
        .node("Gather", "lookup", &["emb", "ids"], &["t"], vec![])
        .node(
            "Conv",
            "patchify",
            &["pixels", "patch"],
            &["p"],
            vec![a_ints("strides", &[4, 4])],
        )
        .output("t")
        .output("p");
    let m = load(&two_towers.bytes(), &ImportOptions::default()).expect("imports");
    let kinds: Vec<ValueKind> = m.inputs.iter().map(|&v| m.values[v].kind).collect();
    assert_eq!(
        kinds,
        vec![
            ValueKind::Data,
            ValueKind::Data,
            ValueKind::Param,
            ValueKind::Param
        ]
    );
    let t = m.training_graph().expect("training graph");
    assert!(ids(&t).contains(&"f:patchify"), "{:?}", ids(&t));

    // A three-dimensional input into a linear layer is exported as MatMul, not Gemm: its first
    // operand is the activation too.
    let tokens_with_labels = G::new(17)
        .input("x", F32, &[D::V(2), D::V(4), D::V(8)])
        .input("labels", I64, &[D::V(2), D::V(4)])
        .input("w", F32, &[D::V(8), D::V(3)])
        .node("MatMul", "proj", &["x", "w"], &["h"], vec![])
        .node(
            "Transpose",
            "t",
            &["h"],
            &["ht"],
            vec![a_ints("perm", &[0, 2, 1])],
        )
        .node(
            "SoftmaxCrossEntropyLoss",
            "ce",
            &["ht", "labels"],
            &["loss"],
            vec![],
        )
        .output("loss");
    let m = load(&tokens_with_labels.bytes(), &ImportOptions::default()).expect("imports");
    let kinds: Vec<ValueKind> = m.inputs.iter().map(|&v| m.values[v].kind).collect();
    assert_eq!(
        kinds,
        vec![ValueKind::Data, ValueKind::Data, ValueKind::Param]
    );

    // Rule 8: two frames concatenated before the network (RAFT): the second is data too.
    let frames = G::new(17)
        .input("img1", F32, &[D::V(1), D::V(3), D::V(8), D::V(8)])
        .input("img2", F32, &[D::V(1), D::V(3), D::V(8), D::V(8)])
        .weight("w", &[4, 3, 3, 3])
        .node(
            "Concat",
            "pair",
            &["img1", "img2"],
            &["both"],
            vec![a_int("axis", 0)],
        )
        .node("Conv", "conv", &["both", "w"], &["y"], vec![])
        .output("y");
    let m = load(&frames.bytes(), &ImportOptions::default()).expect("imports");
    let kind = |name: &str| m.values.iter().find(|v| v.name == name).map(|v| v.kind);
    assert_eq!(kind("img1"), Some(ValueKind::Data));
    assert_eq!(kind("img2"), Some(ValueKind::Data));
    assert_eq!(kind("w"), Some(ValueKind::Param));

    // --param on the integer input is refused by name.
    let opts = ImportOptions {
        params: vec!["ids".into()],
        ..Default::default()
    };
    let err = load(&two_towers.bytes(), &opts).expect_err("an int64 parameter");
    assert!(
        err.to_string().contains(
            "--param \"ids\": the value is i64; --param names floating-point weights only"
        ),
        "{err}"
    );
}

#[test]
fn batchnorm_stats_dropout_mask_and_maxpool_indices_are_extra_values() {
    let g = G::new(17)
        .input("x", F32, &[D::P("batch"), D::V(3), D::V(8), D::V(8)])
        .weight("w", &[4, 3, 3, 3])
        .weight("scale", &[4])
        .weight("bias", &[4])
        .input("mean", F32, &[D::V(4)])
        .input("var", F32, &[D::V(4)])
        .init(tensor_f32("ratio", &[], &[0.5]))
        .init(tensor_bool("train", true))
        .node(
            "Conv",
            "conv",
            &["x", "w"],
            &["c"],
            vec![a_ints("pads", &[1, 1, 1, 1])],
        )
        .node(
            "BatchNormalization",
            "bn",
            &["c", "scale", "bias", "mean", "var"],
            &["b", "rm", "rv"],
            vec![a_int("training_mode", 1)],
        )
        .node("Relu", "relu", &["b"], &["r"], vec![])
        .node(
            "MaxPool",
            "pool",
            &["r"],
            &["p"],
            vec![a_ints("kernel_shape", &[2, 2]), a_ints("strides", &[2, 2])],
        )
        .node("Dropout", "drop", &["p", "ratio", "train"], &["d"], vec![])
        .output("d");
    let m = load(&g.bytes(), &dims(&[("batch", 2)])).expect("imports");
    let kind = |name: &str| m.values.iter().find(|v| v.name == name).map(|v| v.kind);
    assert_eq!(kind("mean"), Some(ValueKind::Buffer));
    assert_eq!(kind("scale"), Some(ValueKind::Param));
    let t = m.training_graph().expect("training graph");
    let n = |id: &str| {
        t.nodes
            .iter()
            .find(|n| n.id == id)
            .unwrap_or_else(|| panic!("{id}: {:?}", ids(&t)))
    };
    assert_eq!(n("f:bn:stats").bytes, 2 * 4 * 4);
    assert_eq!(n("f:pool:indices").bytes, 2 * 4 * 4 * 4 * 8);
    assert!(n("f:drop:mask").replay_rng && n("f:drop").replay_rng);
    assert_eq!(n("f:drop:mask").bytes, 2 * 4 * 4 * 4);
    let deps: Vec<&str> = n("b:bn")
        .deps
        .iter()
        .map(|&d| t.nodes[d].id.as_str())
        .collect();
    assert_eq!(deps, vec!["f:conv", "f:bn:stats", "b:relu"]);
    // Saved: x (1536 floats), conv out (kept by bn), relu out (relu, pool), stats,
    // indices, mask.
    let x = 2 * 3 * 8 * 8 * 4;
    let act = 2 * 4 * 8 * 8 * 4;
    assert_eq!(
        t.saved_activation_bytes,
        x + 2 * act + 32 + 2 * 4 * 4 * 4 * 8 + 2 * 4 * 4 * 4
    );
    assert_eq!(t.buffers_bytes, 2 * 4 * 4 + 4 + 1);
}

#[test]
fn views_share_storage_and_integer_paths_have_no_backward() {
    // y = Reshape(Relu(x)); token ids go through an embedding Gather.
    let g = G::new(17)
        .input("ids", I64, &[D::P("batch"), D::V(5)])
        .weight("emb", &[10, 6])
        .ints("shape", &[-1, 30])
        .node("Gather", "embed", &["emb", "ids"], &["e"], vec![])
        .node("Relu", "relu", &["e"], &["r"], vec![])
        .node("Reshape", "flat", &["r", "shape"], &["f"], vec![])
        .node("Softmax", "sm", &["f"], &["y"], vec![a_int("axis", -1)])
        .output("y");
    let t = load(&g.bytes(), &dims(&[("batch", 2)]))
        .and_then(|m| m.training_graph())
        .expect("training graph");
    assert_eq!(
        ids(&t),
        vec!["i:ids", "f:embed", "f:relu", "f:sm", "loss", "b:sm", "b:relu", "b:embed"]
    );
    // ids (int64) kept by the embedding, relu's output (its view kept by nobody else),
    // softmax's output.
    assert_eq!(
        t.saved_activation_bytes,
        2 * 5 * 8 + 2 * 30 * 4 + 2 * 30 * 4
    );
    assert!(t.nodes.iter().all(|n| n.id != "b:ids"));
}

#[test]
fn inspect_report_serializes_and_displays() {
    let r = inspect(&mlp().bytes(), &dims(&[("batch", 2)])).expect("inspect");
    assert_eq!(r.nodes, 3);
    assert_eq!(r.ops.get("Gemm"), Some(&2));
    assert_eq!(r.symbolic_dims.get("batch"), Some(&2));
    assert_eq!(r.training_nodes, Some(8));
    assert!(r.store_all_peak_bytes.unwrap_or(0) > r.fixed_bytes.unwrap_or(u64::MAX));
    let json = serde_json::to_value(&r).expect("serializes");
    assert_eq!(json["unsupported"], serde_json::json!([]));
    assert_eq!(json["training"][0]["id"], "i:x");
    let text = r.to_string();
    assert!(text.contains("Gemm×2") && text.contains("batch=2") && text.contains("store-all peak"));
}

#[test]
fn unnamed_dynamic_dims_are_bound_by_input_and_axis() {
    let mut g = G::new(17)
        .input("x", F32, &[D::V(1), D::V(4)])
        .weight("w", &[4, 4])
        .node("MatMul", "mm", &["x", "w"], &["y"], vec![])
        .output("y");
    // Clear the first dim: neither a value nor a name.
    if let Some(onnx_protobuf::type_proto::Value::TensorType(t)) = g.graph.input[0]
        .type_
        .as_mut()
        .and_then(|t| t.value.as_mut())
    {
        if let Some(s) = t.shape.as_mut() {
            s.dim[0].value = None;
        }
    }
    match load(&g.bytes(), &ImportOptions::default()) {
        Err(remat_planner::PlannerError::UnboundDims { names }) => assert_eq!(names, vec!["x:0"]),
        other => panic!("expected UnboundDims, got {other:?}"),
    }
    // `x:0`, and the older `x.0`, bind it.
    for name in ["x:0", "x.0"] {
        let t = load(&g.bytes(), &dims(&[(name, 3)]))
            .and_then(|m| m.training_graph())
            .expect("binds");
        assert_eq!(t.saved_activation_bytes, 3 * 4 * 4, "{name}");
    }
    match load(&g.bytes(), &dims(&[("x:1", 3)])) {
        Err(remat_planner::PlannerError::UnknownDim { name, known }) => {
            assert_eq!((name.as_str(), known), ("x:1", vec!["x:0".to_string()]))
        }
        other => panic!("expected UnknownDim, got {other:?}"),
    }
}

#[test]
fn negative_dims_are_dynamic_and_bound_by_input_and_axis() {
    // Paddle writes a dynamic batch as `dim_value: -1`; a dotted input name stays unambiguous.
    let g = G::new(17)
        .input("input.1", F32, &[D::V(-1), D::V(4)])
        .input("mask", F32, &[D::P("batch"), D::V(-1)])
        .weight("w", &[4, 4])
        .node("MatMul", "mm", &["input.1", "w"], &["h"], vec![])
        .node("Mul", "mul", &["h", "mask"], &["y"], vec![])
        .output("y");
    match load(&g.bytes(), &ImportOptions::default()) {
        Err(remat_planner::PlannerError::UnboundDims { names }) => {
            assert_eq!(names, vec!["batch", "input.1:0", "mask:1"])
        }
        other => panic!("expected UnboundDims, got {other:?}"),
    }
    let t = load(
        &g.bytes(),
        &dims(&[("input.1:0", 2), ("batch", 2), ("mask:1", 4)]),
    )
    .and_then(|m| m.training_graph())
    .expect("binds");
    assert!(t.saved_activation_bytes > 0);
    // Bound inconsistently, the shapes say which node disagrees instead of planning.
    assert!(load(
        &g.bytes(),
        &dims(&[("input.1:0", 2), ("batch", 3), ("mask:1", 4)])
    )
    .is_err());
}

#[test]
fn softmax_outputs_read_through_moves_have_a_constant_mean() {
    use remat_planner::training::constant_mean_outputs;
    // p = Softmax(x·w) read through a Transpose and a Reshape; q = LogSoftmax(x·w); r = p·2.
    let g = G::new(17)
        .input("x", F32, &[D::V(2), D::V(4)])
        .weight("w", &[4, 3])
        .ints("shape", &[6])
        .node("MatMul", "mm", &["x", "w"], &["h"], vec![])
        .node("Softmax", "sm", &["h"], &["p0"], vec![a_int("axis", -1)])
        .node("Transpose", "t", &["p0"], &["p1"], vec![])
        .node("Reshape", "flat", &["p1", "shape"], &["p"], vec![])
        .node("LogSoftmax", "lsm", &["h"], &["q"], vec![a_int("axis", -1)])
        .node("Add", "twice", &["p0", "p0"], &["r"], vec![])
        .output("p")
        .output("q")
        .output("r");
    let m = load(&g.bytes(), &ImportOptions::default()).expect("loads");
    let t = m.training_graph().expect("training graph");
    let constant: Vec<&str> = constant_mean_outputs(&m, &t.exec.loss_outputs)
        .iter()
        .map(|&v| m.values[v].name.as_str())
        .collect();
    assert_eq!(constant, vec!["p"]);
    assert_eq!(t.exec.loss_outputs.len(), 3);
}

#[test]
fn paddles_question_mark_dims_are_bound_by_input_and_axis() {
    // PaddleOCR's classifier declares `x` as [-1, 3, "?", "?"]: "?" marks each unknown dim,
    // so height and width are bound apart.
    let g = G::new(11)
        .input("x", F32, &[D::V(-1), D::V(3), D::P("?"), D::P("?")])
        .weight("w", &[192, 4])
        .node("MatMul", "mm", &["x", "w"], &["y"], vec![])
        .output("y");
    match load(&g.bytes(), &ImportOptions::default()) {
        Err(remat_planner::PlannerError::UnboundDims { names }) => {
            assert_eq!(names, vec!["x:0", "x:2", "x:3"])
        }
        other => panic!("expected UnboundDims, got {other:?}"),
    }
    let m = load(&g.bytes(), &dims(&[("x:0", 2), ("x:2", 48), ("x:3", 192)])).expect("binds");
    let t = m.training_graph().expect("training graph");
    // MatMul keeps x for its weight's gradient: 2·3·48·192 floats.
    assert_eq!(t.saved_activation_bytes, 2 * 3 * 48 * 192 * 4);
    match load(&g.bytes(), &dims(&[("x:0", 2), ("?", 48)])) {
        Err(remat_planner::PlannerError::UnknownDim { name, known }) => {
            assert_eq!(name, "?");
            assert_eq!(known, vec!["x:0", "x:2", "x:3"]);
        }
        other => panic!("expected UnknownDim, got {other:?}"),
    }
}

#[test]
fn dropout_with_ratio_zero_is_a_view_and_positive_ratio_keeps_a_mask() {
    for (ratio, mask) in [(0.0f32, false), (0.1, true)] {
        let g = G::new(13)
            .input("x", F32, &[D::V(2), D::V(4)])
            .weight("w", &[4, 4])
            .init(tensor_f32("ratio", &[], &[ratio]))
            .node("MatMul", "mm", &["x", "w"], &["h"], vec![])
            .node("Dropout", "drop", &["h", "ratio"], &["d"], vec![])
            .node("Tanh", "tanh", &["d"], &["y"], vec![])
            .output("y");
        let t = load(&g.bytes(), &ImportOptions::default())
            .and_then(|m| m.training_graph())
            .expect("training graph");
        let has = |id: &str| t.nodes.iter().any(|n| n.id == id);
        assert_eq!(has("f:drop"), mask, "ratio {ratio}");
        assert_eq!(has("f:drop:mask"), mask, "ratio {ratio}");
        // x (for dW) and tanh's output, plus the mask when active.
        let expect = 2 * 4 * 4 + 2 * 4 * 4 + if mask { 2 * 4 } else { 0 };
        assert_eq!(t.saved_activation_bytes, expect, "ratio {ratio}");
    }
}

/// A transformer-style block y = W2·act(norm(x)) built natively or the way exporters
/// decompose it; both must keep the same bytes, as PyTorch's single ops do.
fn block(opset: i64, decomposed: bool, act: &str) -> G {
    let mut g = G::new(opset)
        .input("x", F32, &[D::V(2), D::V(5), D::V(8)])
        .weight("gamma", &[8])
        .weight("beta", &[8])
        .weight("w", &[8, 8])
        .init(tensor_f32("eps", &[], &[1e-5]))
        .init(tensor_f32("two", &[], &[2.0]))
        .init(tensor_f32("sqrt2", &[], &[std::f32::consts::SQRT_2]))
        .init(tensor_f32("one", &[], &[1.0]))
        .init(tensor_f32("half", &[], &[0.5]));
    let axes = vec![a_ints("axes", &[-1])];
    g = if decomposed {
        g.node("ReduceMean", "mean", &["x"], &["m"], axes.clone())
            .node("Sub", "sub", &["x", "m"], &["d"], vec![])
            .node("Pow", "pow", &["d", "two"], &["p"], vec![])
            .node("ReduceMean", "var", &["p"], &["v"], axes)
            .node("Add", "addeps", &["v", "eps"], &["e"], vec![])
            .node("Sqrt", "sqrt", &["e"], &["s"], vec![])
            .node("Div", "div", &["d", "s"], &["n"], vec![])
            .node("Mul", "scale", &["n", "gamma"], &["ns"], vec![])
            .node("Add", "shift", &["ns", "beta"], &["h"], vec![])
    } else {
        g.node(
            "LayerNormalization",
            "ln",
            &["x", "gamma", "beta"],
            &["h"],
            vec![a_int("axis", -1)],
        )
    };
    g = g.node("MatMul", "mm", &["h", "w"], &["z"], vec![]);
    g = match (act, decomposed) {
        ("gelu", true) => g
            .node("Div", "gdiv", &["z", "sqrt2"], &["g1"], vec![])
            .node("Erf", "erf", &["g1"], &["g2"], vec![])
            .node("Add", "gadd", &["g2", "one"], &["g3"], vec![])
            .node("Mul", "gmul", &["z", "g3"], &["g4"], vec![])
            .node("Mul", "ghalf", &["g4", "half"], &["y"], vec![]),
        ("silu", true) => g.node("Sigmoid", "sig", &["z"], &["s1"], vec![]).node(
            "Mul",
            "smul",
            &["s1", "z"],
            &["y"],
            vec![],
        ),
        ("hardswish", true) => g
            .node(
                "HardSigmoid",
                "hsig",
                &["z"],
                &["s1"],
                vec![a_float("alpha", 1.0 / 6.0)],
            )
            .node("Mul", "hmul", &["z", "s1"], &["y"], vec![]),
        ("hardswish", false) => g.node("HardSwish", "hswish", &["z"], &["y"], vec![]),
        ("gelu", false) => g.node("Gelu", "gelu", &["z"], &["y"], vec![]),
        _ => g.node("Swish", "swish", &["z"], &["y"], vec![]),
    };
    g.output("y")
}

#[test]
fn decomposed_layer_norm_and_activations_keep_what_the_native_ops_keep() {
    for act in ["gelu", "silu", "hardswish"] {
        let native = load(&block(20, false, act).bytes(), &ImportOptions::default())
            .and_then(|m| m.training_graph())
            .unwrap_or_else(|e| panic!("{act} native: {e}"));
        let decomposed = load(&block(13, true, act).bytes(), &ImportOptions::default())
            .and_then(|m| m.training_graph())
            .unwrap_or_else(|e| panic!("{act} decomposed: {e}"));
        // x and its statistics (layer norm), h (matmul), z (activation).
        let expect = 3 * 2 * 5 * 8 * 4 + 2 * 2 * 5 * 4;
        assert_eq!(native.saved_activation_bytes, expect, "{act} native");
        assert_eq!(
            decomposed.saved_activation_bytes, expect,
            "{act} decomposed"
        );
        assert_eq!(native.params_bytes, decomposed.params_bytes);
        assert_eq!(native.nodes.len(), decomposed.nodes.len(), "{act}");
    }
}

#[test]
fn random_ops_are_not_folded_and_replay_their_state() {
    let g = G::new(17)
        .input("x", F32, &[D::V(2), D::V(4)])
        .weight("w", &[4, 4])
        .node("RandomNormalLike", "noise", &["x"], &["n"], vec![])
        .node("Add", "add", &["x", "n"], &["h"], vec![])
        .node("MatMul", "mm", &["h", "w"], &["y"], vec![])
        .output("y");
    let t = load(&g.bytes(), &ImportOptions::default())
        .and_then(|m| m.training_graph())
        .expect("training graph");
    let noise = t
        .nodes
        .iter()
        .find(|n| n.id == "f:noise")
        .expect("noise node");
    assert!(noise.replay_rng);
    assert_eq!(noise.bytes, 2 * 4 * 4);
}

/// GroupNorm as exporters write it below opset 18 (Reshape, InstanceNormalization with unit
/// scale and zero bias, Reshape back, Mul γ, Add β) keeps what the native op keeps: x and
/// the per-group statistics, not the normalized tensor.
#[test]
fn decomposed_group_norm_keeps_what_the_native_op_keeps() {
    let graph = |decomposed: bool| {
        let g = G::new(if decomposed { 17 } else { 21 })
            .input("x", F32, &[D::V(2), D::V(4), D::V(6)])
            .weight("w", &[6, 6]);
        let g = if decomposed {
            g.weight("gamma", &[4, 1])
                .weight("beta", &[4, 1])
                .init(tensor_i64("grouped", &[3], &[2, 2, -1]))
                .init(tensor_i64("back", &[3], &[2, 4, 6]))
                .init(tensor_f32("ones", &[2], &[1.0, 1.0]))
                .init(tensor_f32("zeros", &[2], &[0.0, 0.0]))
                .node("Reshape", "rs1", &["x", "grouped"], &["r"], vec![])
                .node(
                    "InstanceNormalization",
                    "in",
                    &["r", "ones", "zeros"],
                    &["n"],
                    vec![a_float("epsilon", 1e-5)],
                )
                .node("Reshape", "rs2", &["n", "back"], &["nb"], vec![])
                .node("Mul", "scale", &["nb", "gamma"], &["ns"], vec![])
                .node("Add", "shift", &["ns", "beta"], &["h"], vec![])
        } else {
            g.weight("gamma", &[4]).weight("beta", &[4]).node(
                "GroupNormalization",
                "gn",
                &["x", "gamma", "beta"],
                &["h"],
                vec![a_int("num_groups", 2)],
            )
        };
        g.node("MatMul", "mm", &["h", "w"], &["y"], vec![])
            .output("y")
    };
    let opts = ImportOptions {
        inputs: vec!["x".into()],
        ..Default::default()
    };
    let saved = |decomposed: bool| {
        load(&graph(decomposed).bytes(), &opts)
            .and_then(|m| m.training_graph())
            .map(|t| t.saved_activation_bytes)
            .unwrap_or_else(|e| panic!("decomposed={decomposed}: {e}"))
    };
    // x and h (48 floats each) and mean/rstd for 2 samples x 2 groups.
    let expect = 2 * 48 * 4 + 2 * 2 * 2 * 4;
    assert_eq!(saved(false), expect, "native");
    assert_eq!(saved(true), expect, "decomposed");
}

/// `x[2, 4, 5, 8]` projected to q, k, v by `wq`, `wk`, `wv` (8×8 each), with the scalar
/// `s` = 0.5 beside them.
fn qkv(opset: i64) -> G {
    G::new(opset)
        .input("x", F32, &[D::V(2), D::V(4), D::V(5), D::V(8)])
        .weight("wq", &[8, 8])
        .weight("wk", &[8, 8])
        .weight("wv", &[8, 8])
        .init(tensor_f32("s", &[], &[0.5]))
        .node("MatMul", "q", &["x", "wq"], &["q"], vec![])
        .node("MatMul", "k", &["x", "wk"], &["k"], vec![])
        .node("MatMul", "v", &["x", "wv"], &["v"], vec![])
        .node(
            "Transpose",
            "kt",
            &["k"],
            &["kt"],
            vec![a_ints("perm", &[0, 1, 3, 2])],
        )
}

/// [`qkv`] and the scores of scaled dot-product attention as both exporters write them:
/// `MatMul(Mul(q, s), Mul(kᵀ, s))`, in `sc`.
fn sdpa_scores(opset: i64) -> G {
    qkv(opset)
        .node("Mul", "qs", &["q", "s"], &["qs"], vec![])
        .node("Mul", "ks", &["kt", "s"], &["ks"], vec![])
        .node("MatMul", "scores", &["qs", "ks"], &["sc"], vec![])
}

#[test]
fn decomposed_sdpa_keeps_what_the_attention_op_keeps() {
    let graph = |kind: &str| {
        let g = match kind {
            "native" => qkv(23).node("Attention", "attn", &["q", "k", "v"], &["y"], vec![]),
            "sdpa" => sdpa_scores(17)
                .node("Softmax", "sm", &["sc"], &["p"], vec![a_int("axis", -1)])
                .node("MatMul", "pv", &["p", "v"], &["y"], vec![]),
            _ => qkv(17)
                .init(tensor_f32("s2", &[], &[0.25]))
                .node("MatMul", "scores", &["q", "kt"], &["raw"], vec![])
                .node("Mul", "scale", &["raw", "s2"], &["sc"], vec![])
                .node("Softmax", "sm", &["sc"], &["p"], vec![a_int("axis", -1)])
                .node("MatMul", "pv", &["p", "v"], &["y"], vec![]),
        };
        g.output("y")
    };
    let opts = ImportOptions {
        inputs: vec!["x".into()],
        ..Default::default()
    };
    let saved = |kind: &str| {
        load(&graph(kind).bytes(), &opts)
            .and_then(|m| m.training_graph())
            .map(|t| t.saved_activation_bytes)
            .unwrap_or_else(|e| panic!("{kind}: {e}"))
    };
    // x (for the three weight gradients), q, k, v, the output: 2·4·5·8 floats each; the
    // log-sum-exp: 2·4·5 floats.
    let expect = 5 * 2 * 4 * 5 * 8 * 4 + 2 * 4 * 5 * 4;
    assert_eq!(saved("native"), expect, "native");
    assert_eq!(saved("sdpa"), expect, "sdpa");
    // The fused node carries the product of the two factors as its scale.
    let fused = load(&graph("sdpa").bytes(), &opts).unwrap_or_else(|e| panic!("sdpa: {e}"));
    let scale = fused
        .graph
        .node_weights()
        .filter(|n| n.op_type == "Attention" && !n.skipped)
        .flat_map(|n| n.attrs.iter())
        .find(|a| a.name == "scale")
        .map(|a| a.f);
    assert_eq!(scale, Some(0.25), "scale of the fused attention");
    // Eager keeps x, q, kᵀ, the probabilities and v, not the output or statistics, plus
    // the 4-byte scale constant its Mul reads.
    let probs = 2 * 4 * 5 * 5 * 4;
    assert_eq!(saved("eager"), 4 * 2 * 4 * 5 * 8 * 4 + probs + 4, "eager");
}

/// An additive mask that may be trained (a learned position bias, as BEiT's, Swin's and T5's)
/// keeps the attention decomposed, so that the bias takes its gradient: the fused op's
/// backward gives q, k and v theirs only. A constant mask (a causal mask a PyTorch exporter
/// wrote as a `Constant`) is fused as before; the same `Constant` in a graph from another
/// producer is a parameter by the parameter rule, so it stays decomposed there too (the fusion
/// and the rule agree: fusing must not change which values are trained).
#[test]
fn attention_with_a_learned_bias_stays_decomposed_and_the_bias_is_a_parameter() {
    let graph = |learned: bool| {
        let g = sdpa_scores(17);
        let g = if learned {
            g.init(tensor_f32("bias", &[1, 4, 5, 5], &[0.1; 100]))
        } else {
            g.node(
                "Constant",
                "causal",
                &[],
                &["bias"],
                vec![a_tensor(
                    "value",
                    tensor_f32("c", &[1, 1, 5, 5], &[0.0; 25]),
                )],
            )
        };
        g.node("Add", "mask", &["sc", "bias"], &["scm"], vec![])
            .node("Softmax", "sm", &["scm"], &["p"], vec![a_int("axis", -1)])
            .node("MatMul", "pv", &["p", "v"], &["y"], vec![])
            .output("y")
    };
    let opts = ImportOptions {
        inputs: vec!["x".into()],
        ..Default::default()
    };
    let fused = |m: &remat_planner::Model| {
        m.graph
            .node_weights()
            .any(|n| n.op_type == "Attention" && !n.skipped)
    };
    let learned = load(&graph(true).bytes(), &opts).expect("imports");
    assert!(
        !fused(&learned),
        "a learned bias was fused away from its gradient"
    );
    let kind = |m: &remat_planner::Model, name: &str| {
        m.values.iter().find(|v| v.name == name).map(|v| v.kind)
    };
    assert_eq!(kind(&learned, "bias"), Some(ValueKind::Param));
    let t = learned.training_graph().expect("training graph");
    assert_eq!(t.params_bytes, (3 * 64 + 100) * 4);
    assert!(ids(&t).contains(&"b:mask"), "{:?}", ids(&t));
    let with_producer = |producer: &str| {
        use onnx_protobuf::Message;
        let mut m = graph(false).model();
        m.producer_name = producer.into();
        load(&m.write_to_bytes().unwrap_or_default(), &opts).expect("imports")
    };
    let constant = with_producer("pytorch");
    assert!(fused(&constant), "a constant mask is fused");
    assert_eq!(kind(&constant, "bias"), Some(ValueKind::Buffer));
    let other = with_producer("remat-tests");
    assert!(
        !fused(&other),
        "a Constant another producer may train was fused"
    );
    assert_eq!(kind(&other, "bias"), Some(ValueKind::Param));
}

/// A float `Constant` read as a MatMul weight is a trainable parameter in general (Paddle
/// and hand-built graphs keep weights that way) but a buffer in a PyTorch export, whose
/// parameters are always graph inputs or initializers; initializers stay parameters.
#[test]
fn pytorch_constant_nodes_are_buffers_initializers_parameters() {
    use onnx_protobuf::Message;
    let g = G::new(17)
        .input("x", F32, &[D::V(2), D::V(4)])
        .init(tensor_f32("w_init", &[4, 4], &[0.5; 16]))
        .node(
            "Constant",
            "mel",
            &[],
            &["w_const"],
            vec![a_tensor("value", tensor_f32("v", &[4, 4], &[0.25; 16]))],
        )
        .node("MatMul", "mm1", &["x", "w_const"], &["h"], vec![])
        .node("MatMul", "mm2", &["h", "w_init"], &["y"], vec![])
        .output("y");
    for (producer, want) in [("remat-tests", 2 * 64), ("pytorch", 64)] {
        let mut m = g.model();
        m.producer_name = producer.into();
        let bytes = m.write_to_bytes().unwrap_or_default();
        let model =
            load(&bytes, &ImportOptions::default()).unwrap_or_else(|e| panic!("{producer}: {e}"));
        let kind = |name: &str| model.values.iter().find(|v| v.name == name).map(|v| v.kind);
        assert_eq!(kind("w_init"), Some(ValueKind::Param), "{producer}");
        let t = model.training_graph().expect("training graph");
        assert_eq!(t.params_bytes, want, "{producer}");
        if producer == "pytorch" {
            assert_eq!(kind("w_const"), Some(ValueKind::Buffer));
        }
    }
}

#[test]
fn a_batched_matmul_keeps_copies_of_strided_views_as_pytorch_does() {
    // qkv = x·W split into heads, permuted, q and k taken by index: strided views of qkv.
    // s = q·kᵀ is batched over (batch, heads), which cannot be merged without a copy, so
    // PyTorch's matmul saves copies of q and kᵀ; z = qkv viewed [2, 4, 3, 4] times a 2-D
    // weight folds as a view and keeps qkv itself.
    let g = G::new(17)
        .input("x", F32, &[D::V(2), D::V(4), D::V(12)])
        .weight("w", &[12, 12])
        .weight("w2", &[4, 4])
        .ints("heads", &[2, 4, 3, 2, 2])
        .ints("parts", &[2, 4, 3, 4])
        .init(tensor_i64("zero", &[], &[0]))
        .init(tensor_i64("one", &[], &[1]))
        .node("MatMul", "proj", &["x", "w"], &["qkv"], vec![])
        .node("Reshape", "split", &["qkv", "heads"], &["h"], vec![])
        .node(
            "Transpose",
            "perm",
            &["h"],
            &["p"],
            vec![a_ints("perm", &[2, 0, 3, 1, 4])],
        )
        .node("Gather", "q", &["p", "zero"], &["q"], vec![])
        .node("Gather", "k", &["p", "one"], &["k"], vec![])
        .node(
            "Transpose",
            "kt",
            &["k"],
            &["kt"],
            vec![a_ints("perm", &[0, 1, 3, 2])],
        )
        .node("MatMul", "s", &["q", "kt"], &["y"], vec![])
        .node("Reshape", "view", &["qkv", "parts"], &["v4"], vec![])
        .node("MatMul", "z", &["v4", "w2"], &["z"], vec![])
        .output("y")
        .output("z");
    let t = load(&g.bytes(), &dims(&[]))
        .and_then(|m| m.training_graph())
        .expect("training graph");
    let names = ids(&t);
    for id in ["f:s:input0_copy", "f:s:input1_copy"] {
        let n = t
            .nodes
            .iter()
            .find(|n| n.id == id)
            .unwrap_or_else(|| panic!("{id}: {names:?}"));
        assert_eq!(n.bytes, 2 * 2 * 4 * 2 * 4, "{id}");
    }
    assert!(
        !names.iter().any(|n| n.starts_with("f:z:input")),
        "{names:?}"
    );
    // x (kept by proj), qkv (kept by z through its contiguous view), the copies of q and kᵀ.
    assert_eq!(
        t.saved_activation_bytes,
        2 * 4 * 12 * 4 + 2 * 4 * 12 * 4 + 2 * (2 * 2 * 4 * 2 * 4)
    );
}

#[test]
fn a_strided_slice_folded_by_matmul_is_kept_as_a_copy() {
    // h[4, 3, 4] sliced with step 2 along dim 0 is [2, 3, 4] with strides [24, 4, 1]: its
    // rows do not fold into [6, 4] as a view, so matmul with a 2-D weight saves a copy; the
    // step-1 slice folds and keeps h.
    let sliced = |step: i64| {
        G::new(17)
            .input("x", F32, &[D::V(4), D::V(3), D::V(4)])
            .weight("w", &[4, 4])
            .weight("w2", &[4, 4])
            .ints("starts", &[0])
            .ints("ends", &[4])
            .ints("axes", &[0])
            .ints("steps", &[step])
            .node("MatMul", "m1", &["x", "w"], &["h"], vec![])
            .node(
                "Slice",
                "sl",
                &["h", "starts", "ends", "axes", "steps"],
                &["hs"],
                vec![],
            )
            .node("MatMul", "m2", &["hs", "w2"], &["y"], vec![])
            .output("y")
    };
    let ids_of = |step: i64| {
        let t = load(&sliced(step).bytes(), &dims(&[]))
            .and_then(|m| m.training_graph())
            .expect("training graph");
        t.nodes
            .iter()
            .map(|n| (n.id.clone(), n.bytes))
            .collect::<Vec<_>>()
    };
    let two = ids_of(2);
    assert!(
        two.iter()
            .any(|(id, b)| id == "f:m2:input0_copy" && *b == 2 * 3 * 4 * 4),
        "{two:?}"
    );
    let one = ids_of(1);
    assert!(!one.iter().any(|(id, _)| id.contains("_copy")), "{one:?}");
}

/// A convolution of more than one group (depthwise) is priced at rates of its own
/// (`Conv.grouped`), forward and backward; a dense one at `Conv`'s.
#[test]
fn grouped_convolutions_have_rates_of_their_own() {
    let g = G::new(17)
        .input("x", F32, &[D::V(1), D::V(8), D::V(16), D::V(16)])
        .weight("wd", &[8, 1, 3, 3])
        .weight("wp", &[8, 8, 1, 1])
        .node(
            "Conv",
            "depthwise",
            &["x", "wd"],
            &["d"],
            vec![a_int("group", 8), a_ints("pads", &[1, 1, 1, 1])],
        )
        .node("Conv", "pointwise", &["d", "wp"], &["p"], vec![])
        .output("p");
    let m = load(&g.bytes(), &dims(&[])).expect("imports");
    let t = m.training_graph().expect("training graph");
    let rate_op = |id: &str| {
        let i = t.nodes.iter().position(|n| n.id == id).unwrap();
        (t.rate_ops[i].as_str(), i)
    };
    assert_eq!(rate_op("f:depthwise").0, "Conv.grouped");
    assert_eq!(rate_op("b:depthwise").0, "Conv.grouped");
    assert_eq!(rate_op("f:pointwise").0, "Conv");
    assert_eq!(rate_op("b:pointwise").0, "Conv");
    assert_eq!(t.rate_ops.len(), t.nodes.len());
    // The defaults price the depthwise kernel at its own (much lower) FLOP rate.
    let r = remat_planner::Roofline::cpu_default();
    let (_, i) = rate_op("f:depthwise");
    let own = r.op_rates("Conv.grouped", NodeKind::Forward);
    assert_eq!(
        r.node_seconds(&t, i),
        own.seconds(t.nodes[i].cost, t.traffic[i] as f64)
    );
    assert!(own.flops_per_second < r.op_rates("Conv", NodeKind::Forward).flops_per_second);
}

/// A one-element float initializer (a scalar `nn.Parameter`, PReLU's one slope) reads like an
/// exporter's constant: it is a buffer by default, named in the report's notes, and
/// `--param NAME` makes it a trained parameter (it was refused: "not a graph input").
#[test]
fn a_one_element_initializer_is_noted_and_trained_when_named() {
    let g = G::new(17)
        .input("x", F32, &[D::V(2), D::V(4)])
        .weight("w", &[4, 3])
        .init(tensor_f32("temp", &[], &[2.0]))
        .node("MatMul", "mm", &["x", "w"], &["h"], vec![])
        .node("Mul", "scale", &["h", "temp"], &["y"], vec![])
        .output("y");
    let kind = |m: &remat_planner::Model| {
        m.values
            .iter()
            .find(|v| v.name == "temp")
            .map(|v| v.kind)
            .expect("temp imported")
    };
    let opts = remat_planner::ImportOptions::default();
    let m = load(&g.bytes(), &opts).expect("imports");
    assert_eq!(kind(&m), ValueKind::Buffer);
    let report = remat_planner::inspect(&g.bytes(), &opts).expect("inspects");
    assert_eq!(report.notes.len(), 1, "{:?}", report.notes);
    assert!(
        report.notes[0].contains("temp") && report.notes[0].contains("--param"),
        "{}",
        report.notes[0]
    );
    let mut opts = remat_planner::ImportOptions::default();
    opts.params.push("temp".into());
    let m = load(&g.bytes(), &opts).expect("imports with --param temp");
    assert_eq!(kind(&m), ValueKind::Param);
    let report = remat_planner::inspect(&g.bytes(), &opts).expect("inspects");
    assert!(report.notes.is_empty(), "{:?}", report.notes);
    let tg = m.training_graph().expect("training graph");
    assert_eq!(tg.params_bytes, 4 * 3 * 4 + 4);
    // An integer initializer is no parameter.
    let g = g.ints("k", &[3, 4]);
    let mut opts = remat_planner::ImportOptions::default();
    opts.params.push("k".into());
    assert!(matches!(
        load(&g.bytes(), &opts),
        Err(remat_planner::PlannerError::ParamNotFloat { .. })
    ));
}

/// `--input` may name an initializer: a weight the training keeps frozen (a frozen backbone,
/// LoRA's base weights) takes no gradient and holds no gradient bytes. It was refused ('not a
/// graph input'), and every stored weight was trained.
#[test]
fn an_initializer_named_as_input_is_a_frozen_weight() {
    let g = G::new(17)
        .input("x", F32, &[D::V(2), D::V(4)])
        .weight("frozen", &[4, 8])
        .weight("w", &[8, 3])
        .node("MatMul", "mm1", &["x", "frozen"], &["h"], vec![])
        .node("Relu", "act", &["h"], &["a"], vec![])
        .node("MatMul", "mm2", &["a", "w"], &["y"], vec![])
        .output("y");
    let kind = |m: &remat_planner::Model, name: &str| {
        m.values
            .iter()
            .find(|v| v.name == name)
            .map(|v| v.kind)
            .expect("imported")
    };
    let opts = remat_planner::ImportOptions::default();
    let m = load(&g.bytes(), &opts).expect("imports");
    assert_eq!(kind(&m, "frozen"), ValueKind::Param);
    let trained = m.training_graph().expect("training graph");
    let mut opts = remat_planner::ImportOptions::default();
    opts.inputs.push("frozen".into());
    let m = load(&g.bytes(), &opts).expect("imports with --input frozen");
    assert_eq!(kind(&m, "frozen"), ValueKind::Buffer);
    assert_eq!(kind(&m, "w"), ValueKind::Param);
    let frozen = m.training_graph().expect("training graph");
    assert_eq!(frozen.params_bytes, 8 * 3 * 4);
    assert_eq!(trained.params_bytes, (4 * 8 + 8 * 3) * 4);
    assert!(
        frozen.nodes.len() < trained.nodes.len(),
        "no backward for the frozen weight"
    );
    // A name that is neither says what it may be.
    let mut opts = remat_planner::ImportOptions::default();
    opts.inputs.push("nope".into());
    let e = load(&g.bytes(), &opts)
        .expect_err("unknown name")
        .to_string();
    assert!(e.contains("not a graph input or an initializer"), "{e}");
}

/// A frozen backbone is hundreds of weights: `--freeze` (like `--input` and `--param`) takes a
/// glob pattern over the graph inputs and initializers; an exact name of another option is an
/// exception; a pattern that matches nothing (a typo would leave the backbone trained) or
/// does not parse is an error naming it, and so is a name given to two options.
#[test]
fn a_pattern_named_to_freeze_freezes_every_weight_it_matches() {
    let g = G::new(17)
        .input("x", F32, &[D::V(2), D::V(4)])
        .weight("backbone/l0.w", &[4, 8])
        .weight("backbone.l1.w", &[8, 8])
        .weight("backbone.l1.scale", &[8])
        .weight("head.w", &[8, 3])
        .node("MatMul", "mm0", &["x", "backbone/l0.w"], &["h0"], vec![])
        .node("MatMul", "mm1", &["h0", "backbone.l1.w"], &["h1"], vec![])
        .node("Mul", "scale", &["h1", "backbone.l1.scale"], &["s"], vec![])
        .node("Relu", "act", &["s"], &["a"], vec![])
        .node("MatMul", "mm2", &["a", "head.w"], &["y"], vec![])
        .output("y");
    let kinds = |opts: &remat_planner::ImportOptions| {
        let m = load(&g.bytes(), opts).expect("imports");
        let mut params: Vec<String> = m
            .values
            .iter()
            .filter(|v| v.kind == ValueKind::Param)
            .map(|v| v.name.clone())
            .collect();
        params.sort();
        (
            params,
            m.training_graph().expect("training graph").params_bytes,
        )
    };
    let mut opts = remat_planner::ImportOptions::default();
    opts.frozen.push("backbone*".into());
    let (params, bytes) = kinds(&opts);
    assert_eq!(params, ["head.w"]);
    assert_eq!(bytes, 8 * 3 * 4);
    // An exact `--param` keeps its weight trained under a pattern of `--freeze`.
    opts.params.push("backbone.l1.scale".into());
    let (params, bytes) = kinds(&opts);
    assert_eq!(params, ["backbone.l1.scale", "head.w"]);
    assert_eq!(bytes, (8 + 8 * 3) * 4);
    // `?` and `[...]` too; `*` crosses `/` and `.`; `--input` takes patterns as well.
    for which in ["freeze", "input"] {
        let mut opts = remat_planner::ImportOptions::default();
        let list = if which == "freeze" {
            &mut opts.frozen
        } else {
            &mut opts.inputs
        };
        list.push("backbone?l[01].w".into());
        let (params, _) = kinds(&opts);
        assert_eq!(params, ["backbone.l1.scale", "head.w"], "{which}");
    }
    for (pattern, wanted) in [
        (
            "encoder.*",
            "matches no floating-point graph input or initializer",
        ),
        ("backbone.[", "not a glob pattern"),
    ] {
        let mut opts = remat_planner::ImportOptions::default();
        opts.frozen.push(pattern.into());
        let e = load(&g.bytes(), &opts).expect_err("refused").to_string();
        assert!(e.contains(wanted) && e.contains(pattern), "{e}");
        assert!(e.contains("--freeze"), "{e}");
    }
    let mut opts = remat_planner::ImportOptions::default();
    opts.frozen.push("head.w".into());
    opts.params.push("head.w".into());
    let e = load(&g.bytes(), &opts).expect_err("twice").to_string();
    assert!(
        e.contains("\"head.w\" is named by both --param and --freeze"),
        "{e}"
    );
    let mut opts = remat_planner::ImportOptions::default();
    opts.frozen.push("backbone.*".into());
    opts.params.push("backbone.l1.*".into());
    let e = load(&g.bytes(), &opts).expect_err("twice").to_string();
    assert!(e.contains("is named by both --param and --freeze"), "{e}");
}

/// A model exported with its weights as graph inputs (`export_params=False`, the fixtures'
/// form): `--freeze` makes one a frozen weight, held as a buffer all step long (its bytes stay
/// in the fixed bytes) with no gradient; `--input` would make it data, which the step may
/// drop after its last use: a frozen 7B base under LoRA would go missing from the peak.
#[test]
fn a_weight_that_is_a_graph_input_freezes_as_a_buffer() {
    let g = G::new(17)
        .input("x", F32, &[D::V(2), D::V(4)])
        .input("frozen", F32, &[D::V(4), D::V(8)])
        .input("w", F32, &[D::V(8), D::V(3)])
        .node("MatMul", "mm1", &["x", "frozen"], &["h"], vec![])
        .node("Relu", "act", &["h"], &["a"], vec![])
        .node("MatMul", "mm2", &["a", "w"], &["y"], vec![])
        .output("y");
    let trained = load(&g.bytes(), &remat_planner::ImportOptions::default())
        .expect("imports")
        .training_graph()
        .expect("training graph");
    let mut opts = remat_planner::ImportOptions::default();
    opts.frozen.push("frozen".into());
    let m = load(&g.bytes(), &opts).expect("imports with --freeze frozen");
    let kind = |name: &str| m.values.iter().find(|v| v.name == name).map(|v| v.kind);
    assert_eq!(kind("frozen"), Some(ValueKind::Buffer));
    assert_eq!(kind("w"), Some(ValueKind::Param));
    let frozen = m.training_graph().expect("training graph");
    assert_eq!(frozen.params_bytes, 8 * 3 * 4);
    assert_eq!(frozen.buffers_bytes, 4 * 8 * 4, "the frozen weight is held");
    assert_eq!(
        trained.to_problem().fixed_bytes - frozen.to_problem().fixed_bytes,
        4 * 8 * 4,
        "only its gradient's bytes go"
    );
    // An integer graph input is not a weight.
    let ids = G::new(17)
        .input("ids", I64, &[D::V(2)])
        .input("table", F32, &[D::V(10), D::V(4)])
        .node("Gather", "emb", &["table", "ids"], &["y"], vec![])
        .output("y");
    let mut opts = remat_planner::ImportOptions::default();
    opts.frozen.push("ids".into());
    let e = load(&ids.bytes(), &opts).expect_err("int").to_string();
    assert!(e.contains("--freeze \"ids\": the value is i64"), "{e}");
    // A pattern passes over what is not a weight; one that matches nothing else is refused.
    let mut opts = remat_planner::ImportOptions::default();
    opts.frozen.push("*".into());
    let m = load(&ids.bytes(), &opts).expect("imports with --freeze '*'");
    let kind = |name: &str| m.values.iter().find(|v| v.name == name).map(|v| v.kind);
    assert_eq!(kind("ids"), Some(ValueKind::Data));
    assert_eq!(kind("table"), Some(ValueKind::Buffer));
    let mut opts = remat_planner::ImportOptions::default();
    opts.frozen.push("id?".into());
    let e = load(&ids.bytes(), &opts).expect_err("only ids").to_string();
    assert!(e.contains("matches no floating-point graph input"), "{e}");
}

/// A frozen weight a backward reads (the gradient of the activation a MatMul multiplies it
/// with) is held all step: autograd's saving it costs nothing, as saving a trained weight
/// does not, and the fixtures' PyTorch figure skips every `model.parameters()` storage. It was
/// counted in `saved_activation_bytes`, so freezing a layer raised the figure the gate guards
/// (+7.67% on a GPT-2 with frozen attention weights) though the peak did not move.
#[test]
fn a_frozen_weight_a_backward_reads_is_not_a_saved_activation() {
    for graph_input in [false, true] {
        let mut g = G::new(17).input("x", F32, &[D::V(2), D::V(4)]);
        g = if graph_input {
            g.input("w1", F32, &[D::V(4), D::V(8)])
                .input("frozen", F32, &[D::V(3), D::V(8)])
        } else {
            g.weight("w1", &[4, 8]).weight("frozen", &[3, 8])
        };
        // The frozen weight is read through a view (the dynamo exporter's transposed Linear).
        let g = g
            .node("MatMul", "mm1", &["x", "w1"], &["h"], vec![])
            .node("Relu", "act", &["h"], &["a"], vec![])
            .node("Transpose", "t", &["frozen"], &["ft"], vec![])
            .node("MatMul", "mm2", &["a", "ft"], &["y"], vec![])
            .output("y");
        let mut opts = remat_planner::ImportOptions::default();
        opts.frozen.push("frozen".into());
        let t = load(&g.bytes(), &opts)
            .expect("imports with --freeze frozen")
            .training_graph()
            .expect("training graph");
        let names: Vec<&str> = t.saved.iter().map(|s| s.name.as_str()).collect();
        assert!(
            !names.iter().any(|n| n.contains("frozen") || *n == "ft"),
            "graph input {graph_input}: {names:?}"
        );
        // What is saved: x (mm1, for w1's gradient) and the ReLU's output (its own backward).
        assert_eq!(
            t.saved_activation_bytes,
            (2 * 4 + 2 * 8) * 4,
            "graph input {graph_input}: {names:?}"
        );
    }
}
