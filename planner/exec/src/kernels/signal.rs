//! Kernels of the signal family: `STFT`, `DFT`, the window generators and
//! `MelWeightMatrix` (see `exec::kernel` for the contract).
//!
//! The transforms are matmuls with cosine and sine bases (built on the host in f64, then
//! moved to the device): frames of a short-time transform are gathered with
//! `index_select`, and the backward (the transposed linear map) multiplies by the bases
//! again and overlap-adds the frame gradients with `index_add`.

use crate::kernel::kbail;
use crate::kernel::{
    to_candle, BwdArgs, Extras, Inputs, KResult, Kernel, KernelCtx, KernelError, KernelRegistry,
};
use candle_core::{DType, Device, Tensor};
use std::f64::consts::PI;

fn scalar_const(cx: &KernelCtx, i: usize, what: &str) -> KResult<Option<i64>> {
    match cx.const_ints(i)? {
        None => Ok(None),
        Some(v) if v.len() == 1 => Ok(v.first().copied()),
        Some(v) => kbail!(
            "{what} (input {i}) must be a scalar, got {} values",
            v.len()
        ),
    }
}

fn positive(v: i64, what: &str) -> KResult<usize> {
    match usize::try_from(v) {
        Ok(n) if n > 0 => Ok(n),
        _ => kbail!("{what} must be positive, got {v}"),
    }
}

/// The bases of an `n`-point transform into `bins` outputs: `C[j, k] = cos(2π j k / n)`,
/// `S[j, k] = sin(2π j k / n)` (`[n, bins]`).
fn bases(n: usize, bins: usize, dtype: DType, dev: &Device) -> KResult<(Tensor, Tensor)> {
    let mut c = Vec::with_capacity(n * bins);
    let mut s = Vec::with_capacity(n * bins);
    for j in 0..n {
        for k in 0..bins {
            // Reduce j·k modulo n first so the angle stays exact for long transforms.
            let a = 2.0 * PI * ((j * k) % n) as f64 / n as f64;
            c.push(a.cos());
            s.push(a.sin());
        }
    }
    Ok((
        Tensor::from_vec(c, (n, bins), dev)?.to_dtype(dtype)?,
        Tensor::from_vec(s, (n, bins), dev)?.to_dtype(dtype)?,
    ))
}

/// A transform along the last dim: `sign` = -1 forward, +1 inverse; `factor` scales.
struct Dft {
    n: usize,
    bins: usize,
    sign: f64,
    factor: f64,
}

impl Dft {
    /// (real, imaginary) of the transform of `xr + i·xi`, both `[.., n]` → `[.., bins]`.
    fn apply(&self, xr: &Tensor, xi: Option<&Tensor>) -> KResult<(Tensor, Tensor)> {
        let (c, s) = bases(self.n, self.bins, xr.dtype(), xr.device())?;
        let mut re = xr.broadcast_matmul(&c)?;
        let mut im = xr.broadcast_matmul(&s)?.affine(self.sign, 0.0)?;
        if let Some(xi) = xi {
            re = (re - xi.broadcast_matmul(&s)?.affine(self.sign, 0.0)?)?;
            im = (im + xi.broadcast_matmul(&c)?)?;
        }
        Ok((re.affine(self.factor, 0.0)?, im.affine(self.factor, 0.0)?))
    }

    /// The transposed map: gradients of (real, imaginary) inputs from those of the outputs.
    fn transpose(&self, dre: &Tensor, dim: &Tensor) -> KResult<(Tensor, Tensor)> {
        let (c, s) = bases(self.n, self.bins, dre.dtype(), dre.device())?;
        let (ct, st) = (c.t()?.contiguous()?, s.t()?.contiguous()?);
        let dxr =
            (dre.broadcast_matmul(&ct)? + dim.broadcast_matmul(&st)?.affine(self.sign, 0.0)?)?;
        let dxi =
            (dim.broadcast_matmul(&ct)? - dre.broadcast_matmul(&st)?.affine(self.sign, 0.0)?)?;
        Ok((dxr.affine(self.factor, 0.0)?, dxi.affine(self.factor, 0.0)?))
    }
}

