//! The kernel registry: forward, extra and backward kernels per op type, in the same
//! families as the shape rules of `remat_planner::ops`.

use super::kernel::KernelRegistry;
use std::sync::OnceLock;

#[macro_use]
mod host;
pub(crate) use host::pool;
mod array;
mod attention;
mod common;
mod elementwise;
mod linalg;
mod nn;
mod quant;
mod random;
mod reduce;
#[cfg(test)]
mod reference;
mod rnn;
mod signal;
mod spatial;
mod window;

/// Every op with kernels.
pub fn registry() -> &'static KernelRegistry {
    static REG: OnceLock<KernelRegistry> = OnceLock::new();
    REG.get_or_init(|| {
        let mut r = KernelRegistry::new();
        elementwise::register(&mut r);
        reduce::register(&mut r);
        nn::register(&mut r);
        array::register(&mut r);
        rnn::register(&mut r);
        attention::register(&mut r);
        signal::register(&mut r);
        spatial::register(&mut r);
        random::register(&mut r);
        quant::register(&mut r);
        linalg::register(&mut r);
        r
    })
}

#[cfg(test)]
mod tests {
    use super::registry;
    use remat_planner::onnx::Attrs;
    use remat_planner::ops::{registry as ops, Ctx};
    use remat_planner::tensor::Fact;

    /// Every op the importer supports has a forward kernel, and a backward kernel exactly
    /// when one of its inputs is differentiable; no kernel is registered for an op without a
    /// shape rule.
    #[test]
    fn every_op_of_the_registry_has_its_kernels() {
        let facts: Vec<Option<Fact>> = vec![];
        let mut problems = vec![];
        for (op, spec) in ops() {
            let Some(k) = registry().get(op) else {
                problems.push(format!("{op}: no kernel"));
                continue;
            };
            let cx = Ctx {
                node: "n",
                op,
                opset: 18,
                attrs: Attrs {
                    node: "n",
                    op,
                    list: &[],
                },
                inputs: &facts,
                n_outputs: 1,
            };
            let differentiable = (0..8).any(|i| (spec.diff_in)(&cx, i));
            if k.backward.is_some() != differentiable {
                problems.push(format!(
                    "{op}: backward kernel present = {}, differentiable = {differentiable}",
                    k.backward.is_some()
                ));
            }
        }
        for op in registry().keys() {
            if !ops().contains_key(op) {
                problems.push(format!("{op}: a kernel but no shape rule"));
            }
        }
        assert!(problems.is_empty(), "{}", problems.join("\n"));
        assert!(ops().len() >= 165, "{} ops", ops().len());
    }
}
