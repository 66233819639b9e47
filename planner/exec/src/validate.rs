//! Validation of a plan by running it: the plan's schedule and the store-all schedule on the
//! same weights and inputs, gradients compared, memory and time measured.

use super::run::{ExecDevice, Executor, RunResult};
use crate::error::{ExecError, ExecFault};
use candle_core::Tensor;
use remat_planner::model::Model;
use remat_planner::training::TrainingGraph;
use remat_solver::{simulate, store_all, Problem, Schedule, Step};
use serde::Serialize;
use std::collections::BTreeMap;

/// What to check.
#[derive(Debug, Clone)]
pub struct ValidateOptions {
    pub device: ExecDevice,
    /// Seed of the generated inputs and of parameters the file does not store.
    pub seed: u64,
    /// The plan's budget: a measured peak above it fails the validation.
    pub budget_bytes: Option<u64>,
    /// Max relative gradient error against the store-all run.
    pub grad_tolerance: f64,
    /// Max relative difference between the measured and the predicted peak.
    pub peak_tolerance: f64,
    /// Time the schedules in rounds after the measured run: each round runs store-all and
    /// every plan (store-all first in one round of each pair, last in the other), at least
    /// two rounds and two more while they have taken less than `timing_seconds` (at most
    /// [`MAX_TIMING_ROUNDS`]); a plan's overhead is the median of its rounds' ratios to the
    /// store-all run beside it. Off when only gradients and memory
    /// matter: times then come from the measured run alone.
    pub repeat_reference: bool,
    /// Seconds of timing rounds to aim for (see `repeat_reference`).
    pub timing_seconds: f64,
    /// Timing rounds at least (rounded up to a pair), whatever `timing_seconds` says and
    /// beyond [`MAX_TIMING_ROUNDS`]: more rounds steady the median on a busy machine.
    pub min_timing_rounds: usize,
    /// The solver's cost of each training node (the plan's cost model: roofline or measured
    /// seconds), for the predicted overhead; `None`: the importer's FLOPs.
    pub costs: Option<Vec<f64>>,
    /// Stops [`validate`] after the step it is running once raised (the executor's
    /// [`Executor::cancel`]). Never by default.
    pub cancel: remat_solver::Cancel,
}

/// Timing rounds at most, unless [`ValidateOptions::min_timing_rounds`] asks for more (see
/// [`ValidateOptions::repeat_reference`]; they go in pairs).
pub const MAX_TIMING_ROUNDS: usize = 8;

impl Default for ValidateOptions {
    fn default() -> Self {
        ValidateOptions {
            device: ExecDevice::Cpu,
            seed: 0,
            budget_bytes: None,
            grad_tolerance: 1e-6,
            peak_tolerance: 0.02,
            repeat_reference: true,
            timing_seconds: 2.0,
            min_timing_rounds: 2,
            costs: None,
            cancel: remat_solver::Cancel::default(),
        }
    }
}

/// One step of the timeline: predicted (the simulator's) and measured bytes after it.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TimelinePoint {
    pub step: usize,
    pub op: &'static str,
    pub node: String,
    pub predicted_bytes: u64,
    pub measured_bytes: u64,
    /// The heap in use after the step above the run's start, plus what the executor held
    /// before the run (parameters, buffers; gradients are allocated in the run).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub heap_bytes: Option<u64>,
    /// The heap's peak during the step (its kernel's output and temporaries), counted as
    /// `heap_bytes`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub heap_peak_bytes: Option<u64>,
    /// On CUDA: device memory in use (cuMemGetInfo) above the run's start, plus what the
    /// executor held before the run.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device_bytes: Option<u64>,
    pub seconds: f64,
}

/// A node whose computed value does not hold the bytes the training graph predicts.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct BytesMismatch {
    pub node: String,
    pub op: String,
    pub predicted_bytes: u64,
    pub measured_bytes: u64,
}

/// Time spent per op type in the plan's run.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct OpTime {
    pub op: String,
    pub seconds: f64,
    pub computations: u32,
}

