//! Kernels of the recurrent family: `LSTM`, `GRU` and `RNN` (see `exec::kernel` for the
//! contract).
//!
//! The forward runs the recurrence step by step on candle ops (the input projection of all
//! steps is one matmul). The `workspace` extra holds, per direction and time step, the gate
//! activations and the hidden (and cell) state the step started from, in the input's dtype:
//! `[dirs, seq, batch, (gates + states) · hidden]`. A GRU with `linear_before_reset` (the form
//! PyTorch exports) keeps three more per step, as PyTorch's CPU cell does (`gru_cell`: its
//! in-place products save copies of their inputs): u = h·Rhᵀ + Rbh and h − h̃, which the
//! backward reads instead of recomputing a matmul and a difference, and r ⊙ u, which PyTorch
//! keeps because it shares storage with the gates and the backward does not read: 7 units of
//! `batch · hidden` per step, the bytes PyTorch keeps (`fixtures/README.md`, "LSTM and GRU").
//! The outputs are an elementwise function of the workspace, so a forward given the
//! workspace reproduces the first one exactly, and the backward is back-propagation through
//! time without recomputing the recurrence.
//!
//! A float32 LSTM's saved workspace is padded with zeros, per direction, to the bytes
//! PyTorch's CPU LSTM keeps (oneDNN's workspace, the output and the final states:
//! `remat_planner::ops::rnn::pytorch_cpu_lstm_bytes`, about 3× the six units read here): the
//! planner's rule declares those bytes so that a plan sized for PyTorch holds there, and the
//! executor holds what the rule declares so that its measured peak checks that prediction.
//!
//! Supported: every direction, layouts 0 and 1, optional B, initial states and peepholes,
//! partial `sequence_lens` (an entry past its length keeps its state and outputs zeros),
//! GRU's `linear_before_reset`, and the activations Sigmoid, Tanh and Relu. `clip` and
//! LSTM's `input_forget` are refused with an error naming the attribute.

use super::common::want;
use crate::kernel::kbail;
use crate::kernel::{
    BwdArgs, Extras, Inputs, KResult, Kernel, KernelCtx, KernelError, KernelRegistry,
};
use candle_core::{DType, Tensor, D};
use remat_planner::ops::rnn::pytorch_cpu_lstm_bytes;
use remat_planner::tensor::DType as PDType;

#[derive(Clone, Copy, PartialEq, Debug)]
enum Cell {
    Lstm,
    Gru,
    Rnn,
}

impl Cell {
    fn of(op: &str) -> KResult<Cell> {
        Ok(match op {
            "LSTM" => Cell::Lstm,
            "GRU" => Cell::Gru,
            "RNN" => Cell::Rnn,
            o => kbail!("{o} is not a recurrent op"),
        })
    }
    fn gates(self) -> usize {
        match self {
            Cell::Lstm => 4,
            Cell::Gru => 3,
            Cell::Rnn => 1,
        }
    }
    fn states(self) -> usize {
        match self {
            Cell::Lstm => 2,
            _ => 1,
        }
    }
    /// Activation functions per direction.
    fn n_acts(self) -> usize {
        match self {
            Cell::Lstm => 3,
            Cell::Gru => 2,
            Cell::Rnn => 1,
        }
    }
    fn default_acts(self) -> Vec<Act> {
        match self {
            Cell::Lstm => vec![Act::Sigmoid, Act::Tanh, Act::Tanh],
            Cell::Gru => vec![Act::Sigmoid, Act::Tanh],
            Cell::Rnn => vec![Act::Tanh],
        }
    }
}

/// An activation whose derivative is a function of its output.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Act {
    Sigmoid,
    Tanh,
    Relu,
}

pub(crate) fn sigmoid(x: &Tensor) -> KResult<Tensor> {
    Ok(x.affine(0.5, 0.0)?.tanh()?.affine(0.5, 0.5)?)
}

impl Act {
    fn apply(self, x: &Tensor) -> KResult<Tensor> {
        match self {
            Act::Sigmoid => sigmoid(x),
            Act::Tanh => Ok(x.tanh()?),
            Act::Relu => Ok(x.relu()?),
        }
    }
    /// d act / d x, from y = act(x).
    fn deriv(self, y: &Tensor) -> KResult<Tensor> {
        match self {
            Act::Sigmoid => Ok((y * y.affine(-1.0, 1.0)?)?),
            Act::Tanh => Ok(y.sqr()?.affine(-1.0, 1.0)?),
            Act::Relu => Ok(y.gt(0.0)?.to_dtype(y.dtype())?),
        }
    }
}

struct Spec {
    cell: Cell,
    seq: usize,
    batch: usize,
    hidden: usize,
    dirs: usize,
    reverse: bool,
    layout1: bool,
    /// Activations of each direction (f, g, h as ONNX names them).
    acts: Vec<Vec<Act>>,
    linear_before_reset: bool,
    /// Elements per direction the saved workspace is padded to (float32 LSTM), 0 for none.
    reserve: usize,
}

impl Spec {
    /// Whether direction `d` runs backwards in time.
    fn backwards(&self, d: usize) -> bool {
        self.reverse || d == 1
    }
    /// Time steps in processing order for direction `d`.
    fn order(&self, d: usize) -> Vec<usize> {
        if self.backwards(d) {
            (0..self.seq).rev().collect()
        } else {
            (0..self.seq).collect()
        }
    }
    /// Values per step in the workspace, in units of `hidden`: the gates and the states the
    /// step started from; a GRU with `linear_before_reset` also keeps what PyTorch's CPU cell
    /// keeps beside them (see `workspace`).
    fn width(&self) -> usize {
        let extra = if self.linear_before_reset { 3 } else { 0 };
        (self.cell.gates() + self.cell.states() + extra) * self.hidden
    }
    /// Elements of one direction's workspace, `seq · batch · width`.
    fn content(&self) -> usize {
        self.seq * self.batch * self.width()
    }
    fn act(&self, d: usize, k: usize) -> KResult<Act> {
        self.acts
            .get(d)
            .and_then(|a| a.get(k))
            .copied()
            .ok_or_else(|| KernelError::new(format!("no activation {k} for direction {d}")))
    }
}

