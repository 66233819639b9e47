//! Host (CPU) kernels as candle custom ops: the operand checks and the dtype dispatch they
//! share. A kernel implements [`Host1`], [`Host2`] or [`HostIdx`] generically over the float
//! type; [`host1`], [`host2`] and [`host_idx`] hand it candle's CPU storage.

use candle_core::{CpuStorage, Layout, Shape, WithDType};
use std::sync::OnceLock;

type Out = candle_core::Result<(CpuStorage, Shape)>;

/// Threads the host kernels split work over.
pub(super) fn threads() -> usize {
    // Read once: `available_parallelism` reads the cgroup's files on every call (about 1% of
    // a resnet18 step's time when asked per kernel).
    static THREADS: OnceLock<usize> = OnceLock::new();
    *THREADS.get_or_init(|| {
        std::thread::available_parallelism()
            .map(|t| t.get())
            .unwrap_or(1)
            .max(1)
    })
}

/// The executor's thread pool, built once: candle's and gemm's parallel loops run in it while
/// a schedule runs (`Executor::run` installs it), and its threads are measured threads (their
/// allocations count toward the open heap measurement, see [`crate::alloc`]).
pub(crate) fn pool() -> Result<&'static rayon::ThreadPool, String> {
    static POOL: OnceLock<Result<rayon::ThreadPool, String>> = OnceLock::new();
    POOL.get_or_init(|| {
        rayon::ThreadPoolBuilder::new()
            .num_threads(threads())
            .thread_name(|i| format!("remat-exec-{i}"))
            .start_handler(|_| crate::alloc::mark_thread(true))
            .build()
            .map_err(|e| format!("cannot start the executor's threads: {e}"))
    })
    .as_ref()
    .map_err(Clone::clone)
}

/// `f(k, item)` for every item, as jobs on the current rayon pool (the executor's while a
/// schedule runs, whose threads count toward the run's heap; a thread spawned per kernel did
/// not: the few bytes std hands from the spawning thread to the new one drifted the count
/// by 24 B a thread), with the results in the items' order. A job's panic reaches the caller.
pub(super) fn par_map<I: Send, R: Send>(
    items: impl IntoIterator<Item = I>,
    f: impl Fn(usize, I) -> R + Sync,
) -> Vec<R> {
    let items: Vec<I> = items.into_iter().collect();
    let mut out: Vec<Option<R>> = std::iter::repeat_with(|| None).take(items.len()).collect();
    let f = &f;
    rayon::scope(|s| {
        for (k, (item, slot)) in items.into_iter().zip(out.iter_mut()).enumerate() {
            s.spawn(move |_| *slot = Some(f(k, item)));
        }
    });
    // The scope returns once every job has run: every slot is filled.
    out.into_iter().flatten().collect()
}

/// Splits `out` into units of `unit_len` (the last may be shorter) and fills them on all
/// threads: `f(unit, slice)`.
pub(super) fn par_units<T: Send>(
    out: &mut [T],
    unit_len: usize,
    f: impl Fn(usize, &mut [T]) + Sync,
) {
    if unit_len == 0 {
        return;
    }
    let units = out.len().div_ceil(unit_len);
    let per = units.div_ceil(threads().min(units.max(1))).max(1);
    par_map(out.chunks_mut(per * unit_len), |ci, chunk| {
        for (k, o) in chunk.chunks_mut(unit_len).enumerate() {
            f(ci * per + k, o);
        }
    });
}

