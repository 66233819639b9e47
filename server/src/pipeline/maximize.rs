//! `maximize`: the largest value of one dim (the batch, the sequence length) whose plan fits a
//! device's memory at no more than a given overhead — the question Ultralytics' AutoBatch and
//! Checkmate's max-batch answer, here with the plan that makes it fit. The search itself
//! ([`largest_fitting`]) knows nothing of models; `PlanJob::run_maximize` plans each value.

use crate::engine::document::MaximizeProbe;
use crate::engine::{EngineError, ErrorKind, PlanRequest};
use remat_solver::plan::{PlanReport, Status};

/// Values above this are not tried: the answer is then this value, with no `next_value`.
pub const MAX_VALUE: u64 = 1 << 20;

/// What [`largest_fitting`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Search {
    /// The largest value that fits (`None`: not even 1).
    pub best: Option<u64>,
    /// The value above it, tried and found not to fit (`None` when `best` is the cap).
    pub next: Option<u64>,
}

/// The largest `v` in `1..=cap` with `fits(v)`, assuming `fits` holds up to some value and not
/// above it (memory grows with the batch): from `start` (clamped to `1..=cap`) it doubles
/// while the value fits, then bisects between the last value that fits and the first that
/// does not, so the answer's successor is always one it tried. About `2·log2(answer/start)`
/// calls; each value is tried once.
pub fn largest_fitting<E>(
    start: u64,
    cap: u64,
    mut fits: impl FnMut(u64) -> Result<bool, E>,
) -> Result<Search, E> {
    let cap = cap.max(1);
    let start = start.clamp(1, cap);
    // `lo` fits (0: none known), `hi` does not.
    let (mut lo, mut hi) = if fits(start)? {
        let mut lo = start;
        loop {
            if lo == cap {
                return Ok(Search {
                    best: Some(cap),
                    next: None,
                });
            }
            let v = lo.saturating_mul(2).min(cap);
            if fits(v)? {
                lo = v;
            } else {
                break (lo, v);
            }
        }
    } else {
        (0, start)
    };
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if fits(mid)? {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    Ok(Search {
        best: (lo > 0).then_some(lo),
        next: Some(hi),
    })
}

fn invalid(message: String) -> EngineError {
    EngineError::new(ErrorKind::BadInput, "invalid_option", message)
}

/// A checked `maximize` request.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Limits {
    /// The device's memory: the budget every value is planned at.
    pub budget_bytes: u64,
    /// The most overhead that still fits (infinite when absent).
    pub max_overhead: f64,
}

/// Checks a `maximize` request; returns its budget and overhead limit.
pub fn check(req: &PlanRequest) -> Result<Limits, EngineError> {
    let dim = req.maximize.as_deref().unwrap_or_default();
    if dim.trim().is_empty() {
        return Err(invalid(
            "maximize: the dim to maximize is empty".to_string(),
        ));
    }
    let budget_bytes = match req.budget.as_deref().map(str::trim) {
        None => {
            return Err(invalid(
                "maximize needs the device's memory as the budget: bytes or a size (\"24GiB\")"
                    .to_string(),
            ))
        }
        Some(b) if remat_solver::plan::is_min_budget(b) => {
            return Err(invalid(format!(
                "maximize: budget {b:?} is the least peak of one model, which changes with \
                 `{dim}`; give the device's memory as bytes or a size (\"24GiB\")"
            )))
        }
        Some(b) if b.to_ascii_lowercase().ends_with('x') => {
            return Err(invalid(format!(
                "maximize: budget {b:?} is a fraction of the store-all peak, which changes with \
                 `{dim}`; give the device's memory as bytes or a size (\"24GiB\")"
            )))
        }
        // Not a fraction: the store-all peak does not enter.
        Some(b) => remat_solver::plan::parse_budget(b, 0).map_err(|e| invalid(e.to_string()))?,
    };
    if !req.fractions.is_empty() {
        return Err(invalid(
            "maximize plans at one budget; fractions belong to a sweep".to_string(),
        ));
    }
    let max_overhead = match req.max_overhead {
        None => f64::INFINITY,
        Some(m) if m.is_finite() && m >= 0.0 => m,
        Some(m) => {
            return Err(invalid(format!(
                "max_overhead must be a non-negative fraction (0.1 is 10%), got {m}"
            )))
        }
    };
    Ok(Limits {
        budget_bytes,
        max_overhead,
    })
}

/// An error at one value of the dim, with the value named.
pub fn at_value(dim: &str, value: u64, e: EngineError) -> EngineError {
    EngineError {
        message: format!("maximize at {dim}={value}: {}", e.message),
        ..e
    }
}

/// A percentage with two decimals, or the digits it takes to tell a small one from zero.
fn pct(x: f64) -> String {
    let p = 100.0 * x;
    if p != 0.0 && p.abs() < 0.005 {
        format!("{p:.1e}%")
    } else {
        format!("{p:.2}%")
    }
}

/// A value whose least possible peak is over the budget: not planned.
pub fn probe_below_floor(value: u64, peak: u64, floor: u64, budget: u64) -> MaximizeProbe {
    MaximizeProbe {
        value,
        fits: false,
        overhead: None,
        store_all_peak_bytes: peak,
        reason: format!(
            "no schedule can peak below {floor} bytes (what the largest step must hold), over the budget of {budget}"
        ),
    }
}

