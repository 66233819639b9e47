//! Training-graph derivation (forward, loss, backward, saved-tensor edges) and lowering to a
//! [`remat_solver::Problem`].

use crate::error::{PlannerError, Result};
use crate::model::{with_ctx, Model, ValueId, ValueKind};
use crate::ops::{GradRule, Saved};
use crate::tensor::Fact;
use petgraph::graph::NodeIndex;
use petgraph::Direction;
use remat_solver::{Node, NodeKind, Problem};
use serde::Serialize;
use std::collections::{BTreeSet, HashMap, HashSet};

/// One node of the training graph: a forward op (or a value it computes for its backward),
/// a graph input, the loss, or the backward of a forward op.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TrainingNode {
    /// Stable unique id: `i:<input>`, `f:<node>`, `f:<node>:<tag>` for extra saved values
    /// (`stats`, `indices`, `mask`, `workspace`), `loss`, `b:<node>`.
    pub id: String,
    /// The ONNX node (or input) name.
    pub name: String,
    pub op: String,
    pub kind: NodeKind,
    /// Bytes of the node's output. A backward node's output is the gradient w.r.t. its
    /// forward op's float non-parameter inputs.
    pub bytes: u64,
    /// FLOPs to compute the node once.
    pub cost: f64,
    /// Indices (into [`TrainingGraph::nodes`]) of the nodes whose outputs this one reads.
    pub deps: Vec<usize>,
    /// Backward nodes that produce a parameter gradient.
    pub required: bool,
    /// The node draws random numbers (dropout mask): recomputing it must replay its state.
    pub replay_rng: bool,
}

/// The training step of a model at its bound dims, in a valid topological order: graph
/// inputs and forward nodes, the loss, then backward nodes.
#[derive(Debug, Clone)]
pub struct TrainingGraph {
    pub nodes: Vec<TrainingNode>,
    /// Bytes of the trainable parameters.
    pub params_bytes: u64,
    /// Bytes of the non-trainable constants the live graph reads (running statistics...).
    pub buffers_bytes: u64,
    /// Bytes of forward values kept for the backward when nothing is recomputed: each
    /// storage once (views share their base's), parameters excluded.
    pub saved_activation_bytes: u64,
    /// The storages counted in `saved_activation_bytes`, largest first.
    pub saved: Vec<SavedTensor>,
    problem: Problem,
    /// Per node, the bytes it reads and writes once computed: its inputs (activations,
    /// parameters and constants) and its output; for a backward node also the weights it
    /// reads and the parameter gradients it writes. The roofline cost model's memory traffic.
    pub traffic: Vec<u64>,
    /// Per node, the op its roofline rates are looked up by (`crate::Roofline::op_rates`):
    /// its op, or a variant that runs at rates of its own: `Conv.grouped` (and
    /// `ConvTranspose.grouped`) for a convolution of more than one group, whose depthwise
    /// kernels run at a fraction of a dense convolution's FLOP rate.
    pub rate_ops: Vec<String>,
    /// What the executor needs to run the graph: where each training node comes from.
    pub exec: ExecInfo,
}

/// Where a training node comes from (parallel to [`TrainingGraph::nodes`]).
#[derive(Debug, Clone, PartialEq)]
pub enum Source {
    /// A graph input carrying data.
    Input(ValueId),
    /// An extra value an op's backward keeps (`stats`, `indices`, `mask`, `workspace`).
    Extra { node: NodeIndex, tag: &'static str },
    /// A forward op (its outputs; views of them are computed on demand).
    Forward(NodeIndex),
    /// The loss: the sum of the means of [`ExecInfo::loss_outputs`].
    Loss,
    /// The backward of a forward op: the gradients of its non-parameter inputs.
    Backward(NodeIndex),
}

/// The executor's view of the training graph.
#[derive(Debug, Clone, Default)]
pub struct ExecInfo {
    pub sources: Vec<Source>,
    /// The training node holding each activation's storage (a view maps to its base's node).
    pub holder: HashMap<ValueId, usize>,
    pub loss_outputs: Vec<ValueId>,
    /// Live forward ops in evaluation order, views included.
    pub fwd_order: Vec<NodeIndex>,
    /// Live views with no node of their own: computed from their base when read, their
    /// backward folded into their consumers' gradient flow.
    pub collapsed: HashSet<NodeIndex>,
    /// Per live op: which input slots need a gradient.
    pub needs: HashMap<NodeIndex, Vec<bool>>,
    /// Per live op: which output slots carry a gradient.
    pub out_grad: HashMap<NodeIndex, Vec<bool>>,
    /// Per live op with a backward: its gradient rule.
    pub rules: HashMap<NodeIndex, GradRule>,
}

/// A storage the backward keeps when nothing is recomputed.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SavedTensor {
    /// The value (its storage root: views resolve to their base), or `<node>:<tag>` for an
    /// extra value such as batch statistics.
    pub name: String,
    pub bytes: u64,
    /// The forward nodes whose backward keeps it.
    pub by: Vec<String>,
}