/// A new vector of `len` elements in units of `unit_len`, built on all threads: each thread
/// zeroes its own run of units (so no single thread `memset`s the whole output first; that
/// was a third of the single-threaded time of a resnet18 step) and then `f(unit, slice)`
/// writes each unit, which holds `zero`s on entry.
pub(super) fn par_build<T: Copy + Send>(
    len: usize,
    unit_len: usize,
    zero: T,
    f: impl Fn(usize, &mut [T]) + Sync,
) -> Vec<T> {
    const SERIAL_BELOW: usize = 1 << 16;
    if len < SERIAL_BELOW || unit_len == 0 {
        let mut v = vec![zero; len];
        if unit_len > 0 {
            for (u, o) in v.chunks_mut(unit_len).enumerate() {
                f(u, o);
            }
        }
        return v;
    }
    let mut v: Vec<T> = Vec::with_capacity(len);
    let spare = &mut v.spare_capacity_mut()[..len];
    let units = len.div_ceil(unit_len);
    let per = units.div_ceil(threads().min(units)).max(1);
    // Each job takes its own copy of `zero` (`T` need not be `Sync`).
    let jobs = spare.chunks_mut(per * unit_len).map(|c| (c, zero));
    par_map(jobs, |ci, (chunk, zero)| {
        for x in chunk.iter_mut() {
            x.write(zero);
        }
        // SAFETY: every element of `chunk` was initialized just above, and
        // `MaybeUninit<T>` has `T`'s layout.
        let chunk: &mut [T] =
            unsafe { &mut *(chunk as *mut [std::mem::MaybeUninit<T>] as *mut [T]) };
        for (k, o) in chunk.chunks_mut(unit_len).enumerate() {
            f(ci * per + k, o);
        }
    });
    // SAFETY: the jobs above initialized every one of the first `len` elements (their
    // chunks cover `spare[..len]`), and `par_map` returned after they all ran.
    unsafe { v.set_len(len) };
    v
}

/// `len` copies of `zero`, written by all threads (see [`par_build`]).
pub(super) fn par_filled<T: Copy + Send>(len: usize, zero: T) -> Vec<T> {
    par_build(len, len.div_ceil(threads()).max(1), zero, |_, _| {})
}

/// The contiguous element range `[a, b)` of an operand, of exactly `want` elements when given.
fn span(l: &Layout, want: Option<usize>, what: &str) -> candle_core::Result<(usize, usize)> {
    let (a, b) = l
        .contiguous_offsets()
        .ok_or_else(|| candle_core::Error::Msg(format!("{what} needs contiguous operands")))?;
    match want {
        Some(w) if b - a != w => Err(candle_core::Error::Msg(format!(
            "{what}: an operand has {} elements, expected {w}",
            b - a
        ))),
        _ => Ok((a, b)),
    }
}

fn dtype_error(what: &str, half: bool) -> candle_core::Error {
    candle_core::Error::Msg(format!(
        "{what} takes {} operands of one dtype",
        if half {
            "f16, bf16, f32 or f64"
        } else {
            "f32 or f64"
        }
    ))
}

/// A host kernel over one float operand, the result in its dtype.
pub(super) trait Host1 {
    /// The op, in errors.
    const WHAT: &'static str;
    /// Takes f16 and bf16 as well as f32 and f64.
    const HALF: bool = false;
    /// Elements the operand must have (`None`: any).
    fn want(&self) -> Option<usize> {
        None
    }
    /// The result and its shape, from the operand's elements and shape.
    fn run<T: WithDType>(&self, x: &[T], shape: &Shape) -> candle_core::Result<(Vec<T>, Shape)>;
}

/// A host kernel over two float operands of one dtype, the result in it.
pub(super) trait Host2 {
    const WHAT: &'static str;
    const HALF: bool = false;
    /// Both operands must have the same shape (not just matching element counts).
    const SAME_SHAPE: bool = false;
    fn want(&self) -> [Option<usize>; 2] {
        [None, None]
    }
    /// The result and its shape, from both operands' elements and the first one's shape.
    fn run<T: WithDType>(
        &self,
        a: &[T],
        b: &[T],
        shape: &Shape,
    ) -> candle_core::Result<(Vec<T>, Shape)>;
}

/// A host kernel over float data and i64 indices, the result in the data's dtype.
pub(super) trait HostIdx {
    const WHAT: &'static str;
    fn run<T: WithDType>(&self, x: &[T], idx: &[i64]) -> candle_core::Result<(Vec<T>, Shape)>;
}

pub(super) fn host1<K: Host1>(k: &K, st: &CpuStorage, l: &Layout) -> Out {
    use CpuStorage as S;
    let (a, b) = span(l, k.want(), K::WHAT)?;
    let sh = l.shape();
    Ok(match st {
        S::F32(v) => {
            let (o, s) = k.run(&v[a..b], sh)?;
            (S::F32(o), s)
        }
        S::F64(v) => {
            let (o, s) = k.run(&v[a..b], sh)?;
            (S::F64(o), s)
        }
        S::F16(v) if K::HALF => {
            let (o, s) = k.run(&v[a..b], sh)?;
            (S::F16(o), s)
        }
        S::BF16(v) if K::HALF => {
            let (o, s) = k.run(&v[a..b], sh)?;
            (S::BF16(o), s)
        }
        _ => return Err(dtype_error(K::WHAT, K::HALF)),
    })
}

