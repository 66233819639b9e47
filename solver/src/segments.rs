//! Chains of segments: Rotor's dynamic program (Beaumont et al., "Optimal checkpointing for
//! heterogeneous chains", 2019) over the stages between the forward graph's split points,
//! with a menu of keep options per stage (the idea of Rockmate, ICML 2023: a block's own
//! schedules, chained by Rotor's program).
//!
//! # Structure
//!
//! A *split point* of the forward phase is a value that every later forward node reaches only
//! through it (no forward edge from an earlier value passes it). On transformers and residual
//! networks the residual stream after every residual add is one, so the forward phase is a
//! chain of *stages* `1..=L`: stage `k` reads the split value `x_{k-1}` and its own nodes and
//! ends with `x_k`. [`structure`] finds them on the [`Problem`] alone (no names, no exporter
//! scopes), assigns every backward node to the stage whose values it reads (the backward phase
//! in natural order, a stage never revisited), and says why when a problem has no such chain.
//!
//! # The program
//!
//! `Opt(s, t, m)`: the least cost of the backward of stages `t` down to `s`, with `x_{s-1}`
//! held by the caller, the gradients entering stage `t` resident and `m` bytes for the rest.
//! Its choices are Rotor's: run stages `s..s'-1` forward keeping only `x_{s'-1}` (*chain*),
//! then `Opt(s', t, m - |x_{s'-1}|)` and `Opt(s, s'-1, m)`; or run stage `s` forward keeping
//! what option `o` of its menu keeps (*keep*), then `Opt(s+1, t, m - kept)`, then stage `s`'s
//! backward, recomputing there what option `o` did not keep (each dropped value once, with
//! whatever it needs, right before its first backward reader). A stage's menu is the Pareto
//! frontier of its keep sets over (bytes kept, forward peak, backward peak, recomputation
//! cost): every subset of the values its backward reads is tried when there are at most
//! [`EXACT_DROPPABLE`] (a transformer block's half has 6 to 9), so the menu is the stage's
//! exact frontier; larger stages get every subset of their largest values and a greedy
//! ladder. Memory is counted in slots (a fraction of the budget; each held size rounded up to
//! whole slots, so the program never counts low), peaks and sizes are measured on the
//! stage's own nodes with the simulator's freeing rule.
//!
//! # Repeated blocks
//!
//! Two runs of stages `s..=t` whose stages have, one by one, the same parameters (costs, sizes,
//! peaks, menus) have the same `Opt` for every `m`: the program solves each distinct run once
//! (`Runs`). On a transformer, whose blocks repeat, that is a few runs per length instead of
//! one per pair of stages (1,358 instead of 19,306 on a 96-layer GPT-2), and the work saved
//! goes into a finer memory grid: up to [`MAX_SLOTS`] slots, as many as [`MAX_WORK`] allows
//! (3,648 on that model, where 256 was the most before, so a held residual no longer
//! counted as six times its size). The blocks are found by their parameters, not by names
//! or exporter scopes.
//!
//! # Long chains
//!
//! The grid must be finer than what a stage holds, or every held output counts as several. On a
//! chain of hundreds of stages the work allows only a coarse grid (a 384-layer GPT-2, 773
//! stages: 271 slots, a slot of six to thirty stage outputs). There [`solve_with`] limits the
//! chain choice to spans of at most `span` stages, the longest span whose grid is fine
//! ([`COARSE`]; at least [`MIN_SPAN`]): the program then reads only the suffix runs `(s, L)` and
//! the runs shorter than the span, so far fewer distinct runs and choices, and a grid up to
//! thirty times finer (on that model, at 0.1 / 0.25 / 0.5 of the way from the least peak to
//! store-all's: +19.48% / +9.46% / +0.78% against +26.66% / +22.42% / +21.99%, within 0.1%,
//! 1.0% and 0.0% of the time-point bound). The whole chain on its coarse grid runs only when
//! the span-limited program fits nothing.
//!
//! # How exact
//!
//! The answer is optimal among the schedules of that class (Rotor's single-recompute-per-stage
//! schedules over the stages, each stage forward either keeping nothing but its output or
//! one keep set of its menu), under the slot rounding; on a long chain whose grid is coarse,
//! among those whose recomputed chains span at most `span` stages. What it returns is a
//! compute order:
//! the schedule's frees come from [`with_frees`](crate::with_frees) and its peak and cost from
//! [`simulate`](crate::simulate), never from the program's own arithmetic. The program's
//! memory model counts high (slots rounded up, a stage's peak above what it holds, gradients
//! held across stages), so [`solve`] reads the table at several memory levels around the
//! budget and bisects between the highest level whose schedule fits and the lowest above it
//! that does not; the caller keeps the cheapest schedule that really fits, after dropping the
//! recomputations the budget does not need. How far that is from the best of every
//! schedule, whatever its class, is what [`crate::bound`] proves: within 0.6% of the time-point
//! bound on every deep fixture at every budget measured (`docs/bench/transformers.md`).

use crate::baselines::{split_points, Builder, Phases};
use crate::problem::{NodeId, Problem};
use crate::schedule::{simulate, Schedule};

