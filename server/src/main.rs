//! `remat`: plan activation checkpointing for training.
//!
//! Exit codes: 0 success, 1 internal failure, 2 usage or input error, 3 infeasible budget.

use anyhow::Context;
use clap::{Args, Parser, Subcommand};
use remat_server::engine::{EngineError, ErrorKind, PlanRequest};
use remat_server::gate;
use remat_server::human_bytes;
use remat_server::pipeline::{self, Pipeline};
use remat_solver::plan::Status;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

mod validate_cmd;

/// The counting allocator: `remat validate` reports the process's real heap peak beside the
/// executor's live-tensor accounting.
#[global_allocator]
static ALLOC: remat_exec::Counting = remat_exec::Counting;

#[derive(Parser)]
#[command(name = "remat", version, about = "Plans activation checkpointing (rematerialization) for neural-network training", long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the planning service (HTTP API and plan store)
    Serve(remat_server::http::ServeArgs),
    /// Import an ONNX model and summarize its training graph
    Inspect(InspectArgs),
    /// Plan a model or node-link graph under a memory budget
    Plan(PlanArgs),
    /// The Pareto frontier: overhead at a range of budgets, with the baselines
    Sweep(SweepArgs),
    /// Fail CI when training memory regresses against a baseline (exit 1), 2 on bad input
    Gate(GateArgs),
    /// Plan a model and run the plan on the executor: measured memory, time and gradient check
    /// (exit 1 when the check fails)
    Validate(validate_cmd::ValidateArgs),
}

#[derive(Args)]
struct GateArgs {
    /// The gate's config: [[model]] tables with name, path, budget, dims, max_overhead, tolerance
    #[arg(long, default_value = "remat.toml")]
    config: PathBuf,
    /// The baseline figures to compare with
    #[arg(long, default_value = "remat-baseline.json")]
    baseline: PathBuf,
    /// Write the new figures as the baseline instead of comparing
    #[arg(long)]
    update: bool,
    #[arg(long, value_enum, default_value_t = GateFormat::Text)]
    format: GateFormat,
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum GateFormat {
    Text,
    Markdown,
    Json,
    Github,
}

#[derive(Args, Clone)]
struct ModelArgs {
    /// ONNX model (.onnx) or node-link graph JSON
    model: PathBuf,
    /// Bind a symbolic dimension: NAME=VALUE (NAME is the model's own dim_param)
    #[arg(long = "dim", value_name = "NAME=VALUE", value_parser = parse_dim)]
    dims: Vec<(String, u64)>,
    /// Treat this graph input as a parameter (overrides the importer's rule)
    #[arg(long = "param", value_name = "NAME")]
    params: Vec<String>,
    /// Treat this graph input as data, not a parameter (overrides the importer's rule)
    #[arg(long = "input", value_name = "NAME")]
    inputs: Vec<String>,
}

#[derive(Args)]
struct InspectArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Print JSON instead of the summary
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
struct PlanArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Memory budget: bytes, a size ("12GiB", "800MB") or a fraction of the store-all peak ("0.8x")
    #[arg(long)]
    budget: String,
    /// auto, ilp, dp, chen-sqrt, chen-greedy, every-k, revolve, store-all
    #[arg(long, default_value = "auto")]
    solver: String,
    /// Seconds the solver may spend
    #[arg(long, default_value_t = pipeline::DEFAULT_TIME_LIMIT)]
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
    /// The executor's device for --validate and --cost measured
    #[arg(long, value_enum, default_value_t = validate_cmd::DeviceArg::Cpu)]
    device: validate_cmd::DeviceArg,
    /// Solver costs: FLOPs of each op, or seconds measured by running each op on the device
    #[arg(long, value_enum, default_value_t = validate_cmd::CostArg::Flops)]
    cost: validate_cmd::CostArg,
}

#[derive(Args)]
struct SweepArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Budget fractions of the store-all peak, comma separated
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "1.0,0.9,0.8,0.7,0.6,0.5,0.4,0.3"
    )]
    fractions: Vec<f64>,
    /// auto, ilp, dp, chen-sqrt, chen-greedy, every-k, revolve, store-all
    #[arg(long, default_value = "auto")]
    solver: String,
    /// Seconds the solver may spend per budget
    #[arg(long, default_value_t = 10.0)]
    time_limit: f64,
    #[arg(long)]
    json: bool,
}

fn parse_dim(s: &str) -> Result<(String, u64), String> {
    let (name, value) = s
        .split_once('=')
        .ok_or_else(|| format!("expected NAME=VALUE, got {s:?}"))?;
    let name = name.trim();
    if name.is_empty() {
        return Err(format!("empty dimension name in {s:?}"));
    }
    let value: u64 = value
        .trim()
        .parse()
        .map_err(|_| format!("dimension {name}: {value:?} is not a positive integer"))?;
    if value == 0 {
        return Err(format!("dimension {name}: must be at least 1"));
    }
    Ok((name.to_string(), value))
}

/// A failure with the exit code it deserves.
struct Failure {
    code: u8,
    error: anyhow::Error,
}

