//! `remat gate`: fail CI when a change makes training memory worse.
//!
//! Per model of the config the gate measures five figures, compares them with the baseline file and
//! reports each change. Every figure is deterministic — the same inputs give the same figures on
//! every run and machine:
//! - `store_all_peak_bytes`, `saved_activation_bytes`: pure functions of the graph;
//! - `min_feasible_budget_bytes`: a deterministic search (chain DP, checkpoint heuristics);
//! - `best_peak_within_overhead_bytes`: the least peak a deterministic algorithm (the baselines,
//!   peak descent and the chain DP; step-bounded, no time limit involved) reaches within `max_overhead`, found by bisection on
//!   the budget;
//! - `planned_overhead`: the configured solver at the device budget. An exact solver with a time
//!   limit is the one figure that can depend on the machine's speed: when the plan is not proven
//!   optimal, the comparison widens the tolerance by the solver's reported gap (the largest amount
//!   by which a better schedule could lower the figure), so a gated change is never timing noise.
//!
//! The baseline records what each model was planned with ([`PlannedWith`]), so a row can say
//! that the config changed rather than the model. The config and the baseline are read with
//! [`read_file`] (a regular file of at most [`MAX_FILE_BYTES`]); the baseline is written to a
//! temporary file beside it and renamed over it, so it is never left half written.

use crate::engine::{ModelFormat, PlanRequest};
use crate::pipeline;
use remat_solver::plan::{self, Status};
use remat_solver::{baselines, budget, dp, sac, simulate, Problem};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::{Read as _, Write as _};
use std::path::{Path, PathBuf};

/// Relative tolerance on byte figures when the config gives none.
pub const DEFAULT_TOLERANCE: f64 = 0.01;
/// Overhead cap for `best_peak_within_overhead_bytes` when the config gives none.
pub const DEFAULT_MAX_OVERHEAD: f64 = 0.2;
/// Solver time limit (seconds) when the config gives none.
pub const DEFAULT_TIME_LIMIT: f64 = 10.0;
/// The most bytes the gate reads of its config or its baseline: far more than either needs, and
/// a bound on what a wrong path (a device, a model file) costs.
pub const MAX_FILE_BYTES: u64 = 64 << 20;

#[derive(Debug, thiserror::Error)]
pub enum GateError {
    #[error("{file}: {message}")]
    Config { file: PathBuf, message: String },
    /// The baseline cannot be read (I/O, not a regular file, too large).
    #[error("{file}: {message}")]
    Baseline { file: PathBuf, message: String },
    /// The baseline was read but is no baseline this remat can compare with (bad JSON, a field
    /// of the wrong type, figures no run can have): `remat gate --update` replaces it.
    #[error(
        "{file}: {message}; restore it from version control, or rewrite it with `remat gate --update`"
    )]
    CorruptBaseline { file: PathBuf, message: String },
    #[error("model {name:?}: {message}")]
    Model { name: String, message: String },
    #[error("{file}: {message}")]
    Write { file: PathBuf, message: String },
}

/// `remat.toml`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GateConfig {
    #[serde(rename = "model", default)]
    pub models: Vec<ModelConfig>,
}

/// One `[[model]]` table: a file format of its own (a required budget, the gate's
/// `max_overhead` and `tolerance`), whose planning options become a [`PlanRequest`]
/// ([`ModelConfig::request`]).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelConfig {
    pub name: String,
    /// ONNX model, node-link graph JSON or captured PyTorch graph (`remat.torch-graph`),
    /// relative to the config file.
    pub path: PathBuf,
    /// The device memory budget: bytes (a TOML integer, or its digits in a string), "14GiB",
    /// "800MB" or a fraction of store-all ("0.5x").
    #[serde(deserialize_with = "budget_text")]
    pub budget: String,
    #[serde(default)]
    pub dims: BTreeMap<String, u64>,
    /// Largest acceptable overhead (fraction, 0.2 = +20% compute) for `best_peak_within_overhead`.
    pub max_overhead: Option<f64>,
    /// Relative tolerance: a figure regresses when it grows by more than this fraction (bytes) or
    /// this many overhead points (planned overhead).
    pub tolerance: Option<f64>,
    /// Solver for the plan at the device budget (default auto).
    pub solver: Option<String>,
    /// Seconds the plan at the device budget may take, its lower bound included (default 10).
    pub time_limit: Option<f64>,
    #[serde(default)]
    pub params: Vec<String>,
    #[serde(default)]
    pub inputs: Vec<String>,
    /// Weights the training keeps frozen (names or glob patterns: `remat plan --freeze`).
    #[serde(default)]
    pub freeze: Vec<String>,
}

/// A config's `budget`: a string as it is, a whole number of bytes as its digits.
fn budget_text<'de, D: serde::Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    struct Budget;
    impl serde::de::Visitor<'_> for Budget {
        type Value = String;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str(
                "a string (\"14GiB\", \"800MB\", \"0.6x\", \"min\") or a whole number of bytes",
            )
        }
        fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<String, E> {
            Ok(v.to_string())
        }
        fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<String, E> {
            Ok(v.to_string())
        }
        fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<String, E> {
            u64::try_from(v)
                .map(|v| v.to_string())
                .map_err(|_| E::custom(format!("a budget of {v} bytes: cannot be negative")))
        }
    }
    d.deserialize_any(Budget)
}

impl ModelConfig {
    /// The options the gate plans this model with (the solver's time limit defaults to
    /// [`DEFAULT_TIME_LIMIT`]).
    pub fn request(&self) -> PlanRequest {
        PlanRequest {
            budget: Some(self.budget.clone()),
            dims: self.dims.clone(),
            solver: self.solver.clone(),
            time_limit: Some(self.time_limit.unwrap_or(DEFAULT_TIME_LIMIT)),
            name: Some(self.name.clone()),
            params: self.params.clone(),
            inputs: self.inputs.clone(),
            frozen: self.freeze.clone(),
            ..PlanRequest::default()
        }
    }
}

/// The statuses a baseline's `planned_status` may have: a free schedule's (`plan::Status`) or
/// a torch-sac plan's (`fits`, `infeasible`).
const PLANNED_STATUSES: [&str; 4] = ["optimal", "feasible", "fits", "infeasible"];

/// The figures of one model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Figures {
    pub store_all_peak_bytes: u64,
    pub saved_activation_bytes: u64,
    pub min_feasible_budget_bytes: u64,
    pub max_overhead: f64,
    /// `None` when even store-all exceeds what the deterministic algorithms reach within the cap
    /// (cannot happen: store-all has no overhead), kept optional for forward compatibility.
    pub best_peak_within_overhead_bytes: Option<u64>,
    pub budget_bytes: u64,
    /// `None` when the device budget is infeasible.
    pub planned_overhead: Option<f64>,
    pub planned_status: String,
    pub planned_solver: String,
    /// The solver's gap to its lower bound (0 when proven optimal).
    pub planned_gap: Option<f64>,
    /// The config's options the figures were measured with; absent from baselines written before
    /// 7 Dec 2026 (nothing is then said about them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub planned_with: Option<PlannedWith>,
}