/// Least number of stages for which the program is worth running.
const MIN_STAGES: usize = 3;
/// Upper limit on the program's work (table entries times choices) and on its table size;
/// the memory slots shrink to stay under both (timings: `docs/bench/transformers.md`).
const MAX_WORK: f64 = 6e8;
const MAX_ENTRIES: usize = 8_000_000;
/// Most pairs of stages the program indexes (a chain of about 2,800 stages).
const MAX_PAIRS: usize = 4_000_000;
/// Most and least memory slots of the table.
const MAX_SLOTS: usize = 8192;
const MIN_SLOTS: usize = 16;
/// Droppable values of a stage up to which every keep set is tried (2^12 sets).
const EXACT_DROPPABLE: usize = 12;
/// The table spans this multiple of the budget, so that memory levels a little above it can
/// be tried where the program's memory model is pessimistic.
const HEADROOM: f64 = 1.3;
/// Memory levels (fractions of the budget) the solution is read at; each is lowered to a
/// schedule and simulated.
const LEVELS: [f64; 17] = [
    1.3, 1.2, 1.1, 1.06, 1.03, 1.0, 0.98, 0.96, 0.94, 0.92, 0.9, 0.87, 0.84, 0.8, 0.75, 0.7, 0.6,
];
/// The grid is fine enough when a slot is at most this multiple of the median stage output
/// (a coarser one counts every held output as several; on the 384-layer GPT-2 at 0.25 of the
/// way, +9.63% with slots of 1.5 outputs, +9.46% with half an output and as with a quarter).
const COARSE: f64 = 0.5;
/// Shortest span of the chain choice when the grid of the whole chain is coarse: the span is
/// shortened until the grid is fine, but not below this.
const MIN_SPAN: usize = 16;
/// Fractions of a stage's droppable bytes its keep options drop (0 is its store-all).
const DROP_SHARES: [f64; 5] = [0.0, 0.25, 0.5, 0.75, 1.0];

/// The stage chain of a training problem.
#[derive(Debug, Clone)]
pub struct Segments {
    /// `fwd[k]`: stage `k`'s needed forward nodes in natural order (`fwd[0]`: the first split
    /// value alone, held throughout).
    pub fwd: Vec<Vec<NodeId>>,
    /// `x[k]`: stage `k`'s output, its last forward node.
    pub x: Vec<NodeId>,
    /// `bwd[k]`: the backward nodes assigned to stage `k`, in natural order (`bwd[0]`: those
    /// that read only the first split value, run last).
    pub bwd: Vec<Vec<NodeId>>,
}

impl Segments {
    /// Number of stages `L` (stage 0 is the input).
    pub fn stages(&self) -> usize {
        self.fwd.len() - 1
    }
}

/// The stage chain of `p`, or why it has none: no backward phase, or fewer than
/// [`MIN_STAGES`] split points.
pub fn structure(p: &Problem) -> std::result::Result<Segments, String> {
    let ph = Phases::of(p);
    if ph.forward.is_empty() {
        return Err("the problem has no backward phase".into());
    }
    let lin = &ph.forward;
    let split = split_points(p, lin);
    let cuts: Vec<usize> = (0..lin.len()).filter(|&i| split[i]).collect();
    if cuts.len() < MIN_STAGES + 1 {
        return Err(format!(
            "the forward phase has {} split points; at least {} make a chain of stages",
            cuts.len(),
            MIN_STAGES + 1
        ));
    }
    let l = cuts.len() - 1;
    let mut stage = vec![usize::MAX; p.len()];
    let mut fwd = vec![Vec::new(); l + 1];
    let mut x = vec![0; l + 1];
    fwd[0] = lin[..=cuts[0]].to_vec();
    for (k, w) in cuts.windows(2).enumerate() {
        fwd[k + 1] = lin[w[0] + 1..=w[1]].to_vec();
    }
    for (k, nodes) in fwd.iter().enumerate() {
        x[k] = *nodes.last().expect("a stage has at least its split value");
        for &v in nodes {
            stage[v] = k;
        }
    }
    let mut bwd = vec![Vec::new(); l + 1];
    let mut cur = l;
    for &b in &ph.backward {
        let latest = p
            .deps(b)
            .iter()
            .filter(|&&d| stage[d] != usize::MAX)
            .map(|&d| {
                if d == x[stage[d]] {
                    (stage[d] + 1).min(l)
                } else {
                    stage[d]
                }
            })
            .min()
            .unwrap_or(cur);
        cur = cur.min(latest);
        bwd[cur].push(b);
    }
    Ok(Segments { fwd, x, bwd })
}

/// One entry of a stage's menu: what its forward keeps for its backward.
#[derive(Debug, Clone)]
struct KeepOption {
    /// `keep[i]`: whether `fwd[k][i]` is kept after the stage's forward.
    keep: Vec<bool>,
    /// Bytes kept (the stage's output included).
    kept_bytes: u64,
    /// Peak of the stage's forward, with what it keeps, above what the caller holds.
    fwd_peak: u64,
    /// Peak of the stage's backward, recomputations included, above what the caller holds.
    bwd_peak: u64,
    /// Cost of the values the backward recomputes.
    recompute: f64,
}

/// What the program knows of a stage.
#[derive(Debug, Clone)]
struct Stage {
    fwd_cost: f64,
    bwd_cost: f64,
    out_bytes: u64,
    /// Peak of the stage's forward keeping only its output.
    chain_peak: u64,
    /// Bytes of the gradients resident when the stage's backward starts.
    grad_bytes: u64,
    options: Vec<KeepOption>,
}

