//! The request and response bodies of protocol v1 as typed serde definitions, each with its
//! OpenAPI schema name and its members ([`Schema`]), and the member names as constants
//! ([`member`]).
//!
//! The hot paths keep their hand-written code: the server decodes `/api/v1/sql` bodies with its
//! own validating reader and writes results cell by cell; the SDK reads the success envelope
//! incrementally. Those read and write the member names in [`member`], and their tests hold what
//! they write and read to these types. Elsewhere (transaction bodies, error bodies, tests, other
//! clients) these types are the bodies.
//!
//! String and parameter types are generic where a side borrows what it sends (`SqlRequest<&str,
//! &[Value]>`) and owns what it reads (`SqlRequest`, the defaults). A member that is absent or
//! `null` reads as its default, as the server reads it.

use serde::{Deserialize, Deserializer, Serialize};
use serde_json::Value;

use crate::{Bookmark, Isolation};

/// The member names of the protocol's bodies.
pub mod member {
    /// A statement's SQL text.
    pub const SQL: &str = "sql";
    /// A statement's positional parameters.
    pub const PARAMS: &str = "params";
    /// A read the server verifies (on a statement, a batch or a transaction).
    pub const READ_ONLY: &str = "read_only";
    /// A batch's statements.
    pub const STATEMENTS: &str = "statements";
    /// A batch's foreign-key mode.
    pub const FOREIGN_KEYS: &str = "foreign_keys";
    /// A batch's or a transaction's isolation level.
    pub const ISOLATION: &str = "isolation";
    /// A read-only serializable transaction that waits for a safe snapshot.
    pub const DEFERRABLE: &str = "deferrable";
    /// A transaction's token.
    pub const TRANSACTION: &str = "transaction";
    /// A transaction statement's number, from 1.
    pub const SEQ: &str = "seq";
    /// The table `describe` asks about.
    pub const TABLE: &str = "table";
    /// A result's columns.
    pub const COLUMNS: &str = "columns";
    /// A result's rows.
    pub const ROWS: &str = "rows";
    /// A result's count of changed rows.
    pub const ROWS_AFFECTED: &str = "rows_affected";
    /// A result's last inserted rowid.
    pub const LAST_INSERT_ID: &str = "last_insert_id";
    /// A streamed write's bookmark, after the result's other members and before [`STATS`].
    pub const BOOKMARK: &str = "bookmark";
    /// What a success cost the server ([`Stats`](super::Stats)), its body's last member.
    pub const STATS: &str = "stats";
    /// The engine's time for the statement(s), in milliseconds (a [`STATS`] member).
    pub const DURATION_MS: &str = "duration_ms";
    /// Rows the engine read (a [`STATS`] member, where the engine knows it).
    pub const ROWS_READ: &str = "rows_read";
    /// Rows the statement(s) wrote (a [`STATS`] member).
    pub const ROWS_WRITTEN: &str = "rows_written";
    /// Which node served the answer, `primary` or `replica` (a [`STATS`] member).
    pub const SERVED_BY: &str = "served_by";
    /// An error body's error, or the error a streamed body ends with.
    pub const ERROR: &str = "error";
    /// A batch's results.
    pub const RESULTS: &str = "results";
    /// A column's name.
    pub const NAME: &str = "name";
    /// A column's declared type.
    pub const TYPE: &str = "type";
    /// An error's code.
    pub const CODE: &str = "code";
    /// An error's message.
    pub const MESSAGE: &str = "message";
    /// The constraint a `CONSTRAINT_VIOLATION` names.
    pub const CONSTRAINT: &str = "constraint";
    /// The batch statement an error belongs to.
    pub const STATEMENT: &str = "statement";
    /// How a transaction ended.
    pub const OUTCOME: &str = "outcome";
    /// A transaction's idle bound, in milliseconds.
    pub const IDLE_TIMEOUT_MS: &str = "idle_timeout_ms";
    /// A transaction's lifetime bound, in milliseconds.
    pub const MAX_LIFETIME_MS: &str = "max_lifetime_ms";
    /// A blob value's only member.
    pub const BASE64: &str = "base64";
    /// Whether a described statement may write.
    pub const MAY_WRITE: &str = "may_write";
    /// Whether a described column may hold NULL (`null`: not known).
    pub const NULLABLE: &str = "nullable";
}

use member as m;

