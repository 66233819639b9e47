//! Elementwise ops: unary activations and math, broadcasting binary and variadic ops,
//! comparisons and logic, `Where`. Small constant inputs are folded.

use super::{first, none, save_x, save_y, Ctx, GradRule, OpSpec, Registry, Saved};
use crate::error::Result;
use crate::tensor::{
    broadcast_index, numel, DType, Data, Fact, Tensor, FLOAT_FOLD_LIMIT, FOLD_LIMIT,
};

/// Output of a unary op: same type and shape as the input, folded when the input is known.
fn unary(cx: &Ctx, f: fn(f64) -> f64, out_dtype: Option<DType>) -> Result<Vec<Fact>> {
    let x = cx.input(0)?;
    let dtype = out_dtype.unwrap_or(x.dtype);
    if let Some(v) = &x.value {
        let vals: Vec<f64> = v.as_f64().into_iter().map(f).collect();
        return Ok(vec![cx.folded(Tensor::new(
            dtype,
            x.shape.clone(),
            Data::F(vals),
        ))]);
    }
    Ok(vec![Fact::new(dtype, x.shape.clone())])
}

fn unary_float(cx: &Ctx, f: fn(f64) -> f64) -> Result<Vec<Fact>> {
    unary(cx, f, None)
}

/// Output of a unary op whose values the importer does not fold (shapes never depend on
/// them): same type and shape as the input; the executor computes the value when it runs.
fn unary_shape(cx: &Ctx) -> Result<Vec<Fact>> {
    let x = cx.input(0)?;
    Ok(vec![Fact::new(x.dtype, x.shape.clone())])
}

/// Values of all inputs broadcast to `shape`, when every input is a known constant.
fn broadcast_values(cx: &Ctx, shape: &[u64]) -> Option<Vec<Vec<f64>>> {
    let n = numel(shape)?;
    if n > FLOAT_FOLD_LIMIT {
        return None;
    }
    cx.inputs
        .iter()
        .map(|f| {
            let f = f.as_ref()?;
            let v = f.value.as_ref()?;
            let vals = v.as_f64();
            let idx = broadcast_index(&f.shape, shape);
            idx.into_iter().map(|i| vals.get(i).copied()).collect()
        })
        .collect()
}

/// Same for exact integer values.
fn broadcast_ints(cx: &Ctx, shape: &[u64]) -> Option<Vec<Vec<i64>>> {
    let n = numel(shape)?;
    if n > FOLD_LIMIT {
        return None;
    }
    cx.inputs
        .iter()
        .map(|f| {
            let f = f.as_ref()?;
            let v = f.value.as_ref()?;
            let vals = v.as_i64();
            let idx = broadcast_index(&f.shape, shape);
            idx.into_iter().map(|i| vals.get(i).copied()).collect()
        })
        .collect()
}

/// A broadcasting n-ary op. `fi` folds integer inputs exactly (returning `None` to refuse,
/// e.g. a division by zero), `ff` folds floats.
fn nary(
    cx: &Ctx,
    out_dtype: Option<DType>,
    fi: fn(&[i64]) -> Option<i64>,
    ff: fn(&[f64]) -> f64,
) -> Result<Vec<Fact>> {
    let variadic = matches!(cx.op, "Sum" | "Max" | "Min" | "Mean");
    let present = cx.inputs.iter().filter(|f| f.is_some()).count();
    if present != cx.inputs.len() || (!variadic && present != 2) || present == 0 {
        return Err(cx.err(format!(
            "expects {} inputs, got {present} of {}",
            if variadic { "one or more" } else { "two" },
            cx.inputs.len()
        )));
    }
    let in_dtype = cx.input(0)?.dtype;
    let dtype = out_dtype.unwrap_or(in_dtype);
    let shape = cx.broadcast_all()?;
    if in_dtype.is_int() {
        if let Some(cols) = broadcast_ints(cx, &shape) {
            let n = cols.first().map(|c| c.len()).unwrap_or(0);
            let mut out = Vec::with_capacity(n);
            let mut args: Vec<i64> = Vec::with_capacity(cols.len());
            for i in 0..n {
                args.clear();
                args.extend(cols.iter().map(|c| c[i]));
                match fi(&args) {
                    Some(v) => out.push(v),
                    None => return Ok(vec![cx.fact(dtype, shape)?]),
                }
            }
            return Ok(vec![cx.folded(Tensor::new(dtype, shape, Data::I(out)))]);
        }
    } else if let Some(cols) = broadcast_values(cx, &shape) {
        let n = cols.first().map(|c| c.len()).unwrap_or(0);
        let mut args: Vec<f64> = Vec::with_capacity(cols.len());
        let out: Vec<f64> = (0..n)
            .map(|i| {
                args.clear();
                args.extend(cols.iter().map(|c| c[i]));
                ff(&args)
            })
            .collect();
        return Ok(vec![cx.folded(Tensor::new(dtype, shape, Data::F(out)))]);
    }
    Ok(vec![cx.fact(dtype, shape)?])
}

