//! ONNX's backend node suite as a test: `fixtures/onnx_node/` holds the one-node cases of the
//! pinned `onnx` package (written by `fixtures/onnx_node.py`; nothing is downloaded or
//! generated at test time). For every case whose op remat's planner knows:
//!
//! - (a) **shapes**: the op's shape rule, on the case's input shapes (an input becomes a
//!   constant only where the rule needs its value, as import folds it in a real model), infers
//!   each output's shape and element type as the reference has them;
//! - (b) **values**: the executor's forward on the case's inputs, on every device compiled in,
//!   equals the reference outputs within the case's own tolerances (`rtol`, `atol`);
//! - (c) **gradients**: where the op is differentiable, the backward (seeing only what the
//!   gradient rule saves) matches central finite differences in f64 at the case's inputs.
//!
//! A case that does not pass all three is listed in `fixtures/onnx_node_known.json` with the
//! check it fails and why; the test fails on an unlisted failure, on a listed case that now
//! passes (so the list shrinks as remat improves), and when `docs/onnx-conformance.md`, the
//! table of results it renders, is not what this run finds (`REMAT_WRITE_CONFORMANCE=1`
//! rewrites it).

use crate::kernels::registry as kernels;
use crate::testing::{check_on, devices, run_values, Arg, Case, In};
use candle_core::Device;
use onnx_protobuf::{NodeProto, TensorProto};
use protobuf::Message;
use remat_planner::onnx::{decode_tensor_values, parse_model, Attrs};
use remat_planner::ops::{registry as rules, Ctx};
use remat_planner::tensor::{DType, Data, Fact, Tensor as PTensor};
use remat_planner::PlannerError;
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    // At run time (a cached test binary may have been built in another checkout).
    std::env::var_os("CARGO_MANIFEST_DIR")
        .map_or_else(|| env!("CARGO_MANIFEST_DIR").into(), PathBuf::from)
        .join("../..")
}

/// One case's data: the node, its opset, the inputs by slot (`None` where omitted) and the
/// reference outputs with the node's output slot each is.
struct Loaded {
    node: NodeProto,
    opset: i64,
    inputs: Vec<Option<PTensor>>,
    outputs: Vec<(usize, PTensor)>,
}

fn read_tensor(path: &Path) -> Result<PTensor, String> {
    let file = path
        .file_name()
        .map_or_else(String::new, |f| f.to_string_lossy().into_owned());
    let bytes = std::fs::read(path).map_err(|e| format!("{file}: {e}"))?;
    let t = TensorProto::parse_from_bytes(&bytes).map_err(|e| format!("{file}: {e}"))?;
    decode_tensor_values(&t, &t.name)
        .map_err(|e| format!("{file}: {e}"))?
        .ok_or_else(|| {
            format!(
                "{file}: remat decodes no values of its type ({})",
                t.data_type
            )
        })
}

fn load(dir: &Path, opset: i64) -> Result<Loaded, String> {
    let model = parse_model(&std::fs::read(dir.join("model.onnx")).map_err(|e| e.to_string())?)
        .map_err(|e| e.to_string())?;
    let g = model.graph.as_ref().ok_or("no graph")?;
    let node = g.node.first().ok_or("no node")?.clone();
    // input_<i>.pb follows the graph's inputs; the node names them (or "" when omitted).
    let mut by_name = BTreeMap::new();
    for (i, v) in g.input.iter().enumerate() {
        by_name.insert(
            v.name.clone(),
            read_tensor(&dir.join(format!("input_{i}.pb")))?,
        );
    }
    let inputs = node
        .input
        .iter()
        .map(|n| {
            if n.is_empty() {
                Ok(None)
            } else {
                by_name
                    .get(n)
                    .cloned()
                    .map(Some)
                    .ok_or_else(|| format!("the node's input {n:?} is not a graph input"))
            }
        })
        .collect::<Result<_, String>>()?;
    let outputs = g
        .output
        .iter()
        .enumerate()
        .map(|(k, v)| {
            let slot = node
                .output
                .iter()
                .position(|o| *o == v.name)
                .ok_or_else(|| format!("graph output {:?} is not the node's", v.name))?;
            Ok((slot, read_tensor(&dir.join(format!("output_{k}.pb")))?))
        })
        .collect::<Result<_, String>>()?;
    Ok(Loaded {
        node,
        opset,
        inputs,
        outputs,
    })
}

