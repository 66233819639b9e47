//! The `torch-sac` planner: the candidates it chooses among, whatever the budget, and the
//! choice ([`plan`], [`Candidates`]).

use super::chain::{self, ChainModel};
use super::model::{held_bytes, keepable, overhead, simulate, SacPlan, SacStats, TorchGraph};
use crate::cancel::Cancel;
use crate::error::Result;
use crate::plan::{gap, sweep_budgets, ParetoPoint, Status, OPTIMAL_GAP};
use serde::Serialize;

/// How a plan came out.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SacReport {
    pub budget_bytes: u64,
    /// `fits`, or `infeasible` (the budget is below every plan's peak; the plan is the one with
    /// the least peak found, `min_peak_bytes`).
    pub status: &'static str,
    pub min_peak_bytes: u64,
    pub unplanned_peak_bytes: u64,
    pub predicted: SacStats,
    /// Accepted moves, in order.
    pub moves: usize,
    /// A lower bound on the compute cost of every plan the planner can express whose peak fits
    /// the budget, for a plan that fits: the chain program's ([`ChainModel::lower_bound`])
    /// where it is exact, else the unplanned step's cost, which every plan runs at least.
    pub lower_bound: Option<SacBound>,
}

/// A lower bound on a torch-sac plan's compute cost and where it comes from.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct SacBound {
    pub compute_cost: f64,
    /// `chain_program` (the chain program with held bytes rounded down, where it is exact; on
    /// its relaxation where it does not enumerate every keep set), `pinned_chain_program` (the
    /// same on [`TorchGraph::pinned`], at the budget plus the pinned bytes) or `unplanned_step`
    /// (the step's own cost: no plan runs less).
    pub source: &'static str,
}

/// Chooses wrapped regions and keep sets whose simulated peak fits `budget` at the least
/// re-run cost found among a set of plans that does not depend on the budget ([`Candidates`]),
/// so a larger budget never costs more. Below the least peak of that set the answer is its
/// least-peak plan with status `infeasible`.
pub fn plan(graph: &TorchGraph, budget: u64) -> Result<(SacPlan, SacReport)> {
    Candidates::new(graph)?.select(budget)
}

/// The plans [`plan`] chooses among, fixed by the graph alone: the unplanned step, full
/// checkpointing, every point of a path of moves from full checkpointing towards the unplanned
/// step ([`path`]), and the budgeted [`greedy`] at budgets spread over that path by position;
/// each with its simulated figures and the moves that made it.
pub struct Candidates {
    /// The unplanned step first, then full checkpointing, the path's points and the greedy's.
    plans: Vec<(SacPlan, SacStats, usize)>,
    /// Index in `plans` of the least peak (the cheapest among equal peaks).
    least: usize,
    /// The chain program, solved again at each budget [`Candidates::select`] is asked for,
    /// and the graph its choices are simulated on.
    chain: Option<(ChainModel, TorchGraph)>,
    /// Where the chain program's values do not add up because of storages
    /// made outside the regions ([`TorchGraph::storages_decided_apart`]): the program on the
    /// graph with them pinned ([`TorchGraph::pinned`]), exact there, and their bytes. Its lower
    /// bound at a budget plus those bytes bounds every plan that fits the budget here.
    pinned: Option<(ChainModel, TorchGraph, u64)>,
}

impl Candidates {
    pub fn new(graph: &TorchGraph) -> Result<Self> {
        Self::with_parts(graph, true, true)
    }

