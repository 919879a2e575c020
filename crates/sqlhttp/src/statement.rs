//! A statement on its way out: SQL text and bound parameters, and the request builders that finish it
//! ([`Query`], [`TableQuery`], [`Execute`]) with their per-call settings (see `options`), and
//! [`Target`], where a statement runs: on its own through the client, or as the next step of an
//! interactive transaction. The builders and their finishing calls are the same for both; only
//! the target knows the difference (ADR 0047).
//!
//! Parameters are always bound, never spliced into SQL: each is serialized to a JSON scalar and sent
//! beside the text. This module knows the request body of protocol v1, not the transport's rules.

use std::fmt;
use std::future::{Future, IntoFuture};
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use serde::Serialize;
use serde::de::DeserializeOwned;

use serde::de::IgnoredAny;

use crate::client::Client;
use crate::cursor::{Collect, First, Reread, RowStream};
use crate::error::{Error, ErrorKind, Result};
use crate::options::{CallOptions, call_settings, read_settings, retry_setting};
use crate::retry::classify::OpClass;
use crate::table::{ExecResult, Table};
use crate::transaction::Handle;
use crate::transport::{Call, Delivered, Endpoint, Receive};
use crate::value::Value as Cell;
use crate::wire::decode;
use serde_json::Value;

/// Where a statement runs: through the client on its own, or as the next statement of an
/// interactive transaction.
#[derive(Clone)]
pub(crate) enum Target {
    Client(Client),
    Transaction(Handle),
}

impl fmt::Debug for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Target::Client(client) => client.fmt(f),
            Target::Transaction(handle) => handle.fmt(f),
        }
    }
}

impl Target {
    /// The client the statement is sent by (its limits; a transaction's own client).
    pub(crate) fn client(&self) -> &Client {
        match self {
            Target::Client(client) => client,
            Target::Transaction(handle) => handle.client(),
        }
    }

    fn in_transaction(&self) -> bool {
        matches!(self, Target::Transaction(_))
    }

    /// Sends a call the request builders made (a `/api/v1/sql` body): as it is through the
    /// client, or as the transaction's next statement.
    pub(crate) async fn send(
        &self,
        call: Call<'_>,
        receiver: &mut dyn Receive,
    ) -> Result<Delivered> {
        match self {
            Target::Client(client) => client.send(call, receiver).await,
            Target::Transaction(handle) => handle.step(call, receiver).await.map(|(d, _)| d),
        }
    }

    /// [`send`](Self::send), for a stream: with, in a transaction, the way to read the stored
    /// result again after a lost answer.
    async fn send_streamed(
        &self,
        call: Call<'_>,
        receiver: &mut dyn Receive,
    ) -> Result<(Delivered, Option<Box<dyn Reread>>)> {
        match self {
            Target::Client(client) => Ok((client.send(call, receiver).await?, None)),
            Target::Transaction(handle) => {
                let (delivered, replay) = handle.step(call, receiver).await?;
                Ok((delivered, Some(Box::new(replay))))
            }
        }
    }
}

/// What a protocol v1 statement body carries; written as the protocol crate's
/// `body::SqlRequest` (ADR 0048).
pub(crate) struct RequestBody<'a> {
    pub(crate) sql: &'a str,
    pub(crate) params: &'a [Value],
    /// `"read_only": true` on a read: the server refuses (`403 READ_ONLY`, nothing written) a
    /// statement that could write, so retrying a read can never write twice.
    pub(crate) read_only: bool,
}

impl RequestBody<'_> {
    pub(crate) fn encode(&self) -> Bytes {
        let body = sqlhttp_protocol::body::SqlRequest {
            sql: self.sql,
            params: (!self.params.is_empty()).then_some(self.params),
            read_only: self.read_only,
        };
        Bytes::from(
            serde_json::to_vec(&body).expect("a request body of JSON scalars always serializes"),
        )
    }
}

