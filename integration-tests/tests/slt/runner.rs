//! Runs one script's [`Record`]s against a server through the SDK and judges the answers: values
//! rendered as the format prescribes, sorted, hashed and compared; labels checked across queries;
//! `skipif`/`onlyif` honoured; and, after the script, what it created dropped again.
//!
//! The rendering follows the format's rules: `NULL`, `(empty)` for an empty string, control and
//! non-ASCII bytes of text as `@`, `I` values as integers (a real truncated toward zero, text read
//! for its leading integer, as SQLite's reference runner reads a cell with `sqlite3_column_int`),
//! `R` values as `%.3f`. Statements go through [`Client::execute`] (a write, never retried) and
//! queries through [`Client::query_table`] (a read), spelled exactly as the script spells them.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use md5::{Digest, Md5};
use sqlhttp::{Client, Error, Table, Value};

use crate::parser::{Condition, Expected, Kind, Query, Record, SortMode};

/// The engine behind the server, by the names the corpus's `skipif`/`onlyif` use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Engine {
    /// `sqlite`.
    Sqlite,
    /// `postgresql`.
    Postgresql,
}

impl Engine {
    /// The corpus's name for the engine.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Engine::Sqlite => "sqlite",
            Engine::Postgresql => "postgresql",
        }
    }

    /// Probes the server's engine: only SQLite has `sqlite_version()`.
    pub(crate) async fn of(client: &Client) -> Engine {
        match client
            .query("SELECT sqlite_version()")
            .fetch_one::<String>()
            .await
        {
            Ok(_) => Engine::Sqlite,
            Err(_) => Engine::Postgresql,
        }
    }
}

/// The results hashed when a script sets no `hash-threshold`: the reference runner's default.
const DEFAULT_HASH_THRESHOLD: usize = 8;

/// How many failures of a file are kept with their details (all are counted).
const KEPT_FAILURES: usize = 20;

/// What running one script came to.
#[derive(Debug, Default)]
pub(crate) struct FileReport {
    /// The script's file name.
    pub(crate) file: String,
    /// Statements and queries run.
    pub(crate) run: usize,
    /// Of those, the ones that did what the script expects.
    pub(crate) passed: usize,
    /// Of those, the ones that did not.
    pub(crate) failed: usize,
    /// Statements and queries not run: for another engine, or after a `halt`.
    pub(crate) skipped: usize,
    /// Skipped labeled queries whose expected results (in the script) disagree with their label's.
    pub(crate) label_conflicts: usize,
    /// The first [`KEPT_FAILURES`] failures.
    pub(crate) failures: Vec<Failure>,
    /// Drops of the script's objects that failed, before or after it.
    pub(crate) cleanup_errors: Vec<String>,
    /// The line of a `halt` record that ended the script early.
    pub(crate) halted_at: Option<usize>,
    /// Wall time, clean-ups included.
    pub(crate) elapsed: Duration,
}

/// One record that did not do what the script expects.
#[derive(Debug, Clone)]
pub(crate) struct Failure {
    /// The script's file name.
    pub(crate) file: String,
    /// The record's first line.
    pub(crate) line: usize,
    /// The SQL sent.
    pub(crate) sql: String,
    /// What the script expects.
    pub(crate) expected: String,
    /// What the server answered.
    pub(crate) got: String,
}

/// Runs `records` (the script `file`) in order on `client`'s server, which runs `engine`. Drops the
/// tables, views and indexes the script creates before it starts (left over by an interrupted
/// run against an external server) and after it ends, views first.
pub(crate) async fn run_file(
    client: &Client,
    engine: Engine,
    file: &str,
    records: &[Record],
) -> FileReport {
    let started = Instant::now();
    let mut run = Run {
        client,
        engine,
        report: FileReport {
            file: file.to_owned(),
            ..FileReport::default()
        },
        hash_threshold: DEFAULT_HASH_THRESHOLD,
        labels: HashMap::new(),
        created: Created::default(),
    };
    let mut leftovers = Created::default();
    for record in records {
        if let Kind::Statement { sql, .. } = &record.kind {
            leftovers.note(sql);
        }
    }
    run.report.cleanup_errors = leftovers.drop_all(client).await;

    for record in records {
        if run.report.halted_at.is_some() {
            if matches!(record.kind, Kind::Statement { .. } | Kind::Query(_)) {
                run.report.skipped += 1;
            }
            continue;
        }
        run.record(record).await;
    }

    let created = std::mem::take(&mut run.created);
    let errors = created.drop_all(client).await;
    run.report.cleanup_errors.extend(errors);
    run.report.elapsed = started.elapsed();
    run.report
}

