//! Kernels of the less common spatial ops and the in-graph losses: `LpPool`,
//! `GlobalLpPool`, `MaxUnpool`, `RoiAlign`, `Col2Im`, `CenterCropPad`, `AffineGrid`,
//! `SoftmaxCrossEntropyLoss`, `NegativeLogLikelihoodLoss` (see `exec::kernel` for the
//! contract).
//!
//! Sliding windows of any rank, stride, dilation and padding (LpPool, Col2Im) gather the
//! window elements with one `index_select` over the zero-padded, flattened spatial dims;
//! their backward scatters back with `index_add`. The index tables are built on the host
//! from the shapes; RoiAlign's bilinear sampling table depends on the boxes, which are read
//! back from the device.

use super::nn::{ints_attr, read_win, usizes};
use super::{present, req};
use crate::exec::kernel::{
    BackwardFn, BwdArgs, ExtraFn, Extras, ForwardFn, KResult, Kernel, KernelCtx, KernelError,
    KernelRegistry,
};
use crate::kbail;
use candle_core::{DType, Device, Tensor, D};

fn grads_out(cx: &KernelCtx) -> Vec<Option<Tensor>> {
    vec![None; cx.inputs.len()]
}

fn set(out: &mut [Option<Tensor>], i: usize, t: Tensor) {
    if let Some(s) = out.get_mut(i) {
        *s = Some(t);
    }
}

// ---------------------------------------------------------------------------------------
// Sliding windows

/// A sliding window over `in_dims` (spatial dims), already resolved to explicit pads.
struct Win {
    in_dims: Vec<usize>,
    kernel: Vec<usize>,
    strides: Vec<usize>,
    dilations: Vec<usize>,
    /// Padding before and after each dim (after includes what ceil mode needs).
    begin: Vec<usize>,
    end: Vec<usize>,
    out_dims: Vec<usize>,
}

impl Win {
    fn padded(&self) -> Vec<usize> {
        (0..self.in_dims.len())
            .map(|i| self.begin[i] + self.in_dims[i] + self.end[i])
            .collect()
    }

    /// For every window position (outer) and kernel offset (inner), the flat index in the
    /// padded dims; `kernel_major` swaps the nesting (Col2Im's column layout).
    fn index(&self, kernel_major: bool, dev: &Device) -> KResult<Tensor> {
        let padded = self.padded();
        let n = padded.len();
        let mut pstride = vec![1usize; n];
        for i in (0..n.saturating_sub(1)).rev() {
            pstride[i] = pstride[i + 1] * padded[i + 1];
        }
        let unravel = |mut flat: usize, dims: &[usize]| -> Vec<usize> {
            let mut v = vec![0; dims.len()];
            for i in (0..dims.len()).rev() {
                let d = dims[i].max(1);
                v[i] = flat % d;
                flat /= d;
            }
            v
        };
        let n_out: usize = self.out_dims.iter().product();
        let n_k: usize = self.kernel.iter().product();
        let pos = |o: usize, k: usize| -> u32 {
            let oi = unravel(o, &self.out_dims);
            let ki = unravel(k, &self.kernel);
            let mut flat = 0;
            for i in 0..n {
                flat += (oi[i] * self.strides[i] + ki[i] * self.dilations[i]) * pstride[i];
            }
            flat as u32
        };
        let mut idx = Vec::with_capacity(n_out * n_k);
        if kernel_major {
            for k in 0..n_k {
                for o in 0..n_out {
                    idx.push(pos(o, k));
                }
            }
        } else {
            for o in 0..n_out {
                for k in 0..n_k {
                    idx.push(pos(o, k));
                }
            }
        }
        let total: usize = padded.iter().product();
        if total > u32::MAX as usize {
            kbail!("padded spatial size {total} is too large");
        }
        Ok(Tensor::from_vec(idx, n_out * n_k, dev)?)
    }

    /// `x` `[a, b, spatial...]` zero-padded and flattened to `[a, b, Π padded]`.
    fn pad_flat(&self, x: &Tensor) -> KResult<Tensor> {
        let mut t = x.clone();
        for i in 0..self.in_dims.len() {
            if self.begin[i] > 0 || self.end[i] > 0 {
                t = t.pad_with_zeros(i + 2, self.begin[i], self.end[i])?;
            }
        }
        Ok(t.flatten_from(2)?.contiguous()?)
    }

    /// The inverse of `pad_flat`: `[a, b, Π padded]` → `[a, b, spatial...]`.
    fn unpad(&self, t: &Tensor) -> KResult<Tensor> {
        let (a, b, _) = t.dims3()?;
        let mut shape = vec![a, b];
        shape.extend(self.padded());
        let mut t = t.reshape(shape)?;
        for i in 0..self.in_dims.len() {
            t = t.narrow(i + 2, self.begin[i], self.in_dims[i])?;
        }
        Ok(t.contiguous()?)
    }
}

/// A pooling window from the attributes (explicit pads, auto_pad: the convolutions' reading,
/// [`super::nn::read_win`]), with the end padding that ceil mode needs; the output dims come
/// from the shape rule.
fn pool_win(cx: &KernelCtx) -> KResult<Win> {
    let x = cx.in_shape(0)?;
    let in_dims = x.get(2..).unwrap_or(&[]).to_vec();
    let out_dims = cx.out_shape(0)?.get(2..).unwrap_or(&[]).to_vec();
    let kernel = match cx.attrs.ints("kernel_shape")? {
        Some(k) => usizes(cx, "attribute \"kernel_shape\"", k)?,
        None => kbail!("attribute \"kernel_shape\" is required"),
    };
    let w = read_win(cx, kernel, &in_dims, &out_dims)?;
    // Ceil mode may need positions past the end padding; they read as zeros.
    let mut end = w.pe.clone();
    for (i, e) in end.iter_mut().enumerate() {
        let span = (out_dims[i] - 1) * w.s[i] + (w.k[i] - 1) * w.d[i] + 1;
        let have = w.pb[i] + in_dims[i] + *e;
        if span > have {
            *e += span - have;
        }
    }
    Ok(Win {
        in_dims,
        kernel: w.k,
        strides: w.s,
        dilations: w.d,
        begin: w.pb,
        end,
        out_dims,
    })
}

