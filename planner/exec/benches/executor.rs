//! One store-all training step of resnet18 (batch 8, 224×224, CPU) on remat's executor against
//! PyTorch's on the same machine with the same thread count, in one run; plus where remat's
//! time goes, per op type, forward and backward.
//!
//! `cargo bench -p remat-exec --bench executor` (release profile). Needs `python3` with
//! `torch` and `torchvision` for the PyTorch side; without them only remat's figures print.
//! The two sides alternate step by step: one PyTorch process stays up and runs a step whenever
//! the bench asks, so each pair of steps (one per side, the order alternating between pairs)
//! sees the same machine; the headline is the median of the pairs' ratios, which the machine's
//! drift (tens of percent within minutes) moves far less than a ratio of separate runs.
//! Env: `REMAT_BENCH_BATCH` (8), `REMAT_BENCH_PAIRS` (15), `REMAT_BENCH_NODES` (0: how many of
//! the slowest nodes to list with their FLOP rates), `REMAT_BENCH_DEVICE` (`cpu`; `cuda` in a
//! build with the `cuda` feature: both sides on the GPU, PyTorch synchronized at the step's end,
//! remat's executor after every step of its schedule, as in a validation run).

use remat_exec::{ExecDevice, Executor};
use remat_planner::{load, ImportOptions};
use remat_solver::store_all;
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::Duration;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// The `q` quantile (nearest rank) of `v`.
fn quantile(mut v: Vec<f64>, q: f64) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[((v.len() - 1) as f64 * q).round() as usize]
}

/// A PyTorch process that runs one timed training step per request (`benches/torch_step.py`).
struct Torch {
    child: Child,
    stdin: ChildStdin,
    out: BufReader<ChildStdout>,
    version: String,
}

impl Torch {
    fn start(
        root: &std::path::Path,
        batch: u64,
        threads: usize,
        device: &str,
    ) -> Result<Self, String> {
        let mut child = Command::new("python3")
            .arg(root.join("benches/torch_step.py"))
            .args([
                "--batch",
                &batch.to_string(),
                "--threads",
                &threads.to_string(),
                "--device",
                device,
            ])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| format!("python3: {e}"))?;
        let stdin = child.stdin.take().ok_or("no stdin")?;
        let out = BufReader::new(child.stdout.take().ok_or("no stdout")?);
        let mut t = Torch {
            child,
            stdin,
            out,
            version: String::new(),
        };
        let hello = t.line()?;
        t.version = hello["torch"].as_str().unwrap_or("?").to_string();
        Ok(t)
    }

    fn line(&mut self) -> Result<serde_json::Value, String> {
        let mut l = String::new();
        if self.out.read_line(&mut l).map_err(|e| e.to_string())? == 0 {
            return Err("torch_step.py ended (see its error above)".into());
        }
        serde_json::from_str(&l).map_err(|e| format!("torch_step.py printed {l:?}: {e}"))
    }

    fn step(&mut self) -> Result<f64, String> {
        writeln!(self.stdin, "step").map_err(|e| e.to_string())?;
        self.stdin.flush().map_err(|e| e.to_string())?;
        let v = self.line()?;
        v["seconds"]
            .as_f64()
            .ok_or_else(|| format!("torch_step.py answered {v}"))
    }
}

impl Drop for Torch {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn main() {
    // First, as the `remat` binary does: glibc fixes its arena count when a second thread allocates.
    remat_exec::alloc::reuse_freed_pages();
    let env = |k: &str, d: usize| -> usize {
        std::env::var(k)
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(d)
    };
    let batch = env("REMAT_BENCH_BATCH", 8) as u64;
    let pairs = env("REMAT_BENCH_PAIRS", 15).max(1);
    let threads = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    let root = PathBuf::from(
        std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or_else(|| env!("CARGO_MANIFEST_DIR").into()),
    );
    let path = root.join("../../fixtures/models/resnet18.legacy.onnx");
    let bytes = std::fs::read(&path).expect("resnet18 fixture");
    let mut opts = ImportOptions::default();
    opts.dims.insert("batch".into(), batch);
    let model = load(&bytes, &opts).expect("imports");
    let tg = model.training_graph().expect("training graph");
    let sched = store_all(&tg.to_problem());
    let device = match std::env::var("REMAT_BENCH_DEVICE").as_deref() {
        Ok("cuda") => ExecDevice::Cuda,
        Ok("cpu") | Err(_) => ExecDevice::Cpu,
        Ok(other) => panic!("REMAT_BENCH_DEVICE={other:?}: cpu or cuda"),
    };
    let mut ex = Executor::new(&model, &tg, &bytes, device, 0).expect("executor");