/// The state of one script's run.
struct Run<'c> {
    client: &'c Client,
    engine: Engine,
    report: FileReport,
    hash_threshold: usize,
    /// Each label's hash, and the line of the query that set it.
    labels: HashMap<String, (String, usize)>,
    created: Created,
}

impl Run<'_> {
    async fn record(&mut self, record: &Record) {
        match &record.kind {
            Kind::HashThreshold(n) => self.hash_threshold = *n,
            Kind::Halt => self.report.halted_at = Some(record.line),
            _ if !self.applies(&record.conditions) => {
                self.report.skipped += 1;
                // A skipped labeled query's expected results still speak for its label.
                if let Kind::Query(query) = &record.kind
                    && let Some(label) = &query.label
                {
                    let hash = match &query.expected {
                        Expected::Hash { md5, .. } => md5.clone(),
                        Expected::Values(values) => md5_of(values),
                    };
                    if let Err((expected, got)) = self.check_label(label, hash, record.line) {
                        self.report.label_conflicts += 1;
                        let got = format!("the script's results (not run here): {got}");
                        self.keep(record.line, &query.sql, expected, got);
                    }
                }
            }
            Kind::Statement { expect_ok, sql } => {
                self.report.run += 1;
                let outcome = self.client.execute(sql.as_str()).await;
                if outcome.is_ok() {
                    self.created.note(sql);
                }
                match (outcome, expect_ok) {
                    (Ok(_), true) | (Err(_), false) => self.report.passed += 1,
                    (Err(err), true) => {
                        self.fail(record.line, sql, "statement ok".into(), describe(&err));
                    }
                    (Ok(_), false) => self.fail(
                        record.line,
                        sql,
                        "statement error".into(),
                        "it succeeded".into(),
                    ),
                }
            }
            Kind::Query(query) => {
                self.report.run += 1;
                match self.query(query, record.line).await {
                    Ok(()) => self.report.passed += 1,
                    Err((expected, got)) => self.fail(record.line, &query.sql, expected, got),
                }
            }
        }
    }

    /// Whether a record with `conditions` runs on this engine.
    fn applies(&self, conditions: &[Condition]) -> bool {
        let me = self.engine.name();
        conditions.iter().all(|condition| match condition {
            Condition::SkipIf(engine) => !engine.eq_ignore_ascii_case(me),
            Condition::OnlyIf(engine) => engine.eq_ignore_ascii_case(me),
        })
    }

    /// Runs a query; on a mismatch, what was expected and what came back.
    async fn query(&mut self, query: &Query, line: usize) -> Result<(), (String, String)> {
        let wanted = || expected_text(&query.expected);
        let table = self
            .client
            .query_table(query.sql.as_str())
            .await
            .map_err(|err| (wanted(), describe(&err)))?;
        let values = rendered(&table, &query.types, query.sort).map_err(|got| (wanted(), got))?;
        let md5 = md5_of(&values);
        let matches = match &query.expected {
            Expected::Values(expected) => *expected == values,
            Expected::Hash { count, md5: hash } => *count == values.len() && *hash == md5,
        };
        if !matches {
            return Err((wanted(), self.got_text(&values, &md5)));
        }
        match &query.label {
            Some(label) => self.check_label(label, md5, line),
            None => Ok(()),
        }
    }

    /// Checks `hash` against the label's, or makes it the label's. Only results that matched their
    /// own expected values get here, so one wrong answer does not fail every later query of its
    /// label.
    fn check_label(
        &mut self,
        label: &str,
        hash: String,
        line: usize,
    ) -> Result<(), (String, String)> {
        match self.labels.get(label) {
            Some((first, _)) if *first == hash => Ok(()),
            Some((first, first_line)) => Err((
                format!("the results of label {label}, hashing to {first} (line {first_line})"),
                format!("results hashing to {hash}"),
            )),
            None => {
                self.labels.insert(label.to_owned(), (hash, line));
                Ok(())
            }
        }
    }

    /// The values as the script would have written them, with the first few when hashed.
    fn got_text(&self, values: &[String], md5: &str) -> String {
        if self.hash_threshold > 0 && values.len() > self.hash_threshold {
            format!(
                "{} values hashing to {md5}, starting {}",
                values.len(),
                preview(values)
            )
        } else {
            preview(values)
        }
    }

    fn fail(&mut self, line: usize, sql: &str, expected: String, got: String) {
        self.report.failed += 1;
        self.keep(line, sql, expected, got);
    }

    /// Keeps a failure's details, while fewer than [`KEPT_FAILURES`] are kept.
    fn keep(&mut self, line: usize, sql: &str, expected: String, got: String) {
        if self.report.failures.len() < KEPT_FAILURES {
            self.report.failures.push(Failure {
                file: self.report.file.clone(),
                line,
                sql: sql.to_owned(),
                expected,
                got,
            });
        }
    }
}

