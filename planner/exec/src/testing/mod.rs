//! Test harness for kernels: runs one op through its shape rule, gradient rule and kernels,
//! and checks the backward against central finite differences in f64, on every device
//! compiled in. Used by the unit tests of each kernel family.
//!
//! What a case checks:
//! 1. the forward's outputs have the shapes and dtypes the shape rule infers;
//! 2. the extra values have exactly the bytes the gradient rule declares (the solver's
//!    memory model counts them);
//! 3. the forward given its extras equals the forward computing them itself;
//! 4. the backward, seeing only what the gradient rule saves (and parameters), matches
//!    finite differences of `sum_k <outputs_k, seed_k>` for every input that needs a
//!    gradient (relative error ≤ `tol`).

use super::kernel::{to_candle, BwdArgs, Extras, KResult, Kernel, KernelCtx, KernelError, Rng};
use super::kernels::registry;
use candle_core::{Device, Tensor};
use onnx_protobuf::attribute_proto::AttributeType;
use onnx_protobuf::AttributeProto;
use remat_planner::onnx::Attrs;
use remat_planner::ops::{registry as op_registry, Ctx, Saved};
use remat_planner::tensor::{DType, Data, Fact, Tensor as PTensor};

/// One input of a test case.
#[derive(Clone, Debug)]
pub enum In {
    /// A random float activation (uniform in [-1, 1], or [lo, hi]) that gets a gradient when
    /// the op's input slot is differentiable.
    Rand(Vec<usize>),
    RandIn(Vec<usize>, f64, f64),
    /// A random float parameter: always passed to the backward, gets a gradient.
    Param(Vec<usize>),
    /// Fixed float values (an activation).
    Floats(Vec<usize>, Vec<f64>),
    /// Fixed float values of a parameter (resident in the backward, gets a gradient).
    ParamFloats(Vec<usize>, Vec<f64>),
    /// A constant known at import (axes, shapes, scales; indices): the fact carries its value.
    Const(DType, Vec<usize>, Vec<f64>),
    /// Integer data computed at run time (token ids, indices), not a constant.
    Ints(DType, Vec<usize>, Vec<i64>),
    /// An omitted optional input.
    None,
}

/// An attribute for a test case.
pub fn int(name: &str, v: i64) -> AttributeProto {
    let mut a = AttributeProto::new();
    a.name = name.into();
    a.type_ = AttributeType::INT.into();
    a.i = v;
    a
}
pub fn ints(name: &str, v: &[i64]) -> AttributeProto {
    let mut a = AttributeProto::new();
    a.name = name.into();
    a.type_ = AttributeType::INTS.into();
    a.ints = v.to_vec();
    a
}
pub fn float(name: &str, v: f32) -> AttributeProto {
    let mut a = AttributeProto::new();
    a.name = name.into();
    a.type_ = AttributeType::FLOAT.into();
    a.f = v;
    a
}
pub fn floats(name: &str, v: &[f32]) -> AttributeProto {
    let mut a = AttributeProto::new();
    a.name = name.into();
    a.type_ = AttributeType::FLOATS.into();
    a.floats = v.to_vec();
    a
}
pub fn string(name: &str, v: &str) -> AttributeProto {
    let mut a = AttributeProto::new();
    a.name = name.into();
    a.type_ = AttributeType::STRING.into();
    a.s = v.as_bytes().to_vec();
    a
}

/// One op under test.
#[derive(Clone, Debug)]
pub struct Case {
    pub op: &'static str,
    pub opset: i64,
    pub attrs: Vec<AttributeProto>,
    pub inputs: Vec<In>,
    pub n_outputs: usize,
    /// Max relative error of the backward against finite differences.
    pub tol: f64,
    /// Elements checked per input (spread over the tensor); all when the input is smaller.
    pub samples: usize,
    pub seed: u64,
}

