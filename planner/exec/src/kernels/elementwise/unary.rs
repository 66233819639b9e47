//! Unary activations and math (one forward and one backward dispatching on the op), Relu's
//! own kernels, and the boolean-valued unary ops.

use super::unary_host::{ClipGrad, GeluGrad, ReluGrad};
use crate::kernel::kbail;
use crate::kernel::{BwdArgs, Extras, Inputs, KResult, Kernel, KernelCtx, KernelRegistry};
use crate::kernels::common::{
    const_scalar, fattr, host_i64, i8_pattern, i8_signed, int_bits, ints_to, mask, need_float,
    scalar_like, scale, shift, sigmoid, softplus, width_mask,
};
use candle_core::{DType, Tensor};
use remat_planner::tensor::DType as PDType;
use std::f64::consts::PI;

// ---------------------------------------------------------------------------------------
// Unary ops.

/// Unary ops whose forward and backward are in `unary_fwd` / `unary_bwd`.
pub(super) const UNARY: &[&str] = &[
    "Relu",
    "LeakyRelu",
    "Sigmoid",
    "Tanh",
    "Erf",
    "Gelu",
    "HardSigmoid",
    "HardSwish",
    "Softplus",
    "Softsign",
    "Elu",
    "Selu",
    "Celu",
    "Mish",
    "Swish",
    "ThresholdedRelu",
    "Sqrt",
    "Exp",
    "Log",
    "Reciprocal",
    "Sin",
    "Cos",
    "Tan",
    "Atan",
    "Asin",
    "Acos",
    "Sinh",
    "Cosh",
    "Asinh",
    "Acosh",
    "Atanh",
    "Shrink",
    "Neg",
    "Abs",
    "Floor",
    "Ceil",
    "Round",
    "Sign",
    "Clip",
];

const SELU_ALPHA: f32 = 1.673_263_2;
const SELU_GAMMA: f32 = 1.050_701;

/// `approximate` of Gelu: `false` for the exact (erf) form, `true` for the tanh form.
fn gelu_tanh(cx: &KernelCtx) -> KResult<bool> {
    match cx.attrs.string("approximate")?.as_deref() {
        None | Some("none") => Ok(false),
        Some("tanh") => Ok(true),
        Some(m) => kbail!("attribute \"approximate\" = {m:?} is not supported"),
    }
}

/// A host loop for the few float functions candle lacks (inverse trigonometry).
fn host_map(x: &Tensor, f: fn(f64) -> f64) -> KResult<Tensor> {
    let v: Vec<f64> = x
        .to_dtype(DType::F64)?
        .flatten_all()?
        .to_vec1::<f64>()?
        .into_iter()
        .map(f)
        .collect();
    Ok(Tensor::from_vec(v, x.dims(), x.device())?.to_dtype(x.dtype())?)
}

/// Banker's rounding (ONNX `Round`: halves to even).
fn round_even(x: &Tensor) -> KResult<Tensor> {
    let r = x.round()?;
    let tie = (&r - x)?.abs()?.eq(0.5)?;
    let even = scale(&scale(x, 0.5)?.round()?, 2.0)?;
    Ok(tie.where_cond(&even, &r)?)
}

/// The bounds of `Clip`: attributes before opset 11, optional inputs 1 and 2 after. A bound
/// is a tensor in `x`'s element type, or `None` when absent.
fn clip_bounds(
    cx: &KernelCtx,
    x: &Tensor,
    xs: &[Option<Tensor>],
) -> KResult<(Option<Tensor>, Option<Tensor>)> {
    if cx.opset < 11 {
        let lo = cx.attrs.float("min")?;
        let hi = cx.attrs.float("max")?;
        let t = |v: Option<f32>| -> KResult<Option<Tensor>> {
            v.map(|v| scalar_like(x, f64::from(v))).transpose()
        };
        return Ok((t(lo)?, t(hi)?));
    }
    let get = |i: usize| -> KResult<Option<Tensor>> {
        match xs.get(i).and_then(|t| t.as_ref()) {
            Some(t) => {
                if t.elem_count() != 1 {
                    kbail!(
                        "input {i} of Clip must hold one value, it has {}",
                        t.elem_count()
                    );
                }
                Ok(Some(t.flatten_all()?.reshape(())?.to_dtype(x.dtype())?))
            }
            None => match cx.inputs.get(i).and_then(|f| f.as_ref()) {
                // Present in the graph but not passed: a constant known at import.
                Some(_) => match const_scalar(cx, i) {
                    Some(v) => Ok(Some(scalar_like(x, v)?)),
                    None => kbail!("the bound in input {i} of Clip is not available"),
                },
                None => Ok(None),
            },
        }
    };
    Ok((get(1)?, get(2)?))
}

fn unary_fwd(cx: &KernelCtx, xs: &[Option<Tensor>], e: &Extras) -> KResult<Vec<Option<Tensor>>> {
    // int8 is held in u8 (its bit pattern): the op runs on the signed values (Clip's bounds
    // too) and the result goes back to its pattern.
    let i8_in = cx.input(0).map(|f| f.dtype == PDType::I8).unwrap_or(false);
    if i8_in {
        let wide: Vec<Option<Tensor>> = xs
            .iter()
            .map(|t| t.as_ref().map(i8_signed).transpose())
            .collect::<KResult<_>>()?;
        let mut y = unary_values(cx, &wide, e)?;
        if let Some(Some(t)) = y.first_mut() {
            if t.dtype() == DType::I64 {
                *t = i8_pattern(t)?;
            }
        }
        return Ok(y);
    }
    unary_values(cx, xs, e)
}

