//! `remat plan`: plan a model under a budget, optionally run the plan on the executor.

use super::common::{document_text, print_document, Bar, ExecArgs, Failure, ModelArgs};
use anyhow::Context;
use clap::Args;
use remat_server::engine::{ModelFormat, PlanRequest};
use remat_server::pipeline::torch;
use remat_server::pipeline::{PlanJob, Stop, DEFAULT_TIME_LIMIT};
use remat_server::text::plan_summary;
use std::path::PathBuf;

/// Plan a model or node-link graph under a memory budget
#[derive(Args)]
pub struct PlanArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Memory budget: bytes, a size ("12GiB", "800MB"), a fraction of the store-all peak
    /// ("0.8x") or "min" (the least peak remat reaches); with --maximize, the device's memory
    #[arg(long, visible_alias = "device-memory")]
    budget: String,
    /// Find the largest value of this dim (e.g. batch, or INPUT:AXIS) whose plan fits the
    /// budget within --max-overhead, and plan at it (ONNX models; each value tried is planned
    /// with --solver and --time-limit; --dim gives the value to start from)
    #[arg(long, value_name = "DIM")]
    maximize: Option<String>,
    /// With --maximize: the most overhead a plan may have, "10%" or 0.1 (default: any)
    #[arg(long, value_name = "OVERHEAD", value_parser = parse_overhead, requires = "maximize")]
    max_overhead: Option<f64>,
    /// auto, ilp, dp, segment-dp, chen-sqrt, chen-greedy, every-k, revolve, store-all
    #[arg(long, default_value = "auto")]
    solver: String,
    /// Seconds the whole plan may take, its lower bound included (not --bound-time): the
    /// search, the MILP, the peak descent and the time-point bound share them; the baselines,
    /// the segment program and the first peak descent run to their end (their times:
    /// docs/bench/transformers.md)
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
    /// A plan of this model made before (`remat plan --json` or --out; repeatable): where
    /// its peak fits the budget, the plan returned costs no more than it (ONNX models and
    /// node-link graphs; not with --maximize). A folder: every plan in it (*.json) that is
    /// one of this model, the others skipped with a note (keep a folder of plans and each
    /// new one reuses them)
    #[arg(long, value_name = "FILE|DIR", conflicts_with = "maximize")]
    reuse: Vec<PathBuf>,
    /// Run the plan on the executor and report measured figures (ONNX models)
    #[arg(long)]
    validate: bool,
    /// A captured PyTorch graph: attach what `remat.torch.measure` measured of this plan (its
    /// JSON), checked against the plan, as the plan's `validation`; exit 1 when it failed
    #[arg(long, value_name = "FILE")]
    validation: Option<PathBuf>,
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
            maximize: self.maximize.clone(),
            max_overhead: self.max_overhead,
            ..self.model.request()
        }
    }
}

/// An overhead: "10%" or a fraction (0.1).
fn parse_overhead(s: &str) -> Result<f64, String> {
    let t = s.trim();
    let (num, scale) = match t.strip_suffix('%') {
        Some(n) => (n.trim(), 0.01),
        None => (t, 1.0),
    };
    match num.parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 0.0 => Ok(v * scale),
        _ => Err(format!(
            "expected a non-negative overhead such as 10% or 0.1, got {s:?}"
        )),
    }
}

/// Plans, prints (and writes `--out`), then exits by how the job stopped: 1 when the run
/// failed its checks, 2 when the run could not happen, 3 when the budget is infeasible.
pub fn exec(args: PlanArgs) -> Result<(), Failure> {
    if let Some(out) = &args.out {
        let same = |a: &std::path::Path, b: &std::path::Path| {
            a == b || matches!((a.canonicalize(), b.canonicalize()), (Ok(x), Ok(y)) if x == y)
        };
        if same(out, &args.model.model) || args.reuse.iter().any(|r| same(out, r)) {
            return Err(Failure::new(
                2,
                format!(
                    "--out {}: that is the model or a --reuse plan, which the plan would overwrite: write it elsewhere",
                    out.display()
                ),
            ));
        }
    }
    let bytes = args.model.read()?;
    let req = args.request();
    let torch = ModelFormat::detect(&bytes) == ModelFormat::TorchGraph;
    if torch && !args.reuse.is_empty() {
        return Err(Failure::new(
            2,
            "--reuse offers a plan's schedule to the free-schedule planner; a captured \
             PyTorch graph is planned per region",
        ));
    }
    if torch {
        return torch_plan(&args, &bytes, &req);
    }
    if let Some(path) = &args.validation {
        return Err(Failure::new(
            2,
            format!(
                "--validation {}: a measurement from remat.torch.measure belongs to the plan of a \
                 captured PyTorch graph; run an ONNX model's plan on the executor with --validate",
                path.display()
            ),
        ));
    }
    // A file that cannot be read, or is not JSON, is the caller's input: exit 2.
    let (reused, found) = reused_plans(&args.reuse).map_err(|error| Failure { code: 2, error })?;
    let outcome = PlanJob::new(&bytes, &req)
        .reuse(&reused)
        .reuse_found(&found)
        .costs(args.exec.cost.into())
        .device(args.exec.device.into())
        .timing_rounds(args.exec.timing_rounds.into())
        .validate(args.validate)
        .progress(Bar)
        .run()?;
    for (file, why) in &outcome.reuse_skipped {
        eprintln!("--reuse: {file} skipped: {why}");
    }
    emit(&args, &outcome.document, plan_summary(&outcome.document))?;
    super::common::print_notes(outcome.document.model.as_ref());
    let found_by = &outcome.document.report.solver;
    if args.solver != "auto"
        && matches!(outcome.stop, Stop::Planned | Stop::Validated { .. })
        && found_by != &args.solver
        && !args.json
    {
        // A fixed solver that found nothing better than its start (a baseline, the peak
        // descent) says so, rather than leave "feasible (chen-greedy)" to be read as a fault.
        eprintln!(
            "note: --solver {} found no schedule cheaper than {found_by}'s within the time limit ({} s); --solver auto combines every solver",
            args.solver,
            args.time_limit
        );
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
            solver,
        } => Err(Failure::infeasible(
            budget_bytes,
            min_feasible_budget_bytes,
            solver.as_deref(),
        )),
        Stop::Planned | Stop::Validated { ok: true } => Ok(()),
    }
}

