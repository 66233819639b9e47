//! Pooling.

use super::pool_host::{gather_flat, scatter_add_flat, PoolArgmax};
use crate::kernel::kbail;
use crate::kernel::{
    BwdArgs, Extras, Inputs, KResult, Kernel, KernelCtx, KernelError, KernelRegistry,
};
use crate::kernels::common::{fsum_keepdim, host_unfold, usizes, want};
use crate::kernels::window::{offsets, pad_dims, read_win, unwindow, window, Win};
use candle_core::{DType, Tensor};

// ---------------------------------------------------------------------------------------------
// Pooling

struct PoolGeo {
    win: Win,
    /// End pads including what ceil_mode windows reach beyond the declared pads.
    pe_full: Vec<usize>,
    x: Vec<usize>,
}

fn pool_geo(cx: &KernelCtx) -> KResult<PoolGeo> {
    let x = cx.in_shape(0)?;
    if x.len() < 3 {
        kbail!("input must be [N, C, spatial...], got {x:?}");
    }
    let k = match cx.attrs.ints("kernel_shape")? {
        Some(v) => usizes(cx, "attribute \"kernel_shape\"", v)?,
        None => kbail!("attribute \"kernel_shape\" is required but missing"),
    };
    let y = cx.out_shape(0)?;
    let win = read_win(cx, k, &x[2..], &y[2..])?;
    let mut pe_full = win.pe.clone();
    for j in 0..win.k.len() {
        let need = (win.out[j] - 1) * win.s[j] + win.eff(j);
        let have = x[2 + j] + win.pb[j] + win.pe[j];
        pe_full[j] += need.saturating_sub(have);
    }
    Ok(PoolGeo { win, pe_full, x })
}

/// Max pooling with the flat index (into the whole input) of each maximum.
fn max_pool_with_indices(x: &Tensor, p: &PoolGeo) -> KResult<(Tensor, Tensor)> {
    let w = &p.win;
    let xp = pad_dims(x, 2, &w.pb, &p.pe_full, f64::NEG_INFINITY)?;
    let dev = x.device();
    let n_sp = p.x.len() - 2;
    let nc = p.x[0] * p.x[1];
    let plane: usize = p.x[2..].iter().product();
    // Flat strides of the spatial dims.
    let mut strides = vec![1usize; n_sp];
    for j in (0..n_sp.saturating_sub(1)).rev() {
        strides[j] = strides[j + 1] * p.x[3 + j];
    }
    let base: Vec<i64> = (0..nc).map(|i| (i * plane) as i64).collect();
    let mut bshape = vec![p.x[0], p.x[1]];
    bshape.extend(std::iter::repeat_n(1, n_sp));
    let mut idx0 = Tensor::from_vec(base, bshape, dev)?;
    for j in 0..n_sp {
        let v: Vec<i64> = (0..w.out[j])
            .map(|o| (o as i64 * w.s[j] as i64 - w.pb[j] as i64) * strides[j] as i64)
            .collect();
        let mut shape = vec![1; 2 + n_sp];
        shape[2 + j] = w.out[j];
        idx0 = idx0.broadcast_add(&Tensor::from_vec(v, shape, dev)?)?;
    }
    let mut best: Option<(Tensor, Tensor)> = None;
    for off in offsets(w) {
        let v = window(&xp, 2, &off, &w.s, &w.out)?;
        let add: i64 = off
            .iter()
            .zip(&strides)
            .map(|(&o, &s)| (o * s) as i64)
            .sum();
        let idx = idx0.broadcast_add(&Tensor::new(add, dev)?)?;
        best = Some(match best {
            None => (v.contiguous()?, idx),
            Some((bv, bi)) => {
                let m = v.gt(&bv)?;
                (m.where_cond(&v, &bv)?, m.where_cond(&idx, &bi)?)
            }
        });
    }
    let (y, i) = best.ok_or_else(|| KernelError::new("empty pooling kernel"))?;
    let last = (x.elem_count().max(1) - 1) as f64;
    Ok((y, i.clamp(0f64, last)?))
}

/// Max pooling with flat indices: the host loop for 2-D pooling on the CPU, strided windows
/// of candle ops otherwise.
fn max_pool_indices_any(x: &Tensor, p: &PoolGeo) -> KResult<(Tensor, Tensor)> {
    if host_argmax(x) {
        let idx = max_pool_indices(x, p)?;
        let y = gather_flat(x, &idx)?;
        return Ok((y, idx));
    }
    max_pool_with_indices(x, p)
}

