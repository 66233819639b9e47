//! Exact checkpointing of training chains: a Rotor-style dynamic program (Beaumont et al.,
//! "Optimal checkpointing for heterogeneous chains", 2019/2021) derived for this crate's
//! memory model, so its predicted peak and cost are exactly what [`simulate`] measures.
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
//! `P(c, t, r)`: process backward stages `t, t-1, …, max(c, lo)` given that `x_c` is resident
//! (`c = -1`: nothing, `x_0` is computed from scratch), `b` of stage `t+1` is resident (when
//! stage `t+1` exists) and `x_{t+1}` is resident when `r` (otherwise it is recomputed from
//! `x_t` right before stage `t`). Either `c = t` and stage `t` runs (after recomputing
//! `x_{t+1}` when `!r`), or for some `c < s ≤ t` the chain is advanced from `x_c` to `x_s`
//! keeping only `x_s`, then `P(s, t, r)` runs with `x_c` held, then `P(c, s-1, r')`, where
//! `r'` says whether `x_s` stays resident until stage `s-1` or is freed after stage `s` and
//! recomputed. Instead of a discretized memory axis each state keeps its exact Pareto frontier
//! of (peak bytes, cost): the peak of a composition is the max of its parts' peaks (shifted by
//! what is held), its cost their sum, so no discretization is needed and the optimum is exact.

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
            "{k} backward nodes but only {} stages in the forward path of {len} nodes",
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
    Split { s: usize, r2: bool },
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