fn unary_values(cx: &KernelCtx, xs: &[Option<Tensor>], _: &Extras) -> KResult<Vec<Option<Tensor>>> {
    let x = xs.req(0)?;
    let float = x.dtype().is_float();
    let y = match cx.op {
        // Ops defined on integers as well.
        "Relu" if !float => x.maximum(&x.zeros_like()?)?,
        "Neg" if !float => (x.zeros_like()? - x)?,
        "Abs" => x.abs()?,
        "Sign" => x.sign()?,
        "Floor" | "Ceil" | "Round" if !float => x.clone(),
        "Clip" => {
            let (lo, hi) = clip_bounds(cx, x, xs)?;
            let mut y = x.clone();
            if let Some(lo) = lo {
                y = y.broadcast_maximum(&lo)?;
            }
            if let Some(hi) = hi {
                y = y.broadcast_minimum(&hi)?;
            }
            y
        }
        "Shrink" if !float => {
            let bias = cx.attrs.float_or("bias", 0.0)?;
            let lambd = cx.attrs.float_or("lambd", 0.5)?;
            let (bias, lambd) = (bias as i64, f64::from(lambd));
            let v: Vec<i64> = host_i64(x)?
                .into_iter()
                .map(|v| {
                    if (v as f64) < -lambd {
                        v.wrapping_add(bias)
                    } else if (v as f64) > lambd {
                        v.wrapping_sub(bias)
                    } else {
                        0
                    }
                })
                .collect();
            ints_to(v, x.dims(), x.dtype(), x)?
        }
        _ => {
            need_float(cx, x)?;
            unary_float(cx, x)?
        }
    };
    Ok(vec![Some(y)])
}

/// The forward of a unary op on a float tensor.
fn unary_float(cx: &KernelCtx, x: &Tensor) -> KResult<Tensor> {
    Ok(match cx.op {
        "Relu" => x.relu()?,
        "LeakyRelu" => {
            let alpha = fattr(cx, "alpha", 0.01)?;
            x.gt(0.0)?.where_cond(x, &scale(x, alpha)?)?
        }
        "Sigmoid" => sigmoid(x)?,
        "Tanh" => x.tanh()?,
        "Erf" => x.erf()?,
        "Gelu" => {
            if gelu_tanh(cx)? {
                x.gelu()?
            } else {
                x.gelu_erf()?
            }
        }
        "HardSigmoid" => {
            let alpha = fattr(cx, "alpha", 0.2)?;
            let beta = fattr(cx, "beta", 0.5)?;
            x.affine(alpha, beta)?.clamp(0.0, 1.0)?
        }
        "HardSwish" => (x * x.affine(1.0 / 6.0, 0.5)?.clamp(0.0, 1.0)?)?,
        "Softplus" => softplus(x)?,
        "Softsign" => (x / shift(&x.abs()?, 1.0)?)?,
        "Elu" | "Selu" | "Celu" => {
            let (alpha, gamma, inner) = match cx.op {
                "Elu" => (fattr(cx, "alpha", 1.0)?, 1.0, 1.0),
                "Selu" => (
                    fattr(cx, "alpha", SELU_ALPHA)?,
                    fattr(cx, "gamma", SELU_GAMMA)?,
                    1.0,
                ),
                _ => {
                    let a = fattr(cx, "alpha", 1.0)?;
                    if a == 0.0 {
                        kbail!("attribute \"alpha\" = 0 is not supported (Celu divides by it)");
                    }
                    (a, 1.0, 1.0 / a)
                }
            };
            // x > 0: x; else α(e^{x·inner} − 1); all times γ.
            let neg = scale(&shift(&scale(x, inner)?.exp()?, -1.0)?, alpha)?;
            scale(&x.gt(0.0)?.where_cond(x, &neg)?, gamma)?
        }
        "Mish" => (x * softplus(x)?.tanh()?)?,
        "Swish" => {
            let alpha = fattr(cx, "alpha", 1.0)?;
            if alpha == 1.0 {
                // SiLU (what the fusion produces): one candle op.
                x.silu()?
            } else {
                (x * sigmoid(&scale(x, alpha)?)?)?
            }
        }
        "ThresholdedRelu" => {
            let alpha = fattr(cx, "alpha", 1.0)?;
            (x * mask(&x.gt(alpha)?, x.dtype())?)?
        }
        "Sqrt" => x.sqrt()?,
        "Exp" => x.exp()?,
        "Log" => x.log()?,
        "Reciprocal" => x.recip()?,
        "Neg" => x.neg()?,
        "Sin" => x.sin()?,
        "Cos" => x.cos()?,
        "Tan" => (x.sin()? / x.cos()?)?,
        "Atan" => host_map(x, f64::atan)?,
        "Asin" => host_map(x, f64::asin)?,
        "Acos" => host_map(x, f64::acos)?,
        "Sinh" => scale(&(x.exp()? - x.neg()?.exp()?)?, 0.5)?,
        "Cosh" => scale(&(x.exp()? + x.neg()?.exp()?)?, 0.5)?,
        // sign(x)·ln(|x| + √(x² + 1)): no cancellation for large negative x.
        "Asinh" => {
            let a = x.abs()?;
            (x.sign()? * (&a + shift(&x.sqr()?, 1.0)?.sqrt()?)?.log()?)?
        }
        "Acosh" => (x + shift(&x.sqr()?, -1.0)?.sqrt()?)?.log()?,
        "Atanh" => scale(&(shift(x, 1.0)? / shift(&x.neg()?, 1.0)?)?.log()?, 0.5)?,
        "Shrink" => {
            let bias = fattr(cx, "bias", 0.0)?;
            let lambd = fattr(cx, "lambd", 0.5)?;
            let lo = mask(&x.lt(-lambd)?, x.dtype())?;
            let hi = mask(&x.gt(lambd)?, x.dtype())?;
            (shift(x, bias)?.mul(&lo)? + shift(x, -bias)?.mul(&hi)?)?
        }
        "Floor" => x.floor()?,
        "Ceil" => x.ceil()?,
        "Round" => round_even(x)?,
        other => kbail!("no unary kernel for {other}"),
    })
}

