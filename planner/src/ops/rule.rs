//! What every op rule is written against: the node as a rule sees it (`Ctx`), the saved
//! values and gradient rule (`Saved`, `GradRule`), the op's spec (`OpSpec`) and its common
//! field values, and the window of convolutions and pooling (`Window`).

use crate::error::{PlannerError, Result};
use crate::onnx::Attrs;
use crate::tensor::{broadcast, numel, DType, Fact, Tensor};
use std::collections::HashMap;

/// What an op rule sees of one node: its identity, attributes and input facts.
#[derive(Clone, Copy)]
pub struct Ctx<'a> {
    pub node: &'a str,
    pub op: &'a str,
    pub opset: i64,
    pub attrs: Attrs<'a>,
    /// One entry per declared input; `None` for an omitted optional input (`""`).
    pub inputs: &'a [Option<Fact>],
    pub n_outputs: usize,
}

impl<'a> Ctx<'a> {
    /// A shape error naming this node.
    pub fn err(&self, message: impl Into<String>) -> PlannerError {
        PlannerError::Shape {
            node: self.node.to_string(),
            op_type: self.op.to_string(),
            message: message.into(),
        }
    }

    pub fn data_dependent(&self, detail: impl Into<String>) -> PlannerError {
        PlannerError::DataDependent {
            node: self.node.to_string(),
            op_type: self.op.to_string(),
            detail: detail.into(),
        }
    }

    /// A required input.
    pub fn input(&self, i: usize) -> Result<&'a Fact> {
        self.inputs
            .get(i)
            .and_then(|f| f.as_ref())
            .ok_or_else(|| self.err(format!("input {i} is required but missing")))
    }

    /// An optional input.
    pub fn opt(&self, i: usize) -> Option<&'a Fact> {
        self.inputs.get(i).and_then(|f| f.as_ref())
    }

    /// The value of a constant input, or `None` when the input is omitted. A present input
    /// whose value is not known at import time is a data-dependent shape.
    pub fn const_input(&self, i: usize) -> Result<Option<&'a Tensor>> {
        match self.opt(i) {
            None => Ok(None),
            Some(f) => match &f.value {
                Some(v) => Ok(Some(v)),
                None => Err(self.data_dependent(format!(
                    "input {i} is computed from data, not from constants"
                ))),
            },
        }
    }

    /// Checks that input `i`, when present, has shape `want`; `because` says why, as in "X
    /// [2, 3, 8, 8] has 3 channels" (a bias, a per-channel scale, a recurrent weight).
    pub fn expect_shape(&self, i: usize, name: &str, want: &[u64], because: &str) -> Result<()> {
        match self.opt(i) {
            Some(f) if f.shape != want => Err(self.err(format!(
                "input {name} has shape {:?}; {because}, so it must be {want:?}",
                f.shape
            ))),
            _ => Ok(()),
        }
    }

    /// Checks that input `i`, when present, broadcasts to `target` (`what`, as in "the
    /// normalized dims") without growing it.
    pub fn expect_broadcast_to(
        &self,
        i: usize,
        name: &str,
        target: &[u64],
        what: &str,
    ) -> Result<()> {
        match self.opt(i) {
            Some(f) if broadcast(target, &f.shape).as_deref() != Some(target) => {
                Err(self.err(format!(
                    "input {name} of shape {:?} does not broadcast to {what} {target:?}",
                    f.shape
                )))
            }
            _ => Ok(()),
        }
    }

    pub fn const_ints(&self, i: usize) -> Result<Option<Vec<i64>>> {
        Ok(self.const_input(i)?.map(|t| t.as_i64()))
    }

    pub fn const_floats(&self, i: usize) -> Result<Option<Vec<f64>>> {
        Ok(self.const_input(i)?.map(|t| t.as_f64()))
    }

    /// A possibly negative axis normalized against `rank`.
    pub fn axis(&self, axis: i64, rank: usize) -> Result<usize> {
        let r = rank as i64;
        let a = if axis < 0 { axis + r } else { axis };
        if a < 0 || a >= r {
            return Err(self.err(format!("axis {axis} is out of range for rank {rank}")));
        }
        Ok(a as usize)
    }

    /// Axes normalized, checked and deduplicated.
    pub fn axes(&self, axes: &[i64], rank: usize) -> Result<Vec<usize>> {
        let mut out = Vec::with_capacity(axes.len());
        for &a in axes {
            let a = self.axis(a, rank)?;
            if out.contains(&a) {
                return Err(self.err(format!("axis {a} appears twice")));
            }
            out.push(a);
        }
        Ok(out)
    }

    /// A fact with a checked shape (no overflow in its element count).
    pub fn fact(&self, dtype: DType, shape: Vec<u64>) -> Result<Fact> {
        if numel(&shape).is_none() {
            return Err(self.err(format!("output shape {shape:?} has too many elements")));
        }
        Ok(Fact::new(dtype, shape))
    }

    /// A fact carrying a folded value when it is small enough to keep.
    pub fn folded(&self, t: Tensor) -> Fact {
        Fact::with_value(t)
    }

    pub fn broadcast_all(&self) -> Result<Vec<u64>> {
        let mut shape: Vec<u64> = Vec::new();
        for (i, f) in self.inputs.iter().enumerate() {
            if let Some(f) = f {
                shape = broadcast(&shape, &f.shape).ok_or_else(|| {
                    self.err(format!(
                        "input {i} of shape {:?} does not broadcast with {:?}",
                        f.shape, shape
                    ))
                })?;
            }
        }
        Ok(shape)
    }

    pub fn in_numel(&self, i: usize) -> f64 {
        self.opt(i).map(|f| f.numel() as f64).unwrap_or(0.0)
    }
}