/// The facts the shape rule sees: runtime tensors, except the slots in `consts`.
fn facts(l: &Loaded, consts: &BTreeSet<usize>) -> Vec<Option<Fact>> {
    l.inputs
        .iter()
        .enumerate()
        .map(|(i, t)| {
            t.as_ref().map(|t| {
                if consts.contains(&i) {
                    Fact::with_value(t.clone())
                } else {
                    Fact::new(t.dtype, t.shape.clone())
                }
            })
        })
        .collect()
}

/// The rule context of the case's node on `facts`.
fn ctx<'a>(l: &'a Loaded, op: &'a str, facts: &'a [Option<Fact>]) -> Ctx<'a> {
    Ctx {
        node: &l.node.name,
        op,
        opset: l.opset,
        attrs: Attrs {
            node: &l.node.name,
            op,
            list: &l.node.attribute,
        },
        inputs: facts,
        n_outputs: l.node.output.len(),
    }
}

/// The input slot a data-dependent error names ("input {i} is computed from data").
fn named_input(detail: &str) -> Option<usize> {
    detail
        .strip_prefix("input ")?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// Runs the shape rule, turning inputs into constants where the rule needs their values: the
/// output facts and the constant slots.
fn infer(l: &Loaded, op: &'static str) -> Result<(Vec<Fact>, BTreeSet<usize>), String> {
    let spec = rules().get(op).ok_or("no shape rule")?;
    let mut consts = BTreeSet::new();
    loop {
        let f = facts(l, &consts);
        let cx = ctx(l, op, &f);
        match (spec.infer)(&cx) {
            Ok(outs) => return Ok((outs, consts)),
            Err(PlannerError::DataDependent { detail, .. }) => {
                let next = named_input(&detail)
                    .filter(|i| !consts.contains(i))
                    .or_else(|| {
                        (0..l.inputs.len()).find(|i| l.inputs[*i].is_some() && !consts.contains(i))
                    });
                match next {
                    Some(i) => {
                        consts.insert(i);
                    }
                    None => {
                        return Err(format!(
                            "data-dependent with every input constant: {detail}"
                        ))
                    }
                }
            }
            Err(e) => return Err(e.to_string()),
        }
    }
}

fn values(t: &PTensor) -> Vec<f64> {
    match &t.data {
        Data::F(v) => v.clone(),
        Data::I(v) => v.iter().map(|&x| x as f64).collect(),
    }
}

/// `|got - want| <= atol + rtol |want|` everywhere (NaN matches NaN; an infinity itself): the
/// first element that is not, with both values.
fn first_mismatch(got: &[f64], want: &[f64], rtol: f64, atol: f64) -> Option<String> {
    if got.len() != want.len() {
        return Some(format!(
            "{} elements, the reference {}",
            got.len(),
            want.len()
        ));
    }
    got.iter().zip(want).enumerate().find_map(|(i, (g, w))| {
        let ok = (g - w).abs() <= atol + rtol * w.abs()
            || (g.is_nan() && w.is_nan())
            || (g.is_infinite() && g == w);
        (!ok).then(|| format!("element {i}: {g} where the reference has {w}"))
    })
}

/// The first check a case fails, as (letter, message); `None` when it passes everything that
/// applies to it. `grad` says whether (c) applied.
fn run_case(
    l: &Loaded,
    op: &'static str,
    rtol: f64,
    atol: f64,
    grad: &mut bool,
) -> Option<(char, String)> {
    // (a) shapes and types.
    let (outs, consts) = match infer(l, op) {
        Ok(x) => x,
        Err(e) => return Some(('a', format!("the shape rule fails: {e}"))),
    };
    for (k, r) in &l.outputs {
        let Some(f) = outs.get(*k) else {
            return Some((
                'a',
                format!(
                    "{} outputs inferred, the reference has output {k}",
                    outs.len()
                ),
            ));
        };
        if f.shape != r.shape || f.dtype != r.dtype {
            return Some((
                'a',
                format!(
                    "output {k} inferred {:?} {:?}, the reference is {:?} {:?}",
                    f.dtype, f.shape, r.dtype, r.shape
                ),
            ));
        }
    }
    if kernels().get(op).is_none() {
        return Some(('b', "no executor kernel (shapes only)".into()));
    }
    // (b) values, on every device compiled in.
    let n_out = l.node.output.len();
    let mut consts = consts;
    for dev in devices() {
        let v = loop {
            let args = match args(l, &consts, &dev) {
                Ok(a) => a,
                Err(e) => return Some(('b', format!("inputs{}: {e}", on(&dev)))),
            };
            match run_values(&dev, op, l.opset, &l.node.attribute, &args, n_out, 7, None) {
                Ok(v) => break v,
                // A kernel that needs a value a real model folds at import (a ratio, a
                // count): that input is a constant, as import would make it.
                Err(e) => match named_input_in(&e.0, "is computed from data") {
                    Some(i) if !consts.contains(&i) => {
                        consts.insert(i);
                    }
                    _ => return Some(('b', format!("the forward fails{}: {e}", on(&dev)))),
                },
            }
        };
        for (k, r) in &l.outputs {
            let mut got = v.outputs[*k].1.clone();
            if r.dtype == DType::I8 {
                // The executor holds int8 in u8, two's complement (its bytes are the model's).
                for x in &mut got {
                    if *x >= 128.0 {
                        *x -= 256.0;
                    }
                }
            }
            if let Some(m) = first_mismatch(&got, &values(r), rtol, atol) {
                return Some(('b', format!("output {k}{}, {m}", on(&dev))));
            }
        }
    }
    // (c) gradients against finite differences (in f64; `check_on` skips an op whose inputs
    // take no gradient).
    let rule = rules().get(op).expect("checked in (a)");
    let f = facts(l, &consts);
    let cx = ctx(l, op, &f);
    // A cast's output type is its attribute's, so the f64 finite-difference run does not apply
    // (its backward, a cast back, is checked by the kernel's own tests).
    *grad = !matches!(op, "Cast" | "CastLike")
        && l.inputs.iter().enumerate().any(|(i, t)| {
            t.as_ref().is_some_and(|t| {
                t.dtype.is_float() && !consts.contains(&i) && (rule.diff_in)(&cx, i)
            })
        });
    if !*grad {
        return None;
    }
    // Inputs a real model holds as parameters or constants (a norm's scale, an RNN's weights, a
    // loss's class weights, an axis): resident in the backward without being saved. Each
    // backward that asks for one makes it so, and the check runs again.
    let mut resident = BTreeSet::new();
    for dev in devices() {
        loop {
            let mut case = Case::new(op, l.opset, fd_inputs(l, &consts, &resident)).outputs(n_out);
            case.attrs = l.node.attribute.clone();
            match check_on(&case, &dev) {
                Ok(()) => break,
                Err(e) => {
                    let asked = ["which is not saved", "which is not resident", "is missing"]
                        .iter()
                        .find_map(|w| named_input_in(&e.0, w));
                    match asked {
                        Some(i) if i < l.inputs.len() && resident.insert(i) => {}
                        _ => return Some(('c', format!("the backward{}: {e}", on(&dev)))),
                    }
                }
            }
        }
    }
    None
}

/// " on <device>" in a message, except for the CPU, so that a listed failure reads the same
/// on every machine (the CPU is always checked).
fn on(dev: &Device) -> String {
    if dev.is_cpu() {
        String::new()
    } else {
        format!(" on {dev:?}")
    }
}

/// The input a kernel's message names next to `what` ("input 2 is missing", "needs the scale
/// (input 1), which is not resident").
fn named_input_in(message: &str, what: &str) -> Option<usize> {
    let at = message.find(what)?;
    let before = &message[..at];
    let i = before.rfind("input ")?;
    before[i + 6..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect::<String>()
        .parse()
        .ok()
}

/// The executor's inputs: each tensor in its own type, a constant where the shape rule needed
/// its value.
fn args(l: &Loaded, consts: &BTreeSet<usize>, dev: &Device) -> Result<Vec<Arg>, String> {
    l.inputs
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let Some(t) = t else { return Ok(Arg::none()) };
            let value = crate::value::from_planner(t, dev).map_err(|e| e.to_string())?;
            let fact = if consts.contains(&i) {
                Fact::with_value(t.clone())
            } else {
                Fact::new(t.dtype, t.shape.clone())
            };
            Ok(Arg {
                fact: Some(fact),
                grad: t.dtype.is_float() && !consts.contains(&i),
                value: Some(value),
            })
        })
        .collect()
}