fn unary_bwd(cx: &KernelCtx, a: &BwdArgs) -> KResult<Vec<Option<Tensor>>> {
    let mut out: Vec<Option<Tensor>> = vec![None; cx.inputs.len().max(1)];
    if !a.need(0) {
        return Ok(out);
    }
    let g = a.grad(cx, 0)?;
    let dt = g.dtype();
    let x = || a.input(0);
    let y = || a.output(0);
    let dx = match cx.op {
        "Relu" => (&g * mask(&y()?.gt(0.0)?, dt)?)?,
        "LeakyRelu" => {
            let alpha = fattr(cx, "alpha", 0.01)?;
            x()?.gt(0.0)?.where_cond(&g, &scale(&g, alpha)?)?
        }
        "Sigmoid" => {
            let y = y()?;
            (&g * (y * shift(&y.neg()?, 1.0)?)?)?
        }
        "Tanh" => (&g * shift(&y()?.sqr()?.neg()?, 1.0)?)?,
        "Erf" => (&g * scale(&x()?.sqr()?.neg()?.exp()?, 2.0 / PI.sqrt())?)?,
        "Gelu" => {
            let x = x()?;
            if g.device().is_cpu() && dt.is_float() && g.dtype() == x.dtype() {
                let op = GeluGrad {
                    tanh: gelu_tanh(cx)?,
                };
                let (g, x) = (g.contiguous()?, x.contiguous()?);
                out[0] = Some(g.apply_op2_no_bwd(&x, &op)?);
                return Ok(out);
            }
            let d = if gelu_tanh(cx)? {
                // u = c(x + 0.044715x³), t = tanh u:
                // ½(1 + t) + ½x(1 − t²)·c(1 + 3·0.044715x²)
                let c = (2.0 / PI).sqrt();
                let x2 = x.sqr()?;
                let u = scale(&(x * shift(&scale(&x2, 0.044715)?, 1.0)?)?, c)?;
                let t = u.tanh()?;
                let left = scale(&shift(&t, 1.0)?, 0.5)?;
                let sech2 = shift(&t.sqr()?.neg()?, 1.0)?;
                let du = scale(&shift(&scale(&x2, 3.0 * 0.044715)?, 1.0)?, c)?;
                (left + scale(&((x * sech2)? * du)?, 0.5)?)?
            } else {
                // Φ(x) + x·φ(x)
                let cdf = scale(&shift(&scale(x, 1.0 / 2f64.sqrt())?.erf()?, 1.0)?, 0.5)?;
                let pdf = scale(&scale(&x.sqr()?, -0.5)?.exp()?, 1.0 / (2.0 * PI).sqrt())?;
                (cdf + (x * pdf)?)?
            };
            (&g * d)?
        }
        "HardSigmoid" => {
            let alpha = fattr(cx, "alpha", 0.2)?;
            let beta = fattr(cx, "beta", 0.5)?;
            let z = x()?.affine(alpha, beta)?;
            let inside = (mask(&z.gt(0.0)?, dt)? * mask(&z.lt(1.0)?, dt)?)?;
            scale(&(&g * inside)?, alpha)?
        }
        "HardSwish" => {
            let x = x()?;
            let mid = shift(&scale(x, 1.0 / 3.0)?, 0.5)?;
            let one = x.ones_like()?;
            let d = x
                .lt(-3.0)?
                .where_cond(&x.zeros_like()?, &x.le(3.0)?.where_cond(&mid, &one)?)?;
            (&g * d)?
        }
        "Softplus" => (&g * sigmoid(x()?)?)?,
        "Softsign" => (&g / shift(&x()?.abs()?, 1.0)?.sqr()?)?,
        "Elu" | "Selu" | "Celu" => {
            let x = x()?;
            let (alpha, gamma, inner) = match cx.op {
                "Elu" => (fattr(cx, "alpha", 1.0)?, 1.0, 1.0),
                "Selu" => (
                    fattr(cx, "alpha", SELU_ALPHA)?,
                    fattr(cx, "gamma", SELU_GAMMA)?,
                    1.0,
                ),
                _ => {
                    let a = fattr(cx, "alpha", 1.0)?;
                    if a == 0.0 {
                        kbail!("attribute \"alpha\" = 0 is not supported (Celu divides by it)");
                    }
                    (a, 1.0, 1.0 / a)
                }
            };
            // x > 0: 1; else α·inner·e^{x·inner}; all times γ.
            let neg = scale(&scale(x, inner)?.exp()?, alpha * inner)?;
            let d = x.gt(0.0)?.where_cond(&x.ones_like()?, &neg)?;
            scale(&(&g * d)?, gamma)?
        }
        "Mish" => {
            let x = x()?;
            let t = softplus(x)?.tanh()?;
            let sech2 = shift(&t.sqr()?.neg()?, 1.0)?;
            (&g * (&t + ((x * sech2)? * sigmoid(x)?)?)?)?
        }
        "Swish" => {
            let alpha = fattr(cx, "alpha", 1.0)?;
            let x = x()?;
            let s = sigmoid(&scale(x, alpha)?)?;
            let ds = (&s * shift(&s.neg()?, 1.0)?)?;
            (&g * (&s + scale(&(x * ds)?, alpha)?)?)?
        }
        "ThresholdedRelu" => {
            let alpha = fattr(cx, "alpha", 1.0)?;
            (&g * mask(&x()?.gt(alpha)?, dt)?)?
        }
        "Sqrt" => (&g / scale(y()?, 2.0)?)?,
        "Exp" => (&g * y()?)?,
        "Log" => (&g / x()?)?,
        "Reciprocal" => (&g * y()?.sqr()?.neg()?)?,
        "Neg" => g.neg()?,
        "Abs" => (&g * x()?.sign()?)?,
        "Sin" => (&g * x()?.cos()?)?,
        "Cos" => (&g * x()?.sin()?.neg()?)?,
        "Tan" => (&g * shift(&y()?.sqr()?, 1.0)?)?,
        "Atan" => (&g / shift(&x()?.sqr()?, 1.0)?)?,
        "Asin" => (&g / shift(&x()?.sqr()?.neg()?, 1.0)?.sqrt()?)?,
        "Acos" => (&g / shift(&x()?.sqr()?.neg()?, 1.0)?.sqrt()?)?.neg()?,
        "Sinh" => {
            let x = x()?;
            (&g * scale(&(x.exp()? + x.neg()?.exp()?)?, 0.5)?)?
        }
        "Cosh" => {
            let x = x()?;
            (&g * scale(&(x.exp()? - x.neg()?.exp()?)?, 0.5)?)?
        }
        "Asinh" => (&g / shift(&x()?.sqr()?, 1.0)?.sqrt()?)?,
        "Acosh" => (&g / shift(&x()?.sqr()?, -1.0)?.sqrt()?)?,
        "Atanh" => (&g / shift(&x()?.sqr()?.neg()?, 1.0)?)?,
        "Shrink" => {
            let lambd = fattr(cx, "lambd", 0.5)?;
            let x = x()?;
            let outside = (mask(&x.lt(-lambd)?, dt)? + mask(&x.gt(lambd)?, dt)?)?;
            (&g * outside)?
        }
        "Floor" | "Ceil" | "Round" | "Sign" => g.zeros_like()?,
        "Clip" => {
            let x = x()?;
            let (lo, hi) = clip_bounds(cx, x, a.inputs)?;
            if g.device().is_cpu() && dt.is_float() && g.dtype() == x.dtype() {
                let bound = |b: &Option<Tensor>, none: f64| -> KResult<f64> {
                    Ok(match b {
                        Some(b) => b.to_dtype(DType::F64)?.to_scalar::<f64>()?,
                        None => none,
                    })
                };
                let op = ClipGrad {
                    lo: bound(&lo, f64::NEG_INFINITY)?,
                    hi: bound(&hi, f64::INFINITY)?,
                };
                let (g, x) = (g.contiguous()?, x.contiguous()?);
                out[0] = Some(g.apply_op2_no_bwd(&x, &op)?);
                return Ok(out);
            }
            let mut m = x.ones_like()?;
            if let Some(lo) = lo {
                m = (m * mask(&x.broadcast_ge(&lo)?, dt)?)?;
            }
            if let Some(hi) = hi {
                m = (m * mask(&x.broadcast_le(&hi)?, dt)?)?;
            }
            (&g * m)?
        }
        other => kbail!("no unary backward for {other}"),
    };
    out[0] = Some(dx);
    Ok(out)
}