/// Scratch for [`local_peak`], sized to the problem.
struct Scratch {
    last: Vec<usize>,
    counted: Vec<bool>,
    touched: Vec<NodeId>,
}

impl Scratch {
    fn new(n: usize) -> Self {
        Scratch {
            last: vec![usize::MAX; n],
            counted: vec![false; n],
            touched: Vec::new(),
        }
    }
}

/// Peak bytes of running `seq` with `live` resident at the start, under the simulator's rule
/// (a value is freed after its last reader in `seq`, unless `keep` says a later step reads
/// it; a live value nobody here reads and nobody keeps is freed first). Values neither live
/// nor computed here (what the caller holds) are not counted.
fn local_peak(
    p: &Problem,
    seq: &[NodeId],
    live: &[NodeId],
    keep: impl Fn(NodeId) -> bool,
    s: &mut Scratch,
) -> u64 {
    for (i, &v) in seq.iter().enumerate() {
        for &d in p.deps(v) {
            if s.last[d] == usize::MAX {
                s.touched.push(d);
            }
            s.last[d] = i;
        }
    }
    let mut mem = 0u64;
    for &v in live {
        if !s.counted[v] {
            s.counted[v] = true;
            s.touched.push(v);
            if s.last[v] != usize::MAX || keep(v) {
                mem += p.bytes(v);
            }
        }
    }
    let mut peak = mem;
    for (i, &v) in seq.iter().enumerate() {
        if !s.counted[v] {
            s.counted[v] = true;
            s.touched.push(v);
        }
        mem += p.bytes(v);
        peak = peak.max(mem);
        for &d in p.deps(v) {
            if s.counted[d] && s.last[d] == i && !keep(d) {
                mem -= p.bytes(d);
            }
        }
        let read_later = s.last[v] != usize::MAX && s.last[v] > i;
        if !read_later && !keep(v) {
            mem -= p.bytes(v);
        }
    }
    for &v in &s.touched {
        s.last[v] = usize::MAX;
        s.counted[v] = false;
    }
    s.touched.clear();
    peak
}

/// Where each node sits: its stage, its position in the stage's forward, the earliest
/// backward stage reading it (`usize::MAX` for none).
struct Ctx {
    stage_of: Vec<usize>,
    pos: Vec<usize>,
    min_reader: Vec<usize>,
}

/// The stage parameters the program needs.
fn stages(p: &Problem, seg: &Segments) -> Vec<Stage> {
    let n = p.len();
    let l = seg.stages();
    let mut stage_of = vec![usize::MAX; n];
    for (k, nodes) in seg.fwd.iter().enumerate() {
        for &v in nodes {
            stage_of[v] = k;
        }
    }
    let mut bstage = vec![usize::MAX; n];
    for (k, nodes) in seg.bwd.iter().enumerate() {
        for &b in nodes {
            bstage[b] = k;
        }
    }
    // The earliest backward stage that reads each value.
    let min_reader: Vec<usize> = (0..n)
        .map(|v| {
            p.users(v)
                .iter()
                .filter(|&&u| bstage[u] != usize::MAX)
                .map(|&u| bstage[u])
                .min()
                .unwrap_or(usize::MAX)
        })
        .collect();
    // grads[k]: the backward values of later stages that stage k or an earlier one reads.
    let mut grads: Vec<Vec<NodeId>> = vec![Vec::new(); l + 1];
    for (k, nodes) in seg.bwd.iter().enumerate() {
        for &b in nodes {
            if min_reader[b] < k {
                for g in grads.iter_mut().take(k).skip(min_reader[b]) {
                    g.push(b);
                }
            }
        }
    }
    let mut pos = vec![usize::MAX; n];
    for nodes in &seg.fwd {
        for (i, &v) in nodes.iter().enumerate() {
            pos[v] = i;
        }
    }
    let ctx = Ctx {
        stage_of,
        pos,
        min_reader,
    };
    let mut scratch = Scratch::new(n);
    let mut out = Vec::with_capacity(l + 1);
    for (k, stage_grads) in grads.iter().enumerate() {
        let fwd = &seg.fwd[k];
        let xk = seg.x[k];
        let fwd_cost: f64 = fwd.iter().map(|&v| p.cost(v)).sum();
        let bwd_cost: f64 = seg.bwd[k].iter().map(|&v| p.cost(v)).sum();
        let chain_peak = local_peak(p, fwd, &[], |v| v == xk, &mut scratch);
        let grad_bytes = stage_grads.iter().map(|&g| p.bytes(g)).sum();
        let saved: Vec<bool> = fwd
            .iter()
            .map(|&v| v == xk || p.users(v).iter().any(|&u| bstage[u] != usize::MAX))
            .collect();
        let options = keep_options(p, seg, k, &saved, &ctx, stage_grads, &mut scratch);
        out.push(Stage {
            fwd_cost,
            bwd_cost,
            out_bytes: p.bytes(xk),
            chain_peak,
            grad_bytes,
            options,
        });
    }
    out
}