impl Case {
    pub fn new(op: &'static str, opset: i64, inputs: Vec<In>) -> Case {
        Case {
            op,
            opset,
            attrs: vec![],
            inputs,
            n_outputs: 1,
            tol: 1e-6,
            samples: 48,
            seed: 7,
        }
    }
    pub fn attr(mut self, a: AttributeProto) -> Case {
        self.attrs.push(a);
        self
    }
    pub fn outputs(mut self, n: usize) -> Case {
        self.n_outputs = n;
        self
    }
    pub fn tol(mut self, t: f64) -> Case {
        self.tol = t;
        self
    }
    pub fn seed(mut self, s: u64) -> Case {
        self.seed = s;
        self
    }
}

/// The devices compiled in and present: the CPU always, a CUDA GPU with the `cuda` feature.
pub fn devices() -> Vec<Device> {
    #[cfg_attr(not(feature = "cuda"), allow(unused_mut))]
    let mut v = vec![Device::Cpu];
    #[cfg(feature = "cuda")]
    if let Ok(d) = Device::new_cuda(0) {
        v.push(d);
    }
    v
}

struct Prepared {
    facts: Vec<Option<Fact>>,
    values: Vec<Option<Tensor>>,
    /// Differentiable float activations or parameters (candidates for a gradient).
    float_in: Vec<bool>,
    params: Vec<bool>,
}

fn prepare(case: &Case, dev: &Device, rng: &mut Rng) -> KResult<Prepared> {
    let mut facts = vec![];
    let mut values = vec![];
    let mut float_in = vec![];
    let mut params = vec![];
    for inp in &case.inputs {
        let u64s = |s: &[usize]| s.iter().map(|&d| d as u64).collect::<Vec<u64>>();
        match inp {
            In::Rand(s) | In::Param(s) | In::RandIn(s, _, _) => {
                let (lo, hi) = match inp {
                    In::RandIn(_, lo, hi) => (*lo, *hi),
                    _ => (-1.0, 1.0),
                };
                let n: usize = s.iter().product();
                let v: Vec<f64> = (0..n).map(|_| rng.uniform(lo, hi)).collect();
                facts.push(Some(Fact::new(DType::F64, u64s(s))));
                values.push(Some(Tensor::from_vec(v, s.clone(), dev)?));
                float_in.push(true);
                params.push(matches!(inp, In::Param(_)));
            }
            In::Floats(s, v) | In::ParamFloats(s, v) => {
                facts.push(Some(Fact::new(DType::F64, u64s(s))));
                values.push(Some(Tensor::from_vec(v.clone(), s.clone(), dev)?));
                float_in.push(true);
                params.push(matches!(inp, In::ParamFloats(..)));
            }
            In::Const(d, s, v) => {
                let d = if d.is_float() { DType::F64 } else { *d };
                let t = PTensor::new(d, u64s(s), Data::F(v.clone()));
                values.push(Some(super::value::from_planner(&t, dev)?));
                facts.push(Some(Fact::with_value(t)));
                float_in.push(false);
                params.push(false);
            }
            In::Ints(d, s, v) => {
                facts.push(Some(Fact::new(*d, u64s(s))));
                let host = Tensor::from_vec(v.clone(), s.clone(), &Device::Cpu)?;
                let t = super::value::on_device(host, to_candle(*d)?, dev)?;
                values.push(Some(t));
                float_in.push(false);
                params.push(false);
            }
            In::None => {
                facts.push(None);
                values.push(None);
                float_in.push(false);
                params.push(false);
            }
        }
    }
    Ok(Prepared {
        facts,
        values,
        float_in,
        params,
    })
}

/// One op on given input facts, run through its shape rule: what a kernel test builds a
/// kernel context from (node name `"n"`).
pub struct Harness<'a> {
    pub op: &'static str,
    pub opset: i64,
    pub attrs: Attrs<'a>,
    pub facts: &'a [Option<Fact>],
    pub n_outputs: usize,
    /// The shape rule's output facts.
    pub outs: Vec<Fact>,
    out_facts: Vec<Option<Fact>>,
}

