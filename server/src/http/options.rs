//! Plan options: read from the query string and the JSON envelope into the one options type
//! ([`PlanRequest`]) and the submission's own options ([`SubmitOptions`]), merged, checked,
//! clamped to the server's caps, and put in canonical form for the plan cache key.

use super::error::ApiError;
use super::store::Kind;
use crate::engine::{PlanRequest, DEFAULT_TIME_LIMIT, MAX_REQUEST_TIMING_ROUNDS};
use remat_solver::plan::{self, Algorithm};
use serde::Deserialize;
use std::time::Duration;
use utoipa::{IntoParams, ToSchema};

/// How the service handles one submission (beside what is planned).
#[derive(Debug, Clone, Default, PartialEq, Deserialize, ToSchema, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct SubmitOptions {
    /// Seconds to wait for the job before answering 202 (default 30).
    pub wait: Option<f64>,
    /// Plan again even when the same model and options were planned before.
    pub refresh: Option<bool>,
    /// The SHA-256 (hex) the model must have, as the service hashes it (ONNX bytes as sent, a
    /// JSON graph as its canonical text: the `model.hash` of the answers): any other model is
    /// refused with 409 `model_mismatch` before a job is made, instead of planned.
    pub expect_model: Option<String>,
}

/// The `options` of a JSON envelope (`{"model": ..., "options": {...}}`): the request's
/// fields and the submission's, nothing else. Its `budget` may also be a whole number of
/// bytes.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct EnvelopeOptions {
    #[serde(flatten)]
    pub request: PlanRequest,
    #[serde(flatten)]
    pub submit: SubmitOptions,
}

impl EnvelopeOptions {
    /// Reads an envelope's `options` (`null` or absent: none). The budget comes back apart,
    /// as it was sent, for [`resolve`] to read: a number there is bytes, and its check
    /// names `options.budget`.
    /// An error names the field by its path (`options.dims.batch: invalid type: string "2",
    /// expected u64`).
    pub fn read(
        options: Option<serde_json::Value>,
    ) -> Result<(EnvelopeOptions, Option<serde_json::Value>), String> {
        let mut options = match options {
            None | Some(serde_json::Value::Null) => return Ok((EnvelopeOptions::default(), None)),
            Some(v) => v,
        };
        let budget = options.as_object_mut().and_then(|map| map.remove("budget"));
        let read = serde_json::from_value(options.clone())
            .map_err(|e| located(&options).unwrap_or_else(|| format!("options: {e}")))?;
        Ok((read, budget))
    }
}

/// The first error in `options` with the path of the field it is in: each flattened part read
/// on its own (a flattened struct's error has no path).
fn located(options: &serde_json::Value) -> Option<String> {
    fn at<T: serde::de::DeserializeOwned>(
        part: serde_json::Map<String, serde_json::Value>,
    ) -> Option<String> {
        let e = serde_path_to_error::deserialize::<_, T>(serde_json::Value::Object(part)).err()?;
        let path = e.path().to_string();
        Some(match path.as_str() {
            "" | "." => format!("options: {}", e.into_inner()),
            _ => format!("options.{path}: {}", e.into_inner()),
        })
    }
    let (submit, request) = options
        .as_object()?
        .clone()
        .into_iter()
        .partition(|(k, _)| k == "wait" || k == "refresh" || k == "expect_model");
    at::<PlanRequest>(request).or_else(|| at::<SubmitOptions>(submit))
}

/// The options of a query string: the request's fields under their query names (`dim`,
/// `param`, `input` and `fraction` repeatable), each `dim` still as its `NAME=VALUE` text.
#[derive(Debug, Default)]
pub struct Query {
    pub request: PlanRequest,
    pub dims: Vec<String>,
    pub submit: SubmitOptions,
}

/// Splits a query string into pairs, with a 400 naming the fault.
pub fn query_pairs(query: Option<&str>) -> Result<Vec<(String, String)>, ApiError> {
    match query {
        None | Some("") => Ok(Vec::new()),
        Some(q) => serde_urlencoded::from_str(q).map_err(|e| {
            ApiError::bad_request(
                "invalid_query",
                format!("cannot parse the query string: {e}"),
            )
        }),
    }
}