/// Stage `k`'s backward when the forward kept `keep`: each value of the stage a backward node
/// reads that was not kept is recomputed (with what it needs of the stage) right before it.
/// Returns the compute order and the cost of the recomputations.
fn backward_order(
    p: &Problem,
    seg: &Segments,
    k: usize,
    keep: &[bool],
    ctx: &Ctx,
) -> (Vec<NodeId>, f64) {
    let stage_of = &ctx.stage_of;
    let mut resident: Vec<bool> = keep.to_vec();
    let is_resident = |resident: &[bool], v: NodeId| resident[ctx.pos[v]];
    let mut seq = Vec::new();
    let mut cost = 0.0;
    let mut stack = Vec::new();
    let mut missing = Vec::new();
    for &b in &seg.bwd[k] {
        missing.clear();
        for &d in p.deps(b) {
            if stage_of[d] == k && !is_resident(&resident, d) {
                stack.push(d);
            }
        }
        while let Some(v) = stack.pop() {
            if !is_resident(&resident, v) {
                resident[ctx.pos[v]] = true;
                missing.push(v);
                for &d in p.deps(v) {
                    if stage_of[d] == k && !is_resident(&resident, d) {
                        stack.push(d);
                    }
                }
            }
        }
        missing.sort_unstable();
        for &v in &missing {
            cost += p.cost(v);
            seq.push(v);
        }
        seq.push(b);
    }
    (seq, cost)
}

/// Stage `k`'s menu: the Pareto frontier of its keep sets over (bytes kept, forward peak,
/// backward peak, recomputation cost). A keep set keeps the stage's output and any subset of
/// its other values the backward reads (its *droppable* values; a graph input is never
/// recomputed): with at most [`EXACT_DROPPABLE`] droppable values every subset is tried, so the
/// menu is the stage's exact frontier within the class; with more, every subset of the
/// [`EXACT_DROPPABLE`] largest (the rest kept) and keep sets that drop growing shares of the
/// droppable bytes, cheapest recomputation per byte first.
#[allow(clippy::too_many_arguments)]
fn keep_options(
    p: &Problem,
    seg: &Segments,
    k: usize,
    saved: &[bool],
    ctx: &Ctx,
    grads: &[NodeId],
    scratch: &mut Scratch,
) -> Vec<KeepOption> {
    let fwd = &seg.fwd[k];
    let xk = seg.x[k];
    let mut droppable: Vec<(f64, usize)> = fwd
        .iter()
        .enumerate()
        .filter(|&(i, &v)| saved[i] && v != xk && !p.deps(v).is_empty())
        .map(|(i, &v)| {
            // Recomputing v alone, from what the store-all keeps.
            let own: f64 = p.cost(v)
                + p.deps(v)
                    .iter()
                    .filter(|&&d| ctx.stage_of[d] == k && !saved[ctx.pos[d]])
                    .map(|&d| p.cost(d))
                    .sum::<f64>();
            (own / p.bytes(v).max(1) as f64, i)
        })
        .collect();
    droppable.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    let mut sets: Vec<Vec<bool>> = Vec::new();
    // Every subset of the largest droppable values.
    let mut largest: Vec<usize> = droppable.iter().map(|&(_, i)| i).collect();
    largest.sort_by_key(|&i| (std::cmp::Reverse(p.bytes(fwd[i])), i));
    largest.truncate(EXACT_DROPPABLE);
    for mask in 0u32..(1u32 << largest.len()) {
        let mut keep = saved.to_vec();
        for (b, &i) in largest.iter().enumerate() {
            if mask & (1 << b) != 0 {
                keep[i] = false;
            }
        }
        sets.push(keep);
    }
    if droppable.len() > EXACT_DROPPABLE {
        let total: u64 = droppable.iter().map(|&(_, i)| p.bytes(fwd[i])).sum();
        let mut keep = saved.to_vec();
        let (mut taken, mut dropped_bytes) = (0usize, 0u64);
        for share in DROP_SHARES {
            let target = (total as f64 * share).ceil() as u64;
            while taken < droppable.len() && dropped_bytes < target {
                let i = droppable[taken].1;
                keep[i] = false;
                dropped_bytes += p.bytes(fwd[i]);
                taken += 1;
            }
            sets.push(keep.clone());
        }
    }
    let mut options: Vec<KeepOption> = Vec::with_capacity(sets.len());
    for keep in sets {
        let kept: Vec<NodeId> = fwd
            .iter()
            .zip(&keep)
            .filter(|(_, &kp)| kp)
            .map(|(&v, _)| v)
            .collect();
        let kept_bytes = kept.iter().map(|&v| p.bytes(v)).sum();
        let fwd_peak = local_peak(
            p,
            fwd,
            &[],
            |v| ctx.stage_of[v] == k && keep[ctx.pos[v]],
            scratch,
        );
        let (order, recompute) = backward_order(p, seg, k, &keep, ctx);
        let mut live = kept;
        live.extend_from_slice(grads);
        let bwd_peak = local_peak(p, &order, &live, |v| ctx.min_reader[v] < k, scratch);
        options.push(KeepOption {
            keep,
            kept_bytes,
            fwd_peak,
            bwd_peak,
            recompute,
        });
    }
    pareto(options)
}

