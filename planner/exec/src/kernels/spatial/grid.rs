//! AffineGrid and GridSample (4-D, host loops).

use crate::kernel::kbail;
use crate::kernel::{
    BwdArgs, Extras, Inputs, KResult, Kernel, KernelCtx, KernelError, KernelRegistry, Outs,
};
use crate::kernels::array::resize::cubic_coeffs;
use crate::kernels::common::{grads_out, host_f64, set, usizes};
use candle_core::{DType, Tensor, D};

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
    let theta = xs.named(0, "theta")?;
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

#[derive(Clone, Copy, PartialEq)]
enum GridPad {
    Zeros,
    Border,
    Reflection,
}

#[derive(Clone, Copy, PartialEq)]
enum GridMode {
    Linear,
    Nearest,
    Cubic,
}

struct GridPlan {
    mode: GridMode,
    pad: GridPad,
    align: bool,
    /// N, C, H, W of the input; Ho, Wo of the grid.
    dims: [usize; 6],
}

fn grid_plan(cx: &KernelCtx) -> KResult<GridPlan> {
    let x = cx.in_shape(0)?;
    let g = cx.in_shape(1)?;
    if x.len() != 4 || g.len() != 4 || g[3] != 2 || g[0] != x[0] {
        kbail!("GridSample supports 4-D inputs with an [N, H, W, 2] grid, got {x:?} and {g:?}");
    }
    let mode = match cx.attrs.string("mode")?.as_deref().unwrap_or("bilinear") {
        "bilinear" | "linear" => GridMode::Linear,
        "nearest" => GridMode::Nearest,
        "bicubic" | "cubic" => GridMode::Cubic,
        m => kbail!("attribute \"mode\" = {m:?} is not supported"),
    };
    let pad = match cx
        .attrs
        .string("padding_mode")?
        .as_deref()
        .unwrap_or("zeros")
    {
        "zeros" => GridPad::Zeros,
        "border" => GridPad::Border,
        "reflection" => GridPad::Reflection,
        m => kbail!("attribute \"padding_mode\" = {m:?} is not supported"),
    };
    Ok(GridPlan {
        mode,
        pad,
        align: cx.attrs.int_or("align_corners", 0)? != 0,
        dims: [x[0], x[1], x[2], x[3], g[1], g[2]],
    })
}

/// Reflects `x` into [lo/2, hi/2] (PyTorch's `reflect_coordinates`), with d out / d x.
fn reflect(x: f64, twice_lo: f64, twice_hi: f64) -> (f64, f64) {
    if twice_lo == twice_hi {
        return (0.0, 0.0);
    }
    let min = twice_lo / 2.0;
    let span = (twice_hi - twice_lo) / 2.0;
    let (mut x, mut sign) = (x - min, 1.0);
    if x < 0.0 {
        x = -x;
        sign = -1.0;
    }
    let extra = x % span;
    let flips = (x / span).floor();
    if flips % 2.0 == 0.0 {
        (extra + min, sign)
    } else {
        (span - extra + min, -sign)
    }
}

/// Pixel coordinate of a normalized grid value along an axis of `size`, with d coord / d g.
fn unnormalize(p: &GridPlan, g: f64, size: usize) -> (f64, f64) {
    let s = size as f64;
    if p.align {
        ((g + 1.0) / 2.0 * (s - 1.0), (s - 1.0) / 2.0)
    } else {
        (((g + 1.0) * s - 1.0) / 2.0, s / 2.0)
    }
}

/// Source coordinate of a normalized grid value along an axis of `size` after the padding
/// mode, with d coord / d g.
fn grid_coord(p: &GridPlan, g: f64, size: usize) -> (f64, f64) {
    let s = size as f64;
    let (mut c, mut d) = unnormalize(p, g, size);
    let clip = |c: f64, d: f64| {
        if c <= 0.0 {
            (0.0, 0.0)
        } else if c >= s - 1.0 {
            (s - 1.0, 0.0)
        } else {
            (c, d)
        }
    };
    match p.pad {
        GridPad::Zeros => {}
        GridPad::Border => (c, d) = clip(c, d),
        GridPad::Reflection => {
            let (r, rd) = if p.align {
                reflect(c, 0.0, 2.0 * (s - 1.0))
            } else {
                reflect(c, -1.0, 2.0 * s - 1.0)
            };
            (c, d) = clip(r, d * rd);
        }
    }
    (c, d)
}

