//! Readers: the node-link JSON graphs of Checkmate and Moccasin.
//!
//! Two flavours exist:
//! - Checkmate's (`*_train_nx.json`): nodes carry `id`, `name`, `cost_cpu`, `cost_ram`,
//!   `backward`; links are `{"source", "target"}`; the natural order is the id order.
//! - Moccasin's random layered graphs: a node's id is its `name`, costs are `duration` and
//!   `out_cost`, links are `{"0": source, "1": target}`, and the natural order is `graph.order`.
//!
//! Ids are kept as they appear in the file (as strings) so that schedules name nodes the way
//! the input does.

use crate::error::{Result, SolverError};
use crate::problem::{Node, NodeKind, Problem};
use serde_json::Value;
use std::collections::HashMap;

fn fmt_err(what: impl Into<String>) -> SolverError {
    SolverError::GraphFormat { what: what.into() }
}

fn id_string(v: &Value, what: &str) -> Result<String> {
    match v {
        Value::String(s) => Ok(s.clone()),
        // An integer JSON reads exactly; any other number is a float, and two ids past 2^64
        // (or differing past the 17th digit) would read as one: the graph's links would join
        // other nodes than written.
        Value::Number(n) if n.is_u64() || n.is_i64() => Ok(n.to_string()),
        Value::Number(n) => Err(fmt_err(format!(
            "{what}: the id {n} is not an integer of at most 64 bits, which is what a numeric \
             id is read exactly as; give ids past that (or with a fraction) as strings"
        ))),
        other => Err(fmt_err(format!(
            "{what}: expected a number or string id, found {other}"
        ))),
    }
}

fn num_field(node: &Value, key: &str, id: &str) -> Result<f64> {
    match node.get(key) {
        Some(Value::Number(n)) => n
            .as_f64()
            .filter(|x| x.is_finite() && *x >= 0.0)
            .ok_or_else(|| {
                fmt_err(format!(
                    "node {id:?}: field {key:?} must be a non-negative number, found {n}"
                ))
            }),
        Some(other) => Err(fmt_err(format!(
            "node {id:?}: field {key:?} must be a number, found {other}"
        ))),
        None => Err(fmt_err(format!("node {id:?}: missing field {key:?}"))),
    }
}

fn bytes_field(node: &Value, key: &str, id: &str) -> Result<u64> {
    match node.get(key) {
        Some(Value::Number(n)) => n.as_u64().ok_or_else(|| {
            fmt_err(format!(
                "node {id:?}: field {key:?} must be a non-negative integer byte count, found {n}"
            ))
        }),
        Some(other) => Err(fmt_err(format!(
            "node {id:?}: field {key:?} must be an integer, found {other}"
        ))),
        None => Err(fmt_err(format!("node {id:?}: missing field {key:?}"))),
    }
}

