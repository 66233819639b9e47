//! Kernels of the elementwise family (see `exec::kernel` for the contract): unary activations
//! and math, broadcasting binary and variadic arithmetic, comparisons, logic and bitwise ops,
//! `Where`. One forward and one backward function per group of ops, dispatching on `cx.op`.
//!
//! Float ops run on candle ops (CPU and CUDA). Integer arithmetic that can fail (division and
//! remainder by zero, integer powers) and the bitwise ops, which candle lacks, run as host
//! loops over the values.

use crate::exec::kernel::{
    BwdArgs, Extras, KResult, Kernel, KernelCtx, KernelError, KernelRegistry,
};
use crate::kbail;
use crate::tensor::DType as ODType;
use candle_core::{DType, Tensor};
use std::f64::consts::PI;

// ---------------------------------------------------------------------------------------
// Shared helpers (also used by the reduction kernels).

/// Input `i` of a forward, or an error naming it.
pub(crate) fn input(xs: &[Option<Tensor>], i: usize) -> KResult<&Tensor> {
    xs.get(i)
        .and_then(|t| t.as_ref())
        .ok_or_else(|| KernelError::new(format!("input {i} is required but missing")))
}

/// Errors unless `x` holds floating-point values.
pub(crate) fn need_float(cx: &KernelCtx, x: &Tensor) -> KResult<()> {
    if !x.dtype().is_float() {
        kbail!(
            "{} is not supported on element type {:?} (floating point only)",
            cx.op,
            x.dtype()
        );
    }
    Ok(())
}

/// `k · x` for a float tensor.
pub(crate) fn scale(x: &Tensor, k: f64) -> KResult<Tensor> {
    Ok(x.affine(k, 0.0)?)
}

/// `x + k` for a float tensor.
fn shift(x: &Tensor, k: f64) -> KResult<Tensor> {
    Ok(x.affine(1.0, k)?)
}

/// A 0/1 mask (a comparison result) in the element type `dt`.
pub(crate) fn mask(m: &Tensor, dt: DType) -> KResult<Tensor> {
    Ok(m.to_dtype(dt)?)
}

/// A scalar (rank 0) tensor of `v` in `x`'s element type and device.
pub(crate) fn scalar_like(x: &Tensor, v: f64) -> KResult<Tensor> {
    Ok(Tensor::new(v, x.device())?.to_dtype(x.dtype())?)
}

/// Sums a gradient of a broadcast result back to the shape of the operand that was
/// broadcast (ONNX multidirectional broadcasting: leading axes and axes of size 1).
pub(crate) fn unbroadcast(g: &Tensor, shape: &[usize]) -> KResult<Tensor> {
    let dims = g.dims();
    if dims == shape {
        return Ok(g.clone());
    }
    if shape.len() > dims.len() {
        kbail!("gradient of shape {dims:?} cannot be reduced to shape {shape:?}");
    }
    let lead = dims.len() - shape.len();
    let mut axes: Vec<usize> = (0..lead).collect();
    for (i, &d) in shape.iter().enumerate() {
        let gd = dims[lead + i];
        if d == 1 && gd != 1 {
            axes.push(lead + i);
        } else if d != gd {
            kbail!("gradient of shape {dims:?} cannot be reduced to shape {shape:?}");
        }
    }
    let s = if axes.is_empty() {
        g.clone()
    } else if matches!(g.dtype(), DType::F16 | DType::BF16) {
        // Half-precision sums accumulate in f32.
        g.to_dtype(DType::F32)?
            .sum_keepdim(axes)?
            .to_dtype(g.dtype())?
    } else {
        g.sum_keepdim(axes)?
    };
    Ok(s.reshape(shape)?)
}

/// `1 / (1 + e^-x)`.
pub(crate) fn sigmoid(x: &Tensor) -> KResult<Tensor> {
    Ok(shift(&x.neg()?.exp()?, 1.0)?.recip()?)
}

/// `ln(1 + e^x)`, computed as `max(x, 0) + ln(1 + e^-|x|)` so that it never overflows.
fn softplus(x: &Tensor) -> KResult<Tensor> {
    let t = shift(&x.abs()?.neg()?.exp()?, 1.0)?.log()?;
    Ok((x.relu()? + t)?)
}

/// Where `c` (a 0/1 mask) holds, `a`, else `b`; all three broadcast to `shape`.
fn select(c: &Tensor, a: &Tensor, b: &Tensor, shape: &[usize]) -> KResult<Tensor> {
    Ok(c.broadcast_as(shape)?
        .where_cond(&a.broadcast_as(shape)?, &b.broadcast_as(shape)?)?)
}

/// The values of a tensor as `i64`s (row-major).
fn ints_of(t: &Tensor) -> KResult<Vec<i64>> {
    Ok(t.to_dtype(DType::I64)?.flatten_all()?.to_vec1::<i64>()?)
}

/// Integer values back into a tensor of `dtype` and `shape` on `like`'s device.
fn ints_to(v: Vec<i64>, shape: &[usize], dtype: DType, like: &Tensor) -> KResult<Tensor> {
    Ok(Tensor::from_vec(v, shape, like.device())?.to_dtype(dtype)?)
}

/// Output shape `0` of the node.
fn out_shape(cx: &KernelCtx) -> KResult<Vec<usize>> {
    cx.out_shape(0)
}

/// A float attribute with its default.
fn fattr(cx: &KernelCtx, name: &str, default: f32) -> KResult<f64> {
    Ok(f64::from(cx.attrs.float_or(name, default)?))
}

/// The value of a constant scalar input (a one-element tensor known at import), if any.
fn const_scalar(cx: &KernelCtx, i: usize) -> Option<f64> {
    let f = cx.inputs.get(i)?.as_ref()?;
    let v = f.value.as_ref()?.as_f64();
    match v.as_slice() {
        [x] => Some(*x),
        _ => None,
    }
}

/// The number of bits of an ONNX integer type (the candle type may be wider).
fn int_bits(d: ODType) -> KResult<u32> {
    Ok(match d {
        ODType::Bool | ODType::U8 | ODType::I8 => 8,
        ODType::U16 | ODType::I16 => 16,
        ODType::U32 | ODType::I32 => 32,
        ODType::U64 | ODType::I64 => 64,
        other => kbail!("element type {other:?} is not an integer type"),
    })
}

fn width_mask(bits: u32) -> u64 {
    if bits >= 64 {
        u64::MAX
    } else {
        (1u64 << bits) - 1
    }
}

// ---------------------------------------------------------------------------------------
// Unary ops.

/// Unary ops whose forward and backward are in `unary_fwd` / `unary_bwd`.
const UNARY: &[&str] = &[
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

fn unary_fwd(cx: &KernelCtx, xs: &[Option<Tensor>], _: &Extras) -> KResult<Vec<Option<Tensor>>> {
    let x = input(xs, 0)?;
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
            let v: Vec<i64> = ints_of(x)?
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
    let x = input(xs, 0)?;
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
            let v: Vec<i64> = ints_of(x)?
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
// Binary and variadic ops.

/// The present inputs of a node (every one required).
fn all_inputs<'t>(cx: &KernelCtx, xs: &'t [Option<Tensor>]) -> KResult<Vec<&'t Tensor>> {
    let v: Vec<&Tensor> = xs.iter().flatten().collect();
    if v.is_empty() || v.len() != xs.len() {
        kbail!(
            "{} expects all of its inputs, got {} of {}",
            cx.op,
            v.len(),
            xs.len()
        );
    }
    Ok(v)
}

