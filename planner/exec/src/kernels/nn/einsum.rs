//! Einsum.

use crate::kernel::kbail;
use crate::kernel::{
    BwdArgs, Extras, Inputs, KResult, Kernel, KernelCtx, KernelError, KernelRegistry,
};
use crate::kernels::common::sum_to;
use candle_core::Tensor;

// ---------------------------------------------------------------------------------------------
// Einsum (any number of operands, contracted pairwise from the left; no ellipsis, no repeated
// letter within a term)

struct Equation {
    text: String,
    ins: Vec<Vec<char>>,
    out: Vec<char>,
}

fn einsum_eq(cx: &KernelCtx) -> KResult<Equation> {
    let eq = cx
        .attrs
        .string("equation")?
        .ok_or_else(|| KernelError::new("attribute \"equation\" is required but missing"))?;
    let text: String = eq.chars().filter(|c| !c.is_whitespace()).collect();
    let unsupported = |why: &str| -> KernelError {
        KernelError::new(format!(
            "attribute \"equation\" = {text:?} is not supported: {why}"
        ))
    };
    if text.contains("...") {
        return Err(unsupported("ellipsis"));
    }
    let (lhs, rhs) = match text.split_once("->") {
        Some((l, r)) => (l.to_string(), Some(r.to_string())),
        None => (text.clone(), None),
    };
    let ins: Vec<Vec<char>> = lhs.split(',').map(|s| s.chars().collect()).collect();
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
    for term in ins.iter().chain(std::iter::once(&out)) {
        for (i, c) in term.iter().enumerate() {
            if !c.is_ascii_alphabetic() {
                return Err(unsupported("invalid character"));
            }
            if term[..i].contains(c) {
                return Err(unsupported("a letter repeated within one term (diagonal)"));
            }
        }
    }
    for c in &out {
        if !ins.iter().any(|t| t.contains(c)) {
            return Err(unsupported("an output letter appears in no operand"));
        }
    }
    Ok(Equation { text, ins, out })
}

fn letter_pos(term: &[char], l: char) -> KResult<usize> {
    term.iter()
        .position(|&c| c == l)
        .ok_or_else(|| KernelError::new(format!("letter {l:?} is not in {term:?}")))
}

/// Sums out the dims of `t` whose letter is not in `keep`.
fn sum_letters(
    t: &Tensor,
    tl: &[char],
    keep: impl Fn(char) -> bool,
) -> KResult<(Tensor, Vec<char>)> {
    let dims: Vec<usize> = (0..tl.len()).filter(|&i| !keep(tl[i])).collect();
    let rest: Vec<char> = tl.iter().copied().filter(|&c| keep(c)).collect();
    if dims.is_empty() {
        return Ok((t.clone(), rest));
    }
    Ok((t.sum(dims)?, rest))
}

/// Permutes `t` (letters `tl`) to the order `to` (a permutation of `tl`).
fn permute_letters(t: &Tensor, tl: &[char], to: &[char]) -> KResult<Tensor> {
    if tl == to {
        return Ok(t.clone());
    }
    let perm = to
        .iter()
        .map(|&l| letter_pos(tl, l))
        .collect::<KResult<Vec<usize>>>()?;
    Ok(t.permute(perm)?)
}

/// `einsum(a, b -> out)` for letters without repeats; sizes must agree.
fn ein2(a: &Tensor, al: &[char], b: &Tensor, bl: &[char], out: &[char]) -> KResult<Tensor> {
    let (a, al) = sum_letters(a, al, |c| out.contains(&c) || bl.contains(&c))?;
    let (b, bl) = sum_letters(b, bl, |c| out.contains(&c) || al.contains(&c))?;
    let batch: Vec<char> = out
        .iter()
        .copied()
        .filter(|c| al.contains(c) && bl.contains(c))
        .collect();
    let ak: Vec<char> = out
        .iter()
        .copied()
        .filter(|c| al.contains(c) && !bl.contains(c))
        .collect();
    let bk: Vec<char> = out
        .iter()
        .copied()
        .filter(|c| bl.contains(c) && !al.contains(c))
        .collect();
    let con: Vec<char> = al
        .iter()
        .copied()
        .filter(|c| bl.contains(c) && !out.contains(c))
        .collect();
    let size = |t: &Tensor, tl: &[char], ls: &[char]| -> KResult<Vec<usize>> {
        ls.iter()
            .map(|&l| Ok(t.dims()[letter_pos(tl, l)?]))
            .collect()
    };
    let bs = size(&a, &al, &batch)?;
    let ms = size(&a, &al, &ak)?;
    let ns = size(&b, &bl, &bk)?;
    let ks = size(&a, &al, &con)?;
    let kb = size(&b, &bl, &con)?;
    let bb = size(&b, &bl, &batch)?;
    if ks != kb || bs != bb {
        kbail!("operand sizes disagree on shared letters");
    }
    let p = |v: &[usize]| v.iter().product::<usize>();
    let ao: Vec<char> = [batch.clone(), ak.clone(), con.clone()].concat();
    let bo: Vec<char> = [batch.clone(), con.clone(), bk.clone()].concat();
    let a3 = permute_letters(&a, &al, &ao)?
        .contiguous()?
        .reshape((p(&bs), p(&ms), p(&ks)))?;
    let b3 = permute_letters(&b, &bl, &bo)?
        .contiguous()?
        .reshape((p(&bs), p(&ks), p(&ns)))?;
    let c = a3.matmul(&b3)?;
    let cl: Vec<char> = [batch, ak, bk].concat();
    let cs: Vec<usize> = [bs, ms, ns].concat();
    let c = c.reshape(cs)?;
    Ok(permute_letters(&c, &cl, out)?.contiguous()?)
}

