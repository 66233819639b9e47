//! The roofline cost model: what one computation of a training node costs, in seconds.
//!
//! FLOPs alone make memory-bound ops free: an elementwise op, a normalization or a pooling
//! has few FLOPs per byte it moves, and recomputing it looks costless to a solver that counts
//! FLOPs while it takes real time. The roofline charges each node the longer of its FLOPs at a
//! compute rate and its bytes moved ([`crate::TrainingGraph::traffic`]: what it reads and
//! writes) at a bandwidth, plus a fixed time per op (dispatch, allocation):
//!
//! ```text
//! seconds = max(flops / flops_per_second, bytes / bytes_per_second) + seconds_per_op
//! ```
//!
//! The rates differ by op family and direction, since a convolution, a matrix product, a
//! normalization and an elementwise op reach very different shares of a machine's peak, and
//! their backward differently again ([`OpClass`]). Within a family ops differ again (remat's
//! CPU executor moves a `Tanh`'s bytes at a thirtieth of an `Add`'s rate, and a depthwise
//! convolution reaches a fiftieth of a dense one's FLOP rate), so an op measured often enough
//! has rates of its own ([`Roofline::ops`], keyed by [`op_key`] over
//! [`TrainingGraph::rate_ops`]); any other op gets its class's. [`Roofline::cpu_default`] holds rates fitted
//! to remat's CPU executor on the 2-core development machine; [`Roofline::fit`] fits them to
//! measured op times on any machine (`remat calibrate`), and they are read from and written as
//! JSON. How much better than FLOPs it predicts what a plan costs: docs/cost-model.md.

use crate::error::{PlannerError, Result};
use crate::training::TrainingGraph;
use remat_solver::{NodeKind, Problem};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The op families the roofline gives rates of their own, each forward and backward.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OpClass {
    ConvForward,
    ConvBackward,
    MatMulForward,
    MatMulBackward,
    NormForward,
    NormBackward,
    OtherForward,
    OtherBackward,
}

impl OpClass {
    pub const ALL: [OpClass; 8] = [
        OpClass::ConvForward,
        OpClass::ConvBackward,
        OpClass::MatMulForward,
        OpClass::MatMulBackward,
        OpClass::NormForward,
        OpClass::NormBackward,
        OpClass::OtherForward,
        OpClass::OtherBackward,
    ];

    /// The class of a training node by its op (`Conv`, `ConvTranspose`: convolutions;
    /// `MatMul`, `Gemm`, `Attention`: matrix products; ops whose name holds `Normalization`,
    /// their batch statistics included: normalizations; everything else, the copies an op
    /// keeps for its backward included: other) and whether it is a backward node.
    pub fn of(op: &str, kind: NodeKind) -> OpClass {
        let backward = kind == NodeKind::Backward;
        let pick = |f: OpClass, b: OpClass| if backward { b } else { f };
        if op.starts_with("Conv") {
            pick(OpClass::ConvForward, OpClass::ConvBackward)
        } else if matches!(op, "MatMul" | "Gemm" | "Attention" | "MatMulInteger") {
            pick(OpClass::MatMulForward, OpClass::MatMulBackward)
        } else if op.contains("Normalization") {
            pick(OpClass::NormForward, OpClass::NormBackward)
        } else {
            pick(OpClass::OtherForward, OpClass::OtherBackward)
        }
    }

    fn index(self) -> usize {
        OpClass::ALL
            .iter()
            .position(|&c| c == self)
            .expect("every class is in ALL")
    }
}

/// One class's rates.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Rates {
    pub flops_per_second: f64,
    pub bytes_per_second: f64,
    pub seconds_per_op: f64,
}

impl Rates {
    /// Seconds for one computation of `flops` FLOPs moving `bytes` bytes.
    pub fn seconds(&self, flops: f64, bytes: f64) -> f64 {
        (flops / self.flops_per_second).max(bytes / self.bytes_per_second) + self.seconds_per_op
    }

    fn valid(&self) -> bool {
        self.flops_per_second.is_finite()
            && self.flops_per_second > 0.0
            && self.bytes_per_second.is_finite()
            && self.bytes_per_second > 0.0
            && self.seconds_per_op.is_finite()
            && self.seconds_per_op >= 0.0
    }
}