// ---------------------------------------------------------------------------------------
// Boolean-valued unary ops (no gradient).

fn predicate_fwd(
    cx: &KernelCtx,
    xs: &[Option<Tensor>],
    _: &Extras,
) -> KResult<Vec<Option<Tensor>>> {
    let x = xs.req(0)?;
    let float = x.dtype().is_float();
    let zeros = || -> KResult<Tensor> { Ok(Tensor::zeros(x.dims(), DType::U8, x.device())?) };
    let y = match cx.op {
        "Not" => x.eq(0.0)?,
        "IsNaN" if float => x.ne(x)?,
        "IsInf" if float => {
            let pos = cx.attrs.int_or("detect_positive", 1)? != 0;
            let neg = cx.attrs.int_or("detect_negative", 1)? != 0;
            let mut y = zeros()?;
            if pos {
                y = y.maximum(&x.eq(f64::INFINITY)?)?;
            }
            if neg {
                y = y.maximum(&x.eq(f64::NEG_INFINITY)?)?;
            }
            y
        }
        "IsNaN" | "IsInf" => zeros()?,
        "BitwiseNot" => {
            let bits = int_bits(cx.input(0)?.dtype)?;
            let m = width_mask(bits);
            let v: Vec<i64> = host_i64(x)?
                .into_iter()
                .map(|v| (!(v as u64) & m) as i64)
                .collect();
            ints_to(v, x.dims(), x.dtype(), x)?
        }
        other => kbail!("no predicate kernel for {other}"),
    };
    Ok(vec![Some(y)])
}

