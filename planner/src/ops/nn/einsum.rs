//! Einsum.

use crate::error::Result;
use crate::ops::rule::{Ctx, GradRule, OpSpec, Registry, Saved};
use crate::tensor::Fact;

/// Parsed einsum equation: letters per operand and of the output (`...` not supported).
fn einsum_parse(cx: &Ctx) -> Result<(Vec<Vec<char>>, Vec<char>)> {
    let eq = cx
        .attrs
        .string("equation")?
        .ok_or_else(|| cx.attrs.err("equation", "required attribute is missing"))?;
    let eq: String = eq.chars().filter(|c| !c.is_whitespace()).collect();
    if eq.contains("...") {
        return Err(cx
            .attrs
            .err("equation", format!("ellipsis is not supported: {eq:?}")));
    }
    let (lhs, rhs) = match eq.split_once("->") {
        Some((l, r)) => (l.to_string(), Some(r.to_string())),
        None => (eq.clone(), None),
    };
    let ins: Vec<Vec<char>> = lhs.split(',').map(|s| s.chars().collect()).collect();
    for term in ins.iter().flatten() {
        if !term.is_ascii_alphabetic() {
            return Err(cx
                .attrs
                .err("equation", format!("invalid character {term:?} in {eq:?}")));
        }
    }
    let out: Vec<char> = match rhs {
        Some(r) => r.chars().collect(),
        None => {
            let mut letters: Vec<char> = ins.iter().flatten().copied().collect();
            letters.sort_unstable();
            let mut once: Vec<char> = letters
                .iter()
                .copied()
                .filter(|c| letters.iter().filter(|d| *d == c).count() == 1)
                .collect();
            once.dedup();
            once
        }
    };
    Ok((ins, out))
}

fn einsum_dims(cx: &Ctx) -> Result<(std::collections::BTreeMap<char, u64>, Vec<char>)> {
    let (ins, out) = einsum_parse(cx)?;
    if ins.len() != cx.inputs.len() {
        return Err(cx.err(format!(
            "equation has {} operands but the node has {} inputs",
            ins.len(),
            cx.inputs.len()
        )));
    }
    let mut dims = std::collections::BTreeMap::new();
    for (i, letters) in ins.iter().enumerate() {
        let f = cx.input(i)?;
        if letters.len() != f.rank() {
            return Err(cx.err(format!(
                "operand {i} has rank {} but the equation gives it {} letters",
                f.rank(),
                letters.len()
            )));
        }
        for (&l, &d) in letters.iter().zip(&f.shape) {
            match dims.get(&l) {
                Some(&e) if e != d && e != 1 && d != 1 => {
                    return Err(cx.err(format!("letter {l:?} has sizes {e} and {d}")))
                }
                Some(&e) if e >= d => {}
                _ => {
                    dims.insert(l, d);
                }
            }
        }
    }
    Ok((dims, out))
}

fn einsum_infer(cx: &Ctx) -> Result<Vec<Fact>> {
    let (dims, out) = einsum_dims(cx)?;
    let shape = out
        .iter()
        .map(|l| {
            dims.get(l)
                .copied()
                .ok_or_else(|| cx.err(format!("output letter {l:?} appears in no operand")))
        })
        .collect::<Result<Vec<u64>>>()?;
    Ok(vec![cx.fact(cx.input(0)?.dtype, shape)?])
}

fn einsum_flops(cx: &Ctx, _: &[Fact]) -> f64 {
    einsum_dims(cx)
        .map(|(d, _)| 2.0 * d.values().map(|&x| x as f64).product::<f64>())
        .unwrap_or(0.0)
}

pub(super) fn register(r: &mut Registry) {
    r.insert(
        "Einsum",
        OpSpec {
            infer: einsum_infer,
            flops: einsum_flops,
            grad: |cx, _, _| GradRule::saves((0..cx.inputs.len()).map(Saved::Input).collect(), 2.0),
            ..OpSpec::DEFAULT
        },
    );
}
