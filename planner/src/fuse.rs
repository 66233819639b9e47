//! Fusions: exporters decompose some PyTorch ops into several ONNX ops whose backward keeps
//! more than PyTorch's single op does. Rewriting them back makes the saved-tensor model match
//! the framework that trains the model.
//!
//! - GELU (erf form), as the legacy exporter writes `torch.nn.functional.gelu`:
//!   `Mul(Mul(x, Add(Erf(Div(x, √2)), 1)), 0.5)`, `Mul(x, Mul(0.5, 1 + erf))` (dynamo),
//!   `Mul(Mul(x, 0.5), 1 + erf)`, operands in either order, `Mul(x, 1/√2)` for the scaling.
//!   Becomes one `Gelu(x)` (PyTorch's gelu saves `x` only).
//! - SiLU: `Mul(x, Sigmoid(x))` → `Swish(x)` (PyTorch's silu saves `x` only).
//! - Hardswish below opset 14: `Mul(x, HardSigmoid(x))` with `alpha = 1/6`, `beta = 0.5`
//!   → `HardSwish(x)` (PyTorch's hardswish saves `x` only).
//! - Group norm below opset 18 (PyTorch's `group_norm` symbolic): `Reshape(x, [N, G, -1])`,
//!   `InstanceNormalization` with constant unit scale and zero bias, `Reshape` back, `Mul` γ,
//!   `Add` β → `GroupNormalization(x, γ, β)` (PyTorch's native_group_norm saves x and the
//!   per-group statistics, not the normalized tensor the `Mul` would keep).
//! - Scaled dot-product attention as both exporters write `F.scaled_dot_product_attention`:
//!   `MatMul(Mul(q, √s), Mul(kᵀ, √s))` (the scale split over both operands, which eager
//!   attention code never does), an optional `Add` mask, `Softmax`, optionally
//!   `Where(IsNaN(p), 0, p)`, then `MatMul(p, v)` → `Attention(q, kᵀ, v, mask)` marked with
//!   the attribute `remat.key_transposed`. PyTorch's fused attention kernels keep q, k, v,
//!   the output and the row log-sum-exp, not the probabilities. Not where the mask is computed
//!   from a value that may be trained (a learned position bias): its gradient is not one the
//!   fused op gives.
//! - Layer norm below opset 17: `ReduceMean`/`Sub`/`Pow`/`ReduceMean`/`Add`/`Sqrt`/`Div`
//!   (+ `Mul` γ, `Add` β) → `LayerNormalization` (saves x and the statistics).

use crate::model::{may_be_parameter, ImportOptions, Model, ValueId, ValueKind};
use crate::ops::attention::KEY_TRANSPOSED;
use onnx_protobuf::AttributeProto;
use petgraph::graph::NodeIndex;
use std::collections::{HashMap, HashSet};

fn scalar(model: &Model, v: ValueId) -> Option<f64> {
    let f = model.values[v].fact.as_ref()?;
    let t = f.value.as_ref()?;
    (t.len() == 1).then(|| t.data.get_f64(0)).flatten()
}

fn near(a: Option<f64>, b: f64) -> bool {
    a.is_some_and(|a| (a - b).abs() < 1e-3 * b.abs().max(1.0))
}

struct View<'m> {
    model: &'m Model,
    opts: &'m ImportOptions,
    users: HashMap<ValueId, Vec<NodeIndex>>,
}