pub(super) fn host2<K: Host2>(
    k: &K,
    s1: &CpuStorage,
    l1: &Layout,
    s2: &CpuStorage,
    l2: &Layout,
) -> Out {
    use CpuStorage as S;
    if K::SAME_SHAPE && l1.shape() != l2.shape() {
        return Err(candle_core::Error::Msg(format!(
            "{}: shapes {:?} and {:?} differ",
            K::WHAT,
            l1.shape(),
            l2.shape()
        )));
    }
    let [w1, w2] = k.want();
    let ((a1, b1), (a2, b2)) = (span(l1, w1, K::WHAT)?, span(l2, w2, K::WHAT)?);
    let sh = l1.shape();
    Ok(match (s1, s2) {
        (S::F32(p), S::F32(q)) => {
            let (o, s) = k.run(&p[a1..b1], &q[a2..b2], sh)?;
            (S::F32(o), s)
        }
        (S::F64(p), S::F64(q)) => {
            let (o, s) = k.run(&p[a1..b1], &q[a2..b2], sh)?;
            (S::F64(o), s)
        }
        (S::F16(p), S::F16(q)) if K::HALF => {
            let (o, s) = k.run(&p[a1..b1], &q[a2..b2], sh)?;
            (S::F16(o), s)
        }
        (S::BF16(p), S::BF16(q)) if K::HALF => {
            let (o, s) = k.run(&p[a1..b1], &q[a2..b2], sh)?;
            (S::BF16(o), s)
        }
        _ => return Err(dtype_error(K::WHAT, K::HALF)),
    })
}

pub(super) fn host_idx<K: HostIdx>(
    k: &K,
    s1: &CpuStorage,
    l1: &Layout,
    s2: &CpuStorage,
    l2: &Layout,
) -> Out {
    use CpuStorage as S;
    let ((a1, b1), (a2, b2)) = (span(l1, None, K::WHAT)?, span(l2, None, K::WHAT)?);
    let S::I64(idx) = s2 else {
        return Err(candle_core::Error::Msg(format!(
            "{}: indices must be i64",
            K::WHAT
        )));
    };
    let idx = &idx[a2..b2];
    Ok(match s1 {
        S::F32(v) => {
            let (o, s) = k.run(&v[a1..b1], idx)?;
            (S::F32(o), s)
        }
        S::F64(v) => {
            let (o, s) = k.run(&v[a1..b1], idx)?;
            (S::F64(o), s)
        }
        S::F16(v) => {
            let (o, s) = k.run(&v[a1..b1], idx)?;
            (S::F16(o), s)
        }
        S::BF16(v) => {
            let (o, s) = k.run(&v[a1..b1], idx)?;
            (S::BF16(o), s)
        }
        _ => return Err(dtype_error(K::WHAT, true)),
    })
}

/// `impl candle_core::CustomOp1` for a [`Host1`] kernel: `custom_op1!(Type, "name")`.
macro_rules! custom_op1 {
    ($t:ty, $name:literal) => {
        impl candle_core::CustomOp1 for $t {
            fn name(&self) -> &'static str {
                $name
            }

            fn cpu_fwd(
                &self,
                s: &candle_core::CpuStorage,
                l: &candle_core::Layout,
            ) -> candle_core::Result<(candle_core::CpuStorage, candle_core::Shape)> {
                $crate::kernels::host::host1(self, s, l)
            }
        }
    };
}

/// `impl candle_core::CustomOp2` for a [`Host2`] kernel (`host2`) or a [`HostIdx`] one
/// (`host_idx`): `custom_op2!(Type, "name", host2)`.
macro_rules! custom_op2 {
    ($t:ty, $name:literal, $run:ident) => {
        impl candle_core::CustomOp2 for $t {
            fn name(&self) -> &'static str {
                $name
            }

            fn cpu_fwd(
                &self,
                s1: &candle_core::CpuStorage,
                l1: &candle_core::Layout,
                s2: &candle_core::CpuStorage,
                l2: &candle_core::Layout,
            ) -> candle_core::Result<(candle_core::CpuStorage, candle_core::Shape)> {
                $crate::kernels::host::$run(self, s1, l1, s2, l2)
            }
        }
    };
}