impl From<anyhow::Error> for Failure {
    fn from(error: anyhow::Error) -> Self {
        Failure { code: 1, error }
    }
}

impl From<EngineError> for Failure {
    fn from(e: EngineError) -> Self {
        let code = match e.kind {
            ErrorKind::Internal => 1,
            _ if e.code == "infeasible_budget" => 3,
            _ => 2,
        };
        Failure {
            code,
            error: anyhow::anyhow!("{}", e.message),
        }
    }
}

fn input_error(e: anyhow::Error) -> Failure {
    Failure { code: 2, error: e }
}

fn read_model(path: &Path) -> Result<Vec<u8>, Failure> {
    std::fs::read(path)
        .with_context(|| format!("cannot read model {}", path.display()))
        .map_err(input_error)
}

fn request(model: &ModelArgs) -> PlanRequest {
    PlanRequest {
        dims: model.dims.iter().cloned().collect::<BTreeMap<_, _>>(),
        params: model.params.clone(),
        inputs: model.inputs.clone(),
        name: model
            .model
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned()),
        ..PlanRequest::default()
    }
}

fn print_json(value: &impl serde::Serialize) -> Result<(), Failure> {
    let text = serde_json::to_string_pretty(value).context("serializing JSON")?;
    println!("{text}");
    Ok(())
}

fn inspect(args: InspectArgs) -> Result<(), Failure> {
    let bytes = read_model(&args.model.model)?;
    let req = request(&args.model);
    let report = remat_planner::inspect(&bytes, &pipeline::import_options(&req))
        .map_err(pipeline::planner_error)?;
    if args.json {
        print_json(&report)?;
    } else {
        println!("{report}");
    }
    if report.unsupported.is_empty() {
        Ok(())
    } else {
        Err(Failure {
            code: 2,
            error: anyhow::anyhow!(
                "{} node(s) use unsupported ops (listed above)",
                report.unsupported.len()
            ),
        })
    }
}

fn plan(args: PlanArgs) -> Result<(), Failure> {
    let bytes = read_model(&args.model.model)?;
    let mut req = request(&args.model);
    req.budget = Some(args.budget.clone());
    req.solver = Some(args.solver.clone());
    req.time_limit = Some(args.time_limit);
    req.bound_time = Some(args.bound_time);
    let engine = Pipeline::new();
    let mut loaded = pipeline::load(&bytes, pipeline::detect(&bytes), &req)?;
    let cost_model =
        validate_cmd::apply_cost_model(&mut loaded, &req, engine.threads, args.cost, args.device)?;
    let opts = pipeline::plan_options(&loaded.problem, &req, engine.threads)?;
    let planned = pipeline::plan_loaded(&loaded, &opts)?;
    let validation = (args.validate && planned.report.status != Status::Infeasible).then(|| {
        let mut vopts = pipeline::validate_options(&opts);
        vopts.device = args.device.into();
        validate_cmd::with_progress(|p| {
            pipeline::validate_schedule(&loaded, &planned.schedule, &vopts, p)
        })
    });
    let failed = matches!(&validation, Some(Ok(v)) if !v.ok);
    let run_error = match &validation {
        Some(Err(e)) => Some(e.clone()),
        _ => None,
    };
    let summary = match &validation {
        Some(Ok(v)) => Some(validate_cmd::summary(v)),
        _ => None,
    };
    let mut doc = pipeline::plan_document(&loaded, &planned, validation);
    if let (Some(cm), serde_json::Value::Object(map)) = (&cost_model, &mut doc) {
        map.insert("cost_model".into(), cm.clone());
    }
    if let Some(path) = &args.out {
        let text = serde_json::to_string_pretty(&doc).context("serializing JSON")?;
        std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))?;
    }
    let r = &planned.report;
    if args.json {
        print_json(&doc)?;
    } else {
        println!(
            "model      {} ({} nodes)",
            loaded.problem.name,
            loaded.problem.len()
        );
        println!("status     {:?} ({})", r.status, r.solver);
        println!(
            "budget     {} (store-all peak {})",
            human_bytes(r.budget_bytes),
            human_bytes(r.store_all_peak_bytes)
        );
        if r.status != Status::Infeasible {
            println!(
                "peak       {}  overhead {:+.2}%  solved in {:.2}s",
                human_bytes(r.predicted.peak_bytes),
                100.0 * r.predicted.overhead,
                r.solve_seconds
            );
            if let (Some(gap), Some(lb)) = (r.gap, &r.lower_bound) {
                println!(
                    "gap        {:.2}% to the lower bound ({})",
                    100.0 * gap,
                    lb.source.as_str()
                );
            }
        }
        println!("baselines");
        for b in &r.baselines {
            println!(
                "  {:<12} peak {:>12}  overhead {:>+8.2}%  {}",
                b.name,
                human_bytes(b.peak_bytes),
                100.0 * b.overhead,
                if b.feasible { "fits" } else { "over budget" }
            );
        }
        if let Some(cm) = &cost_model {
            println!("{}", validate_cmd::cost_summary(cm));
        }
        if let Some(s) = &summary {
            print!("{s}");
        }
    }
    if let Some(e) = run_error {
        return Err(e.into());
    }
    if failed {
        return Err(Failure {
            code: 1,
            error: anyhow::anyhow!("the plan's run failed its checks (see validation.problems)"),
        });
    }
    if r.status == Status::Infeasible {
        let min = r.min_feasible_budget_bytes.unwrap_or(0);
        return Err(Failure {
            code: 3,
            error: anyhow::anyhow!(
                "budget {} bytes is infeasible: the minimum feasible budget is {} bytes ({})",
                r.budget_bytes,
                min,
                human_bytes(min)
            ),
        });
    }
    Ok(())
}

