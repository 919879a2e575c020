//! What a call tells its tracing backend: one `sqlhttp.call` span per call, named and attributed
//! by OpenTelemetry's database client conventions (span kind CLIENT, `db.system.name`,
//! `db.operation.name`, `db.query.summary`, `db.query.text` only when the application opted in,
//! `db.response.status_code`, `error.type`, `server.address`, `server.port`), and one
//! `sqlhttp.attempt` span per attempt under it (its number, the wait before it, the call's retry
//! class, whether an idempotency key was sent, the server's request id, the failure's kind and
//! what the loop decided: retried, or why not). With the `opentelemetry` feature, an attempt
//! carries its span's context as W3C `traceparent`/`tracestate` (the global propagator's).
//!
//! The spans are plain `tracing` spans: with no subscriber, or one that disables them, a call
//! pays a disabled span's cost and nothing more (the summary is computed only for an enabled
//! span). This module knows the spans' names and fields and how a summary is read off the
//! statement's first words; it does not know retry rules (the loop tells it what it decided), nor
//! bound values (it is never given them).

use std::borrow::Cow;
use std::time::Duration;

use tracing::Span;
use tracing::field::Empty;

use crate::error::{Error, ErrorKind};
use crate::retry::classify::OpClass;

/// What the spans say about the client, fixed when it is built.
#[derive(Debug, Clone, Default)]
pub(crate) struct TraceSettings {
    /// The server's host (`server.address`) and port (`server.port`).
    pub(crate) server_address: Option<String>,
    pub(crate) server_port: Option<u16>,
    /// Whether the statement's text goes in `db.query.text` (`ClientBuilder::trace_query_text`).
    pub(crate) query_text: bool,
}

impl TraceSettings {
    /// The settings of a client whose endpoint is `url`.
    pub(crate) fn for_url(url: &reqwest::Url, query_text: bool) -> Self {
        Self {
            server_address: url.host_str().map(str::to_owned),
            server_port: url.port_or_known_default(),
            query_text,
        }
    }
}

/// The span of one call, before any attempt: attributes known from the call alone.
pub(crate) fn call_span(settings: &TraceSettings, class: OpClass, sql: &str) -> Span {
    let span = tracing::info_span!(
        "sqlhttp.call",
        otel.name = Empty,
        otel.kind = "client",
        otel.status_code = Empty,
        op = class.as_str(),
        attempts = Empty,
        db.system.name = Empty,
        db.operation.name = Empty,
        db.query.summary = Empty,
        db.query.text = Empty,
        db.response.status_code = Empty,
        error.type = Empty,
        server.address = Empty,
        server.port = Empty,
    );
    if span.is_disabled() {
        return span;
    }
    let summary = summary(sql);
    span.record("otel.name", summary.as_str());
    span.record("db.query.summary", summary.as_str());
    if let Some(operation) = summary.split(' ').next().filter(|op| !op.is_empty()) {
        span.record("db.operation.name", operation);
    }
    if settings.query_text {
        span.record("db.query.text", sql);
    }
    if let Some(address) = &settings.server_address {
        span.record("server.address", address.as_str());
    }
    if let Some(port) = settings.server_port {
        // As an `i64`: exporters take integers of that width.
        span.record("server.port", i64::from(port));
    }
    span
}

/// Records how the call ended on its span: on failure, its `error.type`, the protocol's code as
/// `db.response.status_code`, and an error status.
pub(crate) fn end_call<T>(span: &Span, outcome: &Result<T, Error>) {
    if span.is_disabled() {
        return;
    }
    if let Err(err) = outcome {
        span.record("otel.status_code", "ERROR");
        span.record("error.type", error_type(err.kind()).as_ref());
        if let Some(code) = err.kind().wire_code() {
            span.record("db.response.status_code", code);
        }
    }
}

/// Records the engine that answered (`sqlhttp-engine`: `sqlite`, `postgresql`) as the call's
/// `db.system.name`.
pub(crate) fn record_engine(call: &Span, engine: Option<&str>) {
    if let Some(engine) = engine {
        call.record("db.system.name", engine);
    }
}

/// The span of one attempt, a child of the call's (the current span when it is made).
pub(crate) fn attempt_span(attempt: u32, waited: Duration, class: OpClass, keyed: bool) -> Span {
    let span = tracing::info_span!(
        "sqlhttp.attempt",
        otel.kind = "client",
        otel.status_code = Empty,
        sqlhttp.attempt = i64::from(attempt),
        http.request.resend_count = Empty,
        sqlhttp.attempt.wait_ms = Empty,
        sqlhttp.retry.class = class.as_str(),
        sqlhttp.idempotency_key.sent = keyed,
        sqlhttp.request_id = Empty,
        http.response.status_code = Empty,
        error.type = Empty,
        sqlhttp.retry.decision = Empty,
    );
    if !span.is_disabled() && attempt > 1 {
        span.record("http.request.resend_count", i64::from(attempt - 1));
        span.record("sqlhttp.attempt.wait_ms", millis(waited));
    }
    span
}

