//! Resize and Upsample.

use crate::kernel::kbail;
use crate::kernel::{BwdArgs, Extras, Inputs, KResult, Kernel, KernelCtx, KernelRegistry, Outs};
use crate::kernels::common::{grad0, select, unselect};
use candle_core::{DType as CD, Device, Tensor};
use remat_planner::ops::array::resize::aspect_scale;

#[derive(Clone, Copy, PartialEq)]
enum Interp {
    Nearest,
    Linear,
    Cubic,
}

/// One resized axis: every output position reads `taps` sources (index and weight lists, one
/// entry per output position); nearest has one tap of weight 1.
struct AxisMap {
    axis: usize,
    taps: Vec<(Vec<i64>, Vec<f64>)>,
}

/// The factor `k` when a one-tap map repeats every source `k` times (`src[i] = i / k`): an
/// integer nearest upsampling, run as a broadcast instead of a gather.
fn repeat_factor(m: &AxisMap, d: usize) -> Option<usize> {
    let [(src, _)] = m.taps.as_slice() else {
        return None;
    };
    let k = src.len().checked_div(d)?;
    (k > 1 && src.len() == d * k && src.iter().enumerate().all(|(i, &s)| s == (i / k) as i64))
        .then_some(k)
}

/// `(kh, kw)` when the maps upsample only the last two axes of a 4-D float tensor by powers
/// of two: candle's `upsample_nearest2d` (exact for such factors) and a sum pool then apply.
fn pow2_upsample(maps: &[AxisMap], dims: &[usize], dt: CD) -> Option<(usize, usize)> {
    if dims.len() != 4 || !dt.is_float() || maps.is_empty() {
        return None;
    }
    let mut k = [1usize; 2];
    for m in maps {
        let slot = k.get_mut(m.axis.checked_sub(2)?)?;
        *slot = repeat_factor(m, dims.get(m.axis).copied()?)?;
    }
    k.iter()
        .all(|f| f.is_power_of_two())
        .then_some((k[0], k[1]))
}

/// Repeats every entry of `x` along `axis` `k` times.
fn repeat_interleave(x: &Tensor, axis: usize, k: usize) -> KResult<Tensor> {
    let mut wide = x.dims().to_vec();
    wide.insert(axis + 1, k);
    let mut out = x.dims().to_vec();
    if let Some(d) = out.get_mut(axis) {
        *d *= k;
    }
    Ok(x.unsqueeze(axis + 1)?
        .broadcast_as(wide)?
        .contiguous()?
        .reshape(out)?)
}

/// ONNX's cubic convolution coefficients for the taps at -1, 0, 1, 2 around `t` in [0, 1).
pub(in crate::kernels) fn cubic_coeffs(t: f64, a: f64) -> [f64; 4] {
    let far = |x: f64| ((a * x - 5.0 * a) * x + 8.0 * a) * x - 4.0 * a;
    let near = |x: f64| ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0;
    [far(t + 1.0), near(t), near(1.0 - t), far(2.0 - t)]
}