impl TrainingGraph {
    /// Bytes every step carries: parameters, their gradients and the buffers.
    pub fn fixed_bytes(&self) -> u64 {
        self.params_bytes
            .saturating_mul(2)
            .saturating_add(self.buffers_bytes)
    }

    /// The solver's view of the training step: costs are FLOPs, bytes are output bytes,
    /// `fixed_bytes` holds parameters, gradients and buffers. The problem was validated when
    /// the training graph was derived.
    pub fn to_problem(&self) -> Problem {
        self.problem.clone()
    }
}

/// The loss outputs whose mean is the same whatever the inputs and parameters: a `Softmax`'s
/// output (every slice along its axis sums to 1, so the mean is 1 / the axis's length), read
/// directly or through ops that only move or regroup its elements. Its gradient is zero up
/// to rounding, and when every loss output is one the loss is constant (classifiers exported
/// for inference end in one, PaddleOCR's among them): the executor weights these outputs'
/// elements so that its gradient check compares real gradients (`remat_exec::Executor::loss_weights`).
pub fn constant_mean_outputs(model: &Model, loss_outputs: &[ValueId]) -> Vec<ValueId> {
    const MOVES: &[&str] = &[
        "Reshape",
        "Flatten",
        "Squeeze",
        "Unsqueeze",
        "Transpose",
        "Identity",
    ];
    loss_outputs
        .iter()
        .copied()
        .filter(|&out| {
            let mut v = out;
            // Bounded by the graph's size: each step goes to an earlier node.
            for _ in 0..=model.graph.node_count() {
                let Some((ix, 0)) = model.values.get(v).and_then(|x| x.producer) else {
                    return false;
                };
                let node = &model.graph[ix];
                if node.op_type == "Softmax" {
                    return true;
                }
                match node.inputs.first().copied().flatten() {
                    Some(input) if MOVES.contains(&node.op_type.as_str()) => v = input,
                    _ => return false,
                }
            }
            false
        })
        .collect()
}

fn fact_bytes(model: &Model, v: ValueId) -> u64 {
    model.values[v].fact.as_ref().map(Fact::bytes).unwrap_or(0)
}

fn is_float(model: &Model, v: ValueId) -> bool {
    model.values[v]
        .fact
        .as_ref()
        .is_some_and(|f| f.dtype.is_float())
}

struct NodeInfo {
    needs: Vec<bool>,
    out_grad: Vec<bool>,
    view: Option<usize>,
    random: bool,
    flops: f64,
    grad: Option<GradRule>,
}

