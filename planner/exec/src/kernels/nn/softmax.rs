//! Softmax, LogSoftmax, Hardmax.

use crate::kernel::{BwdArgs, Extras, Inputs, KResult, Kernel, KernelCtx, KernelRegistry};
use candle_core::Tensor;

// ---------------------------------------------------------------------------------------------
// Softmax, LogSoftmax, Hardmax

/// `x` as `[outer, n, inner]` (or `[outer, n]` when `inner` is 1) for a softmax at the
/// node's axis (opset < 13 flattens the dims from the axis on into one).
fn softmax_view(cx: &KernelCtx, x: &Tensor) -> KResult<Tensor> {
    let rank = x.rank();
    let default = if cx.opset >= 13 { -1 } else { 1 };
    let axis = cx.axis(cx.attrs.int_or("axis", default)?, rank.max(1))?;
    let dims = x.dims();
    let outer: usize = dims[..axis.min(dims.len())].iter().product();
    let (n, inner) = if cx.opset >= 13 {
        (
            dims.get(axis).copied().unwrap_or(1),
            dims[(axis + 1).min(dims.len())..].iter().product(),
        )
    } else {
        (dims[axis.min(dims.len())..].iter().product(), 1)
    };
    let x = x.contiguous()?;
    if inner == 1 {
        // The axis is the last dim: reductions over contiguous rows.
        return Ok(x.reshape((outer, n))?);
    }
    Ok(x.reshape((outer, n, inner))?)
}

fn softmax_fwd(cx: &KernelCtx, xs: &[Option<Tensor>], _: &Extras) -> KResult<Vec<Option<Tensor>>> {
    let x = xs.req(0)?;
    let v = softmax_view(cx, x)?;
    let m = v.max_keepdim(1)?;
    let z = v.broadcast_sub(&m)?;
    let y = if cx.op == "LogSoftmax" {
        let lse = z.exp()?.sum_keepdim(1)?.log()?;
        z.broadcast_sub(&lse)?
    } else {
        let e = z.exp()?;
        e.broadcast_div(&e.sum_keepdim(1)?)?
    };
    Ok(vec![Some(y.reshape(x.dims())?)])
}

fn softmax_bwd(cx: &KernelCtx, a: &BwdArgs) -> KResult<Vec<Option<Tensor>>> {
    let y = a.output(0)?;
    let yv = softmax_view(cx, y)?;
    let g = softmax_view(cx, &a.grad(cx, 0)?)?;
    let dx = if cx.op == "LogSoftmax" {
        (&g - yv.exp()?.broadcast_mul(&g.sum_keepdim(1)?)?)?
    } else {
        let s = (&g * &yv)?.sum_keepdim(1)?;
        (&yv * g.broadcast_sub(&s)?)?
    };
    Ok(vec![Some(dx.reshape(y.dims())?)])
}

fn hardmax_fwd(cx: &KernelCtx, xs: &[Option<Tensor>], _: &Extras) -> KResult<Vec<Option<Tensor>>> {
    let x = xs.req(0)?;
    let v = softmax_view(cx, x)?;
    let n = v.dim(1)?;
    let arg = v.argmax_keepdim(1)?;
    let mut ar_shape = vec![1; v.rank()];
    ar_shape[1] = n;
    let ar = Tensor::arange(0u32, n as u32, x.device())?.reshape(ar_shape)?;
    let y = ar.broadcast_eq(&arg)?.to_dtype(x.dtype())?;
    Ok(vec![Some(y.reshape(x.dims())?)])
}

pub(super) fn register(r: &mut KernelRegistry) {
    r.insert("Softmax", Kernel::new(softmax_fwd, Some(softmax_bwd)));
    r.insert("LogSoftmax", Kernel::new(softmax_fwd, Some(softmax_bwd)));
    r.insert("Hardmax", Kernel::new(hardmax_fwd, None));
}

#[cfg(test)]
mod tests {
    use crate::testing::r;
    use crate::testing::{check, int, Case};
    use remat_planner::ops::Ctx;
    use remat_planner::tensor::DType;

    #[test]
    fn softmax_and_log_softmax() {
        for op in ["Softmax", "LogSoftmax"] {
            check(&Case::new(op, 13, vec![r(&[2, 3, 4])]));
            check(&Case::new(op, 13, vec![r(&[2, 3, 4])]).attr(int("axis", 1)));
            // Opset < 13: flattened at the axis.
            check(&Case::new(op, 11, vec![r(&[2, 3, 4])]));
            check(&Case::new(op, 11, vec![r(&[2, 3, 4])]).attr(int("axis", 2)));
        }
    }

    #[test]
    fn hardmax() {
        use crate::kernel::{Extras, KernelCtx};
        use candle_core::{Device, Tensor};
        use remat_planner::onnx::Attrs;
        use remat_planner::tensor::Fact;
        check(&Case::new("Hardmax", 13, vec![r(&[2, 3, 4])]).attr(int("axis", 1)));
        let dev = Device::Cpu;
        let x = Tensor::new(&[[1.0f64, 3.0, 2.0], [4.0, 0.0, 4.0]], &dev).unwrap();
        let f = Some(Fact::new(DType::F64, vec![2, 3]));
        let inputs = vec![f.clone()];
        let outputs = vec![f];
        let cx = KernelCtx {
            rule: Ctx {
                node: "h",
                op: "Hardmax",
                opset: 13,
                attrs: Attrs {
                    node: "h",
                    op: "Hardmax",
                    list: &[],
                },
                inputs: &inputs,
                n_outputs: outputs.len(),
            },
            outputs: &outputs,
            device: &dev,
            seed: 1,
        };
        let y = super::hardmax_fwd(&cx, &[Some(x)], &Extras::new()).unwrap();
        let v = y[0].as_ref().unwrap().to_vec2::<f64>().unwrap();
        assert_eq!(v, vec![vec![0.0, 1.0, 0.0], vec![1.0, 0.0, 0.0]]);
    }
}
