//! RoiAlign, Col2Im, CenterCropPad.

use crate::kernel::kbail;
use crate::kernel::{
    BwdArgs, Extras, Inputs, KResult, Kernel, KernelCtx, KernelError, KernelRegistry,
};
use crate::kernels::common::{grads_out, set, usizes};
use crate::kernels::window::IndexWin;
use candle_core::{DType, Tensor};
use remat_planner::ops::Window;

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
    let x = xs.named(0, "X")?;
    let (n, c, h, w) = x.dims4()?;
    let t = roi_table(
        cx,
        x.dims(),
        xs.named(1, "rois")?,
        xs.named(2, "batch_indices")?,
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

fn col2im_win(cx: &KernelCtx) -> KResult<IndexWin> {
    let image = cx
        .const_ints(1)?
        .ok_or_else(|| KernelError::new("image_shape (input 1) is required"))?;
    let block = cx
        .const_ints(2)?
        .ok_or_else(|| KernelError::new("block_shape (input 2) is required"))?;
    let in_dims = usizes(cx, "input 1 \"image_shape\"", &image)?;
    let kernel = usizes(cx, "input 2 \"block_shape\"", &block)?;
    let n = in_dims.len();
    if kernel.len() != n {
        kbail!("block_shape {kernel:?} does not match the {n} image dims");
    }
    let w = Window::read(&cx.rule, kernel.iter().map(|&x| x as u64).collect())?;
    let size = |v: &[u64]| v.iter().map(|&x| x as usize).collect::<Vec<usize>>();
    let (strides, dilations, pads) = (size(&w.strides), size(&w.dilations), size(&w.pads));
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
    Ok(IndexWin {
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
    let x = xs.named(0, "input")?;
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
    let mut t = xs.named(0, "input_data")?.clone();
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

pub(super) fn register(r: &mut KernelRegistry) {
    r.insert(
        "RoiAlign",
        Kernel::new(roi_align_forward, Some(roi_align_backward)),
    );
    r.insert("Col2Im", Kernel::new(col2im_forward, Some(col2im_backward)));
    r.insert(
        "CenterCropPad",
        Kernel::new(center_crop_pad_forward, Some(center_crop_pad_backward)),
    );
}

#[cfg(test)]
mod tests {
    use crate::testing::tensors::{close, forward, t, vals};
    use crate::testing::{check, int, ints, string, Case, In};
    use candle_core::{Device, Tensor};
    use remat_planner::tensor::DType;

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
}
