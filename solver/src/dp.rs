//! Exact checkpointing of training chains: a Rotor-style dynamic program (Beaumont et al.,
//! "Optimal checkpointing for heterogeneous chains", 2019/2021) derived for this crate's
//! memory model, so its predicted peak and cost are exactly what [`simulate`](crate::simulate) measures.
//!
//! # Training chains
//!
//! A problem is a training chain when every node is needed and its nodes, in natural order, are
//! - a forward path `x_0 … x_{N-1}`: `x_0` reads nothing and `x_j` reads exactly `x_{j-1}`
//!   (the longest such prefix; a loss node reading only the last activation belongs to it),
//! - then `K ≥ 1` backward nodes `b_0 … b_{K-1}` with `K ≤ N-1`, where `b_i` is the backward
//!   of *stage* `j = N-2-i` and reads exactly `x_j`, `x_{j+1}` and (for `i ≥ 1`) `b_{i-1}`.
//!
//! So stage `j` maps `x_j` to `x_{j+1}` and its backward reads the stage's input, its output and
//! the incoming gradient; stages `N-2` down to `lo = N-1-K` have a backward node. This is the
//! shape of Checkmate's VGG graphs (whose loss reads the last activation).
//!
//! # The program
//!
//! `P(c, t, r, e, q, h)`: process backward stages `t, t-1, …, e` given that `x_c` is resident
//! (`c = -1`: nothing is, `x_0` is computed from scratch) and
//! - without `q`: the gradient of stage `t+1` is resident (when that stage exists) and
//!   `x_{t+1}` is resident when `r` (otherwise it is recomputed from `x_t` right before stage
//!   `t`);
//! - with `q` (stage `t+1` *pending*): stage `t+1` has not run; `x_{t+1}`, the gradient of stage
//!   `t+2` and, when `r`, `x_{t+2}` are resident (otherwise `x_{t+2}` is recomputed from
//!   `x_{t+1}` when the stage runs).
//!
//! When `e == c` the subproblem runs down to stage `c`, which reads `x_c`. When `e > c` the
//! caller does the stages below `e` and `x_c` is freed after its last use, unless `h` (then
//! `e = c+1` and `x_c` stays resident for the caller's pending stage `c`). Choices:
//! - `c = t`: run the pending stage if any, then stage `t` (recomputing `x_{t+1}` when `!r`);
//! - *now* (with `q`): run the pending stage, then `P(c, t, r', e, -, h)`, `r'` choosing whether
//!   `x_{t+1}` stays resident until stage `t`;
//! - *keep*: advance from `x_c` to `x_s` keeping only `x_s` (each intermediate freed after its
//!   successor is computed), run `P(s, t, r, e1, q, -)` with `x_c` held, then
//!   `P(c, e1-1, r', e, -, h)`, where `r'` says whether `x_{e1}` stays resident until stage
//!   `e1-1` or is freed after stage `e1` and recomputed (with `h` and `s = e`, the first part
//!   alone);
//! - *delay*: advance to `x_s` as in *keep*, run `P(s, t, r, s+1, q, h)` (stages down to `s+1`,
//!   `x_s` kept), then `P(c, s-1, r', e, q, h)` with stage `s` pending: the part below can
//!   recompute its activations while holding stage `s`'s inputs instead of its gradient;
//! - *drop* (not with `h`): advance from `x_c` to `x_s ≤ x_e` freeing `x_c` after its first
//!   reader, then `P(s, t, r, e, q, -)`.
//!
//! The whole step is `P(-1, N-2, -, lo, -, -)`. Instead of a discretized memory axis every state
//! keeps its exact Pareto frontier of (peak bytes, cost): a composition's peak is the max of the
//! advance peak and its parts' peaks (the first part shifted by the held `x_c`) and its cost the
//! sum, so nothing is rounded and predicted peak and cost are what
//! [`simulate`](crate::simulate) measures on the schedule [`with_frees`] derives from the
//! compute order.
//!
//! # How exact
//!
//! `tests/props.rs` compares the program with exhaustive search over *all* schedules (any
//! recomputation of any node, any order, any frees) on random chains of up to 4 stages at every
//! budget, and on random five-stage chains at one budget each (plus the five-stage chain that
//! needs *delay*). Release-mode sweeps we ran while deriving it: 4,000 random chains of up to 5 stages
//! at every budget and 300 chains of 5–6 stages at every other budget, with no difference in
//! minimum peak or in cost. Two choices go beyond Rotor and are needed: the Rotor recursion alone
//! (*keep* with `e1 = s`, `x_{t+1}` always kept) differed on 9 of 300 chains (a checkpoint read
//! by its own stage can be worth freeing and recomputing from scratch: *drop*, `e > c`), and
//! without *delay* 2 of 4,000 five-stage chains differed (holding a stage's inputs is cheaper
//! than holding its larger gradient while lower activations are recomputed). Beyond 6 stages
//! ([`PROVEN_STAGES`]) optimality is not proven, and not claimed: a 12-stage chain is known
//! where a schedule the program does not enumerate is cheaper (170 against 173).
//!
//! Cost: `O(N^5)` frontier merges for `N` forward nodes ([`DpMode::Exact`], the default up to 30
//! nodes; its time on VGG19 in `docs/bench/solver-tuning.md`); [`DpMode::Restricted`] (`e = max(c, lo)`, no delayed stages,
//! `O(N^3)`) for longer chains. Frontiers longer than 48 points are thinned (see `thin`).