/// The options of a model's config table that change its figures, besides the budget and
/// `max_overhead` ([`Figures::budget_bytes`], [`Figures::max_overhead`]): a row whose model was
/// measured with others says which changed.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlannedWith {
    #[serde(default)]
    pub dims: BTreeMap<String, u64>,
    #[serde(default)]
    pub params: Vec<String>,
    #[serde(default)]
    pub inputs: Vec<String>,
    /// Weights named frozen (absent when none).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub freeze: Vec<String>,
    /// The solver asked for (`auto` when the config names none); absent for a captured PyTorch
    /// graph, which has one planner.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub solver: Option<String>,
    /// The plan's time limit in seconds, the default included; absent for a captured graph.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_limit: Option<f64>,
    /// The SHA-256 of the model file measured (hex; absent from baselines written before
    /// 8 Dec 2026): a row says whether the model changed, so a figure that moved with the
    /// same file points at remat or the options instead.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_sha256: Option<String>,
}

impl PlannedWith {
    fn of(model: &ModelConfig, torch: bool, bytes: &[u8]) -> PlannedWith {
        use sha2::Digest;
        PlannedWith {
            model_sha256: Some(format!("{:x}", sha2::Sha256::digest(bytes))),
            dims: model.dims.clone(),
            params: model.params.clone(),
            inputs: model.inputs.clone(),
            freeze: model.freeze.clone(),
            solver: (!torch).then(|| model.solver.clone().unwrap_or_else(|| "auto".into())),
            time_limit: (!torch).then(|| model.time_limit.unwrap_or(DEFAULT_TIME_LIMIT)),
        }
    }

    /// What changed from `old` to `self`: the changes that touch every figure (dims, params,
    /// inputs), then those that touch only the planned overhead (solver, time limit).
    fn changes_from(&self, old: &PlannedWith) -> (Vec<String>, Vec<String>) {
        let mut all = Vec::new();
        if let (Some(o), Some(n)) = (&old.model_sha256, &self.model_sha256) {
            if o != n {
                all.push(format!(
                    "model file changed (sha256 {} → {})",
                    &o[..o.len().min(12)],
                    &n[..n.len().min(12)]
                ));
            }
        }
        if self.dims != old.dims {
            let keys: std::collections::BTreeSet<&String> =
                old.dims.keys().chain(self.dims.keys()).collect();
            let show = |v: Option<&u64>| v.map_or("(unset)".to_string(), u64::to_string);
            let changed: Vec<String> = keys
                .into_iter()
                .filter(|k| old.dims.get(*k) != self.dims.get(*k))
                .map(|k| format!("{k} {} → {}", show(old.dims.get(k)), show(self.dims.get(k))))
                .collect();
            all.push(format!("dims changed: {}", changed.join(", ")));
        }
        for (field, o, n) in [
            ("params", &old.params, &self.params),
            ("inputs", &old.inputs, &self.inputs),
            ("freeze", &old.freeze, &self.freeze),
        ] {
            if o != n {
                all.push(format!("{field} changed: {o:?} → {n:?}"));
            }
        }
        let mut planned = Vec::new();
        if self.solver != old.solver {
            let show = |s: &Option<String>| s.clone().unwrap_or_else(|| "(none)".into());
            planned.push(format!(
                "solver changed {} → {}",
                show(&old.solver),
                show(&self.solver)
            ));
        }
        if self.time_limit != old.time_limit {
            let show = |t: Option<f64>| t.map_or("(none)".to_string(), |t| format!("{t} s"));
            planned.push(format!(
                "time_limit changed {} → {}",
                show(old.time_limit),
                show(self.time_limit)
            ));
        }
        (all, planned)
    }
}

/// `remat-baseline.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BaselineFile {
    pub version: u32,
    pub models: BTreeMap<String, Figures>,
}

/// One compared figure.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Row {
    pub model: String,
    pub figure: &'static str,
    pub old: Option<f64>,
    pub new: Option<f64>,
    /// Relative change in percent (bytes) or the change in overhead points.
    pub change: Option<f64>,
    pub unit: &'static str,
    pub regression: bool,
    /// Better than the baseline by more than the tolerance: the baseline is stale, and until
    /// `--update` records the new figure a regression back to the old one passes.
    pub improved: bool,
    pub note: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct Outcome {
    pub rows: Vec<Row>,
    pub figures: BTreeMap<String, Figures>,
    /// Models in the config that the baseline does not have yet.
    pub new_models: Vec<String>,
    /// Models in the baseline that the config no longer lists.
    pub dropped_models: Vec<String>,
    /// The verdict line every format prints: nothing compared, no regression (and how many
    /// figures improved beyond the tolerance), or how many regressions.
    pub verdict: String,
}

impl Row {
    /// The note in parentheses after a space, or nothing.
    fn note_suffix(&self) -> String {
        if self.note.is_empty() {
            String::new()
        } else {
            format!(" ({})", self.note)
        }
    }
}

impl Outcome {
    pub fn regressions(&self) -> impl Iterator<Item = &Row> {
        self.rows.iter().filter(|r| r.regression)
    }

    /// Whether no figure of any model of the config was compared (a baseline of other models,
    /// or of none): such a gate would pass whatever it measured, so it fails instead.
    pub fn compared_nothing(&self) -> bool {
        self.rows.is_empty()
    }

    /// The verdict line: nothing compared, no regression, or how many.
    fn verdict_text(&self) -> String {
        match self.regressions().count() {
            _ if self.compared_nothing() => "nothing compared: no model of the config is in the \
                                             baseline; run remat gate --update to record them"
                .to_string(),
            0 => match self.rows.iter().filter(|r| r.improved).count() {
                0 => "no regression".to_string(),
                k => format!(
                    "no regression; {k} figure(s) improved beyond the tolerance: run remat gate \
                     --update to record them (until then a regression back to the old figures \
                     passes)"
                ),
            },
            n => format!("{n} regression(s)"),
        }
    }
}

/// The bytes of a gate file, `None` when it does not exist. What is not a regular file (a FIFO,
/// a device such as `/dev/zero`, a folder) is refused before it is opened, and a file is read to
/// at most [`MAX_FILE_BYTES`]: a wrong path never blocks or fills the memory. The error says why,
/// without the path (the caller's error names the file).
pub fn read_file(path: &Path) -> Result<Option<Vec<u8>>, String> {
    let regular = |meta: &std::fs::Metadata| {
        if meta.is_file() {
            Ok(())
        } else {
            let what = if meta.is_dir() {
                "a folder"
            } else {
                "not a regular file"
            };
            Err(format!(
                "cannot read: {what}; the gate reads a regular file"
            ))
        }
    };
    let too_large = || {
        format!(
            "cannot read: larger than the gate's limit of {} MiB on a config or baseline",
            MAX_FILE_BYTES >> 20
        )
    };
    let meta = match std::fs::metadata(path) {
        Ok(meta) => meta,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("cannot read: {e}")),
    };
    regular(&meta)?;
    if meta.len() > MAX_FILE_BYTES {
        return Err(too_large());
    }
    let file = std::fs::File::open(path).map_err(|e| format!("cannot read: {e}"))?;
    // The path may have been replaced between the two looks.
    regular(&file.metadata().map_err(|e| format!("cannot read: {e}"))?)?;
    let mut bytes = Vec::new();
    file.take(MAX_FILE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("cannot read: {e}"))?;
    if bytes.len() as u64 > MAX_FILE_BYTES {
        return Err(too_large());
    }
    Ok(Some(bytes))
}