/// Rates per [`OpClass`] and per op, and where they come from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Roofline {
    /// What the rates were measured on (a machine, a device, the models).
    pub source: String,
    /// The executor device the rates were measured on (`cpu`, `cuda`).
    #[serde(default = "default_device")]
    pub device: String,
    /// Every class's rates.
    pub rates: BTreeMap<OpClass, Rates>,
    /// Rates of single ops, by [`op_key`] (`Tanh:forward`); they take precedence over their
    /// class's. Files written before they existed have none.
    #[serde(default)]
    pub ops: BTreeMap<String, Rates>,
}

fn default_device() -> String {
    "cpu".to_string()
}

/// The key of an op's own rates in [`Roofline::ops`]: the training node's op (as the
/// training graph names it: `Conv`, `BatchNormalization.stats`, `MatMul.input0_copy`) and its
/// direction, `Tanh:forward` or `Tanh:backward` (the loss counts as forward).
pub fn op_key(op: &str, kind: NodeKind) -> String {
    let dir = if kind == NodeKind::Backward {
        "backward"
    } else {
        "forward"
    };
    format!("{op}:{dir}")
}

/// The fewest samples of one op for [`Roofline::fit`] to give it rates of its own.
pub const MIN_OP_SAMPLES: usize = 3;

const G: f64 = 1e9;
const US: f64 = 1e-6;
/// A bandwidth that never binds ("compute or fixed cost only").
const UNBOUND: f64 = 1e15;

const fn rates(gflops: f64, gbytes: f64, us: f64) -> Rates {
    Rates {
        flops_per_second: gflops * G,
        bytes_per_second: gbytes * G,
        seconds_per_op: us * US,
    }
}

impl Roofline {
    /// Rates fitted ([`Roofline::fit`]) to remat's CPU executor on the 2-core x86-64
    /// development machine: twelve fixture models at batch 1, each op's time the least of ten
    /// runs of `optimes` (each the fastest of three store-all steps; 3,130 ops;
    /// docs/cost-model.md says which and how well they predict).
    pub const CPU_DEFAULT_RATES: [(OpClass, Rates); 8] = [
        (OpClass::ConvForward, rates(200.0, 5.0, 160.0)),
        (OpClass::ConvBackward, rates(120.0, 3.0, 160.0)),
        (OpClass::MatMulForward, rates(30.0, 12.0, 40.0)),
        (OpClass::MatMulBackward, rates(20.0, 5.0, 80.0)),
        (OpClass::NormForward, rates(20.0, 20.0, 40.0)),
        (OpClass::NormBackward, rates(8.0, 12.0, 80.0)),
        (OpClass::OtherForward, rates(2.0, UNBOUND / G, 5.0)),
        (OpClass::OtherBackward, rates(1.0, 20.0, 10.0)),
    ];

