//! `remat gate` end to end: the binary on two versions of a fixture model.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn fixtures() -> PathBuf {
    crate::common::manifest_dir().join("../fixtures/gate")
}

fn remat(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_remat"))
        .current_dir(dir)
        .args(args)
        .env_remove("GITHUB_STEP_SUMMARY")
        .output()
        .expect("run remat")
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// `remat gate --format json` in `dir`, expected to fail with exit 1: its outcome and the
/// figures that regressed.
fn gate_regressions(dir: &Path) -> (serde_json::Value, Vec<String>) {
    let o = remat(dir, &["gate", "--format", "json"]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let outcome: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let regressed = outcome["rows"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["regression"] == true)
        .map(|r| r["figure"].as_str().unwrap().to_string())
        .collect();
    (outcome, regressed)
}

fn write_config(dir: &Path, model: &str) {
    let path = fixtures().join(model);
    let config = format!(
        "[[model]]\nname = \"mlp\"\npath = {:?}\nbudget = \"160KiB\"\ndims = {{ batch = 32 }}\nmax_overhead = 0.25\ntolerance = 0.01\n",
        path.display().to_string()
    );
    std::fs::write(dir.join("remat.toml"), config).unwrap();
}

#[test]
fn gate_passes_on_its_baseline_fails_on_growth_and_passes_after_update() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    write_config(d, "mlp_v1.onnx");

    // No baseline yet: a usage error that says how to create one.
    let o = remat(d, &["gate"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("--update"), "{}", text(&o));

    let o = remat(d, &["gate", "--update"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let baseline: serde_json::Value =
        serde_json::from_slice(&std::fs::read(d.join("remat-baseline.json")).unwrap()).unwrap();
    let v1_peak = baseline["models"]["mlp"]["store_all_peak_bytes"]
        .as_u64()
        .unwrap();
    assert!(v1_peak > 0);

    // The baseline's own model passes, twice (the figures are deterministic).
    for _ in 0..2 {
        let o = remat(d, &["gate"]);
        assert_eq!(o.status.code(), Some(0), "{}", text(&o));
        assert!(text(&o).contains("no regression"), "{}", text(&o));
    }

    // The model gains a layer: exit 1, each grown figure listed with old -> new and the change.
    write_config(d, "mlp_v2.onnx");
    let (outcome, regressed) = gate_regressions(d);
    assert!(
        regressed.iter().any(|f| f == "store_all_peak_bytes"),
        "{regressed:?}"
    );
    assert!(
        regressed.iter().any(|f| f == "saved_activation_bytes"),
        "{regressed:?}"
    );
    for r in outcome["rows"].as_array().unwrap() {
        if r["regression"] == true && r["unit"] == "bytes" {
            assert!(r["new"].as_f64().unwrap() > r["old"].as_f64().unwrap());
            assert!(r["change"].as_f64().unwrap() > 1.0);
        }
    }
    let o = remat(d, &["gate"]);
    assert_eq!(o.status.code(), Some(1));
    let t = text(&o);
    assert!(
        t.contains("REGRESSION") && t.contains("store_all_peak_bytes"),
        "{t}"
    );

    // GitHub format: one annotation per regression, and the Markdown summary appended.
    let summary = d.join("summary.md");
    let o = Command::new(env!("CARGO_BIN_EXE_remat"))
        .current_dir(d)
        .args(["gate", "--format", "github"])
        .env("GITHUB_STEP_SUMMARY", &summary)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stdout).contains("::error file="));
    let md = std::fs::read_to_string(&summary).unwrap();
    assert!(
        md.contains("| model | figure |") && md.contains("regression"),
        "{md}"
    );
    // A summary file that cannot be written is exit 2 (not the 1 of a regression), and the
    // message still counts the regressions.
    let o = Command::new(env!("CARGO_BIN_EXE_remat"))
        .current_dir(d)
        .args(["gate", "--format", "github"])
        .env("GITHUB_STEP_SUMMARY", d.join("no-such-folder/summary.md"))
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o).contains("cannot write GITHUB_STEP_SUMMARY") && text(&o).contains("regression"),
        "{}",
        text(&o)
    );

    // Accept the change: the gate passes again.
    let o = remat(d, &["gate", "--update"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let o = remat(d, &["gate"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(!text(&o).contains("improved beyond"), "{}", text(&o));

    // Back to the smaller model against v2's baseline: it passes, and says the baseline is
    // stale (a regression back up to v2's figures would pass until --update records v1's).
    write_config(d, "mlp_v1.onnx");
    let o = remat(d, &["gate"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(
        text(&o).contains("improved beyond the tolerance: run remat gate --update"),
        "{}",
        text(&o)
    );
    // Every format carries the same verdict.
    let verdict = String::from_utf8_lossy(&o.stdout)
        .lines()
        .last()
        .unwrap()
        .to_string();
    for format in ["markdown", "github"] {
        let o = remat(d, &["gate", "--format", format]);
        assert_eq!(o.status.code(), Some(0), "{format}: {}", text(&o));
        assert!(
            text(&o).contains(&verdict),
            "{format}: {verdict}: {}",
            text(&o)
        );
    }
    let o = remat(d, &["gate", "--format", "json"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let outcome: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(outcome["verdict"], verdict.as_str(), "{outcome}");
    let improved: Vec<&str> = outcome["rows"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["improved"] == true)
        .map(|r| r["figure"].as_str().unwrap())
        .collect();
    assert!(improved.contains(&"store_all_peak_bytes"), "{outcome}");
}

#[test]
fn corrupt_baseline_or_config_is_exit_2_naming_file_and_field() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    write_config(d, "mlp_v1.onnx");
    let o = remat(d, &["gate", "--update"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));

    // A baseline whose figure has the wrong type.
    let good = std::fs::read_to_string(d.join("remat-baseline.json")).unwrap();
    let bad = good.replacen(
        "\"store_all_peak_bytes\": ",
        "\"store_all_peak_bytes\": \"x\", \"_\": ",
        1,
    );
    std::fs::write(d.join("remat-baseline.json"), bad).unwrap();
    let o = remat(d, &["gate"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    let t = text(&o);
    assert!(
        t.contains("remat-baseline.json") && t.contains("store_all_peak_bytes"),
        "{t}"
    );

    // Figures no run can have: a gate against them would pass or fail whatever it measured.
    let doc: serde_json::Value = serde_json::from_str(&good).unwrap();
    let name = doc["models"]
        .as_object()
        .unwrap()
        .keys()
        .next()
        .unwrap()
        .clone();
    for (field, value) in [
        ("planned_gap", serde_json::json!(-5.0)),
        ("planned_gap", serde_json::json!(1e300)),
        ("planned_overhead", serde_json::json!(-5.0)),
        ("max_overhead", serde_json::json!(-1.0)),
        // Statuses no plan has, an overhead missing from a feasible plan or given to an
        // infeasible one, store-all below the least peak: passed as ok before.
        ("planned_status", serde_json::json!("bogus")),
        ("store_all_peak_bytes", serde_json::json!(0)),
    ] {
        let mut bad = doc.clone();
        bad["models"][&name][field] = value.clone();
        std::fs::write(d.join("remat-baseline.json"), bad.to_string()).unwrap();
        let o = remat(d, &["gate"]);
        let t = text(&o);
        assert_eq!(o.status.code(), Some(2), "{field} {value}: {t}");
        assert!(
            t.contains("remat-baseline.json") && t.contains(&format!("models.{name}.{field}")),
            "{field} {value}: {t}"
        );
    }

    // The fixture's budget is infeasible (no overhead): a feasible status without one, and an
    // overhead with the infeasible status.
    assert_eq!(doc["models"][&name]["planned_status"], "infeasible");
    for (field, value) in [
        ("planned_status", serde_json::json!("feasible")),
        ("planned_overhead", serde_json::json!(0.1)),
    ] {
        let mut bad = doc.clone();
        bad["models"][&name][field] = value;
        std::fs::write(d.join("remat-baseline.json"), bad.to_string()).unwrap();
        let o = remat(d, &["gate"]);
        assert_eq!(o.status.code(), Some(2), "{field}: {}", text(&o));
        assert!(
            text(&o).contains(&format!("models.{name}.planned_overhead")),
            "{field}: {}",
            text(&o)
        );
    }

    // A model name with a line break: it would start a line of its own in CI logs (a GitHub
    // workflow command after `--format github`'s table).
    std::fs::write(
        d.join("injected.toml"),
        format!(
            "[[model]]\nname = \"a\\n::warning::injected\"\npath = {:?}\nbudget = \"160KiB\"\ndims = {{ batch = 32 }}\n",
            fixtures().join("mlp_v1.onnx").display().to_string()
        ),
    )
    .unwrap();
    let o = remat(
        d,
        &[
            "gate",
            "--config",
            "injected.toml",
            "--format",
            "github",
            "--update",
        ],
    );
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o).contains("control character")
            && !String::from_utf8_lossy(&o.stdout).contains("\n::warning"),
        "{}",
        text(&o)
    );

    // Truncated JSON: the error says how to recover.
    std::fs::write(d.join("remat-baseline.json"), &good[..good.len() / 2]).unwrap();
    let o = remat(d, &["gate"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    let t = text(&o);
    assert!(
        t.contains("remat-baseline.json")
            && t.contains("version control")
            && t.contains("remat gate --update"),
        "{t}"
    );
    std::fs::write(d.join("remat-baseline.json"), &good).unwrap();

    // A config with an unknown field, a wrongly typed field, a missing field.
    for (config, field) in [
        (
            "[[model]]\nname = \"m\"\npath = \"x.onnx\"\nbudget = \"1GiB\"\nbudjet = 3\n",
            "budjet",
        ),
        (
            "[[model]]\nname = \"m\"\npath = \"x.onnx\"\nbudget = \"1GiB\"\ntolerance = \"high\"\n",
            "tolerance",
        ),
        ("[[model]]\nname = \"m\"\npath = \"x.onnx\"\n", "budget"),
        (
            "[[model]]\nname = \"m\"\npath = \"x.onnx\"\nbudget = \"1GiB\"\nmax_overhead = -1.0\n",
            "max_overhead",
        ),
        // No bytes: planned_overhead would be "infeasible before and after" and gate nothing.
        (
            "[[model]]\nname = \"m\"\npath = \"x.onnx\"\nbudget = 0\n",
            "no bytes, which no plan fits",
        ),
        (
            "[[model]]\nname = \"m\"\npath = \"x.onnx\"\nbudget = \"0x\"\n",
            "no bytes, which no plan fits",
        ),
    ] {
        std::fs::write(d.join("remat.toml"), config).unwrap();
        let o = remat(d, &["gate"]);
        assert_eq!(o.status.code(), Some(2), "{config}: {}", text(&o));
        let t = text(&o);
        assert!(
            t.contains("remat.toml") && t.contains(field),
            "{config}: {t}"
        );
    }

    // A model file that does not exist: exit 2 naming the model.
    std::fs::write(
        d.join("remat.toml"),
        "[[model]]\nname = \"ghost\"\npath = \"missing.onnx\"\nbudget = \"1GiB\"\n",
    )
    .unwrap();
    let o = remat(d, &["gate"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(text(&o).contains("ghost") && text(&o).contains("missing.onnx"));
}

/// The torch fixture's manifest case `plan` of model `name`: its predicted peak.
fn torch_manifest_peak(name: &str, plan: &str) -> u64 {
    let path = crate::common::manifest_dir().join("../fixtures/torch/manifest.json");
    let m: serde_json::Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    let model = m["models"]
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["name"] == name)
        .unwrap();
    let case = model["cases"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["plan"] == plan)
        .unwrap();
    case["predicted_peak_bytes"].as_u64().unwrap()
}

#[test]
fn a_captured_pytorch_graph_is_gated_in_the_torch_sac_model() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let source = crate::common::manifest_dir().join("../fixtures/torch/stack.torch.json");
    let graph: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&source).unwrap()).unwrap();
    std::fs::write(d.join("stack.torch.json"), graph.to_string()).unwrap();
    let config = "[[model]]\nname = \"stack\"\npath = \"stack.torch.json\"\nbudget = \"0.7x\"\nmax_overhead = 0.3\n";
    std::fs::write(d.join("remat.toml"), config).unwrap();

    let o = remat(d, &["gate", "--update"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let baseline: serde_json::Value =
        serde_json::from_slice(&std::fs::read(d.join("remat-baseline.json")).unwrap()).unwrap();
    let f = &baseline["models"]["stack"];
    let figure = |k: &str| f[k].as_u64().unwrap_or_else(|| panic!("{k}: {f}"));
    // The unplanned step's peak and full checkpointing's, as the fixture's manifest has them
    // (PyTorch measured the first equal to it).
    assert_eq!(
        figure("store_all_peak_bytes"),
        torch_manifest_peak("stack", "none")
    );
    assert_eq!(
        figure("min_feasible_budget_bytes"),
        torch_manifest_peak("stack", "full")
    );
    let (store_all, least) = (
        figure("store_all_peak_bytes"),
        figure("min_feasible_budget_bytes"),
    );
    let within = figure("best_peak_within_overhead_bytes");
    assert!(least <= within && within < store_all, "{f}");
    assert!(figure("saved_activation_bytes") > 0, "{f}");
    let expected = 0.7 * store_all as f64;
    assert!(
        (figure("budget_bytes") as f64 - expected).abs() <= 1.0,
        "0.7x of {store_all}: {f}"
    );
    assert_eq!(f["planned_solver"], "torch-sac", "{f}");
    assert_eq!(f["planned_status"], "fits", "{f}");
    let overhead = f["planned_overhead"].as_f64().unwrap();
    assert!(overhead > 0.0 && overhead <= 0.3, "{f}");

    for _ in 0..2 {
        let o = remat(d, &["gate"]);
        assert_eq!(o.status.code(), Some(0), "{}", text(&o));
        assert!(text(&o).contains("no regression"), "{}", text(&o));
    }

    // The model's activations double (a wider layer, say): the byte figures regress.
    let mut grown = graph.clone();
    for s in grown["storages"].as_array_mut().unwrap() {
        s["bytes"] = (s["bytes"].as_u64().unwrap() * 2).into();
    }
    std::fs::write(d.join("stack.torch.json"), grown.to_string()).unwrap();
    let (_, regressed) = gate_regressions(d);
    for figure in [
        "store_all_peak_bytes",
        "saved_activation_bytes",
        "min_feasible_budget_bytes",
    ] {
        assert!(
            regressed.iter().any(|f| f == figure),
            "{figure}: {regressed:?}"
        );
    }

    // Options of the free model do not apply: exit 2 naming the field.
    for (extra, field) in [
        ("dims = { batch = 2 }\n", "dims"),
        ("solver = \"milp\"\n", "solver"),
        ("time_limit = 5.0\n", "time_limit"),
    ] {
        std::fs::write(d.join("remat.toml"), format!("{config}{extra}")).unwrap();
        let o = remat(d, &["gate"]);
        assert_eq!(o.status.code(), Some(2), "{extra}: {}", text(&o));
        let t = text(&o);
        assert!(t.contains(field) && t.contains("stack"), "{extra}: {t}");
    }
}

/// A gate that compares no figure of any configured model fails (exit 2, saying so and how to
/// record them), whether the baseline has other models or none; a model merely new beside
/// compared ones is a warning. `GITHUB_STEP_SUMMARY` set but empty is unset, and a budget
/// given as a TOML integer is bytes.
#[test]
fn a_gate_that_compares_nothing_fails() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let path = fixtures().join("mlp_v1.onnx").display().to_string();
    let model = |name: &str, budget: &str| {
        format!("[[model]]\nname = {name:?}\npath = {path:?}\nbudget = {budget}\ndims = {{ batch = 32 }}\n")
    };
    std::fs::write(d.join("remat.toml"), model("mlp", "163840")).unwrap();
    let o = remat(d, &["gate", "--update"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let baseline: serde_json::Value =
        serde_json::from_slice(&std::fs::read(d.join("remat-baseline.json")).unwrap()).unwrap();
    assert_eq!(baseline["models"]["mlp"]["budget_bytes"], 163840);

    // Set but empty: no summary to write, and the gate passes.
    let o = Command::new(env!("CARGO_BIN_EXE_remat"))
        .current_dir(d)
        .args(["gate", "--format", "github"])
        .env("GITHUB_STEP_SUMMARY", "")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));

    // A model new beside a compared one: a warning, and the gate passes.
    let two = format!("{}{}", model("mlp", "163840"), model("mlp2", "\"160KiB\""));
    std::fs::write(d.join("remat.toml"), &two).unwrap();
    let o = remat(d, &["gate", "--format", "github"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let t = text(&o);
    assert!(t.contains("::warning") && t.contains("mlp2"), "{t}");
    assert!(t.contains("no regression"), "{t}");

    // The model renamed, or an empty baseline: nothing compared, exit 2.
    for (config, baseline) in [
        (model("renamed", "163840"), None),
        (two, Some(r#"{"version": 1, "models": {}}"#)),
    ] {
        std::fs::write(d.join("remat.toml"), &config).unwrap();
        if let Some(b) = baseline {
            std::fs::write(d.join("remat-baseline.json"), b).unwrap();
        }
        for format in ["text", "github", "markdown"] {
            let o = remat(d, &["gate", "--format", format]);
            let t = text(&o);
            assert_eq!(o.status.code(), Some(2), "{format}: {t}");
            assert!(
                t.contains("nothing compared") && t.contains("--update"),
                "{format}: {t}"
            );
            assert!(!t.contains("no regression"), "{format}: {t}");
        }
    }

    // A budget of the wrong type is named.
    std::fs::write(d.join("remat.toml"), model("mlp", "[1]")).unwrap();
    let o = remat(d, &["gate"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o).contains("budget") && text(&o).contains("whole number of bytes"),
        "{}",
        text(&o)
    );
}

/// `saved_activation_bytes` is one figure: the gate records what `remat inspect` reports, on
/// models with dropout masks (counted once) and constants read by a backward.
#[test]
fn the_gate_saves_the_bytes_inspect_reports() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let root = crate::common::manifest_dir().join("..");
    let models = [
        (
            "bert_tiny",
            "fixtures/grad/bert_tiny.onnx",
            "{ batch = 2, seq = 8 }",
        ),
        (
            "vgg11",
            "fixtures/models/vgg11.legacy.onnx",
            "{ batch = 1 }",
        ),
    ];
    let config: String = models
        .iter()
        .map(|(name, path, dims)| {
            format!(
                "[[model]]\nname = {name:?}\npath = {:?}\nbudget = \"0.9x\"\ndims = {dims}\ntime_limit = 1\n",
                root.join(path).display().to_string()
            )
        })
        .collect();
    std::fs::write(d.join("remat.toml"), config).unwrap();
    let o = remat(d, &["gate", "--update"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let baseline: serde_json::Value =
        serde_json::from_slice(&std::fs::read(d.join("remat-baseline.json")).unwrap()).unwrap();
    for (name, path, dims) in models {
        let mut args = vec![
            "inspect".to_string(),
            root.join(path).display().to_string(),
            "--json".to_string(),
        ];
        for binding in dims.trim_matches(['{', '}', ' ']).split(", ") {
            args.extend(["--dim".to_string(), binding.replace(" = ", "=")]);
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let o = remat(d, &args);
        assert_eq!(o.status.code(), Some(0), "{}", text(&o));
        let inspect: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        assert!(inspect["saved_activation_bytes"].as_u64().unwrap() > 0);
        assert_eq!(
            baseline["models"][name]["saved_activation_bytes"], inspect["saved_activation_bytes"],
            "{name}"
        );
    }
}

/// A model's config table at `path` (relative to the fixtures) with `extra` lines.
fn model_table(name: &str, model: &str, extra: &str) -> String {
    format!(
        "[[model]]\nname = {name:?}\npath = {:?}\nbudget = \"160KiB\"\n{extra}",
        fixtures().join(model).display().to_string()
    )
}

/// The files of `dir`, by name.
fn files_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// `remat gate --update` under a 1 KiB file size limit, with SIGXFSZ ignored (`ignore`: the
/// write fails with EFBIG) or not (the process is killed mid-write).
fn update_under_size_limit(dir: &Path, ignore: bool) -> Output {
    let script = format!(
        "{}ulimit -f 1; exec \"$0\" gate --update",
        if ignore { "trap '' XFSZ; " } else { "" }
    );
    Command::new("bash")
        .current_dir(dir)
        .args(["-c", &script, env!("CARGO_BIN_EXE_remat")])
        .env_remove("GITHUB_STEP_SUMMARY")
        .output()
        .expect("run bash")
}

/// `--update` writes a temporary file and renames it over the baseline: a write that fails
/// (here past a file size limit) exits 2 naming the baseline, removes the temporary file and
/// leaves the old baseline whole; a process killed mid-write leaves it whole too.
#[test]
fn update_never_leaves_a_half_written_baseline() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let config: String = ["a", "b", "c", "d"]
        .iter()
        .map(|name| model_table(name, "mlp_v1.onnx", "dims = { batch = 32 }\n"))
        .collect();
    std::fs::write(d.join("remat.toml"), config).unwrap();
    let o = remat(d, &["gate", "--update"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let good = std::fs::read(d.join("remat-baseline.json")).unwrap();
    // Past the 1 KiB limit below.
    assert!(good.len() > 1024, "{} bytes", good.len());

    // Killed mid-write (SIGXFSZ): the baseline is whole, the temporary file left beside it.
    let o = update_under_size_limit(d, false);
    assert_ne!(o.status.code(), Some(0), "{}", text(&o));
    let now = std::fs::read(d.join("remat-baseline.json")).unwrap();
    assert!(now == good, "{} of {} bytes left", now.len(), good.len());
    for name in files_in(d) {
        if name.ends_with(".tmp") {
            std::fs::remove_file(d.join(name)).unwrap();
        }
    }

    // The write fails (EFBIG): exit 2 naming the baseline, and nothing left behind.
    let o = update_under_size_limit(d, true);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    let now = std::fs::read(d.join("remat-baseline.json")).unwrap();
    assert!(now == good, "{} of {} bytes left", now.len(), good.len());
    assert_eq!(files_in(d), ["remat-baseline.json", "remat.toml"]);
    assert!(
        text(&o).contains("remat-baseline.json") && text(&o).contains("left as it was"),
        "{}",
        text(&o)
    );

    // A baseline that is a symbolic link stays one.
    #[cfg(unix)]
    {
        std::fs::rename(d.join("remat-baseline.json"), d.join("real.json")).unwrap();
        std::os::unix::fs::symlink("real.json", d.join("remat-baseline.json")).unwrap();
        let o = remat(d, &["gate", "--update"]);
        assert_eq!(o.status.code(), Some(0), "{}", text(&o));
        let link = std::fs::symlink_metadata(d.join("remat-baseline.json")).unwrap();
        assert!(link.file_type().is_symlink());
        assert_eq!(std::fs::read(d.join("real.json")).unwrap(), good);
    }
}

/// `remat gate --update` replaces a baseline it cannot parse, with a warning naming the file
/// and what was wrong; the comparison then has no previous baseline.
#[test]
fn update_replaces_a_baseline_it_cannot_parse() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    write_config(d, "mlp_v1.onnx");
    for corrupt in [
        "{\"version\": 1, \"models\": {\"mlp\": {\"store_all_",
        "{\"version\": 7, \"models\": {}}",
        "  \n",
    ] {
        std::fs::write(d.join("remat-baseline.json"), corrupt).unwrap();
        let o = remat(d, &["gate", "--update"]);
        assert_eq!(o.status.code(), Some(0), "{corrupt}: {}", text(&o));
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            err.contains("warning: ") && err.contains("remat-baseline.json"),
            "{corrupt}: {err}"
        );
        let baseline: serde_json::Value =
            serde_json::from_slice(&std::fs::read(d.join("remat-baseline.json")).unwrap()).unwrap();
        assert!(baseline["models"]["mlp"].is_object(), "{baseline}");
        let o = remat(d, &["gate"]);
        assert_eq!(o.status.code(), Some(0), "{corrupt}: {}", text(&o));
    }
    // A file that is no JSON at all is no baseline, half written or not: a mistyped
    // --baseline naming the config (or a model) is refused, not replaced.
    for other in ["remat.toml", "mlp.onnx"] {
        let before = std::fs::read(d.join("remat.toml")).unwrap();
        if other == "mlp.onnx" {
            std::fs::copy(fixtures().join("mlp_v1.onnx"), d.join(other)).unwrap();
        }
        let kept = std::fs::read(d.join(other)).unwrap();
        let o = remat(d, &["gate", "--update", "--baseline", other]);
        assert_eq!(o.status.code(), Some(2), "{other}: {}", text(&o));
        assert_eq!(
            std::fs::read(d.join(other)).unwrap(),
            kept,
            "{other} was overwritten"
        );
        assert_eq!(std::fs::read(d.join("remat.toml")).unwrap(), before);
    }
}

/// Run `remat` with `args` in `dir`, killed after 60 s (a read that never ends).
fn remat_with_timeout(dir: &Path, args: &[&str]) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_remat"))
        .current_dir(dir)
        .args(args)
        .env_remove("GITHUB_STEP_SUMMARY")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run remat");
    let start = std::time::Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > std::time::Duration::from_secs(60) {
            let _ = child.kill();
            let o = child.wait_with_output().unwrap();
            panic!("remat {args:?} still running after 60 s: {}", text(&o));
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    child.wait_with_output().unwrap()
}

/// The config and the baseline must be regular files of at most 64 MiB: a FIFO, a device or an
/// oversized file is refused (exit 2, naming the file and why), with or without --update, and
/// the file is left as it was.
#[test]
fn gate_files_must_be_regular_and_at_most_64_mib() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    write_config(d, "mlp_v1.onnx");
    let o = Command::new("mkfifo").arg(d.join("fifo")).output().unwrap();
    assert!(o.status.success(), "{}", text(&o));
    for (args, file) in [
        (vec!["gate", "--baseline", "fifo"], "fifo"),
        (vec!["gate", "--update", "--baseline", "fifo"], "fifo"),
        (
            vec!["gate", "--update", "--baseline", "/dev/null"],
            "/dev/null",
        ),
        (vec!["gate", "--config", "fifo"], "fifo"),
        (vec!["gate", "--update", "--baseline", "."], "."),
    ] {
        let o = remat_with_timeout(d, &args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", text(&o));
        let t = text(&o);
        assert!(
            t.contains(&format!("{file}: cannot read:"))
                && (t.contains("not a regular file") || t.contains("a folder")),
            "{args:?}: {t}"
        );
    }

    // Past the limit (a sparse file: nothing is written to disk).
    let big = 64 * 1024 * 1024 + 1;
    std::fs::File::create(d.join("big"))
        .unwrap()
        .set_len(big)
        .unwrap();
    for args in [
        vec!["gate", "--baseline", "big"],
        vec!["gate", "--update", "--baseline", "big"],
        vec!["gate", "--config", "big"],
    ] {
        let o = remat_with_timeout(d, &args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", text(&o));
        let t = text(&o);
        assert!(
            t.contains("big: cannot read: larger than") && t.contains("64 MiB"),
            "{args:?}: {t}"
        );
        assert_eq!(std::fs::metadata(d.join("big")).unwrap().len(), big);
    }
}

/// `--format` applies to `--update`: JSON for a parser (the figures written and the comparison
/// with the baseline they replaced), Markdown, and GitHub's step summary.
#[test]
fn update_honours_the_format() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    write_config(d, "mlp_v1.onnx");
    let json = |o: &Output| -> serde_json::Value {
        serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(o)))
    };
    let o = remat(d, &["gate", "--update", "--format", "json"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let report = json(&o);
    assert_eq!(report["written"], "remat-baseline.json", "{report}");
    assert!(report["previous"].is_null(), "{report}");
    let baseline: serde_json::Value =
        serde_json::from_slice(&std::fs::read(d.join("remat-baseline.json")).unwrap()).unwrap();
    assert_eq!(report["figures"], baseline["models"], "{report}");

    let o = remat(d, &["gate", "--update", "--format", "json"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let report = json(&o);
    assert_eq!(report["previous"]["verdict"], "no regression", "{report}");
    assert_eq!(report["previous"]["rows"].as_array().unwrap().len(), 5);

    let o = remat(d, &["gate", "--update", "--format", "markdown"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let md = String::from_utf8_lossy(&o.stdout);
    assert!(
        md.contains("### remat gate: baseline updated")
            && md.contains("| mlp | store_all_peak_bytes |")
            && md.contains("Against the previous baseline: no regression"),
        "{md}"
    );

    let summary = d.join("summary.md");
    let o = Command::new(env!("CARGO_BIN_EXE_remat"))
        .current_dir(d)
        .args(["gate", "--update", "--format", "github"])
        .env("GITHUB_STEP_SUMMARY", &summary)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let md = std::fs::read_to_string(&summary).unwrap();
    assert!(md.contains("### remat gate: baseline updated"), "{md}");
}

/// The baseline records what a model was planned with: a change of its dims is said in every
/// row (the figures moved because of the config, not the model); a baseline written before
/// the record still reads, and says nothing of it.
/// `freeze` in a model's table freezes the weights it names (a glob pattern here): the model
/// holds no gradient for them, so its peaks fall, and the rows say the config changed; a
/// pattern that matches nothing is exit 2 naming it.
#[test]
fn frozen_weights_in_the_config_lower_the_figures_and_are_said() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let config = |freeze: &str| {
        model_table(
            "mlp",
            "mlp_v1.onnx",
            &format!("dims = {{ batch = 32 }}\n{freeze}"),
        )
    };
    std::fs::write(d.join("remat.toml"), config("")).unwrap();
    let o = remat(d, &["gate", "--update"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    std::fs::write(d.join("remat.toml"), config("freeze = [\"?0\"]\n")).unwrap();
    let o = remat(d, &["gate", "--format", "json"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let outcome: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let rows = outcome["rows"].as_array().unwrap();
    let store_all = rows
        .iter()
        .find(|r| r["figure"] == "store_all_peak_bytes")
        .expect("a store-all row");
    // w0 (32·64) and b0 (64) lose their gradients; x is no longer saved for w0's.
    assert!(
        store_all["new"].as_f64().unwrap() < store_all["old"].as_f64().unwrap(),
        "{store_all}"
    );
    for r in rows {
        assert!(
            r["note"]
                .as_str()
                .unwrap()
                .contains("freeze changed: [] → [\"?0\"]"),
            "{r}"
        );
    }
    std::fs::write(d.join("remat.toml"), config("freeze = [\"fc0.*\"]\n")).unwrap();
    let o = remat(d, &["gate"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o)
            .contains("--freeze \"fc0.*\" matches no floating-point graph input or initializer"),
        "{}",
        text(&o)
    );
}

#[test]
fn a_change_of_dims_is_said_in_the_rows() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let config = |batch: u64| {
        model_table(
            "mlp",
            "mlp_v1.onnx",
            &format!("dims = {{ batch = {batch} }}\n"),
        )
    };
    std::fs::write(d.join("remat.toml"), config(32)).unwrap();
    let o = remat(d, &["gate", "--update"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let baseline: serde_json::Value =
        serde_json::from_slice(&std::fs::read(d.join("remat-baseline.json")).unwrap()).unwrap();
    let with = &baseline["models"]["mlp"]["planned_with"];
    assert_eq!(with["dims"]["batch"], 32, "{baseline}");
    assert_eq!(with["solver"], "auto", "{baseline}");

    std::fs::write(d.join("remat.toml"), config(64)).unwrap();
    let (outcome, regressed) = gate_regressions(d);
    assert!(!regressed.is_empty(), "{outcome}");
    for r in outcome["rows"].as_array().unwrap() {
        assert!(
            r["note"]
                .as_str()
                .unwrap()
                .contains("dims changed: batch 32 → 64"),
            "{r}"
        );
    }
    let o = remat(d, &["gate"]);
    assert!(
        text(&o).contains("dims changed: batch 32 → 64"),
        "{}",
        text(&o)
    );

    // A baseline without the record (written before it was kept): it reads, and the same
    // config passes with nothing said.
    std::fs::write(d.join("remat.toml"), config(32)).unwrap();
    let mut old = baseline.clone();
    old["models"]["mlp"]
        .as_object_mut()
        .unwrap()
        .remove("planned_with");
    std::fs::write(d.join("remat-baseline.json"), old.to_string()).unwrap();
    let o = remat(d, &["gate", "--format", "json"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let outcome: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(
        outcome["rows"]
            .as_array()
            .unwrap()
            .iter()
            .all(|r| !r["note"].as_str().unwrap().contains("changed")),
        "{outcome}"
    );
}

/// A model named `a|b` keeps to its cell of the Markdown table (the `|` ended the cell), and a
/// new baseline gets the permissions any new file gets (tempfile's 0600 kept it from the user
/// or job that commits it).
#[test]
fn a_pipe_in_a_name_stays_in_its_cell_and_a_new_baseline_is_readable() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(
        d.join("remat.toml"),
        format!(
            "[[model]]\nname = \"a|b\"\npath = {:?}\nbudget = \"160KiB\"\ndims = {{ batch = 32 }}\n",
            fixtures().join("mlp_v1.onnx").display().to_string()
        ),
    )
    .unwrap();
    let o = Command::new("sh")
        .current_dir(d)
        .args([
            "-c",
            "umask 022 && exec \"$0\" gate --update --format markdown",
            env!("CARGO_BIN_EXE_remat"),
        ])
        .env_remove("GITHUB_STEP_SUMMARY")
        .output()
        .expect("run remat");
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let md = String::from_utf8_lossy(&o.stdout);
    assert!(md.contains("| a\\|b | store_all_peak_bytes |"), "{md}");
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(d.join("remat-baseline.json"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o644, "{mode:o}");
    let o = remat(d, &["gate", "--format", "markdown"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(String::from_utf8_lossy(&o.stdout).contains("| a\\|b |"));
}