fn sweep(args: SweepArgs) -> Result<(), Failure> {
    let bytes = read_model(&args.model.model)?;
    let mut req = request(&args.model);
    req.solver = Some(args.solver.clone());
    req.time_limit = Some(args.time_limit);
    req.fractions = args.fractions.clone();
    let engine = Pipeline::new();
    let loaded = pipeline::load(&bytes, pipeline::detect(&bytes), &req)?;
    let doc = pipeline::sweep_document(&loaded, &req, engine.threads)?;
    if args.json {
        print_json(&doc)?;
    } else {
        let text = serde_json::to_string_pretty(&doc["points"]).context("serializing JSON")?;
        println!("{text}");
    }
    Ok(())
}

fn gate_error(e: gate::GateError) -> Failure {
    Failure {
        code: 2,
        error: anyhow::Error::new(e),
    }
}

fn run_gate(args: GateArgs) -> Result<(), Failure> {
    let config = gate::read_config(&args.config).map_err(gate_error)?;
    let baseline = gate::read_baseline(&args.baseline).map_err(gate_error)?;
    let figures = gate::measure_all(&config, &args.config).map_err(gate_error)?;
    if args.update {
        gate::write_baseline(&args.baseline, &figures).map_err(gate_error)?;
        print!("{}", gate::render_figures(&figures));
        if baseline.is_some() {
            let outcome = gate::compare(&config, &figures, baseline.as_ref());
            println!("\nagainst the previous baseline:");
            print!("{}", gate::render_text(&outcome));
        }
        eprintln!(
            "wrote {} model(s) to {}",
            figures.len(),
            args.baseline.display()
        );
        return Ok(());
    }
    let Some(baseline) = baseline else {
        return Err(Failure {
            code: 2,
            error: anyhow::anyhow!(
                "{}: no baseline file; run `remat gate --update` to create it",
                args.baseline.display()
            ),
        });
    };
    let outcome = gate::compare(&config, &figures, Some(&baseline));
    match args.format {
        GateFormat::Text => print!("{}", gate::render_text(&outcome)),
        GateFormat::Markdown => print!("{}", gate::render_markdown(&outcome)),
        GateFormat::Json => print_json(&outcome)?,
        GateFormat::Github => {
            print!("{}", gate::render_github(&outcome, &args.config));
            if let Some(path) = std::env::var_os("GITHUB_STEP_SUMMARY") {
                use std::io::Write;
                let mut f = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(&path)
                    .with_context(|| {
                        format!("opening GITHUB_STEP_SUMMARY {}", Path::new(&path).display())
                    })?;
                f.write_all(gate::render_markdown(&outcome).as_bytes())
                    .context("writing GITHUB_STEP_SUMMARY")?;
            }
        }
    }
    let n = outcome.regressions().count();
    if n > 0 {
        return Err(Failure {
            code: 1,
            error: anyhow::anyhow!(
                "{n} memory regression(s) against {}",
                args.baseline.display()
            ),
        });
    }
    Ok(())
}

async fn serve(args: remat_server::http::ServeArgs) -> Result<(), Failure> {
    let engine = std::sync::Arc::new(Pipeline::new());
    remat_server::http::serve(args, engine)
        .await
        .map_err(|e| Failure {
            code: 1,
            error: anyhow::Error::new(e),
        })
}

/// Lets a command whose output is piped into `head` end quietly, as command-line tools do, instead
/// of failing on a closed pipe. Not for `serve`, which must outlive clients that hang up.
fn exit_quietly_on_closed_pipe() {
    #[cfg(unix)]
    // SAFETY: restoring the default action of one signal at start-up, before any thread exists.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if !matches!(cli.command, Command::Serve(_)) {
        exit_quietly_on_closed_pipe();
    }
    let result = match cli.command {
        Command::Serve(args) => tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .context("starting the async runtime")
            .map_err(Failure::from)
            .and_then(|rt| rt.block_on(serve(args))),
        Command::Inspect(args) => inspect(args),
        Command::Plan(args) => plan(args),
        Command::Sweep(args) => sweep(args),
        Command::Gate(args) => run_gate(args),
        Command::Validate(args) => validate_cmd::run(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(f) => {
            eprintln!("error: {:#}", f.error);
            ExitCode::from(f.code)
        }
    }
}