pub fn read_config(path: &Path) -> Result<GateConfig, GateError> {
    let error = |message: String| GateError::Config {
        file: path.to_path_buf(),
        message,
    };
    let bytes = read_file(path)
        .map_err(error)?
        .ok_or_else(|| error("cannot read: no such file".to_string()))?;
    let text = String::from_utf8(bytes).map_err(|e| error(format!("not UTF-8 text: {e}")))?;
    let config: GateConfig = toml::from_str(&text).map_err(|e| GateError::Config {
        file: path.to_path_buf(),
        message: e.to_string().trim().to_string(),
    })?;
    if config.models.is_empty() {
        return Err(GateError::Config {
            file: path.to_path_buf(),
            message: "no [[model]] tables".into(),
        });
    }
    let mut names = std::collections::HashSet::new();
    for (i, m) in config.models.iter().enumerate() {
        let field_err = |field: &str, why: String| GateError::Config {
            file: path.to_path_buf(),
            message: format!("model[{i}] ({:?}): field `{field}`: {why}", m.name),
        };
        if m.name.trim().is_empty() {
            return Err(field_err("name", "must not be empty".into()));
        }
        if !names.insert(m.name.clone()) {
            return Err(field_err("name", "appears twice".into()));
        }
        if m.name.chars().any(char::is_control) {
            return Err(field_err(
                "name",
                "contains a control character (a line break, a tab): the name is printed in CI \
                 logs, where a line break would start a line of its own (a GitHub workflow \
                 command, say)"
                    .into(),
            ));
        }
        if let Some(x) = m.max_overhead {
            if !(x.is_finite() && x >= 0.0) {
                return Err(field_err(
                    "max_overhead",
                    format!("must be a fraction ≥ 0, got {x}"),
                ));
            }
        }
        if let Some(x) = m.tolerance {
            if !(x.is_finite() && (0.0..1.0).contains(&x)) {
                return Err(field_err(
                    "tolerance",
                    format!("must be a fraction in [0, 1), got {x}"),
                ));
            }
        }
        if let Some(x) = m.time_limit {
            if !(x.is_finite() && x > 0.0) {
                return Err(field_err(
                    "time_limit",
                    format!("must be positive seconds, got {x}"),
                ));
            }
        }
        // A budget of no bytes (`0`, `"0x"`) fits no plan: `planned_overhead` would say
        // "infeasible before and after" on every run and gate nothing.
        let budget = m.budget.trim();
        if !remat_solver::plan::is_min_budget(budget)
            && remat_solver::plan::parse_budget(budget, 1 << 40).is_ok_and(|b| b == 0)
        {
            return Err(field_err(
                "budget",
                format!(
                    "{budget:?} is no bytes, which no plan fits: give the device's memory (\"14GiB\")"
                ),
            ));
        }
        if let Some((k, _)) = m.dims.iter().find(|(_, v)| **v == 0) {
            return Err(field_err("dims", format!("{k} must be at least 1")));
        }
    }
    Ok(config)
}

/// The baseline, `None` when there is none. [`GateError::Baseline`] when it cannot be read,
/// [`GateError::CorruptBaseline`] when it was read but is no baseline to compare with.
pub fn read_baseline(path: &Path) -> Result<Option<BaselineFile>, GateError> {
    let Some(bytes) = read_file(path).map_err(|message| GateError::Baseline {
        file: path.to_path_buf(),
        message,
    })?
    else {
        return Ok(None);
    };
    let de = &mut serde_json::Deserializer::from_slice(&bytes);
    let file: BaselineFile =
        serde_path_to_error::deserialize(de).map_err(|e| GateError::CorruptBaseline {
            file: path.to_path_buf(),
            message: format!("field `{}`: {}", e.path(), e.inner()),
        })?;
    if file.version != 1 {
        return Err(GateError::CorruptBaseline {
            file: path.to_path_buf(),
            message: format!("field `version`: unsupported version {}", file.version),
        });
    }
    // The figures a gate compares against: an overhead below -1 (a step that takes no time or
    // less), a negative gap or one of 1 or more (a bound at or below zero) would pass or fail
    // every later run whatever it measures.
    for (name, f) in &file.models {
        let corrupt = |message: String| {
            Err(GateError::CorruptBaseline {
                file: path.to_path_buf(),
                message,
            })
        };
        let bad = |field: &str, why: &str, value: f64| {
            corrupt(format!("field `models.{name}.{field}`: {value} is {why}"))
        };
        if name.chars().any(char::is_control) {
            return corrupt(format!(
                "field `models`: the model name {name:?} contains a control character, which no \
                 config allows"
            ));
        }
        if !PLANNED_STATUSES.contains(&f.planned_status.as_str()) {
            return corrupt(format!(
                "field `models.{name}.planned_status`: {:?} is not a plan's status ({})",
                f.planned_status,
                PLANNED_STATUSES.join(", ")
            ));
        }
        let infeasible = f.planned_status == "infeasible";
        if infeasible != f.planned_overhead.is_none() {
            return corrupt(format!(
                "field `models.{name}.planned_overhead`: {} with planned_status {:?} (an \
                 overhead is recorded exactly when the budget is feasible)",
                f.planned_overhead
                    .map_or("null".to_string(), |o| o.to_string()),
                f.planned_status
            ));
        }
        if f.store_all_peak_bytes < f.min_feasible_budget_bytes {
            return corrupt(format!(
                "field `models.{name}.store_all_peak_bytes`: {} is below \
                 min_feasible_budget_bytes {} (storing everything is one of the plans)",
                f.store_all_peak_bytes, f.min_feasible_budget_bytes
            ));
        }
        for (field, value) in [
            ("max_overhead", Some(f.max_overhead)),
            ("planned_overhead", f.planned_overhead),
        ] {
            if let Some(v) = value.filter(|v| !(v.is_finite() && *v >= 0.0)) {
                return bad(field, "not an overhead (a number ≥ 0)", v);
            }
        }
        if let Some(g) = f
            .planned_gap
            .filter(|g| !(g.is_finite() && (0.0..1.0).contains(g)))
        {
            return bad("planned_gap", "not a gap (a fraction in [0, 1))", g);
        }
        if let Some(t) = f
            .planned_with
            .as_ref()
            .and_then(|w| w.time_limit)
            .filter(|t| !(t.is_finite() && *t > 0.0))
        {
            return bad(
                "planned_with.time_limit",
                "not a time limit (seconds > 0)",
                t,
            );
        }
    }
    Ok(Some(file))
}