/// Serializes `value` as one parameter, checked: the one function every path that binds a
/// statement's parameter goes through (statements, batches, transactions). `insert` rows take the
/// same two steps per column: `blob::to_param` (which refuses NaN, the infinities and integers
/// outside `i64`, at any depth), then [`check_scalar`].
pub(crate) fn to_scalar_param<T: Serialize + ?Sized>(value: &T) -> Result<Value, String> {
    let value = crate::wire::blob::to_param(value).map_err(|err| err.to_string())?;
    check_scalar(&value)?;
    Ok(value)
}

/// Checks that a value can travel as a parameter: null, a bool, an integer in `i64`, a finite float,
/// a string, or a blob (`{"base64": ...}`, made from bytes by `blob::to_param`).
pub(crate) fn check_scalar(value: &Value) -> Result<(), String> {
    match value {
        Value::Null | Value::Bool(_) | Value::String(_) => Ok(()),
        Value::Object(map) if crate::wire::blob::is_blob(map) => Ok(()),
        Value::Number(n) if n.is_i64() || n.is_f64() => Ok(()),
        Value::Number(_) => {
            Err("an integer above i64::MAX does not fit in a signed 64-bit integer".to_owned())
        }
        Value::Array(_) => Err("a sequence cannot be bound; bind each element".to_owned()),
        Value::Object(_) => Err("a struct or map cannot be bound as one parameter".to_owned()),
    }
}

/// SQL and parameters, shared by every statement builder. Its `Debug` shows how many parameters are
/// bound, never their values.
#[derive(Clone)]
pub(crate) struct Statement {
    sql: String,
    params: Vec<Value>,
    invalid: Option<ErrorKind>,
}

impl fmt::Debug for Statement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Statement")
            .field("sql", &self.sql)
            .field("params", &format_args!("<{} bound>", self.params.len()))
            .finish()
    }
}

impl Statement {
    pub(crate) fn new(sql: String) -> Self {
        Self {
            sql,
            params: Vec::new(),
            invalid: None,
        }
    }

    pub(crate) fn sql(&self) -> &str {
        &self.sql
    }

    pub(crate) fn params(&self) -> &[Value] {
        &self.params
    }

    /// Why a bound value cannot be sent, if one cannot.
    pub(crate) fn invalid(&self) -> Option<&ErrorKind> {
        self.invalid.as_ref()
    }

    pub(crate) fn bind<T: Serialize + ?Sized>(&mut self, value: &T) {
        if self.invalid.is_some() {
            return;
        }
        let index = self.params.len();
        match to_scalar_param(value) {
            Ok(value) => self.params.push(value),
            Err(message) => {
                self.invalid = Some(ErrorKind::InvalidParameter {
                    index: Some(index),
                    message,
                });
            }
        }
    }

    /// Sends the statement as an operation of `class`, handing the body to `receiver` while the call
    /// may be retried; a parameter that could not be bound or a setting that cannot work fails here,
    /// before anything is sent.
    async fn send(
        self,
        target: &Target,
        class: OpClass,
        options: &CallOptions,
        receiver: &mut dyn Receive,
    ) -> Result<Delivered> {
        let (delivered, _) = self.send_streamed(target, class, options, receiver).await?;
        Ok(delivered)
    }

    async fn send_streamed(
        self,
        target: &Target,
        class: OpClass,
        options: &CallOptions,
        receiver: &mut dyn Receive,
    ) -> Result<(Delivered, Option<Box<dyn Reread>>)> {
        if let Some(kind) = self.invalid {
            return Err(Error::new(kind));
        }
        let body = RequestBody {
            sql: &self.sql,
            params: &self.params,
            // In a transaction the transaction's own access applies (opened read-only or not).
            read_only: class == OpClass::Read && !target.in_transaction(),
        }
        .encode();
        let call = Call {
            class,
            endpoint: Endpoint::Sql,
            body,
            sql: &self.sql,
            options,
            idempotency_key: None,
            started: None,
        };
        target.send_streamed(call, receiver).await
    }