use crate::error::{Result, SolverError};
use crate::problem::{NodeId, Problem};
use crate::schedule::{with_frees, Schedule};

/// A training chain's nodes (see the module documentation).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chain {
    /// `x_0 … x_{N-1}`.
    pub forward: Vec<NodeId>,
    /// `b_0 … b_{K-1}` in natural order; `b_i` is the backward of stage `N-2-i`.
    pub backward: Vec<NodeId>,
}

impl Chain {
    /// The lowest stage with a backward node (`N-1-K`).
    pub fn lowest_stage(&self) -> usize {
        self.forward.len() - 1 - self.backward.len()
    }

    /// The backward node of stage `j`.
    pub fn backward_of(&self, j: usize) -> NodeId {
        self.backward[self.forward.len() - 2 - j]
    }
}

/// Why `p` is not a training chain, or its chain.
pub fn chain_structure(p: &Problem) -> std::result::Result<Chain, String> {
    let n = p.len();
    if let Some(v) = p.needed().iter().position(|&x| !x) {
        return Err(format!(
            "node {:?} is not needed by any required node",
            p.nodes[v].id
        ));
    }
    let mut len = 0;
    while len < n {
        let ok = if len == 0 {
            p.deps(0).is_empty()
        } else {
            p.deps(len) == [len - 1]
        };
        if !ok {
            break;
        }
        len += 1;
    }
    if len < 2 {
        return Err("the forward part is not a path of at least two nodes".to_string());
    }
    let k = n - len;
    if k == 0 {
        return Err("there is no backward node after the forward path".to_string());
    }
    if k > len - 1 {
        return Err(format!(
            "{k} nodes follow the forward path of {len} nodes, but a chain has at most one \
             backward node per stage ({})",
            len - 1
        ));
    }
    for i in 0..k {
        let v = len + i;
        let j = len - 2 - i;
        let mut want = vec![j, j + 1];
        if i > 0 {
            want.push(v - 1);
        }
        if p.deps(v) != want.as_slice() {
            let name = |d: &NodeId| p.nodes[*d].id.clone();
            return Err(format!(
                "backward node {:?} (stage {j}) reads {:?}; a chain's stage-{j} backward reads exactly {:?}",
                p.nodes[v].id,
                p.deps(v).iter().map(name).collect::<Vec<_>>(),
                want.iter().map(name).collect::<Vec<_>>()
            ));
        }
    }
    if len > MAX_FORWARD {
        return Err(format!(
            "its forward path of {len} nodes is longer than the chain DP takes ({MAX_FORWARD}: \
             its (N+1)·N²·8 frontiers grow as N³ in memory and time, and no clock stops it)"
        ));
    }
    Ok(Chain {
        forward: (0..len).collect(),
        backward: (len..n).collect(),
    })
}