/// Writes the baseline atomically: to a temporary file in its folder, synced, then renamed over
/// it. A write that fails (a full disk, a file size limit) removes the temporary file and leaves
/// the old baseline as it was; a process killed mid-write leaves at most the temporary file
/// (`.NAME.PID.tmp`) beside an intact baseline. A baseline that is a symbolic link stays one:
/// its target is replaced.
pub fn write_baseline(path: &Path, figures: &BTreeMap<String, Figures>) -> Result<(), GateError> {
    let error = |message: String| GateError::Write {
        file: path.to_path_buf(),
        message,
    };
    let file = BaselineFile {
        version: 1,
        models: figures.clone(),
    };
    let text = serde_json::to_string_pretty(&file).map_err(|e| error(e.to_string()))? + "\n";
    let target = match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_symlink() => std::fs::canonicalize(path)
            .map_err(|e| error(format!("cannot follow the link: {e}")))?,
        _ => path.to_path_buf(),
    };
    let name = target
        .file_name()
        .ok_or_else(|| error("not a file name".to_string()))?;
    let dir = match target.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    // A temporary file of a name of its own (`.remat-baseline.json.XXXXXX.tmp`), removed when
    // it is dropped unrenamed; one a killed process left is stale.
    let written = (|| {
        let prefix = format!(".{}.", name.to_string_lossy());
        let mut builder = tempfile::Builder::new();
        builder.prefix(&prefix).suffix(".tmp");
        // A new baseline gets what any new file gets (0666 less the umask), as a file the
        // user's editor or `cp` made would; tempfile's own 0600 would keep it from the CI
        // job or user that commits it.
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            builder.permissions(std::fs::Permissions::from_mode(0o666));
        }
        let mut f = builder.tempfile_in(dir)?;
        // The new file keeps the old one's permissions (a rename would otherwise give it the
        // temporary file's).
        if let Ok(meta) = std::fs::metadata(&target) {
            f.as_file().set_permissions(meta.permissions())?;
        }
        f.write_all(text.as_bytes())?;
        f.as_file().sync_all()?;
        f.persist(&target).map(drop).map_err(|e| e.error)
    })();
    if let Err(e) = written {
        return Err(error(format!(
            "cannot write (the baseline is left as it was): {e}"
        )));
    }
    // The rename is durable once the folder is synced; where a folder cannot be opened (not
    // on Unix) the rename has still happened.
    if let Ok(d) = std::fs::File::open(dir) {
        let _ = d.sync_all();
    }
    Ok(())
}

/// The cheapest schedule the deterministic algorithms (baselines, chain DP) find within `budget`:
/// (peak, overhead).
fn deterministic_best(p: &Problem, budget: u64) -> Option<(u64, f64)> {
    let mut best: Option<(u64, f64)> = None;
    let mut consider = |peak: u64, overhead: f64| {
        if peak <= budget && best.is_none_or(|(_, o)| overhead < o) {
            best = Some((peak, overhead));
        }
    };
    for b in baselines::baselines(p, budget) {
        if b.feasible {
            consider(b.stats.peak_bytes, b.stats.overhead(p));
        }
    }
    // Peak descent (deterministic: bounded by a step count, not a clock) helps on plain DAGs,
    // where the checkpoint baselines recompute too much.
    if let Ok(stats) = simulate(p, &budget::descend_to_budget(p, budget)) {
        consider(stats.peak_bytes, stats.overhead(p));
    }
    if dp::as_training_chain(p).is_some() {
        if let Ok(Some(schedule)) = dp::solve_chain(p, budget) {
            if let Ok(stats) = simulate(p, &schedule) {
                consider(stats.peak_bytes, stats.overhead(p));
            }
        }
    }
    // The segment program (Rotor's program over the chain of stages between split points) is
    // deterministic too, and on residual networks and transformers it reaches far lower peaks
    // at a small overhead than the baselines (resnet18 at batch 4: 169.3 MiB at +0.27%, where
    // the baselines' least within 1% was the store-all peak, 174.6 MiB).
    for schedule in remat_solver::segments::solve(p, budget) {
        if let Ok(stats) = simulate(p, &schedule) {
            consider(stats.peak_bytes, stats.overhead(p));
        }
    }
    best
}

/// The least peak a deterministic algorithm reaches with overhead ≤ `cap`, by bisection on the
/// budget between the minimum feasible budget and the store-all peak.
fn best_peak_within_overhead(
    p: &Problem,
    min_budget: u64,
    store_all: u64,
    cap: f64,
) -> Option<u64> {
    let ok = |b: u64| deterministic_best(p, b).filter(|&(_, o)| o <= cap + 1e-12);
    let mut hi = store_all;
    let mut best = ok(hi)?.0;
    let mut lo = min_budget.min(hi);
    if let Some((peak, _)) = ok(lo) {
        return Some(peak);
    }
    // Invariant: ok(hi) holds, ok(lo) does not. Stop at 0.1% of the store-all peak.
    let resolution = (store_all / 1000).max(1);
    while hi - lo > resolution {
        let mid = lo + (hi - lo) / 2;
        match ok(mid) {
            Some((peak, _)) => {
                best = best.min(peak);
                hi = mid;
            }
            None => lo = mid,
        }
    }
    Some(best)
}

/// Measures one model's figures.
pub fn measure(model: &ModelConfig, base_dir: &Path) -> Result<Figures, GateError> {
    let err = |message: String| GateError::Model {
        name: model.name.clone(),
        message,
    };
    let path = base_dir.join(&model.path);
    let bytes = ModelFormat::read_file(&path).map_err(err)?;
    let format = ModelFormat::detect(&bytes);
    if format == ModelFormat::TorchGraph {
        return measure_torch(model, &bytes).map_err(err);
    }
    let req = model.request();
    let loaded = pipeline::load(&bytes, format, &req).map_err(|e| err(e.message))?;
    let p = &loaded.problem;
    let store_all = remat_solver::store_all_peak(p);
    let min_budget = budget::min_feasible_budget(p).bytes;
    let cap = model.max_overhead.unwrap_or(DEFAULT_MAX_OVERHEAD);
    // One thread: HiGHS's result may depend on the thread count.
    let opts =
        pipeline::plan_options(p, &req, 1, &Default::default()).map_err(|e| err(e.message))?;
    let (_, report) = plan::plan(p, &opts).map_err(|e| err(e.to_string()))?;
    let feasible = report.status != Status::Infeasible;
    Ok(Figures {
        store_all_peak_bytes: store_all,
        saved_activation_bytes: loaded.saved_activation_bytes(),
        min_feasible_budget_bytes: min_budget,
        max_overhead: cap,
        best_peak_within_overhead_bytes: best_peak_within_overhead(p, min_budget, store_all, cap),
        budget_bytes: opts.budget,
        planned_overhead: feasible.then_some(report.predicted.overhead),
        planned_status: serde_json::to_value(report.status)
            .ok()
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_default(),
        planned_solver: report.solver.clone(),
        planned_gap: if report.status == Status::Optimal {
            Some(0.0)
        } else {
            report.gap
        },
        planned_with: Some(PlannedWith::of(model, false, &bytes)),
    })
}

