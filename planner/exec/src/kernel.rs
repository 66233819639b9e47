//! The kernel interface: what one op's forward, extra-value and backward functions see and
//! return. Kernels are plain functions over `candle_core::Tensor`s, registered per op type in
//! family files under `kernels/`, the same families as the shape rules in `remat_planner::ops`.
//!
//! Contract (checked by the runner and by `exec::testing`):
//! - `forward` returns one entry per declared output slot: `Some(tensor)` when the slot is
//!   present in the graph (`cx.outputs[k].is_some()`), with the inferred shape and dtype.
//! - `extra` computes a value the op's gradient rule declares as `Saved::Extra { tag }`
//!   (batch statistics, max-pool indices, a dropout mask, an RNN workspace) from the op's
//!   inputs (a `mask` gets no inputs: it is drawn from `cx.seed`). `forward` receives the
//!   extras when the training graph has them and must then use them (so that a recomputed
//!   forward reproduces the first one), and computes what it needs itself otherwise.
//! - `backward` sees only what the op's `GradRule` saves (plus parameters and constants,
//!   which are always resident): a missing input or output is `None`. It returns one entry
//!   per input slot: `Some(gradient)` exactly where `needs[i]`, shaped like the input.

use candle_core::{Device, Tensor};
use remat_planner::ops::{Ctx, INPUT_COPY_TAGS};
use remat_planner::tensor::{DType, Fact};
use remat_planner::PlannerError;
use std::collections::HashMap;

/// What a kernel sees of its node: what its shape rule sees (name, op, opset, attributes,
/// input facts; `KernelCtx` derefs to it), the output facts, the device and the seed.
pub struct KernelCtx<'a> {
    pub rule: Ctx<'a>,
    /// Output facts, one per declared output; `None` for an omitted optional output.
    pub outputs: &'a [Option<Fact>],
    pub device: &'a Device,
    /// The node's random seed: a function of the run's seed and the node's name, so that a
    /// recomputation draws the same numbers.
    pub seed: u64,
}

impl<'a> std::ops::Deref for KernelCtx<'a> {
    type Target = Ctx<'a>;
    fn deref(&self) -> &Ctx<'a> {
        &self.rule
    }
}

impl KernelCtx<'_> {
    /// Shape of input `i` as `usize`s.
    pub fn in_shape(&self, i: usize) -> KResult<Vec<usize>> {
        Ok(self.input(i)?.shape.iter().map(|&d| d as usize).collect())
    }

    /// Shape of output `k` as `usize`s.
    pub fn out_shape(&self, k: usize) -> KResult<Vec<usize>> {
        let f = self
            .outputs
            .get(k)
            .and_then(|f| f.as_ref())
            .ok_or_else(|| KernelError::new(format!("output {k} is not in the graph")))?;
        Ok(f.shape.iter().map(|&d| d as usize).collect())
    }
}

/// Extra values computed for the backward, by tag (`stats`, `indices`, `mask`, `workspace`).
pub type Extras = HashMap<String, Vec<Tensor>>;

/// What a backward kernel receives.
pub struct BwdArgs<'a> {
    /// Input values, one per declared input: present when saved by the gradient rule, or a
    /// parameter or constant; `None` otherwise.
    pub inputs: &'a [Option<Tensor>],
    /// Output values, one per declared output: present when saved by the gradient rule.
    pub outputs: &'a [Option<Tensor>],
    /// The op's extra values (present when the rule saves them).
    pub extras: &'a Extras,
    /// d loss / d output, one per declared output; `None` when no gradient reaches it (zero).
    pub grads: &'a [Option<Tensor>],
    /// Which input slots want a gradient.
    pub needs: &'a [bool],
}