fn spec(cx: &KernelCtx) -> KResult<Spec> {
    let cell = Cell::of(cx.op)?;
    let x = cx.in_shape(0)?;
    let w = cx.in_shape(1)?;
    if x.len() != 3 || w.len() != 3 {
        kbail!("X and W must be 3-D, got {x:?} and {w:?}");
    }
    let layout1 = match cx.attrs.int_or("layout", 0)? {
        0 => false,
        1 => true,
        l => kbail!("attribute \"layout\" = {l} is not supported"),
    };
    let (seq, batch) = if layout1 { (x[1], x[0]) } else { (x[0], x[1]) };
    let direction = cx
        .attrs
        .string("direction")?
        .unwrap_or_else(|| "forward".into());
    let (dirs, reverse) = match direction.as_str() {
        "forward" => (1, false),
        "reverse" => (1, true),
        "bidirectional" => (2, false),
        d => kbail!("attribute \"direction\" = {d:?} is not supported"),
    };
    let g = cell.gates();
    let hidden = match cx.attrs.int("hidden_size")? {
        Some(h) if h > 0 => h as usize,
        Some(h) => kbail!("attribute \"hidden_size\" = {h} is not supported"),
        None => w[1] / g,
    };
    if w[0] != dirs || w[1] != g * hidden || w[2] != x[2] {
        kbail!("W of shape {w:?} does not match {dirs} direction(s), hidden size {hidden} and input size {}", x[2]);
    }
    if let Some(c) = cx.attrs.float("clip")? {
        kbail!("attribute \"clip\" = {c} is not supported");
    }
    if cell == Cell::Lstm {
        let f = cx.attrs.int_or("input_forget", 0)?;
        if f != 0 {
            kbail!("attribute \"input_forget\" = {f} is not supported");
        }
    }
    let n = cell.n_acts();
    let acts = match cx.attrs.list.iter().find(|a| a.name == "activations") {
        None => vec![cell.default_acts(); dirs],
        Some(a) => {
            let names: Vec<String> = a
                .strings
                .iter()
                .map(|s| String::from_utf8_lossy(s).into_owned())
                .collect();
            let mut parsed = vec![];
            for s in &names {
                parsed.push(match s.to_ascii_lowercase().as_str() {
                    "sigmoid" => Act::Sigmoid,
                    "tanh" => Act::Tanh,
                    "relu" => Act::Relu,
                    _ => kbail!(
                        "attribute \"activations\" = {names:?} is not supported (activation {s:?})"
                    ),
                });
            }
            if parsed.len() == n * dirs {
                parsed.chunks(n).map(|c| c.to_vec()).collect()
            } else if parsed.len() == n {
                vec![parsed; dirs]
            } else {
                kbail!(
                    "attribute \"activations\" = {names:?} does not hold {n} activation(s) per direction"
                )
            }
        }
    };
    let linear_before_reset = cell == Cell::Gru && cx.attrs.int_or("linear_before_reset", 0)? != 0;
    let reserve = if cell == Cell::Lstm && cx.input(0)?.dtype == PDType::F32 {
        let bytes = pytorch_cpu_lstm_bytes(seq as u64, batch as u64, x[2] as u64, hidden as u64);
        usize::try_from(bytes / 4)
            .map_err(|_| KernelError::new(format!("an LSTM workspace of {bytes} bytes")))?
    } else {
        0
    };
    Ok(Spec {
        cell,
        seq,
        batch,
        hidden,
        dirs,
        reverse,
        layout1,
        acts,
        linear_before_reset,
        reserve,
    })
}

/// The step mask of `sequence_lens` (`[seq, batch, 1]`, 1 where step t < the entry's
/// length), `None` when absent or every sequence is full. Past its length an entry keeps
/// its state and outputs zeros; a reverse direction starts at its last valid step.
fn lens_mask(sp: &Spec, lens: Option<&Tensor>, dtype: DType) -> KResult<Option<Tensor>> {
    let Some(l) = lens else { return Ok(None) };
    let v = l.to_dtype(DType::I64)?.flatten_all()?.to_vec1::<i64>()?;
    if v.len() != sp.batch {
        kbail!(
            "sequence_lens has {} values for a batch of {}",
            v.len(),
            sp.batch
        );
    }
    if v.iter().any(|&n| n < 0 || n as usize > sp.seq) {
        kbail!("sequence_lens {v:?} falls outside 0..={} steps", sp.seq);
    }
    if v.iter().all(|&n| n as usize == sp.seq) {
        return Ok(None);
    }
    let m: Vec<f32> = (0..sp.seq)
        .flat_map(|t| {
            v.iter()
                .map(move |&n| if (t as i64) < n { 1.0 } else { 0.0 })
        })
        .collect();
    Ok(Some(
        Tensor::from_vec(m, (sp.seq, sp.batch, 1), l.device())?.to_dtype(dtype)?,
    ))
}

/// `prev + m · (next − prev)`: the new state where the step is valid, the old one past it.
fn blend(prev: &Tensor, next: &Tensor, m: &Tensor) -> KResult<Tensor> {
    Ok((prev + (next - prev)?.broadcast_mul(m)?)?)
}

/// An initial state `[dirs, batch, hidden]` (layout 0) from an input in either layout.
fn state_in(sp: &Spec, t: Option<&Tensor>) -> KResult<Option<Tensor>> {
    Ok(match t {
        None => None,
        Some(t) if sp.layout1 => Some(t.transpose(0, 1)?.contiguous()?),
        Some(t) => Some(t.clone()),
    })
}

