//! The chain program of the `torch-sac` model: one option per region (unwrapped, or wrapped
//! keeping one subset of its keepable ops), chosen for all regions together by a dynamic
//! program over the regions in forward order.
//!
//! Each region's options are simulated once, alone (every other region fully checkpointed),
//! and compared point by point with full checkpointing's memory timeline ([`super::timeline`]):
//! `D(r, o, t)`, the bytes option `o` of region `r` adds at point `t`. Each timeline point
//! belongs to one region: its forward from its first op to the next region's, its re-run, and
//! the backward from its trigger to the previous region's. Region `k`'s option `o` is then
//! summed up by three figures:
//! - `held(k, o)`: the most it adds at any point of a later region (what it holds while the
//!   later regions run: its kept values, or, unwrapped, everything it saved);
//! - `active(k, o)`: the most bytes at a point of its own, full checkpointing's bytes there
//!   plus its own addition plus the most any option of each later region adds there (those
//!   are zero on the chains seen: a later region has not run yet, or has finished its
//!   backward);
//! - `cost(k, o)`: its re-run's cost (unwrapped: none).
//!
//! If the additions of different regions add up (the model the program assumes: a value's
//! life depends on its own region's option only), a plan's peak is at most
//! `max over k of (sum of held(j, o_j) for j before k) + active(k, o_k)`, and its cost is the
//! step's plus the re-runs'. The program finds, for a budget, the cheapest choice whose bound
//! fits it, over a grid of the held prefix sums ([`SLOTS`] levels: held bytes are rounded up
//! to the grid, so the bound stays a bound). Every plan it gives is simulated before it is
//! offered: the simulator, not the bound, decides whether it fits. Where the additions are
//! exact (as on a chain of identical blocks whose values live within the block), the program
//! is exact: no plan giving each region one of its options fits the budget less the rounding
//! (at most one slot per region) and costs less. The simulations are bounded by work
//! ([`CHAIN_WORK`] timeline points): a step too long for 2^8 keep sets per region gets fewer.

use super::model::{
    held_bytes, keepable, run, Resolved, SacPlan, SacStats, TimelinePoint, TorchGraph,
};
use crate::error::Result;
use std::collections::{BTreeSet, HashMap};

/// Levels of the grid of held prefix sums.
const SLOTS: usize = 4096;

/// Most timeline points [`ChainModel::build`] simulates over all options of all regions
/// (about 5 s on the development machine); past it, fewer keepable ops per region are
/// enumerated.
const CHAIN_WORK: usize = 50_000_000;

/// Keepable ops of a region whose keep sets are all options (2^8 sets); a region with more
/// tries every keep set of the ones holding the most bytes, the others recomputed in every one.
pub(super) const OPTION_KEEPABLE: usize = 8;

/// The offsets (from the region's first op) of the keepable ops whose keep sets are options:
/// all of them, or the [`OPTION_KEEPABLE`] holding the most bytes.
pub(super) fn option_offsets(graph: &TorchGraph, r: usize) -> Vec<usize> {
    option_offsets_up_to(graph, r, OPTION_KEEPABLE)
}

/// [`option_offsets`] with at most `limit` ops.
fn option_offsets_up_to(graph: &TorchGraph, r: usize, limit: usize) -> Vec<usize> {
    let reg = &graph.regions[r];
    let mut offsets: Vec<usize> = (reg.first_op..=reg.last_op)
        .filter(|&j| keepable(graph, r, j))
        .map(|j| j - reg.first_op)
        .collect();
    offsets.sort_by_key(|&o| (std::cmp::Reverse(held_bytes(graph, reg.first_op + o)), o));
    offsets.truncate(limit);
    offsets
}

/// A region's options as keep sets of offsets: `None` (unwrapped) first, then, where the
/// region may be wrapped, every subset of `offsets` (the empty one is full checkpointing of
/// the region).
pub(super) fn offset_options(
    graph: &TorchGraph,
    r: usize,
    offsets: &[usize],
) -> Vec<Option<Vec<usize>>> {
    let mut options: Vec<Option<Vec<usize>>> = vec![None];
    if !graph.wrappable(r) {
        return options;
    }
    for mask in 0u32..(1u32 << offsets.len()) {
        options.push(Some(
            (0..offsets.len())
                .filter(|b| mask & (1 << b) != 0)
                .map(|b| offsets[b])
                .collect(),
        ));
    }
    options
}