/// Splits `[.., 1 | 2]` into its real and imaginary parts (`[..]`).
fn complex_parts(x: &Tensor) -> KResult<(Tensor, Option<Tensor>)> {
    let r = x.rank();
    let last = x.dim(r - 1)?;
    let re = x.narrow(r - 1, 0, 1)?.squeeze(r - 1)?;
    let im = if last == 2 {
        Some(x.narrow(r - 1, 1, 1)?.squeeze(r - 1)?)
    } else {
        None
    };
    Ok((re, im))
}

// ---------------------------------------------------------------------------------------
// STFT

struct Stft {
    batch: usize,
    signal: usize,
    step: usize,
    len: usize,
    frames: usize,
    bins: usize,
    /// The input has a trailing dim (1 real, 2 complex); a 2-D input is real.
    trailing: Option<usize>,
}

fn stft_cfg(cx: &KernelCtx) -> KResult<Stft> {
    let x = cx.in_shape(0)?;
    let trailing = match x.len() {
        2 => None,
        3 => Some(x.get(2).copied().unwrap_or(1)),
        r => kbail!("signal must be [batch, length, 1 or 2] or [batch, length], got rank {r}"),
    };
    let step = scalar_const(cx, 1, "frame_step")?
        .ok_or_else(|| KernelError::new("frame_step (input 1) is required"))?;
    let step = positive(step, "frame_step")?;
    let wlen = cx
        .inputs
        .get(2)
        .and_then(|f| f.as_ref())
        .map(|f| f.shape.first().copied().unwrap_or(0) as usize);
    let len = match (scalar_const(cx, 3, "frame_length")?, wlen) {
        (Some(l), _) => positive(l, "frame_length")?,
        (None, Some(w)) => w,
        (None, None) => kbail!("STFT needs a window or a frame_length"),
    };
    let (batch, signal) = (
        x.first().copied().unwrap_or(0),
        x.get(1).copied().unwrap_or(0),
    );
    if signal < len || len == 0 {
        kbail!("signal length {signal} is shorter than the frame length {len}");
    }
    let onesided = cx.attrs.int_or("onesided", 1)? != 0;
    Ok(Stft {
        batch,
        signal,
        step,
        len,
        frames: (signal - len) / step + 1,
        bins: if onesided { len / 2 + 1 } else { len },
        trailing,
    })
}

/// Signal positions of every frame sample, `[frames · len]`.
fn frame_index(st: &Stft, dev: &Device) -> KResult<Tensor> {
    let idx: Vec<u32> = (0..st.frames)
        .flat_map(|f| (0..st.len).map(move |j| (f * st.step + j) as u32))
        .collect();
    Ok(Tensor::from_vec(idx, st.frames * st.len, dev)?)
}

fn stft_forward(cx: &KernelCtx, xs: &[Option<Tensor>], _: &Extras) -> KResult<Vec<Option<Tensor>>> {
    let st = stft_cfg(cx)?;
    let x = xs.named(0, "signal")?;
    let (xr, xi) = match st.trailing {
        None => (x.clone(), None),
        Some(_) => complex_parts(x)?,
    };
    let idx = frame_index(&st, cx.device)?;
    let frames = |t: &Tensor| -> KResult<Tensor> {
        let f = t
            .contiguous()?
            .index_select(&idx, 1)?
            .reshape((st.batch, st.frames, st.len))?;
        Ok(match xs.opt(2) {
            Some(w) => f.broadcast_mul(&w.to_dtype(f.dtype())?)?,
            None => f,
        })
    };
    let fr = frames(&xr)?;
    let fi = match &xi {
        Some(t) => Some(frames(t)?),
        None => None,
    };
    let dft = Dft {
        n: st.len,
        bins: st.bins,
        sign: -1.0,
        factor: 1.0,
    };
    let (re, im) = dft.apply(&fr, fi.as_ref())?;
    Ok(vec![Some(Tensor::stack(&[&re, &im], 3)?)])
}