    /// The candidates, with or (to measure what they add) without the [`block_plans`] and the
    /// chain program ([`ChainModel`]).
    pub fn with_parts(graph: &TorchGraph, blocks: bool, chain_program: bool) -> Result<Self> {
        const GREEDY_RUNS: usize = 12;
        let unplanned = simulate(graph, &SacPlan::default())?;
        let full = SacPlan::full(graph);
        let full_stats = simulate(graph, &full)?;
        let points = path(graph, &full, &full_stats)?;
        let step = points.len().div_ceil(GREEDY_RUNS).max(1);
        let grid: Vec<u64> = points
            .iter()
            .step_by(step)
            .chain(points.last())
            .map(|(_, s)| s.peak_bytes)
            .collect();
        let mut plans = vec![
            (SacPlan::default(), unplanned, 0),
            (full.clone(), full_stats.clone(), 0),
        ];
        plans.extend(points.into_iter().enumerate().map(|(i, (p, s))| (p, s, i)));
        for b in grid {
            plans.push(greedy(graph, b, &full, &full_stats)?);
        }
        let mut chain = None;
        if blocks {
            plans.extend(block_plans(graph, &full)?);
        }
        let mut pinned = None;
        if chain_program {
            chain = ChainModel::build(graph)?.map(|m| (m, graph.clone()));
            if let Some((m, _)) = chain.as_ref().filter(|(m, _)| !m.exact()) {
                pinned = pinned_program(graph, m)?;
            }
        }
        if let Some((model, _)) = &chain {
            // The program's least-bound choice, and its choices at budgets spread from there
            // to the unplanned peak: candidates for the least peak and for the gate's queries.
            if let Some(least) = model.least(graph) {
                let lo = least.bound_bytes;
                let hi = plans[0].1.peak_bytes.max(lo);
                plans.push((least.plan.clone(), simulate(graph, &least.plan)?, 0));
                for i in 1..=CHAIN_GRID {
                    let b = lo + ((hi - lo) as f64 * i as f64 / CHAIN_GRID as f64) as u64;
                    if let Some(c) = model.solve(graph, b) {
                        let stats = simulate(graph, &c.plan)?;
                        plans.push((c.plan, stats, 0));
                    }
                }
            }
        }
        let least = (0..plans.len())
            .min_by(|&a, &b| {
                let (sa, sb) = (&plans[a].1, &plans[b].1);
                (sa.peak_bytes, sa.compute_cost)
                    .partial_cmp(&(sb.peak_bytes, sb.compute_cost))
                    .unwrap_or(std::cmp::Ordering::Equal)
            })
            .expect("two plans at least");
        Ok(Candidates {
            plans,
            least,
            chain,
            pinned,
        })
    }

    /// The unplanned step's figures.
    fn unplanned(&self) -> &SacStats {
        &self.plans[0].1
    }

    /// Full checkpointing's figures.
    fn full(&self) -> &SacStats {
        &self.plans[1].1
    }

    /// A budget: bytes or a size (`"8GiB"`), `"0.5x"` of the unplanned peak, or `"min"` (the
    /// least peak of the candidates).
    pub fn budget(&self, budget: &str) -> Result<u64> {
        if budget.trim().eq_ignore_ascii_case("min") {
            return Ok(self.least_peak());
        }
        crate::plan::parse_budget(budget, self.unplanned().peak_bytes)
    }

    /// The least peak any candidate reaches: the least feasible budget.
    pub fn least_peak(&self) -> u64 {
        self.plans[self.least].1.peak_bytes
    }

    /// The least peak of a candidate whose overhead is at most `cap` (a fraction of the step's
    /// cost): what `remat gate` tracks as `best_peak_within_overhead_bytes`. The unplanned step,
    /// overhead 0, is a candidate and bounds it from above.
    pub fn least_peak_within_overhead(&self, cap: f64) -> u64 {
        self.plans
            .iter()
            .filter(|(_, s, _)| s.overhead() <= cap + 1e-12)
            .map(|(_, s, _)| s.peak_bytes)
            .min()
            .unwrap_or(self.unplanned().peak_bytes)
    }