impl<'a> Harness<'a> {
    pub fn new(
        op: &'static str,
        opset: i64,
        attrs: &'a [AttributeProto],
        facts: &'a [Option<Fact>],
        n_outputs: usize,
    ) -> KResult<Self> {
        let mut h = Harness {
            op,
            opset,
            attrs: Attrs {
                node: "n",
                op,
                list: attrs,
            },
            facts,
            n_outputs,
            outs: vec![],
            out_facts: vec![],
        };
        let spec = op_registry()
            .get(op)
            .ok_or_else(|| KernelError::new("no shape rule"))?;
        h.outs = (spec.infer)(&h.shape_cx())?;
        h.out_facts = h.outs.iter().cloned().map(Some).collect();
        Ok(h)
    }

    /// The shape rule's context (for `diff_in`, `diff_out` and `grad`).
    pub fn shape_cx(&self) -> Ctx<'_> {
        Ctx {
            node: "n",
            op: self.op,
            opset: self.opset,
            attrs: self.attrs,
            inputs: self.facts,
            n_outputs: self.n_outputs,
        }
    }

    /// The op's shape and gradient rules.
    pub fn spec(&self) -> KResult<&'static remat_planner::ops::OpSpec> {
        op_registry()
            .get(self.op)
            .ok_or_else(|| KernelError::new("no shape rule"))
    }

    /// The kernel context on `device`, with the inferred output facts.
    pub fn cx<'b>(&'b self, device: &'b Device, seed: u64) -> KernelCtx<'b> {
        KernelCtx {
            rule: Ctx {
                node: "n",
                op: self.op,
                opset: self.opset,
                attrs: self.attrs,
                inputs: self.facts,
                n_outputs: self.out_facts.len(),
            },
            outputs: &self.out_facts,
            device,
            seed,
        }
    }

    pub fn kernel(&self) -> KResult<super::kernel::Kernel> {
        registry()
            .get(self.op)
            .copied()
            .ok_or_else(|| KernelError::new("no kernel"))
    }
}

/// Runs a case on every device; panics with a readable message on a failure (tests only).
pub fn check(case: &Case) {
    for dev in devices() {
        if let Err(e) = check_on(case, &dev) {
            panic!("{} (opset {}) on {:?}: {e}", case.op, case.opset, dev);
        }
    }
}

fn flat(t: &Tensor) -> KResult<Vec<f64>> {
    super::validate::flat(t).map_err(|e| KernelError::new(e.to_string()))
}

