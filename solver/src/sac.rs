//! The `torch-sac` execution model: what PyTorch eager runs with non-reentrant
//! `torch.utils.checkpoint` around regions and a selective-checkpoint policy inside each.
//!
//! The input is a [`TorchGraph`]: one training step as PyTorch ran it (`remat.torch.capture`
//! records it; docs/torch.md documents the format). Every storage has the op that allocated it,
//! when it died in the unplanned step (`free_after`), when it would die if autograd saved nothing
//! (`natural_free_after`, set by the Python code's own references), and which region saved it.
//!
//! A [`SacPlan`] wraps some regions and keeps, in each, the outputs of some ops (`MUST_SAVE`);
//! every other op of a wrapped region is `PREFER_RECOMPUTE`. [`simulate`] replays the step the
//! way PyTorch runs it under that plan:
//! - forward: a value saved only by its own wrapped region and not kept dies at its natural
//!   death; everything else lives as in the unplanned step (kept values are held by the SAC
//!   cache, region inputs by the checkpoint);
//! - backward: at the region's trigger (the first unpack of a value it saved) the region's
//!   forward re-runs from its first op through its stop op (the op after which its last value
//!   was saved: early stop), skipping kept ops (their cached outputs are returned); a re-run
//!   op's saved outputs live until their unplanned backward death, the others die at their
//!   natural death within the re-run, or when it stops.
//!
//! [`plan`] chooses wrapped regions and keep sets under a byte budget: the cheapest plan that
//! fits among candidates that do not depend on the budget (a [`path`] of moves from full
//! checkpointing, the budgeted [`greedy`] at budgets taken from the path, and the
//! [`block_plans`] of each class of identical regions), so a larger budget never costs more.
//! The moves are "keep op j" (in every copy of a block, or in one region) and "do not wrap
//! region r". The block plans give every copy of a block one of its options (each keep set of
//! its keepable ops, or unwrapped) computed once for the block, or the first copies one
//! option and the rest another. It is a heuristic, not an exact solver: the block plans are
//! exhaustive only within that class.

use crate::error::{Result, SolverError};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet, HashMap};

/// The document format name `remat.torch.capture` writes.
pub const FORMAT: &str = "remat.torch-graph";
/// The format version this module reads.
pub const VERSION: u32 = 1;
/// The format name of the plan documents this module writes (`remat.torch.apply` reads them).
pub const PLAN_FORMAT: &str = "remat.torch-plan";

