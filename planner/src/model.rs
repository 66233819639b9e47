//! Import: ONNX protobuf → graph IR on `petgraph`, with shape inference at the bound dims,
//! constant folding of shape arithmetic, `If` inlining and the parameter rule.

use crate::error::{PlannerError, Result, UnsupportedNode};
use crate::onnx::{decode_tensor, parse_model, Attrs};
use crate::ops::{registry, Ctx, OpSpec};
use crate::tensor::{numel, DType, Fact};
use onnx_protobuf::tensor_shape_proto::dimension::Value as DimValue;
use onnx_protobuf::type_proto::Value as TypeValue;
use onnx_protobuf::{AttributeProto, FunctionProto, GraphProto, NodeProto, ValueInfoProto};
use petgraph::graph::{DiGraph, NodeIndex};
use std::collections::{BTreeMap, HashMap, HashSet};

/// Supported opsets of the default domain.
pub const MIN_OPSET: i64 = 9;
/// Opsets 24 and 25 changed the ops the registry knows only in their types (and added
/// `Attention` inputs/attributes that do not change shapes). Opsets 26 to 28 (onnx 1.21 to
/// 1.23) added ops (BitCast, CumProd, SwiGLU, LinearAttention, CausalConvWithState) and
/// changed, of the ops remat knows: SpaceToDepth's `mode` (CRD, 28), Mod's float semantics with
/// `fmod` 0 (floor division, 28), Range's `stash_type` (the accumulation type of 16-bit floats,
/// 27) and the types of Cast, Celu, Compress, DepthToSpace, Einsum, OneHot, the quantizers,
/// ReduceLogSum(Exp), ReverseSequence, Unique and BitShift. ONNX's node suite
/// (`fixtures/onnx_node/`, the `conformance` test of remat-exec) checks them at opset 28.
pub const MAX_OPSET: i64 = 28;

/// Index of a value in [`Model::values`].
pub type ValueId = usize;

/// What a value is in training.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ValueKind {
    /// A graph input that carries data (images, token ids).
    Data,
    /// A trainable parameter: its bytes and its gradient's are fixed bytes.
    Param,
    /// A constant fed to the live graph that is not trainable (running statistics, masks,
    /// scalars): fixed bytes.
    Buffer,
    /// A constant folded at import time and only read by other folded nodes.
    Const,
    /// A constant computed at import from parameters (a transposed or tied weight): it is
    /// its parameters, counted once under them, and it carries their gradient.
    Derived,
    /// The output of a live forward op.
    Activation,
}

#[derive(Debug, Clone)]
pub struct Value {
    pub name: String,
    /// `None` when the value is downstream of an unsupported node.
    pub fact: Option<Fact>,
    /// The node and output slot producing it.
    pub producer: Option<(NodeIndex, usize)>,
    pub kind: ValueKind,
}

/// One op of the typed graph.
#[derive(Debug, Clone)]
pub struct OpNode {
    /// Unique name (the ONNX name, `<op>_<index>` when empty, `#k` suffixes for duplicates,
    /// `<if>/` prefixes for inlined branches).
    pub name: String,
    pub op_type: String,
    pub domain: String,
    pub opset: i64,
    pub attrs: Vec<AttributeProto>,
    pub inputs: Vec<Option<ValueId>>,
    pub outputs: Vec<Option<ValueId>>,
    /// Every input is a constant: the node is evaluated at import and is not part of the
    /// training graph.
    pub folded: bool,
    /// Not part of the forward graph: the op is not supported, an input is unknown because
    /// of one that is not, or the node was fused into another (see [`crate::fuse`]).
    pub skipped: bool,
}

/// An imported model: the typed graph at the bound dims.
#[derive(Debug, Clone)]
pub struct Model {
    pub opset: i64,
    pub producer: String,
    /// Nodes in evaluation (topological) order; edges carry the value id they pass.
    pub graph: DiGraph<OpNode, ValueId>,
    pub values: Vec<Value>,
    /// Graph inputs (data and parameters), in model order.
    pub inputs: Vec<ValueId>,
    pub outputs: Vec<ValueId>,
    /// The bound symbolic dims.
    pub dims: BTreeMap<String, u64>,
    pub unsupported: Vec<UnsupportedNode>,
    /// Nodes in the model's top-level graph.
    pub onnx_nodes: usize,
    /// Op type → count over the top-level graph.
    pub op_counts: BTreeMap<String, usize>,
    /// One-element float initializers read in a differentiable slot and taken for constants
    /// (buffers) by the parameter rule: a scalar `nn.Parameter` or PReLU's one slope reads
    /// like an exporter's epsilon; `--param NAME` trains one (set by [`classify_constants`]).
    pub scalar_constants: Vec<ValueId>,
    /// Weights the training keeps frozen (`--freeze`, or `--input` on an initializer), and the
    /// constants computed at import from them (a transposed frozen weight): buffers held all
    /// step, which a backward may read without saving anything (set by [`classify_constants`]).
    pub frozen: Vec<ValueId>,
}

impl OpNode {
    /// The node's attributes, read through the typed getters (errors name the node).
    pub fn attrs(&self) -> Attrs<'_> {
        Attrs {
            node: &self.name,
            op: &self.op_type,
            list: &self.attrs,
        }
    }
}

impl Model {
    /// The inferred facts of values (`None` for a missing value or one without a fact).
    pub fn facts(&self, vs: &[Option<ValueId>]) -> Vec<Option<Fact>> {
        vs.iter()
            .map(|v| v.and_then(|v| self.values[v].fact.clone()))
            .collect()
    }

    /// The facts of node `ix`'s outputs as an op's gradient and cost rules take them (an
    /// output without one, or absent, as an empty float tensor).
    pub fn output_facts(&self, ix: NodeIndex) -> Vec<Fact> {
        self.graph[ix]
            .outputs
            .iter()
            .map(|v| {
                v.and_then(|v| self.values[v].fact.clone())
                    .unwrap_or_else(|| Fact::new(DType::F32, vec![0]))
            })
            .collect()
    }
}

fn malformed(what: impl Into<String>) -> PlannerError {
    PlannerError::Malformed { what: what.into() }
}

/// The name a dynamic dim without a name is bound by: `<input>:<axis>` (e.g. `x:0`).
pub fn unnamed_dim(input: &str, axis: usize) -> String {
    format!("{input}:{axis}")
}

/// The element type and dims of a graph input as declared.
struct Declared {
    dtype: Option<DType>,
    /// `Ok(d)` for a fixed dim, `Err(name)` for a symbolic one.
    dims: Option<Vec<std::result::Result<i64, String>>>,
}

