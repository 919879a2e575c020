//! Typed bulk insert: rows of any `Serialize` struct or map become parameterized multi-row
//! `INSERT INTO "table" ("a", "b") VALUES (?, ?), (?, ?)` statements with quoted identifiers, split into
//! chunks that respect the engine's bound-parameter limit and the server's body limit.
//!
//! Every row is checked and every chunk encoded before the first one is sent, so bad input fails with
//! nothing written. Each chunk is one write, retried only under `retry_writes`, with an idempotency key
//! of its own derived from the call's (see [`chunk_key`]); an [`atomic`](Insert::atomic) insert sends
//! all its chunks as one batch under the call's key instead (see `batch`). In a transaction each
//! chunk is the transaction's next statement instead (see `statement::Target`), keyed by its number
//! there. This module knows the SQL it generates and the request body; not the transport.

use std::fmt;
use std::future::IntoFuture;

use bytes::Bytes;
use http::HeaderValue;
use serde::Serialize;

use serde::de::IgnoredAny;

use crate::cursor::Collect;
use crate::error::{Error, ErrorKind, Result};
use crate::options::{CallOptions, call_settings, check_key, retry_setting, write_settings};
use crate::retry::classify::OpClass;
use crate::statement::{RequestBody, ResponseFuture, Target, check_scalar};
use crate::table::Table;
use crate::transport::{Call, Endpoint};
use crate::wire::decode;
use serde_json::Value;

/// How large one generated statement may be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct InsertLimits {
    /// Bound parameters in one statement (SQLite's default `SQLITE_MAX_VARIABLE_NUMBER` is 32 766).
    pub(crate) max_params: usize,
    /// Bytes in one request body (the reference server's default limit,
    /// `sqlhttp_protocol::defaults::MAX_BODY_BYTES`).
    pub(crate) max_body_bytes: usize,
}

impl Default for InsertLimits {
    fn default() -> Self {
        Self {
            max_params: 32_766,
            max_body_bytes: sqlhttp_protocol::defaults::MAX_BODY_BYTES,
        }
    }
}

/// One generated statement, encoded and ready to send.
#[derive(Debug)]
pub(crate) struct Chunk {
    pub(crate) body: Bytes,
    pub(crate) rows: usize,
}

/// A typed bulk insert, made by [`Client::insert`](crate::Client::insert) or
/// [`Transaction::insert`](crate::Transaction::insert) (there each statement is a step of the
/// transaction, retried as every step is, and commits with it). `.await` it for the number of rows
/// inserted.
///
/// A **write**: retried only under `retry_writes` (the client's, or this call's
/// [`retry_writes`](Self::retry_writes)). Every statement carries an idempotency key, the same on each
/// of its attempts.
///
/// # Keys the caller holds
///
/// With [`idempotency_key`](Self::idempotency_key) the caller names the write, so that re-sending it
/// later (another call, another process) is applied at most once. An insert that fits one statement
/// sends the key as given; one split into several statements sends `{key}/0`, `{key}/1`, ... in order,
/// one distinct, deterministic key per statement, so a re-send replays the statements that committed
/// and runs the rest. Re-send the same rows with the same client limits
/// ([`ClientBuilder::insert_max_params`](crate::ClientBuilder::insert_max_params),
/// [`ClientBuilder::insert_max_bytes`](crate::ClientBuilder::insert_max_bytes)): a different split gives a
/// statement a different body, which the server refuses under a used key (`422`). Without a key of the
/// caller's, the SDK makes one per call and derives the statements' keys the same way; a failure whose
/// outcome is unknown carries it ([`Error::idempotency_key`]).
///
/// ```no_run
/// # async fn run(client: sqlhttp::Client, job_id: u64) -> sqlhttp::Result<()> {
/// use serde::Serialize;
/// use std::time::Duration;
///
/// #[derive(Serialize)]
/// struct Event { id: i64, kind: String }
///
/// let events = vec![Event { id: 1, kind: "signup".into() }];
/// // The key is stored with the job: after a crash, the job re-sends the same rows with it.
/// let inserted = client
///     .insert("events", &events)
///     .idempotency_key(format!("import-{job_id}"))
///     .retry_writes(true)
///     .timeout(Duration::from_secs(5))
///     .await?;
/// # Ok(())
/// # }
/// ```
///
/// # All or nothing
///
/// A split insert commits statement by statement: a failure part-way leaves the earlier statements'
/// rows in place ([`Error::rows_inserted`] counts them). [`atomic`](Self::atomic) sends every statement
/// in one [batch](crate::Client::batch) instead, committed together or not at all.
///
/// # Errors
///
/// [`ErrorKind::InvalidParameter`] or [`ErrorKind::PayloadTooLarge`] before anything is sent, when a
/// row cannot be inserted (or an atomic insert does not fit one batch); [`ErrorKind::Config`] before
/// anything is sent, when a per-call setting cannot work; otherwise a statement's failure, with
/// [`Error::rows_inserted`] when earlier statements had committed.
#[must_use = "an insert does nothing until it is awaited"]
pub struct Insert<'r, T> {
    target: Target,
    table: String,
    rows: &'r [T],
    atomic: bool,
    options: CallOptions,
}

