//! `sqlhttp import`: rows of a CSV (with a header) or NDJSON file, each field converted to its
//! column's declared type, inserted in chunks through the SDK's typed bulk insert, exactly once.
//!
//! Every chunk carries a caller-held idempotency key derived from the table, the file's contents
//! and the chunk's position, and writes are retried: a chunk whose answer was lost is replayed by
//! the server, not applied twice, and an interrupted import run again skips what it already wrote.
//! Knows the input formats and the type conversions; output goes through `progress`.

use std::fs::File;
use std::io::{self, BufRead, BufReader, Read};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use anyhow::{Context as _, anyhow, bail};
use serde_json::{Map, Number, Value};
use sha2::{Digest, Sha256};
use sqlhttp::Client;

use crate::args::ImportFormat;
use crate::csv_input::{CsvRecords, Field};
use crate::progress::Progress;

/// What an import did.
#[derive(Debug)]
pub(crate) struct Imported {
    /// Rows the chunks hold, written now or by the earlier run a replayed chunk stands for.
    pub(crate) rows: u64,
    pub(crate) chunks: u64,
    /// Chunks the server answered from its store of keyed outcomes: an earlier import under the
    /// same key wrote them, and this one wrote nothing of them.
    pub(crate) replayed_chunks: u64,
    /// The rows of the replayed chunks.
    pub(crate) replayed_rows: u64,
    pub(crate) key: String,
}

impl Imported {
    /// What the import did, in one line for people.
    pub(crate) fn summary(&self, table: &str, elapsed: &str) -> String {
        let plural = |n: u64, word: &str| format!("{n} {word}{}", if n == 1 { "" } else { "s" });
        if self.chunks > 0 && self.replayed_chunks == self.chunks {
            return format!(
                "already imported into {table} under key {}: nothing written ({} the earlier \
                 import wrote; the server remembers keyed writes for its idempotency TTL). Run \
                 with --again to import the file anew",
                self.key,
                plural(self.rows, "row")
            );
        }
        let mut line = format!(
            "imported {} into {table} in {} ({elapsed}; key {})",
            plural(self.rows - self.replayed_rows, "row"),
            plural(self.chunks - self.replayed_chunks, "chunk"),
            self.key
        );
        if self.replayed_chunks > 0 {
            line.push_str(&format!(
                "; resumed: {} ({}) written by an earlier run under this key were skipped",
                plural(self.replayed_chunks, "chunk"),
                plural(self.replayed_rows, "row")
            ));
        }
        line
    }
}

/// How a text field becomes a value, from SQLite's type-affinity rules on the declared type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Affinity {
    Integer,
    Real,
    Numeric,
    Text,
    /// `BLOB` or no declared type: the value is stored as given.
    Blob,
}

impl Affinity {
    fn of(declared: &str) -> Affinity {
        let upper = declared.to_ascii_uppercase();
        if upper.contains("INT") {
            Affinity::Integer
        } else if upper.contains("CHAR") || upper.contains("CLOB") || upper.contains("TEXT") {
            Affinity::Text
        } else if upper.contains("BLOB") || upper.is_empty() {
            Affinity::Blob
        } else if upper.contains("REAL") || upper.contains("FLOA") || upper.contains("DOUB") {
            Affinity::Real
        } else {
            Affinity::Numeric
        }
    }

    /// Converts one text field; `Err` says what it expected.
    fn convert(self, text: &str) -> Result<Value, &'static str> {
        let trimmed = text.trim();
        let integer = || trimmed.parse::<i64>().ok().map(Value::from);
        let real = || {
            trimmed
                .parse::<f64>()
                .ok()
                .filter(|f| f.is_finite())
                .and_then(Number::from_f64)
                .map(Value::Number)
        };
        match self {
            Affinity::Text | Affinity::Blob => Ok(Value::String(text.to_owned())),
            Affinity::Integer => integer().ok_or("an integer"),
            Affinity::Real => real().ok_or("a number"),
            Affinity::Numeric => integer().or_else(real).ok_or("a number"),
        }
    }
}

/// The declared columns of `table`, by lower-cased name.
/// The server's describe call answers on every engine; the type names are the engine's own
/// (`INTEGER` on SQLite, `integer` or `double precision` on PostgreSQL), which the affinity
/// rules read alike.
async fn declared_columns(client: &Client, table: &str) -> anyhow::Result<Vec<(String, Affinity)>> {
    let Some(columns) = client.describe(table).await? else {
        bail!("no such table: {table}");
    };
    Ok(columns
        .into_iter()
        .map(|column| {
            let affinity = Affinity::of(&column.declared_type);
            (column.name, affinity)
        })
        .collect())
}