/// A forward value the backward of an op keeps.
#[derive(Debug, Clone, PartialEq)]
pub enum Saved {
    Input(usize),
    Output(usize),
    /// A value the op computes besides its outputs and its backward keeps (batch statistics,
    /// max-pool indices, a dropout mask). `cost` is the FLOPs to compute it.
    Extra {
        tag: &'static str,
        bytes: u64,
        cost: f64,
    },
}

/// The tags of [`Saved::Extra`] values that are copies of input 0 / 1 (the training graph
/// puts them in place of `Saved::Input` where PyTorch saves a copy: a batched MatMul's strided
/// operand, see `layout`); an executor computes them as a copy of that input and hands the
/// backward the copy as the input.
pub const INPUT_COPY_TAGS: [&str; 2] = ["input0_copy", "input1_copy"];

/// How an op's backward behaves, given which of its inputs need a gradient.
#[derive(Debug, Clone, PartialEq)]
pub struct GradRule {
    pub saved: Vec<Saved>,
    /// Backward FLOPs as a multiple of the forward FLOPs.
    pub bwd_factor: f64,
    /// The op draws random numbers: a recomputation must replay its random state.
    pub replay_rng: bool,
}

impl GradRule {
    pub fn saves(saved: Vec<Saved>, bwd_factor: f64) -> GradRule {
        GradRule {
            saved,
            bwd_factor,
            replay_rng: false,
        }
    }
}

/// One op: shape rule, cost and gradient rule.
#[derive(Clone, Copy)]
pub struct OpSpec {
    /// Output facts (with folded values where the inputs are small constants).
    pub infer: fn(&Ctx) -> Result<Vec<Fact>>,
    /// Forward FLOPs given the output facts.
    pub flops: fn(&Ctx, &[Fact]) -> f64,
    /// Whether input slot `i` is differentiable (gets a gradient when it requires one).
    pub diff_in: fn(&Ctx, usize) -> bool,
    /// Whether output slot `i` carries a gradient.
    pub diff_out: fn(&Ctx, usize) -> bool,
    /// What the backward saves, given which inputs need a gradient.
    pub grad: fn(&Ctx, &[Fact], &[bool]) -> GradRule,
    /// `Some(i)` when the outputs are views sharing input `i`'s storage.
    pub view: fn(&Ctx) -> Option<usize>,
    /// The op draws random numbers: never folded, and a recomputation replays its state.
    pub random: bool,
}

