//! One planning job, as `remat plan`, `remat validate` and `POST /v1/plans` run it: load the
//! model, measure its costs when asked, plan, run the plan on the executor when asked, and
//! build the plan document. [`PlanJob`] is the builder; every setter says its default.

use super::costs::measure_costs;
use super::execute::{validate_schedule, validation_report};
use super::load::{load, Loaded};
use super::solve::{plan_document, plan_loaded, plan_options, solver_error, Planned};
use crate::engine::document::PlanDocument;
use crate::engine::{EngineError, ModelFormat, Phase, PlanRequest};
use remat_exec::{ExecDevice, ValidateOptions};
use remat_solver::plan::Status;
use remat_solver::SolverError;

/// Threads the exact solver may use by default: the machine's cores, at most 2.
pub fn default_threads() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
        .min(2)
}

/// Where the solver's costs come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Costs {
    /// The importer's FLOPs of each op (node-link graphs: their own costs).
    Flops,
    /// Each op's seconds, measured by running the store-all step on the job's device (the
    /// fastest of 3 runs); ONNX models only.
    Measured,
}

/// How a job shows the executor's progress: each executor run of the job (the plan's
/// validation) happens inside [`Progress::task`], which hands it a callback
/// `(phase, steps done, steps in all)`.
pub trait Progress {
    fn task<R>(&self, work: impl FnOnce(&mut (dyn FnMut(&str, usize, usize) + Send)) -> R) -> R;
}

/// Progress shown nowhere (the service's jobs).
#[derive(Debug, Clone, Copy, Default)]
pub struct Quiet;

impl Progress for Quiet {
    fn task<R>(&self, work: impl FnOnce(&mut (dyn FnMut(&str, usize, usize) + Send)) -> R) -> R {
        work(&mut |_, _, _| {})
    }
}

/// Why a job ended where it did.
#[derive(Debug, Clone, PartialEq)]
pub enum Stop {
    /// No schedule fits the budget: the document has no schedule and no decisions, and says
    /// the least budget that fits.
    Infeasible {
        budget_bytes: u64,
        min_feasible_budget_bytes: u64,
    },
    /// Planned; nobody asked to run the plan.
    Planned,
    /// Planned and run on the executor: whether the run passed its checks (the document's
    /// `validation.problems` lists what failed).
    Validated { ok: bool },
    /// Planned, but the run that was asked for could not happen (the document's `validation`
    /// gives the reason).
    NotRun(EngineError),
}

impl Stop {
    /// For callers that need a schedule: the `infeasible_budget` error of an infeasible job
    /// (422 with the budget and the minimum feasible budget in its details).
    pub fn infeasible_error(&self) -> Option<EngineError> {
        match *self {
            Stop::Infeasible {
                budget_bytes,
                min_feasible_budget_bytes,
            } => Some(solver_error(SolverError::Infeasible {
                budget: budget_bytes,
                min_feasible: min_feasible_budget_bytes,
            })),
            _ => None,
        }
    }
}

/// What a job produced.
pub struct PlanOutcome<'a> {
    pub loaded: Loaded<'a>,
    pub planned: Planned,
    pub document: PlanDocument,
    pub stop: Stop,
}

/// One planning job: a model and its options, then what to do beyond the plan.
///
/// ```no_run
/// # use remat_server::engine::PlanRequest;
/// # use remat_server::pipeline::{Costs, PlanJob};
/// let bytes = std::fs::read("fixtures/grad/tiny_cnn.onnx")?;
/// let request = PlanRequest {
///     budget: Some("0.95x".into()),
///     dims: [("batch".to_string(), 2)].into(),
///     ..PlanRequest::default()
/// };
/// let outcome = PlanJob::new(&bytes, &request).costs(Costs::Flops).validate(true).run()?;
/// println!("{:?}: peak {}", outcome.stop, outcome.document.report.predicted.peak_bytes);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct PlanJob<'a, P = Quiet> {
    model: &'a [u8],
    request: &'a PlanRequest,
    threads: usize,
    costs: Costs,
    device: ExecDevice,
    seed: u64,
    validate: bool,
    on_phase: Option<&'a (dyn Fn(Phase) + 'a)>,
    progress: P,
}

impl<'a> PlanJob<'a> {
    /// A job for `model` (ONNX bytes or node-link JSON, told apart by
    /// [`ModelFormat::detect`]) with the options of `request`.
    pub fn new(model: &'a [u8], request: &'a PlanRequest) -> PlanJob<'a> {
        PlanJob {
            model,
            request,
            threads: default_threads(),
            costs: Costs::Flops,
            device: ExecDevice::Cpu,
            seed: 0,
            validate: request.validate == Some(true),
            on_phase: None,
            progress: Quiet,
        }
    }
}