fn resize_plan(cx: &KernelCtx) -> KResult<Vec<AxisMap>> {
    let in_shape = cx.in_shape(0)?;
    let out_shape = cx.out_shape(0)?;
    let rank = in_shape.len();
    if out_shape.len() != rank {
        kbail!("cannot resize {in_shape:?} to {out_shape:?}");
    }
    let legacy = cx.op == "Upsample" || cx.opset < 11;
    let mode = cx.attrs.string("mode")?.unwrap_or_else(|| "nearest".into());
    let interp = match mode.as_str() {
        "nearest" => Interp::Nearest,
        "linear" | "bilinear" => Interp::Linear,
        "cubic" if !legacy => Interp::Cubic,
        m => kbail!("attribute \"mode\" = {m:?} is not supported"),
    };
    let (coord, nearest) = if legacy {
        ("asymmetric".to_string(), "floor".to_string())
    } else {
        (
            cx.attrs
                .string("coordinate_transformation_mode")?
                .unwrap_or_else(|| "half_pixel".into()),
            cx.attrs
                .string("nearest_mode")?
                .unwrap_or_else(|| "round_prefer_floor".into()),
        )
    };
    let cubic_a = f64::from(cx.attrs.float_or("cubic_coeff_a", -0.75)?);
    let exclude_outside = cx.attrs.int_or("exclude_outside", 0)? != 0;
    if cx.attrs.int_or("antialias", 0)? != 0 {
        kbail!("attribute \"antialias\" = 1 is not supported");
    }
    // Scales per axis: the given ones when scales are the input, else output / input.
    let axes: Vec<usize> = match cx.attrs.ints("axes")? {
        Some(a) => cx.rule.axes(a, rank)?,
        None => (0..rank).collect(),
    };
    let given: Option<Vec<f64>> = if cx.op == "Upsample" && cx.opset < 9 {
        cx.attrs
            .floats("scales")?
            .map(|s| s.iter().map(|&f| f64::from(f)).collect())
    } else if legacy {
        cx.const_floats(1)?
    } else {
        let sizes = cx.const_ints(3)?.filter(|s| !s.is_empty());
        if let Some(sizes) = sizes {
            // With a kept aspect ratio every axis scales by one factor, which is not
            // output / input where the output size was rounded.
            let sizes: Vec<u64> = sizes.iter().map(|&s| s.max(0) as u64).collect();
            let in_u: Vec<u64> = in_shape.iter().map(|&d| d as u64).collect();
            aspect_scale(&cx.rule, &in_u, &axes, &sizes)?.map(|s| vec![s; axes.len()])
        } else {
            cx.const_floats(2)?
        }
    }
    .filter(|s| !s.is_empty());
    let mut scales: Vec<f64> = in_shape
        .iter()
        .zip(&out_shape)
        .map(|(&i, &o)| if i == 0 { 1.0 } else { o as f64 / i as f64 })
        .collect();
    if let Some(g) = given {
        if g.len() != axes.len() {
            kbail!("scales {g:?} do not match {} axes", axes.len());
        }
        for (k, &a) in axes.iter().enumerate() {
            if let (Some(s), Some(&v)) = (scales.get_mut(a), g.get(k)) {
                *s = v;
            }
        }
    }
    let n_taps = match interp {
        Interp::Nearest => 1,
        Interp::Linear => 2,
        Interp::Cubic => 4,
    };
    let mut maps = vec![];
    for a in 0..rank {
        let (di, dout) = (in_shape[a], out_shape[a]);
        let scale = scales[a];
        if di == 0 || dout == 0 || scale <= 0.0 {
            if di != dout {
                kbail!("cannot resize axis {a} from {di} to {dout}");
            }
            continue;
        }
        let (fi, fo) = (di as f64, dout as f64);
        let mut taps: Vec<(Vec<i64>, Vec<f64>)> =
            vec![(Vec::with_capacity(dout), Vec::with_capacity(dout)); n_taps];
        let last = di as i64 - 1;
        for i in 0..dout {
            let x = i as f64;
            let src = match coord.as_str() {
                "half_pixel" => (x + 0.5) / scale - 0.5,
                "pytorch_half_pixel" => {
                    if dout > 1 {
                        (x + 0.5) / scale - 0.5
                    } else {
                        0.0
                    }
                }
                "align_corners" => {
                    if dout == 1 {
                        0.0
                    } else {
                        x * (fi - 1.0) / (fo - 1.0)
                    }
                }
                "asymmetric" => x / scale,
                "tf_half_pixel_for_nn" => (x + 0.5) / scale,
                "half_pixel_symmetric" => {
                    let adj = fo / (scale * fi);
                    let center = fi / 2.0;
                    center * (1.0 - adj) + (x + 0.5) / scale - 0.5
                }
                m => {
                    kbail!("attribute \"coordinate_transformation_mode\" = {m:?} is not supported")
                }
            };
            let f = src.floor();
            let t = src - f;
            let f = f as i64;
            // (source, weight) per tap; out-of-range sources read the edge.
            let row: Vec<(i64, f64)> = match interp {
                Interp::Nearest => {
                    let r = match nearest.as_str() {
                        "round_prefer_floor" => {
                            if t == 0.5 {
                                f
                            } else {
                                src.round() as i64
                            }
                        }
                        "round_prefer_ceil" => {
                            if t == 0.5 {
                                f + 1
                            } else {
                                src.round() as i64
                            }
                        }
                        "floor" => f,
                        "ceil" => src.ceil() as i64,
                        m => kbail!("attribute \"nearest_mode\" = {m:?} is not supported"),
                    };
                    vec![(r, 1.0)]
                }
                Interp::Linear => vec![(f, 1.0 - t), (f + 1, t)],
                Interp::Cubic => {
                    let c = cubic_coeffs(t, cubic_a);
                    let mut row: Vec<(i64, f64)> =
                        (0..4).map(|k| (f - 1 + k, c[k as usize])).collect();
                    if exclude_outside {
                        for e in row.iter_mut() {
                            if e.0 < 0 || e.0 > last {
                                e.1 = 0.0;
                            }
                        }
                        let sum: f64 = row.iter().map(|e| e.1).sum();
                        if sum != 0.0 {
                            for e in row.iter_mut() {
                                e.1 /= sum;
                            }
                        }
                    }
                    row
                }
            };
            for (tap, (src, w)) in taps.iter_mut().zip(row) {
                tap.0.push(src.clamp(0, last));
                tap.1.push(w);
            }
        }
        // Skip axes the mapping leaves unchanged.
        let identity = dout == di
            && (0..dout).all(|i| {
                let mut acc = 0.0;
                for (src, w) in &taps {
                    if src[i] == i as i64 {
                        acc += w[i];
                    } else if w[i] != 0.0 {
                        return false;
                    }
                }
                acc == 1.0
            });
        if !identity {
            maps.push(AxisMap { axis: a, taps });
        }
    }
    Ok(maps)
}

