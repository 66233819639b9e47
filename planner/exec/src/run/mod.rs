//! The schedule runner: executes a training step following a solver schedule, keeping exactly
//! the values the schedule says are resident, and measures every step.

use super::alloc;
use super::kernel::{KResult, Kernel, KernelCtx, KernelError};
use super::kernels::registry;
use super::weights::{constants, input_value, seed_for, stored_tensors, ConstSources};
use crate::error::{ExecError, ExecFault};
use candle_core::{Device, Tensor};
use petgraph::graph::NodeIndex;
use remat_planner::model::{Model, ValueId, ValueKind};
use remat_planner::ops::Ctx;
use remat_planner::tensor::Fact;
use remat_planner::training::{Source, TrainingGraph};
use remat_solver::{Schedule, Step};
use std::collections::{HashMap, HashSet};
use std::time::Instant;

mod setup;
mod step;
pub mod storage;

use storage::{distinct_storages, storage_bytes, Value};

/// Where the executor runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ExecDevice {
    Cpu,
    Cuda,
}

impl ExecDevice {
    /// The candle device; without the `cuda` feature, CUDA answers that it is not compiled in.
    pub fn open(self) -> crate::error::Result<Device> {
        match self {
            ExecDevice::Cpu => Ok(Device::Cpu),
            ExecDevice::Cuda => {
                if !cfg!(feature = "cuda") {
                    return Err(ExecError::new(
                        ExecFault::Unsupported,
                        "device cuda: remat was not compiled with CUDA (build with --features cuda)",
                    ));
                }
                Device::new_cuda(0).map_err(|e| {
                    ExecError::new(ExecFault::Unsupported, format!("device cuda: {e}"))
                })
            }
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            ExecDevice::Cpu => "cpu",
            ExecDevice::Cuda => "cuda",
        }
    }
}

/// One step as run.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct StepMeasure {
    /// Live bytes after the step: resident values (each storage once) plus parameters, their
    /// gradients and buffers.
    pub live_bytes: u64,
    /// Heap bytes in use after the step, relative to the start of the run (`None` without the
    /// counting allocator).
    pub heap_bytes: Option<u64>,
    /// The heap's peak during the step (the kernel's output and its temporaries), relative to
    /// the start of the run (`None` without the counting allocator).
    pub heap_peak_bytes: Option<u64>,
    /// On CUDA: device memory in use after the step (total − free), relative to the start of
    /// the run; `None` on the CPU.
    pub device_bytes: Option<i64>,
    pub seconds: f64,
}

/// Device memory in use (total − free, cuMemGetInfo) on a CUDA device; `None` on the CPU.
fn device_used(dev: &Device) -> Option<u64> {
    #[cfg(feature = "cuda")]
    if let Ok(c) = dev.as_cuda_device() {
        return c
            .cuda_stream()
            .context()
            .mem_get_info()
            .ok()
            .map(|(free, total)| total.saturating_sub(free) as u64);
    }
    let _ = dev;
    None
}

/// What one run of a schedule produced and measured.
#[derive(Debug, Clone)]
pub struct RunResult {
    pub loss: f64,
    /// d loss / d parameter, by value id.
    pub grads: HashMap<ValueId, Tensor>,
    pub steps: Vec<StepMeasure>,
    pub live_peak_bytes: u64,
    pub live_peak_step: usize,
    /// Heap peak during the run above the heap in use when it started.
    pub heap_peak_bytes: Option<u64>,
    /// The step during which the heap peaked (`None` without the counting allocator).
    pub heap_peak_step: Option<usize>,
    /// On CUDA: the device memory in use at its highest after a step, above what was in use
    /// when the run started (cuMemGetInfo: it includes what the CUDA allocator keeps cached);
    /// `None` on the CPU.
    pub device_peak_bytes: Option<u64>,
    /// The run's seconds: its steps' (each a node's computation or a free, synchronized on a
    /// device) and the zero gradients after them, without the executor's measuring between
    /// steps (live bytes, heap figures, progress).
    pub seconds: f64,
    /// Seconds per training node (summed over its computations).
    pub node_seconds: Vec<f64>,
    /// Computations per training node.
    pub node_runs: Vec<u32>,
    /// BatchNormalization nodes whose running statistics were updated (once each).
    pub running_stat_updates: usize,
    /// The updated running statistics (new running mean and variance), by the value id of the
    /// buffer they replace: written on a node's first computation only.
    pub running_stats: HashMap<ValueId, Tensor>,
    /// Bytes of each node's value as computed (distinct storages), `None` if never computed.
    pub node_bytes: Vec<Option<u64>>,
    /// Op types that ran on the host for want of a device kernel (see
    /// `kernel::Kernel::run_forward`), in the run or in the executor's setup; empty on the CPU.
    pub host_ops: Vec<String>,
}