/// Runs a case on one device.
pub fn check_on(case: &Case, dev: &Device) -> KResult<()> {
    let mut rng = Rng::new(case.seed);
    let p = prepare(case, dev, &mut rng)?;
    let h = Harness::new(case.op, case.opset, &case.attrs, &p.facts, case.n_outputs)?;
    let (spec, kernel) = (h.spec()?, h.kernel()?);
    let scx = h.shape_cx();
    let outs = &h.outs;
    let needs: Vec<bool> = (0..p.facts.len())
        .map(|i| p.float_in[i] && (spec.diff_in)(&scx, i))
        .collect();
    let rule = (spec.grad)(&scx, outs, &needs);
    let cx = h.cx(dev, case.seed);

    let extras = extras_of(&cx, &kernel, &rule.saved, &p.values)?;
    let y = kernel.run_forward(&cx, &p.values, &extras)?;
    if y.len() != outs.len() {
        return Err(KernelError::new(format!(
            "forward returned {} outputs, the shape rule {}",
            y.len(),
            outs.len()
        )));
    }
    for (k, (t, f)) in y.iter().zip(outs).enumerate() {
        let t = t
            .as_ref()
            .ok_or_else(|| KernelError::new(format!("output {k} missing")))?;
        let want: Vec<usize> = f.shape.iter().map(|&d| d as usize).collect();
        if t.dims() != want.as_slice() {
            return Err(KernelError::new(format!(
                "output {k} has shape {:?}, the shape rule says {want:?}",
                t.dims()
            )));
        }
        let dt = if f.dtype.is_float() {
            candle_core::DType::F64
        } else {
            to_candle(f.dtype)?
        };
        if t.dtype() != dt {
            return Err(KernelError::new(format!(
                "output {k} has dtype {:?}, expected {dt:?}",
                t.dtype()
            )));
        }
    }
    if !extras.is_empty()
        && rule
            .saved
            .iter()
            .all(|s| !matches!(s, Saved::Extra { tag: "mask", .. }))
    {
        let y2 = kernel.run_forward(&cx, &p.values, &Extras::new())?;
        for (k, (a, b)) in y.iter().zip(&y2).enumerate() {
            if let (Some(a), Some(b)) = (a, b) {
                if a.dtype().is_float() {
                    let (a, b) = (flat(a)?, flat(b)?);
                    let d = a
                        .iter()
                        .zip(&b)
                        .map(|(x, y)| (x - y).abs())
                        .fold(0.0, f64::max);
                    if d > 1e-9 {
                        return Err(KernelError::new(format!(
                            "output {k} differs by {d} with and without extras"
                        )));
                    }
                }
            }
        }
    }
    if !needs.iter().any(|&b| b) {
        return Ok(());
    }
    kernel
        .backward
        .ok_or_else(|| KernelError::new("the op is differentiable but has no backward kernel"))?;

    // Seeds for the float outputs that carry a gradient.
    let mut seeds: Vec<Option<Tensor>> = vec![];
    for (k, f) in outs.iter().enumerate() {
        if f.dtype.is_float() && (spec.diff_out)(&scx, k) {
            let n = f.numel() as usize;
            let v: Vec<f64> = (0..n).map(|_| rng.uniform(-1.0, 1.0)).collect();
            let shape: Vec<usize> = f.shape.iter().map(|&d| d as usize).collect();
            seeds.push(Some(Tensor::from_vec(v, shape, dev)?));
        } else {
            seeds.push(None);
        }
    }
    let objective = |values: &[Option<Tensor>]| -> KResult<f64> {
        let y = kernel.run_forward(&cx, values, &extras_of(&cx, &kernel, &rule.saved, values)?)?;
        let mut s = 0.0;
        for (t, g) in y.iter().zip(&seeds) {
            if let (Some(t), Some(g)) = (t, g) {
                s += flat(t)?
                    .iter()
                    .zip(flat(g)?)
                    .map(|(a, b)| a * b)
                    .sum::<f64>();
            }
        }
        Ok(s)
    };

    // What the backward sees: saved values and parameters only.
    let mut bin: Vec<Option<Tensor>> = vec![None; p.values.len()];
    let mut bout: Vec<Option<Tensor>> = vec![None; y.len()];
    for (i, v) in p.values.iter().enumerate() {
        if p.params[i] || matches!(case.inputs[i], In::Const(..)) {
            bin[i] = v.clone();
        }
    }
    for s in &rule.saved {
        match s {
            Saved::Input(i) => {
                if let Some(v) = p.values.get(*i) {
                    bin[*i] = v.clone();
                }
            }
            Saved::Output(k) => {
                if let Some(v) = y.get(*k) {
                    bout[*k] = v.clone();
                }
            }
            Saved::Extra { .. } => {}
        }
    }
    let grads = kernel.run_backward(
        &cx,
        &BwdArgs {
            inputs: &bin,
            outputs: &bout,
            extras: &extras,
            grads: &seeds,
            needs: &needs,
        },
    )?;
    if grads.len() != p.values.len() {
        return Err(KernelError::new(format!(
            "backward returned {} gradients for {} inputs",
            grads.len(),
            p.values.len()
        )));
    }
    let eps = 1e-6;
    for (i, need) in needs.iter().enumerate() {
        let g = &grads[i];
        if !need {
            if g.is_some() {
                return Err(KernelError::new(format!(
                    "backward returned a gradient for input {i}, which needs none"
                )));
            }
            continue;
        }
        let g = g
            .as_ref()
            .ok_or_else(|| KernelError::new(format!("no gradient for input {i}")))?;
        let x = p.values[i].as_ref().expect("float input present");
        if g.dims() != x.dims() {
            return Err(KernelError::new(format!(
                "gradient of input {i} has shape {:?}, the input {:?}",
                g.dims(),
                x.dims()
            )));
        }
        let gv = flat(g)?;
        let xv = flat(x)?;
        let n = xv.len();
        let step = (n / case.samples.max(1)).max(1);
        let mut worst: f64 = 0.0;
        let scale = gv.iter().map(|v| v.abs()).fold(1e-3, f64::max);
        for j in (0..n).step_by(step) {
            let mut num = [0.0; 2];
            for (s, sign) in [1.0, -1.0].iter().enumerate() {
                let mut xv2 = xv.clone();
                xv2[j] += sign * eps;
                let mut vals = p.values.clone();
                vals[i] = Some(Tensor::from_vec(xv2, x.dims(), dev)?);
                num[s] = objective(&vals)?;
            }
            let fd = (num[0] - num[1]) / (2.0 * eps);
            let err = (fd - gv[j]).abs() / scale;
            worst = worst.max(err);
            if err > case.tol {
                return Err(KernelError::new(format!(
                    "d/d input {i}[{j}]: backward {} vs finite difference {fd} (relative error {err:.2e} > {:.0e})",
                    gv[j], case.tol
                )));
            }
        }
    }
    Ok(())
}

