//! Convolutions on the host (CPU): im2col and col2im as candle custom ops, one pass over
//! contiguous memory split over threads, the per-image direct convolution, and the data
//! gradient's weight flip.

use crate::kernel::KResult;
use crate::kernels::host::{self, par_build, par_filled, par_units, threads};
use candle_core::{DType, Tensor};

// ---------------------------------------------------------------------------------------------
// 2-D convolution core (1-D and 3-D are built on it)

#[derive(Clone, Debug)]
pub(super) struct G2 {
    pub(super) k: [usize; 2],
    pub(super) s: [usize; 2],
    pub(super) d: [usize; 2],
    pub(super) pb: [usize; 2],
    pub(super) pe: [usize; 2],
    pub(super) out: [usize; 2],
    pub(super) g: usize,
}

impl G2 {
    pub(super) fn eff(&self, j: usize) -> usize {
        (self.k[j] - 1) * self.d[j] + 1
    }
}

// Host im2col / col2im (CPU): one pass over contiguous memory, split over threads. On other
// devices the convolutions run on candle's conv2d (below).

/// Unfolds `[N, C, H, W]` into columns (zeros where the window is in the padding), or folds
/// columns back (summing overlaps) when `fold`. Columns are `[N, C * kh * kw, O0 * O1]`
/// (batch-major), or `[C * kh * kw, N * O0 * O1]` when `cmajor` (one large matrix product
/// for small images).
#[derive(Clone, Debug)]
struct Unfold {
    n: usize,
    c: usize,
    hw: [usize; 2],
    p: G2,
    fold: bool,
    cmajor: bool,
}

impl Unfold {
    fn kk(&self) -> usize {
        self.p.k[0] * self.p.k[1]
    }
    fn oo(&self) -> usize {
        self.p.out[0] * self.p.out[1]
    }
    fn cols_len(&self) -> usize {
        self.n * self.c * self.kk() * self.oo()
    }
    fn x_len(&self) -> usize {
        self.n * self.c * self.hw[0] * self.hw[1]
    }

    /// Visits every row segment of one image plane a kernel offset reads: (kernel offset,
    /// first output position, first input offset, length). Consecutive output positions of a
    /// segment read input offsets `s[1]` apart; positions in the padding are left out.
    /// Only the output rows `oh0..oh1` are visited; output positions count from the first
    /// position of row `oh0`.
    fn rows_in(&self, oh0: usize, oh1: usize, mut f: impl FnMut(usize, usize, usize, usize)) {
        let p = &self.p;
        let (h, w) = (self.hw[0] as isize, self.hw[1] as isize);
        let (o0, o1) = (p.out[0], p.out[1]);
        let s1 = p.s[1].max(1) as isize;
        for ki in 0..p.k[0] {
            for kj in 0..p.k[1] {
                let kidx = ki * p.k[1] + kj;
                // Output columns whose input column `ow * s1 + off` lies in `[0, w)`.
                let off = (kj * p.d[1]) as isize - p.pb[1] as isize;
                let lo = if off >= 0 { 0 } else { (-off + s1 - 1) / s1 };
                let hi = if w - 1 - off < 0 {
                    0
                } else {
                    ((w - 1 - off) / s1 + 1).min(o1 as isize)
                };
                if hi <= lo {
                    continue;
                }
                let len = (hi - lo) as usize;
                for oh in oh0..oh1.min(o0) {
                    let ih = (oh * p.s[0] + ki * p.d[0]) as isize - p.pb[0] as isize;
                    if ih < 0 || ih >= h {
                        continue;
                    }
                    let xi = ih * w + lo * s1 + off;
                    f(kidx, (oh - oh0) * o1 + lo as usize, xi as usize, len);
                }
            }
        }
    }

    /// Fills the output unit `u` (a channel block of channel-major columns, otherwise one
    /// `(n, c)` plane of the output).
    fn unit<T: candle_core::WithDType>(&self, u: usize, src: &[T], out: &mut [T]) {
        self.unit_rows(u, src, out, 0, self.p.out[0])
    }