/// A model ready to run: constants loaded, inputs generated, kernels looked up.
pub struct Executor<'m> {
    model: &'m Model,
    tg: &'m TrainingGraph,
    device: Device,
    seed: u64,
    consts: HashMap<ValueId, Tensor>,
    inputs: HashMap<ValueId, Tensor>,
    /// Live consumers of each value: (node, input slot).
    consumers: HashMap<ValueId, Vec<(NodeIndex, usize)>>,
    /// Backward training node of each forward op.
    bwd_of: HashMap<NodeIndex, usize>,
    /// Extra training nodes of each forward op, by tag.
    extras_of: HashMap<NodeIndex, Vec<(&'static str, usize)>>,
    facts: HashMap<NodeIndex, NodeFacts>,
    pub sources: ConstSources,
    fixed_live_bytes: u64,
    /// Bytes of the parameters' gradients (part of `fixed_live_bytes`), which a run allocates
    /// as they are computed.
    grad_bytes: u64,
    /// Op types that ran on the host while the executor was set up (folded constants); every
    /// run reports them with its own.
    setup_host_ops: Vec<String>,
    /// Loss outputs whose mean is constant (a Softmax's): the loss weights their elements by
    /// [`Executor::loss_weights`], so that gradients flow for the gradient check.
    weighted: Vec<ValueId>,
    /// Looked at after every step of a run: once raised, the run ends with
    /// [`ExecFault::Cancelled`](crate::ExecFault::Cancelled). Never by default.
    pub cancel: remat_solver::Cancel,
    /// Last, so that it drops after the tensors above: gives their pages back to the kernel.
    _trim: TrimOnDrop,
}

/// Returns the heap's free pages to the kernel when dropped ([`crate::alloc::return_freed_pages`]):
/// the executor keeps freed pages for reuse while it runs, not after.
struct TrimOnDrop;

impl Drop for TrimOnDrop {
    fn drop(&mut self) {
        crate::alloc::return_freed_pages();
    }
}

fn exec_err(node: &str, op: &str, message: impl Into<String>) -> ExecError {
    ExecError::Run {
        node: node.to_string(),
        op: op.to_string(),
        message: message.into(),
        fault: ExecFault::Failed,
    }
}

/// A node's input and output facts.
type NodeFacts = (Vec<Option<Fact>>, Vec<Option<Fact>>);

struct State {
    resident: Vec<Option<Value>>,
    /// Parameter gradients, each from its first contribution on (zeros at the end for those
    /// that got none).
    grads: HashMap<ValueId, Tensor>,
    params_done: HashSet<usize>,
    bn_done: HashSet<NodeIndex>,
    running: HashMap<ValueId, Tensor>,
    computed: Vec<u32>,
    node_seconds: Vec<f64>,
    loss: Option<f64>,
    node_bytes: Vec<Option<u64>>,
}

/// Refuses a model whose store-all step (which every validation and profiling run executes)
/// is predicted to need more memory than `available`: on the CPU the allocation would fail,
/// and a failed allocation aborts the process (the service with it) instead of returning an
/// error. The prediction is the simulator's store-all peak, parameters, gradients and buffers
/// included; the executor's own measurement stays within a few percent of it
/// (docs/bench/executor.md).
pub fn fits_in_memory(tg: &TrainingGraph, available: Option<u64>) -> crate::error::Result<()> {
    fits_in_memory_holding(tg, available, 0)
}

