//! Plans made before, offered to a new plan of the same model, so that a plan at a budget never
//! costs more than one remat found at a lower budget (issue 19): the service's stored plans
//! ([`from_history`]) and the plan documents `remat plan --reuse` is given ([`from_document`]).
//! The solver compares them with what it finds after it ran
//! (`remat_solver::plan::plan_reusing`), pruned to the budget.

use crate::engine::{Fitted, History, PlanRequest};
use remat_planner::InspectReport;
use remat_solver::plan::Earlier;
use remat_solver::schedule::StepJson;
use remat_solver::{simulate, Problem, Schedule};
use serde_json::Value;

/// Most stored plans one plan is offered (the cheapest of those whose peak fits its budget):
/// each is a document read and a simulation.
pub const MAX_REUSED: usize = 4;

/// The plans of `history` made with the same problem as `request` whose predicted peak fits
/// `budget`, cheapest first (by the overhead they were stored with), at most [`MAX_REUSED`],
/// as schedules of `problem`. A stored plan that is not a schedule of `problem` (planned by
/// a version of remat that imported the model otherwise) is left out, and the log says why.
pub fn from_history(
    history: &dyn History,
    problem: &Problem,
    request: &PlanRequest,
    budget: u64,
) -> Vec<Earlier> {
    let mut fitting: Vec<(f64, String)> = history
        .plans()
        .into_iter()
        .filter(|s| s.request.same_problem(request))
        .filter_map(|s| {
            let f = Fitted::read(&s.summary)?;
            (f.peak_bytes <= budget).then_some((f.overhead, s.id))
        })
        .collect();
    fitting.sort_by(|a, b| a.0.total_cmp(&b.0));
    fitting
        .into_iter()
        .take(MAX_REUSED)
        .filter_map(|(_, id)| {
            let document = history.document(&id)?;
            match from_document(problem, None, &document) {
                Ok(earlier) => Some(earlier),
                Err(e) => {
                    tracing::warn!(plan = %id, error = %e, "a stored plan of this model is not reused");
                    None
                }
            }
        })
        .collect()
}

/// A plan document (`remat plan --json`, the API's `plan`) as an earlier plan of `problem`:
/// the budget its schedule was first found at, its solver and its schedule. An error says
/// which field is missing or why the schedule is not one of `problem`, and then, given the
/// model's `report`, what the document records of its model that differs
/// ([`MadeOtherwise`]: other dims, other frozen weights).
pub fn from_document(
    problem: &Problem,
    report: Option<&InspectReport>,
    document: &Value,
) -> Result<Earlier, String> {
    let field = |name: &str| {
        document
            .get(name)
            .ok_or_else(|| format!("the plan document has no {name:?}"))
    };
    let status = field("status")?.as_str().unwrap_or_default();
    if status == "infeasible" {
        return Err("the plan is infeasible: it has no schedule".to_string());
    }
    let budget_bytes = field("budget_bytes")?
        .as_u64()
        .ok_or("the plan document's \"budget_bytes\" is not a whole number of bytes")?;
    let from = match document.get("reused_from_budget_bytes") {
        None | Some(Value::Null) => budget_bytes,
        Some(v) => v.as_u64().ok_or(
            "the plan document's \"reused_from_budget_bytes\" is not a whole number of bytes",
        )?,
    };
    let solver = field("solver")?
        .as_str()
        .ok_or("the plan document's \"solver\" is not a string")?
        .to_string();
    let steps: Vec<StepJson> = serde_json::from_value(field("schedule")?.clone())
        .map_err(|e| format!("the plan document's \"schedule\": {e}"))?;
    let not_ours = |e: String| {
        let e = format!("its schedule is not one of this model's graph: {e}");
        match MadeOtherwise::of(report, document).hint() {
            Some(hint) => format!("{e}: {hint}"),
            None => e,
        }
    };
    let schedule =
        Schedule::from_json_steps(problem, &steps).map_err(|e| not_ours(e.to_string()))?;
    simulate(problem, &schedule).map_err(|e| not_ours(e.to_string()))?;
    Ok(Earlier {
        budget_bytes: from,
        solver,
        schedule,
    })
}

/// What a plan document records of the model it was made of that differs from `report`, the
/// loaded model's: the first input whose shape is another (`reshaped`: other `--dim`
/// values), and parameter or buffer bytes that are others (`reclassified`: other `--freeze`,
/// `--param` or `--input`). A figure the document lacks (a node-link graph's plan) says
/// nothing. The schedule's ids may all map even so (most ids are the same at any dims), and
/// a run then fails on a value that is not resident, naming no option; a schedule that does
/// not map is explained by them.
#[derive(Debug, Default, PartialEq)]
pub struct MadeOtherwise {
    pub reshaped: Option<String>,
    pub reclassified: Option<String>,
}