    /// [`Unfold::unit`] for the output rows `oh0..oh1` (batch-major columns only: a unit's
    /// columns are then `kk × (oh1 - oh0) * O1`).
    fn unit_rows<T: candle_core::WithDType>(
        &self,
        u: usize,
        src: &[T],
        out: &mut [T],
        oh0: usize,
        oh1: usize,
    ) {
        let (kk, n_all) = (self.kk(), self.n);
        let oo = (oh1.min(self.p.out[0]) - oh0.min(oh1)) * self.p.out[1];
        let rows = |f: &mut dyn FnMut(usize, usize, usize, usize)| self.rows_in(oh0, oh1, f);
        let plane = self.hw[0] * self.hw[1];
        let s = self.p.s[1].max(1);
        // Input span of a segment of `len` positions.
        let span = |len: usize| (len - 1) * s + 1;
        let gather = |dst: Option<&mut [T]>, src: Option<&[T]>| {
            if let (Some(d), Some(v)) = (dst, src) {
                if s == 1 {
                    d.copy_from_slice(v);
                } else {
                    for (d, v) in d.iter_mut().zip(v.iter().step_by(s)) {
                        *d = *v;
                    }
                }
            }
        };
        let scatter = |dst: Option<&mut [T]>, src: Option<&[T]>| {
            if let (Some(d), Some(v)) = (dst, src) {
                for (d, v) in d.iter_mut().step_by(s).zip(v) {
                    *d += *v;
                }
            }
        };
        match (self.fold, self.cmajor) {
            (false, false) => {
                if let Some(inp) = src.get(u * plane..(u + 1) * plane) {
                    rows(&mut |k, o, xi, len| {
                        let at = k * oo + o;
                        gather(out.get_mut(at..at + len), inp.get(xi..xi + span(len)));
                    });
                }
            }
            (false, true) => {
                let c = u;
                for n in 0..n_all {
                    let base = (n * self.c + c) * plane;
                    if let Some(inp) = src.get(base..base + plane) {
                        rows(&mut |k, o, xi, len| {
                            let at = (k * n_all + n) * oo + o;
                            gather(out.get_mut(at..at + len), inp.get(xi..xi + span(len)));
                        });
                    }
                }
            }
            (true, false) => {
                if let Some(inp) = src.get(u * kk * oo..(u + 1) * kk * oo) {
                    rows(&mut |k, o, xi, len| {
                        let at = k * oo + o;
                        scatter(out.get_mut(xi..xi + span(len)), inp.get(at..at + len));
                    });
                }
            }
            (true, true) => {
                let (n, c) = (u / self.c, u % self.c);
                let base = c * kk * n_all * oo;
                if let Some(inp) = src.get(base..base + kk * n_all * oo) {
                    rows(&mut |k, o, xi, len| {
                        let at = (k * n_all + n) * oo + o;
                        scatter(out.get_mut(xi..xi + span(len)), inp.get(at..at + len));
                    });
                }
            }
        }
    }

    fn apply<T: candle_core::WithDType>(&self, src: &[T]) -> Vec<T> {
        let (units, unit_len) = match (self.fold, self.cmajor) {
            (false, true) => (self.c, self.kk() * self.n * self.oo()),
            (false, false) => (self.n * self.c, self.kk() * self.oo()),
            (true, _) => (self.n * self.c, self.hw[0] * self.hw[1]),
        };
        par_build(units * unit_len, unit_len, T::from_f64(0.0), |u, out| {
            self.unit(u, src, out)
        })
    }
}

impl host::Host1 for Unfold {
    const WHAT: &'static str = "unfold";
    const HALF: bool = true;

    fn want(&self) -> Option<usize> {
        Some(if self.fold {
            self.cols_len()
        } else {
            self.x_len()
        })
    }

    fn run<T: candle_core::WithDType>(
        &self,
        x: &[T],
        _: &candle_core::Shape,
    ) -> candle_core::Result<(Vec<T>, candle_core::Shape)> {
        let shape = match (self.fold, self.cmajor) {
            (true, _) => candle_core::Shape::from((self.n, self.c, self.hw[0], self.hw[1])),
            (false, false) => candle_core::Shape::from((self.n, self.c * self.kk(), self.oo())),
            (false, true) => candle_core::Shape::from((self.c * self.kk(), self.n * self.oo())),
        };
        Ok((self.apply(x), shape))
    }
}

custom_op1!(Unfold, "remat-unfold");

/// Images with fewer output positions than this use channel-major columns (one matrix
/// product over the whole batch instead of a thin one per image).
pub(super) const CMAJOR_BELOW: usize = 256;

/// `x` `[N, C, H, W]` unfolded: `[N, g, C/g * kh * kw, O0 * O1]`, or
/// `[g, C/g * kh * kw, N * O0 * O1]` when `cmajor`.
fn im2col(x: &Tensor, p: &G2, cmajor: bool) -> KResult<Tensor> {
    let (n, c, h, w) = x.dims4()?;
    if !cmajor && pointwise(p, [h, w]) {
        return Ok(x.contiguous()?.reshape((n, p.g, c / p.g, h * w))?);
    }
    let u = Unfold {
        n,
        c,
        hw: [h, w],
        p: p.clone(),
        fold: false,
        cmajor,
    };
    let cols = x.contiguous()?.apply_op1_no_bwd(&u)?;
    let kk = p.k[0] * p.k[1];
    let oo = p.out[0] * p.out[1];
    if cmajor {
        Ok(cols.reshape((p.g, c / p.g * kk, n * oo))?)
    } else {
        Ok(cols.reshape((n, p.g, c / p.g * kk, oo))?)
    }
}