fn declared(v: &ValueInfoProto) -> Declared {
    let Some(tp) = v.type_.as_ref() else {
        return Declared {
            dtype: None,
            dims: None,
        };
    };
    match &tp.value {
        Some(TypeValue::TensorType(t)) => Declared {
            dtype: DType::from_onnx(i64::from(t.elem_type)),
            dims: t.shape.as_ref().map(|s| {
                s.dim
                    .iter()
                    .enumerate()
                    .map(|(axis, d)| match &d.value {
                        // -1 (Paddle's way of saying dynamic) is a dynamic dim, like one
                        // with neither a value nor a name: both are bound as
                        // `<input>:<axis>`. Other negative values are rejected below. So is
                        // the name "?", which Paddle writes for every unknown dim (a
                        // classifier's `x` is [-1, 3, ?, ?], height and width independent),
                        // not a symbol the axes share.
                        Some(DimValue::DimValue(-1)) => Err(unnamed_dim(&v.name, axis)),
                        Some(DimValue::DimValue(x)) => Ok(*x),
                        Some(DimValue::DimParam(p)) if !p.is_empty() && p != "?" => Err(p.clone()),
                        _ => Err(unnamed_dim(&v.name, axis)),
                    })
                    .collect()
            }),
        },
        _ => Declared {
            dtype: None,
            dims: None,
        },
    }
}

/// Checks that graph input `v`, which has an initializer of fact `f`, declares no other
/// element type, rank or fixed dim than the initializer's.
fn declared_like(v: &ValueInfoProto, f: &Fact) -> Result<()> {
    let d = declared(v);
    let dims_differ = d.dims.as_ref().is_some_and(|dims| {
        dims.len() != f.shape.len()
            || dims
                .iter()
                .zip(&f.shape)
                .any(|(d, &s)| matches!(d, Ok(x) if *x >= 0 && *x as u64 != s))
    });
    if d.dtype.is_some_and(|t| t != f.dtype) || dims_differ {
        let shown: Vec<String> = d
            .dims
            .unwrap_or_default()
            .into_iter()
            .map(|d| d.map_or_else(|s| s, |x| x.to_string()))
            .collect();
        let dtype = d
            .dtype
            .map_or_else(|| "untyped".into(), |t| format!("{t:?}"));
        return Err(malformed(format!(
            "graph input {:?} is declared {dtype} [{}] but its initializer is {:?} {:?}",
            v.name,
            shown.join(", "),
            f.dtype,
            f.shape
        )));
    }
    Ok(())
}

/// Names of every value a graph (and its subgraphs, recursively) reads.
fn names_read(g: &GraphProto, out: &mut HashSet<String>) {
    for n in &g.node {
        out.extend(n.input.iter().filter(|s| !s.is_empty()).cloned());
        for a in &n.attribute {
            if let Some(sub) = a.g.as_ref() {
                names_read(sub, out);
            }
            for sub in &a.graphs {
                names_read(sub, out);
            }
        }
    }
}

/// Nodes of a graph in a topological order (exporters usually sort them; not all do).
fn topo_order(g: &GraphProto) -> Result<Vec<usize>> {
    let mut producer: HashMap<&str, usize> = HashMap::new();
    for (i, n) in g.node.iter().enumerate() {
        for o in n.output.iter().filter(|o| !o.is_empty()) {
            if producer.insert(o.as_str(), i).is_some() {
                return Err(malformed(format!(
                    "value {o:?} is produced by more than one node"
                )));
            }
        }
    }
    let mut dg: DiGraph<usize, ()> = DiGraph::with_capacity(g.node.len(), g.node.len() * 2);
    let ix: Vec<NodeIndex> = (0..g.node.len()).map(|i| dg.add_node(i)).collect();
    for (i, n) in g.node.iter().enumerate() {
        let mut reads: HashSet<String> =
            n.input.iter().filter(|s| !s.is_empty()).cloned().collect();
        for a in &n.attribute {
            if let Some(sub) = a.g.as_ref() {
                names_read(sub, &mut reads);
            }
            for sub in &a.graphs {
                names_read(sub, &mut reads);
            }
        }
        for r in reads {
            if let Some(&p) = producer.get(r.as_str()) {
                dg.add_edge(ix[p], ix[i], ());
            }
        }
    }
    // Kahn's algorithm, smallest model index first: the model's order is kept wherever the
    // dependencies allow, so evaluation and reports are deterministic.
    let mut indegree: Vec<usize> = ix
        .iter()
        .map(|&n| {
            dg.neighbors_directed(n, petgraph::Direction::Incoming)
                .count()
        })
        .collect();
    let mut ready: std::collections::BinaryHeap<std::cmp::Reverse<usize>> = indegree
        .iter()
        .enumerate()
        .filter(|(_, &d)| d == 0)
        .map(|(i, _)| std::cmp::Reverse(i))
        .collect();
    let mut order = Vec::with_capacity(g.node.len());
    while let Some(std::cmp::Reverse(i)) = ready.pop() {
        order.push(i);
        for succ in dg.neighbors_directed(ix[i], petgraph::Direction::Outgoing) {
            let j = dg[succ];
            indegree[j] -= 1;
            if indegree[j] == 0 {
                ready.push(std::cmp::Reverse(j));
            }
        }
    }
    match order.len() == g.node.len() {
        true => Ok(order),
        false => {
            let mut nodes: Vec<String> = petgraph::algo::tarjan_scc(&dg)
                .into_iter()
                .filter(|scc| scc.len() > 1 || dg.contains_edge(scc[0], scc[0]))
                .flatten()
                .map(|n| display_name(&g.node[dg[n]], dg[n]))
                .collect();
            nodes.sort();
            Err(PlannerError::Cycle { nodes })
        }
    }
}

fn display_name(n: &NodeProto, index: usize) -> String {
    if n.name.is_empty() {
        format!("{}_{index}", n.op_type)
    } else {
        n.name.clone()
    }
}

/// Ops whose input 0 is the activation they transform: a graph input read there (directly or
/// through views) is data, never a weight ([`classify_inputs`], rule 6).
const ACTIVATION_SLOT_OPS: &[&str] = &[
    "Conv",
    "ConvTranspose",
    "Gemm",
    "MatMul",
    "BatchNormalization",
    "LayerNormalization",
    "InstanceNormalization",
    "GroupNormalization",
    "RMSNormalization",
    "MaxPool",
    "AveragePool",
    "GlobalAveragePool",
    "GlobalMaxPool",
    "LpPool",
    "LSTM",
    "GRU",
    "RNN",
];

