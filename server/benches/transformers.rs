//! Deep transformers (issue 19): `cargo bench -p remat-server --bench transformers` plans every
//! model of `fixtures/deep/manifest.json` at the manifest's budgets (release build, the 2-core
//! machine's clock) and prints the tables of docs/bench/transformers.md: the plan's overhead
//! and solver, its wall time, the time-point bound and the gap to it, the best baseline and
//! the ratio to it, with the least ratio any schedule can reach (from the bound).
//!
//! `cargo bench -p remat-server --bench transformers -- NAME...` runs only the models named;
//! a `FILE.onnx` among them is planned as well, as a model of `fixtures/deep.py` (dims batch 2,
//! seq 64): `python fixtures/deep.py --only gpt2_384.legacy17 --out /tmp/deep`, then
//! `cargo bench -p remat-server --bench transformers -- /tmp/deep/gpt2_384.legacy17.onnx`.

#[path = "../tests/it/deep_eval.rs"]
mod deep_eval;

use deep_eval::{evaluate, manifest, problem};
use std::time::{Duration, Instant};

fn pct(x: f64) -> String {
    format!("{:+.2}%", x * 100.0)
}

fn main() {
    // RUST_LOG=remat_solver=debug prints each plan's phases and their times.
    remat_server::http::init_logging("warn");
    let only: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let mut m = manifest();
    for file in only.iter().filter(|a| a.ends_with(".onnx")) {
        let name = std::path::Path::new(file)
            .file_stem()
            .map_or_else(|| file.clone(), |s| s.to_string_lossy().into_owned());
        m.models.push(deep_eval::DeepModel {
            name,
            file: file.clone(),
            origin: "fixtures/deep.py, outside the suite".into(),
            dims: [("batch".to_string(), 2), ("seq".to_string(), 64)].into(),
            onnx_nodes: 0,
            training_nodes: 0,
        });
    }
    let limit = Duration::from_secs_f64(m.time_limit_seconds);
    println!("| model | ONNX nodes | training nodes | import s |");
    println!("|---|---|---|---|");
    let mut all = Vec::new();
    for model in &m.models {
        if !only.is_empty()
            && !only
                .iter()
                .any(|o| model.name.contains(o.as_str()) || model.file == *o)
        {
            continue;
        }
        let start = Instant::now();
        let (p, onnx_nodes) = problem(model);
        println!(
            "| {} | {onnx_nodes} | {} | {:.1} |",
            model.name,
            p.len(),
            start.elapsed().as_secs_f64()
        );
        all.push(evaluate(&model.name, &p, &m.budgets, limit));
    }
    println!();
    println!(
        "| model | budget | bytes | remat | solver | s | bound | bound s | gap | best baseline | ratio | least ratio |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|");
    for r in all.iter().flatten() {
        let opt = |x: Option<String>| x.unwrap_or_else(|| "—".into());
        println!(
            "| {} | {} | {} | {} | {}{} | {:.1} | {} | {:.2} | {} | {} | {} | {} |",
            r.model,
            r.fraction,
            r.budget,
            pct(r.report.predicted.overhead),
            r.report.solver,
            if r.report.reused_from_budget_bytes.is_some() {
                " (from below)"
            } else {
                ""
            },
            r.seconds,
            opt(r.bound_overhead().map(pct)),
            r.bound_seconds,
            opt(r.gap().map(|g| format!("{:.3}%", g * 100.0))),
            opt(r
                .best_baseline
                .as_ref()
                .map(|(n, o)| format!("{n} {}", pct(*o)))),
            opt(r.ratio().map(|x| format!("{x:.2}"))),
            opt(r.ratio_floor().map(|x| format!("{x:.2}"))),
        );
    }
}