/// Derives the training graph. The loss is the sum of the means of all floating-point
/// graph outputs produced by the forward graph.
pub fn derive(model: &Model, name: &str) -> Result<TrainingGraph> {
    if !model.unsupported.is_empty() {
        return Err(PlannerError::Unsupported {
            nodes: model.unsupported.clone(),
        });
    }
    let order: Vec<NodeIndex> = model
        .graph
        .node_indices()
        .filter(|&ix| !model.graph[ix].folded && !model.graph[ix].skipped)
        .collect();

    // Gradient requirements, forward.
    let mut requires = vec![false; model.values.len()];
    for (v, val) in model.values.iter().enumerate() {
        requires[v] = matches!(val.kind, ValueKind::Param | ValueKind::Derived);
    }
    let mut info: HashMap<NodeIndex, NodeInfo> = HashMap::with_capacity(order.len());
    for &ix in &order {
        let node = &model.graph[ix];
        let r = with_ctx(model, ix, |spec, cx| {
            let needs: Vec<bool> = node
                .inputs
                .iter()
                .enumerate()
                .map(|(i, v)| {
                    v.is_some_and(|v| requires[v] && is_float(model, v)) && (spec.diff_in)(cx, i)
                })
                .collect();
            let any = needs.iter().any(|&b| b);
            let out_grad: Vec<bool> = node
                .outputs
                .iter()
                .enumerate()
                .map(|(k, v)| {
                    any && v.is_some_and(|v| is_float(model, v)) && (spec.diff_out)(cx, k)
                })
                .collect();
            let outs = model.output_facts(ix);
            let flops = (spec.flops)(cx, &outs);
            let grad = any.then(|| (spec.grad)(cx, &outs, &needs));
            NodeInfo {
                view: (spec.view)(cx),
                random: spec.random,
                needs,
                out_grad,
                flops: if flops.is_finite() && flops >= 0.0 {
                    flops
                } else {
                    0.0
                },
                grad,
            }
        });
        let Some(mut r) = r else {
            return Err(PlannerError::Lowering(format!(
                "node {:?}: op {:?} has no registry entry",
                node.name, node.op_type
            )));
        };
        if let Some(g) = r.grad.as_mut() {
            let view_of = |p: NodeIndex| info.get(&p).and_then(|ni| ni.view);
            crate::layout::copy_strided_operands(model, &view_of, ix, g);
        }
        for (k, v) in node.outputs.iter().enumerate() {
            if let Some(v) = v {
                requires[*v] = r.out_grad[k];
            }
        }
        info.insert(ix, r);
    }

    // The loss reads every floating-point graph output computed by a live node.
    let loss_outputs: Vec<ValueId> = model
        .outputs
        .iter()
        .copied()
        .filter(|&v| is_float(model, v) && model.values[v].kind == ValueKind::Activation)
        .collect();
    if loss_outputs.is_empty() {
        return Err(PlannerError::NoLoss);
    }

    // Live nodes: ancestors of the loss through non-folded nodes.
    let mut live: HashSet<NodeIndex> = HashSet::new();
    let mut stack: Vec<NodeIndex> = loss_outputs
        .iter()
        .filter_map(|&v| model.values[v].producer.map(|p| p.0))
        .collect();
    while let Some(ix) = stack.pop() {
        if !info.contains_key(&ix) || !live.insert(ix) {
            continue;
        }
        for p in model.graph.neighbors_directed(ix, Direction::Incoming) {
            stack.push(p);
        }
    }

    let mut nodes: Vec<TrainingNode> = vec![];
    let mut sources: Vec<Source> = vec![];
    let mut ids: HashSet<String> = HashSet::new();
    let mut push = |nodes: &mut Vec<TrainingNode>, mut n: TrainingNode| -> usize {
        let base = n.id.clone();
        let mut k = 1;
        while !ids.insert(n.id.clone()) {
            k += 1;
            n.id = format!("{base}~{k}");
        }
        nodes.push(n);
        nodes.len() - 1
    };
    // Training node holding each value's storage.
    let mut holder: HashMap<ValueId, usize> = HashMap::new();

    // Graph data inputs read by live nodes.
    let read_by_live: HashSet<ValueId> = live
        .iter()
        .flat_map(|ix| model.graph[*ix].inputs.iter().flatten().copied())
        .collect();
    for &v in &model.inputs {
        let val = &model.values[v];
        if val.kind == ValueKind::Data && read_by_live.contains(&v) {
            let i = push(
                &mut nodes,
                TrainingNode {
                    id: format!("i:{}", val.name),
                    name: val.name.clone(),
                    op: "Input".into(),
                    kind: NodeKind::Forward,
                    bytes: fact_bytes(model, v),
                    cost: 0.0,
                    deps: vec![],
                    required: false,
                    replay_rng: false,
                },
            );
            sources.push(Source::Input(v));
            holder.insert(v, i);
        }
    }

    // Forward nodes, in order; views collapse onto their base's node.
    let fwd_order: Vec<NodeIndex> = order
        .iter()
        .copied()
        .filter(|ix| live.contains(ix))
        .collect();
    let mut fwd_index: HashMap<NodeIndex, usize> = HashMap::new();
    let mut extra_index: HashMap<(NodeIndex, usize), usize> = HashMap::new();
    for &ix in &fwd_order {
        let node = &model.graph[ix];
        let ni = &info[&ix];
        if let Some(base) = ni.view.and_then(|i| node.inputs.get(i).copied().flatten()) {
            if let Some(&h) = holder.get(&base) {
                for v in node.outputs.iter().flatten() {
                    holder.insert(*v, h);
                }
                continue;
            }
        }
        let mut deps: Vec<usize> = node
            .inputs
            .iter()
            .flatten()
            .filter_map(|v| holder.get(v).copied())
            .collect();
        if let Some(g) = &ni.grad {
            for (k, s) in g.saved.iter().enumerate() {
                if let Saved::Extra { tag, bytes, cost } = s {
                    let e = push(
                        &mut nodes,
                        TrainingNode {
                            id: format!("f:{}:{tag}", node.name),
                            name: node.name.clone(),
                            op: format!("{}.{tag}", node.op_type),
                            kind: NodeKind::Forward,
                            bytes: *bytes,
                            cost: if cost.is_finite() { cost.max(0.0) } else { 0.0 },
                            deps: if *tag == "mask" { vec![] } else { deps.clone() },
                            required: false,
                            replay_rng: g.replay_rng,
                        },
                    );
                    sources.push(Source::Extra { node: ix, tag });
                    extra_index.insert((ix, k), e);
                }
            }
            deps.extend(
                extra_index
                    .iter()
                    .filter(|((n, _), _)| *n == ix)
                    .map(|(_, &e)| e),
            );
        }
        deps.sort_unstable();
        deps.dedup();
        let bytes = node
            .outputs
            .iter()
            .flatten()
            .fold(0u64, |a, &v| a.saturating_add(fact_bytes(model, v)));
        let f = push(
            &mut nodes,
            TrainingNode {
                id: format!("f:{}", node.name),
                name: node.name.clone(),
                op: node.op_type.clone(),
                kind: NodeKind::Forward,
                bytes,
                cost: ni.flops,
                deps,
                required: false,
                replay_rng: ni.random || ni.grad.as_ref().is_some_and(|g| g.replay_rng),
            },
        );
        sources.push(Source::Forward(ix));
        fwd_index.insert(ix, f);
        for v in node.outputs.iter().flatten() {
            holder.insert(*v, f);
        }
    }

    // The loss: sum of the means of the float outputs.
    let loss_deps: Vec<usize> = {
        let mut d: Vec<usize> = loss_outputs
            .iter()
            .filter_map(|v| holder.get(v).copied())
            .collect();
        d.sort_unstable();
        d.dedup();
        d
    };
    let loss = push(
        &mut nodes,
        TrainingNode {
            id: "loss".into(),
            name: "loss".into(),
            op: "SumOfMeans".into(),
            kind: NodeKind::Loss,
            bytes: 4,
            cost: loss_outputs
                .iter()
                .map(|&v| {
                    model.values[v]
                        .fact
                        .as_ref()
                        .map(|f| f.numel() as f64)
                        .unwrap_or(0.0)
                })
                .sum(),
            deps: loss_deps,
            required: false,
            replay_rng: false,
        },
    );

    sources.push(Source::Loss);
    debug_assert_eq!(sources.len(), loss + 1);

    // Backward nodes, in reverse forward order. A view's backward is folded into the
    // gradient flow: its consumers' backward nodes feed its base's producer directly.
    let mut bwd_index: HashMap<NodeIndex, usize> = HashMap::new();
    let consumers = |v: ValueId| -> Vec<(NodeIndex, usize)> {
        let Some((p, _)) = model.values[v].producer else {
            // Sources: scan every live node (inputs have no producer edge).
            return fwd_order
                .iter()
                .flat_map(|&ix| {
                    model.graph[ix]
                        .inputs
                        .iter()
                        .enumerate()
                        .filter(move |(_, x)| **x == Some(v))
                        .map(move |(i, _)| (ix, i))
                })
                .collect();
        };
        let mut out = vec![];
        let mut seen = HashSet::new();
        for c in model.graph.neighbors_directed(p, Direction::Outgoing) {
            if !live.contains(&c) || !seen.insert(c) {
                continue;
            }
            for (i, x) in model.graph[c].inputs.iter().enumerate() {
                if *x == Some(v) {
                    out.push((c, i));
                }
            }
        }
        out
    };
    let collapsed = |ix: NodeIndex| !fwd_index.contains_key(&ix);
    for &ix in fwd_order.iter().rev() {
        let node = &model.graph[ix];
        let ni = &info[&ix];
        let Some(g) = &ni.grad else { continue };
        if collapsed(ix) {
            continue;
        }
        // Gradient providers of each output, looking through collapsed views.
        let mut providers: BTreeSet<usize> = BTreeSet::new();
        let mut todo: Vec<ValueId> = node
            .outputs
            .iter()
            .enumerate()
            .filter(|(k, v)| v.is_some() && ni.out_grad[*k])
            .filter_map(|(_, v)| *v)
            .collect();
        let mut visited = HashSet::new();
        while let Some(v) = todo.pop() {
            if !visited.insert(v) {
                continue;
            }
            if loss_outputs.contains(&v) {
                providers.insert(loss);
            }
            for (c, slot) in consumers(v) {
                let Some(ci) = info.get(&c) else { continue };
                if !ci.needs.get(slot).copied().unwrap_or(false) {
                    continue;
                }
                if collapsed(c) {
                    let cn = &model.graph[c];
                    todo.extend(
                        cn.outputs
                            .iter()
                            .enumerate()
                            .filter(|(k, _)| ci.out_grad[*k])
                            .filter_map(|(_, v)| *v),
                    );
                } else if let Some(&b) = bwd_index.get(&c) {
                    providers.insert(b);
                }
            }
        }
        if providers.is_empty() {
            continue;
        }
        let mut deps: Vec<usize> = providers.into_iter().collect();
        for (k, s) in g.saved.iter().enumerate() {
            match s {
                Saved::Input(i) => {
                    if let Some(h) = node
                        .inputs
                        .get(*i)
                        .copied()
                        .flatten()
                        .and_then(|v| holder.get(&v))
                    {
                        deps.push(*h);
                    }
                }
                Saved::Output(i) => {
                    if let Some(h) = node
                        .outputs
                        .get(*i)
                        .copied()
                        .flatten()
                        .and_then(|v| holder.get(&v))
                    {
                        deps.push(*h);
                    }
                }
                Saved::Extra { .. } => {
                    if let Some(&e) = extra_index.get(&(ix, k)) {
                        deps.push(e);
                    }
                }
            }
        }
        deps.sort_unstable();
        deps.dedup();
        let mut grad_values: Vec<ValueId> = node
            .inputs
            .iter()
            .enumerate()
            .filter(|(i, v)| v.is_some() && ni.needs[*i])
            .filter_map(|(_, v)| *v)
            .collect();
        grad_values.sort_unstable();
        grad_values.dedup();
        let is_param =
            |v: ValueId| matches!(model.values[v].kind, ValueKind::Param | ValueKind::Derived);
        let required = grad_values.iter().any(|&v| is_param(v));
        let bytes = grad_values
            .iter()
            .filter(|&&v| !is_param(v))
            .fold(0u64, |a, &v| a.saturating_add(fact_bytes(model, v)));
        let cost = g.bwd_factor * ni.flops;
        let b = push(
            &mut nodes,
            TrainingNode {
                id: format!("b:{}", node.name),
                name: node.name.clone(),
                op: node.op_type.clone(),
                kind: NodeKind::Backward,
                bytes,
                cost: if cost.is_finite() { cost.max(0.0) } else { 0.0 },
                deps,
                required,
                replay_rng: false,
            },
        );
        sources.push(Source::Backward(ix));
        bwd_index.insert(ix, b);
    }

    // Figures.
    let mut params_bytes = 0u64;
    let mut buffers_bytes = 0u64;
    for (v, val) in model.values.iter().enumerate() {
        match val.kind {
            ValueKind::Param => params_bytes = params_bytes.saturating_add(fact_bytes(model, v)),
            ValueKind::Buffer => buffers_bytes = buffers_bytes.saturating_add(fact_bytes(model, v)),
            _ => {}
        }
    }
    let saved = saved_tensors(model, &fwd_order, &info, &bwd_index);
    let saved_activation_bytes = saved.iter().fold(0u64, |a, s| a.saturating_add(s.bytes));

    let problem_nodes: Vec<Node> = nodes
        .iter()
        .map(|n| Node {
            id: n.id.clone(),
            name: format!("{} {}", n.op, n.name),
            cost: n.cost,
            bytes: n.bytes,
            deps: n.deps.clone(),
            kind: n.kind,
            required: n.required,
        })
        .collect();
    let traffic = traffic(model, &nodes, &sources);
    let rate_ops = rate_ops(model, &nodes, &sources);
    let fixed = params_bytes.saturating_mul(2).saturating_add(buffers_bytes);
    let problem = Problem::new(name, problem_nodes, fixed)
        .map_err(|e| PlannerError::Lowering(e.to_string()))?;
    let collapsed_set: HashSet<NodeIndex> = fwd_order
        .iter()
        .copied()
        .filter(|ix| !fwd_index.contains_key(ix))
        .collect();
    let exec = ExecInfo {
        sources,
        holder,
        loss_outputs: loss_outputs.clone(),
        collapsed: collapsed_set,
        needs: fwd_order
            .iter()
            .map(|ix| (*ix, info[ix].needs.clone()))
            .collect(),
        out_grad: fwd_order
            .iter()
            .map(|ix| (*ix, info[ix].out_grad.clone()))
            .collect(),
        rules: fwd_order
            .iter()
            .filter_map(|ix| info[ix].grad.clone().map(|g| (*ix, g)))
            .collect(),
        fwd_order,
    };
    Ok(TrainingGraph {
        exec,
        traffic,
        rate_ops,
        nodes,
        params_bytes,
        buffers_bytes,
        saved_activation_bytes,
        saved,
        problem,
    })
}