/// The workspace of every direction: `[dirs, seq, batch, width]`.
fn workspace(cx: &KernelCtx, sp: &Spec, xs: &[Option<Tensor>]) -> KResult<Tensor> {
    let x = xs.named(0, "X")?.clone();
    let mask = lens_mask(sp, xs.opt(4), x.dtype())?;
    let x = if sp.layout1 {
        x.transpose(0, 1)?.contiguous()?
    } else {
        x
    };
    let w = xs.named(1, "W")?.clone();
    let r = xs.named(2, "R")?.clone();
    let b = xs.opt(3);
    let h0 = state_in(sp, xs.opt(5))?;
    let c0 = if sp.cell == Cell::Lstm {
        state_in(sp, xs.opt(6))?
    } else {
        None
    };
    let p = if sp.cell == Cell::Lstm {
        xs.opt(7)
    } else {
        None
    };
    let h = sp.hidden;
    let gh = sp.cell.gates() * h;
    let (seq, batch) = (sp.seq, sp.batch);
    let input = x.dim(2)?;
    let zeros = Tensor::zeros((batch, h), x.dtype(), cx.device)?;
    let mut per_dir = vec![];
    for d in 0..sp.dirs {
        let wd = w.get(d)?;
        let rd = r.get(d)?;
        let rt = rd.t()?.contiguous()?;
        let mut xw = x
            .reshape((seq * batch, input))?
            .matmul(&wd.t()?.contiguous()?)?;
        // Biases outside the recurrence fold into the input projection.
        let mut rbh = None;
        if let Some(b) = b {
            let bd = b.get(d)?;
            let wb = bd.narrow(0, 0, gh)?;
            let rb = bd.narrow(0, gh, gh)?;
            let add = if sp.linear_before_reset {
                rbh = Some(rb.narrow(0, 2 * h, h)?);
                Tensor::cat(
                    &[&rb.narrow(0, 0, 2 * h)?, &rb.zeros_like()?.narrow(0, 0, h)?],
                    0,
                )?
            } else {
                rb
            };
            xw = xw.broadcast_add(&(wb + add)?)?;
        }
        let xw = xw.reshape((seq, batch, gh))?;
        let pd = match p {
            Some(p) => Some(p.get(d)?),
            None => None,
        };
        let mut hp = match &h0 {
            Some(t) => t.get(d)?,
            None => zeros.clone(),
        };
        let mut cp = match &c0 {
            Some(t) => t.get(d)?,
            None => zeros.clone(),
        };
        let mut steps: Vec<Option<Tensor>> = vec![None; seq];
        for t in sp.order(d) {
            let xt = xw.get(t)?;
            let (ws, hn, cn) = match sp.cell {
                Cell::Lstm => {
                    let (f, g, hh) = (sp.act(d, 0)?, sp.act(d, 1)?, sp.act(d, 2)?);
                    let a = (xt + hp.matmul(&rt)?)?;
                    let mut ai = a.narrow(1, 0, h)?;
                    let mut ao = a.narrow(1, h, h)?;
                    let mut af = a.narrow(1, 2 * h, h)?;
                    let ac = a.narrow(1, 3 * h, h)?;
                    if let Some(pd) = &pd {
                        ai = (ai + cp.broadcast_mul(&pd.narrow(0, 0, h)?)?)?;
                        af = (af + cp.broadcast_mul(&pd.narrow(0, 2 * h, h)?)?)?;
                    }
                    let i = f.apply(&ai)?;
                    let fg = f.apply(&af)?;
                    let c = g.apply(&ac)?;
                    let cn = ((&fg * &cp)? + (&i * &c)?)?;
                    if let Some(pd) = &pd {
                        ao = (ao + cn.broadcast_mul(&pd.narrow(0, h, h)?)?)?;
                    }
                    let o = f.apply(&ao)?;
                    let hn = (&o * hh.apply(&cn)?)?;
                    let ws = Tensor::cat(&[&i, &o, &fg, &c, &hp, &cp], 1)?;
                    (ws, hn, Some(cn))
                }
                Cell::Gru => {
                    let (f, g) = (sp.act(d, 0)?, sp.act(d, 1)?);
                    let azr = (xt.narrow(1, 0, 2 * h)?
                        + hp.matmul(&rt.narrow(1, 0, 2 * h)?.contiguous()?)?)?;
                    let z = f.apply(&azr.narrow(1, 0, h)?)?;
                    let rg = f.apply(&azr.narrow(1, h, h)?)?;
                    let rh = rt.narrow(1, 2 * h, h)?.contiguous()?;
                    let xh = xt.narrow(1, 2 * h, h)?;
                    if sp.linear_before_reset {
                        let mut u = hp.matmul(&rh)?;
                        if let Some(rbh) = &rbh {
                            u = u.broadcast_add(rbh)?;
                        }
                        let ru = (&rg * &u)?;
                        let hh = g.apply(&(xh + &ru)?)?;
                        let diff = (&hp - &hh)?;
                        let hn = (&hh + (&z * &diff)?)?;
                        let ws = Tensor::cat(&[&z, &rg, &hh, &hp, &u, &diff, &ru], 1)?;
                        (ws, hn, None)
                    } else {
                        let hh = g.apply(&(xh + (&rg * &hp)?.matmul(&rh)?)?)?;
                        let hn = (&hh + (&z * (&hp - &hh)?)?)?;
                        let ws = Tensor::cat(&[&z, &rg, &hh, &hp], 1)?;
                        (ws, hn, None)
                    }
                }
                Cell::Rnn => {
                    let hn = sp.act(d, 0)?.apply(&(xt + hp.matmul(&rt)?)?)?;
                    let ws = Tensor::cat(&[&hn, &hp], 1)?;
                    (ws, hn, None)
                }
            };
            match &mask {
                Some(m) => {
                    let mt = m.get(t)?;
                    hp = blend(&hp, &hn, &mt)?;
                    if let Some(cn) = cn {
                        cp = blend(&cp, &cn, &mt)?;
                    }
                }
                None => {
                    hp = hn;
                    if let Some(cn) = cn {
                        cp = cn;
                    }
                }
            }
            if let Some(s) = steps.get_mut(t) {
                *s = Some(ws);
            }
        }
        let steps: Vec<Tensor> = steps
            .into_iter()
            .map(|s| s.ok_or_else(|| KernelError::new("a time step was not computed")))
            .collect::<KResult<_>>()?;
        per_dir.push(Tensor::stack(&steps, 0)?);
    }
    Ok(Tensor::stack(&per_dir, 0)?)
}

/// The workspace as saved: each direction flattened and padded with zeros to `reserve`
/// elements (`[dirs, reserve]`) when the spec has one, unchanged otherwise.
fn padded(sp: &Spec, ws: Tensor) -> KResult<Tensor> {
    let content = sp.content();
    if sp.reserve <= content {
        return Ok(ws);
    }
    let flat = ws.reshape((sp.dirs, content))?;
    let fill = Tensor::zeros((sp.dirs, sp.reserve - content), ws.dtype(), ws.device())?;
    Ok(Tensor::cat(&[&flat, &fill], 1)?)
}

