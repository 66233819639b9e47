//! One planning job, as `remat plan`, `remat validate` and `POST /v1/plans` run it: load the
//! model, measure its costs when asked, plan, run the plan on the executor when asked, and
//! build the plan document. [`PlanJob`] is the builder; every setter says its default.

use super::costs::{flops_costs, measure_costs, roofline_costs};
use super::execute::{validate_schedule, validation_report};
use super::load::{load, Loaded};
use super::maximize;
use super::reuse;
use super::solve::{
    infeasible_message, plan_document, plan_loaded_reusing, plan_options, solver_error, Planned,
};
use crate::engine::document::{MaximizeReport, PlanDocument};
use crate::engine::{EngineError, ErrorKind, History, ModelFormat, NoHistory, Phase, PlanRequest};
use remat_exec::{ExecDevice, ValidateOptions};
use remat_solver::plan::Status;
use remat_solver::{Cancel, SolverError};

/// Threads the exact solver may use by default: the machine's cores, at most 2.
pub fn default_threads() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
        .min(2)
}

/// Where the solver's costs come from (node-link graphs always keep their own).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Costs {
    /// Each op's seconds by the roofline: FLOPs and bytes moved at the process's rates
    /// ([`super::rates`]).
    Roofline,
    /// The importer's FLOPs of each op.
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
        /// The one solver the plan was asked of (`None` for `auto`): where the budget is at
        /// or above the least peak remat knows, that solver alone found nothing, and the
        /// error says so instead of calling the budget infeasible.
        solver: Option<String>,
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
        match self {
            Stop::Infeasible {
                budget_bytes,
                min_feasible_budget_bytes,
                solver,
            } => {
                let e = solver_error(SolverError::Infeasible {
                    budget: *budget_bytes,
                    min_feasible: *min_feasible_budget_bytes,
                });
                Some(match solver {
                    Some(s) => EngineError {
                        message: infeasible_message(
                            *budget_bytes,
                            *min_feasible_budget_bytes,
                            Some(s),
                            &|b| format!("{b} bytes"),
                        ),
                        details: {
                            let mut d = e.details.clone();
                            d["solver"] = s.as_str().into();
                            d
                        },
                        ..e
                    },
                    None => e,
                })
            }
            _ => None,
        }
    }
}

/// One model loaded and planned, before its run and its document.
struct Solved<'a> {
    loaded: Loaded<'a>,
    cost_model: Option<crate::engine::document::CostModel>,
    opts: remat_solver::plan::PlanOptions,
    planned: Planned,
    /// The documents of [`PlanJob::reuse_found`] left out, each with why.
    reuse_skipped: Vec<(String, String)>,
}