/// Whether `p` is a 1×1 window with unit strides and no padding over an `hw` image: the
/// batch-major columns are then the image itself.
fn pointwise(p: &G2, hw: [usize; 2]) -> bool {
    p.k == [1, 1] && p.s == [1, 1] && p.pb == [0, 0] && p.pe == [0, 0] && p.out == hw
}

/// Columns (as [`im2col`] lays them out) folded back to `[N, C, H, W]`.
fn col2im(
    cols: &Tensor,
    p: &G2,
    n: usize,
    c: usize,
    hw: [usize; 2],
    cmajor: bool,
) -> KResult<Tensor> {
    if !cmajor && pointwise(p, hw) {
        return Ok(cols.contiguous()?.reshape((n, c, hw[0], hw[1]))?);
    }
    let u = Unfold {
        n,
        c,
        hw,
        p: p.clone(),
        fold: true,
        cmajor,
    };
    Ok(cols.contiguous()?.apply_op1_no_bwd(&u)?)
}

/// `[N, OC, O0, O1]` as `[g, OC/g, N * O0 * O1]` (channel-major) or `[N, g, OC/g, O0 * O1]`.
fn out_cols(t: &Tensor, g: usize, cmajor: bool) -> KResult<Tensor> {
    let (n, oc, o0, o1) = t.dims4()?;
    if cmajor {
        Ok(t.transpose(0, 1)?
            .contiguous()?
            .reshape((g, oc / g, n * o0 * o1))?)
    } else {
        Ok(t.contiguous()?.reshape((n, g, oc / g, o0 * o1))?)
    }
}

pub(super) fn c2_fwd_host(x: &Tensor, w: &Tensor, p: &G2, cm: bool) -> KResult<Tensor> {
    let n = x.dim(0)?;
    let (oc, cg, kh, kw) = w.dims4()?;
    let g = p.g;
    let (_, c, h, wd) = x.dims4()?;
    if !cm && direct_ok(x, c, oc, g) && w.dtype() == x.dtype() {
        let op = ConvHost {
            n,
            c,
            hw: [h, wd],
            oc,
            p: p.clone(),
            pass: ConvPass::Fwd,
        };
        let wm = w.contiguous()?.reshape((oc, cg * kh * kw))?;
        return Ok(x.contiguous()?.apply_op2_no_bwd(&wm, &op)?);
    }
    let cols = im2col(x, p, cm)?;
    if cm {
        let y = w.reshape((g, oc / g, cg * kh * kw))?.matmul(&cols)?;
        Ok(y.reshape((oc, n, p.out[0], p.out[1]))?
            .transpose(0, 1)?
            .contiguous()?)
    } else {
        let wm = w.reshape((1, g, oc / g, cg * kh * kw))?;
        let y = wm.broadcast_matmul(&cols)?;
        Ok(y.reshape((n, oc, p.out[0], p.out[1]))?)
    }
}

/// With unit strides and dilations, the data gradient is a forward convolution of `dy` with
/// the flipped, channel-transposed weights and the complementary padding: that runs through
/// the forward pass's cache-sized tiles instead of a full-size column buffer folded back
/// (faster on resnet18's 3×3 layers: docs/bench/executor.md, "Figures behind the code").
/// `None` when the geometry does not allow it.
fn c2_dx_as_fwd(dy: &Tensor, w: &Tensor, p: &G2, input: [usize; 2]) -> KResult<Option<Tensor>> {
    let (_, _, o0, o1) = dy.dims4()?;
    let (oc, _, kh, kw) = w.dims4()?;
    let g = p.g;
    let k = [kh, kw];
    let unit = p.s == [1, 1] && p.d == [1, 1];
    if !unit
        || g == 0
        || !oc.is_multiple_of(g)
        || (0..2).any(|j| p.pb[j] >= k[j] || p.pe[j] >= k[j])
    {
        return Ok(None);
    }
    let q = G2 {
        k,
        s: [1, 1],
        d: [1, 1],
        pb: [k[0] - 1 - p.pb[0], k[1] - 1 - p.pb[1]],
        pe: [k[0] - 1 - p.pe[0], k[1] - 1 - p.pe[1]],
        out: input,
        g,
    };
    // The forward over `dy` must produce exactly the input's extent.
    if (0..2).any(|j| [o0, o1][j] + q.pb[j] + q.pe[j] + 1 != input[j] + k[j]) {
        return Ok(None);
    }
    let wt = data_grad_weights(w, g)?;
    Ok(Some(c2_fwd_host(dy, &wt, &q, false)?))
}