// ---------------------------------------------------------------------------------------
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
    let x = req(xs, 0, "X")?;
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
    let x = req(xs, 0, "X")?;
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
    let x = req(xs, 0, "X")?;
    let shape = cx.out_shape(0)?;
    let numel: usize = shape.iter().product();
    let idx = unpool_index(req(xs, 1, "I")?, numel)?;
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

// ---------------------------------------------------------------------------------------
// RoiAlign

/// The bilinear sampling table of every output element: global positions in
/// `[N · H · W]` and weights (already divided by the sample count), `samples` per element.
struct RoiTable {
    pos: Tensor,
    weight: Tensor,
    samples: usize,
    /// `max` mode: the largest weighted corner value over the samples, not their mean.
    max: bool,
}

fn roi_table(
    cx: &KernelCtx,
    x_dims: &[usize],
    rois: &Tensor,
    batch: &Tensor,
    dtype: DType,
) -> KResult<RoiTable> {
    let (n, h, w) = match x_dims {
        [n, _, h, w] => (*n, *h, *w),
        d => kbail!("X must be [N, C, H, W], got {d:?}"),
    };
    let mode = cx.attrs.string("mode")?.unwrap_or_else(|| "avg".into());
    let max = match mode.as_str() {
        "avg" => false,
        "max" => true,
        m => kbail!("attribute \"mode\" = {m:?} is not supported"),
    };
    let ph = usize::try_from(cx.attrs.int_or("output_height", 1)?).unwrap_or(0);
    let pw = usize::try_from(cx.attrs.int_or("output_width", 1)?).unwrap_or(0);
    if ph == 0 || pw == 0 {
        kbail!("attribute \"output_height\"/\"output_width\" must be positive");
    }
    let ratio = cx.attrs.int_or("sampling_ratio", 0)?;
    let scale = cx.attrs.float_or("spatial_scale", 1.0)? as f64;
    let default_mode = if cx.opset >= 16 {
        "half_pixel"
    } else {
        "output_half_pixel"
    };
    let ctm = cx
        .attrs
        .string("coordinate_transformation_mode")?
        .unwrap_or_else(|| default_mode.into());
    let half_pixel = match ctm.as_str() {
        "half_pixel" => true,
        "output_half_pixel" => false,
        m => kbail!("attribute \"coordinate_transformation_mode\" = {m:?} is not supported"),
    };
    let boxes = rois.to_dtype(DType::F64)?.to_vec2::<f64>()?;
    let bidx = batch.to_dtype(DType::I64)?.to_vec1::<i64>()?;
    if boxes.len() != bidx.len() {
        kbail!("{} rois but {} batch indices", boxes.len(), bidx.len());
    }
    let offset = if half_pixel { 0.5 } else { 0.0 };
    // Per roi: sample grid, then the table padded to the largest sample count.
    let mut per: Vec<(usize, Vec<(usize, f64)>)> = vec![];
    let mut max_s = 1;
    for (r, (bx, &b)) in boxes.iter().zip(&bidx).enumerate() {
        let b = usize::try_from(b).ok().filter(|&b| b < n).ok_or_else(|| {
            KernelError::new(format!(
                "batch index {b} of roi {r} is outside the batch of {n}"
            ))
        })?;
        let [x1, y1, x2, y2] = match bx.as_slice() {
            [a, b2, c, d] => [*a, *b2, *c, *d],
            _ => kbail!("roi {r} does not have 4 coordinates"),
        };
        let (sw, sh) = (x1 * scale - offset, y1 * scale - offset);
        let (mut rw, mut rh) = (x2 * scale - offset - sw, y2 * scale - offset - sh);
        if !half_pixel {
            rw = rw.max(1.0);
            rh = rh.max(1.0);
        }
        let (bh, bw) = (rh / ph as f64, rw / pw as f64);
        let gh = if ratio > 0 {
            ratio as usize
        } else {
            (rh / ph as f64).ceil().max(0.0) as usize
        };
        let gw = if ratio > 0 {
            ratio as usize
        } else {
            (rw / pw as f64).ceil().max(0.0) as usize
        };
        // The mean divides by the sample count; the max takes weighted corners as they are.
        let count = if max { 1.0 } else { (gh * gw).max(1) as f64 };
        let mut entries = vec![];
        for py in 0..ph {
            for px in 0..pw {
                let mut e: Vec<(usize, f64)> = vec![];
                for iy in 0..gh {
                    let y = sh + py as f64 * bh + (iy as f64 + 0.5) * bh / gh as f64;
                    for ix in 0..gw {
                        let xx = sw + px as f64 * bw + (ix as f64 + 0.5) * bw / gw as f64;
                        if y < -1.0 || y > h as f64 || xx < -1.0 || xx > w as f64 {
                            // Outside the image: a zero sample (it counts in the max).
                            e.push((b * h * w, 0.0));
                            continue;
                        }
                        let (mut y, mut xx) = (y.max(0.0), xx.max(0.0));
                        let mut yl = y as usize;
                        let mut xl = xx as usize;
                        let yh = if yl + 1 >= h {
                            yl = h - 1;
                            y = yl as f64;
                            yl
                        } else {
                            yl + 1
                        };
                        let xh = if xl + 1 >= w {
                            xl = w - 1;
                            xx = xl as f64;
                            xl
                        } else {
                            xl + 1
                        };
                        let (ly, lx) = (y - yl as f64, xx - xl as f64);
                        let (hy, hx) = (1.0 - ly, 1.0 - lx);
                        let base = b * h * w;
                        e.push((base + yl * w + xl, hy * hx / count));
                        e.push((base + yl * w + xh, hy * lx / count));
                        e.push((base + yh * w + xl, ly * hx / count));
                        e.push((base + yh * w + xh, ly * lx / count));
                    }
                }
                max_s = max_s.max(e.len());
                entries.push(e);
            }
        }
        for e in entries {
            per.push((r, e));
        }
    }
    let mut pos = Vec::with_capacity(per.len() * max_s);
    let mut weight = Vec::with_capacity(per.len() * max_s);
    for (_, e) in &per {
        for k in 0..max_s {
            // Padding repeats the cell's first entry for the max (it cannot change it) and
            // adds zero weights for the mean.
            let pad = match (max, e.first()) {
                (true, Some(&f)) => f,
                _ => (0, 0.0),
            };
            let (p, wt) = e.get(k).copied().unwrap_or(pad);
            pos.push(p as u32);
            weight.push(wt);
        }
    }
    let len = pos.len();
    Ok(RoiTable {
        pos: Tensor::from_vec(pos, len, cx.device)?,
        weight: Tensor::from_vec(weight, len, cx.device)?.to_dtype(dtype)?,
        samples: max_s,
        max,
    })
}

