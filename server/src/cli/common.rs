//! What the subcommands share: the exit-code carrying [`Failure`] (`anyhow` lives only in the
//! binary), the model arguments, the executor arguments, JSON output and the progress bar.

use anyhow::Context;
use clap::{Args, ValueEnum};
use remat_exec::ExecDevice;
use remat_server::engine::{EngineError, ErrorKind, PlanRequest};
use remat_server::human_bytes;
use remat_server::pipeline::{Costs, Progress};
use std::path::{Path, PathBuf};

/// A failure with the exit code it deserves: 1 internal (or a validation that failed its
/// checks), 2 bad input, 3 infeasible budget.
pub struct Failure {
    pub code: u8,
    pub error: anyhow::Error,
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

/// Exits with 130 at once when a second signal stopped `remat serve` or `remat worker`
/// ([`remat_server::http::Stopped::GaveBack`]): the workers' threads still run the jobs that
/// were put back in the queue, and nothing may wait for them.
pub fn exit_if_gave_back(stopped: remat_server::http::Stopped) {
    if stopped == remat_server::http::Stopped::GaveBack {
        std::process::exit(130);
    }
}

impl Failure {
    /// A failure with `code` and a message.
    pub fn new(code: u8, message: impl std::fmt::Display) -> Failure {
        Failure {
            code,
            error: anyhow::anyhow!("{message}"),
        }
    }

    /// Exit 3: no schedule fits `budget_bytes`; the message gives the least budget that does.
    pub fn infeasible(
        budget_bytes: u64,
        min_feasible_budget_bytes: u64,
        solver: Option<&str>,
    ) -> Failure {
        Failure::new(
            3,
            remat_server::pipeline::infeasible_message(
                budget_bytes,
                min_feasible_budget_bytes,
                solver,
                &|b| format!("{b} bytes ({})", human_bytes(b)),
            ),
        )
    }
}

/// The model file and how to read it.
#[derive(Args, Clone)]
pub struct ModelArgs {
    /// ONNX model (.onnx) or node-link graph JSON
    pub model: PathBuf,
    /// Bind a symbolic dimension: NAME=VALUE (NAME is the model's own dim_param; a dim without a
    /// name, with the value -1 or named "?", is INPUT:AXIS, e.g. --dim x:0=8)
    #[arg(long = "dim", value_name = "NAME=VALUE", value_parser = parse_dim)]
    pub dims: Vec<(String, u64)>,
    /// Treat this graph input, or this initializer, as a parameter (overrides the importer's
    /// rule: a one-element initializer is otherwise a constant, as the notes say); a glob
    /// pattern (*, ?, [...]) names every graph input and initializer it matches
    #[arg(long = "param", value_name = "NAME")]
    pub params: Vec<String>,
    /// Treat this graph input as data, not a parameter (overrides the importer's rule); on an
    /// initializer, the same as --freeze; a glob pattern names every name it matches
    #[arg(long = "input", value_name = "NAME")]
    pub inputs: Vec<String>,
    /// A weight the training keeps frozen (a frozen backbone, LoRA's base weights): held all
    /// step, no gradient, no backward of its own; a graph input or an initializer, or a glob
    /// pattern of them: --freeze 'backbone.*'
    #[arg(long = "freeze", value_name = "NAME")]
    pub frozen: Vec<String>,
}

impl ModelArgs {
    /// The request these arguments make: dims, parameters, inputs, and the file's stem as
    /// the model's name; the subcommand adds its solver options.
    pub fn request(&self) -> PlanRequest {
        PlanRequest {
            dims: self.dims.iter().cloned().collect(),
            params: self.params.clone(),
            inputs: self.inputs.clone(),
            frozen: self.frozen.clone(),
            name: self
                .model
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned()),
            ..PlanRequest::default()
        }
    }