/// The program's figures for one graph, built once ([`ChainModel::build`]) and solved for any
/// budget ([`ChainModel::solve`]).
#[derive(Debug, Clone)]
pub struct ChainModel {
    /// Regions in forward order.
    order: Vec<usize>,
    /// Per region (in `order`): its options left after dropping the dominated ones (`None`:
    /// unwrapped; else the kept ops).
    options: Vec<Vec<Option<BTreeSet<usize>>>>,
    held: Vec<Vec<i64>>,
    active: Vec<Vec<i64>>,
    cost: Vec<Vec<f64>>,
    /// Bytes of one slot of the held prefix grid.
    slot: i64,
    /// Per region: its least `held`, and each option's `held` above it in slots (rounded up).
    held_min: Vec<i64>,
    held_slots: Vec<Vec<usize>>,
    /// The same, rounded down: the program's optimistic side, for the lower bound.
    held_slots_down: Vec<Vec<usize>>,
    /// Whether every keepable op of every region is enumerated: then the class is every plan
    /// the torch-sac planner can express (any wrapped regions, any keep sets of keepable ops).
    pub complete: bool,
    /// Whether every storage's life depends on at most one region's option
    /// ([`TorchGraph`]'s check): the additions of the regions then add up exactly.
    pub additive: bool,
    /// The storages made outside the regions whose lives several regions' options decide
    /// ([`TorchGraph::storages_decided_apart`]; `None` where a storage a region makes is one):
    /// empty exactly when `additive`.
    pub decided_apart: Option<Vec<usize>>,
    /// Keepable ops per region whose keep sets are options (at most 8, fewer where the
    /// regions are so many or the step so long that the work limit requires).
    pub keepable_ops: usize,
    /// Whether every later region's addition at a region's points is zero and every region's
    /// addition at later regions' points is one constant per option: then, with `additive`,
    /// the bound of every choice is its simulated peak.
    pub exact_shape: bool,
}

/// One choice of the program: an option per region, the plan, and its bound.
#[derive(Debug, Clone)]
pub struct ChainChoice {
    pub plan: SacPlan,
    /// The program's bound on the plan's peak (the simulator's peak is at most this where the
    /// additions add up).
    pub bound_bytes: u64,
    /// The program's cost of the plan (the step's cost plus the re-runs').
    pub cost: f64,
}

/// Keeps the items whose flag is set.
fn retain_by<T>(v: &mut Vec<T>, keep: &[bool]) {
    let mut flags = keep.iter();
    v.retain(|_| flags.next().copied().unwrap_or(false));
}

fn timeline_and_stats(
    graph: &TorchGraph,
    plan: &SacPlan,
) -> Result<(Vec<TimelinePoint>, SacStats)> {
    let res = Resolved::new(graph, plan)?;
    let mut points = Vec::with_capacity(graph.ops.len());
    let stats = run(graph, &res, Some(&mut points));
    Ok((points, stats))
}