/// Records a successful attempt: the server's request id.
pub(crate) fn attempt_succeeded(span: &Span, request_id: Option<&str>) {
    if let Some(id) = request_id {
        span.record("sqlhttp.request_id", id);
    }
}

/// Records a failed attempt: its kind, its status, and the server's request id.
pub(crate) fn attempt_failed(span: &Span, kind: &ErrorKind, request_id: Option<&str>) {
    if span.is_disabled() {
        return;
    }
    span.record("otel.status_code", "ERROR");
    span.record("error.type", error_type(kind).as_ref());
    if let Some(status) = kind.response_status() {
        span.record("http.response.status_code", i64::from(status));
    }
    if let Some(id) = request_id {
        span.record("sqlhttp.request_id", id);
    }
}

/// What the loop did after a failed attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Decision {
    /// Sent again (after the wait the next attempt's span records).
    Retried,
    /// Sent again at once without the bookmark the server's primary is behind (a free attempt).
    ResentWithoutBookmark,
    /// Not retried: the failure is final for the call's class (or a write not allowed retries).
    Final,
    /// Not retried: the policy's attempts were spent.
    AttemptsExhausted,
    /// Not retried: the next attempt would start past `max_elapsed`.
    MaxElapsed,
    /// Not retried: the retry budget refused.
    BudgetExhausted,
    /// Not retried: the caller cancelled.
    Cancelled,
}

impl Decision {
    fn as_str(self) -> &'static str {
        match self {
            Decision::Retried => "retried",
            Decision::ResentWithoutBookmark => "resent_without_bookmark",
            Decision::Final => "final",
            Decision::AttemptsExhausted => "attempts_exhausted",
            Decision::MaxElapsed => "max_elapsed",
            Decision::BudgetExhausted => "budget_exhausted",
            Decision::Cancelled => "cancelled",
        }
    }
}

/// Records what the loop decided after a failed attempt.
pub(crate) fn decided(span: &Span, decision: Decision) {
    span.record("sqlhttp.retry.decision", decision.as_str());
}

/// A failure's `error.type`: the protocol's code when the server gave one, else the HTTP status,
/// else the kind of failure on the client's side (`timeout`, `connection`, `cancelled`, ...).
/// Few distinct values, as the conventions ask.
pub(crate) fn error_type(kind: &ErrorKind) -> Cow<'_, str> {
    if let Some(code) = kind.wire_code() {
        return Cow::Borrowed(code);
    }
    Cow::Borrowed(match kind {
        ErrorKind::Http { status, .. } => return Cow::Owned(status.to_string()),
        ErrorKind::Timeout { .. } => "timeout",
        ErrorKind::Connection { .. } => "connection",
        ErrorKind::Tls { .. } => "tls",
        ErrorKind::Cancelled => "cancelled",
        ErrorKind::Decode { .. } => "decode",
        ErrorKind::RowNotFound => "row_not_found",
        ErrorKind::InvalidParameter { .. } => "invalid_parameter",
        ErrorKind::Config { .. } => "config",
        _ => "_OTHER",
    })
}

/// The current span's context (the attempt's, when the exchange runs in it) as the headers the
/// global propagator writes: `traceparent` and `tracestate` with `TraceContextPropagator`, none
/// with the default no-op propagator or when no `tracing-opentelemetry` layer tracks the span.
#[cfg(feature = "opentelemetry")]
pub(crate) fn propagation_headers() -> http::HeaderMap {
    use tracing_opentelemetry::OpenTelemetrySpanExt;

    /// Where the propagator writes: a request's headers. A name or value that is not a valid
    /// header is dropped.
    struct Carrier<'a>(&'a mut http::HeaderMap);

    impl opentelemetry::propagation::Injector for Carrier<'_> {
        fn set(&mut self, key: &str, value: String) {
            if let (Ok(name), Ok(value)) = (
                http::HeaderName::from_bytes(key.as_bytes()),
                http::HeaderValue::from_str(&value),
            ) {
                self.0.insert(name, value);
            }
        }
    }

    let mut headers = http::HeaderMap::new();
    let span = Span::current();
    if span.is_disabled() {
        return headers;
    }
    let context = span.context();
    opentelemetry::global::get_text_map_propagator(|propagator| {
        propagator.inject_context(&context, &mut Carrier(&mut headers));
    });
    headers
}