/// The problem's training chain, when it is one (see the module documentation).
pub fn as_training_chain(p: &Problem) -> Option<Chain> {
    chain_structure(p).ok()
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Choice {
    Base,
    Now { r1: bool },
    Keep { s: usize, e1: usize, r2: bool },
    KeepLast { s: usize },
    KeepPending { s: usize, r2: bool },
    Drop { s: usize },
}

#[derive(Debug, Clone, Copy, PartialEq)]
struct Pt {
    peak: u64,
    cost: f64,
    choice: Choice,
}

/// Cost of the cheapest point with peak ≤ `x`, or `None`.
fn eval(front: &[Pt], x: u64) -> Option<&Pt> {
    let k = front.partition_point(|p| p.peak <= x);
    k.checked_sub(1).and_then(|i| front.get(i))
}

fn improves(cost: f64, best: f64) -> bool {
    cost < best - 1e-9 * best.abs().max(1.0)
}

/// Lower envelope of two point lists sorted by increasing peak (each with non-increasing
/// cost) into `out`: increasing peak, strictly decreasing cost. Linear time.
fn merge_envelope(a: &[Pt], b: &[Pt], out: &mut Vec<Pt>) {
    out.clear();
    let (mut i, mut j) = (0, 0);
    while i < a.len() || j < b.len() {
        let take_a = match (a.get(i), b.get(j)) {
            (Some(x), Some(y)) => (x.peak, x.cost) <= (y.peak, y.cost),
            (Some(_), None) => true,
            _ => false,
        };
        let q = if take_a {
            i += 1;
            a[i - 1]
        } else {
            j += 1;
            b[j - 1]
        };
        if out.last().is_none_or(|l| improves(q.cost, l.cost)) {
            out.push(q);
        }
    }
}

/// Chains with more forward nodes than this are not taken (not a training chain to
/// [`as_training_chain`]; `auto` plans them as any graph): the program keeps `(N+1)·N²·8`
/// frontiers whatever the mode, so memory and time grow as `N³` and no clock stops it (600
/// forward nodes asked for 41 GB and aborted the process; 200 took 68 s and 1.5 GB at a 5 s
/// limit). At 100: 0.2 GB and 4.5 s (`remat plan` of a 100-stage chain at 0.7x).
pub const MAX_FORWARD: usize = 100;

/// Chains with at most this many backward stages are the ones the exhaustive comparisons
/// cover (module documentation, "How exact"): only there is the exact program's answer called
/// optimal. Beyond, it is the least cost of the schedules it enumerates, and not always the
/// least of all: a 12-stage chain at one budget costs 173 by the program and 170 by the MILP
/// and by exhaustive search (`solver/tests/it/ilp.rs`,
/// `the_chain_dp_is_not_called_optimal_beyond_the_stages_it_is_proven_for`).
pub const PROVEN_STAGES: usize = 6;

/// Chains with more forward nodes than this use the restricted program (`e = max(c, lo)`: a
/// checkpoint read by a stage is held until that stage), `O(N^3)` instead of `O(N^5)`.
const GENERAL_MAX: usize = 30;

/// Frontiers longer than this are thinned (see [`thin`]).
const MAX_FRONT: usize = 48;

/// Keeps the lowest-peak point of each of `MAX_FRONT / 2` equal peak ranges, and the cheapest
/// point. Every kept point is exact; a budget between two kept points gets the lower one's
/// (costlier) schedule, so the minimum peak stays exact and only costs can be suboptimal.
fn thin(front: Vec<Pt>) -> Vec<Pt> {
    let (Some(first), Some(last)) = (front.first().copied(), front.last().copied()) else {
        return front;
    };
    let buckets = (MAX_FRONT / 2) as u64;
    let width = ((last.peak - first.peak) / buckets).max(1);
    let mut out: Vec<Pt> = Vec::with_capacity(MAX_FRONT / 2 + 2);
    for q in front {
        let b = (q.peak - first.peak) / width;
        if out
            .last()
            .is_none_or(|l| (l.peak - first.peak) / width != b)
        {
            out.push(q);
        }
    }
    if out.last().is_some_and(|l| l.peak != last.peak) {
        out.push(last);
    }
    out
}

/// The DP over one chain.
struct Dp<'a> {
    chain: &'a Chain,
    a: Vec<u64>,
    f: Vec<f64>,
    /// Indexed by stage.
    d: Vec<u64>,
    g: Vec<f64>,
    lo: usize,
    n: usize,
    /// Points above this peak (relative bytes) are useless and dropped.
    cap: u64,
    /// Whether some frontier was thinned (the result may then be suboptimal).
    thinned: bool,
    /// Whether subproblems may end above their checkpoint's stage (`e > c` for `c ≥ lo`).
    general: bool,
    /// `pair_max[i * n + s]`: the largest `a[k-1] + a[k]` for `i < k ≤ s` (0 when none).
    pair_max: Vec<u64>,
    /// Prefix sums of forward costs.
    fsum: Vec<f64>,
    /// `fronts[state(c, t, e, r)]`.
    fronts: Vec<Vec<Pt>>,
}