/// Direction `d`'s workspace `[seq, batch, width]`, from a workspace as `workspace` or
/// `padded` returns it (a view, no copy).
fn ws_dir(sp: &Spec, ws: &Tensor, d: usize) -> KResult<Tensor> {
    let full = [sp.dirs, sp.seq, sp.batch, sp.width()];
    if ws.dims() == full {
        return Ok(ws.get(d)?);
    }
    if sp.reserve > sp.content() && ws.dims() == [sp.dirs, sp.reserve] {
        return Ok(ws.get(d)?.narrow(0, 0, sp.content())?.reshape((
            sp.seq,
            sp.batch,
            sp.width(),
        ))?);
    }
    kbail!(
        "the workspace has shape {:?}, expected {full:?}{}",
        ws.dims(),
        if sp.reserve > sp.content() {
            format!(" or [{}, {}]", sp.dirs, sp.reserve)
        } else {
            String::new()
        }
    )
}

/// Hidden states `[seq, batch, hidden]` and cell states (LSTM) of direction `d`, from its
/// workspace `[seq, batch, width]`.
fn states_of(sp: &Spec, d: usize, ws: &Tensor) -> KResult<(Tensor, Option<Tensor>)> {
    let h = sp.hidden;
    Ok(match sp.cell {
        Cell::Lstm => {
            let n = |k: usize| ws.narrow(2, k * h, h);
            let (i, o, f, g, cp) = (n(0)?, n(1)?, n(2)?, n(3)?, n(5)?);
            let c = ((f * cp)? + (i * g)?)?;
            let hs = (o * sp.act(d, 2)?.apply(&c)?)?;
            (hs, Some(c))
        }
        Cell::Gru => {
            let n = |k: usize| ws.narrow(2, k * h, h);
            let (z, hh, hp) = (n(0)?, n(2)?, n(3)?);
            ((&hh + (z * (hp - &hh)?)?)?, None)
        }
        Cell::Rnn => (ws.narrow(2, 0, h)?, None),
    })
}

fn rnn_forward(cx: &KernelCtx, xs: &[Option<Tensor>], ex: &Extras) -> KResult<Vec<Option<Tensor>>> {
    let sp = spec(cx)?;
    let ws = match ex.get("workspace").and_then(|v| v.first()) {
        Some(w) => w.clone(),
        None => workspace(cx, &sp, xs)?,
    };
    let mask = lens_mask(&sp, xs.opt(4), ws.dtype())?;
    let mut ys = vec![];
    let mut hl = vec![];
    let mut cl = vec![];
    let (h, g) = (sp.hidden, sp.cell.gates());
    for d in 0..sp.dirs {
        let wsd = ws_dir(&sp, &ws, d)?;
        let (hs, cs) = states_of(&sp, d, &wsd)?;
        let last = if sp.backwards(d) { 0 } else { sp.seq - 1 };
        match &mask {
            Some(m) => {
                // The state after the last step keeps what entries past their length had.
                let (prev, mt) = (wsd.get(last)?, m.get(last)?);
                hl.push(blend(&prev.narrow(1, g * h, h)?, &hs.get(last)?, &mt)?);
                if let Some(cs) = &cs {
                    cl.push(blend(
                        &prev.narrow(1, (g + 1) * h, h)?,
                        &cs.get(last)?,
                        &mt,
                    )?);
                }
                ys.push(hs.broadcast_mul(m)?);
            }
            None => {
                hl.push(hs.get(last)?);
                if let Some(cs) = &cs {
                    cl.push(cs.get(last)?);
                }
                ys.push(hs);
            }
        }
    }
    // [seq, dirs, batch, hidden] and [dirs, batch, hidden] in layout 0.
    let mut y = Tensor::stack(&ys, 1)?;
    let mut yh = Tensor::stack(&hl, 0)?;
    let mut yc = if cl.is_empty() {
        None
    } else {
        Some(Tensor::stack(&cl, 0)?)
    };
    if sp.layout1 {
        y = y.permute((2, 0, 1, 3))?.contiguous()?;
        yh = yh.transpose(0, 1)?.contiguous()?;
        yc = match yc {
            Some(c) => Some(c.transpose(0, 1)?.contiguous()?),
            None => None,
        };
    }
    let all = [Some(y), Some(yh), yc];
    Ok((0..cx.outputs.len())
        .map(|k| {
            if want(cx, k) {
                all.get(k).cloned().flatten()
            } else {
                None
            }
        })
        .collect())
}

fn rnn_extra(cx: &KernelCtx, tag: &str, xs: &[Option<Tensor>]) -> KResult<Vec<Tensor>> {
    if tag != "workspace" {
        kbail!("{} has no extra value {tag:?}", cx.op);
    }
    let sp = spec(cx)?;
    Ok(vec![padded(&sp, workspace(cx, &sp, xs)?)?])
}

/// Sum of `a` over its leading dims, as `[last]`.
fn sum_rows(a: &Tensor) -> KResult<Tensor> {
    let n = a.dim(D::Minus1)?;
    Ok(a.reshape(((), n))?.sum(0)?)
}

/// `aᵀ · b` over all leading dims: `[.., m]`, `[.., n]` → `[m, n]`.
fn outer_sum(a: &Tensor, b: &Tensor) -> KResult<Tensor> {
    let m = a.dim(D::Minus1)?;
    let n = b.dim(D::Minus1)?;
    Ok(a.reshape(((), m))?
        .t()?
        .contiguous()?
        .matmul(&b.reshape(((), n))?.contiguous()?)?)
}

struct DirGrads {
    dx: Tensor,
    dw: Tensor,
    dr: Tensor,
    db: Tensor,
    dh0: Tensor,
    dc0: Option<Tensor>,
    dp: Option<Tensor>,
}

