//! Atomic batches: [`Batch`], several statements sent in one request (`POST /api/v1/batch`) that the
//! server runs in order in one transaction, committed only if all succeed; and the batch wire form
//! shared with an [`atomic`](crate::Insert::atomic) insert (encoding, limits, the `results` envelope).
//!
//! This module knows the batch request and response bodies and the call's class (a write batch is a
//! write, a read-only batch a read); the retry rules are the transport's, per-call settings come from
//! `options`, and statements are encoded as `statement` encodes them.

use std::fmt;
use std::future::IntoFuture;

use bytes::Bytes;
use http::HeaderValue;
use serde::Serialize;
use sqlhttp_protocol::body::{ForeignKeys, member};

use crate::client::Client;
use crate::error::{Error, ErrorKind, Result};
use crate::options::{CallOptions, call_settings, read_settings, retry_setting, write_settings};
use crate::retry::classify::OpClass;
use crate::statement::{RequestBody, ResponseFuture, Statement};
use crate::stats::{ServerStats, Stats};
use crate::table::Table;
use crate::transaction::Isolation;
use crate::transport::{Call, Endpoint};

/// How large a batch the client sends (see `ClientBuilder::batch_max_statements` and
/// `ClientBuilder::batch_max_bytes`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BatchLimits {
    pub(crate) max_statements: usize,
    pub(crate) max_body_bytes: usize,
}

impl Default for BatchLimits {
    /// The reference server's defaults.
    fn default() -> Self {
        Self {
            max_statements: sqlhttp_protocol::defaults::MAX_BATCH_STATEMENTS,
            max_body_bytes: sqlhttp_protocol::defaults::MAX_BATCH_BYTES,
        }
    }
}

/// Checks a batch against the limits; `Err` says which one it is over.
pub(crate) fn check_limits(
    statements: usize,
    body_bytes: usize,
    limits: BatchLimits,
) -> std::result::Result<(), String> {
    if statements > limits.max_statements {
        return Err(format!(
            "{statements} statements are over the batch limit of {} \
             (ClientBuilder::batch_max_statements)",
            limits.max_statements
        ));
    }
    if body_bytes > limits.max_body_bytes {
        return Err(format!(
            "a {body_bytes}-byte request is over the batch limit of {} bytes \
             (ClientBuilder::batch_max_bytes)",
            limits.max_body_bytes
        ));
    }
    Ok(())
}

/// `{"statements":[<body>,...],"read_only":<bool>}`, each body a `POST /api/v1/sql` request body.
pub(crate) fn encode(bodies: &[Bytes], read_only: bool) -> Bytes {
    encode_with(bodies, read_only, false, None)
}

/// [`encode`], with `"foreign_keys":"checked_at_commit"` when `keys_at_commit`, and the
/// `"isolation"` asked for.
fn encode_with(
    bodies: &[Bytes],
    read_only: bool,
    keys_at_commit: bool,
    isolation: Option<Isolation>,
) -> Bytes {
    // Written by hand around the statements' bodies, already encoded, with the protocol's member
    // names (`sqlhttp_protocol::body::BatchRequest` is the type a test reads it back as).
    fn key(out: &mut Vec<u8>, name: &str) {
        out.push(b'"');
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(b"\":");
    }
    fn text(out: &mut Vec<u8>, value: &str) {
        out.push(b'"');
        out.extend_from_slice(value.as_bytes());
        out.push(b'"');
    }
    let size = bodies.iter().map(|b| b.len() + 1).sum::<usize>() + 96;
    let mut out = Vec::with_capacity(size);
    out.push(b'{');
    key(&mut out, member::STATEMENTS);
    out.push(b'[');
    for (index, body) in bodies.iter().enumerate() {
        if index > 0 {
            out.push(b',');
        }
        out.extend_from_slice(body);
    }
    out.extend_from_slice(b"],");
    key(&mut out, member::READ_ONLY);
    out.extend_from_slice(if read_only { b"true" } else { b"false" });
    if keys_at_commit {
        out.push(b',');
        key(&mut out, member::FOREIGN_KEYS);
        text(&mut out, ForeignKeys::CheckedAtCommit.as_str());
    }
    if let Some(isolation) = isolation {
        out.push(b',');
        key(&mut out, member::ISOLATION);
        text(&mut out, isolation.as_str());
    }
    out.push(b'}');
    Bytes::from(out)
}

