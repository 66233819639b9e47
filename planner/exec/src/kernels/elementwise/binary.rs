//! Broadcasting binary and variadic arithmetic, comparisons, logic and bitwise ops, Where.

use crate::kernel::kbail;
use crate::kernel::{
    BwdArgs, Extras, Inputs, KResult, Kernel, KernelCtx, KernelError, KernelRegistry,
};
use crate::kernels::common::{
    const_scalar, host_f64, host_i64, i8_pattern, i8_signed, int_bits, ints_to, mask, scalar_like,
    scale, shift, sum_to, where_select, width_mask,
};
use candle_core::{DType, Tensor};
use remat_planner::tensor::DType as PDType;

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
    let av = host_i64(&a.broadcast_as(shape)?)?;
    let bv = host_i64(&b.broadcast_as(shape)?)?;
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
        let xv = host_i64(&x.broadcast_as(shape)?)?;
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

fn binary_fwd(cx: &KernelCtx, xs: &[Option<Tensor>], e: &Extras) -> KResult<Vec<Option<Tensor>>> {
    // int8 is held in u8 (its bit pattern): the arithmetic and comparisons of signed values run
    // on their i64 values, and an int8 result goes back to its pattern. (BitShift reads the
    // patterns itself.)
    let i8_in = |i: usize| cx.input(i).map(|f| f.dtype == PDType::I8).unwrap_or(false);
    if cx.op != "BitShift" && (i8_in(0) || i8_in(1)) {
        let widen = |t: &Tensor, i: usize| -> KResult<Tensor> {
            if i8_in(i) {
                i8_signed(t)
            } else {
                Ok(t.clone())
            }
        };
        let wide: Vec<Option<Tensor>> =
            vec![Some(widen(xs.req(0)?, 0)?), Some(widen(xs.req(1)?, 1)?)];
        let mut y = binary_values(cx, &wide, e)?;
        if let Some(Some(t)) = y.first_mut() {
            if t.dtype() == DType::I64 {
                *t = i8_pattern(t)?;
            }
        }
        return Ok(y);
    }
    binary_values(cx, xs, e)
}

fn binary_values(
    cx: &KernelCtx,
    xs: &[Option<Tensor>],
    _: &Extras,
) -> KResult<Vec<Option<Tensor>>> {
    let a = xs.req(0)?;
    let b = xs.req(1)?;
    let shape = cx.out_shape(0)?;
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
                // On the host, elementwise: C's fmod (Rust's `%`, exact), and for fmod = 0 the
                // result moved to the divisor's sign, as opset 28 spells out (x % ±inf is x or
                // ±inf, x % 0 and inf % y are NaN, a zero takes the divisor's sign). `a - floor(a
                // / b) * b` on the device gets the infinities wrong and rounds.
                let av = host_f64(&a.broadcast_as(shape.as_slice())?)?;
                let bv = host_f64(&b.broadcast_as(shape.as_slice())?)?;
                let v: Vec<f64> = av
                    .iter()
                    .zip(&bv)
                    .map(|(&x, &y)| {
                        let r = x % y;
                        if fmod || r.is_nan() {
                            r
                        } else if r == 0.0 {
                            0f64.copysign(y)
                        } else if (r < 0.0) != (y < 0.0) {
                            r + y
                        } else {
                            r
                        }
                    })
                    .collect();
                Tensor::from_vec(v, shape.as_slice(), a.device())?.to_dtype(a.dtype())?
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
            where_select(&a.lt(0.0)?, &neg, a, &shape)?
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
            let dt = cx.input(0)?.dtype;
            let bits = int_bits(dt)?;
            let m = width_mask(bits);
            // Signed types (opset 28): right shifts are arithmetic, left shifts wrap into the
            // sign bit, and a shift below 0 or of the width or more leaves only the sign fill.
            let signed = matches!(dt, PDType::I8 | PDType::I16 | PDType::I32 | PDType::I64);
            int_binary(a, b, &shape, a.dtype(), |x, s| {
                if signed {
                    // int8 arrives as its u8 bit pattern.
                    let (x, s) = if dt == PDType::I8 {
                        (i64::from(x as u8 as i8), i64::from(s as u8 as i8))
                    } else {
                        (x, s)
                    };
                    if s < 0 || s >= i64::from(bits) {
                        return Ok(if !left && x < 0 { -1 } else { 0 });
                    }
                    if !left {
                        return Ok(x >> s);
                    }
                    let r = ((x as u64) << s) & m;
                    let sign = 1u64 << (bits - 1);
                    return Ok(if bits < 64 && r & sign != 0 {
                        r as i64 - (1i64 << bits)
                    } else {
                        r as i64
                    });
                }
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
                out[0] = Some(sum_to(&g, &sa)?);
            }
            if a.need(1) {
                let gb = sum_to(&g, &sb)?;
                out[1] = Some(if cx.op == "Sub" { gb.neg()? } else { gb });
            }
        }
        "Mul" => {
            if a.need(0) {
                out[0] = Some(sum_to(&g.broadcast_mul(a.input(1)?)?, &sa)?);
            }
            if a.need(1) {
                out[1] = Some(sum_to(&g.broadcast_mul(a.input(0)?)?, &sb)?);
            }
        }
        "Div" => {
            let b = a.input(1)?;
            if a.need(0) {
                out[0] = Some(sum_to(&g.broadcast_div(b)?, &sa)?);
            }
            if a.need(1) {
                // −g·A/B²
                let t = g.broadcast_mul(a.input(0)?)?.broadcast_div(&b.sqr()?)?;
                out[1] = Some(sum_to(&t.neg()?, &sb)?);
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
                out[0] = Some(sum_to(&g.broadcast_mul(&d)?, &sa)?);
            }
            if a.need(1) && !x.dtype().is_float() {
                // An integer base gives an integer power: no gradient reaches the exponent.
                let e = a.input(1)?;
                out[1] = Some(e.zeros_like()?);
            } else if a.need(1) {
                // g·Y·ln X, zero where X = 0 (PyTorch's convention).
                let y = a.output(0)?;
                let xb = x.broadcast_as(shape.as_slice())?;
                let t = (&g * y)?.mul(&xb.log()?)?;
                let t = xb.eq(0.0)?.where_cond(&t.zeros_like()?, &t)?;
                out[1] = Some(sum_to(&t, &sb)?);
            }
        }
        "Mod" => {
            if a.need(0) {
                out[0] = Some(sum_to(&g, &sa)?);
            }
        }
        "PRelu" => {
            let x = a.input(0)?;
            let slope = a.input(1)?;
            let neg = x.lt(0.0)?;
            if a.need(0) {
                let gs = g.broadcast_mul(slope)?;
                out[0] = Some(sum_to(&where_select(&neg, &gs, &g, &shape)?, &sa)?);
            }
            if a.need(1) {
                let gx = g.broadcast_mul(x)?;
                let t = where_select(&neg, &gx, &g.zeros_like()?, &shape)?;
                out[1] = Some(sum_to(&t, &sb)?);
            }
        }
        other => kbail!("no binary backward for {other}"),
    }
    Ok(out)
}

