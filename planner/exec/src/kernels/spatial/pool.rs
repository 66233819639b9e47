//! LpPool, GlobalLpPool, MaxUnpool.

use crate::kernel::kbail;
use crate::kernel::{BwdArgs, Extras, Inputs, KResult, Kernel, KernelCtx, KernelRegistry};
use crate::kernels::common::{grads_out, set};
use crate::kernels::window::pool_win;
use candle_core::{DType, Tensor};

// LpPool, GlobalLpPool

fn lp_p(cx: &KernelCtx) -> KResult<f64> {
    let p = cx.attrs.int_or("p", 2)?;
    if p < 1 {
        kbail!("attribute \"p\" = {p} is not supported");
    }
    Ok(p as f64)
}

/// `|x|^p`.
fn abs_pow(x: &Tensor, p: f64) -> KResult<Tensor> {
    Ok(if p == 1.0 {
        x.abs()?
    } else if p == 2.0 {
        x.sqr()?
    } else {
        x.abs()?.powf(p)?
    })
}

/// `d|x|^p / dx / p = |x|^(p-1)·sign(x)`.
fn abs_pow_deriv(x: &Tensor, p: f64) -> KResult<Tensor> {
    Ok(if p == 1.0 {
        x.sign()?
    } else if p == 2.0 {
        x.clone()
    } else {
        (x.abs()?.powf(p - 1.0)? * x.sign()?)?
    })
}

/// `y^(1-p)`, zero where `y` is zero (an all-zero window has a zero gradient).
fn inv_pow(y: &Tensor, p: f64) -> KResult<Tensor> {
    if p == 1.0 {
        return Ok(y.ones_like()?);
    }
    let z = y.eq(0.0)?;
    let safe = z.where_cond(&y.ones_like()?, y)?;
    let v = safe.powf(1.0 - p)?;
    Ok(z.where_cond(&y.zeros_like()?, &v)?)
}

fn lp_root(s: &Tensor, p: f64) -> KResult<Tensor> {
    Ok(if p == 1.0 {
        s.clone()
    } else if p == 2.0 {
        s.sqrt()?
    } else {
        s.powf(1.0 / p)?
    })
}

fn lp_pool_forward(
    cx: &KernelCtx,
    xs: &[Option<Tensor>],
    _: &Extras,
) -> KResult<Vec<Option<Tensor>>> {
    let x = xs.named(0, "X")?;
    let p = lp_p(cx)?;
    let w = pool_win(cx)?;
    let (n, c) = (x.dim(0)?, x.dim(1)?);
    let idx = w.index(false, cx.device)?;
    let k: usize = w.kernel.iter().product();
    let o: usize = w.out_dims.iter().product();
    let s = w
        .pad_flat(&abs_pow(x, p)?)?
        .index_select(&idx, 2)?
        .reshape((n, c, o, k))?
        .sum(3)?;
    let mut shape = vec![n, c];
    shape.extend(&w.out_dims);
    Ok(vec![Some(lp_root(&s, p)?.reshape(shape)?)])
}

fn lp_pool_backward(cx: &KernelCtx, g: &BwdArgs) -> KResult<Vec<Option<Tensor>>> {
    let mut out = grads_out(cx);
    if !g.need(0) {
        return Ok(out);
    }
    let x = g.input(0)?;
    let y = g.output(0)?;
    let p = lp_p(cx)?;
    let w = pool_win(cx)?;
    let (n, c) = (x.dim(0)?, x.dim(1)?);
    let idx = w.index(false, cx.device)?;
    let k: usize = w.kernel.iter().product();
    let o: usize = w.out_dims.iter().product();
    let dy = (g.grad(cx, 0)? * inv_pow(y, p)?)?
        .reshape((n, c, o, 1))?
        .broadcast_as((n, c, o, k))?
        .reshape((n, c, o * k))?;
    let total: usize = w.padded().iter().product();
    let acc = Tensor::zeros((n, c, total), x.dtype(), cx.device)?.index_add(&idx, &dy, 2)?;
    let dx = (w.unpad(&acc)? * abs_pow_deriv(x, p)?)?;
    set(&mut out, 0, dx);
    Ok(out)
}

fn global_lp_forward(
    cx: &KernelCtx,
    xs: &[Option<Tensor>],
    _: &Extras,
) -> KResult<Vec<Option<Tensor>>> {
    let x = xs.named(0, "X")?;
    let p = lp_p(cx)?;
    let axes: Vec<usize> = (2..x.rank()).collect();
    let s = abs_pow(x, p)?.sum_keepdim(axes)?;
    Ok(vec![Some(lp_root(&s, p)?)])
}

fn global_lp_backward(cx: &KernelCtx, g: &BwdArgs) -> KResult<Vec<Option<Tensor>>> {
    let mut out = grads_out(cx);
    if !g.need(0) {
        return Ok(out);
    }
    let x = g.input(0)?;
    let p = lp_p(cx)?;
    let coef = (g.grad(cx, 0)? * inv_pow(g.output(0)?, p)?)?;
    set(&mut out, 0, abs_pow_deriv(x, p)?.broadcast_mul(&coef)?);
    Ok(out)
}

// ---------------------------------------------------------------------------------------
// MaxUnpool