impl View<'_> {
    fn live(&self, ix: NodeIndex) -> bool {
        let n = &self.model.graph[ix];
        !n.folded && !n.skipped
    }

    /// The single live node reading `v`, when `v` has exactly one reader and is no graph output.
    fn only_user(&self, v: ValueId) -> Option<NodeIndex> {
        if self.model.outputs.contains(&v) {
            return None;
        }
        match self.users.get(&v).map(|u| u.as_slice()) {
            Some([one]) => Some(*one),
            _ => None,
        }
    }

    fn op(&self, ix: NodeIndex) -> &str {
        &self.model.graph[ix].op_type
    }

    fn out(&self, ix: NodeIndex) -> Option<ValueId> {
        self.model.graph[ix].outputs.first().copied().flatten()
    }

    /// Inputs of a binary node as (a, b).
    fn pair(&self, ix: NodeIndex) -> Option<(ValueId, ValueId)> {
        match self.model.graph[ix].inputs.as_slice() {
            [Some(a), Some(b)] => Some((*a, *b)),
            _ => None,
        }
    }

    /// The non-constant operand of a binary op whose other operand is the scalar `c`.
    fn with_scalar(&self, ix: NodeIndex, c: f64) -> Option<ValueId> {
        let (a, b) = self.pair(ix)?;
        if near(scalar(self.model, b), c) {
            Some(a)
        } else if near(scalar(self.model, a), c) {
            Some(b)
        } else {
            None
        }
    }

    /// Matches the erf GELU around an `Erf` node: returns x, the final node and the nodes
    /// folded into it.
    fn gelu_at(&self, erf: NodeIndex) -> Option<(ValueId, NodeIndex, Vec<NodeIndex>)> {
        let arg = self.model.graph[erf].inputs.first().copied().flatten()?;
        let (scale_ix, _) = self.model.values[arg].producer?;
        if !self.live(scale_ix) || self.only_user(arg)? != erf {
            return None;
        }
        let x = match self.op(scale_ix) {
            "Div" => {
                let (a, b) = self.pair(scale_ix)?;
                near(scalar(self.model, b), std::f64::consts::SQRT_2).then_some(a)?
            }
            "Mul" => self.with_scalar(scale_ix, std::f64::consts::FRAC_1_SQRT_2)?,
            _ => return None,
        };
        let add = self.only_user(self.out(erf)?)?;
        if self.op(add) != "Add" || self.with_scalar(add, 1.0)? != self.out(erf)? {
            return None;
        }
        let m1 = self.only_user(self.out(add)?)?;
        if self.op(m1) != "Mul" {
            return None;
        }
        let (a, b) = self.pair(m1)?;
        let other = if a == self.out(add)? { b } else { a };
        if other == x {
            // Mul(x, 1 + erf) then Mul(., 0.5).
            let m2 = self.only_user(self.out(m1)?)?;
            if self.op(m2) != "Mul" || self.with_scalar(m2, 0.5)? != self.out(m1)? {
                return None;
            }
            return Some((x, m2, vec![scale_ix, erf, add, m1]));
        }
        if near(scalar(self.model, other), 0.5) {
            // Mul(x, Mul(0.5, 1 + erf)).
            let m2 = self.only_user(self.out(m1)?)?;
            let (a, b) = self.pair(m2)?;
            let m1_out = self.out(m1)?;
            if self.op(m2) != "Mul" || !((a == x && b == m1_out) || (a == m1_out && b == x)) {
                return None;
            }
            return Some((x, m2, vec![scale_ix, erf, add, m1]));
        }
        // Mul(Mul(x, 0.5), 1 + erf).
        let (half_ix, _) = self.model.values[other].producer?;
        if self.op(half_ix) != "Mul"
            || self.with_scalar(half_ix, 0.5)? != x
            || self.only_user(other)? != m1
        {
            return None;
        }
        Some((x, m1, vec![scale_ix, erf, add, half_ix]))
    }
}

/// A fusion: `last` becomes `op(inputs)` with `attrs`; `parts` leave the graph.
struct Rewrite {
    last: NodeIndex,
    op: &'static str,
    inputs: Vec<Option<ValueId>>,
    attrs: Vec<AttributeProto>,
    parts: Vec<NodeIndex>,
}