    /// Rates of single ops, fitted with [`Roofline::CPU_DEFAULT_RATES`] (every op with at
    /// least [`MIN_OP_SAMPLES`] samples among their op times).
    pub const CPU_DEFAULT_OP_RATES: &'static [(&'static str, Rates)] = &[
        ("Add:backward", rates(1.0, 40.0, 10.0)),
        ("Add:forward", rates(3.0, 40.0, 5.0)),
        ("Attention.stats:forward", rates(1.0, 5.0, 80.0)),
        ("Attention:backward", rates(12.0, 1.0, 160.0)),
        ("Attention:forward", rates(20.0, 2.0, 80.0)),
        ("BatchNormalization.stats:forward", rates(8.0, 12.0, 40.0)),
        ("BatchNormalization:backward", rates(8.0, UNBOUND / G, 80.0)),
        ("Clip:backward", rates(1.0, 3.0, 80.0)),
        ("Clip:forward", rates(2.0, 20.0, 20.0)),
        ("Concat:backward", rates(2.0, 20.0, 10.0)),
        ("Concat:forward", rates(2.0, 20.0, 10.0)),
        ("Conv.grouped:backward", rates(3.0, 2.0, 160.0)),
        ("Conv.grouped:forward", rates(3.0, 2.0, 160.0)),
        ("Conv:backward", rates(120.0, 3.0, 80.0)),
        ("Conv:forward", rates(200.0, 5.0, 80.0)),
        ("Div:backward", rates(1.0, 40.0, 5.0)),
        ("Div:forward", rates(200.0, UNBOUND / G, 5.0)),
        ("Dropout.mask:forward", rates(1.0, 0.5, 10.0)),
        ("Dropout:backward", rates(1.0, 5.0, 20.0)),
        ("Dropout:forward", rates(2.0, 12.0, 20.0)),
        ("Gather:backward", rates(1.0, 12.0, 10.0)),
        ("Gather:forward", rates(1.0, UNBOUND / G, 5.0)),
        ("Gelu:backward", rates(2.0, 2.0, 160.0)),
        ("Gelu:forward", rates(3.0, 3.0, 40.0)),
        ("Gemm:backward", rates(50.0, 5.0, 40.0)),
        ("Gemm:forward", rates(80.0, 12.0, 40.0)),
        ("GlobalAveragePool:backward", rates(1.0, 5.0, 10.0)),
        ("GlobalAveragePool:forward", rates(8.0, 40.0, 20.0)),
        ("HardSigmoid:backward", rates(1.0, 40.0, 10.0)),
        ("HardSigmoid:forward", rates(1.0, 0.5, 10.0)),
        ("HardSwish:backward", rates(1.0, 3.0, 160.0)),
        ("HardSwish:forward", rates(1.0, 8.0, 20.0)),
        ("Input:forward", rates(1.0, UNBOUND / G, 0.0)),
        ("LayerNormalization.stats:forward", rates(1.0, 1.0, 0.0)),
        ("LayerNormalization:backward", rates(1.0, 1.0, 20.0)),
        ("LayerNormalization:forward", rates(2.0, 3.0, 0.0)),
        ("MatMul.input1_copy:forward", rates(1.0, 8.0, 10.0)),
        ("MatMul:backward", rates(50.0, 0.5, 0.0)),
        ("MatMul:forward", rates(50.0, 1.0, 0.0)),
        ("MaxPool.indices:forward", rates(1.0, 3.0, 80.0)),
        ("MaxPool:backward", rates(3.0, 20.0, 80.0)),
        ("MaxPool:forward", rates(12.0, 20.0, 20.0)),
        ("Mul:backward", rates(3.0, 12.0, 5.0)),
        ("Mul:forward", rates(2.0, 40.0, 5.0)),
        ("Neg:backward", rates(1.0, 8.0, 0.0)),
        ("Neg:forward", rates(1.0, 5.0, 5.0)),
        ("Pad:backward", rates(2.0, 12.0, 10.0)),
        ("Pad:forward", rates(12.0, UNBOUND / G, 5.0)),
        ("Pow:backward", rates(20.0, 20.0, 5.0)),
        ("Pow:forward", rates(1.0, 1.0, 0.0)),
        ("Reciprocal:backward", rates(200.0, UNBOUND / G, 5.0)),
        ("Reciprocal:forward", rates(1.0, 0.3, 0.0)),
        ("ReduceMean:backward", rates(1.0, 2.0, 5.0)),
        ("ReduceMean:forward", rates(200.0, UNBOUND / G, 5.0)),
        ("Relu:backward", rates(2.0, 20.0, 20.0)),
        ("Relu:forward", rates(5.0, 40.0, 10.0)),
        ("Sigmoid:backward", rates(1.0, UNBOUND / G, 20.0)),
        ("Sigmoid:forward", rates(1.0, 0.5, 10.0)),
        ("Softmax:backward", rates(5.0, 12.0, 10.0)),
        ("Softmax:forward", rates(1.0, 2.0, 10.0)),
        ("Sqrt:backward", rates(200.0, UNBOUND / G, 5.0)),
        ("Sqrt:forward", rates(200.0, UNBOUND / G, 5.0)),
        ("SumOfMeans:forward", rates(5.0, 40.0, 10.0)),
        ("Swish:backward", rates(1.0, 3.0, 40.0)),
        ("Swish:forward", rates(2.0, 5.0, 10.0)),
        ("Tanh:backward", rates(5.0, 20.0, 20.0)),
        ("Tanh:forward", rates(1.0, 0.5, 0.0)),
    ];

    /// [`Roofline::CPU_DEFAULT_RATES`] and [`Roofline::CPU_DEFAULT_OP_RATES`] with their
    /// source.
    pub fn cpu_default() -> Roofline {
        Roofline {
            source: "remat's defaults: the CPU executor on a 2-core x86-64 machine \
                     (docs/cost-model.md)"
                .to_string(),
            device: default_device(),
            rates: Self::CPU_DEFAULT_RATES.into_iter().collect(),
            ops: Self::CPU_DEFAULT_OP_RATES
                .iter()
                .map(|&(k, r)| (k.to_string(), r))
                .collect(),
        }
    }

    /// The rates of `class`.
    pub fn rates(&self, class: OpClass) -> Rates {
        self.rates
            .get(&class)
            .copied()
            .unwrap_or(Self::CPU_DEFAULT_RATES[class.index()].1)
    }

    /// The rates of one op in one direction: its own where it has them, else its class's.
    pub fn op_rates(&self, op: &str, kind: NodeKind) -> Rates {
        match self.ops.get(&op_key(op, kind)) {
            Some(r) => *r,
            None => self.rates(OpClass::of(op, kind)),
        }
    }

    /// Seconds for one computation of node `i` of `tg`.
    pub fn node_seconds(&self, tg: &TrainingGraph, i: usize) -> f64 {
        let n = &tg.nodes[i];
        self.op_rates(&tg.rate_ops[i], n.kind)
            .seconds(n.cost, tg.traffic[i] as f64)
    }

    /// Reads rates written as JSON (what `remat calibrate` writes); every class must be there,
    /// with finite positive rates, and each op's key must name a direction.
    pub fn from_json(text: &str) -> Result<Roofline> {
        let r: Roofline = serde_json::from_str(text)
            .map_err(|e| PlannerError::Rates(format!("not a roofline rates file: {e}")))?;
        if let Some(class) = OpClass::ALL.iter().find(|c| !r.rates.contains_key(c)) {
            return Err(PlannerError::Rates(format!(
                "`rates` has no {}",
                serde_json::to_string(class).unwrap_or_default()
            )));
        }
        if let Some((c, _)) = r.rates.iter().find(|(_, x)| !x.valid()) {
            return Err(PlannerError::Rates(format!(
                "the rates of {} must be finite and positive (seconds_per_op may be 0)",
                serde_json::to_string(c).unwrap_or_default()
            )));
        }
        for (key, x) in &r.ops {
            let direction = key.rsplit_once(':').map(|(op, d)| (op.is_empty(), d));
            if !matches!(direction, Some((false, "forward" | "backward"))) {
                return Err(PlannerError::Rates(format!(
                    "`ops` key {key:?} is not OP:forward or OP:backward"
                )));
            }
            if !x.valid() {
                return Err(PlannerError::Rates(format!(
                    "the rates of op {key:?} must be finite and positive (seconds_per_op may be 0)"
                )));
            }
        }
        Ok(r)
    }

    /// Fits the rates to measured times: per class, the grid point of [`FIT_GFLOPS`] ×
    /// [`FIT_GBYTES`] × [`FIT_US`] with the least total absolute error in seconds (so that
    /// the ops that take the time weigh the most, as they do in an overhead); then the same
    /// for every op with at least [`MIN_OP_SAMPLES`] samples, as its own rates. A class
    /// without samples keeps [`Roofline::CPU_DEFAULT_RATES`]' rates; the device is `cpu`
    /// unless the caller says otherwise.
    pub fn fit(samples: &[Sample], source: impl Into<String>) -> Roofline {
        let mut rates = BTreeMap::new();
        for (class, default) in Self::CPU_DEFAULT_RATES {
            let mine: Vec<&Sample> = samples.iter().filter(|s| s.class() == class).collect();
            rates.insert(class, best_on_grid(&mine).unwrap_or(default));
        }
        let mut by_op: BTreeMap<String, Vec<&Sample>> = BTreeMap::new();
        for s in samples {
            by_op.entry(op_key(&s.op, s.kind)).or_default().push(s);
        }
        let ops = by_op
            .into_iter()
            .filter(|(_, v)| v.len() >= MIN_OP_SAMPLES)
            .filter_map(|(k, v)| Some((k, best_on_grid(&v)?, v[0].class())))
            // An op whose best rates are its class's needs no entry.
            .filter(|(_, r, class)| rates.get(class) != Some(r))
            .map(|(k, r, _)| (k, r))
            .collect();
        Roofline {
            source: source.into(),
            device: default_device(),
            rates,
            ops,
        }
    }

    /// `tg`'s problem with each node's cost its roofline seconds; an error where the rates
    /// make a cost that is not a finite number of seconds, or costs too large to add up (a
    /// rate of 1e-300 FLOP/s), naming the node.
    pub fn problem(&self, tg: &TrainingGraph) -> Result<Problem> {
        let p = tg.to_problem();
        let nodes = p
            .nodes
            .iter()
            .enumerate()
            .map(|(i, node)| remat_solver::Node {
                cost: self.node_seconds(tg, i),
                ..node.clone()
            })
            .collect();
        Problem::new(p.name.clone(), nodes, p.fixed_bytes).map_err(|e| {
            PlannerError::Rates(format!(
                "these rates ({}) give a cost remat cannot plan with: {e}",
                self.source
            ))
        })
    }
}

