//! `remat validate`: plan a model (or read a plan) and run it on the executor.

use super::common::{print_document, Bar, ExecArgs, Failure, ModelArgs};
use clap::Args;
use remat_server::engine::document::RunDocument;
use remat_server::engine::PlanRequest;
use remat_server::pipeline::reuse::MadeOtherwise;
use remat_server::pipeline::{
    not_runnable, validate_schedule, Loaded, PlanJob, Progress, Stop, DEFAULT_TIME_LIMIT,
};
use remat_server::text::{cost_summary, run_summary, validation_summary};
use remat_solver::schedule::StepJson;
use remat_solver::Schedule;
use serde_json::Value;
use std::path::{Path, PathBuf};

/// Plan a model and run the plan on the executor: measured memory, time and gradient check
/// (exit 1 when the check fails)
#[derive(Args)]
pub struct ValidateArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Memory budget: bytes, a size ("12GiB"), a fraction of the store-all peak ("0.6x") or
    /// "min" (the least peak remat reaches); with --plan, defaults to the plan's budget_bytes
    #[arg(long)]
    budget: Option<String>,
    /// auto, ilp, dp, segment-dp, chen-sqrt, chen-greedy, every-k, revolve, store-all
    #[arg(long, default_value = "auto")]
    solver: String,
    /// Seconds the whole plan may take, its lower bound included (not --bound-time): the
    /// search, the MILP, the peak descent and the time-point bound share them; the baselines,
    /// the segment program and the first peak descent run to their end (their times:
    /// docs/bench/transformers.md)
    #[arg(long, default_value_t = DEFAULT_TIME_LIMIT)]
    time_limit: f64,
    /// Run this plan (a `remat plan --json` document) instead of planning
    #[arg(long, value_name = "FILE")]
    plan: Option<PathBuf>,
    #[command(flatten)]
    exec: ExecArgs,
    /// Seed of the generated inputs and of the weights the file does not store
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Print JSON
    #[arg(long)]
    json: bool,
}

/// A `remat plan --json` document, read from `path`.
fn read_plan(path: &Path) -> Result<Value, Failure> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| Failure::new(2, format!("--plan {}: cannot read it: {e}", path.display())))?;
    serde_json::from_str(&text)
        .map_err(|e| Failure::new(2, format!("{}: not JSON: {e}", path.display())))
}

/// A plan document's schedule mapped onto this model's training graph.
fn schedule_from_plan(loaded: &Loaded, doc: &Value, path: &Path) -> Result<Schedule, Failure> {
    let bad = |m: String| Failure::new(2, format!("{}: {m}", path.display()));
    if doc.get("status").and_then(Value::as_str) == Some("infeasible") {
        return Err(bad(format!(
            "the plan is infeasible: it has no schedule to run (its budget {} bytes is below the least peak {} bytes); plan again at a larger budget",
            doc.get("budget_bytes").unwrap_or(&Value::Null),
            doc.get("min_feasible_budget_bytes").unwrap_or(&Value::Null),
        )));
    }
    // Other input shapes, parameters or buffers than the plan's (other --dim, --freeze,
    // --param or --input).
    let MadeOtherwise {
        reshaped,
        reclassified,
    } = MadeOtherwise::of(loaded.inspect.as_ref(), doc);
    let steps = doc
        .get("schedule")
        .ok_or_else(|| bad("no \"schedule\" (expected a `remat plan --json` document)".into()))?;
    let steps: Vec<StepJson> = serde_json::from_value(steps.clone()).map_err(|e| {
        bad(format!(
            "\"schedule\" is not a list of {{\"op\": \"compute\" | \"free\", \"node\": ID}}: {e}"
        ))
    })?;
    // Ids that map but shapes that differ: this model at other dims (most ids are the same at
    // any dims, and the run would only fail its budget). Ids that do not map: another model,
    // or this one at dims that change its graph.
    match (Schedule::from_json_steps(&loaded.problem, &steps), reshaped) {
        (Ok(_), Some(reshaped)) => Err(bad(format!(
            "{reshaped}: give the --dim values the plan was made with"
        ))),
        (Ok(schedule), None) => match reclassified {
            None => Ok(schedule),
            Some(r) => Err(bad(format!(
                "{r}: the model was imported with other --freeze, --param or --input (give the \
                 ones the plan was made with)"
            ))),
        },
        (Err(e), reshaped) => Err(bad(format!(
            "{e}: the id is not in this model's training graph (is the plan for another model, \
             or other --dim, --freeze, --param or --input values?{}{})",
            reshaped.map_or_else(String::new, |r| format!(" {r}")),
            reclassified.map_or_else(String::new, |r| format!(" {r}"))
        ))),
    }
}

