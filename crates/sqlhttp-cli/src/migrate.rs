//! `sqlhttp migrate`: `add` a numbered migration file, `run` the pending ones, `info` on where
//! each stands, `revert` the latest, over the SDK's `Migrator` and a directory of
//! `NNNN_name.sql` files (`./migrations` unless `--source` says otherwise).
//!
//! Knows the files' names and what each action prints; the rules (one atomic batch per
//! migration, under its key) are the SDK's.

use std::fs;
use std::io::{self, Write as _};
use std::path::{Path, PathBuf};

use anyhow::Context as _;
use sqlhttp::Client;
use sqlhttp::migrate::{MigrateError, MigrationStatus, Migrator};

use crate::args::MigrateAction;
use crate::exit::UsageError;
use crate::output;

/// Runs `action` over the migrations of `source`, with history table `table`.
pub(crate) async fn run(
    client: &Client,
    source: &Path,
    table: &str,
    action: MigrateAction,
) -> anyhow::Result<()> {
    if let MigrateAction::Add { name, reversible } = action {
        return add(source, &name, reversible);
    }
    let (allow_out_of_order, ignore_missing) = match action {
        MigrateAction::Run {
            allow_out_of_order,
            ignore_missing,
        } => (allow_out_of_order, ignore_missing),
        _ => (false, false),
    };
    let migrator = load(source)?
        .table(table)
        .allow_out_of_order(allow_out_of_order)
        .ignore_missing(ignore_missing);
    let mut stdout = io::stdout().lock();
    match action {
        MigrateAction::Add { .. } => unreachable!("handled above"),
        MigrateAction::Run { .. } => {
            let report = migrator.run(client).await.map_err(failed)?;
            for applied in &report.applied {
                if applied.by_another_run {
                    writeln!(
                        stdout,
                        "{:04}_{}: applied by another run",
                        applied.version, applied.name
                    )?;
                } else {
                    writeln!(
                        stdout,
                        "applied {:04}_{} ({})",
                        applied.version,
                        applied.name,
                        output::format_elapsed(applied.elapsed)
                    )?;
                }
            }
            let at = version_text(report.version);
            if report.applied.is_empty() {
                writeln!(stdout, "nothing to apply: {at}")?;
            } else {
                writeln!(stdout, "{at}")?;
            }
        }
        MigrateAction::Info => {
            let lines = migrator.info(client).await.map_err(failed)?;
            if lines.is_empty() {
                writeln!(stdout, "no migrations in {}", source.display())?;
                return Ok(());
            }
            writeln!(
                stdout,
                "{:<8} {:<28} {:<8} {:<30} checksum",
                "version", "name", "status", "applied at"
            )?;
            for line in lines {
                let (status, note) = match &line.status {
                    MigrationStatus::Applied => ("applied", String::new()),
                    MigrationStatus::Pending => ("pending", String::new()),
                    MigrationStatus::Changed { applied } => (
                        "CHANGED",
                        format!(
                            "  (the file changed since it was applied as {})",
                            short(applied)
                        ),
                    ),
                    MigrationStatus::Missing => {
                        ("NO FILE", "  (applied, but no file has it)".to_owned())
                    }
                    _ => ("unknown", String::new()),
                };
                writeln!(
                    stdout,
                    "{:<8} {:<28} {:<8} {:<30} {}{note}",
                    format!("{:04}", line.version),
                    line.name,
                    status,
                    line.applied_at.as_deref().unwrap_or("-"),
                    short(&line.checksum)
                )?;
            }
        }
        MigrateAction::Revert => match migrator.revert(client).await.map_err(failed)? {
            None => writeln!(stdout, "nothing to revert: no migration is applied")?,
            Some(reverted) => {
                let by = if reverted.by_another_run {
                    " (by another run)"
                } else {
                    ""
                };
                writeln!(
                    stdout,
                    "reverted {:04}_{}{by}",
                    reverted.version, reverted.name
                )?;
            }
        },
    }
    Ok(())
}

/// A migrator's failure as the CLI reports it: a file or setting that cannot be used is a
/// usage error (exit 2), like the rest of the CLI's bad input; the rest keep their causes (a
/// server's answer, a connection) for the exit code.
fn failed(error: MigrateError) -> anyhow::Error {
    match error {
        MigrateError::Source { .. } | MigrateError::Config(_) => {
            UsageError(error.to_string()).into()
        }
        other => other.into(),
    }
}

fn version_text(version: Option<u64>) -> String {
    match version {
        Some(version) => format!("at version {version}"),
        None => "no migration applied".to_owned(),
    }
}

fn short(checksum: &str) -> &str {
    checksum.get(..16).unwrap_or(checksum)
}

/// The migrations of `source`; a directory that is missing or has a bad file is a usage error.
fn load(source: &Path) -> anyhow::Result<Migrator> {
    if !source.is_dir() {
        return Err(UsageError(format!(
            "no migrations directory {}: create one with `sqlhttp migrate add NAME`, or name it \
             with --source DIR",
            source.display()
        ))
        .into());
    }
    Migrator::from_dir(source).map_err(failed)
}

/// Creates the next migration file in `source` (and its down file when `reversible`).
fn add(source: &Path, name: &str, reversible: bool) -> anyhow::Result<()> {
    let name = file_name_part(name)?;
    fs::create_dir_all(source)
        .with_context(|| format!("cannot create the directory {}", source.display()))?;
    let next = Migrator::from_dir(source)
        .map_err(|error| UsageError(error.to_string()))?
        .migrations()
        .last()
        .map_or(1, |last| last.version() + 1);
    let up = source.join(format!("{next:04}_{name}.sql"));
    create(
        &up,
        &format!(
            "-- Migration {next}: {name}.\n\
             -- Statements end with `;`. The file is applied as one transaction, together with\n\
             -- its record in the history table: all of it, or nothing.\n"
        ),
    )?;
    let mut created = vec![up];
    if reversible {
        let down = source.join(format!("{next:04}_{name}.down.sql"));
        create(
            &down,
            &format!(
                "-- Reverts migration {next}: {name} (`sqlhttp migrate revert`), as one \
                 transaction.\n"
            ),
        )?;
        created.push(down);
    }
    for path in created {
        println!("created {}", path.display());
    }
    Ok(())
}

/// Writes a new file; an existing one is never overwritten.
fn create(path: &PathBuf, text: &str) -> anyhow::Result<()> {
    let mut file = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
        .with_context(|| format!("cannot create {}", path.display()))?;
    file.write_all(text.as_bytes())
        .with_context(|| format!("cannot write {}", path.display()))
}

/// A migration's name as its file has it: lowercase letters (any script), digits and `_`.
fn file_name_part(name: &str) -> anyhow::Result<String> {
    let mut out = String::new();
    for c in name.trim().chars() {
        if c.is_alphanumeric() {
            out.extend(c.to_lowercase());
        } else if !out.ends_with('_') && !out.is_empty() {
            out.push('_');
        }
    }
    let out = out.trim_end_matches('_').to_owned();
    if out.is_empty() {
        return Err(UsageError(format!(
            "`{name}` cannot name a migration: give it letters or digits (`add_isbn`)"
        ))
        .into());
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_become_file_names() {
        assert_eq!(
            file_name_part("Add ISBN column").unwrap(),
            "add_isbn_column"
        );
        assert_eq!(file_name_part("  books--v2 ").unwrap(), "books_v2");
        assert_eq!(file_name_part("Ünïcode name").unwrap(), "ünïcode_name");
        assert!(file_name_part("--").is_err());
    }
}