    /// Sends the statement and decodes every row into a `T`; a failure anywhere in the body is
    /// retried as the class allows (the caller has seen nothing yet).
    async fn fetch_all<T: DeserializeOwned + Send>(
        self,
        target: &Target,
        class: OpClass,
        options: &CallOptions,
    ) -> Result<Vec<T>> {
        let mut all = Collect::new();
        self.send(target, class, options, &mut all).await?;
        Ok(all.rows)
    }

    /// Sends the statement and returns its rows as a stream, once the first has arrived.
    async fn fetch<T: DeserializeOwned + Send>(
        self,
        target: &Target,
        class: OpClass,
        options: &CallOptions,
    ) -> Result<RowStream<T>> {
        let mut first = First::new();
        let (delivered, reread) = self
            .send_streamed(target, class, options, &mut first)
            .await?;
        Ok(RowStream::new(first, delivered).rereading(reread))
    }

    /// The first row, reading no more of the result than it must.
    async fn fetch_optional<T: DeserializeOwned + Send>(
        self,
        target: &Target,
        class: OpClass,
        options: &CallOptions,
    ) -> Result<(Option<T>, RowStream<T>)> {
        let mut rows = self.fetch(target, class, options).await?;
        let first = rows.try_next().await?;
        Ok((first, rows))
    }

    async fn fetch_one<T: DeserializeOwned + Send>(
        self,
        target: &Target,
        class: OpClass,
        options: &CallOptions,
    ) -> Result<T> {
        let (first, rows) = self.fetch_optional(target, class, options).await?;
        match first {
            Some(row) => {
                rows.close().await;
                Ok(row)
            }
            None => Err(rows.attach(Error::new(ErrorKind::RowNotFound))),
        }
    }
}

/// The future a request builder becomes when it is `.await`ed: the whole call, retries included.
///
/// A named type, so it can be stored in a struct or returned from a trait; it is `Send`, and dropping
/// it stops the call (a statement already sent may still commit on the server).
#[must_use = "futures do nothing unless you `.await` or poll them"]
pub struct ResponseFuture<'a, T> {
    inner: Pin<Box<dyn Future<Output = Result<T>> + Send + 'a>>,
}

impl<'a, T> ResponseFuture<'a, T> {
    pub(crate) fn new(future: impl Future<Output = Result<T>> + Send + 'a) -> Self {
        Self {
            inner: Box::pin(future),
        }
    }
}

impl<T> Future for ResponseFuture<'_, T> {
    type Output = Result<T>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.inner.as_mut().poll(cx)
    }
}

impl<T> fmt::Debug for ResponseFuture<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}

/// `.bind`, for the builders that carry a `statement: Statement`.
macro_rules! bind_params {
    ($builder:ident) => {
        impl $builder {
            /// Binds the next positional parameter (`?` in SQLite). Any `Serialize` value that is a
            /// scalar: `Option::None` and `()` bind `NULL`; bools, integers within `i64`, finite
            /// floats and strings bind as themselves; bytes bind as a BLOB. Anything else (a NaN or
            /// infinite float, an integer outside `i64`, a sequence, a struct) fails the call with
            /// [`ErrorKind::InvalidParameter`] naming the parameter (`?1` for the first), before
            /// anything is sent.
            pub fn bind<T: Serialize>(mut self, value: T) -> Self {
                self.statement.bind(&value);
                self
            }
        }
    };
}

/// A read returning typed rows, made by [`Client::query`] or
/// [`Transaction::query`](crate::Transaction::query) (the same builder: it runs where it was
/// made). Finish it with [`fetch_all`](Self::fetch_all), [`fetch_one`](Self::fetch_one),
/// [`fetch_optional`](Self::fetch_optional) or [`fetch`](Self::fetch) (a stream, for results of
/// any size).
///
/// Retried on transient failures. Per-call settings override the client's for this call only.
///
/// ```no_run
/// # async fn run(client: sqlhttp::Client) -> sqlhttp::Result<()> {
/// use std::time::Duration;
/// use sqlhttp::RetryPolicy;
///
/// // A quick lookup: a short timeout, two attempts within a second.
/// let name: Option<String> = client
///     .query("SELECT name FROM users WHERE id = ?")
///     .bind(42)
///     .timeout(Duration::from_millis(300))
///     .retry(RetryPolicy::new().with_max_attempts(2).with_max_elapsed(Duration::from_secs(1)))
///     .fetch_optional()
///     .await?;
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
#[must_use = "a query does nothing until it is fetched"]
pub struct Query {
    target: Target,
    statement: Statement,
    options: CallOptions,
}