/// Decodes `{"results": [...]}` into one table per statement; a count other than `expected` is a
/// decode failure (the server did not run what was sent).
pub(crate) fn decode_results(
    body: &[u8],
    expected: usize,
) -> Result<(Vec<Table>, Option<ServerStats>)> {
    /// The batch's answer, its `stats` read leniently (`ServerStats::read`).
    #[derive(serde::Deserialize)]
    struct Answer<'a> {
        #[serde(borrow)]
        results: Vec<&'a serde_json::value::RawValue>,
        #[serde(default, borrow)]
        stats: Option<&'a serde_json::value::RawValue>,
    }
    let Answer { results, stats } =
        serde_json::from_slice::<Answer<'_>>(body).map_err(Error::decode)?;
    let stats = stats.and_then(|raw| ServerStats::read(raw.get()));
    if results.len() != expected {
        return Err(Error::new(ErrorKind::Decode {
            row: None,
            column: None,
            message: format!(
                "the server answered {} results for a batch of {expected} statements",
                results.len()
            ),
        }));
    }
    let tables = results
        .iter()
        .map(|result| crate::wire::decode::table(result.get().as_bytes()))
        .collect::<Result<_>>()?;
    Ok((tables, stats))
}

/// Several statements that the server runs **in order, in one transaction**, committing only if all
/// succeed; made by [`Client::batch`]. Add statements with [`statement`](Self::statement), bind each
/// one's parameters with [`bind`](Self::bind) (it binds to the statement added last), then `.await`
/// it for one [`Table`] per statement, in order; [`Table::rows_as`] decodes a statement's rows into a
/// type of yours, and [`Table::rows_affected`] / [`Table::last_insert_id`] tell what it changed.
///
/// **Classes.** A batch is a **write**: retried only under
/// [`retry_writes`](Self::retry_writes) (or [`ClientBuilder::retry_writes`](crate::ClientBuilder::retry_writes)),
/// with one `Idempotency-Key` (the caller's, from [`idempotency_key`](Self::idempotency_key), or one
/// the SDK makes) on every attempt: a server that honours keys applies it exactly once, whatever the
/// number of attempts. A [`read_only`](Self::read_only) batch is a **read**: it runs on one
/// consistent snapshot, any statement that writes is refused ([`ErrorKind::ReadOnly`], nothing
/// written), and it is retried by default.
///
/// **Failures.** When a statement fails, nothing of the batch is applied, and
/// [`Error::statement_index`] says which statement it was (zero-based). Statements cannot open or end
/// transactions themselves (`BEGIN`, `COMMIT`, `SAVEPOINT`, ... are refused); the batch is the
/// transaction. The server's statement timeout covers the whole batch.
///
/// **Limits.** A batch holds at most [`ClientBuilder::batch_max_statements`](crate::ClientBuilder::batch_max_statements)
/// statements in at most [`ClientBuilder::batch_max_bytes`](crate::ClientBuilder::batch_max_bytes)
/// bytes (100 and 8 MiB by default, the reference server's limits); a larger one fails with
/// [`ErrorKind::PayloadTooLarge`] before anything is sent. An empty batch sends nothing and returns no
/// tables.
///
/// ```no_run
/// # async fn run(client: sqlhttp::Client) -> sqlhttp::Result<()> {
/// use std::time::Duration;
///
/// // Move 25 from account 1 to account 2: both updates, or neither.
/// let results = client
///     .batch()
///     .statement("UPDATE accounts SET balance = balance - ? WHERE id = ?").bind(25).bind(1)
///     .statement("UPDATE accounts SET balance = balance + ? WHERE id = ?").bind(25).bind(2)
///     .statement("SELECT id, balance FROM accounts WHERE id IN (?, ?) ORDER BY id").bind(1).bind(2)
///     .idempotency_key("transfer-2024-06-01-0001")
///     .retry_writes(true)
///     .timeout(Duration::from_secs(5))
///     .await?;
/// let balances: Vec<(i64, i64)> = results[2].rows_as()?;
/// assert_eq!(results[0].rows_affected(), 1);
/// # Ok(())
/// # }
/// ```
///
/// A failing statement names itself:
///
/// ```no_run
/// # async fn run(client: sqlhttp::Client) {
/// let err = client
///     .batch()
///     .statement("INSERT INTO orders (id) VALUES (?)").bind(7)
///     .statement("INSERT INTO order_lines (order_id, sku) VALUES (?, ?)").bind(7).bind("no-such-sku")
///     .await
///     .unwrap_err();
/// if let Some(index) = err.statement_index() {
///     eprintln!("statement {index} failed, nothing was applied: {err}");
/// }
/// # }
/// ```
///
/// # Errors
///
/// [`ErrorKind::InvalidParameter`] (with the statement's index) or [`ErrorKind::PayloadTooLarge`]
/// before anything is sent when a statement cannot be sent; [`ErrorKind::Config`] when a per-call
/// setting cannot work (or a key is set on a read-only batch); otherwise the failure of the call after
/// retries, with [`Error::statement_index`] when a statement failed.
#[derive(Clone)]
#[must_use = "a batch does nothing until it is awaited"]
pub struct Batch {
    client: Client,
    statements: Vec<Statement>,
    read_only: bool,
    keys_at_commit: bool,
    isolation: Option<Isolation>,
    /// `bind` was called before any `statement`.
    stray_bind: bool,
    options: CallOptions,
}