impl<'a> Dp<'a> {
    fn new(p: &Problem, chain: &'a Chain, cap: u64, mode: DpMode) -> Self {
        let n = chain.forward.len();
        let lo = chain.lowest_stage();
        let a_vec: Vec<u64> = chain.forward.iter().map(|&v| p.bytes(v)).collect();
        let f_vec: Vec<f64> = chain.forward.iter().map(|&v| p.cost(v)).collect();
        let mut d = vec![0; n];
        let mut g = vec![0.0; n];
        for j in lo..n - 1 {
            let v = chain.backward_of(j);
            d[j] = p.bytes(v);
            g[j] = p.cost(v);
        }
        let mut pair_max = vec![0u64; n * n];
        for i in 0..n {
            let mut m = 0;
            for k in (i + 1)..n {
                m = m.max(a_vec[k - 1] + a_vec[k]);
                pair_max[i * n + k] = m;
            }
        }
        let mut fsum = vec![0.0; n + 1];
        for k in 0..n {
            fsum[k + 1] = fsum[k] + f_vec[k];
        }
        let (a, f) = (a_vec, f_vec);
        let mut dp = Dp {
            pair_max,
            fsum,
            chain,
            a,
            f,
            d,
            g,
            lo,
            n,
            cap,
            thinned: false,
            general: match mode {
                DpMode::Auto => n <= GENERAL_MAX,
                DpMode::Exact => true,
                DpMode::Restricted => false,
            },
            fronts: vec![Vec::new(); (n + 1) * n * n * 8],
        };
        dp.solve();
        dp
    }

    #[allow(clippy::too_many_arguments)]
    fn state(&self, c: isize, t: usize, e: usize, r: bool, q: bool, h: bool) -> usize {
        (((((c + 1) as usize * self.n + t) * self.n + e) * 2 + r as usize) * 2 + q as usize) * 2
            + h as usize
    }

    fn front(&self, c: isize, t: usize, e: usize, r: bool, q: bool, h: bool) -> &[Pt] {
        &self.fronts[self.state(c, t, e, r, q, h)]
    }

    /// Bytes of the gradient of stage `j`, 0 when the stage has no backward node.
    fn dsz(&self, j: usize) -> u64 {
        if j >= self.lo && j + 2 <= self.n {
            self.d[j]
        } else {
            0
        }
    }

    fn xc(&self, c: isize) -> u64 {
        if c >= 0 {
            self.a[c as usize]
        } else {
            0
        }
    }