fn stft_backward(cx: &KernelCtx, g: &BwdArgs) -> KResult<Vec<Option<Tensor>>> {
    let st = stft_cfg(cx)?;
    let mut out: Vec<Option<Tensor>> = vec![None; cx.inputs.len()];
    if !g.need(0) {
        return Ok(out);
    }
    let dy = g.grad(cx, 0)?;
    let dre = dy.narrow(3, 0, 1)?.squeeze(3)?.contiguous()?;
    let dim = dy.narrow(3, 1, 1)?.squeeze(3)?.contiguous()?;
    let dft = Dft {
        n: st.len,
        bins: st.bins,
        sign: -1.0,
        factor: 1.0,
    };
    let (dfr, dfi) = dft.transpose(&dre, &dim)?;
    let window = if cx.inputs.get(2).is_some_and(|f| f.is_some()) {
        Some(g.input(2)?.to_dtype(dre.dtype())?)
    } else {
        None
    };
    let idx = frame_index(&st, cx.device)?;
    let overlap_add = |d: &Tensor| -> KResult<Tensor> {
        let d = match &window {
            Some(w) => d.broadcast_mul(w)?,
            None => d.clone(),
        };
        let d = d.reshape((st.batch, st.frames * st.len))?;
        let z = Tensor::zeros((st.batch, st.signal), d.dtype(), cx.device)?;
        Ok(z.index_add(&idx, &d, 1)?)
    };
    let dxr = overlap_add(&dfr)?;
    let dx = match st.trailing {
        None => dxr,
        Some(1) => dxr.unsqueeze(2)?,
        Some(_) => Tensor::stack(&[&dxr, &overlap_add(&dfi)?], 2)?,
    };
    if let Some(s) = out.get_mut(0) {
        *s = Some(dx);
    }
    Ok(out)
}

// ---------------------------------------------------------------------------------------
// DFT

struct DftCfg {
    axis: usize,
    /// Length of the input along the axis.
    len: usize,
    dft: Dft,
}

fn dft_cfg(cx: &KernelCtx) -> KResult<DftCfg> {
    let x = cx.in_shape(0)?;
    let r = x.len();
    let axis = if cx.opset >= 20 {
        scalar_const(cx, 2, "axis")?.unwrap_or(-2)
    } else {
        cx.attrs.int_or("axis", 1)?
    };
    let a = cx.axis(axis, r)?;
    if a == 0 || a + 1 == r {
        kbail!("attribute \"axis\" = {axis} must name a signal dim of {x:?}");
    }
    let len = x.get(a).copied().unwrap_or(0);
    let n = match scalar_const(cx, 1, "dft_length")? {
        Some(l) => positive(l, "dft_length")?,
        None => len,
    };
    let inverse = cx.attrs.int_or("inverse", 0)? != 0;
    let onesided = cx.attrs.int_or("onesided", 0)? != 0;
    if inverse && onesided {
        kbail!("attribute \"onesided\" = 1 is not supported together with inverse");
    }
    Ok(DftCfg {
        axis: a,
        len,
        dft: Dft {
            n,
            bins: if onesided { n / 2 + 1 } else { n },
            sign: if inverse { 1.0 } else { -1.0 },
            factor: if inverse { 1.0 / n as f64 } else { 1.0 },
        },
    })
}

/// `t` (rank r - 1, the axis somewhere) with the axis moved last and cut or zero-padded to
/// `n` points.
fn to_last(t: &Tensor, axis: usize, len: usize, n: usize) -> KResult<Tensor> {
    let last = t.rank() - 1;
    let t = t.transpose(axis, last)?.contiguous()?;
    Ok(if n < len {
        t.narrow(last, 0, n)?.contiguous()?
    } else if n > len {
        t.pad_with_zeros(last, 0, n - len)?
    } else {
        t
    })
}

fn from_last(t: &Tensor, axis: usize, len: usize, n: usize) -> KResult<Tensor> {
    let last = t.rank() - 1;
    let t = if n > len {
        t.narrow(last, 0, len)?
    } else if n < len {
        t.pad_with_zeros(last, 0, len - n)?
    } else {
        t.clone()
    };
    Ok(t.transpose(axis, last)?.contiguous()?)
}