/// The result of running a plan (the JSON `validation` object).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Validation {
    pub ran: bool,
    pub device: &'static str,
    /// Gradients match, the measured peak agrees with the prediction and fits the budget.
    pub ok: bool,
    /// Why `ok` is false.
    pub problems: Vec<String>,
    pub predicted_peak_bytes: u64,
    /// Peak of the live tensors the executor holds (each storage once), parameters, their
    /// gradients and buffers included.
    pub measured_peak_bytes: u64,
    /// `measured / predicted − 1`.
    pub peak_rel_diff: f64,
    pub measured_peak_step: usize,
    /// The heap's peak during the run above the heap in use when it started, plus what the
    /// executor held before the run (parameters, buffers; comparable with
    /// `measured_peak_bytes`); `None` when the counting allocator is not installed.
    pub heap_peak_bytes: Option<u64>,
    /// The step during which the heap peaked.
    pub heap_peak_step: Option<usize>,
    /// What the difference between the heap peak and the live-tensor peak is, and where the
    /// heap peaked.
    pub heap_note: String,
    /// On CUDA: the device's memory in use at its peak (cuMemGetInfo, so including what the
    /// CUDA allocator caches) above the run's start, plus what the executor held before the
    /// run; `None` on the CPU.
    pub device_peak_bytes: Option<u64>,
    pub budget_bytes: Option<u64>,
    /// Max over parameters of max|plan − store-all| / max|store-all|.
    pub grad_max_rel_err: f64,
    pub grad_tolerance: f64,
    pub params_checked: usize,
    /// Present when the loss is not the plain sum of the outputs' means: a `Softmax`'s
    /// output has a mean that does not depend on the parameters (its gradient is zero), so the
    /// loss weights its elements by fixed pseudo-random factors for the gradient check to have
    /// gradients to compare. Names those outputs. Also present when parameter gradients of
    /// the store-all run are all zero (says how many): the check compares those as zeros.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub grad_note: Option<String>,
    pub loss: f64,
    pub store_all_loss: f64,
    pub step_seconds: f64,
    pub store_all_step_seconds: f64,
    /// The median over the timing rounds of `plan / store-all − 1`, each round's plan run
    /// against the store-all run of the same round; `step_seconds` and `store_all_step_seconds`
    /// are the medians of their runs.
    pub measured_overhead: f64,
    /// The lowest and highest of the rounds' overheads: how far the machine's noise moves it.
    pub measured_overhead_range: [f64; 2],
    pub timing_rounds: usize,
    /// `Σ plan steps / Σ store-all steps − 1` over the same timing runs, each step (a node's
    /// computation or a free) at its least seconds over the rounds: what the plan's steps
    /// cost with the machine's slow spells left out, which slow whole rounds and move
    /// `measured_overhead` by tens of points on a shared machine (docs/cost-model.md, "The
    /// executor's measurement"). The time between steps (the run's own bookkeeping) is not
    /// in it.
    pub measured_step_overhead: f64,
    /// The simulator's overhead of the same schedule, in the plan's costs
    /// ([`ValidateOptions::costs`]; FLOPs without them).
    pub predicted_overhead: f64,
    pub recomputations: usize,
    pub running_stat_updates: usize,
    /// Max relative difference of the updated BatchNormalization running statistics against
    /// the store-all run's (recomputation must not update them twice).
    pub running_stats_max_rel_err: f64,
    pub params_from_file: usize,
    pub params_seeded: usize,
    pub op_seconds: Vec<OpTime>,
    /// Nodes whose values hold other bytes than predicted (the first 20): where a difference
    /// between the measured and the predicted peak comes from.
    pub bytes_mismatches: Vec<BytesMismatch>,
    /// Bytes of parameters, their gradients and buffers (and constants derived from
    /// parameters) as the executor holds them, against the problem's `fixed_bytes`.
    pub measured_fixed_bytes: u64,
    pub predicted_fixed_bytes: u64,
    /// Op types run on the host, inputs and outputs copied, because the GPU's kernel library
    /// lacks one of their kernels (candle's CUDA kernels cover fewer dtypes than its CPU
    /// ones); empty on the CPU.
    pub host_ops: Vec<String>,
    pub timeline: Vec<TimelinePoint>,
}