/// One captured training step (docs/torch.md, "The captured graph").
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TorchGraph {
    pub format: String,
    pub version: u32,
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub device: String,
    /// `"flop"` or `"second"`.
    #[serde(default)]
    pub cost_unit: String,
    /// What the plan is for (parameters, inputs, regions), hashed.
    #[serde(default)]
    pub fingerprint: String,
    /// The parameters', buffers' and inputs' shapes, passed through to the plan.
    #[serde(default)]
    pub signature: serde_json::Value,
    /// Bytes of parameters, buffers and inputs: resident throughout.
    pub fixed_bytes: u64,
    /// Ops `0..forward_ops` are the forward (and the loss); the rest the backward.
    pub forward_ops: usize,
    pub regions: Vec<TorchRegion>,
    pub ops: Vec<TorchOp>,
    pub storages: Vec<TorchStorage>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TorchRegion {
    /// The module's fully qualified name (`transformer.h.3`).
    pub fqn: String,
    /// Its class (`GPT2Block`).
    #[serde(default, rename = "class")]
    pub class_name: String,
    pub first_op: usize,
    pub last_op: usize,
    /// The op after which the region saved its last value; `None`: it saved nothing.
    pub stop_op: Option<usize>,
    /// The backward op before which a value the region saved was first unpacked.
    pub trigger_op: Option<usize>,
    /// Storages passed to the region's forward (the checkpoint holds them).
    #[serde(default)]
    pub inputs: Vec<usize>,
    /// Bytes held only while the region re-runs (`remat.torch.apply` copies the region's
    /// buffers so that BatchNorm's running statistics are updated once).
    #[serde(default)]
    pub rerun_extra_bytes: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TorchOp {
    /// The aten overload (`aten.mm.default`): what the SAC policy sees.
    pub op: String,
    #[serde(default)]
    pub phase: String,
    /// The module that ran it.
    #[serde(default)]
    pub module: String,
    pub region: Option<usize>,
    /// Its index among the region's calls of the same op (SAC's key); `None` outside regions
    /// and for the ops SAC ignores.
    pub occurrence: Option<usize>,
    pub cost: f64,
    /// Storages it allocated (views and in-place results allocate none).
    pub outputs: Vec<usize>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TorchStorage {
    pub bytes: u64,
    pub producer: usize,
    /// Dies after this op in the unplanned step; `None`: outlives the step.
    pub free_after: Option<usize>,
    /// Dies after this forward op when autograd keeps nothing; `None`: alive at the forward's end.
    pub natural_free_after: Option<usize>,
    #[serde(default)]
    pub saves: Vec<TorchSave>,
    /// Written in place after it was made (SAC's cache refuses such values).
    #[serde(default)]
    pub mutated: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TorchSave {
    pub after_op: usize,
    /// The region whose forward saved it (the innermost on the module stack), if any.
    pub region: Option<usize>,
    /// The op after which autograd released this saved value in the unplanned step (its node
    /// had run); `None`: not released within the step.
    #[serde(default)]
    pub released_after: Option<usize>,
}

impl TorchGraph {
    /// Reads and checks a captured graph: every index in range, regions' ranges in the forward,
    /// costs finite. Errors name the field.
    pub fn from_json(text: &str) -> Result<Self> {
        let g: TorchGraph =
            serde_json::from_str(text).map_err(|e| SolverError::Json(e.to_string()))?;
        g.check()?;
        Ok(g)
    }

    pub fn check(&self) -> Result<()> {
        let bad = |what: String| Err(SolverError::GraphFormat { what });
        if self.format != FORMAT {
            return bad(format!("format is {:?}, expected {FORMAT:?}", self.format));
        }
        if self.version != VERSION {
            return bad(format!(
                "version {} of {FORMAT}; this build reads version {VERSION}",
                self.version
            ));
        }
        let n = self.ops.len();
        if self.forward_ops > n {
            return bad(format!("forward_ops {} > {} ops", self.forward_ops, n));
        }
        for (i, op) in self.ops.iter().enumerate() {
            if !op.cost.is_finite() || op.cost < 0.0 {
                return bad(format!(
                    "ops[{i}] ({}): cost {} is not a finite number ≥ 0",
                    op.op, op.cost
                ));
            }
            if let Some(r) = op.region {
                if r >= self.regions.len() {
                    return bad(format!("ops[{i}] ({}): region {r} does not exist", op.op));
                }
            }
            for &s in &op.outputs {
                match self.storages.get(s) {
                    Some(st) if st.producer == i => {}
                    Some(st) => {
                        return bad(format!(
                            "ops[{i}] ({}): output storage {s} names producer {}",
                            op.op, st.producer
                        ))
                    }
                    None => {
                        return bad(format!(
                            "ops[{i}] ({}): output storage {s} does not exist",
                            op.op
                        ))
                    }
                }
            }
        }
        for (s, st) in self.storages.iter().enumerate() {
            if st.producer >= n || !self.ops[st.producer].outputs.contains(&s) {
                return bad(format!(
                    "storages[{s}]: producer {} does not list it",
                    st.producer
                ));
            }
            for (field, at) in [
                ("free_after", st.free_after),
                ("natural_free_after", st.natural_free_after),
            ] {
                if let Some(at) = at {
                    if at < st.producer || at >= n {
                        return bad(format!(
                            "storages[{s}]: {field} {at} is not between its producer {} and the last op {}",
                            st.producer,
                            n.saturating_sub(1)
                        ));
                    }
                }
            }
            for save in &st.saves {
                if save.after_op >= n
                    || save.region.is_some_and(|r| r >= self.regions.len())
                    || save.released_after.is_some_and(|a| a >= n)
                {
                    return bad(format!(
                        "storages[{s}]: a save names op {} / region {:?}, out of range",
                        save.after_op, save.region
                    ));
                }
            }
        }
        for (r, reg) in self.regions.iter().enumerate() {
            let in_forward = |x: usize| x < self.forward_ops;
            if reg.first_op > reg.last_op || !in_forward(reg.last_op) {
                return bad(format!(
                    "regions[{r}] ({}): ops {}..={} are not a range in the forward (forward_ops {})",
                    reg.fqn, reg.first_op, reg.last_op, self.forward_ops
                ));
            }
            if let Some(stop) = reg.stop_op {
                if stop + 1 < reg.first_op || stop > reg.last_op {
                    return bad(format!(
                        "regions[{r}] ({}): stop_op {stop} is outside its ops",
                        reg.fqn
                    ));
                }
            }
            if reg
                .trigger_op
                .is_some_and(|t| t < self.forward_ops || t > n)
            {
                return bad(format!(
                    "regions[{r}] ({}): trigger_op is not a backward position",
                    reg.fqn
                ));
            }
            if reg.stop_op.is_some() != reg.trigger_op.is_some() {
                return bad(format!(
                    "regions[{r}] ({}): stop_op and trigger_op must both be set or both null",
                    reg.fqn
                ));
            }
            for i in reg.first_op..=reg.last_op {
                if self.ops[i].region != Some(r) {
                    return bad(format!(
                        "regions[{r}] ({}): op {i} ({}) inside its range belongs to region {:?}",
                        reg.fqn, self.ops[i].op, self.ops[i].region
                    ));
                }
            }
            if let Some(&s) = reg.inputs.iter().find(|&&s| s >= self.storages.len()) {
                return bad(format!(
                    "regions[{r}] ({}): input storage {s} does not exist",
                    reg.fqn
                ));
            }
        }
        Ok(())
    }

    /// Bytes autograd saves for the backward in the unplanned step: every storage saved at
    /// least once, counted once.
    pub fn saved_bytes(&self) -> u64 {
        self.storages
            .iter()
            .filter(|s| !s.saves.is_empty())
            .map(|s| s.bytes)
            .sum()
    }

    /// The cost of the unplanned step: every op once.
    pub fn base_cost(&self) -> f64 {
        self.ops.iter().map(|o| o.cost).sum()
    }

    /// The last op a region's re-run executes (early stop), if it re-runs at all.
    fn replay_end(&self, r: usize) -> Option<usize> {
        let reg = &self.regions[r];
        reg.stop_op.filter(|&s| s >= reg.first_op)
    }

    /// Regions that are copies of one another: same class, same op sequence, costs and bytes.
    pub fn classes(&self) -> Vec<Vec<usize>> {
        let mut by_sig: BTreeMap<String, Vec<usize>> = BTreeMap::new();
        for (r, reg) in self.regions.iter().enumerate() {
            let mut sig = format!(
                "{}|{:?}|",
                reg.class_name,
                reg.stop_op.map(|s| s as i64 - reg.first_op as i64)
            );
            for op in &self.ops[reg.first_op..=reg.last_op] {
                let bytes: u64 = op.outputs.iter().map(|&s| self.storages[s].bytes).sum();
                sig.push_str(&format!("{}:{}:{};", op.op, op.cost, bytes));
            }
            by_sig.entry(sig).or_default().push(r);
        }
        let mut classes: Vec<Vec<usize>> = by_sig.into_values().collect();
        classes.sort();
        classes
    }

    /// When storage `s` dies under `plan`: the last of its natural death and the releases of the
    /// saves that still hold it. A save inside a wrapped region holds it only when SAC keeps it
    /// (its producer is kept there) or when it is one of the region's inputs (the checkpoint
    /// holds those); autograd holds every other save as in the unplanned step.
    fn death(&self, s: usize, plan: &Resolved) -> Death {
        let st = &self.storages[s];
        let rp = self.ops[st.producer].region;
        if let Some(r) = rp {
            // SAC caches every output of a kept op, saved or not, until the re-run takes it
            // back; an output no save of the region holds then lives as in the re-run.
            let cached = plan.wrapped[r] && plan.keep[r].contains(&st.producer);
            if cached && !st.saves.iter().any(|sv| sv.region == Some(r)) {
                let outside = st
                    .saves
                    .iter()
                    .map(|sv| sv.released_after.or(st.free_after));
                if outside
                    .clone()
                    .all(|at| at.is_some_and(|a| Some(a) <= st.natural_free_after))
                {
                    return Death::InRerun;
                }
            }
        }
        let held = |sv: &TorchSave| match sv.region {
            None => true,
            Some(r) if !plan.wrapped[r] => true,
            Some(r) => {
                (rp == Some(r) && plan.keep[r].contains(&st.producer))
                    || plan.inputs[r].contains(&s)
            }
        };
        if st.saves.iter().all(held) {
            return Death::At(st.free_after);
        }
        let Some(natural) = st.natural_free_after else {
            return Death::At(None);
        };
        let mut at = Some(natural);
        for sv in st.saves.iter().filter(|sv| held(sv)) {
            at = match (at, sv.released_after.or(st.free_after)) {
                (Some(a), Some(b)) => Some(a.max(b)),
                _ => None,
            };
        }
        Death::At(at)
    }
}

/// When a storage dies under a plan.
enum Death {
    /// After this op (`None`: not within the step).
    At(Option<usize>),
    /// Held by the SAC cache until its region re-runs, then as a re-run output.
    InRerun,
}

/// A plan in the `torch-sac` model: for each region whether it is wrapped and which of its ops
/// are kept (by op index in the graph).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct SacPlan {
    /// Wrapped regions and their kept ops; a region not listed runs unwrapped.
    pub wrapped: BTreeMap<usize, BTreeSet<usize>>,
}

impl SacPlan {
    /// Every region wrapped, nothing kept: full checkpointing of every region.
    pub fn full(graph: &TorchGraph) -> Self {
        SacPlan {
            wrapped: (0..graph.regions.len())
                .map(|r| (r, BTreeSet::new()))
                .collect(),
        }
    }
}

struct Resolved {
    wrapped: Vec<bool>,
    keep: Vec<BTreeSet<usize>>,
    /// The storages passed to each wrapped region (empty for the others).
    inputs: Vec<BTreeSet<usize>>,
}

impl Resolved {
    fn new(graph: &TorchGraph, plan: &SacPlan) -> Result<Self> {
        let mut wrapped = vec![false; graph.regions.len()];
        let mut keep = vec![BTreeSet::new(); graph.regions.len()];
        let mut inputs = vec![BTreeSet::new(); graph.regions.len()];
        for (&r, ops) in &plan.wrapped {
            let reg = graph.regions.get(r).ok_or_else(|| {
                SolverError::InvalidArgument(format!("plan wraps region {r}, which does not exist"))
            })?;
            if let Some(&j) = ops.iter().find(|&&j| j < reg.first_op || j > reg.last_op) {
                return Err(SolverError::InvalidArgument(format!(
                    "plan keeps op {j} in region {} ({}), which runs ops {}..={}",
                    r, reg.fqn, reg.first_op, reg.last_op
                )));
            }
            wrapped[r] = true;
            keep[r] = ops.clone();
            inputs[r] = reg.inputs.iter().copied().collect();
        }
        Ok(Resolved {
            wrapped,
            keep,
            inputs,
        })
    }
}

/// What [`simulate`] reports of a plan.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SacStats {
    /// Largest resident bytes, fixed bytes included, after any op's allocations.
    pub peak_bytes: u64,
    /// The op at the peak, and the region re-running when it is inside a re-run.
    pub peak_op: usize,
    pub peak_in_rerun_of: Option<usize>,
    /// Cost of the step: every op once plus the re-runs.
    pub compute_cost: f64,
    pub base_cost: f64,
    /// Cost of each wrapped region's re-run.
    pub rerun_cost: BTreeMap<usize, f64>,
    /// Bytes resident when the forward ends (fixed bytes included).
    pub forward_end_bytes: u64,
}

impl SacStats {
    pub fn overhead(&self) -> f64 {
        if self.base_cost > 0.0 {
            self.compute_cost / self.base_cost - 1.0
        } else {
            0.0
        }
    }
}

/// Replays the step as PyTorch runs it under `plan` and returns its peak and cost.
pub fn simulate(graph: &TorchGraph, plan: &SacPlan) -> Result<SacStats> {
    let res = Resolved::new(graph, plan)?;
    Ok(run(graph, &res, None))
}

/// One point of the memory timeline: resident bytes right after an op's allocations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct TimelinePoint {
    pub op: usize,
    /// The region whose re-run ran the op, if it is a re-run.
    pub rerun_of: Option<usize>,
    pub bytes: u64,
}

/// The memory timeline [`simulate`] walks: one point per op the step runs, re-runs included.
pub fn timeline(graph: &TorchGraph, plan: &SacPlan) -> Result<Vec<TimelinePoint>> {
    let res = Resolved::new(graph, plan)?;
    let mut points = Vec::with_capacity(graph.ops.len());
    run(graph, &res, Some(&mut points));
    Ok(points)
}

fn run(
    graph: &TorchGraph,
    res: &Resolved,
    mut points: Option<&mut Vec<TimelinePoint>>,
) -> SacStats {
    let n = graph.ops.len();
    // When each original storage dies in this plan.
    let mut frees: Vec<Vec<usize>> = vec![Vec::new(); n];
    let mut in_rerun = vec![false; graph.storages.len()];
    for (s, cached) in in_rerun.iter_mut().enumerate() {
        match graph.death(s, res) {
            Death::At(Some(at)) => frees[at].push(s),
            Death::At(None) => {}
            Death::InRerun => *cached = true,
        }
    }
    let mut triggers: HashMap<usize, Vec<usize>> = HashMap::new();
    for (r, reg) in graph.regions.iter().enumerate() {
        if res.wrapped[r] {
            if let (Some(t), Some(_)) = (reg.trigger_op, graph.replay_end(r)) {
                triggers.entry(t).or_default().push(r);
            }
        }
    }
    let mut live = graph.fixed_bytes;
    let mut peak = live;
    let mut peak_op = 0;
    let mut peak_in = None;
    let mut cost = graph.base_cost();
    let mut rerun_cost = BTreeMap::new();
    let mut forward_end_bytes = live;
    // Re-run copies that die at a backward position.
    let mut late_frees: Vec<Vec<u64>> = vec![Vec::new(); n + 1];
    for i in 0..=n {
        if let Some(rs) = triggers.get(&i) {
            for &r in rs {
                let reg = &graph.regions[r];
                let end = graph.replay_end(r).expect("trigger only with a re-run");
                let mut rc = 0.0;
                live += reg.rerun_extra_bytes;
                let mut local: Vec<Vec<u64>> = vec![Vec::new(); end + 2 - reg.first_op];
                for j in reg.first_op..=end {
                    if res.keep[r].contains(&j) {
                        // The cached outputs come back; those no save holds die as re-run ones.
                        for &s in &graph.ops[j].outputs {
                            if in_rerun[s] {
                                let st = &graph.storages[s];
                                let at = st
                                    .natural_free_after
                                    .filter(|&a| a <= end)
                                    .unwrap_or(end + 1);
                                local[at.max(j) - reg.first_op].push(st.bytes);
                            }
                        }
                        for b in local[j - reg.first_op].drain(..) {
                            live -= b;
                        }
                        continue;
                    }
                    let op = &graph.ops[j];
                    rc += op.cost;
                    for &s in &op.outputs {
                        let st = &graph.storages[s];
                        live += st.bytes;
                        let released = st
                            .saves
                            .iter()
                            .filter(|sv| sv.region == Some(r))
                            .map(|sv| sv.released_after)
                            .max();
                        if let Some(released) = released {
                            // Saved again by the re-run: the copy lives until the region's
                            // backward nodes that saved it have run.
                            match released {
                                Some(at) if at >= i => late_frees[at].push(st.bytes),
                                Some(_) => local[end + 1 - reg.first_op].push(st.bytes),
                                None => {}
                            }
                        } else {
                            let at = st
                                .natural_free_after
                                .filter(|&a| a <= end)
                                .unwrap_or(end + 1);
                            local[at.max(j) - reg.first_op].push(st.bytes);
                        }
                    }
                    if let Some(points) = points.as_deref_mut() {
                        points.push(TimelinePoint {
                            op: j,
                            rerun_of: Some(r),
                            bytes: live,
                        });
                    }
                    if live > peak {
                        peak = live;
                        peak_op = j;
                        peak_in = Some(r);
                    }
                    for b in local[j - reg.first_op].drain(..) {
                        live -= b;
                    }
                }
                for b in local[end + 1 - reg.first_op].drain(..) {
                    live -= b;
                }
                live -= reg.rerun_extra_bytes;
                cost += rc;
                rerun_cost.insert(r, rc);
            }
        }
        if i == n {
            break;
        }
        for &s in &graph.ops[i].outputs {
            live += graph.storages[s].bytes;
        }
        if let Some(points) = points.as_deref_mut() {
            points.push(TimelinePoint {
                op: i,
                rerun_of: None,
                bytes: live,
            });
        }
        if live > peak {
            peak = live;
            peak_op = i;
            peak_in = None;
        }
        for &s in &frees[i] {
            live -= graph.storages[s].bytes;
        }
        for b in late_frees[i].drain(..) {
            live -= b;
        }
        if i + 1 == graph.forward_ops {
            forward_end_bytes = live;
        }
    }
    for (r, reg) in graph.regions.iter().enumerate() {
        if res.wrapped[r] && !rerun_cost.contains_key(&r) && reg.trigger_op.is_some() {
            rerun_cost.insert(r, 0.0);
        }
    }
    SacStats {
        peak_bytes: peak,
        peak_op,
        peak_in_rerun_of: peak_in,
        compute_cost: cost,
        base_cost: graph.base_cost(),
        rerun_cost,
        forward_end_bytes,
    }
}

/// Whether op `j` of region `r` may be kept: it allocates, its outputs are saved only by
/// its region and never written in place, and the re-run reaches it.
pub fn keepable(graph: &TorchGraph, r: usize, j: usize) -> bool {
    let op = &graph.ops[j];
    let Some(end) = graph.replay_end(r) else {
        return false;
    };
    j <= end
        && op.cost > 0.0
        && op.occurrence.is_some()
        && !op.outputs.is_empty()
        && op.outputs.iter().all(|&s| !graph.storages[s].mutated)
        && op
            .outputs
            .iter()
            .any(|&s| !graph.storages[s].saves.is_empty())
}

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
}