// ---------------------------------------------------------------------------------------

fn relu_fwd(_: &KernelCtx, xs: &[Option<Tensor>], _: &Extras) -> KResult<Vec<Option<Tensor>>> {
    Ok(vec![Some(xs.req(0)?.relu()?)])
}

fn relu_bwd(cx: &KernelCtx, a: &BwdArgs) -> KResult<Vec<Option<Tensor>>> {
    let y = a.output(0)?;
    let g = a.grad(cx, 0)?;
    if g.device().is_cpu() && g.dtype().is_float() && g.dtype() == y.dtype() {
        let (g, y) = (g.contiguous()?, y.contiguous()?);
        return Ok(vec![Some(g.apply_op2_no_bwd(&y, &ReluGrad)?)]);
    }
    let mask = y.gt(0.0)?.to_dtype(g.dtype())?;
    Ok(vec![Some((g * mask)?)])
}

pub(super) fn register(r: &mut KernelRegistry) {
    for &op in UNARY {
        r.insert(op, Kernel::new(unary_fwd, Some(unary_bwd)));
    }
    // The worked example: float Relu; integer Relu goes through the unary kernel.
    r.insert(
        "Relu",
        Kernel::new(
            |cx, xs, e| {
                if xs.req(0)?.dtype().is_float() {
                    relu_fwd(cx, xs, e)
                } else {
                    unary_fwd(cx, xs, e)
                }
            },
            Some(relu_bwd),
        ),
    );
    for op in ["Not", "IsNaN", "IsInf", "BitwiseNot"] {
        r.insert(op, Kernel::new(predicate_fwd, None));
    }
}

#[cfg(test)]
mod tests {
    use crate::kernel::KernelCtx;

    use crate::testing::typed::{close, fwd, fwd1, V};
    use crate::testing::{check, float, int, string, Case, In};
    use crate::testing::{r, rin};
    use candle_core::{DType, Device, Tensor};
    use remat_planner::onnx::Attrs;
    use remat_planner::ops::Ctx;
    use remat_planner::tensor::{DType as OD, Fact};

    #[test]
    fn relu() {
        check(&Case::new("Relu", 17, vec![In::Rand(vec![3, 4])]));
    }

    /// The one-pass CPU backward of Clip equals the generic `g·[lo ≤ x ≤ hi]` over several
    /// threads, bounds included, NaN giving 0, in f32 and f16, and with one bound open.
    #[test]
    fn clip_backward_fast_path() {
        let dev = Device::Cpu;
        let n = 200_003;
        let mut xv: Vec<f32> = (0..n)
            .map(|i| ((i * 37) % 101) as f32 / 10.0 - 2.0)
            .collect();
        xv[7] = f32::NAN;
        let gv: Vec<f32> = (0..n).map(|i| ((i * 13) % 7) as f32 - 3.0).collect();
        for dt in [DType::F32, DType::F16] {
            let x = Tensor::from_vec(xv.clone(), n, &dev)
                .unwrap()
                .to_dtype(dt)
                .unwrap();
            let g = Tensor::from_vec(gv.clone(), n, &dev)
                .unwrap()
                .to_dtype(dt)
                .unwrap();
            for (lo, hi) in [(0.0, 6.0), (-0.4, 0.3), (f64::NEG_INFINITY, 1.0)] {
                let m = (x.ge(lo).unwrap().to_dtype(dt).unwrap()
                    * x.le(hi).unwrap().to_dtype(dt).unwrap())
                .unwrap();
                let want = (&g * m).unwrap();
                let got = g.apply_op2_no_bwd(&x, &super::ClipGrad { lo, hi }).unwrap();
                let f = |t: &Tensor| t.to_dtype(DType::F32).unwrap().to_vec1::<f32>().unwrap();
                assert_eq!(f(&got), f(&want), "{dt:?} [{lo}, {hi}]");
            }
        }
        // The bounds' values themselves pass the gradient.
        let x = Tensor::new(&[0.0f32, 6.0, -1e-7, 6.000001], &dev).unwrap();
        let g = Tensor::new(&[1.0f32, 2.0, 3.0, 4.0], &dev).unwrap();
        let got = g
            .apply_op2_no_bwd(&x, &super::ClipGrad { lo: 0.0, hi: 6.0 })
            .unwrap();
        assert_eq!(got.to_vec1::<f32>().unwrap(), vec![1.0, 2.0, 0.0, 0.0]);
    }