/// Parses a node-link graph (either flavour) into a [`Problem`].
///
/// `fixed_bytes` is 0 for these graphs (their figures count activations only). Every node is
/// required (Checkmate's problem evaluates every node). Nodes with `backward: true` are
/// backward nodes; the first backward node in the natural order that reads only forward
/// values is the loss's gradient seed and keeps the `Backward` kind (the graphs carry no
/// separate loss node).
pub fn parse_node_link(text: &str, name: &str) -> Result<Problem> {
    let doc: Value = serde_json::from_str(text).map_err(|e| SolverError::Json(e.to_string()))?;
    let nodes = doc
        .get("nodes")
        .and_then(Value::as_array)
        .ok_or_else(|| fmt_err("missing array \"nodes\""))?;
    let links = doc
        .get("links")
        .or_else(|| doc.get("edges"))
        .and_then(Value::as_array)
        .ok_or_else(|| fmt_err("missing array \"links\""))?;
    let graph = doc.get("graph");
    let layered = nodes
        .first()
        .map(|n| n.get("out_cost").is_some())
        .unwrap_or(false);
    let graph_name = graph
        .and_then(|g| g.get("name"))
        .and_then(Value::as_str)
        .unwrap_or(name)
        .to_string();

    struct Raw {
        id: String,
        name: String,
        cost: f64,
        bytes: u64,
        backward: bool,
    }
    let mut raw = Vec::with_capacity(nodes.len());
    for (i, node) in nodes.iter().enumerate() {
        let id_key = if layered { "name" } else { "id" };
        let id = id_string(
            node.get(id_key)
                .ok_or_else(|| fmt_err(format!("node #{i}: missing field {id_key:?}")))?,
            &format!("node #{i} field {id_key:?}"),
        )?;
        let (cost, bytes) = if layered {
            (
                num_field(node, "duration", &id)?,
                bytes_field(node, "out_cost", &id)?,
            )
        } else {
            (
                num_field(node, "cost_cpu", &id)?,
                bytes_field(node, "cost_ram", &id)?,
            )
        };
        let name = if layered {
            id.clone()
        } else {
            node.get("name")
                .and_then(Value::as_str)
                .unwrap_or(&id)
                .to_string()
        };
        let backward = match node.get("backward") {
            None | Some(Value::Null) => false,
            Some(v) => v.as_bool().ok_or_else(|| {
                fmt_err(format!(
                    "node {id:?}: field \"backward\" is {v}, not true or false"
                ))
            })?,
        };
        raw.push(Raw {
            id,
            name,
            cost,
            bytes,
            backward,
        });
    }
    let by_id: HashMap<&str, usize> = raw
        .iter()
        .enumerate()
        .map(|(i, r)| (r.id.as_str(), i))
        .collect();
    if by_id.len() != raw.len() {
        let mut seen = std::collections::HashSet::new();
        let dup = raw
            .iter()
            .find(|r| !seen.insert(r.id.as_str()))
            .map(|r| r.id.clone());
        return Err(SolverError::DuplicateNodeId(dup.unwrap_or_default()));
    }

    // Natural order: graph.order for layered graphs, else ids sorted numerically (falling back
    // to file order when ids are not numbers).
    let order: Vec<usize> =
        if let Some(ord) = graph.and_then(|g| g.get("order")).and_then(Value::as_array) {
            let mut out = Vec::with_capacity(ord.len());
            for (k, v) in ord.iter().enumerate() {
                let id = id_string(v, &format!("graph.order[{k}]"))?;
                out.push(*by_id.get(id.as_str()).ok_or_else(|| {
                    fmt_err(format!("graph.order[{k}] names unknown node {id:?}"))
                })?);
            }
            if out.len() != raw.len() {
                return Err(fmt_err(format!(
                    "graph.order lists {} nodes but the graph has {}",
                    out.len(),
                    raw.len()
                )));
            }
            out
        } else {
            let mut idx: Vec<usize> = (0..raw.len()).collect();
            let numeric: Option<Vec<i64>> = raw.iter().map(|r| r.id.parse::<i64>().ok()).collect();
            if let Some(keys) = numeric {
                idx.sort_by_key(|&i| keys[i]);
            }
            idx
        };
    let mut pos = vec![usize::MAX; raw.len()];
    for (p, &i) in order.iter().enumerate() {
        if pos[i] != usize::MAX {
            return Err(fmt_err(format!(
                "node {:?} appears twice in the order",
                raw[i].id
            )));
        }
        pos[i] = p;
    }

    let mut deps: Vec<Vec<usize>> = vec![Vec::new(); raw.len()];
    for (k, link) in links.iter().enumerate() {
        let (sk, tk) = if link.get("source").is_some() || link.get("target").is_some() {
            ("source", "target")
        } else {
            ("0", "1")
        };
        let s = id_string(
            link.get(sk)
                .ok_or_else(|| fmt_err(format!("link #{k}: missing {sk:?}")))?,
            &format!("link #{k} {sk:?}"),
        )?;
        let t = id_string(
            link.get(tk)
                .ok_or_else(|| fmt_err(format!("link #{k}: missing {tk:?}")))?,
            &format!("link #{k} {tk:?}"),
        )?;
        let si = *by_id
            .get(s.as_str())
            .ok_or_else(|| fmt_err(format!("link #{k}: unknown source node {s:?}")))?;
        let ti = *by_id
            .get(t.as_str())
            .ok_or_else(|| fmt_err(format!("link #{k}: unknown target node {t:?}")))?;
        if pos[si] >= pos[ti] {
            return Err(fmt_err(format!(
                "link #{k} {s:?} -> {t:?} goes against the natural order (a cycle or an order that is not topological)"
            )));
        }
        deps[pos[ti]].push(pos[si]);
    }

    let nodes: Vec<Node> = order
        .iter()
        .enumerate()
        .map(|(p, &i)| {
            let r = &raw[i];
            Node {
                id: r.id.clone(),
                name: r.name.clone(),
                cost: r.cost,
                bytes: r.bytes,
                deps: std::mem::take(&mut deps[p]),
                kind: if r.backward {
                    NodeKind::Backward
                } else {
                    NodeKind::Forward
                },
                required: true,
            }
        })
        .collect();
    Problem::new(graph_name, nodes, 0)
}

