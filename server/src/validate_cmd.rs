//! `remat validate` and the executor options of `remat plan` (`--validate`, `--device`,
//! `--cost measured`).

use super::{print_json, read_model, request, Failure, ModelArgs};
use anyhow::Context;
use clap::{Args, ValueEnum};
use remat_exec::{measured_costs, with_costs, ExecDevice, Validation};
use remat_server::engine::{EngineError, ErrorKind, PlanRequest};
use remat_server::human_bytes;
use remat_server::pipeline::{self, Loaded, Pipeline};
use remat_solver::plan::Status;
use remat_solver::schedule::StepJson;
use remat_solver::{simulate, Schedule, Step};
use serde_json::{json, Value};
use std::path::PathBuf;

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum DeviceArg {
    Cpu,
    Cuda,
}

impl From<DeviceArg> for ExecDevice {
    fn from(d: DeviceArg) -> Self {
        match d {
            DeviceArg::Cpu => ExecDevice::Cpu,
            DeviceArg::Cuda => ExecDevice::Cuda,
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum CostArg {
    /// FLOPs of each op (the importer's estimate)
    Flops,
    /// Seconds per op, measured by running the store-all step on the device (fastest of 3)
    Measured,
}

#[derive(Args)]
pub struct ValidateArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Memory budget: bytes, a size ("12GiB") or a fraction of the store-all peak ("0.6x");
    /// with --plan, defaults to the plan's budget_bytes
    #[arg(long)]
    budget: Option<String>,
    /// auto, ilp, dp, chen-sqrt, chen-greedy, every-k, revolve, store-all
    #[arg(long, default_value = "auto")]
    solver: String,
    /// Seconds the solver may spend
    #[arg(long, default_value_t = pipeline::DEFAULT_TIME_LIMIT)]
    time_limit: f64,
    /// Run this plan (a `remat plan --json` document) instead of planning
    #[arg(long, value_name = "FILE")]
    plan: Option<PathBuf>,
    #[arg(long, value_enum, default_value_t = DeviceArg::Cpu)]
    device: DeviceArg,
    /// Solver costs: FLOPs, or seconds measured on the device
    #[arg(long, value_enum, default_value_t = CostArg::Flops)]
    cost: CostArg,
    /// Seed of the generated inputs and of the weights the file does not store
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Print JSON
    #[arg(long)]
    json: bool,
}

/// Runs `f` with a progress bar on a terminal (hidden otherwise).
pub fn with_progress<R>(f: impl FnOnce(&mut (dyn FnMut(&str, usize, usize) + Send)) -> R) -> R {
    let bar = indicatif::ProgressBar::new(0);
    bar.set_style(
        indicatif::ProgressStyle::with_template("{msg:>16} [{bar:40}] {pos}/{len} steps {elapsed}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    let mut phase = String::new();
    let r = f(&mut |p: &str, done: usize, total: usize| {
        if p != phase {
            phase = p.to_string();
            bar.set_message(phase.clone());
            bar.set_length(total as u64);
        }
        bar.set_position(done as u64);
    });
    bar.finish_and_clear();
    r
}

/// Replaces the problem's costs by measured seconds when asked, and says how that changes
/// the plan at the request's budget.
pub fn apply_cost_model(
    loaded: &mut Loaded,
    req: &PlanRequest,
    threads: usize,
    cost: CostArg,
    device: DeviceArg,
) -> Result<Option<Value>, Failure> {
    if cost == CostArg::Flops {
        return Ok(None);
    }
    let Some(em) = &loaded.exec else {
        return Err(EngineError::new(
            ErrorKind::BadInput,
            "not_runnable",
            "--cost measured needs an ONNX model: a node-link graph has no ops to run",
        )
        .into());
    };
    let runs = 3;
    let costs = with_progress(|_| {
        measured_costs(&em.model, &em.training, em.bytes, device.into(), 0, runs)
    })
    .map_err(pipeline::exec_error)?;
    let measured = with_costs(&loaded.problem, &costs).map_err(pipeline::exec_error)?;
    let flops = std::mem::replace(&mut loaded.problem, measured);
    let mut doc = json!({
        "kind": "measured",
        "unit": "seconds",
        "device": ExecDevice::from(device).name(),
        "profiling_runs": runs,
        "store_all_seconds": loaded.problem.base_cost(),
    });
    // The same budget planned with FLOPs: how different is the plan, and what does it cost in
    // measured seconds?
    if req.budget.is_some() {
        let flops_loaded = Loaded {
            problem: flops,
            format: loaded.format,
            inspect: None,
            exec: None,
        };
        let opts = pipeline::plan_options(&flops_loaded.problem, req, threads)?;
        let by_flops = pipeline::plan_loaded(&flops_loaded, &opts)?;
        let by_time = pipeline::plan_loaded(loaded, &opts)?;
        if by_flops.report.status != Status::Infeasible
            && by_time.report.status != Status::Infeasible
        {
            let as_time = |s: &Schedule| {
                simulate(&loaded.problem, s)
                    .map(|st| st.overhead(&loaded.problem))
                    .ok()
            };
            let counts = |s: &Schedule| {
                let mut c = vec![0u32; loaded.problem.len()];
                for step in &s.steps {
                    if let Step::Compute(i) = step {
                        c[*i] += 1;
                    }
                }
                c
            };
            let (a, b) = (counts(&by_flops.schedule), counts(&by_time.schedule));
            let differ = a.iter().zip(&b).filter(|(x, y)| x != y).count();
            doc["flops_plan_measured_overhead"] = json!(as_time(&by_flops.schedule));
            doc["measured_plan_measured_overhead"] = json!(as_time(&by_time.schedule));
            doc["nodes_computed_differently"] = json!(differ);
        }
    }
    Ok(Some(doc))
}

/// One line on what measured costs changed.
pub fn cost_summary(cm: &Value) -> String {
    let pct = |v: &Value| {
        v.as_f64()
            .map(|x| format!("{:+.2}%", 100.0 * x))
            .unwrap_or("-".into())
    };
    format!(
        "cost model measured seconds on {} (store-all step {:.3}s): plan by FLOPs {} vs by time {} in measured time; {} node(s) computed differently",
        cm["device"].as_str().unwrap_or("?"),
        cm["store_all_seconds"].as_f64().unwrap_or(0.0),
        pct(&cm["flops_plan_measured_overhead"]),
        pct(&cm["measured_plan_measured_overhead"]),
        cm["nodes_computed_differently"].as_u64().map(|n| n.to_string()).unwrap_or("-".into()),
    )
}

/// The validation as text.
pub fn summary(v: &Validation) -> String {
    let mut s = String::new();
    s.push_str(&format!(
        "validation {} on {}\n",
        if v.ok { "passed" } else { "FAILED" },
        v.device
    ));
    s.push_str(&format!(
        "  peak     predicted {}  measured {} ({:+.2}%)  at step {}\n",
        human_bytes(v.predicted_peak_bytes),
        human_bytes(v.measured_peak_bytes),
        100.0 * v.peak_rel_diff,
        v.measured_peak_step
    ));
    match v.heap_peak_bytes {
        Some(h) => s.push_str(&format!(
            "  heap     {} — {}\n",
            human_bytes(h),
            v.heap_note
        )),
        None => s.push_str(&format!("  heap     {}\n", v.heap_note)),
    }
    if let Some(d) = v.device_peak_bytes {
        s.push_str(&format!(
            "  device   {} in use at the peak (cuMemGetInfo, the CUDA allocator's cache included)\n",
            human_bytes(d)
        ));
    }
    s.push_str(&format!(
        "  grads    max relative error {:.2e} over {} parameters (store-all loss {:.6}, plan loss {:.6})\n",
        v.grad_max_rel_err, v.params_checked, v.store_all_loss, v.loss
    ));
    s.push_str(&format!(
        "  time     step {:.3}s vs store-all {:.3}s: measured overhead {:+.2}% ({}; predicted {:+.2}%), {} recomputation(s)\n",
        v.step_seconds,
        v.store_all_step_seconds,
        100.0 * v.measured_overhead,
        match v.timing_rounds {
            0 | 1 => "one run each".to_string(),
            n => format!(
                "median of {n} rounds, {:+.2}% to {:+.2}%",
                100.0 * v.measured_overhead_range[0],
                100.0 * v.measured_overhead_range[1]
            ),
        },
        100.0 * v.predicted_overhead,
        v.recomputations
    ));
    let ops: Vec<String> = v
        .op_seconds
        .iter()
        .take(6)
        .map(|o| format!("{} {:.3}s", o.op, o.seconds))
        .collect();
    s.push_str(&format!("  ops      {}\n", ops.join(", ")));
    if !v.host_ops.is_empty() {
        s.push_str(&format!(
            "  host     {} ran on the host: the GPU's kernel library lacks one of their kernels\n",
            v.host_ops.join(", ")
        ));
    }
    s.push_str(&format!(
        "  weights  {} parameter(s) from the file, {} seeded\n",
        v.params_from_file, v.params_seeded
    ));
    for p in &v.problems {
        s.push_str(&format!("  problem  {p}\n"));
    }
    s
}

/// A plan document's schedule mapped onto this model's training graph.
fn schedule_from_plan(
    loaded: &Loaded,
    doc: &Value,
    path: &std::path::Path,
) -> Result<Schedule, Failure> {
    let bad = |m: String| Failure {
        code: 2,
        error: anyhow::anyhow!("{}: {m}", path.display()),
    };
    let steps = doc
        .get("schedule")
        .ok_or_else(|| bad("no \"schedule\" (expected a `remat plan --json` document)".into()))?;
    let steps: Vec<StepJson> = serde_json::from_value(steps.clone()).map_err(|e| {
        bad(format!(
            "\"schedule\" is not a list of {{\"op\": \"compute\" | \"free\", \"node\": ID}}: {e}"
        ))
    })?;
    Schedule::from_json_steps(&loaded.problem, &steps).map_err(|e| {
        bad(format!(
            "{e}: the id is not in this model's training graph (is the plan for another model, or other --dim values?)"
        ))
    })
}

pub fn run(args: ValidateArgs) -> Result<(), Failure> {
    let bytes = read_model(&args.model.model)?;
    let mut req = request(&args.model);
    req.solver = Some(args.solver.clone());
    req.time_limit = Some(args.time_limit);
    let plan_doc: Option<Value> = match &args.plan {
        Some(p) => {
            let text =
                std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?;
            Some(serde_json::from_str(&text).map_err(|e| Failure {
                code: 2,
                error: anyhow::anyhow!("{}: not JSON: {e}", p.display()),
            })?)
        }
        None => None,
    };
    req.budget = match (&args.budget, &plan_doc) {
        (Some(b), _) => Some(b.clone()),
        (None, Some(d)) => d
            .get("budget_bytes")
            .and_then(|b| b.as_u64())
            .map(|b| b.to_string()),
        (None, None) => None,
    };
    let engine = Pipeline::new();
    let mut loaded = pipeline::load(&bytes, pipeline::detect(&bytes), &req)?;
    if loaded.exec.is_none() {
        return Err(Failure {
            code: 2,
            error: anyhow::anyhow!(
                "only ONNX models can be validated: a node-link graph has no tensors to run"
            ),
        });
    }
    let cost_model = apply_cost_model(&mut loaded, &req, engine.threads, args.cost, args.device)?;
    let (schedule, planned) = match (&plan_doc, &args.plan) {
        (Some(doc), Some(path)) => (schedule_from_plan(&loaded, doc, path)?, None),
        _ => {
            let opts = pipeline::plan_options(&loaded.problem, &req, engine.threads)?;
            let planned = pipeline::plan_loaded(&loaded, &opts)?;
            if planned.report.status == Status::Infeasible {
                let min = planned.report.min_feasible_budget_bytes.unwrap_or(0);
                return Err(Failure {
                    code: 3,
                    error: anyhow::anyhow!(
                        "budget {} bytes is infeasible: the minimum feasible budget is {min} bytes ({})",
                        planned.report.budget_bytes,
                        human_bytes(min)
                    ),
                });
            }
            (planned.schedule.clone(), Some(planned))
        }
    };
    let budget = match &req.budget {
        Some(b) => Some(
            remat_solver::plan::parse_budget(b, remat_solver::store_all_peak(&loaded.problem))
                .map_err(|e| Failure {
                    code: 2,
                    error: anyhow::anyhow!("budget: {e}"),
                })?,
        ),
        None => None,
    };
    let vopts = remat_exec::ValidateOptions {
        device: args.device.into(),
        seed: args.seed,
        budget_bytes: budget,
        ..Default::default()
    };
    let v = with_progress(|p| pipeline::validate_schedule(&loaded, &schedule, &vopts, p))?;
    let ok = v.ok;
    if args.json {
        let mut doc = match &planned {
            Some(planned) => pipeline::plan_document(&loaded, planned, Some(Ok(v))),
            None => json!({ "validation": v }),
        };
        if let (Some(cm), Value::Object(map)) = (&cost_model, &mut doc) {
            map.insert("cost_model".into(), cm.clone());
        }
        print_json(&doc)?;
    } else {
        if let Some(planned) = &planned {
            let r = &planned.report;
            println!(
                "plan       {} at budget {}: predicted peak {}, overhead {:+.2}%",
                r.solver,
                human_bytes(r.budget_bytes),
                human_bytes(r.predicted.peak_bytes),
                100.0 * r.predicted.overhead
            );
        }
        if let Some(cm) = &cost_model {
            println!("{}", cost_summary(cm));
        }
        print!("{}", summary(&v));
    }
    if !ok {
        return Err(Failure {
            code: 1,
            error: anyhow::anyhow!("the plan's run failed its checks (listed above)"),
        });
    }
    Ok(())
}
