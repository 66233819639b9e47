//! Batch normalization's host passes (CPU): moments, the per-channel affine map and the
//! fused backward.

use crate::kernel::kbail;
use crate::kernel::{BwdArgs, KResult, KernelCtx};
use crate::kernels::common::host_unfold;
use crate::kernels::host::{self, par_build, par_units};
use candle_core::{DType, Tensor};

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
pub(super) struct BnMoments {
    pub(super) n: usize,
    pub(super) c: usize,
    pub(super) s: usize,
    pub(super) eps: f64,
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
pub(super) struct ChanAffine {
    pub(super) c: usize,
    pub(super) s: usize,
    pub(super) a: Vec<f64>,
    pub(super) b: Vec<f64>,
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
pub(super) fn bn_host_ok(x: &Tensor) -> bool {
    host_unfold(x.device()) && matches!(x.dtype(), DType::F32 | DType::F64) && x.rank() >= 2
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

pub(super) fn chan_vec(t: &Tensor) -> KResult<Vec<f64>> {
    Ok(t.flatten_all()?.to_dtype(DType::F64)?.to_vec1::<f64>()?)
}

/// Training-mode [`bn_bwd`] on the host in two fused passes (sums, then the data gradient).
pub(super) fn bn_bwd_host(
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