impl BwdArgs<'_> {
    /// Saved input `i`, or an error naming it.
    pub fn input(&self, i: usize) -> KResult<&Tensor> {
        self.inputs.get(i).and_then(|t| t.as_ref()).ok_or_else(|| {
            KernelError::new(format!("the backward needs input {i}, which is not saved"))
        })
    }

    /// Saved output `k`, or an error naming it.
    pub fn output(&self, k: usize) -> KResult<&Tensor> {
        self.outputs.get(k).and_then(|t| t.as_ref()).ok_or_else(|| {
            KernelError::new(format!("the backward needs output {k}, which is not saved"))
        })
    }

    /// Extra value `tag`, or an error naming it.
    pub fn extra(&self, tag: &str) -> KResult<&[Tensor]> {
        self.extras.get(tag).map(|v| v.as_slice()).ok_or_else(|| {
            KernelError::new(format!(
                "the backward needs the extra value {tag:?}, which is not resident"
            ))
        })
    }

    /// d loss / d output `k`, zeros of the output's shape when no gradient reaches it.
    pub fn grad(&self, cx: &KernelCtx, k: usize) -> KResult<Tensor> {
        match self.grads.get(k).and_then(|g| g.as_ref()) {
            Some(g) => Ok(g.clone()),
            None => {
                let f =
                    cx.outputs.get(k).and_then(|f| f.as_ref()).ok_or_else(|| {
                        KernelError::new(format!("output {k} is not in the graph"))
                    })?;
                let shape: Vec<usize> = f.shape.iter().map(|&d| d as usize).collect();
                Ok(Tensor::zeros(shape, to_candle(f.dtype)?, cx.device)?)
            }
        }
    }

    pub fn need(&self, i: usize) -> bool {
        self.needs.get(i).copied().unwrap_or(false)
    }
}

/// What a forward or backward kernel returns: one entry per output (or input) slot.
pub type Outs = KResult<Vec<Option<Tensor>>>;

/// How a kernel reads its input tensors (`&[Option<Tensor>]`, one per declared input; `None`
/// for an omitted optional input, or a value the gradient rule does not save).
pub trait Inputs {
    /// Input `i`, if the node has it.
    fn opt(&self, i: usize) -> Option<&Tensor>;
    /// Input `i`, which the op requires.
    fn req(&self, i: usize) -> KResult<&Tensor> {
        self.opt(i)
            .ok_or_else(|| KernelError::new(format!("input {i} is required but missing")))
    }
    /// Input `i`, which the op requires; `what` names it in the error (`"scale"`).
    fn named(&self, i: usize, what: &str) -> KResult<&Tensor> {
        self.opt(i)
            .ok_or_else(|| KernelError::new(format!("{what} (input {i}) is required but missing")))
    }
}

impl Inputs for [Option<Tensor>] {
    fn opt(&self, i: usize) -> Option<&Tensor> {
        self.get(i).and_then(|t| t.as_ref())
    }
}

pub type ForwardFn = fn(&KernelCtx, &[Option<Tensor>], &Extras) -> KResult<Vec<Option<Tensor>>>;
pub type ExtraFn = fn(&KernelCtx, &str, &[Option<Tensor>]) -> KResult<Vec<Tensor>>;
pub type BackwardFn = fn(&KernelCtx, &BwdArgs) -> KResult<Vec<Option<Tensor>>>;

/// One op's kernels.
#[derive(Clone, Copy)]
pub struct Kernel {
    pub forward: ForwardFn,
    /// Required for ops whose gradient rule has `Saved::Extra` values.
    pub extra: Option<ExtraFn>,
    /// Required for differentiable ops.
    pub backward: Option<BackwardFn>,
}

impl Kernel {
    /// Kernels of an op whose gradient rule saves no extra values.
    pub fn new(forward: ForwardFn, backward: Option<BackwardFn>) -> Kernel {
        Kernel {
            forward,
            extra: None,
            backward,
        }
    }

    /// Kernels of an op whose gradient rule saves extra values (`Saved::Extra`).
    pub fn with_extra(forward: ForwardFn, extra: ExtraFn, backward: Option<BackwardFn>) -> Kernel {
        Kernel {
            forward,
            extra: Some(extra),
            backward,
        }
    }
}

impl Kernel {
    /// `forward`, on the host when the device lacks one of the op's kernels (see
    /// [`missing_on_device`]).
    pub fn run_forward(
        &self,
        cx: &KernelCtx,
        ins: &[Option<Tensor>],
        extras: &Extras,
    ) -> KResult<Vec<Option<Tensor>>> {
        match (self.forward)(cx, ins, extras) {
            Err(e) if missing_on_device(cx, &e) => self.forward_on_host(cx, ins, extras),
            r => r,
        }
    }