    /// The cheapest candidate that fits `budget` (the least peak among equal costs), or the
    /// least-peak one with status `infeasible`.
    pub fn select(&self, budget: u64) -> Result<(SacPlan, SacReport)> {
        let report = |status, predicted: &SacStats, moves, lower_bound| SacReport {
            budget_bytes: budget,
            status,
            min_peak_bytes: self.least_peak(),
            unplanned_peak_bytes: self.unplanned().peak_bytes,
            predicted: predicted.clone(),
            moves,
            lower_bound,
        };
        // The chain program at this budget, when the simulator confirms that it fits.
        let mut at_budget = None;
        if let Some((c, graph)) = self
            .chain
            .as_ref()
            .and_then(|(m, g)| Some((m.solve(g, budget)?, g)))
        {
            let stats = simulate(graph, &c.plan)?;
            if stats.peak_bytes <= budget {
                at_budget = Some((c.plan, stats, 0));
            }
        }
        let best = self
            .plans
            .iter()
            .chain(at_budget.as_ref())
            .filter(|(_, s, _)| s.peak_bytes <= budget)
            .min_by(|a, b| {
                (a.1.compute_cost, a.1.peak_bytes)
                    .partial_cmp(&(b.1.compute_cost, b.1.peak_bytes))
                    .unwrap_or(std::cmp::Ordering::Equal)
            });
        Ok(match best {
            Some((p, s, moves)) => {
                // A bound above the answer would call a worse plan optimal: never reported.
                let chain = self
                    .chain
                    .as_ref()
                    .and_then(|(m, g)| m.lower_bound(g, budget))
                    .filter(|&b| b <= s.compute_cost * (1.0 + 1e-12));
                let pinned = self
                    .pinned
                    .as_ref()
                    .and_then(|(m, g, bytes)| m.lower_bound(g, budget.saturating_add(*bytes)))
                    .filter(|&b| b <= s.compute_cost * (1.0 + 1e-12));
                let bound = match (chain, pinned) {
                    (Some(b), _) => SacBound {
                        compute_cost: b,
                        source: "chain_program",
                    },
                    (None, Some(b)) if b > self.unplanned().compute_cost => SacBound {
                        compute_cost: b,
                        source: "pinned_chain_program",
                    },
                    _ => SacBound {
                        compute_cost: self.unplanned().compute_cost,
                        source: "unplanned_step",
                    },
                };
                (p.clone(), report("fits", s, *moves, Some(bound)))
            }
            None => {
                let (p, s, moves) = &self.plans[self.least];
                (p.clone(), report("infeasible", s, *moves, None))
            }
        })
    }
}

/// The torch-sac plans at budgets `fractions` of the unplanned peak (rounded up), as the free
/// model's [`crate::plan::sweep`] gives its frontier: per budget the plan's overhead, its gap to
/// the plan's lower bound ([`SacReport::lower_bound`]; `optimal` within
/// [`crate::plan::OPTIMAL_GAP`]), and the two fixed policies side by side: `none` (PyTorch's
/// own step, nothing wrapped) and `full` (every region checkpointed, nothing kept: Hugging
/// Face's `gradient_checkpointing_enable`, torchtitan's `full` mode), each with its overhead
/// where its peak fits. The candidates are built once. The budgets are planned from the
/// smallest up and a plan found at a smaller budget is kept where it is cheaper than what the
/// larger budget finds (`reused_from_budget_bytes`), so the overhead never rises with the
/// budget; below the least peak a point is `infeasible`.
pub fn sweep(graph: &TorchGraph, fractions: &[f64]) -> Result<SacSweep> {
    sweep_within(graph, fractions, &Cancel::default())
}

