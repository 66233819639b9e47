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
//!
//! Where a region has more keepable ops than are enumerated (`rest`: a `cost="measured"`
//! capture prices every op, and a GPT-2 block then has 14-15), the lower bound runs on a
//! relaxation that stands for every keep set `K`, with `E` its enumerated part:
//! - cost: a kept op is not run again, so `cost(K) = cost(E) - sum of K's rest ops' costs`;
//! - held: each rest op is simulated kept alone; what it adds at later regions' points (the
//!   least over them) is added to `held(E)`, as kept storages add up (one producer each);
//! - active: keeping more never lowers a point both plans run (what the re-run regenerates
//!   is held already; `sac_props::keeping_more_never_lowers_a_point_both_plans_run`), and `K`
//!   runs every point of `E`'s but the re-run points of its rest ops; so `E`'s most bytes at
//!   its own points without those re-run points.
//!
//! The rest ops' subsets enter as the Pareto frontier of (bytes added, cost saved) ([`subset_frontier`]).

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
    /// The options' figures, as the program solves with them.
    fig: Figures,
    /// Where the options are not every keep set ([`ChainModel::complete`] is false): figures at
    /// most those of every keep set, for the lower bound ([`ChainModel::lower_bound`]).
    relaxed: Option<Figures>,
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

/// Points of the frontier [`subset_frontier`] keeps.
const FRONTIER: usize = 32;

/// Per region, one figure per option: what it holds while later regions run, its most bytes
/// at its own points, and its re-run's cost; with the grid of held prefix sums the program
/// runs on.
#[derive(Debug, Clone)]
struct Figures {
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
}

impl Figures {
    /// Drops, per region, the options another matches or beats in all three figures (the
    /// first of equal ones stays) and lays the grid; returns which options stayed.
    fn new(
        mut held: Vec<Vec<i64>>,
        mut active: Vec<Vec<i64>>,
        mut cost: Vec<Vec<f64>>,
    ) -> (Figures, Vec<Vec<bool>>) {
        let mut kept = Vec::with_capacity(held.len());
        for k in 0..held.len() {
            // In lexicographic order a dominating option comes first, so each option is
            // checked against the ones kept before it only (domination is transitive).
            let mut by: Vec<usize> = (0..held[k].len()).collect();
            by.sort_by(|&a, &b| {
                (held[k][a], active[k][a])
                    .cmp(&(held[k][b], active[k][b]))
                    .then(cost[k][a].total_cmp(&cost[k][b]))
                    .then(a.cmp(&b))
            });
            let mut keep = vec![false; by.len()];
            let mut stay: Vec<usize> = Vec::new();
            for a in by {
                if !stay.iter().any(|&b| {
                    held[k][b] <= held[k][a]
                        && active[k][b] <= active[k][a]
                        && cost[k][b] <= cost[k][a]
                }) {
                    stay.push(a);
                    keep[a] = true;
                }
            }
            retain_by(&mut held[k], &keep);
            retain_by(&mut active[k], &keep);
            retain_by(&mut cost[k], &keep);
            kept.push(keep);
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
        let slots = |round_up: bool| -> Vec<Vec<usize>> {
            held.iter()
                .zip(&held_min)
                .map(|(h, &lo)| {
                    h.iter()
                        .map(|&x| {
                            ((x - lo) + if round_up { slot - 1 } else { 0 }).div_euclid(slot)
                                as usize
                        })
                        .collect()
                })
                .collect()
        };
        let (held_slots, held_slots_down) = (slots(true), slots(false));
        (
            Figures {
                held,
                active,
                cost,
                slot,
                held_min,
                held_slots,
                held_slots_down,
            },
            kept,
        )
    }
}

/// The Pareto frontier of (bytes held, cost saved) over the subsets of `items`, each an op's
/// (bytes it adds while held, its cost), with the empty subset; at most [`FRONTIER`] points:
/// past that, each run of neighbouring points becomes one with the run's least bytes and most
/// saving, so every subset still has a point at or below its bytes and at or above its saving.
fn subset_frontier(items: &[(i64, f64)]) -> Vec<(i64, f64)> {
    let mut front = vec![(0i64, 0.0f64)];
    for &(bytes, saving) in items {
        let mut all: Vec<(i64, f64)> = front
            .iter()
            .copied()
            .chain(front.iter().map(|&(b, c)| (b + bytes, c + saving)))
            .collect();
        all.sort_by(|x, y| x.0.cmp(&y.0).then(y.1.total_cmp(&x.1)));
        front.clear();
        for p in all {
            if front.last().is_none_or(|l: &(i64, f64)| p.1 > l.1) {
                front.push(p);
            }
        }
        if front.len() > FRONTIER {
            front = front
                .chunks(front.len().div_ceil(FRONTIER))
                .map(|run| (run[0].0, run[run.len() - 1].1))
                .collect();
        }
    }
    front
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
        Self::build_enumerating(graph, OPTION_KEEPABLE)
    }