/// A body's place in `docs/openapi.yaml`: its schema's name, its members and the required ones.
pub trait Schema {
    /// The schema's name under `components/schemas`.
    const NAME: &'static str;
    /// Every member, in the order the body writes them.
    const MEMBERS: &'static [&'static str];
    /// The members a valid body always has.
    const REQUIRED: &'static [&'static str];
}

fn null_is_default<'de, D: Deserializer<'de>, T: Default + Deserialize<'de>>(
    deserializer: D,
) -> Result<T, D::Error> {
    Option::<T>::deserialize(deserializer).map(Option::unwrap_or_default)
}

#[allow(
    clippy::trivially_copy_pass_by_ref,
    reason = "serde's skip_serializing_if hands a reference"
)]
fn is_false(value: &bool) -> bool {
    !*value
}

/// `POST /api/v1/sql`: one statement. `params` absent (or `null`) means none; `read_only`
/// absent means `false`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(bound(deserialize = "S: Deserialize<'de>, P: Deserialize<'de>"))]
pub struct SqlRequest<S = String, P = Vec<Value>> {
    /// Exactly one statement, passed to the engine verbatim.
    pub sql: S,
    /// Positional values (JSON scalars, or a blob `{"base64": "..."}`), bound in order.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub params: Option<P>,
    /// A read the server verifies: a statement that may write is refused (`403 READ_ONLY`).
    #[serde(
        default,
        skip_serializing_if = "is_false",
        deserialize_with = "null_is_default"
    )]
    pub read_only: bool,
}

impl<S, P> Schema for SqlRequest<S, P> {
    const NAME: &'static str = "SqlRequest";
    const MEMBERS: &'static [&'static str] = &[m::SQL, m::PARAMS, m::READ_ONLY];
    const REQUIRED: &'static [&'static str] = &[m::SQL];
}

/// How a write batch's foreign keys are enforced (`foreign_keys`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ForeignKeys {
    /// As declared, statement by statement (`enforced`, the default).
    #[default]
    Enforced,
    /// On SQLite, off while the statements run and every key checked once before the batch
    /// commits (`checked_at_commit`). Refused on PostgreSQL.
    CheckedAtCommit,
}

impl ForeignKeys {
    /// Both modes.
    pub const ALL: [ForeignKeys; 2] = [ForeignKeys::Enforced, ForeignKeys::CheckedAtCommit];

    /// The protocol's name.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            ForeignKeys::Enforced => "enforced",
            ForeignKeys::CheckedAtCommit => "checked_at_commit",
        }
    }

    /// The mode of a protocol name; `None` for another name.
    #[must_use]
    pub fn from_name(name: &str) -> Option<ForeignKeys> {
        ForeignKeys::ALL
            .into_iter()
            .find(|mode| mode.as_str() == name)
    }
}

/// `POST /api/v1/batch`: statements run in order in one transaction. Each statement is a
/// [`SqlRequest`] without `read_only`, which belongs to the batch.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct BatchRequest<St = SqlRequest> {
    /// At least one statement, at most the server's limit.
    pub statements: Vec<St>,
    /// A read-only batch: one snapshot, a statement that may write is refused.
    #[serde(default, deserialize_with = "null_is_default")]
    pub read_only: bool,
    /// How foreign keys are enforced; absent is [`ForeignKeys::Enforced`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub foreign_keys: Option<ForeignKeys>,
    /// The isolation asked for; absent is the engine's default for a batch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub isolation: Option<Isolation>,
}

impl<St> Schema for BatchRequest<St> {
    const NAME: &'static str = "BatchRequest";
    const MEMBERS: &'static [&'static str] =
        &[m::STATEMENTS, m::READ_ONLY, m::FOREIGN_KEYS, m::ISOLATION];
    const REQUIRED: &'static [&'static str] = &[m::STATEMENTS];
}

/// `POST /api/v1/batch`'s success: one result a statement, in order (each with its own
/// `stats`), then the whole batch's [`Stats`].
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct BatchResponse<R = QueryResult> {
    /// The statements' results.
    pub results: Vec<R>,
    /// What the whole batch cost (its statements, its BEGIN and COMMIT); absent from a server
    /// that does not say.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stats: Option<Stats>,
}

impl<R> Schema for BatchResponse<R> {
    const NAME: &'static str = "BatchResponse";
    const MEMBERS: &'static [&'static str] = &[m::RESULTS, m::STATS];
    const REQUIRED: &'static [&'static str] = &[m::RESULTS];
}

