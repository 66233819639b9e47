//! Max pooling's host loops (CPU): the argmax scan and the flat gather and scatter.

use crate::kernel::{KResult, KernelError};
use crate::kernels::common::host_unfold;
use crate::kernels::host::{self, par_build};
use crate::kernels::window::Win;
use candle_core::Tensor;

/// One step of a running maximum `(b, bi)` over values in window order: `v` (at `i`) wins
/// when greater, or when it is the first NaN. Selects, not branches: on activations the
/// comparison is a coin toss, which a branch predictor loses.
#[inline(always)]
fn max_step<T: candle_core::WithDType, const NAN: bool>(b: &mut T, bi: &mut usize, v: T, i: usize) {
    #[allow(clippy::eq_op)]
    let take = if NAN {
        (v > *b) | ((v != v) & (*b == *b))
    } else {
        v > *b
    };
    *b = std::hint::select_unpredictable(take, v, *b);
    *bi = std::hint::select_unpredictable(take, i, *bi);
}

/// Window bounds of a [`PoolArgmax`] scan: per output row `(first input row, kernel rows
/// inside)`, per output column `(first input column, kernel columns inside)`, and the output
/// columns `ia..ib` whose kernel row lies wholly inside the input.
struct ScanGeo {
    rows: Vec<(isize, (usize, usize))>,
    cols: Vec<(isize, (usize, usize))>,
    ia: usize,
    ib: usize,
}

/// Host argmax of 2-D max pooling (CPU): flat indices into the whole input, first maximum in
/// window order (NaN counts as the maximum).
#[derive(Clone, Debug)]
pub(super) struct PoolArgmax {
    pub(super) nc: usize,
    pub(super) hw: [usize; 2],
    pub(super) win: Win,
}

impl PoolArgmax {
    /// For every output position of every plane: `pick(plane index, plane, position of the
    /// maximum within the plane)`, planes spread over all threads. Window bounds are worked
    /// out once per row and column, so the inner loop reads without checks per element.
    fn scan<T: candle_core::WithDType, O: Copy + Send>(
        &self,
        x: &[T],
        zero: O,
        pick: impl Fn(usize, &[T], usize) -> O + Sync,
    ) -> Vec<O> {
        let w = &self.win;
        let (h, wd) = (self.hw[0] as isize, self.hw[1] as isize);
        let plane = self.hw[0] * self.hw[1];
        let (o0, o1) = (w.out[0], w.out[1]);
        let oo = o0 * o1;
        if oo == 0 {
            return vec![zero; self.nc * oo];
        }
        // Kernel offsets along one dim whose input position lies in `[0, len)`, for a window
        // starting at `start`.
        let range = |start: isize, k: usize, d: usize, len: isize| -> (usize, usize) {
            let d = d.max(1) as isize;
            let lo = if start >= 0 { 0 } else { (-start + d - 1) / d };
            let hi = if len - 1 - start < 0 {
                0
            } else {
                ((len - 1 - start) / d + 1).min(k as isize)
            };
            (lo as usize, (hi.max(lo)) as usize)
        };
        let rows: Vec<(isize, (usize, usize))> = (0..o0)
            .map(|oh| {
                let h0 = (oh * w.s[0]) as isize - w.pb[0] as isize;
                (h0, range(h0, w.k[0], w.d[0], h))
            })
            .collect();
        let cols: Vec<(isize, (usize, usize))> = (0..o1)
            .map(|ow| {
                let w0 = (ow * w.s[1]) as isize - w.pb[1] as isize;
                (w0, range(w0, w.k[1], w.d[1], wd))
            })
            .collect();
        // Output columns whose whole kernel row lies inside the input: these are done a row
        // at a time (the inner loop runs along the output row).
        let full = |&(_, (lo, hi)): &(isize, (usize, usize))| lo == 0 && hi == w.k[1];
        let ia = cols.iter().position(full).unwrap_or(o1);
        let ib = ia + cols[ia..].iter().take_while(|c| full(c)).count();
        let geo = ScanGeo { rows, cols, ia, ib };
        let (geo, pick) = (&geo, &pick);
        par_build(self.nc * oo, oo, zero, |u, out| {
            let Some(inp) = x.get(u * plane..(u + 1) * plane) else {
                return;
            };
            // Planes without NaN (the usual case) take the shorter comparison.
            #[allow(clippy::eq_op)]
            let nan = inp.iter().fold(false, |a, &v| a | (v != v));
            if nan {
                self.plane::<T, O, true>(geo, inp, out, &|i| pick(u, inp, i));
            } else {
                self.plane::<T, O, false>(geo, inp, out, &|i| pick(u, inp, i));
            }
        })
    }