/// [`sweep`], stopping with [`crate::SolverError::Cancelled`] once `cancel` is raised: looked at
/// after the candidates are built and before each budget.
pub fn sweep_within(graph: &TorchGraph, fractions: &[f64], cancel: &Cancel) -> Result<SacSweep> {
    let candidates = Candidates::new(graph)?;
    cancel.check()?;
    let unplanned = candidates.unplanned();
    let full = candidates.full();
    let budgets = sweep_budgets(fractions, unplanned.peak_bytes)?;
    let mut order: Vec<usize> = (0..fractions.len()).collect();
    order.sort_by_key(|&i| budgets[i]);
    let mut points: Vec<Option<ParetoPoint>> = vec![None; fractions.len()];
    // The cheapest plan found so far: its cost and the budget it was found at.
    let mut below: Option<(f64, u64)> = None;
    for i in order {
        cancel.check()?;
        let budget = budgets[i];
        let (_, report) = candidates.select(budget)?;
        let fits = report.status == "fits";
        let mut cost = report.predicted.compute_cost;
        let mut reused = None;
        if let Some((c, at)) = below.filter(|&(c, _)| fits && c < cost) {
            (cost, reused) = (c, Some(at));
        }
        if fits && reused.is_none() {
            below = Some((cost, budget));
        }
        let gap = report
            .lower_bound
            .filter(|_| fits)
            .map(|b| gap(cost, b.compute_cost));
        let fitting = |s: &SacStats| (s.peak_bytes <= budget).then(|| s.overhead());
        points[i] = Some(ParetoPoint {
            budget_bytes: budget,
            fraction: fractions[i],
            status: match (fits, gap) {
                (false, _) => Status::Infeasible,
                (true, Some(g)) if g <= OPTIMAL_GAP => Status::Optimal,
                (true, _) => Status::Feasible,
            },
            overhead: fits.then(|| overhead(cost, unplanned.base_cost)),
            solver: SOLVER.to_string(),
            gap,
            bound_source: report
                .lower_bound
                .filter(|_| gap.is_some())
                .map(|b| b.source.to_string()),
            reused_from_budget_bytes: reused,
            baselines: vec![
                ("none".to_string(), fitting(unplanned)),
                ("full".to_string(), fitting(full)),
            ],
            min_feasible_budget_bytes: (!fits).then_some(report.min_peak_bytes),
        });
    }
    Ok(SacSweep {
        unplanned_peak_bytes: unplanned.peak_bytes,
        points: points.into_iter().flatten().collect(),
    })
}

/// A torch-sac sweep ([`sweep`]).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SacSweep {
    /// The unplanned step's peak, which the fractions are of.
    pub unplanned_peak_bytes: u64,
    /// A point per fraction, in their order.
    pub points: Vec<ParetoPoint>,
}

/// The solver name a torch-sac sweep's points carry.
pub const SOLVER: &str = "torch-sac";

/// The chain program on `graph` with its storages decided apart pinned, where that makes it
/// exact, with their bytes.
fn pinned_program(
    graph: &TorchGraph,
    model: &ChainModel,
) -> Result<Option<(ChainModel, TorchGraph, u64)>> {
    let Some(apart) = model.decided_apart.as_ref().filter(|a| !a.is_empty()) else {
        return Ok(None);
    };
    let g = graph.pinned(apart);
    if g.check().is_err() {
        return Ok(None);
    }
    let bytes = apart.iter().map(|&s| graph.storages[s].bytes).sum();
    Ok(ChainModel::build(&g)?
        .filter(|m| m.exact())
        .map(|m| (m, g, bytes)))
}

/// Budgets between the chain program's least bound and the unplanned peak at which its
/// choices join the candidates.
const CHAIN_GRID: usize = 32;
/// Most plans mixing two options [`block_plans`] simulates per class of blocks.
const BLOCK_MIXTURES: usize = 2048;