fn invalid(message: impl Into<String>) -> ApiError {
    ApiError::bad_request("invalid_option", message)
}

fn parse_bool(key: &str, value: &str) -> Result<bool, ApiError> {
    match value {
        "true" | "1" | "yes" => Ok(true),
        "false" | "0" | "no" => Ok(false),
        _ => Err(invalid(format!(
            "query parameter `{key}`: expected true or false, got {value:?}"
        ))),
    }
}

fn parse_f64(key: &str, value: &str) -> Result<f64, ApiError> {
    value.parse::<f64>().map_err(|_| {
        invalid(format!(
            "query parameter `{key}`: expected a number, got {value:?}"
        ))
    })
}

impl Query {
    /// Reads the plan options of a query string; unknown parameters are an error.
    pub fn parse(pairs: &[(String, String)]) -> Result<Query, ApiError> {
        let mut q = Query::default();
        let r = &mut q.request;
        for (key, value) in pairs {
            match key.as_str() {
                "budget" => r.budget = Some(value.clone()),
                "dim" => q.dims.push(value.clone()),
                "solver" => r.solver = Some(value.clone()),
                "time_limit" => r.time_limit = Some(parse_f64(key, value)?),
                "bound_time" => r.bound_time = Some(parse_f64(key, value)?),
                "validate" => r.validate = Some(parse_bool(key, value)?),
                "name" => r.name = Some(value.clone()),
                "wait" => q.submit.wait = Some(parse_f64(key, value)?),
                "refresh" => q.submit.refresh = Some(parse_bool(key, value)?),
                "expect_model" => q.submit.expect_model = Some(value.clone()),
                "param" => r.params.push(value.clone()),
                "input" => r.inputs.push(value.clone()),
                "freeze" => r.frozen.push(value.clone()),
                "fraction" => r.fractions.push(parse_f64(key, value)?),
                "maximize" => r.maximize = Some(value.clone()),
                "max_overhead" => r.max_overhead = Some(parse_f64(key, value)?),
                "timing_rounds" => {
                    r.timing_rounds = Some(value.parse::<u32>().map_err(|_| {
                        invalid(format!(
                            "query parameter `{key}`: expected a whole number, got {value:?}"
                        ))
                    })?)
                }
                other => {
                    return Err(invalid(format!(
                        "unknown query parameter `{other}`; known: budget, dim, solver, time_limit, bound_time, \
                         validate, name, wait, refresh, expect_model, param, input, fraction, maximize, max_overhead, \
                         timing_rounds"
                    )))
                }
            }
        }
        Ok(q)
    }
}

/// Server limits that shape the options.
#[derive(Debug, Clone, Copy)]
pub struct Caps {
    pub max_time_limit: f64,
    pub default_wait: Duration,
    pub max_wait: Duration,
}

/// The options of one submission, ready to use.
#[derive(Debug, Clone)]
pub struct Resolved {
    pub request: PlanRequest,
    /// The options as applied (with a note when a value was clamped), stored with the plan.
    pub applied: serde_json::Value,
    pub wait: Duration,
    pub refresh: bool,
    /// The model hash the submission must have ([`SubmitOptions::expect_model`]), lowercase.
    pub expect_model: Option<String>,
}

