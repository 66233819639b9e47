//! Random draws: RandomNormal(Like), RandomUniform(Like), Bernoulli (from `Rng::new(cx.seed)`,
//! so that a recomputation replays them).

use super::common::{host_f64, out_dtype};
use crate::kernel::kbail;
use crate::kernel::{Extras, Inputs, KResult, Kernel, KernelCtx, KernelRegistry, Outs, Rng};
use candle_core::Tensor;

/// A standard normal draw (Box-Muller).
fn normal(rng: &mut Rng) -> f64 {
    let u1 = rng.uniform(f64::MIN_POSITIVE, 1.0);
    let u2 = rng.uniform(0.0, 1.0);
    (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
}

fn random_fwd(cx: &KernelCtx, xs: &[Option<Tensor>], _: &Extras) -> Outs {
    let shape = cx.out_shape(0)?;
    let dt = out_dtype(cx, 0)?;
    let n: usize = shape.iter().product();
    let mut rng = Rng::new(cx.seed);
    let f = |name: &str, d: f32| -> KResult<f64> { Ok(f64::from(cx.attrs.float_or(name, d)?)) };
    let v: Vec<f64> = match cx.op {
        "RandomNormal" | "RandomNormalLike" => {
            let (mean, scale) = (f("mean", 0.0)?, f("scale", 1.0)?);
            (0..n).map(|_| mean + scale * normal(&mut rng)).collect()
        }
        "RandomUniform" | "RandomUniformLike" => {
            let (lo, hi) = (f("low", 0.0)?, f("high", 1.0)?);
            (0..n).map(|_| rng.uniform(lo, hi)).collect()
        }
        "Bernoulli" => {
            let p = host_f64(xs.req(0)?)?;
            if p.len() != n {
                kbail!(
                    "probabilities hold {} elements for an output of {n}",
                    p.len()
                );
            }
            p.iter()
                .map(|&q| if rng.uniform(0.0, 1.0) < q { 1.0 } else { 0.0 })
                .collect()
        }
        op => kbail!("{op} is not a random op"),
    };
    Ok(vec![Some(
        Tensor::from_vec(v, shape, cx.device)?.to_dtype(dt)?,
    )])
}

pub fn register(r: &mut KernelRegistry) {
    for op in [
        "RandomNormal",
        "RandomUniform",
        "RandomNormalLike",
        "RandomUniformLike",
        "Bernoulli",
    ] {
        r.insert(op, Kernel::new(random_fwd, None));
    }
}

#[cfg(test)]
mod tests {
    use crate::testing::fixed::{close, fl, run, run_with};
    use crate::testing::{check, float, int, ints, Case, In};

    #[test]
    fn random() {
        for op in ["RandomNormal", "RandomUniform"] {
            check(
                &Case::new(op, 1, vec![])
                    .attr(ints("shape", &[2, 3]))
                    .attr(int("dtype", 11)),
            );
        }
        for op in ["RandomNormalLike", "RandomUniformLike"] {
            check(&Case::new(op, 1, vec![In::Rand(vec![4])]).attr(float("high", 3.0)));
        }
        check(&Case::new(
            "Bernoulli",
            15,
            vec![In::RandIn(vec![3, 3], 0.0, 1.0)],
        ));
        check(
            &Case::new("Bernoulli", 15, vec![In::RandIn(vec![3], 0.0, 1.0)]).attr(int("dtype", 9)),
        );
    }
    #[test]
    fn values_random() {
        let draw = |seed| {
            run_with(
                "RandomNormal",
                1,
                vec![
                    ints("shape", &[4000]),
                    float("mean", 2.0),
                    float("scale", 3.0),
                ],
                vec![],
                1,
                seed,
            )
            .remove(0)
        };
        let (a, b, c) = (draw(5), draw(5), draw(6));
        assert_eq!(a, b, "the same seed replays the same draws");
        assert_ne!(a, c);
        let mean = a.iter().sum::<f64>() / a.len() as f64;
        let sd = (a.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / a.len() as f64).sqrt();
        assert!(
            (mean - 2.0).abs() < 0.2 && (sd - 3.0).abs() < 0.2,
            "{mean} {sd}"
        );
        let u = run_with(
            "RandomUniform",
            1,
            vec![
                ints("shape", &[1000]),
                float("low", -1.0),
                float("high", 1.0),
            ],
            vec![],
            1,
            1,
        )
        .remove(0);
        assert!(u.iter().all(|v| (-1.0..1.0).contains(v)));
        let p = fl(&[4], &[0.0, 1.0, 0.0, 1.0]);
        close(
            &run("Bernoulli", 15, vec![], vec![p]),
            &[0.0, 1.0, 0.0, 1.0],
        );
    }
}