/// Which node served an answer (the `served_by` of [`Stats`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ServedBy {
    /// The primary (on SQLite, always).
    Primary,
    /// A read replica.
    Replica,
    /// A value from a later protocol version, which this reader does not know.
    #[serde(other)]
    Other,
}

impl ServedBy {
    /// The protocol's name; [`ServedBy::Other`] is `other`, which no server sends.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            ServedBy::Primary => "primary",
            ServedBy::Replica => "replica",
            ServedBy::Other => "other",
        }
    }
}

/// What a success cost the server: the last member (`stats`) of every success body of a
/// statement, a batch's statement and a whole batch, a transaction's statement and its commit.
///
/// Every member is optional to a reader: a body without `stats`, or `stats` with members missing
/// or members it does not know, is read (what is missing is `None`). sqlhttpd always sends
/// `duration_ms`, `rows_written` and `served_by`, and `rows_read` where its engine counts it.
/// A keyed write answered from the idempotency store carries its first execution's stats.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct Stats {
    /// The engine's time for the statement(s) in milliseconds, with microsecond precision,
    /// excluding the wait for the engine's turn.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_ms: Option<f64>,
    /// Rows the engine read to answer, where it knows: on SQLite the rows its virtual machine
    /// stepped through (full scans, sorts, index steps), on PostgreSQL the rows returned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rows_read: Option<u64>,
    /// Rows the statement(s) inserted, updated or deleted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rows_written: Option<u64>,
    /// Which node served the answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub served_by: Option<ServedBy>,
}

impl Schema for Stats {
    const NAME: &'static str = "Stats";
    const MEMBERS: &'static [&'static str] =
        &[m::DURATION_MS, m::ROWS_READ, m::ROWS_WRITTEN, m::SERVED_BY];
    const REQUIRED: &'static [&'static str] = &[];
}

/// `POST /api/v1/describe`: `{}` lists the tables and views, `{"table": NAME}` one's columns.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(bound(deserialize = "S: Deserialize<'de>"))]
pub struct DescribeRequest<S = String> {
    /// The table to describe.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub table: Option<S>,
}

impl<S> Schema for DescribeRequest<S> {
    const NAME: &'static str = "DescribeRequest";
    const MEMBERS: &'static [&'static str] = &[m::TABLE];
    const REQUIRED: &'static [&'static str] = &[];
}

/// `POST /api/v1/describe/statement`: one statement to describe without running it.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, bound(deserialize = "S: Deserialize<'de>"))]
pub struct DescribeStatementRequest<S = String> {
    /// The statement's SQL text, as `/api/v1/sql` takes it (`?` placeholders on both engines).
    pub sql: S,
}

impl<S> Schema for DescribeStatementRequest<S> {
    const NAME: &'static str = "DescribeStatementRequest";
    const MEMBERS: &'static [&'static str] = &[m::SQL];
    const REQUIRED: &'static [&'static str] = &[m::SQL];
}

/// The answer to `POST /api/v1/describe/statement`: what the statement takes and gives, found
/// by preparing it, nothing run.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct StatementDescription {
    /// Its parameters, in order (`?1` first).
    pub params: Vec<ParamDescription>,
    /// Its result columns, in order (none for a statement without rows).
    pub columns: Vec<ColumnDescription>,
    /// Whether it may write (SQLite's `sqlite3_stmt_readonly`; on PostgreSQL, any statement
    /// but a plain `SELECT`, `VALUES`, `TABLE`, `SHOW` or `EXPLAIN` without `ANALYZE`).
    pub may_write: bool,
}

impl Schema for StatementDescription {
    const NAME: &'static str = "StatementDescription";
    const MEMBERS: &'static [&'static str] = &[m::PARAMS, m::COLUMNS, m::MAY_WRITE];
    const REQUIRED: &'static [&'static str] = &[m::PARAMS, m::COLUMNS, m::MAY_WRITE];
}

/// One parameter of a described statement.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ParamDescription {
    /// Its type as the engine inferred it (PostgreSQL's name, `int4`); `null` where the engine
    /// does not know (always on SQLite).
    #[serde(rename = "type")]
    pub type_name: Option<String>,
}

impl Schema for ParamDescription {
    const NAME: &'static str = "ParamDescription";
    const MEMBERS: &'static [&'static str] = &[m::TYPE];
    const REQUIRED: &'static [&'static str] = &[m::TYPE];
}