/// Whether max pooling finds its argmax with the host loop.
fn host_argmax(x: &Tensor) -> bool {
    host_unfold(x.device()) && x.rank() == 4
}

/// The flat indices alone (the saved value of the backward: no values gathered on the host).
fn max_pool_indices(x: &Tensor, p: &PoolGeo) -> KResult<Tensor> {
    if !host_argmax(x) {
        return Ok(max_pool_with_indices(x, p)?.1);
    }
    let (n, c, h, w) = x.dims4()?;
    let op = PoolArgmax {
        nc: n * c,
        hw: [h, w],
        win: p.win.clone(),
    };
    let (o0, o1) = (p.win.out[0], p.win.out[1]);
    Ok(x.contiguous()?
        .apply_op1_no_bwd(&op)?
        .reshape((n, c, o0, o1))?)
}

fn maxpool_extra(cx: &KernelCtx, tag: &str, xs: &[Option<Tensor>]) -> KResult<Vec<Tensor>> {
    if tag != "indices" {
        kbail!("no extra value {tag:?}");
    }
    let p = pool_geo(cx)?;
    Ok(vec![max_pool_indices(xs.req(0)?, &p)?])
}

fn maxpool_fwd(cx: &KernelCtx, xs: &[Option<Tensor>], ex: &Extras) -> KResult<Vec<Option<Tensor>>> {
    let x = xs.req(0)?;
    let p = pool_geo(cx)?;
    if cx.attrs.int_or("storage_order", 0)? != 0 && want(cx, 1) {
        kbail!("attribute \"storage_order\" = 1 is not supported");
    }
    let y_shape = cx.out_shape(0)?;
    let saved = ex.get("indices").and_then(|v| v.first());
    let (y, idx) = match saved {
        Some(i) => {
            let y = gather_flat(x, i)?.reshape(y_shape)?;
            (y, Some(i.clone()))
        }
        None if want(cx, 1)
            || p.win.k.len() != 2
            || p.win.d != [1, 1]
            || host_unfold(x.device()) =>
        {
            let (y, i) = max_pool_indices_any(x, &p)?;
            (y, Some(i))
        }
        None => {
            let w = &p.win;
            let xp = pad_dims(x, 2, &w.pb, &p.pe_full, f64::NEG_INFINITY)?;
            let y = xp.max_pool2d_with_stride((w.k[0], w.k[1]), (w.s[0], w.s[1]))?;
            let y = y.narrow(2, 0, w.out[0])?.narrow(3, 0, w.out[1])?;
            (y, None)
        }
    };
    let mut outs = vec![Some(y)];
    if cx.outputs.len() > 1 {
        outs.push(if want(cx, 1) { idx } else { None });
    }
    Ok(outs)
}

fn maxpool_bwd(cx: &KernelCtx, a: &BwdArgs) -> KResult<Vec<Option<Tensor>>> {
    let idx = a
        .extra("indices")?
        .first()
        .ok_or_else(|| KernelError::new("the indices extra is empty"))?;
    let g = a.grad(cx, 0)?;
    let x_shape = cx.in_shape(0)?;
    let dx = scatter_add_flat(&g, idx, &x_shape)?;
    let mut out = vec![Some(dx)];
    out.resize(a.inputs.len(), None);
    Ok(out)
}

/// Window element counts of an average pool (`[1, 1, out...]`).
fn avg_counts(p: &PoolGeo, include_pad: bool, like: &Tensor) -> KResult<Tensor> {
    let w = &p.win;
    let n_sp = w.k.len();
    let dev = like.device();
    let mut mask: Option<Tensor> = None;
    for j in 0..n_sp {
        let len = p.x[2 + j] + w.pb[j] + p.pe_full[j];
        let (lo, hi) = if include_pad {
            (0, p.x[2 + j] + w.pb[j] + w.pe[j])
        } else {
            (w.pb[j], w.pb[j] + p.x[2 + j])
        };
        let v: Vec<f64> = (0..len)
            .map(|i| if i >= lo && i < hi { 1.0 } else { 0.0 })
            .collect();
        let mut shape = vec![1; 2 + n_sp];
        shape[2 + j] = len;
        let t = Tensor::from_vec(v, shape, dev)?.to_dtype(like.dtype())?;
        mask = Some(match mask {
            None => t,
            Some(m) => m.broadcast_mul(&t)?,
        });
    }
    let mask = mask.ok_or_else(|| KernelError::new("pooling without spatial dims"))?;
    let mut cnt: Option<Tensor> = None;
    for off in offsets(w) {
        let v = window(&mask, 2, &off, &w.s, &w.out)?;
        cnt = Some(match cnt {
            None => v.contiguous()?,
            Some(c) => (c + v)?,
        });
    }
    let cnt = cnt.ok_or_else(|| KernelError::new("empty pooling kernel"))?;
    Ok(cnt.clamp(1f64, f64::INFINITY)?)
}