/// The figures of a captured PyTorch graph (`remat.torch-graph`), in the torch-sac execution
/// model `remat.torch.apply` runs: the unplanned step's peak stands for store-all, the least peak
/// a torch-sac plan reaches for the minimum feasible budget, and the planner's candidates (fixed
/// by the graph, no clock involved) give the least peak within `max_overhead`. The planner has
/// no optimality bound, so the planned overhead's gap is unknown (`None`) and the tolerance is
/// not widened: its figures are deterministic anyway.
fn measure_torch(model: &ModelConfig, bytes: &[u8]) -> Result<Figures, String> {
    let not_here = |field: &str, why: &str| {
        Err(format!(
            "field `{field}` does not apply to a captured PyTorch graph ({why}); remove it"
        ))
    };
    if !model.dims.is_empty() {
        return not_here("dims", "its shapes were fixed when it was captured");
    }
    if !model.params.is_empty() || !model.inputs.is_empty() || !model.freeze.is_empty() {
        let field = if !model.params.is_empty() {
            "params"
        } else if !model.inputs.is_empty() {
            "inputs"
        } else {
            "freeze"
        };
        return not_here(field, "the capture says what is a parameter and an input");
    }
    if let Some(solver) = model.solver.as_deref().filter(|s| *s != "auto") {
        return Err(format!(
            "field `solver`: {solver:?} plans free schedules; a captured PyTorch graph is planned \
             in the torch-sac model (leave it out)"
        ));
    }
    if model.time_limit.is_some() {
        return not_here("time_limit", "the torch-sac planner runs without a clock");
    }
    let graph = pipeline::torch::read(bytes).map_err(|e| e.message)?;
    let solver_error = |e: remat_solver::SolverError| e.to_string();
    // One candidate set for every figure (the planner's, built once).
    let candidates = sac::Candidates::new(&graph).map_err(solver_error)?;
    let budget = candidates
        .budget(&model.budget)
        .map_err(|e| format!("field `budget`: {e}"))?;
    let cap = model.max_overhead.unwrap_or(DEFAULT_MAX_OVERHEAD);
    let (_, report) = candidates.select(budget).map_err(solver_error)?;
    let feasible = report.status != "infeasible";
    Ok(Figures {
        store_all_peak_bytes: report.unplanned_peak_bytes,
        saved_activation_bytes: graph.saved_bytes(),
        min_feasible_budget_bytes: report.min_peak_bytes,
        max_overhead: cap,
        best_peak_within_overhead_bytes: Some(candidates.least_peak_within_overhead(cap)),
        budget_bytes: budget,
        planned_overhead: feasible.then_some(report.predicted.overhead()),
        planned_status: report.status.to_string(),
        planned_solver: "torch-sac".to_string(),
        planned_gap: None,
        planned_with: Some(PlannedWith::of(model, true, bytes)),
    })
}

fn bytes_row(
    model: &str,
    figure: &'static str,
    old: Option<u64>,
    new: Option<u64>,
    tol: f64,
) -> Row {
    let (change, regression, improved, note) = match (old, new) {
        (Some(o), Some(n)) => {
            let change = if o > 0 {
                100.0 * (n as f64 - o as f64) / o as f64
            } else if n > 0 {
                f64::INFINITY
            } else {
                0.0
            };
            let regression = n as f64 > o as f64 * (1.0 + tol);
            let improved = (n as f64) < o as f64 * (1.0 - tol);
            let note = if regression {
                format!("grew by more than the {:.1}% tolerance", 100.0 * tol)
            } else if improved {
                format!("fell by more than the {:.1}% tolerance", 100.0 * tol)
            } else {
                String::new()
            };
            (Some(change), regression, improved, note)
        }
        (Some(_), None) => (None, true, false, "no longer reachable".to_string()),
        (None, Some(_)) => (None, false, true, "now reachable".to_string()),
        (None, None) => (None, false, false, String::new()),
    };
    Row {
        model: model.to_string(),
        figure,
        old: old.map(|x| x as f64),
        new: new.map(|x| x as f64),
        change,
        unit: "bytes",
        regression,
        improved,
        note,
    }
}

/// Compares new figures with the baseline's.
pub fn compare(
    config: &GateConfig,
    figures: &BTreeMap<String, Figures>,
    baseline: Option<&BaselineFile>,
) -> Outcome {
    let mut rows = Vec::new();
    let mut new_models = Vec::new();
    for m in &config.models {
        let Some(new) = figures.get(&m.name) else {
            continue;
        };
        let Some(old) = baseline.and_then(|b| b.models.get(&m.name)) else {
            new_models.push(m.name.clone());
            continue;
        };
        let tol = m.tolerance.unwrap_or(DEFAULT_TOLERANCE);
        let name = m.name.as_str();
        let first = rows.len();
        rows.push(bytes_row(
            name,
            "store_all_peak_bytes",
            Some(old.store_all_peak_bytes),
            Some(new.store_all_peak_bytes),
            tol,
        ));
        rows.push(bytes_row(
            name,
            "saved_activation_bytes",
            Some(old.saved_activation_bytes),
            Some(new.saved_activation_bytes),
            tol,
        ));
        rows.push(bytes_row(
            name,
            "min_feasible_budget_bytes",
            Some(old.min_feasible_budget_bytes),
            Some(new.min_feasible_budget_bytes),
            tol,
        ));
        let mut row = bytes_row(
            name,
            "best_peak_within_overhead_bytes",
            old.best_peak_within_overhead_bytes,
            new.best_peak_within_overhead_bytes,
            tol,
        );
        if (old.max_overhead - new.max_overhead).abs() > 1e-12 {
            row.regression = false;
            row.improved = false;
            row.note = format!(
                "max_overhead changed {} → {}: not compared",
                old.max_overhead, new.max_overhead
            );
        }
        rows.push(row);
        // Planned overhead at the device budget, in overhead points.
        let (change, regression, improved, note) =
            match (old.planned_overhead, new.planned_overhead) {
                (Some(o), Some(n)) => {
                    let rise = Allowance::new(tol, "new", new.planned_gap, n);
                    let fall = Allowance::new(tol, "old", old.planned_gap, o);
                    let regression = n - o > rise.points / 100.0;
                    let improved = o - n > fall.points / 100.0;
                    let note = if regression {
                        format!("grew by more than the allowed {rise}")
                    } else if improved {
                        format!("fell by more than the allowed {fall}")
                    } else if rise.widened() || fall.widened() {
                        format!("not proven optimal: allowed a rise of {rise}, a fall of {fall}")
                    } else {
                        String::new()
                    };
                    (Some(100.0 * (n - o)), regression, improved, note)
                }
                (Some(_), None) => (
                    None,
                    true,
                    false,
                    format!(
                        "the device budget ({} bytes) became infeasible",
                        new.budget_bytes
                    ),
                ),
                (None, Some(_)) => (
                    None,
                    false,
                    true,
                    "the device budget became feasible".to_string(),
                ),
                (None, None) => (
                    None,
                    false,
                    false,
                    "infeasible before and after".to_string(),
                ),
            };
        let mut note = note;
        if old.budget_bytes != new.budget_bytes {
            add_note(
                &mut note,
                &format!(
                    "budget changed {} → {} bytes",
                    old.budget_bytes, new.budget_bytes
                ),
            );
        }
        // The options the model was planned with (unknown for a baseline written before they
        // were recorded): a change of dims says why every figure moved.
        let (all, planned) = match (&old.planned_with, &new.planned_with) {
            (Some(o), Some(n)) => n.changes_from(o),
            _ => Default::default(),
        };
        for change in &planned {
            add_note(&mut note, change);
        }
        rows.push(Row {
            model: m.name.clone(),
            figure: "planned_overhead",
            old: old.planned_overhead,
            new: new.planned_overhead,
            change,
            unit: "fraction",
            regression,
            improved,
            note,
        });
        if !all.is_empty() {
            for row in &mut rows[first..] {
                for change in &all {
                    add_note(&mut row.note, change);
                }
            }
        }
        // A regression of the same file, with the same options: remat's doing (a new version)
        // or the machine's (a time limit that ran out elsewhere), not the model's.
        let same_file = matches!(
            (&old.planned_with, &new.planned_with),
            (Some(o), Some(n)) if o.model_sha256.is_some() && o.model_sha256 == n.model_sha256
        );
        if same_file && all.is_empty() && planned.is_empty() {
            for row in rows[first..].iter_mut().filter(|r| r.regression) {
                add_note(&mut row.note, "the model file is unchanged");
            }
        }
    }
    let dropped_models = baseline
        .map(|b| {
            b.models
                .keys()
                .filter(|k| !config.models.iter().any(|m| &m.name == *k))
                .cloned()
                .collect()
        })
        .unwrap_or_default();
    let mut outcome = Outcome {
        rows,
        figures: figures.clone(),
        new_models,
        dropped_models,
        verdict: String::new(),
    };
    outcome.verdict = outcome.verdict_text();
    outcome
}