call_settings!(impl['r, T] Insert<'r, T>);
retry_setting!(impl['r, T] Insert<'r, T>);
write_settings!(impl['r, T] Insert<'r, T>);

impl<'r, T> Insert<'r, T> {
    pub(crate) fn new(target: Target, table: String, rows: &'r [T]) -> Self {
        Self {
            target,
            table,
            rows,
            atomic: false,
            options: CallOptions::default(),
        }
    }

    /// Inserts every row or none: the statements the rows are split into (see
    /// [`ClientBuilder::insert_max_params`](crate::ClientBuilder::insert_max_params) and
    /// [`ClientBuilder::insert_max_bytes`](crate::ClientBuilder::insert_max_bytes)) are sent as one
    /// [batch](crate::Client::batch), which the server commits in one transaction. The call's
    /// idempotency key (the caller's, or one the SDK makes) covers the whole batch, as given: no
    /// `{key}/{index}` suffixes. A failure names the statement ([`Error::statement_index`]) and leaves
    /// no row behind. An insert that fits one statement is sent as that statement, atomic already.
    ///
    /// The batch must fit the client's batch limits
    /// ([`ClientBuilder::batch_max_statements`](crate::ClientBuilder::batch_max_statements),
    /// [`ClientBuilder::batch_max_bytes`](crate::ClientBuilder::batch_max_bytes): 100 statements and
    /// 8 MiB by default, the reference server's); when it does not, the call fails with
    /// [`ErrorKind::PayloadTooLarge`] before anything is sent, saying how large the batch would be.
    ///
    /// ```no_run
    /// # async fn run(client: sqlhttp::Client, rows: Vec<std::collections::BTreeMap<String, i64>>) -> sqlhttp::Result<()> {
    /// let inserted = client.insert("readings", &rows).atomic(true).retry_writes(true).await?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// Default: `false` (statements sent one by one).
    pub fn atomic(mut self, atomic: bool) -> Self {
        self.atomic = atomic;
        self
    }
}

/// The rows' values never show: only how many there are.
impl<T> fmt::Debug for Insert<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Insert")
            .field("table", &self.table)
            .field("rows", &format_args!("<{} rows>", self.rows.len()))
            .field("atomic", &self.atomic)
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

/// The idempotency key of statement `index` of `count`: the call's key itself when there is one
/// statement, `{key}/{index}` otherwise.
pub(crate) fn chunk_key(key: &str, index: usize, count: usize) -> String {
    if count == 1 {
        key.to_owned()
    } else {
        format!("{key}/{index}")
    }
}

/// Whether the server answered `delivered` from its store on the call's first attempt, so that
/// an earlier call, not this one, wrote what it stands for.
pub(crate) fn replayed_by_an_earlier_call(delivered: &crate::transport::Delivered) -> bool {
    delivered.attempts == 1 && delivered.body.replayed()
}

/// What an insert did, from [`Insert::report`]: the rows the server reported, and how many of
/// the statements were answered from the server's store of keyed outcomes rather than run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct InsertReport {
    /// Rows inserted, as the server reported them; a replayed statement reports the rows it
    /// inserted when it first ran.
    pub rows: u64,
    /// Statements the rows were sent in (one batch counts as one).
    pub statements: usize,
    /// Statements the server answered with a stored outcome (`Idempotent-Replayed: true`) on
    /// their first attempt: an earlier call applied their key, so nothing of them was written
    /// by this one. A replay that answers a retry is not counted: the attempt before it, lost on
    /// the way back, may have been this call's own write.
    pub replayed: usize,
}

impl InsertReport {
    /// Whether every statement was a replay: this call wrote nothing (an earlier call with the
    /// same key did).
    pub fn is_replay(&self) -> bool {
        self.statements > 0 && self.replayed == self.statements
    }
}

impl<'r, T: Serialize + Sync> Insert<'r, T> {
    /// Runs the insert and reports what it did, replays included. Awaiting the insert itself
    /// gives [`InsertReport::rows`].
    ///
    /// ```no_run
    /// # async fn run(client: sqlhttp::Client, rows: Vec<std::collections::BTreeMap<String, i64>>) -> sqlhttp::Result<()> {
    /// let report = client.insert("readings", &rows).idempotency_key("import-7").report().await?;
    /// if report.is_replay() {
    ///     println!("already imported under import-7: nothing written");
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub fn report(self) -> ResponseFuture<'r, InsertReport> {
        ResponseFuture::new(self.run())
    }
}

impl<'r, T: Serialize + Sync> IntoFuture for Insert<'r, T> {
    type Output = Result<u64>;
    type IntoFuture = ResponseFuture<'r, u64>;

    fn into_future(self) -> Self::IntoFuture {
        ResponseFuture::new(async move { self.run().await.map(|report| report.rows) })
    }
}

impl<'r, T: Serialize + Sync> Insert<'r, T> {
    async fn run(self) -> Result<InsertReport> {
        self.options.validate()?;
        let chunks = plan(&self.table, self.rows, self.target.client().insert_limits())?;
        let count = chunks.len();
        let call_key = match &self.options.idempotency_key {
            Some(key) => key.clone(),
            None => crate::transport::new_idempotency_key(),
        };
        if count > 1 {
            check_key(&chunk_key(&call_key, count - 1, count)).map_err(|message| {
                Error::config(format!(
                    "the insert takes {count} statements, keyed `{{key}}/{{index}}`: {message}"
                ))
            })?;
        }
        let sql_for_log = format!("INSERT INTO {} ...", quote_identifier(&self.table));
        // In a transaction the statements commit with it: nothing to batch.
        if self.atomic && count > 1 && matches!(self.target, Target::Client(_)) {
            return self.send_atomic(chunks, call_key, &sql_for_log).await;
        }
        let mut inserted = 0u64;
        let mut replayed = 0usize;
        // One `max_elapsed` for the whole insert, however many statements it takes.
        let started = tokio::time::Instant::now();
        for (index, chunk) in chunks.into_iter().enumerate() {
            let key = HeaderValue::try_from(chunk_key(&call_key, index, count))
                .map_err(|err| Error::config(format!("invalid idempotency key: {err}")))?;
            let mut effect = Collect::<IgnoredAny>::new();
            let call = Call {
                class: OpClass::Write,
                endpoint: Endpoint::Sql,
                body: chunk.body,
                sql: &sql_for_log,
                options: &self.options,
                idempotency_key: Some(key),
                started: Some(started),
            };
            let sent = self
                .target
                .send(call, &mut effect)
                .await
                .and_then(|delivered| {
                    let effect = decode::effect_of(&effect.decoder, delivered.attempts)
                        .map_err(|err| delivered.attach(err))?;
                    Ok((effect, replayed_by_an_earlier_call(&delivered)))
                });
            let err = match sent {
                Ok((effect, was_replayed)) => {
                    inserted += effect.rows_affected;
                    replayed += usize::from(was_replayed);
                    tracing::debug!(rows = chunk.rows, "insert chunk committed");
                    continue;
                }
                Err(err) => err,
            };
            // The key to re-send with is the call's: it covers every statement. In a transaction
            // the error keeps its step's own, as every step's does (its number is what counts).
            let err = match (err.idempotency_key(), &self.target) {
                (Some(_), Target::Client(_)) => err.with_idempotency_key(Some(call_key)),
                _ => err,
            };
            return Err(if inserted > 0 {
                err.with_rows_inserted(inserted)
            } else {
                err
            });
        }
        Ok(InsertReport {
            rows: inserted,
            statements: count,
            replayed,
        })
    }
}

impl<T> Insert<'_, T> {
    /// Sends every chunk in one batch under the call's key; all rows or none.
    async fn send_atomic(
        &self,
        chunks: Vec<Chunk>,
        call_key: String,
        sql: &str,
    ) -> Result<InsertReport> {
        let count = chunks.len();
        let rows: usize = chunks.iter().map(|chunk| chunk.rows).sum();
        let bodies: Vec<Bytes> = chunks.into_iter().map(|chunk| chunk.body).collect();
        let body = crate::batch::encode(&bodies, false);
        crate::batch::check_limits(count, body.len(), self.target.client().batch_limits()).map_err(
            |message| {
                Error::new(ErrorKind::PayloadTooLarge {
                    message: format!(
                        "an atomic insert of {rows} rows takes {count} statements in one batch, and {message}; \
                         nothing was sent. Insert without .atomic(true) (each statement exactly once \
                         under its key, but not all or nothing), split the rows, or raise the \
                         client's batch limits to the server's"
                    ),
                })
            },
        )?;
        let key = HeaderValue::try_from(call_key.as_str())
            .map_err(|err| Error::config(format!("invalid idempotency key: {err}")))?;
        let mut whole = crate::cursor::Whole::default();
        let call = Call {
            class: OpClass::Write,
            endpoint: Endpoint::Batch,
            body,
            sql,
            options: &self.options,
            idempotency_key: Some(key),
            started: None,
        };
        let delivered = self.target.client().send(call, &mut whole).await?;
        let (tables, _) =
            crate::batch::decode_results(&whole.0, count).map_err(|err| delivered.attach(err))?;
        Ok(InsertReport {
            rows: tables.iter().map(Table::rows_affected).sum(),
            statements: 1,
            replayed: usize::from(replayed_by_an_earlier_call(&delivered)),
        })
    }
}