impl<'a, P: Progress> PlanJob<'a, P> {
    /// Threads the exact solver may use. Default: [`default_threads`] (the machine's cores,
    /// at most 2).
    pub fn threads(mut self, threads: usize) -> Self {
        self.threads = threads;
        self
    }

    /// Where the solver's costs come from. Default: [`Costs::Flops`].
    pub fn costs(mut self, costs: Costs) -> Self {
        self.costs = costs;
        self
    }

    /// The executor's device, for the run and for measured costs. Default: the CPU.
    pub fn device(mut self, device: ExecDevice) -> Self {
        self.device = device;
        self
    }

    /// Seed of the run's generated inputs and of the weights the file does not store.
    /// Default: 0.
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }

    /// Whether to run the plan on the executor (feasible plans only). Default: the request's
    /// `validate` (no run when it is absent).
    pub fn validate(mut self, validate: bool) -> Self {
        self.validate = validate;
        self
    }

    /// Called as the job enters a phase (solving, then validating). Default: nothing is
    /// called.
    pub fn on_phase(mut self, on_phase: &'a (dyn Fn(Phase) + 'a)) -> Self {
        self.on_phase = Some(on_phase);
        self
    }

    /// How the executor's progress is shown. Default: [`Quiet`] (nowhere).
    pub fn progress<Q: Progress>(self, progress: Q) -> PlanJob<'a, Q> {
        PlanJob {
            model: self.model,
            request: self.request,
            threads: self.threads,
            costs: self.costs,
            device: self.device,
            seed: self.seed,
            validate: self.validate,
            on_phase: self.on_phase,
            progress,
        }
    }

    /// The executor's options for a run of this job's plan at `budget_bytes`.
    pub fn validate_options(&self, budget_bytes: Option<u64>) -> ValidateOptions {
        ValidateOptions {
            device: self.device,
            seed: self.seed,
            budget_bytes,
            ..ValidateOptions::default()
        }
    }

    /// The first stage alone: the model loaded into a solver problem (costs as imported).
    pub fn load(&self) -> Result<Loaded<'a>, EngineError> {
        load(self.model, ModelFormat::detect(self.model), self.request)
    }

    /// Replaces the loaded problem's costs when the job measures them; returns what the
    /// measurement found (`None` with FLOPs).
    pub fn measure_costs(
        &self,
        loaded: &mut Loaded<'a>,
    ) -> Result<Option<crate::engine::document::CostModel>, EngineError> {
        match self.costs {
            Costs::Flops => Ok(None),
            Costs::Measured => {
                measure_costs(loaded, self.request, self.threads, self.device).map(Some)
            }
        }
    }

    /// Runs the whole job: load → costs → options → plan → run (when asked and feasible) →
    /// document.
    pub fn run(&self) -> Result<PlanOutcome<'a>, EngineError> {
        self.run_loaded(self.load()?)
    }

    /// Runs the job on a model [`PlanJob::load`] loaded: costs → options → plan → run (when
    /// asked and feasible) → document. An infeasible budget is an `Ok` whose `stop` says so.
    pub fn run_loaded(&self, mut loaded: Loaded<'a>) -> Result<PlanOutcome<'a>, EngineError> {
        let cost_model = self.measure_costs(&mut loaded)?;
        let opts = plan_options(&loaded.problem, self.request, self.threads)?;
        self.phase(Phase::Solving);
        let planned = plan_loaded(&loaded, &opts)?;
        let outcome = if planned.report.status == Status::Infeasible {
            None
        } else if self.validate {
            self.phase(Phase::Validating);
            let vopts = self.validate_options(Some(opts.budget));
            Some(
                self.progress
                    .task(|p| validate_schedule(&loaded, &planned.schedule, &vopts, p)),
            )
        } else {
            None
        };
        let stop = match &outcome {
            _ if planned.report.status == Status::Infeasible => Stop::Infeasible {
                budget_bytes: opts.budget,
                min_feasible_budget_bytes: planned.report.min_feasible_budget_bytes.unwrap_or(0),
            },
            None => Stop::Planned,
            Some(Ok(v)) => Stop::Validated { ok: v.ok },
            Some(Err(e)) => Stop::NotRun(e.clone()),
        };
        let validation = validation_report(&loaded, outcome.as_ref());
        let document = plan_document(&loaded, &planned, validation, cost_model);
        Ok(PlanOutcome {
            loaded,
            planned,
            document,
            stop,
        })
    }

    fn phase(&self, phase: Phase) {
        if let Some(f) = self.on_phase {
            f(phase);
        }
    }
}