    /// `forward` on the host: inputs and extras copied to the CPU, outputs back to `cx`'s
    /// device; the op is noted for [`take_host_ops`].
    fn forward_on_host(
        &self,
        cx: &KernelCtx,
        ins: &[Option<Tensor>],
        extras: &Extras,
    ) -> KResult<Vec<Option<Tensor>>> {
        let cpu = Device::Cpu;
        let ins = opt_to(ins, &cpu)?;
        let out = (self.forward)(&cx.on(&cpu), &ins, &extras_to(extras, &cpu)?)?;
        noted_on_host(cx.op);
        opt_to(&out, cx.device)
    }

    /// `extra` (an error when the op has none), on the host as [`Kernel::run_forward`].
    pub fn run_extra(
        &self,
        cx: &KernelCtx,
        tag: &str,
        ins: &[Option<Tensor>],
    ) -> KResult<Vec<Tensor>> {
        // A saved copy of an input (the training graph's `INPUT_COPY_TAGS`): a storage of its
        // own, whatever the kernel.
        if let Some(i) = INPUT_COPY_TAGS.iter().position(|t| *t == tag) {
            let x = ins.get(i).and_then(|x| x.as_ref()).ok_or_else(|| {
                KernelError::new(format!("the extra value {tag:?} needs input {i}"))
            })?;
            return Ok(vec![x.copy()?]);
        }
        let f = self.extra.ok_or_else(|| {
            KernelError::new(format!("no kernel computes the extra value {tag:?}"))
        })?;
        match f(cx, tag, ins) {
            Err(e) if missing_on_device(cx, &e) => {
                let cpu = Device::Cpu;
                let out = f(&cx.on(&cpu), tag, &opt_to(ins, &cpu)?)?;
                noted_on_host(cx.op);
                all_to(&out, cx.device)
            }
            r => r,
        }
    }

    /// `backward` (an error when the op has none), on the host as [`Kernel::run_forward`].
    pub fn run_backward(&self, cx: &KernelCtx, a: &BwdArgs) -> KResult<Vec<Option<Tensor>>> {
        let b = self
            .backward
            .ok_or_else(|| KernelError::new("the op has no backward kernel"))?;
        match b(cx, a) {
            Err(e) if missing_on_device(cx, &e) => {
                let cpu = Device::Cpu;
                let (inputs, outputs) = (opt_to(a.inputs, &cpu)?, opt_to(a.outputs, &cpu)?);
                let (extras, grads) = (extras_to(a.extras, &cpu)?, opt_to(a.grads, &cpu)?);
                let host = BwdArgs {
                    inputs: &inputs,
                    outputs: &outputs,
                    extras: &extras,
                    grads: &grads,
                    needs: a.needs,
                };
                let out = b(&cx.on(&cpu), &host)?;
                noted_on_host(cx.op);
                opt_to(&out, cx.device)
            }
            r => r,
        }
    }
}

impl<'a> KernelCtx<'a> {
    /// The same node on another device.
    fn on<'b>(&'b self, device: &'b Device) -> KernelCtx<'b>
    where
        'a: 'b,
    {
        KernelCtx {
            rule: self.rule,
            outputs: self.outputs,
            device,
            seed: self.seed,
        }
    }
}

/// Whether `e`, from a kernel on a GPU, says that the device's kernel library has no kernel for
/// what was asked: candle's CUDA kernels cover fewer dtype pairs than its CPU ones (casts from
/// and to 32-bit integers, some integer gathers and elementwise ops), and cudarc answers
/// `CUDA_ERROR_NOT_FOUND` for the missing symbol. Such an op runs on the host instead (its
/// inputs copied to the CPU, its outputs back), and the run reports it
/// ([`take_host_ops`]).
fn missing_on_device(cx: &KernelCtx, e: &KernelError) -> bool {
    !cx.device.is_cpu() && names_missing_kernel(e)
}

/// Whether an error is cudarc's for a kernel the loaded module does not have (as seen on an
/// H200: `DriverError(CUDA_ERROR_NOT_FOUND, "named symbol not found")`).
fn names_missing_kernel(e: &KernelError) -> bool {
    e.0.contains("CUDA_ERROR_NOT_FOUND") || e.0.contains("named symbol not found")
}