/// Lower envelope: increasing peak, strictly decreasing cost.
fn envelope(mut pts: Vec<Pt>) -> Vec<Pt> {
    pts.sort_by(|a, b| a.peak.cmp(&b.peak).then(a.cost.total_cmp(&b.cost)));
    let mut out: Vec<Pt> = Vec::new();
    for p in pts {
        if out.last().is_none_or(|l| improves(p.cost, l.cost)) {
            out.push(p);
        }
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
    /// `fronts[state(c, t, r)]`.
    fronts: Vec<Vec<Pt>>,
}

impl<'a> Dp<'a> {
    fn new(p: &Problem, chain: &'a Chain) -> Self {
        let n = chain.forward.len();
        let lo = chain.lowest_stage();
        let a = chain.forward.iter().map(|&v| p.bytes(v)).collect();
        let f = chain.forward.iter().map(|&v| p.cost(v)).collect();
        let mut d = vec![0; n];
        let mut g = vec![0.0; n];
        for j in lo..n - 1 {
            let v = chain.backward_of(j);
            d[j] = p.bytes(v);
            g[j] = p.cost(v);
        }
        let mut dp = Dp {
            chain,
            a,
            f,
            d,
            g,
            lo,
            n,
            fronts: vec![Vec::new(); (n + 1) * n * 2],
        };
        dp.solve();
        dp
    }

    fn state(&self, c: isize, t: usize, r: bool) -> usize {
        (((c + 1) as usize * self.n) + t) * 2 + r as usize
    }

    /// Bytes of the gradient of stage `j`, 0 when the stage has no backward node.
    fn dsz(&self, j: usize) -> u64 {
        if j >= self.lo && j + 2 <= self.n {
            self.d[j]
        } else {
            0
        }
    }

    fn entry(&self, c: isize, t: usize, r: bool) -> u64 {
        let xc = if c >= 0 { self.a[c as usize] } else { 0 };
        let xt = if r { self.a[t + 1] } else { 0 };
        xc + xt + self.dsz(t + 1)
    }

    fn solve(&mut self) {
        let top = self.n - 2;
        for len in 0..=(top + 1) {
            for c in -1..=(top as isize) {
                let t = c + len as isize;
                if t < 0 || t as usize > top || (t as usize) < self.lo {
                    continue;
                }
                let t = t as usize;
                for r in [true, false] {
                    if t == top && r {
                        continue;
                    }
                    let front = self.options(c, t, r);
                    let st = self.state(c, t, r);
                    self.fronts[st] = front;
                }
            }
        }
    }

    /// Advance from `x_c` to `x_s` keeping only `x_s`: (peak, cost). `e` is the entry memory;
    /// `dies` frees `x_c` after its first reader.
    fn advance(&self, c: isize, s: usize, e: u64, dies: bool) -> (u64, f64) {
        let first = (c + 1) as usize;
        let mut peak = 0;
        let mut cost = 0.0;
        for i in first..=s {
            let mut m = e + self.a[i];
            if i > first {
                m += self.a[i - 1];
                if dies {
                    m -= self.a[c as usize];
                }
            }
            peak = peak.max(m);
            cost += self.f[i];
        }
        (peak, cost)
    }

    fn split_parts(&self, c: isize, s: usize) -> (bool, u64) {
        let second_empty = s <= self.lo;
        let dies = c >= 0 && (c as usize) < self.lo && second_empty;
        let shift = if c >= 0 && !dies {
            self.a[c as usize]
        } else {
            0
        };
        (dies, shift)
    }

    fn options(&self, c: isize, t: usize, r: bool) -> Vec<Pt> {
        let e = self.entry(c, t, r);
        if c == t as isize {
            let (peak, cost) = if r {
                (e + self.d[t], self.g[t])
            } else {
                (e + self.a[t + 1] + self.d[t], self.f[t + 1] + self.g[t])
            };
            return vec![Pt {
                peak,
                cost,
                choice: Choice::Base,
            }];
        }
        let mut pts = Vec::new();
        for s in ((c + 1) as usize)..=t {
            let (dies, shift) = self.split_parts(c, s);
            let (adv_peak, adv_cost) = self.advance(c, s, e, dies);
            let f1 = &self.fronts[self.state(s as isize, t, r)];
            let second_empty = s <= self.lo;
            for r2 in [true, false] {
                if second_empty && !r2 {
                    continue;
                }
                let empty = [Pt {
                    peak: 0,
                    cost: 0.0,
                    choice: Choice::Base,
                }];
                let f2: &[Pt] = if second_empty {
                    &empty
                } else {
                    &self.fronts[self.state(c, s - 1, r2)]
                };
                let mut levels: Vec<u64> = f1
                    .iter()
                    .map(|q| q.peak + shift)
                    .chain(f2.iter().map(|q| q.peak))
                    .chain(std::iter::once(adv_peak))
                    .filter(|&l| l >= adv_peak)
                    .collect();
                levels.sort_unstable();
                levels.dedup();
                for lvl in levels {
                    let (Some(q1), Some(q2)) = (eval(f1, lvl - shift), eval(f2, lvl)) else {
                        continue;
                    };
                    pts.push(Pt {
                        peak: lvl,
                        cost: adv_cost + q1.cost + q2.cost,
                        choice: Choice::Split { s, r2 },
                    });
                }
            }
        }
        envelope(pts)
    }

    fn top_front(&self) -> &[Pt] {
        &self.fronts[self.state(-1, self.n - 2, false)]
    }

    /// Appends the compute sequence of state `(c, t, r)` within `budget` (relative bytes).
    fn emit(&self, c: isize, t: usize, r: bool, budget: u64, out: &mut Vec<NodeId>) -> bool {
        let Some(pt) = eval(&self.fronts[self.state(c, t, r)], budget).copied() else {
            return false;
        };
        match pt.choice {
            Choice::Base => {
                if !r {
                    out.push(self.chain.forward[t + 1]);
                }
                out.push(self.chain.backward_of(t));
                true
            }
            Choice::Split { s, r2 } => {
                let (_, shift) = self.split_parts(c, s);
                out.extend_from_slice(&self.chain.forward[((c + 1) as usize)..=s]);
                if !self.emit(s as isize, t, r, pt.peak - shift, out) {
                    return false;
                }
                if s > self.lo {
                    return self.emit(c, s - 1, r2, pt.peak, out);
                }
                true
            }
        }
    }

    fn schedule(&self, p: &Problem, budget: u64) -> Option<Schedule> {
        let mut seq = Vec::new();
        self.emit(-1, self.n - 2, false, budget, &mut seq)
            .then(|| with_frees(p, &seq))
    }
}

/// One point of a chain's exact frontier.
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

/// The exact Pareto frontier (peak, least cost) of a training chain, increasing peak and
/// decreasing cost. An error (naming why) when `p` is not a training chain.
pub fn chain_frontier(p: &Problem) -> Result<Vec<FrontierPoint>> {
    let chain = not_chain(p)?;
    let dp = Dp::new(p, &chain);
    Ok(dp
        .top_front()
        .iter()
        .map(|q| FrontierPoint {
            peak_bytes: q.peak + p.fixed_bytes,
            compute_cost: q.cost,
        })
        .collect())
}

/// The cheapest schedule of a training chain whose peak is within `budget` (an optimal one
/// under [`crate::simulate`]'s model), `None` when no schedule fits. An error (naming why) when
/// `p` is not a training chain.
pub fn solve_chain(p: &Problem, budget: u64) -> Result<Option<Schedule>> {
    let chain = not_chain(p)?;
    let Some(rel) = budget.checked_sub(p.fixed_bytes) else {
        return Ok(None);
    };
    let dp = Dp::new(p, &chain);
    Ok(dp.schedule(p, rel))
}

/// For a training chain, the least peak of any schedule and a schedule reaching it with the
/// least cost; `None` for other problems.
pub fn min_peak_chain(p: &Problem) -> Option<(u64, Schedule)> {
    let chain = as_training_chain(p)?;
    let dp = Dp::new(p, &chain);
    let first = dp.top_front().first().copied()?;
    dp.schedule(p, first.peak)
        .map(|s| (first.peak + p.fixed_bytes, s))
}