/// One result column of a described statement.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ColumnDescription {
    /// Its name.
    pub name: String,
    /// Its type: PostgreSQL's name (`int8`, `text`); on SQLite the declared type of the table
    /// column it comes from, `null` for an expression.
    #[serde(rename = "type")]
    pub type_name: Option<String>,
    /// `false` for a column read straight from a `NOT NULL` table column, outside any outer
    /// join or compound select; `null` (not known) otherwise. Never `true`.
    pub nullable: Option<bool>,
}

impl Schema for ColumnDescription {
    const NAME: &'static str = "ColumnDescription";
    const MEMBERS: &'static [&'static str] = &[m::NAME, m::TYPE, m::NULLABLE];
    const REQUIRED: &'static [&'static str] = &[m::NAME, m::TYPE, m::NULLABLE];
}

/// One column of a result.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Column {
    /// Its name.
    pub name: String,
    /// Its declared type; empty for an expression.
    #[serde(rename = "type")]
    pub type_name: String,
}

impl Schema for Column {
    const NAME: &'static str = "Column";
    const MEMBERS: &'static [&'static str] = &[m::NAME, m::TYPE];
    const REQUIRED: &'static [&'static str] = &[m::NAME, m::TYPE];
}

/// A statement's success body, its members in exactly this order. `last_insert_id` is `null`
/// when the statement inserted no row (always on PostgreSQL); `bookmark` comes after it in a
/// write's streamed body on PostgreSQL (its headers went out before it committed); `stats` is
/// the last member.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QueryResult<R = Vec<Value>> {
    /// The columns.
    pub columns: Vec<Column>,
    /// The rows, each one value a column.
    pub rows: Vec<R>,
    /// Rows the statement changed.
    pub rows_affected: u64,
    /// The rowid of the last row it inserted.
    pub last_insert_id: Option<i64>,
    /// The position a streamed write committed at.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bookmark: Option<Bookmark>,
    /// What the statement cost; absent from a server that does not say.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stats: Option<Stats>,
}

impl<R> Schema for QueryResult<R> {
    const NAME: &'static str = "QueryResult";
    const MEMBERS: &'static [&'static str] = &[
        m::COLUMNS,
        m::ROWS,
        m::ROWS_AFFECTED,
        m::LAST_INSERT_ID,
        m::BOOKMARK,
        m::STATS,
    ];
    const REQUIRED: &'static [&'static str] =
        &[m::COLUMNS, m::ROWS, m::ROWS_AFFECTED, m::LAST_INSERT_ID];
}

/// A streamed success body that failed after its status was sent: whole rows, then `error`
/// instead of `rows_affected` and `last_insert_id`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StreamedFailure<R = Vec<Value>> {
    /// The columns.
    pub columns: Vec<Column>,
    /// The rows sent before the failure.
    pub rows: Vec<R>,
    /// The failure.
    pub error: ErrorObject,
}

impl<R> Schema for StreamedFailure<R> {
    const NAME: &'static str = "StreamedFailure";
    const MEMBERS: &'static [&'static str] = &[m::COLUMNS, m::ROWS, m::ERROR];
    const REQUIRED: &'static [&'static str] = &[m::COLUMNS, m::ROWS, m::ERROR];
}

/// Every error response's body: `{"error": {...}}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody<S = String> {
    /// The error.
    pub error: ErrorObject<S>,
}

impl<S> Schema for ErrorBody<S> {
    const NAME: &'static str = "ErrorBody";
    const MEMBERS: &'static [&'static str] = &[m::ERROR];
    const REQUIRED: &'static [&'static str] = &[m::ERROR];
}

/// An error: its [`ErrorCode`](crate::ErrorCode)'s text and a message for humans (never to be
/// parsed). Clients ignore members they do not know.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(bound(deserialize = "S: Deserialize<'de>"))]
pub struct ErrorObject<S = String> {
    /// The code ([`ErrorCode::as_str`](crate::ErrorCode::as_str)).
    pub code: S,
    /// What went wrong.
    pub message: S,
    /// On `CONSTRAINT_VIOLATION`: the [`Constraint`](crate::Constraint)'s name, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub constraint: Option<S>,
    /// In a batch: the zero-based index of the statement the error belongs to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub statement: Option<usize>,
}

impl<S> Schema for ErrorObject<S> {
    const NAME: &'static str = "ErrorObject";
    const MEMBERS: &'static [&'static str] = &[m::CODE, m::MESSAGE, m::CONSTRAINT, m::STATEMENT];
    const REQUIRED: &'static [&'static str] = &[m::CODE, m::MESSAGE];
}