fn roi_align_forward(
    cx: &KernelCtx,
    xs: &[Option<Tensor>],
    _: &Extras,
) -> KResult<Vec<Option<Tensor>>> {
    let x = req(xs, 0, "X")?;
    let (n, c, h, w) = x.dims4()?;
    let t = roi_table(
        cx,
        x.dims(),
        req(xs, 1, "rois")?,
        req(xs, 2, "batch_indices")?,
        x.dtype(),
    )?;
    let shape = cx.out_shape(0)?;
    let cells: usize = shape.iter().product::<usize>() / c.max(1);
    // [C, N·H·W] gathered to [C, cells, samples], weighted and summed.
    let xt = x
        .permute((1, 0, 2, 3))?
        .reshape((c, n * h * w))?
        .contiguous()?;
    let v = xt
        .index_select(&t.pos, 1)?
        .reshape((c, cells, t.samples))?
        .broadcast_mul(&t.weight.reshape((1, cells, t.samples))?)?;
    let y = if t.max { v.max(2)? } else { v.sum(2)? };
    let (r, _, oh, ow) = match shape.as_slice() {
        [r, c2, oh, ow] => (*r, *c2, *oh, *ow),
        s => kbail!("output shape {s:?} is not 4-D"),
    };
    let y = y
        .reshape((c, r, oh, ow))?
        .permute((1, 0, 2, 3))?
        .contiguous()?;
    Ok(vec![Some(y)])
}

fn roi_align_backward(cx: &KernelCtx, g: &BwdArgs) -> KResult<Vec<Option<Tensor>>> {
    let mut out = grads_out(cx);
    if !g.need(0) {
        return Ok(out);
    }
    let x_dims = cx.in_shape(0)?;
    let dy = g.grad(cx, 0)?;
    let t = roi_table(cx, &x_dims, g.input(1)?, g.input(2)?, dy.dtype())?;
    let (n, c, h, w) = match x_dims.as_slice() {
        [n, c, h, w] => (*n, *c, *h, *w),
        d => kbail!("X must be [N, C, H, W], got {d:?}"),
    };
    let (r, _, oh, ow) = dy.dims4()?;
    let cells = r * oh * ow;
    let weight = t.weight.reshape((1, cells, t.samples))?;
    let mut d = dy
        .permute((1, 0, 2, 3))?
        .reshape((c, cells, 1))?
        .broadcast_mul(&weight)?;
    if t.max {
        // Only the winning weighted corner of each cell gets the gradient.
        let x = g.input(0)?;
        let v = x
            .permute((1, 0, 2, 3))?
            .reshape((c, n * h * w))?
            .contiguous()?
            .index_select(&t.pos, 1)?
            .reshape((c, cells, t.samples))?
            .broadcast_mul(&weight)?;
        let win = v.argmax_keepdim(2)?;
        let slots =
            Tensor::arange(0u32, t.samples as u32, cx.device)?.reshape((1, 1, t.samples))?;
        let mask = slots.broadcast_eq(&win)?.to_dtype(d.dtype())?;
        d = (d * mask)?;
    }
    let d = d.reshape((c, cells * t.samples))?;
    let dx = Tensor::zeros((c, n * h * w), dy.dtype(), cx.device)?
        .index_add(&t.pos, &d, 1)?
        .reshape((c, n, h, w))?
        .permute((1, 0, 2, 3))?
        .contiguous()?;
    set(&mut out, 0, dx);
    Ok(out)
}

// ---------------------------------------------------------------------------------------
// Col2Im