/// A host loop over two broadcast integer tensors.
fn int_binary(
    a: &Tensor,
    b: &Tensor,
    shape: &[usize],
    out: DType,
    f: impl Fn(i64, i64) -> KResult<i64>,
) -> KResult<Tensor> {
    let av = ints_of(&a.broadcast_as(shape)?)?;
    let bv = ints_of(&b.broadcast_as(shape)?)?;
    let v = av
        .into_iter()
        .zip(bv)
        .map(|(x, y)| f(x, y))
        .collect::<KResult<Vec<i64>>>()?;
    ints_to(v, shape, out, a)
}

/// `x^e` elementwise for float tensors of one type: `|x|^e` with the sign of `x` for odd
/// integer exponents, NaN for a negative base with a fractional exponent, `1` for `e = 0`.
fn pow_tensor(x: &Tensor, e: &Tensor, shape: &[usize]) -> KResult<Tensor> {
    let x = x.broadcast_as(shape)?;
    let e = e.broadcast_as(shape)?;
    let mag = (&e * x.abs()?.log()?)?.exp()?;
    let half = scale(&scale(&e, 0.5)?.floor()?, 2.0)?;
    let odd = e.ne(&half)?;
    let signed = odd.where_cond(&mag.neg()?, &mag)?;
    let integral = e.eq(&e.floor()?)?;
    let nan = Tensor::full(f64::NAN, shape, x.device())?.to_dtype(x.dtype())?;
    let negative = integral.where_cond(&signed, &nan)?;
    let y = x.lt(0.0)?.where_cond(&negative, &mag)?;
    Ok(e.eq(0.0)?.where_cond(&x.ones_like()?, &y)?)
}

/// `x^e` with a scalar exponent.
fn pow_scalar(x: &Tensor, e: f64) -> KResult<Tensor> {
    Ok(if e == 0.0 {
        x.ones_like()?
    } else if e == 1.0 {
        x.clone()
    } else if e == 2.0 {
        x.sqr()?
    } else if e == 0.5 {
        x.sqrt()?
    } else if e == -1.0 {
        x.recip()?
    } else {
        x.powf(e)?
    })
}

fn pow_fwd(cx: &KernelCtx, x: &Tensor, e: &Tensor, shape: &[usize]) -> KResult<Tensor> {
    if !x.dtype().is_float() {
        // Integer base: exact integer powers, truncated float powers for float exponents.
        let ev: Vec<f64> = e
            .broadcast_as(shape)?
            .to_dtype(DType::F64)?
            .flatten_all()?
            .to_vec1::<f64>()?;
        let xv = ints_of(&x.broadcast_as(shape)?)?;
        let v = xv
            .into_iter()
            .zip(ev)
            .map(|(b, p)| {
                if p.fract() == 0.0 && p >= 0.0 && p <= f64::from(u32::MAX) {
                    b.checked_pow(p as u32).ok_or_else(|| {
                        KernelError::new(format!("{b}^{p} overflows the integer type of Pow"))
                    })
                } else {
                    Ok((b as f64).powf(p) as i64)
                }
            })
            .collect::<KResult<Vec<i64>>>()?;
        return ints_to(v, shape, x.dtype(), x);
    }
    let y = match const_scalar(cx, 1) {
        Some(p) => pow_scalar(x, p)?.broadcast_as(shape)?.contiguous()?,
        None => pow_tensor(x, &e.to_dtype(x.dtype())?, shape)?,
    };
    Ok(y)
}

fn binary_fwd(cx: &KernelCtx, xs: &[Option<Tensor>], _: &Extras) -> KResult<Vec<Option<Tensor>>> {
    let a = input(xs, 0)?;
    let b = input(xs, 1)?;
    let shape = out_shape(cx)?;
    let float = a.dtype().is_float();
    if !matches!(cx.op, "Pow" | "BitShift") && a.dtype() != b.dtype() {
        kbail!(
            "{} needs inputs of one element type, got {:?} and {:?}",
            cx.op,
            a.dtype(),
            b.dtype()
        );
    }
    let y = match cx.op {
        "Add" => a.broadcast_add(b)?,
        "Sub" => a.broadcast_sub(b)?,
        "Mul" => a.broadcast_mul(b)?,
        "Div" if float => a.broadcast_div(b)?,
        "Div" => int_binary(a, b, &shape, a.dtype(), |x, y| {
            x.checked_div(y)
                .ok_or_else(|| KernelError::new(format!("integer division {x} / {y} is undefined")))
        })?,
        "Pow" => pow_fwd(cx, a, b, &shape)?,
        "Mod" => {
            let fmod = cx.attrs.int_or("fmod", 0)? != 0;
            if float {
                let q = a.broadcast_div(b)?;
                let t = if fmod {
                    // truncation toward zero
                    q.lt(0.0)?.where_cond(&q.ceil()?, &q.floor()?)?
                } else {
                    q.floor()?
                };
                a.broadcast_sub(&b.broadcast_mul(&t)?)?
            } else {
                int_binary(a, b, &shape, a.dtype(), |x, y| {
                    let r = x.checked_rem(y).ok_or_else(|| {
                        KernelError::new(format!("integer remainder {x} % {y} is undefined"))
                    })?;
                    Ok(if !fmod && r != 0 && ((r < 0) != (y < 0)) {
                        r + y
                    } else {
                        r
                    })
                })?
            }
        }
        "PRelu" => {
            let neg = a.broadcast_mul(b)?;
            select(&a.lt(0.0)?, &neg, a, &shape)?
        }
        "Equal" => a.broadcast_eq(b)?,
        "Less" => a.broadcast_lt(b)?,
        "LessOrEqual" => a.broadcast_le(b)?,
        "Greater" => a.broadcast_gt(b)?,
        "GreaterOrEqual" => a.broadcast_ge(b)?,
        "And" => a.ne(0.0)?.broadcast_mul(&b.ne(0.0)?)?,
        "Or" => a.ne(0.0)?.broadcast_maximum(&b.ne(0.0)?)?,
        "Xor" => a.ne(0.0)?.broadcast_ne(&b.ne(0.0)?)?,
        "BitwiseAnd" => int_binary(a, b, &shape, a.dtype(), |x, y| Ok(x & y))?,
        "BitwiseOr" => int_binary(a, b, &shape, a.dtype(), |x, y| Ok(x | y))?,
        "BitwiseXor" => int_binary(a, b, &shape, a.dtype(), |x, y| Ok(x ^ y))?,
        "BitShift" => {
            let left = match cx.attrs.string("direction")?.as_deref() {
                Some("LEFT") => true,
                Some("RIGHT") => false,
                other => kbail!("attribute \"direction\" = {other:?} is not supported"),
            };
            let bits = int_bits(cx.input(0)?.dtype)?;
            let m = width_mask(bits);
            int_binary(a, b, &shape, a.dtype(), |x, s| {
                let (x, s) = (x as u64 & m, s as u64 & m);
                let r = if s >= u64::from(bits) {
                    0
                } else if left {
                    (x << s) & m
                } else {
                    x >> s
                };
                Ok(r as i64)
            })?
        }
        other => kbail!("no binary kernel for {other}"),
    };
    Ok(vec![Some(y)])
}