/// Checks every row and splits them into encoded statements.
pub(crate) fn plan<T: Serialize>(
    table: &str,
    rows: &[T],
    limits: InsertLimits,
) -> Result<Vec<Chunk>> {
    let Some(first) = rows.first() else {
        return Ok(Vec::new());
    };
    check_identifier(table, "table")?;
    let columns: Vec<String> = match to_object(first, 0)? {
        Value::Object(map) => map.keys().cloned().collect(),
        _ => unreachable!("to_object returns objects"),
    };
    if columns.is_empty() {
        return Err(invalid(None, "row 0 has no fields to insert".to_owned()));
    }
    for column in &columns {
        check_identifier(column, "column")?;
    }
    let rows_per_statement = limits.max_params / columns.len();
    if rows_per_statement == 0 {
        return Err(invalid(
            None,
            format!(
                "a row has {} columns, more than the {} parameters one statement may bind",
                columns.len(),
                limits.max_params
            ),
        ));
    }

    let prefix = format!(
        "INSERT INTO {} ({}) VALUES ",
        quote_identifier(table),
        columns
            .iter()
            .map(|c| quote_identifier(c))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let group = format!("({})", vec!["?"; columns.len()].join(", "));
    // `{"sql":"<prefix>","params":[]}` with the prefix escaped as JSON.
    let fixed_bytes = serde_json::to_string(&prefix)
        .expect("strings serialize")
        .len()
        + r#"{"sql":,"params":[]}"#.len();

    let mut chunks = Vec::new();
    let mut params: Vec<Value> = Vec::new();
    let mut rows_in_chunk = 0usize;
    let mut body_bytes = fixed_bytes;
    for (index, row) in rows.iter().enumerate() {
        let Value::Object(mut map) = to_object(row, index)? else {
            unreachable!("to_object returns objects")
        };
        if map.len() != columns.len() || !columns.iter().all(|c| map.contains_key(c)) {
            return Err(invalid(
                None,
                format!(
                    "row {index} has different fields from row 0 ({})",
                    columns.join(", ")
                ),
            ));
        }
        let mut row_params = Vec::with_capacity(columns.len());
        // Each row adds its placeholder group plus ", " and, per parameter, its JSON plus ",".
        let mut row_bytes = group.len() + 2;
        for column in &columns {
            let value = map.remove(column).expect("checked above");
            check_scalar(&value).map_err(|message| {
                invalid(None, format!("row {index}, column `{column}`: {message}"))
            })?;
            row_bytes += serde_json::to_string(&value)
                .expect("scalars serialize")
                .len()
                + 1;
            row_params.push(value);
        }
        if fixed_bytes + row_bytes > limits.max_body_bytes {
            return Err(Error::new(ErrorKind::PayloadTooLarge {
                message: format!(
                    "row {index} alone needs about {} bytes, over the {}-byte body limit",
                    fixed_bytes + row_bytes,
                    limits.max_body_bytes
                ),
            }));
        }
        if rows_in_chunk == rows_per_statement || body_bytes + row_bytes > limits.max_body_bytes {
            chunks.push(encode(&prefix, &group, rows_in_chunk, &params));
            params.clear();
            rows_in_chunk = 0;
            body_bytes = fixed_bytes;
        }
        params.extend(row_params);
        rows_in_chunk += 1;
        body_bytes += row_bytes;
    }
    chunks.push(encode(&prefix, &group, rows_in_chunk, &params));
    Ok(chunks)
}

fn encode(prefix: &str, group: &str, rows: usize, params: &[Value]) -> Chunk {
    let mut sql = String::with_capacity(prefix.len() + rows * (group.len() + 2));
    sql.push_str(prefix);
    for i in 0..rows {
        if i > 0 {
            sql.push_str(", ");
        }
        sql.push_str(group);
    }
    Chunk {
        body: RequestBody {
            sql: &sql,
            params,
            read_only: false,
        }
        .encode(),
        rows,
    }
}

fn to_object<T: Serialize>(row: &T, index: usize) -> Result<Value> {
    match crate::wire::blob::to_param(row) {
        Ok(value @ Value::Object(_)) => Ok(value),
        Ok(_) => Err(invalid(
            None,
            format!("row {index} is not a struct or a map"),
        )),
        Err(err) => Err(invalid(None, format!("row {index}: {err}"))),
    }
}

/// Quotes an identifier for SQL: `"name"`, with `"` doubled.
pub(crate) fn quote_identifier(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

fn check_identifier(name: &str, what: &str) -> Result<()> {
    if name.is_empty() || name.contains('\0') {
        return Err(invalid(None, format!("invalid {what} name {name:?}")));
    }
    Ok(())
}

fn invalid(index: Option<usize>, message: String) -> Error {
    Error::new(ErrorKind::InvalidParameter { index, message })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Serialize;
    use std::collections::BTreeMap;

    #[derive(Serialize)]
    struct User {
        id: i64,
        name: String,
        email: Option<String>,
    }

    fn users(n: usize) -> Vec<User> {
        (0..n)
            .map(|i| User {
                id: i as i64,
                name: format!("user {i}"),
                email: (i % 2 == 0).then(|| format!("u{i}@example.com")),
            })
            .collect()
    }

    fn body(chunk: &Chunk) -> serde_json::Value {
        serde_json::from_slice(&chunk.body).unwrap()
    }

    #[test]
    fn one_statement_with_quoted_identifiers_and_bound_values() {
        let chunks = plan("people", &users(2), InsertLimits::default()).unwrap();
        assert_eq!(chunks.len(), 1);
        let b = body(&chunks[0]);
        assert_eq!(
            b["sql"],
            r#"INSERT INTO "people" ("email", "id", "name") VALUES (?, ?, ?), (?, ?, ?)"#
        );
        assert_eq!(
            b["params"],
            serde_json::json!(["u0@example.com", 0, "user 0", null, 1, "user 1"])
        );
    }

    #[test]
    fn identifiers_cannot_break_out_of_quotes() {
        let mut row = BTreeMap::new();
        row.insert("a\"; DROP TABLE t; --", 1);
        let chunks = plan("t\"x", &[row], InsertLimits::default()).unwrap();
        assert_eq!(
            body(&chunks[0])["sql"],
            r#"INSERT INTO "t""x" ("a""; DROP TABLE t; --") VALUES (?)"#
        );
    }

    #[test]
    fn splits_on_the_parameter_limit() {
        let limits = InsertLimits {
            max_params: 7,
            ..InsertLimits::default()
        };
        let chunks = plan("t", &users(5), limits).unwrap();
        assert_eq!(
            chunks.iter().map(|c| c.rows).collect::<Vec<_>>(),
            vec![2, 2, 1]
        );
        for chunk in &chunks {
            assert!(body(chunk)["params"].as_array().unwrap().len() <= 7);
        }
    }

    #[test]
    fn splits_on_the_body_limit_and_every_body_fits() {
        let limits = InsertLimits {
            max_params: 32_766,
            max_body_bytes: 1_000,
        };
        let rows = users(200);
        let chunks = plan("t", &rows, limits).unwrap();
        assert!(chunks.len() > 1);
        assert_eq!(chunks.iter().map(|c| c.rows).sum::<usize>(), 200);
        for chunk in &chunks {
            assert!(chunk.body.len() <= 1_000, "{} bytes", chunk.body.len());
            // Nearly full: the estimate is exact, not merely safe.
            assert!(
                chunk.body.len() > 850 || chunk.rows < 10,
                "{} bytes",
                chunk.body.len()
            );
        }
    }

    #[test]
    fn a_row_too_large_alone_fails_before_anything_is_sent() {
        let limits = InsertLimits {
            max_params: 100,
            max_body_bytes: 200,
        };
        let mut rows = users(3);
        rows[2].name = "x".repeat(500);
        let err = plan("t", &rows, limits).unwrap_err();
        assert!(
            matches!(err.kind(), ErrorKind::PayloadTooLarge { .. }),
            "{err:?}"
        );
    }

    #[test]
    fn rows_of_different_shapes_are_refused() {
        let a: BTreeMap<&str, i64> = [("a", 1)].into();
        let b: BTreeMap<&str, i64> = [("b", 1)].into();
        let err = plan("t", &[a, b], InsertLimits::default()).unwrap_err();
        assert!(err.to_string().contains("row 1"), "{err}");
    }

    #[test]
    fn nested_values_and_scalars_are_refused() {
        #[derive(Serialize)]
        struct Tagged {
            tags: Vec<String>,
        }
        let err = plan(
            "t",
            &[Tagged {
                tags: vec!["a".into()],
            }],
            InsertLimits::default(),
        )
        .unwrap_err();
        assert!(err.to_string().contains("`tags`"), "{err}");
        let err = plan("t", &[1, 2], InsertLimits::default()).unwrap_err();
        assert!(err.to_string().contains("not a struct"), "{err}");
        let err = plan("", &users(1), InsertLimits::default()).unwrap_err();
        assert!(matches!(err.kind(), ErrorKind::InvalidParameter { .. }));
    }

    #[test]
    fn no_rows_no_statements() {
        assert!(
            plan::<User>("t", &[], InsertLimits::default())
                .unwrap()
                .is_empty()
        );
    }
}