/// `einsum(a -> out)`.
fn ein1(a: &Tensor, al: &[char], out: &[char]) -> KResult<Tensor> {
    let (a, al) = sum_letters(a, al, |c| out.contains(&c))?;
    Ok(permute_letters(&a, &al, out)?.contiguous()?)
}

/// `g` (letters `gl`, a subset of `tl`) broadcast to `shape` (letters `tl`).
fn ein_expand(g: &Tensor, gl: &[char], tl: &[char], shape: &[usize]) -> KResult<Tensor> {
    let present: Vec<char> = tl.iter().copied().filter(|c| gl.contains(c)).collect();
    let g = permute_letters(g, gl, &present)?;
    let view: Vec<usize> = tl
        .iter()
        .zip(shape)
        .map(|(c, &d)| if gl.contains(c) { d } else { 1 })
        .collect();
    Ok(g.contiguous()?
        .reshape(view)?
        .broadcast_as(shape)?
        .contiguous()?)
}

/// Letter sizes over all operands (the largest, for size-1 broadcasting).
fn letter_sizes(eq: &Equation, xs: &[&Tensor]) -> KResult<std::collections::HashMap<char, usize>> {
    let mut m = std::collections::HashMap::new();
    for (t, tl) in xs.iter().zip(&eq.ins) {
        if t.rank() != tl.len() {
            kbail!(
                "operand of rank {} for term {:?} in {:?}",
                t.rank(),
                tl.iter().collect::<String>(),
                eq.text
            );
        }
        for (&l, &d) in tl.iter().zip(t.dims()) {
            let e = m.entry(l).or_insert(d);
            if *e != d && *e != 1 && d != 1 {
                kbail!("letter {l:?} has sizes {e} and {d} in {:?}", eq.text);
            }
            *e = (*e).max(d);
        }
    }
    Ok(m)
}

fn expand_to_letters(
    t: &Tensor,
    tl: &[char],
    sizes: &std::collections::HashMap<char, usize>,
) -> KResult<Tensor> {
    let shape: Vec<usize> = tl
        .iter()
        .map(|c| sizes.get(c).copied().unwrap_or(1))
        .collect();
    if t.dims() == shape.as_slice() {
        Ok(t.clone())
    } else {
        Ok(t.broadcast_as(shape)?.contiguous()?)
    }
}

/// `einsum(ops -> out)` by pairwise products from the left; each intermediate keeps the
/// letters that the output or a later operand needs.
fn einn(ops: &[(Tensor, Vec<char>)], out: &[char]) -> KResult<Tensor> {
    let Some((first, rest)) = ops.split_first() else {
        kbail!("einsum without operands");
    };
    let (mut acc, mut al) = (first.0.clone(), first.1.clone());
    for (j, (t, tl)) in rest.iter().enumerate() {
        let later = &rest[j + 1..];
        let mut keep: Vec<char> = vec![];
        for &c in al.iter().chain(tl.iter()) {
            let needed = out.contains(&c) || later.iter().any(|(_, l)| l.contains(&c));
            if needed && !keep.contains(&c) {
                keep.push(c);
            }
        }
        acc = ein2(&acc, &al, t, tl, &keep)?;
        al = keep;
    }
    ein1(&acc, &al, out)
}

/// The operands broadcast to the letter sizes, with their letters.
fn einsum_operands(eq: &Equation, ops: &[&Tensor]) -> KResult<Vec<(Tensor, Vec<char>)>> {
    let sizes = letter_sizes(eq, ops)?;
    ops.iter()
        .zip(&eq.ins)
        .map(|(t, tl)| Ok((expand_to_letters(t, tl, &sizes)?, tl.clone())))
        .collect()
}