/// The options no other is at least as good as in every respect (of equal ones, the first).
fn pareto(mut options: Vec<KeepOption>) -> Vec<KeepOption> {
    let key = |o: &KeepOption| (o.kept_bytes, o.fwd_peak, o.bwd_peak);
    options.sort_by(|a, b| {
        key(a)
            .cmp(&key(b))
            .then(a.recompute.total_cmp(&b.recompute))
    });
    let dominates = |b: &KeepOption, a: &KeepOption| {
        b.kept_bytes <= a.kept_bytes
            && b.fwd_peak <= a.fwd_peak
            && b.bwd_peak <= a.bwd_peak
            && b.recompute <= a.recompute
    };
    // Sorted so that a dominating option comes first.
    let mut menu: Vec<KeepOption> = Vec::new();
    for a in options {
        if !menu.iter().any(|b| dominates(b, &a)) {
            menu.push(a);
        }
    }
    menu
}

/// Which stage runs are the same to the program: `id(s, t)` names the run of stages `s..=t`,
/// equal for two runs whose stages have, one by one, the same parameters (costs, sizes, peaks,
/// menus). The program solves each distinct run once: on a transformer, whose blocks repeat,
/// a few per length instead of one per pair of stages, which pays for a finer memory grid.
struct Runs {
    /// `offset[s]`: index of the pair `(s, s)`; `(s, t)` is `offset[s] + t - s`.
    offset: Vec<usize>,
    /// Per pair, its run's id.
    id: Vec<u32>,
    /// Per id, a pair `(s, t)` that has it, the first met in order of length.
    first: Vec<(usize, usize)>,
}

impl Runs {
    /// The runs the program over `st` reads when its chain choice spans at most `span` stages:
    /// the suffixes `(s, L)` and the runs shorter than `span` (every run when `span` is at least
    /// `L`).
    fn new(st: &[Stage], span: usize) -> Self {
        let l = st.len() - 1;
        // Stages with equal parameters get one class.
        let mut classes: std::collections::HashMap<Vec<u64>, u32> = Default::default();
        let class: Vec<u32> = st
            .iter()
            .map(|stage| {
                let key = stage.signature();
                let next = classes.len() as u32;
                *classes.entry(key).or_insert(next)
            })
            .collect();
        let mut offset = vec![0usize; l + 2];
        for s in 2..=l + 1 {
            offset[s] = offset[s - 1] + (l - (s - 1) + 1);
        }
        let pairs = l * (l + 1) / 2;
        let mut id = vec![u32::MAX; pairs];
        let mut first = Vec::new();
        // A run is its first stage's class followed by the rest of the run.
        let mut cons: std::collections::HashMap<(u32, u32), u32> = Default::default();
        for len in 0..l {
            for s in 1..=l - len {
                let t = s + len;
                if t < l && len >= span {
                    continue;
                }
                let rest = if s < t {
                    id[offset[s + 1] + t - (s + 1)]
                } else {
                    u32::MAX
                };
                let next = first.len() as u32;
                let got = *cons.entry((class[s], rest)).or_insert(next);
                if got == next {
                    first.push((s, t));
                }
                id[offset[s] + len] = got;
            }
        }
        Runs { offset, id, first }
    }

    fn of(&self, s: usize, t: usize) -> usize {
        self.id[self.offset[s] + t - s] as usize
    }
}

impl Stage {
    /// Every parameter the program reads, as bits: equal signatures, equal answers.
    fn signature(&self) -> Vec<u64> {
        let mut k = vec![
            self.fwd_cost.to_bits(),
            self.bwd_cost.to_bits(),
            self.out_bytes,
            self.chain_peak,
            self.grad_bytes,
            self.options.len() as u64,
        ];
        for o in &self.options {
            k.extend([o.kept_bytes, o.fwd_peak, o.bwd_peak, o.recompute.to_bits()]);
        }
        k
    }
}

/// The program's table: `cost[id, m]` per distinct run and the choice that reaches it.
struct Table {
    slots: usize,
    slot: u64,
    runs: Runs,
    cost: Vec<f64>,
    /// `-1 - o`: keep with option `o`; `d > 0`: chain up to stage `s + d`; 0: infeasible.
    choice: Vec<i32>,
}

impl Table {
    fn at(&self, s: usize, t: usize) -> usize {
        self.runs.of(s, t) * (self.slots + 1)
    }
}

fn slots_of(bytes: u64, slot: u64) -> usize {
    bytes.div_ceil(slot) as usize
}

/// The grid: as many memory slots as the work and table limits allow for these runs, with
/// chains of at most `span` stages.
fn grid(st: &[Stage], runs: &Runs, span: usize) -> Option<usize> {
    let work: f64 = runs
        .first
        .iter()
        .map(|&(s, t)| (st[s].options.len() + (t - s + 1).min(span)) as f64)
        .sum();
    let distinct = runs.first.len();
    if distinct * (MIN_SLOTS + 1) > MAX_ENTRIES {
        return None;
    }
    Some(
        ((MAX_WORK / work.max(1.0)) as usize)
            .min(MAX_ENTRIES / distinct.max(1) - 1)
            .clamp(MIN_SLOTS, MAX_SLOTS),
    )
}