/// The pixel a bicubic tap at integer position `t` reads under the padding mode (`None`: zero).
fn cubic_tap(p: &GridPlan, t: i64, size: usize) -> Option<i64> {
    let last = size as i64 - 1;
    match p.pad {
        GridPad::Zeros => (0..=last).contains(&t).then_some(t),
        GridPad::Border => Some(t.clamp(0, last)),
        GridPad::Reflection => {
            let s = size as f64;
            let (r, _) = if p.align {
                reflect(t as f64, 0.0, 2.0 * (s - 1.0))
            } else {
                reflect(t as f64, -1.0, 2.0 * s - 1.0)
            };
            Some((r.round() as i64).clamp(0, last))
        }
    }
}

/// Derivatives of [`cubic_coeffs`] with respect to `t`.
fn cubic_coeffs_dt(t: f64, a: f64) -> [f64; 4] {
    let far = |x: f64| (3.0 * a * x - 10.0 * a) * x + 8.0 * a;
    let near = |x: f64| (3.0 * (a + 2.0) * x - 2.0 * (a + 3.0)) * x;
    [far(t + 1.0), near(t), -near(1.0 - t), -far(2.0 - t)]
}

/// Bilinear taps (y, x, weight, d weight / d cx, d weight / d cy) of a source point.
pub(super) fn taps(cx: f64, cy: f64) -> [(i64, i64, f64, f64, f64); 4] {
    let (x0, y0) = (cx.floor(), cy.floor());
    let (wx, wy) = (cx - x0, cy - y0);
    let (x0, y0) = (x0 as i64, y0 as i64);
    [
        (y0, x0, (1.0 - wx) * (1.0 - wy), -(1.0 - wy), -(1.0 - wx)),
        (y0, x0 + 1, wx * (1.0 - wy), 1.0 - wy, -wx),
        (y0 + 1, x0, (1.0 - wx) * wy, -wy, 1.0 - wx),
        (y0 + 1, x0 + 1, wx * wy, wy, wx),
    ]
}

/// Runs GridSample on host data: the output, and when `g` is given the input and grid gradients.
fn grid_sample(
    p: &GridPlan,
    x: &[f64],
    grid: &[f64],
    g: Option<&[f64]>,
) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let [n, c, h, w, ho, wo] = p.dims;
    let mut y = vec![0.0; n * c * ho * wo];
    let (mut dx, mut dgrid) = if g.is_some() {
        (vec![0.0; x.len()], vec![0.0; grid.len()])
    } else {
        (vec![], vec![])
    };
    let at = |b: usize, ch: usize, yy: i64, xx: i64| -> Option<usize> {
        (yy >= 0 && xx >= 0 && (yy as usize) < h && (xx as usize) < w)
            .then(|| ((b * c + ch) * h + yy as usize) * w + xx as usize)
    };
    for b in 0..n {
        for i in 0..ho {
            for j in 0..wo {
                let gi = ((b * ho + i) * wo + j) * 2;
                let (gx, gy) = (
                    grid.get(gi).copied().unwrap_or(0.0),
                    grid.get(gi + 1).copied().unwrap_or(0.0),
                );
                let ((sx, dsx), (sy, dsy)) = if p.mode == GridMode::Cubic {
                    (unnormalize(p, gx, w), unnormalize(p, gy, h))
                } else {
                    (grid_coord(p, gx, w), grid_coord(p, gy, h))
                };
                let (mut dcx, mut dcy) = (0.0, 0.0);
                for ch in 0..c {
                    let yi = ((b * c + ch) * ho + i) * wo + j;
                    let go = g.and_then(|g| g.get(yi).copied()).unwrap_or(0.0);
                    if p.mode == GridMode::Cubic {
                        let (x0, y0) = (sx.floor(), sy.floor());
                        let (tx, ty) = (sx - x0, sy - y0);
                        let (cxw, cyw) = (cubic_coeffs(tx, -0.75), cubic_coeffs(ty, -0.75));
                        let (dxw, dyw) = (cubic_coeffs_dt(tx, -0.75), cubic_coeffs_dt(ty, -0.75));
                        for (q, (&wy, &dwy)) in cyw.iter().zip(&dyw).enumerate() {
                            let Some(yy) = cubic_tap(p, y0 as i64 - 1 + q as i64, h) else {
                                continue;
                            };
                            for (r, (&wx, &dwx)) in cxw.iter().zip(&dxw).enumerate() {
                                let Some(xx) = cubic_tap(p, x0 as i64 - 1 + r as i64, w) else {
                                    continue;
                                };
                                if let Some(k) = at(b, ch, yy, xx) {
                                    let v = x.get(k).copied().unwrap_or(0.0);
                                    y[yi] += wx * wy * v;
                                    if let Some(d) = dx.get_mut(k) {
                                        *d += go * wx * wy;
                                    }
                                    dcx += go * v * dwx * wy;
                                    dcy += go * v * wx * dwy;
                                }
                            }
                        }
                        continue;
                    }
                    if p.mode == GridMode::Nearest {
                        let (rx, ry) = (sx.round_ties_even() as i64, sy.round_ties_even() as i64);
                        if let Some(k) = at(b, ch, ry, rx) {
                            y[yi] = x.get(k).copied().unwrap_or(0.0);
                            if let Some(d) = dx.get_mut(k) {
                                *d += go;
                            }
                        }
                        continue;
                    }
                    for (ty, tx, wt, dwx, dwy) in taps(sx, sy) {
                        if let Some(k) = at(b, ch, ty, tx) {
                            let v = x.get(k).copied().unwrap_or(0.0);
                            y[yi] += wt * v;
                            if let Some(d) = dx.get_mut(k) {
                                *d += go * wt;
                            }
                            dcx += go * v * dwx;
                            dcy += go * v * dwy;
                        }
                    }
                }
                if let Some(d) = dgrid.get_mut(gi) {
                    *d = dcx * dsx;
                }
                if let Some(d) = dgrid.get_mut(gi + 1) {
                    *d = dcy * dsy;
                }
            }
        }
    }
    (y, dx, dgrid)
}