call_settings!(impl[] Batch);
retry_setting!(impl[] Batch);
write_settings!(impl[] Batch);
read_settings!(impl[] Batch);

impl Batch {
    pub(crate) fn new(client: Client) -> Self {
        Self {
            client,
            statements: Vec::new(),
            read_only: false,
            keys_at_commit: false,
            isolation: None,
            stray_bind: false,
            options: CallOptions::default(),
        }
    }

    /// Adds a statement, run after those added before it. Exactly one statement per call (the server
    /// refuses several in one text).
    pub fn statement(mut self, sql: impl Into<String>) -> Self {
        self.statements.push(Statement::new(sql.into()));
        self
    }

    /// Binds the next positional parameter of the statement added last, as
    /// [`Query::bind`](crate::Query::bind) does. Binding before any statement fails the call before it
    /// is sent.
    pub fn bind<T: Serialize>(mut self, value: T) -> Self {
        match self.statements.last_mut() {
            Some(statement) => statement.bind(&value),
            None => self.stray_bind = true,
        }
        self
    }

    /// Makes this a read-only batch: one consistent snapshot, any statement that writes refused
    /// ([`ErrorKind::ReadOnly`]), and the class of a **read** (retried by default, no idempotency key).
    ///
    /// Default: `false` (a write batch).
    pub fn read_only(mut self, read_only: bool) -> Self {
        self.read_only = read_only;
        self
    }

    /// On SQLite, runs the batch with foreign keys off (no `ON DELETE`/`ON UPDATE` actions, no
    /// checks while its statements run) and checks every key once, before it commits: a row
    /// left referring to a missing parent fails the batch with [`ErrorKind::ConstraintViolation`]
    /// and nothing of it is applied. This is what SQLite's table rebuild (create the new table,
    /// copy, drop the old one, rename) needs: with foreign keys on, dropping the old table
    /// deletes its rows first, which fires the actions of the tables that refer to it
    /// (`CASCADE` deletes their rows). PostgreSQL alters tables in place; the server refuses
    /// this there (`400`). Not for a read-only batch.
    ///
    /// ```no_run
    /// # async fn run(client: sqlhttp::Client) -> sqlhttp::Result<()> {
    /// client
    ///     .batch()
    ///     .statement("CREATE TABLE authors_new (id INTEGER PRIMARY KEY, name TEXT NOT NULL)")
    ///     .statement("INSERT INTO authors_new SELECT id, name FROM authors")
    ///     .statement("DROP TABLE authors") // posts REFERENCES authors ON DELETE CASCADE keep their rows
    ///     .statement("ALTER TABLE authors_new RENAME TO authors")
    ///     .foreign_keys_checked_at_commit(true)
    ///     .await?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// Default: `false` (keys checked as each statement runs).
    pub fn foreign_keys_checked_at_commit(mut self, at_commit: bool) -> Self {
        self.keys_at_commit = at_commit;
        self
    }