/// The program over the runs, with memory in `slots` slots of `top_bytes` in all, and the
/// chain choice over at most `span` stages.
fn run_program(st: &[Stage], runs: Runs, slots: usize, top_bytes: u64, span: usize) -> Table {
    let slot = top_bytes.div_ceil(slots as u64).max(1);
    let width = slots + 1;
    let distinct = runs.first.len();
    let mut t = Table {
        slots,
        slot,
        runs,
        cost: vec![f64::INFINITY; distinct * width],
        choice: vec![0; distinct * width],
    };
    let mut row = vec![f64::INFINITY; width];
    let mut row_choice = vec![0i32; width];
    for r in 0..distinct {
        // In order of length: every shorter run is solved before.
        let (s, e) = t.runs.first[r];
        row.fill(f64::INFINITY);
        row_choice.fill(0);
        let stage = &st[s];
        // Keep: stage s forward with option o, the rest, then stage s's backward.
        let sub = (s < e).then(|| t.at(s + 1, e));
        for (o, opt) in stage.options.iter().enumerate() {
            let need = (st[e].grad_bytes + opt.fwd_peak).max(opt.bwd_peak);
            let held = slots_of(opt.kept_bytes, slot);
            let lo = slots_of(need, slot).max(if s < e { held } else { 0 });
            let own = stage.fwd_cost + stage.bwd_cost + opt.recompute;
            for m in lo..=slots {
                let c = match sub {
                    Some(base) => own + t.cost[base + m - held],
                    None => own,
                };
                if c < row[m] {
                    row[m] = c;
                    row_choice[m] = -1 - o as i32;
                }
            }
        }
        // Chain: stages s..s2-1 forward keeping only x_{s2-1}.
        let mut peak = 0u64;
        let mut fwd_cost = 0.0;
        for s2 in s + 1..=e.min(s.saturating_add(span)) {
            let k = s2 - 1;
            let held_input = if k > s { st[k - 1].out_bytes } else { 0 };
            peak = peak.max(st[k].chain_peak + held_input);
            fwd_cost += st[k].fwd_cost;
            let held = slots_of(st[k].out_bytes, slot);
            let lo = slots_of(st[e].grad_bytes + peak, slot).max(held);
            if lo > slots {
                break;
            }
            let a = t.at(s2, e);
            let b = t.at(s, k);
            for m in lo..=slots {
                let c = fwd_cost + t.cost[a + m - held] + t.cost[b + m];
                if c < row[m] {
                    row[m] = c;
                    row_choice[m] = (s2 - s) as i32;
                }
            }
        }
        let at = r * width;
        t.cost[at..at + width].copy_from_slice(&row);
        t.choice[at..at + width].copy_from_slice(&row_choice);
    }
    t
}

/// Turns the program's answer at `(s, t, m)` into computes on the builder.
fn lower(
    seg: &Segments,
    st: &[Stage],
    tab: &Table,
    b: &mut Builder<'_>,
    (s, t, m): (usize, usize, usize),
) {
    let ch = tab.choice[tab.at(s, t) + m];
    if ch < 0 {
        let o = (-1 - ch) as usize;
        let opt = &st[s].options[o];
        b.ensure(&seg.fwd[s]);
        for (i, &v) in seg.fwd[s].iter().enumerate() {
            if !opt.keep[i] {
                b.drop_value(v);
            }
        }
        if s < t {
            let held = slots_of(opt.kept_bytes, tab.slot);
            lower(seg, st, tab, b, (s + 1, t, m - held));
        }
        for &v in &seg.bwd[s] {
            b.ensure(&[v]);
        }
    } else {
        let s2 = s + ch as usize;
        for k in s..s2 {
            b.ensure(&seg.fwd[k]);
            for &v in &seg.fwd[k] {
                if v != seg.x[k] {
                    b.drop_value(v);
                }
            }
            if k > s {
                b.drop_value(seg.x[k - 1]);
            }
        }
        let held = slots_of(st[s2 - 1].out_bytes, tab.slot);
        lower(seg, st, tab, b, (s2, t, m - held));
        b.drop_value(seg.x[s2 - 1]);
        lower(seg, st, tab, b, (s, s2 - 1, m));
    }
}

/// Schedules from the program at memory levels around `budget` (fixed bytes included), each a
/// compute order with the frees [`with_frees`](crate::with_frees) derives, distinct, in
/// decreasing memory level; empty when the problem has no chain of stages or nothing fits.
/// Their peaks and costs are for [`simulate`](crate::simulate) to tell.
pub fn solve(p: &Problem, budget: u64) -> Vec<Schedule> {
    let Ok(seg) = structure(p) else {
        return Vec::new();
    };
    solve_with(p, &seg, budget)
}