    /// One plane of [`PoolArgmax::scan`]; `NAN`: the plane may hold NaN.
    fn plane<T: candle_core::WithDType, O, const NAN: bool>(
        &self,
        geo: &ScanGeo,
        inp: &[T],
        out: &mut [O],
        pick: &dyn Fn(usize) -> O,
    ) {
        let w = &self.win;
        let (h, wd) = (self.hw[0] as isize, self.hw[1] as isize);
        let o1 = w.out[1];
        let (ia, ib) = (geo.ia, geo.ib);
        let zero = T::from_f64(0.0);
        let mut bv = vec![zero; o1];
        let mut bi = vec![0usize; o1];
        for (oh, &(h0, (ki0, ki1))) in geo.rows.iter().enumerate() {
            let row_at = |ki: usize| (h0 + (ki * w.d[0]) as isize) as usize * self.hw[1];
            // One window, scanned on its own.
            let single = |ow: usize| {
                let (w0, (kj0, kj1)) = geo.cols[ow];
                let at = |ki: usize, kj: usize| row_at(ki) + (w0 + (kj * w.d[1]) as isize) as usize;
                if ki0 < ki1 && kj0 < kj1 {
                    let mut bi = at(ki0, kj0);
                    let mut b = inp[bi];
                    for ki in ki0..ki1 {
                        for kj in kj0..kj1 {
                            let i = at(ki, kj);
                            max_step::<T, NAN>(&mut b, &mut bi, inp[i], i);
                        }
                    }
                    bi
                } else {
                    let ih = h0.clamp(0, h - 1) as usize;
                    let iw = w0.clamp(0, wd - 1) as usize;
                    ih * self.hw[1] + iw
                }
            };
            let o = &mut out[oh * o1..(oh + 1) * o1];
            if ki0 >= ki1 || ia >= ib {
                for (ow, slot) in o.iter_mut().enumerate() {
                    *slot = pick(single(ow));
                }
                continue;
            }
            for ow in (0..ia).chain(ib..o1) {
                o[ow] = pick(single(ow));
            }
            // Running maxima along the row (the inner loop runs over the output row), window
            // order kept per output.
            let s1 = w.s[1];
            let first = |ki: usize| row_at(ki) + geo.cols[ia].0 as usize;
            for ow in ia..ib {
                bi[ow] = first(ki0) + (ow - ia) * s1;
                bv[ow] = inp[bi[ow]];
            }
            for ki in ki0..ki1 {
                for kj in 0..w.k[1] {
                    let start = first(ki) + kj * w.d[1];
                    for (k, (b, bix)) in bv[ia..ib].iter_mut().zip(&mut bi[ia..ib]).enumerate() {
                        let i = start + k * s1;
                        max_step::<T, NAN>(b, bix, inp[i], i);
                    }
                }
            }
            for ow in ia..ib {
                o[ow] = pick(bi[ow]);
            }
        }
    }

    /// Flat indices (into the whole input) of each window's maximum.
    fn run<T: candle_core::WithDType>(&self, x: &[T]) -> Vec<i64> {
        let plane = self.hw[0] * self.hw[1];
        self.scan(x, 0i64, |u, _, i| (u * plane + i) as i64)
    }
}

/// `out[j] = x[idx[j]]` (CPU, flat indices into `x`): a max pool's values from its indices.
pub(super) struct GatherFlat;

impl host::HostIdx for GatherFlat {
    const WHAT: &'static str = "gather";

