//! Kernels of the neural-network family (see `exec::kernel` for the contract): convolutions,
//! matrix products, normalizations, pooling, softmax, dropout, einsum.
//!
//! Convolutions are 2-D at the core (1-D as 2-D with a unit height, 3-D as a sum of 2-D
//! convolutions over the kernel depth). On the CPU they unfold the input on the host (im2col
//! and col2im as candle custom ops, one pass over contiguous memory) and multiply with
//! candle's matmul: forward `W · cols`, data gradient `col2im(Wᵀ · dY)`, weight gradient
//! `dY · colsᵀ`. On other devices they run on candle ops only: `conv2d` forward, the data
//! gradient as a `conv2d` of the stride-dilated gradient with the flipped, transposed kernel,
//! the weight gradient as one product of the gradient with columns built from strided
//! windows. A test checks that both paths agree.
//!
//! Pooling works on strided windows of the padded input in any number of spatial dims (2-D
//! max pooling finds its argmax on the host on the CPU). Normalization statistics are
//! computed in f32 (f64 when the data is f64) and saved as f32, as the gradient rules declare.

use super::get as opt;
use super::host::{self, par_build, par_filled, par_units, threads};
use crate::exec::kernel::{
    to_candle, BwdArgs, Extras, KResult, Kernel, KernelCtx, KernelError, KernelRegistry, Rng,
};
use crate::kbail;
use candle_core::{DType, Tensor};

// ---------------------------------------------------------------------------------------------
// Small helpers

fn req(xs: &[Option<Tensor>], i: usize) -> KResult<&Tensor> {
    opt(xs, i).ok_or_else(|| KernelError::new(format!("input {i} is required but missing")))
}

/// The dtype statistics are computed in: f64 for f64 data, f32 otherwise.
fn compute_dtype(d: DType) -> DType {
    if d == DType::F64 {
        DType::F64
    } else {
        DType::F32
    }
}

/// Sums a broadcast gradient back to `shape` (ONNX multidirectional broadcasting).
fn sum_to(t: &Tensor, shape: &[usize]) -> KResult<Tensor> {
    if t.dims() == shape {
        return Ok(t.clone());
    }
    let r = t.rank();
    let q = shape.len();
    let mut t = t.clone();
    if r > q {
        let lead: Vec<usize> = (0..r - q).collect();
        t = fsum(&t, &lead)?;
    }
    let dims = t.dims().to_vec();
    let off = shape.len().saturating_sub(dims.len());
    let mut axes = vec![];
    for (i, &d) in dims.iter().enumerate() {
        let want = shape.get(i + off).copied().unwrap_or(1);
        if want == 1 && d != 1 {
            axes.push(i);
        } else if want != d {
            kbail!(
                "gradient of shape {:?} cannot be summed to {shape:?}",
                t.dims()
            );
        }
    }
    if !axes.is_empty() {
        t = fsum_keepdim(&t, &axes)?;
    }
    Ok(t.reshape(shape)?)
}

/// Sum over `dims` keeping them as unit dims. Runs of adjacent reduced (and kept) dims are
/// merged first, so that candle reduces contiguous rows (a strided reduction over several
/// dims is two orders of magnitude slower on the CPU).
fn fsum_keepdim(t: &Tensor, dims: &[usize]) -> KResult<Tensor> {
    let shape = t.dims().to_vec();
    let mut merged: Vec<(usize, bool)> = vec![];
    for (i, &d) in shape.iter().enumerate() {
        let r = dims.contains(&i);
        match merged.last_mut() {
            Some((s, rr)) if *rr == r => *s *= d,
            _ => merged.push((d, r)),
        }
    }
    let sizes: Vec<usize> = merged.iter().map(|m| m.0).collect();
    let mut v = t.contiguous()?.reshape(sizes)?;
    for (j, m) in merged.iter().enumerate().rev() {
        if m.1 {
            v = v.sum_keepdim(j)?;
        }
    }
    let keep: Vec<usize> = shape
        .iter()
        .enumerate()
        .map(|(i, &d)| if dims.contains(&i) { 1 } else { d })
        .collect();
    Ok(v.reshape(keep)?)
}

/// Sum over `dims`, dropping them.
fn fsum(t: &Tensor, dims: &[usize]) -> KResult<Tensor> {
    let kept: Vec<usize> = t
        .dims()
        .iter()
        .enumerate()
        .filter(|(i, _)| !dims.contains(i))
        .map(|(_, &d)| d)
        .collect();
    Ok(fsum_keepdim(t, dims)?.reshape(kept)?)
}

/// Shape `[1, c, 1, ...]` of rank `rank` (a per-channel vector broadcast over NCHW data).
fn chan_shape(c: usize, rank: usize) -> Vec<usize> {
    let mut s = vec![1; rank.max(1)];
    s[usize::from(rank > 1)] = c;
    s
}

/// Output dtype of a float output whose rule type is `k`'s fact (f64 when the data is f64).
fn float_out(cx: &KernelCtx, k: usize, data: DType) -> KResult<DType> {
    if data == DType::F64 {
        return Ok(DType::F64);
    }
    match cx.outputs.get(k).and_then(|f| f.as_ref()) {
        Some(f) => to_candle(f.dtype),
        None => Ok(data),
    }
}

fn want(cx: &KernelCtx, k: usize) -> bool {
    cx.outputs.get(k).map(|f| f.is_some()).unwrap_or(false)
}

/// `v` as sizes; `what` names the attribute or input in the error (`attribute "strides"`,
/// `input 1 "size"`).
pub(super) fn usizes(cx: &KernelCtx, what: &str, v: &[i64]) -> KResult<Vec<usize>> {
    v.iter()
        .map(|&x| {
            usize::try_from(x).map_err(|_| {
                KernelError::new(format!(
                    "{what} value {x} must be non-negative (node {})",
                    cx.node
                ))
            })
        })
        .collect()
}

pub(super) fn ints_attr(
    cx: &KernelCtx,
    name: &str,
    n: usize,
    default: usize,
) -> KResult<Vec<usize>> {
    match cx.attrs.ints(name)? {
        Some(v) => {
            let v = usizes(cx, &format!("attribute {name:?}"), v)?;
            if v.len() != n {
                kbail!(
                    "attribute {name:?} has {} values for {n} spatial dims",
                    v.len()
                );
            }
            Ok(v)
        }
        None => Ok(vec![default; n]),
    }
}

// ---------------------------------------------------------------------------------------------
// Windows: strides, dilations, pads of conv and pooling ops

#[derive(Clone, Debug)]
pub(super) struct Win {
    pub(super) k: Vec<usize>,
    pub(super) s: Vec<usize>,
    pub(super) d: Vec<usize>,
    pub(super) pb: Vec<usize>,
    pub(super) pe: Vec<usize>,
    /// Output spatial size.
    pub(super) out: Vec<usize>,
}

impl Win {
    fn eff(&self, j: usize) -> usize {
        (self.k[j] - 1) * self.d[j] + 1
    }
}

/// Reads strides, dilations and pads (resolving `auto_pad`) for input spatial size `input`
/// and output spatial size `out` (from the shape rule).
pub(super) fn read_win(
    cx: &KernelCtx,
    k: Vec<usize>,
    input: &[usize],
    out: &[usize],
) -> KResult<Win> {
    let n = k.len();
    if input.len() != n || out.len() != n {
        kbail!(
            "kernel has {n} spatial dims, the input {} and the output {}",
            input.len(),
            out.len()
        );
    }
    let s = ints_attr(cx, "strides", n, 1)?;
    let d = ints_attr(cx, "dilations", n, 1)?;
    if k.contains(&0) || s.contains(&0) || d.contains(&0) {
        kbail!("kernel, strides and dilations must be positive");
    }
    let auto_pad = cx.attrs.string("auto_pad")?.unwrap_or_default();
    let (pb, pe) = match auto_pad.as_str() {
        "" | "NOTSET" => {
            let p = ints_attr(cx, "pads", 2 * n, 0)?;
            (p[..n].to_vec(), p[n..].to_vec())
        }
        "VALID" => (vec![0; n], vec![0; n]),
        "SAME_UPPER" | "SAME_LOWER" => {
            let mut pb = vec![0; n];
            let mut pe = vec![0; n];
            for j in 0..n {
                let eff = (k[j] - 1) * d[j] + 1;
                let total = (out[j].saturating_sub(1) * s[j] + eff).saturating_sub(input[j]);
                if auto_pad == "SAME_UPPER" {
                    pb[j] = total / 2;
                    pe[j] = total - pb[j];
                } else {
                    pe[j] = total / 2;
                    pb[j] = total - pe[j];
                }
            }
            (pb, pe)
        }
        other => kbail!("attribute \"auto_pad\" = {other:?} is not supported"),
    };
    if out.contains(&0) {
        kbail!("output spatial size {out:?} is empty");
    }
    Ok(Win {
        k,
        s,
        d,
        pb,
        pe,
        out: out.to_vec(),
    })
}

/// Elements `off + o * s` for `o < out` along `dim`.
fn take_strided(x: &Tensor, dim: usize, off: usize, s: usize, out: usize) -> KResult<Tensor> {
    let len = x.dim(dim)?;
    if out == 0 || off + (out - 1) * s >= len {
        kbail!("window at {off} with stride {s} and {out} steps exceeds length {len}");
    }
    if s == 1 {
        return Ok(x.narrow(dim, off, out)?);
    }
    if out == 1 {
        return Ok(x.narrow(dim, off, 1)?);
    }
    let idx: Vec<u32> = (0..out).map(|o| (off + o * s) as u32).collect();
    let idx = Tensor::from_vec(idx, out, x.device())?;
    Ok(x.contiguous()?.index_select(&idx, dim)?)
}

/// Inserts `s - 1` zeros between the elements along `dim` (length `(n - 1) * s + 1`).
fn zero_insert(g: &Tensor, dim: usize, s: usize) -> KResult<Tensor> {
    let n = g.dim(dim)?;
    if s == 1 || n <= 1 {
        return Ok(g.clone());
    }
    let mut shape = g.dims().to_vec();
    shape[dim] = n * s;
    let z = g
        .unsqueeze(dim + 1)?
        .pad_with_zeros(dim + 1, 0, s - 1)?
        .reshape(shape)?;
    Ok(z.narrow(dim, 0, (n - 1) * s + 1)?)
}

/// Adjoint of [`take_strided`]: `g` placed at `off + o * s` in zeros of length `len`.
fn put_strided(g: &Tensor, dim: usize, off: usize, s: usize, len: usize) -> KResult<Tensor> {
    let z = zero_insert(g, dim, s)?;
    let zl = z.dim(dim)?;
    if off + zl > len {
        kbail!("window at {off} of length {zl} exceeds length {len}");
    }
    Ok(z.pad_with_zeros(dim, off, len - off - zl)?)
}

/// The window at kernel offset `off` (already multiplied by the dilation) over spatial dims
/// starting at `base`.
fn window(x: &Tensor, base: usize, off: &[usize], s: &[usize], out: &[usize]) -> KResult<Tensor> {
    let mut t = x.clone();
    for j in 0..off.len() {
        t = take_strided(&t, base + j, off[j], s[j], out[j])?;
    }
    Ok(t)
}

/// Adjoint of [`window`]: `g` scattered into zeros of spatial size `lens`.
fn unwindow(
    g: &Tensor,
    base: usize,
    off: &[usize],
    s: &[usize],
    lens: &[usize],
) -> KResult<Tensor> {
    let mut t = g.clone();
    for j in 0..off.len() {
        t = put_strided(&t, base + j, off[j], s[j], lens[j])?;
    }
    Ok(t)
}

/// Pads spatial dims (from `base`) with `value`.
fn pad_dims(x: &Tensor, base: usize, pb: &[usize], pe: &[usize], value: f64) -> KResult<Tensor> {
    let mut t = x.clone();
    for j in 0..pb.len() {
        let dim = base + j;
        if pb[j] == 0 && pe[j] == 0 {
            continue;
        }
        if value == 0.0 {
            t = t.pad_with_zeros(dim, pb[j], pe[j])?;
        } else {
            let mut parts = vec![];
            let mut shape = t.dims().to_vec();
            if pb[j] > 0 {
                shape[dim] = pb[j];
                parts.push(Tensor::full(value, shape.clone(), t.device())?.to_dtype(t.dtype())?);
            }
            parts.push(t.clone());
            if pe[j] > 0 {
                shape[dim] = pe[j];
                parts.push(Tensor::full(value, shape.clone(), t.device())?.to_dtype(t.dtype())?);
            }
            t = Tensor::cat(&parts, dim)?;
        }
    }
    Ok(t)
}

/// Every kernel offset (row-major over the kernel), each already multiplied by the dilation.
fn offsets(w: &Win) -> Vec<Vec<usize>> {
    let mut all: Vec<Vec<usize>> = vec![vec![]];
    for j in 0..w.k.len() {
        let mut next = vec![];
        for o in &all {
            for i in 0..w.k[j] {
                let mut v = o.clone();
                v.push(i * w.d[j]);
                next.push(v);
            }
        }
        all = next;
    }
    all
}

// ---------------------------------------------------------------------------------------------
// 2-D convolution core (1-D and 3-D are built on it)

#[derive(Clone, Debug)]
struct G2 {
    k: [usize; 2],
    s: [usize; 2],
    d: [usize; 2],
    pb: [usize; 2],
    pe: [usize; 2],
    out: [usize; 2],
    g: usize,
}

impl G2 {
    fn eff(&self, j: usize) -> usize {
        (self.k[j] - 1) * self.d[j] + 1
    }
}