    // One warm-up step each, then pairs of steps: remat first in even pairs, PyTorch first in
    // odd ones, a pause before every step so that neither side's idle threads (spinning
    // OpenMP or rayon workers) overlap the other's step.
    let mut torch = match Torch::start(&root, batch, threads, device.name()) {
        Ok(t) => Some(t),
        Err(e) => {
            eprintln!("PyTorch side not run: {e}");
            None
        }
    };
    let pause = || std::thread::sleep(Duration::from_millis(300));
    let mut last = ex.run(&sched, &mut |_, _| {}).expect("step runs");
    let mut remat = vec![];
    let mut torch_steps = vec![];
    let mut node_steps: Vec<Vec<f64>> = vec![vec![]; tg.nodes.len()];
    for pair in 0..pairs {
        for side in 0..2 {
            pause();
            if (side == 0) == (pair % 2 == 0) {
                let r = ex.run(&sched, &mut |_, _| {}).expect("step runs");
                remat.push(r.seconds);
                for (i, s) in r.node_seconds.iter().enumerate() {
                    node_steps[i].push(*s);
                }
                last = r;
            } else if let Some(t) = torch.as_mut() {
                match t.step() {
                    Ok(s) => torch_steps.push(s),
                    Err(e) => {
                        eprintln!("PyTorch side stopped: {e}");
                        torch = None;
                        torch_steps.clear();
                    }
                }
            }
        }
    }
    let list = |v: &[f64]| {
        v.iter()
            .map(|s| format!("{s:.3}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let min = |v: &[f64]| v.iter().copied().fold(f64::INFINITY, f64::min);
    let rm = median(remat.clone());
    let on = match device {
        ExecDevice::Cpu => format!("CPU, {threads} thread(s)"),
        ExecDevice::Cuda => "CUDA GPU".to_string(),
    };
    println!("## resnet18 training step, batch {batch}, 224×224, {on}\n");
    println!(
        "{pairs} pairs of steps, one per side, alternating (remat first in odd-numbered pairs, \
         PyTorch first in even-numbered ones), 0.3 s apart, after one warm-up step each.\n"
    );
    println!("| | median step (s) | fastest step (s) | steps (s), in order |");
    println!("|---|---|---|---|");
    println!(
        "| remat executor (candle-core) | {rm:.3} | {:.3} | {} |",
        min(&remat),
        list(&remat)
    );
    if let (Some(t), false) = (&torch, torch_steps.is_empty()) {
        let tm = median(torch_steps.clone());
        println!(
            "| PyTorch {} | {tm:.3} | {:.3} | {} |",
            t.version,
            min(&torch_steps),
            list(&torch_steps)
        );
        let ratios: Vec<f64> = remat.iter().zip(&torch_steps).map(|(r, t)| r / t).collect();
        println!(
            "\nratio remat / PyTorch: **{:.2}×**, the median of the {} pairs' ratios \
             (quartiles {:.2}×–{:.2}×; pairs: {}); {:.2}× of the medians, {:.2}× of the fastest \
             steps (goal ≤ 1.5×)\n",
            median(ratios.clone()),
            ratios.len(),
            quantile(ratios.clone(), 0.25),
            quantile(ratios.clone(), 0.75),
            list(&ratios),
            rm / tm,
            min(&remat) / min(&torch_steps)
        );
    }
    // The nodes' times: each node's median over the timed steps.
    let node_seconds: Vec<f64> = node_steps.into_iter().map(median).collect();
    let step_seconds: f64 = node_seconds.iter().sum();
    // Where the time goes: by op type, forward and backward (shares of the nodes' medians' sum).
    let mut by: BTreeMap<(String, String), f64> = BTreeMap::new();
    for (i, n) in tg.nodes.iter().enumerate() {
        let kind = format!("{:?}", n.kind).to_lowercase();
        *by.entry((n.op.clone(), kind)).or_default() += node_seconds[i];
    }
    let mut rows: Vec<_> = by.into_iter().collect();
    rows.sort_by(|a, b| b.1.total_cmp(&a.1));
    println!("| op | pass | seconds | share |");
    println!("|---|---|---|---|");
    for ((op, kind), s) in rows.iter().take(12) {
        println!(
            "| {op} | {kind} | {s:.3} | {:.1}% |",
            100.0 * s / step_seconds
        );
    }
    // Optional: the slowest nodes with their FLOP rates (`REMAT_BENCH_NODES=N`).
    let top: usize = std::env::var("REMAT_BENCH_NODES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    if top > 0 {
        let mut nodes: Vec<usize> = (0..tg.nodes.len()).collect();
        nodes.sort_by(|&a, &b| node_seconds[b].total_cmp(&node_seconds[a]));
        println!("\n| node | op | pass | seconds | GFLOP/s |");
        println!("|---|---|---|---|---|");
        for &i in nodes.iter().take(top) {
            let n = &tg.nodes[i];
            let s = node_seconds[i];
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
static ALLOC: remat_exec::Counting = remat_exec::Counting;