    fn run<T: candle_core::WithDType>(
        &self,
        x: &[T],
        idx: &[i64],
    ) -> candle_core::Result<(Vec<T>, candle_core::Shape)> {
        const UNIT: usize = 1 << 14;
        let bad = std::sync::atomic::AtomicBool::new(false);
        let out = par_build(idx.len(), UNIT, T::from_f64(0.0), |u, o| {
            let ids = idx.get(u * UNIT..).unwrap_or(&[]);
            for (d, &i) in o.iter_mut().zip(ids) {
                match usize::try_from(i).ok().and_then(|i| x.get(i)) {
                    Some(v) => *d = *v,
                    None => bad.store(true, std::sync::atomic::Ordering::Relaxed),
                }
            }
        });
        if bad.into_inner() {
            let i = idx
                .iter()
                .find(|&&i| usize::try_from(i).map_or(true, |i| i >= x.len()))
                .copied()
                .unwrap_or(-1);
            return Err(candle_core::Error::Msg(format!(
                "index {i} outside the {} input elements",
                x.len()
            )));
        }
        Ok((out, candle_core::Shape::from(idx.len())))
    }
}

custom_op2!(GatherFlat, "remat-gather-flat", host_idx);

/// `dx` of `len` zeros with `dx[idx[j]] += g[j]` (CPU, flat indices): a max pool's backward.
/// The indices come in `planes` equal runs, run `u` pointing into plane `u` of `dx` (as a
/// max pool's do: a window never leaves its plane), so planes are filled on all threads.
pub(super) struct ScatterAddFlat {
    pub(super) len: usize,
    pub(super) planes: usize,
}

impl host::HostIdx for ScatterAddFlat {
    const WHAT: &'static str = "scatter";

    fn run<T: candle_core::WithDType>(
        &self,
        g: &[T],
        idx: &[i64],
    ) -> candle_core::Result<(Vec<T>, candle_core::Shape)> {
        let (len, planes) = (self.len, self.planes.max(1));
        if idx.len() != g.len() || !len.is_multiple_of(planes) || !g.len().is_multiple_of(planes) {
            return Err(candle_core::Error::Msg(format!(
                "{} indices for {} gradient elements in {planes} planes of {len} elements",
                idx.len(),
                g.len()
            )));
        }
        let (pl, gl) = (len / planes, g.len() / planes);
        let bad = std::sync::atomic::AtomicBool::new(false);
        let dx = par_build(len, pl.max(1), T::from_f64(0.0), |u, d| {
            let at = u * gl;
            let (Some(ids), Some(vs)) = (idx.get(at..at + gl), g.get(at..at + gl)) else {
                return;
            };
            for (&i, &v) in ids.iter().zip(vs) {
                match usize::try_from(i)
                    .ok()
                    .and_then(|i| i.checked_sub(u * pl))
                    .and_then(|i| d.get_mut(i))
                {
                    Some(o) => *o += v,
                    None => bad.store(true, std::sync::atomic::Ordering::Relaxed),
                }
            }
        });
        if bad.into_inner() {
            let (j, i) = idx
                .iter()
                .enumerate()
                .find(|&(j, &i)| {
                    let u = j / gl.max(1);
                    usize::try_from(i).map_or(true, |i| i < u * pl || i >= (u + 1) * pl)
                })
                .map_or((0, -1), |(j, &i)| (j, i));
            return Err(candle_core::Error::Msg(format!(
                "index {i} (at {j}) outside its plane: plane {} of {planes} holds elements {}..{}",
                j / gl.max(1),
                (j / gl.max(1)) * pl,
                (j / gl.max(1) + 1) * pl
            )));
        }
        Ok((dx, candle_core::Shape::from(len)))
    }
}

custom_op2!(ScatterAddFlat, "remat-scatter-add-flat", host_idx);