impl Candidates {
    pub fn new(graph: &TorchGraph) -> Result<Self> {
        Self::with_blocks(graph, true)
    }

    /// The candidates, with the [`block_plans`] or (to measure what they add) without.
    pub fn with_blocks(graph: &TorchGraph, blocks: bool) -> Result<Self> {
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
        if blocks {
            plans.extend(block_plans(graph, &full)?);
        }
        let least = (0..plans.len())
            .min_by(|&a, &b| {
                let (sa, sb) = (&plans[a].1, &plans[b].1);
                (sa.peak_bytes, sa.compute_cost)
                    .partial_cmp(&(sb.peak_bytes, sb.compute_cost))
                    .unwrap_or(std::cmp::Ordering::Equal)
            })
            .expect("two plans at least");
        Ok(Candidates { plans, least })
    }

    /// The unplanned step's figures.
    fn unplanned(&self) -> &SacStats {
        &self.plans[0].1
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
        let report = |status, predicted: &SacStats, moves| SacReport {
            budget_bytes: budget,
            status,
            min_peak_bytes: self.least_peak(),
            unplanned_peak_bytes: self.unplanned().peak_bytes,
            predicted: predicted.clone(),
            moves,
        };
        let best = self
            .plans
            .iter()
            .filter(|(_, s, _)| s.peak_bytes <= budget)
            .min_by(|a, b| {
                (a.1.compute_cost, a.1.peak_bytes)
                    .partial_cmp(&(b.1.compute_cost, b.1.peak_bytes))
                    .unwrap_or(std::cmp::Ordering::Equal)
            });
        Ok(match best {
            Some((p, s, moves)) => (p.clone(), report("fits", s, *moves)),
            None => {
                let (p, s, moves) = &self.plans[self.least];
                (p.clone(), report("infeasible", s, *moves))
            }
        })
    }
}