fn cmp(cx: &Ctx, fi: fn(&[i64]) -> Option<i64>, ff: fn(&[f64]) -> f64) -> Result<Vec<Fact>> {
    nary(cx, Some(DType::Bool), fi, ff)
}

fn b(x: bool) -> i64 {
    i64::from(x)
}
fn bf(x: bool) -> f64 {
    if x {
        1.0
    } else {
        0.0
    }
}

/// `Where(cond, a, b)`: broadcast of all three; folded when all are known.
fn where_infer(cx: &Ctx) -> Result<Vec<Fact>> {
    if cx.inputs.len() != 3 || cx.inputs.iter().any(|f| f.is_none()) {
        return Err(cx.err("expects three inputs: condition, X, Y"));
    }
    let dtype = cx.input(1)?.dtype;
    let shape = cx.broadcast_all()?;
    if dtype.is_int() {
        if let Some(cols) = broadcast_ints(cx, &shape) {
            let out: Vec<i64> = (0..cols[0].len())
                .map(|i| {
                    if cols[0][i] != 0 {
                        cols[1][i]
                    } else {
                        cols[2][i]
                    }
                })
                .collect();
            return Ok(vec![cx.folded(Tensor::new(dtype, shape, Data::I(out)))]);
        }
    } else if let Some(cols) = broadcast_values(cx, &shape) {
        let out: Vec<f64> = (0..cols[0].len())
            .map(|i| {
                if cols[0][i] != 0.0 {
                    cols[1][i]
                } else {
                    cols[2][i]
                }
            })
            .collect();
        return Ok(vec![cx.folded(Tensor::new(dtype, shape, Data::F(out)))]);
    }
    Ok(vec![cx.fact(dtype, shape)?])
}

fn per_elem(k: f64) -> impl Fn(&[Fact]) -> f64 {
    move |out: &[Fact]| out.iter().map(|f| f.numel() as f64).sum::<f64>() * k
}

fn int_pow(a: i64, e: i64) -> Option<i64> {
    u32::try_from(e).ok().and_then(|e| a.checked_pow(e))
}