fn avgpool_fwd(cx: &KernelCtx, xs: &[Option<Tensor>], _: &Extras) -> KResult<Vec<Option<Tensor>>> {
    let x = xs.req(0)?;
    let p = pool_geo(cx)?;
    let include = cx.attrs.int_or("count_include_pad", 0)? != 0;
    let w = &p.win;
    let xp = pad_dims(x, 2, &w.pb, &p.pe_full, 0.0)?;
    let mut acc: Option<Tensor> = None;
    for off in offsets(w) {
        let v = window(&xp, 2, &off, &w.s, &w.out)?;
        acc = Some(match acc {
            None => v.contiguous()?,
            Some(a) => (a + v)?,
        });
    }
    let acc = acc.ok_or_else(|| KernelError::new("empty pooling kernel"))?;
    let cnt = avg_counts(&p, include, x)?;
    Ok(vec![Some(acc.broadcast_div(&cnt)?)])
}

fn avgpool_bwd(cx: &KernelCtx, a: &BwdArgs) -> KResult<Vec<Option<Tensor>>> {
    let p = pool_geo(cx)?;
    let include = cx.attrs.int_or("count_include_pad", 0)? != 0;
    let g = a.grad(cx, 0)?;
    let w = &p.win;
    let gc = g.broadcast_div(&avg_counts(&p, include, &g)?)?;
    let lens: Vec<usize> = (0..w.k.len())
        .map(|j| p.x[2 + j] + w.pb[j] + p.pe_full[j])
        .collect();
    let mut acc: Option<Tensor> = None;
    for off in offsets(w) {
        let v = unwindow(&gc, 2, &off, &w.s, &lens)?;
        acc = Some(match acc {
            None => v,
            Some(a) => (a + v)?,
        });
    }
    let mut dx = acc.ok_or_else(|| KernelError::new("empty pooling kernel"))?;
    for j in 0..w.k.len() {
        dx = dx.narrow(2 + j, w.pb[j], p.x[2 + j])?;
    }
    let mut out = vec![Some(dx.contiguous()?)];
    out.resize(a.inputs.len(), None);
    Ok(out)
}

fn spatial_dims(rank: usize) -> Vec<usize> {
    (2..rank).collect()
}

fn gap_fwd(_: &KernelCtx, xs: &[Option<Tensor>], _: &Extras) -> KResult<Vec<Option<Tensor>>> {
    let x = xs.req(0)?;
    if x.rank() < 3 {
        kbail!("input must be [N, C, spatial...]");
    }
    let plane: usize = x.dims()[2..].iter().product();
    let s = fsum_keepdim(x, &spatial_dims(x.rank()))?;
    Ok(vec![Some(s.affine(1.0 / plane.max(1) as f64, 0.0)?)])
}

fn gap_bwd(cx: &KernelCtx, a: &BwdArgs) -> KResult<Vec<Option<Tensor>>> {
    let x_shape = cx.in_shape(0)?;
    let plane: usize = x_shape[2..].iter().product();
    let g = a.grad(cx, 0)?;
    let dx = g
        .affine(1.0 / plane.max(1) as f64, 0.0)?
        .broadcast_as(x_shape)?
        .contiguous()?;
    Ok(vec![Some(dx)])
}

/// Global max: values and flat indices into the whole input.
fn gmp_indices(x: &Tensor) -> KResult<Tensor> {
    if x.rank() < 3 {
        kbail!("input must be [N, C, spatial...]");
    }
    let (n, c) = (x.dim(0)?, x.dim(1)?);
    let plane = x.elem_count() / (n * c).max(1);
    let arg = x
        .contiguous()?
        .reshape((n * c, plane))?
        .argmax_keepdim(1)?
        .to_dtype(DType::I64)?;
    let base: Vec<i64> = (0..n * c).map(|i| (i * plane) as i64).collect();
    let base = Tensor::from_vec(base, (n * c, 1), x.device())?;
    let mut shape = vec![n, c];
    shape.extend(std::iter::repeat_n(1, x.rank() - 2));
    Ok((arg + base)?.reshape(shape)?)
}