fn millis(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1_000.0
}

/// How far into a statement a summary looks: past it, the summary is the operation alone.
const SUMMARY_SCAN_BYTES: usize = 4096;
/// The longest table name a summary repeats.
const SUMMARY_TARGET_BYTES: usize = 64;

/// `db.query.summary`: the statement's operation and the table it names first, read off its first
/// words (`SELECT books`, `INSERT books`, `UPDATE books`, `DELETE books`, `CREATE TABLE books`,
/// `BEGIN`). Never a literal: only keywords and the identifier after `FROM`, `INTO`, `UPDATE`,
/// `TABLE`, `INDEX`, `VIEW` or `JOIN` are kept. Bounded: it reads at most the statement's first
/// 4 KiB.
pub(crate) fn summary(sql: &str) -> String {
    let mut scan = sql.len().min(SUMMARY_SCAN_BYTES);
    while !sql.is_char_boundary(scan) {
        scan -= 1;
    }
    let mut words = Words {
        rest: &sql[..scan],
        truncated: scan < sql.len(),
    };
    let Some(first) = words.next_word() else {
        return String::new();
    };
    let operation = first.to_ascii_uppercase();
    // The keyword after which the statement names its table.
    let (anchors, with_kind): (&[&str], bool) = match operation.as_str() {
        "SELECT" | "DELETE" | "WITH" => (&["FROM"], false),
        "INSERT" | "REPLACE" => (&["INTO"], false),
        "UPDATE" => (&[], false),
        "CREATE" | "DROP" | "ALTER" => (&["TABLE", "INDEX", "VIEW", "TRIGGER"], true),
        _ => return operation,
    };
    let mut summary = operation;
    let target = if anchors.is_empty() {
        // `UPDATE [OR ROLLBACK] table`.
        words.table()
    } else {
        let mut kind = None;
        let mut found = None;
        while let Some(word) = words.next_word() {
            if anchors
                .iter()
                .any(|anchor| word.eq_ignore_ascii_case(anchor))
            {
                kind = Some(word.to_ascii_uppercase());
                found = words.table();
                break;
            }
        }
        if with_kind && let Some(kind) = kind {
            summary.push(' ');
            summary.push_str(&kind);
        }
        found
    };
    if let Some(target) = target {
        summary.push(' ');
        summary.push_str(target);
    }
    summary
}

/// `db.operation.name`: the statement's first word, as written (the metrics put it in capitals:
/// `SELECT`, `BATCH`, `COMMIT`), for the metrics' attributes (a span takes it from its summary).
#[cfg(feature = "opentelemetry")]
pub(crate) fn operation(sql: &str) -> Option<&str> {
    // Measured on every call: a statement that starts with its first word (no space, comment or
    // literal before it) gives it without the scanner, as the scanner would.
    let bytes = sql.as_bytes();
    if bytes
        .first()
        .is_some_and(|b| b.is_ascii_alphabetic() || *b == b'_')
    {
        let end = bytes
            .iter()
            .position(|b| !(b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'$')))
            .unwrap_or(bytes.len());
        // Not at the end of a statement cut short by the scan, and not PostgreSQL's `E'...'`.
        if end < bytes.len().min(SUMMARY_SCAN_BYTES) && bytes[end] != b'\'' {
            return Some(&sql[..end]);
        }
    }
    let mut scan = sql.len().min(SUMMARY_SCAN_BYTES);
    while !sql.is_char_boundary(scan) {
        scan -= 1;
    }
    Words {
        rest: &sql[..scan],
        truncated: scan < sql.len(),
    }
    .next_word()
}

/// Keywords that may stand between an anchor and the table (`IF NOT EXISTS`, `OR REPLACE`, ...).
fn is_keyword(word: &str) -> bool {
    [
        "IF", "NOT", "EXISTS", "OR", "ROLLBACK", "ABORT", "FAIL", "IGNORE", "ONLY", "UNIQUE",
    ]
    .iter()
    .any(|keyword| word.eq_ignore_ascii_case(keyword))
}

/// The identifiers and keywords of a statement's start; literals, numbers, parameters and
/// punctuation are skipped, never returned.
struct Words<'a> {
    rest: &'a str,
    /// The statement goes on past `rest`: a word at its very end may be cut, so it is dropped.
    truncated: bool,
}