/// Ops that pass their input 0 on as a view or a cast, followed when looking for the op an
/// input reaches.
const PASS_THROUGH_OPS: &[&str] = &[
    "Reshape",
    "Flatten",
    "Squeeze",
    "Unsqueeze",
    "Identity",
    "Cast",
];

/// Calls `reads(input, node, slot)` for each node of the main graph (default domain) that
/// reads a graph input, directly or through [`PASS_THROUGH_OPS`] (their input 0), at `slot`.
fn walk_from_inputs<'a>(g: &'a GraphProto, mut reads: impl FnMut(&'a str, &'a NodeProto, usize)) {
    let mut readers: HashMap<&str, Vec<(&NodeProto, usize)>> = HashMap::new();
    for n in g
        .node
        .iter()
        .filter(|n| n.domain.is_empty() || n.domain == "ai.onnx")
    {
        for (slot, i) in n.input.iter().enumerate().filter(|(_, i)| !i.is_empty()) {
            readers.entry(i.as_str()).or_default().push((n, slot));
        }
    }
    for input in &g.input {
        let mut stack = vec![input.name.as_str()];
        let mut seen: HashSet<&str> = HashSet::new();
        while let Some(v) = stack.pop() {
            if !seen.insert(v) {
                continue;
            }
            for &(n, slot) in readers.get(v).into_iter().flatten() {
                reads(input.name.as_str(), n, slot);
                if slot == 0 && PASS_THROUGH_OPS.contains(&n.op_type.as_str()) {
                    stack.extend(n.output.first().map(String::as_str));
                }
            }
        }
    }
}

/// The graph inputs that reach input 0 of an [`ACTIVATION_SLOT_OPS`] op of the main graph,
/// directly or through [`PASS_THROUGH_OPS`] (their input 0).
fn read_as_activations(g: &GraphProto) -> HashSet<String> {
    let mut found = HashSet::new();
    walk_from_inputs(g, |input, n, slot| {
        if slot == 0 && ACTIVATION_SLOT_OPS.contains(&n.op_type.as_str()) {
            found.insert(input.to_string());
        }
    });
    found
}

/// For each graph input, the other graph inputs it is concatenated with: both reach one
/// `Concat` of the main graph (any slot), directly or through [`PASS_THROUGH_OPS`].
fn concatenated_with(g: &GraphProto) -> HashMap<String, HashSet<String>> {
    // The graph inputs that reach each Concat (by its first output's name).
    let mut at: HashMap<&str, HashSet<String>> = HashMap::new();
    walk_from_inputs(g, |input, n, _| {
        if let Some(out) = n.output.first().filter(|_| n.op_type == "Concat") {
            at.entry(out.as_str())
                .or_default()
                .insert(input.to_string());
        }
    });
    let mut partners: HashMap<String, HashSet<String>> = HashMap::new();
    for group in at.values() {
        for a in group {
            let others = group.iter().filter(|b| *b != a).cloned();
            partners.entry(a.clone()).or_default().extend(others);
        }
    }
    partners
}

/// `--param` and `--freeze` name floating-point weights: `Err` when `name`, a value of the
/// type `dtype` names, which is not floating point, is named by either.
fn weights_are_float(opts: &ImportOptions, name: &str, dtype: impl Fn() -> String) -> Result<()> {
    for (which, list) in [("--param", &opts.params), ("--freeze", &opts.frozen)] {
        if list.iter().any(|n| n == name) {
            return Err(PlannerError::ParamNotFloat {
                which,
                name: name.to_string(),
                dtype: dtype(),
            });
        }
    }
    Ok(())
}

/// Decides which graph inputs are parameters (the rule is documented in the crate docs).
fn classify_inputs(
    inputs: &[&ValueInfoProto],
    initializers: &HashSet<&str>,
    activations: &HashSet<String>,
    partners: &HashMap<String, HashSet<String>>,
    opts: &ImportOptions,
) -> Result<HashMap<String, bool>> {
    let names: Vec<String> = inputs.iter().map(|v| v.name.clone()).collect();
    for (which, list) in [
        ("--param", &opts.params),
        ("--input", &opts.inputs),
        ("--freeze", &opts.frozen),
    ] {
        for n in list {
            // Each may also name an initializer that is not a graph input: `--param` a
            // one-element one (a scalar `nn.Parameter`, PReLU's slope), otherwise a constant;
            // `--input` or `--freeze` a weight the training keeps frozen, otherwise a
            // parameter.
            if !names.contains(n) && !initializers.contains(n.as_str()) {
                return Err(PlannerError::UnknownInput {
                    which,
                    name: n.clone(),
                    inputs: names.clone(),
                });
            }
        }
    }
    for v in inputs {
        if let Some(dtype) = declared(v).dtype.filter(|t| !t.is_float()) {
            weights_are_float(opts, &v.name, || format!("{dtype:?}").to_lowercase())?;
        }
    }
    let mut decided: Vec<Option<bool>> = inputs
        .iter()
        .map(|v| {
            let name = v.name.as_str();
            if opts.inputs.iter().any(|n| n == name) {
                return Some(false);
            }
            // A frozen weight is a constant like a parameter (its kind is decided with the
            // constants: a buffer, `may_be_parameter`).
            if opts.params.iter().chain(&opts.frozen).any(|n| n == name)
                || initializers.contains(name)
            {
                return Some(true);
            }
            let d = declared(v);
            if !d.dtype.is_some_and(|t| t.is_float()) {
                return Some(false);
            }
            if d.dims
                .as_ref()
                .is_none_or(|dims| dims.iter().any(|x| x.is_err()))
            {
                return Some(false);
            }
            if activations.contains(name) {
                return Some(false);
            }
            None
        })
        .collect();
    if !decided.contains(&Some(false)) {
        if let Some(first) = decided.iter_mut().find(|d| d.is_none()) {
            *first = Some(false);
        }
    }
    // Rule 8: concatenated with data (RAFT's two frames), to a fixed point.
    loop {
        let data: HashSet<&str> = inputs
            .iter()
            .zip(&decided)
            .filter(|(_, d)| **d == Some(false))
            .map(|(v, _)| v.name.as_str())
            .collect();
        let mut changed = false;
        for (v, d) in inputs.iter().zip(decided.iter_mut()) {
            let joined = partners
                .get(&v.name)
                .is_some_and(|p| p.iter().any(|o| data.contains(o.as_str())));
            if d.is_none() && joined {
                *d = Some(false);
                changed = true;
            }
        }
        if !changed {
            break;
        }
    }
    Ok(names
        .into_iter()
        .zip(decided)
        .map(|(n, d)| (n, d.unwrap_or(true)))
        .collect())
}