/// Interpolation weights along `axis`, shaped to broadcast against a tensor of `rank`.
fn axis_weights(w: &[f64], axis: usize, rank: usize, dt: CD, dev: &Device) -> KResult<Tensor> {
    let mut shape = vec![1; rank];
    if let Some(s) = shape.get_mut(axis) {
        *s = w.len();
    }
    Ok(Tensor::from_vec(w.to_vec(), shape, dev)?.to_dtype(dt)?)
}

fn resize_fwd(cx: &KernelCtx, xs: &[Option<Tensor>], _: &Extras) -> Outs {
    let mut x = xs.req(0)?.clone();
    let maps = resize_plan(cx)?;
    if let Some((kh, kw)) = pow2_upsample(&maps, x.dims(), x.dtype()) {
        let (_, _, h, w) = x.dims4()?;
        return Ok(vec![Some(x.upsample_nearest2d(h * kh, w * kw)?)]);
    }
    for m in &maps {
        let d = x.dims().get(m.axis).copied().unwrap_or(0);
        if let Some(k) = repeat_factor(m, d) {
            x = repeat_interleave(&x, m.axis, k)?;
            continue;
        }
        let mut acc: Option<Tensor> = None;
        for (src, w) in &m.taps {
            let mut t = select(&x, src, m.axis)?;
            if m.taps.len() > 1 {
                t = t.broadcast_mul(&axis_weights(w, m.axis, x.rank(), x.dtype(), x.device())?)?;
            }
            acc = Some(match acc {
                Some(a) => (a + t)?,
                None => t,
            });
        }
        if let Some(a) = acc {
            x = a;
        }
    }
    Ok(vec![Some(x)])
}