    /// Entry memory of `P(c, t, r, e, q, h)`: `x_c`; when stage `t+1` is pending (`q`) its
    /// inputs `x_{t+1}`, `x_{t+2}` (when `r`) and the gradient of stage `t+2`; otherwise
    /// `x_{t+1}` (when `r`) and the gradient of stage `t+1`.
    fn entry(&self, c: isize, t: usize, r: bool, q: bool) -> u64 {
        if q {
            let x2 = if r { self.a[t + 2] } else { 0 };
            self.xc(c) + self.a[t + 1] + x2 + self.dsz(t + 2)
        } else {
            let xt = if r { self.a[t + 1] } else { 0 };
            self.xc(c) + xt + self.dsz(t + 1)
        }
    }

    fn solve(&mut self) {
        let top = self.n - 2;
        let flags: &[bool] = if self.general {
            &[false, true]
        } else {
            &[false]
        };
        for len in 0..=(top + 1) {
            for c in -1..=(top as isize) {
                let t = c + len as isize;
                if t < 0 || t as usize > top || (t as usize) < self.lo {
                    continue;
                }
                let t = t as usize;
                let e_min = self.lo.max(c.max(0) as usize);
                let e_max = if self.general { t } else { e_min };
                for e in e_min..=e_max {
                    for &h in flags {
                        // Holding x_c to the exit only serves a pending stage c.
                        if h && (c < self.lo as isize || e != (c + 1) as usize) {
                            continue;
                        }
                        // Non-pending states first: "run the pending stage now" reads them.
                        for &q in flags {
                            if q && t + 1 > top {
                                continue;
                            }
                            for r in [true, false] {
                                if !q && t == top && r {
                                    continue;
                                }
                                let mut front = self.options(c, t, e, r, q, h);
                                front.retain(|x| x.peak <= self.cap);
                                if front.len() > MAX_FRONT {
                                    front = thin(front);
                                    self.thinned = true;
                                }
                                let st = self.state(c, t, e, r, q, h);
                                self.fronts[st] = front;
                            }
                        }
                    }
                }
            }
        }
    }

    /// Advance from `x_c` to `x_s` keeping only `x_s`: (peak, cost). `e` is the entry memory;
    /// `dies`: `x_c` is freed after its first reader.
    fn advance(&self, c: isize, s: usize, e: u64, dies: bool) -> (u64, f64) {
        let first = (c + 1) as usize;
        let pairs = self.pair_max[first * self.n + s];
        let cost = self.fsum[s + 1] - self.fsum[first];
        let peak = if dies {
            e - self.xc(c) + (self.xc(c) + self.a[first]).max(pairs)
        } else {
            e + self.a[first].max(pairs)
        };
        (peak, cost)
    }

    /// Running the pending stage `t+1` (after recomputing `x_{t+2}` from `x_{t+1}` when `!r`):
    /// (peak, cost, memory after it with `x_{t+2}` and the old gradient freed, minus `x_c`).
    fn pending_run(&self, c: isize, t: usize, r: bool) -> (u64, f64) {
        let en = self.entry(c, t, r, true);
        let (pre, pre_cost) = if r {
            (0, 0.0)
        } else {
            (self.a[t + 2], self.f[t + 2])
        };
        (en + pre + self.d[t + 1], pre_cost + self.g[t + 1])
    }