struct Builder {
    opset: i64,
    graph: DiGraph<OpNode, ValueId>,
    values: Vec<Value>,
    /// Whether each value is a constant (not computed from data inputs).
    is_const: Vec<bool>,
    scopes: Vec<HashMap<String, ValueId>>,
    used_names: HashSet<String>,
    unsupported: Vec<UnsupportedNode>,
    /// Model-local functions by (domain, name), inlined where they are called.
    functions: HashMap<(String, String), FunctionProto>,
    /// Nesting of inlined functions (a recursive function is an error, not a hang).
    depth: usize,
}

impl Builder {
    fn lookup(&self, name: &str) -> Option<ValueId> {
        self.scopes.iter().rev().find_map(|s| s.get(name).copied())
    }

    fn add_value(
        &mut self,
        name: &str,
        fact: Option<Fact>,
        kind: ValueKind,
        is_const: bool,
    ) -> ValueId {
        let id = self.values.len();
        self.values.push(Value {
            name: name.to_string(),
            fact,
            producer: None,
            kind,
        });
        self.is_const.push(is_const);
        if let Some(scope) = self.scopes.last_mut() {
            scope.insert(name.to_string(), id);
        }
        id
    }

    fn unique_name(&mut self, base: String) -> String {
        let mut name = base.clone();
        let mut k = 1;
        while !self.used_names.insert(name.clone()) {
            k += 1;
            name = format!("{base}#{k}");
        }
        name
    }

    fn add_initializers(&mut self, g: &GraphProto) -> Result<()> {
        let mut seen = HashSet::new();
        for t in &g.initializer {
            if t.name.is_empty() {
                return Err(malformed("an initializer has no name"));
            }
            if !seen.insert(t.name.as_str()) {
                return Err(malformed(format!(
                    "two initializers are named {:?} (which one the graph reads is not defined)",
                    t.name
                )));
            }
            let d = decode_tensor(t, &t.name)?;
            let fact = match d.value {
                Some(v) => Fact::with_value(v),
                None => Fact::new(d.dtype, d.shape),
            };
            self.add_value(&t.name, Some(fact), ValueKind::Const, true);
        }
        if !g.sparse_initializer.is_empty() {
            return Err(malformed("sparse initializers are not supported"));
        }
        Ok(())
    }

    /// Runs the nodes of `g` (the top-level graph or an inlined branch) in topological order.
    fn run_graph(&mut self, g: &GraphProto, prefix: &str) -> Result<()> {
        let order = topo_order(g)?;
        // Every input must be produced somewhere: this graph, an enclosing one, or an input.
        let produced: HashSet<&str> = g
            .node
            .iter()
            .flat_map(|n| n.output.iter().map(|s| s.as_str()))
            .collect();
        for (i, n) in g.node.iter().enumerate() {
            for inp in n.input.iter().filter(|s| !s.is_empty()) {
                if !produced.contains(inp.as_str()) && self.lookup(inp).is_none() {
                    return Err(PlannerError::DanglingInput {
                        node: format!("{prefix}{}", display_name(n, i)),
                        input: inp.clone(),
                    });
                }
            }
        }
        for i in order {
            self.run_node(&g.node[i], i, prefix)?;
        }
        Ok(())
    }

    fn unsupported(&mut self, name: &str, n: &NodeProto, reason: &str) {
        self.unsupported.push(UnsupportedNode {
            node: name.to_string(),
            op_type: n.op_type.clone(),
            domain: n.domain.clone(),
            reason: reason.to_string(),
        });
    }

    fn run_node(&mut self, n: &NodeProto, index: usize, prefix: &str) -> Result<()> {
        let name = self.unique_name(format!("{prefix}{}", display_name(n, index)));
        if n.op_type.is_empty() {
            return Err(malformed(format!("node {name:?} has no op_type")));
        }
        let inputs: Vec<Option<ValueId>> = n
            .input
            .iter()
            .map(|s| if s.is_empty() { None } else { self.lookup(s) })
            .collect();
        let facts: Vec<Option<Fact>> = inputs
            .iter()
            .map(|v| v.and_then(|v| self.values[v].fact.clone()))
            .collect();
        let any_unknown = inputs
            .iter()
            .zip(&facts)
            .any(|(v, f)| v.is_some() && f.is_none());
        let default_domain = n.domain.is_empty() || n.domain == "ai.onnx";
        let spec: Option<&OpSpec> = if default_domain {
            registry().get(n.op_type.as_str())
        } else {
            None
        };

        if default_domain && n.op_type == "If" && spec.is_none() {
            if any_unknown {
                return self.skip(n, &name, inputs, true);
            }
            let cond = facts
                .first()
                .and_then(|f| f.as_ref())
                .and_then(|f| f.value.as_ref())
                .and_then(|v| v.data.get_i64(0));
            let Some(cond) = cond else {
                self.unsupported(&name, n, "If with a data-dependent condition");
                return self.skip(n, &name, inputs, true);
            };
            let attrs = Attrs {
                node: &name,
                op: "If",
                list: &n.attribute,
            };
            let branch_name = if cond != 0 {
                "then_branch"
            } else {
                "else_branch"
            };
            let branch = attrs
                .graph(branch_name)?
                .ok_or_else(|| attrs.err(branch_name, "required attribute is missing"))?;
            if branch.output.len() != n.output.len() {
                return Err(attrs.err(
                    branch_name,
                    format!(
                        "branch has {} outputs but the node has {}",
                        branch.output.len(),
                        n.output.len()
                    ),
                ));
            }
            self.scopes.push(HashMap::new());
            self.add_initializers(branch)?;
            let r = self.run_graph(branch, &format!("{name}/"));
            let ids: Vec<Option<ValueId>> =
                branch.output.iter().map(|o| self.lookup(&o.name)).collect();
            self.scopes.pop();
            r?;
            for (out, id) in n.output.iter().zip(ids) {
                let id = id.ok_or_else(|| {
                    malformed(format!("If {name:?}: branch output is not produced"))
                })?;
                if !out.is_empty() {
                    if let Some(scope) = self.scopes.last_mut() {
                        scope.insert(out.clone(), id);
                    }
                }
            }
            return Ok(());
        }

        if spec.is_none() {
            let key = (n.domain.clone(), n.op_type.clone());
            if let Some(f) = self.functions.get(&key).cloned() {
                if any_unknown {
                    return self.skip(n, &name, inputs, true);
                }
                return self.inline_function(&f, n, &name);
            }
        }
        let Some(spec) = spec else {
            let reason = if !default_domain {
                format!("domain {:?} is not supported", n.domain)
            } else if matches!(n.op_type.as_str(), "Loop" | "Scan") {
                "data-dependent control flow is not supported".to_string()
            } else {
                "unknown op".to_string()
            };
            self.unsupported(&name, n, &reason);
            return self.skip(n, &name, inputs, true);
        };
        if any_unknown {
            return self.skip(n, &name, inputs, true);
        }
        let cx = Ctx {
            node: &name,
            op: &n.op_type,
            opset: self.opset,
            attrs: Attrs {
                node: &name,
                op: &n.op_type,
                list: &n.attribute,
            },
            inputs: &facts,
            n_outputs: n.output.len(),
        };
        crate::ops::schema::check(&cx)?;
        let out_facts = (spec.infer)(&cx)?;
        for (k, o) in n.output.iter().enumerate() {
            if !o.is_empty() && k >= out_facts.len() {
                return Err(cx.err(format!(
                    "node declares output {k} ({o:?}), which the op does not have"
                )));
            }
        }
        for f in &out_facts {
            if f.dtype.is_float() && numel(&f.shape).is_none() {
                return Err(cx.err(format!("output shape {:?} overflows", f.shape)));
            }
        }
        let all_const = inputs.iter().flatten().all(|&v| self.is_const[v]);
        let all_known = !out_facts.is_empty() && out_facts.iter().all(|f| f.value.is_some());
        let folded = (all_const || all_known) && !spec.random;
        let node_ix = self.graph.add_node(OpNode {
            name: name.clone(),
            op_type: n.op_type.clone(),
            domain: n.domain.clone(),
            opset: self.opset,
            attrs: n.attribute.clone(),
            inputs: inputs.clone(),
            outputs: vec![],
            folded,
            skipped: false,
        });
        let mut outs = Vec::with_capacity(n.output.len());
        for (k, o) in n.output.iter().enumerate() {
            if o.is_empty() {
                outs.push(None);
                continue;
            }
            let kind = if folded {
                ValueKind::Const
            } else {
                ValueKind::Activation
            };
            let id = self.add_value(o, out_facts.get(k).cloned(), kind, folded);
            self.values[id].producer = Some((node_ix, k));
            outs.push(Some(id));
        }
        self.graph[node_ix].outputs = outs;
        for v in inputs.into_iter().flatten() {
            if let Some((p, _)) = self.values[v].producer {
                self.graph.add_edge(p, node_ix, v);
            }
        }
        Ok(())
    }