/// The extra values `saved` declares, computed by the op's extra kernel (a `mask` from the seed
/// alone) and checked against their declared bytes (the solver counts them).
fn extras_of(
    cx: &KernelCtx,
    kernel: &Kernel,
    saved: &[Saved],
    values: &[Option<Tensor>],
) -> KResult<Extras> {
    let mut e = Extras::new();
    for s in saved {
        if let Saved::Extra { tag, bytes, .. } = s {
            kernel.extra.ok_or_else(|| {
                KernelError::new(format!(
                    "the rule saves {tag:?} but the kernel has no extra function"
                ))
            })?;
            let inputs: Vec<Option<Tensor>> = if *tag == "mask" {
                vec![None; values.len()]
            } else {
                values.to_vec()
            };
            let v = kernel.run_extra(cx, tag, &inputs)?;
            let got: u64 = v
                .iter()
                .map(|t| (t.elem_count() * t.dtype().size_in_bytes()) as u64)
                .sum();
            if got != *bytes {
                return Err(KernelError::new(format!(
                    "extra {tag:?} holds {got} bytes but the gradient rule declares {bytes}"
                )));
            }
            e.insert(tag.to_string(), v);
        }
    }
    Ok(e)
}

// ---------------------------------------------------------------------------------------------
// Value runs: an op's forward (and backward) on given inputs, results in f64. One runner; the
// submodules are the input conventions the families' tests are written in.

pub mod fixed;
pub mod tensors;
pub mod typed;

/// One input of a value run, as the kernel sees it: the fact its shape rule sees, the tensor,
/// and whether it takes a gradient (where its slot is differentiable).
pub struct Arg {
    pub fact: Option<Fact>,
    pub value: Option<Tensor>,
    pub grad: bool,
}

impl Arg {
    /// An omitted optional input.
    pub fn none() -> Arg {
        Arg {
            fact: None,
            value: None,
            grad: false,
        }
    }

    /// A tensor computed at run time: float ones take a gradient.
    pub fn runtime(t: Tensor) -> KResult<Arg> {
        let shape = t.dims().iter().map(|&d| d as u64).collect();
        Ok(Arg {
            fact: Some(Fact::new(planner_dtype(t.dtype())?, shape)),
            grad: t.dtype().is_float(),
            value: Some(t),
        })
    }

