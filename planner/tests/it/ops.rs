//! One-node cases over the op registry: output shape per op, data driven.

use crate::build::*;
use onnx_protobuf::AttributeProto;
use remat_planner::{load, ImportOptions};

struct Case {
    op: &'static str,
    opset: i64,
    /// Float data inputs with their shapes.
    data: Vec<(&'static str, Vec<i64>)>,
    /// Initializers (weights, constant operands).
    consts: Vec<onnx_protobuf::TensorProto>,
    inputs: Vec<&'static str>,
    attrs: Vec<AttributeProto>,
    outputs: usize,
    expect: Vec<u64>,
    /// The output is not floating point (or is folded): no loss, no training graph.
    no_loss: bool,
}

fn case(
    op: &'static str,
    data: &[(&'static str, &[i64])],
    inputs: &[&'static str],
    expect: &[u64],
) -> Case {
    Case {
        op,
        opset: 17,
        data: data.iter().map(|(n, s)| (*n, s.to_vec())).collect(),
        consts: vec![],
        inputs: inputs.to_vec(),
        attrs: vec![],
        outputs: 1,
        expect: expect.to_vec(),
        no_loss: false,
    }
}

impl Case {
    fn attrs(mut self, a: Vec<AttributeProto>) -> Case {
        self.attrs = a;
        self
    }
    fn consts(mut self, c: Vec<onnx_protobuf::TensorProto>) -> Case {
        self.consts = c;
        self
    }
    fn opset(mut self, o: i64) -> Case {
        self.opset = o;
        self
    }
    fn no_loss(mut self) -> Case {
        self.no_loss = true;
        self
    }
    fn outputs(mut self, n: usize) -> Case {
        self.outputs = n;
        self
    }
}

fn cases() -> Vec<Case> {
    let x = ("x", &[2i64, 3, 4][..]);
    let img = ("x", &[2i64, 4, 6, 6][..]);
    vec![
        case("LeakyRelu", &[x], &["x"], &[2, 3, 4]).attrs(vec![a_float("alpha", 0.1)]),
        case("Clip", &[x], &["x"], &[2, 3, 4])
            .opset(9)
            .attrs(vec![a_float("min", 0.0), a_float("max", 6.0)]),
        case("HardSigmoid", &[x], &["x"], &[2, 3, 4]),
        case("HardSwish", &[x], &["x"], &[2, 3, 4]),
        case("Gelu", &[x], &["x"], &[2, 3, 4])
            .opset(20)
            .attrs(vec![a_str("approximate", "tanh")]),
        case("Max", &[x, ("y", &[4])], &["x", "y", "x"], &[2, 3, 4]),
        case("Sum", &[x, ("y", &[3, 1])], &["x", "y"], &[2, 3, 4]),
        case("PRelu", &[x], &["x", "slope"], &[2, 3, 4]).consts(vec![tensor_f32(
            "slope",
            &[4],
            &[0.1; 4],
        )]),
        case("LogSoftmax", &[x], &["x"], &[2, 3, 4]).attrs(vec![a_int("axis", 1)]),
        case("Pow", &[x], &["x", "e"], &[2, 3, 4]).consts(vec![tensor_f32("e", &[], &[2.0])]),
        case("Where", &[x], &["c", "x", "x"], &[2, 3, 4]).consts(vec![tensor_bool("c", true)]),
        case("Flatten", &[x], &["x"], &[2, 12]),
        case("Transpose", &[x], &["x"], &[4, 3, 2]),
        case("Transpose", &[x], &["x"], &[3, 2, 4]).attrs(vec![a_ints("perm", &[1, 0, 2])]),
        case("Gather", &[x], &["x", "i"], &[2, 5, 4])
            .consts(vec![tensor_i64("i", &[5], &[0, 1, 2, -1, 0])])
            .attrs(vec![a_int("axis", 1)]),
        case("GatherElements", &[x], &["x", "i"], &[2, 1, 4])
            .consts(vec![tensor_i64("i", &[2, 1, 4], &[0; 8])])
            .attrs(vec![a_int("axis", 1)]),
        case("Tile", &[x], &["x", "r"], &[4, 3, 12]).consts(vec![tensor_i64(
            "r",
            &[3],
            &[2, 1, 3],
        )]),
        case("Trilu", &[x], &["x"], &[2, 3, 4]),
        case("CumSum", &[x], &["x", "a"], &[2, 3, 4]).consts(vec![tensor_i64("a", &[], &[1])]),
        case("TopK", &[x], &["x", "k"], &[2, 3, 2])
            .consts(vec![tensor_i64("k", &[1], &[2])])
            .outputs(2),
        case(
            "ScatterND",
            &[x, ("u", &[2, 4])],
            &["x", "i", "u"],
            &[2, 3, 4],
        )
        .consts(vec![tensor_i64("i", &[2, 2], &[0, 0, 1, 2])]),
        case("OneHot", &[], &["i", "d", "v"], &[5, 10])
            .consts(vec![
                tensor_i64("i", &[5], &[1, 2, 3, 4, 5]),
                tensor_i64("d", &[], &[10]),
                tensor_f32("v", &[2], &[0.0, 1.0]),
            ])
            .no_loss(),
        case("ReduceMax", &[x], &["x", "a"], &[2, 1, 4])
            .opset(18)
            .consts(vec![tensor_i64("a", &[1], &[1])]),
        case("ReduceSum", &[x], &["x", "a"], &[2, 4])
            .opset(13)
            .consts(vec![tensor_i64("a", &[1], &[1])])
            .attrs(vec![a_int("keepdims", 0)]),
        case("ReduceL2", &[x], &["x"], &[1, 1, 1]),
        case("ReduceProd", &[x], &["x"], &[2, 3, 1]).attrs(vec![a_ints("axes", &[2])]),
        case("ArgMax", &[x], &["x"], &[2, 4])
            .attrs(vec![a_int("axis", 1), a_int("keepdims", 0)])
            .no_loss(),
        case("Einsum", &[x, ("w", &[4, 5])], &["x", "w"], &[2, 3, 5])
            .attrs(vec![a_str("equation", "bij,jk->bik")]),
        case(
            "Einsum",
            &[("q", &[2, 3, 4]), ("k", &[2, 5, 4])],
            &["q", "k"],
            &[2, 3, 5],
        )
        .attrs(vec![a_str("equation", "bqd,bkd->bqk")]),
        case("Conv", &[img], &["x", "w"], &[2, 8, 6, 6])
            .consts(vec![tensor_f32("w", &[8, 2, 3, 3], &[0.0; 144])])
            .attrs(vec![a_int("group", 2), a_str("auto_pad", "SAME_UPPER")]),
        case(
            "InstanceNormalization",
            &[img],
            &["x", "s", "b"],
            &[2, 4, 6, 6],
        )
        .consts(vec![
            tensor_f32("s", &[4], &[1.0; 4]),
            tensor_f32("b", &[4], &[0.0; 4]),
        ]),
        case("LayerNormalization", &[x], &["x", "s"], &[2, 3, 4]).consts(vec![tensor_f32(
            "s",
            &[4],
            &[1.0; 4],
        )]),
        case(
            "GroupNormalization",
            &[img],
            &["x", "s", "b"],
            &[2, 4, 6, 6],
        )
        .opset(21)
        .consts(vec![
            tensor_f32("s", &[4], &[1.0; 4]),
            tensor_f32("b", &[4], &[0.0; 4]),
        ])
        .attrs(vec![a_int("num_groups", 2)]),
        case("LRN", &[img], &["x"], &[2, 4, 6, 6]).attrs(vec![a_int("size", 3)]),
        case("AveragePool", &[img], &["x"], &[2, 4, 3, 3]).attrs(vec![
            a_ints("kernel_shape", &[2, 2]),
            a_ints("strides", &[2, 2]),
        ]),
        case("GlobalMaxPool", &[img], &["x"], &[2, 4, 1, 1]),
        case("DepthToSpace", &[img], &["x"], &[2, 1, 12, 12]).attrs(vec![a_int("blocksize", 2)]),
        case("SpaceToDepth", &[img], &["x"], &[2, 16, 3, 3]).attrs(vec![a_int("blocksize", 2)]),
        case("Resize", &[img], &["x", "", "", "sz"], &[2, 4, 9, 12]).consts(vec![tensor_i64(
            "sz",
            &[4],
            &[2, 4, 9, 12],
        )]),
        case("Resize", &[img], &["x", "", "sc"], &[2, 4, 12, 12]).consts(vec![tensor_f32(
            "sc",
            &[4],
            &[1.0, 1.0, 2.0, 2.0],
        )]),
        case("Pad", &[img], &["x"], &[2, 4, 8, 9])
            .opset(9)
            .attrs(vec![a_ints("pads", &[0, 0, 1, 1, 0, 0, 1, 2])]),
        case("Dropout", &[x], &["x"], &[2, 3, 4])
            .opset(9)
            .attrs(vec![a_float("ratio", 0.2)]),
        case("Celu", &[x], &["x"], &[2, 3, 4])
            .opset(12)
            .attrs(vec![a_floats("unused", &[1.0])]),
        case(
            "LSTM",
            &[("x", &[5, 2, 3])],
            &["x", "w", "r"],
            &[5, 2, 2, 4],
        )
        .consts(vec![
            tensor_f32("w", &[2, 16, 3], &[0.0; 96]),
            tensor_f32("r", &[2, 16, 4], &[0.0; 128]),
        ])
        .attrs(vec![
            a_int("hidden_size", 4),
            a_str("direction", "bidirectional"),
        ])
        .outputs(3),
        case("GRU", &[("x", &[5, 2, 3])], &["x", "w", "r"], &[5, 1, 2, 4])
            .consts(vec![
                tensor_f32("w", &[1, 12, 3], &[0.0; 36]),
                tensor_f32("r", &[1, 12, 4], &[0.0; 48]),
            ])
            .attrs(vec![a_int("hidden_size", 4)]),
        case("Asinh", &[x], &["x"], &[2, 3, 4]),
        case("RandomNormalLike", &[x], &["x"], &[2, 3, 4]),
        case(
            "GridSample",
            &[img, ("g", &[2, 5, 7, 2])],
            &["x", "g"],
            &[2, 4, 5, 7],
        )
        .opset(20),
        case("Det", &[("m", &[2, 3, 3])], &["m"], &[2]),
        case("DequantizeLinear", &[], &["q", "s"], &[4])
            .consts(vec![
                tensor_i64("q", &[4], &[1, 2, 3, 4]),
                tensor_f32("s", &[], &[0.5]),
            ])
            .no_loss(),
        case("Upsample", &[img], &["x", "sc"], &[2, 4, 12, 18])
            .opset(9)
            .consts(vec![tensor_f32("sc", &[4], &[1.0, 1.0, 2.0, 3.0])]),
        // Audio front ends: 1 s at 16 kHz, 400-sample frames every 160.
        case(
            "STFT",
            &[("s", &[2, 16000, 1])],
            &["s", "st", "w"],
            &[2, 98, 201, 2],
        )
        .consts(vec![
            tensor_i64("st", &[], &[160]),
            tensor_f32("w", &[400], &[1.0; 400]),
        ]),
        case(
            "STFT",
            &[("s", &[2, 1000, 1])],
            &["s", "st", "", "fl"],
            &[2, 4, 256, 2],
        )
        .consts(vec![
            tensor_i64("st", &[], &[200]),
            tensor_i64("fl", &[], &[256]),
        ])
        .attrs(vec![a_int("onesided", 0)]),
        case(
            "STFT",
            &[("s", &[2, 16000])],
            &["s", "st", "w"],
            &[2, 98, 201, 2],
        )
        .consts(vec![
            tensor_i64("st", &[], &[160]),
            tensor_f32("w", &[400], &[1.0; 400]),
        ]),
        case("DFT", &[("s", &[2, 64, 1])], &["s"], &[2, 33, 2]).attrs(vec![a_int("onesided", 1)]),
        case(
            "DFT",
            &[("s", &[2, 5, 64, 2])],
            &["s", "n", "a"],
            &[2, 5, 128, 2],
        )
        .opset(20)
        .consts(vec![
            tensor_i64("n", &[], &[128]),
            tensor_i64("a", &[], &[-2]),
        ]),
        case("HannWindow", &[], &["n"], &[400])
            .consts(vec![tensor_i64("n", &[], &[400])])
            .no_loss(),
        case("BlackmanWindow", &[], &["n"], &[64])
            .consts(vec![tensor_i64("n", &[], &[64])])
            .no_loss(),
        case(
            "MelWeightMatrix",
            &[],
            &["m", "d", "r", "lo", "hi"],
            &[201, 80],
        )
        .consts(vec![
            tensor_i64("m", &[], &[80]),
            tensor_i64("d", &[], &[400]),
            tensor_i64("r", &[], &[16000]),
            tensor_f32("lo", &[], &[0.0]),
            tensor_f32("hi", &[], &[8000.0]),
        ])
        .no_loss(),
        case("LpPool", &[img], &["x"], &[2, 4, 3, 3]).attrs(vec![
            a_ints("kernel_shape", &[2, 2]),
            a_ints("strides", &[2, 2]),
        ]),
        case("GlobalLpPool", &[img], &["x"], &[2, 4, 1, 1]),
        case(
            "MaxUnpool",
            &[("x", &[2, 4, 3, 3])],
            &["x", "i"],
            &[2, 4, 6, 6],
        )
        .consts(vec![tensor_i64("i", &[2, 4, 3, 3], &[0; 72])])
        .attrs(vec![
            a_ints("kernel_shape", &[2, 2]),
            a_ints("strides", &[2, 2]),
        ]),
        case(
            "MaxUnpool",
            &[("x", &[2, 4, 3, 3])],
            &["x", "i", "o"],
            &[2, 4, 7, 7],
        )
        .consts(vec![
            tensor_i64("i", &[2, 4, 3, 3], &[0; 72]),
            tensor_i64("o", &[4], &[2, 4, 7, 7]),
        ])
        .attrs(vec![
            a_ints("kernel_shape", &[2, 2]),
            a_ints("strides", &[2, 2]),
        ]),
        case("RoiAlign", &[img], &["x", "rois", "bi"], &[3, 4, 2, 5])
            .consts(vec![
                tensor_f32("rois", &[3, 4], &[0.0; 12]),
                tensor_i64("bi", &[3], &[0, 1, 1]),
            ])
            .attrs(vec![a_int("output_height", 2), a_int("output_width", 5)]),
        case(
            "Col2Im",
            &[("x", &[2, 12, 9])],
            &["x", "im", "bl"],
            &[2, 3, 4, 4],
        )
        .opset(18)
        .consts(vec![
            tensor_i64("im", &[2], &[4, 4]),
            tensor_i64("bl", &[2], &[2, 2]),
        ]),
        case("CenterCropPad", &[img], &["x", "sh"], &[2, 4, 4, 8])
            .opset(18)
            .consts(vec![tensor_i64("sh", &[2], &[4, 8])])
            .attrs(vec![a_ints("axes", &[2, 3])]),
        case(
            "AffineGrid",
            &[("t", &[2, 2, 3])],
            &["t", "sz"],
            &[2, 5, 7, 2],
        )
        .opset(20)
        .consts(vec![tensor_i64("sz", &[4], &[2, 3, 5, 7])]),
        case(
            "SoftmaxCrossEntropyLoss",
            &[("s", &[4, 10])],
            &["s", "l"],
            &[],
        )
        .opset(13)
        .consts(vec![tensor_i64("l", &[4], &[1, 2, 3, 9])]),
        case(
            "SoftmaxCrossEntropyLoss",
            &[("s", &[4, 10, 3])],
            &["s", "l"],
            &[4, 3],
        )
        .opset(13)
        .consts(vec![tensor_i64("l", &[4, 3], &[0; 12])])
        .attrs(vec![a_str("reduction", "none")])
        .outputs(2),
        case(
            "NegativeLogLikelihoodLoss",
            &[("s", &[4, 10])],
            &["s", "l"],
            &[],
        )
        .opset(13)
        .consts(vec![tensor_i64("l", &[4], &[1, 2, 3, 9])])
        .attrs(vec![a_str("reduction", "sum")]),
        case("Scatter", &[x], &["x", "i", "x"], &[2, 3, 4])
            .opset(10)
            .consts(vec![tensor_i64("i", &[2, 3, 4], &[0; 24])]),
        // Opset 23 transformer ops: 4-D and 3-D attention (grouped query), RMS norm, rotary.
        case(
            "Attention",
            &[
                ("q", &[2, 8, 5, 16]),
                ("k", &[2, 2, 7, 16]),
                ("v", &[2, 2, 7, 32]),
            ],
            &["q", "k", "v"],
            &[2, 8, 5, 32],
        )
        .opset(23),
        case(
            "Attention",
            &[("q", &[2, 5, 64]), ("k", &[2, 7, 32]), ("v", &[2, 7, 32])],
            &["q", "k", "v"],
            &[2, 5, 64],
        )
        .opset(23)
        .attrs(vec![
            a_int("q_num_heads", 4),
            a_int("kv_num_heads", 2),
            a_int("is_causal", 1),
        ]),
        case(
            "Attention",
            &[
                ("q", &[2, 8, 5, 16]),
                ("k", &[2, 8, 7, 16]),
                ("v", &[2, 8, 7, 16]),
            ],
            &["q", "k", "v"],
            &[2, 8, 5, 16],
        )
        .opset(25)
        .attrs(vec![a_int("left_window_size", 2)]),
        case("Swish", &[x], &["x"], &[2, 3, 4])
            .opset(24)
            .attrs(vec![a_float("alpha", 1.5)]),
        case("RMSNormalization", &[x], &["x", "s"], &[2, 3, 4])
            .opset(23)
            .consts(vec![tensor_f32("s", &[4], &[1.0; 4])]),
        case(
            "RotaryEmbedding",
            &[("x", &[2, 4, 5, 8]), ("c", &[2, 5, 4]), ("sn", &[2, 5, 4])],
            &["x", "c", "sn"],
            &[2, 4, 5, 8],
        )
        .opset(23),
    ]
}

#[test]
fn every_case_gets_its_shape_and_a_training_graph() {
    let mut failures = vec![];
    for (k, c) in cases().into_iter().enumerate() {
        let mut g = G::new(c.opset);
        for (n, s) in &c.data {
            let dims: Vec<D> = s.iter().map(|&d| D::V(d)).collect();
            g = g.input(n, F32, &dims);
        }
        for t in c.consts {
            g = g.init(t);
        }
        let outs: Vec<String> = (0..c.outputs).map(|i| format!("out{i}")).collect();
        let out_refs: Vec<&str> = outs.iter().map(|s| s.as_str()).collect();
        g = g
            .node(c.op, "node", &c.inputs, &out_refs, c.attrs)
            .output("out0");
        let label = format!("case {k} ({} opset {})", c.op, c.opset);
        let opts = ImportOptions {
            inputs: c.data.iter().map(|(n, _)| n.to_string()).collect(),
            ..Default::default()
        };
        match load(&g.bytes(), &opts) {
            Ok(m) => {
                let v = m.outputs[0];
                let shape = m.values[v].fact.as_ref().map(|f| f.shape.clone());
                if shape.as_deref() != Some(&c.expect[..]) {
                    failures.push(format!("{label}: shape {shape:?}, expected {:?}", c.expect));
                }
                match (m.training_graph(), c.no_loss) {
                    (Ok(_), false) | (Err(remat_planner::PlannerError::NoLoss), true) => {}
                    (Ok(_), true) => failures.push(format!("{label}: expected no loss")),
                    (Err(e), _) => failures.push(format!("{label}: training graph: {e}")),
                }
            }
            Err(e) => failures.push(format!("{label}: {e}")),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Every op issue #2 lists has a registry entry (shape rule, cost, gradient rule).
#[test]
fn the_issue_op_list_is_covered() {
    const REQUIRED: &[&str] = &[
        "Conv",
        "ConvTranspose",
        "BatchNormalization",
        "InstanceNormalization",
        "LayerNormalization",
        "Relu",
        "LeakyRelu",
        "Sigmoid",
        "Tanh",
        "Erf",
        "Gelu",
        "HardSigmoid",
        "HardSwish",
        "Clip",
        "Max",
        "Min",
        "Sum",
        "Softmax",
        "LogSoftmax",
        "MaxPool",
        "AveragePool",
        "GlobalAveragePool",
        "GlobalMaxPool",
        "LRN",
        "Gemm",
        "MatMul",
        "Add",
        "Sub",
        "Mul",
        "Div",
        "Pow",
        "Sqrt",
        "Exp",
        "Log",
        "Neg",
        "Reciprocal",
        "Reshape",
        "Flatten",
        "Transpose",
        "Squeeze",
        "Unsqueeze",
        "Concat",
        "Split",
        "Slice",
        "Gather",
        "GatherElements",
        "Expand",
        "Where",
        "Cast",
        "Identity",
        "Dropout",
        "ReduceMean",
        "ReduceSum",
        "ReduceMax",
        "Resize",
        "Pad",
        "Shape",
        "Size",
        "ConstantOfShape",
        "Constant",
        "Range",
        "Equal",
        "Less",
        "LessOrEqual",
        "GreaterOrEqual",
        "Not",
        "And",
        "ArgMax",
        "LSTM",
        "Greater",
        "Or",
        "Abs",
        "Softplus",
        "Tile",
        "Einsum",
        "ReduceL2",
        "ReduceProd",
        "ReduceMin",
        "Trilu",
        "CumSum",
        "TopK",
        "ScatterND",
        "Upsample",
        "GroupNormalization",
        "Sin",
        "Cos",
        "Floor",
        "Ceil",
        "Round",
        "Sign",
        "IsNaN",
        "Mod",
        "Selu",
        "Elu",
        "PRelu",
        "DepthToSpace",
        "SpaceToDepth",
        "OneHot",
        "NonZero",
    ];
    let reg = remat_planner::ops::registry();
    let missing: Vec<&&str> = REQUIRED
        .iter()
        .filter(|op| !reg.contains_key(**op))
        .collect();
    assert!(missing.is_empty(), "missing ops: {missing:?}");
    eprintln!("{} ops registered, {} required", reg.len(), REQUIRED.len());
    assert!(reg.len() > REQUIRED.len());
}