/// The plan documents `--reuse` names: each file as given (one that is not a plan of this
/// model is an error naming it, when the job reads it), and each folder's `*.json` files, in
/// name order, for the job to keep those that are plans of this model
/// ([`PlanJob::reuse_found`]); a file there that cannot be read as JSON is skipped here, with a
/// note on stderr.
#[allow(clippy::type_complexity)]
fn reused_plans(
    paths: &[PathBuf],
) -> anyhow::Result<(
    Vec<(String, serde_json::Value)>,
    Vec<(String, serde_json::Value)>,
)> {
    let mut given = Vec::new();
    let mut found = Vec::new();
    for path in paths {
        if !path.is_dir() {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("--reuse {}: cannot read it", path.display()))?;
            let document = serde_json::from_str(&text)
                .with_context(|| format!("--reuse {}: not a JSON plan document", path.display()))?;
            given.push((path.display().to_string(), document));
            continue;
        }
        let mut files: Vec<PathBuf> = std::fs::read_dir(path)
            .with_context(|| format!("--reuse {}: cannot list the folder", path.display()))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.is_file() && p.extension().is_some_and(|x| x == "json"))
            .collect();
        files.sort();
        for file in files {
            let read = std::fs::read_to_string(&file)
                .map_err(|e| format!("cannot read it: {e}"))
                .and_then(|text| serde_json::from_str(&text).map_err(|e| format!("not JSON: {e}")));
            match read {
                Ok(document) => found.push((file.display().to_string(), document)),
                Err(e) => eprintln!("--reuse: {} skipped: {e}", file.display()),
            }
        }
    }
    Ok((given, found))
}

/// A captured PyTorch graph: the torch-sac plan that `remat.torch.apply` reads (written with
/// `--out`), its summary or JSON; exit 3 when the budget is below the least reachable peak
/// (the document is then the least-peak plan).
fn torch_plan(args: &PlanArgs, bytes: &[u8], req: &PlanRequest) -> Result<(), Failure> {
    let req = PlanRequest {
        solver: None,
        time_limit: None,
        bound_time: None,
        validate: Some(args.validate),
        ..req.clone()
    };
    if args.solver != "auto" {
        return Err(Failure::new(
            2,
            format!(
                "--solver {} plans free schedules; a captured PyTorch graph is planned in the torch-sac model",
                args.solver
            ),
        ));
    }
    let mut planned = torch::plan(bytes, &req, &Default::default())?;
    if let Some(path) = &args.validation {
        let text = std::fs::read_to_string(path)
            .map_err(|e| Failure::new(2, format!("--validation {}: {e}", path.display())))?;
        let measured: serde_json::Value = serde_json::from_str(&text).map_err(|e| {
            Failure::new(2, format!("--validation {}: not JSON: {e}", path.display()))
        })?;
        remat_solver::sac::check_validation(&planned.document, &measured)
            .map_err(|e| Failure::new(2, format!("--validation {}: {e}", path.display())))?;
        planned.document.validation = Some(measured);
    }
    let doc = &planned.document;
    emit(args, doc, torch::summary(doc))?;
    if planned.infeasible {
        return Err(Failure::infeasible(
            doc.budget_bytes,
            doc.min_peak_bytes,
            None,
        ));
    }
    if doc
        .validation
        .as_ref()
        .is_some_and(|v| v["ok"] == serde_json::Value::Bool(false))
    {
        return Err(Failure::new(
            1,
            "the plan's measurement in PyTorch failed its checks (see validation.problems)",
        ));
    }
    Ok(())
}

/// Writes the document to `--out` when asked, and prints it (`--json`) or its summary.
fn emit(args: &PlanArgs, doc: &impl serde::Serialize, summary: String) -> Result<(), Failure> {
    if let Some(path) = &args.out {
        std::fs::write(path, document_text(doc)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    if args.json {
        print_document(doc)?;
    } else {
        print!("{summary}");
    }
    Ok(())
}
