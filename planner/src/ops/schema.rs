//! What the ONNX operator schemas say of a node, checked before its shape rule runs: how many
//! inputs its op takes and the type of each attribute it declares (`onnx_schema.txt`, written
//! by `fixtures/onnx_schema.py` from the pinned `onnx` package), and the values a string
//! attribute may take (`ENUMS`). An attribute read only by a kernel (Elu's `alpha`, Pad's
//! `mode`) would otherwise be refused only when the plan runs; an input past the op's last
//! would be ignored.

use crate::error::Result;
use crate::ops::rule::Ctx;
use onnx_protobuf::attribute_proto::AttributeType;
use std::collections::HashMap;
use std::sync::OnceLock;

struct Schema {
    /// `None` for a variadic op.
    most_inputs: Option<usize>,
    attrs: HashMap<&'static str, AttributeType>,
}

fn attribute_type(name: &str) -> Option<AttributeType> {
    use AttributeType::*;
    Some(match name {
        "FLOAT" => FLOAT,
        "INT" => INT,
        "STRING" => STRING,
        "TENSOR" => TENSOR,
        "GRAPH" => GRAPH,
        "SPARSE_TENSOR" => SPARSE_TENSOR,
        "TYPE_PROTO" => TYPE_PROTO,
        "FLOATS" => FLOATS,
        "INTS" => INTS,
        "STRINGS" => STRINGS,
        "TENSORS" => TENSORS,
        "GRAPHS" => GRAPHS,
        "SPARSE_TENSORS" => SPARSE_TENSORS,
        "TYPE_PROTOS" => TYPE_PROTOS,
        _ => return None,
    })
}

fn schemas() -> &'static HashMap<&'static str, Schema> {
    static TABLE: OnceLock<HashMap<&'static str, Schema>> = OnceLock::new();
    TABLE.get_or_init(|| {
        let mut table = HashMap::new();
        for line in include_str!("onnx_schema.txt").lines() {
            if line.starts_with('#') || line.trim().is_empty() {
                continue;
            }
            let mut words = line.split_whitespace();
            let (Some(op), Some(most)) = (words.next(), words.next()) else {
                continue;
            };
            let attrs = words
                .filter_map(|w| {
                    let (name, ty) = w.split_once(':')?;
                    Some((name, attribute_type(ty)?))
                })
                .collect();
            let most_inputs = most.parse().ok();
            table.insert(op, Schema { most_inputs, attrs });
        }
        table
    })
}

/// The values an enumerated string attribute may take, by op and attribute (ONNX's operator
/// documentation; the schemas do not list them). Those a shape rule reads itself (`auto_pad`
/// in `Window::read`, DepthToSpace's `mode`, the recurrent ops' `direction`) are checked there.
const ENUMS: &[(&str, &str, &[&str])] = &[
    ("BitShift", "direction", &["LEFT", "RIGHT"]),
    ("Gelu", "approximate", &["none", "tanh"]),
    (
        "GridSample",
        "mode",
        &["bilinear", "nearest", "bicubic", "linear", "cubic"],
    ),
    (
        "GridSample",
        "padding_mode",
        &["zeros", "border", "reflection"],
    ),
    ("Pad", "mode", &["constant", "reflect", "edge", "wrap"]),
    ("Resize", "mode", &["nearest", "linear", "cubic"]),
    ("Upsample", "mode", &["nearest", "linear", "bilinear"]),
    (
        "Resize",
        "coordinate_transformation_mode",
        &[
            "half_pixel",
            "half_pixel_symmetric",
            "pytorch_half_pixel",
            "align_corners",
            "asymmetric",
            "tf_half_pixel_for_nn",
            "tf_crop_and_resize",
        ],
    ),
    (
        "Resize",
        "keep_aspect_ratio_policy",
        &["stretch", "not_larger", "not_smaller"],
    ),
    (
        "Resize",
        "nearest_mode",
        &["round_prefer_floor", "round_prefer_ceil", "floor", "ceil"],
    ),
    ("RoiAlign", "mode", &["avg", "max"]),
    (
        "RoiAlign",
        "coordinate_transformation_mode",
        &["half_pixel", "output_half_pixel"],
    ),
    (
        "ScatterElements",
        "reduction",
        &["none", "add", "mul", "max", "min"],
    ),
    (
        "ScatterND",
        "reduction",
        &["none", "add", "mul", "max", "min"],
    ),
    (
        "NegativeLogLikelihoodLoss",
        "reduction",
        &["none", "sum", "mean"],
    ),
    (
        "SoftmaxCrossEntropyLoss",
        "reduction",
        &["none", "sum", "mean"],
    ),
];

/// Refuses a node of a default-domain op that has more inputs than the op takes, an
/// attribute of another type than the op's schema declares (one with no type set, as very old
/// models write, is taken as it is), or an enumerated string attribute with a value the op
/// does not define. Each error names the node, the op and the attribute or input count.
pub fn check(cx: &Ctx) -> Result<()> {
    let Some(schema) = schemas().get(cx.op) else {
        return Ok(());
    };
    if let Some(most) = schema.most_inputs {
        if cx.inputs.len() > most {
            return Err(cx.err(format!(
                "the node has {} inputs; {} takes at most {most}",
                cx.inputs.len(),
                cx.op
            )));
        }
    }
    for a in cx.attrs.list {
        let Some(&want) = schema.attrs.get(a.name.as_str()) else {
            continue;
        };
        match a.type_.enum_value() {
            Ok(t) if t == want || t == AttributeType::UNDEFINED => {}
            Ok(t) => {
                return Err(cx.attrs.err(
                    &a.name,
                    format!("expected a {want:?} attribute, found {t:?}"),
                ))
            }
            Err(code) => {
                return Err(cx
                    .attrs
                    .err(&a.name, format!("unknown attribute type code {code}")))
            }
        }
    }
    for (_, name, values) in ENUMS.iter().filter(|(op, _, _)| *op == cx.op) {
        if let Some(v) = cx.attrs.string(name)? {
            if !values.contains(&v.as_str()) {
                return Err(cx
                    .attrs
                    .err(name, format!("{v:?} is not one of {}", values.join(", "))));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every op the planner supports has a schema line (a misspelt or missing line would
    /// check nothing), apart from the ops of newer ONNX versions than the pinned package.
    #[test]
    fn every_registered_op_has_a_schema() {
        let missing: Vec<&str> = crate::ops::registry()
            .keys()
            .copied()
            .filter(|op| !schemas().contains_key(op))
            .collect();
        assert!(missing.is_empty(), "no schema for {missing:?}");
    }
}