/// [`fits_in_memory`] while `gradient_sets` finished runs' parameter gradients are held
/// besides the run (a validation keeps the store-all run's and each plan's to compare them).
pub fn fits_in_memory_holding(
    tg: &TrainingGraph,
    available: Option<u64>,
    gradient_sets: u64,
) -> crate::error::Result<()> {
    let Some(available) = available else {
        return Ok(());
    };
    let step = remat_solver::store_all_peak(&tg.to_problem());
    let held = gradient_sets.saturating_mul(tg.params_bytes);
    let needed = step.saturating_add(held);
    if needed > available {
        let what = if held == 0 {
            "the store-all step needs".to_string()
        } else {
            format!(
                "the store-all step ({step} bytes) and the {gradient_sets} sets of parameter \
                 gradients a validation compares ({held} bytes) need"
            )
        };
        return Err(ExecError::new(
            ExecFault::Memory,
            format!(
                "{what} about {needed} bytes ({:.1} GiB) and this machine has {available} bytes ({:.1} GiB) available: run it on a larger machine or with smaller dims",
                needed as f64 / GIB,
                available as f64 / GIB
            ),
        ));
    }
    Ok(())
}

const GIB: f64 = 1024.0 * 1024.0 * 1024.0;

impl<'m> Executor<'m> {
    /// Whether it runs on the CPU (where a failed allocation aborts the process).
    pub fn is_cpu(&self) -> bool {
        self.device.is_cpu()
    }