thread_local! {
    static HOST_OPS: std::cell::RefCell<std::collections::BTreeSet<String>> =
        const { std::cell::RefCell::new(std::collections::BTreeSet::new()) };
}

fn noted_on_host(op: &str) {
    HOST_OPS.with(|h| {
        h.borrow_mut().insert(op.to_string());
    });
}

/// The op types this thread ran on the host for want of a device kernel since the last call
/// (sorted).
pub fn take_host_ops() -> Vec<String> {
    HOST_OPS.with(|h| std::mem::take(&mut *h.borrow_mut()).into_iter().collect())
}

/// The op types of several host-op lists, once each (sorted).
pub fn host_ops_union<'a>(lists: impl IntoIterator<Item = &'a [String]>) -> Vec<String> {
    let all: std::collections::BTreeSet<&String> = lists.into_iter().flatten().collect();
    all.into_iter().cloned().collect()
}

fn opt_to(v: &[Option<Tensor>], d: &Device) -> KResult<Vec<Option<Tensor>>> {
    v.iter()
        .map(|t| t.as_ref().map(|t| t.to_device(d)).transpose())
        .collect::<candle_core::Result<_>>()
        .map_err(Into::into)
}

fn all_to(v: &[Tensor], d: &Device) -> KResult<Vec<Tensor>> {
    v.iter()
        .map(|t| t.to_device(d))
        .collect::<candle_core::Result<_>>()
        .map_err(Into::into)
}

fn extras_to(e: &Extras, d: &Device) -> KResult<Extras> {
    e.iter()
        .map(|(k, v)| Ok((k.clone(), all_to(v, d)?)))
        .collect()
}

pub type KernelRegistry = HashMap<&'static str, Kernel>;

/// A kernel's error; the runner adds the node and the op.
#[derive(Debug, Clone, PartialEq)]
pub struct KernelError(pub String);

impl KernelError {
    pub fn new(message: impl Into<String>) -> KernelError {
        KernelError(message.into())
    }
}

impl std::fmt::Display for KernelError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<candle_core::Error> for KernelError {
    fn from(e: candle_core::Error) -> Self {
        KernelError(candle_message(e))
    }
}

/// A candle error's message without the backtrace candle attaches when `RUST_BACKTRACE` is
/// set (fifteen frames of candle and rayon in a user's error, or in a plan's stored
/// validation).
pub fn candle_message(e: candle_core::Error) -> String {
    fn strip(e: candle_core::Error) -> candle_core::Error {
        match e {
            candle_core::Error::WithBacktrace { inner, .. } => strip(*inner),
            candle_core::Error::Context { inner, context } => candle_core::Error::Context {
                inner: Box::new(strip(*inner)),
                context,
            },
            candle_core::Error::WithPath { inner, path } => candle_core::Error::WithPath {
                inner: Box::new(strip(*inner)),
                path,
            },
            other => other,
        }
    }
    strip(e).to_string()
}

/// A shape-rule or attribute error seen by a kernel. The runner names the node and the op, so
/// the message keeps only what the planner says of them.
impl From<PlannerError> for KernelError {
    fn from(e: PlannerError) -> Self {
        KernelError(match e {
            PlannerError::Shape { message, .. } => message,
            PlannerError::Attribute {
                attribute, message, ..
            } => format!("attribute {attribute:?}: {message}"),
            PlannerError::DataDependent { detail, .. } => {
                format!("a value must be known at import time ({detail})")
            }
            other => other.to_string(),
        })
    }
}

pub type KResult<T> = std::result::Result<T, KernelError>;

/// Early return with a [`KernelError`].
macro_rules! kbail {
    ($($arg:tt)*) => {
        return Err($crate::kernel::KernelError::new(format!($($arg)*)))
    };
}
pub(crate) use kbail;