fn gmp_extra(_: &KernelCtx, tag: &str, xs: &[Option<Tensor>]) -> KResult<Vec<Tensor>> {
    if tag != "indices" {
        kbail!("no extra value {tag:?}");
    }
    Ok(vec![gmp_indices(xs.req(0)?)?])
}

fn gmp_fwd(_: &KernelCtx, xs: &[Option<Tensor>], ex: &Extras) -> KResult<Vec<Option<Tensor>>> {
    let x = xs.req(0)?;
    let idx = match ex.get("indices").and_then(|v| v.first()) {
        Some(i) => i.clone(),
        None => gmp_indices(x)?,
    };
    let y = x
        .flatten_all()?
        .index_select(&idx.flatten_all()?, 0)?
        .reshape(idx.dims())?;
    Ok(vec![Some(y)])
}

pub(super) fn register(r: &mut KernelRegistry) {
    r.insert(
        "MaxPool",
        Kernel::with_extra(maxpool_fwd, maxpool_extra, Some(maxpool_bwd)),
    );
    r.insert("AveragePool", Kernel::new(avgpool_fwd, Some(avgpool_bwd)));
    r.insert("GlobalAveragePool", Kernel::new(gap_fwd, Some(gap_bwd)));
    r.insert(
        "GlobalMaxPool",
        Kernel::with_extra(gmp_fwd, gmp_extra, Some(maxpool_bwd)),
    );
}

#[cfg(test)]
mod tests {
    use crate::testing::{check, int, ints, string, Case};
    use crate::testing::{max_abs_diff, r};
    use remat_planner::ops::Ctx;
    use remat_planner::tensor::DType;

    #[test]
    fn max_pool() {
        check(
            &Case::new("MaxPool", 12, vec![r(&[2, 3, 7, 7])])
                .attr(ints("kernel_shape", &[3, 3]))
                .attr(ints("strides", &[2, 2]))
                .attr(ints("pads", &[1, 1, 1, 1])),
        );
        check(
            &Case::new("MaxPool", 12, vec![r(&[1, 2, 6, 7])])
                .attr(ints("kernel_shape", &[2, 3]))
                .attr(ints("strides", &[2, 2]))
                .attr(int("ceil_mode", 1))
                .outputs(2),
        );
        check(
            &Case::new("MaxPool", 12, vec![r(&[1, 2, 7, 7])])
                .attr(ints("kernel_shape", &[2, 2]))
                .attr(ints("dilations", &[2, 2]))
                .attr(ints("pads", &[0, 1, 1, 0])),
        );
        check(
            &Case::new("MaxPool", 12, vec![r(&[2, 2, 9])])
                .attr(ints("kernel_shape", &[3]))
                .attr(ints("strides", &[2]))
                .attr(string("auto_pad", "SAME_UPPER")),
        );
        check(
            &Case::new("MaxPool", 12, vec![r(&[1, 2, 4, 4, 5])])
                .attr(ints("kernel_shape", &[2, 2, 3]))
                .attr(ints("strides", &[2, 1, 2])),
        );
    }

    #[test]
    fn max_pool_indices_are_onnx_flat_indices() {
        use crate::kernel::{Extras, KernelCtx};
        use candle_core::{Device, Tensor};
        use remat_planner::onnx::Attrs;
        use remat_planner::tensor::Fact;
        let dev = Device::Cpu;
        let x = Tensor::new(
            &[
                [[[1.0f64, 5.0, 2.0], [0.0, 3.0, 9.0]]],
                [[[4.0, 1.0, 0.0], [2.0, 8.0, 1.0]]],
            ],
            &dev,
        )
        .unwrap();
        let attrs = vec![ints("kernel_shape", &[2, 2])];
        let inputs = vec![Some(Fact::new(DType::F64, vec![2, 1, 2, 3]))];
        let outputs = vec![
            Some(Fact::new(DType::F64, vec![2, 1, 1, 2])),
            Some(Fact::new(DType::I64, vec![2, 1, 1, 2])),
        ];
        let cx = KernelCtx {
            rule: Ctx {
                node: "mp",
                op: "MaxPool",
                opset: 12,
                attrs: Attrs {
                    node: "mp",
                    op: "MaxPool",
                    list: &attrs,
                },
                inputs: &inputs,
                n_outputs: outputs.len(),
            },
            outputs: &outputs,
            device: &dev,
            seed: 1,
        };
        let y = super::maxpool_fwd(&cx, &[Some(x)], &Extras::new()).unwrap();
        let v = y[0]
            .as_ref()
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1::<f64>()
            .unwrap();
        let i = y[1]
            .as_ref()
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1::<i64>()
            .unwrap();
        assert_eq!(v, vec![5.0, 9.0, 8.0, 8.0]);
        assert_eq!(i, vec![1, 5, 10, 10]);
    }