impl View<'_> {
    /// `Mul(x, Sigmoid(x))` → `Swish(x)` (PyTorch's `silu` saves `x` only).
    fn silu_at(&self, sig: NodeIndex) -> Option<Rewrite> {
        let x = self.model.graph[sig].inputs.first().copied().flatten()?;
        let s = self.out(sig)?;
        let mul = self.only_user(s)?;
        if self.op(mul) != "Mul" {
            return None;
        }
        let (a, b) = self.pair(mul)?;
        if !((a == x && b == s) || (a == s && b == x)) {
            return None;
        }
        Some(Rewrite {
            last: mul,
            op: "Swish",
            inputs: vec![Some(x)],
            attrs: vec![],
            parts: vec![sig],
        })
    }

    /// `Mul(x, HardSigmoid(x; alpha = 1/6, beta = 0.5))` → `HardSwish(x)`.
    fn hardswish_at(&self, hs: NodeIndex) -> Option<Rewrite> {
        // ONNX defaults: alpha 0.2, beta 0.5 (the exporter omits beta).
        let attr = |name: &str, default: f64| {
            self.model.graph[hs]
                .attrs
                .iter()
                .find(|a| a.name == name)
                .map_or(default, |a| f64::from(a.f))
        };
        if !near(Some(attr("alpha", 0.2)), 1.0 / 6.0) || !near(Some(attr("beta", 0.5)), 0.5) {
            return None;
        }
        let mut r = self.silu_at(hs)?;
        r.op = "HardSwish";
        Some(r)
    }

    fn producer(&self, v: ValueId, op: &str) -> Option<NodeIndex> {
        let (p, _) = self.model.values[v].producer?;
        (self.live(p) && self.op(p) == op).then_some(p)
    }

    fn users_of(&self, v: ValueId) -> &[NodeIndex] {
        self.users.get(&v).map(|u| u.as_slice()).unwrap_or(&[])
    }

    /// Reduced axes of a `ReduceMean` (attribute before opset 18, input after).
    fn mean_axes(&self, ix: NodeIndex) -> Option<Vec<i64>> {
        let n = &self.model.graph[ix];
        if let Some(a) = n.attrs.iter().find(|a| a.name == "axes") {
            return Some(a.ints.clone());
        }
        let v = n.inputs.get(1).copied().flatten()?;
        Some(self.model.values[v].fact.as_ref()?.value.as_ref()?.as_i64())
    }

    /// A value that is not computed from data: a constant, parameter or buffer.
    fn is_fixed(&self, v: ValueId) -> bool {
        !matches!(
            self.model.values[v].kind,
            ValueKind::Activation | ValueKind::Data
        )
    }

    /// `Reshape → InstanceNormalization(1, 0) → Reshape → Mul γ [→ Add β]` around the
    /// instance norm: the group norm of the first Reshape's input.
    fn group_norm_at(&self, inorm: NodeIndex) -> Option<Rewrite> {
        let n = &self.model.graph[inorm];
        let (r, scale, bias) = match n.inputs.as_slice() {
            [Some(r), Some(s), Some(b)] => (*r, *s, *b),
            _ => return None,
        };
        let ones = self.model.values[scale].fact.as_ref()?.value.as_ref()?;
        let zeros = self.model.values[bias].fact.as_ref()?.value.as_ref()?;
        if !ones.as_f64().iter().all(|&v| v == 1.0) || !zeros.as_f64().iter().all(|&v| v == 0.0) {
            return None;
        }
        let rs1 = self.producer(r, "Reshape")?;
        let x = self.model.graph[rs1].inputs.first().copied().flatten()?;
        let xs = &self.model.values[x].fact.as_ref()?.shape;
        let rshape = &self.model.values[r].fact.as_ref()?.shape;
        let groups = *rshape.get(1)?;
        let channels = *xs.get(1)?;
        if rshape.len() != 3 || xs.len() < 3 || groups == 0 || !channels.is_multiple_of(groups) {
            return None;
        }
        if self.only_user(r)? != inorm {
            return None;
        }
        let rs2 = self.only_user(self.out(inorm)?)?;
        if self.op(rs2) != "Reshape" {
            return None;
        }
        let back = self.out(rs2)?;
        if self.model.values[back].fact.as_ref()?.shape != *xs {
            return None;
        }
        let affine = |node: NodeIndex, op: &str| -> Option<(NodeIndex, ValueId)> {
            let out = self.out(node)?;
            let u = self.only_user(out)?;
            if self.op(u) != op {
                return None;
            }
            let (a, b) = self.pair(u)?;
            let other = if a == out { b } else { a };
            self.is_fixed(other).then_some((u, other))
        };
        let (mul, gamma) = affine(rs2, "Mul")?;
        let mut parts = vec![rs1, inorm, rs2];
        let mut last = mul;
        let mut inputs = vec![Some(x), Some(gamma)];
        if let Some((add, beta)) = affine(mul, "Add") {
            parts.push(mul);
            last = add;
            inputs.push(Some(beta));
        }
        let mut g = AttributeProto::new();
        g.name = "num_groups".into();
        g.type_ = onnx_protobuf::attribute_proto::AttributeType::INT.into();
        g.i = groups as i64;
        let mut attrs = vec![g];
        attrs.extend(n.attrs.iter().filter(|a| a.name == "epsilon").cloned());
        Some(Rewrite {
            last,
            op: "GroupNormalization",
            inputs,
            attrs,
            parts,
        })
    }

    /// The operand of `Mul(x, c)` that is not the fixed scalar `c`, and the value of `c`.
    fn scaled(&self, mul: NodeIndex) -> Option<(ValueId, f64)> {
        let (a, b) = self.pair(mul)?;
        let is_scalar = |v: ValueId| {
            self.is_fixed(v)
                && self.model.values[v]
                    .fact
                    .as_ref()
                    .is_some_and(|f| f.numel() == 1)
        };
        if is_scalar(b) && !is_scalar(a) {
            Some((a, scalar(self.model, b)?))
        } else if is_scalar(a) && !is_scalar(b) {
            Some((b, scalar(self.model, a)?))
        } else {
            None
        }
    }

    /// Scaled dot-product attention around its `Softmax` (see the module docs).
    fn sdpa_at(&self, sm: NodeIndex) -> Option<Rewrite> {
        let s_in = self.model.graph[sm].inputs.first().copied().flatten()?;
        let mut parts = vec![];
        let (scores, mask) = match self.producer(s_in, "Add") {
            Some(add) => {
                let (a, b) = self.pair(add)?;
                parts.push(add);
                if self.producer(a, "MatMul").is_some() {
                    (a, Some(b))
                } else {
                    (b, Some(a))
                }
            }
            None => (s_in, None),
        };
        let m1 = self.producer(scores, "MatMul")?;
        if self.only_user(scores)? != *parts.first().unwrap_or(&sm) {
            return None;
        }
        // A mask that may take a gradient (a learned bias: BEiT's and Swin's relative position
        // tables, T5's position bias, a bias computed by a layer) stays decomposed: the fused
        // op's backward gives its q, k and v gradients only, and the bias would get none.
        if mask.is_some_and(|m| self.may_take_gradient(m)) {
            return None;
        }
        let (qs, ks) = self.pair(m1)?;
        let mq = self.producer(qs, "Mul")?;
        let mk = self.producer(ks, "Mul")?;
        let ((q, sq), (kt, sk)) = (self.scaled(mq)?, self.scaled(mk)?);
        if self.only_user(qs)? != m1 || self.only_user(ks)? != m1 {
            return None;
        }
        parts.extend([mq, mk, m1, sm]);
        let p = self.out(sm)?;
        let probs = match self.users_of(p) {
            [_] => p,
            [a, b] => {
                let (isnan, wh) = if self.op(*a) == "IsNaN" {
                    (*a, *b)
                } else {
                    (*b, *a)
                };
                let flag = self.out(isnan)?;
                let n = &self.model.graph[wh];
                let ok = self.op(isnan) == "IsNaN"
                    && self.op(wh) == "Where"
                    && self.only_user(flag)? == wh
                    && n.inputs.first().copied().flatten() == Some(flag)
                    && n.inputs.get(2).copied().flatten() == Some(p);
                if !ok {
                    return None;
                }
                parts.extend([isnan, wh]);
                self.out(wh)?
            }
            _ => return None,
        };
        let m2 = self.only_user(probs)?;
        if self.op(m2) != "MatMul" {
            return None;
        }
        let (pa, v) = self.pair(m2)?;
        if pa != probs {
            return None;
        }
        let rank4 = |x: ValueId| {
            self.model.values[x]
                .fact
                .as_ref()
                .is_some_and(|f| f.rank() == 4)
        };
        if !(rank4(q) && rank4(kt) && rank4(v)) {
            return None;
        }
        let mut attr = AttributeProto::new();
        attr.name = KEY_TRANSPOSED.into();
        attr.type_ = onnx_protobuf::attribute_proto::AttributeType::INT.into();
        attr.i = 1;
        // The two factors multiply into the attention's scale.
        let mut scale = AttributeProto::new();
        scale.name = "scale".into();
        scale.type_ = onnx_protobuf::attribute_proto::AttributeType::FLOAT.into();
        scale.f = (sq * sk) as f32;
        Some(Rewrite {
            last: m2,
            op: "Attention",
            inputs: vec![Some(q), Some(kt), Some(v), mask],
            attrs: vec![attr, scale],
            parts,
        })
    }

    fn is_const(&self, v: ValueId) -> bool {
        self.model.values[v].kind == ValueKind::Const
    }

    /// Whether `v` is computed from a value that may be trained: a constant that
    /// [`may_be_parameter`] admits, reached through the inputs each op differentiates (not a
    /// Shape's, a CastLike's type template, a Where's condition). Before `classify_constants`,
    /// so a parameter candidate counts: the fusion and the parameter rule share one rule.
    fn may_take_gradient(&self, v: ValueId) -> bool {
        let float = |x: ValueId| {
            self.model.values[x]
                .fact
                .as_ref()
                .is_some_and(|f| f.dtype.is_float())
        };
        let mut stack = vec![v];
        let mut seen: HashSet<ValueId> = HashSet::new();
        while let Some(x) = stack.pop() {
            if !seen.insert(x) || !float(x) {
                continue; // no gradient flows through an integer or boolean value
            }
            let inputs: Vec<ValueId> = match self.model.values[x].producer {
                None => vec![],
                Some((p, _)) => {
                    let inputs = &self.model.graph[p].inputs;
                    let diff = crate::model::with_ctx(self.model, p, |spec, cx| {
                        (0..inputs.len())
                            .map(|i| (spec.diff_in)(cx, i))
                            .collect::<Vec<bool>>()
                    })
                    .unwrap_or_default();
                    inputs
                        .iter()
                        .enumerate()
                        .filter(|(i, _)| diff.get(*i) == Some(&true))
                        .filter_map(|(_, v)| *v)
                        .collect()
                }
            };
            // A constant computed from no float constant is a root of the parameter rule.
            let root = self.is_const(x) && !inputs.iter().any(|&i| self.is_const(i) && float(i));
            if root && may_be_parameter(self.model, x, self.opts) {
                return true;
            }
            stack.extend(inputs);
        }
        false
    }

    /// The layer norm that exporters write below opset 17 (PyTorch's `layer_norm` symbolic):
    /// `d = x − ReduceMean(x)`, `Div(d, Sqrt(ReduceMean(Pow(d, 2)) + eps))`, optionally
    /// `· γ + β` → `LayerNormalization(x, γ, β)` (which saves x and the statistics).
    fn layer_norm_at(&self, sqrt: NodeIndex) -> Option<Rewrite> {
        let e = self.model.graph[sqrt].inputs.first().copied().flatten()?;
        let add_eps = self.producer(e, "Add")?;
        let (va, vb) = self.pair(add_eps)?;
        let v = if self.is_const(vb) {
            va
        } else if self.is_const(va) {
            vb
        } else {
            return None;
        };
        let var = self.producer(v, "ReduceMean")?;
        let p = self.model.graph[var].inputs.first().copied().flatten()?;
        let pow = self.producer(p, "Pow")?;
        let (d, two) = self.pair(pow)?;
        if !near(scalar(self.model, two), 2.0) {
            return None;
        }
        let sub = self.producer(d, "Sub")?;
        let (x, m) = self.pair(sub)?;
        let mean = self.producer(m, "ReduceMean")?;
        if self.model.graph[mean].inputs.first().copied().flatten()? != x {
            return None;
        }
        let axes = self.mean_axes(mean)?;
        if self.mean_axes(var)? != axes || axes.is_empty() {
            return None;
        }
        let rank = self.model.values[x].fact.as_ref()?.rank() as i64;
        let mut norm: Vec<i64> = axes
            .iter()
            .map(|&a| if a < 0 { a + rank } else { a })
            .collect();
        norm.sort_unstable();
        let first = *norm.first()?;
        if norm != (first..rank).collect::<Vec<_>>() {
            return None;
        }
        let q = self.out(sqrt)?;
        let div = self.only_user(q)?;
        if self.op(div) != "Div" || self.pair(div)? != (d, q) {
            return None;
        }
        let mut d_users = self.users_of(d).to_vec();
        d_users.sort();
        let mut expect = vec![pow, div];
        expect.sort();
        if d_users != expect
            || self.only_user(m)? != sub
            || self.only_user(p)? != var
            || self.only_user(v)? != add_eps
            || self.only_user(e)? != sqrt
        {
            return None;
        }
        let mut parts = vec![mean, sub, pow, var, add_eps, sqrt];
        let mut last = div;
        let mut inputs = vec![Some(x)];
        // Affine: Mul by a constant scale, then Add a constant bias.
        let affine = |node: NodeIndex, op: &str| -> Option<(NodeIndex, ValueId)> {
            let u = self.only_user(self.out(node)?)?;
            if self.op(u) != op {
                return None;
            }
            let (a, b) = self.pair(u)?;
            let out = self.out(node)?;
            let other = if a == out { b } else { a };
            self.is_const(other).then_some((u, other))
        };
        if let Some((mul, gamma)) = affine(div, "Mul") {
            parts.push(last);
            last = mul;
            inputs.push(Some(gamma));
            if let Some((add, beta)) = affine(mul, "Add") {
                parts.push(last);
                last = add;
                inputs.push(Some(beta));
            }
        }
        let mut axis = AttributeProto::new();
        axis.name = "axis".into();
        axis.type_ = onnx_protobuf::attribute_proto::AttributeType::INT.into();
        axis.i = first;
        Some(Rewrite {
            last,
            op: "LayerNormalization",
            inputs,
            attrs: vec![axis],
            parts,
        })
    }
}