bind_params!(Query);
call_settings!(impl[] Query);
retry_setting!(impl[] Query);
read_settings!(impl[] Query);

impl Query {
    pub(crate) fn new(target: Target, sql: String) -> Self {
        Self {
            target,
            statement: Statement::new(sql),
            options: CallOptions::default(),
        }
    }

    /// Every row, each decoded into a `T`: a struct (by column name), a tuple (by position), a map, or a
    /// scalar when the result has one column. `Option<_>` fields read `NULL`.
    ///
    /// # Errors
    ///
    /// Any failure of the call (see [`ErrorKind`]); [`ErrorKind::Decode`] naming the row and column when a
    /// cell is not what `T` expects.
    pub async fn fetch_all<T: DeserializeOwned + Send>(self) -> Result<Vec<T>> {
        self.statement
            .fetch_all(&self.target, OpClass::Read, &self.options)
            .await
    }

    /// The rows as a [`RowStream`], decoded one at a time as they arrive, in constant memory
    /// whatever the result's size. Retried as a read until the first row has arrived; never after
    /// (see [`RowStream`]). The request goes out when the stream is first read, or when it is
    /// awaited: `client.query(sql).fetch::<T>().await?` waits for the first row, so that
    /// [`RowStream::columns`] are known and any failure before it comes back there.
    ///
    /// ```no_run
    /// # async fn run(client: sqlhttp::Client) -> sqlhttp::Result<()> {
    /// let mut ids = client.query("SELECT id FROM events").fetch::<i64>();
    /// while let Some(id) = ids.try_next().await? {
    ///     println!("{id}");
    /// }
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// Any failure of the call before the first row (see [`ErrorKind`]) comes from the first read
    /// (or the `.await`); later failures from the reads after it.
    pub fn fetch<T: DeserializeOwned + Send + 'static>(self) -> RowStream<T> {
        RowStream::starting(async move {
            self.statement
                .fetch(&self.target, OpClass::Read, &self.options)
                .await
        })
    }

    /// The first row. Reads no further into the result: the rest is never sent in full, and the
    /// server stops the statement.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::RowNotFound`] when the query returned no rows; otherwise as [`fetch_all`](Self::fetch_all).
    pub async fn fetch_one<T: DeserializeOwned + Send>(self) -> Result<T> {
        self.statement
            .fetch_one(&self.target, OpClass::Read, &self.options)
            .await
    }

    /// The first row, or `None` when there is none. Reads no further into the result.
    ///
    /// # Errors
    ///
    /// As [`fetch_all`](Self::fetch_all).
    pub async fn fetch_optional<T: DeserializeOwned + Send>(self) -> Result<Option<T>> {
        let (first, rows) = self
            .statement
            .fetch_optional(&self.target, OpClass::Read, &self.options)
            .await?;
        rows.close().await;
        Ok(first)
    }
}

/// A read returning a [`Table`], made by [`Client::query_table`] or
/// [`Transaction::query_table`](crate::Transaction::query_table). `.await` it.
///
/// Retried on transient failures. Per-call settings override the client's for this call only.
///
/// ```no_run
/// # async fn run(client: sqlhttp::Client) -> sqlhttp::Result<()> {
/// use std::time::Duration;
///
/// // A long report: no per-attempt timeout for this call alone.
/// let report = client
///     .query_table("SELECT region, sum(total) AS total FROM orders GROUP BY region")
///     .timeout(None)
///     .await?;
/// println!("{} regions", report.len());
/// # Ok(())
/// # }
/// ```
///
/// # Errors
///
/// Any failure of the call after retries (see [`ErrorKind`]); [`ErrorKind::InvalidParameter`] before
/// anything is sent when a bound value is not a scalar.
#[derive(Debug, Clone)]
#[must_use = "a query does nothing until it is awaited"]
pub struct TableQuery {
    target: Target,
    statement: Statement,
    options: CallOptions,
}