/// An error as the report shows it: HTTP status, protocol code and message.
fn describe(err: &Error) -> String {
    let status = err.status().map_or_else(String::new, |s| format!("{s} "));
    let code = err.code().map_or_else(String::new, |c| format!("{c}: "));
    format!("error {status}{code}{err}")
}

/// The expected results as the report shows them.
fn expected_text(expected: &Expected) -> String {
    match expected {
        Expected::Values(values) => preview(values),
        Expected::Hash { count, md5 } => format!("{count} values hashing to {md5}"),
    }
}

/// Up to 24 values, space-separated; `(no rows)` for none.
fn preview(values: &[String]) -> String {
    const SHOWN: usize = 24;
    if values.is_empty() {
        return "(no rows)".into();
    }
    let mut text = values
        .iter()
        .take(SHOWN)
        .map(String::as_str)
        .collect::<Vec<_>>()
        .join(" ");
    if values.len() > SHOWN {
        text.push_str(&format!(" ... ({} values)", values.len()));
    }
    text
}

/// The table's values rendered per `types`, in the order `sort` asks for; an error when the table
/// has not as many columns as `types` has characters.
fn rendered(table: &Table, types: &str, sort: SortMode) -> Result<Vec<String>, String> {
    let types: Vec<char> = types.chars().collect();
    if table.columns().len() != types.len() {
        return Err(format!(
            "{} result columns ({}), not {}",
            table.columns().len(),
            table
                .columns()
                .iter()
                .map(|c| c.name())
                .collect::<Vec<_>>()
                .join(", "),
            types.len()
        ));
    }
    let mut rows: Vec<Vec<String>> = table
        .rows()
        .map(|row| {
            row.values()
                .iter()
                .zip(&types)
                .map(|(value, ty)| render(value, *ty))
                .collect()
        })
        .collect();
    match sort {
        SortMode::Unsorted => Ok(rows.concat()),
        SortMode::Rows => {
            rows.sort();
            Ok(rows.concat())
        }
        SortMode::Values => {
            let mut values = rows.concat();
            values.sort();
            Ok(values)
        }
    }
}

/// One cell as the format writes it in a column of type `ty` (`T`, `I` or `R`).
fn render(value: &Value, ty: char) -> String {
    if value.is_null() {
        return "NULL".into();
    }
    match ty {
        'I' => match value {
            Value::Integer(i) => i.to_string(),
            // Toward zero, as C's conversion of a double to an int.
            Value::Real(f) => (*f as i64).to_string(),
            Value::Text(text) => leading_integer(text).to_string(),
            Value::Blob(bytes) => leading_integer(&String::from_utf8_lossy(bytes)).to_string(),
            _ => "NULL".into(),
        },
        'R' => {
            let f = match value {
                Value::Integer(i) => *i as f64,
                Value::Real(f) => *f,
                Value::Text(text) => leading_real(text),
                Value::Blob(bytes) => leading_real(&String::from_utf8_lossy(bytes)),
                _ => 0.0,
            };
            format!("{f:.3}")
        }
        _ => {
            let text = match value {
                Value::Integer(i) => i.to_string(),
                Value::Real(f) => real_as_text(*f),
                Value::Text(text) => text.clone(),
                Value::Blob(bytes) => String::from_utf8_lossy(bytes).into_owned(),
                _ => String::new(),
            };
            if text.is_empty() {
                "(empty)".into()
            } else {
                // Byte by byte: a multi-byte character becomes one `@` per byte.
                text.bytes()
                    .map(|b| {
                        if (b' '..=b'~').contains(&b) {
                            b as char
                        } else {
                            '@'
                        }
                    })
                    .collect()
            }
        }
    }
}