fn err(message: impl Into<String>) -> ExecError {
    ExecError::new(ExecFault::Failed, message)
}

/// Max over parameters of max|a − b| / max|b|, how many were compared, and the value whose
/// difference is that max (`None` when none differs).
pub fn grad_rel_err(
    a: &std::collections::HashMap<usize, Tensor>,
    b: &std::collections::HashMap<usize, Tensor>,
) -> crate::error::Result<(f64, usize, Option<usize>)> {
    let mut worst: f64 = 0.0;
    let mut worst_value = None;
    let mut n = 0;
    for (v, tb) in b {
        let ta = a
            .get(v)
            .ok_or_else(|| err(format!("the plan's run has no gradient for value {v}")))?;
        if ta.elem_count() != tb.elem_count() {
            return Err(err(format!("gradient shapes differ for value {v}")));
        }
        // In chunks: a whole gradient as f64 on the host, twice, was 4× its f32 bytes at once
        // (a 381 MiB gradient took 1.5 GB more than the run itself).
        let (fa, fb) = (
            ta.flatten_all().map_err(|e| err(e.to_string()))?,
            tb.flatten_all().map_err(|e| err(e.to_string()))?,
        );
        let (mut scale, mut diff) = (0.0f64, 0.0f64);
        let n_elems = fa.elem_count();
        let mut start = 0;
        while start < n_elems {
            let len = COMPARE_CHUNK.min(n_elems - start);
            let chunk = |t: &Tensor| {
                t.narrow(0, start, len)
                    .map_err(|e| err(e.to_string()))
                    .and_then(|c| flat(&c))
            };
            let (ca, cb) = (chunk(&fa)?, chunk(&fb)?);
            scale = cb.iter().fold(scale, |m, x| m.max(x.abs()));
            diff = ca.iter().zip(&cb).fold(diff, |m, (x, y)| {
                if (x - y).is_nan() {
                    f64::INFINITY
                } else {
                    m.max((x - y).abs())
                }
            });
            start += len;
        }
        let rel = if scale > 0.0 { diff / scale } else { diff };
        // Ties go to the smaller value id, so the name reported does not follow the map's order.
        if rel > worst || (rel == worst && rel > 0.0 && worst_value.is_some_and(|w| *v < w)) {
            worst = rel;
            worst_value = Some(*v);
        }
        n += 1;
    }
    Ok((worst, n, worst_value))
}

/// How many of `tensors` are all zero (a tensor that cannot be read counts as not zero: the
/// comparison reports it).
fn zero_tensors(tensors: &std::collections::HashMap<usize, Tensor>) -> usize {
    tensors
        .values()
        .filter(|t| {
            t.abs()
                .and_then(|a| a.flatten_all())
                .and_then(|a| a.max(0))
                .and_then(|m| m.to_dtype(candle_core::DType::F64))
                .and_then(|m| m.to_scalar::<f64>())
                .is_ok_and(|m| m == 0.0)
        })
        .count()
}

/// Elements compared at once by [`grad_rel_err`] (8 MiB per side as f64).
const COMPARE_CHUNK: usize = 1 << 20;

/// A tensor's values as f64 on the host.
pub fn flat(t: &Tensor) -> crate::error::Result<Vec<f64>> {
    // On the host: candle's CUDA kernels cannot convert every integer dtype.
    t.to_device(&candle_core::Device::Cpu)
        .and_then(|t| t.to_dtype(candle_core::DType::F64))
        .and_then(|t| t.flatten_all())
        .and_then(|t| t.to_vec1::<f64>())
        .map_err(|e| err(e.to_string()))
}

/// Checks that `schedule` belongs to `problem` and is valid; the simulator's error names the
/// step.
fn check_schedule(
    problem: &Problem,
    schedule: &Schedule,
) -> crate::error::Result<remat_solver::Stats> {
    simulate(problem, schedule).map_err(|e| {
        ExecError::new(
            ExecFault::InvalidSchedule,
            format!("the schedule is not valid for this model: {e}"),
        )
    })
}