/// [`TrainingGraph::traffic`]: per node, what it reads and writes.
fn traffic(model: &Model, nodes: &[TrainingNode], sources: &[Source]) -> Vec<u64> {
    let deps = |i: usize| -> u64 {
        nodes[i]
            .deps
            .iter()
            .fold(0u64, |a, &d| a.saturating_add(nodes[d].bytes))
    };
    let values = |vs: &[Option<ValueId>], keep: &dyn Fn(ValueId) -> bool| -> u64 {
        let mut seen: Vec<ValueId> = vs.iter().flatten().copied().filter(|&v| keep(v)).collect();
        seen.sort_unstable();
        seen.dedup();
        seen.iter()
            .fold(0u64, |a, &v| a.saturating_add(fact_bytes(model, v)))
    };
    let weight = |v: ValueId| {
        matches!(
            model.values[v].kind,
            ValueKind::Param | ValueKind::Derived | ValueKind::Buffer
        )
    };
    nodes
        .iter()
        .enumerate()
        .map(|(i, n)| {
            let own = n.bytes;
            let io = match sources.get(i) {
                // Every input and output of the op.
                Some(Source::Forward(ix)) => {
                    let node = &model.graph[*ix];
                    values(&node.inputs, &|_| true).saturating_add(values(&node.outputs, &|_| true))
                }
                // What it reads, the weights the gradient of the inputs needs, the input
                // gradients it writes and, when it is required, the parameter gradients.
                Some(Source::Backward(ix)) => {
                    let w = values(&model.graph[*ix].inputs, &weight);
                    let grads = if n.required { w } else { 0 };
                    deps(i)
                        .saturating_add(w)
                        .saturating_add(own)
                        .saturating_add(grads)
                }
                _ => deps(i).saturating_add(own),
            };
            io.max(own)
        })
        .collect()
}