/// Keepable ops of a block whose keep sets are all tried (2^8 sets); a block with more tries
/// every keep set of the ones that hold the most bytes, the others recomputed in every one.
const BLOCK_KEEPABLE: usize = 8;
/// Most plans mixing two options [`block_plans`] simulates per class of blocks.
const BLOCK_MIXTURES: usize = 2048;

/// The block candidates. For each class of identical regions (copies of one block, in forward
/// order) with its other regions fully checkpointed: every copy given one option of the block
/// (unwrapped, or wrapped keeping one subset of its keepable ops: every subset when there are
/// at most [`BLOCK_KEEPABLE`], else every subset of the ones holding the most bytes), then,
/// among the options whose uniform plans are on the (peak, cost) Pareto front, the first `k`
/// copies given one and the rest another, for every `k` (the copies that run first hold what
/// they keep the longest). Each plan is simulated; at most [`BLOCK_MIXTURES`] mixtures per class
/// (adjacent front options only, when every pair would be more).
pub fn block_plans(graph: &TorchGraph, full: &SacPlan) -> Result<Vec<(SacPlan, SacStats, usize)>> {
    let mut out = Vec::new();
    for class in graph.classes() {
        let r0 = class[0];
        let reg = &graph.regions[r0];
        let mut offsets: Vec<usize> = (reg.first_op..=reg.last_op)
            .filter(|&j| keepable(graph, r0, j))
            .map(|j| j - reg.first_op)
            .collect();
        offsets.sort_by_key(|&o| (std::cmp::Reverse(held_bytes(graph, reg.first_op + o)), o));
        offsets.truncate(BLOCK_KEEPABLE);
        // An option: None (unwrapped) or the offsets kept.
        let mut options: Vec<Option<Vec<usize>>> = vec![None];
        for mask in 0u32..(1u32 << offsets.len()) {
            let keep = (0..offsets.len())
                .filter(|b| mask & (1 << b) != 0)
                .map(|b| offsets[b])
                .collect();
            options.push(Some(keep));
        }
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

/// Bytes a kept op holds: SAC caches every one of its outputs.
fn held_bytes(graph: &TorchGraph, j: usize) -> u64 {
    graph.ops[j]
        .outputs
        .iter()
        .map(|&s| graph.storages[s].bytes)
        .sum()
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

/// The plan document `remat.torch.apply` reads (docs/torch.md, "The plan").
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PlanDocument {
    pub format: String,
    pub version: u32,
    pub execution_model: String,
    pub model: String,
    pub device: String,
    pub fingerprint: String,
    pub signature: serde_json::Value,
    pub cost_unit: String,
    pub budget_bytes: u64,
    /// `fits` or `infeasible` (then the plan is the least-peak one, at `min_peak_bytes`).
    pub status: String,
    pub min_peak_bytes: u64,
    pub unplanned_peak_bytes: u64,
    pub predicted: PredictedDoc,
    pub regions: Vec<RegionDoc>,
    /// What `remat.torch.measure` measured of this plan in PyTorch, once attached (`PUT
    /// /v1/plans/{id}/validation`, or set by the caller): the fields of a plan's `validation`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub validation: Option<serde_json::Value>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PredictedDoc {
    pub peak_bytes: u64,
    pub compute_cost: f64,
    pub base_cost: f64,
    /// `compute_cost / base_cost - 1`.
    pub overhead: f64,
    pub forward_end_bytes: u64,
    pub peak_op: usize,
    pub peak_in_rerun_of: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RegionDoc {
    pub fqn: String,
    #[serde(rename = "class")]
    pub class_name: String,
    pub wrapped: bool,
    /// Kept ops as `[aten op, occurrence]`: the policy's `MUST_SAVE` keys.
    pub keep: Vec<(String, usize)>,
    /// The ops the policy sees, in order (a run that differs is refused).
    pub ops: Vec<String>,
    pub rerun_cost: f64,
}

/// Parses a budget for a captured graph: bytes or a size (`"8GiB"`), `"0.5x"` of the
/// unplanned peak, or `"min"` (the least peak the model can reach).
pub fn parse_torch_budget(graph: &TorchGraph, budget: &str) -> Result<u64> {
    if budget.trim().eq_ignore_ascii_case("min") {
        return Candidates::new(graph)?.budget(budget);
    }
    let unplanned = simulate(graph, &SacPlan::default())?.peak_bytes;
    crate::plan::parse_budget(budget, unplanned)
}

/// Plans `graph` under `budget` and writes the document `remat.torch.apply` reads.
pub fn plan_document(graph: &TorchGraph, budget: u64) -> Result<PlanDocument> {
    let (p, report) = plan(graph, budget)?;
    Ok(document(graph, &p, &report))
}

/// The document of a fixed policy, for comparison: `"none"` (no region wrapped: PyTorch's own
/// step) or `"full"` (every region wrapped, nothing kept: plain per-block checkpointing).
pub fn baseline_document(graph: &TorchGraph, name: &str) -> Result<PlanDocument> {
    let p = match name {
        "none" => SacPlan::default(),
        "full" => SacPlan::full(graph),
        other => {
            return Err(SolverError::InvalidArgument(format!(
                "unknown torch-sac baseline {other:?}: use \"none\" or \"full\""
            )))
        }
    };
    let predicted = simulate(graph, &p)?;
    let unplanned = simulate(graph, &SacPlan::default())?.peak_bytes;
    let report = SacReport {
        budget_bytes: predicted.peak_bytes,
        status: "fits",
        min_peak_bytes: Candidates::new(graph)?.least_peak(),
        unplanned_peak_bytes: unplanned,
        predicted,
        moves: 0,
    };
    Ok(document(graph, &p, &report))
}

/// Checks that `validation` (what `remat.torch.measure` returns) is a measurement of the plan
/// `doc`: an object with the device (`torch-cpu`, `torch-cuda`, ...), the figures a plan's
/// `validation` has, the plan's own predicted peak, and, where it says them, the plan's
/// fingerprint and budget. Errors name the field.
pub fn check_validation(doc: &PlanDocument, validation: &serde_json::Value) -> Result<()> {
    let bad = |field: &str, why: String| {
        Err(SolverError::InvalidArgument(format!(
            "validation field `{field}`: {why}"
        )))
    };
    let Some(v) = validation.as_object() else {
        return Err(SolverError::InvalidArgument(
            "validation: expected a JSON object (what remat.torch.measure returns)".into(),
        ));
    };
    match v.get("device").and_then(|d| d.as_str()) {
        Some(d) if d.starts_with("torch-") && d.len() > "torch-".len() => {}
        Some(d) => {
            return bad(
                "device",
                format!("expected torch-cpu or torch-cuda, got {d:?}"),
            )
        }
        None => return bad("device", "missing or not a string".into()),
    }
    for field in ["ran", "ok"] {
        if !v.get(field).is_some_and(|x| x.is_boolean()) {
            return bad(field, "missing or not true/false".into());
        }
    }
    let whole = |field: &str| v.get(field).and_then(|x| x.as_u64());
    if whole("measured_peak_bytes").is_none() {
        return bad(
            "measured_peak_bytes",
            "missing or not a whole number of bytes".into(),
        );
    }
    match whole("predicted_peak_bytes") {
        Some(p) if p == doc.predicted.peak_bytes => {}
        Some(p) => {
            return bad(
                "predicted_peak_bytes",
                format!(
                    "{p} is not this plan's predicted peak ({} bytes): it measured another plan",
                    doc.predicted.peak_bytes
                ),
            )
        }
        None => {
            return bad(
                "predicted_peak_bytes",
                "missing or not a whole number".into(),
            )
        }
    }
    match v.get("grad_max_rel_err").and_then(|x| x.as_f64()) {
        Some(e) if e.is_finite() && e >= 0.0 => {}
        _ => return bad("grad_max_rel_err", "missing or not a number ≥ 0".into()),
    }
    if !v
        .get("measured_overhead")
        .and_then(|x| x.as_f64())
        .is_some_and(f64::is_finite)
    {
        return bad("measured_overhead", "missing or not a number".into());
    }
    if let Some(f) = v.get("fingerprint").filter(|f| !f.is_null()) {
        if f.as_str() != Some(doc.fingerprint.as_str()) {
            return bad(
                "fingerprint",
                format!(
                    "{f} is not this plan's ({:?}): it measured another model",
                    doc.fingerprint
                ),
            );
        }
    }
    if let Some(b) = v.get("budget_bytes").filter(|b| !b.is_null()) {
        if b.as_u64() != Some(doc.budget_bytes) {
            return bad(
                "budget_bytes",
                format!("{b} is not this plan's budget ({} bytes)", doc.budget_bytes),
            );
        }
    }
    Ok(())
}

/// The plan document of `p`.
pub fn document(graph: &TorchGraph, p: &SacPlan, report: &SacReport) -> PlanDocument {
    let s = &report.predicted;
    let regions = graph
        .regions
        .iter()
        .enumerate()
        .map(|(r, reg)| {
            let kept = p.wrapped.get(&r);
            let ops = &graph.ops[reg.first_op..=reg.last_op];
            RegionDoc {
                fqn: reg.fqn.clone(),
                class_name: reg.class_name.clone(),
                wrapped: kept.is_some(),
                keep: kept
                    .into_iter()
                    .flatten()
                    .filter_map(|&j| Some((graph.ops[j].op.clone(), graph.ops[j].occurrence?)))
                    .collect(),
                ops: ops
                    .iter()
                    .filter(|o| o.occurrence.is_some())
                    .map(|o| o.op.clone())
                    .collect(),
                rerun_cost: s.rerun_cost.get(&r).copied().unwrap_or(0.0),
            }
        })
        .collect();
    PlanDocument {
        format: PLAN_FORMAT.into(),
        version: VERSION,
        execution_model: "torch-sac".into(),
        model: graph.name.clone(),
        device: graph.device.clone(),
        fingerprint: graph.fingerprint.clone(),
        signature: graph.signature.clone(),
        cost_unit: graph.cost_unit.clone(),
        budget_bytes: report.budget_bytes,
        status: report.status.into(),
        min_peak_bytes: report.min_peak_bytes,
        unplanned_peak_bytes: report.unplanned_peak_bytes,
        predicted: PredictedDoc {
            peak_bytes: s.peak_bytes,
            compute_cost: s.compute_cost,
            base_cost: s.base_cost,
            overhead: s.overhead(),
            forward_end_bytes: s.forward_end_bytes,
            peak_op: s.peak_op,
            peak_in_rerun_of: s.peak_in_rerun_of.map(|r| graph.regions[r].fqn.clone()),
        },
        regions,
        validation: None,
    }
}

/// Reads a plan document back into a [`SacPlan`] for `graph`: the fingerprint must match and
/// every kept `[op, occurrence]` must name an op of its region.
pub fn plan_from_document(graph: &TorchGraph, doc: &PlanDocument) -> Result<SacPlan> {
    if doc.fingerprint != graph.fingerprint {
        return Err(SolverError::InvalidArgument(format!(
            "the plan is for fingerprint {} ({}), the graph has {} ({})",
            doc.fingerprint, doc.model, graph.fingerprint, graph.name
        )));
    }
    let mut p = SacPlan::default();
    for rd in &doc.regions {
        if !rd.wrapped {
            continue;
        }
        let r = graph
            .regions
            .iter()
            .position(|g| g.fqn == rd.fqn)
            .ok_or_else(|| {
                SolverError::InvalidArgument(format!(
                    "the plan wraps region {:?}, which the graph lacks",
                    rd.fqn
                ))
            })?;
        let reg = &graph.regions[r];
        let mut kept = BTreeSet::new();
        for (op, occ) in &rd.keep {
            let j = (reg.first_op..=reg.last_op)
                .find(|&j| graph.ops[j].op == *op && graph.ops[j].occurrence == Some(*occ))
                .ok_or_else(|| {
                    SolverError::InvalidArgument(format!(
                        "the plan keeps {op} #{occ} in region {:?}, which runs no such op",
                        rd.fqn
                    ))
                })?;
            kept.insert(j);
        }
        p.wrapped.insert(r, kept);
    }
    Ok(p)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two identical blocks `a_k = f(x_k)`, `x_{k+1} = g(a_k)` each saving `a_k` and its input,
    /// then a loss and the backward in reverse.
    fn two_blocks() -> TorchGraph {
        // ops: 0 f0, 1 g0, 2 f1, 3 g1, 4 loss | 5 bg1, 6 bf1, 7 bg0, 8 bf0
        let op = |name: &str,
                  region: Option<usize>,
                  occ: Option<usize>,
                  cost: f64,
                  outputs: Vec<usize>| TorchOp {
            op: name.into(),
            phase: String::new(),
            module: String::new(),
            region,
            occurrence: occ,
            cost,
            outputs,
        };
        let st = |producer, free_after, natural, saves: Vec<(usize, Option<usize>)>| TorchStorage {
            bytes: 100,
            producer,
            free_after,
            natural_free_after: natural,
            saves: saves
                .into_iter()
                .map(|(after_op, region)| TorchSave {
                    after_op,
                    region,
                    released_after: free_after,
                })
                .collect(),
            mutated: false,
        };
        TorchGraph {
            format: FORMAT.into(),
            version: VERSION,
            name: "two".into(),
            device: "cpu".into(),
            cost_unit: "flop".into(),
            fingerprint: String::new(),
            signature: serde_json::Value::Null,
            fixed_bytes: 10,
            forward_ops: 5,
            regions: vec![
                TorchRegion {
                    fqn: "b.0".into(),
                    class_name: "B".into(),
                    first_op: 0,
                    last_op: 1,
                    stop_op: Some(0),
                    trigger_op: Some(7),
                    inputs: vec![],
                    rerun_extra_bytes: 0,
                },
                TorchRegion {
                    fqn: "b.1".into(),
                    class_name: "B".into(),
                    first_op: 2,
                    last_op: 3,
                    stop_op: Some(2),
                    trigger_op: Some(5),
                    inputs: vec![1],
                    rerun_extra_bytes: 0,
                },
            ],
            ops: vec![
                op("f", Some(0), Some(0), 5.0, vec![0]),
                op("g", Some(0), Some(0), 1.0, vec![1]),
                op("f", Some(1), Some(0), 5.0, vec![2]),
                op("g", Some(1), Some(0), 1.0, vec![3]),
                op("loss", None, None, 1.0, vec![4]),
                op("bg", None, None, 1.0, vec![5]),
                op("bf", None, None, 1.0, vec![6]),
                op("bg", None, None, 1.0, vec![7]),
                op("bf", None, None, 1.0, vec![8]),
            ],
            storages: vec![
                st(0, Some(7), Some(1), vec![(0, Some(0))]), // a0: saved by g0
                st(1, Some(6), Some(2), vec![(1, Some(1))]), // x1: saved by f1 (region 1's input)
                st(2, Some(5), Some(3), vec![(2, Some(1))]), // a1: saved by g1
                st(3, Some(4), Some(4), vec![]),             // x2: the loss reads it
                st(4, Some(5), Some(4), vec![]),             // loss
                st(5, Some(6), None, vec![]),                // grad of a1
                st(6, Some(7), None, vec![]),                // grad of x1
                st(7, Some(8), None, vec![]),                // grad of a0
                st(8, Some(8), None, vec![]),                // grad of x0
            ],
        }
    }

    #[test]
    fn unplanned_replays_the_captured_lifetimes() {
        let g = two_blocks();
        g.check().unwrap();
        let s = simulate(&g, &SacPlan::default()).unwrap();
        // After op 3: fixed 10 + a0, x1, a1, x2 = 410; op 4 adds the loss (510) and frees x2.
        assert_eq!(s.peak_bytes, 510);
        assert_eq!(s.compute_cost, g.base_cost());
        assert!(s.rerun_cost.is_empty());
    }

    #[test]
    fn full_checkpointing_frees_the_saved_values_and_reruns_up_to_the_last_save() {
        let g = two_blocks();
        let s = simulate(&g, &SacPlan::full(&g)).unwrap();
        // a0 and a1 die at their natural deaths; x1 is held (region 1's input).
        // Forward end: 10 + x1 + loss = 210 after op 4 frees x2.
        assert_eq!(s.forward_end_bytes, 210);
        // Each region re-runs f only (early stop after its last save): +5 each.
        assert_eq!(s.rerun_cost.values().sum::<f64>(), 10.0);
        assert_eq!(s.compute_cost, g.base_cost() + 10.0);
        assert!(s.peak_bytes < simulate(&g, &SacPlan::default()).unwrap().peak_bytes);
    }

    #[test]
    fn keeping_an_op_skips_its_rerun_and_holds_its_output() {
        let g = two_blocks();
        let mut p = SacPlan::full(&g);
        p.wrapped.get_mut(&0).unwrap().insert(0);
        let s = simulate(&g, &p).unwrap();
        assert_eq!(s.rerun_cost[&0], 0.0);
        assert_eq!(s.rerun_cost[&1], 5.0);
        let kept_bytes = simulate(&g, &SacPlan::full(&g)).unwrap().forward_end_bytes + 100;
        assert_eq!(s.forward_end_bytes, kept_bytes);
    }

    #[test]
    fn plan_fits_the_budget_and_costs_less_with_more_memory() {
        let g = two_blocks();
        let unplanned = simulate(&g, &SacPlan::default()).unwrap().peak_bytes;
        let min = Candidates::new(&g).unwrap().least_peak();
        assert!(min <= simulate(&g, &SacPlan::full(&g)).unwrap().peak_bytes);
        let mut last = f64::INFINITY;
        for budget in [min, (min + unplanned) / 2, unplanned] {
            let (p, rep) = plan(&g, budget).unwrap();
            assert_eq!(rep.status, "fits");
            let s = simulate(&g, &p).unwrap();
            assert!(s.peak_bytes <= budget);
            assert_eq!(s, rep.predicted);
            assert!(s.compute_cost <= last);
            last = s.compute_cost;
        }
        let (p, rep) = plan(&g, min - 1).unwrap();
        assert_eq!(rep.status, "infeasible");
        assert_eq!(simulate(&g, &p).unwrap().peak_bytes, rep.min_peak_bytes);
    }

    #[test]
    fn bad_documents_name_the_field() {
        let mut g = two_blocks();
        g.ops[3].outputs = vec![9];
        let e = g.check().unwrap_err().to_string();
        assert!(e.contains("ops[3] (g): output storage 9"), "{e}");
        let mut g = two_blocks();
        g.regions[1].first_op = 1;
        let e = g.check().unwrap_err().to_string();
        assert!(e.contains("regions[1] (b.1): op 1 (g)"), "{e}");
        let mut g = two_blocks();
        g.format = "x".into();
        assert!(g
            .check()
            .unwrap_err()
            .to_string()
            .contains("format is \"x\""));
        let g = two_blocks();
        let mut p = SacPlan::full(&g);
        p.wrapped.get_mut(&1).unwrap().insert(0);
        let e = simulate(&g, &p).unwrap_err().to_string();
        assert!(e.contains("keeps op 0 in region 1 (b.1)"), "{e}");
    }
}