fn binary_bwd(cx: &KernelCtx, a: &BwdArgs) -> KResult<Vec<Option<Tensor>>> {
    let n = cx.inputs.len();
    let mut out: Vec<Option<Tensor>> = vec![None; n];
    let g = a.grad(cx, 0)?;
    let sa = cx.in_shape(0)?;
    let sb = cx.in_shape(1)?;
    let shape = g.dims().to_vec();
    match cx.op {
        "Add" | "Sub" => {
            if a.need(0) {
                out[0] = Some(unbroadcast(&g, &sa)?);
            }
            if a.need(1) {
                let gb = unbroadcast(&g, &sb)?;
                out[1] = Some(if cx.op == "Sub" { gb.neg()? } else { gb });
            }
        }
        "Mul" => {
            if a.need(0) {
                out[0] = Some(unbroadcast(&g.broadcast_mul(a.input(1)?)?, &sa)?);
            }
            if a.need(1) {
                out[1] = Some(unbroadcast(&g.broadcast_mul(a.input(0)?)?, &sb)?);
            }
        }
        "Div" => {
            let b = a.input(1)?;
            if a.need(0) {
                out[0] = Some(unbroadcast(&g.broadcast_div(b)?, &sa)?);
            }
            if a.need(1) {
                // −g·A/B²
                let t = g.broadcast_mul(a.input(0)?)?.broadcast_div(&b.sqr()?)?;
                out[1] = Some(unbroadcast(&t.neg()?, &sb)?);
            }
        }
        "Pow" => {
            let x = a.input(0)?;
            if a.need(0) {
                let d = match const_scalar(cx, 1) {
                    Some(0.0) => x.zeros_like()?,
                    Some(p) => scale(&pow_scalar(x, p - 1.0)?, p)?,
                    None => {
                        let e = a.input(1)?.to_dtype(x.dtype())?;
                        pow_tensor(x, &shift(&e, -1.0)?, &shape)?.broadcast_mul(&e)?
                    }
                };
                out[0] = Some(unbroadcast(&g.broadcast_mul(&d)?, &sa)?);
            }
            if a.need(1) {
                // g·Y·ln X, zero where X = 0 (PyTorch's convention).
                let y = a.output(0)?;
                let xb = x.broadcast_as(shape.as_slice())?;
                let t = (&g * y)?.mul(&xb.log()?)?;
                let t = xb.eq(0.0)?.where_cond(&t.zeros_like()?, &t)?;
                out[1] = Some(unbroadcast(&t, &sb)?);
            }
        }
        "Mod" => {
            if a.need(0) {
                out[0] = Some(unbroadcast(&g, &sa)?);
            }
        }
        "PRelu" => {
            let x = a.input(0)?;
            let slope = a.input(1)?;
            let neg = x.lt(0.0)?;
            if a.need(0) {
                let gs = g.broadcast_mul(slope)?;
                out[0] = Some(unbroadcast(&select(&neg, &gs, &g, &shape)?, &sa)?);
            }
            if a.need(1) {
                let gx = g.broadcast_mul(x)?;
                let t = select(&neg, &gx, &g.zeros_like()?, &shape)?;
                out[1] = Some(unbroadcast(&t, &sb)?);
            }
        }
        other => kbail!("no binary backward for {other}"),
    }
    Ok(out)
}

fn variadic_fwd(cx: &KernelCtx, xs: &[Option<Tensor>], _: &Extras) -> KResult<Vec<Option<Tensor>>> {
    let v = all_inputs(cx, xs)?;
    let shape = out_shape(cx)?;
    let mut y = v[0].broadcast_as(shape.as_slice())?.contiguous()?;
    for t in &v[1..] {
        if t.dtype() != y.dtype() {
            kbail!(
                "{} needs inputs of one element type, got {:?} and {:?}",
                cx.op,
                y.dtype(),
                t.dtype()
            );
        }
        y = match cx.op {
            "Sum" | "Mean" => y.broadcast_add(t)?,
            "Max" => y.broadcast_maximum(t)?,
            "Min" => y.broadcast_minimum(t)?,
            other => kbail!("no variadic kernel for {other}"),
        };
    }
    if cx.op == "Mean" {
        let n = v.len() as f64;
        y = if y.dtype().is_float() {
            scale(&y, 1.0 / n)?
        } else {
            y.broadcast_div(&scalar_like(&y, n)?)?
        };
    }
    Ok(vec![Some(y)])
}

fn variadic_bwd(cx: &KernelCtx, a: &BwdArgs) -> KResult<Vec<Option<Tensor>>> {
    let n = cx.inputs.len();
    let mut out: Vec<Option<Tensor>> = vec![None; n];
    let g = a.grad(cx, 0)?;
    let dt = g.dtype();
    match cx.op {
        "Sum" | "Mean" => {
            let g = if cx.op == "Mean" {
                scale(&g, 1.0 / n as f64)?
            } else {
                g
            };
            for (i, o) in out.iter_mut().enumerate() {
                if a.need(i) {
                    *o = Some(unbroadcast(&g, &cx.in_shape(i)?)?);
                }
            }
        }
        "Max" | "Min" => {
            // The gradient goes to the inputs equal to the result, shared evenly on ties.
            let xs: Vec<Tensor> = (0..n)
                .map(|i| a.input(i).cloned())
                .collect::<KResult<_>>()?;
            let Some((first, rest)) = xs.split_first() else {
                kbail!("{} has no inputs", cx.op);
            };
            let shape = g.dims().to_vec();
            let mut y = first.broadcast_as(shape.as_slice())?.contiguous()?;
            for x in rest {
                y = if cx.op == "Max" {
                    y.broadcast_maximum(x)?
                } else {
                    y.broadcast_minimum(x)?
                };
            }
            let hits: Vec<Tensor> = xs
                .iter()
                .map(|x| mask(&x.broadcast_eq(&y)?, dt))
                .collect::<KResult<_>>()?;
            let mut count = g.zeros_like()?;
            for h in &hits {
                count = (count + h)?;
            }
            let share = (&g / count)?;
            for (i, (o, h)) in out.iter_mut().zip(&hits).enumerate() {
                if a.need(i) {
                    *o = Some(unbroadcast(&(&share * h)?, &cx.in_shape(i)?)?);
                }
            }
        }
        other => kbail!("no variadic backward for {other}"),
    }
    Ok(out)
}

// ---------------------------------------------------------------------------------------
// Where.

fn where_fwd(cx: &KernelCtx, xs: &[Option<Tensor>], _: &Extras) -> KResult<Vec<Option<Tensor>>> {
    let c = input(xs, 0)?;
    let x = input(xs, 1)?;
    let y = input(xs, 2)?;
    if x.dtype() != y.dtype() {
        kbail!(
            "Where needs X and Y of one element type, got {:?} and {:?}",
            x.dtype(),
            y.dtype()
        );
    }
    let c = if c.dtype().is_float() {
        c.ne(0.0)?
    } else {
        c.clone()
    };
    Ok(vec![Some(select(&c, x, y, &out_shape(cx)?)?)])
}