fn resize_bwd(cx: &KernelCtx, a: &BwdArgs) -> Outs {
    grad0(cx, a, || {
        let shape = cx.in_shape(0)?;
        let mut g = a.grad(cx, 0)?;
        let maps = resize_plan(cx)?;
        if let Some((kh, kw)) = pow2_upsample(&maps, &shape, g.dtype()) {
            let sum = g.avg_pool2d_with_stride((kh, kw), (kh, kw))?;
            return Ok(sum.affine((kh * kw) as f64, 0.0)?);
        }
        for m in maps.iter().rev() {
            let d = shape.get(m.axis).copied().unwrap_or(0);
            if let Some(k) = repeat_factor(m, d) {
                let mut wide = g.dims().to_vec();
                if let Some(v) = wide.get_mut(m.axis) {
                    *v = d;
                }
                wide.insert(m.axis + 1, k);
                g = g.reshape(wide)?.sum(m.axis + 1)?;
                continue;
            }
            let mut acc: Option<Tensor> = None;
            for (src, w) in &m.taps {
                let gw = if m.taps.len() > 1 {
                    g.broadcast_mul(&axis_weights(w, m.axis, g.rank(), g.dtype(), g.device())?)?
                } else {
                    g.clone()
                };
                let t = unselect(&gw, src, m.axis, d)?;
                acc = Some(match acc {
                    Some(a) => (a + t)?,
                    None => t,
                });
            }
            if let Some(a) = acc {
                g = a;
            }
        }
        Ok(g)
    })
}

pub(super) fn register(r: &mut KernelRegistry) {
    r.insert("Resize", Kernel::new(resize_fwd, Some(resize_bwd)));
    r.insert("Upsample", Kernel::new(resize_fwd, Some(resize_bwd)));
}

#[cfg(test)]
mod tests {
    use crate::testing::fixed::{c64, close, f32s, fl, iota, run};
    use crate::testing::{check, ints, string, Case, In};