    /// Inlines a call of a model-local function: formal inputs bind to the call's values,
    /// attribute references (`ref_attr_name`) to the call's attributes or the defaults.
    fn inline_function(&mut self, f: &FunctionProto, n: &NodeProto, name: &str) -> Result<()> {
        if self.depth >= 32 {
            return Err(malformed(format!(
                "node {name:?}: function {:?} nests more than 32 levels (recursive?)",
                f.name
            )));
        }
        let mut scope = HashMap::new();
        for (formal, actual) in f.input.iter().zip(&n.input) {
            if actual.is_empty() {
                continue;
            }
            let id = self
                .lookup(actual)
                .ok_or_else(|| PlannerError::DanglingInput {
                    node: name.to_string(),
                    input: actual.clone(),
                })?;
            scope.insert(formal.clone(), id);
        }
        let mut attrs: HashMap<&str, &AttributeProto> = f
            .attribute_proto
            .iter()
            .map(|a| (a.name.as_str(), a))
            .collect();
        for a in &n.attribute {
            attrs.insert(a.name.as_str(), a);
        }
        let mut body = GraphProto::new();
        for bn in &f.node {
            let mut bn = bn.clone();
            bn.attribute = bn
                .attribute
                .into_iter()
                .filter_map(|a| {
                    if a.ref_attr_name.is_empty() {
                        return Some(a);
                    }
                    attrs.get(a.ref_attr_name.as_str()).map(|v| {
                        let mut v = (*v).clone();
                        v.name = a.name.clone();
                        v
                    })
                })
                .collect();
            body.node.push(bn);
        }
        self.scopes.push(scope);
        self.depth += 1;
        let r = self.run_graph(&body, &format!("{name}/"));
        self.depth -= 1;
        let ids: Vec<Option<ValueId>> = f.output.iter().map(|o| self.lookup(o)).collect();
        self.scopes.pop();
        r?;
        for (k, out) in n.output.iter().enumerate() {
            if out.is_empty() {
                continue;
            }
            let id = ids.get(k).copied().flatten().ok_or_else(|| {
                malformed(format!(
                    "node {name:?}: function {:?} does not produce output {k}",
                    f.name
                ))
            })?;
            if let Some(scope) = self.scopes.last_mut() {
                scope.insert(out.clone(), id);
            }
        }
        Ok(())
    }

    /// Adds a node whose outputs are unknown (unsupported, or downstream of one).
    fn skip(
        &mut self,
        n: &NodeProto,
        name: &str,
        inputs: Vec<Option<ValueId>>,
        skipped: bool,
    ) -> Result<()> {
        let node_ix = self.graph.add_node(OpNode {
            name: name.to_string(),
            op_type: n.op_type.clone(),
            domain: n.domain.clone(),
            opset: self.opset,
            attrs: vec![],
            inputs,
            outputs: vec![],
            folded: false,
            skipped,
        });
        let mut outs = vec![];
        for (k, o) in n.output.iter().enumerate() {
            if o.is_empty() {
                outs.push(None);
                continue;
            }
            let id = self.add_value(o, None, ValueKind::Activation, false);
            self.values[id].producer = Some((node_ix, k));
            outs.push(Some(id));
        }
        self.graph[node_ix].outputs = outs;
        Ok(())
    }
}

/// The op spec and context of a node, rebuilt from the typed graph.
pub fn with_ctx<R>(model: &Model, ix: NodeIndex, f: impl FnOnce(&OpSpec, &Ctx) -> R) -> Option<R> {
    let node = &model.graph[ix];
    let spec = registry().get(node.op_type.as_str())?;
    let facts = model.facts(&node.inputs);
    let cx = Ctx {
        node: &node.name,
        op: &node.op_type,
        opset: node.opset,
        attrs: node.attrs(),
        inputs: &facts,
        n_outputs: node.outputs.len(),
    };
    Some(f(spec, &cx))
}

