//! Kernels of the elementwise and reduction families (see `exec::kernel` for the contract).

use crate::exec::kernel::{BwdArgs, Extras, KResult, Kernel, KernelCtx, KernelRegistry};
use candle_core::Tensor;

fn x0(xs: &[Option<Tensor>]) -> KResult<&Tensor> {
    xs.first()
        .and_then(|t| t.as_ref())
        .ok_or_else(|| crate::exec::kernel::KernelError::new("input 0 is required"))
}

fn relu_fwd(_: &KernelCtx, xs: &[Option<Tensor>], _: &Extras) -> KResult<Vec<Option<Tensor>>> {
    Ok(vec![Some(x0(xs)?.relu()?)])
}

fn relu_bwd(cx: &KernelCtx, a: &BwdArgs) -> KResult<Vec<Option<Tensor>>> {
    let y = a.output(0)?;
    let g = a.grad(cx, 0)?;
    let mask = y.gt(0.0)?.to_dtype(g.dtype())?;
    Ok(vec![Some((g * mask)?)])
}

pub fn register(r: &mut KernelRegistry) {
    r.insert(
        "Relu",
        Kernel {
            forward: relu_fwd,
            extra: None,
            backward: Some(relu_bwd),
        },
    );
}

#[cfg(test)]
mod tests {
    use crate::exec::testing::{check, Case, In};

    #[test]
    fn relu() {
        check(&Case::new("Relu", 17, vec![In::Rand(vec![3, 4])]));
    }
}