fn dft_forward(cx: &KernelCtx, xs: &[Option<Tensor>], _: &Extras) -> KResult<Vec<Option<Tensor>>> {
    let c = dft_cfg(cx)?;
    let (xr, xi) = complex_parts(xs.named(0, "input")?)?;
    let xr = to_last(&xr, c.axis, c.len, c.dft.n)?;
    let xi = match xi {
        Some(t) => Some(to_last(&t, c.axis, c.len, c.dft.n)?),
        None => None,
    };
    let (re, im) = c.dft.apply(&xr, xi.as_ref())?;
    let last = re.rank() - 1;
    let re = re.transpose(c.axis, last)?;
    let im = im.transpose(c.axis, last)?;
    Ok(vec![Some(
        Tensor::stack(&[&re, &im], last + 1)?.contiguous()?,
    )])
}

fn dft_backward(cx: &KernelCtx, g: &BwdArgs) -> KResult<Vec<Option<Tensor>>> {
    let c = dft_cfg(cx)?;
    let mut out: Vec<Option<Tensor>> = vec![None; cx.inputs.len()];
    if !g.need(0) {
        return Ok(out);
    }
    let dy = g.grad(cx, 0)?;
    let (dre, dim) = complex_parts(&dy)?;
    let dim = dim.ok_or_else(|| KernelError::new("the DFT gradient has no imaginary part"))?;
    let last = dre.rank() - 1;
    let dre = dre.transpose(c.axis, last)?.contiguous()?;
    let dim = dim.transpose(c.axis, last)?.contiguous()?;
    let (dxr, dxi) = c.dft.transpose(&dre, &dim)?;
    let dxr = from_last(&dxr, c.axis, c.len, c.dft.n)?;
    let trailing = cx.in_shape(0)?.last().copied().unwrap_or(1);
    let dx = if trailing == 2 {
        let dxi = from_last(&dxi, c.axis, c.len, c.dft.n)?;
        Tensor::stack(&[&dxr, &dxi], last + 1)?
    } else {
        dxr.unsqueeze(last + 1)?
    };
    if let Some(s) = out.get_mut(0) {
        *s = Some(dx);
    }
    Ok(out)
}

// ---------------------------------------------------------------------------------------
// Generators

fn out_dtype(cx: &KernelCtx) -> KResult<DType> {
    let f = cx
        .outputs
        .first()
        .and_then(|f| f.as_ref())
        .ok_or_else(|| KernelError::new("output 0 is not in the graph"))?;
    to_candle(f.dtype)
}

fn window_forward(
    cx: &KernelCtx,
    _: &[Option<Tensor>],
    _: &Extras,
) -> KResult<Vec<Option<Tensor>>> {
    let size = scalar_const(cx, 0, "size")?
        .ok_or_else(|| KernelError::new("size (input 0) is required"))?;
    let size = usize::try_from(size)
        .map_err(|_| KernelError::new(format!("size must be non-negative, got {size}")))?;
    let periodic = cx.attrs.int_or("periodic", 1)? != 0;
    let n = if periodic {
        size
    } else {
        size.saturating_sub(1)
    } as f64;
    let v: Vec<f64> = (0..size)
        .map(|i| {
            let a = if n > 0.0 {
                2.0 * PI * i as f64 / n
            } else {
                0.0
            };
            match cx.op {
                "HannWindow" => 0.5 - 0.5 * a.cos(),
                "HammingWindow" => 25.0 / 46.0 - (21.0 / 46.0) * a.cos(),
                _ => 0.42 - 0.5 * a.cos() + 0.08 * (2.0 * a).cos(),
            }
        })
        .collect();
    Ok(vec![Some(
        Tensor::from_vec(v, size, cx.device)?.to_dtype(out_dtype(cx)?)?,
    )])
}

