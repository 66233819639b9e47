//! One store-all training step of resnet18 (batch 8, 224×224, CPU) on remat's executor against
//! PyTorch's on the same machine with the same thread count, in one run; plus where remat's
//! time goes, per op type, forward and backward.
//!
//! `cargo bench -p remat-planner --bench executor` (release profile). Needs `python3` with
//! `torch` and `torchvision` for the PyTorch side; without them only remat's figures print.
//! Env: `REMAT_BENCH_BATCH` (8), `REMAT_BENCH_ROUNDS` (3), `REMAT_BENCH_ITERS` (5 per side and
//! round), `REMAT_BENCH_NODES` (0: how many of the slowest nodes to list with their FLOP rates).

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

/// One PyTorch round: its version and the timed steps.
fn torch_round(
    root: &std::path::Path,
    batch: u64,
    threads: usize,
    iters: usize,
) -> Result<(String, Vec<f64>), String> {
    let o = Command::new("python3")
        .arg(root.join("benches/torch_step.py"))
        .args([
            "--batch",
            &batch.to_string(),
            "--threads",
            &threads.to_string(),
            "--iters",
            &iters.to_string(),
        ])
        .output()
        .map_err(|e| e.to_string())?;
    if !o.status.success() {
        return Err(String::from_utf8_lossy(&o.stderr).into_owned());
    }
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).map_err(|e| e.to_string())?;
    let secs = v["seconds"]
        .as_array()
        .ok_or("torch_step.py printed no seconds")?
        .iter()
        .filter_map(|x| x.as_f64())
        .collect();
    Ok((v["torch"].as_str().unwrap_or("?").to_string(), secs))
}

fn main() {
    let batch: u64 = std::env::var("REMAT_BENCH_BATCH")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(8);
    let iters: usize = std::env::var("REMAT_BENCH_ITERS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(5);
    let rounds: usize = std::env::var("REMAT_BENCH_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3)
        .max(1);
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

    // Rounds, interleaved so that both sides see the same load: remat runs `iters` timed
    // steps (after one warm-up step in the first round), then PyTorch its own (a fresh process
    // each round, one warm-up step each).
    let mut remat = vec![];
    let mut torch_steps = vec![];
    let mut torch_ver = None;
    let mut last = None;
    for round in 0..rounds {
        for i in 0..iters + usize::from(round == 0) {
            let r = ex.run(&sched, &mut |_, _| {}).expect("step runs");
            if round > 0 || i > 0 {
                remat.push(r.seconds);
            }
            last = Some(r);
        }
        match torch_round(&root, batch, threads, iters) {
            Ok((ver, secs)) => {
                torch_ver = Some(ver);
                torch_steps.extend(secs);
            }
            Err(e) => {
                eprintln!("PyTorch side not run: {e}");
                break;
            }
        }
    }
    let last = last.expect("ran");

    let list = |v: &[f64]| {
        v.iter()
            .map(|s| format!("{s:.3}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let min = |v: &[f64]| v.iter().copied().fold(f64::INFINITY, f64::min);
    let rm = median(remat.clone());
    println!("## resnet18 training step, batch {batch}, 224×224, CPU, {threads} thread(s)\n");
    println!(
        "{rounds} interleaved round(s) of {iters} step(s) per side (remat, then PyTorch, each round).\n"
    );
    println!("| | median step (s) | fastest step (s) | steps (s), in order |");
    println!("|---|---|---|---|");
    println!(
        "| remat executor (candle-core) | {rm:.3} | {:.3} | {} |",
        min(&remat),
        list(&remat)
    );
    if let Some(ver) = &torch_ver {
        let t = median(torch_steps.clone());
        println!(
            "| PyTorch {ver} | {t:.3} | {:.3} | {} |",
            min(&torch_steps),
            list(&torch_steps)
        );
        println!(
            "\nratio remat / PyTorch: **{:.2}×** of the medians, {:.2}× of the fastest steps (goal ≤ 1.5×)\n",
            rm / t,
            min(&remat) / min(&torch_steps)
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