    /// A constant known at import: the fact carries its value.
    pub fn constant(t: Tensor) -> KResult<Arg> {
        let d = planner_dtype(t.dtype())?;
        let shape = t.dims().iter().map(|&d| d as u64).collect();
        let flat = t.flatten_all()?;
        let data = if d.is_float() {
            Data::F(flat.to_dtype(candle_core::DType::F64)?.to_vec1::<f64>()?)
        } else {
            Data::I(flat.to_dtype(candle_core::DType::I64)?.to_vec1::<i64>()?)
        };
        Ok(Arg {
            fact: Some(Fact::with_value(PTensor::new(d, shape, data))),
            value: Some(t),
            grad: false,
        })
    }
}

/// The ONNX type a candle tensor of `d` stands for in a test.
fn planner_dtype(d: candle_core::DType) -> KResult<DType> {
    use candle_core::DType as C;
    Ok(match d {
        C::F64 => DType::F64,
        C::F32 => DType::F32,
        C::F16 => DType::F16,
        C::BF16 => DType::Bf16,
        C::I64 => DType::I64,
        C::I32 => DType::I32,
        C::I16 => DType::I16,
        C::U32 => DType::U32,
        C::U8 => DType::U8,
        other => return Err(KernelError::new(format!("no ONNX type for {other:?}"))),
    })
}

/// The inputs of a value run from [`In`]s: float activations and parameters in `ft` (random
/// ones drawn in f64 from `Rng::new(seed)`, so that every float type sees the same draws),
/// float constants in `ft` too, integers as declared.
pub fn args_in(inputs: Vec<In>, ft: DType, seed: u64) -> KResult<Vec<Arg>> {
    let dev = Device::Cpu;
    let cft = to_candle(ft)?;
    let mut rng = Rng::new(seed);
    let mut out = vec![];
    for i in inputs {
        out.push(match i {
            In::Rand(s) | In::Param(s) => {
                let n: usize = s.iter().product();
                let v: Vec<f64> = (0..n).map(|_| rng.uniform(-1.0, 1.0)).collect();
                Arg::runtime(Tensor::from_vec(v, s, &dev)?.to_dtype(cft)?)?
            }
            In::RandIn(s, lo, hi) => {
                let n: usize = s.iter().product();
                let v: Vec<f64> = (0..n).map(|_| rng.uniform(lo, hi)).collect();
                Arg::runtime(Tensor::from_vec(v, s, &dev)?.to_dtype(cft)?)?
            }
            In::Floats(s, v) | In::ParamFloats(s, v) => {
                Arg::runtime(Tensor::from_vec(v, s, &dev)?.to_dtype(cft)?)?
            }
            In::Const(d, s, v) => {
                let d = if d.is_float() { ft } else { d };
                let t = PTensor::new(d, s.iter().map(|&x| x as u64).collect(), Data::F(v));
                Arg {
                    value: Some(super::value::from_planner(&t, &dev)?),
                    fact: Some(Fact::with_value(t)),
                    grad: false,
                }
            }
            In::Ints(d, s, v) => {
                let t = Tensor::from_vec(v, s.clone(), &dev)?.to_dtype(to_candle(d)?)?;
                Arg {
                    fact: Some(Fact::new(d, s.iter().map(|&x| x as u64).collect())),
                    value: Some(t),
                    grad: false,
                }
            }
            In::None => Arg::none(),
        });
    }
    Ok(out)
}

/// The output gradients a value run's backward starts from.
#[derive(Clone, Copy, Debug)]
pub enum Seeds {
    /// All ones.
    Ones,
    /// `sin(0.37 i + 0.5)` over the elements.
    Sine,
    /// `0.25 (i mod 7) - 0.6` over the elements.
    Saw,
    /// Uniform in [-1, 1), drawn from `Rng::new(seed)` (the run's seed).
    Random,
}

