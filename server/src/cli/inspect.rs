//! `remat inspect`: what the importer sees in an ONNX model.

use super::common::{print_json, Failure, ModelArgs};
use clap::Args;
use remat_server::engine::ModelFormat;
use remat_server::pipeline::{import_options, planner_error};

/// Import an ONNX model and summarize its training graph
#[derive(Args)]
pub struct InspectArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Print JSON instead of the summary
    #[arg(long)]
    json: bool,
}

/// Prints the inspect report; exit 2 when a node's op is unsupported.
pub fn exec(args: InspectArgs) -> Result<(), Failure> {
    let bytes = args.model.read()?;
    if ModelFormat::detect(&bytes) != ModelFormat::Onnx {
        return Err(Failure::new(
            2,
            format!(
                "{}: inspect reads ONNX models; this is a JSON graph, whose nodes and sizes are in the file (remat plan reads it)",
                args.model.model.display()
            ),
        ));
    }
    remat_server::pipeline::not_json(&bytes)?;
    let req = args.model.request();
    let report = remat_planner::inspect(&bytes, &import_options(&req)).map_err(planner_error)?;
    if args.json {
        print_json(&report)?;
    } else {
        println!("{report}");
    }
    if report.unsupported.is_empty() {
        Ok(())
    } else {
        Err(Failure::new(
            2,
            format!(
                "{} node(s) use unsupported ops (listed above)",
                report.unsupported.len()
            ),
        ))
    }
}
