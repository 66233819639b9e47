//! One-pass host backwards (CPU) of Relu, Clip and GELU.

use candle_core::DType;

/// `g` where `y > 0`, else 0: the Relu backward in one pass on the CPU, split over candle's
/// threads (the comparison, cast and product of the generic path take three passes; Relu's
/// backward is the most frequent one in a CNN).
pub(super) struct ReluGrad;

impl crate::kernels::host::Host2 for ReluGrad {
    const WHAT: &'static str = "relu-grad";
    const HALF: bool = true;
    const SAME_SHAPE: bool = true;

    fn run<T: candle_core::WithDType>(
        &self,
        g: &[T],
        y: &[T],
        shape: &candle_core::Shape,
    ) -> candle_core::Result<(Vec<T>, candle_core::Shape)> {
        if g.len() != y.len() {
            candle_core::bail!("relu-grad: {} and {} elements differ", g.len(), y.len());
        }
        Ok((mask_positive(g, y), shape.clone()))
    }
}

custom_op2!(ReluGrad, "relu-grad", host2);

/// `g[i]` where `y[i] > 0`, else zero, in chunks of 64K elements on all threads.
fn mask_positive<T: candle_core::WithDType>(g: &[T], y: &[T]) -> Vec<T> {
    const CHUNK: usize = 1 << 16;
    let zero = T::from_f64(0.0);
    crate::kernels::host::par_build(g.len(), CHUNK, zero, |u, o| {
        let at = u * CHUNK;
        for ((o, &g), &y) in o.iter_mut().zip(&g[at..]).zip(&y[at..]) {
            *o = if y > zero { g } else { zero };
        }
    })
}

/// `g[i]` where `lo ≤ x[i] ≤ hi`, else zero, in chunks of 64K elements on all threads. (Its
/// own loop: one shared with [`mask_positive`] through a predicate closure made Relu's
/// backward several times slower: docs/bench/executor.md, "Figures behind the code".)
fn mask_within<T: candle_core::WithDType>(g: &[T], x: &[T], lo: T, hi: T) -> Vec<T> {
    const CHUNK: usize = 1 << 16;
    let zero = T::from_f64(0.0);
    crate::kernels::host::par_build(g.len(), CHUNK, zero, |u, o| {
        let at = u * CHUNK;
        for ((o, &g), &x) in o.iter_mut().zip(&g[at..]).zip(&x[at..]) {
            *o = if lo <= x && x <= hi { g } else { zero };
        }
    })
}

/// `g` where `lo ≤ x ≤ hi`, else 0 (NaN: 0): Clip's backward in one pass on the CPU. The
/// generic path (two comparisons, two casts, three products) held three temporaries of the
/// input's size at once: the heap's peak of mobilenet_v2's training step (its ReLU6s).
pub(super) struct ClipGrad {
    pub(super) lo: f64,
    pub(super) hi: f64,
}

impl crate::kernels::host::Host2 for ClipGrad {
    const WHAT: &'static str = "clip-grad";
    const HALF: bool = true;
    const SAME_SHAPE: bool = true;

    fn run<T: candle_core::WithDType>(
        &self,
        g: &[T],
        x: &[T],
        shape: &candle_core::Shape,
    ) -> candle_core::Result<(Vec<T>, candle_core::Shape)> {
        // `SAME_SHAPE`: `host2` has checked that the operands' shapes, so their lengths, agree.
        let (lo, hi) = (T::from_f64(self.lo), T::from_f64(self.hi));
        Ok((mask_within(g, x, lo, hi), shape.clone()))
    }
}

custom_op2!(ClipGrad, "clip-grad", host2);

/// `g · GELU'(x)` in one pass on the CPU, in f32 (f64 for f64 inputs): `Φ(x) + x·φ(x)`, or
/// with `tanh`, `½(1 + t) + ½x(1 − t²)·c(1 + 3·0.044715x²)` where `t = tanh(c(x + 0.044715x³))`.
/// The generic path's dozen tensor ops held several temporaries of the input's size at once
/// (wav2vec_features: the heap's peak).
pub(super) struct GeluGrad {
    pub(super) tanh: bool,
}

macro_rules! gelu_derivative {
    ($name:ident, $t:ty, $erf:path, $pi:expr) => {
        fn $name(x: $t, tanh: bool) -> $t {
            if tanh {
                let c = (2.0 / $pi).sqrt();
                let x2 = x * x;
                let t = (c * x * (1.0 + 0.044715 * x2)).tanh();
                0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * c * (1.0 + 3.0 * 0.044715 * x2)
            } else {
                let cdf = 0.5 * (1.0 + $erf(x * std::f64::consts::FRAC_1_SQRT_2 as $t));
                let pdf = (-0.5 * x * x).exp() / (2.0 * $pi).sqrt();
                cdf + x * pdf
            }
        }
    };
}
gelu_derivative!(
    gelu_d32,
    f32,
    candle_core::cpu::erf::erf_f32,
    std::f32::consts::PI
);
gelu_derivative!(
    gelu_d64,
    f64,
    candle_core::cpu::erf::erf_f64,
    std::f64::consts::PI
);

impl crate::kernels::host::Host2 for GeluGrad {
    const WHAT: &'static str = "gelu-grad";
    const HALF: bool = true;
    const SAME_SHAPE: bool = true;

    fn run<T: candle_core::WithDType>(
        &self,
        g: &[T],
        x: &[T],
        shape: &candle_core::Shape,
    ) -> candle_core::Result<(Vec<T>, candle_core::Shape)> {
        // `SAME_SHAPE`: `host2` has checked that the operands' shapes, so their lengths, agree.
        const CHUNK: usize = 1 << 16;
        let (tanh, wide) = (self.tanh, T::DTYPE == DType::F64);
        let out = crate::kernels::host::par_build(g.len(), CHUNK, T::from_f64(0.0), |u, o| {
            let at = u * CHUNK;
            for ((o, &g), &x) in o.iter_mut().zip(&g[at..]).zip(&x[at..]) {
                *o = if wide {
                    T::from_f64(g.to_f64() * gelu_d64(x.to_f64(), tanh))
                } else {
                    T::from_f64(f64::from(
                        g.to_f64() as f32 * gelu_d32(x.to_f64() as f32, tanh),
                    ))
                };
            }
        });
        Ok((out, shape.clone()))
    }
}

custom_op2!(GeluGrad, "gelu-grad", host2);