/// The integer a text starts with (0 when none), as SQLite reads text as an integer.
fn leading_integer(text: &str) -> i64 {
    let text = text.trim_start();
    let (negative, digits) = match text.as_bytes().first() {
        Some(b'-') => (true, &text[1..]),
        Some(b'+') => (false, &text[1..]),
        _ => (false, text),
    };
    let end = digits
        .bytes()
        .position(|b| !b.is_ascii_digit())
        .unwrap_or(digits.len());
    let magnitude: i64 = digits[..end].parse().unwrap_or(0);
    if negative { -magnitude } else { magnitude }
}

/// The number a text starts with (0 when none), as SQLite reads text as a real.
fn leading_real(text: &str) -> f64 {
    let text = text.trim_start();
    // The longest prefix that parses: numbers here are short.
    (1..=text.len())
        .rev()
        .filter(|end| text.is_char_boundary(*end))
        .find_map(|end| text[..end].parse::<f64>().ok().filter(|f| f.is_finite()))
        .unwrap_or(0.0)
}

/// A real as SQLite renders it as text (`%!.15g`: 15 significant digits, `.0` kept on integers).
fn real_as_text(f: f64) -> String {
    if !f.is_finite() {
        return if f.is_nan() {
            "NaN".into()
        } else if f > 0.0 {
            "Inf".into()
        } else {
            "-Inf".into()
        };
    }
    let scientific = format!("{f:.14e}");
    let (mantissa, exponent) = scientific.split_once('e').unwrap_or((&scientific, "0"));
    let exponent: i32 = exponent.parse().unwrap_or(0);
    if !(-4..15).contains(&exponent) {
        let mantissa = trim_fraction(mantissa);
        let sign = if exponent < 0 { '-' } else { '+' };
        return format!("{mantissa}e{sign}{:02}", exponent.abs());
    }
    let decimals = usize::try_from(14 - exponent).unwrap_or(0);
    trim_fraction(&format!("{f:.decimals$}"))
}

/// `1.500` → `1.5`, `2.000` → `2.0`, `3` → `3.0`.
fn trim_fraction(number: &str) -> String {
    match number.split_once('.') {
        Some((whole, fraction)) => {
            let fraction = fraction.trim_end_matches('0');
            let fraction = if fraction.is_empty() { "0" } else { fraction };
            format!("{whole}.{fraction}")
        }
        None => format!("{number}.0"),
    }
}

/// The format's hash: the MD5 of every value followed by a newline, in lowercase hex.
fn md5_of(values: &[String]) -> String {
    let mut hasher = Md5::new();
    for value in values {
        hasher.update(value.as_bytes());
        hasher.update(b"\n");
    }
    hasher
        .finalize()
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect()
}

/// The tables, views and indexes a script created, in creation order.
#[derive(Debug, Default)]
struct Created {
    tables: Vec<String>,
    views: Vec<String>,
    indexes: Vec<String>,
}

impl Created {
    /// Remembers the object `sql` creates, if it is a `CREATE TABLE`, `VIEW` or `INDEX`.
    fn note(&mut self, sql: &str) {
        let Some((kind, name)) = created_object(sql) else {
            return;
        };
        let list = match kind {
            ObjectKind::Table => &mut self.tables,
            ObjectKind::View => &mut self.views,
            ObjectKind::Index => &mut self.indexes,
        };
        if !list.contains(&name) {
            list.push(name);
        }
    }