    /// The one-pass CPU backward of GELU (both forms), over several threads, is as close to
    /// the derivative computed in f64 as the tensor-op path in the same dtype is (f64, f32,
    /// f16).
    #[test]
    fn gelu_backward_fast_path() {
        use std::f64::consts::PI;
        let dev = Device::Cpu;
        let n = 150_001;
        let xv: Vec<f64> = (0..n).map(|i| (i as f64 / n as f64) * 16.0 - 8.0).collect();
        let gv: Vec<f64> = (0..n).map(|i| ((i * 13) % 7) as f64 - 3.0).collect();
        let x = Tensor::from_vec(xv, n, &dev).unwrap();
        let g = Tensor::from_vec(gv, n, &dev).unwrap();
        // The generic path's formulas (`unary_bwd`), in the tensors' own dtype.
        let derivative = |x: &Tensor, tanh: bool| -> Tensor {
            if tanh {
                let c = (2.0 / PI).sqrt();
                let x2 = x.sqr().unwrap();
                let t = ((x * (x2.affine(0.044715, 1.0).unwrap())).unwrap() * c)
                    .unwrap()
                    .tanh()
                    .unwrap();
                let left = t.affine(0.5, 0.5).unwrap();
                let sech2 = t.sqr().unwrap().affine(-1.0, 1.0).unwrap();
                let du = x2.affine(3.0 * 0.044715 * c, c).unwrap();
                (left
                    + ((x * sech2).unwrap() * du)
                        .unwrap()
                        .affine(0.5, 0.0)
                        .unwrap())
                .unwrap()
            } else {
                let cdf = (x / 2f64.sqrt())
                    .unwrap()
                    .erf()
                    .unwrap()
                    .affine(0.5, 0.5)
                    .unwrap();
                let pdf = (x.sqr().unwrap() * -0.5)
                    .unwrap()
                    .exp()
                    .unwrap()
                    .affine(1.0 / (2.0 * PI).sqrt(), 0.0)
                    .unwrap();
                (cdf + (x * pdf).unwrap()).unwrap()
            }
        };
        let f64s = |t: Tensor| t.to_dtype(DType::F64).unwrap().to_vec1::<f64>().unwrap();
        let err = |got: &[f64], want: &[f64]| {
            got.iter()
                .zip(want)
                .map(|(a, b)| (a - b).abs() / b.abs().max(1.0))
                .fold(0.0, f64::max)
        };
        for tanh in [false, true] {
            let want = f64s((&g * derivative(&x, tanh)).unwrap());
            for dt in [DType::F64, DType::F32, DType::F16] {
                let (gt, xt) = (g.to_dtype(dt).unwrap(), x.to_dtype(dt).unwrap());
                let fast = f64s(gt.apply_op2_no_bwd(&xt, &super::GeluGrad { tanh }).unwrap());
                let generic = f64s((&gt * derivative(&xt, tanh)).unwrap());
                let (ef, eg) = (err(&fast, &want), err(&generic, &want));
                assert!(
                    ef <= 2.0 * eg + 1e-12,
                    "tanh {tanh} {dt:?}: one pass {ef}, tensor ops {eg}"
                );
            }
        }
    }

