//! Det (host LU with partial pivoting).

use super::common::{grad0, host_f64};
use crate::kernel::kbail;
use crate::kernel::{
    BwdArgs, Extras, Inputs, KResult, Kernel, KernelCtx, KernelError, KernelRegistry, Outs,
};
use candle_core::Tensor;

/// LU factorization of an `n × n` row-major matrix in place: the pivot rows, the
/// determinant's sign, and `false` when the matrix is singular.
fn lu(a: &mut [f64], n: usize) -> (Vec<usize>, f64, bool) {
    let mut piv: Vec<usize> = (0..n).collect();
    let mut sign = 1.0;
    for k in 0..n {
        let p = (k..n)
            .max_by(|&i, &j| a[i * n + k].abs().total_cmp(&a[j * n + k].abs()))
            .unwrap_or(k);
        if a[p * n + k] == 0.0 {
            return (piv, 0.0, false);
        }
        if p != k {
            for j in 0..n {
                a.swap(k * n + j, p * n + j);
            }
            piv.swap(k, p);
            sign = -sign;
        }
        for i in k + 1..n {
            let f = a[i * n + k] / a[k * n + k];
            a[i * n + k] = f;
            for j in k + 1..n {
                a[i * n + j] -= f * a[k * n + j];
            }
        }
    }
    (piv, sign, true)
}

/// The determinant of an `n × n` row-major matrix (overwritten by its LU factors).
fn det_of(m: &mut [f64], n: usize) -> f64 {
    let (_, sign, ok) = lu(m, n);
    if ok {
        sign * (0..n).map(|i| m[i * n + i]).product::<f64>()
    } else {
        0.0
    }
}

/// Matrix `b` of a batch of `n × n` matrices.
fn matrix(v: &[f64], b: usize, n: usize) -> KResult<&[f64]> {
    v.get(b * n * n..(b + 1) * n * n)
        .ok_or_else(|| KernelError::new(format!("matrix {b} is missing from the input")))
}

fn det_dims(cx: &KernelCtx) -> KResult<(usize, usize)> {
    let s = cx.in_shape(0)?;
    let r = s.len();
    if r < 2 || s[r - 1] != s[r - 2] {
        kbail!("Det needs square matrices, got {s:?}");
    }
    Ok((s[..r - 2].iter().product(), s[r - 1]))
}

fn det_fwd(cx: &KernelCtx, xs: &[Option<Tensor>], _: &Extras) -> Outs {
    let x = xs.req(0)?;
    let (batch, n) = det_dims(cx)?;
    let v = host_f64(x)?;
    let mut out = Vec::with_capacity(batch);
    for b in 0..batch {
        let mut m = matrix(&v, b, n)?.to_vec();
        out.push(det_of(&mut m, n));
    }
    Ok(vec![Some(
        Tensor::from_vec(out, cx.out_shape(0)?, cx.device)?.to_dtype(x.dtype())?,
    )])
}

/// d det / d A = det · A^-T.
fn det_bwd(cx: &KernelCtx, a: &BwdArgs) -> Outs {
    grad0(cx, a, || {
        let x = a.input(0)?;
        let (batch, n) = det_dims(cx)?;
        let v = host_f64(x)?;
        let d = host_f64(a.output(0)?)?;
        let g = host_f64(&a.grad(cx, 0)?)?;
        let mut out = vec![0.0; v.len()];
        if d.len() < batch || g.len() < batch {
            kbail!(
                "Det has {} outputs for {batch} matrices",
                d.len().min(g.len())
            );
        }
        for b in 0..batch {
            let mut m = matrix(&v, b, n)?.to_vec();
            let (piv, _, ok) = lu(&mut m, n);
            if !ok {
                // Singular: d det / d A is the cofactor matrix (no inverse to use).
                let a = matrix(&v, b, n)?;
                for i in 0..n {
                    for j in 0..n {
                        let mut minor: Vec<f64> = Vec::with_capacity((n - 1) * (n - 1));
                        for r in (0..n).filter(|&r| r != i) {
                            minor.extend((0..n).filter(|&c| c != j).map(|c| a[r * n + c]));
                        }
                        let sign = if (i + j) % 2 == 0 { 1.0 } else { -1.0 };
                        out[b * n * n + i * n + j] = g[b] * sign * det_of(&mut minor, n - 1);
                    }
                }
                continue;
            }
            let scale = g[b] * d[b];
            // Column j of A^-1 solves A x = e_j; with P A = L U.
            for j in 0..n {
                let mut col: Vec<f64> = piv.iter().map(|&p| f64::from(u8::from(p == j))).collect();
                for i in 0..n {
                    for k in 0..i {
                        col[i] -= m[i * n + k] * col[k];
                    }
                }
                for i in (0..n).rev() {
                    for k in i + 1..n {
                        col[i] -= m[i * n + k] * col[k];
                    }
                    col[i] /= m[i * n + i];
                }
                // (A^-T)[j][i] = (A^-1)[i][j] = col[i].
                for (i, &c) in col.iter().enumerate() {
                    out[b * n * n + j * n + i] = scale * c;
                }
            }
        }
        Ok(Tensor::from_vec(out, x.dims(), cx.device)?.to_dtype(x.dtype())?)
    })
}

pub fn register(r: &mut KernelRegistry) {
    r.insert("Det", Kernel::new(det_fwd, Some(det_bwd)));
}

#[cfg(test)]
mod tests {

    use crate::testing::{check, Case, In};

    #[test]
    fn det() {
        check(&Case::new("Det", 11, vec![In::Rand(vec![3, 3])]));
        check(&Case::new("Det", 11, vec![In::Rand(vec![2, 4, 4])]).tol(1e-5));
        // A singular matrix (rank 2): the gradient is the cofactor matrix.
        let sing = [1.0, 2.0, 3.0, 2.0, 4.0, 6.5, 0.5, 1.0, 1.5];
        check(&Case::new(
            "Det",
            11,
            vec![In::Floats(vec![3, 3], sing.to_vec())],
        ));
    }
}