impl<'a> Words<'a> {
    fn next_word(&mut self) -> Option<&'a str> {
        loop {
            let rest = self.rest.trim_start();
            let first = rest.chars().next()?;
            if rest.starts_with("--") {
                self.rest = rest.find('\n').map_or("", |end| &rest[end..]);
                continue;
            }
            if rest.starts_with("/*") {
                self.rest = rest.find("*/").map_or("", |end| &rest[end + 2..]);
                continue;
            }
            let escaped_string = matches!(first, 'E' | 'e') && rest[1..].starts_with('\'');
            if first == '\'' || escaped_string {
                // A string literal, skipped whole: `''` inside it is two literals back to back;
                // PostgreSQL's `E'...'` takes backslash escapes.
                let at = usize::from(escaped_string);
                self.rest = after_quoted(&rest[at..], '\'', escaped_string);
                continue;
            }
            if first == '$' {
                // PostgreSQL's dollar-quoted string (`$$...$$`, `$tag$...$tag$`), skipped whole
                // (to the end when it does not close), or a parameter (`$1`).
                let body = &rest[1..];
                let tag = body
                    .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                    .unwrap_or(body.len());
                if body[tag..].starts_with('$') && !body.starts_with(|c: char| c.is_ascii_digit()) {
                    let delimiter = &rest[..tag + 2];
                    let inside = &rest[delimiter.len()..];
                    self.rest = inside
                        .find(delimiter)
                        .map_or("", |end| &inside[end + delimiter.len()..]);
                } else {
                    self.rest = &body[tag..];
                }
                continue;
            }
            let word_end = match first {
                // A quoted identifier: one word, when it closes.
                '"' | '`' | '[' => {
                    let close = if first == '[' { ']' } else { first };
                    rest[1..].find(close).map(|end| end + 2)
                }
                c if c.is_ascii_alphabetic() || c == '_' => Some(
                    rest.find(|c: char| {
                        !(c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '$'))
                    })
                    .unwrap_or(rest.len()),
                ),
                _ => None,
            };
            let Some(end) = word_end else {
                if matches!(first, '"' | '`' | '[') {
                    // An identifier that never closes: nothing after it is a word.
                    self.rest = "";
                    return None;
                }
                // Numbers, parameters, punctuation: skipped.
                let skip = match rest.find(|c: char| {
                    c.is_whitespace()
                        || c.is_ascii_alphabetic()
                        || matches!(c, '\'' | '"' | '`' | '[' | '$' | '_')
                }) {
                    Some(0) => first.len_utf8(),
                    Some(at) => at,
                    None => rest.len(),
                };
                self.rest = &rest[skip..];
                continue;
            };
            let word = &rest[..end];
            self.rest = &rest[end..];
            if self.truncated && self.rest.is_empty() {
                return None;
            }
            if word.len() > SUMMARY_TARGET_BYTES || word.contains(char::is_whitespace) {
                continue;
            }
            return Some(word);
        }
    }
}

/// What follows the quoted text `quoted` starts with (its opening `quote`), or nothing when it
/// does not close; with `backslashes`, a backslash escapes the character after it.
fn after_quoted(quoted: &str, quote: char, backslashes: bool) -> &str {
    let mut chars = quoted.char_indices().skip(1);
    while let Some((at, c)) = chars.next() {
        if backslashes && c == '\\' {
            chars.next();
        } else if c == quote {
            return &quoted[at + c.len_utf8()..];
        }
    }
    ""
}