impl ChainModel {
    /// Simulates every option of every region alone and sums them up; `None` when the regions
    /// are not a chain (they overlap) or a timeline has a point full checkpointing's lacks.
    pub fn build(graph: &TorchGraph) -> Result<Option<ChainModel>> {
        let n = graph.regions.len();
        if n == 0 {
            return Ok(None);
        }
        let mut order: Vec<usize> = (0..n).collect();
        order.sort_by_key(|&r| graph.regions[r].first_op);
        if order
            .windows(2)
            .any(|w| graph.regions[w[0]].last_op >= graph.regions[w[1]].first_op)
        {
            return Ok(None);
        }
        let mut pos = vec![0; n];
        for (k, &r) in order.iter().enumerate() {
            pos[r] = k;
        }
        let full = SacPlan::full(graph);
        let (base_points, _) = timeline_and_stats(graph, &full)?;
        let key = |p: &TimelinePoint| (p.op, p.rerun_of);
        let index: HashMap<(usize, Option<usize>), usize> = base_points
            .iter()
            .enumerate()
            .map(|(t, p)| (key(p), t))
            .collect();
        if index.len() != base_points.len() {
            return Ok(None);
        }
        // Which region each point belongs to (a position in `order`).
        let owner: Vec<usize> = base_points
            .iter()
            .map(|p| match p.rerun_of {
                Some(r) => pos[r],
                None if p.op < graph.forward_ops => order
                    .iter()
                    .rposition(|&r| graph.regions[r].first_op <= p.op)
                    .unwrap_or(0),
                None => order
                    .iter()
                    .enumerate()
                    .filter_map(|(k, &r)| {
                        graph.regions[r]
                            .trigger_op
                            .filter(|&t| t <= p.op)
                            .map(|t| (t, k))
                    })
                    .max()
                    .map_or(n - 1, |(_, k)| k),
            })
            .collect();
        let owned: Vec<Vec<usize>> = (0..n)
            .map(|k| (0..base_points.len()).filter(|&t| owner[t] == k).collect())
            .collect();
        // As many keepable ops per region as the work limit allows.
        let keepable_ops = (0..=OPTION_KEEPABLE)
            .rev()
            .find(|&limit| {
                let sims: usize = (0..n)
                    .map(|r| (1usize << option_offsets_up_to(graph, r, limit).len()) + 1)
                    .sum();
                sims.saturating_mul(base_points.len()) <= CHAIN_WORK
            })
            .unwrap_or(0);
        let complete = (0..n).all(|r| {
            let reg = &graph.regions[r];
            (reg.first_op..=reg.last_op)
                .filter(|&j| keepable(graph, r, j))
                .count()
                <= keepable_ops
        });
        let mut exact_shape = true;
        let mut options = Vec::with_capacity(n);
        let mut held = Vec::with_capacity(n);
        let mut cost = Vec::with_capacity(n);
        // Per region and option: the bytes at each of its own points (None: the point does
        // not run under that option).
        let mut own: Vec<Vec<Vec<Option<i64>>>> = Vec::with_capacity(n);
        // Per region: the most any of its options adds at each point of an earlier region.
        let mut early: Vec<Vec<i64>> = Vec::with_capacity(n);
        for (k, &r) in order.iter().enumerate() {
            let first = graph.regions[r].first_op;
            let opts: Vec<Option<BTreeSet<usize>>> =
                offset_options(graph, r, &option_offsets_up_to(graph, r, keepable_ops))
                    .into_iter()
                    .map(|o| o.map(|offs| offs.iter().map(|x| first + x).collect()))
                    .collect();
            let mut h = Vec::with_capacity(opts.len());
            let mut c = Vec::with_capacity(opts.len());
            let mut mine = Vec::with_capacity(opts.len());
            let mut most_early = vec![i64::MIN; base_points.len()];
            for o in &opts {
                let mut plan = full.clone();
                match o {
                    None => {
                        plan.wrapped.remove(&r);
                    }
                    Some(keep) => {
                        plan.wrapped.insert(r, keep.clone());
                    }
                }
                let (points, stats) = timeline_and_stats(graph, &plan)?;
                let mut seen = vec![false; base_points.len()];
                let mut later = i64::MIN;
                let mut later_min = i64::MAX;
                let mut at_own: Vec<Option<i64>> = vec![None; owned[k].len()];
                for p in &points {
                    let Some(&t) = index.get(&key(p)) else {
                        return Ok(None);
                    };
                    seen[t] = true;
                    let d = p.bytes as i64 - base_points[t].bytes as i64;
                    match owner[t].cmp(&k) {
                        std::cmp::Ordering::Equal => {
                            let i = owned[k].binary_search(&t).expect("owned point");
                            at_own[i] = Some(p.bytes as i64);
                        }
                        std::cmp::Ordering::Greater => {
                            later = later.max(d);
                            later_min = later_min.min(d);
                        }
                        std::cmp::Ordering::Less => {
                            most_early[t] = most_early[t].max(d);
                            if d != 0 {
                                exact_shape = false;
                            }
                        }
                    }
                }
                // Only the region's own points (its re-run's ops) may be missing.
                if seen.iter().zip(&owner).any(|(&s, &w)| !s && w != k) {
                    return Ok(None);
                }
                if later != i64::MIN && later != later_min {
                    exact_shape = false;
                }
                h.push(if later == i64::MIN { 0 } else { later });
                c.push(stats.rerun_cost.get(&r).copied().unwrap_or(0.0));
                mine.push(at_own);
            }
            options.push(opts);
            held.push(h);
            cost.push(c);
            own.push(mine);
            early.push(most_early);
        }
        // What the later regions may add at each point.
        let mut ahead = vec![0i64; base_points.len()];
        for (j, most) in early.iter().enumerate() {
            for (t, &w) in owner.iter().enumerate() {
                if w < j {
                    ahead[t] += most[t];
                }
            }
        }
        let mut active = Vec::with_capacity(n);
        for k in 0..n {
            active.push(
                own[k]
                    .iter()
                    .map(|at| {
                        at.iter()
                            .zip(&owned[k])
                            .filter_map(|(b, &t)| b.map(|b| b + ahead[t]))
                            .max()
                            .unwrap_or(0)
                    })
                    .collect::<Vec<i64>>(),
            );
        }
        // Drop the options another matches or beats in all three figures.
        for k in 0..n {
            let m = options[k].len();
            let keep: Vec<bool> = (0..m)
                .map(|a| {
                    !(0..m).any(|b| {
                        b != a
                            && held[k][b] <= held[k][a]
                            && active[k][b] <= active[k][a]
                            && cost[k][b] <= cost[k][a]
                            && (held[k][b] < held[k][a]
                                || active[k][b] < active[k][a]
                                || cost[k][b] < cost[k][a]
                                || b < a)
                    })
                })
                .collect();
            retain_by(&mut options[k], &keep);
            retain_by(&mut held[k], &keep);
            retain_by(&mut active[k], &keep);
            retain_by(&mut cost[k], &keep);
        }
        let held_min: Vec<i64> = held
            .iter()
            .map(|h| h.iter().copied().min().unwrap_or(0))
            .collect();
        let range: i64 = held
            .iter()
            .zip(&held_min)
            .map(|(h, &lo)| h.iter().map(|&x| x - lo).max().unwrap_or(0))
            .sum();
        let slot = (range + SLOTS as i64 - 1).div_euclid(SLOTS as i64).max(1);
        let held_slots = held
            .iter()
            .zip(&held_min)
            .map(|(h, &lo)| {
                h.iter()
                    .map(|&x| ((x - lo) + slot - 1).div_euclid(slot) as usize)
                    .collect()
            })
            .collect();
        let held_slots_down = held
            .iter()
            .zip(&held_min)
            .map(|(h, &lo)| {
                h.iter()
                    .map(|&x| (x - lo).div_euclid(slot) as usize)
                    .collect()
            })
            .collect();
        let decided_apart = graph.storages_decided_apart();
        Ok(Some(ChainModel {
            order,
            options,
            held,
            active,
            cost,
            slot,
            held_min,
            held_slots,
            held_slots_down,
            keepable_ops,
            complete,
            exact_shape,
            additive: decided_apart.as_ref().is_some_and(|a| a.is_empty()),
            decided_apart,
        }))
    }