pub fn all(_: &Ctx, _: usize) -> bool {
    true
}
pub fn none(_: &Ctx, _: usize) -> bool {
    false
}
pub fn first(_: &Ctx, i: usize) -> bool {
    i == 0
}
pub fn no_view(_: &Ctx) -> Option<usize> {
    None
}
pub fn view0(_: &Ctx) -> Option<usize> {
    Some(0)
}
pub fn zero_flops(_: &Ctx, _: &[Fact]) -> f64 {
    0.0
}
/// One FLOP per output element.
pub fn out_elems(_: &Ctx, out: &[Fact]) -> f64 {
    out.iter().map(|f| f.numel() as f64).sum()
}
pub fn nothing_saved(_: &Ctx, _: &[Fact], _: &[bool]) -> GradRule {
    GradRule::saves(vec![], 1.0)
}
pub fn save_x(_: &Ctx, _: &[Fact], _: &[bool]) -> GradRule {
    GradRule::saves(vec![Saved::Input(0)], 1.0)
}
pub fn save_y(_: &Ctx, _: &[Fact], _: &[bool]) -> GradRule {
    GradRule::saves(vec![Saved::Output(0)], 1.0)
}
fn not_implemented(cx: &Ctx) -> Result<Vec<Fact>> {
    Err(cx.err("op has no shape rule"))
}

impl OpSpec {
    /// Defaults: every input and output differentiable, nothing saved, no view, one FLOP per
    /// output element.
    pub const DEFAULT: OpSpec = OpSpec {
        infer: not_implemented,
        flops: out_elems,
        diff_in: all,
        diff_out: all,
        grad: nothing_saved,
        view: no_view,
        random: false,
    };
}

pub type Registry = HashMap<&'static str, OpSpec>;

/// Output spatial size of a sliding window (pooling, convolution).
#[allow(clippy::too_many_arguments)]
pub fn window_out(
    cx: &Ctx,
    input: u64,
    kernel: u64,
    stride: u64,
    dilation: u64,
    pad_begin: u64,
    pad_end: u64,
    ceil_mode: bool,
    auto_pad: &str,
) -> Result<u64> {
    if stride == 0 || kernel == 0 || dilation == 0 {
        return Err(cx.err("kernel, stride and dilation must be positive"));
    }
    let eff = (kernel - 1).saturating_mul(dilation) + 1;
    match auto_pad {
        "SAME_UPPER" | "SAME_LOWER" => Ok(input.div_ceil(stride)),
        "VALID" => {
            if input < eff {
                return Err(cx.err(format!("window {eff} larger than input {input}")));
            }
            Ok((input - eff) / stride + 1)
        }
        _ => {
            let padded = input.saturating_add(pad_begin).saturating_add(pad_end);
            if padded < eff {
                return Err(cx.err(format!("window {eff} larger than padded input {padded}")));
            }
            let span = padded - eff;
            let mut out = if ceil_mode {
                span.div_ceil(stride) + 1
            } else {
                span / stride + 1
            };
            // With ceil_mode the last window must start inside the input or left padding.
            if ceil_mode && (out - 1).saturating_mul(stride) >= input.saturating_add(pad_begin) {
                out -= 1;
            }
            Ok(out)
        }
    }
}

/// Kernel, strides, dilations, pads and `auto_pad` of a windowed op (convolutions, pooling,
/// Col2Im), with the ONNX defaults: what the shape rules and the kernels both read.
pub struct Window {
    pub kernel: Vec<u64>,
    pub strides: Vec<u64>,
    pub dilations: Vec<u64>,
    pub pads: Vec<u64>,
    pub auto_pad: String,
    pub ceil_mode: bool,
}

pub fn nonneg(cx: &Ctx, attribute: &str, v: &[i64]) -> Result<Vec<u64>> {
    v.iter()
        .map(|&x| {
            u64::try_from(x).map_err(|_| {
                cx.attrs
                    .err(attribute, format!("value {x} must be non-negative"))
            })
        })
        .collect()
}