    #[test]
    fn resize() {
        let x = || In::Rand(vec![1, 2, 3, 4]);
        // Nearest, as the exporters write it.
        check(
            &Case::new(
                "Resize",
                13,
                vec![x(), In::None, f32s(&[1.0, 1.0, 2.0, 2.0])],
            )
            .attr(string("coordinate_transformation_mode", "asymmetric"))
            .attr(string("nearest_mode", "floor")),
        );
        check(&Case::new(
            "Resize",
            13,
            vec![x(), In::None, f32s(&[1.0, 1.0, 1.5, 0.5])],
        ));
        // Integer nearest upsampling: power-of-two fast path (one or both axes), and others.
        check(&Case::new(
            "Resize",
            13,
            vec![x(), In::None, f32s(&[1.0, 1.0, 1.0, 4.0])],
        ));
        check(&Case::new(
            "Resize",
            13,
            vec![x(), In::None, f32s(&[1.0, 1.0, 3.0, 1.0])],
        ));
        check(&Case::new(
            "Resize",
            13,
            vec![In::Rand(vec![2, 3, 2]), In::None, f32s(&[1.0, 2.0, 2.0])],
        ));
        check(
            &Case::new(
                "Resize",
                13,
                vec![x(), In::None, In::None, c64(&[1, 2, 5, 7])],
            )
            .attr(string(
                "coordinate_transformation_mode",
                "pytorch_half_pixel",
            ))
            .attr(string("nearest_mode", "round_prefer_ceil")),
        );
        // Linear with the transformations of bilinear / align_corners.
        for ctm in [
            "half_pixel",
            "align_corners",
            "pytorch_half_pixel",
            "asymmetric",
        ] {
            check(
                &Case::new(
                    "Resize",
                    13,
                    vec![x(), f32s(&[]), f32s(&[1.0, 1.0, 2.0, 1.5])],
                )
                .attr(string("mode", "linear"))
                .attr(string("coordinate_transformation_mode", ctm)),
            );
        }
        check(
            &Case::new(
                "Resize",
                13,
                vec![x(), In::None, In::None, c64(&[1, 2, 2, 3])],
            )
            .attr(string("mode", "linear"))
            .attr(string("coordinate_transformation_mode", "align_corners")),
        );
        check(
            &Case::new("Resize", 18, vec![x(), In::None, f32s(&[3.0, 0.5])])
                .attr(string("mode", "linear"))
                .attr(ints("axes", &[2, 3])),
        );
        check(&Case::new(
            "Resize",
            10,
            vec![x(), f32s(&[1.0, 1.0, 2.0, 3.0])],
        ));
        check(&Case::new(
            "Upsample",
            9,
            vec![x(), f32s(&[1.0, 1.0, 2.0, 2.0])],
        ));
        check(
            &Case::new("Upsample", 7, vec![x()])
                .attr(crate::testing::floats("scales", &[1.0, 1.0, 2.0, 2.0]))
                .attr(string("mode", "linear")),
        );
    }
    #[test]
    fn values_resize() {
        let x = || fl(&[1, 1, 2, 2], &[1.0, 2.0, 3.0, 4.0]);
        let s2 = || f32s(&[1.0, 1.0, 2.0, 2.0]);
        // ONNX backend test resize_upsample_scales_linear.
        close(
            &run(
                "Resize",
                13,
                vec![string("mode", "linear")],
                vec![x(), In::None, s2()],
            ),
            &[
                1.0, 1.25, 1.75, 2.0, 1.5, 1.75, 2.25, 2.5, 2.5, 2.75, 3.25, 3.5, 3.0, 3.25, 3.75,
                4.0,
            ],
        );
        // resize_upsample_scales_linear_align_corners.
        let t = 1.0 / 3.0;
        close(
            &run(
                "Resize",
                13,
                vec![
                    string("mode", "linear"),
                    string("coordinate_transformation_mode", "align_corners"),
                ],
                vec![x(), In::None, s2()],
            ),
            &[
                1.0,
                1.0 + t,
                1.0 + 2.0 * t,
                2.0,
                1.0 + 2.0 * t,
                2.0,
                2.0 + t,
                2.0 + 2.0 * t,
                2.0 + t,
                2.0 + 2.0 * t,
                3.0,
                3.0 + t,
                3.0,
                3.0 + t,
                3.0 + 2.0 * t,
                4.0,
            ],
        );
        // resize_downsample_scales_nearest.
        close(
            &run(
                "Resize",
                13,
                vec![],
                vec![iota(&[1, 1, 2, 4]), In::None, f32s(&[1.0, 1.0, 0.6, 0.6])],
            ),
            &[0.0, 2.0],
        );
        // resize_upsample_sizes_nearest (half_pixel, round_prefer_floor).
        let y = run(
            "Resize",
            13,
            vec![],
            vec![x(), In::None, In::None, c64(&[1, 1, 7, 8])],
        );
        let row = |a: f64, b: f64| [a, a, a, a, b, b, b, b];
        let mut want = vec![];
        for r in 0..7 {
            want.extend(if r < 4 { row(1.0, 2.0) } else { row(3.0, 4.0) });
        }
        close(&y, &want);
        close(
            &run("Resize", 13, vec![], vec![x(), In::None, s2()]),
            &[
                1.0, 1.0, 2.0, 2.0, 1.0, 1.0, 2.0, 2.0, 3.0, 3.0, 4.0, 4.0, 3.0, 3.0, 4.0, 4.0,
            ],
        );
        close(
            &run(
                "Resize",
                13,
                vec![],
                vec![x(), In::None, f32s(&[1.0, 1.0, 1.0, 3.0])],
            ),
            &[1.0, 1.0, 1.0, 2.0, 2.0, 2.0, 3.0, 3.0, 3.0, 4.0, 4.0, 4.0],
        );
        // Exporters' nearest: asymmetric + floor, and the legacy Upsample.
        let z = run(
            "Resize",
            13,
            vec![
                string("coordinate_transformation_mode", "asymmetric"),
                string("nearest_mode", "floor"),
            ],
            vec![fl(&[1, 3], &[1.0, 2.0, 3.0]), In::None, f32s(&[1.0, 2.0])],
        );
        close(&z, &[1.0, 1.0, 2.0, 2.0, 3.0, 3.0]);
        close(
            &run(
                "Upsample",
                9,
                vec![],
                vec![fl(&[1, 2], &[1.0, 2.0]), f32s(&[1.0, 3.0])],
            ),
            &[1.0, 1.0, 1.0, 2.0, 2.0, 2.0],
        );
        // pytorch_half_pixel bilinear downsampling by 2 averages neighbours.
        close(
            &run(
                "Resize",
                13,
                vec![
                    string("mode", "linear"),
                    string("coordinate_transformation_mode", "pytorch_half_pixel"),
                ],
                vec![
                    fl(&[1, 4], &[1.0, 2.0, 3.0, 5.0]),
                    In::None,
                    f32s(&[1.0, 0.5]),
                ],
            ),
            &[1.5, 4.0],
        );
    }
}