fn col2im_win(cx: &KernelCtx) -> KResult<Win> {
    let image = cx
        .const_ints(1)?
        .ok_or_else(|| KernelError::new("image_shape (input 1) is required"))?;
    let block = cx
        .const_ints(2)?
        .ok_or_else(|| KernelError::new("block_shape (input 2) is required"))?;
    let in_dims = usizes(cx, "input 1 \"image_shape\"", &image)?;
    let kernel = usizes(cx, "input 2 \"block_shape\"", &block)?;
    let n = in_dims.len();
    let strides = ints_attr(cx, "strides", n, 1)?;
    let dilations = ints_attr(cx, "dilations", n, 1)?;
    let pads = ints_attr(cx, "pads", 2 * n, 0)?;
    if kernel.len() != n {
        kbail!("block_shape {kernel:?} does not match the {n} image dims");
    }
    let mut out_dims = vec![];
    for i in 0..n {
        let span = (kernel[i].saturating_sub(1)) * dilations[i] + 1;
        let padded = in_dims[i] + pads[i] + pads[i + n];
        if strides[i] == 0 || padded < span {
            kbail!("block {kernel:?} does not fit the padded image on dim {i}");
        }
        out_dims.push((padded - span) / strides[i] + 1);
    }
    let l: usize = out_dims.iter().product();
    let have = cx.in_shape(0)?.get(2).copied().unwrap_or(0);
    if l != have {
        kbail!("input has {have} blocks but the image and block shapes give {l}");
    }
    Ok(Win {
        begin: pads.get(..n).unwrap_or(&[]).to_vec(),
        end: pads.get(n..).unwrap_or(&[]).to_vec(),
        in_dims,
        kernel,
        strides,
        dilations,
        out_dims,
    })
}

fn col2im_forward(
    cx: &KernelCtx,
    xs: &[Option<Tensor>],
    _: &Extras,
) -> KResult<Vec<Option<Tensor>>> {
    let x = req(xs, 0, "input")?;
    let w = col2im_win(cx)?;
    let (n, ck, l) = x.dims3()?;
    let k: usize = w.kernel.iter().product();
    let c = ck / k.max(1);
    let idx = w.index(true, cx.device)?;
    let total: usize = w.padded().iter().product();
    let src = x.reshape((n, c, k * l))?;
    let acc = Tensor::zeros((n, c, total), x.dtype(), cx.device)?.index_add(&idx, &src, 2)?;
    Ok(vec![Some(w.unpad(&acc)?)])
}

fn col2im_backward(cx: &KernelCtx, g: &BwdArgs) -> KResult<Vec<Option<Tensor>>> {
    let mut out = grads_out(cx);
    if !g.need(0) {
        return Ok(out);
    }
    let w = col2im_win(cx)?;
    let dy = g.grad(cx, 0)?;
    let idx = w.index(true, cx.device)?;
    let dx = w
        .pad_flat(&dy)?
        .index_select(&idx, 2)?
        .reshape(cx.in_shape(0)?)?;
    set(&mut out, 0, dx);
    Ok(out)
}

// ---------------------------------------------------------------------------------------
// CenterCropPad

/// Per axis: (crop start, pad before, pad after) from the input dims to the output dims.
fn crop_pad(cx: &KernelCtx) -> KResult<Vec<(usize, usize, usize, usize)>> {
    let x = cx.in_shape(0)?;
    let y = cx.out_shape(0)?;
    if x.len() != y.len() {
        kbail!(
            "output rank {} differs from the input's {}",
            y.len(),
            x.len()
        );
    }
    Ok(x.iter()
        .zip(&y)
        .map(|(&d, &t)| {
            if t < d {
                ((d - t) / 2, 0, 0, t)
            } else {
                let before = (t - d) / 2;
                (0, before, t - d - before, d)
            }
        })
        .collect())
}

fn center_crop_pad_forward(
    cx: &KernelCtx,
    xs: &[Option<Tensor>],
    _: &Extras,
) -> KResult<Vec<Option<Tensor>>> {
    let mut t = req(xs, 0, "input_data")?.clone();
    for (a, (start, before, after, keep)) in crop_pad(cx)?.into_iter().enumerate() {
        t = t.narrow(a, start, keep)?;
        if before > 0 || after > 0 {
            t = t.pad_with_zeros(a, before, after)?;
        }
    }
    Ok(vec![Some(t.contiguous()?)])
}

fn center_crop_pad_backward(cx: &KernelCtx, g: &BwdArgs) -> KResult<Vec<Option<Tensor>>> {
    let mut out = grads_out(cx);
    if !g.need(0) {
        return Ok(out);
    }
    let x = cx.in_shape(0)?;
    let mut t = g.grad(cx, 0)?;
    for (a, (start, before, _, keep)) in crop_pad(cx)?.into_iter().enumerate() {
        t = t.narrow(a, before, keep)?;
        let d = x.get(a).copied().unwrap_or(keep);
        if d > keep {
            t = t.pad_with_zeros(a, start, d - keep - start)?;
        }
    }
    set(&mut out, 0, t.contiguous()?);
    Ok(out)
}

// ---------------------------------------------------------------------------------------
// AffineGrid

/// The base grid `[Π spatial, spatial + 1]`: normalized (x, y[, z]) coordinates and a 1.
fn affine_base(cx: &KernelCtx, dtype: DType) -> KResult<Tensor> {
    let size = cx
        .const_ints(1)?
        .ok_or_else(|| KernelError::new("size (input 1) is required"))?;
    let size = usizes(cx, "input 1 \"size\"", &size)?;
    let spatial = size.get(2..).unwrap_or(&[]).to_vec();
    let align = cx.attrs.int_or("align_corners", 0)? != 0;
    let coord = |i: usize, n: usize| -> f64 {
        if align {
            if n <= 1 {
                0.0
            } else {
                -1.0 + 2.0 * i as f64 / (n - 1) as f64
            }
        } else {
            (2.0 * i as f64 + 1.0) / n as f64 - 1.0
        }
    };
    let total: usize = spatial.iter().product();
    let k = spatial.len();
    let mut v = Vec::with_capacity(total * (k + 1));
    for flat in 0..total {
        // Spatial index (D,) H, W; coordinates are written x (W) first.
        let mut rem = flat;
        let mut idx = vec![0; k];
        for i in (0..k).rev() {
            let d = spatial[i].max(1);
            idx[i] = rem % d;
            rem /= d;
        }
        for i in (0..k).rev() {
            v.push(coord(idx[i], spatial[i]));
        }
        v.push(1.0);
    }
    Ok(Tensor::from_vec(v, (total, k + 1), cx.device)?.to_dtype(dtype)?)
}

