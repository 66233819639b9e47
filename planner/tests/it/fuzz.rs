//! Import never panics: mutated fixture bytes (truncated, flipped, spliced) give `Ok` or a
//! `PlannerError`. `catch_unwind` only detects a panic to fail the test.

use proptest::prelude::*;
use remat_planner::onnx::{check_model_bytes, parse_model};
use remat_planner::{inspect, ImportOptions};

fn seeds() -> Vec<(Vec<u8>, ImportOptions)> {
    let mut out = vec![(
        crate::build::mlp().bytes(),
        crate::build::dims(&[("batch", 2)]),
    )];
    let dir = crate::manifest_dir().join("../fixtures");
    for (file, dims) in [
        ("models/resnet18.legacy.onnx", vec![("batch", 1)]),
        ("models/gpt2.dynamo.onnx", vec![("batch", 1), ("seq", 4)]),
        ("models/light/light_squeezenet.onnx", vec![]),
        // Paddle's dims: x is [-1, 3, ?, ?], bound per axis.
        (
            "models/thirdparty/ppocr_cls.opset11.onnx",
            vec![("x:0", 1), ("x:2", 48), ("x:3", 192)],
        ),
    ] {
        let b = std::fs::read(dir.join(file))
            .unwrap_or_else(|e| panic!("fixture {file} (a seed of this test): {e}"));
        out.push((b, crate::build::dims(&dims)));
    }
    out
}

#[derive(Debug, Clone)]
enum Mutation {
    Truncate(usize),
    Flip(usize, u8),
    Splice(usize, usize, usize),
    Overwrite(usize, Vec<u8>),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        any::<usize>().prop_map(Mutation::Truncate),
        (any::<usize>(), 1u8..=255).prop_map(|(i, x)| Mutation::Flip(i, x)),
        (any::<usize>(), any::<usize>(), 1usize..512)
            .prop_map(|(a, b, n)| Mutation::Splice(a, b, n)),
        (
            any::<usize>(),
            proptest::collection::vec(any::<u8>(), 1..16)
        )
            .prop_map(|(i, v)| Mutation::Overwrite(i, v)),
    ]
}

fn apply(bytes: &mut Vec<u8>, m: &Mutation) {
    let len = bytes.len().max(1);
    match m {
        Mutation::Truncate(n) => bytes.truncate(n % len),
        Mutation::Flip(i, x) => {
            if let Some(b) = bytes.get_mut(i % len) {
                *b ^= x;
            }
        }
        Mutation::Splice(from, to, n) => {
            let from = from % len;
            let chunk: Vec<u8> = bytes.iter().skip(from).take(*n).copied().collect();
            let to = (to % len).min(bytes.len());
            bytes.splice(to..to, chunk);
        }
        Mutation::Overwrite(i, v) => {
            for (k, x) in v.iter().enumerate() {
                if let Some(b) = bytes.get_mut((i + k) % len) {
                    *b = *x;
                }
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]
    #[test]
    fn mutated_models_never_panic(seed in 0usize..5, muts in proptest::collection::vec(mutation(), 1..4)) {
        let seeds = seeds();
        let (bytes, opts) = &seeds[seed % seeds.len()];
        let mut bytes = bytes.clone();
        for m in &muts {
            apply(&mut bytes, m);
        }
        let result = std::panic::catch_unwind(|| inspect(&bytes, opts).map(|r| r.nodes));
        prop_assert!(result.is_ok(), "import panicked after {:?}", muts);
        // The service's early check refuses only what the parser refuses.
        let checked = std::panic::catch_unwind(|| check_model_bytes(&bytes).is_ok());
        prop_assert!(checked.is_ok(), "check_model_bytes panicked after {:?}", muts);
        if matches!(checked, Ok(false)) {
            prop_assert!(parse_model(&bytes).is_err(), "checked as malformed, parsed after {:?}", muts);
        }
    }
}

/// The early check passes the fixtures and refuses what is no model, a truncated model, a
/// model without a graph and a malformed node, with the parser's messages.
#[test]
fn the_early_check_refuses_what_is_no_model_without_building_it() {
    for (bytes, _) in seeds() {
        check_model_bytes(&bytes).expect("a fixture passes");
    }
    let mlp = crate::build::mlp().bytes();
    for (what, bytes, says) in [
        (
            "garbage",
            b"\x07garbage".to_vec(),
            "not a valid ONNX protobuf",
        ),
        (
            "truncated",
            mlp[..mlp.len() - 3].to_vec(),
            "not a valid ONNX protobuf",
        ),
        ("no graph", vec![0x08, 0x08], "has no graph"),
        // ModelProto.graph → GraphProto.node whose op_type (field 4) runs past the node's end.
        (
            "bad node",
            vec![0x3a, 0x04, 0x0a, 0x02, 0x22, 0x05],
            "graph field 1",
        ),
    ] {
        let e = check_model_bytes(&bytes).expect_err(what).to_string();
        assert!(e.contains(says), "{what}: {e}");
        assert!(
            parse_model(&bytes).is_err(),
            "{what}: the parser accepts it"
        );
    }
}