/// The block candidates. For each class of identical regions (copies of one block, in forward
/// order) with its other regions fully checkpointed: every copy given one option of the block
/// (unwrapped, or wrapped keeping one subset of its keepable ops: every subset when there are
/// at most 8, else every subset of the ones holding the most bytes), then,
/// among the options whose uniform plans are on the (peak, cost) Pareto front, the first `k`
/// copies given one and the rest another, for every `k` (the copies that run first hold what
/// they keep the longest). Each plan is simulated; at most [`BLOCK_MIXTURES`] mixtures per class
/// (adjacent front options only, when every pair would be more).
pub fn block_plans(graph: &TorchGraph, full: &SacPlan) -> Result<Vec<(SacPlan, SacStats, usize)>> {
    let mut out = Vec::new();
    for class in graph.classes() {
        // An option: None (unwrapped) or the offsets kept.
        let options =
            chain::offset_options(graph, class[0], &chain::option_offsets(graph, class[0]));
        let with = |choice: &dyn Fn(usize) -> usize| -> SacPlan {
            let mut plan = full.clone();
            for (i, &r) in class.iter().enumerate() {
                match &options[choice(i)] {
                    None => {
                        plan.wrapped.remove(&r);
                    }
                    Some(keep) => {
                        let first = graph.regions[r].first_op;
                        plan.wrapped
                            .insert(r, keep.iter().map(|o| first + o).collect());
                    }
                }
            }
            plan
        };
        // Uniform plans, and the options on their Pareto front.
        let mut uniform = Vec::with_capacity(options.len());
        for o in 0..options.len() {
            let plan = with(&|_| o);
            let stats = simulate(graph, &plan)?;
            uniform.push((o, stats.peak_bytes, stats.compute_cost));
            out.push((plan, stats, 0));
        }
        uniform.sort_by(|a, b| a.1.cmp(&b.1).then(a.2.total_cmp(&b.2)));
        let mut front: Vec<usize> = Vec::new();
        let mut best = f64::INFINITY;
        for &(o, _, cost) in &uniform {
            if cost < best {
                best = cost;
                front.push(o);
            }
        }
        let n = class.len();
        let pairs: Vec<(usize, usize)> = if front.len() * front.len() * (n - 1) <= BLOCK_MIXTURES {
            front
                .iter()
                .flat_map(|&a| front.iter().filter(move |&&b| b != a).map(move |&b| (a, b)))
                .collect()
        } else {
            front
                .windows(2)
                .flat_map(|w| [(w[0], w[1]), (w[1], w[0])])
                .take(BLOCK_MIXTURES / n.max(2))
                .collect()
        };
        for (a, b) in pairs {
            for k in 1..n {
                let plan = with(&|i| if i < k { a } else { b });
                let stats = simulate(graph, &plan)?;
                out.push((plan, stats, 0));
            }
        }
    }
    Ok(out)
}

/// Cost saved per byte held: the order moves are tried in.
fn density(saving: f64, bytes: u64) -> f64 {
    saving / (bytes.max(1) as f64)
}

/// The moves from `current`: keep an op in every copy of a block, keep an op in one region,
/// stop wrapping a region; with their static density.
fn moves_from(
    graph: &TorchGraph,
    classes: &[Vec<usize>],
    current: &SacPlan,
    stats: &SacStats,
) -> Vec<(f64, Move)> {
    let mut out = Vec::new();
    for class in classes.iter().filter(|c| c.len() > 1) {
        let first = class[0];
        let reg = &graph.regions[first];
        for j in reg.first_op..=reg.last_op {
            let offset = j - reg.first_op;
            let open = class.iter().all(|&r| {
                current
                    .wrapped
                    .get(&r)
                    .is_some_and(|k| !k.contains(&(graph.regions[r].first_op + offset)))
            });
            if open && keepable(graph, first, j) {
                let d = density(graph.ops[j].cost, held_bytes(graph, j));
                out.push((d, Move::KeepAll(class.clone(), offset)));
            }
        }
    }
    for (&r, kept) in &current.wrapped {
        let reg = &graph.regions[r];
        for j in reg.first_op..=reg.last_op {
            if !kept.contains(&j) && keepable(graph, r, j) {
                out.push((
                    density(graph.ops[j].cost, held_bytes(graph, j)),
                    Move::Keep(r, j),
                ));
            }
        }
        let rerun = stats.rerun_cost.get(&r).copied().unwrap_or(0.0);
        if rerun > 0.0 {
            let extra: u64 = (reg.first_op..=reg.last_op)
                .filter(|j| !kept.contains(j))
                .map(|j| held_bytes(graph, j))
                .sum();
            out.push((density(rerun, extra), Move::Unwrap(r)));
        }
    }
    out.sort_by(|a, b| b.0.total_cmp(&a.0));
    out
}