    /// The bytes of one slot of the held prefix grid: a choice fitting `budget` less one slot
    /// per region is within reach of the program at `budget`.
    pub fn slot_bytes(&self) -> u64 {
        self.slot as u64
    }

    /// The regions in forward order.
    pub fn regions(&self) -> usize {
        self.order.len()
    }

    /// Runs the program: for each region in order, per slot of the held prefix, the least
    /// value of `step(value so far, prefix bound, option)` (`None`: not allowed), and the
    /// option that gave it.
    fn program(
        &self,
        slots: &[Vec<usize>],
        step: impl Fn(f64, i64, usize, usize) -> Option<f64>,
    ) -> Option<(Vec<usize>, f64)> {
        let width: usize = slots
            .iter()
            .map(|h| h.iter().copied().max().unwrap_or(0))
            .sum::<usize>()
            + 1;
        let mut value = vec![f64::INFINITY; width];
        value[0] = 0.0;
        let mut choice: Vec<Vec<u16>> = Vec::with_capacity(self.order.len());
        let mut reach = 1usize;
        let mut prefix_min = 0i64;
        for (k, region_slots) in slots.iter().enumerate() {
            let top = region_slots.iter().copied().max().unwrap_or(0);
            let mut next = vec![f64::INFINITY; width];
            let mut pick = vec![u16::MAX; width];
            for (p, &v) in value.iter().enumerate().take(reach) {
                if !v.is_finite() {
                    continue;
                }
                let prefix = prefix_min + p as i64 * self.slot;
                for (o, &held) in region_slots.iter().enumerate() {
                    let Some(w) = step(v, prefix, k, o) else {
                        continue;
                    };
                    let q = p + held;
                    if w < next[q] {
                        next[q] = w;
                        pick[q] = o as u16;
                    }
                }
            }
            reach += top;
            prefix_min += self.held_min[k];
            value = next;
            choice.push(pick);
        }
        let (end, &best) = value
            .iter()
            .enumerate()
            .filter(|(_, v)| v.is_finite())
            .min_by(|a, b| a.1.total_cmp(b.1))?;
        let mut picks = vec![0; self.order.len()];
        let mut p = end;
        for k in (0..self.order.len()).rev() {
            let o = choice[k][p] as usize;
            picks[k] = o;
            p -= slots[k][o];
        }
        Some((picks, best))
    }