bind_params!(TableQuery);
call_settings!(impl[] TableQuery);
retry_setting!(impl[] TableQuery);
read_settings!(impl[] TableQuery);

impl TableQuery {
    pub(crate) fn new(target: Target, sql: String) -> Self {
        Self {
            target,
            statement: Statement::new(sql),
            options: CallOptions::default(),
        }
    }
}

impl IntoFuture for TableQuery {
    type Output = Result<Table>;
    type IntoFuture = ResponseFuture<'static, Table>;

    fn into_future(self) -> Self::IntoFuture {
        ResponseFuture::new(async move {
            let mut all = Collect::<Vec<Cell>>::new();
            let delivered = self
                .statement
                .send(&self.target, OpClass::Read, &self.options, &mut all)
                .await?;
            Ok(all.into_table(delivered.attempts))
        })
    }
}

/// A statement run for its effect, made by [`Client::execute`] or
/// [`Transaction::execute`](crate::Transaction::execute). `.await` it for the rows affected and
/// the last insert id, or finish it with [`fetch_all`](Self::fetch_all),
/// [`fetch_one`](Self::fetch_one) or [`fetch_optional`](Self::fetch_optional) to decode the rows of a
/// `RETURNING` clause.
///
/// **Never retried** on the client: one attempt, whatever the client's or the call's settings. That
/// is why it has no `.retry` setting: a setting that could not take effect would only mislead. (In a
/// [`Transaction`](crate::Transaction) it is a step of the transaction, which the server makes safe
/// to send again: retried under the client's policy, as every step is.) It takes a
/// [`timeout`](Self::timeout) and a [`cancel_on`](Self::cancel_on) token like every call. After a
/// failure whose outcome is unknown ([`Error::is_outcome_unknown`]), check before running it again.
///
/// ```no_run
/// # async fn run(client: sqlhttp::Client) -> sqlhttp::Result<()> {
/// use serde::Deserialize;
///
/// let effect = client.execute("DELETE FROM sessions WHERE expires < ?").bind(1_700_000_000).await?;
/// println!("{} sessions deleted", effect.rows_affected);
///
/// #[derive(Deserialize)]
/// struct Created { id: i64 }
/// let created: Created = client
///     .execute("INSERT INTO users (name) VALUES (?) RETURNING id")
///     .bind("ada")
///     .fetch_one()
///     .await?;
/// println!("user {}", created.id);
/// # Ok(())
/// # }
/// ```
///
/// A retry policy does not apply:
///
/// ```compile_fail
/// # async fn run(client: sqlhttp::Client) {
/// let _ = client.execute("DELETE FROM t").retry(sqlhttp::RetryPolicy::new()).await;
/// # }
/// ```
///
/// # Errors
///
/// Any failure of the one attempt (see [`ErrorKind`]); [`ErrorKind::InvalidParameter`] before anything
/// is sent when a bound value is not a scalar.
#[derive(Debug, Clone)]
#[must_use = "a statement does nothing until it is awaited"]
pub struct Execute {
    target: Target,
    statement: Statement,
    options: CallOptions,
}

bind_params!(Execute);
call_settings!(impl[] Execute);

impl Execute {
    pub(crate) fn new(target: Target, sql: String) -> Self {
        Self {
            target,
            statement: Statement::new(sql),
            options: CallOptions::default(),
        }
    }

    /// Runs the statement once and decodes the rows of its `RETURNING` clause (or any rows it returns)
    /// into `T`s, as [`Query::fetch_all`] does. Never retried, unlike a `query`.
    ///
    /// # Errors
    ///
    /// Any failure of the one attempt (see [`ErrorKind`]); [`ErrorKind::Decode`] naming the row and
    /// column when a cell is not what `T` expects (the statement has run: its effects stay).
    pub async fn fetch_all<T: DeserializeOwned + Send>(self) -> Result<Vec<T>> {
        self.statement
            .fetch_all(&self.target, OpClass::Execute, &self.options)
            .await
    }

