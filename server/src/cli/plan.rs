//! `remat plan`: plan a model under a budget, optionally run the plan on the executor.

use super::common::{document_text, print_document, Bar, ExecArgs, Failure, ModelArgs};
use anyhow::Context;
use clap::Args;
use remat_server::engine::PlanRequest;
use remat_server::pipeline::{PlanJob, Stop, DEFAULT_TIME_LIMIT};
use remat_server::text::plan_summary;
use std::path::PathBuf;

/// Plan a model or node-link graph under a memory budget
#[derive(Args)]
pub struct PlanArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Memory budget: bytes, a size ("12GiB", "800MB") or a fraction of the store-all peak ("0.8x")
    #[arg(long)]
    budget: String,
    /// auto, ilp, dp, chen-sqrt, chen-greedy, every-k, revolve, store-all
    #[arg(long, default_value = "auto")]
    solver: String,
    /// Seconds the solver may spend
    #[arg(long, default_value_t = DEFAULT_TIME_LIMIT)]
    time_limit: f64,
    /// Extra seconds, after the schedule is found, to prove a lower bound (for graphs too
    /// large for the MILP: an LP relaxation, then a relaxed MILP; 0: none)
    #[arg(long, default_value_t = 0.0)]
    bound_time: f64,
    /// Print the plan as JSON
    #[arg(long)]
    json: bool,
    /// Also write the JSON plan to this file
    #[arg(long, value_name = "FILE")]
    out: Option<PathBuf>,
    /// Run the plan on the executor and report measured figures (ONNX models)
    #[arg(long)]
    validate: bool,
    #[command(flatten)]
    exec: ExecArgs,
}

impl PlanArgs {
    /// The request these arguments make.
    fn request(&self) -> PlanRequest {
        PlanRequest {
            budget: Some(self.budget.clone()),
            solver: Some(self.solver.clone()),
            time_limit: Some(self.time_limit),
            bound_time: Some(self.bound_time),
            ..self.model.request()
        }
    }
}

/// Plans, prints (and writes `--out`), then exits by how the job stopped: 1 when the run
/// failed its checks, 2 when the run could not happen, 3 when the budget is infeasible.
pub fn exec(args: PlanArgs) -> Result<(), Failure> {
    let bytes = args.model.read()?;
    let req = args.request();
    let outcome = PlanJob::new(&bytes, &req)
        .costs(args.exec.cost.into())
        .device(args.exec.device.into())
        .validate(args.validate)
        .progress(Bar)
        .run()?;
    let doc = &outcome.document;
    if let Some(path) = &args.out {
        std::fs::write(path, document_text(doc)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    if args.json {
        print_document(doc)?;
    } else {
        print!("{}", plan_summary(doc));
    }
    match outcome.stop {
        Stop::NotRun(e) => Err(e.into()),
        Stop::Validated { ok: false } => Err(Failure::new(
            1,
            "the plan's run failed its checks (see validation.problems)",
        )),
        Stop::Infeasible {
            budget_bytes,
            min_feasible_budget_bytes,
        } => Err(Failure::infeasible(budget_bytes, min_feasible_budget_bytes)),
        Stop::Planned | Stop::Validated { ok: true } => Ok(()),
    }
}