/// With different dilations per dim, the kernel is dilated explicitly (zeros inserted) so
/// that candle sees dilation 1.
fn uniform_dilation(w: &Tensor, p: &G2) -> KResult<(Tensor, G2)> {
    if p.d[0] == p.d[1] {
        return Ok((w.clone(), p.clone()));
    }
    let mut w2 = w.clone();
    for j in 0..2 {
        w2 = zero_insert(&w2, 2 + j, p.d[j])?;
    }
    let mut q = p.clone();
    q.k = [p.eff(0), p.eff(1)];
    q.d = [1, 1];
    Ok((w2, q))
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

/// Whether convolutions on `dev` use the host im2col path.
fn host_unfold(dev: &candle_core::Device) -> bool {
    dev.is_cpu()
}

/// Images with fewer output positions than this use channel-major columns (one matrix
/// product over the whole batch instead of a thin one per image).
const CMAJOR_BELOW: usize = 256;

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

fn c2_fwd_host(x: &Tensor, w: &Tensor, p: &G2, cm: bool) -> KResult<Tensor> {
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
/// (measured on resnet18's 3×3 layers at batch 8, best of 12, side by side: 56×56×64 15.7 ms
/// against 24.9 ms folding; 28×28×128 19.6 ms against 23.1 ms). `None` when the geometry
/// does not allow it.
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
fn data_grad_weights(w: &Tensor, g: usize) -> KResult<Tensor> {
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

fn c2_dx_host(dy: &Tensor, w: &Tensor, p: &G2, input: [usize; 2], cm: bool) -> KResult<Tensor> {
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

fn c2_dw_host(x: &Tensor, dy: &Tensor, p: &G2, cm: bool) -> KResult<Tensor> {
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
    /// the product reads them from cache right after they are written (measured on resnet18's
    /// 56×56 layer: forward −16%, weight gradient −29%). The data gradient, whose tiles' folds
    /// overlap (measured 7% slower tiled at that size), and a pass spread over threads (`par`)
    /// take the image whole up to the bound every pass keeps: all groups' columns of a tile
    /// within 1M elements (4 MiB in f32). Without it a depthwise convolution's columns were the
    /// whole image's (mobilenet_v2's stride-2 depthwise layer at 96 channels: 10.8 MB a thread).
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
        // at a time); the whole image's columns were allocated before, of which a tile may use
        // 512 KiB (resnet18's first layer at batch 8: 7.4 MB a thread).
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

/// `x` `[N, C, H, W]`, `w` `[OC, C/g, kh, kw]` → `[N, OC, out...]`.
fn c2_fwd(x: &Tensor, w: &Tensor, p: &G2) -> KResult<Tensor> {
    if host_unfold(x.device()) {
        return c2_fwd_host(x, w, p, p.out[0] * p.out[1] < CMAJOR_BELOW);
    }
    c2_fwd_candle(x, w, p)
}

fn c2_fwd_candle(x: &Tensor, w: &Tensor, p: &G2) -> KResult<Tensor> {
    let (w, q) = uniform_dilation(w, p)?;
    let uniform_pad = q.pb[0] == q.pb[1] && q.pe[0] == q.pe[1] && q.pb[0] == q.pe[0];
    let (xin, pad) = if uniform_pad {
        (x.clone(), q.pb[0])
    } else {
        (pad_dims(x, 2, &q.pb, &q.pe, 0.0)?, 0)
    };
    let same_stride = q.s[0] == q.s[1];
    let st = if same_stride { q.s[0] } else { 1 };
    let mut y = xin.conv2d(&w, pad, st, q.d[0], q.g)?;
    if !same_stride {
        y = window(&y, 2, &[0, 0], &q.s, &q.out)?;
    }
    for j in 0..2 {
        let have = y.dim(2 + j)?;
        if have < q.out[j] {
            kbail!(
                "convolution produced {have} positions along spatial dim {j}, expected {}",
                q.out[j]
            );
        }
        if have > q.out[j] {
            y = y.narrow(2 + j, 0, q.out[j])?;
        }
    }
    Ok(y)
}

/// Gradient of [`c2_fwd`] with respect to `x` (spatial size `input`), from `dy`.
fn c2_dx(dy: &Tensor, w: &Tensor, p: &G2, input: [usize; 2]) -> KResult<Tensor> {
    if host_unfold(dy.device()) {
        let oo = dy.dim(2)? * dy.dim(3)?;
        return c2_dx_host(dy, w, p, input, oo < CMAJOR_BELOW);
    }
    c2_dx_candle(dy, w, p, input)
}

fn c2_dx_candle(dy: &Tensor, w: &Tensor, p: &G2, input: [usize; 2]) -> KResult<Tensor> {
    let (w, q) = uniform_dilation(w, p)?;
    let (oc, cg, _, _) = w.dims4()?;
    let g = q.g;
    if g == 0 || !oc.is_multiple_of(g) {
        kbail!("{oc} output channels do not split into {g} groups");
    }
    let wt = data_grad_weights(&w, g)?;
    let mut z = dy.clone();
    let mut lr = [(0isize, 0isize); 2];
    for j in 0..2 {
        z = zero_insert(&z, 2 + j, q.s[j])?;
        let o = dy.dim(2 + j)? as isize;
        let l = ((q.k[j] - 1) * q.d[j]) as isize - q.pb[j] as isize;
        let r = input[j] as isize + q.pb[j] as isize - (o - 1) * q.s[j] as isize - 1;
        lr[j] = (l, r);
    }
    let uniform = lr[0].0 == lr[0].1 && lr[1] == lr[0] && lr[0].0 >= 0;
    let pad = if uniform {
        lr[0].0 as usize
    } else {
        for (j, &(l, r)) in lr.iter().enumerate() {
            let dim = 2 + j;
            if l < 0 {
                let len = z.dim(dim)?;
                let cut = (-l) as usize;
                if cut >= len {
                    kbail!("padding {} exceeds the gradient length {len}", q.pb[j]);
                }
                z = z.narrow(dim, cut, len - cut)?;
            }
            if r < 0 {
                let len = z.dim(dim)?;
                let cut = (-r) as usize;
                if cut >= len {
                    kbail!("the gradient of length {len} does not reach the input");
                }
                z = z.narrow(dim, 0, len - cut)?;
            }
            z = z.pad_with_zeros(dim, l.max(0) as usize, r.max(0) as usize)?;
        }
        0
    };
    let dx = z.conv2d(&wt, pad, 1, q.d[0], g)?;
    let want = [dy.dim(0)?, g * cg, input[0], input[1]];
    if dx.dims() != want {
        kbail!("data gradient has shape {:?}, expected {want:?}", dx.dims());
    }
    Ok(dx)
}

/// Gradient of [`c2_fwd`] with respect to `w` (`[OC, C/g, kh, kw]`): one matrix product of
/// the gradient with the unfolded input per group.
fn c2_dw(x: &Tensor, dy: &Tensor, p: &G2) -> KResult<Tensor> {
    if host_unfold(x.device()) {
        let oo = dy.dim(2)? * dy.dim(3)?;
        return c2_dw_host(x, dy, p, oo < CMAJOR_BELOW);
    }
    c2_dw_candle(x, dy, p)
}

fn c2_dw_candle(x: &Tensor, dy: &Tensor, p: &G2) -> KResult<Tensor> {
    let (n, c, h, wd) = x.dims4()?;
    let (_, oc, o0, o1) = dy.dims4()?;
    let g = p.g;
    if g == 0 || !c.is_multiple_of(g) || !oc.is_multiple_of(g) {
        kbail!("{c} input and {oc} output channels do not split into {g} groups");
    }
    let input = [h, wd];
    let mut pe = [0usize; 2];
    for j in 0..2 {
        let o = [o0, o1][j];
        let need = (o - 1) * p.s[j] + p.eff(j);
        pe[j] = need.saturating_sub(input[j] + p.pb[j]);
    }
    let xt = pad_dims(&x.transpose(0, 1)?, 2, &p.pb, &pe, 0.0)?;
    let mut cols = Vec::with_capacity(p.k[0] * p.k[1]);
    for i in 0..p.k[0] {
        for j in 0..p.k[1] {
            cols.push(window(&xt, 2, &[i * p.d[0], j * p.d[1]], &p.s, &[o0, o1])?);
        }
    }
    let kk = n * o0 * o1;
    let cols = Tensor::stack(&cols, 1)?.reshape((g, c / g * p.k[0] * p.k[1], kk))?;
    let dym = dy.transpose(0, 1)?.contiguous()?.reshape((g, oc / g, kk))?;
    let dw = dym.matmul(&cols.t()?)?;
    Ok(dw.reshape((oc, c / g, p.k[0], p.k[1]))?)
}

// ---------------------------------------------------------------------------------------------
// Conv

/// Convolution geometry of a node: its window and groups.
struct ConvGeo {
    win: Win,
    g: usize,
}

fn conv_geo(cx: &KernelCtx, transpose: bool) -> KResult<ConvGeo> {
    let x = cx.in_shape(0)?;
    let w = cx.in_shape(1)?;
    if x.len() < 3 || w.len() != x.len() {
        kbail!("input {x:?} and weight {w:?} must be [N, C, spatial...] of the same rank");
    }
    let n = x.len() - 2;
    let g = cx.attrs.int_or("group", 1)?;
    if g < 1 {
        kbail!("attribute \"group\" = {g} must be positive");
    }
    let g = g as usize;
    let k = match cx.attrs.ints("kernel_shape")? {
        Some(v) => {
            let v = usizes(cx, "attribute \"kernel_shape\"", v)?;
            if v != w[2..] {
                kbail!("attribute \"kernel_shape\" = {v:?} does not match the weight {w:?}");
            }
            v
        }
        None => w[2..].to_vec(),
    };
    let y = cx.out_shape(0)?;
    if y.len() != x.len() {
        kbail!("output {y:?} does not match the input rank");
    }
    if x[2..].contains(&0) || y[2..].contains(&0) || x[1] == 0 || y[1] == 0 {
        kbail!("empty input {x:?} or output {y:?}");
    }
    let win = if transpose {
        convt_win(cx, k, &x[2..], &y[2..])?
    } else {
        read_win(cx, k, &x[2..], &y[2..])?
    };
    if win.k.len() != n {
        kbail!("kernel does not match {n} spatial dims");
    }
    Ok(ConvGeo { win, g })
}

/// Window of a ConvTranspose: `out` is its output (the larger side); pads from `pads`,
/// `auto_pad` or `output_shape` as the ONNX spec computes them.
fn convt_win(cx: &KernelCtx, k: Vec<usize>, input: &[usize], out: &[usize]) -> KResult<Win> {
    let n = k.len();
    let s = ints_attr(cx, "strides", n, 1)?;
    let d = ints_attr(cx, "dilations", n, 1)?;
    let op = ints_attr(cx, "output_padding", n, 0)?;
    if k.contains(&0) || s.contains(&0) || d.contains(&0) {
        kbail!("kernel, strides and dilations must be positive");
    }
    let auto_pad = cx.attrs.string("auto_pad")?.unwrap_or_default();
    let explicit_shape = cx.attrs.ints("output_shape")?.is_some();
    let mut pb = vec![0; n];
    let mut pe = vec![0; n];
    match auto_pad.as_str() {
        "" | "NOTSET" if !explicit_shape => {
            let p = ints_attr(cx, "pads", 2 * n, 0)?;
            pb = p[..n].to_vec();
            pe = p[n..].to_vec();
        }
        "" | "NOTSET" | "SAME_UPPER" | "SAME_LOWER" | "VALID" => {
            for j in 0..n {
                let eff = (k[j] - 1) * d[j] + 1;
                let full = s[j] * input[j].saturating_sub(1) + op[j] + eff;
                if auto_pad == "VALID" {
                    continue;
                }
                let total = full.checked_sub(out[j]).ok_or_else(|| {
                    KernelError::new(format!(
                        "output size {} exceeds the full transposed size {full}",
                        out[j]
                    ))
                })?;
                if auto_pad == "SAME_LOWER" {
                    pb[j] = total - total / 2;
                    pe[j] = total / 2;
                } else {
                    pb[j] = total / 2;
                    pe[j] = total - total / 2;
                }
            }
        }
        other => kbail!("attribute \"auto_pad\" = {other:?} is not supported"),
    }
    Ok(Win {
        k,
        s,
        d,
        pb,
        pe,
        out: input.to_vec(),
    })
}

/// The 2-D geometry of spatial dims `dims` of a window (a unit dim when `None`).
fn g2_of(w: &Win, dims: [Option<usize>; 2], out: [usize; 2], g: usize) -> G2 {
    let pick = |v: &[usize], j: usize, def: usize| dims[j].map(|i| v[i]).unwrap_or(def);
    G2 {
        k: [pick(&w.k, 0, 1), pick(&w.k, 1, 1)],
        s: [pick(&w.s, 0, 1), pick(&w.s, 1, 1)],
        d: [pick(&w.d, 0, 1), pick(&w.d, 1, 1)],
        pb: [pick(&w.pb, 0, 0), pick(&w.pb, 1, 0)],
        pe: [pick(&w.pe, 0, 0), pick(&w.pe, 1, 0)],
        out,
        g,
    }
}

/// A convolution in the layout candle's 2-D kernels take: 1-D data gets a unit height, 3-D
/// data is handled by the caller as a sum over kernel depth.
fn to4(t: &Tensor) -> KResult<Tensor> {
    match t.rank() {
        3 => Ok(t.unsqueeze(2)?),
        4 => Ok(t.clone()),
        r => kbail!("rank {r} is not a 1-D or 2-D convolution layout"),
    }
}

fn from4(t: &Tensor, rank: usize) -> KResult<Tensor> {
    if rank == 3 {
        Ok(t.squeeze(2)?)
    } else {
        Ok(t.clone())
    }
}

/// 2-D geometry for rank-3 or rank-4 data.
fn g2_for(geo: &ConvGeo, rank: usize, out: &[usize]) -> KResult<G2> {
    match rank {
        3 => Ok(g2_of(&geo.win, [None, Some(0)], [1, out[0]], geo.g)),
        4 => Ok(g2_of(&geo.win, [Some(0), Some(1)], [out[0], out[1]], geo.g)),
        r => kbail!("convolution over {} spatial dims is not supported", r - 2),
    }
}

/// Depth slice `t` of a padded 5-D input, as a batch of 2-D images `[N * OD, C, H, W]`.
fn depth_slice(xpd: &Tensor, w: &Win, t: usize) -> KResult<Tensor> {
    let xs = take_strided(xpd, 2, t * w.d[0], w.s[0], w.out[0])?;
    let (n, c, od, h, wd) = xs.dims5()?;
    Ok(xs
        .permute((0, 2, 1, 3, 4))?
        .contiguous()?
        .reshape((n * od, c, h, wd))?)
}

/// Depth padding of a 5-D input: left pad and the right pad the windows need.
fn depth_pads(w: &Win, depth: usize) -> (usize, usize) {
    let need = (w.out[0] - 1) * w.s[0] + w.eff(0);
    (w.pb[0], need.saturating_sub(depth + w.pb[0]))
}

/// Forward convolution of `x` with `w` under `geo` (any of 1, 2, 3 spatial dims).
fn conv_apply(x: &Tensor, w: &Tensor, geo: &ConvGeo) -> KResult<Tensor> {
    let rank = x.rank();
    if rank == 5 {
        let win = &geo.win;
        let (n, _, d, _, _) = x.dims5()?;
        let (pb, pe) = depth_pads(win, d);
        let xpd = x.pad_with_zeros(2, pb, pe)?;
        let p = g2_of(win, [Some(1), Some(2)], [win.out[1], win.out[2]], geo.g);
        let mut acc: Option<Tensor> = None;
        for t in 0..win.k[0] {
            let xs = depth_slice(&xpd, win, t)?;
            let wt = w.narrow(2, t, 1)?.squeeze(2)?.contiguous()?;
            let y = c2_fwd(&xs, &wt, &p)?;
            acc = Some(match acc {
                None => y,
                Some(a) => (a + y)?,
            });
        }
        let y = acc.ok_or_else(|| KernelError::new("empty kernel depth"))?;
        let (_, oc, oh, ow) = y.dims4()?;
        return Ok(y
            .reshape((n, win.out[0], oc, oh, ow))?
            .permute((0, 2, 1, 3, 4))?
            .contiguous()?);
    }
    let p = g2_for(geo, rank, &geo.win.out)?;
    from4(&c2_fwd(&to4(x)?, &to4(w)?, &p)?, rank)
}

/// Gradient of [`conv_apply`] with respect to its input (spatial size `input`).
fn conv_apply_dx(dy: &Tensor, w: &Tensor, geo: &ConvGeo, input: &[usize]) -> KResult<Tensor> {
    let rank = dy.rank();
    if rank == 5 {
        let win = &geo.win;
        let (n, _, od, oh, ow) = dy.dims5()?;
        let oc = dy.dim(1)?;
        let dy2 = dy
            .permute((0, 2, 1, 3, 4))?
            .contiguous()?
            .reshape((n * od, oc, oh, ow))?;
        let p = g2_of(win, [Some(1), Some(2)], [oh, ow], geo.g);
        let (pb, pe) = depth_pads(win, input[0]);
        let dp = input[0] + pb + pe;
        let mut acc: Option<Tensor> = None;
        for t in 0..win.k[0] {
            let wt = w.narrow(2, t, 1)?.squeeze(2)?.contiguous()?;
            let dxs = c2_dx(&dy2, &wt, &p, [input[1], input[2]])?;
            let c = dxs.dim(1)?;
            let dxs = dxs
                .reshape((n, od, c, input[1], input[2]))?
                .permute((0, 2, 1, 3, 4))?;
            let placed = put_strided(&dxs, 2, t * win.d[0], win.s[0], dp)?;
            acc = Some(match acc {
                None => placed,
                Some(a) => (a + placed)?,
            });
        }
        let dx = acc.ok_or_else(|| KernelError::new("empty kernel depth"))?;
        return Ok(dx.narrow(2, pb, input[0])?.contiguous()?);
    }
    let out: Vec<usize> = dy.dims()[2..].to_vec();
    let p = g2_for(geo, rank, &out)?;
    let inp = if rank == 3 {
        [1, input[0]]
    } else {
        [input[0], input[1]]
    };
    from4(&c2_dx(&to4(dy)?, &to4(w)?, &p, inp)?, rank)
}

/// Gradient of [`conv_apply`] with respect to its weight.
fn conv_apply_dw(x: &Tensor, dy: &Tensor, geo: &ConvGeo) -> KResult<Tensor> {
    let rank = x.rank();
    if rank == 5 {
        let win = &geo.win;
        let (n, _, d, _, _) = x.dims5()?;
        let (_, oc, od, oh, ow) = dy.dims5()?;
        let dy2 = dy
            .permute((0, 2, 1, 3, 4))?
            .contiguous()?
            .reshape((n * od, oc, oh, ow))?;
        let (pb, pe) = depth_pads(win, d);
        let xpd = x.pad_with_zeros(2, pb, pe)?;
        let p = g2_of(win, [Some(1), Some(2)], [oh, ow], geo.g);
        let mut parts = vec![];
        for t in 0..win.k[0] {
            let xs = depth_slice(&xpd, win, t)?;
            parts.push(c2_dw(&xs, &dy2, &p)?);
        }
        return Ok(Tensor::stack(&parts, 2)?);
    }
    let out: Vec<usize> = dy.dims()[2..].to_vec();
    let p = g2_for(geo, rank, &out)?;
    from4(&c2_dw(&to4(x)?, &to4(dy)?, &p)?, rank)
}

fn bias_grad(g: &Tensor) -> KResult<Tensor> {
    let dims: Vec<usize> = (0..g.rank()).filter(|&d| d != 1).collect();
    fsum(g, &dims)
}

fn add_bias(y: Tensor, b: Option<&Tensor>) -> KResult<Tensor> {
    match b {
        None => Ok(y),
        Some(b) => {
            let c = y.dim(1)?;
            if b.elem_count() != c {
                kbail!("bias has {} elements for {c} channels", b.elem_count());
            }
            Ok(y.broadcast_add(&b.reshape(chan_shape(c, y.rank()))?)?)
        }
    }
}

fn conv_fwd(cx: &KernelCtx, xs: &[Option<Tensor>], _: &Extras) -> KResult<Vec<Option<Tensor>>> {
    let geo = conv_geo(cx, false)?;
    let y = conv_apply(req(xs, 0)?, req(xs, 1)?, &geo)?;
    Ok(vec![Some(add_bias(y, opt(xs, 2))?)])
}

fn conv_bwd(cx: &KernelCtx, a: &BwdArgs) -> KResult<Vec<Option<Tensor>>> {
    let geo = conv_geo(cx, false)?;
    let g = a.grad(cx, 0)?;
    let x_shape = cx.in_shape(0)?;
    let mut out = vec![None; a.inputs.len()];
    if a.need(0) {
        out[0] = Some(conv_apply_dx(&g, a.input(1)?, &geo, &x_shape[2..])?);
    }
    if a.need(1) {
        let dw = conv_apply_dw(a.input(0)?, &g, &geo)?;
        out[1] = Some(dw.reshape(cx.in_shape(1)?)?);
    }
    if a.need(2) {
        out[2] = Some(bias_grad(&g)?.reshape(cx.in_shape(2)?)?);
    }
    Ok(out)
}

// ConvTranspose: the data gradient of a convolution (whose input is this op's output).

fn convt_fwd(cx: &KernelCtx, xs: &[Option<Tensor>], _: &Extras) -> KResult<Vec<Option<Tensor>>> {
    let geo = conv_geo(cx, true)?;
    let x = req(xs, 0)?;
    let y_shape = cx.out_shape(0)?;
    let y = conv_apply_dx(x, req(xs, 1)?, &geo, &y_shape[2..])?;
    Ok(vec![Some(add_bias(y, opt(xs, 2))?)])
}

fn convt_bwd(cx: &KernelCtx, a: &BwdArgs) -> KResult<Vec<Option<Tensor>>> {
    let mut geo = conv_geo(cx, true)?;
    let g = a.grad(cx, 0)?;
    let x_shape = cx.in_shape(0)?;
    let y_shape = cx.out_shape(0)?;
    // As a convolution of dY: its output is X's spatial size; the end pads only need to
    // cover the last window.
    for j in 0..geo.win.k.len() {
        let need = (x_shape[2 + j] - 1) * geo.win.s[j] + geo.win.eff(j);
        geo.win.pe[j] = need.saturating_sub(y_shape[2 + j] + geo.win.pb[j]);
    }
    let mut out = vec![None; a.inputs.len()];
    if a.need(0) {
        out[0] = Some(conv_apply(&g, a.input(1)?, &geo)?);
    }
    if a.need(1) {
        let dw = conv_apply_dw(&g, a.input(0)?, &geo)?;
        out[1] = Some(dw.reshape(cx.in_shape(1)?)?);
    }
    if a.need(2) {
        out[2] = Some(bias_grad(&g)?.reshape(cx.in_shape(2)?)?);
    }
    Ok(out)
}

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
    let (a, b) = mm_operands(req(xs, 0)?, req(xs, 1)?)?;
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
    let a = tr(req(xs, 0)?, p.ta)?;
    let b = tr(req(xs, 1)?, p.tb)?;
    let mut y = a.matmul(&b)?;
    if p.alpha != 1.0 {
        y = y.affine(p.alpha, 0.0)?;
    }
    if let Some(c) = opt(xs, 2) {
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
    // (a 25088 × 4096 classifier weight: 411 MB more heap at VGG's peak).
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

// ---------------------------------------------------------------------------------------------
// Normalizations

/// Mean and inverse standard deviation over `dims` (keepdim), in `x`'s dtype.
fn moments(x: &Tensor, dims: &[usize], eps: f64) -> KResult<(Tensor, Tensor)> {
    let cnt: usize = dims.iter().map(|&d| x.dims()[d]).product();
    if cnt == 0 {
        kbail!("normalization over an empty set of elements");
    }
    let inv = 1.0 / cnt as f64;
    let mean = fsum_keepdim(x, dims)?.affine(inv, 0.0)?;
    let xc = x.broadcast_sub(&mean)?;
    let var = fsum_keepdim(&xc.sqr()?, dims)?.affine(inv, 0.0)?;
    let r = var.affine(1.0, eps)?.sqrt()?.recip()?;
    Ok((mean, r))
}

/// `dx = r * (g - mean(g) - xhat * mean(g * xhat))` over `dims`.
fn norm_dx(xhat: &Tensor, r: &Tensor, g: &Tensor, dims: &[usize]) -> KResult<Tensor> {
    let cnt: usize = dims.iter().map(|&d| g.dims()[d]).product();
    let inv = 1.0 / cnt.max(1) as f64;
    let mg = fsum_keepdim(g, dims)?.affine(inv, 0.0)?;
    let mgx = fsum_keepdim(&(g * xhat)?, dims)?.affine(inv, 0.0)?;
    let t = g.broadcast_sub(&mg)?.sub(&xhat.broadcast_mul(&mgx)?)?;
    Ok(t.broadcast_mul(r)?)
}

/// The statistics as the `stats` extra: mean and inverse std, flat, in f32.
fn stats_extra(mean: &Tensor, r: &Tensor) -> KResult<Vec<Tensor>> {
    Ok(vec![
        mean.flatten_all()?.to_dtype(DType::F32)?,
        r.flatten_all()?.to_dtype(DType::F32)?,
    ])
}

/// Saved statistics back in compute dtype and keepdim `shape`.
fn stats_from(v: &[Tensor], dt: DType, shape: &[usize]) -> KResult<(Tensor, Tensor)> {
    match v {
        [m, r] => Ok((
            m.to_dtype(dt)?.reshape(shape)?,
            r.to_dtype(dt)?.reshape(shape)?,
        )),
        _ => kbail!("the stats extra must hold mean and inverse std"),
    }
}

/// Statistics for the forward: the saved ones when they are exact (computed in the same
/// dtype), otherwise computed here.
fn fwd_stats(xc: &Tensor, dims: &[usize], eps: f64, ex: &Extras) -> KResult<(Tensor, Tensor)> {
    if let Some(v) = ex.get("stats") {
        if xc.dtype() == DType::F32 {
            let mut shape = xc.dims().to_vec();
            for &d in dims {
                shape[d] = 1;
            }
            return stats_from(v, DType::F32, &shape);
        }
    }
    if dims == all_but_1(xc.rank()).as_slice() {
        return bn_moments(xc, eps);
    }
    moments(xc, dims, eps)
}

fn eps_attr(cx: &KernelCtx) -> KResult<f64> {
    Ok(cx.attrs.float_or("epsilon", 1e-5)? as f64)
}

/// Per-channel parameter `t` (C elements) as `[1, C, 1, ...]` in dtype `dt`.
fn per_chan(t: &Tensor, c: usize, rank: usize, dt: DType) -> KResult<Tensor> {
    if t.elem_count() != c {
        kbail!(
            "per-channel input has {} elements for {c} channels",
            t.elem_count()
        );
    }
    Ok(t.to_dtype(dt)?.reshape(chan_shape(c, rank))?)
}

fn all_but_1(rank: usize) -> Vec<usize> {
    (0..rank).filter(|&d| d != 1).collect()
}

fn bn_training(cx: &KernelCtx) -> KResult<bool> {
    if cx.opset >= 14 {
        Ok(cx.attrs.int_or("training_mode", 0)? != 0)
    } else {
        Ok(cx.outputs.len() > 1)
    }
}

fn bn_extra(cx: &KernelCtx, tag: &str, xs: &[Option<Tensor>]) -> KResult<Vec<Tensor>> {
    if tag != "stats" {
        kbail!("no extra value {tag:?}");
    }
    let x = req(xs, 0)?;
    let xc = x.to_dtype(compute_dtype(x.dtype()))?;
    let (m, r) = bn_moments(&xc, eps_attr(cx)?)?;
    stats_extra(&m, &r)
}

fn bn_fwd(cx: &KernelCtx, xs: &[Option<Tensor>], ex: &Extras) -> KResult<Vec<Option<Tensor>>> {
    let x = req(xs, 0)?;
    let dt = compute_dtype(x.dtype());
    let rank = x.rank();
    if rank < 2 {
        kbail!("input must be [N, C, ...]");
    }
    let c = x.dim(1)?;
    let eps = eps_attr(cx)?;
    let xc = x.to_dtype(dt)?;
    let scale = per_chan(req(xs, 1)?, c, rank, dt)?;
    let bias = per_chan(req(xs, 2)?, c, rank, dt)?;
    let mut outs: Vec<Option<Tensor>> = vec![None; cx.outputs.len().max(1)];
    if bn_training(cx)? {
        let dims = all_but_1(rank);
        let (m, r) = fwd_stats(&xc, &dims, eps, ex)?;
        let a = scale.broadcast_mul(&r)?;
        let b = bias.broadcast_sub(&m.broadcast_mul(&a)?)?;
        let y = bn_affine(&xc, &a, &b)?;
        outs[0] = Some(y.to_dtype(x.dtype())?);
        if cx.outputs.len() > 1 {
            let momentum = cx.attrs.float_or("momentum", 0.9)? as f64;
            // Biased batch variance, as the ONNX reference computes it.
            let var = r.sqr()?.recip()?.affine(1.0, -eps)?;
            let m1 = m.flatten_all()?;
            let v1 = var.flatten_all()?;
            let run_m = per_chan(req(xs, 3)?, c, 1, dt)?.flatten_all()?;
            let run_v = per_chan(req(xs, 4)?, c, 1, dt)?.flatten_all()?;
            let new_m = (run_m.affine(momentum, 0.0)? + m1.affine(1.0 - momentum, 0.0)?)?;
            let new_v = (run_v.affine(momentum, 0.0)? + v1.affine(1.0 - momentum, 0.0)?)?;
            let vals = [new_m, new_v, m1, v1];
            for (k, v) in vals.into_iter().enumerate() {
                if want(cx, k + 1) {
                    outs[k + 1] = Some(v.to_dtype(float_out(cx, k + 1, x.dtype())?)?);
                }
            }
        }
    } else {
        let m = per_chan(req(xs, 3)?, c, rank, dt)?;
        let v = per_chan(req(xs, 4)?, c, rank, dt)?;
        let a = scale.broadcast_mul(&v.affine(1.0, eps)?.sqrt()?.recip()?)?;
        let b = bias.broadcast_sub(&m.broadcast_mul(&a)?)?;
        let y = bn_affine(&xc, &a, &b)?;
        outs[0] = Some(y.to_dtype(x.dtype())?);
        for (k, src) in [(1usize, 3usize), (2, 4)] {
            if want(cx, k) {
                outs[k] = Some(req(xs, src)?.clone());
            }
        }
    }
    Ok(outs)
}

fn bn_bwd(cx: &KernelCtx, a: &BwdArgs) -> KResult<Vec<Option<Tensor>>> {
    let x = a.input(0)?;
    let dt = compute_dtype(x.dtype());
    let rank = x.rank();
    let c = x.dim(1)?;
    let eps = eps_attr(cx)?;
    let g = a.grad(cx, 0)?.to_dtype(dt)?;
    let dims = all_but_1(rank);
    let cs = chan_shape(c, rank);
    let training = bn_training(cx)?;
    let (m, r) = if training {
        stats_from(a.extra("stats")?, dt, &cs)?
    } else {
        let m = per_chan(a.input(3)?, c, rank, dt)?;
        let v = per_chan(a.input(4)?, c, rank, dt)?;
        (m, v.affine(1.0, eps)?.sqrt()?.recip()?)
    };
    if training
        && host_unfold(x.device())
        && x.dtype() == dt
        && matches!(dt, DType::F32 | DType::F64)
    {
        return bn_bwd_host(cx, a, &g, &m, &r);
    }
    // Per-channel sums: S_g = sum dY, S_gx = sum dY (x - mean); then every gradient is a
    // per-channel affine map (few passes over the data).
    let xc = x.to_dtype(dt)?.broadcast_sub(&m)?;
    let sg = fsum_keepdim(&g, &dims)?;
    let sgx = if training || a.need(1) {
        Some(fsum_keepdim(&(&g * &xc)?, &dims)?)
    } else {
        None
    };
    let mut out = vec![None; a.inputs.len()];
    if a.need(0) {
        let scale = per_chan(a.input(1)?, c, rank, dt)?;
        let k = scale.broadcast_mul(&r)?;
        let dx = match (&sgx, training) {
            (Some(sgx), true) => {
                let cnt: usize = dims.iter().map(|&d| x.dims()[d]).product();
                let inv = 1.0 / cnt.max(1) as f64;
                // dx = k (g - S_g / M - (x - mean) r^2 S_gx / M)
                let bx = k
                    .broadcast_mul(&r.sqr()?)?
                    .broadcast_mul(sgx)?
                    .affine(-inv, 0.0)?;
                let c0 = k.broadcast_mul(&sg)?.affine(-inv, 0.0)?;
                g.broadcast_mul(&k)?
                    .add(&xc.broadcast_mul(&bx)?)?
                    .broadcast_add(&c0)?
            }
            _ => g.broadcast_mul(&k)?,
        };
        out[0] = Some(dx.to_dtype(x.dtype())?);
    }
    if a.need(1) {
        if let Some(sgx) = &sgx {
            let ds = sgx.broadcast_mul(&r)?;
            out[1] = Some(ds.to_dtype(x.dtype())?.reshape(cx.in_shape(1)?)?);
        }
    }
    if a.need(2) {
        out[2] = Some(sg.to_dtype(x.dtype())?.reshape(cx.in_shape(2)?)?);
    }
    Ok(out)
}

/// Accumulator lanes of the host reductions: independent partial sums, so that the adds
/// pipeline and vectorize instead of waiting on one running total.
const LANES: usize = 8;

/// `Σ f(v)` in f64 over [`LANES`] partial sums.
fn lane_sum<T: candle_core::WithDType>(v: &[T], f: impl Fn(f64) -> f64) -> f64 {
    let mut acc = [0f64; LANES];
    let mut it = v.chunks_exact(LANES);
    for ch in &mut it {
        for (a, x) in acc.iter_mut().zip(ch) {
            *a += f(x.to_f64());
        }
    }
    let tail: f64 = it.remainder().iter().map(|x| f(x.to_f64())).sum();
    acc.iter().sum::<f64>() + tail
}

/// `(Σ g, Σ g (x − m))` in f64 over [`LANES`] partial sums.
fn lane_sums2<T: candle_core::WithDType>(x: &[T], g: &[T], m: f64) -> (f64, f64) {
    let (mut a, mut b) = ([0f64; LANES], [0f64; LANES]);
    let (mut xi, mut gi) = (x.chunks_exact(LANES), g.chunks_exact(LANES));
    for (xc, gc) in (&mut xi).zip(&mut gi) {
        for k in 0..LANES {
            let gv = gc[k].to_f64();
            a[k] += gv;
            b[k] += gv * (xc[k].to_f64() - m);
        }
    }
    let (mut sa, mut sb) = (a.iter().sum::<f64>(), b.iter().sum::<f64>());
    for (xv, gv) in xi.remainder().iter().zip(gi.remainder()) {
        let gv = gv.to_f64();
        sa += gv;
        sb += gv * (xv.to_f64() - m);
    }
    (sa, sb)
}

/// Batch statistics of `[N, C, S]` data on the host (CPU): per channel the mean and the
/// inverse standard deviation `1 / sqrt(var + eps)` (biased variance, two passes in f64),
/// returned as `[mean; r]` (`2 * C` values), channels spread over threads.
#[derive(Clone, Debug)]
struct BnMoments {
    n: usize,
    c: usize,
    s: usize,
    eps: f64,
}

impl BnMoments {
    fn apply<T: candle_core::WithDType>(&self, x: &[T]) -> Vec<T> {
        let (n, c, s) = (self.n, self.c, self.s);
        let cnt = (n * s).max(1) as f64;
        let mut out = vec![(0.0f64, 0.0f64); c];
        par_units(&mut out, 1, |ch, o| {
            let plane = |b: usize| x.get((b * c + ch) * s..(b * c + ch + 1) * s).unwrap_or(&[]);
            let mean = (0..n).map(|b| lane_sum(plane(b), |v| v)).sum::<f64>() / cnt;
            let var = (0..n)
                .map(|b| lane_sum(plane(b), |v| (v - mean) * (v - mean)))
                .sum::<f64>()
                / cnt;
            o[0] = (mean, 1.0 / (var + self.eps).sqrt());
        });
        let mut v: Vec<T> = out.iter().map(|p| T::from_f64(p.0)).collect();
        v.extend(out.iter().map(|p| T::from_f64(p.1)));
        v
    }
}

impl host::Host1 for BnMoments {
    const WHAT: &'static str = "batch-norm statistics";

    fn want(&self) -> Option<usize> {
        Some(self.n * self.c * self.s)
    }

    fn run<T: candle_core::WithDType>(
        &self,
        x: &[T],
        _: &candle_core::Shape,
    ) -> candle_core::Result<(Vec<T>, candle_core::Shape)> {
        Ok((self.apply(x), candle_core::Shape::from(2 * self.c)))
    }
}

custom_op1!(BnMoments, "remat-batchnorm-moments");

/// `y = a[c] x + b[c]` over `[N, C, S]` data on the host (CPU): the batch-norm forward in
/// one pass.
#[derive(Clone, Debug)]
struct ChanAffine {
    c: usize,
    s: usize,
    a: Vec<f64>,
    b: Vec<f64>,
}

impl ChanAffine {
    fn apply<T: candle_core::WithDType>(&self, x: &[T]) -> Vec<T> {
        par_build(x.len(), self.s.max(1), T::from_f64(0.0), |u, o| {
            let ch = u % self.c.max(1);
            // In the data's dtype, as the broadcast ops it replaces compute (and vectorizes).
            let (a, b) = (T::from_f64(self.a[ch]), T::from_f64(self.b[ch]));
            if let Some(xs) = x.get(u * self.s..(u + 1) * self.s) {
                for (o, &v) in o.iter_mut().zip(xs) {
                    *o = v * a + b;
                }
            }
        })
    }
}

impl host::Host1 for ChanAffine {
    const WHAT: &'static str = "channel affine";

    fn run<T: candle_core::WithDType>(
        &self,
        x: &[T],
        shape: &candle_core::Shape,
    ) -> candle_core::Result<(Vec<T>, candle_core::Shape)> {
        let plane = (self.c * self.s).max(1);
        if !x.len().is_multiple_of(plane) || self.a.len() != self.c || self.b.len() != self.c {
            return Err(candle_core::Error::Msg(format!(
                "channel affine: {} elements or {} coefficients do not match {} channels of {}",
                x.len(),
                self.a.len(),
                self.c,
                self.s
            )));
        }
        Ok((self.apply(x), shape.clone()))
    }
}

custom_op1!(ChanAffine, "remat-channel-affine");

/// Whether the batch-norm host paths take `x` (CPU, f32/f64, at least `[N, C]`).
fn bn_host_ok(x: &Tensor) -> bool {
    host_unfold(x.device()) && matches!(x.dtype(), DType::F32 | DType::F64) && x.rank() >= 2
}

/// Batch statistics over all dims but the channels: mean and inverse std, keepdim-shaped.
fn bn_moments(xc: &Tensor, eps: f64) -> KResult<(Tensor, Tensor)> {
    if !bn_host_ok(xc) {
        return moments(xc, &all_but_1(xc.rank()), eps);
    }
    let (n, c) = (xc.dim(0)?, xc.dim(1)?);
    let s: usize = xc.dims()[2..].iter().product();
    let op = BnMoments { n, c, s, eps };
    let v = xc.contiguous()?.apply_op1_no_bwd(&op)?;
    let cs = chan_shape(c, xc.rank());
    Ok((
        v.narrow(0, 0, c)?.reshape(cs.clone())?,
        v.narrow(0, c, c)?.reshape(cs)?,
    ))
}

/// `x · a + b` with per-channel `a`, `b` (keepdim-shaped): one host pass on the CPU.
fn bn_affine(x: &Tensor, a: &Tensor, b: &Tensor) -> KResult<Tensor> {
    if bn_host_ok(x) {
        let c = x.dim(1)?;
        let s: usize = x.dims()[2..].iter().product();
        let (av, bv) = (chan_vec(a)?, chan_vec(b)?);
        if av.len() == c && bv.len() == c {
            let op = ChanAffine { c, s, a: av, b: bv };
            return Ok(x.contiguous()?.apply_op1_no_bwd(&op)?);
        }
    }
    Ok(x.broadcast_mul(a)?.broadcast_add(b)?)
}

/// Fused batch-normalization backward passes on the host over contiguous `[N, C, S]` data
/// `x` (first operand) and its gradient `g` (second): the per-channel sums `[S_g; S_gx]`
/// (`2 * C` values), or, with `coef`, `dx = a g + b (x - mean) + c0` per channel.
#[derive(Clone, Debug)]
struct BnHost {
    n: usize,
    c: usize,
    s: usize,
    mean: Vec<f64>,
    coef: Option<[Vec<f64>; 3]>,
}

impl BnHost {
    fn sums<T: candle_core::WithDType>(&self, x: &[T], g: &[T]) -> Vec<T> {
        let (n, c, s) = (self.n, self.c, self.s);
        let mut out = vec![(0.0f64, 0.0f64); c];
        par_units(&mut out, 1, |ch, acc| {
            let m = self.mean.get(ch).copied().unwrap_or(0.0);
            for b in 0..n {
                let at = (b * c + ch) * s;
                if let (Some(xs), Some(gs)) = (x.get(at..at + s), g.get(at..at + s)) {
                    let (sg, sgx) = lane_sums2(xs, gs, m);
                    acc[0].0 += sg;
                    acc[0].1 += sgx;
                }
            }
        });
        let mut v: Vec<T> = out.iter().map(|p| T::from_f64(p.0)).collect();
        v.extend(out.iter().map(|p| T::from_f64(p.1)));
        v
    }

    fn dx<T: candle_core::WithDType>(&self, x: &[T], g: &[T], coef: &[Vec<f64>; 3]) -> Vec<T> {
        let (c, s) = (self.c, self.s);
        let units = self.n * c;
        par_build(units * s, s, T::from_f64(0.0), |u, o| {
            let ch = u % c;
            let at = u * s;
            let pick = |v: &[f64]| v.get(ch).copied().unwrap_or(0.0);
            let (a, b, c0) = (pick(&coef[0]), pick(&coef[1]), pick(&coef[2]));
            // dx = a g + b x + (c0 - b mean), in the data's dtype (vectorizes).
            let c1 = T::from_f64(c0 - b * self.mean.get(ch).copied().unwrap_or(0.0));
            let (a, b) = (T::from_f64(a), T::from_f64(b));
            if let (Some(xs), Some(gs)) = (x.get(at..at + s), g.get(at..at + s)) {
                for ((o, &xv), &gv) in o.iter_mut().zip(xs).zip(gs) {
                    *o = a * gv + b * xv + c1;
                }
            }
        })
    }

    fn apply<T: candle_core::WithDType>(&self, x: &[T], g: &[T]) -> Vec<T> {
        match &self.coef {
            None => self.sums(x, g),
            Some(coef) => self.dx(x, g, coef),
        }
    }
}

impl host::Host2 for BnHost {
    const WHAT: &'static str = "batch-norm backward";

    fn want(&self) -> [Option<usize>; 2] {
        let len = self.n * self.c * self.s;
        [Some(len), Some(len)]
    }

    fn run<T: candle_core::WithDType>(
        &self,
        x: &[T],
        g: &[T],
        _: &candle_core::Shape,
    ) -> candle_core::Result<(Vec<T>, candle_core::Shape)> {
        let shape = match self.coef {
            None => candle_core::Shape::from(2 * self.c),
            Some(_) => candle_core::Shape::from((self.n, self.c, self.s)),
        };
        Ok((self.apply(x, g), shape))
    }
}

custom_op2!(BnHost, "remat-batchnorm-backward", host2);

fn chan_vec(t: &Tensor) -> KResult<Vec<f64>> {
    Ok(t.flatten_all()?.to_dtype(DType::F64)?.to_vec1::<f64>()?)
}

/// Training-mode [`bn_bwd`] on the host in two fused passes (sums, then the data gradient).
fn bn_bwd_host(
    cx: &KernelCtx,
    a: &BwdArgs,
    g: &Tensor,
    m: &Tensor,
    r: &Tensor,
) -> KResult<Vec<Option<Tensor>>> {
    let x = a.input(0)?;
    let (n, c) = (x.dim(0)?, x.dim(1)?);
    let s: usize = x.dims()[2..].iter().product();
    if g.dims() != x.dims() {
        kbail!(
            "gradient {:?} does not match the input {:?}",
            g.dims(),
            x.dims()
        );
    }
    let xs = x.contiguous()?.reshape((n, c, s))?;
    let gs = g.contiguous()?.reshape((n, c, s))?;
    let mean = chan_vec(m)?;
    let rv = chan_vec(r)?;
    if mean.len() != c || rv.len() != c {
        kbail!("batch-norm statistics do not have {c} channels");
    }
    let mut op = BnHost {
        n,
        c,
        s,
        mean,
        coef: None,
    };
    let sums = chan_vec(&xs.apply_op2_no_bwd(&gs, &op)?)?;
    let (sg, sgx) = sums.split_at(c.min(sums.len()));
    let dev = x.device();
    let mut out = vec![None; a.inputs.len()];
    if a.need(0) {
        let scale = chan_vec(a.input(1)?)?;
        if scale.len() != c || sg.len() != c || sgx.len() != c {
            kbail!("batch-norm scale does not have {c} channels");
        }
        let inv = 1.0 / (n * s).max(1) as f64;
        let k: Vec<f64> = scale.iter().zip(&rv).map(|(sc, r)| sc * r).collect();
        // dx = k (g - S_g / M - (x - mean) r^2 S_gx / M)
        let b: Vec<f64> = (0..c)
            .map(|i| -inv * k[i] * rv[i] * rv[i] * sgx[i])
            .collect();
        let c0: Vec<f64> = (0..c).map(|i| -inv * k[i] * sg[i]).collect();
        op.coef = Some([k, b, c0]);
        let dx = xs.apply_op2_no_bwd(&gs, &op)?.reshape(x.dims())?;
        out[0] = Some(dx);
    }
    if a.need(1) {
        let ds: Vec<f64> = sgx.iter().zip(&rv).map(|(v, r)| v * r).collect();
        let t = Tensor::from_vec(ds, c, dev)?.to_dtype(x.dtype())?;
        out[1] = Some(t.reshape(cx.in_shape(1)?)?);
    }
    if a.need(2) {
        let t = Tensor::from_vec(sg.to_vec(), sg.len(), dev)?.to_dtype(x.dtype())?;
        out[2] = Some(t.reshape(cx.in_shape(2)?)?);
    }
    Ok(out)
}

// InstanceNormalization: per-(n, c) statistics over the spatial dims.

fn in_dims(rank: usize) -> Vec<usize> {
    (2..rank).collect()
}

fn in_extra(cx: &KernelCtx, tag: &str, xs: &[Option<Tensor>]) -> KResult<Vec<Tensor>> {
    if tag != "stats" {
        kbail!("no extra value {tag:?}");
    }
    let x = req(xs, 0)?;
    if x.rank() < 3 {
        kbail!("input must be [N, C, spatial...]");
    }
    let xc = x.to_dtype(compute_dtype(x.dtype()))?;
    let (m, r) = moments(&xc, &in_dims(x.rank()), eps_attr(cx)?)?;
    stats_extra(&m, &r)
}

fn in_fwd(cx: &KernelCtx, xs: &[Option<Tensor>], ex: &Extras) -> KResult<Vec<Option<Tensor>>> {
    let x = req(xs, 0)?;
    let rank = x.rank();
    if rank < 3 {
        kbail!("input must be [N, C, spatial...]");
    }
    let dt = compute_dtype(x.dtype());
    let c = x.dim(1)?;
    let xc = x.to_dtype(dt)?;
    let (m, r) = fwd_stats(&xc, &in_dims(rank), eps_attr(cx)?, ex)?;
    let scale = per_chan(req(xs, 1)?, c, rank, dt)?;
    let bias = per_chan(req(xs, 2)?, c, rank, dt)?;
    let y = xc
        .broadcast_sub(&m)?
        .broadcast_mul(&r.broadcast_mul(&scale)?)?
        .broadcast_add(&bias)?;
    Ok(vec![Some(y.to_dtype(x.dtype())?)])
}

fn in_bwd(cx: &KernelCtx, a: &BwdArgs) -> KResult<Vec<Option<Tensor>>> {
    let x = a.input(0)?;
    let rank = x.rank();
    let dt = compute_dtype(x.dtype());
    let (n, c) = (x.dim(0)?, x.dim(1)?);
    let xc = x.to_dtype(dt)?;
    let mut sshape = vec![1; rank];
    sshape[0] = n;
    sshape[1] = c;
    let (m, r) = stats_from(a.extra("stats")?, dt, &sshape)?;
    let xhat = xc.broadcast_sub(&m)?.broadcast_mul(&r)?;
    let g = a.grad(cx, 0)?.to_dtype(dt)?;
    let mut out = vec![None; a.inputs.len()];
    if a.need(0) {
        let scale = per_chan(a.input(1)?, c, rank, dt)?;
        let dx = norm_dx(&xhat, &r, &g.broadcast_mul(&scale)?, &in_dims(rank))?;
        out[0] = Some(dx.to_dtype(x.dtype())?);
    }
    if a.need(1) {
        let ds = fsum(&(&g * &xhat)?, &all_but_1(rank))?;
        out[1] = Some(ds.to_dtype(x.dtype())?.reshape(cx.in_shape(1)?)?);
    }
    if a.need(2) {
        let db = fsum(&g, &all_but_1(rank))?;
        out[2] = Some(db.to_dtype(x.dtype())?.reshape(cx.in_shape(2)?)?);
    }
    Ok(out)
}

// LayerNormalization: statistics over the dims from `axis` on.

fn ln_axis(cx: &KernelCtx, rank: usize) -> KResult<usize> {
    cx.axis(cx.attrs.int_or("axis", -1)?, rank)
}

fn ln_extra(cx: &KernelCtx, tag: &str, xs: &[Option<Tensor>]) -> KResult<Vec<Tensor>> {
    if tag != "stats" {
        kbail!("no extra value {tag:?}");
    }
    let x = req(xs, 0)?;
    let axis = ln_axis(cx, x.rank())?;
    let xc = x.to_dtype(compute_dtype(x.dtype()))?;
    let dims: Vec<usize> = (axis..x.rank()).collect();
    let (m, r) = moments(&xc, &dims, eps_attr(cx)?)?;
    stats_extra(&m, &r)
}

fn ln_fwd(cx: &KernelCtx, xs: &[Option<Tensor>], ex: &Extras) -> KResult<Vec<Option<Tensor>>> {
    let x = req(xs, 0)?;
    let dt = compute_dtype(x.dtype());
    let axis = ln_axis(cx, x.rank())?;
    let dims: Vec<usize> = (axis..x.rank()).collect();
    let xc = x.to_dtype(dt)?;
    let (m, r) = fwd_stats(&xc, &dims, eps_attr(cx)?, ex)?;
    let mut y = xc.broadcast_sub(&m)?.broadcast_mul(&r)?;
    if let Some(s) = opt(xs, 1) {
        y = y.broadcast_mul(&s.to_dtype(dt)?)?;
    }
    if let Some(b) = opt(xs, 2) {
        y = y.broadcast_add(&b.to_dtype(dt)?)?;
    }
    let mut outs = vec![Some(y.to_dtype(x.dtype())?)];
    for (k, v) in [(1usize, &m), (2, &r)] {
        if k < cx.outputs.len() {
            outs.push(if want(cx, k) {
                Some(v.to_dtype(float_out(cx, k, x.dtype())?)?)
            } else {
                None
            });
        }
    }
    Ok(outs)
}

fn ln_bwd(cx: &KernelCtx, a: &BwdArgs) -> KResult<Vec<Option<Tensor>>> {
    let x = a.input(0)?;
    let dt = compute_dtype(x.dtype());
    let rank = x.rank();
    let axis = ln_axis(cx, rank)?;
    let dims: Vec<usize> = (axis..rank).collect();
    let mut sshape = x.dims().to_vec();
    for d in &mut sshape[axis..] {
        *d = 1;
    }
    let (m, r) = stats_from(a.extra("stats")?, dt, &sshape)?;
    let xhat = x.to_dtype(dt)?.broadcast_sub(&m)?.broadcast_mul(&r)?;
    let g = a.grad(cx, 0)?.to_dtype(dt)?;
    let mut out = vec![None; a.inputs.len()];
    if a.need(0) {
        let gs = match a.inputs.get(1).and_then(|t| t.as_ref()) {
            Some(s) => g.broadcast_mul(&s.to_dtype(dt)?)?,
            None if cx.inputs.get(1).map(|f| f.is_some()).unwrap_or(false) => {
                kbail!("the backward needs the scale (input 1), which is not resident")
            }
            None => g.clone(),
        };
        out[0] = Some(norm_dx(&xhat, &r, &gs, &dims)?.to_dtype(x.dtype())?);
    }
    if a.need(1) {
        let ds = sum_to(&(&g * &xhat)?, &cx.in_shape(1)?)?;
        out[1] = Some(ds.to_dtype(x.dtype())?);
    }
    if a.need(2) {
        out[2] = Some(sum_to(&g, &cx.in_shape(2)?)?.to_dtype(x.dtype())?);
    }
    Ok(out)
}

// GroupNormalization: statistics per (n, group); scale and bias per channel (opset 21 and
// the fused form) or per group (opset 18).

fn gn_groups(cx: &KernelCtx, c: usize) -> KResult<usize> {
    let g = cx
        .attrs
        .int("num_groups")?
        .ok_or_else(|| KernelError::new("attribute \"num_groups\" is required but missing"))?;
    if g < 1 || !c.is_multiple_of(g as usize) {
        kbail!("attribute \"num_groups\" = {g} does not divide {c} channels");
    }
    Ok(g as usize)
}

/// `x` as `[N, G, rest]`.
fn gn_view(x: &Tensor, g: usize) -> KResult<Tensor> {
    let n = x.dim(0)?;
    let rest = x.elem_count() / (n * g).max(1);
    Ok(x.contiguous()?.reshape((n, g, rest))?)
}

/// Scale or bias as a per-channel `[1, C, 1, ...]` tensor.
fn gn_param(t: &Tensor, c: usize, g: usize, rank: usize, dt: DType) -> KResult<Tensor> {
    let n = t.elem_count();
    let t = t.to_dtype(dt)?.flatten_all()?;
    let t = if n == c {
        t
    } else if n == g {
        t.reshape((g, 1))?
            .broadcast_as((g, c / g))?
            .contiguous()?
            .flatten_all()?
    } else {
        kbail!("scale and bias must have {c} (channels) or {g} (groups) elements, got {n}");
    };
    Ok(t.reshape(chan_shape(c, rank))?)
}

/// Per-channel gradient `[C]` summed back to a parameter of `n` elements and `shape`.
fn gn_param_grad(dc: &Tensor, c: usize, g: usize, shape: &[usize]) -> KResult<Tensor> {
    let n: usize = shape.iter().product();
    let t = if n == c {
        dc.clone()
    } else {
        dc.reshape((g, c / g))?.sum(1)?
    };
    Ok(t.reshape(shape)?)
}

fn gn_extra(cx: &KernelCtx, tag: &str, xs: &[Option<Tensor>]) -> KResult<Vec<Tensor>> {
    if tag != "stats" {
        kbail!("no extra value {tag:?}");
    }
    let x = req(xs, 0)?;
    let g = gn_groups(cx, x.dim(1)?)?;
    let xg = gn_view(&x.to_dtype(compute_dtype(x.dtype()))?, g)?;
    let (m, r) = moments(&xg, &[2], eps_attr(cx)?)?;
    stats_extra(&m, &r)
}

fn gn_fwd(cx: &KernelCtx, xs: &[Option<Tensor>], ex: &Extras) -> KResult<Vec<Option<Tensor>>> {
    let x = req(xs, 0)?;
    if x.rank() < 2 {
        kbail!("input must be [N, C, ...]");
    }
    let dt = compute_dtype(x.dtype());
    let (c, rank) = (x.dim(1)?, x.rank());
    let g = gn_groups(cx, c)?;
    let xg = gn_view(&x.to_dtype(dt)?, g)?;
    let (m, r) = fwd_stats(&xg, &[2], eps_attr(cx)?, ex)?;
    let mut y = xg.broadcast_sub(&m)?.broadcast_mul(&r)?.reshape(x.dims())?;
    if let Some(s) = opt(xs, 1) {
        y = y.broadcast_mul(&gn_param(s, c, g, rank, dt)?)?;
    }
    if let Some(b) = opt(xs, 2) {
        y = y.broadcast_add(&gn_param(b, c, g, rank, dt)?)?;
    }
    Ok(vec![Some(y.to_dtype(x.dtype())?)])
}

fn gn_bwd(cx: &KernelCtx, a: &BwdArgs) -> KResult<Vec<Option<Tensor>>> {
    let x = a.input(0)?;
    let dt = compute_dtype(x.dtype());
    let (n, c, rank) = (x.dim(0)?, x.dim(1)?, x.rank());
    let g = gn_groups(cx, c)?;
    let (m, r) = stats_from(a.extra("stats")?, dt, &[n, g, 1])?;
    let xhat = gn_view(&x.to_dtype(dt)?, g)?
        .broadcast_sub(&m)?
        .broadcast_mul(&r)?;
    let gy = a.grad(cx, 0)?.to_dtype(dt)?;
    let mut out = vec![None; a.inputs.len()];
    if a.need(0) {
        let gs = match a.inputs.get(1).and_then(|t| t.as_ref()) {
            Some(s) => gy.broadcast_mul(&gn_param(s, c, g, rank, dt)?)?,
            None if cx.inputs.get(1).map(|f| f.is_some()).unwrap_or(false) => {
                kbail!("the backward needs the scale (input 1), which is not resident")
            }
            None => gy.clone(),
        };
        let dx = norm_dx(&xhat, &r, &gn_view(&gs, g)?, &[2])?;
        out[0] = Some(dx.reshape(x.dims())?.to_dtype(x.dtype())?);
    }
    if a.need(1) {
        let xh = xhat.reshape(x.dims())?;
        let dc = fsum(&(&gy * &xh)?, &all_but_1(rank))?;
        out[1] = Some(gn_param_grad(&dc, c, g, &cx.in_shape(1)?)?.to_dtype(x.dtype())?);
    }
    if a.need(2) {
        let dc = fsum(&gy, &all_but_1(rank))?;
        out[2] = Some(gn_param_grad(&dc, c, g, &cx.in_shape(2)?)?.to_dtype(x.dtype())?);
    }
    Ok(out)
}

// LRN: y = x / (bias + alpha / size * sum of squares over a channel window) ^ beta.

struct LrnAttrs {
    alpha: f64,
    beta: f64,
    bias: f64,
    size: usize,
}

fn lrn_attrs(cx: &KernelCtx) -> KResult<LrnAttrs> {
    let size = cx
        .attrs
        .int("size")?
        .ok_or_else(|| KernelError::new("attribute \"size\" is required but missing"))?;
    if size < 1 {
        kbail!("attribute \"size\" = {size} must be positive");
    }
    Ok(LrnAttrs {
        alpha: cx.attrs.float_or("alpha", 1e-4)? as f64,
        beta: cx.attrs.float_or("beta", 0.75)? as f64,
        bias: cx.attrs.float_or("bias", 1.0)? as f64,
        size: size as usize,
    })
}

/// Sum over the channel window `[c - lo, c + hi]` (zeros outside).
fn chan_window_sum(t: &Tensor, lo: usize, hi: usize) -> KResult<Tensor> {
    let c = t.dim(1)?;
    let p = t.pad_with_zeros(1, lo, hi)?;
    let mut acc = p.narrow(1, 0, c)?;
    for i in 1..=lo + hi {
        acc = (acc + p.narrow(1, i, c)?)?;
    }
    Ok(acc)
}

/// The denominator base `bias + alpha / size * window sum of x^2`.
fn lrn_base(x: &Tensor, p: &LrnAttrs) -> KResult<Tensor> {
    let lo = (p.size - 1) / 2;
    let hi = p.size - 1 - lo;
    Ok(chan_window_sum(&x.sqr()?, lo, hi)?.affine(p.alpha / p.size as f64, p.bias)?)
}

fn lrn_fwd(cx: &KernelCtx, xs: &[Option<Tensor>], _: &Extras) -> KResult<Vec<Option<Tensor>>> {
    let p = lrn_attrs(cx)?;
    let x = req(xs, 0)?;
    let s = lrn_base(x, &p)?;
    Ok(vec![Some((x * s.powf(-p.beta)?)?)])
}

fn lrn_bwd(cx: &KernelCtx, a: &BwdArgs) -> KResult<Vec<Option<Tensor>>> {
    let p = lrn_attrs(cx)?;
    let x = a.input(0)?;
    let y = a.output(0)?;
    let g = a.grad(cx, 0)?;
    let s = lrn_base(x, &p)?;
    let lo = (p.size - 1) / 2;
    let hi = p.size - 1 - lo;
    // dx_c = g_c s_c^-b - 2 a b / n x_c sum_{c' : c in window(c')} g_c' y_c' / s_c'
    let t = ((&g * y)? / &s)?;
    let back = chan_window_sum(&t, hi, lo)?;
    let dx = ((&g * s.powf(-p.beta)?)?
        - (x * back)?.affine(2.0 * p.alpha * p.beta / p.size as f64, 0.0)?)?;
    Ok(vec![Some(dx)])
}

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
struct PoolArgmax {
    nc: usize,
    hw: [usize; 2],
    win: Win,
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
struct GatherFlat;

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
struct ScatterAddFlat {
    len: usize,
    planes: usize,
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
fn gather_flat(x: &Tensor, idx: &Tensor) -> KResult<Tensor> {
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
fn scatter_add_flat(g: &Tensor, idx: &Tensor, shape: &[usize]) -> KResult<Tensor> {
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
/// thread over every index: 0.44 s of resnet18's 0.49 s step on an H200; a row per plane
/// gives it a thread per plane.)
fn scatter_add_planes(g: &Tensor, idx: &Tensor, shape: &[usize]) -> KResult<Tensor> {
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
    Ok(vec![max_pool_indices(req(xs, 0)?, &p)?])
}

fn maxpool_fwd(cx: &KernelCtx, xs: &[Option<Tensor>], ex: &Extras) -> KResult<Vec<Option<Tensor>>> {
    let x = req(xs, 0)?;
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
    let x = req(xs, 0)?;
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
    let x = req(xs, 0)?;
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
    Ok(vec![gmp_indices(req(xs, 0)?)?])
}

fn gmp_fwd(_: &KernelCtx, xs: &[Option<Tensor>], ex: &Extras) -> KResult<Vec<Option<Tensor>>> {
    let x = req(xs, 0)?;
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

// ---------------------------------------------------------------------------------------------
// Softmax, LogSoftmax, Hardmax

/// `x` as `[outer, n, inner]` (or `[outer, n]` when `inner` is 1) for a softmax at the
/// node's axis (opset < 13 flattens the dims from the axis on into one).
fn softmax_view(cx: &KernelCtx, x: &Tensor) -> KResult<Tensor> {
    let rank = x.rank();
    let default = if cx.opset >= 13 { -1 } else { 1 };
    let axis = cx.axis(cx.attrs.int_or("axis", default)?, rank.max(1))?;
    let dims = x.dims();
    let outer: usize = dims[..axis.min(dims.len())].iter().product();
    let (n, inner) = if cx.opset >= 13 {
        (
            dims.get(axis).copied().unwrap_or(1),
            dims[(axis + 1).min(dims.len())..].iter().product(),
        )
    } else {
        (dims[axis.min(dims.len())..].iter().product(), 1)
    };
    let x = x.contiguous()?;
    if inner == 1 {
        // The axis is the last dim: reductions over contiguous rows.
        return Ok(x.reshape((outer, n))?);
    }
    Ok(x.reshape((outer, n, inner))?)
}

fn softmax_fwd(cx: &KernelCtx, xs: &[Option<Tensor>], _: &Extras) -> KResult<Vec<Option<Tensor>>> {
    let x = req(xs, 0)?;
    let v = softmax_view(cx, x)?;
    let m = v.max_keepdim(1)?;
    let z = v.broadcast_sub(&m)?;
    let y = if cx.op == "LogSoftmax" {
        let lse = z.exp()?.sum_keepdim(1)?.log()?;
        z.broadcast_sub(&lse)?
    } else {
        let e = z.exp()?;
        e.broadcast_div(&e.sum_keepdim(1)?)?
    };
    Ok(vec![Some(y.reshape(x.dims())?)])
}

fn softmax_bwd(cx: &KernelCtx, a: &BwdArgs) -> KResult<Vec<Option<Tensor>>> {
    let y = a.output(0)?;
    let yv = softmax_view(cx, y)?;
    let g = softmax_view(cx, &a.grad(cx, 0)?)?;
    let dx = if cx.op == "LogSoftmax" {
        (&g - yv.exp()?.broadcast_mul(&g.sum_keepdim(1)?)?)?
    } else {
        let s = (&g * &yv)?.sum_keepdim(1)?;
        (&yv * g.broadcast_sub(&s)?)?
    };
    Ok(vec![Some(dx.reshape(y.dims())?)])
}

fn hardmax_fwd(cx: &KernelCtx, xs: &[Option<Tensor>], _: &Extras) -> KResult<Vec<Option<Tensor>>> {
    let x = req(xs, 0)?;
    let v = softmax_view(cx, x)?;
    let n = v.dim(1)?;
    let arg = v.argmax_keepdim(1)?;
    let mut ar_shape = vec![1; v.rank()];
    ar_shape[1] = n;
    let ar = Tensor::arange(0u32, n as u32, x.device())?.reshape(ar_shape)?;
    let y = ar.broadcast_eq(&arg)?.to_dtype(x.dtype())?;
    Ok(vec![Some(y.reshape(x.dims())?)])
}

// ---------------------------------------------------------------------------------------------
// Dropout

fn dropout_ratio(cx: &KernelCtx) -> KResult<f64> {
    if cx.opset < 12 {
        return Ok(cx.attrs.float_or("ratio", 0.5)? as f64);
    }
    match cx.const_floats(1)? {
        None => Ok(0.5),
        Some(v) => v
            .first()
            .copied()
            .ok_or_else(|| KernelError::new("input 1 (ratio) is empty")),
    }
}

/// Whether the dropout drops: as the gradient rule decides, a positive ratio (the training
/// graph models training, whatever `training_mode` the model was exported with).
fn dropout_active(cx: &KernelCtx) -> KResult<bool> {
    let r = dropout_ratio(cx)?;
    if !(0.0..=1.0).contains(&r) {
        kbail!("ratio {r} must be in [0, 1]");
    }
    Ok(r > 0.0)
}

/// The keep mask (1 = kept) drawn from the node's seed.
fn dropout_mask(cx: &KernelCtx) -> KResult<Tensor> {
    let shape = cx.in_shape(0)?;
    let n: usize = shape.iter().product();
    let ratio = dropout_ratio(cx)?;
    let mut rng = Rng::new(cx.seed);
    let v: Vec<u8> = (0..n)
        .map(|_| u8::from(rng.uniform(0.0, 1.0) >= ratio))
        .collect();
    Ok(Tensor::from_vec(v, shape, cx.device)?)
}

fn dropout_extra(cx: &KernelCtx, tag: &str, _: &[Option<Tensor>]) -> KResult<Vec<Tensor>> {
    if tag != "mask" {
        kbail!("no extra value {tag:?}");
    }
    Ok(vec![dropout_mask(cx)?])
}

/// `t * mask / (1 - ratio)`.
fn apply_mask(t: &Tensor, mask: &Tensor, ratio: f64) -> KResult<Tensor> {
    let scale = if ratio >= 1.0 {
        0.0
    } else {
        1.0 / (1.0 - ratio)
    };
    Ok((t * mask.to_dtype(t.dtype())?)?.affine(scale, 0.0)?)
}

fn dropout_fwd(cx: &KernelCtx, xs: &[Option<Tensor>], ex: &Extras) -> KResult<Vec<Option<Tensor>>> {
    let x = req(xs, 0)?;
    let (y, mask) = if dropout_active(cx)? {
        let mask = match ex.get("mask").and_then(|v| v.first()) {
            Some(m) => m.clone(),
            None => dropout_mask(cx)?,
        };
        (apply_mask(x, &mask, dropout_ratio(cx)?)?, mask)
    } else {
        (x.clone(), Tensor::ones(x.dims(), DType::U8, x.device())?)
    };
    let mut outs = vec![Some(y)];
    if cx.outputs.len() > 1 {
        outs.push(if want(cx, 1) { Some(mask) } else { None });
    }
    Ok(outs)
}

fn dropout_bwd(cx: &KernelCtx, a: &BwdArgs) -> KResult<Vec<Option<Tensor>>> {
    let g = a.grad(cx, 0)?;
    let dx = if dropout_active(cx)? {
        let mask = a
            .extra("mask")?
            .first()
            .ok_or_else(|| KernelError::new("the mask extra is empty"))?;
        apply_mask(&g, mask, dropout_ratio(cx)?)?
    } else {
        g
    };
    let mut out = vec![Some(dx)];
    out.resize(a.inputs.len(), None);
    Ok(out)
}

// ---------------------------------------------------------------------------------------------
// Einsum (any number of operands, contracted pairwise from the left; no ellipsis, no repeated
// letter within a term)

struct Equation {
    text: String,
    ins: Vec<Vec<char>>,
    out: Vec<char>,
}

fn einsum_eq(cx: &KernelCtx) -> KResult<Equation> {
    let eq = cx
        .attrs
        .string("equation")?
        .ok_or_else(|| KernelError::new("attribute \"equation\" is required but missing"))?;
    let text: String = eq.chars().filter(|c| !c.is_whitespace()).collect();
    let unsupported = |why: &str| -> KernelError {
        KernelError::new(format!(
            "attribute \"equation\" = {text:?} is not supported: {why}"
        ))
    };
    if text.contains("...") {
        return Err(unsupported("ellipsis"));
    }
    let (lhs, rhs) = match text.split_once("->") {
        Some((l, r)) => (l.to_string(), Some(r.to_string())),
        None => (text.clone(), None),
    };
    let ins: Vec<Vec<char>> = lhs.split(',').map(|s| s.chars().collect()).collect();
    let out: Vec<char> = match rhs {
        Some(r) => r.chars().collect(),
        None => {
            let mut letters: Vec<char> = ins.iter().flatten().copied().collect();
            letters.sort_unstable();
            let mut once: Vec<char> = letters
                .iter()
                .copied()
                .filter(|c| letters.iter().filter(|d| *d == c).count() == 1)
                .collect();
            once.dedup();
            once
        }
    };
    for term in ins.iter().chain(std::iter::once(&out)) {
        for (i, c) in term.iter().enumerate() {
            if !c.is_ascii_alphabetic() {
                return Err(unsupported("invalid character"));
            }
            if term[..i].contains(c) {
                return Err(unsupported("a letter repeated within one term (diagonal)"));
            }
        }
    }
    for c in &out {
        if !ins.iter().any(|t| t.contains(c)) {
            return Err(unsupported("an output letter appears in no operand"));
        }
    }
    Ok(Equation { text, ins, out })
}

fn letter_pos(term: &[char], l: char) -> KResult<usize> {
    term.iter()
        .position(|&c| c == l)
        .ok_or_else(|| KernelError::new(format!("letter {l:?} is not in {term:?}")))
}

/// Sums out the dims of `t` whose letter is not in `keep`.
fn sum_letters(
    t: &Tensor,
    tl: &[char],
    keep: impl Fn(char) -> bool,
) -> KResult<(Tensor, Vec<char>)> {
    let dims: Vec<usize> = (0..tl.len()).filter(|&i| !keep(tl[i])).collect();
    let rest: Vec<char> = tl.iter().copied().filter(|&c| keep(c)).collect();
    if dims.is_empty() {
        return Ok((t.clone(), rest));
    }
    Ok((t.sum(dims)?, rest))
}

/// Permutes `t` (letters `tl`) to the order `to` (a permutation of `tl`).
fn permute_letters(t: &Tensor, tl: &[char], to: &[char]) -> KResult<Tensor> {
    if tl == to {
        return Ok(t.clone());
    }
    let perm = to
        .iter()
        .map(|&l| letter_pos(tl, l))
        .collect::<KResult<Vec<usize>>>()?;
    Ok(t.permute(perm)?)
}

/// `einsum(a, b -> out)` for letters without repeats; sizes must agree.
fn ein2(a: &Tensor, al: &[char], b: &Tensor, bl: &[char], out: &[char]) -> KResult<Tensor> {
    let (a, al) = sum_letters(a, al, |c| out.contains(&c) || bl.contains(&c))?;
    let (b, bl) = sum_letters(b, bl, |c| out.contains(&c) || al.contains(&c))?;
    let batch: Vec<char> = out
        .iter()
        .copied()
        .filter(|c| al.contains(c) && bl.contains(c))
        .collect();
    let ak: Vec<char> = out
        .iter()
        .copied()
        .filter(|c| al.contains(c) && !bl.contains(c))
        .collect();
    let bk: Vec<char> = out
        .iter()
        .copied()
        .filter(|c| bl.contains(c) && !al.contains(c))
        .collect();
    let con: Vec<char> = al
        .iter()
        .copied()
        .filter(|c| bl.contains(c) && !out.contains(c))
        .collect();
    let size = |t: &Tensor, tl: &[char], ls: &[char]| -> KResult<Vec<usize>> {
        ls.iter()
            .map(|&l| Ok(t.dims()[letter_pos(tl, l)?]))
            .collect()
    };
    let bs = size(&a, &al, &batch)?;
    let ms = size(&a, &al, &ak)?;
    let ns = size(&b, &bl, &bk)?;
    let ks = size(&a, &al, &con)?;
    let kb = size(&b, &bl, &con)?;
    let bb = size(&b, &bl, &batch)?;
    if ks != kb || bs != bb {
        kbail!("operand sizes disagree on shared letters");
    }
    let p = |v: &[usize]| v.iter().product::<usize>();
    let ao: Vec<char> = [batch.clone(), ak.clone(), con.clone()].concat();
    let bo: Vec<char> = [batch.clone(), con.clone(), bk.clone()].concat();
    let a3 = permute_letters(&a, &al, &ao)?
        .contiguous()?
        .reshape((p(&bs), p(&ms), p(&ks)))?;
    let b3 = permute_letters(&b, &bl, &bo)?
        .contiguous()?
        .reshape((p(&bs), p(&ks), p(&ns)))?;
    let c = a3.matmul(&b3)?;
    let cl: Vec<char> = [batch, ak, bk].concat();
    let cs: Vec<usize> = [bs, ms, ns].concat();
    let c = c.reshape(cs)?;
    Ok(permute_letters(&c, &cl, out)?.contiguous()?)
}

/// `einsum(a -> out)`.
fn ein1(a: &Tensor, al: &[char], out: &[char]) -> KResult<Tensor> {
    let (a, al) = sum_letters(a, al, |c| out.contains(&c))?;
    Ok(permute_letters(&a, &al, out)?.contiguous()?)
}

/// `g` (letters `gl`, a subset of `tl`) broadcast to `shape` (letters `tl`).
fn ein_expand(g: &Tensor, gl: &[char], tl: &[char], shape: &[usize]) -> KResult<Tensor> {
    let present: Vec<char> = tl.iter().copied().filter(|c| gl.contains(c)).collect();
    let g = permute_letters(g, gl, &present)?;
    let view: Vec<usize> = tl
        .iter()
        .zip(shape)
        .map(|(c, &d)| if gl.contains(c) { d } else { 1 })
        .collect();
    Ok(g.contiguous()?
        .reshape(view)?
        .broadcast_as(shape)?
        .contiguous()?)
}

/// Letter sizes over all operands (the largest, for size-1 broadcasting).
fn letter_sizes(eq: &Equation, xs: &[&Tensor]) -> KResult<std::collections::HashMap<char, usize>> {
    let mut m = std::collections::HashMap::new();
    for (t, tl) in xs.iter().zip(&eq.ins) {
        if t.rank() != tl.len() {
            kbail!(
                "operand of rank {} for term {:?} in {:?}",
                t.rank(),
                tl.iter().collect::<String>(),
                eq.text
            );
        }
        for (&l, &d) in tl.iter().zip(t.dims()) {
            let e = m.entry(l).or_insert(d);
            if *e != d && *e != 1 && d != 1 {
                kbail!("letter {l:?} has sizes {e} and {d} in {:?}", eq.text);
            }
            *e = (*e).max(d);
        }
    }
    Ok(m)
}

fn expand_to_letters(
    t: &Tensor,
    tl: &[char],
    sizes: &std::collections::HashMap<char, usize>,
) -> KResult<Tensor> {
    let shape: Vec<usize> = tl
        .iter()
        .map(|c| sizes.get(c).copied().unwrap_or(1))
        .collect();
    if t.dims() == shape.as_slice() {
        Ok(t.clone())
    } else {
        Ok(t.broadcast_as(shape)?.contiguous()?)
    }
}

/// `einsum(ops -> out)` by pairwise products from the left; each intermediate keeps the
/// letters that the output or a later operand needs.
fn einn(ops: &[(Tensor, Vec<char>)], out: &[char]) -> KResult<Tensor> {
    let Some((first, rest)) = ops.split_first() else {
        kbail!("einsum without operands");
    };
    let (mut acc, mut al) = (first.0.clone(), first.1.clone());
    for (j, (t, tl)) in rest.iter().enumerate() {
        let later = &rest[j + 1..];
        let mut keep: Vec<char> = vec![];
        for &c in al.iter().chain(tl.iter()) {
            let needed = out.contains(&c) || later.iter().any(|(_, l)| l.contains(&c));
            if needed && !keep.contains(&c) {
                keep.push(c);
            }
        }
        acc = ein2(&acc, &al, t, tl, &keep)?;
        al = keep;
    }
    ein1(&acc, &al, out)
}

/// The operands broadcast to the letter sizes, with their letters.
fn einsum_operands(eq: &Equation, ops: &[&Tensor]) -> KResult<Vec<(Tensor, Vec<char>)>> {
    let sizes = letter_sizes(eq, ops)?;
    ops.iter()
        .zip(&eq.ins)
        .map(|(t, tl)| Ok((expand_to_letters(t, tl, &sizes)?, tl.clone())))
        .collect()
}

fn einsum_fwd(cx: &KernelCtx, xs: &[Option<Tensor>], _: &Extras) -> KResult<Vec<Option<Tensor>>> {
    let eq = einsum_eq(cx)?;
    let ops = (0..eq.ins.len())
        .map(|i| req(xs, i))
        .collect::<KResult<Vec<&Tensor>>>()?;
    let full = einsum_operands(&eq, &ops)?;
    Ok(vec![Some(einn(&full, &eq.out)?)])
}

fn einsum_bwd(cx: &KernelCtx, a: &BwdArgs) -> KResult<Vec<Option<Tensor>>> {
    let eq = einsum_eq(cx)?;
    let g = a.grad(cx, 0)?;
    let mut out = vec![None; a.inputs.len()];
    let n = eq.ins.len();
    if !(0..n).any(|i| a.need(i)) {
        return Ok(out);
    }
    let ops = (0..n)
        .map(|i| a.input(i))
        .collect::<KResult<Vec<&Tensor>>>()?;
    let full = einsum_operands(&eq, &ops)?;
    for i in 0..n {
        if !a.need(i) {
            continue;
        }
        // d/d operand i = einsum(dY, the other operands -> operand i's letters), broadcast
        // over the letters only operand i has (summed out in the forward).
        let mut others = vec![(g.clone(), eq.out.clone())];
        others.extend(
            full.iter()
                .enumerate()
                .filter(|(j, _)| *j != i)
                .map(|(_, o)| o.clone()),
        );
        let tl = &eq.ins[i];
        let kept: Vec<char> = tl
            .iter()
            .copied()
            .filter(|c| others.iter().any(|(_, l)| l.contains(c)))
            .collect();
        let d = einn(&others, &kept)?;
        let d = ein_expand(&d, &kept, tl, full[i].0.dims())?;
        out[i] = Some(sum_to(&d, &cx.in_shape(i)?)?);
    }
    Ok(out)
}

// ---------------------------------------------------------------------------------------------

pub fn register(r: &mut KernelRegistry) {
    let k = |forward, extra, backward| Kernel {
        forward,
        extra,
        backward,
    };
    r.insert("Conv", k(conv_fwd, None, Some(conv_bwd)));
    r.insert("ConvTranspose", k(convt_fwd, None, Some(convt_bwd)));
    r.insert("MatMul", k(matmul_fwd, None, Some(matmul_bwd)));
    r.insert("Gemm", k(gemm_fwd, None, Some(gemm_bwd)));
    r.insert(
        "BatchNormalization",
        k(bn_fwd, Some(bn_extra), Some(bn_bwd)),
    );
    r.insert(
        "InstanceNormalization",
        k(in_fwd, Some(in_extra), Some(in_bwd)),
    );
    r.insert(
        "LayerNormalization",
        k(ln_fwd, Some(ln_extra), Some(ln_bwd)),
    );
    r.insert(
        "GroupNormalization",
        k(gn_fwd, Some(gn_extra), Some(gn_bwd)),
    );
    r.insert("LRN", k(lrn_fwd, None, Some(lrn_bwd)));
    r.insert(
        "MaxPool",
        k(maxpool_fwd, Some(maxpool_extra), Some(maxpool_bwd)),
    );
    r.insert("AveragePool", k(avgpool_fwd, None, Some(avgpool_bwd)));
    r.insert("GlobalAveragePool", k(gap_fwd, None, Some(gap_bwd)));
    r.insert(
        "GlobalMaxPool",
        k(gmp_fwd, Some(gmp_extra), Some(maxpool_bwd)),
    );
    r.insert("Softmax", k(softmax_fwd, None, Some(softmax_bwd)));
    r.insert("LogSoftmax", k(softmax_fwd, None, Some(softmax_bwd)));
    r.insert("Hardmax", k(hardmax_fwd, None, None));
    r.insert(
        "Dropout",
        k(dropout_fwd, Some(dropout_extra), Some(dropout_bwd)),
    );
    r.insert("Einsum", k(einsum_fwd, None, Some(einsum_bwd)));
}

#[cfg(test)]
mod tests {
    use crate::exec::testing::{check, float, int, ints, string, Case, In};
    use crate::tensor::DType;

    fn r(s: &[usize]) -> In {
        In::Rand(s.to_vec())
    }
    fn p(s: &[usize]) -> In {
        In::Param(s.to_vec())
    }

    /// The largest elementwise difference of two tensors of one shape, in f64.
    fn max_abs_diff(a: &candle_core::Tensor, b: &candle_core::Tensor) -> f64 {
        assert_eq!(a.dims(), b.dims());
        (a - b)
            .unwrap()
            .abs()
            .unwrap()
            .max_all()
            .unwrap()
            .to_dtype(candle_core::DType::F64)
            .unwrap()
            .to_scalar::<f64>()
            .unwrap()
    }

    #[test]
    fn conv2d_pads_strides_bias() {
        check(
            &Case::new(
                "Conv",
                17,
                vec![r(&[2, 3, 5, 5]), p(&[4, 3, 3, 3]), p(&[4])],
            )
            .attr(ints("pads", &[1, 1, 1, 1]))
            .attr(ints("strides", &[2, 2])),
        );
        check(&Case::new(
            "Conv",
            17,
            vec![r(&[1, 2, 4, 4]), r(&[3, 2, 1, 1])],
        ));
        check(
            &Case::new("Conv", 17, vec![r(&[1, 2, 5, 5]), p(&[3, 2, 1, 1])])
                .attr(ints("strides", &[2, 2])),
        );
    }

    #[test]
    fn conv2d_groups_dilations_asymmetric() {
        check(
            &Case::new(
                "Conv",
                17,
                vec![r(&[2, 4, 6, 7]), p(&[6, 2, 3, 2]), p(&[6])],
            )
            .attr(int("group", 2))
            .attr(ints("dilations", &[2, 2]))
            .attr(ints("pads", &[0, 1, 2, 0]))
            .attr(ints("strides", &[1, 2])),
        );
        check(
            &Case::new("Conv", 17, vec![r(&[1, 2, 7, 7]), p(&[2, 2, 3, 3])])
                .attr(ints("dilations", &[1, 2]))
                .attr(ints("pads", &[1, 2, 1, 2])),
        );
    }

    #[test]
    fn conv2d_depthwise_auto_pad() {
        check(
            &Case::new("Conv", 17, vec![r(&[1, 4, 6, 6]), p(&[4, 1, 3, 3])])
                .attr(int("group", 4))
                .attr(string("auto_pad", "SAME_UPPER"))
                .attr(ints("strides", &[2, 2])),
        );
        check(
            &Case::new("Conv", 17, vec![r(&[1, 2, 5, 6]), p(&[8, 1, 2, 2])])
                .attr(int("group", 2))
                .attr(string("auto_pad", "SAME_LOWER")),
        );
        check(
            &Case::new("Conv", 17, vec![r(&[1, 2, 5, 6]), p(&[2, 2, 3, 3])])
                .attr(string("auto_pad", "VALID"))
                .attr(ints("kernel_shape", &[3, 3])),
        );
    }

    #[test]
    fn conv1d_and_conv3d() {
        check(
            &Case::new("Conv", 17, vec![r(&[2, 2, 7]), p(&[3, 2, 3]), p(&[3])])
                .attr(ints("pads", &[1, 2]))
                .attr(ints("strides", &[2])),
        );
        check(
            &Case::new(
                "Conv",
                17,
                vec![r(&[1, 2, 4, 5, 5]), p(&[3, 2, 2, 3, 3]), p(&[3])],
            )
            .attr(ints("pads", &[1, 0, 1, 0, 1, 1]))
            .attr(ints("strides", &[2, 1, 2]))
            .attr(ints("dilations", &[1, 2, 1])),
        );
        check(
            &Case::new("Conv", 17, vec![r(&[2, 4, 3, 4, 4]), p(&[4, 2, 3, 1, 1])])
                .attr(int("group", 2))
                .attr(ints("pads", &[1, 0, 0, 1, 0, 0])),
        );
    }

    /// The candle-op convolution path (used off the CPU) agrees with the host im2col path.
    #[test]
    fn conv_paths_agree() {
        use super::{
            c2_dw_candle, c2_dw_host, c2_dx_candle, c2_dx_host, c2_fwd_candle, c2_fwd_host, G2,
        };
        use candle_core::{Device, Tensor};
        let dev = Device::Cpu;
        let geos = [
            // k, s, d, pb, pe, in, c, oc, g
            ([3, 3], [1, 1], [1, 1], [1, 1], [1, 1], [6, 6], 4, 6, 1),
            ([3, 2], [2, 1], [1, 2], [0, 1], [2, 0], [7, 6], 4, 6, 2),
            ([1, 1], [2, 2], [1, 1], [0, 0], [0, 0], [5, 5], 3, 4, 1),
            ([3, 3], [2, 2], [2, 2], [2, 1], [1, 2], [8, 7], 4, 4, 4),
            ([7, 7], [2, 2], [1, 1], [3, 3], [3, 3], [12, 12], 3, 4, 1),
            // 1×1, unit stride, no padding: the columns are the image itself.
            ([1, 1], [1, 1], [1, 1], [0, 0], [0, 0], [5, 6], 3, 4, 1),
            // Stride 3 with a window wider than the padding on one side.
            ([2, 4], [1, 3], [1, 1], [1, 2], [0, 3], [6, 9], 2, 3, 1),
            // Enough channels that an image goes in tiles of output rows (with padding rows
            // in the first and last tiles, and a shorter last tile).
            ([3, 3], [1, 1], [1, 1], [1, 1], [1, 1], [30, 20], 64, 8, 1),
            ([3, 3], [2, 2], [1, 1], [1, 0], [0, 1], [45, 40], 128, 4, 2),
            // Depthwise: every group's columns count toward the tile (four tiles here).
            (
                [3, 3],
                [1, 1],
                [1, 1],
                [1, 1],
                [1, 1],
                [40, 40],
                256,
                256,
                256,
            ),
        ];
        for (k, s, d, pb, pe, hw, c, oc, g) in geos {
            let out = [0, 1].map(|j| (hw[j] + pb[j] + pe[j] - ((k[j] - 1) * d[j] + 1)) / s[j] + 1);
            let p = G2 {
                k,
                s,
                d,
                pb,
                pe,
                out,
                g,
            };
            // One image (its products spread over the threads) and five (split between them).
            for n in [1, 5] {
                let x = Tensor::randn(0f64, 1.0, (n, c, hw[0], hw[1]), &dev).unwrap();
                let w = Tensor::randn(0f64, 1.0, (oc, c / g, k[0], k[1]), &dev).unwrap();
                let dy = Tensor::randn(0f64, 1.0, (n, oc, out[0], out[1]), &dev).unwrap();
                let diff = |a: Tensor, b: Tensor| max_abs_diff(&a, &b);
                for cm in [false, true] {
                    let e1 = diff(
                        c2_fwd_host(&x, &w, &p, cm).unwrap(),
                        c2_fwd_candle(&x, &w, &p).unwrap(),
                    );
                    let e2 = diff(
                        c2_dx_host(&dy, &w, &p, hw, cm).unwrap(),
                        c2_dx_candle(&dy, &w, &p, hw).unwrap(),
                    );
                    let e3 = diff(
                        c2_dw_host(&x, &dy, &p, cm).unwrap(),
                        c2_dw_candle(&x, &dy, &p).unwrap(),
                    );
                    assert!(
                        e1 < 1e-10 && e2 < 1e-10 && e3 < 1e-10,
                        "{p:?} batch {n} {cm}: {e1} {e2} {e3}"
                    );
                }
            }
        }
    }

    #[test]
    fn conv_transpose() {
        check(
            &Case::new(
                "ConvTranspose",
                17,
                vec![r(&[2, 3, 3, 4]), p(&[3, 2, 3, 3]), p(&[2])],
            )
            .attr(ints("strides", &[2, 2]))
            .attr(ints("pads", &[1, 1, 1, 1]))
            .attr(ints("output_padding", &[1, 0])),
        );
        check(
            &Case::new(
                "ConvTranspose",
                17,
                vec![r(&[1, 4, 3, 3]), p(&[4, 1, 2, 2])],
            )
            .attr(int("group", 2))
            .attr(ints("dilations", &[2, 1]))
            .attr(ints("pads", &[0, 1, 1, 0])),
        );
        check(
            &Case::new("ConvTranspose", 17, vec![r(&[1, 2, 5]), p(&[2, 3, 3])])
                .attr(ints("strides", &[2]))
                .attr(string("auto_pad", "SAME_UPPER")),
        );
        check(
            &Case::new(
                "ConvTranspose",
                17,
                vec![r(&[1, 2, 3, 3]), p(&[2, 2, 3, 3])],
            )
            .attr(ints("strides", &[2, 2]))
            .attr(ints("output_shape", &[6, 7])),
        );
    }

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

    fn pos(c: usize) -> In {
        In::Const(
            DType::F32,
            vec![c],
            (0..c).map(|i| 0.5 + 0.25 * i as f64).collect(),
        )
    }
    fn small(c: usize) -> In {
        In::Const(
            DType::F32,
            vec![c],
            (0..c).map(|i| 0.1 * i as f64 - 0.1).collect(),
        )
    }

    #[test]
    fn batch_norm_training() {
        check(
            &Case::new(
                "BatchNormalization",
                15,
                vec![r(&[3, 2, 3, 3]), p(&[2]), p(&[2]), small(2), pos(2)],
            )
            .attr(int("training_mode", 1))
            .attr(float("momentum", 0.8))
            .outputs(3),
        );
        check(
            &Case::new(
                "BatchNormalization",
                9,
                vec![r(&[4, 3]), p(&[3]), p(&[3]), small(3), pos(3)],
            )
            .outputs(5),
        );
    }

    #[test]
    fn batch_norm_running_stats_follow_onnx() {
        use crate::exec::kernel::{Extras, KernelCtx};
        use crate::onnx::Attrs;
        use crate::tensor::Fact;
        use candle_core::{Device, Tensor};
        let dev = Device::Cpu;
        let x = Tensor::new(&[[1.0f64, 3.0], [5.0, 7.0]], &dev).unwrap();
        let ones = Tensor::new(&[1.0f64, 1.0], &dev).unwrap();
        let zeros = Tensor::new(&[0.0f64, 0.0], &dev).unwrap();
        let attrs = vec![int("training_mode", 1), float("momentum", 0.9)];
        let f2 = Some(Fact::new(DType::F64, vec![2]));
        let inputs = vec![
            Some(Fact::new(DType::F64, vec![2, 2])),
            f2.clone(),
            f2.clone(),
            f2.clone(),
            f2.clone(),
        ];
        let outputs = vec![Some(Fact::new(DType::F64, vec![2, 2])), f2.clone(), f2];
        let cx = KernelCtx {
            node: "bn",
            op: "BatchNormalization",
            opset: 15,
            attrs: Attrs {
                node: "bn",
                op: "BatchNormalization",
                list: &attrs,
            },
            inputs: &inputs,
            outputs: &outputs,
            device: &dev,
            seed: 1,
        };
        let xs = vec![
            Some(x),
            Some(ones.clone()),
            Some(zeros.clone()),
            Some(zeros),
            Some(ones),
        ];
        let y = super::bn_fwd(&cx, &xs, &Extras::new()).unwrap();
        let m = y[1].as_ref().unwrap().to_vec1::<f64>().unwrap();
        let v = y[2].as_ref().unwrap().to_vec1::<f64>().unwrap();
        // Batch means 3 and 5, biased variances 4 and 4 (momentum is an f32 attribute).
        assert!(
            (m[0] - 0.3).abs() < 1e-6 && (m[1] - 0.5).abs() < 1e-6,
            "{m:?}"
        );
        assert!(
            (v[0] - 1.3).abs() < 1e-6 && (v[1] - 1.3).abs() < 1e-6,
            "{v:?}"
        );
    }

    #[test]
    fn batch_norm_inference() {
        check(&Case::new(
            "BatchNormalization",
            15,
            vec![r(&[2, 3, 2, 2]), p(&[3]), p(&[3]), small(3), pos(3)],
        ));
    }

    #[test]
    fn instance_norm() {
        check(
            &Case::new(
                "InstanceNormalization",
                6,
                vec![r(&[2, 3, 3, 2]), p(&[3]), p(&[3])],
            )
            .tol(1e-5),
        );
    }

    #[test]
    fn layer_norm() {
        check(&Case::new(
            "LayerNormalization",
            17,
            vec![r(&[2, 3, 5]), p(&[5]), p(&[5])],
        ));
        check(
            &Case::new(
                "LayerNormalization",
                17,
                vec![r(&[2, 3, 4]), p(&[3, 4]), In::None],
            )
            .attr(int("axis", 1))
            .attr(float("epsilon", 1e-3))
            .outputs(3),
        );
        check(&Case::new("LayerNormalization", 17, vec![r(&[3, 6])]));
    }

    #[test]
    fn group_norm() {
        check(
            &Case::new(
                "GroupNormalization",
                21,
                vec![r(&[2, 4, 3, 2]), p(&[4]), p(&[4])],
            )
            .attr(int("num_groups", 2)),
        );
        check(
            &Case::new(
                "GroupNormalization",
                18,
                vec![r(&[2, 6, 5]), p(&[3]), p(&[3])],
            )
            .attr(int("num_groups", 3))
            .attr(float("epsilon", 1e-2)),
        );
        // The fused form: per-channel scale shaped [C, 1, 1], no bias.
        check(
            &Case::new(
                "GroupNormalization",
                17,
                vec![r(&[1, 4, 2, 3]), p(&[4, 1, 1])],
            )
            .attr(int("num_groups", 2)),
        );
    }

    #[test]
    fn lrn() {
        check(&Case::new("LRN", 13, vec![r(&[2, 5, 3, 3])]).attr(int("size", 3)));
        check(
            &Case::new("LRN", 13, vec![r(&[1, 6, 2, 2])])
                .attr(int("size", 4))
                .attr(float("alpha", 0.1))
                .attr(float("beta", 0.6))
                .attr(float("bias", 2.0)),
        );
    }

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
        use crate::exec::kernel::{Extras, KernelCtx};
        use crate::onnx::Attrs;
        use crate::tensor::Fact;
        use candle_core::{Device, Tensor};
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
            node: "mp",
            op: "MaxPool",
            opset: 12,
            attrs: Attrs {
                node: "mp",
                op: "MaxPool",
                list: &attrs,
            },
            inputs: &inputs,
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

    /// The host gather and scatter of a max pool (planes on all threads above 64 Ki
    /// elements) agree with candle's `index_select` / `index_add`, and name a bad index.
    #[test]
    fn max_pool_gather_scatter_on_threads() {
        use super::{gather_flat, scatter_add_flat, GatherFlat, ScatterAddFlat};
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
        let dx_planes = super::scatter_add_planes(&g, &idx, &[2, 3, h, w]).unwrap();
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

    #[test]
    fn softmax_and_log_softmax() {
        for op in ["Softmax", "LogSoftmax"] {
            check(&Case::new(op, 13, vec![r(&[2, 3, 4])]));
            check(&Case::new(op, 13, vec![r(&[2, 3, 4])]).attr(int("axis", 1)));
            // Opset < 13: flattened at the axis.
            check(&Case::new(op, 11, vec![r(&[2, 3, 4])]));
            check(&Case::new(op, 11, vec![r(&[2, 3, 4])]).attr(int("axis", 2)));
        }
    }

    #[test]
    fn hardmax() {
        use crate::exec::kernel::{Extras, KernelCtx};
        use crate::onnx::Attrs;
        use crate::tensor::Fact;
        use candle_core::{Device, Tensor};
        check(&Case::new("Hardmax", 13, vec![r(&[2, 3, 4])]).attr(int("axis", 1)));
        let dev = Device::Cpu;
        let x = Tensor::new(&[[1.0f64, 3.0, 2.0], [4.0, 0.0, 4.0]], &dev).unwrap();
        let f = Some(Fact::new(DType::F64, vec![2, 3]));
        let inputs = vec![f.clone()];
        let outputs = vec![f];
        let cx = KernelCtx {
            node: "h",
            op: "Hardmax",
            opset: 13,
            attrs: Attrs {
                node: "h",
                op: "Hardmax",
                list: &[],
            },
            inputs: &inputs,
            outputs: &outputs,
            device: &dev,
            seed: 1,
        };
        let y = super::hardmax_fwd(&cx, &[Some(x)], &Extras::new()).unwrap();
        let v = y[0].as_ref().unwrap().to_vec2::<f64>().unwrap();
        assert_eq!(v, vec![vec![0.0, 1.0, 0.0], vec![1.0, 0.0, 0.0]]);
    }

    #[test]
    fn dropout() {
        let ratio = |v: f64| In::Const(DType::F32, vec![], vec![v]);
        check(&Case::new("Dropout", 13, vec![r(&[4, 5]), ratio(0.3)]).outputs(2));
        check(&Case::new("Dropout", 13, vec![r(&[4, 5]), ratio(0.0)]));
        check(&Case::new("Dropout", 13, vec![r(&[3, 3])]));
        check(&Case::new("Dropout", 10, vec![r(&[4, 5])]).attr(float("ratio", 0.25)));
    }

    #[test]
    fn dropout_mask_is_seeded_and_scaled() {
        use crate::exec::kernel::{Extras, KernelCtx};
        use crate::onnx::Attrs;
        use crate::tensor::{Data, Fact, Tensor as PTensor};
        use candle_core::{Device, Tensor};
        let dev = Device::Cpu;
        let ratio = PTensor::new(DType::F32, vec![], Data::F(vec![0.5]));
        let inputs = vec![
            Some(Fact::new(DType::F64, vec![1000])),
            Some(Fact::with_value(ratio)),
        ];
        let outputs = vec![
            Some(Fact::new(DType::F64, vec![1000])),
            Some(Fact::new(DType::Bool, vec![1000])),
        ];
        let run = |seed: u64| {
            let cx = KernelCtx {
                node: "d",
                op: "Dropout",
                opset: 13,
                attrs: Attrs {
                    node: "d",
                    op: "Dropout",
                    list: &[],
                },
                inputs: &inputs,
                outputs: &outputs,
                device: &dev,
                seed,
            };
            let x = Tensor::ones(1000, candle_core::DType::F64, &dev).unwrap();
            let y = super::dropout_fwd(&cx, &[Some(x), None], &Extras::new()).unwrap();
            (
                y[0].as_ref().unwrap().to_vec1::<f64>().unwrap(),
                y[1].as_ref().unwrap().to_vec1::<u8>().unwrap(),
            )
        };
        let (y1, m1) = run(3);
        let (y2, m2) = run(3);
        let (_, m3) = run(4);
        assert_eq!(m1, m2);
        assert_eq!(y1, y2);
        assert_ne!(m1, m3);
        let kept = m1.iter().filter(|&&b| b == 1).count();
        assert!(
            (400..600).contains(&kept),
            "{kept} of 1000 kept at ratio 0.5"
        );
        for (y, m) in y1.iter().zip(&m1) {
            assert_eq!(*y, if *m == 1 { 2.0 } else { 0.0 });
        }
    }

    #[test]
    fn einsum() {
        let eq = |e: &str| string("equation", e);
        check(&Case::new("Einsum", 12, vec![r(&[3, 4]), r(&[4, 5])]).attr(eq("ij,jk->ik")));
        check(
            &Case::new("Einsum", 12, vec![r(&[2, 3, 4]), r(&[2, 4, 5])]).attr(eq("bij,bjk->bik")),
        );
        check(
            &Case::new("Einsum", 12, vec![r(&[2, 2, 3, 4]), r(&[2, 2, 5, 4])])
                .attr(eq("bhqd,bhkd->bhqk")),
        );
        check(&Case::new("Einsum", 12, vec![r(&[3, 4])]).attr(eq("ij->ji")));
        check(&Case::new("Einsum", 12, vec![r(&[3, 4])]).attr(eq("ij->i")));
        check(&Case::new("Einsum", 12, vec![r(&[3]), r(&[4])]).attr(eq("i,j->ij")));
        check(&Case::new("Einsum", 12, vec![r(&[3, 4]), r(&[3, 4])]).attr(eq("ij,ij->")));
        check(&Case::new("Einsum", 12, vec![r(&[3, 4]), r(&[4, 2])]).attr(eq("ij,jk")));
        check(&Case::new("Einsum", 12, vec![r(&[2, 3, 4]), r(&[4, 5])]).attr(eq("bij,jk->bki")));
        check(&Case::new("Einsum", 12, vec![r(&[3, 4, 2]), r(&[4])]).attr(eq("ijk,j->ik")));
        check(
            &Case::new("Einsum", 12, vec![r(&[2, 3]), r(&[3, 4]), r(&[4, 2])])
                .attr(eq("ij,jk,kl->il")),
        );
        check(&Case::new("Einsum", 12, vec![r(&[3]), r(&[3]), r(&[2, 3])]).attr(eq("i,i,ji->j")));
        // Size-1 broadcasting of a shared letter.
        check(
            &Case::new("Einsum", 12, vec![r(&[1, 3, 4]), r(&[2, 4, 5])]).attr(eq("bij,bjk->bik")),
        );
    }

    #[test]
    fn einsum_unsupported_equation_is_a_clear_error() {
        use crate::exec::testing::check_on;
        use candle_core::Device;
        let e = check_on(
            &Case::new("Einsum", 12, vec![r(&[3, 3])]).attr(string("equation", "ii->i")),
            &Device::Cpu,
        );
        match e {
            Err(e) => assert!(e.0.contains("ii->i"), "{e}"),
            Ok(()) => panic!("a diagonal equation must be refused"),
        }
    }

    /// Runs the forward and the backward of an op with float inputs of element type `dt`
    /// (the same draws in every type), with the extras of its gradient rule, and returns
    /// every output, then every gradient, as f64.
    fn forward_in(
        op: &'static str,
        opset: i64,
        attrs: &[onnx_protobuf::AttributeProto],
        shapes: &[Vec<usize>],
        n_out: usize,
        dt: DType,
    ) -> Vec<Vec<f64>> {
        use crate::exec::kernel::{to_candle, Extras, KernelCtx, Rng};
        use crate::onnx::Attrs;
        use crate::ops::{registry as ops, Ctx, Saved};
        use crate::tensor::Fact;
        use candle_core::{Device, Tensor};
        let dev = Device::Cpu;
        let mut rng = Rng::new(5);
        let facts: Vec<Option<Fact>> = shapes
            .iter()
            .map(|s| Some(Fact::new(dt, s.iter().map(|&d| d as u64).collect())))
            .collect();
        let values: Vec<Option<Tensor>> = shapes
            .iter()
            .map(|s| {
                let n: usize = s.iter().product();
                let v: Vec<f64> = (0..n).map(|_| rng.uniform(0.1, 1.0)).collect();
                Some(
                    Tensor::from_vec(v, s.clone(), &dev)
                        .unwrap()
                        .to_dtype(to_candle(dt).unwrap())
                        .unwrap(),
                )
            })
            .collect();
        let spec = ops()[op];
        let list = attrs.to_vec();
        let scx = Ctx {
            node: "n",
            op,
            opset,
            attrs: Attrs {
                node: "n",
                op,
                list: &list,
            },
            inputs: &facts,
            n_outputs: n_out,
        };
        let inferred = (spec.infer)(&scx).unwrap();
        let rule = (spec.grad)(&scx, &inferred, &vec![true; facts.len()]);
        let outs: Vec<Option<Fact>> = inferred.into_iter().map(Some).collect();
        let cx = KernelCtx {
            node: "n",
            op,
            opset,
            attrs: Attrs {
                node: "n",
                op,
                list: &list,
            },
            inputs: &facts,
            outputs: &outs,
            device: &dev,
            seed: 3,
        };
        let k = crate::exec::kernels::registry()[op];
        let mut ex = Extras::new();
        for sv in &rule.saved {
            if let Saved::Extra { tag, bytes, .. } = sv {
                let v = (k.extra.unwrap())(&cx, tag, &values).unwrap();
                let got: usize = v
                    .iter()
                    .map(|t| t.elem_count() * t.dtype().size_in_bytes())
                    .sum();
                assert_eq!(got as u64, *bytes, "{op} {tag} bytes in {dt:?}");
                ex.insert(tag.to_string(), v);
            }
        }
        let y = (k.forward)(&cx, &values, &ex).unwrap();
        let mut res: Vec<Vec<f64>> = y
            .iter()
            .zip(&outs)
            .map(|(t, f)| {
                let t = t.as_ref().unwrap();
                let f = f.as_ref().unwrap();
                let want = if f.dtype.is_float() && dt == DType::F64 {
                    candle_core::DType::F64
                } else {
                    to_candle(f.dtype).unwrap()
                };
                assert_eq!(t.dtype(), want, "{op} output dtype in {dt:?}");
                t.to_dtype(candle_core::DType::F64)
                    .unwrap()
                    .flatten_all()
                    .unwrap()
                    .to_vec1::<f64>()
                    .unwrap()
            })
            .collect();
        // The backward, with every input visible, seeds from the same draws in every dtype.
        let needs: Vec<bool> = (0..facts.len()).map(|i| (spec.diff_in)(&scx, i)).collect();
        if !needs.iter().any(|&b| b) {
            return res;
        }
        let seeds: Vec<Option<Tensor>> = outs
            .iter()
            .enumerate()
            .map(|(k, f)| {
                let f = f.as_ref().unwrap();
                (f.dtype.is_float() && (spec.diff_out)(&scx, k)).then(|| {
                    let shape: Vec<usize> = f.shape.iter().map(|&d| d as usize).collect();
                    let n: usize = shape.iter().product();
                    let v: Vec<f64> = (0..n).map(|_| rng.uniform(-1.0, 1.0)).collect();
                    Tensor::from_vec(v, shape, &dev)
                        .unwrap()
                        .to_dtype(to_candle(dt).unwrap())
                        .unwrap()
                })
            })
            .collect();
        let outputs: Vec<Option<Tensor>> = y.clone();
        let args = crate::exec::kernel::BwdArgs {
            inputs: &values,
            outputs: &outputs,
            extras: &ex,
            grads: &seeds,
            needs: &needs,
        };
        let grads = (k.backward.unwrap())(&cx, &args).unwrap();
        for (i, g) in grads.iter().enumerate() {
            if let Some(g) = g {
                let x = values[i].as_ref().unwrap();
                assert_eq!(g.dtype(), x.dtype(), "{op} gradient {i} dtype in {dt:?}");
                assert_eq!(g.dims(), x.dims(), "{op} gradient {i} shape in {dt:?}");
                res.push(
                    g.to_dtype(candle_core::DType::F64)
                        .unwrap()
                        .flatten_all()
                        .unwrap()
                        .to_vec1::<f64>()
                        .unwrap(),
                );
            }
        }
        res
    }

    /// Op, opset, attributes, input shapes, output count.
    type FwdCase = (
        &'static str,
        i64,
        Vec<onnx_protobuf::AttributeProto>,
        Vec<Vec<usize>>,
        usize,
    );

    /// Models run in f32 and f16: the kernels give the f64 results there too, forward and
    /// backward (statistics in f32, saved extras used by the forward).
    #[test]
    fn f32_and_f16_match_f64() {
        let v = |s: &[usize]| s.to_vec();
        let cases: Vec<FwdCase> = vec![
            (
                "Conv",
                17,
                vec![ints("pads", &[1, 1, 1, 1]), ints("strides", &[2, 2])],
                vec![v(&[2, 3, 9, 9]), v(&[4, 3, 3, 3]), v(&[4])],
                1,
            ),
            (
                "Conv",
                17,
                vec![ints("pads", &[1, 1, 1, 1, 1, 1])],
                vec![v(&[1, 2, 3, 5, 5]), v(&[3, 2, 3, 3, 3])],
                1,
            ),
            (
                "BatchNormalization",
                15,
                vec![int("training_mode", 1)],
                vec![v(&[4, 3, 5, 5]), v(&[3]), v(&[3]), v(&[3]), v(&[3])],
                3,
            ),
            (
                "LayerNormalization",
                17,
                vec![],
                vec![v(&[4, 16]), v(&[16]), v(&[16])],
                3,
            ),
            (
                "GroupNormalization",
                21,
                vec![int("num_groups", 2)],
                vec![v(&[2, 4, 3, 3]), v(&[4]), v(&[4])],
                1,
            ),
            (
                "InstanceNormalization",
                6,
                vec![],
                vec![v(&[2, 3, 4, 4]), v(&[3]), v(&[3])],
                1,
            ),
            (
                "MaxPool",
                12,
                vec![
                    ints("kernel_shape", &[3, 3]),
                    ints("strides", &[2, 2]),
                    ints("pads", &[1, 1, 1, 1]),
                ],
                vec![v(&[2, 3, 9, 9])],
                2,
            ),
            (
                "AveragePool",
                19,
                vec![ints("kernel_shape", &[2, 2])],
                vec![v(&[2, 3, 6, 6])],
                1,
            ),
            (
                "Gemm",
                13,
                vec![int("transB", 1)],
                vec![v(&[4, 8]), v(&[5, 8]), v(&[5])],
                1,
            ),
            ("MatMul", 13, vec![], vec![v(&[2, 3, 8]), v(&[8, 4])], 1),
            ("Softmax", 13, vec![], vec![v(&[3, 7])], 1),
            ("LogSoftmax", 13, vec![], vec![v(&[3, 7])], 1),
            ("GlobalAveragePool", 13, vec![], vec![v(&[2, 3, 4, 4])], 1),
        ];
        for (op, opset, attrs, shapes, n_out) in cases {
            let want = forward_in(op, opset, &attrs, &shapes, n_out, DType::F64);
            for (dt, tol) in [(DType::F32, 1e-4), (DType::F16, 5e-2)] {
                let got = forward_in(op, opset, &attrs, &shapes, n_out, dt);
                // Outputs, then at least one gradient.
                assert!(
                    want.len() > n_out && got.len() == want.len(),
                    "{op} in {dt:?}"
                );
                for (k, (a, b)) in want.iter().zip(&got).enumerate() {
                    let scale = a.iter().map(|x| x.abs()).fold(1.0, f64::max);
                    let err = a
                        .iter()
                        .zip(b)
                        .map(|(x, y)| (x - y).abs())
                        .fold(0.0, f64::max)
                        / scale;
                    assert!(err < tol, "{op} result {k} in {dt:?}: relative error {err}");
                }
            }
        }
    }
}