/// Exit 1 when the run failed its checks.
fn checked(ok: bool) -> Result<(), Failure> {
    if ok {
        Ok(())
    } else {
        Err(Failure::new(
            1,
            "the plan's run failed its checks (listed above)",
        ))
    }
}

/// Plans (or reads `--plan`), runs the plan, prints what the run measured.
pub fn exec(args: ValidateArgs) -> Result<(), Failure> {
    let bytes = args.model.read()?;
    let plan_doc = args.plan.as_deref().map(read_plan).transpose()?;
    let budget = match (&args.budget, &plan_doc) {
        (Some(b), _) => Some(b.clone()),
        (None, Some(d)) => d
            .get("budget_bytes")
            .and_then(|b| b.as_u64())
            .map(|b| b.to_string()),
        (None, None) => None,
    };
    let req = PlanRequest {
        budget,
        solver: Some(args.solver.clone()),
        time_limit: Some(args.time_limit),
        ..args.model.request()
    };
    let job = PlanJob::new(&bytes, &req)
        .costs(args.exec.cost.into())
        .device(args.exec.device.into())
        .timing_rounds(args.exec.timing_rounds.into())
        .seed(args.seed)
        .validate(true)
        .progress(Bar);
    let mut loaded = job.load()?;
    if loaded.exec.is_none() {
        return Err(not_runnable().into());
    }
    let (Some(doc), Some(path)) = (&plan_doc, &args.plan) else {
        return planned_run(&job, loaded, args.json);
    };
    // A given plan: its schedule, at the request's budget (by default the plan's own).
    let cost_model = job.measure_costs(&mut loaded)?;
    let schedule = schedule_from_plan(&loaded, doc, path)?;
    let budget = match &req.budget {
        Some(_) => Some(
            remat_server::pipeline::plan_options(&loaded.problem, &req, 1, &Default::default())
                .map_err(|e| Failure::new(2, e.message))?
                .budget,
        ),
        None => None,
    };
    super::common::print_notes(loaded.inspect.as_ref());
    let vopts = job.validate_options(budget);
    let v = Bar.task(|p| validate_schedule(&loaded, &schedule, &vopts, p))?;
    let ok = v.ok;
    if args.json {
        print_document(&RunDocument {
            validation: v,
            cost_model,
        })?;
    } else {
        if let Some(cm) = &cost_model {
            println!("{}", cost_summary(cm));
        }
        print!("{}", validation_summary(&v));
    }
    checked(ok)
}

/// Plans the loaded model and runs the plan (exit 3 when the budget is infeasible, before any
/// run).
fn planned_run(job: &PlanJob<'_, Bar>, loaded: Loaded, json: bool) -> Result<(), Failure> {
    let outcome = job.run_loaded(loaded)?;
    let ok = match outcome.stop {
        Stop::Infeasible {
            budget_bytes,
            min_feasible_budget_bytes,
            solver,
        } => {
            return Err(Failure::infeasible(
                budget_bytes,
                min_feasible_budget_bytes,
                solver.as_deref(),
            ))
        }
        Stop::NotRun(e) => return Err(e.into()),
        Stop::Validated { ok } => ok,
        // `validate(true)` runs every feasible plan: a job that did not is a bug.
        Stop::Planned => return Err(Failure::new(1, "the plan was not run")),
    };
    let doc = &outcome.document;
    if json {
        print_document(doc)?;
    } else {
        print!("{}", run_summary(doc));
    }
    super::common::print_notes(doc.model.as_ref());
    checked(ok)
}