fn where_bwd(cx: &KernelCtx, a: &BwdArgs) -> KResult<Vec<Option<Tensor>>> {
    let mut out: Vec<Option<Tensor>> = vec![None; 3];
    let g = a.grad(cx, 0)?;
    let c = a.input(0)?;
    let c = if c.dtype().is_float() {
        c.ne(0.0)?
    } else {
        c.clone()
    };
    let shape = g.dims().to_vec();
    let z = g.zeros_like()?;
    if a.need(1) {
        out[1] = Some(unbroadcast(&select(&c, &g, &z, &shape)?, &cx.in_shape(1)?)?);
    }
    if a.need(2) {
        out[2] = Some(unbroadcast(&select(&c, &z, &g, &shape)?, &cx.in_shape(2)?)?);
    }
    Ok(out)
}

// ---------------------------------------------------------------------------------------

fn relu_fwd(_: &KernelCtx, xs: &[Option<Tensor>], _: &Extras) -> KResult<Vec<Option<Tensor>>> {
    Ok(vec![Some(input(xs, 0)?.relu()?)])
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

/// `g` where `y > 0`, else 0: the Relu backward in one pass on the CPU, split over candle's
/// threads (the comparison, cast and product of the generic path take three passes; Relu's
/// backward is the most frequent one in a CNN).
struct ReluGrad;

impl super::host::Host2 for ReluGrad {
    const WHAT: &'static str = "relu-grad";
    const HALF: bool = true;
    const SAME_SHAPE: bool = true;

    fn run<T: candle_core::WithDType>(
        &self,
        g: &[T],
        y: &[T],
        shape: &candle_core::Shape,
    ) -> candle_core::Result<(Vec<T>, candle_core::Shape)> {
        if g.len() != y.len() {
            candle_core::bail!("relu-grad: {} and {} elements differ", g.len(), y.len());
        }
        Ok((mask_positive(g, y), shape.clone()))
    }
}

custom_op2!(ReluGrad, "relu-grad", host2);

/// `g[i]` where `y[i] > 0`, else zero, in chunks of 64K elements on all threads.
fn mask_positive<T: candle_core::WithDType>(g: &[T], y: &[T]) -> Vec<T> {
    const CHUNK: usize = 1 << 16;
    let zero = T::from_f64(0.0);
    super::host::par_build(g.len(), CHUNK, zero, |u, o| {
        let at = u * CHUNK;
        for ((o, &g), &y) in o.iter_mut().zip(&g[at..]).zip(&y[at..]) {
            *o = if y > zero { g } else { zero };
        }
    })
}

/// `g[i]` where `lo ≤ x[i] ≤ hi`, else zero, in chunks of 64K elements on all threads. (Its
/// own loop: one shared with [`mask_positive`] through a predicate closure made Relu's
/// backward 3.5× slower in the resnet18 bench, 0.023–0.029 s against 0.085 s a step.)
fn mask_within<T: candle_core::WithDType>(g: &[T], x: &[T], lo: T, hi: T) -> Vec<T> {
    const CHUNK: usize = 1 << 16;
    let zero = T::from_f64(0.0);
    super::host::par_build(g.len(), CHUNK, zero, |u, o| {
        let at = u * CHUNK;
        for ((o, &g), &x) in o.iter_mut().zip(&g[at..]).zip(&x[at..]) {
            *o = if lo <= x && x <= hi { g } else { zero };
        }
    })
}

/// `g` where `lo ≤ x ≤ hi`, else 0 (NaN: 0): Clip's backward in one pass on the CPU. The
/// generic path (two comparisons, two casts, three products) held three temporaries of the
/// input's size at once: the heap's peak of mobilenet_v2's training step (its ReLU6s).
struct ClipGrad {
    lo: f64,
    hi: f64,
}

impl super::host::Host2 for ClipGrad {
    const WHAT: &'static str = "clip-grad";
    const HALF: bool = true;
    const SAME_SHAPE: bool = true;

    fn run<T: candle_core::WithDType>(
        &self,
        g: &[T],
        x: &[T],
        shape: &candle_core::Shape,
    ) -> candle_core::Result<(Vec<T>, candle_core::Shape)> {
        // `SAME_SHAPE`: `host2` has checked that the operands' shapes, so their lengths, agree.
        let (lo, hi) = (T::from_f64(self.lo), T::from_f64(self.hi));
        Ok((mask_within(g, x, lo, hi), shape.clone()))
    }
}

custom_op2!(ClipGrad, "clip-grad", host2);

/// `g · GELU'(x)` in one pass on the CPU, in f32 (f64 for f64 inputs): `Φ(x) + x·φ(x)`, or
/// with `tanh`, `½(1 + t) + ½x(1 − t²)·c(1 + 3·0.044715x²)` where `t = tanh(c(x + 0.044715x³))`.
/// The generic path's dozen tensor ops held several temporaries of the input's size at once
/// (wav2vec_features: the heap's peak).
struct GeluGrad {
    tanh: bool,
}

macro_rules! gelu_derivative {
    ($name:ident, $t:ty, $erf:path, $pi:expr) => {
        fn $name(x: $t, tanh: bool) -> $t {
            if tanh {
                let c = (2.0 / $pi).sqrt();
                let x2 = x * x;
                let t = (c * x * (1.0 + 0.044715 * x2)).tanh();
                0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * c * (1.0 + 3.0 * 0.044715 * x2)
            } else {
                let cdf = 0.5 * (1.0 + $erf(x * std::f64::consts::FRAC_1_SQRT_2 as $t));
                let pdf = (-0.5 * x * x).exp() / (2.0 * $pi).sqrt();
                cdf + x * pdf
            }
        }
    };
}
gelu_derivative!(
    gelu_d32,
    f32,
    candle_core::cpu::erf::erf_f32,
    std::f32::consts::PI
);
gelu_derivative!(
    gelu_d64,
    f64,
    candle_core::cpu::erf::erf_f64,
    std::f64::consts::PI
);

impl super::host::Host2 for GeluGrad {
    const WHAT: &'static str = "gelu-grad";
    const HALF: bool = true;
    const SAME_SHAPE: bool = true;

    fn run<T: candle_core::WithDType>(
        &self,
        g: &[T],
        x: &[T],
        shape: &candle_core::Shape,
    ) -> candle_core::Result<(Vec<T>, candle_core::Shape)> {
        // `SAME_SHAPE`: `host2` has checked that the operands' shapes, so their lengths, agree.
        const CHUNK: usize = 1 << 16;
        let (tanh, wide) = (self.tanh, T::DTYPE == DType::F64);
        let out = super::host::par_build(g.len(), CHUNK, T::from_f64(0.0), |u, o| {
            let at = u * CHUNK;
            for ((o, &g), &x) in o.iter_mut().zip(&g[at..]).zip(&x[at..]) {
                *o = if wide {
                    T::from_f64(g.to_f64() * gelu_d64(x.to_f64(), tanh))
                } else {
                    T::from_f64(f64::from(
                        g.to_f64() as f32 * gelu_d32(x.to_f64() as f32, tanh),
                    ))
                };
            }
        });
        Ok((out, shape.clone()))
    }
}

custom_op2!(GeluGrad, "gelu-grad", host2);

pub fn register(r: &mut KernelRegistry) {
    let k = Kernel::new;
    for &op in UNARY {
        r.insert(op, k(unary_fwd, Some(unary_bwd)));
    }
    // The worked example: float Relu; integer Relu goes through the unary kernel.
    r.insert(
        "Relu",
        k(
            |cx, xs, e| {
                if input(xs, 0)?.dtype().is_float() {
                    relu_fwd(cx, xs, e)
                } else {
                    unary_fwd(cx, xs, e)
                }
            },
            Some(relu_bwd),
        ),
    );
    for op in ["Not", "IsNaN", "IsInf", "BitwiseNot"] {
        r.insert(op, k(predicate_fwd, None));
    }
    for op in ["Add", "Sub", "Mul", "Div", "Pow", "Mod", "PRelu"] {
        r.insert(op, k(binary_fwd, Some(binary_bwd)));
    }
    for op in [
        "Equal",
        "Less",
        "LessOrEqual",
        "Greater",
        "GreaterOrEqual",
        "And",
        "Or",
        "Xor",
        "BitwiseAnd",
        "BitwiseOr",
        "BitwiseXor",
        "BitShift",
    ] {
        r.insert(op, k(binary_fwd, None));
    }
    for op in ["Sum", "Mean", "Max", "Min"] {
        r.insert(op, k(variadic_fwd, Some(variadic_bwd)));
    }
    r.insert("Where", k(where_fwd, Some(where_bwd)));
}

#[cfg(test)]
pub(crate) mod tests {
    use crate::exec::kernel::{KResult, KernelCtx, KernelError};
    use crate::exec::kernels::registry;
    use crate::exec::testing::{check, float, int, string, Case, Harness, In};
    use crate::onnx::Attrs;
    use crate::ops::Ctx;
    use crate::tensor::{DType as OD, Data, Fact, Tensor as PTensor};
    use candle_core::{DType, Device, Tensor};
    use onnx_protobuf::AttributeProto;

    /// One input of a value test: a run-time tensor, or a constant known at import.
    pub(crate) enum V {
        T(OD, Vec<usize>, Vec<f64>),
        C(OD, Vec<usize>, Vec<f64>),
        None,
    }

    /// Runs an op's forward (shapes from its shape rule) on concrete values and returns its
    /// outputs as `f64`s with their shapes.
    type Flat = (Vec<usize>, Vec<f64>);

    /// Runs an op's forward (shapes from its shape rule) on concrete values and returns its
    /// outputs as `f64`s with their shapes.
    pub(crate) fn fwd(
        op: &'static str,
        opset: i64,
        attrs: &[AttributeProto],
        inputs: Vec<V>,
    ) -> KResult<Vec<Flat>> {
        Ok(run(op, opset, attrs, inputs, false)?.0)
    }

    /// Forward, then (with `backward`) the backward with every input and output visible and
    /// fixed output gradients; run-time float inputs get gradients where differentiable.
    pub(crate) fn run(
        op: &'static str,
        opset: i64,
        attrs: &[AttributeProto],
        inputs: Vec<V>,
        backward: bool,
    ) -> KResult<(Vec<Flat>, Vec<Option<Flat>>)> {
        let dev = Device::Cpu;
        let mut facts = vec![];
        let mut values = vec![];
        let mut runtime_float = vec![];
        for v in inputs {
            let is_const = matches!(v, V::C(..));
            match v {
                V::T(d, s, x) | V::C(d, s, x) => {
                    let shape: Vec<u64> = s.iter().map(|&d| d as u64).collect();
                    let t = Tensor::from_vec(x.clone(), s.clone(), &dev)?
                        .to_dtype(crate::exec::kernel::to_candle(d)?)?;
                    runtime_float.push(!is_const && d.is_float());
                    facts.push(Some(if is_const {
                        Fact::with_value(PTensor::new(d, shape, Data::F(x)))
                    } else {
                        Fact::new(d, shape)
                    }));
                    values.push(Some(t));
                }
                V::None => {
                    facts.push(None);
                    values.push(None);
                    runtime_float.push(false);
                }
            }
        }
        let h = Harness::new(op, opset, attrs, &facts, 1)?;
        let (spec, k, scx) = (h.spec()?, h.kernel()?, h.shape_cx());
        let cx = h.cx(&dev, 1);
        let ys = (k.forward)(&cx, &values, &Default::default())?;
        let flat = |t: &Tensor| -> KResult<Flat> {
            Ok((
                t.dims().to_vec(),
                t.to_dtype(DType::F64)?.flatten_all()?.to_vec1::<f64>()?,
            ))
        };
        let y: Vec<Flat> = ys.iter().flatten().map(flat).collect::<KResult<_>>()?;
        if !backward {
            return Ok((y, vec![]));
        }
        let needs: Vec<bool> = (0..facts.len())
            .map(|i| runtime_float[i] && (spec.diff_in)(&scx, i))
            .collect();
        let grads: Vec<Option<Tensor>> = ys
            .iter()
            .map(|t| {
                t.as_ref()
                    .filter(|t| t.dtype().is_float())
                    .map(|t| -> KResult<Tensor> {
                        let n = t.elem_count();
                        let v: Vec<f64> = (0..n).map(|i| 0.25 * (i % 7) as f64 - 0.6).collect();
                        Ok(Tensor::from_vec(v, t.dims(), &dev)?.to_dtype(t.dtype())?)
                    })
                    .transpose()
            })
            .collect::<KResult<_>>()?;
        let bwd = k
            .backward
            .ok_or_else(|| KernelError::new("no backward kernel"))?;
        let d = bwd(
            &cx,
            &crate::exec::kernel::BwdArgs {
                inputs: &values,
                outputs: &ys,
                extras: &Default::default(),
                grads: &grads,
                needs: &needs,
            },
        )?;
        let d = d
            .iter()
            .map(|t| t.as_ref().map(flat).transpose())
            .collect::<KResult<_>>()?;
        Ok((y, d))
    }

    /// The values of the single output.
    pub(crate) fn fwd1(
        op: &'static str,
        opset: i64,
        attrs: &[AttributeProto],
        inputs: Vec<V>,
    ) -> Vec<f64> {
        match fwd(op, opset, attrs, inputs) {
            Ok(mut v) if !v.is_empty() => v.swap_remove(0).1,
            Ok(_) => panic!("{op}: no output"),
            Err(e) => panic!("{op}: {e}"),
        }
    }

    pub(crate) fn close(got: &[f64], want: &[f64]) {
        assert_eq!(got.len(), want.len(), "{got:?} vs {want:?}");
        for (g, w) in got.iter().zip(want) {
            assert!(
                (g - w).abs() <= 1e-9 * w.abs().max(1.0) || (g.is_nan() && w.is_nan()),
                "{got:?} vs {want:?}"
            );
        }
    }

    fn r(s: &[usize]) -> In {
        In::Rand(s.to_vec())
    }
    fn rin(s: &[usize], lo: f64, hi: f64) -> In {
        In::RandIn(s.to_vec(), lo, hi)
    }

    /// Every op of the elementwise and reduction shape-rule families has a forward kernel,
    /// and a backward kernel when one of its inputs is differentiable.
    #[test]
    fn every_op_has_kernels() {
        let mut specs = crate::ops::Registry::new();
        crate::ops::elementwise::register(&mut specs);
        crate::ops::reduce::register(&mut specs);
        let facts: Vec<Option<Fact>> = vec![];
        for (op, spec) in &specs {
            let k = registry()
                .get(op)
                .unwrap_or_else(|| panic!("{op} has no kernel"));
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
            let differentiable = (0..3).any(|i| (spec.diff_in)(&cx, i));
            assert_eq!(
                k.backward.is_some(),
                differentiable,
                "{op}: backward kernel present = {}, differentiable = {differentiable}",
                k.backward.is_some()
            );
        }
        assert!(specs.len() >= 79, "{} ops", specs.len());
    }

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
            node: "n",
            op: "Relu",
            opset: 14,
            attrs: Attrs {
                node: "n",
                op: "Relu",
                list: &[],
            },
            inputs: &facts,
            outputs: &facts,
            device: &dev,
            seed: 0,
        };
        let d = super::relu_bwd(
            &cx,
            &crate::exec::kernel::BwdArgs {
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
    fn broadcasting_arithmetic() {
        for op in ["Add", "Sub", "Mul"] {
            check(&Case::new(op, 14, vec![r(&[2, 3, 4]), r(&[3, 1])]));
            check(&Case::new(op, 14, vec![r(&[3, 1]), r(&[2, 3, 4])]));
            check(&Case::new(op, 14, vec![r(&[2, 3]), r(&[2, 3])]));
            check(&Case::new(op, 14, vec![r(&[2, 3]), In::Param(vec![])]));
            // Second operand a constant: only the first gets a gradient.
            check(&Case::new(
                op,
                14,
                vec![
                    r(&[2, 3]),
                    In::Const(OD::F32, vec![3], vec![0.5, -1.0, 2.0]),
                ],
            ));
        }
        check(&Case::new(
            "Div",
            14,
            vec![r(&[2, 3, 4]), rin(&[4], 0.5, 2.0)],
        ));
        check(&Case::new(
            "Div",
            14,
            vec![r(&[1, 4]), rin(&[3, 1], 0.5, 2.0)],
        ));
        check(&Case::new("Div", 14, vec![r(&[3]), In::Param(vec![1])]).tol(1e-5));
        check(&Case::new(
            "Div",
            14,
            vec![
                In::Const(OD::F32, vec![], vec![1.0]),
                rin(&[2, 3], 0.5, 2.0),
            ],
        ));
    }

    #[test]
    fn pow() {
        let e = |v: f64| In::Const(OD::F32, vec![], vec![v]);
        for p in [2.0, 3.0, 0.5, -1.0, 1.0, 0.0, 1.7, -2.0] {
            check(&Case::new("Pow", 15, vec![rin(&[3, 4], 0.5, 2.0), e(p)]));
        }
        // Negative bases with integer exponents (x², x³ in decompositions).
        for p in [2.0, 3.0, -1.0] {
            check(&Case::new("Pow", 15, vec![rin(&[3, 4], -2.0, -0.5), e(p)]));
        }
        // Run-time exponents, broadcast both ways, with gradients for both.
        check(&Case::new("Pow", 15, vec![rin(&[2, 3], 0.5, 2.0), r(&[3])]));
        check(&Case::new(
            "Pow",
            15,
            vec![rin(&[3, 1], 0.5, 2.0), r(&[2, 1, 4])],
        ));
        check(&Case::new(
            "Pow",
            15,
            vec![rin(&[3], 0.5, 2.0), In::Param(vec![])],
        ));
        // Integer exponent tensor.
        check(&Case::new(
            "Pow",
            15,
            vec![
                rin(&[3, 4], -2.0, 2.0),
                In::Ints(OD::I64, vec![4], vec![0, 1, 2, 3]),
            ],
        ));
        let y = fwd1(
            "Pow",
            15,
            &[],
            vec![
                V::T(OD::F64, vec![5], vec![-2.0, -2.0, 0.0, 0.0, -8.0]),
                V::T(OD::F64, vec![5], vec![2.0, 3.0, 0.0, 2.0, 0.5]),
            ],
        );
        close(&y, &[4.0, -8.0, 1.0, 0.0, f64::NAN]);
        let y = fwd1(
            "Pow",
            15,
            &[],
            vec![
                V::T(OD::I64, vec![3], vec![-2.0, 3.0, 5.0]),
                V::T(OD::I64, vec![3], vec![3.0, 2.0, 0.0]),
            ],
        );
        close(&y, &[-8.0, 9.0, 1.0]);
        let e = fwd(
            "Pow",
            15,
            &[],
            vec![
                V::T(OD::I64, vec![1], vec![10.0]),
                V::T(OD::I64, vec![1], vec![40.0]),
            ],
        );
        assert!(matches!(e, Err(e) if e.0.contains("overflows")));
    }

    #[test]
    fn integer_division_and_mod() {
        let a = || V::T(OD::I64, vec![4], vec![7.0, -7.0, 7.0, -7.0]);
        let b = || V::T(OD::I64, vec![4], vec![2.0, 2.0, -2.0, -2.0]);
        close(
            &fwd1("Div", 14, &[], vec![a(), b()]),
            &[3.0, -3.0, -3.0, 3.0],
        );
        close(
            &fwd1("Mod", 13, &[], vec![a(), b()]),
            &[1.0, 1.0, -1.0, -1.0],
        );
        close(
            &fwd1("Mod", 13, &[int("fmod", 1)], vec![a(), b()]),
            &[1.0, -1.0, 1.0, -1.0],
        );
        let z = || V::T(OD::I64, vec![1], vec![0.0]);
        let e = fwd("Div", 14, &[], vec![a(), z()]);
        assert!(matches!(e, Err(e) if e.0.contains("division")));
        let e = fwd("Mod", 13, &[], vec![a(), z()]);
        assert!(matches!(e, Err(e) if e.0.contains("remainder")));
        // Float Mod: fmod = 1 truncates, fmod = 0 floors.
        let fa = || V::T(OD::F64, vec![2], vec![5.5, -5.5]);
        let fb = || V::T(OD::F64, vec![1], vec![2.0]);
        close(
            &fwd1("Mod", 13, &[int("fmod", 1)], vec![fa(), fb()]),
            &[1.5, -1.5],
        );
        close(&fwd1("Mod", 13, &[], vec![fa(), fb()]), &[1.5, 0.5]);
        let m = |f: i64| {
            Case::new(
                "Mod",
                13,
                vec![r(&[3, 4]), In::Const(OD::F32, vec![], vec![0.3])],
            )
            .attr(int("fmod", f))
        };
        check(&m(1));
        check(&m(0));
        check(&Case::new("Mod", 13, vec![r(&[2, 3]), rin(&[3], 0.5, 1.0)]).attr(int("fmod", 1)));
    }

    #[test]
    fn prelu() {
        check(&Case::new(
            "PRelu",
            16,
            vec![r(&[2, 3, 4]), In::Param(vec![3, 1])],
        ));
        check(&Case::new(
            "PRelu",
            16,
            vec![r(&[2, 3]), In::Param(vec![1])],
        ));
        check(&Case::new("PRelu", 16, vec![r(&[2, 3]), r(&[2, 3])]));
        let y = fwd1(
            "PRelu",
            16,
            &[],
            vec![
                V::T(OD::F64, vec![2, 2], vec![-1.0, 2.0, -3.0, 4.0]),
                V::T(OD::F64, vec![2, 1], vec![0.1, 0.5]),
            ],
        );
        close(&y, &[-0.1, 2.0, -1.5, 4.0]);
    }

    #[test]
    fn variadic() {
        for op in ["Sum", "Mean", "Max", "Min"] {
            check(&Case::new(op, 13, vec![r(&[2, 3, 4])]));
            check(&Case::new(op, 13, vec![r(&[2, 3, 4]), r(&[3, 1])]));
            check(&Case::new(
                op,
                13,
                vec![r(&[3, 1]), In::Param(vec![4]), r(&[2, 1, 1])],
            ));
        }
        let a = || V::T(OD::F64, vec![3], vec![1.0, 5.0, -2.0]);
        let b = || V::T(OD::F64, vec![1], vec![2.0]);
        close(&fwd1("Max", 13, &[], vec![a(), b()]), &[2.0, 5.0, 2.0]);
        close(&fwd1("Min", 13, &[], vec![a(), b()]), &[1.0, 2.0, -2.0]);
        close(&fwd1("Sum", 13, &[], vec![a(), b(), b()]), &[5.0, 9.0, 2.0]);
        close(&fwd1("Mean", 13, &[], vec![a(), b()]), &[1.5, 3.5, 0.0]);
        let i = V::T(OD::I64, vec![2], vec![3.0, -4.0]);
        let j = V::T(OD::I64, vec![2], vec![1.0, 1.0]);
        close(&fwd1("Max", 13, &[], vec![i, j]), &[3.0, 1.0]);
    }

    /// At a tie the gradient of Max is shared evenly between the equal inputs.
    #[test]
    fn max_tie_gradient() {
        use crate::exec::kernel::BwdArgs;
        let dev = Device::Cpu;
        let facts = vec![
            Some(Fact::new(OD::F64, vec![2])),
            Some(Fact::new(OD::F64, vec![2])),
        ];
        let outs = vec![Some(Fact::new(OD::F64, vec![2]))];
        let cx = KernelCtx {
            node: "n",
            op: "Max",
            opset: 13,
            attrs: Attrs {
                node: "n",
                op: "Max",
                list: &[],
            },
            inputs: &facts,
            outputs: &outs,
            device: &dev,
            seed: 0,
        };
        let t = |v: Vec<f64>| Tensor::from_vec(v, 2, &dev).map(Some);
        let ins = vec![t(vec![1.0, 3.0]).unwrap(), t(vec![1.0, 2.0]).unwrap()];
        let g = vec![t(vec![1.0, 1.0]).unwrap()];
        let k = registry().get("Max").unwrap();
        let d = (k.backward.unwrap())(
            &cx,
            &BwdArgs {
                inputs: &ins,
                outputs: &[None],
                extras: &Default::default(),
                grads: &g,
                needs: &[true, true],
            },
        )
        .unwrap();
        let v = |i: usize| d[i].as_ref().unwrap().to_vec1::<f64>().unwrap();
        assert_eq!(v(0), vec![0.5, 1.0]);
        assert_eq!(v(1), vec![0.5, 0.0]);
    }

    #[test]
    fn comparisons_and_logic() {
        let a = || V::T(OD::F32, vec![2, 3], vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        let b = || V::T(OD::F32, vec![3], vec![2.0, 2.0, 5.0]);
        let cases: [(&str, [f64; 6]); 5] = [
            ("Equal", [0.0, 1.0, 0.0, 0.0, 0.0, 0.0]),
            ("Less", [1.0, 0.0, 1.0, 0.0, 0.0, 0.0]),
            ("LessOrEqual", [1.0, 1.0, 1.0, 0.0, 0.0, 0.0]),
            ("Greater", [0.0, 0.0, 0.0, 1.0, 1.0, 1.0]),
            ("GreaterOrEqual", [0.0, 1.0, 0.0, 1.0, 1.0, 1.0]),
        ];
        for (op, want) in cases {
            let out = fwd(op, 16, &[], vec![a(), b()]).unwrap();
            assert_eq!(out[0].0, vec![2, 3]);
            close(&out[0].1, &want);
            // Integers too; the harness checks the boolean output type.
            check(&Case::new(
                op,
                16,
                vec![
                    In::Ints(OD::I64, vec![2, 2], vec![1, 2, 3, 4]),
                    In::Ints(OD::I64, vec![2], vec![2, 3]),
                ],
            ));
            check(&Case::new(op, 16, vec![r(&[2, 3]), r(&[3])]));
        }
        let p = || V::T(OD::Bool, vec![4], vec![0.0, 0.0, 1.0, 1.0]);
        let q = || V::T(OD::Bool, vec![4], vec![0.0, 1.0, 0.0, 1.0]);
        close(&fwd1("And", 7, &[], vec![p(), q()]), &[0.0, 0.0, 0.0, 1.0]);
        close(&fwd1("Or", 7, &[], vec![p(), q()]), &[0.0, 1.0, 1.0, 1.0]);
        close(&fwd1("Xor", 7, &[], vec![p(), q()]), &[0.0, 1.0, 1.0, 0.0]);
        close(&fwd1("Not", 1, &[], vec![p()]), &[1.0, 1.0, 0.0, 0.0]);
        for op in ["And", "Or", "Xor"] {
            check(&Case::new(
                op,
                7,
                vec![
                    In::Ints(OD::Bool, vec![2, 2], vec![0, 1, 1, 0]),
                    In::Ints(OD::Bool, vec![1, 2], vec![1, 0]),
                ],
            ));
        }
        check(&Case::new(
            "Not",
            1,
            vec![In::Ints(OD::Bool, vec![3], vec![0, 1, 1])],
        ));
        // Mismatched element types are an error.
        let e = fwd(
            "Equal",
            16,
            &[],
            vec![a(), V::T(OD::I64, vec![3], vec![1.0; 3])],
        );
        assert!(e.is_err());
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

    #[test]
    fn bitwise() {
        let a = || V::T(OD::U8, vec![3], vec![12.0, 255.0, 1.0]);
        let b = || V::T(OD::U8, vec![3], vec![10.0, 15.0, 2.0]);
        close(
            &fwd1("BitwiseAnd", 18, &[], vec![a(), b()]),
            &[8.0, 15.0, 0.0],
        );
        close(
            &fwd1("BitwiseOr", 18, &[], vec![a(), b()]),
            &[14.0, 255.0, 3.0],
        );
        close(
            &fwd1("BitwiseXor", 18, &[], vec![a(), b()]),
            &[6.0, 240.0, 3.0],
        );
        close(
            &fwd1("BitwiseNot", 18, &[], vec![a()]),
            &[243.0, 0.0, 254.0],
        );
        let i = V::T(OD::I32, vec![2], vec![0.0, -6.0]);
        close(&fwd1("BitwiseNot", 18, &[], vec![i]), &[-1.0, 5.0]);
        let s = || V::T(OD::U8, vec![3], vec![1.0, 4.0, 9.0]);
        close(
            &fwd1(
                "BitShift",
                11,
                &[string("direction", "LEFT")],
                vec![a(), s()],
            ),
            &[24.0, 240.0, 0.0],
        );
        close(
            &fwd1(
                "BitShift",
                11,
                &[string("direction", "RIGHT")],
                vec![a(), s()],
            ),
            &[6.0, 15.0, 0.0],
        );
        let e = fwd("BitShift", 11, &[string("direction", "UP")], vec![a(), s()]);
        assert!(matches!(e, Err(e) if e.0.contains("\"direction\"")));
        check(&Case::new(
            "BitwiseAnd",
            18,
            vec![
                In::Ints(OD::I64, vec![2, 2], vec![1, 2, 3, 4]),
                In::Ints(OD::I64, vec![2], vec![3, 7]),
            ],
        ));
        check(
            &Case::new(
                "BitShift",
                11,
                vec![
                    In::Ints(OD::U32, vec![2, 2], vec![1, 2, 3, 4]),
                    In::Ints(OD::U32, vec![2], vec![3, 7]),
                ],
            )
            .attr(string("direction", "LEFT")),
        );
        check(&Case::new(
            "BitwiseNot",
            18,
            vec![In::Ints(OD::I64, vec![2], vec![3, 7])],
        ));
    }

    #[test]
    fn where_op() {
        let c = || In::Ints(OD::Bool, vec![3, 1], vec![1, 0, 1]);
        check(&Case::new("Where", 16, vec![c(), r(&[3, 4]), r(&[4])]));
        check(&Case::new(
            "Where",
            16,
            vec![c(), r(&[2, 1, 4]), In::Param(vec![])],
        ));
        check(&Case::new(
            "Where",
            16,
            vec![c(), In::Const(OD::F32, vec![], vec![-5.0]), r(&[3, 2])],
        ));
        let y = fwd1(
            "Where",
            16,
            &[],
            vec![
                V::T(OD::Bool, vec![2], vec![1.0, 0.0]),
                V::T(OD::I64, vec![2, 1], vec![1.0, 2.0]),
                V::T(OD::I64, vec![], vec![9.0]),
            ],
        );
        close(&y, &[1.0, 9.0, 2.0, 9.0]);
    }

    /// Models run in f32 (sometimes f16): forward and backward of every differentiable op
    /// agree with the f64 run.
    #[test]
    fn single_and_half_precision_match_double() {
        let xs: Vec<f64> = (0..12).map(|i| -1.73 + 0.31 * i as f64).collect();
        let pos: Vec<f64> = (0..12).map(|i| 0.4 + 0.13 * i as f64).collect();
        let unit: Vec<f64> = (0..12).map(|i| -0.9 + 0.15 * i as f64).collect();
        /// Op, opset, attributes, and the inputs in f64, f32 and f16.
        type Row = (
            &'static str,
            i64,
            Vec<AttributeProto>,
            Vec<V>,
            Vec<V>,
            Vec<V>,
        );
        let cases: Vec<Row> = {
            let mut v = vec![];
            let mk = |f: &dyn Fn(OD) -> Vec<V>| (f(OD::F64), f(OD::F32), f(OD::F16));
            for op in super::UNARY {
                let data = match *op {
                    "Sqrt" | "Log" | "Reciprocal" | "Acosh" => {
                        if *op == "Acosh" {
                            pos.iter().map(|p| p + 1.0).collect()
                        } else {
                            pos.clone()
                        }
                    }
                    "Asin" | "Acos" | "Atanh" | "Tan" => unit.clone(),
                    _ => xs.clone(),
                };
                let (a, b, c) = mk(&|d| vec![V::T(d, vec![3, 4], data.clone())]);
                v.push((*op, 17, vec![], a, b, c));
            }
            let two = |d: OD, x: &Vec<f64>, y: Vec<f64>, ys: Vec<usize>| {
                vec![V::T(d, vec![3, 4], x.clone()), V::T(d, ys, y)]
            };
            for op in [
                "Add", "Sub", "Mul", "Div", "PRelu", "Mod", "Max", "Min", "Sum", "Mean",
            ] {
                let (a, b, c) = mk(&|d| two(d, &xs, vec![0.5, 1.5, 2.5, 3.5], vec![4]));
                let attrs = if op == "Mod" {
                    vec![int("fmod", 1)]
                } else {
                    vec![]
                };
                v.push((op, 14, attrs, a, b, c));
            }
            let (a, b, c) = mk(&|d| two(d, &pos, vec![0.5, -1.5, 2.0, 3.0], vec![4]));
            v.push(("Pow", 15, vec![], a, b, c));
            let (a, b, c) =
                mk(&|d| vec![V::T(d, vec![3, 4], xs.clone()), V::C(d, vec![], vec![3.0])]);
            v.push(("Pow", 15, vec![], a, b, c));
            let (a, b, c) = mk(&|d| {
                vec![
                    V::T(OD::Bool, vec![4], vec![1.0, 0.0, 0.0, 1.0]),
                    V::T(d, vec![3, 4], xs.clone()),
                    V::T(d, vec![], vec![0.5]),
                ]
            });
            v.push(("Where", 16, vec![], a, b, c));
            for op in [
                "ReduceSum",
                "ReduceMean",
                "ReduceSumSquare",
                "ReduceL1",
                "ReduceL2",
                "ReduceLogSum",
                "ReduceLogSumExp",
                "ReduceMax",
                "ReduceMin",
                "ReduceProd",
            ] {
                let (a, b, c) = mk(&|d| {
                    vec![
                        V::T(d, vec![3, 4], pos.clone()),
                        V::C(OD::I64, vec![1], vec![1.0]),
                    ]
                });
                v.push((op, 18, vec![], a, b, c));
            }
            v
        };
        for (op, opset, attrs, d64, d32, d16) in cases {
            let (y64, g64) =
                run(op, opset, &attrs, d64, true).unwrap_or_else(|e| panic!("{op} f64: {e}"));
            for (name, data, tol) in [("f32", d32, 1e-5), ("f16", d16, 2e-2)] {
                let (y, g) = run(op, opset, &attrs, data, true)
                    .unwrap_or_else(|e| panic!("{op} {name}: {e}"));
                let near = |a: &[f64], b: &[f64], what: &str| {
                    let scale = b.iter().fold(1.0f64, |m, v| m.max(v.abs()));
                    for (p, q) in a.iter().zip(b) {
                        assert!(
                            (p - q).abs() <= tol * scale,
                            "{op} {name} {what}: {a:?} vs {b:?}"
                        );
                    }
                };
                for (a, b) in y.iter().zip(&y64) {
                    assert_eq!(a.0, b.0, "{op} {name}");
                    near(&a.1, &b.1, "output");
                }
                assert_eq!(g.len(), g64.len(), "{op} {name}");
                for (a, b) in g.iter().zip(&g64) {
                    match (a, b) {
                        (Some(a), Some(b)) => near(&a.1, &b.1, "gradient"),
                        (None, None) => {}
                        _ => panic!("{op} {name}: gradients differ in presence"),
                    }
                }
            }
        }
    }

    /// Models run in f32 (sometimes f16): every float kernel runs there too.
    #[test]
    fn low_precision_types() {
        let x = || V::T(OD::F32, vec![4], vec![-1.5, -0.2, 0.3, 2.0]);
        let h = || V::T(OD::F16, vec![4], vec![-1.5, -0.2, 0.3, 2.0]);
        for op in [
            "Relu",
            "Sigmoid",
            "Tanh",
            "Gelu",
            "Swish",
            "HardSwish",
            "Erf",
            "Neg",
            "Abs",
        ] {
            let a = fwd1(op, 17, &[], vec![x()]);
            let b = fwd1(op, 17, &[], vec![h()]);
            for (p, q) in a.iter().zip(&b) {
                assert!((p - q).abs() < 1e-2, "{op}: {a:?} vs {b:?}");
            }
        }
        let y = fwd1("Pow", 15, &[], vec![x(), V::C(OD::F32, vec![], vec![2.0])]);
        for (p, q) in y.iter().zip([2.25, 0.04, 0.09, 4.0]) {
            assert!((p - q).abs() < 1e-6, "{y:?}");
        }
    }
}
