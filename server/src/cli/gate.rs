//! `remat gate`: fail CI when training memory regresses against a baseline.

use super::common::{print_json, Failure};
use clap::{Args, ValueEnum};
use remat_server::gate;
use std::path::{Path, PathBuf};

/// Fail CI when training memory regresses against a baseline (exit 1), 2 on bad input
#[derive(Args)]
pub struct GateArgs {
    /// The gate's config: [[model]] tables with name, path, budget, dims, max_overhead, tolerance
    #[arg(long, default_value = "remat.toml")]
    config: PathBuf,
    /// The baseline figures to compare with
    #[arg(long, default_value = "remat-baseline.json")]
    baseline: PathBuf,
    /// Write the new figures as the baseline instead of comparing
    #[arg(long)]
    update: bool,
    #[arg(long, value_enum, default_value_t = GateFormat::Text)]
    format: GateFormat,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum GateFormat {
    Text,
    Markdown,
    Json,
    Github,
}

fn gate_error(e: gate::GateError) -> Failure {
    Failure {
        code: 2,
        error: anyhow::Error::new(e),
    }
}

/// Measures the config's models, then writes them as the baseline (`--update`) or compares
/// them with it (exit 1 on a regression).
pub fn exec(args: GateArgs) -> Result<(), Failure> {
    let config = gate::read_config(&args.config).map_err(gate_error)?;
    let baseline = gate::read_baseline(&args.baseline).map_err(gate_error)?;
    let figures = gate::measure_all(&config, &args.config).map_err(gate_error)?;
    if args.update {
        gate::write_baseline(&args.baseline, &figures).map_err(gate_error)?;
        print!("{}", gate::render_figures(&figures));
        if baseline.is_some() {
            let outcome = gate::compare(&config, &figures, baseline.as_ref());
            println!("\nagainst the previous baseline:");
            print!("{}", gate::render_text(&outcome));
        }
        eprintln!(
            "wrote {} model(s) to {}",
            figures.len(),
            args.baseline.display()
        );
        return Ok(());
    }
    let Some(baseline) = baseline else {
        return Err(Failure::new(
            2,
            format!(
                "{}: no baseline file; run `remat gate --update` to create it",
                args.baseline.display()
            ),
        ));
    };
    let outcome = gate::compare(&config, &figures, Some(&baseline));
    match args.format {
        GateFormat::Text => print!("{}", gate::render_text(&outcome)),
        GateFormat::Markdown => print!("{}", gate::render_markdown(&outcome)),
        GateFormat::Json => print_json(&outcome)?,
        GateFormat::Github => {
            print!("{}", gate::render_github(&outcome, &args.config));
            // Set but empty is unset, as GitHub's toolkit reads it.
            if let Some(path) =
                std::env::var_os("GITHUB_STEP_SUMMARY").filter(|path| !path.is_empty())
            {
                use std::io::Write;
                // A summary file that cannot be written is the environment's fault (exit 2),
                // not a regression (exit 1, which the regressions keep below).
                let written = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(&path)
                    .and_then(|mut f| f.write_all(gate::render_markdown(&outcome).as_bytes()));
                if let Err(e) = written {
                    let n = outcome.regressions().count();
                    return Err(Failure::new(
                        2,
                        format!(
                            "cannot write GITHUB_STEP_SUMMARY {}: {e}{}",
                            Path::new(&path).display(),
                            if n > 0 {
                                format!(
                                    " ({n} memory regression(s) against {})",
                                    args.baseline.display()
                                )
                            } else {
                                String::new()
                            }
                        ),
                    ));
                }
            }
        }
    }
    // A gate that compared nothing would pass whatever it measured: a usage error (exit 2).
    if outcome.compared_nothing() {
        return Err(Failure::new(
            2,
            format!(
                "nothing compared: {} has none of the {} model(s) of {} ({}); run `remat gate --update` to record them",
                args.baseline.display(),
                config.models.len(),
                args.config.display(),
                outcome.new_models.join(", ")
            ),
        ));
    }
    let n = outcome.regressions().count();
    if n > 0 {
        return Err(Failure::new(
            1,
            format!(
                "{n} memory regression(s) against {}",
                args.baseline.display()
            ),
        ));
    }
    Ok(())
}