impl Window {
    pub fn read(cx: &Ctx, kernel: Vec<u64>) -> Result<Window> {
        let n = kernel.len();
        let strides = match cx.attrs.ints("strides")? {
            Some(s) => nonneg(cx, "strides", s)?,
            None => vec![1; n],
        };
        let dilations = match cx.attrs.ints("dilations")? {
            Some(s) => nonneg(cx, "dilations", s)?,
            None => vec![1; n],
        };
        let pads = match cx.attrs.ints("pads")? {
            Some(s) => nonneg(cx, "pads", s)?,
            None => vec![0; 2 * n],
        };
        if strides.len() != n || dilations.len() != n || pads.len() != 2 * n {
            return Err(cx.err(format!(
                "strides/dilations/pads lengths ({}, {}, {}) do not match {n} spatial dims",
                strides.len(),
                dilations.len(),
                pads.len()
            )));
        }
        for (name, values) in [("strides", &strides), ("dilations", &dilations)] {
            if let Some(v) = values.iter().find(|&&v| v == 0) {
                return Err(cx
                    .attrs
                    .err(name, format!("must be positive, got {v} in {values:?}")));
            }
        }
        let auto_pad = cx.attrs.string("auto_pad")?.unwrap_or_default();
        if !matches!(
            auto_pad.as_str(),
            "" | "NOTSET" | "VALID" | "SAME_UPPER" | "SAME_LOWER"
        ) {
            return Err(cx.attrs.err(
                "auto_pad",
                format!("{auto_pad:?} is not one of NOTSET, VALID, SAME_UPPER, SAME_LOWER"),
            ));
        }
        let ceil_mode = cx.attrs.int_or("ceil_mode", 0)? != 0;
        Ok(Window {
            kernel,
            strides,
            dilations,
            pads,
            auto_pad,
            ceil_mode,
        })
    }

    /// The begin and end pads of every spatial dim for an input of spatial size `input` and an
    /// output of `out` (the shape rule's): the `pads` attribute, none for `VALID`, or what
    /// `SAME_UPPER` / `SAME_LOWER` add so that the windows cover `out` positions (the odd one
    /// at the end, or at the beginning).
    pub fn pads_for(&self, input: &[u64], out: &[u64]) -> (Vec<u64>, Vec<u64>) {
        let n = self.kernel.len();
        match self.auto_pad.as_str() {
            "VALID" => (vec![0; n], vec![0; n]),
            "SAME_UPPER" | "SAME_LOWER" => {
                let (mut pb, mut pe) = (vec![0; n], vec![0; n]);
                for j in 0..n {
                    let eff = self.kernel[j].saturating_sub(1) * self.dilations[j] + 1;
                    let o = out.get(j).copied().unwrap_or(0);
                    let i = input.get(j).copied().unwrap_or(0);
                    let total = (o.saturating_sub(1) * self.strides[j] + eff).saturating_sub(i);
                    let small = total / 2;
                    if self.auto_pad == "SAME_UPPER" {
                        (pb[j], pe[j]) = (small, total - small);
                    } else {
                        (pb[j], pe[j]) = (total - small, small);
                    }
                }
                (pb, pe)
            }
            _ => (self.pads[..n].to_vec(), self.pads[n..].to_vec()),
        }
    }

    pub fn out_spatial(&self, cx: &Ctx, input: &[u64]) -> Result<Vec<u64>> {
        let n = self.kernel.len();
        if input.len() != n {
            return Err(cx.err(format!(
                "input has {} spatial dims but the kernel has {n}",
                input.len()
            )));
        }
        (0..n)
            .map(|i| {
                window_out(
                    cx,
                    input[i],
                    self.kernel[i],
                    self.strides[i],
                    self.dilations[i],
                    self.pads[i],
                    self.pads[i + n],
                    self.ceil_mode,
                    &self.auto_pad,
                )
            })
            .collect()
    }
}
