//! Broadcasting binary and variadic arithmetic, comparisons, logic and bitwise ops, Where.

use super::common::{b, bf, computed, logic, per_elem, spec};
use crate::error::Result;
use crate::ops::rule::{first, Ctx, GradRule, OpSpec, Registry, Saved};
use crate::tensor::{
    broadcast_index, numel, DType, Data, Fact, Tensor, FLOAT_FOLD_LIMIT, FOLD_LIMIT,
};

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
/// `Where(cond, a, b)`: broadcast of all three; folded when all are known.
fn where_infer(cx: &Ctx) -> Result<Vec<Fact>> {
    if cx.inputs.len() != 3 || cx.inputs.iter().any(|f| f.is_none()) {
        return Err(cx.err("expects three inputs: condition, X, Y"));
    }
    let cond = cx.input(0)?.dtype;
    if cond != DType::Bool {
        return Err(cx.err(format!("input condition is {cond:?}; it must be bool")));
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
fn int_pow(a: i64, e: i64) -> Option<i64> {
    u32::try_from(e).ok().and_then(|e| a.checked_pow(e))
}

pub(super) fn register(r: &mut Registry) {
    let f1: fn(&Ctx, &[Fact]) -> f64 = |_, o| per_elem(1.0)(o);
    let f4: fn(&Ctx, &[Fact]) -> f64 = |_, o| per_elem(4.0)(o);
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
        spec(
            |cx| nary(cx, None, |a| a[0].checked_add(a[1]), |a| a[0] + a[1]),
            f1,
            crate::ops::rule::nothing_saved,
        ),
    );
    r.insert(
        "Sub",
        spec(
            |cx| nary(cx, None, |a| a[0].checked_sub(a[1]), |a| a[0] - a[1]),
            f1,
            crate::ops::rule::nothing_saved,
        ),
    );
    r.insert(
        "Mul",
        spec(
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
        spec(
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
        spec(
            |cx| {
                nary(
                    cx,
                    None,
                    |a| a.iter().try_fold(0i64, |s, &x| s.checked_add(x)),
                    |a| a.iter().sum(),
                )
            },
            f1,
            crate::ops::rule::nothing_saved,
        ),
    );
    r.insert(
        "Mean",
        spec(
            |cx| {
                nary(
                    cx,
                    None,
                    |a| Some(a.iter().sum::<i64>() / a.len().max(1) as i64),
                    |a| a.iter().sum::<f64>() / a.len().max(1) as f64,
                )
            },
            f1,
            crate::ops::rule::nothing_saved,
        ),
    );

    // Comparisons and logic: boolean outputs, no gradient.
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