    /// Pareto frontier of `P(c, t, r, e, q, h)`: stages `t` down to `e` with `x_c` resident at
    /// entry (held to the end when `e == c`, where stage `c` reads it, or when `h`, for a
    /// caller's pending stage `c`; otherwise freed after its last use); with `q`, stage `t+1`
    /// has not run yet and its inputs are resident.
    fn options(&self, c: isize, t: usize, e: usize, r: bool, q: bool, h: bool) -> Vec<Pt> {
        let en = self.entry(c, t, r, q);
        if c == t as isize {
            let (peak, cost) = if q {
                let (p1, c1) = self.pending_run(c, t, r);
                let after = self.xc(c) + self.a[t + 1] + self.dsz(t + 1);
                (p1.max(after + self.d[t]), c1 + self.g[t])
            } else if r {
                (en + self.d[t], self.g[t])
            } else {
                (en + self.a[t + 1] + self.d[t], self.f[t + 1] + self.g[t])
            };
            return vec![Pt {
                peak,
                cost,
                choice: Choice::Base,
            }];
        }
        let zero = [Pt {
            peak: 0,
            cost: 0.0,
            choice: Choice::Base,
        }];
        let mut acc: Vec<Pt> = Vec::new();
        let mut pts: Vec<Pt> = Vec::new();
        let mut merged: Vec<Pt> = Vec::new();
        let mut absorb = |pts: &mut Vec<Pt>| {
            merge_envelope(&acc, pts, &mut merged);
            std::mem::swap(&mut acc, &mut merged);
            pts.clear();
        };
        if q {
            // Run the pending stage now; keep x_{t+1} for stage t or free it and recompute.
            let now = self.pending_run(c, t, r);
            for r1 in [true, false] {
                let f1 = self.front(c, t, e, r1, false, h);
                combine(&mut pts, now, f1, 0, &zero, Choice::Now { r1 }, self.cap);
                absorb(&mut pts);
            }
        }
        for s in ((c + 1) as usize)..=t {
            // Keep x_c through the first part, then continue from it.
            let (adv_peak, adv_cost) = self.advance(c, s, en, false);
            let shift = self.xc(c);
            let e1_max = if self.general { t } else { s };
            for e1 in s.max(self.lo).max(e + 1)..=e1_max {
                let f1 = self.front(s as isize, t, e1, r, q, false);
                for r2 in [true, false] {
                    let f2 = self.front(c, e1 - 1, e, r2, false, h);
                    combine(
                        &mut pts,
                        (adv_peak, adv_cost),
                        f1,
                        shift,
                        f2,
                        Choice::Keep { s, e1, r2 },
                        self.cap,
                    );
                    absorb(&mut pts);
                }
            }
            // Held x_c with nothing left below: the first part runs down to e = s.
            if h && s == e {
                let f1 = self.front(s as isize, t, s, r, q, false);
                combine(
                    &mut pts,
                    (adv_peak, adv_cost),
                    f1,
                    shift,
                    &zero,
                    Choice::KeepLast { s },
                    self.cap,
                );
                absorb(&mut pts);
            }
            // Delay stage s: the first part stops above it holding x_s, and the part below
            // runs stage s when it suits.
            if self.general && s >= self.lo && s < t && s > e {
                let f1 = self.front(s as isize, t, s + 1, r, q, true);
                for r2 in [true, false] {
                    let f2 = self.front(c, s - 1, e, r2, true, h);
                    combine(
                        &mut pts,
                        (adv_peak, adv_cost),
                        f1,
                        shift,
                        f2,
                        Choice::KeepPending { s, r2 },
                        self.cap,
                    );
                    absorb(&mut pts);
                }
            }
            // Free x_c after the advance: the first part goes all the way down to e.
            if !h && e as isize > c && s <= e {
                let (adv_peak, adv_cost) = self.advance(c, s, en, true);
                let f1 = self.front(s as isize, t, e, r, q, false);
                combine(
                    &mut pts,
                    (adv_peak, adv_cost),
                    f1,
                    0,
                    &zero,
                    Choice::Drop { s },
                    self.cap,
                );
                absorb(&mut pts);
            }
        }
        acc
    }

    fn top_front(&self) -> &[Pt] {
        self.front(-1, self.n - 2, self.lo, false, false, false)
    }

