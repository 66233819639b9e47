//! Fusions: exporters decompose some PyTorch ops into several ONNX ops whose backward keeps
//! more than PyTorch's single op does. Rewriting them back makes the saved-tensor model match
//! the framework that trains the model.
//!
//! - GELU (erf form), as the legacy exporter writes `torch.nn.functional.gelu`:
//!   `Mul(Mul(x, Add(Erf(Div(x, √2)), 1)), 0.5)`, `Mul(x, Mul(0.5, 1 + erf))` (dynamo),
//!   `Mul(Mul(x, 0.5), 1 + erf)`, operands in either order, `Mul(x, 1/√2)` for the scaling.
//!   Becomes one `Gelu(x)` (PyTorch's gelu saves `x` only).

use crate::model::{Model, ValueId};
use petgraph::graph::NodeIndex;
use std::collections::HashMap;

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

/// Applies every fusion to the typed graph.
pub fn fuse(model: &mut Model) {
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
        users,
    };
    let erfs: Vec<NodeIndex> = model
        .graph
        .node_indices()
        .filter(|&ix| view.live(ix) && view.op(ix) == "Erf")
        .collect();
    let matches: Vec<(ValueId, NodeIndex, Vec<NodeIndex>)> =
        erfs.into_iter().filter_map(|e| view.gelu_at(e)).collect();
    for (x, last, parts) in matches {
        for p in parts {
            model.graph[p].skipped = true;
        }
        let node = &mut model.graph[last];
        node.op_type = "Gelu".into();
        node.attrs.clear();
        node.inputs = vec![Some(x)];
        if let Some((p, _)) = model.values[x].producer {
            model.graph.add_edge(p, last, x);
        }
    }
}