/// [`solve`] on a structure already found.
pub fn solve_with(p: &Problem, seg: &Segments, budget: u64) -> Vec<Schedule> {
    let l = seg.stages();
    let input: u64 = seg.fwd[0].iter().map(|&v| p.bytes(v)).sum();
    let Some(avail) = budget.checked_sub(p.fixed_bytes + input) else {
        return Vec::new();
    };
    if avail == 0 {
        return Vec::new();
    }
    let top = (avail as f64 * HEADROOM) as u64;
    let needed = Phases::of(p).needed;
    let mut out: Vec<Schedule> = Vec::new();
    let mut fits = false;
    // Whether a grid of `slots` is fine for stages whose median output is `median`.
    let fine =
        |slots: usize, median: u64| top.div_ceil(slots as u64) as f64 <= COARSE * median as f64;
    let tabled = l * (l + 1) / 2 <= MAX_PAIRS;
    let st = stages(p, seg);
    let median = median_output(&st);
    // The whole chain, on the grid its work allows.
    let whole = match tabled
        .then(|| Runs::new(&st, usize::MAX))
        .and_then(|runs| grid(&st, &runs, usize::MAX).map(|slots| (runs, slots)))
    {
        Some((runs, slots)) if fine(slots, median) => {
            let tab = run_program(&st, runs, slots, top, usize::MAX);
            read_levels(p, seg, &st, &tab, &needed, avail, budget, &mut out);
            return out;
        }
        coarse => coarse,
    };
    // Too coarse: the same stages with the chain choice over at most `span` stages, the
    // longest span whose grid is fine (at least MIN_SPAN): only the suffixes and the short runs
    // are solved, so the grid gets finer as the span gets shorter.
    if tabled && l > MIN_SPAN {
        let grid_at = |span: usize| {
            let runs = Runs::new(&st, span);
            grid(&st, &runs, span).map(|slots| (runs, slots))
        };
        let (mut lo, mut hi) = (MIN_SPAN, l);
        if grid_at(lo).is_some_and(|(_, slots)| fine(slots, median)) {
            while hi > lo + 1 {
                let mid = lo + (hi - lo) / 2;
                if grid_at(mid).is_some_and(|(_, slots)| fine(slots, median)) {
                    lo = mid;
                } else {
                    hi = mid;
                }
            }
        }
        if let Some((runs, slots)) = grid_at(lo) {
            let tab = run_program(&st, runs, slots, top, lo);
            fits |= read_levels(p, seg, &st, &tab, &needed, avail, budget, &mut out);
        }
    }
    // Nothing fits: the whole chain on its coarse grid, whose chains may span every stage.
    if !fits {
        if let Some((runs, slots)) = whole {
            let tab = run_program(&st, runs, slots, top, usize::MAX);
            read_levels(p, seg, &st, &tab, &needed, avail, budget, &mut out);
        }
    }
    out
}

/// The median size of the stages' outputs.
fn median_output(st: &[Stage]) -> u64 {
    let mut outputs: Vec<u64> = st[1..].iter().map(|s| s.out_bytes).collect();
    outputs.sort_unstable();
    outputs.get(outputs.len() / 2).copied().unwrap_or(1)
}