/// Runs `schedule` and the store-all schedule of `tg` and compares them.
pub fn validate(
    model: &Model,
    tg: &TrainingGraph,
    model_bytes: &[u8],
    schedule: &Schedule,
    opts: &ValidateOptions,
    progress: &mut (dyn FnMut(&str, usize, usize) + Send),
) -> crate::error::Result<Validation> {
    let mut ex = Executor::new(model, tg, model_bytes, opts.device, opts.seed)?;
    ex.cancel = opts.cancel.clone();
    let mut v = validate_with(
        &mut ex,
        tg,
        &[(schedule.clone(), opts.budget_bytes)],
        opts,
        progress,
    )?;
    v.pop().ok_or_else(|| err("no validation"))
}

/// Runs several schedules (each with its budget) on one executor: the store-all run first
/// (the reference gradients), then each schedule, then store-all again (the reference time
/// is the faster of the two store-all runs).
pub fn validate_with(
    ex: &mut Executor,
    tg: &TrainingGraph,
    schedules: &[(Schedule, Option<u64>)],
    opts: &ValidateOptions,
    progress: &mut (dyn FnMut(&str, usize, usize) + Send),
) -> crate::error::Result<Vec<Validation>> {
    let problem = match &opts.costs {
        Some(c) => with_costs(&tg.to_problem(), c)?,
        None => tg.to_problem(),
    };
    let mut checked = Vec::with_capacity(schedules.len());
    for (s, _) in schedules {
        checked.push(check_schedule(&problem, s)?);
    }
    // The store-all run's gradients and each plan's are held while the next runs.
    if ex.is_cpu() {
        crate::run::fits_in_memory_holding(
            tg,
            crate::alloc::available_memory(),
            1 + schedules.len() as u64,
        )?;
    }
    let reference = store_all(&problem);
    let sa1 = ex.run(&reference, &mut |d, t| progress("store-all", d, t))?;
    let mut runs = Vec::with_capacity(schedules.len());
    for (s, _) in schedules {
        runs.push(ex.run(s, &mut |d, t| progress("plan", d, t))?);
    }
    // Timing rounds: store-all and the plans back to back, so that each plan's run is
    // compared with a store-all run taken moments from it: a machine's speed drifts within
    // minutes (docs/executor.md, "What a run checks", the time row).
    let mut sa_secs = Timed::of(&sa1);
    let mut plan_secs: Vec<Timed> = runs.iter().map(Timed::of).collect();
    if opts.repeat_reference {
        sa_secs = Timed::default();
        plan_secs.iter_mut().for_each(|t| *t = Timed::default());
        // Rounds go in pairs, store-all first in one and last in the other: the second run
        // of a round runs a few percent faster than the first (docs/bench/executor.md,
        // "Figures behind the code").
        let t0 = std::time::Instant::now();
        while sa_secs.runs.len() < opts.min_timing_rounds.max(2)
            || (sa_secs.runs.len() < MAX_TIMING_ROUNDS
                && t0.elapsed().as_secs_f64() < opts.timing_seconds)
        {
            for store_all_first in [true, false] {
                if store_all_first {
                    sa_secs.add(&timed(ex, &reference, "timing store-all", progress)?);
                }
                for ((s, _), secs) in schedules.iter().zip(plan_secs.iter_mut()) {
                    secs.add(&timed(ex, s, "timing plan", progress)?);
                }
                if !store_all_first {
                    sa_secs.add(&timed(ex, &reference, "timing store-all", progress)?);
                }
            }
        }
    }
    Ok(schedules
        .iter()
        .zip(&checked)
        .zip(runs.iter().zip(&plan_secs))
        .map(|(((s, budget), stats), (run, secs))| {
            let o = ValidateOptions {
                budget_bytes: *budget,
                ..opts.clone()
            };
            report(
                ex,
                tg,
                &problem,
                s,
                stats,
                run,
                &sa1,
                Times::of(secs, &sa_secs),
                &o,
            )
        })
        .collect())
}

/// One run of `s`.
fn timed(
    ex: &mut Executor,
    s: &Schedule,
    what: &str,
    progress: &mut (dyn FnMut(&str, usize, usize) + Send),
) -> crate::error::Result<RunResult> {
    ex.run(s, &mut |d, t| progress(what, d, t))
}

