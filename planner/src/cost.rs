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
//! their backward differently again ([`OpClass`]). [`Roofline::cpu_default`] holds rates fitted
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

/// Rates per [`OpClass`], and where they come from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Roofline {
    /// What the rates were measured on (a machine, a device, the models).
    pub source: String,
    /// Every class's rates.
    pub rates: BTreeMap<OpClass, Rates>,
}

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
    /// development machine: the fastest of three store-all steps of twelve fixture models at
    /// batch 1 (3,130 op times; docs/cost-model.md says which and how well they predict).
    pub const CPU_DEFAULT_RATES: [(OpClass, Rates); 8] = [
        (OpClass::ConvForward, rates(120.0, 3.0, 80.0)),
        (OpClass::ConvBackward, rates(120.0, 2.0, 160.0)),
        (OpClass::MatMulForward, rates(30.0, 8.0, 40.0)),
        (OpClass::MatMulBackward, rates(20.0, 3.0, 80.0)),
        (OpClass::NormForward, rates(8.0, 12.0, 40.0)),
        (OpClass::NormBackward, rates(5.0, 8.0, 80.0)),
        (OpClass::OtherForward, rates(2.0, UNBOUND / G, 10.0)),
        (OpClass::OtherBackward, rates(1.0, 12.0, 10.0)),
    ];

    /// [`Roofline::CPU_DEFAULT_RATES`] with their source.
    pub fn cpu_default() -> Roofline {
        Roofline {
            source: "remat's defaults: the CPU executor on a 2-core x86-64 machine \
                     (docs/cost-model.md)"
                .to_string(),
            rates: Self::CPU_DEFAULT_RATES.into_iter().collect(),
        }
    }

    /// The rates of `class`.
    pub fn rates(&self, class: OpClass) -> Rates {
        self.rates
            .get(&class)
            .copied()
            .unwrap_or(Self::CPU_DEFAULT_RATES[class.index()].1)
    }

    /// Seconds for one computation of node `i` of `tg`.
    pub fn node_seconds(&self, tg: &TrainingGraph, i: usize) -> f64 {
        let n = &tg.nodes[i];
        self.rates(OpClass::of(&n.op, n.kind))
            .seconds(n.cost, tg.traffic[i] as f64)
    }

    /// Reads rates written as JSON (what `remat calibrate` writes); every class must be there,
    /// with finite positive rates.
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
        Ok(r)
    }

    /// Fits the rates of every class to measured times: per class, the grid point of
    /// [`FIT_GFLOPS`] × [`FIT_GBYTES`] × [`FIT_US`] with the least total absolute error in
    /// seconds (so that the ops that take the time weigh the most, as they do in an
    /// overhead). A class without samples keeps [`Roofline::CPU_DEFAULT_RATES`]' rates.
    pub fn fit(samples: &[Sample], source: impl Into<String>) -> Roofline {
        let mut out = BTreeMap::new();
        for (class, default) in Self::CPU_DEFAULT_RATES {
            let mine: Vec<&Sample> = samples.iter().filter(|s| s.class == class).collect();
            if mine.is_empty() {
                out.insert(class, default);
                continue;
            }
            let mut best: Option<(f64, Rates)> = None;
            for &gf in &FIT_GFLOPS {
                for &gb in &FIT_GBYTES {
                    for &us in &FIT_US {
                        let r = rates(gf, gb, us);
                        let err: f64 = mine
                            .iter()
                            .map(|s| (r.seconds(s.flops, s.bytes) - s.seconds).abs())
                            .sum();
                        if best.is_none_or(|(e, _)| err < e) {
                            best = Some((err, r));
                        }
                    }
                }
            }
            out.insert(class, best.map_or(default, |(_, r)| r));
        }
        Roofline {
            source: source.into(),
            rates: out,
        }
    }

    /// `tg`'s problem with each node's cost its roofline seconds.
    pub fn problem(&self, tg: &TrainingGraph) -> Problem {
        let mut p = tg.to_problem();
        for (i, node) in p.nodes.iter_mut().enumerate() {
            node.cost = self.node_seconds(tg, i);
        }
        p
    }
}

/// One measured op time for [`Roofline::fit`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sample {
    pub class: OpClass,
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
                class: OpClass::of(&n.op, n.kind),
                flops: n.cost,
                bytes: tg.traffic[i] as f64,
                seconds: s,
            })
            .collect()
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

    #[test]
    fn the_fit_recovers_rates_on_the_grid() {
        let truth = rates(30.0, 5.0, 20.0);
        let samples: Vec<Sample> = (0..40)
            .map(|i| {
                let flops = 1e5 * (1 + i * i) as f64;
                let bytes = 4e4 * (1 + (i * 7) % 13) as f64 * (1 + i) as f64;
                Sample {
                    class: OpClass::MatMulForward,
                    flops,
                    bytes,
                    seconds: truth.seconds(flops, bytes),
                }
            })
            .collect();
        let fitted = Roofline::fit(&samples, "test");
        assert_eq!(fitted.rates(OpClass::MatMulForward), truth);
        // Classes without samples keep the defaults.
        assert_eq!(
            fitted.rates(OpClass::ConvForward),
            Roofline::CPU_DEFAULT_RATES[0].1
        );
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
        assert!(Roofline::from_json("[]")
            .unwrap_err()
            .to_string()
            .contains("not a roofline rates file"));
    }
}