/// Appends `more` to a row's note, after "; " when it has one.
fn add_note(note: &mut String, more: &str) {
    if !note.is_empty() {
        note.push_str("; ");
    }
    note.push_str(more);
}

/// How far the planned overhead may move one way before it counts: the tolerance, widened by
/// `gap × (1 + overhead)` of the plan on the side that could be off. The solver's gap is
/// `(cost − bound) / cost` of the step's compute cost, `1 + overhead` times the unplanned step's,
/// so an optimal plan's overhead is at most `gap × (1 + overhead)` below the figure, never above
/// it. A rise is measured against the new plan's gap (an unchanged model could have come out that
/// much higher), a fall against the old plan's.
struct Allowance {
    /// Overhead points (percent of the unplanned step's cost).
    points: f64,
    tol: f64,
    side: &'static str,
    gap: f64,
    overhead: f64,
}

impl Allowance {
    fn new(tol: f64, side: &'static str, gap: Option<f64>, overhead: f64) -> Allowance {
        let gap = gap.unwrap_or(0.0);
        Allowance {
            points: 100.0 * (tol + gap * (1.0 + overhead)),
            tol,
            side,
            gap,
            overhead,
        }
    }

    fn widened(&self) -> bool {
        self.gap > 0.0
    }
}

/// "5.59 points (tolerance 1.00 + new gap 4.386% × (1 + 4.59%))": the terms a reader recomputes
/// the allowance from.
impl std::fmt::Display for Allowance {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        write!(
            f,
            "{:.2} points (tolerance {:.2}",
            self.points,
            100.0 * self.tol
        )?;
        if self.widened() {
            write!(
                f,
                " + {} gap {:.3}% × (1 + {:.2}%)",
                self.side,
                100.0 * self.gap,
                100.0 * self.overhead
            )?;
        }
        f.write_str(")")
    }
}

fn show(value: Option<f64>, unit: &str) -> String {
    match value {
        None => "–".to_string(),
        Some(v) if unit == "fraction" => format!("{:+.2}%", 100.0 * v),
        Some(v) => crate::human_bytes(v as u64),
    }
}

fn show_change(row: &Row) -> String {
    match row.change {
        None => "–".to_string(),
        Some(c) if row.unit == "fraction" => format!("{c:+.2} pts"),
        Some(c) => format!("{c:+.2}%"),
    }
}

/// The comparison as a plain-text table.
pub fn render_text(outcome: &Outcome) -> String {
    let mut s = String::new();
    let w = name_width(outcome.rows.iter().map(|r| r.model.as_str()));
    let _ = writeln!(
        s,
        "{:<w$} {:<34} {:>14} {:>14} {:>10}  verdict",
        "model", "figure", "baseline", "now", "change"
    );
    for r in &outcome.rows {
        let _ = writeln!(
            s,
            "{:<w$} {:<34} {:>14} {:>14} {:>10}  {}{}",
            r.model,
            r.figure,
            show(r.old, r.unit),
            show(r.new, r.unit),
            show_change(r),
            if r.regression { "REGRESSION" } else { "ok" },
            r.note_suffix()
        );
    }
    for m in &outcome.new_models {
        let _ = writeln!(
            s,
            "{m:<20} not in the baseline: run with --update to record it"
        );
    }
    for m in &outcome.dropped_models {
        let _ = writeln!(s, "{m:<20} in the baseline but no longer in the config");
    }
    let _ = writeln!(s, "{}", outcome.verdict_text());
    s
}

/// The width of the model column of a text table: its longest name, at least 20.
fn name_width<'a>(names: impl Iterator<Item = &'a str>) -> usize {
    names.map(|n| n.chars().count()).max().unwrap_or(0).max(20)
}

/// The measured figures, one row per model and figure (what `--update` records).
pub fn render_figures(figures: &BTreeMap<String, Figures>) -> String {
    let mut s = String::new();
    let w = name_width(figures.keys().map(String::as_str));
    let _ = writeln!(s, "{:<w$} {:<34} {:>14}", "model", "figure", "value");
    for (name, f) in figures {
        for (figure, value) in figure_values(f) {
            let _ = writeln!(s, "{name:<w$} {figure:<34} {value:>14}");
        }
    }
    s
}