    /// Runs the batch's transaction at `isolation`. Without it a write batch runs at the
    /// engine's default (`READ COMMITTED` on PostgreSQL) and a read-only one sees one snapshot
    /// (`REPEATABLE READ`); SQLite's transactions are serializable, and the server refuses the
    /// other levels there (`400`). On PostgreSQL a [`Isolation::Serializable`] batch may fail to
    /// serialize against a concurrent transaction: nothing of it is kept, and it is answered as
    /// unavailable, so it is retried under the client's policy when it is a read
    /// ([`read_only`](Self::read_only)) or carries an idempotency key; an unkeyed write batch is
    /// not retried (see `retry_writes`).
    ///
    /// ```no_run
    /// # async fn run(client: sqlhttp::Client) -> sqlhttp::Result<()> {
    /// use sqlhttp::Isolation;
    /// client
    ///     .batch()
    ///     .statement("INSERT INTO ledger (account, delta) SELECT 1, -25 WHERE (SELECT sum(delta) FROM ledger WHERE account = 1) >= 25")
    ///     .isolation(Isolation::Serializable)
    ///     .idempotency_key("withdraw-42")
    ///     .await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn isolation(mut self, isolation: Isolation) -> Self {
        self.isolation = Some(isolation);
        self
    }

    /// How many statements the batch holds.
    pub fn len(&self) -> usize {
        self.statements.len()
    }

    /// Whether no statement was added.
    pub fn is_empty(&self) -> bool {
        self.statements.is_empty()
    }

    /// Runs the batch and reports what it did: its results, and whether the server answered
    /// from its store of keyed outcomes rather than running it. Awaiting the batch itself gives
    /// [`BatchReport::results`].
    ///
    /// ```no_run
    /// # async fn run(client: sqlhttp::Client) -> sqlhttp::Result<()> {
    /// let report = client
    ///     .batch()
    ///     .statement("INSERT INTO jobs (id) VALUES (?)").bind(7)
    ///     .idempotency_key("enqueue-7")
    ///     .report()
    ///     .await?;
    /// if report.replayed {
    ///     println!("job 7 was enqueued earlier, under the same key: nothing written now");
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub fn report(self) -> ResponseFuture<'static, BatchReport> {
        ResponseFuture::new(self.send())
    }

    async fn send(self) -> Result<BatchReport> {
        self.options.validate()?;
        if self.stray_bind {
            return Err(Error::new(ErrorKind::InvalidParameter {
                index: None,
                message: "bind() was called before any statement(); add the statement first"
                    .to_owned(),
            }));
        }
        if self.read_only && self.keys_at_commit {
            return Err(Error::config(
                "a read-only batch changes nothing: foreign_keys_checked_at_commit is for writes",
            ));
        }
        if self.read_only && self.options.idempotency_key.is_some() {
            return Err(Error::config(
                "a read-only batch is a read: it applies nothing, so it carries no idempotency key",
            ));
        }
        if let Some((index, kind)) = self
            .statements
            .iter()
            .enumerate()
            .find_map(|(index, s)| s.invalid().map(|kind| (index, kind.clone())))
        {
            return Err(Error::new(kind).with_statement_index(Some(index)));
        }
        if self.statements.is_empty() {
            return Ok(BatchReport::default());
        }
        let count = self.statements.len();
        let bodies: Vec<Bytes> = self
            .statements
            .iter()
            .map(|s| {
                RequestBody {
                    sql: s.sql(),
                    params: s.params(),
                    // A read-only batch says so once, for all of its statements.
                    read_only: false,
                }
                .encode()
            })
            .collect();
        let body = encode_with(&bodies, self.read_only, self.keys_at_commit, self.isolation);
        check_limits(count, body.len(), self.client.batch_limits()).map_err(|message| {
            Error::new(ErrorKind::PayloadTooLarge {
                message: format!("the batch cannot be sent: {message}"),
            })
        })?;
        let (class, key) = if self.read_only {
            (OpClass::Read, None)
        } else {
            let key = self
                .options
                .idempotency_key
                .as_deref()
                .map(HeaderValue::try_from)
                .transpose()
                .map_err(|err| Error::config(format!("invalid idempotency key: {err}")))?;
            (OpClass::Write, key)
        };
        let sql_for_log = format!("BATCH of {count} statements");
        let mut whole = crate::cursor::Whole::default();
        let call = Call {
            class,
            endpoint: Endpoint::Batch,
            body,
            sql: &sql_for_log,
            options: &self.options,
            idempotency_key: key,
            started: None,
        };
        let delivered = self.client.send(call, &mut whole).await?;
        let replayed = crate::insert::replayed_by_an_earlier_call(&delivered);
        let (results, stats) =
            decode_results(&whole.0, count).map_err(|err| delivered.attach(err))?;
        let results = results
            .into_iter()
            .map(|table| table.attempted(delivered.attempts))
            .collect();
        let stats = Stats::from_wire(stats.as_ref(), delivered.attempts);
        Ok(BatchReport {
            results,
            replayed,
            stats,
        })
    }
}