/// `x.flatten()[idx]` in `idx`'s shape: a host loop on the CPU, `index_select` elsewhere.
pub(super) fn gather_flat(x: &Tensor, idx: &Tensor) -> KResult<Tensor> {
    let (xf, i) = (x.flatten_all()?, idx.flatten_all()?);
    let y = if host_unfold(x.device()) {
        xf.contiguous()?
            .apply_op2_no_bwd(&i.contiguous()?, &GatherFlat)?
    } else {
        xf.index_select(&i, 0)?
    };
    Ok(y.reshape(idx.dims())?)
}

/// Zeros of `shape` with `g` added at the flat indices `idx` (a host loop on the CPU,
/// [`scatter_add_planes`] elsewhere). Each index points into its own plane (the first two
/// dims of `shape` count the planes), as a max pool's do.
pub(super) fn scatter_add_flat(g: &Tensor, idx: &Tensor, shape: &[usize]) -> KResult<Tensor> {
    let n: usize = shape.iter().product();
    let planes = shape.iter().take(2).product::<usize>();
    if !host_unfold(g.device()) {
        return scatter_add_planes(g, idx, shape);
    }
    let (gf, i) = (g.flatten_all()?, idx.flatten_all()?);
    let dx = gf
        .contiguous()?
        .apply_op2_no_bwd(&i.contiguous()?, &ScatterAddFlat { len: n, planes })?;
    Ok(dx.reshape(shape)?)
}

/// [`scatter_add_flat`] with candle's ops: one scatter-add row per plane, the indices made
/// local to their plane. (A scatter into the flat vector runs candle's CUDA kernel as one
/// thread over every index; a row per plane gives it a thread per plane: docs/bench/executor.md,
/// "On a GPU".)
pub(super) fn scatter_add_planes(g: &Tensor, idx: &Tensor, shape: &[usize]) -> KResult<Tensor> {
    let n: usize = shape.iter().product();
    let planes = shape.iter().take(2).product::<usize>().max(1);
    let (len, per) = (n / planes, g.elem_count() / planes);
    if len * planes != n || per * planes != g.elem_count() || idx.elem_count() != g.elem_count() {
        return Err(KernelError::new(format!(
            "{} indices for {} gradient elements in {planes} planes of {n} elements",
            idx.elem_count(),
            g.elem_count()
        )));
    }
    let base: Vec<i64> = (0..planes).map(|u| (u * len) as i64).collect();
    let base = Tensor::from_vec(base, (planes, 1), g.device())?;
    let local = idx
        .to_dtype(candle_core::DType::I64)?
        .reshape((planes, per))?
        .broadcast_sub(&base)?;
    let dx = Tensor::zeros((planes, len), g.dtype(), g.device())?.scatter_add(
        &local.contiguous()?,
        &g.reshape((planes, per))?.contiguous()?,
        1,
    )?;
    Ok(dx.reshape(shape)?)
}

impl candle_core::CustomOp1 for PoolArgmax {
    fn name(&self) -> &'static str {
        "remat-maxpool-argmax"
    }

    fn cpu_fwd(
        &self,
        s: &candle_core::CpuStorage,
        l: &candle_core::Layout,
    ) -> candle_core::Result<(candle_core::CpuStorage, candle_core::Shape)> {
        use candle_core::CpuStorage as S;
        let (a, b) = l
            .contiguous_offsets()
            .ok_or_else(|| candle_core::Error::Msg("pooling needs a contiguous input".into()))?;
        if b - a != self.nc * self.hw[0] * self.hw[1] || self.hw.contains(&0) {
            return Err(candle_core::Error::Msg(format!(
                "pooling input has {} elements, expected {} planes of {:?}",
                b - a,
                self.nc,
                self.hw
            )));
        }
        let idx = match s {
            S::F32(v) => self.run(&v[a..b]),
            S::F64(v) => self.run(&v[a..b]),
            S::F16(v) => self.run(&v[a..b]),
            S::BF16(v) => self.run(&v[a..b]),
            _ => {
                return Err(candle_core::Error::Msg(
                    "max pooling supports f16, bf16, f32 and f64 data only".into(),
                ))
            }
        };
        Ok((
            S::I64(idx),
            candle_core::Shape::from((self.nc, self.win.out[0] * self.win.out[1])),
        ))
    }
}