/// The weights `[OC, C/g, kh, kw]` of a convolution as those of its data gradient computed
/// as a convolution of `dy`: `[C, OC/g, kh, kw]`, channels transposed within each group and the
/// window flipped.
pub(super) fn data_grad_weights(w: &Tensor, g: usize) -> KResult<Tensor> {
    let (oc, cg, kh, kw) = w.dims4()?;
    if w.device().is_cpu() && g > 0 && oc.is_multiple_of(g) {
        let op = FlipTranspose {
            g,
            ocg: oc / g,
            cg,
            k: [kh, kw],
        };
        return Ok(w.contiguous()?.apply_op1_no_bwd(&op)?);
    }
    Ok(w.reshape((g, oc / g, cg, kh, kw))?
        .transpose(1, 2)?
        .reshape((g * cg, oc / g, kh, kw))?
        .flip(&[2, 3])?
        .contiguous()?)
}

/// [`data_grad_weights`] on the host, rows on all threads (it ran on the calling thread
/// alone as candle's strided copy: a layer-4 weight of resnet18 is 2.4 M elements).
#[derive(Clone, Debug)]
struct FlipTranspose {
    g: usize,
    ocg: usize,
    cg: usize,
    k: [usize; 2],
}

impl host::Host1 for FlipTranspose {
    const WHAT: &'static str = "weight flip";
    const HALF: bool = true;

    fn want(&self) -> Option<usize> {
        Some(self.g * self.ocg * self.cg * self.k[0] * self.k[1])
    }

    fn run<T: candle_core::WithDType>(
        &self,
        w: &[T],
        _: &candle_core::Shape,
    ) -> candle_core::Result<(Vec<T>, candle_core::Shape)> {
        let (ocg, cg) = (self.ocg, self.cg);
        let kk = self.k[0] * self.k[1];
        // Output row `gi * cg + c` holds, for each `o`, the window of input row
        // `gi * ocg + o`, channel `c`, reversed.
        let out = par_build(
            self.g * cg * ocg * kk,
            ocg * kk,
            T::from_f64(0.0),
            |row, dst| {
                let (gi, c) = (row / cg.max(1), row % cg.max(1));
                for (o, win) in dst.chunks_mut(kk.max(1)).enumerate() {
                    let at = ((gi * ocg + o) * cg + c) * kk;
                    if let Some(src) = w.get(at..at + kk) {
                        for (d, v) in win.iter_mut().zip(src.iter().rev()) {
                            *d = *v;
                        }
                    }
                }
            },
        );
        let shape = candle_core::Shape::from((self.g * cg, ocg, self.k[0], self.k[1]));
        Ok((out, shape))
    }
}

custom_op1!(FlipTranspose, "remat-weight-flip");

pub(super) fn c2_dx_host(
    dy: &Tensor,
    w: &Tensor,
    p: &G2,
    input: [usize; 2],
    cm: bool,
) -> KResult<Tensor> {
    let (n, _, o0, o1) = dy.dims4()?;
    let (oc, cg, kh, kw) = w.dims4()?;
    let g = p.g;
    let mut q = p.clone();
    q.out = [o0, o1];
    if !cm && direct_ok(dy, g * cg, oc, g) && w.dtype() == dy.dtype() {
        if let Some(dx) = c2_dx_as_fwd(dy, w, p, input)? {
            return Ok(dx);
        }
        let op = ConvHost {
            n,
            c: g * cg,
            hw: input,
            oc,
            p: q,
            pass: ConvPass::Dx,
        };
        let wm = w.contiguous()?.reshape((oc, cg * kh * kw))?;
        return Ok(dy.contiguous()?.apply_op2_no_bwd(&wm, &op)?);
    }
    let d = out_cols(dy, g, cm)?;
    let dcols = if cm {
        w.reshape((g, oc / g, cg * kh * kw))?
            .transpose(1, 2)?
            .matmul(&d)?
    } else {
        w.reshape((1, g, oc / g, cg * kh * kw))?
            .transpose(2, 3)?
            .broadcast_matmul(&d)?
    };
    col2im(&dcols, &q, n, g * cg, input, cm)
}