    /// Loads constants (from `bytes`, the model file, where it stores them), generates inputs
    /// and runs the folded nodes that compute derived constants.
    pub fn new(
        model: &'m Model,
        tg: &'m TrainingGraph,
        bytes: &[u8],
        device: ExecDevice,
        seed: u64,
    ) -> crate::error::Result<Executor<'m>> {
        let dev = device.open()?;
        let stored = stored_tensors(bytes)?;
        Executor::with_stored(model, tg, &stored, dev, seed)
    }

    pub fn with_stored(
        model: &'m Model,
        tg: &'m TrainingGraph,
        stored: &HashMap<String, remat_planner::tensor::Tensor>,
        dev: Device,
        seed: u64,
    ) -> crate::error::Result<Executor<'m>> {
        crate::alloc::reuse_freed_pages();
        if dev.is_cpu() {
            fits_in_memory(tg, crate::alloc::available_memory())?;
        }
        let kerr = |e: KernelError| exec_err("", "", e.0);
        let (consts, sources) = constants(model, stored, seed, &dev).map_err(kerr)?;
        let mut ex = Executor {
            model,
            tg,
            device: dev,
            seed,
            consts,
            inputs: HashMap::new(),
            consumers: HashMap::new(),
            bwd_of: HashMap::new(),
            extras_of: HashMap::new(),
            facts: HashMap::new(),
            sources,
            fixed_live_bytes: 0,
            grad_bytes: 0,
            setup_host_ops: vec![],
            weighted: remat_planner::training::constant_mean_outputs(model, &tg.exec.loss_outputs),
            cancel: remat_solver::Cancel::default(),
            _trim: TrimOnDrop,
        };
        // Every op the run needs must have kernels: report all missing at once.
        let mut missing: Vec<String> = vec![];
        for &ix in &tg.exec.fwd_order {
            let node = &model.graph[ix];
            let k = registry().get(node.op_type.as_str());
            let needs_bwd = tg.exec.rules.contains_key(&ix)
                && tg.exec.needs.get(&ix).is_some_and(|n| n.iter().any(|&b| b));
            match k {
                None => missing.push(format!("{} ({})", node.name, node.op_type)),
                Some(k) if needs_bwd && k.backward.is_none() => {
                    missing.push(format!("{} ({} backward)", node.name, node.op_type))
                }
                _ => {}
            }
        }
        if !missing.is_empty() {
            let n = missing.len();
            missing.truncate(12);
            return Err(ExecError::new(
                ExecFault::Unsupported,
                format!(
                    "{n} node(s) have no executor kernel: {}{}",
                    missing.join(", "),
                    if n > 12 { ", ..." } else { "" }
                ),
            ));
        }
        super::kernel::take_host_ops();
        ex.fold_constants()?;
        ex.setup_host_ops = super::kernel::take_host_ops();
        for (i, s) in tg.exec.sources.iter().enumerate() {
            match s {
                Source::Input(v) => {
                    let t = input_value(model, *v, seed, &ex.device).map_err(kerr)?;
                    ex.inputs.insert(*v, t);
                }
                Source::Backward(ix) => {
                    ex.bwd_of.insert(*ix, i);
                }
                Source::Extra { node, tag } => {
                    ex.extras_of.entry(*node).or_default().push((tag, i))
                }
                _ => {}
            }
        }
        for &ix in &tg.exec.fwd_order {
            for (slot, v) in model.graph[ix].inputs.iter().enumerate() {
                if let Some(v) = v {
                    ex.consumers.entry(*v).or_default().push((ix, slot));
                }
            }
        }
        let mut seen = HashSet::new();
        let fixed: u64 = ex
            .consts
            .iter()
            .filter(|(v, _)| {
                matches!(
                    model.values[**v].kind,
                    ValueKind::Param | ValueKind::Buffer | ValueKind::Derived
                )
            })
            .map(|(_, t)| storage_bytes(std::iter::once(t), &mut seen))
            .sum();
        let grads: u64 = ex
            .params()
            .iter()
            .filter_map(|v| model.values[*v].fact.as_ref())
            .map(|f| f.bytes())
            .sum();
        ex.fixed_live_bytes = fixed + grads;
        ex.grad_bytes = grads;
        Ok(ex)
    }

    /// Replaces a generated data input (e.g. with a fixture's recorded values). The tensor must
    /// have the input's shape; it is converted to the input's element type.
    pub fn set_input(&mut self, name: &str, t: Tensor) -> crate::error::Result<()> {
        let v = self
            .inputs
            .keys()
            .copied()
            .find(|&v| self.model.values[v].name == name)
            .ok_or_else(|| {
                let mut known: Vec<&str> = self
                    .inputs
                    .keys()
                    .map(|&v| self.model.values[v].name.as_str())
                    .collect();
                known.sort_unstable();
                exec_err(
                    "",
                    "",
                    format!(
                        "{name:?} is not a data input the step reads; those are: {}",
                        known.join(", ")
                    ),
                )
            })?;
        let old = &self.inputs[&v];
        if old.dims() != t.dims() {
            return Err(exec_err(
                "",
                "",
                format!(
                    "input {name:?} has shape {:?}, the value given {:?}",
                    old.dims(),
                    t.dims()
                ),
            ));
        }
        let t = t
            .to_dtype(old.dtype())
            .and_then(|t| t.to_device(&self.device))
            .map_err(|e| exec_err("", "", format!("input {name:?}: {e}")))?;
        self.inputs.insert(v, t);
        Ok(())
    }

    /// Parameters (trainable values), in value order.
    pub fn params(&self) -> Vec<ValueId> {
        (0..self.model.values.len())
            .filter(|&v| {
                self.model.values[v].kind == ValueKind::Param && self.consts.contains_key(&v)
            })
            .collect()
    }

    /// The model this executor runs.
    pub fn model(&self) -> &'m Model {
        self.model
    }

    /// The loss outputs the loss weights (their mean is constant), in the loss's order.
    pub fn weighted_loss_outputs(&self) -> &[ValueId] {
        &self.weighted
    }

    /// The factors the loss weights loss output `v`'s elements by, when its mean is constant
    /// (a Softmax's, whose plain mean has a zero gradient): fixed pseudo-random values in
    /// [0.5, 1.5) from the run's seed and the value, f32 on the run's device; `None` for
    /// the other outputs, whose mean the loss takes as it is. Made when needed (at the loss
    /// and at its gradient), like the constant gradient a plain mean seeds, so a run holds no
    /// more than the memory model counts.
    pub(crate) fn loss_weights(&self, v: ValueId, shape: &[usize]) -> KResult<Option<Tensor>> {
        if !self.weighted.contains(&v) {
            return Ok(None);
        }
        let n: usize = shape.iter().product();
        let mut rng = crate::kernel::Rng::new(seed_for(self.seed, &format!("loss:{v}")));
        let w: Vec<f32> = (0..n).map(|_| rng.uniform(0.5, 1.5) as f32).collect();
        Ok(Some(Tensor::from_vec(w, shape, &self.device)?))
    }

    /// Bytes of parameters, their gradients and buffers as held by the executor.
    pub fn fixed_live_bytes(&self) -> u64 {
        self.fixed_live_bytes
    }

    /// The part of [`Executor::fixed_live_bytes`] held before a run starts (parameters,
    /// buffers, derived constants): the run allocates the gradients, so its heap and device
    /// figures (measured from its start) hold them already.
    pub fn held_before_run_bytes(&self) -> u64 {
        self.fixed_live_bytes - self.grad_bytes
    }

    fn node_facts(&self, ix: NodeIndex) -> NodeFacts {
        let node = &self.model.graph[ix];
        (
            self.model.facts(&node.inputs),
            self.model.facts(&node.outputs),
        )
    }

    fn cache_facts(&mut self, ix: NodeIndex) {
        if !self.facts.contains_key(&ix) {
            let f = self.node_facts(ix);
            self.facts.insert(ix, f);
        }
    }

    fn with_kernel<R>(
        &self,
        ix: NodeIndex,
        f: impl FnOnce(&Kernel, &KernelCtx) -> KResult<R>,
    ) -> crate::error::Result<R> {
        let node = &self.model.graph[ix];
        let kernel = registry()
            .get(node.op_type.as_str())
            .ok_or_else(|| ExecError::Run {
                node: node.name.clone(),
                op: node.op_type.clone(),
                message: "the op has no executor kernel".into(),
                fault: ExecFault::Unsupported,
            })?;
        let owned;
        let (ins, outs) = match self.facts.get(&ix) {
            Some(f) => (&f.0, &f.1),
            None => {
                owned = self.node_facts(ix);
                (&owned.0, &owned.1)
            }
        };
        let cx = KernelCtx {
            rule: Ctx {
                node: &node.name,
                op: &node.op_type,
                opset: node.opset,
                attrs: node.attrs(),
                inputs: ins,
                n_outputs: outs.len(),
            },
            outputs: outs,
            device: &self.device,
            seed: seed_for(self.seed, &node.name),
        };
        f(kernel, &cx).map_err(|e| exec_err(&node.name, &node.op_type, e.0))
    }

    /// Runs the schedule (already validated by `simulate` against this graph's problem).
    /// `progress` is called after every step with (done, total).
    ///
    /// The run is the process's one measured run while it lasts (a concurrent one waits):
    /// it runs on the executor's thread pool, whose allocations are the heap figures' (see
    /// [`alloc`]), and its time is not shared with another run's.
    pub fn run(
        &mut self,
        schedule: &Schedule,
        progress: &mut (dyn FnMut(usize, usize) + Send),
    ) -> crate::error::Result<RunResult> {
        let pool = super::kernels::pool().map_err(|e| exec_err("", "", e))?;
        let measurement = alloc::Measurement::begin();
        pool.install(|| self.run_measured(schedule, progress, &measurement))
    }

    fn run_measured(
        &mut self,
        schedule: &Schedule,
        progress: &mut (dyn FnMut(usize, usize) + Send),
        m: &alloc::Measurement,
    ) -> crate::error::Result<RunResult> {
        for ix in self.tg.exec.fwd_order.clone() {
            self.cache_facts(ix);
        }
        super::kernel::take_host_ops();
        let n = self.tg.nodes.len();
        let mut st = State {
            resident: vec![None; n],
            grads: HashMap::new(),
            params_done: HashSet::new(),
            bn_done: HashSet::new(),
            running: HashMap::new(),
            computed: vec![0; n],
            node_seconds: vec![0.0; n],
            loss: None,
            node_bytes: vec![None; n],
        };
        // The run's own bookkeeping is allocated before the heap's baseline is taken: a long
        // schedule's step figures are megabytes (docs/bench/executor.md, "Figures behind the code").
        let mut steps = Vec::with_capacity(schedule.steps.len());
        let heap0 = alloc::installed().then(|| m.reset_peak());
        let dev0 = device_used(&self.device);
        let mut dev_peak = 0i64;
        // The run's time is its steps' (and the tail's below), not the measuring between
        // them: the live-bytes set walks every resident value after each step, which costs
        // store-all, holding the most, the most, and made plans of many small ops look cheaper
        // than they are (T5's plan: a median of −1% against +9% of its steps' time).
        let mut seconds = 0.0;
        let mut live_peak = 0u64;
        let mut live_peak_step = 0usize;
        let total = schedule.steps.len();
        let mut heap_peak_step = None;
        let mut heap_peak = 0u64;
        for (s, step) in schedule.steps.iter().enumerate() {
            let ts = Instant::now();
            if heap0.is_some() {
                m.reset_peak();
            }
            match *step {
                Step::Compute(i) => {
                    if i >= n {
                        return Err(exec_err(
                            "",
                            "",
                            format!("step {s}: node index {i} is out of range"),
                        ));
                    }
                    let v = distinct_storages(self.compute(&mut st, i, s)?, &st.resident)
                        .map_err(|e| exec_err(&self.tg.nodes[i].name, &self.tg.nodes[i].op, e.0))?;
                    if st.loss.is_none() && self.tg.exec.sources[i] == Source::Loss {
                        if let Some(t) = v.first().cloned().flatten() {
                            let l = t
                                .to_dtype(candle_core::DType::F64)
                                .and_then(|t| t.to_scalar::<f64>())
                                .map_err(|e| exec_err("loss", "SumOfMeans", e.to_string()))?;
                            st.loss = Some(l);
                        }
                    }
                    if st.node_bytes[i].is_none() {
                        st.node_bytes[i] =
                            Some(storage_bytes(v.iter().flatten(), &mut HashSet::new()));
                    }
                    st.resident[i] = Some(v);
                    st.computed[i] += 1;
                }
                Step::Free(i) => {
                    if i >= n || st.resident[i].is_none() {
                        return Err(exec_err(
                            "",
                            "",
                            format!("step {s}: frees a value that is not resident"),
                        ));
                    }
                    st.resident[i] = None;
                }
            }
            // Device kernels run asynchronously: a step's time and memory count once it ends.
            let device_bytes = match dev0 {
                Some(d0) => {
                    self.device
                        .synchronize()
                        .map_err(|e| exec_err("", "", e.to_string()))?;
                    device_used(&self.device).map(|d| d as i64 - d0 as i64)
                }
                None => None,
            };
            if let Some(d) = device_bytes {
                dev_peak = dev_peak.max(d);
            }
            let secs = ts.elapsed().as_secs_f64();
            seconds += secs;
            // Both read before this loop's own bookkeeping allocates (the live-bytes set).
            let step_heap_peak = heap0.map(|h0| (m.peak() - h0).max(0) as u64);
            let step_heap = heap0.map(|h0| (m.current() - h0).max(0) as u64);
            if let Some(h) = step_heap_peak.filter(|&h| heap_peak_step.is_none() || h > heap_peak) {
                heap_peak = h;
                heap_peak_step = Some(s);
            }
            if let Step::Compute(i) = *step {
                st.node_seconds[i] += secs;
            }
            let mut seen = HashSet::new();
            let live = self.fixed_live_bytes
                + storage_bytes(st.resident.iter().flatten().flatten().flatten(), &mut seen);
            if live > live_peak {
                live_peak = live;
                live_peak_step = s;
            }
            steps.push(StepMeasure {
                live_bytes: live,
                heap_bytes: step_heap,
                heap_peak_bytes: step_heap_peak,
                device_bytes,
                seconds: secs,
            });
            progress(s + 1, total);
            if self.cancel.is_cancelled() {
                return Err(crate::error::ExecError::new(
                    crate::error::ExecFault::Cancelled,
                    format!("the run was cancelled at step {s} of {total}"),
                ));
            }
        }
        // Parameters no backward reached have zero gradients.
        let tail = Instant::now();
        for v in self.params() {
            if let std::collections::hash_map::Entry::Vacant(e) = st.grads.entry(v) {
                let z = self.consts[&v]
                    .zeros_like()
                    .map_err(|e| exec_err("", "", e.to_string()))?;
                e.insert(z);
            }
        }
        let loss = st.loss.unwrap_or(f64::NAN);
        seconds += tail.elapsed().as_secs_f64();
        // The steps' peaks, and what came after the last one (zero gradients).
        let heap_peak = heap0.map(|h0| heap_peak.max((m.peak() - h0).max(0) as u64));
        Ok(RunResult {
            loss,
            grads: st.grads,
            steps,
            live_peak_bytes: live_peak,
            live_peak_step,
            heap_peak_bytes: heap_peak,
            heap_peak_step,
            device_peak_bytes: dev0.map(|_| dev_peak as u64),
            seconds,
            node_seconds: st.node_seconds,
            node_runs: st.computed,
            running_stat_updates: st.bn_done.len(),
            running_stats: st.running,
            node_bytes: st.node_bytes,
            host_ops: super::kernel::host_ops_union([
                &super::kernel::take_host_ops()[..],
                &self.setup_host_ops,
            ]),
        })
    }
}
