//! One step of a schedule: a node's inputs from resident values and views, its kernel, the
//! gradient flow of a backward node, parameter gradients.

use crate::kernel::{BwdArgs, Extras, KResult, KernelError};
use candle_core::Tensor;
use petgraph::graph::NodeIndex;
use remat_planner::model::{ValueId, ValueKind};
use remat_planner::ops::{Saved, INPUT_COPY_TAGS};
use remat_planner::training::Source;

use super::storage::own_grad;
use super::{exec_err, Executor, State, Value};

impl Executor<'_> {
    /// The values of a node's inputs as the step sees them.
    pub(super) fn inputs_of(
        &self,
        st: &State,
        node: &remat_planner::model::OpNode,
        step: usize,
    ) -> crate::error::Result<Value> {
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
    pub(super) fn backward_kernel(
        &self,
        ix: NodeIndex,
        inputs: &[Option<Tensor>],
        outputs: &[Option<Tensor>],
        extras: &Extras,
        grads: &[Option<Tensor>],
        needs: &[bool],
    ) -> crate::error::Result<Value> {
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
    pub(super) fn value(
        &self,
        st: &State,
        v: ValueId,
        step: usize,
    ) -> crate::error::Result<Tensor> {
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

    pub(super) fn resident<'s>(
        &self,
        st: &'s State,
        h: usize,
        step: usize,
        what: &str,
    ) -> crate::error::Result<&'s Value> {
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
    pub(super) fn grad_of(
        &self,
        st: &State,
        v: ValueId,
        step: usize,
        depth: usize,
    ) -> crate::error::Result<Option<Tensor>> {
        if depth > self.model.graph.node_count() + 1 {
            return Err(exec_err(
                "",
                "",
                format!("step {step}: gradient flow loops through views"),
            ));
        }
        let mut acc: Option<Tensor> = None;
        let add = |acc: &mut Option<Tensor>, g: Tensor| -> crate::error::Result<()> {
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
            let dt = crate::kernel::to_candle(f.dtype).map_err(|e| exec_err("", "", e.0))?;
            let weights = self
                .loss_weights(v, &shape)
                .map_err(|e| exec_err("loss", "SumOfMeans", e.0))?;
            let g = match weights {
                Some(w) => w.affine(1.0 / n, 0.0),
                None => Tensor::full(1.0 / n, shape, &self.device),
            }
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

    pub(super) fn compute(
        &self,
        st: &mut State,
        i: usize,
        step: usize,
    ) -> crate::error::Result<Value> {
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
                    let weights = self
                        .loss_weights(v, t.dims())
                        .map_err(|e| exec_err("loss", "SumOfMeans", e.0))?;
                    let m = t
                        .to_dtype(candle_core::DType::F32)
                        .and_then(|t| match &weights {
                            Some(w) => t * w,
                            None => Ok(t),
                        })
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

    pub(super) fn extras(
        &self,
        st: &State,
        ix: NodeIndex,
        step: usize,
    ) -> crate::error::Result<Extras> {
        let mut e = Extras::new();
        if let Some(list) = self.extras_of.get(&ix) {
            for (tag, h) in list {
                let v = self.resident(st, *h, step, &format!("extra {tag}"))?;
                e.insert(tag.to_string(), v.iter().flatten().cloned().collect());
            }
        }
        Ok(e)
    }

    pub(super) fn backward(
        &self,
        st: &mut State,
        i: usize,
        ix: NodeIndex,
        step: usize,
    ) -> crate::error::Result<Value> {
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
        // A saved copy stands for its input.
        for (k, tag) in INPUT_COPY_TAGS.iter().enumerate() {
            if let (Some(c), Some(slot)) =
                (extras.get(*tag).and_then(|v| v.first()), ins.get_mut(k))
            {
                *slot = Some(c.clone());
            }
        }
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
    pub(super) fn add_param_grad(&self, st: &mut State, v: ValueId, g: Tensor) -> KResult<()> {
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

    /// The extra values (batch statistics, ...) the backward of folded node `ix` keeps, computed
    /// from its inputs: a folded node has no training node whose forward would have made them
    /// (a layer norm of a parameter alone, weight normalization's norm).
    fn folded_extras(
        &self,
        ix: NodeIndex,
        ins: &[Option<Tensor>],
        needs: &[bool],
    ) -> crate::error::Result<Extras> {
        let model = self.model;
        let rule = remat_planner::model::with_ctx(model, ix, |spec, cx| {
            (spec.grad)(cx, &model.output_facts(ix), needs)
        });
        let mut extras = Extras::new();
        for saved in rule.map(|r| r.saved).unwrap_or_default() {
            if let Saved::Extra { tag, .. } = saved {
                let out = self.with_kernel(ix, |k, cx| k.run_extra(cx, tag, ins))?;
                extras.insert(tag.to_string(), out);
            }
        }
        Ok(extras)
    }

    /// Pushes a gradient contribution `g` of the derived constant `v` (a transposed or tied
    /// weight) back through the folded node that computes it, to the parameters it comes
    /// from, as it arrives: the backward is linear in `g`, so contributions need no summing
    /// first, and summing them until the end of the run would hold a gradient-sized buffer
    /// per derived constant that the memory model does not count (MiniLM's transposed
    /// weights: docs/bench/executor.md, "Figures behind the code").
    pub(super) fn push_derived(
        &self,
        st: &mut State,
        v: ValueId,
        g: Tensor,
        depth: usize,
    ) -> crate::error::Result<()> {
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
        let extras = self.folded_extras(ix, &ins, &needs)?;
        let r = self.backward_kernel(ix, &ins, &outs, &extras, &grads, &needs)?;
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
}