/// The finite-difference check's inputs: float tensors as f64 activations at the case's
/// values, integers as run-time data, constants as constants.
fn fd_inputs(l: &Loaded, consts: &BTreeSet<usize>, resident: &BTreeSet<usize>) -> Vec<In> {
    l.inputs
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let Some(t) = t else { return In::None };
            let shape: Vec<usize> = t.shape.iter().map(|&d| d as usize).collect();
            if consts.contains(&i) || (resident.contains(&i) && !t.dtype.is_float()) {
                In::Const(t.dtype, shape, values(t))
            } else if resident.contains(&i) {
                In::ParamFloats(shape, values(t))
            } else if t.dtype.is_float() {
                In::Floats(shape, values(t))
            } else {
                In::Ints(
                    t.dtype,
                    shape,
                    values(t).iter().map(|&x| x as i64).collect(),
                )
            }
        })
        .collect()
}

/// What became of one case.
#[derive(Clone, Debug, PartialEq)]
enum Outcome {
    /// Not run: remat has no rule for the op.
    Unsupported,
    /// Passed (a) and (b), and (c) where the op is differentiable.
    Pass { grad: bool },
    /// Failed `check` with this message.
    Fail { check: char, message: String },
}

/// A listed case: the check it fails, why, and a part of the failure's message (so that the
/// reason stays the reason: a case failing otherwise is a new failure).
struct Known {
    check: char,
    why: String,
    with: String,
}