#[allow(clippy::too_many_arguments)]
fn backward_dir(
    sp: &Spec,
    d: usize,
    ws: &Tensor,
    x: &Tensor,
    w: &Tensor,
    r: &Tensor,
    p: Option<&Tensor>,
    mask: Option<&Tensor>,
    dy: &Tensor,
    dh_last: Tensor,
    dc_last: Option<Tensor>,
) -> KResult<DirGrads> {
    let h = sp.hidden;
    let gh = sp.cell.gates() * h;
    let n = |k: usize| ws.narrow(2, k * h, h);
    let mut dh = dh_last;
    let mut dc = dc_last;
    let mut da_x: Vec<Option<Tensor>> = vec![None; sp.seq];
    let mut da_r: Vec<Option<Tensor>> = vec![None; sp.seq];
    let mut dp_parts: Option<[Tensor; 3]> = None;
    let rh = if sp.cell == Cell::Gru {
        Some(r.narrow(0, 2 * h, h)?)
    } else {
        None
    };
    let mut order = sp.order(d);
    order.reverse();
    for t in order {
        let wst = ws.get(t)?;
        let g = |k: usize| wst.narrow(1, k * h, h);
        // Past an entry's length the state passes through and the output is zero.
        let (pass_h, pass_c) = match mask {
            Some(m) => {
                let mt = m.get(t)?;
                let skip = mt.affine(-1.0, 1.0)?;
                let ph = dh.broadcast_mul(&skip)?;
                dh = (dh + dy.get(t)?)?.broadcast_mul(&mt)?;
                let pc = match dc.take() {
                    Some(c) => {
                        dc = Some(c.broadcast_mul(&mt)?);
                        Some(c.broadcast_mul(&skip)?)
                    }
                    None => None,
                };
                (Some(ph), pc)
            }
            None => {
                dh = (dh + dy.get(t)?)?;
                (None, None)
            }
        };
        let (dax, dar) = match sp.cell {
            Cell::Lstm => {
                let (fa, ga, ha) = (sp.act(d, 0)?, sp.act(d, 1)?, sp.act(d, 2)?);
                let (i, o, f, c, cp) = (g(0)?, g(1)?, g(2)?, g(3)?, g(5)?);
                let cn = ((&f * &cp)? + (&i * &c)?)?;
                let tc = ha.apply(&cn)?;
                let dcur = match &dc {
                    Some(dc) => dc.clone(),
                    None => dh.zeros_like()?,
                };
                let dao = ((&dh * &tc)? * fa.deriv(&o)?)?;
                let mut dcn = (dcur + ((&dh * &o)? * ha.deriv(&tc)?)?)?;
                if let Some(p) = p {
                    dcn = (dcn + dao.broadcast_mul(&p.narrow(0, h, h)?)?)?;
                }
                let dai = ((&dcn * &c)? * fa.deriv(&i)?)?;
                let daf = ((&dcn * &cp)? * fa.deriv(&f)?)?;
                let dac = ((&dcn * &i)? * ga.deriv(&c)?)?;
                let mut dcp = (&dcn * &f)?;
                if let Some(p) = p {
                    dcp = (dcp
                        + dai.broadcast_mul(&p.narrow(0, 0, h)?)?
                        + daf.broadcast_mul(&p.narrow(0, 2 * h, h)?)?)?;
                    let parts = [
                        (&dai * &cp)?.sum(0)?,
                        (&dao * &cn)?.sum(0)?,
                        (&daf * &cp)?.sum(0)?,
                    ];
                    dp_parts = Some(match dp_parts {
                        None => parts,
                        Some([a, b2, c2]) => {
                            let [p0, p1, p2] = parts;
                            [(a + p0)?, (b2 + p1)?, (c2 + p2)?]
                        }
                    });
                }
                let da = Tensor::cat(&[&dai, &dao, &daf, &dac], 1)?;
                dh = da.matmul(r)?;
                dc = Some(dcp);
                (da.clone(), da)
            }
            Cell::Gru => {
                let (fa, ga) = (sp.act(d, 0)?, sp.act(d, 1)?);
                let (z, rg, hh, hp) = (g(0)?, g(1)?, g(2)?, g(3)?);
                let rh = rh
                    .as_ref()
                    .ok_or_else(|| KernelError::new("GRU without its candidate weights"))?;
                // With linear_before_reset the workspace holds hp − hh and u = hp·Rhᵀ + Rbh.
                let dz = if sp.linear_before_reset {
                    (&dh * g(5)?)?
                } else {
                    (&dh * (&hp - &hh)?)?
                };
                let dhh = (&dh * z.affine(-1.0, 1.0)?)?;
                let mut dhp = (&dh * &z)?;
                let dah = (dhh * ga.deriv(&hh)?)?;
                let (dr, dah_r) = if sp.linear_before_reset {
                    let du = (&dah * &rg)?;
                    dhp = (dhp + du.matmul(rh)?)?;
                    ((&dah * g(4)?)?, du)
                } else {
                    let drh = dah.matmul(rh)?;
                    dhp = (dhp + (&drh * &rg)?)?;
                    ((drh * &hp)?, dah.clone())
                };
                let daz = (dz * fa.deriv(&z)?)?;
                let dar = (dr * fa.deriv(&rg)?)?;
                let dzr = Tensor::cat(&[&daz, &dar], 1)?;
                dhp = (dhp + dzr.matmul(&r.narrow(0, 0, 2 * h)?)?)?;
                dh = dhp;
                (
                    Tensor::cat(&[&daz, &dar, &dah], 1)?,
                    Tensor::cat(&[&daz, &dar, &dah_r], 1)?,
                )
            }
            Cell::Rnn => {
                let hn = g(0)?;
                let da = (&dh * sp.act(d, 0)?.deriv(&hn)?)?;
                dh = da.matmul(r)?;
                (da.clone(), da)
            }
        };
        if let Some(ph) = pass_h {
            dh = (dh + ph)?;
        }
        if let Some(pc) = pass_c {
            dc = Some(match dc {
                Some(c) => (c + pc)?,
                None => pc,
            });
        }
        if let Some(s) = da_x.get_mut(t) {
            *s = Some(dax);
        }
        if let Some(s) = da_r.get_mut(t) {
            *s = Some(dar);
        }
    }
    let collect = |v: Vec<Option<Tensor>>| -> KResult<Tensor> {
        let v: Vec<Tensor> = v
            .into_iter()
            .map(|s| s.ok_or_else(|| KernelError::new("a time step has no gradient")))
            .collect::<KResult<_>>()?;
        Ok(Tensor::stack(&v, 0)?)
    };
    // [seq, batch, gates · hidden]
    let dax = collect(da_x)?;
    let dar = collect(da_r)?;
    let input = x.dim(2)?;
    let dx = dax
        .reshape(((), gh))?
        .matmul(w)?
        .reshape((sp.seq, sp.batch, input))?;
    let dw = outer_sum(&dax, x)?;
    // The state each step started from.
    let hp = n(sp.cell.gates())?;
    let dr = match sp.cell {
        Cell::Gru => {
            let rhs = if sp.linear_before_reset {
                hp.clone()
            } else {
                (n(1)? * &hp)?
            };
            Tensor::cat(
                &[
                    &outer_sum(&dar.narrow(2, 0, 2 * h)?, &hp)?,
                    &outer_sum(&dar.narrow(2, 2 * h, h)?, &rhs)?,
                ],
                0,
            )?
        }
        _ => outer_sum(&dar, &hp)?,
    };
    let db = Tensor::cat(&[&sum_rows(&dax)?, &sum_rows(&dar)?], 0)?;
    let dp = match dp_parts {
        Some([a, b2, c2]) => Some(Tensor::cat(&[&a, &b2, &c2], 0)?),
        None => None,
    };
    Ok(DirGrads {
        dx,
        dw,
        dr,
        db,
        dh0: dh,
        dc0: dc,
        dp,
    })
}