/// `POST /api/v1/transaction/open`: how the transaction opens; every member optional.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct TransactionOpenRequest {
    /// Only statements that cannot write run in it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_only: Option<bool>,
    /// Its isolation level; absent is [`Isolation::Serializable`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub isolation: Option<Isolation>,
    /// For a read-only serializable transaction: wait for a snapshot that cannot fail.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deferrable: Option<bool>,
}

impl Schema for TransactionOpenRequest {
    const NAME: &'static str = "TransactionOpenRequest";
    const MEMBERS: &'static [&'static str] = &[m::READ_ONLY, m::ISOLATION, m::DEFERRABLE];
    const REQUIRED: &'static [&'static str] = &[];
}

/// The open's success: the transaction's token and what it opened as.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TransactionOpened<S = String> {
    /// The token every later step names.
    pub transaction: S,
    /// Whether it may only read.
    pub read_only: bool,
    /// Its isolation level.
    pub isolation: Isolation,
    /// How long it may stay idle before the server rolls it back.
    pub idle_timeout_ms: u64,
    /// How long it may stay open at most.
    pub max_lifetime_ms: u64,
}

impl<S> Schema for TransactionOpened<S> {
    const NAME: &'static str = "TransactionOpened";
    const MEMBERS: &'static [&'static str] = &[
        m::TRANSACTION,
        m::READ_ONLY,
        m::ISOLATION,
        m::IDLE_TIMEOUT_MS,
        m::MAX_LIFETIME_MS,
    ];
    const REQUIRED: &'static [&'static str] = Self::MEMBERS;
}

/// `POST /api/v1/transaction/statement`: a [`SqlRequest`] with the transaction and the
/// statement's number (from 1) in it, all members side by side.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(bound(deserialize = "S: Deserialize<'de>, P: Deserialize<'de>"))]
pub struct TransactionStatementRequest<S = String, P = Vec<Value>> {
    /// The statement (`sql`, `params`, `read_only`).
    #[serde(flatten)]
    pub statement: SqlRequest<S, P>,
    /// The transaction's token.
    pub transaction: S,
    /// The statement's number in the transaction, from 1.
    pub seq: u64,
}

impl<S, P> Schema for TransactionStatementRequest<S, P> {
    const NAME: &'static str = "TransactionStatementRequest";
    const MEMBERS: &'static [&'static str] =
        &[m::SQL, m::PARAMS, m::READ_ONLY, m::TRANSACTION, m::SEQ];
    const REQUIRED: &'static [&'static str] = &[m::SQL, m::TRANSACTION, m::SEQ];
}

/// `POST /api/v1/transaction/{commit,rollback,outcome}`: the transaction.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct TransactionNamed<S = String> {
    /// The transaction's token.
    pub transaction: S,
}

impl<S> Schema for TransactionNamed<S> {
    const NAME: &'static str = "TransactionNamed";
    const MEMBERS: &'static [&'static str] = &[m::TRANSACTION];
    const REQUIRED: &'static [&'static str] = &[m::TRANSACTION];
}

/// How a transaction ended, as `POST /api/v1/transaction/outcome` answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// Still open.
    Open,
    /// Committed.
    Committed,
    /// Rolled back by its client.
    RolledBack,
    /// Rolled back by the server (idle, too old).
    Expired,
    /// Could not go on and was rolled back.
    Aborted,
    /// The server does not know it (never opened here, or forgotten); also what a reader
    /// takes an outcome from a later protocol version for, which it cannot know either.
    #[serde(other)]
    Unknown,
}

impl Outcome {
    /// Every outcome.
    pub const ALL: [Outcome; 6] = [
        Outcome::Open,
        Outcome::Committed,
        Outcome::RolledBack,
        Outcome::Expired,
        Outcome::Aborted,
        Outcome::Unknown,
    ];

    /// The protocol's name.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Outcome::Open => "open",
            Outcome::Committed => "committed",
            Outcome::RolledBack => "rolled_back",
            Outcome::Expired => "expired",
            Outcome::Aborted => "aborted",
            Outcome::Unknown => "unknown",
        }
    }
}

