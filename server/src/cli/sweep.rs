//! `remat sweep`: the plan's overhead across budgets, with the baselines.

use super::common::{print_document, Failure, ModelArgs};
use clap::Args;
use remat_server::engine::{ModelFormat, PlanRequest};
use remat_server::pipeline::{default_threads, load, sweep_document, torch};
use remat_server::text::sweep_summary;

/// The Pareto frontier: overhead at a range of budgets, with the baselines (a captured PyTorch
/// graph: its torch-sac plans, with PyTorch's step and full checkpointing)
#[derive(Args)]
pub struct SweepArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Budget fractions of the store-all peak, comma separated (the API's default too)
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "1.0,0.9,0.8,0.7,0.6,0.5,0.4,0.3,0.2"
    )]
    fractions: Vec<f64>,
    /// auto, ilp, dp, segment-dp, chen-sqrt, chen-greedy, every-k, revolve, store-all
    #[arg(long, default_value = "auto")]
    solver: String,
    /// Seconds each budget's plan may take, its lower bound included (as `remat plan
    /// --time-limit`)
    #[arg(long, default_value_t = 10.0)]
    time_limit: f64,
    /// Print the whole sweep document as JSON (default: a table, a row per budget)
    #[arg(long)]
    json: bool,
}

impl SweepArgs {
    /// The request these arguments make.
    fn request(&self) -> PlanRequest {
        PlanRequest {
            solver: Some(self.solver.clone()),
            time_limit: Some(self.time_limit),
            fractions: self.fractions.clone(),
            ..self.model.request()
        }
    }
}

/// Prints the frontier (`--json`: the whole sweep document).
pub fn exec(args: SweepArgs) -> Result<(), Failure> {
    let bytes = args.model.read()?;
    let req = args.request();
    let format = ModelFormat::detect(&bytes);
    let doc = if format == ModelFormat::TorchGraph {
        torch::sweep(&bytes, &req, &Default::default())?
    } else {
        sweep_document(
            &load(&bytes, format, &req)?,
            &req,
            default_threads(),
            &Default::default(),
        )?
    };
    if args.json {
        print_document(&doc)
    } else {
        print!("{}", sweep_summary(&doc));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::SweepArgs;
    use clap::{Args, Command, FromArgMatches};

    /// The CLI's default fractions are the service's (`DEFAULT_FRACTIONS`): the CLI swept
    /// 1.0…0.3 while `POST /v1/sweeps` swept 1.0…0.2.
    #[test]
    fn the_default_fractions_are_the_services() {
        let matches = SweepArgs::augment_args(Command::new("sweep"))
            .try_get_matches_from(["sweep", "model.onnx"])
            .unwrap();
        let args = SweepArgs::from_arg_matches(&matches).unwrap();
        assert_eq!(args.fractions, remat_solver::plan::DEFAULT_FRACTIONS);
    }
}