/// What `--update` did, as Markdown: the figures written, then the comparison with the baseline
/// they replaced (`previous`; none when there was none, or it could not be parsed).
pub fn render_update_markdown(
    figures: &BTreeMap<String, Figures>,
    baseline: &Path,
    previous: Option<&Outcome>,
) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "### remat gate: baseline updated ({} model(s) written to `{}`)\n",
        figures.len(),
        baseline.display()
    );
    let _ = writeln!(s, "| model | figure | value |");
    let _ = writeln!(s, "|---|---|---:|");
    for (name, f) in figures {
        for (figure, value) in figure_values(f) {
            let _ = writeln!(s, "| {} | {figure} | {value} |", md_cell(name));
        }
    }
    if let Some(outcome) = previous {
        let _ = writeln!(
            s,
            "\n#### Against the previous baseline: {}\n",
            outcome.verdict_text()
        );
        s.push_str(&markdown_table(outcome));
    }
    s
}

/// What `remat gate --update --format json` prints.
#[derive(Debug, Serialize)]
pub struct UpdateReport<'a> {
    /// The baseline file written.
    pub written: &'a Path,
    pub figures: &'a BTreeMap<String, Figures>,
    /// The comparison with the baseline it replaced; `null` when there was none, or it could not
    /// be parsed (a warning on stderr says so).
    pub previous: Option<&'a Outcome>,
}

/// A model's five figures as the `--update` tables show them.
fn figure_values(f: &Figures) -> [(&'static str, String); 5] {
    [
        (
            "store_all_peak_bytes",
            crate::human_bytes(f.store_all_peak_bytes),
        ),
        (
            "saved_activation_bytes",
            crate::human_bytes(f.saved_activation_bytes),
        ),
        (
            "min_feasible_budget_bytes",
            crate::human_bytes(f.min_feasible_budget_bytes),
        ),
        (
            "best_peak_within_overhead_bytes",
            f.best_peak_within_overhead_bytes
                .map(crate::human_bytes)
                .unwrap_or_else(|| "–".into()),
        ),
        (
            "planned_overhead",
            f.planned_overhead
                .map(|o| format!("{:+.2}% ({})", 100.0 * o, f.planned_status))
                .unwrap_or_else(|| "infeasible".into()),
        ),
    ]
}

/// The comparison as a Markdown table (for pull-request summaries).
pub fn render_markdown(outcome: &Outcome) -> String {
    format!(
        "### remat gate: {}\n\n{}",
        outcome.verdict_text(),
        markdown_table(outcome)
    )
}

/// The rows of a comparison as a Markdown table, then the models new to the baseline or taken
/// out of the config.
fn markdown_table(outcome: &Outcome) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "| model | figure | baseline | now | change | verdict |");
    let _ = writeln!(s, "|---|---|---:|---:|---:|---|");
    for r in &outcome.rows {
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {}{} |",
            md_cell(&r.model),
            r.figure,
            show(r.old, r.unit),
            show(r.new, r.unit),
            show_change(r),
            if r.regression {
                "❌ regression"
            } else {
                "✅"
            },
            r.note_suffix()
        );
    }
    for m in &outcome.new_models {
        let _ = writeln!(
            s,
            "\n{}: not in the baseline yet (`remat gate --update` records it).",
            md_cell(m)
        );
    }
    for m in &outcome.dropped_models {
        let _ = writeln!(
            s,
            "\n{}: in the baseline but no longer in the config: it is not gated any more \
             (`remat gate --update` drops it from the baseline).",
            md_cell(m)
        );
    }
    s
}

/// A model name in a Markdown table cell: a `|` would end the cell.
fn md_cell(v: &str) -> String {
    v.replace('|', "\\|")
}

/// A value inside a workflow command's `key=value` settings, escaped as GitHub's toolkit
/// escapes it (`%`, CR, LF, `:` and `,`): a model named `a,b` or `x::y` would otherwise end the
/// setting or the command.
fn github_property(v: &str) -> String {
    github_message(v).replace(':', "%3A").replace(',', "%2C")
}

/// A workflow command's message, escaped (`%`, CR, LF).
fn github_message(v: &str) -> String {
    v.replace('%', "%25")
        .replace('\r', "%0D")
        .replace('\n', "%0A")
}

/// GitHub Actions workflow commands: one `::error` annotation per regression.
pub fn render_github(outcome: &Outcome, config_path: &Path) -> String {
    let mut s = String::new();
    let file = github_property(&config_path.display().to_string());
    for r in outcome.regressions() {
        let message = format!(
            "{} {} → {} ({}){}",
            r.figure,
            show(r.old, r.unit),
            show(r.new, r.unit),
            show_change(r),
            if r.note.is_empty() {
                String::new()
            } else {
                format!(": {}", r.note)
            }
        );
        let _ = writeln!(
            s,
            "::error file={file},title={}::{}",
            github_property(&format!("remat gate: {} {}", r.model, r.figure)),
            github_message(&message)
        );
    }
    if outcome.compared_nothing() {
        let _ = writeln!(
            s,
            "::error file={file},title=remat gate::{}",
            github_message(&outcome.verdict_text())
        );
    }
    for m in &outcome.new_models {
        let _ = writeln!(
            s,
            "::warning file={file},title={}::not in the baseline; run remat gate --update",
            github_property(&format!("remat gate: {m}"))
        );
    }
    for m in &outcome.dropped_models {
        let _ = writeln!(
            s,
            "::warning file={file},title={}::in the baseline but no longer in the config: not gated any more",
            github_property(&format!("remat gate: {m}"))
        );
    }
    s.push_str(&render_text(outcome));
    s
}