/// How to import a model.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ImportOptions {
    /// Values of the model's symbolic dims (`dim_param` names), e.g. `batch=8`. A dynamic
    /// dim without a name (no value and no name, or the value -1 or the name "?", as Paddle
    /// writes them) is called `<input>:<axis>` (e.g. `x:0=6`); the older `<input>.<axis>` is
    /// read too.
    pub dims: BTreeMap<String, u64>,
    /// Graph inputs or initializers to treat as parameters (`--param NAME`); a name may be a
    /// glob pattern (`read`'s `resolve_names`).
    pub params: Vec<String>,
    /// Graph inputs to treat as data, or initializers as frozen weights (`--input NAME`); a
    /// name may be a glob pattern.
    pub inputs: Vec<String>,
    /// Weights the training keeps frozen (`--freeze NAME`): graph inputs (a model exported
    /// with its weights as inputs) or initializers, held as buffers with no gradient; a name
    /// may be a glob pattern (`--freeze 'backbone.*'`).
    pub frozen: Vec<String>,
}

/// Reads a model: parse, bind dims, infer shapes, fold constants. Unsupported nodes do not
/// stop the import; they are listed in [`Model::unsupported`]. The values are classified by
/// [`classify_constants`] once the exporter's decompositions are fused (`crate::import`);
/// the second result says which values are constants.
/// The third result is `opts` with the patterns among its names expanded
/// ([`resolve_names`]), for the steps after this one.
pub(crate) fn read(
    bytes: &[u8],
    opts: &ImportOptions,
) -> Result<(Model, Vec<bool>, ImportOptions)> {
    let mut proto = parse_model(bytes)?;
    crate::external::check_no_external_shapes(&mut proto)?;
    let Some(g) = proto.graph.as_ref() else {
        return Err(malformed("the protobuf has no graph"));
    };
    let resolved = resolve_names(opts, g)?;
    let opts = &resolved;
    let opset = proto
        .opset_import
        .iter()
        .find(|o| o.domain.is_empty() || o.domain == "ai.onnx")
        .map(|o| o.version)
        .ok_or_else(|| malformed("the model imports no opset of the default ONNX domain"))?;
    if !(MIN_OPSET..=MAX_OPSET).contains(&opset) {
        return Err(PlannerError::UnsupportedOpset {
            version: opset,
            min: MIN_OPSET,
            max: MAX_OPSET,
        });
    }

    let init_names: HashSet<&str> = g.initializer.iter().map(|t| t.name.as_str()).collect();
    for t in &g.initializer {
        let dtype = DType::from_onnx(i64::from(t.data_type));
        if !dtype.is_some_and(|d| d.is_float()) {
            weights_are_float(opts, &t.name, || {
                dtype.map_or_else(
                    || format!("ONNX type {}", t.data_type),
                    |d| format!("{d:?}").to_lowercase(),
                )
            })?;
        }
    }
    let graph_inputs: Vec<&ValueInfoProto> = g.input.iter().collect();
    for (what, list) in [("graph input", &g.input), ("graph output", &g.output)] {
        let mut seen = HashSet::new();
        if let Some(v) = list.iter().find(|v| !seen.insert(v.name.as_str())) {
            return Err(malformed(format!("{what} {:?} is declared twice", v.name)));
        }
    }
    let is_param = classify_inputs(
        &graph_inputs,
        &init_names,
        &read_as_activations(g),
        &concatenated_with(g),
        opts,
    )?;

    // Symbolic dims of the data inputs: every one must be bound, every binding must exist.
    let mut symbolic: Vec<String> = vec![];
    for v in &graph_inputs {
        if init_names.contains(v.name.as_str()) {
            continue;
        }
        if let Some(dims) = declared(v).dims {
            for d in dims.into_iter().filter_map(|d| d.err()) {
                if !symbolic.contains(&d) {
                    symbolic.push(d);
                }
            }
        }
    }
    // `<input>.<axis>`, the name before `<input>:<axis>`, binds the same dim.
    let mut bound: BTreeMap<String, u64> = BTreeMap::new();
    for (name, &value) in &opts.dims {
        let name = if symbolic.contains(name) {
            name.clone()
        } else {
            match name.rsplit_once('.') {
                Some((input, axis))
                    if axis.parse::<usize>().is_ok()
                        && symbolic.contains(&format!("{input}:{axis}")) =>
                {
                    format!("{input}:{axis}")
                }
                _ => {
                    return Err(PlannerError::UnknownDim {
                        name: name.clone(),
                        known: symbolic.clone(),
                    })
                }
            }
        };
        bound.insert(name, value);
    }
    let mut unbound: Vec<String> = symbolic
        .iter()
        .filter(|s| !bound.contains_key(*s))
        .cloned()
        .collect();
    if !unbound.is_empty() {
        unbound.sort();
        return Err(PlannerError::UnboundDims { names: unbound });
    }
    let mut dims = BTreeMap::new();
    for (name, &value) in &bound {
        if value == 0 || value > i64::MAX as u64 {
            return Err(PlannerError::InvalidDim {
                what: format!("symbolic dimension {name:?}"),
                value: value.to_string(),
                message: if value == 0 {
                    "bound dims must be positive".into()
                } else {
                    format!("bound dims must be at most {}", i64::MAX)
                },
            });
        }
        dims.insert(name.clone(), value);
    }

    let mut b = Builder {
        opset,
        graph: DiGraph::with_capacity(g.node.len(), g.node.len() * 2),
        values: Vec::with_capacity(g.node.len() * 2),
        is_const: vec![],
        scopes: vec![HashMap::new()],
        used_names: HashSet::new(),
        unsupported: vec![],
        functions: proto
            .functions
            .iter()
            .map(|f| ((f.domain.clone(), f.name.clone()), f.clone()))
            .collect(),
        depth: 0,
    };
    b.add_initializers(g)?;
    let mut inputs = vec![];
    for v in &graph_inputs {
        let param = is_param.get(&v.name).copied().unwrap_or(false);
        if let Some(id) = b.lookup(&v.name) {
            // An input with an initializer: the initializer gives its shape, which the
            // input's declaration must not contradict.
            if let Some(f) = &b.values[id].fact {
                declared_like(v, f)?;
            }
            if !param {
                b.values[id].kind = ValueKind::Data;
                b.is_const[id] = false;
                if let Some(f) = b.values[id].fact.as_mut() {
                    f.value = None;
                }
            }
            inputs.push(id);
            continue;
        }
        let d = declared(v);
        let dtype = d.dtype.ok_or_else(|| {
            malformed(format!(
                "graph input {:?} has no tensor element type",
                v.name
            ))
        })?;
        let decl = d
            .dims
            .ok_or_else(|| malformed(format!("graph input {:?} has no shape", v.name)))?;
        let mut shape = Vec::with_capacity(decl.len());
        for dim in decl {
            let x = match dim {
                Ok(x) => x,
                Err(sym) => dims.get(&sym).map(|&x| x as i64).unwrap_or(0),
            };
            if x <= 0 {
                return Err(PlannerError::InvalidDim {
                    what: format!("graph input {:?}", v.name),
                    value: x.to_string(),
                    message: "input dims must be positive".into(),
                });
            }
            shape.push(x as u64);
        }
        if numel(&shape).is_none_or(|n| n.checked_mul(dtype.bits()).is_none()) {
            return Err(PlannerError::InvalidDim {
                what: format!("graph input {:?}", v.name),
                value: format!("{shape:?}"),
                message: "the element count of this shape overflows".into(),
            });
        }
        let kind = if param {
            ValueKind::Const
        } else {
            ValueKind::Data
        };
        let id = b.add_value(&v.name, Some(Fact::new(dtype, shape)), kind, param);
        inputs.push(id);
    }
    b.run_graph(g, "")?;

    let mut outputs = vec![];
    for o in &g.output {
        let id = b.lookup(&o.name).ok_or_else(|| {
            malformed(format!(
                "graph output {:?} is not produced by any node or input",
                o.name
            ))
        })?;
        outputs.push(id);
    }
    let mut op_counts = BTreeMap::new();
    for n in &g.node {
        *op_counts.entry(n.op_type.clone()).or_insert(0) += 1;
    }
    let model = Model {
        opset,
        producer: format!("{} {}", proto.producer_name, proto.producer_version)
            .trim()
            .to_string(),
        graph: b.graph,
        values: b.values,
        inputs,
        outputs,
        dims,
        unsupported: b.unsupported,
        onnx_nodes: g.node.len(),
        op_counts,
        scalar_constants: vec![],
        frozen: vec![],
    };
    Ok((model, b.is_const, resolved))
}