/// Applies every fusion to the typed graph (`opts` for the parameter rule).
pub fn fuse(model: &mut Model, opts: &ImportOptions) {
    let mut users: HashMap<ValueId, Vec<NodeIndex>> = HashMap::new();
    for ix in model.graph.node_indices() {
        let n = &model.graph[ix];
        if n.folded || n.skipped {
            continue;
        }
        for &v in n.inputs.iter().flatten() {
            let u = users.entry(v).or_default();
            if !u.contains(&ix) {
                u.push(ix);
            }
        }
    }
    let view = View {
        model: &*model,
        opts,
        users,
    };
    let mut rewrites: Vec<Rewrite> = vec![];
    let mut taken: HashSet<NodeIndex> = HashSet::new();
    for ix in model.graph.node_indices() {
        if !view.live(ix) {
            continue;
        }
        let r = match view.op(ix) {
            "Erf" => view.gelu_at(ix).map(|(x, last, parts)| Rewrite {
                last,
                op: "Gelu",
                inputs: vec![Some(x)],
                attrs: vec![],
                parts,
            }),
            "Sigmoid" => view.silu_at(ix),
            "HardSigmoid" => view.hardswish_at(ix),
            "Sqrt" => view.layer_norm_at(ix),
            "InstanceNormalization" => view.group_norm_at(ix),
            "Softmax" => view.sdpa_at(ix),
            _ => None,
        };
        if let Some(r) = r {
            if r.parts.iter().chain([&r.last]).all(|p| !taken.contains(p)) {
                taken.extend(r.parts.iter().copied());
                taken.insert(r.last);
                rewrites.push(r);
            }
        }
    }
    for r in rewrites {
        for p in r.parts {
            model.graph[p].skipped = true;
        }
        let node = &mut model.graph[r.last];
        node.op_type = r.op.into();
        node.attrs = r.attrs;
        node.inputs = r.inputs.clone();
        for x in r.inputs.into_iter().flatten() {
            if let Some((p, _)) = model.values[x].producer {
                model.graph.add_edge(p, r.last, x);
            }
        }
    }
}