fn rnn_backward(cx: &KernelCtx, a: &BwdArgs) -> KResult<Vec<Option<Tensor>>> {
    let sp = spec(cx)?;
    let ws = a
        .extra("workspace")?
        .first()
        .ok_or_else(|| KernelError::new("the workspace extra is empty"))?;
    ws_dir(&sp, ws, 0)?;
    let x = a.input(0)?;
    let x = if sp.layout1 {
        x.transpose(0, 1)?.contiguous()?
    } else {
        x.clone()
    };
    let w = a.input(1)?;
    let r = a.input(2)?;
    let has = |i: usize| cx.inputs.get(i).is_some_and(|f| f.is_some());
    let p = if sp.cell == Cell::Lstm && has(7) {
        Some(a.input(7)?)
    } else {
        None
    };
    // Output gradients in layout 0.
    let present = |k: usize| super::common::want(cx, k);
    let mut dy = if present(0) {
        a.grad(cx, 0)?
    } else {
        let shape = if sp.layout1 {
            (sp.batch, sp.seq, sp.dirs, sp.hidden)
        } else {
            (sp.seq, sp.dirs, sp.batch, sp.hidden)
        };
        Tensor::zeros(shape, x.dtype(), cx.device)?
    };
    let zeros_state = || {
        let shape = if sp.layout1 {
            (sp.batch, sp.dirs, sp.hidden)
        } else {
            (sp.dirs, sp.batch, sp.hidden)
        };
        Tensor::zeros(shape, x.dtype(), cx.device)
    };
    let mut dyh = if present(1) {
        a.grad(cx, 1)?
    } else {
        zeros_state()?
    };
    let mut dyc = if sp.cell == Cell::Lstm && present(2) {
        Some(a.grad(cx, 2)?)
    } else {
        None
    };
    if sp.layout1 {
        dy = dy.permute((1, 2, 0, 3))?.contiguous()?;
        dyh = dyh.transpose(0, 1)?.contiguous()?;
        dyc = match dyc {
            Some(c) => Some(c.transpose(0, 1)?.contiguous()?),
            None => None,
        };
    }
    let lens = if has(4) { Some(a.input(4)?) } else { None };
    let mask = lens_mask(&sp, lens, x.dtype())?;
    let mut dx: Option<Tensor> = None;
    let (mut dw, mut dr, mut db, mut dh0, mut dc0, mut dp) =
        (vec![], vec![], vec![], vec![], vec![], vec![]);
    for d in 0..sp.dirs {
        let pd = match p {
            Some(p) => Some(p.get(d)?),
            None => None,
        };
        let dc_last = match (&dyc, sp.cell) {
            (Some(c), _) => Some(c.get(d)?),
            (None, Cell::Lstm) => Some(Tensor::zeros((sp.batch, sp.hidden), x.dtype(), cx.device)?),
            _ => None,
        };
        let g = backward_dir(
            &sp,
            d,
            &ws_dir(&sp, ws, d)?,
            &x,
            &w.get(d)?,
            &r.get(d)?,
            pd.as_ref(),
            mask.as_ref(),
            &dy.narrow(1, d, 1)?.squeeze(1)?,
            dyh.get(d)?,
            dc_last,
        )?;
        dx = Some(match dx {
            None => g.dx,
            Some(s) => (s + g.dx)?,
        });
        dw.push(g.dw);
        dr.push(g.dr);
        db.push(g.db);
        dh0.push(g.dh0);
        if let Some(c) = g.dc0 {
            dc0.push(c);
        }
        if let Some(q) = g.dp {
            dp.push(q);
        }
    }
    let state_out = |v: &[Tensor]| -> KResult<Tensor> {
        let t = Tensor::stack(v, 0)?;
        Ok(if sp.layout1 {
            t.transpose(0, 1)?.contiguous()?
        } else {
            t
        })
    };
    let mut out: Vec<Option<Tensor>> = vec![None; cx.inputs.len()];
    for (i, slot) in out.iter_mut().enumerate() {
        if !a.need(i) {
            continue;
        }
        *slot = Some(match i {
            0 => {
                let dx = dx
                    .clone()
                    .ok_or_else(|| KernelError::new("no direction was run"))?;
                if sp.layout1 {
                    dx.transpose(0, 1)?.contiguous()?
                } else {
                    dx
                }
            }
            1 => Tensor::stack(&dw, 0)?,
            2 => Tensor::stack(&dr, 0)?,
            3 => Tensor::stack(&db, 0)?,
            5 => state_out(&dh0)?,
            6 if sp.cell == Cell::Lstm => state_out(&dc0)?,
            7 if sp.cell == Cell::Lstm && !dp.is_empty() => Tensor::stack(&dp, 0)?,
            _ => kbail!("input {i} of {} takes no gradient", cx.op),
        });
    }
    Ok(out)
}

pub fn register(r: &mut KernelRegistry) {
    for op in ["LSTM", "GRU", "RNN"] {
        r.insert(
            op,
            Kernel {
                forward: rnn_forward,
                extra: Some(rnn_extra),
                backward: Some(rnn_backward),
            },
        );
    }
}

#[cfg(test)]
mod tests {
    use crate::testing::{check, int, string, Case, In};
    use remat_planner::tensor::DType;