    /// The one-pass CPU backward of Relu, over several threads and on strided gradients,
    /// equals `g·[y > 0]`.
    #[test]
    fn relu_backward_fast_path() {
        let dev = Device::Cpu;
        let n = 300_007;
        let x: Vec<f32> = (0..n).map(|i| ((i * 37) % 101) as f32 - 50.0).collect();
        let gv: Vec<f32> = (0..n).map(|i| ((i * 13) % 7) as f32 - 3.0).collect();
        let y = Tensor::from_vec(x, n, &dev).unwrap().relu().unwrap();
        let g = Tensor::from_vec(gv, n, &dev).unwrap();
        let want = (&g * y.gt(0.0).unwrap().to_dtype(DType::F32).unwrap()).unwrap();
        let got = g.apply_op2_no_bwd(&y, &super::ReluGrad).unwrap();
        assert_eq!(
            got.to_vec1::<f32>().unwrap(),
            want.to_vec1::<f32>().unwrap()
        );
        // Equal element counts in different shapes are refused.
        let a = Tensor::zeros((2, 3), DType::F32, &dev).unwrap();
        let b = Tensor::zeros((3, 2), DType::F32, &dev).unwrap();
        let err = a
            .apply_op2_no_bwd(&b, &super::ReluGrad)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("relu-grad: shapes [2, 3] and [3, 2] differ"),
            "{err}"
        );
        // Through the kernel, with a transposed (non-contiguous) gradient.
        let y2 = y
            .narrow(0, 0, 300_000)
            .unwrap()
            .reshape((600, 500))
            .unwrap();
        let g2 = g
            .narrow(0, 0, 300_000)
            .unwrap()
            .reshape((500, 600))
            .unwrap()
            .t()
            .unwrap();
        let facts = vec![Some(Fact::new(OD::F32, vec![600, 500]))];
        let cx = KernelCtx {
            rule: Ctx {
                node: "n",
                op: "Relu",
                opset: 14,
                attrs: Attrs {
                    node: "n",
                    op: "Relu",
                    list: &[],
                },
                inputs: &facts,
                n_outputs: facts.len(),
            },
            outputs: &facts,
            device: &dev,
            seed: 0,
        };
        let d = super::relu_bwd(
            &cx,
            &crate::kernel::BwdArgs {
                inputs: &[None],
                outputs: &[Some(y2.clone())],
                extras: &Default::default(),
                grads: &[Some(g2.clone())],
                needs: &[true],
            },
        )
        .unwrap();
        let want = (&g2 * y2.gt(0.0).unwrap().to_dtype(DType::F32).unwrap()).unwrap();
        let got = d[0].as_ref().unwrap();
        assert_eq!(got.dims(), &[600, 500]);
        assert_eq!(
            got.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
            want.flatten_all().unwrap().to_vec1::<f32>().unwrap()
        );
    }

    #[test]
    fn activations() {
        for op in [
            "Relu",
            "LeakyRelu",
            "Sigmoid",
            "Tanh",
            "Erf",
            "Gelu",
            "Softplus",
            "Softsign",
            "Elu",
            "Selu",
            "Celu",
            "Mish",
            "Swish",
            "ThresholdedRelu",
            "Shrink",
            "Neg",
            "Abs",
            "Sin",
            "Cos",
            "Tan",
            "Atan",
            "Sinh",
            "Cosh",
            "Asinh",
            "Exp",
            "Floor",
            "Ceil",
            "Round",
            "Sign",
        ] {
            check(&Case::new(op, 17, vec![In::Rand(vec![2, 3, 4])]));
        }
        // Wider ranges to cross the kinks; positive or bounded domains.
        check(&Case::new("HardSigmoid", 17, vec![rin(&[5, 8], -4.0, 4.0)]));
        check(&Case::new("HardSwish", 17, vec![rin(&[5, 8], -5.0, 5.0)]));
        check(&Case::new("Asinh", 17, vec![rin(&[3, 4], -30.0, 30.0)]));
        check(&Case::new("Softplus", 17, vec![rin(&[3, 4], -30.0, 30.0)]));
        for op in ["Sqrt", "Log", "Reciprocal"] {
            check(&Case::new(op, 17, vec![rin(&[3, 4], 0.5, 2.0)]));
        }
        check(&Case::new("Acosh", 17, vec![rin(&[3, 4], 1.5, 3.0)]));
        for op in ["Asin", "Acos", "Atanh"] {
            check(&Case::new(op, 17, vec![rin(&[3, 4], -0.8, 0.8)]));
        }
    }

    #[test]
    fn activation_attributes() {
        let c = |op: &'static str| Case::new(op, 22, vec![rin(&[4, 6], -3.0, 3.0)]);
        check(&c("LeakyRelu").attr(float("alpha", 0.1)));
        check(&c("Elu").attr(float("alpha", 0.5)));
        check(
            &c("Selu")
                .attr(float("alpha", 1.5))
                .attr(float("gamma", 2.0)),
        );
        check(&c("Celu").attr(float("alpha", 2.0)));
        check(&c("ThresholdedRelu").attr(float("alpha", 0.2)));
        check(
            &c("HardSigmoid")
                .attr(float("alpha", 0.3))
                .attr(float("beta", 0.4)),
        );
        check(
            &c("Shrink")
                .attr(float("bias", 0.1))
                .attr(float("lambd", 0.3)),
        );
        check(&c("Swish").attr(float("alpha", 1.7)));
        check(&c("Gelu").attr(string("approximate", "none")));
        check(&c("Gelu").attr(string("approximate", "tanh")));
    }

    #[test]
    fn activation_values() {
        let x = vec![-2.0, -0.5, 0.0, 0.5, 2.0];
        let t = || V::T(OD::F64, vec![5], x.clone());
        let map = |f: fn(f64) -> f64| x.iter().map(|&v| f(v)).collect::<Vec<f64>>();
        close(&fwd1("Relu", 17, &[], vec![t()]), &map(|v| v.max(0.0)));
        close(
            &fwd1("Sigmoid", 17, &[], vec![t()]),
            &map(|v| 1.0 / (1.0 + (-v).exp())),
        );
        close(
            &fwd1("Softplus", 17, &[], vec![t()]),
            &map(|v| v.exp().ln_1p()),
        );
        close(
            &fwd1("Softsign", 17, &[], vec![t()]),
            &map(|v| v / (1.0 + v.abs())),
        );
        close(
            &fwd1("HardSwish", 17, &[], vec![t()]),
            &map(|v| v * (v / 6.0 + 0.5).clamp(0.0, 1.0)),
        );
        close(
            &fwd1("Swish", 24, &[], vec![t()]),
            &map(|v| v / (1.0 + (-v).exp())),
        );
        close(
            &fwd1("Mish", 18, &[], vec![t()]),
            &map(|v| v * v.exp().ln_1p().tanh()),
        );
        // ONNX's defaults are the f32 values of SELU's constants.
        let (sa, sg) = (f64::from(1.673_263_2f32), f64::from(1.050_701f32));
        assert_eq!(sa, 1.673_263_192_176_818_8);
        assert_eq!(sg, 1.050_701_022_148_132_3);
        close(
            &fwd1("Selu", 6, &[], vec![t()]),
            &x.iter()
                .map(|&v| sg * if v > 0.0 { v } else { sa * (v.exp() - 1.0) })
                .collect::<Vec<f64>>(),
        );
        close(
            &fwd1("Elu", 6, &[float("alpha", 0.5)], vec![t()]),
            &map(|v| if v > 0.0 { v } else { 0.5 * (v.exp() - 1.0) }),
        );
        close(
            &fwd1("Celu", 12, &[float("alpha", 2.0)], vec![t()]),
            &map(|v| v.max(0.0) + (2.0 * ((v / 2.0).exp() - 1.0)).min(0.0)),
        );
        close(
            &fwd1("Gelu", 20, &[], vec![t()]),
            &[
                -0.04550026389635842,
                -0.15426876936299344,
                0.0,
                0.34573123063700656,
                1.9544997361036416,
            ],
        );
        close(
            &fwd1("Gelu", 20, &[string("approximate", "tanh")], vec![t()]),
            &map(|v| {
                let c = (2.0 / std::f64::consts::PI).sqrt();
                0.5 * v * (1.0 + (c * (v + 0.044715 * v * v * v)).tanh())
            }),
        );
        close(
            &fwd1(
                "Shrink",
                9,
                &[float("lambd", 1.0), float("bias", 0.5)],
                vec![t()],
            ),
            &[-1.5, 0.0, 0.0, 0.0, 1.5],
        );
        close(
            &fwd1("ThresholdedRelu", 10, &[float("alpha", 0.5)], vec![t()]),
            &[0.0, 0.0, 0.0, 0.0, 2.0],
        );
        let err = fwd("Gelu", 20, &[string("approximate", "cube")], vec![t()]);
        assert!(matches!(err, Err(e) if e.0.contains("\"approximate\"")));
    }
    #[test]
    fn rounding_values() {
        let x = vec![-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 2.4, -2.6];
        let t = || V::T(OD::F64, vec![8], x.clone());
        close(
            &fwd1("Round", 11, &[], vec![t()]),
            &[-2.0, -2.0, -0.0, 0.0, 2.0, 2.0, 2.0, -3.0],
        );
        close(
            &fwd1("Floor", 13, &[], vec![t()]),
            &[-3.0, -2.0, -1.0, 0.0, 1.0, 2.0, 2.0, -3.0],
        );
        close(
            &fwd1("Ceil", 13, &[], vec![t()]),
            &[-2.0, -1.0, -0.0, 1.0, 2.0, 3.0, 3.0, -2.0],
        );
        close(
            &fwd1("Sign", 13, &[], vec![t()]),
            &[-1.0, -1.0, -1.0, 1.0, 1.0, 1.0, 1.0, -1.0],
        );
        // Integer inputs.
        let i = || V::T(OD::I64, vec![3], vec![-3.0, 0.0, 4.0]);
        close(&fwd1("Neg", 13, &[], vec![i()]), &[3.0, 0.0, -4.0]);
        close(&fwd1("Abs", 13, &[], vec![i()]), &[3.0, 0.0, 4.0]);
        close(&fwd1("Relu", 14, &[], vec![i()]), &[0.0, 0.0, 4.0]);
        close(&fwd1("Sign", 13, &[], vec![i()]), &[-1.0, 0.0, 1.0]);
        let i32s = V::T(OD::I32, vec![3], vec![-3.0, 0.0, 4.0]);
        close(&fwd1("Neg", 13, &[], vec![i32s]), &[3.0, 0.0, -4.0]);
        // Float-only ops refuse integers with an error, not a panic.
        let e = fwd("Exp", 13, &[], vec![i()]);
        assert!(matches!(e, Err(e) if e.0.contains("floating point")));
    }

    #[test]
    fn clip() {
        // Bounds as attributes (opset 6).
        let c = Case::new("Clip", 6, vec![r(&[3, 5])])
            .attr(float("min", -0.4))
            .attr(float("max", 0.3));
        check(&c);
        check(&Case::new("Clip", 6, vec![r(&[3, 5])]).attr(float("max", 0.3)));
        // Bounds as constant inputs (opset 13), either omitted.
        let b = |v: f64| In::Const(OD::F32, vec![], vec![v]);
        check(&Case::new("Clip", 13, vec![r(&[3, 5]), b(-0.4), b(0.3)]));
        check(&Case::new("Clip", 13, vec![r(&[3, 5]), In::None, b(0.3)]));
        check(&Case::new("Clip", 13, vec![r(&[3, 5]), b(-0.2), In::None]));
        check(&Case::new("Clip", 13, vec![r(&[3, 5])]));
        // Bounds computed at run time: the gradient rule saves them.
        let f = |v: f64| In::Floats(vec![], vec![v]);
        check(&Case::new("Clip", 13, vec![r(&[3, 5]), f(-0.4), f(0.3)]));
        // Bounds as run-time values.
        let x = vec![-2.0, -0.5, 0.0, 0.5, 2.0];
        let y = fwd1(
            "Clip",
            13,
            &[],
            vec![
                V::T(OD::F32, vec![5], x.clone()),
                V::T(OD::F32, vec![], vec![-1.0]),
                V::T(OD::F32, vec![1], vec![0.25]),
            ],
        );
        close(&y, &[-1.0, -0.5, 0.0, 0.25, 0.25]);
        let y = fwd1(
            "Clip",
            13,
            &[],
            vec![
                V::T(OD::I64, vec![5], x),
                V::C(OD::I64, vec![], vec![-1.0]),
                V::None,
            ],
        );
        close(&y, &[-1.0, -0.0, 0.0, 0.0, 2.0]);
        let y = fwd1(
            "Clip",
            6,
            &[float("min", 0.0), float("max", 6.0)],
            vec![V::T(OD::F32, vec![3], vec![-1.0, 3.0, 7.0])],
        );
        close(&y, &[0.0, 3.0, 6.0]);
    }
    #[test]
    fn nan_and_inf() {
        let x = || {
            V::T(
                OD::F32,
                vec![4],
                vec![f64::NAN, f64::INFINITY, f64::NEG_INFINITY, 1.0],
            )
        };
        close(&fwd1("IsNaN", 13, &[], vec![x()]), &[1.0, 0.0, 0.0, 0.0]);
        close(&fwd1("IsInf", 10, &[], vec![x()]), &[0.0, 1.0, 1.0, 0.0]);
        close(
            &fwd1("IsInf", 10, &[int("detect_negative", 0)], vec![x()]),
            &[0.0, 1.0, 0.0, 0.0],
        );
        close(
            &fwd1("IsInf", 10, &[int("detect_positive", 0)], vec![x()]),
            &[0.0, 0.0, 1.0, 0.0],
        );
        check(&Case::new("IsNaN", 13, vec![r(&[2, 2])]));
        check(&Case::new("IsInf", 10, vec![r(&[2, 2])]));
    }
}