/// [`TrainingGraph::rate_ops`].
fn rate_ops(model: &Model, nodes: &[TrainingNode], sources: &[Source]) -> Vec<String> {
    nodes
        .iter()
        .enumerate()
        .map(|(i, n)| {
            // A forward op and its backward carry the ONNX node's op type as their op.
            let grouped = n.op.starts_with("Conv")
                && match sources.get(i) {
                    // The importer has read `group` already; a value it refused never gets here.
                    Some(Source::Forward(ix) | Source::Backward(ix)) => {
                        model.graph[*ix].attrs().int_or("group", 1).unwrap_or(1) > 1
                    }
                    _ => false,
                };
            if grouped {
                format!("{}.grouped", n.op)
            } else {
                n.op.clone()
            }
        })
        .collect()
}

/// The storage a value lives in: views resolve to their base.
fn storage_root(model: &Model, info: &HashMap<NodeIndex, NodeInfo>, mut v: ValueId) -> ValueId {
    for _ in 0..model.values.len() {
        let Some((p, _)) = model.values[v].producer else {
            return v;
        };
        let Some(ni) = info.get(&p) else { return v };
        match ni
            .view
            .and_then(|i| model.graph[p].inputs.get(i).copied().flatten())
        {
            Some(base) => v = base,
            None => return v,
        }
    }
    v
}