pub fn register(r: &mut Registry) {
    let u = |infer: fn(&Ctx) -> Result<Vec<Fact>>,
             flops: fn(&Ctx, &[Fact]) -> f64,
             grad: fn(&Ctx, &[Fact], &[bool]) -> GradRule| OpSpec {
        infer,
        flops,
        grad,
        ..OpSpec::DEFAULT
    };
    let f1: fn(&Ctx, &[Fact]) -> f64 = |_, o| per_elem(1.0)(o);
    let f4: fn(&Ctx, &[Fact]) -> f64 = |_, o| per_elem(4.0)(o);
    let f8: fn(&Ctx, &[Fact]) -> f64 = |_, o| per_elem(8.0)(o);

    // Activations: the saved value follows PyTorch's autograd (derivatives.yaml).
    r.insert("Relu", u(|cx| unary_float(cx, |x| x.max(0.0)), f1, save_y));
    r.insert("LeakyRelu", u(unary_shape, f1, save_x));
    r.insert(
        "Sigmoid",
        u(
            |cx| unary_float(cx, |x| 1.0 / (1.0 + (-x).exp())),
            f4,
            save_y,
        ),
    );
    r.insert("Tanh", u(|cx| unary_float(cx, f64::tanh), f4, save_y));
    r.insert("Erf", u(unary_shape, f8, save_x));
    r.insert("Gelu", u(unary_shape, f8, save_x));
    r.insert("HardSigmoid", u(unary_shape, f1, save_x));
    r.insert("HardSwish", u(unary_shape, f1, save_x));
    r.insert("Softplus", u(unary_shape, f4, save_x));
    r.insert("Softsign", u(unary_shape, f4, save_x));
    r.insert("Elu", u(unary_shape, f4, save_x));
    r.insert("Selu", u(unary_shape, f4, save_x));
    r.insert("Celu", u(unary_shape, f4, save_x));
    r.insert("Mish", u(unary_shape, f8, save_x));
    // Swish (opset 24; also what the SiLU fusion produces): x·sigmoid(αx), saves x.
    r.insert(
        "Swish",
        u(|cx| unary_float(cx, |x| x / (1.0 + (-x).exp())), f4, save_x),
    );
    r.insert("ThresholdedRelu", u(unary_shape, f1, save_x));
    r.insert("Sqrt", u(|cx| unary_float(cx, f64::sqrt), f1, save_y));
    r.insert("Exp", u(|cx| unary_float(cx, f64::exp), f4, save_y));
    r.insert("Log", u(|cx| unary_float(cx, f64::ln), f4, save_x));
    r.insert(
        "Reciprocal",
        u(|cx| unary_float(cx, |x| 1.0 / x), f1, save_y),
    );
    r.insert("Sin", u(|cx| unary_float(cx, f64::sin), f4, save_x));
    r.insert("Cos", u(|cx| unary_float(cx, f64::cos), f4, save_x));
    r.insert("Tan", u(|cx| unary_float(cx, f64::tan), f4, save_y));
    r.insert("Atan", u(|cx| unary_float(cx, f64::atan), f4, save_x));
    r.insert("Asin", u(|cx| unary_float(cx, f64::asin), f4, save_x));
    r.insert("Acos", u(|cx| unary_float(cx, f64::acos), f4, save_x));
    r.insert("Sinh", u(|cx| unary_float(cx, f64::sinh), f4, save_x));
    r.insert("Cosh", u(|cx| unary_float(cx, f64::cosh), f4, save_x));
    r.insert("Asinh", u(|cx| unary_float(cx, f64::asinh), f4, save_x));
    r.insert("Acosh", u(|cx| unary_float(cx, f64::acosh), f4, save_x));
    r.insert("Atanh", u(|cx| unary_float(cx, f64::atanh), f4, save_x));
    // dX = dY·[|X| > lambd] needs X (PyTorch's hard/softshrink save self).
    r.insert("Shrink", u(unary_shape, f1, save_x));
    r.insert(
        "Neg",
        u(|cx| unary_float(cx, |x| -x), f1, super::nothing_saved),
    );
    r.insert("Abs", u(|cx| unary_float(cx, f64::abs), f1, save_x));
    // Piecewise constant: zero gradient, nothing saved.
    for op in ["Floor", "Ceil", "Round", "Sign"] {
        r.insert(op, u(unary_rounding(op), f1, super::nothing_saved));
    }
    r.insert(
        "IsNaN",
        OpSpec {
            infer: |cx| unary(cx, |x| bf(x.is_nan()), Some(DType::Bool)),
            diff_in: none,
            ..OpSpec::DEFAULT
        },
    );
    r.insert(
        "IsInf",
        OpSpec {
            infer: |cx| unary(cx, |x| bf(x.is_infinite()), Some(DType::Bool)),
            diff_in: none,
            ..OpSpec::DEFAULT
        },
    );
    r.insert(
        "Not",
        OpSpec {
            infer: |cx| unary(cx, |x| bf(x == 0.0), Some(DType::Bool)),
            diff_in: none,
            ..OpSpec::DEFAULT
        },
    );
    r.insert(
        "Clip",
        OpSpec {
            infer: |cx| {
                unary_float(cx, |x| x)
                    .map(|mut v| {
                        v.iter_mut().for_each(|f| f.value = None);
                        v
                    })
                    .and_then(|v| clip_fold(cx).map(|f| f.map(|f| vec![f]).unwrap_or(v)))
            },
            flops: f1,
            diff_in: first,
            // dX = dY·[min ≤ X ≤ max]: bounds computed at run time are saved too.
            grad: |cx, _, _| {
                let mut s = vec![Saved::Input(0)];
                s.extend((1..3).filter(|&i| computed(cx, i)).map(Saved::Input));
                GradRule::saves(s, 1.0)
            },
            ..OpSpec::DEFAULT
        },
    );
    r.insert(
        "PRelu",
        OpSpec {
            infer: |cx| {
                nary(
                    cx,
                    None,
                    |a| Some(a[0]),
                    |a| if a[0] >= 0.0 { a[0] } else { a[0] * a[1] },
                )
            },
            flops: f1,
            grad: |_, _, _| GradRule::saves(vec![Saved::Input(0), Saved::Input(1)], 2.0),
            ..OpSpec::DEFAULT
        },
    );

    // Broadcasting arithmetic.
    r.insert(
        "Add",
        u(
            |cx| nary(cx, None, |a| a[0].checked_add(a[1]), |a| a[0] + a[1]),
            f1,
            super::nothing_saved,
        ),
    );
    r.insert(
        "Sub",
        u(
            |cx| nary(cx, None, |a| a[0].checked_sub(a[1]), |a| a[0] - a[1]),
            f1,
            super::nothing_saved,
        ),
    );
    r.insert(
        "Mul",
        u(
            |cx| nary(cx, None, |a| a[0].checked_mul(a[1]), |a| a[0] * a[1]),
            f1,
            |_, _, needs| {
                let mut s = vec![];
                if needs.get(1) == Some(&true) {
                    s.push(Saved::Input(0));
                }
                if needs.first() == Some(&true) {
                    s.push(Saved::Input(1));
                }
                GradRule::saves(s, 1.5)
            },
        ),
    );
    r.insert(
        "Div",
        u(
            |cx| nary(cx, None, |a| a[0].checked_div(a[1]), |a| a[0] / a[1]),
            f1,
            |_, _, needs| {
                let mut s = vec![Saved::Input(1)];
                if needs.get(1) == Some(&true) {
                    s.push(Saved::Input(0));
                }
                GradRule::saves(s, 2.5)
            },
        ),
    );
    r.insert(
        "Pow",
        OpSpec {
            infer: |cx| nary(cx, None, |a| int_pow(a[0], a[1]), |a| a[0].powf(a[1])),
            flops: f4,
            grad: |cx, _, needs| {
                let mut s = vec![Saved::Input(0)];
                // dX needs the exponent too: a constant one is always resident, a computed
                // one is saved (PyTorch's pow saves both operands).
                if needs.get(1) == Some(&true) || computed(cx, 1) {
                    s.push(Saved::Input(1));
                }
                if needs.get(1) == Some(&true) {
                    s.push(Saved::Output(0));
                }
                GradRule::saves(s, 3.0)
            },
            ..OpSpec::DEFAULT
        },
    );
    r.insert(
        "Mod",
        OpSpec {
            infer: |cx| {
                nary(
                    cx,
                    None,
                    |a| {
                        if a[1] == 0 {
                            None
                        } else {
                            Some(((a[0] % a[1]) + a[1]) % a[1])
                        }
                    },
                    |a| a[0] % a[1],
                )
            },
            diff_in: first,
            ..OpSpec::DEFAULT
        },
    );
    r.insert(
        "Max",
        OpSpec {
            infer: |cx| {
                nary(
                    cx,
                    None,
                    |a| a.iter().copied().max(),
                    |a| a.iter().copied().fold(f64::NEG_INFINITY, f64::max),
                )
            },
            grad: |cx, _, _| GradRule::saves((0..cx.inputs.len()).map(Saved::Input).collect(), 1.0),
            ..OpSpec::DEFAULT
        },
    );
    r.insert(
        "Min",
        OpSpec {
            infer: |cx| {
                nary(
                    cx,
                    None,
                    |a| a.iter().copied().min(),
                    |a| a.iter().copied().fold(f64::INFINITY, f64::min),
                )
            },
            grad: |cx, _, _| GradRule::saves((0..cx.inputs.len()).map(Saved::Input).collect(), 1.0),
            ..OpSpec::DEFAULT
        },
    );
    r.insert(
        "Sum",
        u(
            |cx| {
                nary(
                    cx,
                    None,
                    |a| a.iter().try_fold(0i64, |s, &x| s.checked_add(x)),
                    |a| a.iter().sum(),
                )
            },
            f1,
            super::nothing_saved,
        ),
    );
    r.insert(
        "Mean",
        u(
            |cx| {
                nary(
                    cx,
                    None,
                    |a| Some(a.iter().sum::<i64>() / a.len().max(1) as i64),
                    |a| a.iter().sum::<f64>() / a.len().max(1) as f64,
                )
            },
            f1,
            super::nothing_saved,
        ),
    );

    // Comparisons and logic: boolean outputs, no gradient.
    let logic = |infer: fn(&Ctx) -> Result<Vec<Fact>>| OpSpec {
        infer,
        diff_in: none,
        diff_out: none,
        ..OpSpec::DEFAULT
    };
    r.insert(
        "Equal",
        logic(|cx| cmp(cx, |a| Some(b(a[0] == a[1])), |a| bf(a[0] == a[1]))),
    );
    r.insert(
        "Less",
        logic(|cx| cmp(cx, |a| Some(b(a[0] < a[1])), |a| bf(a[0] < a[1]))),
    );
    r.insert(
        "LessOrEqual",
        logic(|cx| cmp(cx, |a| Some(b(a[0] <= a[1])), |a| bf(a[0] <= a[1]))),
    );
    r.insert(
        "Greater",
        logic(|cx| cmp(cx, |a| Some(b(a[0] > a[1])), |a| bf(a[0] > a[1]))),
    );
    r.insert(
        "GreaterOrEqual",
        logic(|cx| cmp(cx, |a| Some(b(a[0] >= a[1])), |a| bf(a[0] >= a[1]))),
    );
    r.insert(
        "And",
        logic(|cx| {
            cmp(
                cx,
                |a| Some(b(a[0] != 0 && a[1] != 0)),
                |a| bf(a[0] != 0.0 && a[1] != 0.0),
            )
        }),
    );
    r.insert(
        "Or",
        logic(|cx| {
            cmp(
                cx,
                |a| Some(b(a[0] != 0 || a[1] != 0)),
                |a| bf(a[0] != 0.0 || a[1] != 0.0),
            )
        }),
    );
    for op in ["BitwiseAnd", "BitwiseOr", "BitwiseXor", "BitShift"] {
        r.insert(op, logic(|cx| nary(cx, None, |_| None, |a| a[0])));
    }
    r.insert(
        "BitwiseNot",
        logic(|cx| {
            let x = cx.input(0)?;
            Ok(vec![Fact::new(x.dtype, x.shape.clone())])
        }),
    );
    r.insert(
        "Xor",
        logic(|cx| {
            cmp(
                cx,
                |a| Some(b((a[0] != 0) ^ (a[1] != 0))),
                |a| bf((a[0] != 0.0) ^ (a[1] != 0.0)),
            )
        }),
    );
    r.insert(
        "Where",
        OpSpec {
            infer: where_infer,
            diff_in: |_, i| i > 0,
            grad: |_, _, _| GradRule::saves(vec![Saved::Input(0)], 1.0),
            ..OpSpec::DEFAULT
        },
    );
}