/// The timed runs of one schedule: each run's seconds, and each step's least seconds over
/// the runs (`measured_step_overhead`; the example `plan_steps` reads the steps).
#[derive(Default)]
pub struct Timed {
    runs: Vec<f64>,
    least_steps: Vec<f64>,
}

impl Timed {
    /// The timing of one run.
    pub fn of(run: &RunResult) -> Timed {
        let mut t = Timed::default();
        t.add(run);
        t
    }

    /// One more run of the same schedule.
    pub fn add(&mut self, run: &RunResult) {
        self.add_seconds(run.seconds, run.steps.iter().map(|m| m.seconds));
    }

    /// Each step's least seconds over the runs, in schedule order.
    pub fn least_steps(&self) -> &[f64] {
        &self.least_steps
    }

    fn add_seconds(&mut self, seconds: f64, steps: impl Iterator<Item = f64>) {
        if self.runs.is_empty() {
            self.least_steps = steps.collect();
        } else {
            for (least, s) in self.least_steps.iter_mut().zip(steps) {
                *least = least.min(s);
            }
        }
        self.runs.push(seconds);
    }

    /// The sum of the steps' least seconds.
    pub fn least_step_total(&self) -> f64 {
        self.least_steps.iter().sum()
    }
}

/// A plan's timing rounds against store-all's.
struct Times {
    /// Median seconds of the plan's runs and of store-all's.
    plan: f64,
    store_all: f64,
    /// The rounds' ratios `plan / store-all − 1`: their median, lowest and highest.
    overhead: f64,
    range: [f64; 2],
    rounds: usize,
    /// `Σ plan steps / Σ store-all steps − 1`, each step at its least over the runs.
    step_overhead: f64,
}

impl Times {
    fn of(plan_runs: &Timed, store_all_runs: &Timed) -> Times {
        let (plan, store_all) = (&plan_runs.runs, &store_all_runs.runs);
        let mut ratios: Vec<f64> = plan
            .iter()
            .zip(store_all)
            .filter(|(_, &s)| s > 0.0)
            .map(|(p, s)| p / s - 1.0)
            .collect();
        ratios.sort_by(f64::total_cmp);
        let least_store_all = store_all_runs.least_step_total();
        Times {
            step_overhead: if least_store_all > 0.0 {
                plan_runs.least_step_total() / least_store_all - 1.0
            } else {
                0.0
            },
            plan: median(plan),
            store_all: median(store_all),
            overhead: median(&ratios),
            range: [
                ratios.first().copied().unwrap_or(0.0),
                ratios.last().copied().unwrap_or(0.0),
            ],
            rounds: ratios.len(),
        }
    }
}

/// The median of `v` (the mean of the middle two for an even count; 0 when empty).
fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => 0.0,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