impl MadeOtherwise {
    pub fn of(report: Option<&InspectReport>, document: &Value) -> Self {
        let Some(report) = report else {
            return Self::default();
        };
        let planned = |field: &str| {
            document
                .pointer(&format!("/model/{field}"))
                .and_then(Value::as_u64)
        };
        let reclassified = [
            ("params_bytes", report.params_bytes),
            ("buffers_bytes", report.buffers_bytes),
        ]
        .into_iter()
        .find_map(|(field, ours)| {
            let (theirs, ours) = (planned(field)?, ours?);
            (theirs != ours)
                .then(|| format!("the plan was made with {field} {theirs}, which is {ours} here"))
        });
        let reshaped = document
            .pointer("/model/inputs")
            .and_then(Value::as_array)
            .and_then(|inputs| {
                inputs.iter().find_map(|input| {
                    let name = input.get("name").and_then(Value::as_str)?;
                    let shape: Vec<u64> = input
                        .get("shape")
                        .and_then(Value::as_array)?
                        .iter()
                        .filter_map(Value::as_u64)
                        .collect();
                    let ours = report.inputs.iter().find(|i| i.name == name)?.shape.as_ref()?;
                    (*ours != shape).then(|| {
                        format!(
                            "the plan was made with input {name:?} of shape {shape:?}, which is {ours:?} here"
                        )
                    })
                })
            });
        Self {
            reshaped,
            reclassified,
        }
    }

