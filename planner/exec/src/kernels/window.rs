//! Sliding windows of convolution and pooling ops: strides, dilations and pads resolved
//! against the shape rule's output size, and strided views of a padded input.

use super::common::usizes;
use crate::kernel::kbail;
use crate::kernel::{KResult, KernelCtx};
use candle_core::{Device, Tensor};
use remat_planner::ops::Window;

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
    pub(super) fn eff(&self, j: usize) -> usize {
        (self.k[j] - 1) * self.d[j] + 1
    }
}

/// The node's window ([`Window::read`]: strides, dilations, pads and `auto_pad`, as its shape
/// rule reads them), resolved for input spatial size `input` and output spatial size `out`
/// (from the shape rule) and the kernel `k`.
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
    let w = Window::read(&cx.rule, u64s(&k))?;
    let (s, d) = (sizes(&w.strides), sizes(&w.dilations));
    if k.contains(&0) || s.contains(&0) || d.contains(&0) {
        kbail!("kernel, strides and dilations must be positive");
    }
    let (pb, pe) = w.pads_for(&u64s(input), &u64s(out));
    let (pb, pe) = (sizes(&pb), sizes(&pe));
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
pub(super) fn take_strided(
    x: &Tensor,
    dim: usize,
    off: usize,
    s: usize,
    out: usize,
) -> KResult<Tensor> {
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
pub(super) fn zero_insert(g: &Tensor, dim: usize, s: usize) -> KResult<Tensor> {
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
pub(super) fn put_strided(
    g: &Tensor,
    dim: usize,
    off: usize,
    s: usize,
    len: usize,
) -> KResult<Tensor> {
    let z = zero_insert(g, dim, s)?;
    let zl = z.dim(dim)?;
    if off + zl > len {
        kbail!("window at {off} of length {zl} exceeds length {len}");
    }
    Ok(z.pad_with_zeros(dim, off, len - off - zl)?)
}

/// The window at kernel offset `off` (already multiplied by the dilation) over spatial dims
/// starting at `base`.
pub(super) fn window(
    x: &Tensor,
    base: usize,
    off: &[usize],
    s: &[usize],
    out: &[usize],
) -> KResult<Tensor> {
    let mut t = x.clone();
    for j in 0..off.len() {
        t = take_strided(&t, base + j, off[j], s[j], out[j])?;
    }
    Ok(t)
}

/// Adjoint of [`window`]: `g` scattered into zeros of spatial size `lens`.
pub(super) fn unwindow(
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
pub(super) fn pad_dims(
    x: &Tensor,
    base: usize,
    pb: &[usize],
    pe: &[usize],
    value: f64,
) -> KResult<Tensor> {
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
pub(super) fn offsets(w: &Win) -> Vec<Vec<usize>> {
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

// Index windows: the window elements of any rank, gathered by one `index_select` over the
// zero-padded, flattened spatial dims (LpPool, Col2Im).

/// A sliding window over `in_dims` (spatial dims), already resolved to explicit pads.
pub(super) struct IndexWin {
    pub(super) in_dims: Vec<usize>,
    pub(super) kernel: Vec<usize>,
    pub(super) strides: Vec<usize>,
    pub(super) dilations: Vec<usize>,
    /// Padding before and after each dim (after includes what ceil mode needs).
    pub(super) begin: Vec<usize>,
    pub(super) end: Vec<usize>,
    pub(super) out_dims: Vec<usize>,
}

impl IndexWin {
    pub(super) fn padded(&self) -> Vec<usize> {
        (0..self.in_dims.len())
            .map(|i| self.begin[i] + self.in_dims[i] + self.end[i])
            .collect()
    }

    /// For every window position (outer) and kernel offset (inner), the flat index in the
    /// padded dims; `kernel_major` swaps the nesting (Col2Im's column layout).
    pub(super) fn index(&self, kernel_major: bool, dev: &Device) -> KResult<Tensor> {
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
    pub(super) fn pad_flat(&self, x: &Tensor) -> KResult<Tensor> {
        let mut t = x.clone();
        for i in 0..self.in_dims.len() {
            if self.begin[i] > 0 || self.end[i] > 0 {
                t = t.pad_with_zeros(i + 2, self.begin[i], self.end[i])?;
            }
        }
        Ok(t.flatten_from(2)?.contiguous()?)
    }

    /// The inverse of `pad_flat`: `[a, b, Π padded]` → `[a, b, spatial...]`.
    pub(super) fn unpad(&self, t: &Tensor) -> KResult<Tensor> {
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
pub(super) fn pool_win(cx: &KernelCtx) -> KResult<IndexWin> {
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
    Ok(IndexWin {
        in_dims,
        kernel: w.k,
        strides: w.s,
        dilations: w.d,
        begin: w.pb,
        end,
        out_dims,
    })
}

fn u64s(v: &[usize]) -> Vec<u64> {
    v.iter().map(|&x| x as u64).collect()
}

fn sizes(v: &[u64]) -> Vec<usize> {
    v.iter().map(|&x| x as usize).collect()
}