    /// The host argmax (CPU) and the strided-window argmax (other devices) agree.
    #[test]
    fn max_pool_paths_agree() {
        use super::{max_pool_indices_any, max_pool_with_indices, PoolGeo, Win};
        use candle_core::{Device, Tensor};
        let dev = Device::Cpu;
        let cases = [
            ([3, 3], [2, 2], [1, 1], [1, 1], [1, 1], [9, 9]),
            ([2, 3], [2, 1], [2, 1], [0, 1], [1, 0], [8, 7]),
            ([3, 3], [3, 3], [1, 1], [0, 0], [2, 2], [7, 7]),
        ];
        for (k, s, d, pb, pe, hw) in cases {
            let out: Vec<usize> = (0..2)
                .map(|j| (hw[j] + pb[j] + pe[j] - ((k[j] - 1) * d[j] + 1)) / s[j] + 1)
                .collect();
            let win = Win {
                k: k.to_vec(),
                s: s.to_vec(),
                d: d.to_vec(),
                pb: pb.to_vec(),
                pe: pe.to_vec(),
                out,
            };
            let p = PoolGeo {
                pe_full: win.pe.clone(),
                win,
                x: vec![2, 3, hw[0], hw[1]],
            };
            let x = Tensor::randn(0f64, 1.0, (2, 3, hw[0], hw[1]), &dev).unwrap();
            // Rounded values tie often: both paths keep the first maximum in window order.
            let ties = (&x * 1.5).unwrap().round().unwrap();
            for x in [x, ties] {
                let (y1, i1) = max_pool_indices_any(&x, &p).unwrap();
                let (y2, i2) = max_pool_with_indices(&x, &p).unwrap();
                assert_eq!(
                    i1.flatten_all().unwrap().to_vec1::<i64>().unwrap(),
                    i2.flatten_all().unwrap().to_vec1::<i64>().unwrap()
                );
                assert_eq!(max_abs_diff(&y1, &y2), 0.0);
            }
        }
    }
    /// The host gather and scatter of a max pool (planes on all threads above 64 Ki
    /// elements) agree with candle's `index_select` / `index_add`, and name a bad index.
    #[test]
    fn max_pool_gather_scatter_on_threads() {
        use super::super::pool_host::{gather_flat, scatter_add_flat, GatherFlat, ScatterAddFlat};
        use candle_core::{Device, Tensor};
        let dev = Device::Cpu;
        // 6 planes of 120×110 (79,200 elements) and 72,000 outputs, each reading its own plane; the
        // windows overlap, so an input element receives several gradients.
        let (planes, h, w, o) = (6usize, 120usize, 110usize, 12000usize);
        let x = Tensor::randn(0f32, 1.0, (2, 3, h, w), &dev).unwrap();
        let mut ids = Vec::with_capacity(planes * o);
        for u in 0..planes {
            for j in 0..o {
                ids.push((u * h * w + (j * 7919) % (h * w)) as i64);
            }
        }
        let idx = Tensor::from_vec(ids.clone(), (2, 3, o), &dev).unwrap();
        let g = Tensor::randn(0f32, 1.0, (2, 3, o), &dev).unwrap();
        let flat = idx.flatten_all().unwrap();
        let y = gather_flat(&x, &idx).unwrap().flatten_all().unwrap();
        let y_ref = x.flatten_all().unwrap().index_select(&flat, 0).unwrap();
        assert_eq!(y.to_vec1::<f32>().unwrap(), y_ref.to_vec1::<f32>().unwrap());
        let dx = scatter_add_flat(&g, &idx, &[2, 3, h, w]).unwrap();
        let dx_ref = Tensor::zeros(planes * h * w, candle_core::DType::F32, &dev)
            .unwrap()
            .index_add(&flat, &g.flatten_all().unwrap(), 0)
            .unwrap();
        // The GPU's path (candle's scatter-add, a row per plane), here on the CPU.
        let dx_planes =
            super::super::pool_host::scatter_add_planes(&g, &idx, &[2, 3, h, w]).unwrap();
        for got in [&dx, &dx_planes] {
            let e = max_abs_diff(&got.flatten_all().unwrap(), &dx_ref);
            assert!(e < 1e-6, "{e}");
        }
        // An index outside the input, and one outside its plane.
        let mut bad = ids.clone();
        bad[planes * o - 1] = (planes * h * w) as i64;
        let bad = Tensor::from_vec(bad, planes * o, &dev).unwrap();
        let xf = x.flatten_all().unwrap();
        let err = xf
            .apply_op2_no_bwd(&bad, &GatherFlat)
            .unwrap_err()
            .to_string();
        assert!(err.contains(&format!("index {}", planes * h * w)), "{err}");
        let mut cross = ids;
        cross[o] = 0; // plane 1's first index points into plane 0
        let cross = Tensor::from_vec(cross, planes * o, &dev).unwrap();
        let op = ScatterAddFlat {
            len: planes * h * w,
            planes,
        };
        let err = g
            .flatten_all()
            .unwrap()
            .apply_op2_no_bwd(&cross, &op)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("index 0 (at 12000) outside its plane"),
            "{err}"
        );
    }

    #[test]
    fn host_max_pool_takes_the_first_nan() {
        use super::{max_pool_indices_any, PoolGeo, Win};
        use candle_core::{Device, Tensor};
        // Two 4×4 planes, 2×2 windows, stride 2. The first has NaN at 5 and 6 (window 0 holds
        // 5; window 1 holds 6 after a larger number): the first NaN wins; the second plane has
        // no NaN and a tie.
        let mut v: Vec<f32> = (0..32).map(|i| (i % 7) as f32).collect();
        v[5] = f32::NAN;
        v[6] = f32::NAN;
        v[3] = 100.0;
        v[30] = 6.0; // ties with 27, which comes first in window order
        let x = Tensor::from_vec(v, (1, 2, 4, 4), &Device::Cpu).unwrap();
        let win = Win {
            k: vec![2, 2],
            s: vec![2, 2],
            d: vec![1, 1],
            pb: vec![0, 0],
            pe: vec![0, 0],
            out: vec![2, 2],
        };
        let p = PoolGeo {
            pe_full: vec![0, 0],
            win,
            x: vec![1, 2, 4, 4],
        };
        let (y, i) = max_pool_indices_any(&x, &p).unwrap();
        let i = i.flatten_all().unwrap().to_vec1::<i64>().unwrap();
        assert_eq!(&i[..4], &[5, 6, 13, 11]);
        let y = y.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        assert!(y[0].is_nan() && y[1].is_nan());
        // Second plane (values (16..32) % 7): windows' first maxima.
        assert_eq!(&i[4..], &[20, 19, 25, 27]);
    }
    #[test]
    fn average_pool() {
        for include in [0, 1] {
            check(
                &Case::new("AveragePool", 19, vec![r(&[2, 2, 5, 6])])
                    .attr(ints("kernel_shape", &[3, 3]))
                    .attr(ints("strides", &[2, 2]))
                    .attr(ints("pads", &[1, 1, 1, 0]))
                    .attr(int("ceil_mode", 1))
                    .attr(int("count_include_pad", include)),
            );
        }
        check(
            &Case::new("AveragePool", 19, vec![r(&[1, 3, 8])])
                .attr(ints("kernel_shape", &[2]))
                .attr(ints("strides", &[2])),
        );
        check(
            &Case::new("AveragePool", 19, vec![r(&[1, 1, 3, 4, 4])])
                .attr(ints("kernel_shape", &[2, 2, 2]))
                .attr(ints("pads", &[1, 0, 1, 0, 1, 1])),
        );
    }

    #[test]
    fn global_pools() {
        check(&Case::new("GlobalAveragePool", 13, vec![r(&[2, 3, 4, 5])]));
        check(&Case::new("GlobalAveragePool", 13, vec![r(&[2, 3, 4])]));
        check(&Case::new("GlobalMaxPool", 13, vec![r(&[2, 3, 4, 5])]));
        check(&Case::new("GlobalMaxPool", 13, vec![r(&[1, 2, 2, 3, 2])]));
    }
}