pub(super) fn c2_dw_host(x: &Tensor, dy: &Tensor, p: &G2, cm: bool) -> KResult<Tensor> {
    let (_, oc, o0, o1) = dy.dims4()?;
    let g = p.g;
    let mut q = p.clone();
    q.out = [o0, o1];
    let (n, c, h, wd) = x.dims4()?;
    if !cm && direct_ok(x, c, oc, g) && dy.dtype() == x.dtype() {
        let op = ConvHost {
            n,
            c,
            hw: [h, wd],
            oc,
            p: q,
            pass: ConvPass::Dw,
        };
        let dw = x.contiguous()?.apply_op2_no_bwd(&dy.contiguous()?, &op)?;
        return Ok(dw.reshape((oc, c / g, p.k[0], p.k[1]))?);
    }
    let cols = im2col(x, &q, cm)?;
    let d = out_cols(dy, g, cm)?;
    let dw = if cm {
        d.matmul(&cols.transpose(1, 2)?)?
    } else {
        d.matmul(&cols.transpose(2, 3)?)?.sum(0)?
    };
    let c = x.dim(1)?;
    Ok(dw.reshape((oc, c / g, p.k[0], p.k[1]))?)
}

/// A strided host matrix operand: data, rows, columns, row stride, column stride.
struct Mat<'a, T> {
    v: &'a [T],
    rows: usize,
    cols: usize,
    rs: usize,
    cs: usize,
}

impl<T> Mat<'_, T> {
    fn fits(&self) -> bool {
        self.rows == 0
            || self.cols == 0
            || (self.rows - 1) * self.rs + (self.cols - 1) * self.cs < self.v.len()
    }
}

/// `dst` (row-major `lhs.rows × rhs.cols`, rows `drs` apart) `=` (or `+=` when
/// `accumulate`) `lhs · rhs`, on the host through the gemm crate, on all threads when `par`.
/// f32 and f64 only.
fn host_gemm<T: candle_core::WithDType>(
    dst: &mut [T],
    drs: usize,
    accumulate: bool,
    lhs: Mat<'_, T>,
    rhs: Mat<'_, T>,
    par: bool,
) -> candle_core::Result<()> {
    let (m, k, n) = (lhs.rows, lhs.cols, rhs.cols);
    if !matches!(T::DTYPE, DType::F32 | DType::F64) {
        return Err(candle_core::Error::Msg(format!(
            "host matrix product of {:?} data",
            T::DTYPE
        )));
    }
    let dst_fits = m == 0 || n == 0 || (drs >= n && (m - 1) * drs + n <= dst.len());
    if rhs.rows != k || !dst_fits || !lhs.fits() || !rhs.fits() {
        return Err(candle_core::Error::Msg(format!(
            "host matrix product {m}×{k} · {}×{n} does not fit its buffers",
            rhs.rows
        )));
    }
    if m == 0 || n == 0 {
        return Ok(());
    }
    if k == 0 {
        if !accumulate {
            for row in dst.chunks_mut(drs).take(m) {
                row.iter_mut().take(n).for_each(|d| *d = T::from_f64(0.0));
            }
        }
        return Ok(());
    }
    let threads = threads();
    let par = if par && threads > 1 {
        gemm::Parallelism::Rayon(threads)
    } else {
        gemm::Parallelism::None
    };
    // SAFETY: the dtype is one gemm implements (checked above); every element the product
    // reads lies inside `lhs.v` / `rhs.v` (`fits`) and every element it writes inside `dst`
    // (`m` rows of `n`, `drs` apart: `dst_fits`); `dst` is borrowed mutably, so it overlaps
    // neither operand.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst.as_mut_ptr(),
            1,
            drs as isize,
            accumulate,
            lhs.v.as_ptr(),
            lhs.cs as isize,
            lhs.rs as isize,
            rhs.v.as_ptr(),
            rhs.cs as isize,
            rhs.rs as isize,
            T::from_f64(if accumulate { 1.0 } else { 0.0 }),
            T::from_f64(1.0),
            false,
            false,
            false,
            par,
        );
    }
    Ok(())
}

/// `len` elements of `v` from `at` (empty when out of range; the products then refuse it).
fn seg<T>(v: &[T], at: usize, len: usize) -> &[T] {
    v.get(at..at + len).unwrap_or(&[])
}

/// Which product a [`ConvHost`] computes.
#[derive(Clone, Copy, Debug)]
enum ConvPass {
    /// `(x [N, C, H, W], w [OC, C/g * kk])` → `y [N, OC, O0, O1]`.
    Fwd,
    /// `(dy [N, OC, O0, O1], w [OC, C/g * kk])` → `dx [N, C, H, W]`.
    Dx,
    /// `(x [N, C, H, W], dy [N, OC, O0, O1])` → `dw [OC, C/g * kk]`.
    Dw,
}