fn grid_fwd(cx: &KernelCtx, xs: &[Option<Tensor>], _: &Extras) -> Outs {
    let p = grid_plan(cx)?;
    let x = xs.req(0)?;
    let (y, _, _) = grid_sample(&p, &host_f64(x)?, &host_f64(xs.req(1)?)?, None);
    let [n, c, _, _, ho, wo] = p.dims;
    Ok(vec![Some(
        Tensor::from_vec(y, (n, c, ho, wo), cx.device)?.to_dtype(x.dtype())?,
    )])
}

fn grid_bwd(cx: &KernelCtx, a: &BwdArgs) -> Outs {
    let p = grid_plan(cx)?;
    let x = a.input(0)?;
    let grid = a.input(1)?;
    let g = host_f64(&a.grad(cx, 0)?)?;
    let (_, dx, dgrid) = grid_sample(&p, &host_f64(x)?, &host_f64(grid)?, Some(&g));
    let mut v = vec![None; cx.inputs.len()];
    if a.need(0) {
        if let Some(slot) = v.get_mut(0) {
            *slot = Some(Tensor::from_vec(dx, x.dims(), cx.device)?.to_dtype(x.dtype())?);
        }
    }
    if a.need(1) {
        if let Some(slot) = v.get_mut(1) {
            *slot = Some(Tensor::from_vec(dgrid, grid.dims(), cx.device)?.to_dtype(grid.dtype())?);
        }
    }
    Ok(v)
}

pub(super) fn register(r: &mut KernelRegistry) {
    r.insert(
        "AffineGrid",
        Kernel::new(affine_grid_forward, Some(affine_grid_backward)),
    );
    r.insert("GridSample", Kernel::new(grid_fwd, Some(grid_bwd)));
}

#[cfg(test)]
mod tests {
    use crate::testing::tensors::{close, forward, t, vals};
    use crate::testing::{check, int, string, Case, In};
    use candle_core::{Device, Tensor};
    use remat_planner::tensor::DType;

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
    fn grid_sample() {
        let x = || In::Rand(vec![2, 2, 3, 4]);
        let g = || In::RandIn(vec![2, 3, 2, 2], -1.2, 1.2);
        for pad in ["zeros", "border", "reflection"] {
            for align in [0, 1] {
                check(
                    &Case::new("GridSample", 16, vec![x(), g()])
                        .attr(string("padding_mode", pad))
                        .attr(int("align_corners", align)),
                );
            }
        }
        check(&Case::new("GridSample", 16, vec![x(), g()]).attr(string("mode", "nearest")));
        for pad in ["zeros", "border", "reflection"] {
            check(
                &Case::new("GridSample", 16, vec![x(), g()])
                    .attr(string("mode", "bicubic"))
                    .attr(string("padding_mode", pad)),
            );
        }
        check(&Case::new("GridSample", 20, vec![x(), g()]).attr(string("mode", "linear")));
    }
}