/// Merges envelope and query options (a query value wins over the envelope's; lists add up),
/// checks and clamps them. `body` is what [`EnvelopeOptions::read`] returned.
pub fn resolve(
    body: Option<(EnvelopeOptions, Option<serde_json::Value>)>,
    query: Query,
    caps: Caps,
) -> Result<Resolved, ApiError> {
    let (body, body_budget) = body.unwrap_or_default();
    let budget = match body_budget {
        None | Some(serde_json::Value::Null) => None,
        Some(serde_json::Value::String(s)) => Some(s),
        Some(serde_json::Value::Number(n)) if n.is_u64() => Some(n.to_string()),
        Some(other) => {
            return Err(invalid(format!(
                "options.budget: expected a string (\"2GiB\", \"0.6x\") or a whole number of bytes, got {other}"
            )))
        }
    };
    let (b, q) = (body.request, query.request);
    let mut request = PlanRequest {
        budget: q.budget.or(budget),
        dims: b.dims,
        solver: q.solver.or(b.solver),
        time_limit: q.time_limit.or(b.time_limit),
        bound_time: q.bound_time.or(b.bound_time),
        validate: q.validate.or(b.validate),
        name: q.name.or(b.name),
        params: b.params,
        inputs: b.inputs,
        frozen: b.frozen,
        fractions: b.fractions,
        maximize: q.maximize.or(b.maximize),
        max_overhead: q.max_overhead.or(b.max_overhead),
        timing_rounds: q.timing_rounds.or(b.timing_rounds),
    };
    // The budget's syntax and the solver's name are the request's, whatever the model: a bad
    // one is refused here, before any job is made, by the parsers the plan uses.
    if let Some(budget) = &request.budget {
        budget_key(budget)?;
    }
    if let Some(solver) = &request.solver {
        solver
            .parse::<Algorithm>()
            .map_err(|e| invalid(format!("solver: {e}")))?;
    }
    // A display name is stored as text: PostgreSQL's cannot hold a NUL, and no control
    // character belongs in a name shown in lists and logs.
    if let Some(name) = &request.name {
        if let Some(c) = name.chars().find(|c| c.is_control()) {
            return Err(invalid(format!(
                "name {name:?}: a display name may not hold a control character ({c:?})"
            )));
        }
    }
    if let Some(n) = request.timing_rounds {
        if !(2..=MAX_REQUEST_TIMING_ROUNDS).contains(&n) {
            return Err(invalid(format!(
                "timing_rounds {n}: expected 2 to {MAX_REQUEST_TIMING_ROUNDS}"
            )));
        }
    }
    let mut from_query = std::collections::HashMap::new();
    for binding in &query.dims {
        let (name, value) = binding.split_once('=').ok_or_else(|| {
            invalid(format!(
                "dim {binding:?}: expected NAME=VALUE, e.g. dim=batch=8"
            ))
        })?;
        let name = name.trim();
        if name.is_empty() {
            return Err(invalid(format!(
                "dim {binding:?}: the dimension name is empty"
            )));
        }
        let value = value.trim().parse::<u64>().map_err(|e| {
            let why = match e.kind() {
                std::num::IntErrorKind::PosOverflow => {
                    "is over the largest a dim may be (2^64 − 1)"
                }
                _ => "is not a non-negative integer",
            };
            invalid(format!(
                "dim {binding:?}: value {value:?} of `{name}` {why}"
            ))
        })?;
        // The query's value wins over the envelope's; the query itself says it once.
        if let Some(&other) = from_query.get(name) {
            if other != value {
                return Err(invalid(format!(
                    "dim {name} is given twice, as {other} and {value}: give it once"
                )));
            }
        }
        from_query.insert(name, value);
        request.dims.insert(name.to_string(), value);
    }
    if request.dims.keys().any(|k| k.trim().is_empty()) {
        return Err(invalid("options.dims: a dimension name is empty"));
    }
    if let Some((name, _)) = request.dims.iter().find(|(_, v)| **v == 0) {
        return Err(invalid(format!(
            "dim {name}=0: a dimension must be at least 1"
        )));
    }
    request.params.extend(q.params);
    request.inputs.extend(q.inputs);
    request.frozen.extend(q.frozen);
    request.fractions.extend(q.fractions);
    // A fraction given twice is one point of the sweep.
    let mut seen: Vec<f64> = Vec::new();
    request.fractions.retain(|f| {
        let first = !seen.contains(f);
        seen.push(*f);
        first
    });
    if let Some(f) = request
        .fractions
        .iter()
        .find(|f| !(f.is_finite() && **f > 0.0))
    {
        return Err(invalid(format!("fraction {f}: expected a positive number")));
    }

    if let Some(m) = request
        .max_overhead
        .filter(|m| !(m.is_finite() && *m >= 0.0))
    {
        return Err(invalid(format!(
            "max_overhead {m}: expected a non-negative fraction (0.1 is 10%)"
        )));
    }

    let mut clamped = serde_json::Map::new();
    // Each of the solve and the bound gets at most the server's cap.
    for (key, value, zero_ok) in [
        ("time_limit", &mut request.time_limit, false),
        ("bound_time", &mut request.bound_time, true),
    ] {
        let Some(t) = *value else { continue };
        if !(t.is_finite() && (t > 0.0 || (zero_ok && t == 0.0))) {
            let what = if zero_ok { "non-negative" } else { "positive" };
            return Err(invalid(format!(
                "{key} {t}: expected a {what} number of seconds"
            )));
        }
        if t > caps.max_time_limit {
            *value = Some(caps.max_time_limit);
            clamped.insert(
                key.to_string(),
                serde_json::json!({
                    "requested": t,
                    "applied": caps.max_time_limit,
                    "reason": format!("the server caps the solver time at {} s", caps.max_time_limit),
                }),
            );
        }
    }
    // A request without `time_limit` gets the default, and the cap where that is lower: the
    // cap bounds every solve, not only those that name their time.
    if request.time_limit.is_none() && DEFAULT_TIME_LIMIT > caps.max_time_limit {
        request.time_limit = Some(caps.max_time_limit);
        clamped.insert(
            "time_limit".to_string(),
            serde_json::json!({
                "default": DEFAULT_TIME_LIMIT,
                "applied": caps.max_time_limit,
                "reason": format!(
                    "time_limit was not given and its default, {DEFAULT_TIME_LIMIT} s, is over the \
                     server's cap of {} s",
                    caps.max_time_limit
                ),
            }),
        );
    }
    let wait = match query.submit.wait.or(body.submit.wait) {
        None => caps.default_wait,
        Some(w) if w.is_finite() && w >= 0.0 => {
            Duration::from_secs_f64(w.min(caps.max_wait.as_secs_f64()))
        }
        Some(w) => {
            return Err(invalid(format!(
                "wait {w}: expected a non-negative number of seconds"
            )))
        }
    };
    let refresh = query
        .submit
        .refresh
        .or(body.submit.refresh)
        .unwrap_or(false);
    let expect_model = match query.submit.expect_model.or(body.submit.expect_model) {
        None => None,
        Some(h) if h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit()) => {
            Some(h.to_ascii_lowercase())
        }
        Some(h) => {
            return Err(invalid(format!(
                "expect_model {h:?}: expected a SHA-256 in hex (64 characters), as `model.hash` gives it"
            )))
        }
    };

    let mut applied = serde_json::to_value(&request)
        .map_err(ApiError::internal)?
        .as_object()
        .cloned()
        .unwrap_or_default();
    if !clamped.is_empty() {
        applied.insert("clamped".to_string(), serde_json::Value::Object(clamped));
    }
    Ok(Resolved {
        request,
        applied: serde_json::Value::Object(applied),
        wait,
        refresh,
        expect_model,
    })
}