/// A convolution pass on the host one image at a time: the image's columns go to a buffer
/// reused across the batch (no batch-sized column tensor), and the products run straight
/// on the contiguous operands.
#[derive(Clone, Debug)]
struct ConvHost {
    n: usize,
    c: usize,
    hw: [usize; 2],
    oc: usize,
    p: G2,
    pass: ConvPass,
}

impl ConvHost {
    fn unfold(&self, fold: bool) -> Unfold {
        Unfold {
            n: 1,
            c: self.c,
            hw: self.hw,
            p: self.p.clone(),
            fold,
            cmajor: false,
        }
    }

    fn lens(&self) -> (usize, usize, usize) {
        let (n, c, oc) = (self.n, self.c, self.oc);
        let x = n * c * self.hw[0] * self.hw[1];
        let y = n * oc * self.p.out[0] * self.p.out[1];
        let w = oc * (c / self.p.g.max(1)) * self.p.k[0] * self.p.k[1];
        (x, y, w)
    }

    /// Output rows per tile of an image pass. A single-threaded forward or weight-gradient
    /// pass keeps a group's columns (`C/g * kk` rows of `rows × O1`) within about 512 KiB, so
    /// the product reads them from cache right after they are written. The data gradient, whose
    /// tiles' folds overlap (slower tiled), and a pass spread over threads (`par`) take the
    /// image whole up to the bound every pass keeps: all groups' columns of a tile within 1M
    /// elements (4 MiB in f32); without it a depthwise convolution's columns are the whole
    /// image's. (Measured: docs/bench/executor.md, "Figures behind the code".)
    fn tile_rows(&self, par: bool) -> usize {
        let (o0, o1) = (self.p.out[0], self.p.out[1]);
        if o0 == 0 || o1 == 0 {
            return o0.max(1);
        }
        let kk = self.p.k[0] * self.p.k[1];
        let ckg = (self.c / self.p.g.max(1)) * kk;
        let whole = 1024 * 1024 / (self.c * kk).max(1);
        let cols = if par || matches!(self.pass, ConvPass::Dx) {
            whole
        } else {
            whole.min(128 * 1024 / ckg.max(1))
        };
        (cols.max(o1) / o1).clamp(1, o0)
    }

    /// Whether every kernel row of the output rows `oh0..oh1` reads inside the input (no
    /// padding rows), so that tiles of such rows and one width skip the same positions.
    fn interior(&self, oh0: usize, oh1: usize) -> bool {
        let p = &self.p;
        let lo = oh0 * p.s[0];
        let hi = (oh1.max(1) - 1) * p.s[0] + (p.k[0].max(1) - 1) * p.d[0];
        lo >= p.pb[0] && hi < self.hw[0] + p.pb[0]
    }

