//! `remat validate`, `remat plan --validate` and `remat plan --bound-time` as a user runs them:
//! exit codes and what they say.

use std::path::PathBuf;
use std::process::{Command, Output};

fn root() -> PathBuf {
    crate::common::manifest_dir()
        .parent()
        .unwrap()
        .to_path_buf()
}

fn remat(args: &[&str]) -> Output {
    remat_env(args, &[])
}

/// `remat` with these environment variables set, and `RUST_LOG` only where `env` sets it (a
/// developer's own would add log lines to what the tests read).
fn remat_env(args: &[&str], env: &[(&str, &str)]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_remat"))
        .current_dir(root())
        .args(args)
        .env_remove("RUST_LOG")
        .envs(env.iter().copied())
        .output()
        .expect("remat runs")
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

const MODEL: &str = "fixtures/grad/tiny_cnn.onnx";

#[test]
fn validate_passes_and_prints_the_measured_figures() {
    let o = remat(&["validate", MODEL, "--dim", "batch=2", "--budget", "0.95x"]);
    let t = text(&o);
    assert_eq!(o.status.code(), Some(0), "{t}");
    assert!(t.contains("validation passed on cpu"), "{t}");
    assert!(t.contains("max relative error 0.00e0"), "{t}");
    // The counting allocator is installed in the binary: the heap is measured.
    assert!(!t.contains("heap not measured"), "{t}");
}

#[test]
fn timing_rounds_are_asked_for_and_reported() {
    // More than the eight the time budget stops at, and odd: rounded up to a pair.
    let o = remat(&[
        "validate",
        MODEL,
        "--dim",
        "batch=2",
        "--budget",
        "0.95x",
        "--timing-rounds",
        "11",
        "--json",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let v = &v["validation"];
    assert_eq!(v["timing_rounds"], 12);
    let steps = v["measured_step_overhead"]
        .as_f64()
        .expect("the steps' least overhead");
    assert!(steps.is_finite() && steps > -1.0, "{steps}");
    // Fewer than a pair is refused, naming the flag.
    let o = remat(&[
        "validate",
        MODEL,
        "--dim",
        "batch=2",
        "--timing-rounds",
        "1",
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("--timing-rounds"), "{}", text(&o));
}

#[test]
fn a_plan_json_round_trips_through_validate_and_a_foreign_plan_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let plan = dir.path().join("plan.json");
    let o = remat(&[
        "plan",
        MODEL,
        "--dim",
        "batch=2",
        "--budget",
        "0.95x",
        "--json",
        "--out",
        plan.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let o = remat(&[
        "validate",
        MODEL,
        "--dim",
        "batch=2",
        "--plan",
        plan.to_str().unwrap(),
        "--json",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["validation"]["ok"], true);
    // The same plan against another model: exit 2, naming the node id.
    let o = remat(&[
        "validate",
        "fixtures/grad/mlp_ln_gelu.onnx",
        "--dim",
        "batch=2",
        "--plan",
        plan.to_str().unwrap(),
    ]);
    let t = text(&o);
    assert_eq!(o.status.code(), Some(2), "{t}");
    assert!(t.contains("is not in this model's training graph"), "{t}");
}

#[test]
fn a_graph_json_cannot_be_validated_and_cuda_is_not_compiled_in() {
    let graph = root().join("../shared/bench/graphs/VGG16 (MLSys)_256_(224, 224, 3)_train_nx.json");
    let o = remat(&["validate", graph.to_str().unwrap(), "--budget", "0.9x"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("only ONNX models can be validated"));
    if !cfg!(feature = "cuda") {
        let o = remat(&[
            "validate", MODEL, "--dim", "batch=2", "--budget", "0.95x", "--device", "cuda",
        ]);
        assert_eq!(o.status.code(), Some(2), "{}", text(&o));
        assert!(text(&o).contains("not compiled with CUDA"), "{}", text(&o));
    }
}

/// A training chain of `k` forward and `k - 1` backward nodes in node-link form (Checkmate's
/// flavour): more nodes than `auto` hands to the MILP once `k` is over 80.
fn chain_graph(k: usize) -> String {
    let mut nodes = Vec::new();
    let mut links = Vec::new();
    for i in 0..k {
        nodes.push(serde_json::json!({
            "id": i, "cost_cpu": 1 + i % 7, "cost_ram": 10 + 4 * (i % 5), "backward": false
        }));
        if i > 0 {
            links.push(serde_json::json!({"source": i - 1, "target": i}));
        }
    }
    for j in 0..k - 1 {
        let id = k + j;
        let f = k - 2 - j;
        nodes.push(serde_json::json!({
            "id": id, "cost_cpu": 2 + j % 3, "cost_ram": 12, "backward": true
        }));
        links.push(serde_json::json!({"source": f, "target": id}));
        links.push(serde_json::json!({"source": f + 1, "target": id}));
        if j > 0 {
            links.push(serde_json::json!({"source": id - 1, "target": id}));
        }
    }
    serde_json::json!({"directed": true, "nodes": nodes, "links": links}).to_string()
}

/// `RUST_LOG=remat_solver=debug` prints each phase of a plan with its time on stderr, and
/// leaves the JSON on stdout whole; without it the CLI logs nothing of the kind.
/// A budget remat cannot read is refused with the text and what is wrong with it, said once;
/// one with an exponent is a number (`1e6`), not a unit.
#[test]
fn a_budget_is_read_or_refused_naming_its_text() {
    let plan = |budget: &str| {
        remat(&[
            "plan",
            MODEL,
            "--dim",
            "batch=2",
            "--budget",
            budget,
            "--time-limit",
            "1",
        ])
    };
    for (budget, why) in [
        ("12 parsecs", "unknown unit \"parsecs\""),
        ("1e", "unknown unit \"e\""),
        ("1.5", "a byte count must be a whole number"),
        ("1e30", "too large"),
    ] {
        let o = plan(budget);
        assert_eq!(o.status.code(), Some(2), "{budget}: {}", text(&o));
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains(&format!("budget {budget:?}: {why}")), "{err}");
        assert!(!err.contains("budget: budget"), "{err}");
    }
    let o = plan("1e6");
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(text(&o).contains("budget     976.6 KiB"), "{}", text(&o));
}

/// HiGHS warns when a solve stops at its time limit (here the bound's LP, given 50 ms, time
/// enough to build its model and not to solve it): remat reports the bound it has and its source, and the warning, which names
/// nothing a user can act on, is left out unless `RUST_LOG` asks for it.
#[test]
fn highs_time_limit_warnings_are_not_printed_unless_asked_for() {
    let args = [
        "plan",
        "fixtures/models/resnet18.legacy.onnx",
        "--dim",
        "batch=2",
        "--budget",
        "0.95x",
        "--time-limit",
        "2",
        "--bound-time",
        "0.05",
    ];
    let warning = "HiGHS emitted a warning";
    let o = remat(&args);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(!text(&o).contains(warning), "{}", text(&o));
    assert!(text(&o).contains("to the lower bound"), "{}", text(&o));
    let o = remat_env(&args, &[("RUST_LOG", "highs=warn")]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(text(&o).contains(warning), "{}", text(&o));
}

#[test]
fn rust_log_prints_the_phases_of_a_plan_on_stderr() {
    let args = [
        "plan",
        MODEL,
        "--dim",
        "batch=2",
        "--budget",
        "0.9x",
        "--time-limit",
        "1",
        "--json",
    ];
    let o = remat_env(&args, &[("RUST_LOG", "remat_solver=debug")]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("stdout is the plan alone");
    let err = String::from_utf8_lossy(&o.stderr);
    for phase in ["baselines", "segment program", "descent ladder", "search"] {
        assert!(
            err.contains(&format!("phase=\"{phase}\"")),
            "{phase}: {err}"
        );
    }
    let done = err
        .lines()
        .find(|l| l.contains("plan done"))
        .expect("plan done");
    assert!(
        done.contains(&format!("budget={}", v["budget_bytes"])),
        "{done}"
    );

    let quiet = remat(&args);
    assert_eq!(quiet.status.code(), Some(0), "{}", text(&quiet));
    assert!(!String::from_utf8_lossy(&quiet.stderr).contains("plan phase done"));
}

#[test]
fn bound_time_proves_an_lp_bound_and_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let graph = dir.path().join("chain.json");
    std::fs::write(&graph, chain_graph(86)).unwrap();
    let base = [
        "plan",
        graph.to_str().unwrap(),
        "--budget",
        "0.6x",
        "--time-limit",
        "2",
    ];
    let o = remat(&[&base[..], &["--json"]].concat());
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    // Every plan is bounded by the time-point relaxation.
    assert_eq!(v["lower_bound"]["source"], "time_points", "{v}");
    assert_eq!(v["bound_seconds"], 0.0);

    // The LP first, then the same model as a MILP for the rest of the time: the best bound
    // of the three is the report's.
    let o = remat(&[&base[..], &["--bound-time", "5", "--json"]].concat());
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let w: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let source = w["lower_bound"]["source"].as_str().unwrap();
    assert!(
        ["lp", "boundary_milp", "time_points"].contains(&source),
        "{w}"
    );
    let lb = w["lower_bound"]["compute_cost"].as_f64().unwrap();
    let cost = w["predicted"]["compute_cost"].as_f64().unwrap();
    assert!(lb >= v["lower_bound"]["compute_cost"].as_f64().unwrap() && lb <= cost);
    assert!(w["gap"].as_f64().unwrap() <= v["gap"].as_f64().unwrap());
    assert!(w["bound_seconds"].as_f64().unwrap() > 0.0);

    let o = remat(&[&base[..], &["--bound-time", "5"]].concat());
    assert!(
        ["(LP)", "(boundary MILP)", "(time points)"]
            .iter()
            .any(|s| text(&o).contains(&format!("to the lower bound {s}"))),
        "{}",
        text(&o)
    );

    let o = remat(&[&base[..], &["--bound-time=-1"]].concat());
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o).contains("bound_time must be a non-negative number of seconds up to a year"),
        "{}",
        text(&o)
    );
    // More than a Duration holds, or than the clock can add: refused by name, no panic.
    for (flag, name) in [
        ("--time-limit=1e30", "time_limit"),
        ("--bound-time=1e30", "bound_time"),
    ] {
        // `base` without its own --time-limit.
        let o = remat(&[&base[..4], &[flag]].concat());
        assert_eq!(o.status.code(), Some(2), "{flag}: {}", text(&o));
        assert!(
            text(&o).contains(&format!("{name} must be a")) && text(&o).contains("got 1e30"),
            "{flag}: {}",
            text(&o)
        );
    }
}

/// ALBERT's one layer group runs four times per step: its regions are calls, named so.
#[test]
fn remat_plan_names_the_calls_of_a_module_run_more_than_once() {
    let o = remat(&[
        "plan",
        "fixtures/torch/albert.torch.json",
        "--budget",
        "0.6x",
    ]);
    let t = text(&o);
    assert_eq!(o.status.code(), Some(0), "{t}");
    assert!(t.contains("torch-sac): fits"), "{t}");
    assert!(
        t.contains("encoder.albert_layer_groups.0 (AlbertLayerGroup, call 1 of 4)"),
        "{t}"
    );
    let o = remat(&[
        "plan",
        "fixtures/torch/albert.torch.json",
        "--budget",
        "0.6x",
        "--json",
    ]);
    let doc: serde_json::Value = serde_json::from_str(&text(&o)).unwrap();
    let calls: Vec<u64> = doc["regions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["call"].as_u64().unwrap())
        .collect();
    assert_eq!(calls, [0, 1, 2, 3]);
}

#[test]
fn remat_plan_takes_a_captured_pytorch_graph() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("plan.json");
    let graph = "fixtures/torch/gpt2.torch.json";
    let o = remat(&[
        "plan",
        graph,
        "--budget",
        "0.8x",
        "--out",
        out.to_str().unwrap(),
    ]);
    let t = text(&o);
    assert_eq!(o.status.code(), Some(0), "{t}");
    assert!(t.contains("torch-sac): fits"), "{t}");
    assert!(t.contains("transformer.h."), "{t}");
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    assert_eq!(doc["format"], "remat.torch-plan");
    assert!(doc["predicted"]["peak_bytes"].as_u64() <= doc["budget_bytes"].as_u64());
    // Below the least reachable peak: the least-peak plan, and exit 3.
    let o = remat(&["plan", graph, "--budget", "1000", "--json"]);
    let t = text(&o);
    assert_eq!(o.status.code(), Some(3), "{t}");
    assert!(t.contains("\"status\": \"infeasible\""), "{t}");
    assert!(t.contains("its minimum feasible budget, is"), "{t}");
    // Options of the free model are refused, naming them.
    let o = remat(&["plan", graph, "--budget", "0.8x", "--solver", "ilp"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("--solver ilp plans free schedules"));
    let o = remat(&["plan", graph, "--budget", "0.8x", "--validate"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("remat.torch.measure"), "{}", text(&o));
    let o = remat(&[
        "plan",
        graph,
        "--budget",
        "0.8x",
        "--reuse",
        out.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o).contains("--reuse offers a plan's schedule to the free-schedule planner"),
        "{}",
        text(&o)
    );
    // The sweep plans it in the torch-sac model too, with PyTorch's step and full
    // checkpointing side by side; below the least peak a point is infeasible.
    let o = remat(&["sweep", graph, "--fractions", "1,0.95,0.75,0.01", "--json"]);
    let t = text(&o);
    assert_eq!(o.status.code(), Some(0), "{t}");
    let sweep: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(sweep["graph"]["format"], "torch_graph", "{t}");
    let points = sweep["points"].as_array().unwrap();
    assert_eq!(points.len(), 4, "{t}");
    assert!(points.iter().all(|p| p["solver"] == "torch-sac"), "{t}");
    assert_eq!(points[0]["overhead"], 0.0, "{t}");
    assert_eq!(
        points[0]["baselines"][0],
        serde_json::json!(["none", 0.0]),
        "{t}"
    );
    let at_095 = points[1]["overhead"].as_f64().unwrap();
    assert!(
        at_095 > 0.0 && at_095 <= points[2]["overhead"].as_f64().unwrap(),
        "{t}"
    );
    assert_eq!(points[3]["status"], "infeasible", "{t}");
    // Without --json: a row per budget, smallest first, with the gap's source and the
    // cheapest policy that fits.
    let o = remat(&["sweep", graph, "--fractions", "1,0.75,0.01"]);
    let t = text(&o);
    assert_eq!(o.status.code(), Some(0), "{t}");
    let rows: Vec<&str> = t.lines().skip(2).collect();
    assert_eq!(rows.len(), 3, "{t}");
    assert!(
        rows[0].contains("0.010x")
            && rows[0].contains("infeasible")
            && rows[0].contains("none fits"),
        "{t}"
    );
    assert!(
        rows[1].contains("0.750x")
            && rows[1].contains("(chain_program)")
            && rows[1].contains("full +"),
        "{t}"
    );
    assert!(
        rows[2].contains("1.000x") && rows[2].contains("+0.00%") && rows[2].contains("none +0.00%"),
        "{t}"
    );
    let o = remat(&["sweep", graph, "--solver", "ilp"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("torch-sac"), "{}", text(&o));
    // What has no torch-sac meaning says where the graph goes instead.
    let o = remat(&["validate", graph, "--budget", "0.8x"]);
    assert_ne!(o.status.code(), Some(0), "{}", text(&o));
    assert!(text(&o).contains("remat sweep"), "{}", text(&o));
    assert!(text(&o).contains("remat.torch.measure"), "{}", text(&o));

    // What remat.torch.measure measured of this plan becomes its `validation`, checked first.
    let predicted = doc["predicted"]["peak_bytes"].as_u64().unwrap();
    let measured = |ok: bool, predicted: u64| {
        let v = serde_json::json!({
            "ran": true, "device": "torch-cpu", "ok": ok,
            "problems": if ok { vec![] } else { vec!["gradients differ"] },
            "predicted_peak_bytes": predicted, "measured_peak_bytes": predicted,
            "grad_max_rel_err": 0.5, "grad_reference_rel_err": 0.75,
            "measured_overhead": 0.125, "measured_step_overhead": 0.0875,
            "fingerprint": doc["fingerprint"],
        });
        let path = dir.path().join(format!("measured-{ok}-{predicted}.json"));
        std::fs::write(&path, v.to_string()).unwrap();
        path.to_str().unwrap().to_string()
    };
    let good = measured(true, predicted);
    let o = remat(&[
        "plan",
        graph,
        "--budget",
        "0.8x",
        "--validation",
        &good,
        "--out",
        out.to_str().unwrap(),
    ]);
    let t = text(&o);
    assert_eq!(o.status.code(), Some(0), "{t}");
    assert!(t.contains("measured in PyTorch (torch-cpu): passed"), "{t}");
    assert!(
        t.contains("(+0.00% of predicted)")
            && t.contains("max gradient error 5.0e-1 (the unplanned step against itself 7.5e-1)")
            && t.contains("overhead +12.50% (ops at their least +8.75%)"),
        "{t}"
    );
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    assert_eq!(doc["validation"]["measured_overhead"], 0.125);
    let o = remat(&[
        "plan",
        graph,
        "--budget",
        "0.8x",
        "--validation",
        &measured(false, predicted),
    ]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(
        text(&o).contains("problem: gradients differ"),
        "{}",
        text(&o)
    );
    let other = measured(true, predicted + 1);
    let o = remat(&["plan", graph, "--budget", "0.8x", "--validation", &other]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o).contains("predicted_peak_bytes") && text(&o).contains(&other),
        "{}",
        text(&o)
    );
    let o = remat(&[
        "plan",
        "fixtures/gate/mlp_v1.onnx",
        "--budget",
        "0.8x",
        "--dim",
        "batch=4",
        "--validation",
        &good,
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("--validate"), "{}", text(&o));
}

/// The segment program's plans of a transformer (GPT-2, Llama: a chain of stages at every
/// residual add) run on the executor: the measured peak is the predicted one, within the
/// budget, the gradients are those of the unplanned run, and the plan recomputes.
#[test]
fn segment_dp_plans_of_transformers_run_with_their_predicted_peak() {
    for model in [
        "fixtures/models/gpt2.legacy.onnx",
        "fixtures/models/thirdparty/llama.dynamo18.onnx",
    ] {
        let o = remat(&[
            "validate",
            model,
            "--dim",
            "batch=2",
            "--dim",
            "seq=32",
            "--budget",
            "0.85x",
            "--solver",
            "segment-dp",
            "--json",
        ]);
        let t = text(&o);
        assert_eq!(o.status.code(), Some(0), "{model}: {t}");
        let doc: serde_json::Value = serde_json::from_slice(&o.stdout).expect("JSON");
        assert_eq!(doc["solver"], "segment-dp", "{model}");
        let v = &doc["validation"];
        assert_eq!(v["ok"], true, "{model}: {v}");
        assert_eq!(
            v["measured_peak_bytes"], v["predicted_peak_bytes"],
            "{model}"
        );
        assert!(v["measured_peak_bytes"].as_u64() <= doc["budget_bytes"].as_u64());
        assert_eq!(v["grad_max_rel_err"].as_f64(), Some(0.0), "{model}");
        assert!(v["recomputations"].as_u64() > Some(0), "{model}: {v}");
    }
}

/// The roofline is the default cost model; `remat calibrate` fits rates on this machine,
/// `--rates` (or `REMAT_RATES`) plans with them, `--cost flops` plans with FLOPs; a file that
/// is not a rates file is exit 2 naming it.
#[test]
fn plans_cost_by_the_roofline_and_calibrate_writes_rates_plans_read() {
    let dir = tempfile::tempdir().unwrap();
    let plan = |extra: &[&str]| -> serde_json::Value {
        let mut args = vec![
            "plan", MODEL, "--dim", "batch=2", "--budget", "0.9x", "--json",
        ];
        args.extend_from_slice(extra);
        let o = remat(&args);
        assert_eq!(o.status.code(), Some(0), "{}", text(&o));
        serde_json::from_slice(&o.stdout).unwrap()
    };
    let default = plan(&[]);
    assert_eq!(default["cost_model"]["kind"], "roofline", "{default}");
    assert_eq!(default["cost_model"]["unit"], "seconds");
    assert!(default["cost_model"]["rates"]
        .as_str()
        .unwrap()
        .contains("remat's defaults"));
    let base = default["store_all_cost"].as_f64().unwrap();
    assert!(
        base > 0.0 && base < 1.0,
        "a tiny CNN's step in seconds: {base}"
    );
    let flops = plan(&["--cost", "flops"]);
    assert!(flops.get("cost_model").is_none(), "{flops}");
    assert!(flops["store_all_cost"].as_f64().unwrap() > 1e5, "FLOPs");

    let rates = dir.path().join("rates.json");
    let o = remat(&[
        "calibrate",
        MODEL,
        "--dim",
        "batch=2",
        "--runs",
        "1",
        "--out",
        rates.to_str().unwrap(),
    ]);
    let t = text(&o);
    assert_eq!(o.status.code(), Some(0), "{t}");
    assert!(
        t.contains("conv_backward") && t.contains("by the roofline"),
        "{t}"
    );
    let written: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&rates).unwrap()).unwrap();
    assert!(written["source"]
        .as_str()
        .unwrap()
        .contains("tiny_cnn.onnx"));
    assert_eq!(written["device"], "cpu", "{written}");
    assert!(written["ops"].is_object(), "{written}");
    assert!(t.contains("ops have rates of their own"), "{t}");
    let calibrated = plan(&["--rates", rates.to_str().unwrap()]);
    assert_eq!(calibrated["cost_model"]["rates"], written["source"]);
    assert_eq!(calibrated["cost_model"]["device"], "cpu");
    // The document names the device the rates were measured on, not the planner's.
    let mut cuda = written.clone();
    cuda["device"] = "cuda".into();
    let cuda_rates = dir.path().join("rates-cuda.json");
    std::fs::write(&cuda_rates, cuda.to_string()).unwrap();
    let on_cuda = plan(&["--rates", cuda_rates.to_str().unwrap()]);
    assert_eq!(on_cuda["cost_model"]["device"], "cuda", "{on_cuda}");
    let by_env = remat_env(
        &[
            "plan", MODEL, "--dim", "batch=2", "--budget", "0.9x", "--json",
        ],
        &[("REMAT_RATES", rates.to_str().unwrap())],
    );
    let by_env: serde_json::Value = serde_json::from_slice(&by_env.stdout).unwrap();
    assert_eq!(by_env["cost_model"]["rates"], written["source"]);

    std::fs::write(
        dir.path().join("bad.json"),
        "{\"source\": \"x\", \"rates\": {}}",
    )
    .unwrap();
    let bad = dir.path().join("bad.json");
    let o = remat(&[
        "plan",
        MODEL,
        "--dim",
        "batch=2",
        "--budget",
        "0.9x",
        "--rates",
        bad.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o).contains("bad.json") && text(&o).contains("`rates` has no \"conv_forward\""),
        "{}",
        text(&o)
    );
    // Rates that are finite and positive but price an op at infinite seconds (a FLOP rate of
    // 5e-324) are refused naming the node, not planned into a NaN overhead.
    let mut tiny = written.clone();
    for class in tiny["rates"].as_object_mut().unwrap().values_mut() {
        class["flops_per_second"] = 5e-324.into();
    }
    tiny["ops"] = serde_json::json!({});
    let tiny_rates = dir.path().join("tiny.json");
    std::fs::write(&tiny_rates, tiny.to_string()).unwrap();
    let o = remat(&[
        "plan",
        MODEL,
        "--dim",
        "batch=2",
        "--budget",
        "0.9x",
        "--rates",
        tiny_rates.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o).contains("has an invalid cost: inf") && text(&o).contains("node \"f:"),
        "{}",
        text(&o)
    );
}

/// `remat plan --reuse`: a plan made at a lower budget (here +8.09% at 0.8x) is offered to the
/// plan at 0.82x, which on its own costs +5.32% and returns the 0.8x schedule less what 0.82x
/// need not recompute (+3.97%); a plan naming a node the graph lacks is refused, naming its
/// file.
#[test]
fn remat_plan_reuses_a_plan_of_a_lower_budget_given_with_reuse() {
    let graph =
        root().join("../shared/bench/graphs/random_layered_n250_w0.43_nlv0.75_ed0.2_scd0.14.json");
    let graph = graph.to_str().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let low = dir.path().join("low.json");
    let plan = |budget: &str, extra: &[&str]| {
        let mut args = vec![
            "plan",
            graph,
            "--budget",
            budget,
            "--solver",
            "ilp",
            "--time-limit",
            "0.2",
            "--json",
        ];
        args.extend_from_slice(extra);
        remat(&args)
    };
    let o = plan("0.8x", &["--out", low.to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o));
    let low_doc: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let alone: serde_json::Value = serde_json::from_slice(&plan("0.82x", &[]).stdout).unwrap();
    assert!(alone.get("reused_from_budget_bytes").is_none(), "{alone}");
    // The summary without --json spells the status as the plan document does.
    let doc_path = dir.path().join("summary.json");
    let summary = text(&remat(&[
        "plan",
        graph,
        "--budget",
        "0.82x",
        "--solver",
        "ilp",
        "--time-limit",
        "0.2",
        "--out",
        doc_path.to_str().unwrap(),
    ]));
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&doc_path).unwrap()).unwrap();
    let status = doc["status"].as_str().unwrap();
    assert!(
        summary.contains(&format!("status     {status} (")),
        "{status}\n{summary}"
    );
    let o = plan("0.82x", &["--reuse", low.to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o));
    let reused: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(reused["reused_from_budget_bytes"], low_doc["budget_bytes"]);
    let overhead = |d: &serde_json::Value| d["predicted"]["overhead"].as_f64().unwrap();
    assert!(overhead(&reused) < overhead(&alone) && overhead(&reused) <= overhead(&low_doc));

    let other = dir.path().join("other.json");
    let mut foreign = low_doc.clone();
    foreign["schedule"][0]["node"] = serde_json::json!("not-in-this-graph");
    std::fs::write(&other, foreign.to_string()).unwrap();
    let o = plan("0.82x", &["--reuse", other.to_str().unwrap()]);
    assert!(!o.status.success());
    let err = text(&o);
    assert!(
        err.contains("other.json") && err.contains("unknown node id"),
        "{err}"
    );

    // A folder: the plans of this model in it are reused, the others skipped with a note.
    let folder = dir.path().join("plans");
    std::fs::create_dir(&folder).unwrap();
    std::fs::copy(&low, folder.join("a-low.json")).unwrap();
    std::fs::write(folder.join("b-other.json"), foreign.to_string()).unwrap();
    std::fs::write(folder.join("c-notes.json"), "not json").unwrap();
    std::fs::write(folder.join("d-readme.txt"), "not a plan").unwrap();
    let o = plan("0.82x", &["--reuse", folder.to_str().unwrap()]);
    let err = text(&o);
    assert!(o.status.success(), "{err}");
    let from_folder: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(
        from_folder["reused_from_budget_bytes"], low_doc["budget_bytes"],
        "{err}"
    );
    assert_eq!(overhead(&from_folder), overhead(&reused));
    assert!(
        err.contains("b-other.json skipped") && err.contains("unknown node id"),
        "{err}"
    );
    assert!(err.contains("c-notes.json skipped: not JSON"), "{err}");
    assert!(
        !err.contains("a-low.json") && !err.contains("d-readme"),
        "{err}"
    );
}

/// `remat plan --reuse` with a plan of the model imported otherwise (here with its first
/// layer frozen: its schedule never computes that layer's backward) is refused, and the
/// message says what differs (the parameter bytes) and which options to look at; it named no
/// option. A plan at other dims whose schedule is one of this graph is reused.
#[test]
fn a_reused_plan_made_with_other_frozen_weights_is_refused_naming_the_options() {
    let mlp = root().join("fixtures/gate/mlp_v1.onnx");
    let mlp = mlp.to_str().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let frozen = dir.path().join("frozen.json");
    let plan = |batch: &str, extra: &[&str]| {
        let dim = format!("batch={batch}");
        let mut args = vec!["plan", mlp, "--dim", &dim, "--budget", "1.0x", "--json"];
        args.extend_from_slice(extra);
        remat(&args)
    };
    let o = plan("32", &["--freeze", "?0", "--out", frozen.to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o));
    let o = plan("32", &["--reuse", frozen.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    let err = text(&o);
    assert!(
        err.contains("frozen.json")
            && err.contains("never computes required node \"b:fc0\"")
            && err.contains("the plan was made with params_bytes 71208, which is 88104 here")
            && err.contains("other --freeze, --param or --input"),
        "{err}"
    );
    let o = plan(
        "16",
        &["--freeze", "?0", "--reuse", frozen.to_str().unwrap()],
    );
    assert!(o.status.success(), "{}", text(&o));
}

/// A validation whose store-all step needs more memory than the machine has is refused
/// before anything is allocated (a failed allocation would abort the process, and the service
/// with it), naming both figures; the service answers the plan with the validation not run
/// and the reason.
#[test]
fn a_validation_that_needs_more_memory_than_the_machine_has_is_refused() {
    let vgg = root().join("fixtures/models/vgg11.legacy.onnx");
    let o = remat(&[
        "validate",
        vgg.to_str().unwrap(),
        "--dim",
        "batch=1000000",
        "--budget",
        "1.0x",
        "--solver",
        "store-all",
    ]);
    let t = text(&o);
    assert_eq!(o.status.code(), Some(2), "{t}");
    assert!(
        t.contains("the store-all step needs about") && t.contains("available"),
        "{t}"
    );
}

/// `--dim`, `--param` and `--input` shape an ONNX model's training graph; a node-link graph and
/// a captured PyTorch graph have theirs fixed in the file, so the options are refused, naming
/// them, instead of ignored (the plan would not be of the model asked for). A `--dim` given
/// twice with two values is refused too.
#[test]
fn options_that_shape_an_onnx_model_are_refused_where_they_do_not_apply() {
    let node_link =
        root().join("../shared/bench/graphs/random_layered_n250_w0.43_nlv0.75_ed0.2_scd0.14.json");
    let cases: [(&str, &[&str], &str); 3] = [
        (
            node_link.to_str().unwrap(),
            &["--dim", "batch=64"],
            "dims (batch) apply to ONNX models; a node-link graph",
        ),
        (
            "fixtures/torch/stack.torch.json",
            &["--param", "foo"],
            "params (foo) apply to ONNX models; a captured PyTorch graph",
        ),
        (
            MODEL,
            &["--dim", "batch=2", "--dim", "batch=3"],
            "--dim batch is given twice, as 2 and 3",
        ),
    ];
    for (model, extra, want) in cases {
        let mut args = vec!["plan", model, "--budget", "0.9x"];
        args.extend_from_slice(extra);
        let o = remat(&args);
        let t = text(&o);
        assert_eq!(o.status.code(), Some(2), "{model}: {t}");
        assert!(t.contains(want), "{model}: {t}");
    }
}

/// JSON with a byte-order mark or leading blank lines is JSON (read as such, not as ONNX);
/// JSON that is not an object says so; `inspect` says it reads ONNX models only.
#[test]
fn json_models_are_told_apart_from_onnx_whatever_comes_first() {
    let dir = tempfile::tempdir().unwrap();
    let graph = std::fs::read(
        root().join("../shared/bench/graphs/random_layered_n250_w0.43_nlv0.75_ed0.2_scd0.14.json"),
    )
    .unwrap();
    let write = |name: &str, head: &[u8], body: &[u8]| {
        let path = dir.path().join(name);
        std::fs::write(&path, [head, body].concat()).unwrap();
        path.to_str().unwrap().to_string()
    };
    for path in [
        write("bom.json", b"\xef\xbb\xbf", &graph),
        write("blank.json", b"\n\n  ", &graph),
    ] {
        let o = remat(&["plan", &path, "--budget", "0.9x"]);
        assert_eq!(o.status.code(), Some(0), "{path}: {}", text(&o));
    }
    for (name, body, want) in [
        ("null.json", &b"null"[..], "JSON but null, not an object"),
        ("empty.onnx", &b""[..], "the model is empty (0 bytes)"),
        (
            "blanks.json",
            &b" \n"[..],
            "the model is empty (2 bytes, blanks only)",
        ),
        (
            "array.json",
            &b"[1, 2]"[..],
            "JSON but an array, not an object",
        ),
    ] {
        let path = write(name, b"", body);
        let o = remat(&["plan", &path, "--budget", "0.9x"]);
        assert_eq!(o.status.code(), Some(2), "{name}: {}", text(&o));
        assert!(text(&o).contains(want), "{name}: {}", text(&o));
    }
    let path = write("graph.json", b"", &graph);
    let o = remat(&["inspect", &path]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o).contains("inspect reads ONNX models"),
        "{}",
        text(&o)
    );
}

/// Bad input is exit 2 wherever it comes from: a `--reuse` file that is not JSON, a `--plan`
/// file that is not there, a `serve` flag out of range.
#[test]
fn bad_files_and_flags_are_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    let truncated = dir.path().join("truncated.json");
    std::fs::write(&truncated, "{\"schedule\": [").unwrap();
    let missing = dir.path().join("missing.json");
    let db = dir.path().join("r.db");
    let cases: [(Vec<&str>, &str); 3] = [
        (
            vec![
                "plan",
                MODEL,
                "--dim",
                "batch=2",
                "--budget",
                "0.9x",
                "--reuse",
                truncated.to_str().unwrap(),
            ],
            "not a JSON plan document",
        ),
        (
            vec![
                "validate",
                MODEL,
                "--dim",
                "batch=2",
                "--plan",
                missing.to_str().unwrap(),
            ],
            "cannot read it",
        ),
        (
            vec![
                "serve",
                "--max-time-limit",
                "0",
                "--db",
                db.to_str().unwrap(),
            ],
            "--max-time-limit",
        ),
    ];
    for (args, want) in cases {
        let o = remat(&args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", text(&o));
        assert!(text(&o).contains(want), "{args:?}: {}", text(&o));
    }
    // `--out` naming the model itself would overwrite it with the plan: refused, the model
    // left as it was.
    let model = dir.path().join("model.onnx");
    std::fs::copy(root().join(MODEL), &model).unwrap();
    let before = std::fs::read(&model).unwrap();
    let m = model.to_str().unwrap();
    let o = remat(&[
        "plan", m, "--dim", "batch=2", "--budget", "0.9x", "--out", m,
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("would overwrite"), "{}", text(&o));
    assert_eq!(std::fs::read(&model).unwrap(), before);
}

/// `validate --plan` with a plan of this model at other dims says which input's shape differs
/// (not that the run went over its budget), and with an infeasible plan that it has no
/// schedule (not that a node is never computed).
#[test]
fn validate_names_why_a_plan_does_not_fit_this_model() {
    let dir = tempfile::tempdir().unwrap();
    let plan_at = |budget: &str, out: &str| {
        let args = [
            "plan", MODEL, "--dim", "batch=2", "--budget", budget, "--out", out,
        ];
        remat(&args)
    };
    let validate =
        |batch: &str, plan: &str| remat(&["validate", MODEL, "--dim", batch, "--plan", plan]);
    let at_2 = dir.path().join("at2.json");
    let at_2 = at_2.to_str().unwrap();
    let o = plan_at("0.9x", at_2);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let o = validate("batch=4", at_2);
    let t = text(&o);
    assert_eq!(o.status.code(), Some(2), "{t}");
    assert!(
        t.contains("the plan was made with input") && t.contains("[2,") && t.contains("[4,"),
        "{t}"
    );
    let infeasible = dir.path().join("infeasible.json");
    let infeasible = infeasible.to_str().unwrap();
    let o = plan_at("1", infeasible);
    assert_eq!(o.status.code(), Some(3), "{}", text(&o));
    let o = validate("batch=2", infeasible);
    let t = text(&o);
    assert_eq!(o.status.code(), Some(2), "{t}");
    assert!(t.contains("the plan is infeasible"), "{t}");
    // A plan made with other frozen weights: named as such (the run failed on a value that
    // was not resident, naming no option).
    let o = remat(&[
        "validate", MODEL, "--dim", "batch=2", "--plan", at_2, "--freeze", "conv.*",
    ]);
    let t = text(&o);
    assert_eq!(o.status.code(), Some(2), "{t}");
    assert!(
        t.contains("the plan was made with params_bytes") && t.contains("--freeze"),
        "{t}"
    ); // And the other way: a plan made with them, run without.
    let frozen = dir.path().join("frozen.json");
    let frozen = frozen.to_str().unwrap();
    let o = remat(&[
        "plan", MODEL, "--dim", "batch=2", "--budget", "0.9x", "--freeze", "conv.*", "--out",
        frozen,
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let o = validate("batch=2", frozen);
    let t = text(&o);
    assert_eq!(o.status.code(), Some(2), "{t}");
    assert!(t.contains("imported with other --freeze"), "{t}");
}

/// An ONNX model whose weights are in a file beside it (`onnx.save(...,
/// save_as_external_data=True)`, the dynamo exporter's `.onnx.data`): the CLI reads them,
/// and a missing file is an error naming the tensor and the file (exit 2), never seeded
/// weights without a word.
#[test]
fn external_data_beside_the_model_is_read_and_a_missing_file_named() {
    use onnx_protobuf::tensor_proto::DataLocation;
    use onnx_protobuf::{Message, ModelProto, StringStringEntryProto};
    let bytes = std::fs::read(root().join(MODEL)).expect("fixture");
    let mut model = ModelProto::parse_from_bytes(&bytes).expect("parses");
    let mut data = vec![];
    let g = model.graph.as_mut().expect("graph");
    let mut moved = 0;
    for t in g.initializer.iter_mut().filter(|t| !t.raw_data.is_empty()) {
        let raw = std::mem::take(&mut t.raw_data);
        let entry = |key: &str, value: String| StringStringEntryProto {
            key: key.into(),
            value,
            ..Default::default()
        };
        t.external_data = vec![
            entry("location", "tiny_cnn.onnx.data".into()),
            entry("offset", data.len().to_string()),
            entry("length", raw.len().to_string()),
        ];
        t.data_location = DataLocation::EXTERNAL.into();
        data.extend_from_slice(&raw);
        moved += 1;
    }
    assert!(moved >= 4, "the fixture keeps its weights inline: {moved}");
    let dir = tempfile::tempdir().expect("temp folder");
    let path = dir.path().join("tiny_cnn.onnx");
    std::fs::write(&path, model.write_to_bytes().expect("encodes")).expect("write");
    let p = path.to_str().expect("utf-8 path");
    let run = || remat(&["validate", p, "--dim", "batch=2", "--budget", "0.95x"]);

    let o = run();
    let t = text(&o);
    assert_eq!(o.status.code(), Some(2), "{t}");
    assert!(
        t.contains("external data \"tiny_cnn.onnx.data\": cannot open"),
        "{t}"
    );

    std::fs::write(dir.path().join("tiny_cnn.onnx.data"), &data).expect("write");
    let o = run();
    let t = text(&o);
    assert_eq!(o.status.code(), Some(0), "{t}");
    assert!(t.contains("validation passed on cpu"), "{t}");
    assert!(t.contains("from the file, 0 seeded"), "{t}");
}

/// `--budget min` plans at the least peak remat reaches: the budget an infeasible budget's
/// error names, and a plan that fits it.
#[test]
fn budget_min_plans_at_the_least_peak_an_infeasible_budget_names() {
    let o = remat(&["plan", MODEL, "--dim", "batch=2", "--budget", "1000"]);
    let t = text(&o);
    assert_eq!(o.status.code(), Some(3), "{t}");
    let named: u64 = t
        .split("its minimum feasible budget, is ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no minimum in {t}"));
    for min in ["min", "MIN"] {
        let o = remat(&["plan", MODEL, "--dim", "batch=2", "--budget", min, "--json"]);
        let t = text(&o);
        assert_eq!(o.status.code(), Some(0), "{t}");
        let doc: serde_json::Value = serde_json::from_slice(&o.stdout).expect("JSON");
        assert_eq!(doc["budget_bytes"], named, "{t}");
        // The plan says which budget is the least: the one it was asked for.
        assert_eq!(doc["min_feasible_budget_bytes"], named, "{t}");
        let peak = doc["predicted"]["peak_bytes"].as_u64().unwrap();
        assert!(peak <= named, "{t}");
    }
}