fn affine_grid_forward(
    cx: &KernelCtx,
    xs: &[Option<Tensor>],
    _: &Extras,
) -> KResult<Vec<Option<Tensor>>> {
    let theta = req(xs, 0, "theta")?;
    let base = affine_base(cx, theta.dtype())?;
    let grid = base
        .unsqueeze(0)?
        .broadcast_matmul(&theta.transpose(1, 2)?.contiguous()?)?
        .reshape(cx.out_shape(0)?)?;
    Ok(vec![Some(grid)])
}

fn affine_grid_backward(cx: &KernelCtx, g: &BwdArgs) -> KResult<Vec<Option<Tensor>>> {
    let mut out = grads_out(cx);
    if !g.need(0) {
        return Ok(out);
    }
    let dy = g.grad(cx, 0)?;
    let base = affine_base(cx, dy.dtype())?;
    let (n, k) = (dy.dim(0)?, dy.dim(D::Minus1)?);
    let dt = dy
        .reshape((n, (), k))?
        .transpose(1, 2)?
        .contiguous()?
        .broadcast_matmul(&base)?;
    set(&mut out, 0, dt);
    Ok(out)
}

// ---------------------------------------------------------------------------------------
// Losses

struct Loss {
    reduction: String,
    ignore: Option<i64>,
    classes: usize,
}

fn loss_cfg(cx: &KernelCtx) -> KResult<Loss> {
    let reduction = cx
        .attrs
        .string("reduction")?
        .unwrap_or_else(|| "mean".into());
    if !matches!(reduction.as_str(), "none" | "sum" | "mean") {
        kbail!("attribute \"reduction\" = {reduction:?} is not supported");
    }
    Ok(Loss {
        reduction,
        ignore: cx.attrs.int("ignore_index")?,
        classes: cx.in_shape(0)?.get(1).copied().unwrap_or(0),
    })
}

/// Labels as `[N, 1, d...]` indices safe to gather (ignored ones at 0), and the per-element
/// weight `[N, d...]` (class weight, 0 where ignored), in `dtype`.
fn label_weights(
    l: &Loss,
    labels: &Tensor,
    weights: Option<&Tensor>,
    dtype: DType,
) -> KResult<(Tensor, Tensor)> {
    let lab = labels.to_dtype(DType::I64)?;
    let keep = match l.ignore {
        Some(i) => lab.ne(i as f64)?,
        None => lab.ones_like()?.to_dtype(DType::U8)?,
    };
    let safe = keep.where_cond(&lab, &lab.zeros_like()?)?;
    if safe.elem_count() > 0 {
        let lo = safe.min_all()?.to_scalar::<i64>()?;
        let hi = safe.max_all()?.to_scalar::<i64>()?;
        if lo < 0 || hi as usize >= l.classes {
            kbail!(
                "labels in [{lo}, {hi}] fall outside the {} classes",
                l.classes
            );
        }
    }
    let keep_f = keep.to_dtype(dtype)?;
    let w = match weights {
        Some(w) => {
            (w.to_dtype(dtype)?
                .index_select(&safe.flatten_all()?, 0)?
                .reshape(safe.dims())?
                * keep_f)?
        }
        None => keep_f,
    };
    Ok((safe.unsqueeze(1)?, w))
}

/// The reduced loss from per-element `-w·log p` values and weights.
fn reduce_loss(l: &Loss, per: &Tensor, w: &Tensor) -> KResult<Tensor> {
    Ok(match l.reduction.as_str() {
        "none" => per.clone(),
        "sum" => per.sum_all()?,
        _ => (per.sum_all()? / w.sum_all()?)?,
    })
}

/// `d loss / d (-w·log p)` per element: the incoming gradient spread by the reduction.
fn per_element_grad(l: &Loss, dy: &Tensor, w: &Tensor) -> KResult<Tensor> {
    Ok(match l.reduction.as_str() {
        "none" => dy.clone(),
        "sum" => dy.broadcast_as(w.dims())?.contiguous()?,
        _ => dy
            .broadcast_div(&w.sum_all()?)?
            .broadcast_as(w.dims())?
            .contiguous()?,
    })
}

fn weights_input<'a>(cx: &KernelCtx, xs: &'a [Option<Tensor>]) -> KResult<Option<&'a Tensor>> {
    if present(cx, 2) {
        Ok(Some(req(xs, 2, "weights")?))
    } else {
        Ok(None)
    }
}

fn nll_from_logp(
    cx: &KernelCtx,
    logp: &Tensor,
    labels: &Tensor,
    weights: Option<&Tensor>,
) -> KResult<Tensor> {
    let l = loss_cfg(cx)?;
    let (idx, w) = label_weights(&l, labels, weights, logp.dtype())?;
    let picked = logp
        .contiguous()?
        .gather(&idx.contiguous()?, 1)?
        .squeeze(1)?;
    let per = (picked * &w)?.neg()?;
    reduce_loss(&l, &per, &w)
}

fn log_softmax(x: &Tensor) -> KResult<Tensor> {
    let m = x.max_keepdim(1)?;
    let s = x.broadcast_sub(&m)?;
    let lse = s.exp()?.sum_keepdim(1)?.log()?;
    Ok(s.broadcast_sub(&lse)?)
}