fn known() -> BTreeMap<String, Known> {
    let path = root().join("fixtures/onnx_node_known.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let doc: Value = serde_json::from_str(&text).expect("the known list is JSON");
    doc["cases"]
        .as_object()
        .expect("cases")
        .iter()
        .map(|(name, v)| {
            let check = v["check"]
                .as_str()
                .and_then(|s| s.chars().next())
                .expect("check");
            let why = v["why"].as_str().expect("why").to_string();
            let with = v["fails_with"].as_str().expect("fails_with").to_string();
            assert!(
                !why.trim().is_empty(),
                "{name}: a listed case needs a reason"
            );
            (name.clone(), Known { check, why, with })
        })
        .collect()
}

#[test]
fn onnx_backend_node_suite() {
    let dir = root().join("fixtures/onnx_node");
    let text = std::fs::read_to_string(dir.join("manifest.json"))
        .expect("fixtures/onnx_node/manifest.json exists (python fixtures/onnx_node.py writes it)");
    let manifest: Value = serde_json::from_str(&text).expect("the manifest is JSON");
    let cases = manifest["cases"].as_array().expect("cases");
    assert!(cases.len() >= 1000, "{} cases", cases.len());
    let known = known();
    let mut results: Vec<(String, String, Outcome)> = vec![];
    for c in cases {
        let name = c["name"].as_str().expect("name").to_string();
        let op_name = c["op"].as_str().expect("op");
        let op: &'static str = Box::leak(op_name.to_string().into_boxed_str());
        if rules().get(op).is_none() {
            results.push((name, op_name.into(), Outcome::Unsupported));
            continue;
        }
        let opset = c["opset"].as_i64().expect("opset");
        let (rtol, atol) = (
            c["rtol"].as_f64().expect("rtol"),
            c["atol"].as_f64().expect("atol"),
        );
        let mut grad = false;
        let outcome = match load(&dir.join(&name), opset) {
            Err(e) => Outcome::Fail {
                check: 'a',
                message: format!("the case's files do not load: {e}"),
            },
            Ok(l) => {
                let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    run_case(&l, op, rtol, atol, &mut grad)
                }));
                match r {
                    Ok(None) => Outcome::Pass { grad },
                    Ok(Some((check, message))) => Outcome::Fail { check, message },
                    Err(p) => Outcome::Fail {
                        check: 'b',
                        message: format!(
                            "panicked: {}",
                            p.downcast_ref::<String>()
                                .map(String::as_str)
                                .or_else(|| p.downcast_ref::<&str>().copied())
                                .unwrap_or("?")
                        ),
                    },
                }
            }
        };
        results.push((name, op_name.into(), outcome));
    }

    let mut problems = vec![];
    for (name, _, outcome) in &results {
        match (outcome, known.get(name)) {
            (Outcome::Fail { check, message }, None) => {
                problems.push(format!("{name}: ({check}) {message}"))
            }
            (Outcome::Fail { check, message }, Some(k))
                if k.check != *check || !message.contains(&k.with) =>
            {
                problems.push(format!(
                    "{name}: listed as failing ({}) with {:?} but fails ({check}): {message}",
                    k.check, k.with
                ))
            }
            (Outcome::Pass { .. }, Some(k)) => problems.push(format!(
                "{name}: listed as failing ({}) but passes: remove it from the list",
                k.check
            )),
            (Outcome::Unsupported, Some(_)) => {
                problems.push(format!("{name}: listed, but its op has no rule"))
            }
            _ => {}
        }
    }
    let names: BTreeSet<&str> = results.iter().map(|r| r.0.as_str()).collect();
    for name in known.keys() {
        if !names.contains(name.as_str()) {
            problems.push(format!("{name}: listed, but not a case of the suite"));
        }
    }

    let doc = render(&manifest, &results, &known);
    let path = root().join("docs/onnx-conformance.md");
    if std::env::var_os("REMAT_WRITE_CONFORMANCE").is_some() {
        std::fs::write(&path, &doc).expect("write docs/onnx-conformance.md");
    } else if std::fs::read_to_string(&path).ok().as_deref() != Some(doc.as_str()) {
        problems.push(
            "docs/onnx-conformance.md is not what this run finds: rerun with REMAT_WRITE_CONFORMANCE=1"
                .into(),
        );
    }
    assert!(
        problems.is_empty(),
        "{} problems in ONNX's node suite:\n{}",
        problems.len(),
        problems.join("\n")
    );
}