/// Measures every model of the config (relative paths resolve against the config's folder).
pub fn measure_all(
    config: &GateConfig,
    config_path: &Path,
) -> Result<BTreeMap<String, Figures>, GateError> {
    let base = config_path.parent().unwrap_or_else(|| Path::new("."));
    let mut out = BTreeMap::new();
    for m in &config.models {
        out.insert(m.name.clone(), measure(m, base)?);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outcome(model: &str) -> Outcome {
        Outcome {
            rows: vec![Row {
                model: model.to_string(),
                figure: "store_all_peak_bytes",
                old: Some(100.0),
                new: Some(200.0),
                change: Some(100.0),
                unit: "bytes",
                regression: true,
                improved: false,
                note: String::new(),
            }],
            figures: BTreeMap::new(),
            new_models: vec![],
            dropped_models: vec!["gone".to_string()],
            verdict: String::new(),
        }
    }

    fn figures(overhead: f64, gap: f64) -> Figures {
        Figures {
            store_all_peak_bytes: 1000,
            saved_activation_bytes: 500,
            min_feasible_budget_bytes: 400,
            max_overhead: 0.2,
            best_peak_within_overhead_bytes: Some(600),
            budget_bytes: 700,
            planned_overhead: Some(overhead),
            planned_status: "feasible".to_string(),
            planned_solver: "milp".to_string(),
            planned_gap: Some(gap),
            planned_with: None,
        }
    }

    fn config(tolerance: f64) -> GateConfig {
        toml::from_str(&format!(
            "[[model]]\nname = \"m\"\npath = \"m.onnx\"\nbudget = \"700\"\ntolerance = {tolerance}\n"
        ))
        .unwrap()
    }

    fn planned_overhead_row(old: Figures, new: Figures, tolerance: f64) -> Row {
        let baseline = BaselineFile {
            version: 1,
            models: [("m".to_string(), old)].into(),
        };
        let figures = [("m".to_string(), new)].into();
        compare(&config(tolerance), &figures, Some(&baseline))
            .rows
            .into_iter()
            .find(|r| r.figure == "planned_overhead")
            .unwrap()
    }

    /// The planned overhead's tolerance widens by `gap × (1 + overhead)` of the plan on the side
    /// that could be off (docs/ci.md): a rise by the new plan's, a fall by the old plan's, never
    /// their sum. The tester's case: overhead 4.587%, gap 4.386%, tolerance 1 point: a rise is
    /// allowed 1 + 4.386 × 1.04587 = 5.59 points, so 7 points is a regression, 5 is not.
    #[test]
    fn planned_overhead_allowance_is_the_documented_one_and_recomputable() {
        let (o, g) = (0.04587, 0.04386);
        let row = planned_overhead_row(figures(o, g), figures(o + 0.07, g), 0.01);
        assert!(row.regression, "{row:?}");
        let allowed = 100.0 * (0.01 + g * (1.0 + o + 0.07));
        assert!(
            row.note.starts_with(&format!(
                "grew by more than the allowed {allowed:.2} points"
            )),
            "{row:?}"
        );
        // The terms the note gives recompute its allowance: 1.00 + 4.386 × (1 + 11.59%).
        assert!(
            row.note
                .contains("(tolerance 1.00 + new gap 4.386% × (1 + 11.59%))"),
            "{row:?}"
        );
        let row = planned_overhead_row(figures(o, g), figures(o + 0.05, g), 0.01);
        assert!(!row.regression && !row.improved, "{row:?}");
        assert_eq!(
            row.note,
            "not proven optimal: allowed a rise of 5.81 points (tolerance 1.00 + new gap 4.386% × \
             (1 + 9.59%)), a fall of 5.59 points (tolerance 1.00 + old gap 4.386% × (1 + 4.59%))"
        );
        // A fall is measured against the old plan's gap: with the new plan proven optimal, a
        // fall of 3 points within the old gap's 5.59 is no improvement.
        let row = planned_overhead_row(figures(o, g), figures(o - 0.03, 0.0), 0.01);
        assert!(!row.regression && !row.improved, "{row:?}");
        // Both proven optimal: the tolerance alone, and no note.
        let row = planned_overhead_row(figures(o, 0.0), figures(o + 0.005, 0.0), 0.01);
        assert!(!row.regression && row.note.is_empty(), "{row:?}");
        let row = planned_overhead_row(figures(o, 0.0), figures(o + 0.02, 0.0), 0.01);
        assert!(row.regression, "{row:?}");
        assert!(
            row.note
                .starts_with("grew by more than the allowed 1.00 points (tolerance 1.00)"),
            "{row:?}"
        );
    }

    /// A change of what the model was planned with is said in its rows: dims, params and inputs
    /// in all five, the solver and its time limit in the planned overhead's; a baseline without
    /// the record says nothing.
    #[test]
    fn changed_planning_options_are_said_in_the_rows() {
        let with = |seq: u64, time_limit: f64| PlannedWith {
            dims: [("batch".to_string(), 2), ("seq".to_string(), seq)].into(),
            solver: Some("auto".to_string()),
            time_limit: Some(time_limit),
            ..PlannedWith::default()
        };
        let baseline = |w: Option<PlannedWith>| BaselineFile {
            version: 1,
            models: [(
                "m".to_string(),
                Figures {
                    planned_with: w,
                    ..figures(0.1, 0.0)
                },
            )]
            .into(),
        };
        let figures = [(
            "m".to_string(),
            Figures {
                planned_with: Some(with(40, 5.0)),
                ..figures(0.1, 0.0)
            },
        )]
        .into();
        let outcome = compare(
            &config(0.01),
            &figures,
            Some(&baseline(Some(with(32, 10.0)))),
        );
        assert_eq!(outcome.rows.len(), 5);
        for r in &outcome.rows {
            assert!(r.note.contains("dims changed: seq 32 → 40"), "{r:?}");
            assert_eq!(
                r.note.contains("time_limit changed 10 s → 5 s"),
                r.figure == "planned_overhead",
                "{r:?}"
            );
        }
        let outcome = compare(&config(0.01), &figures, Some(&baseline(None)));
        assert!(
            outcome.rows.iter().all(|r| r.note.is_empty()),
            "{outcome:?}"
        );
    }

    /// The rows say whether the model file changed: a regression of the same file is not the
    /// model's doing.
    #[test]
    fn the_rows_say_whether_the_model_file_changed() {
        let with = |hash: &str| PlannedWith {
            model_sha256: Some(hash.to_string()),
            ..PlannedWith::default()
        };
        let one = |overhead: f64, hash: &str| -> BTreeMap<String, Figures> {
            [(
                "m".to_string(),
                Figures {
                    planned_with: Some(with(hash)),
                    ..figures(overhead, 0.0)
                },
            )]
            .into()
        };
        let baseline = BaselineFile {
            version: 1,
            models: one(0.1, "aaaaaaaaaaaaaaaa"),
        };
        let changed = compare(
            &config(0.01),
            &one(0.1, "bbbbbbbbbbbbbbbb"),
            Some(&baseline),
        );
        assert!(
            changed.rows.iter().all(|r| r
                .note
                .contains("model file changed (sha256 aaaaaaaaaaaa → bbbbbbbbbbbb)")),
            "{changed:?}"
        );
        let same = compare(
            &config(0.01),
            &one(0.2, "aaaaaaaaaaaaaaaa"),
            Some(&baseline),
        );
        let row = same
            .rows
            .iter()
            .find(|r| r.figure == "planned_overhead")
            .unwrap();
        assert!(
            row.regression && row.note.contains("the model file is unchanged"),
            "{row:?}"
        );
        assert!(same
            .rows
            .iter()
            .filter(|r| !r.regression)
            .all(|r| !r.note.contains("unchanged")));
    }

    /// A model name with a comma, `::` or a newline stays inside its annotation's title, and
    /// a model taken out of the config shows in every format.
    #[test]
    fn github_annotations_are_escaped_and_dropped_models_show_everywhere() {
        let gh = render_github(&outcome("res,net::x%\n"), Path::new("remat.toml"));
        let error = gh.lines().find(|l| l.starts_with("::error")).unwrap();
        assert!(
            error.starts_with("::error file=remat.toml,title=remat gate%3A res%2Cnet%3A%3Ax%25%0A store_all_peak_bytes::"),
            "{error}"
        );
        assert!(
            gh.lines().any(|l| l.starts_with("::warning")
                && l.contains("gone")
                && l.contains("no longer in the config")),
            "{gh}"
        );
        assert!(render_markdown(&outcome("m"))
            .contains("gone: in the baseline but no longer in the config"));
        assert!(render_text(&outcome("m")).contains("no longer in the config"));
    }
}