fn sce_forward(cx: &KernelCtx, xs: &[Option<Tensor>], ex: &Extras) -> KResult<Vec<Option<Tensor>>> {
    let scores = req(xs, 0, "scores")?;
    let logp = match ex.get("log_prob").and_then(|v| v.first()) {
        Some(t) => t.reshape(scores.dims())?,
        None => log_softmax(scores)?,
    };
    let loss = nll_from_logp(cx, &logp, req(xs, 1, "labels")?, weights_input(cx, xs)?)?;
    let mut out = vec![Some(loss)];
    if cx.outputs.len() > 1 {
        out.push(if cx.outputs.get(1).is_some_and(|f| f.is_some()) {
            Some(logp)
        } else {
            None
        });
    }
    Ok(out)
}

fn sce_extra(cx: &KernelCtx, tag: &str, xs: &[Option<Tensor>]) -> KResult<Vec<Tensor>> {
    if tag != "log_prob" {
        kbail!("{} has no extra value {tag:?}", cx.op);
    }
    Ok(vec![log_softmax(req(xs, 0, "scores")?)?])
}

fn sce_backward(cx: &KernelCtx, g: &BwdArgs) -> KResult<Vec<Option<Tensor>>> {
    let mut out = grads_out(cx);
    if !g.need(0) {
        return Ok(out);
    }
    let logp = match g.outputs.get(1).and_then(|t| t.as_ref()) {
        Some(t) => t.clone(),
        None => g
            .extra("log_prob")?
            .first()
            .ok_or_else(|| KernelError::new("the log_prob extra is empty"))?
            .reshape(cx.in_shape(0)?)?,
    };
    let l = loss_cfg(cx)?;
    let weights = if present(cx, 2) {
        Some(g.input(2)?)
    } else {
        None
    };
    let (idx, w) = label_weights(&l, g.input(1)?, weights, logp.dtype())?;
    let coef = (per_element_grad(&l, &g.grad(cx, 0)?, &w)? * &w)?.unsqueeze(1)?;
    // d/dscores of -log p[label] = softmax - onehot(label).
    let onehot = logp.zeros_like()?.scatter_add(
        &idx.contiguous()?,
        &idx.ones_like()?.to_dtype(logp.dtype())?,
        1,
    )?;
    let d = (logp.exp()? - onehot)?.broadcast_mul(&coef)?;
    set(&mut out, 0, d);
    Ok(out)
}

fn nll_forward(cx: &KernelCtx, xs: &[Option<Tensor>], _: &Extras) -> KResult<Vec<Option<Tensor>>> {
    let loss = nll_from_logp(
        cx,
        req(xs, 0, "input")?,
        req(xs, 1, "target")?,
        weights_input(cx, xs)?,
    )?;
    Ok(vec![Some(loss)])
}

fn nll_backward(cx: &KernelCtx, g: &BwdArgs) -> KResult<Vec<Option<Tensor>>> {
    let mut out = grads_out(cx);
    if !g.need(0) {
        return Ok(out);
    }
    let l = loss_cfg(cx)?;
    let shape = cx.in_shape(0)?;
    let dy = g.grad(cx, 0)?;
    let weights = if present(cx, 2) {
        Some(g.input(2)?)
    } else {
        None
    };
    let (idx, w) = label_weights(&l, g.input(1)?, weights, dy.dtype())?;
    let coef = (per_element_grad(&l, &dy, &w)? * &w)?.neg()?.unsqueeze(1)?;
    let d = Tensor::zeros(shape, dy.dtype(), cx.device)?.scatter_add(
        &idx.contiguous()?,
        &coef.contiguous()?,
        1,
    )?;
    set(&mut out, 0, d);
    Ok(out)
}

pub fn register(r: &mut KernelRegistry) {
    let mut add =
        |op: &'static str, forward: ForwardFn, extra: Option<ExtraFn>, backward: BackwardFn| {
            r.insert(
                op,
                Kernel {
                    forward,
                    extra,
                    backward: Some(backward),
                },
            );
        };
    add("LpPool", lp_pool_forward, None, lp_pool_backward);
    add("GlobalLpPool", global_lp_forward, None, global_lp_backward);
    add("MaxUnpool", max_unpool_forward, None, max_unpool_backward);
    add("RoiAlign", roi_align_forward, None, roi_align_backward);
    add("Col2Im", col2im_forward, None, col2im_backward);
    add(
        "CenterCropPad",
        center_crop_pad_forward,
        None,
        center_crop_pad_backward,
    );
    add(
        "AffineGrid",
        affine_grid_forward,
        None,
        affine_grid_backward,
    );
    add(
        "SoftmaxCrossEntropyLoss",
        sce_forward,
        Some(sce_extra),
        sce_backward,
    );
    add("NegativeLogLikelihoodLoss", nll_forward, None, nll_backward);
}

#[cfg(test)]
mod tests {
    use crate::exec::kernels::attention::tests::{close, forward, t, vals};
    use crate::exec::testing::{check, int, ints, string, Case, In};
    use crate::tensor::DType;
    use candle_core::{Device, Tensor};

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

    #[test]
    fn roi_align() {
        let rois = vec![0.5, 1.0, 4.2, 3.9, 1.2, 0.3, 5.5, 4.4];
        for ratio in [2, 0] {
            check(
                &Case::new(
                    "RoiAlign",
                    16,
                    vec![
                        In::Rand(vec![2, 2, 5, 6]),
                        In::Floats(vec![2, 4], rois.clone()),
                        In::Ints(DType::I64, vec![2], vec![1, 0]),
                    ],
                )
                .attr(int("output_height", 2))
                .attr(int("output_width", 3))
                .attr(int("sampling_ratio", ratio)),
            );
        }
    }

