//! The command line: one module per subcommand, each with its arguments and an `exec` that
//! calls the library and decides the exit code ([`common::Failure`]).

mod calibrate;
pub mod common;
mod gate;
mod inspect;
mod plan;
mod serve;
mod sweep;
mod validate;
mod worker;

use clap::{Parser, Subcommand};
use common::Failure;

#[derive(Parser)]
#[command(name = "remat", version, about = "Plans activation checkpointing (rematerialization) for neural-network training", long_about = None)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
    /// Roofline rates to plan ONNX models with (a file `remat calibrate` wrote); remat's CPU
    /// defaults otherwise (docs/cost-model.md)
    #[arg(long, global = true, env = "REMAT_RATES", value_name = "FILE")]
    pub rates: Option<std::path::PathBuf>,
}

impl Cli {
    /// Installs the rates of `--rates` / `REMAT_RATES` (exit 2 naming the file when it is not
    /// a rates file).
    pub fn install_rates(&self) -> Result<(), Failure> {
        if let Some(path) = &self.rates {
            let r = remat_server::pipeline::rates::read(path).map_err(|e| Failure::new(2, e))?;
            remat_server::pipeline::rates::set(r).map_err(|e| Failure::new(2, e))?;
        }
        Ok(())
    }
}

#[derive(Subcommand)]
pub enum Command {
    /// Run the planning service (HTTP API and plan store)
    Serve(serve::ServeArgs),
    /// Import an ONNX model and summarize its training graph
    Inspect(inspect::InspectArgs),
    /// Plan a model or node-link graph under a memory budget
    Plan(plan::PlanArgs),
    /// The Pareto frontier: overhead at a range of budgets, with the baselines
    Sweep(sweep::SweepArgs),
    /// Fail CI when training memory regresses against a baseline (exit 1), 2 on bad input
    Gate(gate::GateArgs),
    /// Plan a model and run the plan on the executor: measured memory, time and gradient check
    /// (exit 1 when the check fails)
    Validate(validate::ValidateArgs),
    /// Take solve and validation jobs from the shared PostgreSQL queue of `remat serve
    /// --db postgres://...` replicas (no HTTP)
    Worker(worker::WorkerArgs),
    /// Fit the roofline's rates to op times measured on this machine's executor, for
    /// `--rates` (docs/cost-model.md)
    Calibrate(calibrate::CalibrateArgs),
}

impl Command {
    /// Whether the command serves clients (which may hang up) rather than writing to a pipe.
    pub fn serves(&self) -> bool {
        matches!(self, Command::Serve(_) | Command::Worker(_))
    }

    /// Runs the subcommand.
    pub fn exec(self) -> Result<(), Failure> {
        match self {
            Command::Serve(args) => serve::exec(args),
            Command::Inspect(args) => inspect::exec(args),
            Command::Plan(args) => plan::exec(args),
            Command::Sweep(args) => sweep::exec(args),
            Command::Gate(args) => gate::exec(args),
            Command::Validate(args) => validate::exec(args),
            Command::Worker(args) => worker::exec(args),
            Command::Calibrate(args) => calibrate::exec(args),
        }
    }
}