/// Expands the patterns among the names of `--input`, `--param` and `--freeze`: a name that
/// is not a graph input or an initializer of `g` and holds `*`, `?` or `[` is a glob pattern
/// (`*` any run of characters, `/` and `.` included; `?` one; `[...]` one of a set), replaced
/// by every graph input and initializer it matches, in the file's order: `--freeze
/// 'backbone.*'` freezes a backbone of hundreds of weights. A name another option gives
/// exactly is left to it (`--freeze 'encoder.*' --param encoder.scale` trains the scale). A
/// pattern that matches nothing, or does not parse, is an error naming it: a frozen backbone
/// that silently stayed trained is the mistake this guards against. Exact names are kept as
/// they are (one that names nothing is refused later, listing the graph inputs); one name
/// given exactly to two of the options is an error.
fn resolve_names(opts: &ImportOptions, g: &GraphProto) -> Result<ImportOptions> {
    named_once(opts)?;
    let lists = [&opts.inputs, &opts.params, &opts.frozen];
    let is_pattern = |n: &str| n.contains(['*', '?', '[']);
    if !lists.iter().any(|l| l.iter().any(|n| is_pattern(n))) {
        return Ok(opts.clone());
    }
    let mut names: Vec<&str> = Vec::new();
    let mut seen: HashSet<&str> = HashSet::new();
    for n in g
        .input
        .iter()
        .map(|v| v.name.as_str())
        .chain(g.initializer.iter().map(|t| t.name.as_str()))
    {
        if seen.insert(n) {
            names.push(n);
        }
    }
    // `--param` and `--freeze` name weights: their patterns pass over integer and boolean
    // values (a module's index buffer, the token ids), which they may not name.
    let not_float: HashSet<&str> = g
        .input
        .iter()
        .filter(|v| !declared(v).dtype.is_some_and(|t| t.is_float()))
        .map(|v| v.name.as_str())
        .chain(
            g.initializer
                .iter()
                .filter(|t| !DType::from_onnx(i64::from(t.data_type)).is_some_and(|d| d.is_float()))
                .map(|t| t.name.as_str()),
        )
        .collect();
    let exact: HashSet<&str> = lists
        .iter()
        .flat_map(|l| l.iter())
        .map(String::as_str)
        .filter(|n| seen.contains(n) || !is_pattern(n))
        .collect();
    let expand = |which: &'static str, list: &[String]| -> Result<Vec<String>> {
        let mut out: Vec<String> = Vec::new();
        for n in list {
            if seen.contains(n.as_str()) || !is_pattern(n) {
                out.push(n.clone());
                continue;
            }
            let pattern = glob::Pattern::new(n).map_err(|e| PlannerError::BadPattern {
                which,
                pattern: n.clone(),
                reason: e.msg.to_string(),
            })?;
            let weights_only = which != "--input";
            let matched: Vec<&str> = names
                .iter()
                .copied()
                .filter(|m| pattern.matches(m) && !(weights_only && not_float.contains(m)))
                .collect();
            if matched.is_empty() {
                return Err(PlannerError::NoMatch {
                    which,
                    what: if weights_only {
                        "floating-point graph input or initializer"
                    } else {
                        "graph input or initializer"
                    },
                    pattern: n.clone(),
                    examples: names.iter().take(8).map(|s| s.to_string()).collect(),
                    count: names.len(),
                });
            }
            for m in matched {
                if !exact.contains(m) && !out.iter().any(|o| o == m) {
                    out.push(m.to_string());
                }
            }
        }
        Ok(out)
    };
    let resolved = ImportOptions {
        dims: opts.dims.clone(),
        inputs: expand("--input", &opts.inputs)?,
        params: expand("--param", &opts.params)?,
        frozen: expand("--freeze", &opts.frozen)?,
    };
    named_once(&resolved)?;
    Ok(resolved)
}