/// The table: per op the cases, and how many pass each check; then the listed cases and the
/// cases not committed, with their reasons.
fn render(
    manifest: &Value,
    results: &[(String, String, Outcome)],
    known: &BTreeMap<String, Known>,
) -> String {
    #[derive(Default)]
    struct Row {
        cases: usize,
        a: usize,
        b: usize,
        c: usize,
        diff: usize,
        listed: usize,
    }
    let mut ops: BTreeMap<&str, Row> = BTreeMap::new();
    let mut unsupported: BTreeMap<&str, usize> = BTreeMap::new();
    for (_, op, o) in results {
        if *o == Outcome::Unsupported {
            *unsupported.entry(op).or_default() += 1;
            continue;
        }
        let r = ops.entry(op).or_default();
        r.cases += 1;
        match o {
            Outcome::Pass { grad } => {
                r.a += 1;
                r.b += 1;
                if *grad {
                    r.diff += 1;
                    r.c += 1;
                }
            }
            Outcome::Fail { check, .. } => {
                r.listed += 1;
                if *check != 'a' {
                    r.a += 1;
                }
                if *check == 'c' {
                    r.b += 1;
                    r.diff += 1;
                }
            }
            Outcome::Unsupported => {}
        }
    }
    let total = |f: fn(&Row) -> usize| ops.values().map(f).sum::<usize>();
    let mut s = String::new();
    let _ = writeln!(
        s,
        "# ONNX's backend node suite\n\n\
         Generated by the test `conformance::onnx_backend_node_suite` (planner/exec/src/conformance.rs)\n\
         from `fixtures/onnx_node/` (the one-node cases of onnx {}, written by `fixtures/onnx_node.py`);\n\
         do not edit: `REMAT_WRITE_CONFORMANCE=1 cargo test --release -p remat-exec conformance` rewrites it.\n\n\
         For each case of an op remat supports: (a) the shape rule infers the reference's output shapes\n\
         and types; (b) the executor's forward equals the reference outputs within the case's tolerances,\n\
         on every device compiled in (this file: the CPU); (c) where an input takes a gradient, the\n\
         backward matches central finite differences in f64 at the case's inputs. A case that fails\n\
         one is listed below with the reason (`fixtures/onnx_node_known.json`).\n",
        manifest["onnx"].as_str().unwrap_or("?")
    );
    let _ = writeln!(
        s,
        "**{} cases of {} supported ops: (a) {} pass, (b) {} pass, (c) {} of {} differentiable pass; \
         {} listed.** {} cases of {} ops remat does not support; {} cases not committed (below).\n",
        total(|r| r.cases),
        ops.len(),
        total(|r| r.a),
        total(|r| r.b),
        total(|r| r.c),
        total(|r| r.diff),
        total(|r| r.listed),
        unsupported.values().sum::<usize>(),
        unsupported.len(),
        manifest["left_out"].as_array().map_or(0, Vec::len),
    );
    s.push_str("| op | cases | (a) shapes | (b) values | (c) gradients | listed |\n|---|---|---|---|---|---|\n");
    for (op, r) in &ops {
        let c = if r.diff == 0 {
            "–".to_string()
        } else {
            format!("{} / {}", r.c, r.diff)
        };
        let _ = writeln!(
            s,
            "| {op} | {} | {} | {} | {c} | {} |",
            r.cases, r.a, r.b, r.listed
        );
    }
    s.push_str("\n## Listed cases\n\n| case | fails | why |\n|---|---|---|\n");
    for (name, k) in known {
        let _ = writeln!(s, "| `{name}` | ({}) | {} |", k.check, k.why);
    }
    s.push_str("\n## Ops remat does not support\n\n");
    let list: Vec<String> = unsupported
        .iter()
        .map(|(op, n)| format!("{op} ({n})"))
        .collect();
    let _ = writeln!(s, "{}\n", list.join(", "));
    s.push_str("## Cases not committed\n\n| case | op | why |\n|---|---|---|\n");
    for l in manifest["left_out"].as_array().into_iter().flatten() {
        let _ = writeln!(
            s,
            "| `{}` | {} | {} |",
            l["name"].as_str().unwrap_or("?"),
            l["op"].as_str().unwrap_or(""),
            l["reason"].as_str().unwrap_or("?").replace('|', "\\|")
        );
    }
    s
}

#[test]
fn a_data_dependent_error_names_its_input() {
    assert_eq!(
        named_input("input 2 is computed from data, not from constants"),
        Some(2)
    );
    assert_eq!(
        named_input("the indices of non-zero elements depend on data"),
        None
    );
}