    /// Drops everything remembered, `IF EXISTS`: views (which may name the tables), indexes, then
    /// tables, each group newest first. Returns the drops that failed.
    async fn drop_all(self, client: &Client) -> Vec<String> {
        let drops = (self
            .views
            .iter()
            .rev()
            .map(|name| format!("DROP VIEW IF EXISTS {name}")))
        .chain(
            self.indexes
                .iter()
                .rev()
                .map(|name| format!("DROP INDEX IF EXISTS {name}")),
        )
        .chain(
            self.tables
                .iter()
                .rev()
                .map(|name| format!("DROP TABLE IF EXISTS {name}")),
        );
        let mut errors = Vec::new();
        for sql in drops {
            if let Err(err) = client.execute(sql.as_str()).await {
                errors.push(format!("{sql}: {}", describe(&err)));
            }
        }
        errors
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ObjectKind {
    Table,
    View,
    Index,
}

/// The kind and name (as spelled) of what a `CREATE [TEMP] [UNIQUE] TABLE|VIEW|INDEX [IF NOT
/// EXISTS] name` statement creates.
fn created_object(sql: &str) -> Option<(ObjectKind, String)> {
    let mut words = sql
        .split(|c: char| c.is_whitespace() || c == '(')
        .filter(|word| !word.is_empty());
    if !words.next()?.eq_ignore_ascii_case("CREATE") {
        return None;
    }
    let kind = loop {
        let word = words.next()?.to_ascii_uppercase();
        match word.as_str() {
            "TEMP" | "TEMPORARY" | "UNIQUE" => {}
            "TABLE" => break ObjectKind::Table,
            "VIEW" => break ObjectKind::View,
            "INDEX" => break ObjectKind::Index,
            _ => return None,
        }
    };
    let mut name = words.next()?;
    if name.eq_ignore_ascii_case("IF") {
        // IF NOT EXISTS
        words.next()?;
        words.next()?;
        name = words.next()?;
    }
    Some((kind, name.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_cells_by_column_type() {
        assert_eq!(render(&Value::Null, 'I'), "NULL");
        assert_eq!(render(&Value::Integer(-7), 'I'), "-7");
        assert_eq!(render(&Value::Real(-7.9), 'I'), "-7");
        assert_eq!(render(&Value::Text("12.50".into()), 'I'), "12");
        assert_eq!(render(&Value::Text("abc".into()), 'I'), "0");
        assert_eq!(render(&Value::Integer(3), 'R'), "3.000");
        assert_eq!(render(&Value::Real(2.0 / 3.0), 'R'), "0.667");
        assert_eq!(render(&Value::Text("-1.25x".into()), 'R'), "-1.250");
        assert_eq!(render(&Value::Text(String::new()), 'T'), "(empty)");
        assert_eq!(render(&Value::Text("a\tb é".into()), 'T'), "a@b @@");
        assert_eq!(render(&Value::Integer(42), 'T'), "42");
        assert_eq!(render(&Value::Real(1.5), 'T'), "1.5");
        assert_eq!(render(&Value::Real(2.0), 'T'), "2.0");
        assert_eq!(render(&Value::Real(0.1 + 0.2), 'T'), "0.3");
        assert_eq!(render(&Value::Real(1e20), 'T'), "1.0e+20");
    }

    #[test]
    fn hashes_values_with_newlines() {
        // printf '1\n2\n' | md5sum
        assert_eq!(
            md5_of(&["1".into(), "2".into()]),
            "6ddb4095eb719e2a9f0a3f95677d24e0"
        );
        // The hash of no values: MD5 of nothing.
        assert_eq!(md5_of(&[]), "d41d8cd98f00b204e9800998ecf8427e");
    }

    #[test]
    fn names_what_a_statement_creates() {
        assert_eq!(
            created_object("CREATE TABLE t1(a INTEGER)"),
            Some((ObjectKind::Table, "t1".into()))
        );
        assert_eq!(
            created_object("create unique index if not exists t1i0 ON t1(a1)"),
            Some((ObjectKind::Index, "t1i0".into()))
        );
        assert_eq!(
            created_object("CREATE TEMP VIEW v1 AS SELECT 1"),
            Some((ObjectKind::View, "v1".into()))
        );
        assert_eq!(created_object("CREATE TRIGGER tr AFTER INSERT ON t1"), None);
        assert_eq!(created_object("INSERT INTO t1 VALUES(1)"), None);
    }

    #[test]
    fn prefixed_numbers() {
        assert_eq!(leading_integer("  -42abc"), -42);
        assert_eq!(leading_integer("1e3"), 1);
        assert_eq!(leading_integer(""), 0);
        assert!((leading_real("3.5e1 apples") - 35.0).abs() < 1e-9);
        assert_eq!(leading_real("none"), 0.0);
    }
}