    /// Appends the compute sequence of `P(c, t, r, e, q, h)` within `budget` (relative bytes).
    #[allow(clippy::too_many_arguments)]
    fn emit(
        &self,
        c: isize,
        t: usize,
        e: usize,
        r: bool,
        q: bool,
        h: bool,
        budget: u64,
        out: &mut Vec<NodeId>,
    ) -> bool {
        let Some(pt) = eval(self.front(c, t, e, r, q, h), budget).copied() else {
            return false;
        };
        let fwd = |out: &mut Vec<NodeId>, s: usize| {
            out.extend_from_slice(&self.chain.forward[((c + 1) as usize)..=s]);
        };
        let run_pending = |out: &mut Vec<NodeId>| {
            if !r {
                out.push(self.chain.forward[t + 2]);
            }
            out.push(self.chain.backward_of(t + 1));
        };
        match pt.choice {
            Choice::Base => {
                if q {
                    run_pending(out);
                } else if !r {
                    out.push(self.chain.forward[t + 1]);
                }
                out.push(self.chain.backward_of(t));
                true
            }
            Choice::Now { r1 } => {
                run_pending(out);
                self.emit(c, t, e, r1, false, h, pt.peak, out)
            }
            Choice::Keep { s, e1, r2 } => {
                fwd(out, s);
                self.emit(s as isize, t, e1, r, q, false, pt.peak - self.xc(c), out)
                    && self.emit(c, e1 - 1, e, r2, false, h, pt.peak, out)
            }
            Choice::KeepLast { s } => {
                fwd(out, s);
                self.emit(s as isize, t, s, r, q, false, pt.peak - self.xc(c), out)
            }
            Choice::KeepPending { s, r2 } => {
                fwd(out, s);
                self.emit(s as isize, t, s + 1, r, q, true, pt.peak - self.xc(c), out)
                    && self.emit(c, s - 1, e, r2, true, h, pt.peak, out)
            }
            Choice::Drop { s } => {
                fwd(out, s);
                self.emit(s as isize, t, e, r, q, false, pt.peak, out)
            }
        }
    }

    fn schedule(&self, p: &Problem, budget: u64) -> Option<Schedule> {
        let mut seq = Vec::new();
        self.emit(
            -1,
            self.n - 2,
            self.lo,
            false,
            false,
            false,
            budget,
            &mut seq,
        )
        .then(|| with_frees(p, &seq))
    }
}

/// Adds the frontier of "advance, then part 1 (peaks shifted by what is held), then part 2"
/// to `pts`: at every breakpoint between the advance peak and `cap`, the cheapest parts that fit.
fn combine(
    pts: &mut Vec<Pt>,
    adv: (u64, f64),
    f1: &[Pt],
    shift: u64,
    f2: &[Pt],
    choice: Choice,
    cap: u64,
) {
    let (adv_peak, adv_cost) = adv;
    let mut lvl = adv_peak;
    let mut i = f1.partition_point(|q| q.peak + shift <= lvl);
    let mut j = f2.partition_point(|q| q.peak <= lvl);
    while lvl <= cap {
        if i > 0 && j > 0 {
            pts.push(Pt {
                peak: lvl,
                cost: adv_cost + f1[i - 1].cost + f2[j - 1].cost,
                choice,
            });
        }
        let next = match (f1.get(i), f2.get(j)) {
            (None, None) => break,
            (Some(q), None) => q.peak + shift,
            (None, Some(q)) => q.peak,
            (Some(q1), Some(q2)) => (q1.peak + shift).min(q2.peak),
        };
        lvl = next;
        while f1.get(i).is_some_and(|q| q.peak + shift <= lvl) {
            i += 1;
        }
        while f2.get(j).is_some_and(|q| q.peak <= lvl) {
            j += 1;
        }
    }
}

/// Which program [`solve_chain_with`] runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DpMode {
    /// The exact program up to 30 forward nodes, the restricted one beyond.
    #[default]
    Auto,
    /// The exact `O(N^5)` program whatever the length.
    Exact,
    /// The `O(N^3)` program in which a checkpoint read by a stage is held until that stage and
    /// no stage is delayed (classical Rotor structure plus recomputing `x_{t+1}`): fast, not
    /// always optimal.
    Restricted,
}

/// A chain solution and whether it is proven optimal.
#[derive(Debug, Clone, PartialEq)]
pub struct ChainSolution {
    /// The cheapest schedule found within the budget; `None` when none fits.
    pub schedule: Option<Schedule>,
    /// Its peak (fixed bytes included) and cost as the DP predicts them (equal to
    /// [`crate::simulate`]'s figures).
    pub peak_bytes: u64,
    pub compute_cost: f64,
    /// Whether the answer is proven optimal: the exact program ran, no frontier was thinned
    /// and the chain has at most [`PROVEN_STAGES`] backward stages (how far the program is
    /// checked against exhaustive search: the module documentation).
    pub optimal: bool,
}