fn mel_forward(cx: &KernelCtx, _: &[Option<Tensor>], _: &Extras) -> KResult<Vec<Option<Tensor>>> {
    let mels = scalar_const(cx, 0, "num_mel_bins")?
        .ok_or_else(|| KernelError::new("num_mel_bins (input 0) is required"))?;
    let mels = positive(mels, "num_mel_bins")?;
    let dft = scalar_const(cx, 1, "dft_length")?
        .ok_or_else(|| KernelError::new("dft_length (input 1) is required"))?;
    let dft = positive(dft, "dft_length")?;
    let scalar_f = |i: usize, what: &str| -> KResult<f64> {
        match cx.const_floats(i)? {
            Some(v) if v.len() == 1 => Ok(v.first().copied().unwrap_or(0.0)),
            _ => kbail!("{what} (input {i}) must be a constant scalar"),
        }
    };
    let rate = scalar_f(2, "sample_rate")?;
    let (lo, hi) = (
        scalar_f(3, "lower_edge_hertz")?,
        scalar_f(4, "upper_edge_hertz")?,
    );
    if rate <= 0.0 {
        kbail!("sample_rate must be positive, got {rate}");
    }
    let spec_bins = dft / 2 + 1;
    let to_mel = |f: f64| 2595.0 * (1.0 + f / 700.0).log10();
    let (lm, hm) = (to_mel(lo), to_mel(hi));
    let step = (hm - lm) / (mels + 2) as f64;
    let bins: Vec<i64> = (0..mels + 2)
        .map(|i| {
            let hz = 700.0 * (10f64.powf((i as f64 * step + lm) / 2595.0) - 1.0);
            (((dft + 1) as f64 * hz) / rate).floor() as i64
        })
        .collect();
    let mut out = vec![0.0f64; spec_bins * mels];
    let mut set = |j: i64, i: usize, v: f64| -> KResult<()> {
        let j = usize::try_from(j)
            .ok()
            .filter(|&j| j < spec_bins)
            .ok_or_else(|| {
                KernelError::new(format!(
                    "mel bin edge {j} falls outside the {spec_bins} spectrogram bins"
                ))
            })?;
        if let Some(x) = out.get_mut(j * mels + i) {
            *x = v;
        }
        Ok(())
    };
    for i in 0..mels {
        let (l, c, h) = (
            bins.get(i).copied().unwrap_or(0),
            bins.get(i + 1).copied().unwrap_or(0),
            bins.get(i + 2).copied().unwrap_or(0),
        );
        if c == l {
            set(c, i, 1.0)?;
        } else {
            for j in l..=c {
                set(j, i, (j - l) as f64 / (c - l) as f64)?;
            }
        }
        if h > c {
            for j in c..h {
                set(j, i, (h - j) as f64 / (h - c) as f64)?;
            }
        }
    }
    Ok(vec![Some(
        Tensor::from_vec(out, (spec_bins, mels), cx.device)?.to_dtype(out_dtype(cx)?)?,
    )])
}

pub fn register(r: &mut KernelRegistry) {
    r.insert("STFT", Kernel::new(stft_forward, Some(stft_backward)));
    r.insert("DFT", Kernel::new(dft_forward, Some(dft_backward)));
    for op in ["HannWindow", "HammingWindow", "BlackmanWindow"] {
        r.insert(op, Kernel::new(window_forward, None));
    }
    r.insert("MelWeightMatrix", Kernel::new(mel_forward, None));
}

#[cfg(test)]
mod tests {
    use crate::testing::tensors::{close, forward, seq, t, vals};
    use crate::testing::{check, int, Case, In};
    use candle_core::{Device, Tensor};
    use remat_planner::tensor::DType;
    use std::f64::consts::PI;

    fn ci(v: i64) -> Tensor {
        Tensor::from_vec(vec![v], (), &Device::Cpu).unwrap()
    }

    /// A naive DFT of `(re, im)` sequences.
    fn naive(re: &[f64], im: &[f64], bins: usize, sign: f64) -> Vec<(f64, f64)> {
        let n = re.len();
        (0..bins)
            .map(|k| {
                let mut acc = (0.0, 0.0);
                for j in 0..n {
                    let a = sign * 2.0 * PI * (j * k) as f64 / n as f64;
                    acc.0 += re[j] * a.cos() - im[j] * a.sin();
                    acc.1 += re[j] * a.sin() + im[j] * a.cos();
                }
                acc
            })
            .collect()
    }