impl<'a> Words<'a> {
    /// The table named right here (past keywords such as `IF NOT EXISTS`): the next word when
    /// nothing else (a literal, a parenthesis) comes first.
    fn table(&mut self) -> Option<&'a str> {
        loop {
            let rest = self.rest.trim_start();
            let first = rest.chars().next()?;
            let literal = matches!(first, 'E' | 'e') && rest[1..].starts_with('\'');
            if literal || !(first.is_ascii_alphabetic() || matches!(first, '_' | '"' | '`' | '[')) {
                return None;
            }
            let word = self.next_word()?;
            if !is_keyword(word) {
                return Some(word);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The metrics' operation is the first word the summary's scanner finds, its fast path
    /// included.
    #[cfg(feature = "opentelemetry")]
    #[test]
    fn an_operation_is_the_scanners_first_word() {
        let long = format!("SELECT {}", "x, ".repeat(2_000));
        for sql in [
            "SELECT id FROM books",
            "select\tid",
            "INSERT INTO t VALUES (1)",
            "  SELECT 1",
            "-- note\nUPDATE t SET a = 1",
            "/* c */ DELETE FROM t",
            "E'x' SELECT",
            "BEGIN",
            "COMMIT;",
            "_x.y$z(1)",
            "WITH a AS (SELECT 1) SELECT * FROM a",
            "1 + 1",
            "",
            long.as_str(),
        ] {
            let mut words = Words {
                rest: sql,
                truncated: false,
            };
            let scanned = if sql.len() > SUMMARY_SCAN_BYTES {
                Some("SELECT")
            } else {
                words.next_word()
            };
            assert_eq!(operation(sql), scanned, "{sql:?}");
        }
        assert_eq!(operation("SELECT"), Some("SELECT"));
        assert_eq!(operation("select 1"), Some("select"));
    }

    #[test]
    fn a_summary_is_the_operation_and_its_table() {
        for (sql, expected) in [
            ("SELECT * FROM books WHERE id = ?", "SELECT books"),
            ("select title from main.books", "SELECT main.books"),
            ("INSERT INTO books (id) VALUES (1)", "INSERT books"),
            (
                "insert or replace into \"books\" values (?)",
                "INSERT \"books\"",
            ),
            ("UPDATE books SET year = 1 WHERE id = 2", "UPDATE books"),
            ("UPDATE OR ROLLBACK books SET year = 1", "UPDATE books"),
            ("DELETE FROM books", "DELETE books"),
            (
                "CREATE TABLE IF NOT EXISTS books (id INTEGER)",
                "CREATE TABLE books",
            ),
            ("DROP INDEX books_by_year", "DROP INDEX books_by_year"),
            ("  -- a comment\n SELECT 1", "SELECT"),
            ("/* hint */ SELECT count(*) FROM t", "SELECT t"),
            ("WITH x AS (SELECT 1) SELECT * FROM x", "WITH x"),
            ("BEGIN", "BEGIN"),
            ("BATCH of 3 statements", "BATCH"),
            ("pragma table_info(books)", "PRAGMA"),
            ("", ""),
            ("   ", ""),
        ] {
            assert_eq!(summary(sql), expected, "{sql}");
        }
    }

    /// A literal written into the statement never reaches the summary.
    #[test]
    fn a_summary_never_holds_a_literal() {
        assert_eq!(
            summary("SELECT 'secret' FROM 'quoted table' JOIN t"),
            "SELECT"
        );
        assert_eq!(summary("SELECT * FROM (SELECT 1) AS sub"), "SELECT");
        assert_eq!(summary("SELECT 'it''s' , 42 FROM t"), "SELECT t");
        assert_eq!(summary("DELETE FROM t WHERE x = 'FROM u'"), "DELETE t");
        // PostgreSQL's dollar-quoted and escaped strings are literals too.
        assert_eq!(summary("SELECT $$x FROM hunter2$$"), "SELECT");
        assert_eq!(
            summary("SELECT $tag$ $$ FROM hunter2 $tag$ FROM t"),
            "SELECT t"
        );
        assert_eq!(summary("SELECT $$never closes FROM hunter2"), "SELECT");
        assert_eq!(summary(r"SELECT E'it\'s FROM hunter2' FROM t"), "SELECT t");
        assert_eq!(summary("SELECT * FROM t WHERE id = $1"), "SELECT t");
        // A double-quoted word is one identifier (SQLite reads an unknown one as a string).
        assert_eq!(summary("SELECT \"hunter2 FROM x\" FROM t"), "SELECT t");
        assert_eq!(summary("SELECT * FROM \"my table\""), "SELECT");
        assert_eq!(summary("SELECT * FROM [books]"), "SELECT [books]");
        assert_eq!(summary("SELECT \"never closes FROM x"), "SELECT");
    }

    /// The summary reads at most the statement's first 4 KiB, and a word cut there is dropped.
    #[test]
    fn a_summary_is_bounded() {
        let long = format!("SELECT {} FROM far_away", "a, ".repeat(10_000));
        assert_eq!(summary(&long), "SELECT");
        let cut = format!("SELECT {}x FROM t", " ".repeat(SUMMARY_SCAN_BYTES - 8));
        assert_eq!(summary(&cut), "SELECT");
        let multibyte = "é".repeat(5_000);
        assert_eq!(summary(&multibyte), "");
    }

    #[test]
    fn error_types_are_few() {
        assert_eq!(error_type(&ErrorKind::Cancelled), "cancelled");
        assert_eq!(
            error_type(&ErrorKind::Timeout {
                after: Duration::from_secs(1)
            }),
            "timeout"
        );
        assert_eq!(
            error_type(&ErrorKind::Http {
                status: 502,
                code: None,
                message: String::new(),
            }),
            "502"
        );
    }
}