    /// The differences as a sentence with the options to look at, or `None`.
    pub fn hint(&self) -> Option<String> {
        let mut parts = vec![];
        if let Some(r) = &self.reshaped {
            parts.push(format!("{r} (give the --dim values it was made with)"));
        }
        if let Some(r) = &self.reclassified {
            parts.push(format!(
                "{r} (the model was imported with other --freeze, --param or --input)"
            ));
        }
        (!parts.is_empty()).then(|| parts.join("; "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::StoredPlan;
    use remat_solver::plan::{plan, Algorithm, PlanOptions};
    use remat_solver::store_all_peak;
    use serde_json::json;
    use std::cell::Cell;
    use std::collections::HashMap;
    use std::time::Duration;

    /// A chain of six forward nodes (ids 0-5) and their backward (ids 6-11): backward node
    /// `6 + j` reads forward `5 - j` and the backward node before it (the first: forward 5 alone).
    fn problem() -> Problem {
        let k = 6;
        let mut nodes = Vec::new();
        let mut links = Vec::new();
        for i in 0..k {
            nodes.push(json!({"id": i, "cost_cpu": 1.0 + i as f64, "cost_ram": 100 * (i + 1)}));
            if i > 0 {
                links.push(json!({"source": i - 1, "target": i}));
            }
        }
        for j in 0..k {
            nodes.push(json!({"id": k + j, "cost_cpu": 2.0, "cost_ram": 50, "backward": true}));
            links.push(json!({"source": k - 1 - j, "target": k + j}));
            if j > 0 {
                links.push(json!({"source": k + j - 1, "target": k + j}));
            }
        }
        let graph = json!({"directed": true, "nodes": nodes, "links": links});
        remat_solver::io::parse_node_link(&graph.to_string(), "chain").expect("the graph parses")
    }

    struct Stored {
        plans: Vec<StoredPlan>,
        documents: HashMap<String, Value>,
        reads: Cell<usize>,
    }

    impl History for Stored {
        fn plans(&self) -> Vec<StoredPlan> {
            self.plans.clone()
        }

        fn document(&self, id: &str) -> Option<Value> {
            self.reads.set(self.reads.get() + 1);
            self.documents.get(id).cloned()
        }
    }

    fn planned(p: &Problem, budget: u64, algorithm: Algorithm) -> Value {
        let opts = PlanOptions {
            budget,
            algorithm,
            time_limit: Duration::from_secs(5),
            threads: 1,
            bound_time: Duration::ZERO,
            cancel: Default::default(),
        };
        let (_, report) = plan(p, &opts).expect("plans");
        serde_json::to_value(report).expect("serializes")
    }

    fn stored(id: &str, request: PlanRequest, document: &Value) -> StoredPlan {
        StoredPlan {
            id: id.to_string(),
            request,
            summary: crate::engine::summarize(document).expect("a summary"),
        }
    }

    #[test]
    fn the_cheapest_stored_plans_of_the_same_problem_that_fit_are_offered() {
        let p = problem();
        let peak = store_all_peak(&p);
        let request = PlanRequest::default();
        let other_dims = PlanRequest {
            dims: [("batch".to_string(), 4)].into(),
            ..PlanRequest::default()
        };
        let full = planned(&p, peak, Algorithm::StoreAll);
        let tight = planned(&p, peak - 1, Algorithm::Auto);
        let tight_peak = tight["predicted"]["peak_bytes"].as_u64().unwrap();
        let mut documents = HashMap::new();
        documents.insert("full".to_string(), full.clone());
        documents.insert("tight".to_string(), tight.clone());
        documents.insert("dims".to_string(), full.clone());
        let history = Stored {
            plans: vec![
                stored("full", request.clone(), &full),
                stored("tight", request.clone(), &tight),
                stored("dims", other_dims, &full),
            ],
            documents,
            reads: Cell::new(0),
        };
        // Store-all's peak fits both: the cheaper (store-all) first; the other dims never.
        let both = from_history(&history, &p, &request, peak);
        assert_eq!(both.len(), 2);
        assert_eq!(both[0].solver, "store-all");
        assert_eq!(both[0].budget_bytes, peak);
        assert_eq!(both[1].budget_bytes, peak - 1);
        // Under store-all's peak only the tight plan fits; under its peak none is read.
        let one = from_history(&history, &p, &request, tight_peak);
        assert_eq!(one.len(), 1);
        assert_eq!(one[0].budget_bytes, peak - 1);
        let reads = history.reads.get();
        assert!(from_history(&history, &p, &request, tight_peak - 1).is_empty());
        assert_eq!(
            history.reads.get(),
            reads,
            "no document read when none fits"
        );
    }

    #[test]
    fn a_document_that_is_not_a_schedule_of_the_problem_says_why() {
        let p = problem();
        let good = planned(&p, store_all_peak(&p), Algorithm::StoreAll);
        assert!(from_document(&p, None, &good).is_ok());
        let mut unknown = good.clone();
        unknown["schedule"][0]["node"] = json!("no-such-node");
        let e = from_document(&p, None, &unknown).unwrap_err();
        assert!(e.contains("no-such-node"), "{e}");
        let mut short = good.clone();
        short["schedule"] = json!([good["schedule"].as_array().unwrap().last().unwrap()]);
        let e = from_document(&p, None, &short).unwrap_err();
        assert!(e.contains("not one of this model's graph"), "{e}");
        let mut no_budget = good.clone();
        no_budget.as_object_mut().unwrap().remove("budget_bytes");
        assert_eq!(
            from_document(&p, None, &no_budget).unwrap_err(),
            "the plan document has no \"budget_bytes\""
        );
        let mut infeasible = good;
        infeasible["status"] = json!("infeasible");
        assert!(from_document(&p, None, &infeasible)
            .unwrap_err()
            .contains("infeasible"));
    }

    #[test]
    fn a_reused_plan_keeps_the_budget_it_was_first_found_at() {
        let p = problem();
        let mut doc = planned(&p, store_all_peak(&p), Algorithm::StoreAll);
        doc["reused_from_budget_bytes"] = json!(12);
        assert_eq!(from_document(&p, None, &doc).unwrap().budget_bytes, 12);
    }

    #[test]
    fn requests_plan_the_same_problem_when_dims_params_and_inputs_agree() {
        let a = PlanRequest {
            budget: Some("0.5x".into()),
            params: vec!["w".into(), "v".into()],
            ..PlanRequest::default()
        };
        let b = PlanRequest {
            budget: Some("0.9x".into()),
            solver: Some("ilp".into()),
            params: vec!["v".into(), "w".into()],
            validate: Some(true),
            ..PlanRequest::default()
        };
        assert!(a.same_problem(&b));
        let dims = PlanRequest {
            dims: [("batch".to_string(), 2)].into(),
            ..a.clone()
        };
        assert!(!a.same_problem(&dims));
        let inputs = PlanRequest {
            inputs: vec!["x".into()],
            ..a.clone()
        };
        assert!(!a.same_problem(&inputs));
        let maximize = PlanRequest {
            maximize: Some("batch".into()),
            ..a.clone()
        };
        assert!(!a.same_problem(&maximize));
    }
}
