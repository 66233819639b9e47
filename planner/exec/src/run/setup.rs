//! The executor's setup: constants folded from parameters (derived weights), computed once.

use crate::kernel::Extras;
use candle_core::Tensor;
use petgraph::graph::NodeIndex;
use remat_planner::model::{ValueId, ValueKind};

use super::{exec_err, Executor, Value};

impl Executor<'_> {
    /// Runs the folded nodes whose outputs are large constants (not kept by the importer) or
    /// derived from parameters, in graph order.
    pub(super) fn fold_constants(&mut self) -> crate::error::Result<()> {
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
    pub(super) fn derived(&self, v: ValueId, depth: usize) -> crate::error::Result<Tensor> {
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
    pub(super) fn run_folded(&self, p: NodeIndex, depth: usize) -> crate::error::Result<Value> {
        let ins = self.folded_inputs(p, depth)?;
        self.with_kernel(p, |k, cx| k.run_forward(cx, &ins, &Extras::new()))
    }

    pub(super) fn folded_inputs(&self, p: NodeIndex, depth: usize) -> crate::error::Result<Value> {
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
}