/// The candle element type that holds an ONNX type (booleans and 8-bit integers as `u8`,
/// unsigned 16/32-bit as `u32`, 64-bit unsigned as `i64`).
pub fn to_candle(d: DType) -> KResult<candle_core::DType> {
    use candle_core::DType as C;
    Ok(match d {
        DType::F32 => C::F32,
        DType::F64 => C::F64,
        DType::F16 => C::F16,
        DType::Bf16 => C::BF16,
        DType::Bool | DType::U8 | DType::I8 => C::U8,
        DType::I16 => C::I16,
        DType::I32 => C::I32,
        DType::U16 | DType::U32 => C::U32,
        DType::I64 | DType::U64 => C::I64,
        other => {
            return Err(KernelError::new(format!(
                "element type {other:?} is not supported by the executor"
            )))
        }
    })
}

/// A small deterministic generator (splitmix64) for seeded draws (dropout masks, initial weights, test data).
pub struct Rng(u64);
impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed ^ 0x9E37_79B9_7F4A_7C15)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in [lo, hi).
    pub fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * ((self.next_u64() >> 11) as f64 / (1u64 << 53) as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::registry;

    /// Whatever RUST_BACKTRACE says, a kernel error carries candle's message, not its frames.
    #[test]
    fn a_candle_error_loses_its_backtrace() {
        let e = candle_core::Error::WithBacktrace {
            inner: Box::new(candle_core::Error::Msg(
                "shape mismatch in broadcast_add".into(),
            )),
            backtrace: Box::new(std::backtrace::Backtrace::force_capture()),
        }
        .context("node ln");
        let seen = KernelError::from(e);
        assert_eq!(seen.0, "node ln\nshape mismatch in broadcast_add");
    }

    #[test]
    fn a_missing_device_kernel_is_recognised_by_cudarcs_error() {
        let seen = KernelError::from(candle_core::Error::Msg(
            "DriverError(CUDA_ERROR_NOT_FOUND, \"named symbol not found\")".into(),
        ));
        assert!(names_missing_kernel(&seen));
        assert!(!names_missing_kernel(&KernelError::new(
            "DriverError(CUDA_ERROR_OUT_OF_MEMORY, \"out of memory\")"
        )));
        assert!(!names_missing_kernel(&KernelError::new("shape mismatch")));
    }

    /// The host path copies the inputs over, runs the same kernel and notes the op; on the CPU
    /// (no GPU here) it must give exactly the device path's answer.
    #[test]
    fn the_host_path_gives_the_kernels_answer_and_is_reported() {
        let k = registry()["Relu"];
        let facts = [Some(Fact::new(DType::F32, vec![2, 3]))];
        let cx = KernelCtx {
            rule: Ctx {
                node: "r",
                op: "Relu",
                opset: 14,
                attrs: remat_planner::onnx::Attrs {
                    node: "r",
                    op: "Relu",
                    list: &[],
                },
                inputs: &facts,
                n_outputs: 1,
            },
            outputs: &facts,
            device: &Device::Cpu,
            seed: 0,
        };
        let x = Tensor::new(&[[-1f32, 2.0, -3.0], [4.0, -5.0, 6.0]], &Device::Cpu).unwrap();
        let ins = [Some(x)];
        take_host_ops();
        let direct = k.run_forward(&cx, &ins, &Extras::new()).unwrap();
        assert!(take_host_ops().is_empty(), "the CPU never falls back");
        let host = k.forward_on_host(&cx, &ins, &Extras::new()).unwrap();
        assert_eq!(take_host_ops(), vec!["Relu".to_string()]);
        let v = |t: &[Option<Tensor>]| t[0].as_ref().unwrap().to_vec2::<f32>().unwrap();
        assert_eq!(v(&direct), v(&host));
        assert_eq!(v(&host), vec![vec![0.0, 2.0, 0.0], vec![4.0, 0.0, 6.0]]);
    }

    /// A run reports the setup's host ops with its own, each op once, sorted.
    #[test]
    fn host_op_lists_merge_once_each_in_order() {
        let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        let (run, setup) = (s(&["Gather", "Cast"]), s(&["Cast", "CastLike"]));
        assert_eq!(
            host_ops_union([&run[..], &setup[..]]),
            s(&["Cast", "CastLike", "Gather"])
        );
        assert!(host_ops_union([&[][..]]).is_empty());
    }
}