fn affinity_of(columns: &[(String, Affinity)], name: &str) -> anyhow::Result<Affinity> {
    columns
        .iter()
        .find(|(column, _)| column.eq_ignore_ascii_case(name))
        .map(|(_, affinity)| *affinity)
        .ok_or_else(|| anyhow!("the table has no column `{name}`"))
}

/// The format of `path`: by extension unless given.
fn format_of(path: &Path, given: Option<ImportFormat>) -> ImportFormat {
    given.unwrap_or_else(|| match path.extension().and_then(|e| e.to_str()) {
        Some(ext) if ext.eq_ignore_ascii_case("ndjson") || ext.eq_ignore_ascii_case("jsonl") => {
            ImportFormat::Ndjson
        }
        _ => ImportFormat::Csv,
    })
}

/// The key prefix of an import: the table, the file's bytes and the chunk size decide it.
fn derived_key(table: &str, path: &Path, chunk_rows: u64) -> anyhow::Result<String> {
    let mut hasher = Sha256::new();
    hasher.update(table.as_bytes());
    hasher.update([0]);
    hasher.update(chunk_rows.to_le_bytes());
    let mut file = File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    let mut buffer = vec![0; 64 * 1024];
    loop {
        let read = file.read(&mut buffer)?;
        if read == 0 {
            break;
        }
        hasher.update(&buffer[..read]);
    }
    let digest = hasher.finalize();
    let hex: String = digest[..12].iter().map(|b| format!("{b:02x}")).collect();
    Ok(format!("sqlhttp-import-{hex}"))
}

fn random_key() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("sqlhttp-import-{nanos:x}-{}", std::process::id())
}

/// A reader that counts the bytes it has given, for the progress bar.
struct Counting<R> {
    inner: R,
    read: Arc<AtomicU64>,
}

impl<R: Read> Read for Counting<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.read.fetch_add(n as u64, Ordering::Relaxed);
        Ok(n)
    }
}

/// Rows read from the input, converted and ready to insert.
trait RowSource {
    fn next_row(&mut self) -> anyhow::Result<Option<Map<String, Value>>>;
}

struct CsvSource<R> {
    records: CsvRecords<R>,
    header: Vec<(String, Affinity)>,
    record: u64,
}

impl<R: BufRead> RowSource for CsvSource<R> {
    fn next_row(&mut self) -> anyhow::Result<Option<Map<String, Value>>> {
        let Some(fields) = self.records.next_record()? else {
            return Ok(None);
        };
        self.record += 1;
        if fields.len() != self.header.len() {
            bail!(
                "record {}: {} fields, but the header has {}",
                self.record,
                fields.len(),
                self.header.len()
            );
        }
        let mut row = Map::new();
        for ((name, affinity), field) in self.header.iter().zip(fields) {
            let value = match field {
                None => Value::Null,
                Some(text) => affinity.convert(&text).map_err(|expected| {
                    anyhow!(
                        "record {}, column `{name}`: `{text}` is not {expected}",
                        self.record
                    )
                })?,
            };
            row.insert(name.clone(), value);
        }
        Ok(Some(row))
    }
}

struct NdjsonSource<R> {
    lines: io::Lines<R>,
    columns: Vec<(String, Affinity)>,
    line: u64,
}

impl<R: BufRead> RowSource for NdjsonSource<R> {
    fn next_row(&mut self) -> anyhow::Result<Option<Map<String, Value>>> {
        loop {
            let Some(line) = self.lines.next().transpose()? else {
                return Ok(None);
            };
            self.line += 1;
            if line.trim().is_empty() {
                continue;
            }
            let object: Map<String, Value> = serde_json::from_str(&line)
                .with_context(|| format!("line {}: not a JSON object", self.line))?;
            let mut row = Map::new();
            for (name, value) in object {
                let affinity = affinity_of(&self.columns, &name)
                    .with_context(|| format!("line {}", self.line))?;
                let value = match value {
                    Value::String(text) if affinity != Affinity::Text => {
                        affinity.convert(&text).map_err(|expected| {
                            anyhow!(
                                "line {}, column `{name}`: `{text}` is not {expected}",
                                self.line
                            )
                        })?
                    }
                    other => other,
                };
                row.insert(name, value);
            }
            return Ok(Some(row));
        }
    }
}

/// Inserts one chunk under its own idempotency key, retried.
async fn insert_chunk(
    client: &Client,
    table: &str,
    key: &str,
    chunk: &[Map<String, Value>],
    imported: &mut Imported,
) -> anyhow::Result<()> {
    let first = imported.rows + 1;
    let last = imported.rows + chunk.len() as u64;
    let report = client
        .insert(table, chunk)
        .retry_writes(true)
        .idempotency_key(format!("{key}-{}", imported.chunks))
        .report()
        .await
        .map_err(|e| {
            let context = if e.is_retryable() || e.is_outcome_unknown() || !e.is_sent() {
                format!(
                    "chunk {} (rows {first} to {last}) may not have been written; run the same \
                     import again to resume: chunks already written are skipped",
                    imported.chunks
                )
            } else {
                format!(
                    "chunk {} (rows {first} to {last}) was refused",
                    imported.chunks
                )
            };
            anyhow::Error::new(e).context(context)
        })?;
    if report.is_replay() {
        imported.replayed_chunks += 1;
        imported.replayed_rows += chunk.len() as u64;
    }
    imported.rows = last;
    imported.chunks += 1;
    Ok(())
}