    #[test]
    fn stft_real_2d_with_window() {
        check(&Case::new(
            "STFT",
            17,
            vec![
                In::Rand(vec![2, 10]),
                In::Const(DType::I64, vec![], vec![3.0]),
                In::Const(DType::F32, vec![4], vec![0.1, 0.6, 0.9, 0.4]),
            ],
        ));
    }

    #[test]
    fn stft_complex_two_sided_frame_length() {
        check(
            &Case::new(
                "STFT",
                17,
                vec![
                    In::Rand(vec![1, 9, 2]),
                    In::Const(DType::I64, vec![], vec![2.0]),
                    In::None,
                    In::Const(DType::I64, vec![], vec![5.0]),
                ],
            )
            .attr(int("onesided", 0)),
        );
        check(&Case::new(
            "STFT",
            17,
            vec![
                In::Rand(vec![1, 9, 1]),
                In::Const(DType::I64, vec![], vec![2.0]),
                In::None,
                In::Const(DType::I64, vec![], vec![5.0]),
            ],
        ));
    }

    #[test]
    fn stft_matches_a_naive_transform() {
        let x = seq(12, 0.7, 0.2);
        let w = [0.2, 0.5, 1.0, 0.5, 0.3];
        let y = forward(
            "STFT",
            17,
            &[],
            &[Some(t(&x, &[1, 12])), Some(ci(3)), Some(t(&w, &[5]))],
            &[1],
            1,
        )
        .unwrap();
        let mut want = vec![];
        for f in 0..3 {
            let re: Vec<f64> = (0..5).map(|j| x[f * 3 + j] * w[j]).collect();
            for (a, b) in naive(&re, &[0.0; 5], 3, -1.0) {
                want.extend([a, b]);
            }
        }
        assert_eq!(y[0].dims(), &[1, 3, 3, 2]);
        close(&vals(&y[0]), &want, 1e-12);
    }

    #[test]
    fn dft_axes_lengths_inverse_onesided() {
        // Opset 17: axis attribute, real input, onesided.
        check(
            &Case::new("DFT", 17, vec![In::Rand(vec![2, 6, 3, 1])])
                .attr(int("axis", 1))
                .attr(int("onesided", 1)),
        );
        // Opset 20: axis input, complex input, padded dft_length, inverse.
        check(
            &Case::new(
                "DFT",
                20,
                vec![
                    In::Rand(vec![2, 3, 5, 2]),
                    In::Const(DType::I64, vec![], vec![7.0]),
                    In::Const(DType::I64, vec![], vec![-2.0]),
                ],
            )
            .attr(int("inverse", 1)),
        );
        // A truncating dft_length.
        check(&Case::new(
            "DFT",
            20,
            vec![
                In::Rand(vec![1, 6, 2]),
                In::Const(DType::I64, vec![], vec![4.0]),
            ],
        ));
    }

    #[test]
    fn dft_matches_a_naive_transform() {
        let re = seq(5, 0.9, 0.1);
        let im = seq(5, 0.4, 1.1);
        let x: Vec<f64> = re.iter().zip(&im).flat_map(|(a, b)| [*a, *b]).collect();
        for inverse in [0, 1] {
            let y = forward(
                "DFT",
                20,
                &[int("inverse", inverse)],
                &[Some(t(&x, &[1, 5, 2]))],
                &[],
                1,
            )
            .unwrap();
            let sign = if inverse == 1 { 1.0 } else { -1.0 };
            let f = if inverse == 1 { 0.2 } else { 1.0 };
            let want: Vec<f64> = naive(&re, &im, 5, sign)
                .into_iter()
                .flat_map(|(a, b)| [a * f, b * f])
                .collect();
            close(&vals(&y[0]), &want, 1e-12);
        }
    }