    fn lstm(dir: &str, dirs: usize, layout: i64, full: bool) -> Case {
        let (s, b, i, h) = (3, 2, 3, 2);
        let x = if layout == 0 {
            vec![s, b, i]
        } else {
            vec![b, s, i]
        };
        let st = if layout == 0 {
            vec![dirs, b, h]
        } else {
            vec![b, dirs, h]
        };
        let mut inputs = vec![
            In::Rand(x),
            In::Param(vec![dirs, 4 * h, i]),
            In::Param(vec![dirs, 4 * h, h]),
        ];
        if full {
            inputs.extend([
                In::Param(vec![dirs, 8 * h]),
                In::Ints(DType::I32, vec![b], vec![s as i64; b]),
                In::Rand(st.clone()),
                In::Rand(st),
                In::Param(vec![dirs, 3 * h]),
            ]);
        }
        Case::new("LSTM", 14, inputs)
            .attr(string("direction", dir))
            .attr(int("hidden_size", h as i64))
            .attr(int("layout", layout))
            .outputs(3)
    }

    #[test]
    fn lstm_forward_plain() {
        check(&lstm("forward", 1, 0, false));
    }

    #[test]
    fn lstm_all_inputs_each_direction() {
        check(&lstm("forward", 1, 0, true));
        check(&lstm("reverse", 1, 0, true));
        check(&lstm("bidirectional", 2, 0, true));
    }

    #[test]
    fn lstm_layout_1() {
        check(&lstm("bidirectional", 2, 1, true));
        check(&lstm("reverse", 1, 1, false));
    }

    #[test]
    fn lstm_only_y() {
        check(&lstm("forward", 1, 0, true).outputs(1));
    }

    fn gru(dir: &str, dirs: usize, layout: i64, lbr: i64) -> Case {
        let (s, b, i, h) = (3, 2, 3, 2);
        let x = if layout == 0 {
            vec![s, b, i]
        } else {
            vec![b, s, i]
        };
        let st = if layout == 0 {
            vec![dirs, b, h]
        } else {
            vec![b, dirs, h]
        };
        Case::new(
            "GRU",
            14,
            vec![
                In::Rand(x),
                In::Param(vec![dirs, 3 * h, i]),
                In::Param(vec![dirs, 3 * h, h]),
                In::Param(vec![dirs, 6 * h]),
                In::None,
                In::Rand(st),
            ],
        )
        .attr(string("direction", dir))
        .attr(int("hidden_size", h as i64))
        .attr(int("layout", layout))
        .attr(int("linear_before_reset", lbr))
        .outputs(2)
    }

    #[test]
    fn gru_directions_and_reset_modes() {
        for lbr in [0, 1] {
            check(&gru("forward", 1, 0, lbr));
            check(&gru("reverse", 1, 0, lbr));
            check(&gru("bidirectional", 2, 0, lbr));
            check(&gru("bidirectional", 2, 1, lbr));
        }
    }

    #[test]
    fn gru_without_bias_or_state() {
        check(
            &Case::new(
                "GRU",
                14,
                vec![
                    In::Rand(vec![4, 2, 3]),
                    In::Param(vec![1, 6, 3]),
                    In::Param(vec![1, 6, 2]),
                ],
            )
            .attr(int("hidden_size", 2)),
        );
    }

    #[test]
    fn rnn_tanh_and_relu() {
        let case = |dir: &str, dirs: usize| {
            Case::new(
                "RNN",
                14,
                vec![
                    In::Rand(vec![3, 2, 3]),
                    In::Param(vec![dirs, 2, 3]),
                    In::Param(vec![dirs, 2, 2]),
                    In::Param(vec![dirs, 4]),
                    In::None,
                    In::Rand(vec![dirs, 2, 2]),
                ],
            )
            .attr(string("direction", dir))
            .attr(int("hidden_size", 2))
            .outputs(2)
        };
        check(&case("forward", 1));
        check(&case("bidirectional", 2));
        let mut relu = case("reverse", 1);
        let mut a = string("activations", "");
        a.type_ = onnx_protobuf::attribute_proto::AttributeType::STRINGS.into();
        a.strings = vec![b"Relu".to_vec()];
        relu = relu.attr(a);
        check(&relu);
    }

    fn sig(x: f64) -> f64 {
        1.0 / (1.0 + (-x).exp())
    }

    /// `W·x` for a row block of a `[rows, cols]` matrix.
    fn mv(m: &[f64], row0: usize, rows: usize, cols: usize, x: &[f64]) -> Vec<f64> {
        (0..rows)
            .map(|r| (0..cols).map(|c| m[(row0 + r) * cols + c] * x[c]).sum())
            .collect()
    }