fn apply_move(graph: &TorchGraph, plan: &SacPlan, mv: &Move) -> Option<SacPlan> {
    let mut trial = plan.clone();
    match mv {
        Move::KeepAll(class, offset) => {
            for &r in class {
                let j = graph.regions[r].first_op + offset;
                if !trial.wrapped.get_mut(&r)?.insert(j) {
                    return None;
                }
            }
        }
        Move::Keep(r, j) => {
            if !trial.wrapped.get_mut(r)?.insert(*j) {
                return None;
            }
        }
        Move::Unwrap(r) => {
            trial.wrapped.remove(r)?;
        }
    }
    Some(trial)
}

/// A path of plans from full checkpointing towards the unplanned step, independent of any
/// budget: each step takes, among the densest moves, the one that saves the most cost per byte
/// of peak it adds (a move that adds none first).
pub fn path(
    graph: &TorchGraph,
    full: &SacPlan,
    full_stats: &SacStats,
) -> Result<Vec<(SacPlan, SacStats)>> {
    // Moves simulated per step: the densest by their static figures.
    const TRIED: usize = 24;
    // The copies of each block, found once (their signature reads every op).
    let classes = graph.classes();
    let mut current = full.clone();
    let mut stats = full_stats.clone();
    let mut points = vec![(current.clone(), stats.clone())];
    loop {
        let mut chosen: Option<(f64, SacPlan, SacStats)> = None;
        for (_, mv) in moves_from(graph, &classes, &current, &stats)
            .into_iter()
            .take(TRIED)
        {
            let Some(trial) = apply_move(graph, &current, &mv) else {
                continue;
            };
            let s = simulate(graph, &trial)?;
            let saving = stats.compute_cost - s.compute_cost;
            if saving <= 0.0 {
                continue;
            }
            let added = s.peak_bytes.saturating_sub(stats.peak_bytes);
            let score = if added == 0 {
                f64::INFINITY
            } else {
                saving / added as f64
            };
            let better = chosen.as_ref().is_none_or(|(best, _, b)| {
                score > *best || (score == *best && s.compute_cost < b.compute_cost)
            });
            if better {
                chosen = Some((score, trial, s));
            }
        }
        let Some((_, trial, s)) = chosen else {
            break;
        };
        current = trial;
        stats = s;
        points.push((current.clone(), stats.clone()));
    }
    Ok(points)
}

/// The budgeted greedy: from full checkpointing, the densest moves first, each accepted when
/// the simulated peak still fits `budget` and it saves cost; repeated until none is accepted.
pub fn greedy(
    graph: &TorchGraph,
    budget: u64,
    full: &SacPlan,
    full_stats: &SacStats,
) -> Result<(SacPlan, SacStats, usize)> {
    // The copies of each block, found once (their signature reads every op).
    let classes = graph.classes();
    let mut current = full.clone();
    let mut stats = full_stats.clone();
    let mut moves = 0;
    loop {
        let mut improved = false;
        for (_, mv) in moves_from(graph, &classes, &current, &stats) {
            let Some(trial) = apply_move(graph, &current, &mv) else {
                continue;
            };
            let s = simulate(graph, &trial)?;
            if s.peak_bytes <= budget && s.compute_cost < stats.compute_cost {
                current = trial;
                stats = s;
                moves += 1;
                improved = true;
            }
        }
        if !improved {
            break;
        }
    }
    Ok((current, stats, moves))
}

#[derive(Debug, Clone)]
enum Move {
    /// Keep the op at this offset in every region of a class of copies.
    KeepAll(Vec<usize>, usize),
    Keep(usize, usize),
    Unwrap(usize),
}