    fn choice(&self, graph: &TorchGraph, picks: &[usize]) -> ChainChoice {
        let mut plan = SacPlan::default();
        let mut prefix = 0i64;
        let mut bound = i64::MIN;
        let mut cost = graph.base_cost();
        for (k, (&r, &o)) in self.order.iter().zip(picks).enumerate() {
            bound = bound.max(prefix + self.active[k][o]);
            prefix += self.held[k][o];
            cost += self.cost[k][o];
            if let Some(keep) = &self.options[k][o] {
                plan.wrapped.insert(r, keep.clone());
            }
        }
        ChainChoice {
            plan,
            bound_bytes: bound.max(0) as u64,
            cost,
        }
    }

    /// The cheapest choice whose bound (with held bytes rounded up to the grid) fits `budget`.
    pub fn solve(&self, graph: &TorchGraph, budget: u64) -> Option<ChainChoice> {
        let budget = i64::try_from(budget).unwrap_or(i64::MAX);
        let (picks, _) = self.program(&self.held_slots, |v, prefix, k, o| {
            (prefix.saturating_add(self.active[k][o]) <= budget).then(|| v + self.cost[k][o])
        })?;
        Some(self.choice(graph, &picks))
    }

    /// Whether the program is exact: the values are additive and the figures have the exact
    /// shape, so every choice's bound is its simulated peak.
    pub fn exact(&self) -> bool {
        self.additive && self.exact_shape
    }

    /// A lower bound on the cost of every plan of the class whose peak fits `budget`: the
    /// program with the held bytes rounded down, where it is exact and complete (`None`
    /// otherwise, or when no plan of the class fits: then `Some(f64::INFINITY)`). Every plan the
    /// torch-sac planner can express is then in the class, so it bounds the planner's answer.
    pub fn lower_bound(&self, graph: &TorchGraph, budget: u64) -> Option<f64> {
        if !(self.exact() && self.complete) {
            return None;
        }
        let budget = i64::try_from(budget).unwrap_or(i64::MAX);
        Some(
            self.program(&self.held_slots_down, |v, prefix, k, o| {
                (prefix.saturating_add(self.active[k][o]) <= budget).then(|| v + self.cost[k][o])
            })
            .map_or(f64::INFINITY, |(_, cost)| graph.base_cost() + cost),
        )
    }

    /// The least bound any choice has (held bytes rounded up to the grid), with the cheapest
    /// choice at that bound.
    pub fn least(&self, graph: &TorchGraph) -> Option<ChainChoice> {
        let (picks, _) = self.program(&self.held_slots, |v, prefix, k, o| {
            Some(v.max((prefix + self.active[k][o]) as f64))
        })?;
        let least = self.choice(graph, &picks);
        // The cheapest at that bound (the program above ignores costs).
        let rounded = self.rounded_bound(&picks);
        self.solve(graph, rounded).or(Some(least))
    }

    /// A choice's bound with its held bytes rounded up to the grid, as the program sees it.
    fn rounded_bound(&self, picks: &[usize]) -> u64 {
        let mut prefix = 0i64;
        let mut bound = i64::MIN;
        for (k, &o) in picks.iter().enumerate() {
            bound = bound.max(prefix + self.active[k][o]);
            prefix += self.held_min[k] + self.held_slots[k][o] as i64 * self.slot;
        }
        bound.max(0) as u64
    }
}