/// The success of `POST /api/v1/transaction/{commit,rollback,outcome}`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct TransactionOutcome {
    /// How it ended.
    pub outcome: Outcome,
    /// On a commit's answer: what the COMMIT cost (`rows_written` absent: the statements' own
    /// stats counted them). Absent on the others.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stats: Option<Stats>,
}

impl Schema for TransactionOutcome {
    const NAME: &'static str = "TransactionOutcome";
    const MEMBERS: &'static [&'static str] = &[m::OUTCOME, m::STATS];
    const REQUIRED: &'static [&'static str] = &[m::OUTCOME];
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The members a value serializes with, in order.
    fn keys<T: Serialize>(value: &T) -> Vec<String> {
        let text = serde_json::to_string(value).unwrap();
        let mut keys = Vec::new();
        let mut de = serde_json::Deserializer::from_str(&text);
        let map: serde_json::Map<String, Value> = Deserialize::deserialize(&mut de).unwrap();
        // serde_json's map keeps insertion order only with `preserve_order`; read the text.
        let mut at = 0;
        while let Some(found) = text[at..].find("\":") {
            let end = at + found;
            let start = text[..end].rfind('"').unwrap() + 1;
            let key = &text[start..end];
            if map.contains_key(key) && !keys.iter().any(|k| k == key) {
                keys.push(key.to_owned());
            }
            at = end + 2;
        }
        keys
    }

    fn assert_members<T: Serialize + Schema>(full: &T) {
        assert_eq!(keys(full), T::MEMBERS, "{}", T::NAME);
    }

    /// An outcome from a later version reads as `unknown` (its reader cannot know it), so a
    /// client asking how its COMMIT ended asks again rather than failing to read the answer.
    #[test]
    fn an_outcome_a_reader_does_not_know_is_unknown() {
        let read: TransactionOutcome =
            serde_json::from_str(r#"{"outcome":"handed_over"}"#).unwrap();
        assert_eq!(read.outcome, Outcome::Unknown);
        for outcome in Outcome::ALL {
            let text = serde_json::to_string(&outcome).unwrap();
            assert_eq!(text, format!("\"{}\"", outcome.as_str()));
            assert_eq!(serde_json::from_str::<Outcome>(&text).unwrap(), outcome);
        }
    }

    #[test]
    fn the_types_write_the_members_their_schemas_name() {
        assert_members(&SqlRequest {
            sql: "SELECT ?",
            params: Some(vec![Value::from(1)]),
            read_only: true,
        });
        assert_members(&BatchRequest {
            statements: vec![SqlRequest::<String>::default()],
            read_only: false,
            foreign_keys: Some(ForeignKeys::CheckedAtCommit),
            isolation: Some(Isolation::Serializable),
        });
        assert_members(&BatchResponse::<QueryResult> {
            results: vec![],
            stats: Some(Stats::full()),
        });
        assert_members(&Stats::full());
        assert_members(&DescribeRequest {
            table: Some("t".to_owned()),
        });
        assert_members(&Column::default());
        assert_members(&DescribeStatementRequest { sql: "SELECT ?" });
        assert_members(&StatementDescription::default());
        assert_members(&ParamDescription::default());
        assert_members(&ColumnDescription::default());
        assert_members(&QueryResult::<Vec<Value>> {
            bookmark: Some(Bookmark::from_position(1)),
            stats: Some(Stats::full()),
            ..QueryResult::default()
        });
        let error = ErrorObject {
            code: "CONSTRAINT_VIOLATION".to_owned(),
            message: "m".to_owned(),
            constraint: Some("unique".to_owned()),
            statement: Some(1),
        };
        assert_members(&error);
        assert_members(&StreamedFailure::<Vec<Value>> {
            columns: vec![],
            rows: vec![],
            error: error.clone(),
        });
        assert_members(&ErrorBody { error });
        assert_members(&TransactionOpenRequest {
            read_only: Some(true),
            isolation: Some(Isolation::Serializable),
            deferrable: Some(true),
        });
        assert_members(&TransactionOpened {
            transaction: "t",
            read_only: false,
            isolation: Isolation::ReadCommitted,
            idle_timeout_ms: 1,
            max_lifetime_ms: 2,
        });
        assert_members(&TransactionStatementRequest {
            statement: SqlRequest {
                sql: "SELECT 1",
                params: Some(vec![Value::Null]),
                read_only: true,
            },
            transaction: "t",
            seq: 1,
        });
        let read: TransactionStatementRequest = serde_json::from_str(
            r#"{"transaction":"t.1","seq":2,"sql":"SELECT ?","params":[1],"read_only":null}"#,
        )
        .unwrap();
        assert_eq!((read.transaction.as_str(), read.seq), ("t.1", 2));
        assert_eq!(read.statement.params, Some(vec![Value::from(1)]));
        assert_members(&TransactionNamed { transaction: "t" });
        assert_members(&TransactionOutcome {
            outcome: Outcome::Committed,
            stats: Some(Stats::full()),
        });
    }

    #[test]
    fn absent_and_null_members_read_as_their_defaults() {
        let body: SqlRequest =
            serde_json::from_str(r#"{"sql":"SELECT 1","params":null,"read_only":null}"#).unwrap();
        assert_eq!(body, SqlRequest::default_for("SELECT 1"));
        let body: SqlRequest = serde_json::from_str(r#"{"sql":"SELECT 1"}"#).unwrap();
        assert_eq!(body, SqlRequest::default_for("SELECT 1"));
        // What the SDK sends for a read, borrowed.
        let sent = serde_json::to_string(&SqlRequest::<&str, &[Value]> {
            sql: "SELECT ?",
            params: Some(&[Value::from(7)]),
            read_only: true,
        })
        .unwrap();
        assert_eq!(sent, r#"{"sql":"SELECT ?","params":[7],"read_only":true}"#);
        for outcome in Outcome::ALL {
            let json = serde_json::to_string(&outcome).unwrap();
            assert_eq!(json, format!("\"{}\"", outcome.as_str()));
        }
        for mode in ForeignKeys::ALL {
            assert_eq!(ForeignKeys::from_name(mode.as_str()), Some(mode));
            let json = serde_json::to_string(&mode).unwrap();
            assert_eq!(json, format!("\"{}\"", mode.as_str()));
        }
    }

    impl Stats {
        fn full() -> Stats {
            Stats {
                duration_ms: Some(1.305),
                rows_read: Some(3),
                rows_written: Some(1),
                served_by: Some(ServedBy::Replica),
            }
        }
    }

    /// The wire format readers rely on: `stats` after `bookmark`, last; a body without it, stats
    /// with members missing, unknown members or an unknown `served_by` are all read.
    #[test]
    fn stats_end_the_body_and_readers_take_any_subset() {
        let result = QueryResult::<Vec<Value>> {
            bookmark: Some(Bookmark::from_position(7)),
            stats: Some(Stats::full()),
            ..QueryResult::default()
        };
        assert_eq!(
            serde_json::to_string(&result).unwrap(),
            r#"{"columns":[],"rows":[],"rows_affected":0,"last_insert_id":null,"bookmark":"0000000000000007","stats":{"duration_ms":1.305,"rows_read":3,"rows_written":1,"served_by":"replica"}}"#
        );
        let bare: QueryResult = serde_json::from_str(
            r#"{"columns":[],"rows":[],"rows_affected":0,"last_insert_id":null}"#,
        )
        .unwrap();
        assert_eq!(bare.stats, None);
        let partial: QueryResult = serde_json::from_str(
            r#"{"columns":[],"rows":[],"rows_affected":0,"last_insert_id":null,"stats":{"duration_ms":0.5,"served_by":"edge","cpu_ms":1}}"#,
        )
        .unwrap();
        assert_eq!(
            partial.stats,
            Some(Stats {
                duration_ms: Some(0.5),
                served_by: Some(ServedBy::Other),
                ..Stats::default()
            })
        );
        let batch: BatchResponse = serde_json::from_str(
            r#"{"results":[{"columns":[],"rows":[],"rows_affected":1,"last_insert_id":1,"stats":{}}],"stats":{"rows_written":1}}"#,
        )
        .unwrap();
        assert_eq!(batch.results[0].stats, Some(Stats::default()));
        assert_eq!(batch.stats.unwrap().rows_written, Some(1));
        let outcome: TransactionOutcome =
            serde_json::from_str(r#"{"outcome":"committed"}"#).unwrap();
        assert_eq!(outcome.stats, None);
        for served_by in [ServedBy::Primary, ServedBy::Replica] {
            let text = serde_json::to_string(&served_by).unwrap();
            assert_eq!(text, format!("\"{}\"", served_by.as_str()));
        }
    }

    impl SqlRequest {
        fn default_for(sql: &str) -> Self {
            SqlRequest {
                sql: sql.to_owned(),
                params: None,
                read_only: false,
            }
        }
    }
}