/// The indices flattened as i64, checked against `numel` positions.
fn unpool_index(i: &Tensor, numel: usize) -> KResult<Tensor> {
    let idx = i.to_dtype(DType::I64)?.flatten_all()?;
    if idx.elem_count() > 0 {
        let lo = idx.min_all()?.to_scalar::<i64>()?;
        let hi = idx.max_all()?.to_scalar::<i64>()?;
        if lo < 0 || hi as usize >= numel {
            kbail!("indices in [{lo}, {hi}] fall outside the output's {numel} elements");
        }
    }
    Ok(idx)
}

fn max_unpool_forward(
    cx: &KernelCtx,
    xs: &[Option<Tensor>],
    _: &Extras,
) -> KResult<Vec<Option<Tensor>>> {
    let x = xs.named(0, "X")?;
    let shape = cx.out_shape(0)?;
    let numel: usize = shape.iter().product();
    let idx = unpool_index(xs.named(1, "I")?, numel)?;
    let y = Tensor::zeros(numel, x.dtype(), cx.device)?
        .scatter(&idx, &x.flatten_all()?, 0)?
        .reshape(shape)?;
    Ok(vec![Some(y)])
}

fn max_unpool_backward(cx: &KernelCtx, g: &BwdArgs) -> KResult<Vec<Option<Tensor>>> {
    let mut out = grads_out(cx);
    if !g.need(0) {
        return Ok(out);
    }
    let dy = g.grad(cx, 0)?.flatten_all()?;
    let idx = unpool_index(g.input(1)?, dy.elem_count())?;
    let dx = dy.gather(&idx, 0)?.reshape(cx.in_shape(0)?)?;
    set(&mut out, 0, dx);
    Ok(out)
}

pub(super) fn register(r: &mut KernelRegistry) {
    r.insert(
        "LpPool",
        Kernel::new(lp_pool_forward, Some(lp_pool_backward)),
    );
    r.insert(
        "GlobalLpPool",
        Kernel::new(global_lp_forward, Some(global_lp_backward)),
    );
    r.insert(
        "MaxUnpool",
        Kernel::new(max_unpool_forward, Some(max_unpool_backward)),
    );
}

#[cfg(test)]
mod tests {
    use crate::testing::tensors::{close, forward, t, vals};
    use crate::testing::{check, int, ints, string, Case, In};
    use candle_core::{Device, Tensor};
    use remat_planner::tensor::DType;

    #[test]
    fn lp_pool_2d_pads_strides_and_1d_dilated_ceil() {
        check(
            &Case::new("LpPool", 18, vec![In::Rand(vec![1, 2, 5, 6])])
                .attr(ints("kernel_shape", &[2, 2]))
                .attr(ints("strides", &[1, 2]))
                .attr(ints("pads", &[1, 0, 0, 1])),
        );
        check(
            &Case::new("LpPool", 18, vec![In::Rand(vec![2, 1, 8])])
                .attr(int("p", 3))
                .attr(ints("kernel_shape", &[2]))
                .attr(ints("strides", &[2]))
                .attr(ints("dilations", &[2]))
                .attr(int("ceil_mode", 1)),
        );
        check(
            &Case::new("LpPool", 11, vec![In::Rand(vec![1, 1, 5, 5])])
                .attr(int("p", 1))
                .attr(ints("kernel_shape", &[3, 2]))
                .attr(ints("strides", &[2, 2]))
                .attr(string("auto_pad", "SAME_UPPER")),
        );
    }

    #[test]
    fn lp_pool_value() {
        let x: Vec<f64> = (0..6).map(|i| i as f64 - 2.0).collect();
        let y = forward(
            "LpPool",
            18,
            &[ints("kernel_shape", &[2]), ints("strides", &[2])],
            &[Some(t(&x, &[1, 1, 6]))],
            &[],
            1,
        )
        .unwrap();
        close(
            &vals(&y[0]),
            &[(4.0f64 + 1.0).sqrt(), 1.0, (4.0f64 + 9.0).sqrt()],
            1e-12,
        );
    }

    #[test]
    fn global_lp_pool() {
        check(&Case::new(
            "GlobalLpPool",
            2,
            vec![In::Rand(vec![2, 3, 4, 2])],
        ));
        check(&Case::new("GlobalLpPool", 2, vec![In::Rand(vec![1, 2, 5])]).attr(int("p", 3)));
    }

    #[test]
    fn max_unpool() {
        check(
            &Case::new(
                "MaxUnpool",
                11,
                vec![
                    In::Rand(vec![1, 2, 2, 2]),
                    In::Ints(
                        DType::I64,
                        vec![1, 2, 2, 2],
                        vec![5, 2, 8, 15, 16, 19, 25, 31],
                    ),
                ],
            )
            .attr(ints("kernel_shape", &[2, 2]))
            .attr(ints("strides", &[2, 2])),
        );
        let y = forward(
            "MaxUnpool",
            11,
            &[ints("kernel_shape", &[2]), ints("strides", &[2])],
            &[
                Some(t(&[7.0, 9.0], &[1, 1, 2])),
                Some(Tensor::from_vec(vec![1i64, 2], (1, 1, 2), &Device::Cpu).unwrap()),
            ],
            &[],
            1,
        )
        .unwrap();
        close(&vals(&y[0]), &[0.0, 7.0, 9.0, 0.0], 0.0);
    }
}