    /// Runs the statement once and returns the rows it returns (a `RETURNING` clause, a
    /// data-changing `WITH`) as a [`RowStream`], decoded one at a time as they arrive, in
    /// constant memory whatever the result's size, as [`Query::fetch`] does. **Never retried**,
    /// not even before the first row: the statement may have run. The request goes out when the
    /// stream is first read, or when it is awaited.
    ///
    /// ```no_run
    /// # async fn run(client: sqlhttp::Client) -> sqlhttp::Result<()> {
    /// let mut archived = client
    ///     .execute("DELETE FROM events WHERE at < ? RETURNING id")
    ///     .bind(1_700_000_000)
    ///     .fetch::<i64>();
    /// while let Some(id) = archived.try_next().await? {
    ///     println!("archived {id}");
    /// }
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// The one attempt's failure before the first row comes from the first read (or the
    /// `.await`); later failures from the reads after it. Either way the statement may have run
    /// in part or whole; a failure mid-stream means the server stopped it and rolled it back
    /// unless [`Error::is_outcome_unknown`] says otherwise.
    pub fn fetch<T: DeserializeOwned + Send + 'static>(self) -> RowStream<T> {
        RowStream::starting(async move {
            self.statement
                .fetch(&self.target, OpClass::Execute, &self.options)
                .await
        })
    }

    /// Runs the statement once and decodes the first returned row.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::RowNotFound`] when the statement returned no rows (it has run all the same);
    /// otherwise as [`fetch_all`](Self::fetch_all).
    pub async fn fetch_one<T: DeserializeOwned + Send>(self) -> Result<T> {
        self.statement
            .fetch_one(&self.target, OpClass::Execute, &self.options)
            .await
    }

    /// Runs the statement once and decodes the first returned row, or `None` when there is none.
    ///
    /// # Errors
    ///
    /// As [`fetch_all`](Self::fetch_all).
    pub async fn fetch_optional<T: DeserializeOwned + Send>(self) -> Result<Option<T>> {
        let (first, rows) = self
            .statement
            .fetch_optional(&self.target, OpClass::Execute, &self.options)
            .await?;
        rows.close().await;
        Ok(first)
    }

    /// Runs the statement once and returns what it returned with its columns, as
    /// [`Client::query_table`] does, plus [`Table::rows_affected`]. Never retried: the way to run a
    /// statement whose shape is known only at run time (a shell, a migration tool) safely.
    ///
    /// ```no_run
    /// # async fn run(client: sqlhttp::Client) -> sqlhttp::Result<()> {
    /// let table = client
    ///     .execute("UPDATE users SET active = 0 WHERE last_seen < ? RETURNING id, name")
    ///     .bind("2020-01-01")
    ///     .fetch_table()
    ///     .await?;
    /// println!("{} rows changed; columns {:?}", table.rows_affected(), table.columns());
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// Any failure of the one attempt (see [`ErrorKind`]).
    pub async fn fetch_table(self) -> Result<Table> {
        let mut all = Collect::<Vec<Cell>>::new();
        let delivered = self
            .statement
            .send(&self.target, OpClass::Execute, &self.options, &mut all)
            .await?;
        Ok(all.into_table(delivered.attempts))
    }
}

impl IntoFuture for Execute {
    type Output = Result<ExecResult>;
    type IntoFuture = ResponseFuture<'static, ExecResult>;

    fn into_future(self) -> Self::IntoFuture {
        ResponseFuture::new(async move {
            let mut effect = Collect::<IgnoredAny>::new();
            let delivered = self
                .statement
                .send(&self.target, OpClass::Execute, &self.options, &mut effect)
                .await?;
            decode::effect_of(&effect.decoder, delivered.attempts)
                .map_err(|err| delivered.attach(err))
        })
    }
}