/// The grid point with the least total absolute error in seconds over `samples`.
fn best_on_grid(samples: &[&Sample]) -> Option<Rates> {
    if samples.is_empty() {
        return None;
    }
    let mut best: Option<(f64, Rates)> = None;
    for &gf in &FIT_GFLOPS {
        for &gb in &FIT_GBYTES {
            for &us in &FIT_US {
                let r = rates(gf, gb, us);
                let err: f64 = samples
                    .iter()
                    .map(|s| (r.seconds(s.flops, s.bytes) - s.seconds).abs())
                    .sum();
                if best.is_none_or(|(e, _)| err < e) {
                    best = Some((err, r));
                }
            }
        }
    }
    best.map(|(_, r)| r)
}

/// One measured op time for [`Roofline::fit`].
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// The op the node's rates are looked up by ([`TrainingGraph::rate_ops`]).
    pub op: String,
    pub kind: NodeKind,
    pub flops: f64,
    pub bytes: f64,
    pub seconds: f64,
}

impl Sample {
    /// The samples of `tg` measured at `seconds` per node.
    pub fn of(tg: &TrainingGraph, seconds: &[f64]) -> Vec<Sample> {
        tg.nodes
            .iter()
            .zip(seconds)
            .enumerate()
            .map(|(i, (n, &s))| Sample {
                op: tg.rate_ops[i].clone(),
                kind: n.kind,
                flops: n.cost,
                bytes: tg.traffic[i] as f64,
                seconds: s,
            })
            .collect()
    }