#[allow(clippy::too_many_arguments)]
fn report(
    ex: &Executor,
    tg: &TrainingGraph,
    problem: &Problem,
    schedule: &Schedule,
    stats: &remat_solver::Stats,
    plan: &RunResult,
    reference: &RunResult,
    times: Times,
    opts: &ValidateOptions,
) -> Validation {
    let mut problems = vec![];
    let (grad_err, params_checked, worst) = match grad_rel_err(&plan.grads, &reference.grads) {
        Ok(x) => x,
        Err(e) => {
            problems.push(e.to_string());
            (f64::INFINITY, 0, None)
        }
    };
    if grad_err.is_nan() || grad_err > opts.grad_tolerance {
        let of = worst.map_or(String::new(), |v| {
            format!(" (parameter {})", ex.model().values[v].name)
        });
        problems.push(format!(
            "gradients differ from the store-all run's: max relative error {grad_err:.3e}{of} > {:.0e}",
            opts.grad_tolerance
        ));
    }
    let running_err = match grad_rel_err(&plan.running_stats, &reference.running_stats) {
        Ok((e, _, _)) => e,
        Err(e) => {
            problems.push(format!("running statistics: {e}"));
            f64::INFINITY
        }
    };
    if running_err.is_nan() || running_err > opts.grad_tolerance {
        problems.push(format!(
            "BatchNormalization running statistics differ from the store-all run's: max relative error {running_err:.3e}"
        ));
    }
    let predicted = stats.peak_bytes;
    let measured = plan.live_peak_bytes;
    let rel = if predicted > 0 {
        measured as f64 / predicted as f64 - 1.0
    } else {
        0.0
    };
    if rel.abs() > opts.peak_tolerance {
        problems.push(format!(
            "measured live-tensor peak {measured} B differs from the predicted {predicted} B by {:+.2}% (tolerance ±{:.0}%)",
            rel * 100.0,
            opts.peak_tolerance * 100.0
        ));
    }
    if let Some(b) = opts.budget_bytes {
        if measured > b {
            let node = match schedule.steps.get(plan.live_peak_step) {
                Some(Step::Compute(i)) | Some(Step::Free(i)) => {
                    tg.nodes.get(*i).map(|n| n.id.clone()).unwrap_or_default()
                }
                None => String::new(),
            };
            problems.push(format!(
                "the run's measured peak {measured} B exceeds the budget {b} B at step {} ({node})",
                plan.live_peak_step
            ));
        }
    }
    // A loss that is no number compares nothing: NaN gradients equal NaN gradients.
    if !reference.loss.is_finite() || !plan.loss.is_finite() {
        problems.push(format!(
            "the loss is not finite (store-all {}, plan {}): with the inputs and weights the \
             executor seeds, an output holds NaN or infinity (an empty tensor's mean, a log of \
             zero, a division by zero), so the gradient check compares nothing",
            reference.loss, plan.loss
        ));
    }
    let zero_grads = zero_tensors(&reference.grads);
    let weighted = ex.weighted_loss_outputs();
    let zero_note = (zero_grads > 0).then(|| {
        format!(
            "{zero_grads} of {} parameter gradients are zero in the store-all run (a layer \
             initialised to zero, as torchvision ViT's head, or an output the loss does not \
             reach stops them): the check compares those as zeros",
            reference.grads.len()
        )
    });
    let softmax_note = (!weighted.is_empty()).then(|| {
        let names: Vec<&str> = weighted
            .iter()
            .map(|&v| ex.model().values[v].name.as_str())
            .collect();
        format!(
            "{names:?} {} a Softmax's output, whose mean is the same whatever the parameters (its gradient is zero): the loss weights {} elements by fixed pseudo-random factors in [0.5, 1.5) from the seed, so that the gradient check compares real gradients (the plan does not depend on the loss)",
            if names.len() == 1 { "is" } else { "are each" },
            if names.len() == 1 { "its" } else { "their" }
        )
    });
    let grad_note = match (softmax_note, zero_note) {
        (Some(a), Some(b)) => Some(format!("{a}; {b}")),
        (a, b) => a.or(b),
    };
    let fixed = ex.fixed_live_bytes();
    // The heap and the device are measured from the run's start: add what was held before it.
    let before = ex.held_before_run_bytes();
    let heap_peak = plan.heap_peak_bytes.map(|h| h + before);
    let heap_note = match heap_peak {
        None => {
            "heap not measured: the counting allocator is not installed in this process".to_string()
        }
        Some(h) => {
            let extra = h as i64 - measured as i64;
            let at = plan
                .heap_peak_step
                .and_then(|s| Some((s, schedule.steps.get(s)?, plan.steps.get(s)?)))
                .map(|(s, step, m)| {
                    let i = match *step {
                        Step::Compute(i) | Step::Free(i) => i,
                    };
                    let (id, op) = tg
                        .nodes
                        .get(i)
                        .map(|n| (n.id.as_str(), n.op.as_str()))
                        .unwrap_or_default();
                    let live = m.live_bytes as i64;
                    format!(
                        "; it peaked during step {s} ({} {id}, {op}), {} B above the {} B of live tensors after that step",
                        if matches!(step, Step::Compute(_)) { "compute" } else { "free" },
                        h as i64 - live,
                        live
                    )
                })
                .unwrap_or_default();
            format!(
                "the heap peaked {} B ({:+.1}%) {} the live-tensor peak: kernel workspaces and temporaries \
                 (im2col buffers, packed matmul operands, gradient contributions being summed, views made \
                 contiguous) that the memory model does not count, less what it counts before it is allocated: \
                 parameter gradients (fixed memory in the model) are allocated when first computed, and inputs \
                 are generated before the run and held outside it{at}",
                extra.unsigned_abs(),
                if measured > 0 { extra as f64 / measured as f64 * 100.0 } else { 0.0 },
                if extra >= 0 { "above" } else { "below" }
            )
        }
    };
    let mut by_op: BTreeMap<String, (f64, u32)> = BTreeMap::new();
    for (i, n) in tg.nodes.iter().enumerate() {
        let e = by_op.entry(n.op.clone()).or_default();
        e.0 += plan.node_seconds.get(i).copied().unwrap_or(0.0);
        e.1 += plan.node_runs.get(i).copied().unwrap_or(0);
    }
    let mut op_seconds: Vec<OpTime> = by_op
        .into_iter()
        .map(|(op, (seconds, computations))| OpTime {
            op,
            seconds,
            computations,
        })
        .collect();
    op_seconds.sort_by(|a, b| b.seconds.total_cmp(&a.seconds));
    op_seconds.truncate(15);
    let timeline = schedule
        .steps
        .iter()
        .enumerate()
        .map(|(s, step)| {
            let (op, i) = match *step {
                Step::Compute(i) => ("compute", i),
                Step::Free(i) => ("free", i),
            };
            let m = plan.steps.get(s);
            TimelinePoint {
                step: s,
                op,
                node: tg.nodes.get(i).map(|n| n.id.clone()).unwrap_or_default(),
                predicted_bytes: stats.memory.get(s).copied().unwrap_or(0),
                measured_bytes: m.map(|m| m.live_bytes).unwrap_or(0),
                heap_bytes: m.and_then(|m| m.heap_bytes).map(|h| h + before),
                heap_peak_bytes: m.and_then(|m| m.heap_peak_bytes).map(|h| h + before),
                device_bytes: m
                    .and_then(|m| m.device_bytes)
                    .map(|d| (d + before as i64).max(0) as u64),
                seconds: m.map(|m| m.seconds).unwrap_or(0.0),
            }
        })
        .collect();
    let bytes_mismatches: Vec<BytesMismatch> = tg
        .nodes
        .iter()
        .zip(&plan.node_bytes)
        .filter_map(|(n, m)| {
            let m = (*m)?;
            (m != n.bytes).then(|| BytesMismatch {
                node: n.id.clone(),
                op: n.op.clone(),
                predicted_bytes: n.bytes,
                measured_bytes: m,
            })
        })
        .take(20)
        .collect();
    Validation {
        bytes_mismatches,
        measured_fixed_bytes: fixed,
        predicted_fixed_bytes: problem.fixed_bytes,
        ran: true,
        device: opts.device.name(),
        ok: problems.is_empty(),
        problems,
        predicted_peak_bytes: predicted,
        measured_peak_bytes: measured,
        peak_rel_diff: rel,
        measured_peak_step: plan.live_peak_step,
        heap_peak_bytes: heap_peak,
        heap_peak_step: plan.heap_peak_step,
        heap_note,
        device_peak_bytes: plan.device_peak_bytes.map(|d| d + before),
        budget_bytes: opts.budget_bytes,
        grad_max_rel_err: grad_err,
        grad_tolerance: opts.grad_tolerance,
        params_checked,
        grad_note,
        loss: plan.loss,
        store_all_loss: reference.loss,
        step_seconds: times.plan,
        store_all_step_seconds: times.store_all,
        measured_overhead: times.overhead,
        measured_overhead_range: times.range,
        measured_step_overhead: times.step_overhead,
        timing_rounds: times.rounds,
        predicted_overhead: stats.overhead(problem),
        recomputations: stats.recomputations,
        running_stat_updates: plan.running_stat_updates,
        running_stats_max_rel_err: running_err,
        params_from_file: ex.sources.params_from_file,
        params_seeded: ex.sources.params_seeded,
        op_seconds,
        host_ops: super::kernel::host_ops_union([&plan.host_ops[..], &reference.host_ops]),
        timeline,
    }
}