/// A tensor's shape and its values in f64, row-major.
pub type Flat = (Vec<usize>, Vec<f64>);

/// What a value run returns: every output, then (when it went backward) the gradient of each
/// input slot that took one.
pub struct Values {
    pub outputs: Vec<Flat>,
    pub grads: Vec<Option<Flat>>,
}

fn flat_of(t: &Tensor) -> KResult<Flat> {
    Ok((t.dims().to_vec(), flat(t)?))
}

/// Runs `op` on `dev` (the args' tensors are moved there) on `args`: its shape rule, then the
/// forward (with the extras its gradient rule declares, checked against their bytes; every output
/// in the dtype the shape rule infers), then, with `seeds`, the backward seeing every input and
/// output, for the inputs that take a gradient where their slot is differentiable. `seed` is the
/// node's seed (dropout masks, random draws) and the generator of [`Seeds::Random`].
#[allow(clippy::too_many_arguments)]
pub fn run_values(
    dev: &Device,
    op: &'static str,
    opset: i64,
    attrs: &[AttributeProto],
    args: &[Arg],
    n_outputs: usize,
    seed: u64,
    seeds: Option<Seeds>,
) -> KResult<Values> {
    let dev = dev.clone();
    let facts: Vec<Option<Fact>> = args.iter().map(|a| a.fact.clone()).collect();
    let values: Vec<Option<Tensor>> = args
        .iter()
        .map(|a| a.value.as_ref().map(|t| t.to_device(&dev)).transpose())
        .collect::<candle_core::Result<_>>()?;
    let h = Harness::new(op, opset, attrs, &facts, n_outputs)?;
    let (spec, kernel, scx) = (h.spec()?, h.kernel()?, h.shape_cx());
    let needs: Vec<bool> = (0..args.len())
        .map(|i| args[i].grad && (spec.diff_in)(&scx, i))
        .collect();
    let rule = (spec.grad)(&scx, &h.outs, &needs);
    let cx = h.cx(&dev, seed);
    let extras = extras_of(&cx, &kernel, &rule.saved, &values)?;
    let y = (kernel.forward)(&cx, &values, &extras)?;
    // In an f64 run a float output may be f64 whatever float type the rule declares
    // (statistics the rule keeps in f32 are computed in the data's precision).
    let f64_run = values
        .iter()
        .flatten()
        .any(|t| t.dtype() == candle_core::DType::F64);
    let mut outputs = vec![];
    for (k, f) in h.outs.iter().enumerate() {
        let t = y
            .get(k)
            .and_then(|t| t.as_ref())
            .ok_or_else(|| KernelError::new(format!("output {k} is missing")))?;
        let want = to_candle(f.dtype)?;
        let f64_ok = f64_run && f.dtype.is_float() && t.dtype() == candle_core::DType::F64;
        if t.dtype() != want && !f64_ok {
            return Err(KernelError::new(format!(
                "output {k} has dtype {:?}, the shape rule says {want:?}",
                t.dtype()
            )));
        }
        outputs.push(flat_of(t)?);
    }
    let Some(seeds) = seeds else {
        return Ok(Values {
            outputs,
            grads: vec![],
        });
    };
    if !needs.iter().any(|&b| b) {
        return Ok(Values {
            outputs,
            grads: vec![None; args.len()],
        });
    }
    let mut rng = Rng::new(seed);
    let grads: Vec<Option<Tensor>> = h
        .outs
        .iter()
        .enumerate()
        .map(|(k, f)| -> KResult<Option<Tensor>> {
            if !(f.dtype.is_float() && (spec.diff_out)(&scx, k)) {
                return Ok(None);
            }
            let shape: Vec<usize> = f.shape.iter().map(|&d| d as usize).collect();
            let n: usize = shape.iter().product();
            let v: Vec<f64> = match seeds {
                Seeds::Ones => vec![1.0; n],
                Seeds::Sine => (0..n).map(|i| (i as f64 * 0.37 + 0.5).sin()).collect(),
                Seeds::Saw => (0..n).map(|i| 0.25 * (i % 7) as f64 - 0.6).collect(),
                Seeds::Random => (0..n).map(|_| rng.uniform(-1.0, 1.0)).collect(),
            };
            Ok(Some(
                Tensor::from_vec(v, shape, &dev)?.to_dtype(to_candle(f.dtype)?)?,
            ))
        })
        .collect::<KResult<_>>()?;
    let backward = kernel
        .backward
        .ok_or_else(|| KernelError::new("no backward kernel"))?;
    let g = backward(
        &cx,
        &BwdArgs {
            inputs: &values,
            outputs: &y,
            extras: &extras,
            grads: &grads,
            needs: &needs,
        },
    )?;
    let mut out = vec![];
    for (i, t) in g.iter().enumerate() {
        out.push(match (t, values.get(i).and_then(|v| v.as_ref())) {
            (Some(t), Some(x)) => {
                if t.dtype() != x.dtype() || t.dims() != x.dims() {
                    return Err(KernelError::new(format!(
                        "gradient {i} is {:?} {:?}, its input {:?} {:?}",
                        t.dtype(),
                        t.dims(),
                        x.dtype(),
                        x.dims()
                    )));
                }
                Some(flat_of(t)?)
            }
            (Some(t), None) => Some(flat_of(t)?),
            (None, _) => None,
        });
    }
    Ok(Values {
        outputs,
        grads: out,
    })
}

