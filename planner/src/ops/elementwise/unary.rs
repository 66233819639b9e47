//! Unary activations and math, Clip, and the boolean-valued unary ops.

use super::common::{bf, computed, logic, per_elem, spec};
use crate::error::Result;
use crate::ops::rule::{first, none, save_x, save_y, Ctx, GradRule, OpSpec, Registry, Saved};
use crate::tensor::{DType, Data, Fact, Tensor};

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
    for (i, name) in [(1, "min"), (2, "max")] {
        if let Some(b) = cx.opt(i).filter(|b| b.numel() != 1) {
            return Err(cx.err(format!(
                "input {name} has shape {:?}; it must be a scalar",
                b.shape
            )));
        }
    }
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

pub(super) fn register(r: &mut Registry) {
    let f1: fn(&Ctx, &[Fact]) -> f64 = |_, o| per_elem(1.0)(o);
    let f4: fn(&Ctx, &[Fact]) -> f64 = |_, o| per_elem(4.0)(o);
    let f8: fn(&Ctx, &[Fact]) -> f64 = |_, o| per_elem(8.0)(o);

    // Activations: the saved value follows PyTorch's autograd (derivatives.yaml).
    r.insert(
        "Relu",
        spec(|cx| unary_float(cx, |x| x.max(0.0)), f1, save_y),
    );
    r.insert("LeakyRelu", spec(unary_shape, f1, save_x));
    r.insert(
        "Sigmoid",
        spec(
            |cx| unary_float(cx, |x| 1.0 / (1.0 + (-x).exp())),
            f4,
            save_y,
        ),
    );
    r.insert("Tanh", spec(|cx| unary_float(cx, f64::tanh), f4, save_y));
    r.insert("Erf", spec(unary_shape, f8, save_x));
    r.insert("Gelu", spec(unary_shape, f8, save_x));
    r.insert("HardSigmoid", spec(unary_shape, f1, save_x));
    r.insert("HardSwish", spec(unary_shape, f1, save_x));
    r.insert("Softplus", spec(unary_shape, f4, save_x));
    r.insert("Softsign", spec(unary_shape, f4, save_x));
    r.insert("Elu", spec(unary_shape, f4, save_x));
    r.insert("Selu", spec(unary_shape, f4, save_x));
    r.insert("Celu", spec(unary_shape, f4, save_x));
    r.insert("Mish", spec(unary_shape, f8, save_x));
    // Swish (opset 24; also what the SiLU fusion produces): x·sigmoid(αx), saves x.
    r.insert(
        "Swish",
        spec(|cx| unary_float(cx, |x| x / (1.0 + (-x).exp())), f4, save_x),
    );
    r.insert("ThresholdedRelu", spec(unary_shape, f1, save_x));
    r.insert("Sqrt", spec(|cx| unary_float(cx, f64::sqrt), f1, save_y));
    r.insert("Exp", spec(|cx| unary_float(cx, f64::exp), f4, save_y));
    r.insert("Log", spec(|cx| unary_float(cx, f64::ln), f4, save_x));
    r.insert(
        "Reciprocal",
        spec(|cx| unary_float(cx, |x| 1.0 / x), f1, save_y),
    );
    r.insert("Sin", spec(|cx| unary_float(cx, f64::sin), f4, save_x));
    r.insert("Cos", spec(|cx| unary_float(cx, f64::cos), f4, save_x));
    r.insert("Tan", spec(|cx| unary_float(cx, f64::tan), f4, save_y));
    r.insert("Atan", spec(|cx| unary_float(cx, f64::atan), f4, save_x));
    r.insert("Asin", spec(|cx| unary_float(cx, f64::asin), f4, save_x));
    r.insert("Acos", spec(|cx| unary_float(cx, f64::acos), f4, save_x));
    r.insert("Sinh", spec(|cx| unary_float(cx, f64::sinh), f4, save_x));
    r.insert("Cosh", spec(|cx| unary_float(cx, f64::cosh), f4, save_x));
    r.insert("Asinh", spec(|cx| unary_float(cx, f64::asinh), f4, save_x));
    r.insert("Acosh", spec(|cx| unary_float(cx, f64::acosh), f4, save_x));
    r.insert("Atanh", spec(|cx| unary_float(cx, f64::atanh), f4, save_x));
    // dX = dY·[|X| > lambd] needs X (PyTorch's hard/softshrink save self).
    r.insert("Shrink", spec(unary_shape, f1, save_x));
    r.insert(
        "Neg",
        spec(
            |cx| unary_float(cx, |x| -x),
            f1,
            crate::ops::rule::nothing_saved,
        ),
    );
    r.insert("Abs", spec(|cx| unary_float(cx, f64::abs), f1, save_x));
    // Piecewise constant: zero gradient, nothing saved.
    for op in ["Floor", "Ceil", "Round", "Sign"] {
        r.insert(
            op,
            spec(unary_rounding(op), f1, crate::ops::rule::nothing_saved),
        );
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
        "BitwiseNot",
        logic(|cx| {
            let x = cx.input(0)?;
            Ok(vec![Fact::new(x.dtype, x.shape.clone())])
        }),
    );
}
