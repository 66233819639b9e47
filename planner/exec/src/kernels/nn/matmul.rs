//! MatMul and Gemm.

use crate::kernel::{BwdArgs, Extras, Inputs, KResult, Kernel, KernelCtx, KernelRegistry};
use crate::kernels::common::sum_to;
use candle_core::Tensor;

// ---------------------------------------------------------------------------------------------
// MatMul, Gemm

/// Operands of a MatMul with 1-D operands made 2-D.
fn mm_operands(a: &Tensor, b: &Tensor) -> KResult<(Tensor, Tensor)> {
    let a2 = if a.rank() == 1 {
        a.unsqueeze(0)?
    } else {
        a.clone()
    };
    let b2 = if b.rank() == 1 {
        b.unsqueeze(1)?
    } else {
        b.clone()
    };
    Ok((a2, b2))
}

fn matmul_fwd(cx: &KernelCtx, xs: &[Option<Tensor>], _: &Extras) -> KResult<Vec<Option<Tensor>>> {
    let (a, b) = mm_operands(xs.req(0)?, xs.req(1)?)?;
    let y = if a.rank() == 2 && b.rank() == 2 {
        a.matmul(&b)?
    } else {
        a.broadcast_matmul(&b)?
    };
    Ok(vec![Some(y.reshape(cx.out_shape(0)?)?)])
}

fn matmul_bwd(cx: &KernelCtx, a: &BwdArgs) -> KResult<Vec<Option<Tensor>>> {
    let sa = cx.in_shape(0)?;
    let sb = cx.in_shape(1)?;
    let a2s: Vec<usize> = if sa.len() == 1 {
        vec![1, sa[0]]
    } else {
        sa.clone()
    };
    let b2s: Vec<usize> = if sb.len() == 1 {
        vec![sb[0], 1]
    } else {
        sb.clone()
    };
    // dY with the squeezed unit dims put back: batch..., m, n.
    let g = a.grad(cx, 0)?;
    let ys = g.dims().to_vec();
    let mut g2s = ys.clone();
    if sa.len() == 1 {
        g2s.insert(g2s.len() - usize::from(sb.len() != 1), 1);
    }
    if sb.len() == 1 {
        g2s.push(1);
    }
    let g2 = g.reshape(g2s)?;
    let mut out = vec![None, None];
    if b2s.len() == 2 {
        // A 2-D right operand (a linear layer's weight): the left operand's batch dims fold
        // into its rows, so both gradients are single products. Through the broadcast, `dB`
        // would be a product per batch entry summed afterwards, which holds the batch's
        // copies of `dB` at once (a [100, 1, 128] · [128, 384] projection: 19.7 MB for a
        // 197 kB gradient).
        let (k, n) = (b2s[0], b2s[1]);
        let rows = g2.elem_count() / n.max(1);
        let g_flat = g2.reshape((rows, n))?;
        if a.need(0) {
            let b = a.input(1)?.reshape(b2s.clone())?;
            out[0] = Some(g_flat.matmul(&b.t()?)?.reshape(sa.clone())?);
        }
        if a.need(1) {
            let x = a.input(0)?.reshape((rows, k))?;
            out[1] = Some(x.t()?.matmul(&g_flat)?.reshape(sb.clone())?);
        }
        return Ok(out);
    }
    if a.need(0) {
        let b = a.input(1)?.reshape(b2s.clone())?;
        let da = g2.broadcast_matmul(&b.t()?)?;
        out[0] = Some(sum_to(&da, &a2s)?.reshape(sa.clone())?);
    }
    if a.need(1) {
        let x = a.input(0)?.reshape(a2s.clone())?;
        let db = x.t()?.broadcast_matmul(&g2)?;
        out[1] = Some(sum_to(&db, &b2s)?.reshape(sb.clone())?);
    }
    Ok(out)
}

struct GemmAttrs {
    alpha: f64,
    beta: f64,
    ta: bool,
    tb: bool,
}

fn gemm_attrs(cx: &KernelCtx) -> KResult<GemmAttrs> {
    Ok(GemmAttrs {
        alpha: cx.attrs.float_or("alpha", 1.0)? as f64,
        beta: cx.attrs.float_or("beta", 1.0)? as f64,
        ta: cx.attrs.int_or("transA", 0)? != 0,
        tb: cx.attrs.int_or("transB", 0)? != 0,
    })
}

fn tr(t: &Tensor, yes: bool) -> KResult<Tensor> {
    if yes {
        Ok(t.t()?)
    } else {
        Ok(t.clone())
    }
}