/// Runs an import of `path` into `table`.
pub(crate) async fn run(
    client: &Client,
    table: &str,
    path: &Path,
    format: Option<ImportFormat>,
    chunk_rows: u64,
    key: Option<String>,
    again: bool,
) -> anyhow::Result<Imported> {
    let from_stdin = path == Path::new("-");
    let key = match key {
        Some(key) => key,
        None if from_stdin || again => random_key(),
        None => derived_key(table, path, chunk_rows)?,
    };
    let read = Arc::new(AtomicU64::new(0));
    let (input, progress): (Box<dyn BufRead>, Progress) = if from_stdin {
        (
            Box::new(BufReader::new(io::stdin())),
            Progress::new("imported"),
        )
    } else {
        let file = File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
        let size = file.metadata().map(|m| m.len()).unwrap_or(0);
        let counting = Counting {
            inner: file,
            read: Arc::clone(&read),
        };
        (
            Box::new(BufReader::new(counting)),
            Progress::bytes("importing", size),
        )
    };
    let progress = &progress;
    let columns = declared_columns(client, table).await?;
    let mut source: Box<dyn RowSource> = match format_of(path, format) {
        ImportFormat::Csv => {
            let mut records = CsvRecords::new(input);
            let header: Vec<Field> = records
                .next_record()?
                .ok_or_else(|| anyhow!("the CSV is empty: it needs a header line"))?;
            let header = header
                .into_iter()
                .map(|name| {
                    let name = name.unwrap_or_default();
                    affinity_of(&columns, &name).map(|affinity| (name, affinity))
                })
                .collect::<anyhow::Result<_>>()?;
            Box::new(CsvSource {
                records,
                header,
                record: 1,
            })
        }
        ImportFormat::Ndjson => Box::new(NdjsonSource {
            lines: input.lines(),
            columns,
            line: 0,
        }),
    };

    let started = Instant::now();
    let mut imported = Imported {
        rows: 0,
        chunks: 0,
        replayed_chunks: 0,
        replayed_rows: 0,
        key: key.clone(),
    };
    let chunk_size = usize::try_from(chunk_rows).unwrap_or(usize::MAX);
    let mut chunk: Vec<Map<String, Value>> = Vec::with_capacity(chunk_size.min(10_000));
    loop {
        let row = source.next_row()?;
        // One statement inserts rows of one shape: a row naming other columns (NDJSON objects
        // may leave some out, to get their defaults) starts a new chunk.
        let reshaped = match (&row, chunk.first()) {
            (Some(row), Some(first)) => !row.keys().eq(first.keys()),
            _ => false,
        };
        if !chunk.is_empty() && (chunk.len() >= chunk_size || row.is_none() || reshaped) {
            insert_chunk(client, table, &key, &chunk, &mut imported).await?;
            chunk.clear();
            progress.read(read.load(Ordering::Relaxed));
            progress.rows(imported.rows, started.elapsed());
        }
        match row {
            Some(row) => chunk.push(row),
            None => break,
        }
    }
    progress.finish();
    Ok(imported)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn affinities_follow_sqlite() {
        assert_eq!(Affinity::of("INTEGER"), Affinity::Integer);
        assert_eq!(Affinity::of("bigint"), Affinity::Integer);
        assert_eq!(Affinity::of("VARCHAR(20)"), Affinity::Text);
        assert_eq!(Affinity::of("DOUBLE PRECISION"), Affinity::Real);
        assert_eq!(Affinity::of("DECIMAL(10,2)"), Affinity::Numeric);
        assert_eq!(Affinity::of(""), Affinity::Blob);
    }

    #[test]
    fn conversions() {
        assert_eq!(Affinity::Integer.convert(" 42 "), Ok(json!(42)));
        assert!(Affinity::Integer.convert("4.2").is_err());
        assert_eq!(Affinity::Real.convert("4.5"), Ok(json!(4.5)));
        assert_eq!(Affinity::Numeric.convert("7"), Ok(json!(7)));
        assert_eq!(Affinity::Numeric.convert("7.5"), Ok(json!(7.5)));
        assert_eq!(Affinity::Text.convert(" 7 "), Ok(json!(" 7 ")));
        assert!(Affinity::Real.convert("NaN").is_err());
    }
}
