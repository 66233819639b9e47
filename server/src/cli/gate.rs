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
    /// Write the new figures as the baseline instead of comparing (it replaces a baseline it
    /// cannot parse, with a warning)
    #[arg(long)]
    update: bool,
    /// The report's form; with --update, the figures written and their comparison with the
    /// baseline they replace
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

/// Appends `markdown` to `$GITHUB_STEP_SUMMARY` when it is set and not empty (as GitHub's
/// toolkit reads it): the error names the file.
fn append_step_summary(markdown: &str) -> Result<(), String> {
    let Some(path) = std::env::var_os("GITHUB_STEP_SUMMARY").filter(|path| !path.is_empty()) else {
        return Ok(());
    };
    use std::io::Write;
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .and_then(|mut f| f.write_all(markdown.as_bytes()))
        .map_err(|e| {
            format!(
                "cannot write GITHUB_STEP_SUMMARY {}: {e}",
                Path::new(&path).display()
            )
        })
}

/// Whether `file` is empty or begins (past white space) with `{`, as a baseline, a truncated one
/// included, does: what `--update` may replace when it cannot parse it.
fn looks_like_json(file: &Path) -> bool {
    let Ok(bytes) = std::fs::read(file) else {
        return false;
    };
    matches!(
        bytes.iter().find(|b| !b.is_ascii_whitespace()),
        None | Some(b'{')
    )
}

/// Measures the config's models, then writes them as the baseline (`--update`) or compares
/// them with it (exit 1 on a regression).
pub fn exec(args: GateArgs) -> Result<(), Failure> {
    let config = gate::read_config(&args.config).map_err(gate_error)?;
    let baseline = match gate::read_baseline(&args.baseline) {
        // The documented way to rewrite a baseline works on one that cannot be parsed; one that
        // cannot be read (not a regular file, too large) is still refused, and so is a file
        // that is no JSON at all (a mistyped --baseline naming the config or a model).
        Err(gate::GateError::CorruptBaseline { file, message })
            if args.update && looks_like_json(&file) =>
        {
            eprintln!(
                "warning: {}: cannot be parsed ({message}); --update replaces it",
                file.display()
            );
            None
        }
        read => read.map_err(gate_error)?,
    };
    let figures = gate::measure_all(&config, &args.config).map_err(gate_error)?;
    if args.update {
        return update(&args, &config, &figures, baseline.as_ref());
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
            // A summary file that cannot be written is the environment's fault (exit 2), not a
            // regression (exit 1, which the regressions keep below).
            if let Err(e) = append_step_summary(&gate::render_markdown(&outcome)) {
                let n = outcome.regressions().count();
                return Err(Failure::new(
                    2,
                    format!(
                        "{e}{}",
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

/// `--update`: writes the figures as the baseline, then reports them (and their comparison with
/// the baseline they replace) in the asked format: JSON for a parser, Markdown for a summary;
/// `github` prints the text and appends the Markdown to `$GITHUB_STEP_SUMMARY`.
fn update(
    args: &GateArgs,
    config: &gate::GateConfig,
    figures: &std::collections::BTreeMap<String, gate::Figures>,
    baseline: Option<&gate::BaselineFile>,
) -> Result<(), Failure> {
    gate::write_baseline(&args.baseline, figures).map_err(gate_error)?;
    let previous = baseline.map(|b| gate::compare(config, figures, Some(b)));
    let markdown = || gate::render_update_markdown(figures, &args.baseline, previous.as_ref());
    match args.format {
        GateFormat::Text | GateFormat::Github => {
            print!("{}", gate::render_figures(figures));
            if let Some(outcome) = &previous {
                println!("\nagainst the previous baseline:");
                print!("{}", gate::render_text(outcome));
            }
        }
        GateFormat::Markdown => print!("{}", markdown()),
        GateFormat::Json => print_json(&gate::UpdateReport {
            written: &args.baseline,
            figures,
            previous: previous.as_ref(),
        })?,
    }
    if args.format == GateFormat::Github {
        append_step_summary(&markdown())
            .map_err(|e| Failure::new(2, format!("{e} (the baseline was written)")))?;
    }
    eprintln!(
        "wrote {} model(s) to {}",
        figures.len(),
        args.baseline.display()
    );
    Ok(())
}