/// Measured seconds per training node: the fastest of `runs` store-all runs (at least one),
/// for the solver's cost model (`--cost measured`).
pub fn measured_costs(
    model: &Model,
    tg: &TrainingGraph,
    model_bytes: &[u8],
    device: ExecDevice,
    seed: u64,
    runs: usize,
) -> crate::error::Result<Vec<f64>> {
    let problem = tg.to_problem();
    let sched = store_all(&problem);
    let mut ex = Executor::new(model, tg, model_bytes, device, seed)?;
    let mut best: Option<Vec<f64>> = None;
    for _ in 0..runs.max(1) {
        let r = ex.run(&sched, &mut |_, _| {})?;
        best = Some(match best {
            None => r.node_seconds,
            Some(b) => b
                .iter()
                .zip(&r.node_seconds)
                .map(|(a, c)| a.min(*c))
                .collect(),
        });
    }
    best.ok_or_else(|| err("no profiling run"))
}

/// The problem with its costs replaced by `costs` (seconds per node).
pub fn with_costs(problem: &Problem, costs: &[f64]) -> crate::error::Result<Problem> {
    if costs.len() != problem.nodes.len() {
        return Err(err("one measured cost per node is needed"));
    }
    let nodes = problem
        .nodes
        .iter()
        .zip(costs)
        .map(|(n, &c)| {
            let mut n = n.clone();
            n.cost = if c.is_finite() && c >= 0.0 { c } else { 0.0 };
            n
        })
        .collect();
    Problem::new(problem.name.clone(), nodes, problem.fixed_bytes).map_err(|e| err(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::{Timed, Times};

    fn timed(runs: &[&[f64]]) -> Timed {
        let mut t = Timed::default();
        for steps in runs {
            t.add_seconds(steps.iter().sum(), steps.iter().copied());
        }
        t
    }

    #[test]
    fn each_step_counts_at_its_least_over_the_rounds() {
        // The plan's second step was slow in the first round, its first in the second: a
        // slow spell in each round, which the median of the rounds' ratios keeps.
        let plan = timed(&[&[1.0, 5.0], &[3.0, 2.0]]);
        let store_all = timed(&[&[1.0, 1.0], &[2.0, 0.5]]);
        assert_eq!(plan.least_steps, vec![1.0, 2.0]);
        let t = Times::of(&plan, &store_all);
        assert_eq!(t.step_overhead, 3.0 / 1.5 - 1.0);
        // Round ratios 6/2 − 1 = 2 and 5/2.5 − 1 = 1: their median.
        assert_eq!(t.overhead, 1.5);
        assert_eq!(t.range, [1.0, 2.0]);
        assert_eq!(t.rounds, 2);
    }

    #[test]
    fn the_gradient_error_names_the_value_that_differs_most() {
        let t = |v: &[f32]| candle_core::Tensor::new(v, &candle_core::Device::Cpu).unwrap();
        let reference: std::collections::HashMap<usize, _> =
            [(3, t(&[1.0, -2.0])), (7, t(&[4.0])), (9, t(&[0.0]))].into();
        let same = super::grad_rel_err(&reference.clone(), &reference).unwrap();
        assert_eq!(same, (0.0, 3, None));
        let mut plan = reference.clone();
        plan.insert(3, t(&[1.0, -2.5])); // 0.25 of 2
        plan.insert(7, t(&[4.5])); // 0.125 of 4
        assert_eq!(
            super::grad_rel_err(&plan, &reference).unwrap(),
            (0.25, 3, Some(3))
        );
        plan.insert(9, t(&[f32::NAN]));
        let (err, _, worst) = super::grad_rel_err(&plan, &reference).unwrap();
        assert!(err.is_infinite() && worst == Some(9), "{err} {worst:?}");
        plan.remove(&7);
        let missing = super::grad_rel_err(&plan, &reference)
            .unwrap_err()
            .to_string();
        assert!(missing.contains("no gradient for value 7"), "{missing}");
    }

    #[test]
    fn no_steps_no_step_overhead() {
        let t = Times::of(&timed(&[&[]]), &timed(&[&[]]));
        assert_eq!(t.step_overhead, 0.0);
    }
}