/// The budget as one text per budget, for the cache key: `min`, a fraction of the store-all
/// peak by its value (`0.9x` for `0.90x`), a size by its bytes (`2147483648` for `2GiB`). An
/// error, from the solver's own parser, names the budget's text.
fn budget_key(text: &str) -> Result<String, ApiError> {
    if plan::is_min_budget(text) {
        return Ok("min".to_string());
    }
    let bad = |e: remat_solver::SolverError| invalid(e.to_string());
    // A size's bytes are the same at every peak, a fraction's are not (the syntax is checked
    // at a peak of 0, where any fraction has its bytes).
    let at_zero = plan::parse_budget(text, 0).map_err(bad)?;
    if plan::parse_budget(text, 1).is_ok_and(|b| b == at_zero) {
        return Ok(at_zero.to_string());
    }
    let number = text.trim().trim_end_matches(['x', 'X']).trim();
    Ok(match number.parse::<f64>() {
        Ok(fraction) => format!("{fraction}x"),
        Err(_) => text.to_string(),
    })
}

/// The query parameters that never apply to a job of `kind`, which [`check_applies`] refuses
/// by name; the OpenAPI document leaves them out of the kind's `POST` operation.
pub fn not_applicable(kind: Kind) -> &'static [&'static str] {
    match kind {
        Kind::Plan => &["fraction"],
        Kind::Sweep => &[
            "budget",
            "validate",
            "timing_rounds",
            "maximize",
            "max_overhead",
        ],
    }
}

