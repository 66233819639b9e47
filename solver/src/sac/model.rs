//! The `torch-sac` model: a captured step ([`TorchGraph`]), a plan ([`SacPlan`]) and the
//! simulator that replays the step as PyTorch runs it under the plan ([`simulate`]).

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
    /// What checkpointing's own work costs, where the capture priced it (`cost="measured"`:
    /// docs/torch.md, "What wrapping costs"); `None`: only the re-run ops are priced.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wrap_cost: Option<WrapCost>,
}

/// The price of checkpointing's own work, in the graph's cost unit: per op that runs through
/// its dispatch modes (every op of a wrapped region's forward, every op of its re-run, the
/// ones its cache serves included) the Python of the policy, the modes, the saved-tensor hooks
/// and the module's own code between ops, which the op times do not hold; and the unplanned
/// step's own time, the base an overhead is measured against.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WrapCost {
    /// Cost per op run through checkpointing's modes.
    pub per_op: f64,
    /// The unplanned step's cost (its measured time): the base of every overhead.
    pub step: f64,
    /// How it was measured (steps, pairs, the plan it was measured on).
    #[serde(default)]
    pub source: String,
    /// The measured pairs, `[unplanned, full checkpointing]` seconds, kept as evidence.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pairs: Vec<[f64; 2]>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TorchRegion {
    /// The module's fully qualified name (`transformer.h.3`).
    pub fqn: String,
    /// Which call of the module this region is, from 0: a module whose forward runs more than
    /// once per step (ALBERT's shared layer group) is a region per call, each checkpointed on
    /// its own. `(fqn, call)` names a region.
    #[serde(default)]
    pub call: usize,
    /// Its class (`GPT2Block`).
    #[serde(default, rename = "class")]
    pub class_name: String,
    pub first_op: usize,
    pub last_op: usize,
    /// The op after which the region saved its last value; `None`: its re-run runs no op (it
    /// saved nothing, or only the inputs of its first op, which the checkpoint holds).
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
    /// The in-place op by which the region's forward writes one of its inputs
    /// (`aten.relu_.default` of a lone `nn.ReLU(inplace=True)`), if it does: a re-run would
    /// write the checkpoint's saved input again, so the region is never wrapped.
    #[serde(default)]
    pub writes_input: Option<String>,
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
    /// It draws random numbers (a dropout with p > 0, an attention kernel with dropout, a
    /// sampler): never kept, see [`keepable`].
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub random: bool,
    /// Bytes its kernel allocates for itself while it runs and frees before it returns (a
    /// workspace; measured by the capture on CUDA, 0 elsewhere): they count in the peak at
    /// the op, wherever it runs (forward, re-run, backward).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub transient: u64,
}