    /// [`ChainModel::build`] enumerating the keep sets of at most `max_keepable` keepable ops
    /// per region (and fewer where the work limit requires); the program's bound stands for
    /// the others through its relaxation.
    pub fn build_enumerating(
        graph: &TorchGraph,
        max_keepable: usize,
    ) -> Result<Option<ChainModel>> {
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
        // As many keepable ops per region as the work limit allows: each region simulates
        // every keep set of those, unwrapped, and each of the others kept alone.
        let keepable_count: Vec<usize> = (0..n)
            .map(|r| {
                let reg = &graph.regions[r];
                (reg.first_op..=reg.last_op)
                    .filter(|&j| keepable(graph, r, j))
                    .count()
            })
            .collect();
        let keepable_ops = (0..=max_keepable.min(OPTION_KEEPABLE))
            .rev()
            .find(|&limit| {
                let sims: usize = (0..n)
                    .map(|r| {
                        let e = keepable_count[r].min(limit);
                        (1usize << e) + 1 + (keepable_count[r] - e)
                    })
                    .sum();
                sims.saturating_mul(base_points.len()) <= CHAIN_WORK
            })
            .unwrap_or(0);
        let complete = keepable_count.iter().all(|&c| c <= keepable_ops);
        let mut exact_shape = true;
        let mut options = Vec::with_capacity(n);
        let mut held = Vec::with_capacity(n);
        let mut cost = Vec::with_capacity(n);
        // Per region and option: the bytes at each of its own points (None: the point does
        // not run under that option), and the same leaving out the re-run points of the
        // keepable ops not enumerated (`rest`), which a keep set with them does not run.
        let mut own: Vec<Vec<Vec<Option<i64>>>> = Vec::with_capacity(n);
        let mut own_lb: Vec<Vec<Vec<Option<i64>>>> = Vec::with_capacity(n);
        // Per region: the keepable ops not enumerated, each as (the least bytes it adds at a
        // later region's point when kept alone, its cost).
        let mut rest_items: Vec<Vec<(i64, f64)>> = Vec::with_capacity(n);
        // Per region: the most any of its options adds at each point of an earlier region.
        let mut early: Vec<Vec<i64>> = Vec::with_capacity(n);
        // Simulates `plan`; per point of the full plan's timeline, its bytes above that
        // timeline, and the own points' absolute bytes (`None`: a point `plan` has not).
        type Sim = (Vec<i64>, Vec<Option<(usize, Option<usize>, i64)>>, SacStats);
        let sim = |plan: &SacPlan, k: usize| -> Result<Option<Sim>> {
            let (points, stats) = timeline_and_stats(graph, plan)?;
            let mut d = vec![0i64; base_points.len()];
            let mut at_own = vec![None; owned[k].len()];
            let mut seen = vec![false; base_points.len()];
            for p in &points {
                let Some(&t) = index.get(&key(p)) else {
                    return Ok(None);
                };
                seen[t] = true;
                d[t] = p.bytes as i64 - base_points[t].bytes as i64;
                if owner[t] == k {
                    let i = owned[k].binary_search(&t).expect("owned point");
                    at_own[i] = Some((p.op, p.rerun_of, p.bytes as i64));
                }
            }
            // Only the region's own points (its re-run's ops) may be missing.
            if seen.iter().zip(&owner).any(|(&s, &w)| !s && w != k) {
                return Ok(None);
            }
            Ok(Some((d, at_own, stats)))
        };
        for (k, &r) in order.iter().enumerate() {
            let first = graph.regions[r].first_op;
            let offsets = option_offsets_up_to(graph, r, keepable_ops);
            let rest: BTreeSet<usize> = if graph.wrappable(r) {
                (first..=graph.regions[r].last_op)
                    .filter(|&j| keepable(graph, r, j) && !offsets.contains(&(j - first)))
                    .collect()
            } else {
                BTreeSet::new()
            };
            let opts: Vec<Option<BTreeSet<usize>>> = offset_options(graph, r, &offsets)
                .into_iter()
                .map(|o| o.map(|offs| offs.iter().map(|x| first + x).collect()))
                .collect();
            let mut h = Vec::with_capacity(opts.len());
            let mut c = Vec::with_capacity(opts.len());
            let mut mine = Vec::with_capacity(opts.len());
            let mut mine_lb = Vec::with_capacity(opts.len());
            let mut most_early = vec![i64::MIN; base_points.len()];
            let with = |o: &Option<BTreeSet<usize>>| {
                let mut plan = full.clone();
                match o {
                    None => {
                        plan.wrapped.remove(&r);
                    }
                    Some(keep) => {
                        plan.wrapped.insert(r, keep.clone());
                    }
                }
                plan
            };
            for o in &opts {
                let Some((d, at_own, stats)) = sim(&with(o), k)? else {
                    return Ok(None);
                };
                let mut later = i64::MIN;
                let mut later_min = i64::MAX;
                for (t, &dt) in d.iter().enumerate() {
                    match owner[t].cmp(&k) {
                        std::cmp::Ordering::Equal => {}
                        std::cmp::Ordering::Greater => {
                            later = later.max(dt);
                            later_min = later_min.min(dt);
                        }
                        std::cmp::Ordering::Less => {
                            most_early[t] = most_early[t].max(dt);
                            if dt != 0 {
                                exact_shape = false;
                            }
                        }
                    }
                }
                if later != i64::MIN && later != later_min {
                    exact_shape = false;
                }
                h.push(if later == i64::MIN { 0 } else { later });
                c.push(stats.rerun_cost.get(&r).copied().unwrap_or(0.0));
                mine_lb.push(
                    at_own
                        .iter()
                        .map(|p| {
                            p.filter(|&(op, rerun_of, _)| {
                                o.is_none() || rerun_of.is_none() || !rest.contains(&op)
                            })
                            .map(|(_, _, b)| b)
                        })
                        .collect(),
                );
                mine.push(at_own.iter().map(|p| p.map(|(_, _, b)| b)).collect());
            }
            // The ops not enumerated, each kept alone: what it adds while later regions run
            // (the full plan adds nothing), the least over their points.
            let mut items = Vec::with_capacity(rest.len());
            for &j in &rest {
                let Some((d, _, _)) = sim(&with(&Some(BTreeSet::from([j]))), k)? else {
                    return Ok(None);
                };
                let added = (0..d.len())
                    .filter(|&t| owner[t] > k)
                    .map(|t| d[t])
                    .min()
                    .unwrap_or(0)
                    .max(0);
                items.push((added, graph.ops[j].cost));
            }
            options.push(opts);
            held.push(h);
            cost.push(c);
            own.push(mine);
            own_lb.push(mine_lb);
            rest_items.push(items);
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
        let most_at = |at: &[Option<i64>], k: usize| -> i64 {
            at.iter()
                .zip(&owned[k])
                .filter_map(|(b, &t)| b.map(|b| b + ahead[t]))
                .max()
                .unwrap_or(0)
        };
        let active: Vec<Vec<i64>> = (0..n)
            .map(|k| own[k].iter().map(|at| most_at(at, k)).collect())
            .collect();
        // The relaxation of a keep set with ops not enumerated: its enumerated part's held
        // bytes plus the least the others add, its enumerated part's most bytes at the points
        // it shares with it (keeping more never lowers a shared point: what a re-run
        // regenerates is already held), and its enumerated part's cost less theirs (a kept op
        // is not run again).
        let relaxed = (!complete).then(|| {
            let mut rh = Vec::with_capacity(n);
            let mut ra = Vec::with_capacity(n);
            let mut rc = Vec::with_capacity(n);
            for k in 0..n {
                let front = subset_frontier(&rest_items[k]);
                let (mut h, mut a, mut c) = (Vec::new(), Vec::new(), Vec::new());
                for (o, opt) in options[k].iter().enumerate() {
                    let lb = most_at(&own_lb[k][o], k);
                    let front: &[(i64, f64)] = if opt.is_some() { &front } else { &[(0, 0.0)] };
                    for &(bytes, saving) in front {
                        h.push(held[k][o] + bytes);
                        a.push(lb);
                        c.push(cost[k][o] - saving);
                    }
                }
                rh.push(h);
                ra.push(a);
                rc.push(c);
            }
            Figures::new(rh, ra, rc).0
        });
        let (fig, kept) = Figures::new(held, active, cost);
        for (opts, keep) in options.iter_mut().zip(&kept) {
            retain_by(opts, keep);
        }
        let decided_apart = graph.storages_decided_apart();
        Ok(Some(ChainModel {
            order,
            options,
            fig,
            relaxed,
            keepable_ops,
            exact_shape,
            additive: decided_apart.as_ref().is_some_and(|a| a.is_empty()),
            decided_apart,
        }))
    }

    /// Whether every keepable op of every region is enumerated: then the class is every plan
    /// the torch-sac planner can express (any wrapped regions, any keep sets of keepable ops)
    /// and no relaxation is needed.
    pub fn complete(&self) -> bool {
        self.relaxed.is_none()
    }

    /// The bytes of one slot of the held prefix grid: a choice fitting `budget` less one slot
    /// per region is within reach of the program at `budget`.
    pub fn slot_bytes(&self) -> u64 {
        self.fig.slot as u64
    }

    /// The regions in forward order.
    pub fn regions(&self) -> usize {
        self.order.len()
    }

    fn choice(&self, graph: &TorchGraph, picks: &[usize]) -> ChainChoice {
        let mut plan = SacPlan::default();
        let mut prefix = 0i64;
        let mut bound = i64::MIN;
        let mut cost = graph.base_cost();
        for (k, (&r, &o)) in self.order.iter().zip(picks).enumerate() {
            bound = bound.max(prefix + self.fig.active[k][o]);
            prefix += self.fig.held[k][o];
            cost += self.fig.cost[k][o];
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
        let (picks, _) = self.fig.cheapest(&self.fig.held_slots, budget)?;
        Some(self.choice(graph, &picks))
    }

    /// Whether the program is exact: the values are additive and the figures have the exact
    /// shape, so every choice's bound is its simulated peak.
    pub fn exact(&self) -> bool {
        self.additive && self.exact_shape
    }

    /// A lower bound on the cost of every plan of the class whose peak fits `budget`: the
    /// program with the held bytes rounded down, where it is exact (`None` otherwise, or when
    /// no plan of the class fits: then `Some(f64::INFINITY)`). Where the options are not every
    /// keep set, it runs on their relaxation, which stands for every keep set. Every plan the
    /// torch-sac planner can express is in the class, so it bounds the planner's answer.
    pub fn lower_bound(&self, graph: &TorchGraph, budget: u64) -> Option<f64> {
        if !self.exact() {
            return None;
        }
        let fig = self.relaxed.as_ref().unwrap_or(&self.fig);
        Some(
            fig.cheapest(&fig.held_slots_down, budget)
                .map_or(f64::INFINITY, |(_, cost)| graph.base_cost() + cost),
        )
    }

    /// The least bound any choice has (held bytes rounded up to the grid), with the cheapest
    /// choice at that bound.
    pub fn least(&self, graph: &TorchGraph) -> Option<ChainChoice> {
        let (picks, _) = self.fig.program(&self.fig.held_slots, |v, prefix, k, o| {
            Some(v.max((prefix + self.fig.active[k][o]) as f64))
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
            bound = bound.max(prefix + self.fig.active[k][o]);
            prefix += self.fig.held_min[k] + self.fig.held_slots[k][o] as i64 * self.fig.slot;
        }
        bound.max(0) as u64
    }
}

impl Figures {
    /// The cheapest choice (and its re-run cost) whose bound, with held bytes as `slots`,
    /// fits `budget`.
    fn cheapest(&self, slots: &[Vec<usize>], budget: u64) -> Option<(Vec<usize>, f64)> {
        let budget = i64::try_from(budget).unwrap_or(i64::MAX);
        self.program(slots, |v, prefix, k, o| {
            (prefix.saturating_add(self.active[k][o]) <= budget).then(|| v + self.cost[k][o])
        })
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
        let mut choice: Vec<Vec<u16>> = Vec::with_capacity(slots.len());
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
        let mut picks = vec![0; slots.len()];
        let mut p = end;
        for k in (0..slots.len()).rev() {
            let o = choice[k][p] as usize;
            picks[k] = o;
            p -= slots[k][o];
        }
        Some((picks, best))
    }
}