    /// LSTM and GRU (both reset modes) against the ONNX equations, one scalar at a time.
    #[test]
    fn cells_match_the_onnx_equations() {
        use crate::testing::tensors::{close, forward, seq, t, vals};
        let (sl, b, i, h) = (3, 2, 3, 2);
        let x = seq(sl * b * i, 0.7, 0.1);
        for (op, g) in [("LSTM", 4), ("GRU", 3)] {
            for lbr in [0, 1] {
                if op == "LSTM" && lbr == 1 {
                    continue;
                }
                let w = seq(g * h * i, 0.31, 0.2);
                let r = seq(g * h * h, 0.57, 0.9);
                let bias = seq(2 * g * h, 0.83, 0.4);
                let mut attrs = vec![int("hidden_size", h as i64)];
                if op == "GRU" {
                    attrs.push(int("linear_before_reset", lbr));
                }
                let y = forward(
                    if op == "LSTM" { "LSTM" } else { "GRU" },
                    14,
                    &attrs,
                    &[
                        Some(t(&x, &[sl, b, i])),
                        Some(t(&w, &[1, g * h, i])),
                        Some(t(&r, &[1, g * h, h])),
                        Some(t(&bias, &[1, 2 * g * h])),
                    ],
                    &[],
                    1,
                )
                .unwrap();
                let mut want = vec![];
                let mut hs = vec![vec![0.0; h]; b];
                let mut cs = vec![vec![0.0; h]; b];
                for step in 0..sl {
                    for n in 0..b {
                        let xt = &x[(step * b + n) * i..(step * b + n + 1) * i];
                        let hp = hs[n].clone();
                        let wx = |k: usize| mv(&w, k * h, h, i, xt);
                        let rh = |k: usize, v: &[f64]| mv(&r, k * h, h, h, v);
                        let wb = |k: usize, j: usize| bias[k * h + j];
                        let rb = |k: usize, j: usize| bias[(g + k) * h + j];
                        let mut hn = vec![0.0; h];
                        if op == "LSTM" {
                            let (a_i, a_o, a_f, a_c) = (wx(0), wx(1), wx(2), wx(3));
                            let (r_i, r_o, r_f, r_c) =
                                (rh(0, &hp), rh(1, &hp), rh(2, &hp), rh(3, &hp));
                            for j in 0..h {
                                let ig = sig(a_i[j] + r_i[j] + wb(0, j) + rb(0, j));
                                let og = sig(a_o[j] + r_o[j] + wb(1, j) + rb(1, j));
                                let fg = sig(a_f[j] + r_f[j] + wb(2, j) + rb(2, j));
                                let cg = (a_c[j] + r_c[j] + wb(3, j) + rb(3, j)).tanh();
                                cs[n][j] = fg * cs[n][j] + ig * cg;
                                hn[j] = og * cs[n][j].tanh();
                            }
                        } else {
                            let (a_z, a_r, a_h) = (wx(0), wx(1), wx(2));
                            let (r_z, r_r) = (rh(0, &hp), rh(1, &hp));
                            let z: Vec<f64> = (0..h)
                                .map(|j| sig(a_z[j] + r_z[j] + wb(0, j) + rb(0, j)))
                                .collect();
                            let rg: Vec<f64> = (0..h)
                                .map(|j| sig(a_r[j] + r_r[j] + wb(1, j) + rb(1, j)))
                                .collect();
                            let cand: Vec<f64> = if lbr == 0 {
                                let rhp: Vec<f64> = (0..h).map(|j| rg[j] * hp[j]).collect();
                                let u = rh(2, &rhp);
                                (0..h)
                                    .map(|j| (a_h[j] + u[j] + rb(2, j) + wb(2, j)).tanh())
                                    .collect()
                            } else {
                                let u = rh(2, &hp);
                                (0..h)
                                    .map(|j| (a_h[j] + rg[j] * (u[j] + rb(2, j)) + wb(2, j)).tanh())
                                    .collect()
                            };
                            for j in 0..h {
                                hn[j] = (1.0 - z[j]) * cand[j] + z[j] * hp[j];
                            }
                        }
                        hs[n] = hn.clone();
                        want.extend(hn);
                    }
                }
                close(&vals(&y[0]), &want, 1e-12);
            }
        }
    }

    #[test]
    fn partial_sequence_lengths() {
        for (op, g) in [("LSTM", 4), ("GRU", 3), ("RNN", 1)] {
            for dir in ["forward", "reverse", "bidirectional"] {
                let dirs = if dir == "bidirectional" { 2 } else { 1 };
                check(
                    &Case::new(
                        op,
                        14,
                        vec![
                            In::Rand(vec![4, 3, 2]),
                            In::Param(vec![dirs, g * 2, 2]),
                            In::Param(vec![dirs, g * 2, 2]),
                            In::Param(vec![dirs, 2 * g * 2]),
                            In::Ints(DType::I32, vec![3], vec![4, 2, 0]),
                            In::Rand(vec![dirs, 3, 2]),
                        ],
                    )
                    .attr(string("direction", dir))
                    .attr(int("hidden_size", 2))
                    .outputs(if op == "LSTM" { 3 } else { 2 }),
                );
            }
        }
    }

    /// Past its length an entry outputs zeros and its final state is the one at its last
    /// valid step: the same as running the shorter sequence alone.
    #[test]
    fn short_sequences_match_running_them_alone() {
        use crate::testing::tensors::{close, forward, seq, t, vals};
        let x = seq(4 * 2 * 3, 0.7, 0.1);
        let w = seq(4 * 2 * 3, 0.3, 0.2);
        let r = seq(4 * 2 * 2, 0.5, 0.9);
        let lens =
            candle_core::Tensor::from_vec(vec![4i64, 2], 2, &candle_core::Device::Cpu).unwrap();
        for dir in ["forward", "reverse"] {
            let attrs = [string("direction", dir), int("hidden_size", 2)];
            let both = forward(
                "LSTM",
                14,
                &attrs,
                &[
                    Some(t(&x, &[4, 2, 3])),
                    Some(t(&w, &[1, 8, 3])),
                    Some(t(&r, &[1, 8, 2])),
                    None,
                    Some(lens.clone()),
                ],
                &[],
                3,
            )
            .unwrap();
            // Entry 1 alone over its first 2 steps.
            let x1: Vec<f64> = (0..2)
                .flat_map(|s| x[(s * 2 + 1) * 3..(s * 2 + 2) * 3].to_vec())
                .collect();
            let alone = forward(
                "LSTM",
                14,
                &attrs,
                &[
                    Some(t(&x1, &[2, 1, 3])),
                    Some(t(&w, &[1, 8, 3])),
                    Some(t(&r, &[1, 8, 2])),
                ],
                &[],
                3,
            )
            .unwrap();
            let y = vals(&both[0]);
            let ya = vals(&alone[0]);
            for s in 0..4 {
                let got = &y[(s * 2 + 1) * 2..(s * 2 + 2) * 2];
                let want = if s < 2 {
                    ya[s * 2..s * 2 + 2].to_vec()
                } else {
                    vec![0.0, 0.0]
                };
                close(got, &want, 1e-12);
            }
            for k in [1, 2] {
                close(&vals(&both[k])[2..4], &vals(&alone[k]), 1e-12);
            }
        }
    }

    #[test]
    fn f32_agrees_with_f64() {
        use crate::testing::tensors::{same_in, seq, t};
        let r = |n: usize, a: f64, shape: &[usize]| Some(t(&seq(n, a, 0.3), shape));
        let inputs = |g: usize| {
            vec![
                r(3 * 2 * 3, 0.7, &[3, 2, 3]),
                r(2 * g * 2 * 3, 0.3, &[2, g * 2, 3]),
                r(2 * g * 2 * 2, 0.9, &[2, g * 2, 2]),
                r(2 * 2 * g * 2, 0.5, &[2, 2 * g * 2]),
                None,
                r(2 * 2 * 2, 0.2, &[2, 2, 2]),
            ]
        };
        let attrs = [string("direction", "bidirectional"), int("hidden_size", 2)];
        let dt = candle_core::DType::F32;
        same_in("LSTM", 14, &attrs, &inputs(4), &[], 3, dt, 1e-4);
        same_in("GRU", 14, &attrs, &inputs(3), &[], 2, dt, 1e-4);
        same_in("RNN", 14, &attrs, &inputs(1), &[], 2, dt, 1e-4);
    }
}