/// No name in two of `--input`, `--param` and `--freeze` (exactly, or matched by patterns of
/// two of them): each says something else of the value.
fn named_once(opts: &ImportOptions) -> Result<()> {
    let lists: [(&'static str, &Vec<String>); 3] = [
        ("--input", &opts.inputs),
        ("--param", &opts.params),
        ("--freeze", &opts.frozen),
    ];
    for (i, (a, first)) in lists.iter().enumerate() {
        for (b, second) in &lists[i + 1..] {
            if let Some(n) = first.iter().find(|n| second.contains(n)) {
                return Err(PlannerError::NamedTwice {
                    name: n.clone(),
                    first: a,
                    second: b,
                });
            }
        }
    }
    Ok(())
}

/// The parameter rule's eligibility, one place for [`classify_constants`] and the fusions
/// (which must not fuse a value that may take a gradient away from it): whether the constant
/// `v` (an initializer, a graph input that is not data, a `Constant` node's output, a value
/// folded from integer constants) may be a trained parameter. A float value named by
/// `--param` always may; otherwise a graph input may, and any other of at least two elements
/// (a one-element constant is an epsilon or a scale), except one a PyTorch exporter wrote in
/// the graph: PyTorch's exporters put every parameter in a graph input or an initializer, so
/// what they write as a `Constant` node or compute in-graph (non-persistent buffers such as a
/// mel matrix, zero initial RNN states) is not trainable. [`classify_constants`] makes it a
/// parameter when, besides, a differentiated input reads it (or `--param` names it).
pub(crate) fn may_be_parameter(model: &Model, v: ValueId, opts: &ImportOptions) -> bool {
    let value = &model.values[v];
    let Some(f) = &value.fact else { return false };
    if !f.dtype.is_float() || value.kind == ValueKind::Data {
        return false;
    }
    // `--freeze` (or `--input` on an initializer) names a weight the training keeps frozen
    // (`requires_grad=False`: a frozen backbone, the base weights under LoRA): no gradient, no
    // backward of its own; `--input` on a graph input names data.
    if opts.inputs.contains(&value.name) || opts.frozen.contains(&value.name) {
        return false;
    }
    if opts.params.contains(&value.name) || model.inputs.contains(&v) {
        return true;
    }
    let from_pytorch = model
        .producer
        .split_whitespace()
        .next()
        .is_some_and(|p| p.eq_ignore_ascii_case("pytorch"));
    let in_graph = value.producer.is_some();
    f.numel() >= 2 && !(from_pytorch && in_graph)
}

/// Constants read by live nodes become parameters when they are floating point, are read in
/// a differentiable slot, and are either a graph input (or `--param`) or have at least two
/// elements (scalars such as `0.5` or `eps` are never parameters). In a model whose producer
/// is `pytorch`, only graph inputs and initializers can be parameters: its exporters write
/// non-persistent buffers as `Constant` nodes. Others become buffers.
/// A constant computed at import from other floating-point constants (a transposed weight,
/// a tied embedding, an embedding lookup at constant indices) is attributed to its roots:
/// the parameter is the weight it was computed from, counted once.
pub(crate) fn classify_constants(model: &mut Model, is_const: &[bool], opts: &ImportOptions) {
    let n = model.values.len();
    // Roots of each constant: itself, or the float constants its folded producer read.
    let mut roots: Vec<Vec<ValueId>> = vec![vec![]; n];
    for v in 0..n {
        if !is_const[v] {
            continue;
        }
        let mut r: Vec<ValueId> = vec![];
        if let Some((p, _)) = model.values[v].producer {
            let node = &model.graph[p];
            if node.folded {
                for &i in node.inputs.iter().flatten() {
                    let float = model.values[i]
                        .fact
                        .as_ref()
                        .is_some_and(|f| f.dtype.is_float());
                    if float && is_const[i] && i < v {
                        r.extend(roots[i].iter().copied());
                    }
                }
            }
        }
        if r.is_empty() {
            r.push(v);
        }
        r.sort_unstable();
        r.dedup();
        roots[v] = r;
    }
    let mut diff_use = vec![false; n];
    let mut any_use = vec![false; n];
    let mark = |v: ValueId, diff: bool, any_use: &mut Vec<bool>, diff_use: &mut Vec<bool>| {
        any_use[v] = true;
        for &r in &roots[v] {
            any_use[r] = true;
            if diff {
                diff_use[r] = true;
            }
        }
    };
    for ix in model.graph.node_indices() {
        let node = &model.graph[ix];
        if node.folded || node.skipped {
            continue;
        }
        let slots: Vec<(usize, ValueId)> = node
            .inputs
            .iter()
            .enumerate()
            .filter_map(|(i, v)| v.map(|v| (i, v)))
            .filter(|&(_, v)| is_const[v])
            .collect();
        if slots.is_empty() {
            continue;
        }
        let diffs = with_ctx(model, ix, |spec, cx| {
            slots
                .iter()
                .map(|&(i, _)| (spec.diff_in)(cx, i))
                .collect::<Vec<bool>>()
        })
        .unwrap_or_default();
        for (k, &(_, v)) in slots.iter().enumerate() {
            mark(v, diffs.get(k) == Some(&true), &mut any_use, &mut diff_use);
        }
    }
    for &o in &model.outputs {
        if is_const[o] {
            mark(o, false, &mut any_use, &mut diff_use);
        }
    }
    let kinds: Vec<Option<ValueKind>> = (0..n)
        .map(|v| {
            let value = &model.values[v];
            if !is_const[v] || value.kind == ValueKind::Data || value.fact.is_none() {
                return None;
            }
            let forced = opts.params.contains(&value.name);
            let is_root = roots[v].len() == 1 && roots[v][0] == v;
            Some(if !is_root || (!any_use[v] && !forced) {
                ValueKind::Const
            } else if may_be_parameter(model, v, opts) && (forced || diff_use[v]) {
                ValueKind::Param
            } else {
                ValueKind::Buffer
            })
        })
        .collect();
    for (value, kind) in model.values.iter_mut().zip(kinds) {
        if let Some(kind) = kind {
            value.kind = kind;
        }
    }
    model.scalar_constants = (0..n)
        .filter(|&v| {
            let value = &model.values[v];
            is_const[v]
                && diff_use[v]
                && value.kind == ValueKind::Buffer
                && !opts.inputs.contains(&value.name)
                && !opts.frozen.contains(&value.name)
                && value.producer.is_none()
                && !model.inputs.contains(&v)
                && value
                    .fact
                    .as_ref()
                    .is_some_and(|f| f.dtype.is_float() && f.numel() == 1)
        })
        .collect();
    let named_frozen = |r: ValueId| {
        let value = &model.values[r];
        value.kind == ValueKind::Buffer
            && (opts.frozen.contains(&value.name) || opts.inputs.contains(&value.name))
    };
    model.frozen = (0..n)
        .filter(|&v| is_const[v] && roots[v].iter().any(|&r| named_frozen(r)))
        .collect();
    for v in 0..n {
        let is_root = roots[v].len() == 1 && roots[v][0] == v;
        if is_const[v]
            && !is_root
            && roots[v]
                .iter()
                .any(|&r| model.values[r].kind == ValueKind::Param)
        {
            model.values[v].kind = ValueKind::Derived;
        }
    }
}