/// What a batch did, from [`Batch::report`].
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct BatchReport {
    /// One table per statement, in order, as awaiting the batch gives them.
    pub results: Vec<Table>,
    /// Whether the server answered the batch's first attempt with a stored outcome
    /// (`Idempotent-Replayed: true`): an earlier call applied its key, so nothing was written by
    /// this one. A replay that answers a retry does not count: the attempt before it, lost on
    /// the way back, may have been this call's own write.
    pub replayed: bool,
    /// What the whole batch cost (its statements, its BEGIN and COMMIT; each statement's own
    /// figures are its table's [`Table::stats`]) and the attempts the call took.
    pub stats: Stats,
}

impl IntoFuture for Batch {
    type Output = Result<Vec<Table>>;
    type IntoFuture = ResponseFuture<'static, Vec<Table>>;

    fn into_future(self) -> Self::IntoFuture {
        ResponseFuture::new(async move { self.send().await.map(|report| report.results) })
    }
}

/// Statements show their SQL and how many values are bound, never the values.
impl fmt::Debug for Batch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Batch")
            .field("statements", &self.statements)
            .field("read_only", &self.read_only)
            .field("foreign_keys_checked_at_commit", &self.keys_at_commit)
            .field("isolation", &self.isolation)
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the hand-written encoder writes is the protocol's batch body.
    #[test]
    fn the_encoded_batch_is_the_protocol_s_body() {
        use sqlhttp_protocol::body::{BatchRequest, SqlRequest};
        let bodies = [
            Bytes::from_static(br#"{"sql":"SELECT ?","params":[1]}"#),
            Bytes::from_static(br#"{"sql":"SELECT 2"}"#),
        ];
        let encoded = encode_with(&bodies, true, true, Some(Isolation::RepeatableRead));
        let read: BatchRequest = serde_json::from_slice(&encoded).unwrap();
        assert_eq!(
            read,
            BatchRequest {
                statements: vec![
                    SqlRequest {
                        sql: "SELECT ?".to_owned(),
                        params: Some(vec![serde_json::json!(1)]),
                        read_only: false,
                    },
                    SqlRequest {
                        sql: "SELECT 2".to_owned(),
                        params: None,
                        read_only: false,
                    },
                ],
                read_only: true,
                foreign_keys: Some(ForeignKeys::CheckedAtCommit),
                isolation: Some(Isolation::RepeatableRead),
            }
        );
        let plain: BatchRequest = serde_json::from_slice(&encode(&bodies, false)).unwrap();
        assert!(!plain.read_only);
        assert_eq!((plain.foreign_keys, plain.isolation), (None, None));
    }

    #[test]
    fn encodes_statement_bodies_in_order() {
        let bodies = [
            Bytes::from_static(br#"{"sql":"SELECT 1"}"#),
            Bytes::from_static(br#"{"sql":"SELECT ?","params":[2]}"#),
        ];
        assert_eq!(
            &encode(&bodies, true)[..],
            br#"{"statements":[{"sql":"SELECT 1"},{"sql":"SELECT ?","params":[2]}],"read_only":true}"#
        );
    }

    #[test]
    fn foreign_keys_checked_at_commit_are_said_once() {
        let bodies = [Bytes::from_static(br#"{"sql":"SELECT 1"}"#)];
        assert_eq!(
            &encode_with(&bodies, false, true, None)[..],
            br#"{"statements":[{"sql":"SELECT 1"}],"read_only":false,"foreign_keys":"checked_at_commit"}"#
        );
    }

    #[test]
    fn limits_name_the_setting() {
        let limits = BatchLimits {
            max_statements: 2,
            max_body_bytes: 100,
        };
        assert!(check_limits(2, 100, limits).is_ok());
        assert!(
            check_limits(3, 10, limits)
                .unwrap_err()
                .contains("batch_max_statements")
        );
        assert!(
            check_limits(1, 101, limits)
                .unwrap_err()
                .contains("batch_max_bytes")
        );
    }

    #[test]
    fn a_result_count_other_than_the_statements_is_a_decode_failure() {
        let one = br#"{"results":[{"columns":[],"rows":[],"rows_affected":1,"last_insert_id":3}]}"#;
        let (tables, stats) = decode_results(one, 1).unwrap();
        assert_eq!(stats, None, "an older server's batch has no stats");
        assert_eq!(tables[0].last_insert_id(), Some(3));
        let err = decode_results(one, 2).unwrap_err();
        assert!(matches!(err.kind(), ErrorKind::Decode { .. }), "{err:?}");
    }
}