/// A value the model does not import at (a dim past what its weights cover): not planned.
pub fn probe_not_imported(value: u64, why: &str) -> MaximizeProbe {
    MaximizeProbe {
        value,
        fits: false,
        overhead: None,
        store_all_peak_bytes: 0,
        reason: format!("the model does not import at this value: {why}"),
    }
}

/// The verdict on one planned value.
pub fn probe(value: u64, peak: u64, report: &PlanReport, limit: f64) -> MaximizeProbe {
    let (fits, overhead, reason) = match report.status {
        Status::Infeasible => (
            false,
            None,
            format!(
                "no schedule found within the budget of {} bytes (the least peak found: {} bytes)",
                report.budget_bytes,
                report.min_feasible_budget_bytes.unwrap_or(0)
            ),
        ),
        _ => {
            let o = report.predicted.overhead;
            let fits = o <= limit + 1e-12;
            let verdict = if limit.is_infinite() {
                "fits".to_string()
            } else if fits {
                format!("fits: overhead {} within {}", pct(o), pct(limit))
            } else {
                format!("overhead {} over the limit of {}", pct(o), pct(limit))
            };
            (
                fits,
                Some(o),
                format!(
                    "{verdict} (peak {} of {} bytes, {})",
                    report.predicted.peak_bytes, report.budget_bytes, report.solver
                ),
            )
        }
    };
    MaximizeProbe {
        value,
        fits,
        overhead,
        store_all_peak_bytes: peak,
        reason,
    }
}

/// The error when no value fits, not even 1: every probe's reason.
pub fn nothing_fits(dim: &str, probes: &[MaximizeProbe]) -> EngineError {
    let tried: Vec<String> = probes
        .iter()
        .map(|p| format!("{dim}={}: {}", p.value, p.reason))
        .collect();
    EngineError::new(
        ErrorKind::Unprocessable,
        "nothing_fits",
        format!("maximize `{dim}`: no value fits; {}", tried.join("; ")),
    )
    .with_details(serde_json::json!({ "probes": probes }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(start: u64, cap: u64, answer: u64) -> (Search, Vec<u64>) {
        let mut tried = vec![];
        let s = largest_fitting::<()>(start, cap, |v| {
            tried.push(v);
            Ok(v <= answer)
        })
        .unwrap();
        (s, tried)
    }

    #[test]
    fn finds_the_largest_value_and_tries_its_successor() {
        for start in [1, 2, 3, 7, 64, 1000] {
            for answer in [0, 1, 2, 5, 63, 64, 65, 999, 1000, 4097] {
                let (s, tried) = run(start, 1 << 20, answer);
                assert_eq!(s.best, (answer > 0).then_some(answer), "{start} {answer}");
                assert_eq!(s.next, Some(answer + 1), "{start} {answer}");
                assert!(tried.contains(&(answer + 1)), "{start} {answer}: {tried:?}");
                let mut unique = tried.clone();
                unique.sort();
                unique.dedup();
                assert_eq!(unique.len(), tried.len(), "tried twice: {tried:?}");
                assert!(tried.len() <= 2 * 22, "{tried:?}");
            }
        }
    }

    #[test]
    fn small_overheads_are_not_shown_as_zero() {
        assert_eq!(pct(0.0), "0.00%");
        assert_eq!(pct(0.1), "10.00%");
        assert_eq!(pct(0.000_004), "4.0e-4%");
    }

    #[test]
    fn stops_at_the_cap() {
        let (s, tried) = run(3, 100, u64::MAX);
        assert_eq!(
            s,
            Search {
                best: Some(100),
                next: None
            }
        );
        assert_eq!(tried, vec![3, 6, 12, 24, 48, 96, 100]);
        let (s, _) = run(500, 100, 40);
        assert_eq!(
            s,
            Search {
                best: Some(40),
                next: Some(41)
            }
        );
    }

    #[test]
    fn errors_stop_the_search() {
        let mut n = 0;
        let r = largest_fitting(1, 1 << 20, |v| {
            n += 1;
            if v >= 8 {
                Err(format!("at {v}"))
            } else {
                Ok(true)
            }
        });
        assert_eq!(r, Err("at 8".to_string()));
        assert_eq!(n, 4);
    }

    #[test]
    fn requests_are_checked() {
        let req = |budget: Option<&str>, over: Option<f64>| PlanRequest {
            budget: budget.map(str::to_string),
            maximize: Some("batch".into()),
            max_overhead: over,
            ..PlanRequest::default()
        };
        let l = check(&req(Some("24GiB"), Some(0.1))).unwrap();
        assert_eq!((l.budget_bytes, l.max_overhead), (24 << 30, 0.1));
        assert!(check(&req(Some("1000"), None))
            .unwrap()
            .max_overhead
            .is_infinite());
        for (r, says) in [
            (req(None, None), "device's memory"),
            (req(Some("0.5x"), None), "fraction of the store-all peak"),
            (req(Some("1GiB"), Some(-0.1)), "max_overhead"),
            (req(Some("1GiB"), Some(f64::NAN)), "max_overhead"),
            (req(Some("lots"), None), "budget"),
        ] {
            let e = check(&r).unwrap_err();
            assert!(e.message.contains(says), "{}", e.message);
        }
        let mut sweep = req(Some("1GiB"), None);
        sweep.fractions = vec![0.5];
        assert!(check(&sweep).unwrap_err().message.contains("sweep"));
    }
}
