//! The schedule runner: executes a training step following a solver schedule, keeping exactly
//! the values the schedule says are resident, and measures every step.

use super::alloc;
use super::kernel::{BwdArgs, Extras, KResult, Kernel, KernelCtx, KernelError};
use super::kernels::registry;
use super::weights::{constants, input_value, seed_for, stored_tensors, ConstSources};
use crate::error::{ExecFault, PlannerError};
use crate::model::{Model, ValueId, ValueKind};
use crate::ops::Saved;
use crate::tensor::Fact;
use crate::training::{Source, TrainingGraph};
use candle_core::{Device, Tensor};
use petgraph::graph::NodeIndex;
use remat_solver::{Schedule, Step};
use std::collections::{HashMap, HashSet};
use std::time::Instant;

/// Where the executor runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ExecDevice {
    Cpu,
    Cuda,
}

impl ExecDevice {
    /// The candle device; without the `cuda` feature, CUDA answers that it is not compiled in.
    pub fn open(self) -> crate::Result<Device> {
        match self {
            ExecDevice::Cpu => Ok(Device::Cpu),
            ExecDevice::Cuda => {
                if !cfg!(feature = "cuda") {
                    return Err(exec_fault(
                        ExecFault::Unsupported,
                        "device cuda: remat was not compiled with CUDA (build with --features cuda)",
                    ));
                }
                Device::new_cuda(0)
                    .map_err(|e| exec_fault(ExecFault::Unsupported, format!("device cuda: {e}")))
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
}

fn exec_err(node: &str, op: &str, message: impl Into<String>) -> PlannerError {
    PlannerError::Exec {
        node: node.to_string(),
        op: op.to_string(),
        message: message.into(),
        fault: ExecFault::Failed,
    }
}

/// An executor error of `fault`'s kind, about no node in particular.
pub(crate) fn exec_fault(fault: ExecFault, message: impl Into<String>) -> PlannerError {
    PlannerError::Exec {
        node: String::new(),
        op: String::new(),
        message: message.into(),
        fault,
    }
}

/// Bytes of the distinct storages behind `tensors`.
pub fn storage_bytes<'a>(
    tensors: impl Iterator<Item = &'a Tensor>,
    seen: &mut HashSet<usize>,
) -> u64 {
    let mut total = 0u64;
    for t in tensors {
        let (storage, layout) = t.storage_and_layout();
        let key = std::ptr::from_ref(&*storage).addr();
        if !seen.insert(key) {
            continue;
        }
        let bytes = match &*storage {
            candle_core::Storage::Cpu(c) => cpu_storage_bytes(c),
            _ => None,
        };
        total += bytes.unwrap_or((layout.shape().elem_count() * t.dtype().size_in_bytes()) as u64);
    }
    total
}

fn cpu_storage_bytes(c: &candle_core::CpuStorage) -> Option<u64> {
    use candle_core::CpuStorage as C;
    let n = match c {
        C::U8(v) => v.len(),
        C::U32(v) => v.len() * 4,
        C::I16(v) => v.len() * 2,
        C::I32(v) => v.len() * 4,
        C::I64(v) => v.len() * 8,
        C::BF16(v) => v.len() * 2,
        C::F16(v) => v.len() * 2,
        C::F32(v) => v.len() * 4,
        C::F64(v) => v.len() * 8,
        _ => return None,
    };
    Some(n as u64)
}

type Value = Vec<Option<Tensor>>;

/// A node's input and output facts.
type NodeFacts = (Vec<Option<Fact>>, Vec<Option<Fact>>);

fn storage_key(t: &Tensor) -> usize {
    let (storage, _) = t.storage_and_layout();
    std::ptr::from_ref(&*storage).addr()
}

/// A node's value in storages of its own, as the memory model has it: an output that shares
/// storage with another output or with a resident value (an Add's backward passing its
/// incoming gradient through, an op returning its input), or that is a view into a larger
/// storage (a Concat's backward slicing its incoming gradient), is copied into a compact storage.
fn distinct_storages(v: Value, st: &State) -> KResult<Value> {
    let mut taken: HashSet<usize> = st
        .resident
        .iter()
        .flatten()
        .flatten()
        .flatten()
        .map(storage_key)
        .collect();
    let mut out = Vec::with_capacity(v.len());
    for t in v {
        out.push(match t {
            Some(t) => {
                let own = (t.elem_count() * t.dtype().size_in_bytes()) as u64;
                let held = storage_bytes(std::iter::once(&t), &mut HashSet::new());
                if !taken.insert(storage_key(&t)) || held > own {
                    let c = t.force_contiguous()?;
                    taken.insert(storage_key(&c));
                    Some(c)
                } else {
                    Some(t)
                }
            }
            None => None,
        });
    }
    Ok(out)
}

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

/// A parameter's gradient `g` as the parameter's `shape` and `dtype` in a storage of its own
/// size (a view into a larger storage is copied out).
fn own_grad(g: Tensor, shape: &[usize], dt: candle_core::DType) -> KResult<Tensor> {
    if g.dims() != shape {
        return Err(KernelError::new(format!(
            "the parameter's gradient has shape {:?}, the parameter {shape:?}",
            g.dims()
        )));
    }
    let g = g.to_dtype(dt)?;
    let own = (g.elem_count() * dt.size_in_bytes()) as u64;
    if storage_bytes(std::iter::once(&g), &mut HashSet::new()) > own {
        return Ok(g.force_contiguous()?);
    }
    Ok(g)
}

impl<'m> Executor<'m> {
    /// Loads constants (from `bytes`, the model file, where it stores them), generates inputs
    /// and runs the folded nodes that compute derived constants.
    pub fn new(
        model: &'m Model,
        tg: &'m TrainingGraph,
        bytes: &[u8],
        device: ExecDevice,
        seed: u64,
    ) -> crate::Result<Executor<'m>> {
        let dev = device.open()?;
        let stored = stored_tensors(bytes)?;
        Executor::with_stored(model, tg, &stored, dev, seed)
    }

    pub fn with_stored(
        model: &'m Model,
        tg: &'m TrainingGraph,
        stored: &HashMap<String, crate::tensor::Tensor>,
        dev: Device,
        seed: u64,
    ) -> crate::Result<Executor<'m>> {
        crate::exec::alloc::reuse_freed_pages();
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
            return Err(exec_fault(
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
    pub fn set_input(&mut self, name: &str, t: Tensor) -> crate::Result<()> {
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
    ) -> crate::Result<R> {
        let node = &self.model.graph[ix];
        let kernel = registry()
            .get(node.op_type.as_str())
            .ok_or_else(|| PlannerError::Exec {
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
            node: &node.name,
            op: &node.op_type,
            opset: node.opset,
            attrs: node.attrs(),
            inputs: ins,
            outputs: outs,
            device: &self.device,
            seed: seed_for(self.seed, &node.name),
        };
        f(kernel, &cx).map_err(|e| exec_err(&node.name, &node.op_type, e.0))
    }

    /// Runs the folded nodes whose outputs are large constants (not kept by the importer) or
    /// derived from parameters, in graph order.
    fn fold_constants(&mut self) -> crate::Result<()> {
        let order: Vec<NodeIndex> = self.model.graph.node_indices().collect();
        for ix in order {
            let node = &self.model.graph[ix];
            if !node.folded || node.skipped {
                continue;
            }
            // Constants derived from parameters (a transposed or tied weight) are computed
            // when read, like the views they are in the frameworks: the memory model counts
            // them under their parameters.
            let derived = node
                .outputs
                .iter()
                .flatten()
                .any(|v| self.model.values[*v].kind == ValueKind::Derived);
            let missing = node
                .outputs
                .iter()
                .flatten()
                .any(|v| !self.consts.contains_key(v) && self.model.values[*v].fact.is_some());
            if derived || !missing {
                continue;
            }
            let mut ins = vec![];
            let mut ok = true;
            for v in &node.inputs {
                match v {
                    None => ins.push(None),
                    Some(v) => match self.consts.get(v) {
                        Some(t) => ins.push(Some(t.clone())),
                        None => {
                            ok = false;
                            break;
                        }
                    },
                }
            }
            if !ok {
                continue;
            }
            self.cache_facts(ix);
            let outs = self.with_kernel(ix, |k, cx| k.run_forward(cx, &ins, &Extras::new()))?;
            for (v, t) in node.outputs.iter().zip(outs) {
                if let (Some(v), Some(t)) = (v, t) {
                    self.consts.entry(*v).or_insert(t);
                }
            }
        }
        Ok(())
    }

    /// A constant derived from parameters, computed by running its folded producers.
    fn derived(&self, v: ValueId, depth: usize) -> crate::Result<Tensor> {
        if let Some(t) = self.consts.get(&v) {
            return Ok(t.clone());
        }
        let val = &self.model.values[v];
        let Some((p, slot)) = val
            .producer
            .filter(|_| depth <= self.model.graph.node_count())
        else {
            return Err(exec_err(
                "",
                "",
                format!("constant {:?} has no value and no producer", val.name),
            ));
        };
        let outs = self.run_folded(p, depth)?;
        outs.get(slot).cloned().flatten().ok_or_else(|| {
            let n = &self.model.graph[p];
            exec_err(
                &n.name,
                &n.op_type,
                format!("did not produce {:?}", val.name),
            )
        })
    }

    /// A folded node's inputs and outputs, computed from the constants.
    fn run_folded(&self, p: NodeIndex, depth: usize) -> crate::Result<Value> {
        let ins = self.folded_inputs(p, depth)?;
        self.with_kernel(p, |k, cx| k.run_forward(cx, &ins, &Extras::new()))
    }

    fn folded_inputs(&self, p: NodeIndex, depth: usize) -> crate::Result<Value> {
        let node = &self.model.graph[p];
        let mut ins = Vec::with_capacity(node.inputs.len());
        for x in &node.inputs {
            ins.push(match x {
                Some(x) => Some(self.derived(*x, depth + 1)?),
                None => None,
            });
        }
        Ok(ins)
    }

    /// The values of a node's inputs as the step sees them.
    fn inputs_of(
        &self,
        st: &State,
        node: &crate::model::OpNode,
        step: usize,
    ) -> crate::Result<Value> {
        let mut ins = Vec::with_capacity(node.inputs.len());
        for x in &node.inputs {
            ins.push(match x {
                Some(x) => Some(self.value(st, *x, step)?),
                None => None,
            });
        }
        Ok(ins)
    }

    /// Runs a node's backward kernel.
    fn backward_kernel(
        &self,
        ix: NodeIndex,
        inputs: &[Option<Tensor>],
        outputs: &[Option<Tensor>],
        extras: &Extras,
        grads: &[Option<Tensor>],
        needs: &[bool],
    ) -> crate::Result<Value> {
        self.with_kernel(ix, |k, cx| {
            k.run_backward(
                cx,
                &BwdArgs {
                    inputs,
                    outputs,
                    extras,
                    grads,
                    needs,
                },
            )
        })
    }

    /// The value `v` as the step sees it: a constant, an input's or op's resident output, or a
    /// view computed from its resident base.
    fn value(&self, st: &State, v: ValueId, step: usize) -> crate::Result<Tensor> {
        if let Some(t) = self.consts.get(&v) {
            return Ok(t.clone());
        }
        if self.model.values[v].kind == ValueKind::Derived {
            return self.derived(v, 0);
        }
        let val = &self.model.values[v];
        if let Some(&h) = self.tg.exec.holder.get(&v) {
            match (&self.tg.exec.sources[h], val.producer) {
                (Source::Input(iv), _) if *iv == v => {
                    return self
                        .resident(st, h, step, &val.name)?
                        .first()
                        .cloned()
                        .flatten()
                        .ok_or_else(|| {
                            exec_err(
                                "",
                                "",
                                format!("step {step}: input {:?} has no value", val.name),
                            )
                        });
                }
                (Source::Forward(fx), Some((p, slot))) if *fx == p => {
                    return self
                        .resident(st, h, step, &val.name)?
                        .get(slot)
                        .cloned()
                        .flatten()
                        .ok_or_else(|| {
                            exec_err(
                                "",
                                "",
                                format!("step {step}: value {:?} was not produced", val.name),
                            )
                        });
                }
                _ => {}
            }
        }
        // A view: compute it from its inputs.
        let Some((p, slot)) = val.producer else {
            return Err(exec_err(
                "",
                "",
                format!("step {step}: value {:?} has no source", val.name),
            ));
        };
        if !self.tg.exec.collapsed.contains(&p) {
            return Err(exec_err(
                &self.model.graph[p].name,
                &self.model.graph[p].op_type,
                format!(
                    "step {step}: value {:?} is not held by any training node",
                    val.name
                ),
            ));
        }
        let node = &self.model.graph[p];
        let ins = self.inputs_of(st, node, step)?;
        let outs = self.with_kernel(p, |k, cx| k.run_forward(cx, &ins, &Extras::new()))?;
        outs.get(slot).cloned().flatten().ok_or_else(|| {
            exec_err(
                &node.name,
                &node.op_type,
                format!("the view did not produce output {slot}"),
            )
        })
    }

    fn resident<'s>(
        &self,
        st: &'s State,
        h: usize,
        step: usize,
        what: &str,
    ) -> crate::Result<&'s Value> {
        st.resident[h].as_ref().ok_or_else(|| {
            exec_err(
                "",
                "",
                format!(
                    "step {step}: {what:?} is held by {}, which the schedule does not keep resident here",
                    self.tg.nodes[h].id
                ),
            )
        })
    }

    /// d loss / d `v` from the loss and every consumer's backward (through views).
    fn grad_of(
        &self,
        st: &State,
        v: ValueId,
        step: usize,
        depth: usize,
    ) -> crate::Result<Option<Tensor>> {
        if depth > self.model.graph.node_count() + 1 {
            return Err(exec_err(
                "",
                "",
                format!("step {step}: gradient flow loops through views"),
            ));
        }
        let mut acc: Option<Tensor> = None;
        let add = |acc: &mut Option<Tensor>, g: Tensor| -> crate::Result<()> {
            *acc = Some(match acc.take() {
                None => g,
                Some(a) => (a + g).map_err(|e| exec_err("", "", e.to_string()))?,
            });
            Ok(())
        };
        if self.tg.exec.loss_outputs.contains(&v) {
            let f = self.model.values[v]
                .fact
                .as_ref()
                .ok_or_else(|| exec_err("", "", "loss output without a shape"))?;
            let shape: Vec<usize> = f.shape.iter().map(|&d| d as usize).collect();
            let n = f.numel().max(1) as f64;
            let dt = super::kernel::to_candle(f.dtype).map_err(|e| exec_err("", "", e.0))?;
            let g = Tensor::full(1.0 / n, shape, &self.device)
                .and_then(|t| t.to_dtype(dt))
                .map_err(|e| exec_err("", "loss", e.to_string()))?;
            add(&mut acc, g)?;
        }
        let Some(users) = self.consumers.get(&v) else {
            return Ok(acc);
        };
        for &(c, slot) in users {
            let needs = self.tg.exec.needs.get(&c);
            if !needs.and_then(|n| n.get(slot)).copied().unwrap_or(false) {
                continue;
            }
            if self.tg.exec.collapsed.contains(&c) {
                let node = &self.model.graph[c];
                let og = self.tg.exec.out_grad.get(&c).cloned().unwrap_or_default();
                let mut grads: Vec<Option<Tensor>> = vec![];
                let mut any = false;
                for (k, o) in node.outputs.iter().enumerate() {
                    let g = match o {
                        Some(o) if og.get(k).copied().unwrap_or(false) => {
                            self.grad_of(st, *o, step, depth + 1)?
                        }
                        _ => None,
                    };
                    any |= g.is_some();
                    grads.push(g);
                }
                if !any {
                    continue;
                }
                let ins: Vec<Option<Tensor>> = node
                    .inputs
                    .iter()
                    .map(|x| x.and_then(|x| self.consts.get(&x).cloned()))
                    .collect();
                let outs: Vec<Option<Tensor>> = vec![None; node.outputs.len()];
                let needs_v: Vec<bool> = needs.cloned().unwrap_or_default();
                let r = self.backward_kernel(c, &ins, &outs, &Extras::new(), &grads, &needs_v)?;
                if let Some(g) = r.get(slot).cloned().flatten() {
                    add(&mut acc, g)?;
                }
            } else if let Some(&b) = self.bwd_of.get(&c) {
                let r = self.resident(
                    st,
                    b,
                    step,
                    &format!("gradient of {}", self.model.values[v].name),
                )?;
                if let Some(g) = r.get(slot).cloned().flatten() {
                    add(&mut acc, g)?;
                }
            }
        }
        Ok(acc)
    }

    fn compute(&self, st: &mut State, i: usize, step: usize) -> crate::Result<Value> {
        let tn = &self.tg.nodes[i];
        for &d in &tn.deps {
            if st.resident[d].is_none() {
                return Err(exec_err(
                    &tn.name,
                    &tn.op,
                    format!(
                        "step {step}: computing {} needs {}, which is not resident",
                        tn.id, self.tg.nodes[d].id
                    ),
                ));
            }
        }
        match &self.tg.exec.sources[i] {
            Source::Input(v) => Ok(vec![self.inputs.get(v).cloned()]),
            Source::Extra { node, tag } => {
                let n = &self.model.graph[*node];
                let ins: Vec<Option<Tensor>> = if *tag == "mask" {
                    vec![None; n.inputs.len()]
                } else {
                    self.inputs_of(st, n, step)?
                };
                let out = self.with_kernel(*node, |k, cx| k.run_extra(cx, tag, &ins))?;
                Ok(out.into_iter().map(Some).collect())
            }
            Source::Forward(ix) => {
                let n = &self.model.graph[*ix];
                let ins = self.inputs_of(st, n, step)?;
                let extras = self.extras(st, *ix, step)?;
                let outs = self.with_kernel(*ix, |k, cx| k.run_forward(cx, &ins, &extras))?;
                if n.op_type == "BatchNormalization" && outs.len() > 1 && st.bn_done.insert(*ix) {
                    // Training-mode running statistics (outputs 1 and 2 replace the buffers
                    // at inputs 3 and 4): written on the first computation only, so a
                    // recomputation never updates them twice.
                    for (out, buffer) in [(1, 3), (2, 4)] {
                        if let (Some(Some(t)), Some(Some(v))) =
                            (outs.get(out), n.inputs.get(buffer))
                        {
                            st.running.insert(*v, t.clone());
                        }
                    }
                }
                Ok(outs)
            }
            Source::Loss => {
                let mut total: Option<Tensor> = None;
                for &v in &self.tg.exec.loss_outputs {
                    let t = self.value(st, v, step)?;
                    let m = t
                        .to_dtype(candle_core::DType::F32)
                        .and_then(|t| t.mean_all())
                        .map_err(|e| exec_err("loss", "SumOfMeans", e.to_string()))?;
                    total = Some(match total {
                        None => m,
                        Some(a) => {
                            (a + m).map_err(|e| exec_err("loss", "SumOfMeans", e.to_string()))?
                        }
                    });
                }
                Ok(vec![total])
            }
            Source::Backward(ix) => self.backward(st, i, *ix, step),
        }
    }

    fn extras(&self, st: &State, ix: NodeIndex, step: usize) -> crate::Result<Extras> {
        let mut e = Extras::new();
        if let Some(list) = self.extras_of.get(&ix) {
            for (tag, h) in list {
                let v = self.resident(st, *h, step, &format!("extra {tag}"))?;
                e.insert(tag.to_string(), v.iter().flatten().cloned().collect());
            }
        }
        Ok(e)
    }

    fn backward(
        &self,
        st: &mut State,
        i: usize,
        ix: NodeIndex,
        step: usize,
    ) -> crate::Result<Value> {
        let node = &self.model.graph[ix];
        let og = self.tg.exec.out_grad.get(&ix).cloned().unwrap_or_default();
        let mut grads = vec![];
        for (k, o) in node.outputs.iter().enumerate() {
            grads.push(match o {
                Some(o) if og.get(k).copied().unwrap_or(false) => self.grad_of(st, *o, step, 0)?,
                _ => None,
            });
        }
        let rule = self
            .tg
            .exec
            .rules
            .get(&ix)
            .ok_or_else(|| exec_err(&node.name, &node.op_type, "no gradient rule"))?;
        let mut ins: Vec<Option<Tensor>> = Vec::with_capacity(node.inputs.len());
        for x in &node.inputs {
            ins.push(match x {
                Some(x) if self.model.values[*x].kind == ValueKind::Derived => {
                    Some(self.derived(*x, 0)?)
                }
                Some(x) => self.consts.get(x).cloned(),
                None => None,
            });
        }
        let mut outs: Vec<Option<Tensor>> = vec![None; node.outputs.len()];
        for s in &rule.saved {
            match s {
                Saved::Input(k) => {
                    if let Some(Some(x)) = node.inputs.get(*k) {
                        ins[*k] = Some(self.value(st, *x, step)?);
                    }
                }
                Saved::Output(k) => {
                    if let Some(Some(x)) = node.outputs.get(*k) {
                        outs[*k] = Some(self.value(st, *x, step)?);
                    }
                }
                Saved::Extra { .. } => {}
            }
        }
        let extras = self.extras(st, ix, step)?;
        let needs = self.tg.exec.needs.get(&ix).cloned().unwrap_or_default();
        let r = self.backward_kernel(ix, &ins, &outs, &extras, &grads, &needs)?;
        let first = st.params_done.insert(i);
        let mut out: Value = vec![None; node.inputs.len()];
        for (slot, g) in r.into_iter().enumerate() {
            let (Some(g), Some(Some(v))) = (g, node.inputs.get(slot)) else {
                continue;
            };
            match self.model.values[*v].kind {
                ValueKind::Param => {
                    if first {
                        self.add_param_grad(st, *v, g)
                            .map_err(|e| exec_err(&node.name, &node.op_type, e.0))?;
                    }
                }
                ValueKind::Derived => {
                    if first {
                        self.push_derived(st, *v, g, 0)?;
                    }
                }
                _ => {
                    if let Some(slot_out) = out.get_mut(slot) {
                        *slot_out = Some(g);
                    }
                }
            }
        }
        Ok(out)
    }

    /// Adds a contribution `g` to parameter `v`'s gradient. The first one becomes the gradient
    /// (in the parameter's dtype and a storage of its own size), as in the frameworks: a
    /// gradient held as zeros from the start and added to would hold it three times at once
    /// (the zeros, `g` and the sum) where the memory model counts it once.
    fn add_param_grad(&self, st: &mut State, v: ValueId, g: Tensor) -> KResult<()> {
        match st.grads.remove(&v) {
            Some(acc) => {
                let dt = acc.dtype();
                st.grads.insert(v, (acc + g.to_dtype(dt)?)?);
            }
            None => {
                let p = self.consts.get(&v).ok_or_else(|| {
                    KernelError::new("a gradient for a parameter without a value")
                })?;
                st.grads.insert(v, own_grad(g, p.dims(), p.dtype())?);
            }
        }
        Ok(())
    }

    /// Pushes a gradient contribution `g` of the derived constant `v` (a transposed or tied
    /// weight) back through the folded node that computes it, to the parameters it comes
    /// from, as it arrives: the backward is linear in `g`, so contributions need no summing
    /// first, and summing them until the end of the run would hold a gradient-sized buffer
    /// per derived constant that the memory model does not count (MiniLM's transposed
    /// weights: 42 MB at batch 1).
    fn push_derived(
        &self,
        st: &mut State,
        v: ValueId,
        g: Tensor,
        depth: usize,
    ) -> crate::Result<()> {
        let val = &self.model.values[v];
        let Some((ix, slot)) = val
            .producer
            .filter(|&(p, _)| depth <= self.model.graph.node_count() && self.model.graph[p].folded)
        else {
            return Err(exec_err(
                "",
                "",
                format!("derived constant {:?} has no folded producer", val.name),
            ));
        };
        let node = &self.model.graph[ix];
        let mut grads: Vec<Option<Tensor>> = vec![None; node.outputs.len()];
        let Some(at) = grads.get_mut(slot) else {
            return Err(exec_err(&node.name, &node.op_type, "no such output"));
        };
        *at = Some(g);
        let needs: Vec<bool> = node
            .inputs
            .iter()
            .map(|x| {
                x.is_some_and(|x| {
                    matches!(
                        self.model.values[x].kind,
                        ValueKind::Param | ValueKind::Derived
                    ) && self.model.values[x]
                        .fact
                        .as_ref()
                        .is_some_and(|f| f.dtype.is_float())
                })
            })
            .collect();
        if !needs.iter().any(|&b| b) {
            return Ok(());
        }
        let ins = self.folded_inputs(ix, depth)?;
        let outs = self.run_folded(ix, depth)?;
        let r = self.backward_kernel(ix, &ins, &outs, &Extras::new(), &grads, &needs)?;
        for (slot, g) in r.into_iter().enumerate() {
            let (Some(g), Some(Some(x))) = (g, node.inputs.get(slot)) else {
                continue;
            };
            match self.model.values[*x].kind {
                ValueKind::Param => self
                    .add_param_grad(st, *x, g)
                    .map_err(|e| exec_err(&node.name, &node.op_type, e.0))?,
                ValueKind::Derived => self.push_derived(st, *x, g, depth + 1)?,
                _ => {}
            }
        }
        Ok(())
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
    ) -> crate::Result<RunResult> {
        let pool = super::kernels::pool().map_err(|e| exec_err("", "", e))?;
        let measurement = alloc::Measurement::begin();
        pool.install(|| self.run_measured(schedule, progress, &measurement))
    }

    fn run_measured(
        &mut self,
        schedule: &Schedule,
        progress: &mut (dyn FnMut(usize, usize) + Send),
        m: &alloc::Measurement,
    ) -> crate::Result<RunResult> {
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
        // The run's own bookkeeping is allocated before the heap's baseline is taken: a
        // schedule of 40k steps (mobilenet_v2 at 0.4x) keeps 2.5 MB of step figures.
        let mut steps = Vec::with_capacity(schedule.steps.len());
        let heap0 = alloc::installed().then(|| m.reset_peak());
        let dev0 = device_used(&self.device);
        let mut dev_peak = 0i64;
        let t0 = Instant::now();
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
                    let v = distinct_storages(self.compute(&mut st, i, s)?, &st)
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
        }
        // Parameters no backward reached have zero gradients.
        for v in self.params() {
            if let std::collections::hash_map::Entry::Vacant(e) = st.grads.entry(v) {
                let z = self.consts[&v]
                    .zeros_like()
                    .map_err(|e| exec_err("", "", e.to_string()))?;
                e.insert(z);
            }
        }
        let loss = st.loss.unwrap_or(f64::NAN);
        let seconds = t0.elapsed().as_secs_f64();
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