fn gemm_fwd(cx: &KernelCtx, xs: &[Option<Tensor>], _: &Extras) -> KResult<Vec<Option<Tensor>>> {
    let p = gemm_attrs(cx)?;
    let a = tr(xs.req(0)?, p.ta)?;
    let b = tr(xs.req(1)?, p.tb)?;
    let mut y = a.matmul(&b)?;
    if p.alpha != 1.0 {
        y = y.affine(p.alpha, 0.0)?;
    }
    if let Some(c) = xs.opt(2) {
        let c = if p.beta != 1.0 {
            c.affine(p.beta, 0.0)?
        } else {
            c.clone()
        };
        y = y.broadcast_add(&c)?;
    }
    Ok(vec![Some(y)])
}

fn gemm_bwd(cx: &KernelCtx, a: &BwdArgs) -> KResult<Vec<Option<Tensor>>> {
    let p = gemm_attrs(cx)?;
    let g = a.grad(cx, 0)?;
    let g = if p.alpha != 1.0 {
        g.affine(p.alpha, 0.0)?
    } else {
        g
    };
    // Each gradient is computed in its input's stored layout (`Aᵀ` or `Bᵀ` when transposed):
    // a product into the other layout and a transposing copy would hold the gradient twice
    // (VGG's classifier weight: docs/bench/executor.md, "Figures behind the code").
    let mut out = vec![None; a.inputs.len()];
    if a.need(0) {
        let b = tr(a.input(1)?, p.tb)?;
        // dA' = g Bᵀ, where A' = op(A).
        let da = if p.ta {
            b.matmul(&g.t()?)?
        } else {
            g.matmul(&b.t()?)?
        };
        out[0] = Some(da.contiguous()?);
    }
    if a.need(1) {
        let x = tr(a.input(0)?, p.ta)?;
        // dB' = A'ᵀ g, where B' = op(B).
        let db = if p.tb {
            g.t()?.matmul(&x)?
        } else {
            x.t()?.matmul(&g)?
        };
        out[1] = Some(db.contiguous()?);
    }
    if a.need(2) {
        let g0 = a.grad(cx, 0)?;
        let dc = sum_to(&g0, &cx.in_shape(2)?)?;
        out[2] = Some(if p.beta != 1.0 {
            dc.affine(p.beta, 0.0)?
        } else {
            dc
        });
    }
    Ok(out)
}

pub(super) fn register(r: &mut KernelRegistry) {
    r.insert("MatMul", Kernel::new(matmul_fwd, Some(matmul_bwd)));
    r.insert("Gemm", Kernel::new(gemm_fwd, Some(gemm_bwd)));
}

#[cfg(test)]
mod tests {
    use crate::testing::{check, float, int, Case};
    use crate::testing::{p, r};

    #[test]
    fn gemm() {
        for (ta, tb) in [(0, 0), (0, 1), (1, 0), (1, 1)] {
            let a = if ta == 1 { r(&[4, 3]) } else { r(&[3, 4]) };
            let b = if tb == 1 { r(&[5, 4]) } else { r(&[4, 5]) };
            check(
                &Case::new("Gemm", 13, vec![a, b, r(&[5])])
                    .attr(int("transA", ta))
                    .attr(int("transB", tb))
                    .attr(float("alpha", 0.5))
                    .attr(float("beta", 2.0)),
            );
        }
        check(&Case::new(
            "Gemm",
            13,
            vec![r(&[3, 4]), p(&[4, 5]), r(&[3, 1])],
        ));
        check(&Case::new(
            "Gemm",
            13,
            vec![r(&[3, 4]), p(&[4, 5]), r(&[3, 5])],
        ));
        check(&Case::new("Gemm", 13, vec![r(&[3, 4]), p(&[5, 4])]).attr(int("transB", 1)));
        check(
            &Case::new("Gemm", 13, vec![r(&[3, 4]), p(&[4, 5]), r(&[])]).attr(float("beta", 0.5)),
        );
    }

    #[test]
    fn matmul() {
        check(&Case::new("MatMul", 13, vec![r(&[3, 4]), r(&[4, 5])]));
        check(&Case::new("MatMul", 13, vec![r(&[2, 3, 4]), p(&[4, 5])]));
        check(&Case::new(
            "MatMul",
            13,
            vec![r(&[2, 1, 3, 4]), r(&[3, 4, 2])],
        ));
        check(&Case::new("MatMul", 13, vec![r(&[4]), r(&[2, 4, 3])]));
        check(&Case::new("MatMul", 13, vec![r(&[2, 3, 4]), r(&[4])]));
        check(&Case::new("MatMul", 13, vec![r(&[4]), r(&[4])]));
        // A 2-D right operand under batch dims with single rows (the (T, B, E) projections
        // of a sequence-first attention), and under a 1-D left operand.
        check(&Case::new("MatMul", 13, vec![r(&[5, 1, 3]), p(&[3, 4])]));
        check(&Case::new("MatMul", 13, vec![r(&[4]), p(&[4, 3])]));
    }
}
