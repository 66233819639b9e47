//! `remat calibrate`: the roofline's rates fitted to op times measured on this machine.

use super::common::{DeviceArg, Failure, ModelArgs};
use clap::Args;
use remat_exec::{measured_costs, ExecDevice};
use remat_planner::{OpClass, Roofline, Sample};
use remat_server::engine::ModelFormat;
use remat_server::pipeline::{exec_error, import_options, not_runnable, planner_error};
use std::path::PathBuf;

/// Fit the roofline's rates to op times measured on this machine's executor, for `--rates`
/// (docs/cost-model.md)
#[derive(Args)]
pub struct CalibrateArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// The executor's device
    #[arg(long, value_enum, default_value_t = DeviceArg::Cpu)]
    device: DeviceArg,
    /// Store-all steps timed (each op's time is its fastest), after one that warms up (1 to 1000)
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u16).range(1..=1000))]
    runs: u16,
    /// Where to write the rates [default: $HOME/.cache/remat/rates-DEVICE.json]
    #[arg(long, value_name = "FILE")]
    out: Option<PathBuf>,
}

pub fn exec(args: CalibrateArgs) -> Result<(), Failure> {
    let bytes = args.model.read()?;
    if ModelFormat::detect(&bytes) != ModelFormat::Onnx {
        return Err(not_runnable().into());
    }
    remat_server::pipeline::not_json(&bytes)?;
    let req = args.model.request();
    let model = remat_planner::load(&bytes, &import_options(&req)).map_err(planner_error)?;
    let tg = model.training_graph().map_err(planner_error)?;
    let device: ExecDevice = args.device.into();
    measured_costs(&model, &tg, &bytes, device, 0, 1).map_err(exec_error)?;
    let seconds = measured_costs(&model, &tg, &bytes, device, 0, usize::from(args.runs))
        .map_err(exec_error)?;
    let samples = Sample::of(&tg, &seconds);
    let name = args
        .model
        .model
        .file_name()
        .map_or_else(|| "the model".into(), |n| n.to_string_lossy().into_owned());
    let mut fitted = Roofline::fit(
        &samples,
        format!(
            "remat calibrate: {} op times of {name} on the {} executor (fastest of {} store-all steps)",
            samples.len(),
            device.name(),
            args.runs
        ),
    );
    fitted.device = device.name().to_string();
    println!("{}", summary(&fitted, &samples));
    let out = match args.out {
        Some(p) => p,
        None => {
            let home = std::env::var_os("HOME")
                .ok_or_else(|| Failure::new(2, "HOME is not set: give --out FILE"))?;
            PathBuf::from(home)
                .join(".cache/remat")
                .join(format!("rates-{}.json", device.name()))
        }
    };
    if let Some(dir) = out.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)
            .map_err(|e| Failure::new(2, format!("{}: {e}", dir.display())))?;
    }
    let json = serde_json::to_string_pretty(&fitted)
        .map_err(|e| Failure::new(1, format!("cannot write the rates: {e}")))?;
    std::fs::write(&out, json + "\n")
        .map_err(|e| Failure::new(2, format!("{}: {e}", out.display())))?;
    println!(
        "wrote {}: plan with it by --rates {0} or REMAT_RATES={0}",
        out.display()
    );
    Ok(())
}

/// The roofline's seconds for one sample: its op's own rates, or its class's.
fn seconds(r: &Roofline, x: &Sample) -> f64 {
    r.op_rates(&x.op, x.kind).seconds(x.flops, x.bytes)
}

/// The fitted rates per class, with how well they and FLOPs account for where the time went.
fn summary(r: &Roofline, samples: &[Sample]) -> String {
    let mut s = format!(
        "{:<16} {:>5} {:>10} {:>9} {:>8} {:>11} {:>11}\n",
        "class", "ops", "GFLOP/s", "GB/s", "µs/op", "measured s", "roofline s"
    );
    for class in OpClass::ALL {
        let mine: Vec<&Sample> = samples.iter().filter(|x| x.class() == class).collect();
        let rates = r.rates(class);
        let measured: f64 = mine.iter().map(|x| x.seconds).sum();
        let predicted: f64 = mine.iter().map(|x| seconds(r, x)).sum();
        let gb = rates.bytes_per_second / 1e9;
        s += &format!(
            "{:<16} {:>5} {:>10.1} {:>9} {:>8.0} {:>11.4} {:>11.4}\n",
            serde_json::to_value(class)
                .ok()
                .and_then(|v| v.as_str().map(str::to_string))
                .unwrap_or_default(),
            mine.len(),
            rates.flops_per_second / 1e9,
            if gb >= 1e5 {
                "unbound".to_string()
            } else {
                format!("{gb:.1}")
            },
            rates.seconds_per_op * 1e6,
            measured,
            predicted
        );
    }
    let shares = |cost: &dyn Fn(&Sample) -> f64| {
        let total: f64 = samples.iter().map(cost).sum();
        let measured: f64 = samples.iter().map(|x| x.seconds).sum();
        if total <= 0.0 || measured <= 0.0 {
            return f64::NAN;
        }
        samples
            .iter()
            .map(|x| (cost(x) / total - x.seconds / measured).abs())
            .sum::<f64>()
            / 2.0
    };
    let roof = shares(&|x| seconds(r, x));
    let flops = shares(&|x| x.flops);
    s += &format!(
        "{} ops have rates of their own (the GFLOP/s, GB/s and µs/op above are the classes'; \
         \"roofline s\" counts each op at its own rates)\n",
        r.ops.len()
    );
    s += &format!(
        "share of the step's time put on the wrong ops: {:.1}% by the roofline, {:.1}% by FLOPs",
        roof * 100.0,
        flops * 100.0
    );
    s
}