    /// The sample's op class.
    pub fn class(&self) -> OpClass {
        OpClass::of(&self.op, self.kind)
    }
}

/// The grid [`Roofline::fit`] searches: GFLOP/s, GB/s (the last never binds) and µs per op.
pub const FIT_GFLOPS: [f64; 12] = [
    1.0, 2.0, 3.0, 5.0, 8.0, 12.0, 20.0, 30.0, 50.0, 80.0, 120.0, 200.0,
];
pub const FIT_GBYTES: [f64; 11] = [
    0.3,
    0.5,
    1.0,
    2.0,
    3.0,
    5.0,
    8.0,
    12.0,
    20.0,
    40.0,
    UNBOUND / G,
];
pub const FIT_US: [f64; 7] = [0.0, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families_and_directions() {
        assert_eq!(OpClass::of("Conv", NodeKind::Forward), OpClass::ConvForward);
        assert_eq!(
            OpClass::of("ConvTranspose", NodeKind::Backward),
            OpClass::ConvBackward
        );
        assert_eq!(
            OpClass::of("Gemm", NodeKind::Backward),
            OpClass::MatMulBackward
        );
        assert_eq!(
            OpClass::of("LayerNormalization.stats", NodeKind::Forward),
            OpClass::NormForward
        );
        // The copy of an operand a batched product keeps is a copy, not a product.
        assert_eq!(
            OpClass::of("MatMul.input0_copy", NodeKind::Forward),
            OpClass::OtherForward
        );
        assert_eq!(OpClass::of("loss", NodeKind::Loss), OpClass::OtherForward);
    }

    fn samples(op: &str, truth: Rates, n: usize) -> Vec<Sample> {
        (0..n)
            .map(|i| {
                let flops = 1e5 * (1 + i * i) as f64;
                let bytes = 4e4 * (1 + (i * 7) % 13) as f64 * (1 + i) as f64;
                Sample {
                    op: op.to_string(),
                    kind: NodeKind::Forward,
                    flops,
                    bytes,
                    seconds: truth.seconds(flops, bytes),
                }
            })
            .collect()
    }

    #[test]
    fn the_fit_recovers_rates_on_the_grid() {
        let truth = rates(30.0, 5.0, 20.0);
        let fitted = Roofline::fit(&samples("MatMul", truth, 40), "test");
        assert_eq!(fitted.rates(OpClass::MatMulForward), truth);
        // The only op of its class has its class's rates: no entry of its own.
        assert!(fitted.ops.is_empty(), "{:?}", fitted.ops);
        // Classes without samples keep the defaults.
        assert_eq!(
            fitted.rates(OpClass::ConvForward),
            Roofline::CPU_DEFAULT_RATES[0].1
        );
    }

    #[test]
    fn ops_of_one_class_that_run_at_different_rates_get_their_own() {
        let add = rates(3.0, 40.0, 5.0);
        let tanh = rates(1.0, 0.5, 0.0);
        let mut all = samples("Add", add, 40);
        all.extend(samples("Tanh", tanh, 10));
        // Too few to count: its class's rates.
        all.extend(samples("Erf", tanh, MIN_OP_SAMPLES - 1));
        let fitted = Roofline::fit(&all, "test");
        // Both ops' times are predicted exactly (rates that tie on these samples may differ
        // in a term that never binds).
        for s in all.iter().filter(|s| s.op != "Erf") {
            let p = fitted.op_rates(&s.op, s.kind).seconds(s.flops, s.bytes);
            assert!((p - s.seconds).abs() <= 1e-12 * s.seconds, "{s:?}: {p}");
        }
        assert!(fitted.ops.contains_key("Tanh:forward"));
        let class = fitted.rates(OpClass::OtherForward);
        assert_eq!(fitted.op_rates("Erf", NodeKind::Forward), class);
        assert_eq!(
            fitted.op_rates("Tanh", NodeKind::Backward),
            fitted.rates(OpClass::OtherBackward)
        );
        assert!(!fitted.ops.contains_key("Erf:forward"));
        assert_eq!(op_key("Tanh", NodeKind::Loss), "Tanh:forward");
    }

    #[test]
    fn rates_files_round_trip_and_bad_ones_name_what_is_wrong() {
        let r = Roofline::cpu_default();
        let text = serde_json::to_string(&r).unwrap();
        assert_eq!(Roofline::from_json(&text).unwrap(), r);
        let missing = text.replace("\"conv_forward\"", "\"conv_sideways\"");
        let e = Roofline::from_json(&missing).unwrap_err().to_string();
        assert!(e.contains("unknown variant `conv_sideways`"), "{e}");
        let mut partial = r.clone();
        partial.rates.remove(&OpClass::NormBackward);
        let e = Roofline::from_json(&serde_json::to_string(&partial).unwrap())
            .unwrap_err()
            .to_string();
        assert!(e.contains("`rates` has no \"norm_backward\""), "{e}");
        let zero = text.replacen(
            "\"flops_per_second\":120000000000.0",
            "\"flops_per_second\":0.0",
            1,
        );
        let e = Roofline::from_json(&zero).unwrap_err().to_string();
        assert!(e.contains("must be finite and positive"), "{e}");
        // Files from before per-op rates and devices read as CPU class rates.
        let mut v: serde_json::Value = serde_json::from_str(&text).unwrap();
        v.as_object_mut().unwrap().remove("ops");
        v.as_object_mut().unwrap().remove("device");
        let old = Roofline::from_json(&v.to_string()).unwrap();
        assert!(old.ops.is_empty() && old.device == "cpu");
        let mut bad = r.clone();
        bad.ops.insert("Tanh".to_string(), rates(1.0, 1.0, 0.0));
        let e = Roofline::from_json(&serde_json::to_string(&bad).unwrap())
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("\"Tanh\" is not OP:forward or OP:backward"),
            "{e}"
        );
        let mut bad = r.clone();
        bad.ops
            .insert("Tanh:forward".to_string(), rates(-1.0, 1.0, 0.0));
        let e = Roofline::from_json(&serde_json::to_string(&bad).unwrap())
            .unwrap_err()
            .to_string();
        assert!(e.contains("op \"Tanh:forward\" must be finite"), "{e}");
        assert!(Roofline::from_json("[]")
            .unwrap_err()
            .to_string()
            .contains("not a roofline rates file"));
    }
}