/// Lowers the program's answers at the memory levels around the budget ([`LEVELS`], then a
/// bisection) to schedules, adding the new ones to `out`; whether one of them fits.
#[allow(clippy::too_many_arguments)]
fn read_levels(
    p: &Problem,
    seg: &Segments,
    st: &[Stage],
    tab: &Table,
    needed: &[bool],
    avail: u64,
    budget: u64,
    out: &mut Vec<Schedule>,
) -> bool {
    let l = seg.stages();
    // The schedule at memory level `m` and whether its simulated peak fits the budget.
    let mut read = |m: usize| -> Option<bool> {
        if tab.choice[tab.at(1, l) + m] == 0 {
            return None;
        }
        let mut b = Builder::new(p);
        b.ensure(&seg.fwd[0]);
        lower(seg, st, tab, &mut b, (1, l, m));
        for &v in &seg.bwd[0] {
            b.ensure(&[v]);
        }
        let s = b.finish(needed);
        let fits = simulate(p, &s).is_ok_and(|x| x.peak_bytes <= budget);
        if !out.contains(&s) {
            out.push(s);
        }
        Some(fits)
    };
    // The levels, then a bisection between the highest that fits and the lowest above it
    // that does not: the program counts memory pessimistically (slots rounded up, a
    // stage's peak above what it holds), so the best schedule that fits usually lies a
    // little above the budget's own level.
    let (mut fit, mut over): (Option<usize>, Option<usize>) = (None, None);
    for f in LEVELS {
        let m = (((avail as f64 * f) as u64 / tab.slot) as usize).min(tab.slots);
        match read(m) {
            Some(true) => fit = fit.max(Some(m)),
            Some(false) if fit.is_none() => over = Some(m),
            _ => {}
        }
    }
    if let (Some(mut lo), Some(mut hi)) = (fit, over) {
        while hi > lo + 1 {
            let mid = lo + (hi - lo) / 2;
            if read(mid) == Some(true) {
                lo = mid;
            } else {
                hi = mid;
            }
        }
    }
    fit.is_some()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schedule::{simulate, store_all_peak};
    use crate::testutil::{residual_blocks, training_chain};

    /// Runs with every pair of stages its own id: what the program did before it shared them.
    fn unshared(st: &[Stage]) -> Runs {
        let l = st.len() - 1;
        let mut offset = vec![0usize; l + 2];
        for s in 2..=l + 1 {
            offset[s] = offset[s - 1] + (l - (s - 1) + 1);
        }
        let mut id = vec![0u32; l * (l + 1) / 2];
        let mut first = Vec::new();
        for len in 0..l {
            for s in 1..=l - len {
                id[offset[s] + len] = first.len() as u32;
                first.push((s, s + len));
            }
        }
        Runs { offset, id, first }
    }

    #[test]
    fn repeated_blocks_share_their_runs_and_the_answer_is_unchanged() {
        let p = residual_blocks(24);
        let seg = structure(&p).unwrap();
        let st = stages(&p, &seg);
        let l = st.len() - 1;
        let runs = Runs::new(&st, usize::MAX);
        // Identical blocks: a handful of distinct runs per length, not one per pair.
        assert!(
            runs.first.len() <= 4 * l,
            "{} runs for {l} stages",
            runs.first.len()
        );
        assert!(runs.first.len() < l * (l + 1) / 4);
        let top = store_all_peak(&p);
        let shared = run_program(&st, runs, 64, top, usize::MAX);
        let each = run_program(&st, unshared(&st), 64, top, usize::MAX);
        same_answers(&shared, &each, l, "shared runs");
    }

    /// The two tables give the whole chain the same cost at every memory level.
    fn same_answers(x: &Table, y: &Table, l: usize, what: &str) {
        for m in 0..=x.slots {
            let (a, b) = (x.cost[x.at(1, l) + m], y.cost[y.at(1, l) + m]);
            assert!(
                a == b || (a - b).abs() <= 1e-9 * a.abs(),
                "{what}, m {m}: {a} against {b}"
            );
        }
    }

    #[test]
    fn a_span_limited_program_reads_only_suffixes_and_short_runs() {
        let p = residual_blocks(40);
        let seg = structure(&p).unwrap();
        let st = stages(&p, &seg);
        let l = st.len() - 1;
        let top = store_all_peak(&p);
        for span in [1, 3, 8] {
            let runs = Runs::new(&st, span);
            let all = Runs::new(&st, usize::MAX);
            assert!(runs.first.len() < all.first.len(), "span {span}");
            let limited = run_program(&st, runs, 64, top, span);
            let every = run_program(&st, unshared(&st), 64, top, span);
            let free = run_program(&st, all, 64, top, usize::MAX);
            same_answers(&limited, &every, l, &format!("span {span}"));
            for m in 0..=64 {
                // A limit never helps.
                let a = limited.cost[limited.at(1, l) + m];
                assert!(a >= free.cost[free.at(1, l) + m], "span {span}, m {m}");
            }
        }
    }

    /// The cheapest schedule of `schedules` within `budget`.
    fn cheapest(p: &Problem, schedules: &[Schedule], budget: u64) -> f64 {
        schedules
            .iter()
            .map(|s| simulate(p, s).unwrap())
            .filter(|st| st.peak_bytes <= budget)
            .map(|st| st.compute_cost)
            .fold(f64::INFINITY, f64::min)
    }

    #[test]
    fn a_long_chain_with_a_coarse_grid_is_solved_with_short_spans_on_a_fine_one() {
        let p = residual_blocks(1200);
        let seg = structure(&p).unwrap();
        let l = seg.stages();
        let full = store_all_peak(&p);
        let input: u64 = seg.fwd[0].iter().map(|&v| p.bytes(v)).sum();
        let needed = Phases::of(&p).needed;
        for frac in [0.3, 0.6] {
            let budget = (full as f64 * frac) as u64;
            let avail = budget - p.fixed_bytes - input;
            let top = (avail as f64 * HEADROOM) as u64;
            // The whole chain on the grid its work allows: coarser than a stage's output.
            let st = stages(&p, &seg);
            let runs = Runs::new(&st, usize::MAX);
            let slots = grid(&st, &runs, usize::MAX).unwrap();
            assert!(
                top.div_ceil(slots as u64) as f64 > COARSE * st[l].out_bytes as f64,
                "{frac}: the grid is fine already ({slots} slots)"
            );
            let tab = run_program(&st, runs, slots, top, usize::MAX);
            let mut whole = Vec::new();
            read_levels(&p, &seg, &st, &tab, &needed, avail, budget, &mut whole);
            let before = cheapest(&p, &whole, budget);
            let after = cheapest(&p, &solve(&p, budget), budget);
            assert!(after < before, "{frac}: {after} against {before}");
        }
    }

    #[test]
    fn a_stage_menu_spans_keeping_everything_to_keeping_the_output() {
        let p = residual_blocks(6);
        let seg = structure(&p).unwrap();
        let st = stages(&p, &seg);
        // Every keep set of a block's stage (here: a, b or both dropped, or none) is matched
        // or beaten in every respect by an entry of the menu.
        let (k, stage) = st
            .iter()
            .enumerate()
            .find(|(_, s)| s.options.len() > 1)
            .expect("a stage with a choice");
        let cheapest = stage
            .options
            .iter()
            .map(|o| o.recompute)
            .fold(f64::INFINITY, f64::min);
        let least = stage.options.iter().map(|o| o.kept_bytes).min().unwrap();
        assert_eq!(
            cheapest, 0.0,
            "stage {k}: keeping everything is on the menu"
        );
        let out = p.bytes(seg.x[k]);
        assert_eq!(
            least, out,
            "stage {k}: keeping only the output is on the menu"
        );
    }

    #[test]
    fn a_training_chain_is_a_chain_of_stages() {
        let p = training_chain(8, |_| 1.0, |_| 10);
        let seg = structure(&p).unwrap();
        assert_eq!(seg.stages(), 7);
        let full = store_all_peak(&p);
        for frac in [1.0, 0.8, 0.6, 0.5] {
            let budget = (full as f64 * frac) as u64;
            for s in solve(&p, budget) {
                simulate(&p, &s).unwrap();
            }
        }
        // At store-all's peak the program keeps everything: nothing is recomputed.
        let best = solve(&p, full)
            .iter()
            .map(|s| simulate(&p, s).unwrap())
            .filter(|st| st.peak_bytes <= full)
            .map(|st| st.compute_cost)
            .fold(f64::INFINITY, f64::min);
        assert_eq!(best, p.base_cost());
    }
}