/// One point of a chain's frontier.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FrontierPoint {
    /// Peak bytes (fixed bytes included), as [`crate::simulate`] measures them.
    pub peak_bytes: u64,
    /// The least compute cost of any schedule whose peak is at most `peak_bytes`.
    pub compute_cost: f64,
}

fn not_chain(p: &Problem) -> Result<Chain> {
    chain_structure(p).map_err(|why| SolverError::Unavailable {
        solver: "chain DP".to_string(),
        why: format!("problem {:?} is not a training chain: {why}", p.name),
    })
}

/// The Pareto frontier (peak, least cost) of a training chain up to `max_peak` bytes, increasing
/// peak and decreasing cost, from the exact program. An error (naming why) when `p` is not a
/// training chain. The time grows with the frontier, so a tight `max_peak` is much faster.
pub fn chain_frontier(p: &Problem, max_peak: u64) -> Result<Vec<FrontierPoint>> {
    let chain = not_chain(p)?;
    let Some(cap) = max_peak.checked_sub(p.fixed_bytes) else {
        return Ok(Vec::new());
    };
    let dp = Dp::new(p, &chain, cap, DpMode::Exact);
    Ok(dp
        .top_front()
        .iter()
        .map(|q| FrontierPoint {
            peak_bytes: q.peak + p.fixed_bytes,
            compute_cost: q.cost,
        })
        .collect())
}

/// Solves a training chain for `budget` with the given program. An error (naming why) when `p`
/// is not a training chain.
pub fn solve_chain_with(p: &Problem, budget: u64, mode: DpMode) -> Result<ChainSolution> {
    let chain = not_chain(p)?;
    let Some(cap) = budget.checked_sub(p.fixed_bytes) else {
        return Ok(ChainSolution {
            schedule: None,
            peak_bytes: 0,
            compute_cost: 0.0,
            optimal: true,
        });
    };
    let dp = Dp::new(p, &chain, cap, mode);
    let optimal = dp.general && !dp.thinned && chain.backward.len() <= PROVEN_STAGES;
    let best = eval(dp.top_front(), cap).copied();
    Ok(ChainSolution {
        schedule: best.and_then(|_| dp.schedule(p, cap)),
        peak_bytes: best.map_or(0, |q| q.peak + p.fixed_bytes),
        compute_cost: best.map_or(0.0, |q| q.cost),
        optimal,
    })
}

/// The cheapest schedule of a training chain whose peak is within `budget`, `None` when no
/// schedule fits; for chains of up to 30 forward nodes the exact program's optimum (see the
/// module documentation for what it covers, and [`solve_chain_with`] for longer chains). An
/// error (naming why) when `p` is not a training chain.
pub fn solve_chain(p: &Problem, budget: u64) -> Result<Option<Schedule>> {
    Ok(solve_chain_with(p, budget, DpMode::Auto)?.schedule)
}

/// For a training chain, the least peak the DP reaches, a cheapest schedule reaching it, and
/// whether the exact program ran (thinning keeps minimum peaks exact); `None` for other
/// problems. Searches caps upward from the footprint lower bound (each
/// run only keeps points under its cap) up to the store-all peak, which always fits.
pub fn min_peak_chain(p: &Problem) -> Option<(u64, Schedule, bool)> {
    let chain = as_training_chain(p)?;
    let lower = p.footprint_lower_bound().saturating_sub(p.fixed_bytes);
    let upper = crate::schedule::store_all_peak(p).saturating_sub(p.fixed_bytes);
    let mut cap = lower.min(upper);
    loop {
        let dp = Dp::new(p, &chain, cap, DpMode::Auto);
        if let Some(first) = dp.top_front().first().copied() {
            return dp
                .schedule(p, first.peak)
                .map(|s| (first.peak + p.fixed_bytes, s, dp.general));
        }
        if cap >= upper {
            return None;
        }
        cap = (cap + cap / 8 + 1).min(upper);
    }
}