fn is_zero(x: &u64) -> bool {
    *x == 0
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

    /// How messages and documents name region `r`: its module's FQN, with the call
    /// (`encoder.layer_group (call 3 of 12)`, counted from 1) where the module runs more than once.
    pub fn region_label(&self, r: usize) -> String {
        let reg = &self.regions[r];
        let calls = self.regions.iter().filter(|o| o.fqn == reg.fqn).count();
        if calls > 1 {
            format!("{} (call {} of {calls})", reg.fqn, reg.call + 1)
        } else {
            reg.fqn.clone()
        }
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
        if let Some(w) = &self.wrap_cost {
            for (field, x) in [("per_op", w.per_op), ("step", w.step)] {
                if !x.is_finite() || x < 0.0 {
                    return bad(format!("wrap_cost.{field} {x} is not a finite number ≥ 0"));
                }
            }
        }
        let total_cost: f64 = self.ops.iter().map(|op| op.cost.max(0.0)).sum();
        if total_cost > crate::problem::MAX_TOTAL_COST {
            return bad(format!(
                "the ops' costs add up to {total_cost:e}, more than remat plans with ({:e}); scale them down",
                crate::problem::MAX_TOTAL_COST
            ));
        }
        let total_bytes = u128::from(self.fixed_bytes)
            + self
                .storages
                .iter()
                .map(|st| u128::from(st.bytes))
                .sum::<u128>();
        if total_bytes > u128::from(crate::problem::MAX_TOTAL_BYTES) {
            return bad(format!(
                "fixed_bytes and the storages' bytes add up to {total_bytes}, more than remat plans for ({} bytes, 1 EiB)",
                crate::problem::MAX_TOTAL_BYTES
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
            if let Some(other) = self.regions[..r]
                .iter()
                .position(|o| o.fqn == reg.fqn && o.call == reg.call)
            {
                return bad(format!(
                    "regions[{r}] ({}): the same module and call as regions[{other}]",
                    self.region_label(r)
                ));
            }
            let in_forward = |x: usize| x < self.forward_ops;
            if reg.first_op > reg.last_op || !in_forward(reg.last_op) {
                return bad(format!(
                    "regions[{r}] ({}): ops {}..={} are not a range in the forward (forward_ops {})",
                    self.region_label(r), reg.first_op, reg.last_op, self.forward_ops
                ));
            }
            if let Some(stop) = reg.stop_op {
                if stop + 1 < reg.first_op || stop > reg.last_op {
                    return bad(format!(
                        "regions[{r}] ({}): stop_op {stop} is outside its ops",
                        self.region_label(r)
                    ));
                }
            }
            if reg
                .trigger_op
                .is_some_and(|t| t < self.forward_ops || t > n)
            {
                return bad(format!(
                    "regions[{r}] ({}): trigger_op is not a backward position",
                    self.region_label(r)
                ));
            }
            if reg.stop_op.is_some() && reg.trigger_op.is_none() {
                return bad(format!(
                    "regions[{r}] ({}): stop_op is set and trigger_op is null: a region that \
                     re-runs needs the backward op that starts it",
                    self.region_label(r)
                ));
            }
            for i in reg.first_op..=reg.last_op {
                if self.ops[i].region != Some(r) {
                    return bad(format!(
                        "regions[{r}] ({}): op {i} ({}) inside its range belongs to region {:?}",
                        self.region_label(r),
                        self.ops[i].op,
                        self.ops[i].region
                    ));
                }
            }
            if let Some(&s) = reg.inputs.iter().find(|&&s| s >= self.storages.len()) {
                return bad(format!(
                    "regions[{r}] ({}): input storage {s} does not exist",
                    self.region_label(r)
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

    /// The cost of the unplanned step: its measured time where the graph has one
    /// ([`WrapCost::step`]), else every op once.
    pub fn base_cost(&self) -> f64 {
        match &self.wrap_cost {
            Some(w) if w.step > 0.0 => w.step,
            _ => self.ops.iter().map(|o| o.cost).sum(),
        }
    }

    /// The ops a wrapped region runs through checkpointing's dispatch modes: its forward's, and
    /// its re-run's up to the early stop (the ops the cache serves are dispatched too).
    pub fn wrapped_ops(&self, r: usize) -> usize {
        let reg = &self.regions[r];
        let rerun = match (reg.trigger_op, self.replay_end(r)) {
            (Some(_), Some(end)) => end + 1 - reg.first_op,
            _ => 0,
        };
        reg.last_op + 1 - reg.first_op + rerun
    }

    /// What wrapping region `r` costs beyond its re-run's ops ([`WrapCost::per_op`] for each of
    /// [`Self::wrapped_ops`]); 0 where the graph does not price it.
    pub fn wrap_cost_of(&self, r: usize) -> f64 {
        self.wrap_cost
            .as_ref()
            .map_or(0.0, |w| w.per_op * self.wrapped_ops(r) as f64)
    }

    /// Whether checkpointing may wrap region `r`: not when its forward writes an input in place.
    pub fn wrappable(&self, r: usize) -> bool {
        self.regions[r].writes_input.is_none()
    }

    /// The last op a region's re-run executes (early stop), if it re-runs at all.
    fn replay_end(&self, r: usize) -> Option<usize> {
        let reg = &self.regions[r];
        reg.stop_op.filter(|&s| s >= reg.first_op)
    }

    /// Regions that are copies of one another: same class, same op sequence, costs, bytes,
    /// transient bytes, and the same ops keepable ([`keepable`]: a copy's keep set is given to
    /// every copy, so an op drawing random numbers in one copy only, or written in place in one
    /// only, makes them different blocks).
    pub fn classes(&self) -> Vec<Vec<usize>> {
        let mut by_sig: BTreeMap<String, Vec<usize>> = BTreeMap::new();
        for (r, reg) in self.regions.iter().enumerate() {
            let mut sig = format!(
                "{}|{:?}|{:?}|",
                reg.class_name,
                reg.stop_op.map(|s| s as i64 - reg.first_op as i64),
                reg.writes_input
            );
            for (j, op) in self
                .ops
                .iter()
                .enumerate()
                .take(reg.last_op + 1)
                .skip(reg.first_op)
            {
                let bytes: u64 = op.outputs.iter().map(|&s| self.storages[s].bytes).sum();
                sig.push_str(&format!(
                    "{}:{}:{}:{}:{};",
                    op.op,
                    op.cost,
                    bytes,
                    op.transient,
                    keepable(self, r, j)
                ));
            }
            by_sig.entry(sig).or_default().push(r);
        }
        let mut classes: Vec<Vec<usize>> = by_sig.into_values().collect();
        classes.sort();
        classes
    }

    /// The storages that more than one region's option decides the death of, where every one of
    /// them is made outside the regions (a tensor every block takes, held by whichever wrapped
    /// block's checkpoint ends last): what [`TorchGraph::pinned`] takes out of the regions'
    /// hands. `None` where a storage a region makes is decided by several regions, or touched
    /// by more than 6 without the latest-holder form. Empty: the life of every storage under
    /// any plan depends on the option of at most one region (its producer's or a saving
    /// one's), so the bytes a plan adds to full checkpointing at any point of the step are the
    /// sum of what each region's option adds alone, which the chain program's exactness rests
    /// on. For each storage that more than one region touches (its producer's, the saving ones
    /// and the ones that take it as an input): by trying every state of those regions
    /// (unwrapped, wrapped, wrapped keeping the producer where it is keepable) where at most 6
    /// touch it ([`TorchGraph::regions_deciding`]), else by the latest-holder form of its death
    /// where it has it ([`TorchGraph::regions_deciding_latest`]).
    pub fn storages_decided_apart(&self) -> Option<Vec<usize>> {
        let mut res = Resolved::all_wrapped(self);
        let mut apart = Vec::new();
        for s in 0..self.storages.len() {
            let touching = self.touching(s, &res.input_of);
            if touching.len() < 2 {
                continue;
            }
            let deciding = if touching.len() <= 6 {
                Some(self.regions_deciding(s, &touching, &mut res))
            } else {
                self.regions_deciding_latest(s, &res.input_of, &res.frame_ends)
            };
            match deciding {
                Some(d) if d <= 1 => {}
                _ if self.ops[self.storages[s].producer].region.is_none() => apart.push(s),
                _ => return None,
            }
        }
        Some(apart)
    }

    /// This graph with `storages` (made outside every region) alive from their producer to the
    /// latest death any plan gives them (the last of their deaths, natural and unplanned, their
    /// saves' releases and the frame ends of the regions that take them): no saves, taken by no
    /// region as an input. No other storage lives longer on it under any plan (a region's frame
    /// ends no later without those saves), so every plan's peak on it is at most its peak here
    /// plus their bytes.
    pub fn pinned(&self, storages: &[usize]) -> TorchGraph {
        let frame_ends = self.frame_ends();
        let input_of = self.input_of();
        // `None` (not within the step) is the latest.
        let later = |a: Option<usize>, b: Option<usize>| a.zip(b).map(|(a, b)| a.max(b));
        let mut g = self.clone();
        for &s in storages {
            let st = &self.storages[s];
            let mut end = later(st.free_after, st.natural_free_after);
            for sv in &st.saves {
                end = later(end, sv.released_after.or(st.free_after));
            }
            for &r in input_of.get(&s).into_iter().flatten() {
                end = later(end, frame_ends[r]);
            }
            let p = &mut g.storages[s];
            p.saves.clear();
            p.free_after = end;
            p.natural_free_after = end;
            for reg in &mut g.regions {
                reg.inputs.retain(|&x| x != s);
            }
        }
        g
    }

    /// The regions that touch storage `s`: its producer's, the saving ones and the ones that
    /// take it as an input.
    pub(super) fn touching(&self, s: usize, input_of: &HashMap<usize, Vec<usize>>) -> Vec<usize> {
        let st = &self.storages[s];
        let mut touching: BTreeSet<usize> = st.saves.iter().filter_map(|sv| sv.region).collect();
        // A region that takes the storage as an input may hold it longer wrapped (until its
        // checkpoint's frame ends) than unwrapped (through its saves, if any).
        touching.extend(input_of.get(&s).into_iter().flatten());
        touching.extend(self.ops[st.producer].region);
        touching.into_iter().collect()
    }

    /// How many of `regions` (those touching storage `s`) change its death, by trying every
    /// state of them ([`TorchGraph::death`]); `res` is left with every region wrapped, keeping
    /// nothing.
    pub(super) fn regions_deciding(
        &self,
        s: usize,
        regions: &[usize],
        res: &mut Resolved,
    ) -> usize {
        let st = &self.storages[s];
        let rp = self.ops[st.producer].region;
        let key = |d: Death| match d {
            Death::At(at) => Some(at),
            Death::InRerun => None,
        };
        let states = 3usize.pow(regions.len() as u32);
        let mut deaths = Vec::with_capacity(states);
        for code in 0..states {
            let mut c = code;
            for &r in regions {
                let state = c % 3;
                c /= 3;
                res.wrapped[r] = state > 0;
                res.keep[r].clear();
                // Keeping the producer is a state only of its region, where it may be kept.
                if state == 2 && rp == Some(r) && keepable(self, r, st.producer) {
                    res.keep[r].insert(st.producer);
                }
            }
            deaths.push(key(self.death(s, res)));
        }
        for &r in regions {
            res.wrapped[r] = true;
            res.keep[r].clear();
        }
        // Region i matters when two states differing in its digit alone differ in death.
        (0..regions.len())
            .filter(|&i| {
                let step = 3usize.pow(i as u32);
                (0..states).any(|code| {
                    let digit = (code / step) % 3;
                    (digit + 1..3).any(|d| deaths[code] != deaths[code + (d - digit) * step])
                })
            })
            .count()
    }

    /// How many regions change the death of storage `s` when it has the latest-holder form: no
    /// region produces it, it has a natural death, and its death in the unplanned step is the
    /// latest of its natural death and its saves' releases. Then under any plan it dies at the
    /// latest of a constant (the natural death, the releases of the saves outside regions) and
    /// one figure per touching region: unwrapped, the latest release of the region's saves;
    /// wrapped, the end of its checkpoint's frame if it takes `s` as an input (its saves no
    /// longer hold it: SAC keeps only what a region produces). A region changes the death when
    /// its two figures differ and the larger is above the constant and every other region's
    /// smaller figure. `None` without that form. Agrees with [`TorchGraph::regions_deciding`]
    /// wherever both apply (`the_latest_holder_form_agrees_with_trying_every_state`).
    pub(super) fn regions_deciding_latest(
        &self,
        s: usize,
        input_of: &HashMap<usize, Vec<usize>>,
        frame_ends: &[Option<usize>],
    ) -> Option<usize> {
        let st = &self.storages[s];
        if self.ops[st.producer].region.is_some() {
            return None;
        }
        // `None` (not within the step) is the latest.
        let at = |a: Option<usize>| a.unwrap_or(usize::MAX);
        let natural = st.natural_free_after?;
        let release = |sv: &TorchSave| at(sv.released_after.or(st.free_after));
        if st.saves.iter().map(release).fold(natural, usize::max) != at(st.free_after) {
            return None;
        }
        let mut constant = natural;
        // Per region: (unwrapped, wrapped).
        let mut figures: BTreeMap<usize, (usize, usize)> = BTreeMap::new();
        for sv in &st.saves {
            match sv.region {
                None => constant = constant.max(release(sv)),
                Some(r) => {
                    let f = figures.entry(r).or_insert((0, 0));
                    f.0 = f.0.max(release(sv));
                }
            }
        }
        for &r in input_of.get(&s).into_iter().flatten() {
            let f = figures.entry(r).or_insert((0, 0));
            f.1 = f.1.max(at(frame_ends[r]));
        }
        let ranges: Vec<(usize, usize)> = figures
            .values()
            .map(|&(u, w)| (u.min(w), u.max(w)))
            .collect();
        Some(
            (0..ranges.len())
                .filter(|&i| {
                    let (lo, hi) = ranges[i];
                    let floor = ranges
                        .iter()
                        .enumerate()
                        .filter(|&(j, _)| j != i)
                        .map(|(_, r)| r.0)
                        .fold(constant, usize::max);
                    lo < hi && floor < hi
                })
                .count(),
        )
    }

    /// The regions each storage is an input of (storages that are none's left out).
    pub(super) fn input_of(&self) -> HashMap<usize, Vec<usize>> {
        let mut input_of: HashMap<usize, Vec<usize>> = HashMap::new();
        for (r, reg) in self.regions.iter().enumerate() {
            for &s in &reg.inputs {
                input_of.entry(s).or_default().push(r);
            }
        }
        input_of
    }

    /// When a wrapped region's checkpoint lets go of its inputs. The checkpoint saves them
    /// (`_NoopSaveInputs`) in a node that never runs, which lives as long as the checkpoint's
    /// frame; the frame lives while any value the region saved is still held by autograd, so
    /// until the last of the region's saves is released (`None`: not within the step). A region
    /// that saves nothing lets go when its forward ends.
    pub(super) fn frame_ends(&self) -> Vec<Option<usize>> {
        let mut ends: Vec<Option<Option<usize>>> = vec![None; self.regions.len()];
        for st in &self.storages {
            for sv in &st.saves {
                if let Some(r) = sv.region {
                    let at = sv.released_after.or(st.free_after);
                    ends[r] = Some(match ends[r] {
                        None => at,
                        Some(prev) => prev.zip(at).map(|(a, b)| a.max(b)),
                    });
                }
            }
        }
        ends.iter()
            .zip(&self.regions)
            .map(|(end, reg)| end.unwrap_or(Some(reg.last_op)))
            .collect()
    }

    /// When storage `s` dies under `plan`: the last of its natural death and the releases of the
    /// saves that still hold it. A save inside a wrapped region holds it only when SAC keeps it
    /// (its producer is kept there); autograd holds every other save as in the unplanned step.
    /// A wrapped region that takes `s` as an input holds it until its checkpoint's frame ends
    /// ([`TorchGraph::frame_ends`]), whether or not one of its ops saves it.
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
            Some(r) => rp == Some(r) && plan.keep[r].contains(&st.producer),
        };
        let later = |a: Option<usize>, b: Option<usize>| a.zip(b).map(|(a, b)| a.max(b));
        // The frames of the wrapped regions that take it as an input.
        let mut frames = Some(0);
        for &r in plan.input_of.get(&s).into_iter().flatten() {
            if plan.wrapped[r] {
                frames = later(frames, plan.frame_ends[r]);
            }
        }
        if st.saves.iter().all(held) {
            return Death::At(later(st.free_after, frames));
        }
        let Some(natural) = st.natural_free_after else {
            return Death::At(None);
        };
        let mut at = later(Some(natural), frames);
        for sv in st.saves.iter().filter(|sv| held(sv)) {
            at = later(at, sv.released_after.or(st.free_after));
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
    /// Every region wrapped, nothing kept: full checkpointing of every region (that may be
    /// wrapped: [`TorchGraph::wrappable`]).
    pub fn full(graph: &TorchGraph) -> Self {
        SacPlan {
            wrapped: (0..graph.regions.len())
                .filter(|&r| graph.wrappable(r))
                .map(|r| (r, BTreeSet::new()))
                .collect(),
        }
    }
}

pub(super) struct Resolved {
    wrapped: Vec<bool>,
    keep: Vec<BTreeSet<usize>>,
    /// The regions each storage is passed to (wrapped or not).
    pub(super) input_of: HashMap<usize, Vec<usize>>,
    /// When each region's checkpoint would let go of its inputs ([`TorchGraph::frame_ends`]).
    pub(super) frame_ends: Vec<Option<usize>>,
}

impl Resolved {
    /// Every region wrapped, nothing kept, whether or not the region may be wrapped: the
    /// state the checks of [`TorchGraph::regions_deciding`] start from and return to.
    pub(super) fn all_wrapped(graph: &TorchGraph) -> Self {
        let n = graph.regions.len();
        Resolved {
            wrapped: vec![true; n],
            keep: vec![BTreeSet::new(); n],
            input_of: graph.input_of(),
            frame_ends: graph.frame_ends(),
        }
    }

    pub(super) fn new(graph: &TorchGraph, plan: &SacPlan) -> Result<Self> {
        let mut wrapped = vec![false; graph.regions.len()];
        let mut keep = vec![BTreeSet::new(); graph.regions.len()];
        for (&r, ops) in &plan.wrapped {
            let reg = graph.regions.get(r).ok_or_else(|| {
                SolverError::InvalidArgument(format!("plan wraps region {r}, which does not exist"))
            })?;
            if let Some(op) = &reg.writes_input {
                return Err(SolverError::InvalidArgument(format!(
                    "plan wraps region {r} ({}), whose forward writes its input in place ({op}), or a \
                     buffer an earlier op of it read: the re-run would write the saved input again, \
                     or read the buffer as the forward left it",
                    graph.region_label(r)
                )));
            }
            if let Some(&j) = ops.iter().find(|&&j| j < reg.first_op || j > reg.last_op) {
                return Err(SolverError::InvalidArgument(format!(
                    "plan keeps op {j} in region {} ({}), which runs ops {}..={}",
                    r,
                    graph.region_label(r),
                    reg.first_op,
                    reg.last_op
                )));
            }
            wrapped[r] = true;
            keep[r] = ops.clone();
        }
        Ok(Resolved {
            wrapped,
            keep,
            input_of: graph.input_of(),
            frame_ends: graph.frame_ends(),
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
    /// Cost of each wrapped region: its re-run's ops, plus checkpointing's own work
    /// ([`TorchGraph::wrap_cost_of`]) where the graph prices it.
    pub rerun_cost: BTreeMap<usize, f64>,
    /// The part of `compute_cost` that is checkpointing's own work (0 where not priced).
    pub wrap_cost: f64,
    /// Ops run through checkpointing's dispatch modes ([`TorchGraph::wrapped_ops`] of every
    /// wrapped region): what `remat.torch.capture` divides the measured price by.
    pub wrapped_ops: usize,
    /// Bytes resident when the forward ends (fixed bytes included).
    pub forward_end_bytes: u64,
}

impl SacStats {
    pub fn overhead(&self) -> f64 {
        overhead(self.compute_cost, self.base_cost)
    }
}

/// `cost / base - 1`: the extra compute of a step costing `cost` over the unplanned step
/// (0 for a step that costs nothing).
pub fn overhead(cost: f64, base: f64) -> f64 {
    if base > 0.0 {
        cost / base - 1.0
    } else {
        0.0
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
    /// Bytes live after the op, plus its kernel's transient bytes (its highest point).
    pub bytes: u64,
}

/// The memory timeline [`simulate`] walks: one point per op the step runs, re-runs included.
pub fn timeline(graph: &TorchGraph, plan: &SacPlan) -> Result<Vec<TimelinePoint>> {
    let res = Resolved::new(graph, plan)?;
    let mut points = Vec::with_capacity(graph.ops.len());
    run(graph, &res, Some(&mut points));
    Ok(points)
}

pub(super) fn run(
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
                            bytes: live + op.transient,
                        });
                    }
                    if live + op.transient > peak {
                        peak = live + op.transient;
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
                bytes: live + graph.ops[i].transient,
            });
        }
        if live + graph.ops[i].transient > peak {
            peak = live + graph.ops[i].transient;
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
    let mut wrap_cost = 0.0;
    let mut wrapped_ops = 0;
    for (r, reg) in graph.regions.iter().enumerate() {
        if !res.wrapped[r] {
            continue;
        }
        if !rerun_cost.contains_key(&r) && reg.trigger_op.is_some() {
            rerun_cost.insert(r, 0.0);
        }
        wrapped_ops += graph.wrapped_ops(r);
        let w = graph.wrap_cost_of(r);
        if w > 0.0 {
            *rerun_cost.entry(r).or_insert(0.0) += w;
            wrap_cost += w;
        }
    }
    cost += wrap_cost;
    SacStats {
        peak_bytes: peak,
        peak_op,
        peak_in_rerun_of: peak_in,
        compute_cost: cost,
        base_cost: graph.base_cost(),
        rerun_cost,
        wrap_cost,
        wrapped_ops,
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
    // A kept op is not run again in the re-run, so it draws nothing there: a random op after
    // it would draw what it drew in the forward, another dropout mask, and the gradients
    // would be wrong (seen on CUDA: GPT-2's attention with dropout kept, gradients off by
    // 66-95% of their size). Random ops are recomputed, in their order, from the restored
    // generator state.
    j <= end
        && !op.random
        && op.cost > 0.0
        && op.occurrence.is_some()
        && !op.outputs.is_empty()
        && op.outputs.iter().all(|&s| !graph.storages[s].mutated)
        && op
            .outputs
            .iter()
            .any(|&s| !graph.storages[s].saves.is_empty())
}

/// Bytes a kept op holds: SAC caches every one of its outputs.
pub(super) fn held_bytes(graph: &TorchGraph, j: usize) -> u64 {
    graph.ops[j]
        .outputs
        .iter()
        .map(|&s| graph.storages[s].bytes)
        .sum()
}