fn einsum_fwd(cx: &KernelCtx, xs: &[Option<Tensor>], _: &Extras) -> KResult<Vec<Option<Tensor>>> {
    let eq = einsum_eq(cx)?;
    let ops = (0..eq.ins.len())
        .map(|i| xs.req(i))
        .collect::<KResult<Vec<&Tensor>>>()?;
    let full = einsum_operands(&eq, &ops)?;
    Ok(vec![Some(einn(&full, &eq.out)?)])
}

fn einsum_bwd(cx: &KernelCtx, a: &BwdArgs) -> KResult<Vec<Option<Tensor>>> {
    let eq = einsum_eq(cx)?;
    let g = a.grad(cx, 0)?;
    let mut out = vec![None; a.inputs.len()];
    let n = eq.ins.len();
    if !(0..n).any(|i| a.need(i)) {
        return Ok(out);
    }
    let ops = (0..n)
        .map(|i| a.input(i))
        .collect::<KResult<Vec<&Tensor>>>()?;
    let full = einsum_operands(&eq, &ops)?;
    for i in 0..n {
        if !a.need(i) {
            continue;
        }
        // d/d operand i = einsum(dY, the other operands -> operand i's letters), broadcast
        // over the letters only operand i has (summed out in the forward).
        let mut others = vec![(g.clone(), eq.out.clone())];
        others.extend(
            full.iter()
                .enumerate()
                .filter(|(j, _)| *j != i)
                .map(|(_, o)| o.clone()),
        );
        let tl = &eq.ins[i];
        let kept: Vec<char> = tl
            .iter()
            .copied()
            .filter(|c| others.iter().any(|(_, l)| l.contains(c)))
            .collect();
        let d = einn(&others, &kept)?;
        let d = ein_expand(&d, &kept, tl, full[i].0.dims())?;
        out[i] = Some(sum_to(&d, &cx.in_shape(i)?)?);
    }
    Ok(out)
}

pub(super) fn register(r: &mut KernelRegistry) {
    r.insert("Einsum", Kernel::new(einsum_fwd, Some(einsum_bwd)));
}

#[cfg(test)]
mod tests {
    use crate::testing::r;
    use crate::testing::{check, string, Case};

    #[test]
    fn einsum() {
        let eq = |e: &str| string("equation", e);
        check(&Case::new("Einsum", 12, vec![r(&[3, 4]), r(&[4, 5])]).attr(eq("ij,jk->ik")));
        check(
            &Case::new("Einsum", 12, vec![r(&[2, 3, 4]), r(&[2, 4, 5])]).attr(eq("bij,bjk->bik")),
        );
        check(
            &Case::new("Einsum", 12, vec![r(&[2, 2, 3, 4]), r(&[2, 2, 5, 4])])
                .attr(eq("bhqd,bhkd->bhqk")),
        );
        check(&Case::new("Einsum", 12, vec![r(&[3, 4])]).attr(eq("ij->ji")));
        check(&Case::new("Einsum", 12, vec![r(&[3, 4])]).attr(eq("ij->i")));
        check(&Case::new("Einsum", 12, vec![r(&[3]), r(&[4])]).attr(eq("i,j->ij")));
        check(&Case::new("Einsum", 12, vec![r(&[3, 4]), r(&[3, 4])]).attr(eq("ij,ij->")));
        check(&Case::new("Einsum", 12, vec![r(&[3, 4]), r(&[4, 2])]).attr(eq("ij,jk")));
        check(&Case::new("Einsum", 12, vec![r(&[2, 3, 4]), r(&[4, 5])]).attr(eq("bij,jk->bki")));
        check(&Case::new("Einsum", 12, vec![r(&[3, 4, 2]), r(&[4])]).attr(eq("ijk,j->ik")));
        check(
            &Case::new("Einsum", 12, vec![r(&[2, 3]), r(&[3, 4]), r(&[4, 2])])
                .attr(eq("ij,jk,kl->il")),
        );
        check(&Case::new("Einsum", 12, vec![r(&[3]), r(&[3]), r(&[2, 3])]).attr(eq("i,i,ji->j")));
        // Size-1 broadcasting of a shared letter.
        check(
            &Case::new("Einsum", 12, vec![r(&[1, 3, 4]), r(&[2, 4, 5])]).attr(eq("bij,bjk->bik")),
        );
    }

    #[test]
    fn einsum_unsupported_equation_is_a_clear_error() {
        use crate::testing::check_on;
        use candle_core::Device;
        let e = check_on(
            &Case::new("Einsum", 12, vec![r(&[3, 3])]).attr(string("equation", "ii->i")),
            &Device::Cpu,
        );
        match e {
            Err(e) => assert!(e.0.contains("ii->i"), "{e}"),
            Ok(()) => panic!("a diagonal equation must be refused"),
        }
    }
}