    /// One image's pass: `buf` is the column buffer (a tile's: `C * kk * rows * O1`), `dst` the image's output (`Fwd`: `[OC, O0 * O1]`; `Dx`:
    /// `[C, H * W]`, zeros on entry) or, for `Dw`, the weight gradient the image adds to
    /// (overwritten when `!accumulate`). The image goes in tiles of output rows
    /// ([`ConvHost::tile_rows`]). `par`: spread the copies and products over all threads
    /// (used when the batch cannot be split).
    #[allow(clippy::too_many_arguments)]
    fn image<T: candle_core::WithDType>(
        &self,
        img: usize,
        a: &[T],
        b: &[T],
        buf: &mut [T],
        dst: &mut [T],
        accumulate: bool,
        par: bool,
    ) -> candle_core::Result<()> {
        let g = self.p.g.max(1);
        let (c, oc) = (self.c, self.oc);
        let (cg, ocg) = (c / g, oc / g);
        let kk = self.p.k[0] * self.p.k[1];
        let (o0, o1) = (self.p.out[0], self.p.out[1]);
        let oo = o0 * o1;
        let plane = self.hw[0] * self.hw[1];
        let ckg = cg * kk;
        let unf = self.unfold(false);
        let fold = self.unfold(true);
        let step = self.tile_rows(par);
        // The unfold skips padding positions: the buffer must hold zeros there, which a
        // previous tile with another layout may have overwritten.
        let mut prev: Option<(usize, bool)> = None;
        for oh0 in (0..o0).step_by(step) {
            let oh1 = (oh0 + step).min(o0);
            let tw = (oh1 - oh0) * o1;
            let j0 = oh0 * o1;
            let tile = buf.get_mut(..c * kk * tw).unwrap_or(&mut []);
            if let ConvPass::Fwd | ConvPass::Dw = self.pass {
                let inner = self.interior(oh0, oh1);
                if prev != Some((tw, true)) || !inner {
                    tile.iter_mut().for_each(|v| *v = T::from_f64(0.0));
                }
                prev = Some((tw, inner));
                let x = seg(a, img * c * plane, c * plane);
                if par {
                    par_units(tile, kk * tw, |u, o| unf.unit_rows(u, x, o, oh0, oh1));
                } else {
                    for (u, o) in tile.chunks_mut(kk * tw).enumerate() {
                        unf.unit_rows(u, x, o, oh0, oh1);
                    }
                }
            }
            for gi in 0..g {
                match self.pass {
                    ConvPass::Fwd => {
                        let at = gi * ocg * oo + j0;
                        let d = dst.get_mut(at..).unwrap_or(&mut []);
                        let lhs = Mat {
                            v: seg(b, gi * ocg * ckg, ocg * ckg),
                            rows: ocg,
                            cols: ckg,
                            rs: ckg,
                            cs: 1,
                        };
                        let rhs = Mat {
                            v: seg(tile, gi * ckg * tw, ckg * tw),
                            rows: ckg,
                            cols: tw,
                            rs: tw,
                            cs: 1,
                        };
                        host_gemm(d, oo, false, lhs, rhs, par)?;
                    }
                    ConvPass::Dx => {
                        let at = gi * ckg * tw;
                        let cols = tile.get_mut(at..at + ckg * tw).unwrap_or(&mut []);
                        let lhs = Mat {
                            v: seg(b, gi * ocg * ckg, ocg * ckg),
                            rows: ckg,
                            cols: ocg,
                            rs: 1,
                            cs: ckg,
                        };
                        let rhs = Mat {
                            v: seg(a, (img * oc + gi * ocg) * oo + j0, (ocg - 1) * oo + tw),
                            rows: ocg,
                            cols: tw,
                            rs: oo,
                            cs: 1,
                        };
                        host_gemm(cols, tw, false, lhs, rhs, par)?;
                    }
                    ConvPass::Dw => {
                        let at = gi * ocg * ckg;
                        let d = dst.get_mut(at..at + ocg * ckg).unwrap_or(&mut []);
                        let lhs = Mat {
                            v: seg(b, (img * oc + gi * ocg) * oo + j0, (ocg - 1) * oo + tw),
                            rows: ocg,
                            cols: tw,
                            rs: oo,
                            cs: 1,
                        };
                        let rhs = Mat {
                            v: seg(tile, gi * ckg * tw, ckg * tw),
                            rows: tw,
                            cols: ckg,
                            rs: 1,
                            cs: tw,
                        };
                        host_gemm(d, ckg, accumulate || oh0 > 0, lhs, rhs, par)?;
                    }
                }
            }
            if let ConvPass::Dx = self.pass {
                let dx = dst.get_mut(..c * plane).unwrap_or(&mut []);
                let tile = &*tile;
                if par {
                    par_units(dx, plane, |u, o| fold.unit_rows(u, tile, o, oh0, oh1));
                } else {
                    for (u, o) in dx.chunks_mut(plane).enumerate() {
                        fold.unit_rows(u, tile, o, oh0, oh1);
                    }
                }
            }
        }
        Ok(())
    }