fn saved_tensors(
    model: &Model,
    fwd_order: &[NodeIndex],
    info: &HashMap<NodeIndex, NodeInfo>,
    bwd_index: &HashMap<NodeIndex, usize>,
) -> Vec<SavedTensor> {
    let mut roots: Vec<SavedTensor> = vec![];
    let mut root_index: HashMap<ValueId, usize> = HashMap::new();
    for &ix in fwd_order {
        if !bwd_index.contains_key(&ix) {
            continue;
        }
        let Some(g) = &info[&ix].grad else { continue };
        let node = &model.graph[ix];
        for s in &g.saved {
            let v = match s {
                Saved::Input(i) => node.inputs.get(*i).copied().flatten(),
                Saved::Output(i) => node.outputs.get(*i).copied().flatten(),
                Saved::Extra { tag, bytes, .. } => {
                    roots.push(SavedTensor {
                        name: format!("{}:{tag}", node.name),
                        bytes: *bytes,
                        by: vec![node.name.clone()],
                    });
                    None
                }
            };
            let Some(v) = v else { continue };
            let r = storage_root(model, info, v);
            // Parameters and frozen weights are held all step: saving one costs nothing (the
            // fixtures' PyTorch figure skips every `model.parameters()` storage, trained or not).
            if matches!(model.values[r].kind, ValueKind::Param | ValueKind::Derived)
                || model.frozen.contains(&r)
            {
                continue;
            }
            match root_index.get(&r) {
                Some(&k) => {
                    if !roots[k].by.contains(&node.name) {
                        roots[k].by.push(node.name.clone());
                    }
                }
                None => {
                    root_index.insert(r, roots.len());
                    roots.push(SavedTensor {
                        name: model.values[r].name.clone(),
                        bytes: fact_bytes(model, r),
                        by: vec![node.name.clone()],
                    });
                }
            }
        }
    }
    roots.sort_by(|a, b| b.bytes.cmp(&a.bytes).then_with(|| a.name.cmp(&b.name)));
    roots
}

impl Model {
    /// The training step at the bound dims (forward, loss, backward).
    pub fn training_graph(&self) -> Result<TrainingGraph> {
        let name = if self.producer.is_empty() {
            "onnx"
        } else {
            &self.producer
        };
        derive(self, name)
    }
}
