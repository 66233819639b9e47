//! One store-all training step of resnet18 (batch 8, 224×224, CPU) on remat's executor against
//! PyTorch's on the same machine with the same thread count, in one run; plus where remat's
//! time goes, per op type, forward and backward.
//!
//! `cargo bench -p remat-planner --bench executor` (release profile). Needs `python3` with
//! `torch` and `torchvision` for the PyTorch side; without them only remat's figures print.
//! Env: `REMAT_BENCH_BATCH` (8), `REMAT_BENCH_ITERS` (3), `REMAT_BENCH_NODES` (0: how many of
//! the slowest nodes to list with their FLOP rates).

use remat_planner::exec::run::{ExecDevice, Executor};
use remat_planner::{load, ImportOptions};
use remat_solver::store_all;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn main() {
    let batch: u64 = std::env::var("REMAT_BENCH_BATCH")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(8);
    let iters: usize = std::env::var("REMAT_BENCH_ITERS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3);
    let threads = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let path = root.join("../fixtures/models/resnet18.legacy.onnx");
    let bytes = std::fs::read(&path).expect("resnet18 fixture");
    let mut opts = ImportOptions::default();
    opts.dims.insert("batch".into(), batch);
    let model = load(&bytes, &opts).expect("imports");
    let tg = model.training_graph().expect("training graph");
    let sched = store_all(&tg.to_problem());
    let mut ex = Executor::new(&model, &tg, &bytes, ExecDevice::Cpu, 0).expect("executor");

    // remat: one warm-up step, then `iters` timed steps.
    let mut remat = vec![];
    let mut last = None;
    for i in 0..=iters {
        let r = ex.run(&sched, &mut |_, _| {}).expect("step runs");
        if i > 0 {
            remat.push(r.seconds);
        }
        last = Some(r);
    }
    let last = last.expect("ran");

    // PyTorch, same machine, same threads, right after.
    let torch = Command::new("python3")
        .arg(root.join("benches/torch_step.py"))
        .args([
            "--batch",
            &batch.to_string(),
            "--threads",
            &threads.to_string(),
            "--iters",
            &iters.to_string(),
        ])
        .output();
    let torch: Option<(String, f64)> = match torch {
        Ok(o) if o.status.success() => {
            let v: serde_json::Value =
                serde_json::from_slice(&o.stdout).expect("torch_step.py prints JSON");
            let secs: Vec<f64> = v["seconds"]
                .as_array()
                .expect("seconds")
                .iter()
                .filter_map(|x| x.as_f64())
                .collect();
            Some((v["torch"].as_str().unwrap_or("?").to_string(), median(secs)))
        }
        Ok(o) => {
            eprintln!(
                "PyTorch side failed: {}",
                String::from_utf8_lossy(&o.stderr)
            );
            None
        }
        Err(e) => {
            eprintln!("PyTorch side not run: {e}");
            None
        }
    };

    let rm = median(remat.clone());
    println!("## resnet18 training step, batch {batch}, 224×224, CPU, {threads} thread(s)\n");
    println!("| | median step (s) | steps (s) |");
    println!("|---|---|---|");
    println!(
        "| remat executor (candle-core) | {rm:.3} | {} |",
        remat
            .iter()
            .map(|s| format!("{s:.3}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    if let Some((ver, t)) = &torch {
        println!("| PyTorch {ver} | {t:.3} | |");
        println!(
            "\nratio remat / PyTorch: **{:.2}×** (goal ≤ 1.5×)\n",
            rm / t
        );
    }
    // Where the time goes: by op type, forward and backward, in the last step.
    let mut by: BTreeMap<(String, String), f64> = BTreeMap::new();
    for (i, n) in tg.nodes.iter().enumerate() {
        let kind = format!("{:?}", n.kind).to_lowercase();
        *by.entry((n.op.clone(), kind)).or_default() += last.node_seconds[i];
    }
    let mut rows: Vec<_> = by.into_iter().collect();
    rows.sort_by(|a, b| b.1.total_cmp(&a.1));
    println!("| op | pass | seconds | share |");
    println!("|---|---|---|---|");
    for ((op, kind), s) in rows.iter().take(12) {
        println!(
            "| {op} | {kind} | {s:.3} | {:.1}% |",
            100.0 * s / last.seconds
        );
    }
    // Optional: the slowest nodes with their FLOP rates (`REMAT_BENCH_NODES=N`).
    let top: usize = std::env::var("REMAT_BENCH_NODES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    if top > 0 {
        let mut nodes: Vec<usize> = (0..tg.nodes.len()).collect();
        nodes.sort_by(|&a, &b| last.node_seconds[b].total_cmp(&last.node_seconds[a]));
        println!("\n| node | op | pass | seconds | GFLOP/s |");
        println!("|---|---|---|---|---|");
        for &i in nodes.iter().take(top) {
            let n = &tg.nodes[i];
            let s = last.node_seconds[i];
            println!(
                "| {} | {} | {:?} | {s:.4} | {:.1} |",
                n.name,
                n.op,
                n.kind,
                n.cost / s.max(1e-12) / 1e9
            );
        }
    }
    println!(
        "\nmeasured live-tensor peak {} B, heap peak {} B (parameters, gradients and buffers included in both)",
        last.live_peak_bytes,
        last.heap_peak_bytes
            .map(|h| (h + ex.fixed_live_bytes()).to_string())
            .unwrap_or("not measured".into())
    );
}

#[global_allocator]
static ALLOC: remat_planner::exec::alloc::Counting = remat_planner::exec::alloc::Counting;