    /// The whole batch. With at least two images and two threads, each thread takes a run of
    /// images with a column buffer of its own and single-threaded products (no
    /// synchronisation inside an image; the weight gradient is summed from per-thread
    /// partial sums); otherwise images go one at a time, each spread over all threads.
    fn apply<T: candle_core::WithDType>(&self, a: &[T], b: &[T]) -> candle_core::Result<Vec<T>> {
        let g = self.p.g.max(1);
        let (c, oc) = (self.c, self.oc);
        let kk = self.p.k[0] * self.p.k[1];
        let oo = self.p.out[0] * self.p.out[1];
        let plane = self.hw[0] * self.hw[1];
        let ckg = c / g * kk;
        // The column buffer holds one tile (`image` builds the columns a tile of output rows
        // at a time), not the whole image's columns, of which a tile uses about 512 KiB.
        let buf_len = |par: bool| c * kk * self.p.out[1] * self.tile_rows(par);
        let (out_len, per_img) = match self.pass {
            ConvPass::Fwd => (self.n * oc * oo, oc * oo),
            ConvPass::Dx => (self.n * c * plane, c * plane),
            ConvPass::Dw => (oc * ckg, 0),
        };
        let zero = T::from_f64(0.0);
        let mut out = par_filled(out_len, zero);
        let workers = threads().min(self.n);
        if workers <= 1 {
            let mut buf = vec![zero; buf_len(true)];
            for img in 0..self.n {
                let dst = match self.pass {
                    ConvPass::Dw => &mut out[..],
                    _ => out
                        .get_mut(img * per_img..(img + 1) * per_img)
                        .unwrap_or(&mut []),
                };
                self.image(img, a, b, &mut buf, dst, img > 0, true)?;
            }
            return Ok(out);
        }
        let per = self.n.div_ceil(workers);
        let buf_len = buf_len(false);
        if let ConvPass::Dw = self.pass {
            let partials = host::par_map((0..self.n).step_by(per), |_, first| {
                let mut buf = vec![zero; buf_len];
                let mut dw = vec![zero; out_len];
                for img in first..(first + per).min(self.n) {
                    self.image(img, a, b, &mut buf, &mut dw, img > first, false)?;
                }
                Ok::<_, candle_core::Error>(dw)
            });
            for part in partials {
                for (o, v) in out.iter_mut().zip(part?) {
                    *o += v;
                }
            }
            return Ok(out);
        }
        let results = host::par_map(out.chunks_mut(per * per_img), |wi, chunk| {
            let mut buf = vec![zero; buf_len];
            for (k, dst) in chunk.chunks_mut(per_img).enumerate() {
                self.image(wi * per + k, a, b, &mut buf, dst, false, false)?;
            }
            Ok::<_, candle_core::Error>(())
        });
        for r in results {
            r?;
        }
        Ok(out)
    }
}

impl host::Host2 for ConvHost {
    const WHAT: &'static str = "host convolution";

    fn want(&self) -> [Option<usize>; 2] {
        let (x, y, w) = self.lens();
        match self.pass {
            ConvPass::Fwd => [Some(x), Some(w)],
            ConvPass::Dx => [Some(y), Some(w)],
            ConvPass::Dw => [Some(x), Some(y)],
        }
    }

    fn run<T: candle_core::WithDType>(
        &self,
        a: &[T],
        b: &[T],
        _: &candle_core::Shape,
    ) -> candle_core::Result<(Vec<T>, candle_core::Shape)> {
        let (_, _, w) = self.lens();
        let shape = match self.pass {
            ConvPass::Fwd => {
                candle_core::Shape::from((self.n, self.oc, self.p.out[0], self.p.out[1]))
            }
            ConvPass::Dx => candle_core::Shape::from((self.n, self.c, self.hw[0], self.hw[1])),
            ConvPass::Dw => candle_core::Shape::from((self.oc, w / self.oc.max(1))),
        };
        Ok((self.apply(a, b)?, shape))
    }
}

custom_op2!(ConvHost, "remat-conv-host", host2);

/// Whether the per-image host convolution handles `t`'s dtype (and the groups split).
fn direct_ok(t: &Tensor, c: usize, oc: usize, g: usize) -> bool {
    matches!(t.dtype(), DType::F32 | DType::F64)
        && g > 0
        && c.is_multiple_of(g)
        && oc.is_multiple_of(g)
}

#[cfg(test)]
mod tests {

    /// The host weight flip of the data gradient equals candle's reshape / transpose / flip,
    /// with groups, on one thread and on all (above 64 Ki elements).
    #[test]
    fn weight_flip_matches_candle() {
        use super::{data_grad_weights, FlipTranspose};
        use candle_core::{Device, Tensor};
        let dev = Device::Cpu;
        for (oc, cg, kh, kw, g) in [(6, 4, 3, 2, 2), (64, 128, 3, 3, 1), (8, 3, 1, 1, 4)] {
            let w = Tensor::randn(0f32, 1.0, (oc, cg, kh, kw), &dev).unwrap();
            let got = data_grad_weights(&w, g).unwrap();
            let want = w
                .reshape((g, oc / g, cg, kh, kw))
                .unwrap()
                .transpose(1, 2)
                .unwrap()
                .reshape((g * cg, oc / g, kh, kw))
                .unwrap()
                .flip(&[2, 3])
                .unwrap()
                .contiguous()
                .unwrap();
            assert_eq!(got.dims(), want.dims());
            assert_eq!(
                got.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
                want.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
                "{oc} {cg} {kh} {kw} {g}"
            );
        }
        // The wrong element count is an error, not a panic.
        let op = FlipTranspose {
            g: 1,
            ocg: 2,
            cg: 2,
            k: [3, 3],
        };
        let w = Tensor::zeros((2, 2, 3, 2), candle_core::DType::F32, &dev).unwrap();
        assert!(w.apply_op1_no_bwd(&op).is_err());
    }
}
