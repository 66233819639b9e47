//! Dropout.

use crate::kernel::kbail;
use crate::kernel::{
    BwdArgs, Extras, Inputs, KResult, Kernel, KernelCtx, KernelError, KernelRegistry, Rng,
};
use crate::kernels::common::want;
use candle_core::{DType, Tensor};

// ---------------------------------------------------------------------------------------------
// Dropout

fn dropout_ratio(cx: &KernelCtx) -> KResult<f64> {
    if cx.opset < 12 {
        return Ok(cx.attrs.float_or("ratio", 0.5)? as f64);
    }
    match cx.const_floats(1)? {
        None => Ok(0.5),
        Some(v) => v
            .first()
            .copied()
            .ok_or_else(|| KernelError::new("input 1 (ratio) is empty")),
    }
}

/// Whether the dropout drops: as the gradient rule decides, a positive ratio (the training
/// graph models training, whatever `training_mode` the model was exported with).
fn dropout_active(cx: &KernelCtx) -> KResult<bool> {
    let r = dropout_ratio(cx)?;
    if !(0.0..=1.0).contains(&r) {
        kbail!("ratio {r} must be in [0, 1]");
    }
    Ok(r > 0.0)
}

/// The keep mask (1 = kept) drawn from the node's seed.
fn dropout_mask(cx: &KernelCtx) -> KResult<Tensor> {
    let shape = cx.in_shape(0)?;
    let n: usize = shape.iter().product();
    let ratio = dropout_ratio(cx)?;
    let mut rng = Rng::new(cx.seed);
    let v: Vec<u8> = (0..n)
        .map(|_| u8::from(rng.uniform(0.0, 1.0) >= ratio))
        .collect();
    Ok(Tensor::from_vec(v, shape, cx.device)?)
}

fn dropout_extra(cx: &KernelCtx, tag: &str, _: &[Option<Tensor>]) -> KResult<Vec<Tensor>> {
    if tag != "mask" {
        kbail!("no extra value {tag:?}");
    }
    Ok(vec![dropout_mask(cx)?])
}

/// `t * mask / (1 - ratio)`.
fn apply_mask(t: &Tensor, mask: &Tensor, ratio: f64) -> KResult<Tensor> {
    let scale = if ratio >= 1.0 {
        0.0
    } else {
        1.0 / (1.0 - ratio)
    };
    Ok((t * mask.to_dtype(t.dtype())?)?.affine(scale, 0.0)?)
}

fn dropout_fwd(cx: &KernelCtx, xs: &[Option<Tensor>], ex: &Extras) -> KResult<Vec<Option<Tensor>>> {
    let x = xs.req(0)?;
    let (y, mask) = if dropout_active(cx)? {
        let mask = match ex.get("mask").and_then(|v| v.first()) {
            Some(m) => m.clone(),
            None => dropout_mask(cx)?,
        };
        (apply_mask(x, &mask, dropout_ratio(cx)?)?, mask)
    } else {
        (x.clone(), Tensor::ones(x.dims(), DType::U8, x.device())?)
    };
    let mut outs = vec![Some(y)];
    if cx.outputs.len() > 1 {
        outs.push(if want(cx, 1) { Some(mask) } else { None });
    }
    Ok(outs)
}

fn dropout_bwd(cx: &KernelCtx, a: &BwdArgs) -> KResult<Vec<Option<Tensor>>> {
    let g = a.grad(cx, 0)?;
    let dx = if dropout_active(cx)? {
        let mask = a
            .extra("mask")?
            .first()
            .ok_or_else(|| KernelError::new("the mask extra is empty"))?;
        apply_mask(&g, mask, dropout_ratio(cx)?)?
    } else {
        g
    };
    let mut out = vec![Some(dx)];
    out.resize(a.inputs.len(), None);
    Ok(out)
}

pub(super) fn register(r: &mut KernelRegistry) {
    r.insert(
        "Dropout",
        Kernel::with_extra(dropout_fwd, dropout_extra, Some(dropout_bwd)),
    );
}

#[cfg(test)]
mod tests {
    use crate::testing::r;
    use crate::testing::{check, float, Case, In};
    use remat_planner::ops::Ctx;
    use remat_planner::tensor::DType;

    #[test]
    fn dropout() {
        let ratio = |v: f64| In::Const(DType::F32, vec![], vec![v]);
        check(&Case::new("Dropout", 13, vec![r(&[4, 5]), ratio(0.3)]).outputs(2));
        check(&Case::new("Dropout", 13, vec![r(&[4, 5]), ratio(0.0)]));
        check(&Case::new("Dropout", 13, vec![r(&[3, 3])]));
        check(&Case::new("Dropout", 10, vec![r(&[4, 5])]).attr(float("ratio", 0.25)));
    }

    #[test]
    fn dropout_mask_is_seeded_and_scaled() {
        use crate::kernel::{Extras, KernelCtx};
        use candle_core::{Device, Tensor};
        use remat_planner::onnx::Attrs;
        use remat_planner::tensor::{Data, Fact, Tensor as PTensor};
        let dev = Device::Cpu;
        let ratio = PTensor::new(DType::F32, vec![], Data::F(vec![0.5]));
        let inputs = vec![
            Some(Fact::new(DType::F64, vec![1000])),
            Some(Fact::with_value(ratio)),
        ];
        let outputs = vec![
            Some(Fact::new(DType::F64, vec![1000])),
            Some(Fact::new(DType::Bool, vec![1000])),
        ];
        let run = |seed: u64| {
            let cx = KernelCtx {
                rule: Ctx {
                    node: "d",
                    op: "Dropout",
                    opset: 13,
                    attrs: Attrs {
                        node: "d",
                        op: "Dropout",
                        list: &[],
                    },
                    inputs: &inputs,
                    n_outputs: outputs.len(),
                },
                outputs: &outputs,
                device: &dev,
                seed,
            };
            let x = Tensor::ones(1000, candle_core::DType::F64, &dev).unwrap();
            let y = super::dropout_fwd(&cx, &[Some(x), None], &Extras::new()).unwrap();
            (
                y[0].as_ref().unwrap().to_vec1::<f64>().unwrap(),
                y[1].as_ref().unwrap().to_vec1::<u8>().unwrap(),
            )
        };
        let (y1, m1) = run(3);
        let (y2, m2) = run(3);
        let (_, m3) = run(4);
        assert_eq!(m1, m2);
        assert_eq!(y1, y2);
        assert_ne!(m1, m3);
        let kept = m1.iter().filter(|&&b| b == 1).count();
        assert!(
            (400..600).contains(&kept),
            "{kept} of 1000 kept at ratio 0.5"
        );
        for (y, m) in y1.iter().zip(&m1) {
            assert_eq!(*y, if *m == 1 { 2.0 } else { 0.0 });
        }
    }
}