    /// The model file's bytes (exit 2 when it cannot be read, or when a `--dim` is given
    /// twice with two values: which one was meant is not for remat to guess).
    pub fn read(&self) -> Result<Vec<u8>, Failure> {
        for (i, (name, value)) in self.dims.iter().enumerate() {
            if let Some((_, other)) = self.dims[..i].iter().find(|(n, v)| n == name && v != value) {
                return Err(Failure::new(
                    2,
                    format!("--dim {name} is given twice, as {other} and {value}: give it once"),
                ));
            }
        }
        read_model(&self.model)
    }
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

fn read_model(path: &Path) -> Result<Vec<u8>, Failure> {
    remat_server::engine::ModelFormat::read_file(path)
        .map_err(|e| Failure::new(2, format!("model {e}")))
}

/// The executor's device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
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

/// Where the solver's costs come from.
#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum CostArg {
    /// Seconds per op by the roofline: FLOPs and bytes moved at the rates of --rates
    /// (remat's CPU defaults without it)
    Roofline,
    /// FLOPs of each op (the importer's estimate)
    Flops,
    /// Seconds per op, measured by running the store-all step on the device (fastest of 3)
    Measured,
}

impl From<CostArg> for Costs {
    fn from(c: CostArg) -> Self {
        match c {
            CostArg::Roofline => Costs::Roofline,
            CostArg::Flops => Costs::Flops,
            CostArg::Measured => Costs::Measured,
        }
    }
}

/// The executor's options of `plan` and `validate`.
#[derive(Args, Clone, Copy)]
pub struct ExecArgs {
    /// The executor's device (for the plan's run and for --cost measured)
    #[arg(long, value_enum, default_value_t = DeviceArg::Cpu)]
    pub device: DeviceArg,
    /// Solver costs: seconds per op by the roofline, FLOPs of each op, or seconds measured by
    /// running each op on the device
    #[arg(long, value_enum, default_value_t = CostArg::Roofline)]
    pub cost: CostArg,
    /// When the plan is run: timing rounds at least (store-all and the plan side by side in
    /// each; rounded up to a pair). The default takes 2 and up to 8 while they last under two
    /// seconds; more steady the measured overhead on a busy machine
    #[arg(long, value_name = "N", default_value_t = 2, value_parser = clap::value_parser!(u16).range(2..=1000))]
    pub timing_rounds: u16,
}

/// Prints a value as pretty JSON, its fields in their declared order.
pub fn print_json(value: &impl serde::Serialize) -> Result<(), Failure> {
    let text = serde_json::to_string_pretty(value).context("serializing JSON")?;
    println!("{text}");
    Ok(())
}

/// Prints the importer's notes on stderr (one-element initializers taken for constants, and
/// how to train them), whatever the output's form: they are in the JSON's `model.notes` too.
pub fn print_notes(report: Option<&remat_planner::InspectReport>) {
    for n in report.iter().flat_map(|r| &r.notes) {
        eprintln!("note: {n}");
    }
}

/// Prints a plan or sweep document as pretty JSON ([`document_text`]).
pub fn print_document(document: &impl serde::Serialize) -> Result<(), Failure> {
    println!("{}", document_text(document)?);
    Ok(())
}

/// A plan or sweep document as pretty JSON text, as the service stores it: through a JSON
/// value, whose objects keep their keys sorted, so the CLI and the API give the same text.
pub fn document_text(document: &impl serde::Serialize) -> Result<String, Failure> {
    let value = serde_json::to_value(document).context("serializing JSON")?;
    Ok(serde_json::to_string_pretty(&value).context("serializing JSON")?)
}

/// The executor's progress on a terminal (hidden otherwise): one bar per run.
pub struct Bar;

impl Progress for Bar {
    fn task<R>(&self, work: impl FnOnce(&mut (dyn FnMut(&str, usize, usize) + Send)) -> R) -> R {
        let bar = indicatif::ProgressBar::new(0);
        bar.set_style(
            indicatif::ProgressStyle::with_template(
                "{msg:>16} [{bar:40}] {pos}/{len} steps {elapsed}",
            )
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
            .progress_chars("=> "),
        );
        let mut phase = String::new();
        let r = work(&mut |p: &str, done: usize, total: usize| {
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
}