fn variadic_fwd(cx: &KernelCtx, xs: &[Option<Tensor>], _: &Extras) -> KResult<Vec<Option<Tensor>>> {
    let v = all_inputs(cx, xs)?;
    let shape = cx.out_shape(0)?;
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
                    *o = Some(sum_to(&g, &cx.in_shape(i)?)?);
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
                    *o = Some(sum_to(&(&share * h)?, &cx.in_shape(i)?)?);
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
    let c = xs.req(0)?;
    let x = xs.req(1)?;
    let y = xs.req(2)?;
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
    Ok(vec![Some(where_select(&c, x, y, &cx.out_shape(0)?)?)])
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
        out[1] = Some(sum_to(
            &where_select(&c, &g, &z, &shape)?,
            &cx.in_shape(1)?,
        )?);
    }
    if a.need(2) {
        out[2] = Some(sum_to(
            &where_select(&c, &z, &g, &shape)?,
            &cx.in_shape(2)?,
        )?);
    }
    Ok(out)
}

pub(super) fn register(r: &mut KernelRegistry) {
    for op in ["Add", "Sub", "Mul", "Div", "Pow", "Mod", "PRelu"] {
        r.insert(op, Kernel::new(binary_fwd, Some(binary_bwd)));
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
        r.insert(op, Kernel::new(binary_fwd, None));
    }
    for op in ["Sum", "Mean", "Max", "Min"] {
        r.insert(op, Kernel::new(variadic_fwd, Some(variadic_bwd)));
    }
    r.insert("Where", Kernel::new(where_fwd, Some(where_bwd)));
}

#[cfg(test)]
mod tests {
    use crate::kernel::KernelCtx;
    use crate::kernels::registry;
    use crate::testing::typed::{close, fwd, fwd1, V};
    use crate::testing::{check, int, string, Case, In};
    use crate::testing::{r, rin};
    use candle_core::{Device, Tensor};
    use remat_planner::onnx::Attrs;
    use remat_planner::ops::Ctx;
    use remat_planner::tensor::{DType as OD, Fact};

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
        use crate::kernel::BwdArgs;
        let dev = Device::Cpu;
        let facts = vec![
            Some(Fact::new(OD::F64, vec![2])),
            Some(Fact::new(OD::F64, vec![2])),
        ];
        let outs = vec![Some(Fact::new(OD::F64, vec![2]))];
        let cx = KernelCtx {
            rule: Ctx {
                node: "n",
                op: "Max",
                opset: 13,
                attrs: Attrs {
                    node: "n",
                    op: "Max",
                    list: &[],
                },
                inputs: &facts,
                n_outputs: outs.len(),
            },
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
}