/// Refuses the options that do not apply to a job of `kind` (a plan has one budget, a sweep
/// its fractions; `max_overhead` bounds a `maximize` search): given, they would be ignored
/// and the job stored under options it did not use.
pub fn check_applies(kind: Kind, request: &PlanRequest) -> Result<(), ApiError> {
    let refuse = |field: &str, why: &str| Err(invalid(format!("{field} does not apply {why}")));
    match kind {
        Kind::Plan if !request.fractions.is_empty() => refuse(
            "fraction",
            "to a plan: a plan has one budget; a sweep (POST /v1/sweeps) plans at each fraction",
        ),
        Kind::Sweep if request.budget.is_some() => refuse(
            "budget",
            "to a sweep: it plans at each fraction of the store-all peak (fraction=...)",
        ),
        Kind::Sweep if request.validate.is_some() || request.timing_rounds.is_some() => refuse(
            if request.validate.is_some() {
                "validate"
            } else {
                "timing_rounds"
            },
            "to a sweep: validate a plan (POST /v1/plans?validate=true)",
        ),
        Kind::Sweep if request.maximize.is_some() => refuse(
            "maximize",
            "to a sweep: it is a plan's search (POST /v1/plans?maximize=...)",
        ),
        Kind::Plan if request.timing_rounds.is_some() && request.validate != Some(true) => refuse(
            "timing_rounds",
            "without validate=true: it is how many rounds a validation times the plan",
        ),
        _ if request.max_overhead.is_some() && request.maximize.is_none() => refuse(
            "max_overhead",
            "without maximize: it bounds the overhead of the largest value maximize finds",
        ),
        _ => Ok(()),
    }
}