/// Reads a node-link graph file.
pub fn read_node_link(path: &std::path::Path) -> Result<Problem> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| fmt_err(format!("cannot read {}: {e}", path.display())))?;
    let stem = path
        .file_stem()
        .and_then(|s| s.to_str())
        .unwrap_or("graph")
        .to_string();
    parse_node_link(&text, &stem)
}

#[cfg(test)]
mod tests {
    use super::parse_node_link;

    fn error(text: &str) -> String {
        parse_node_link(text, "g").expect_err(text).to_string()
    }

    /// A `backward` that is not a boolean was read as forward; a link with a target and no
    /// source was said to miss `"0"`, the other flavour's key.
    #[test]
    fn a_bad_backward_flag_or_a_link_without_source_is_named() {
        let node = |backward: &str| {
            format!(
                r#"{{"nodes": [{{"id": 0, "cost_cpu": 1, "cost_ram": 1}},
                     {{"id": 1, "cost_cpu": 1, "cost_ram": 1, "backward": {backward}}}],
                   "links": [{{"source": 0, "target": 1}}]}}"#
            )
        };
        let e = error(&node("\"yes\""));
        assert!(
            e.contains("node \"1\": field \"backward\" is \"yes\""),
            "{e}"
        );
        assert!(parse_node_link(&node("true"), "g").is_ok());
        assert!(parse_node_link(&node("null"), "g").is_ok());
        let e = error(
            r#"{"nodes": [{"id": 0, "cost_cpu": 1, "cost_ram": 1}, {"id": 1, "cost_cpu": 1, "cost_ram": 1}],
                "links": [{"target": 1}]}"#,
        );
        assert!(e.contains("link #0: missing \"source\""), "{e}");
    }

    /// Ids past 2^64 were read as floats: two of them one apart became one id, "appears more
    /// than once" (or, in a link, another node than written).
    #[test]
    fn a_numeric_id_that_is_no_64_bit_integer_is_refused() {
        let e = error(
            r#"{"nodes": [{"id": 18446744073709551616, "cost_cpu": 1, "cost_ram": 1},
                          {"id": 18446744073709551617, "cost_cpu": 1, "cost_ram": 1}],
                "links": [{"source": 18446744073709551616, "target": 18446744073709551617}]}"#,
        );
        assert!(e.contains("not an integer of at most 64 bits"), "{e}");
        assert!(
            error(r#"{"nodes": [{"id": 0.5, "cost_cpu": 1, "cost_ram": 1}], "links": []}"#)
                .contains("give ids past that (or with a fraction) as strings")
        );
        let ok = r#"{"nodes": [{"id": -1, "cost_cpu": 1, "cost_ram": 1},
                                {"id": 18446744073709551615, "cost_cpu": 1, "cost_ram": 1}],
                     "links": [{"source": -1, "target": 18446744073709551615}]}"#;
        assert!(parse_node_link(ok, "g").is_ok());
    }
}