/// Whether input `i` is present and computed at run time (not a constant known at import).
fn computed(cx: &Ctx, i: usize) -> bool {
    cx.opt(i).is_some_and(|f| f.value.is_none())
}

fn unary_rounding(op: &str) -> fn(&Ctx) -> Result<Vec<Fact>> {
    match op {
        "Floor" => |cx| unary_float(cx, f64::floor),
        "Ceil" => |cx| unary_float(cx, f64::ceil),
        "Round" => |cx| unary_float(cx, f64::round_ties_even),
        _ => |cx| unary_float(cx, f64::signum),
    }
}

/// Folds `Clip` when the input and its bounds are known (bounds as attributes before opset 11,
/// inputs after).
fn clip_fold(cx: &Ctx) -> Result<Option<Fact>> {
    let x = cx.input(0)?;
    let Some(v) = &x.value else { return Ok(None) };
    let (lo, hi) = if cx.opset < 11 {
        (
            f64::from(cx.attrs.float_or("min", f32::MIN)?),
            f64::from(cx.attrs.float_or("max", f32::MAX)?),
        )
    } else {
        let get = |i: usize| -> Option<Option<f64>> {
            match cx.opt(i) {
                None => Some(None),
                Some(f) => f
                    .value
                    .as_ref()
                    .and_then(|t| t.as_f64().first().copied())
                    .map(Some),
            }
        };
        match (get(1), get(2)) {
            (Some(lo), Some(hi)) => (lo.unwrap_or(f64::NEG_INFINITY), hi.unwrap_or(f64::INFINITY)),
            _ => return Ok(None),
        }
    };
    let vals: Vec<f64> = v.as_f64().into_iter().map(|x| x.max(lo).min(hi)).collect();
    Ok(Some(cx.folded(Tensor::new(
        x.dtype,
        x.shape.clone(),
        Data::F(vals),
    ))))
}