/// Asserts `|got - want| <= atol + rtol |want|` elementwise (NaN matches NaN, an infinity
/// itself), with equal lengths.
pub fn assert_allclose(got: &[f64], want: &[f64], atol: f64, rtol: f64) {
    assert_eq!(got.len(), want.len(), "lengths differ: {got:?} vs {want:?}");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let ok = (g - w).abs() <= atol + rtol * w.abs()
            || (g.is_nan() && w.is_nan())
            || (g.is_infinite() && g == w);
        assert!(ok, "element {i}: got {g}, want {w} ({got:?} vs {want:?})");
    }
}

/// The largest elementwise difference of two tensors of one shape, in f64.
pub fn max_abs_diff(a: &Tensor, b: &Tensor) -> f64 {
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

/// A random float activation of `shape` (uniform in [-1, 1]).
pub fn r(shape: &[usize]) -> In {
    In::Rand(shape.to_vec())
}

/// A random float activation of `shape`, uniform in [lo, hi].
pub fn rin(shape: &[usize], lo: f64, hi: f64) -> In {
    In::RandIn(shape.to_vec(), lo, hi)
}

/// A random float parameter of `shape`.
pub fn p(shape: &[usize]) -> In {
    In::Param(shape.to_vec())
}

/// Forward and backward of `op` on random inputs of `shapes` (uniform in [0.1, 1], the same
/// draws in every float type `dt`) with random output gradients: every output, then every
/// input gradient, as f64.
pub fn random_in(
    op: &'static str,
    opset: i64,
    attrs: &[AttributeProto],
    shapes: &[Vec<usize>],
    n_outputs: usize,
    dt: DType,
) -> Vec<Vec<f64>> {
    let inputs = shapes
        .iter()
        .map(|s| In::RandIn(s.clone(), 0.1, 1.0))
        .collect();
    let args = args_in(inputs, dt, 5).unwrap_or_else(|e| panic!("{op}: {e}"));
    let v = run_values(
        &Device::Cpu,
        op,
        opset,
        attrs,
        &args,
        n_outputs,
        3,
        Some(Seeds::Random),
    )
    .unwrap_or_else(|e| panic!("{op} in {dt:?}: {e}"));
    v.outputs
        .into_iter()
        .map(|o| o.1)
        .chain(v.grads.into_iter().flatten().map(|g| g.1))
        .collect()
}