    #[test]
    fn roi_align_max_mode() {
        // Boxes partly outside the image (zero samples count in the max).
        let rois = vec![0.5, 1.0, 4.2, 3.9, -1.5, 0.3, 5.5, 6.4];
        check(
            &Case::new(
                "RoiAlign",
                16,
                vec![
                    In::Rand(vec![2, 2, 5, 6]),
                    In::Floats(vec![2, 4], rois),
                    In::Ints(DType::I64, vec![2], vec![1, 0]),
                ],
            )
            .attr(string("mode", "max"))
            .attr(int("output_height", 2))
            .attr(int("output_width", 2)),
        );
        // One sample at a pixel centre: the max of its weighted corners is the pixel itself.
        let x: Vec<f64> = (0..16).map(|i| i as f64).collect();
        let y = forward(
            "RoiAlign",
            16,
            &[string("mode", "max"), int("sampling_ratio", 1)],
            &[
                Some(t(&x, &[1, 1, 4, 4])),
                Some(t(&[1.0, 1.0, 3.0, 3.0], &[1, 4])),
                Some(Tensor::from_vec(vec![0i64], 1, &Device::Cpu).unwrap()),
            ],
            &[],
            1,
        )
        .unwrap();
        // Half-pixel: the box spans [0.5, 2.5), its single sample sits at (1.5, 1.5), whose
        // four corners weigh 0.25 each: the max is 0.25 · x[2, 2] = 2.5.
        close(&vals(&y[0]), &[2.5], 1e-12);
    }

    #[test]
    fn roi_align_interpolates_a_linear_image_exactly() {
        // X[h, w] = w: every bilinear sample is its own x coordinate, so each output is the
        // x centre of its bin (half-pixel: the box [1, 4) starts at 0.5, bins of width 1).
        let x: Vec<f64> = (0..5 * 6).map(|i| (i % 6) as f64).collect();
        let y = forward(
            "RoiAlign",
            16,
            &[
                int("output_height", 1),
                int("output_width", 3),
                int("sampling_ratio", 2),
            ],
            &[
                Some(t(&x, &[1, 1, 5, 6])),
                Some(t(&[1.0, 1.0, 4.0, 3.0], &[1, 4])),
                Some(Tensor::from_vec(vec![0i64], 1, &Device::Cpu).unwrap()),
            ],
            &[],
            1,
        )
        .unwrap();
        close(&vals(&y[0]), &[1.0, 2.0, 3.0], 1e-12);
    }

    #[test]
    fn col2im() {
        check(&Case::new(
            "Col2Im",
            18,
            vec![
                In::Rand(vec![1, 8, 12]),
                In::Const(DType::I64, vec![2], vec![4.0, 5.0]),
                In::Const(DType::I64, vec![2], vec![2.0, 2.0]),
            ],
        ));
        check(
            &Case::new(
                "Col2Im",
                18,
                vec![
                    In::Rand(vec![2, 4, 12]),
                    In::Const(DType::I64, vec![2], vec![5.0, 5.0]),
                    In::Const(DType::I64, vec![2], vec![2.0, 2.0]),
                ],
            )
            .attr(ints("dilations", &[2, 1]))
            .attr(ints("strides", &[1, 2]))
            .attr(ints("pads", &[1, 0, 0, 1])),
        );
        let ones = Tensor::ones((1, 4, 4), candle_core::DType::F64, &Device::Cpu).unwrap();
        let cv = |v: &[i64]| Tensor::from_vec(v.to_vec(), v.len(), &Device::Cpu).unwrap();
        let y = forward(
            "Col2Im",
            18,
            &[],
            &[Some(ones), Some(cv(&[3, 3])), Some(cv(&[2, 2]))],
            &[1, 2],
            1,
        )
        .unwrap();
        close(
            &vals(&y[0]),
            &[1.0, 2.0, 1.0, 2.0, 4.0, 2.0, 1.0, 2.0, 1.0],
            0.0,
        );
    }

    #[test]
    fn center_crop_pad() {
        check(
            &Case::new(
                "CenterCropPad",
                18,
                vec![
                    In::Rand(vec![4, 5, 3]),
                    In::Const(DType::I64, vec![2], vec![2.0, 8.0]),
                ],
            )
            .attr(ints("axes", &[0, 1])),
        );
        check(&Case::new(
            "CenterCropPad",
            18,
            vec![
                In::Rand(vec![5, 3]),
                In::Const(DType::I64, vec![2], vec![3.0, 4.0]),
            ],
        ));
        let x: Vec<f64> = (0..5).map(|i| i as f64).collect();
        let cv = Tensor::from_vec(vec![3i64], 1, &Device::Cpu).unwrap();
        let y = forward(
            "CenterCropPad",
            18,
            &[],
            &[Some(t(&x, &[5])), Some(cv)],
            &[1],
            1,
        )
        .unwrap();
        close(&vals(&y[0]), &[1.0, 2.0, 3.0], 0.0);
    }

    #[test]
    fn affine_grid() {
        for align in [0, 1] {
            check(
                &Case::new(
                    "AffineGrid",
                    20,
                    vec![
                        In::Rand(vec![2, 2, 3]),
                        In::Const(DType::I64, vec![4], vec![2.0, 1.0, 3.0, 4.0]),
                    ],
                )
                .attr(int("align_corners", align)),
            );
        }
        check(&Case::new(
            "AffineGrid",
            20,
            vec![
                In::Rand(vec![1, 3, 4]),
                In::Const(DType::I64, vec![5], vec![1.0, 1.0, 2.0, 3.0, 2.0]),
            ],
        ));
        // The identity transform gives the base grid: x over W first, then y over H.
        let theta = t(&[1.0, 0.0, 0.0, 0.0, 1.0, 0.0], &[1, 2, 3]);
        let size = Tensor::from_vec(vec![1i64, 1, 2, 2], 4, &Device::Cpu).unwrap();
        let y = forward(
            "AffineGrid",
            20,
            &[int("align_corners", 1)],
            &[Some(theta), Some(size)],
            &[1],
            1,
        )
        .unwrap();
        close(
            &vals(&y[0]),
            &[-1.0, -1.0, 1.0, -1.0, -1.0, 1.0, 1.0, 1.0],
            1e-12,
        );
    }