/// The options that decide the result, in one canonical text: the display name is left out,
/// the budget is its value (`0.90x` is `0.9x`, `1KiB` is `1024`: [`budget_key`]), an option
/// spelled out at its default is the option left out (`solver=auto`, `validate=false`,
/// `bound_time=0`, `time_limit=30`), parameter, input and frozen lists are sorted, and
/// fractions only count for sweeps, as a set.
pub fn canonical(kind: Kind, request: &PlanRequest) -> String {
    let mut c = request.clone();
    c.name = None;
    if c.solver.as_deref() == Some("auto") {
        c.solver = None;
    }
    if c.validate == Some(false) {
        c.validate = None;
    }
    if c.bound_time == Some(0.0) {
        c.bound_time = None;
    }
    if c.time_limit == Some(DEFAULT_TIME_LIMIT) {
        c.time_limit = None;
    }
    c.fractions.sort_by(f64::total_cmp);
    c.fractions.dedup();
    c.budget = c.budget.map(|b| budget_key(&b).unwrap_or(b));
    c.params.sort();
    c.params.dedup();
    c.inputs.sort();
    c.inputs.dedup();
    c.frozen.sort();
    c.frozen.dedup();
    if kind == Kind::Plan {
        c.fractions.clear();
    }
    serde_json::to_string(&c).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn caps() -> Caps {
        Caps {
            max_time_limit: 300.0,
            default_wait: Duration::from_secs(30),
            max_wait: Duration::from_secs(60),
        }
    }

    fn pairs(q: &str) -> Vec<(String, String)> {
        query_pairs(Some(q)).unwrap()
    }

    /// A value of a query parameter that passes `resolve`.
    fn applicable_value(name: &str) -> &'static str {
        match name {
            "budget" => "0.5x",
            "validate" => "true",
            "timing_rounds" => "4",
            "maximize" => "batch",
            "max_overhead" => "0.1",
            "fraction" => "0.5",
            other => panic!("no test value for {other}"),
        }
    }

    /// Options that a job of the kind would ignore are refused, naming them.
    #[test]
    fn options_that_do_not_apply_to_the_kind_are_refused() {
        let req = |q: &str| {
            resolve(None, Query::parse(&pairs(q)).unwrap(), caps())
                .unwrap()
                .request
        };
        for (kind, q, field) in [
            (Kind::Plan, "budget=0.5x&fraction=0.5", "fraction"),
            (Kind::Sweep, "budget=0.5x", "budget"),
            (Kind::Sweep, "validate=true", "validate"),
            (Kind::Sweep, "timing_rounds=4", "timing_rounds"),
            (Kind::Sweep, "maximize=batch", "maximize"),
            (Kind::Plan, "budget=1GiB&max_overhead=0.1", "max_overhead"),
            (Kind::Plan, "budget=0.5x&timing_rounds=3", "timing_rounds"),
            (
                Kind::Plan,
                "budget=0.5x&validate=false&timing_rounds=3",
                "timing_rounds",
            ),
        ]
        .map(|(kind, q, field)| (kind, q.to_string(), field))
        .into_iter()
        // Every parameter the OpenAPI document leaves out of a kind's operation is refused.
        .chain([Kind::Plan, Kind::Sweep].into_iter().flat_map(|kind| {
            not_applicable(kind)
                .iter()
                .map(move |name| (kind, format!("{name}={}", applicable_value(name)), *name))
        })) {
            let q = q.as_str();
            let e = check_applies(kind, &req(q)).unwrap_err();
            assert!(
                e.error
                    .message
                    .starts_with(&format!("{field} does not apply")),
                "{q}: {}",
                e.error.message
            );
        }
        // A max_overhead that is no fraction is refused before any job is made.
        let q = Query::parse(&pairs("budget=1GiB&maximize=batch&max_overhead=-1")).unwrap();
        let e = resolve(None, q, caps()).unwrap_err();
        assert!(
            e.error.message.contains("max_overhead -1"),
            "{}",
            e.error.message
        );
        for (kind, q) in [
            (Kind::Plan, "budget=0.5x&validate=true&timing_rounds=4"),
            (Kind::Plan, "budget=1GiB&maximize=batch&max_overhead=0.1"),
            (Kind::Sweep, "fraction=0.5&solver=dp&time_limit=5"),
        ] {
            assert!(check_applies(kind, &req(q)).is_ok(), "{q}");
        }
    }

    /// A value of the wrong type is named by its path in the envelope.
    #[test]
    fn envelope_errors_name_the_field_by_its_path() {
        for (options, path) in [
            (
                serde_json::json!({"dims": {"batch": "2"}}),
                "options.dims.batch: ",
            ),
            (
                serde_json::json!({"dims": {"batch": -2}}),
                "options.dims.batch: ",
            ),
            (
                serde_json::json!({"time_limit": "abc"}),
                "options.time_limit: ",
            ),
        ] {
            let e = EnvelopeOptions::read(Some(options.clone())).unwrap_err();
            assert!(e.starts_with(path), "{options}: {e}");
        }
        let e = EnvelopeOptions::read(Some(serde_json::json!({"colour": 1}))).unwrap_err();
        assert!(e.contains("colour"), "{e}");
    }

    #[test]
    fn query_overrides_envelope_and_dims_merge() {
        let body = EnvelopeOptions::read(Some(serde_json::json!(
            {"budget": 1000, "dims": {"batch": 1, "seq": 4}, "solver": "dp"}
        )))
        .unwrap();
        let q = Query::parse(&pairs("budget=0.6x&dim=batch=2&wait=0")).unwrap();
        let r = resolve(Some(body), q, caps()).unwrap();
        assert_eq!(r.request.budget.as_deref(), Some("0.6x"));
        assert_eq!(r.request.dims.get("batch"), Some(&2));
        assert_eq!(r.request.dims.get("seq"), Some(&4));
        assert_eq!(r.request.solver.as_deref(), Some("dp"));
        assert_eq!(r.wait, Duration::ZERO);
    }

    #[test]
    fn bad_values_name_the_parameter() {
        let cases = [
            ("dim=batch", "dim \"batch\""),
            ("dim==3", "name is empty"),
            ("dim=batch=x", "`batch`"),
            ("time_limit=abc", "`time_limit`"),
            ("validate=maybe", "`validate`"),
            ("colour=red", "`colour`"),
            ("time_limit=-1", "time_limit -1"),
            ("wait=-3", "wait -3"),
            ("fraction=0", "fraction 0"),
            ("budget=lots", "budget \"lots\""),
            ("budget=12parsecs", "budget \"12parsecs\""),
            ("solver=magic", "solver: unknown algorithm \"magic\""),
            ("dim=batch=0", "dim batch=0"),
        ];
        for (q, needle) in cases {
            let err = Query::parse(&pairs(q))
                .and_then(|q| resolve(None, q, caps()))
                .unwrap_err();
            assert_eq!(err.status, axum::http::StatusCode::BAD_REQUEST, "{q}");
            assert!(
                err.error.message.contains(needle),
                "{q}: {}",
                err.error.message
            );
        }
    }

    /// An envelope's zero dim is refused like the query's, naming it.
    #[test]
    fn a_zero_dim_in_an_envelope_is_refused_naming_it() {
        let body = EnvelopeOptions::read(Some(serde_json::json!({"dims": {"seq": 0}}))).unwrap();
        let e = resolve(Some(body), Query::default(), caps()).unwrap_err();
        assert_eq!(e.error.code, "invalid_option");
        assert!(e.error.message.contains("dim seq=0"), "{}", e.error.message);
    }

    #[test]
    fn time_limit_is_clamped_and_says_so() {
        let r = resolve(
            None,
            Query::parse(&pairs("time_limit=1000&wait=999")).unwrap(),
            caps(),
        )
        .unwrap();
        assert_eq!(r.request.time_limit, Some(300.0));
        assert_eq!(r.applied["clamped"]["time_limit"]["requested"], 1000.0);
        assert_eq!(r.wait, Duration::from_secs(60));
    }

    /// A request that leaves `time_limit` out is held to the cap too, and the clamp says the
    /// default was capped; under a cap above the default nothing changes.
    #[test]
    fn an_absent_time_limit_is_capped_when_the_default_is_over_the_cap() {
        let low = Caps {
            max_time_limit: 10.0,
            ..caps()
        };
        let r = resolve(None, Query::parse(&pairs("budget=0.5x")).unwrap(), low).unwrap();
        assert_eq!(r.request.time_limit, Some(10.0));
        let c = &r.applied["clamped"]["time_limit"];
        assert_eq!(c["default"], DEFAULT_TIME_LIMIT, "{c}");
        assert_eq!(c["applied"], 10.0, "{c}");
        assert!(c["reason"].as_str().unwrap().contains("default"), "{c}");
        assert_eq!(r.applied["time_limit"], 10.0);
        let r = resolve(None, Query::parse(&pairs("budget=0.5x")).unwrap(), caps()).unwrap();
        assert_eq!(r.request.time_limit, None);
        assert!(r.applied.get("clamped").is_none(), "{}", r.applied);
    }

    /// Budgets of one value share a cache key however they are written; other budgets do not.
    #[test]
    fn canonical_keys_a_budget_by_its_value() {
        let key = |budget: &str| {
            canonical(
                Kind::Plan,
                &PlanRequest {
                    budget: Some(budget.to_string()),
                    ..Default::default()
                },
            )
        };
        for same in [
            ["0.9x", "0.90x"],
            ["0.9x", " 9e-1 X"],
            ["1KiB", "1024"],
            ["2GB", "2e9"],
            ["1024 B", "1kib"],
            ["min", " MIN"],
            ["0x", "0"],
        ] {
            assert_eq!(key(same[0]), key(same[1]), "{same:?}");
        }
        for other in [
            ["0.9x", "0.91x"],
            ["1x", "1"],
            ["1KB", "1KiB"],
            ["min", "0"],
        ] {
            assert_ne!(key(other[0]), key(other[1]), "{other:?}");
        }
    }

    #[test]
    fn canonical_ignores_name_and_list_order() {
        let a = PlanRequest {
            name: Some("a".into()),
            params: vec!["w2".into(), "w1".into()],
            ..Default::default()
        };
        let b = PlanRequest {
            name: Some("b".into()),
            params: vec!["w1".into(), "w2".into(), "w1".into()],
            fractions: vec![0.5],
            ..Default::default()
        };
        assert_eq!(canonical(Kind::Plan, &a), canonical(Kind::Plan, &b));
        assert_ne!(canonical(Kind::Sweep, &a), canonical(Kind::Sweep, &b));
    }

    /// An option spelled out at its default is the same request as the option left out (a
    /// client that writes `solver=auto` must not plan again), and a sweep's fractions are a
    /// set; other values stay apart.
    #[test]
    fn canonical_reads_defaults_spelled_out_as_left_out() {
        let key = |kind: Kind, r: PlanRequest| {
            canonical(
                kind,
                &PlanRequest {
                    budget: Some("0.9x".into()),
                    ..r
                },
            )
        };
        let plain = key(Kind::Plan, PlanRequest::default());
        for (what, r) in [
            (
                "solver=auto",
                PlanRequest {
                    solver: Some("auto".into()),
                    ..Default::default()
                },
            ),
            (
                "validate=false",
                PlanRequest {
                    validate: Some(false),
                    ..Default::default()
                },
            ),
            (
                "bound_time=0",
                PlanRequest {
                    bound_time: Some(0.0),
                    ..Default::default()
                },
            ),
            (
                "time_limit=30",
                PlanRequest {
                    time_limit: Some(DEFAULT_TIME_LIMIT),
                    ..Default::default()
                },
            ),
        ] {
            assert_eq!(key(Kind::Plan, r), plain, "{what}");
        }
        for (what, r) in [
            (
                "solver=ilp",
                PlanRequest {
                    solver: Some("ilp".into()),
                    ..Default::default()
                },
            ),
            (
                "validate=true",
                PlanRequest {
                    validate: Some(true),
                    ..Default::default()
                },
            ),
            (
                "bound_time=1",
                PlanRequest {
                    bound_time: Some(1.0),
                    ..Default::default()
                },
            ),
            (
                "time_limit=5",
                PlanRequest {
                    time_limit: Some(5.0),
                    ..Default::default()
                },
            ),
        ] {
            assert_ne!(key(Kind::Plan, r), plain, "{what}");
        }
        let fractions = |f: &[f64]| {
            key(
                Kind::Sweep,
                PlanRequest {
                    fractions: f.to_vec(),
                    ..Default::default()
                },
            )
        };
        assert_eq!(fractions(&[0.9, 0.7]), fractions(&[0.7, 0.9, 0.7]));
        assert_ne!(fractions(&[0.9, 0.7]), fractions(&[0.9]));
    }

    /// A fraction given twice (in the envelope and the query, or twice in either) is one
    /// point of the sweep, not two.
    #[test]
    fn a_fraction_given_twice_is_one_point() {
        let body =
            EnvelopeOptions::read(Some(serde_json::json!({"fractions": [0.9, 0.7]}))).unwrap();
        let q = Query::parse(&pairs("fraction=0.7&fraction=0.5&fraction=0.5")).unwrap();
        let r = resolve(Some(body), q, caps()).unwrap();
        assert_eq!(r.request.fractions, [0.9, 0.7, 0.5]);
    }
}
