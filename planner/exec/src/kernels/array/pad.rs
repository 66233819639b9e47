//! Pad.

use crate::kernel::kbail;
use crate::kernel::{
    BwdArgs, Extras, Inputs, KResult, Kernel, KernelCtx, KernelError, KernelRegistry, Outs,
};
use crate::kernels::common::{full, grad0, host_f64, ints_in, select, unselect};
use candle_core::Tensor;

#[derive(Clone, Copy, PartialEq, Debug)]
enum PadMode {
    Constant,
    Reflect,
    Edge,
    Wrap,
}

struct PadPlan {
    mode: PadMode,
    /// Per padded axis: (axis, before, after); negative values crop.
    axes: Vec<(usize, i64, i64)>,
}

fn pad_plan(cx: &KernelCtx, xs: &[Option<Tensor>]) -> KResult<PadPlan> {
    let rank = cx.input(0)?.rank();
    let mode = match cx.attrs.string("mode")?.as_deref().unwrap_or("constant") {
        "constant" => PadMode::Constant,
        "reflect" => PadMode::Reflect,
        "edge" => PadMode::Edge,
        "wrap" => PadMode::Wrap,
        m => kbail!("attribute \"mode\" = {m:?} is not supported"),
    };
    let pads = if cx.opset < 11 {
        cx.attrs.ints("pads")?.map(|p| p.to_vec())
    } else {
        ints_in(cx, xs, 1)?
    }
    .ok_or_else(|| KernelError::new("pads are required"))?;
    let axes: Vec<usize> = match if cx.opset >= 18 {
        ints_in(cx, xs, 3)?
    } else {
        None
    } {
        Some(a) => cx.rule.axes(&a, rank)?,
        None => (0..rank).collect(),
    };
    if pads.len() != 2 * axes.len() {
        kbail!("pads {pads:?} do not match {} axes", axes.len());
    }
    let n = axes.len();
    let axes = axes
        .iter()
        .enumerate()
        .filter_map(|(k, &a)| {
            let (b, e) = (pads.get(k).copied()?, pads.get(k + n).copied()?);
            (b != 0 || e != 0).then_some((a, b, e))
        })
        .collect();
    Ok(PadPlan { mode, axes })
}

fn pad_value(cx: &KernelCtx, xs: &[Option<Tensor>]) -> KResult<f64> {
    if cx.opset < 11 {
        return Ok(f64::from(cx.attrs.float_or("value", 0.0)?));
    }
    match xs.get(2).and_then(|t| t.as_ref()) {
        Some(t) if t.elem_count() > 0 => Ok(host_f64(t)?.first().copied().unwrap_or(0.0)),
        _ => Ok(0.0),
    }
}

/// Source index of output position `p` (relative to the original start) along an axis of
/// size `d`, for the non-constant modes.
fn pad_source(mode: PadMode, p: i64, d: i64) -> i64 {
    match mode {
        PadMode::Edge | PadMode::Constant => p.clamp(0, d - 1),
        PadMode::Wrap => p.rem_euclid(d),
        PadMode::Reflect => {
            if d == 1 {
                0
            } else {
                let m = p.rem_euclid(2 * (d - 1));
                if m < d {
                    m
                } else {
                    2 * (d - 1) - m
                }
            }
        }
    }
}

fn pad_indices(mode: PadMode, b: i64, e: i64, d: usize) -> KResult<Vec<i64>> {
    let d = d as i64;
    if d == 0 {
        kbail!("cannot pad an empty axis in mode {mode:?}");
    }
    Ok((-b..d + e).map(|p| pad_source(mode, p, d)).collect())
}

fn pad_fwd(cx: &KernelCtx, xs: &[Option<Tensor>], _: &Extras) -> Outs {
    let plan = pad_plan(cx, xs)?;
    let value = pad_value(cx, xs)?;
    let mut x = xs.req(0)?.clone();
    for &(a, b, e) in &plan.axes {
        let d = x.dims().get(a).copied().unwrap_or(0);
        if plan.mode == PadMode::Constant {
            let lo = (-b).max(0) as usize;
            let hi = (-e).max(0) as usize;
            if lo + hi > d {
                kbail!("pads ({b}, {e}) crop more than axis {a} of size {d}");
            }
            if lo + hi > 0 {
                x = x.narrow(a, lo, d - lo - hi)?;
            }
            let mut parts = vec![];
            let block = |n: usize| -> KResult<Tensor> {
                let mut s = x.dims().to_vec();
                if let Some(v) = s.get_mut(a) {
                    *v = n;
                }
                full(value, &s, x.dtype(), x.device())
            };
            if b > 0 {
                parts.push(block(b as usize)?);
            }
            parts.push(x.clone());
            if e > 0 {
                parts.push(block(e as usize)?);
            }
            if parts.len() > 1 {
                x = Tensor::cat(&parts, a)?;
            }
        } else {
            x = select(&x, &pad_indices(plan.mode, b, e, d)?, a)?;
        }
    }
    Ok(vec![Some(x.contiguous()?)])
}

fn pad_bwd(cx: &KernelCtx, a: &BwdArgs) -> Outs {
    grad0(cx, a, || {
        let plan = pad_plan(cx, a.inputs)?;
        let shape = cx.in_shape(0)?;
        let mut g = a.grad(cx, 0)?;
        for &(ax, b, e) in plan.axes.iter().rev() {
            let d = shape.get(ax).copied().unwrap_or(0);
            if plan.mode == PadMode::Constant {
                let lo = (-b).max(0) as usize;
                let hi = (-e).max(0) as usize;
                let kept = d.saturating_sub(lo + hi);
                g = g.narrow(ax, b.max(0) as usize, kept)?;
                if lo + hi > 0 {
                    g = g.pad_with_zeros(ax, lo, hi)?;
                }
            } else {
                g = unselect(&g, &pad_indices(plan.mode, b, e, d)?, ax, d)?;
            }
        }
        Ok(g)
    })
}

pub(super) fn register(r: &mut KernelRegistry) {
    r.insert("Pad", Kernel::new(pad_fwd, Some(pad_bwd)));
}

#[cfg(test)]
mod tests {
    use crate::testing::fixed::c64;
    use crate::testing::{check, float, ints, string, Case, In};
    use remat_planner::tensor::DType;

    #[test]
    fn pad() {
        let x = || In::Rand(vec![2, 3, 4]);
        let value = || In::Const(DType::F32, vec![], vec![0.5]);
        check(&Case::new(
            "Pad",
            13,
            vec![x(), c64(&[0, 1, 2, 1, 0, 3]), value()],
        ));
        check(&Case::new("Pad", 13, vec![x(), c64(&[0, -1, 2, 1, 1, -3])]));
        for mode in ["reflect", "edge"] {
            check(
                &Case::new("Pad", 13, vec![x(), c64(&[1, 2, 3, 0, 2, 3])])
                    .attr(string("mode", mode)),
            );
        }
        check(
            &Case::new("Pad", 19, vec![x(), c64(&[0, 2, 5, 0, 1, 1])]).attr(string("mode", "wrap")),
        );
        check(
            &Case::new("Pad", 2, vec![x()])
                .attr(ints("pads", &[1, 0, 0, 0, 2, 1]))
                .attr(float("value", -1.0)),
        );
        check(
            &Case::new(
                "Pad",
                18,
                vec![x(), c64(&[1, 2, 0, 1]), In::None, c64(&[-1, 1])],
            )
            .attr(string("mode", "reflect")),
        );
        check(&Case::new(
            "Pad",
            13,
            vec![In::Ints(DType::I64, vec![2], vec![4, 5]), c64(&[1, 1])],
        ));
    }
}