/// What a job produced.
pub struct PlanOutcome<'a> {
    pub loaded: Loaded<'a>,
    pub planned: Planned,
    pub document: PlanDocument,
    pub stop: Stop,
    /// The documents of [`PlanJob::reuse_found`] that are not plans of the loaded graph, each
    /// with why (the CLI prints them).
    pub reuse_skipped: Vec<(String, String)>,
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
/// let outcome = PlanJob::new(&bytes, &request).costs(Costs::Roofline).validate(true).run()?;
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
    timing_rounds: usize,
    validate: bool,
    on_phase: Option<&'a (dyn Fn(Phase) + 'a)>,
    history: &'a dyn History,
    reuse: &'a [(String, serde_json::Value)],
    reuse_found: &'a [(String, serde_json::Value)],
    cancel: Cancel,
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
            costs: Costs::Roofline,
            device: ExecDevice::Cpu,
            seed: 0,
            timing_rounds: request
                .timing_rounds
                .map_or(ValidateOptions::default().min_timing_rounds, |n| n as usize),
            validate: request.validate == Some(true),
            on_phase: None,
            history: &NoHistory,
            reuse: &[],
            reuse_found: &[],
            cancel: Cancel::default(),
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

    /// Where the solver's costs come from. Default: [`Costs::Roofline`].
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

    /// Timing rounds at least when the plan is run ([`ValidateOptions::min_timing_rounds`]).
    /// Default: 2.
    pub fn timing_rounds(mut self, rounds: usize) -> Self {
        self.timing_rounds = rounds;
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

    /// The plans the service made of this model before: those of the same dims, parameters
    /// and inputs whose peak fits the budget (the cheapest [`reuse::MAX_REUSED`]) are offered
    /// to the plan, which returns one of them, less the recomputations its budget does not
    /// need, when it finds nothing cheaper (`reused_from_budget_bytes` says so). A stored plan
    /// that is not a schedule of the loaded graph is left out. Not with `maximize`. Default:
    /// none.
    pub fn history(mut self, history: &'a dyn History) -> Self {
        self.history = history;
        self
    }

    /// Plan documents (`remat plan --json`) of this model, each with where it came from (a
    /// file's name), offered to the plan like [`PlanJob::history`]'s where their peak fits
    /// the budget; one that is not a schedule of the loaded graph is an `invalid_option` error
    /// naming it. Not with `maximize`. Default: none.
    pub fn reuse(mut self, documents: &'a [(String, serde_json::Value)]) -> Self {
        self.reuse = documents;
        self
    }

    /// Documents found in a folder (`remat plan --reuse DIR`), each with its file's name:
    /// offered like [`PlanJob::reuse`]'s, but one that is not a plan of the loaded graph (another
    /// model's, not a plan at all) is left out and named in the outcome's `reuse_skipped`.
    /// Default: none.
    pub fn reuse_found(mut self, documents: &'a [(String, serde_json::Value)]) -> Self {
        self.reuse_found = documents;
        self
    }

    /// Stops the job at its next look once raised ([`EngineError::cancelled`]): in the plan
    /// (`remat_solver::cancel`), between the values `maximize` tries, before the run.
    /// Default: never.
    pub fn cancel(mut self, cancel: &Cancel) -> Self {
        self.cancel = cancel.clone();
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
            timing_rounds: self.timing_rounds,
            validate: self.validate,
            on_phase: self.on_phase,
            history: self.history,
            reuse: self.reuse,
            reuse_found: self.reuse_found,
            cancel: self.cancel,
            progress,
        }
    }

    /// The executor's options for a run of this job's plan at `budget_bytes`.
    pub fn validate_options(&self, budget_bytes: Option<u64>) -> ValidateOptions {
        ValidateOptions {
            device: self.device,
            seed: self.seed,
            budget_bytes,
            min_timing_rounds: self.timing_rounds,
            cancel: self.cancel.clone(),
            ..ValidateOptions::default()
        }
    }

    /// The first stage alone: the model loaded into a solver problem (costs as imported).
    pub fn load(&self) -> Result<Loaded<'a>, EngineError> {
        load(self.model, ModelFormat::detect(self.model), self.request)
    }

    /// Replaces the loaded problem's costs when the job asks for FLOPs or measures them;
    /// returns the cost model (`None` with FLOPs, and for a node-link graph).
    pub fn measure_costs(
        &self,
        loaded: &mut Loaded<'a>,
    ) -> Result<Option<crate::engine::document::CostModel>, EngineError> {
        self.measure_costs_for(loaded, self.request)
    }

    fn measure_costs_for(
        &self,
        loaded: &mut Loaded<'a>,
        request: &PlanRequest,
    ) -> Result<Option<crate::engine::document::CostModel>, EngineError> {
        match self.costs {
            Costs::Roofline => Ok(roofline_costs(loaded)),
            Costs::Flops => {
                flops_costs(loaded);
                Ok(None)
            }
            Costs::Measured => measure_costs(loaded, request, self.threads, self.device).map(Some),
        }
    }

    /// Runs the whole job: load → costs → options → plan → run (when asked and feasible) →
    /// document. With the request's `maximize`, the search for the largest value of that dim
    /// comes first ([`PlanJob::run_maximize`]).
    pub fn run(&self) -> Result<PlanOutcome<'a>, EngineError> {
        if let Some(dim) = &self.request.maximize {
            return self.run_maximize(dim);
        }
        self.run_loaded(self.load()?)
    }

    /// Runs the job on a model [`PlanJob::load`] loaded: costs → options → plan → run (when
    /// asked and feasible) → document. An infeasible budget is an `Ok` whose `stop` says so.
    pub fn run_loaded(&self, loaded: Loaded<'a>) -> Result<PlanOutcome<'a>, EngineError> {
        let solved = self.solve(loaded, self.request, false)?;
        self.cancelled()?;
        self.finish(solved, None)
    }

    /// Costs, options and the plan of one loaded model under `request`; with `quick`, a
    /// budget at or above the store-all peak takes store-all without a search (nothing is
    /// cheaper).
    fn solve(
        &self,
        mut loaded: Loaded<'a>,
        request: &PlanRequest,
        quick: bool,
    ) -> Result<Solved<'a>, EngineError> {
        let cost_model = self.measure_costs_for(&mut loaded, request)?;
        let mut opts = plan_options(&loaded.problem, request, self.threads, &self.cancel)?;
        if quick && remat_solver::store_all_peak(&loaded.problem) <= opts.budget {
            opts.algorithm = remat_solver::plan::Algorithm::StoreAll;
        }
        let (earlier, reuse_skipped) = if quick {
            (Vec::new(), Vec::new())
        } else {
            self.earlier(&loaded, request, opts.budget)?
        };
        self.phase(Phase::Solving);
        let mut planned = plan_loaded_reusing(&loaded, &opts, &earlier)?;
        // Asked for the least budget, the plan says it is: that budget is the least.
        if request
            .budget
            .as_deref()
            .is_some_and(remat_solver::plan::is_min_budget)
        {
            planned
                .report
                .min_feasible_budget_bytes
                .get_or_insert(opts.budget);
        }
        Ok(Solved {
            loaded,
            cost_model,
            opts,
            planned,
            reuse_skipped,
        })
    }

    /// The run (when asked and feasible) and the document of a solved job; a run stopped by
    /// the job's cancel flag is the job's error, not a validation that did not happen.
    fn finish(
        &self,
        solved: Solved<'a>,
        maximize: Option<MaximizeReport>,
    ) -> Result<PlanOutcome<'a>, EngineError> {
        let Solved {
            loaded,
            cost_model,
            opts,
            planned,
            reuse_skipped,
        } = solved;
        let outcome = if planned.report.status == Status::Infeasible {
            None
        } else if self.validate {
            self.phase(Phase::Validating);
            let vopts = self.validate_options(Some(opts.budget));
            let run = self
                .progress
                .task(|p| validate_schedule(&loaded, &planned.schedule, &vopts, p));
            if let Err(e) = &run {
                if e.kind == ErrorKind::Cancelled {
                    return Err(e.clone());
                }
            }
            Some(run)
        } else {
            None
        };
        let stop = match &outcome {
            _ if planned.report.status == Status::Infeasible => Stop::Infeasible {
                budget_bytes: opts.budget,
                min_feasible_budget_bytes: planned.report.min_feasible_budget_bytes.unwrap_or(0),
                solver: (opts.algorithm != remat_solver::plan::Algorithm::Auto)
                    .then(|| opts.algorithm.to_string()),
            },
            None => Stop::Planned,
            Some(Ok(v)) => Stop::Validated { ok: v.ok },
            Some(Err(e)) => Stop::NotRun(e.clone()),
        };
        let validation = validation_report(&loaded, outcome.as_ref());
        let mut document = plan_document(&loaded, &planned, validation, cost_model);
        document.maximize = maximize;
        Ok(PlanOutcome {
            loaded,
            planned,
            document,
            stop,
            reuse_skipped,
        })
    }

    /// `maximize`: the largest value of `dim` whose plan fits the budget within the
    /// request's `max_overhead` ([`maximize::largest_fitting`]: doubling from the request's
    /// value of the dim, or 1, then bisection), and that plan, run when asked. Each value is
    /// planned with the request's solver and time limit; a value whose least possible peak
    /// ([`remat_solver::Problem::footprint_lower_bound`]) is over the budget is not planned.
    /// When not even 1 fits, the answer is the `nothing_fits` error with every probe.
    pub fn run_maximize(&self, dim: &str) -> Result<PlanOutcome<'a>, EngineError> {
        let limits = maximize::check(self.request)?;
        let budget_bytes = limits.budget_bytes;
        let format = ModelFormat::detect(self.model);
        super::load::refuse_options(format, self.request)?;
        let start = self.request.dims.get(dim).copied().unwrap_or(1);
        let mut probes = Vec::new();
        let mut best: Option<(u64, Solved<'a>)> = None;
        let search = maximize::largest_fitting(start, maximize::MAX_VALUE, |value| {
            self.cancelled()?;
            let mut req = self.request.clone();
            req.maximize = None;
            req.dims.insert(dim.to_string(), value);
            let loaded = match load(self.model, format, &req) {
                Ok(loaded) => loaded,
                // A value the model cannot be imported at (GPT-2's positions end at n_positions:
                // its Gather refuses seq=256), once a smaller one imported: that value does not
                // fit, and the search goes on below it. At the first value, the error is the
                // request's (a dim the model lacks) and is the answer.
                Err(e) if !probes.is_empty() && e.kind == ErrorKind::BadInput => {
                    probes.push(maximize::probe_not_imported(value, &e.message));
                    return Ok(false);
                }
                Err(e) => return Err(maximize::at_value(dim, value, e)),
            };
            let peak = remat_solver::store_all_peak(&loaded.problem);
            let floor = loaded.problem.footprint_lower_bound();
            if floor > budget_bytes {
                probes.push(maximize::probe_below_floor(
                    value,
                    peak,
                    floor,
                    budget_bytes,
                ));
                return Ok(false);
            }
            let solved = self
                .solve(loaded, &req, true)
                .map_err(|e| maximize::at_value(dim, value, e))?;
            let probe = maximize::probe(value, peak, &solved.planned.report, limits.max_overhead);
            let fits = probe.fits;
            probes.push(probe);
            if fits && best.as_ref().is_none_or(|(v, _)| value > *v) {
                best = Some((value, solved));
            }
            Ok(fits)
        })?;
        let Some((value, solved)) = best else {
            return Err(maximize::nothing_fits(dim, &probes));
        };
        debug_assert_eq!(search.best, Some(value));
        self.cancelled()?;
        let report = MaximizeReport {
            dim: dim.to_string(),
            value,
            budget_bytes,
            max_overhead: self.request.max_overhead,
            next_value: search.next,
            probes,
        };
        self.finish(solved, Some(report))
    }

    /// The plans found before that this plan is offered: the documents given, those found
    /// that are plans of this graph, then the history's (the plan compares them all and keeps
    /// the cheapest); and the found ones left out, with why.
    #[allow(clippy::type_complexity)]
    fn earlier(
        &self,
        loaded: &Loaded<'a>,
        request: &PlanRequest,
        budget: u64,
    ) -> Result<(Vec<remat_solver::plan::Earlier>, Vec<(String, String)>), EngineError> {
        let mut earlier = Vec::new();
        let mut skipped = Vec::new();
        let from_document =
            |document| reuse::from_document(&loaded.problem, loaded.inspect.as_ref(), document);
        for (name, document) in self.reuse_found {
            match from_document(document) {
                Ok(e) => earlier.push(e),
                Err(e) => skipped.push((name.clone(), e)),
            }
        }
        for (name, document) in self.reuse {
            let e = from_document(document).map_err(|e| {
                EngineError::new(
                    ErrorKind::BadInput,
                    "invalid_option",
                    format!("reuse {name}: {e}"),
                )
            })?;
            earlier.push(e);
        }
        earlier.extend(reuse::from_history(
            self.history,
            &loaded.problem,
            request,
            budget,
        ));
        Ok((earlier, skipped))
    }

    /// `Err(EngineError::cancelled())` once the job's cancel flag is raised.
    fn cancelled(&self) -> Result<(), EngineError> {
        if self.cancel.is_cancelled() {
            return Err(EngineError::cancelled());
        }
        Ok(())
    }

    fn phase(&self, phase: Phase) {
        if let Some(f) = self.on_phase {
            f(phase);
        }
    }
}