    #[test]
    fn softmax_cross_entropy() {
        let labels = In::Ints(DType::I64, vec![3], vec![2, 0, 3]);
        check(&Case::new(
            "SoftmaxCrossEntropyLoss",
            13,
            vec![In::Rand(vec![3, 4]), labels.clone()],
        ));
        check(
            &Case::new(
                "SoftmaxCrossEntropyLoss",
                13,
                vec![
                    In::Rand(vec![3, 4]),
                    In::Ints(DType::I64, vec![3], vec![2, -1, 3]),
                    In::Const(DType::F32, vec![4], vec![0.5, 1.0, 2.0, 1.5]),
                ],
            )
            .attr(int("ignore_index", -1))
            .outputs(2),
        );
        for reduction in ["none", "sum"] {
            check(
                &Case::new(
                    "SoftmaxCrossEntropyLoss",
                    13,
                    vec![
                        In::Rand(vec![2, 3, 2]),
                        In::Ints(DType::I32, vec![2, 2], vec![0, 2, 1, 1]),
                    ],
                )
                .attr(string("reduction", reduction)),
            );
        }
        // Value: mean of -log softmax at the labels, weighted.
        let s = [0.1, 0.5, -0.2, 0.3, 0.0, 0.9];
        let y = forward(
            "SoftmaxCrossEntropyLoss",
            13,
            &[],
            &[
                Some(t(&s, &[2, 3])),
                Some(Tensor::from_vec(vec![1i64, 2], 2, &Device::Cpu).unwrap()),
                Some(t(&[1.0, 2.0, 3.0], &[3])),
            ],
            &[],
            1,
        )
        .unwrap();
        let lse = |r: &[f64]| r.iter().map(|v| v.exp()).sum::<f64>().ln();
        let want = (2.0 * (lse(&s[..3]) - 0.5) + 3.0 * (lse(&s[3..]) - 0.9)) / 5.0;
        close(&vals(&y[0].reshape(1).unwrap()), &[want], 1e-12);
    }

    #[test]
    fn negative_log_likelihood() {
        check(&Case::new(
            "NegativeLogLikelihoodLoss",
            13,
            vec![
                In::Rand(vec![3, 4]),
                In::Ints(DType::I64, vec![3], vec![2, 0, 3]),
            ],
        ));
        check(
            &Case::new(
                "NegativeLogLikelihoodLoss",
                13,
                vec![
                    In::Rand(vec![2, 3, 2]),
                    In::Ints(DType::I64, vec![2, 2], vec![0, 5, 1, 2]),
                    In::Const(DType::F32, vec![3], vec![0.5, 1.0, 2.0]),
                ],
            )
            .attr(int("ignore_index", 5))
            .attr(string("reduction", "sum")),
        );
        let bad = Case::new(
            "NegativeLogLikelihoodLoss",
            13,
            vec![
                In::Rand(vec![2, 3]),
                In::Ints(DType::I64, vec![2], vec![0, 3]),
            ],
        );
        let err =
            crate::exec::testing::check_on(&bad, &Device::Cpu).expect_err("label 3 of 3 classes");
        assert!(err.0.contains("labels"), "{}", err.0);
    }

    #[test]
    fn f32_agrees_with_f64() {
        use crate::exec::kernels::attention::tests::{same_in, seq};
        let dt = candle_core::DType::F32;
        let x = t(&seq(2 * 2 * 5 * 6, 0.7, 0.1), &[2, 2, 5, 6]);
        same_in(
            "LpPool",
            18,
            &[
                ints("kernel_shape", &[2, 3]),
                ints("strides", &[2, 1]),
                ints("pads", &[1, 1, 0, 1]),
            ],
            &[Some(x.clone())],
            &[],
            1,
            dt,
            1e-4,
        );
        same_in(
            "GlobalLpPool",
            2,
            &[int("p", 3)],
            &[Some(x.clone())],
            &[],
            1,
            dt,
            1e-4,
        );
        let rois = t(&[0.5, 1.0, 4.2, 3.9, 1.2, 0.3, 5.5, 4.4], &[2, 4]);
        let b = Tensor::from_vec(vec![1i64, 0], 2, &Device::Cpu).unwrap();
        same_in(
            "RoiAlign",
            16,
            &[int("output_height", 2), int("output_width", 2)],
            &[Some(x.clone()), Some(rois), Some(b)],
            &[1],
            1,
            dt,
            1e-4,
        );
        let labels = Tensor::from_vec(vec![1i64, -1, 0, 2], 4, &Device::Cpu).unwrap();
        let scores = t(&seq(12, 0.9, 0.4), &[4, 3]);
        let w = t(&[1.0, 2.0, 0.5], &[3]);
        same_in(
            "SoftmaxCrossEntropyLoss",
            13,
            &[int("ignore_index", -1)],
            &[Some(scores.clone()), Some(labels.clone()), Some(w)],
            &[2],
            2,
            dt,
            1e-4,
        );
        same_in(
            "NegativeLogLikelihoodLoss",
            13,
            &[int("ignore_index", -1)],
            &[Some(scores), Some(labels)],
            &[],
            1,
            dt,
            1e-4,
        );
        let theta = t(&seq(12, 0.5, 0.0), &[2, 2, 3]);
        let size = Tensor::from_vec(vec![2i64, 1, 3, 4], 4, &Device::Cpu).unwrap();
        same_in(
            "AffineGrid",
            20,
            &[],
            &[Some(theta), Some(size)],
            &[1],
            1,
            dt,
            1e-4,
        );
    }
}