    #[test]
    fn windows() {
        let run = |op: &'static str, periodic: i64| {
            let y = forward(
                op,
                17,
                &[int("periodic", periodic)],
                &[Some(ci(5))],
                &[0],
                1,
            )
            .unwrap();
            assert_eq!(y[0].dtype(), crate::kernel::to_candle(DType::F32).unwrap());
            y[0].to_dtype(candle_core::DType::F64)
                .unwrap()
                .to_vec1::<f64>()
                .unwrap()
        };
        let n = |periodic: i64| if periodic == 1 { 5.0 } else { 4.0 };
        for p in [0, 1] {
            let a = |i: usize| 2.0 * PI * i as f64 / n(p);
            let hann: Vec<f64> = (0..5).map(|i| 0.5 - 0.5 * a(i).cos()).collect();
            let hamming: Vec<f64> = (0..5)
                .map(|i| 25.0 / 46.0 - 21.0 / 46.0 * a(i).cos())
                .collect();
            let blackman: Vec<f64> = (0..5)
                .map(|i| 0.42 - 0.5 * a(i).cos() + 0.08 * (2.0 * a(i)).cos())
                .collect();
            close(&run("HannWindow", p), &hann, 1e-6);
            close(&run("HammingWindow", p), &hamming, 1e-6);
            close(&run("BlackmanWindow", p), &blackman, 1e-6);
        }
    }

    #[test]
    fn mel_weight_matrix_triangles() {
        let cf = |v: f64| Tensor::from_vec(vec![v], (), &Device::Cpu).unwrap();
        let y = forward(
            "MelWeightMatrix",
            17,
            &[],
            &[
                Some(ci(4)),
                Some(ci(16)),
                Some(ci(8000)),
                Some(cf(0.0)),
                Some(cf(4000.0)),
            ],
            &[0, 1, 2, 3, 4],
            1,
        )
        .unwrap();
        assert_eq!(y[0].dims(), &[9, 4]);
        let v = y[0]
            .to_dtype(candle_core::DType::F64)
            .unwrap()
            .to_vec2::<f64>()
            .unwrap();
        // Each mel filter is a triangle peaking at 1 with weights in [0, 1].
        for i in 0..4 {
            let col: Vec<f64> = v.iter().map(|r| r[i]).collect();
            let peak = col.iter().cloned().fold(0.0, f64::max);
            assert!((peak - 1.0).abs() < 1e-6, "filter {i}: {col:?}");
            assert!(
                col.iter().all(|&w| (0.0..=1.0).contains(&w)),
                "filter {i}: {col:?}"
            );
        }
        // Edges of the reference's integer bins: mel spacing over 0..4000 Hz, 17/8000 bins per Hz.
        let to_mel = |f: f64| 2595.0 * (1.0 + f / 700.0).log10();
        let step = to_mel(4000.0) / 6.0;
        let edge = |i: usize| {
            let hz = 700.0 * (10f64.powf(i as f64 * step / 2595.0) - 1.0);
            (17.0 * hz / 8000.0).floor() as usize
        };
        for i in 0..4 {
            assert!(
                (v[edge(i + 1)][i] - 1.0).abs() < 1e-6,
                "filter {i} peaks at bin {}",
                edge(i + 1)
            );
        }
    }

    #[test]
    fn f32_agrees_with_f64() {
        use crate::testing::tensors::same_in;
        let dt = candle_core::DType::F32;
        let x = t(&seq(20, 0.7, 0.1), &[2, 10]);
        let w = t(&[0.1, 0.6, 0.9, 0.4], &[4]);
        same_in(
            "STFT",
            17,
            &[],
            &[Some(x), Some(ci(3)), Some(w)],
            &[1, 2],
            1,
            dt,
            1e-4,
        );
        let x = t(&seq(30, 0.3, 0.2), &[1, 3, 5, 2]);
        same_in(
            "DFT",
            20,
            &[int("inverse", 1)],
            &[Some(x), Some(ci(6)), Some(ci(-2))],
            &[1, 2],
            1,
            dt,
            1e-4,
        );
    }
}
