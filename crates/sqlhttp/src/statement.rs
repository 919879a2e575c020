//! A statement on its way out: SQL text, bound parameters, an optional cancellation token, and the
//! request builders that finish it ([`Query`], [`TableQuery`], [`Execute`]).
//!
//! Parameters are always bound, never spliced into SQL: each is serialized to a JSON scalar and sent
//! beside the text. This module knows the request body of protocol v1, not the transport's rules.

use std::future::{Future, IntoFuture};
use std::pin::Pin;

use bytes::Bytes;
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio_util::sync::CancellationToken;

use crate::client::Client;
use crate::decode;
use crate::error::{Error, ErrorKind, Result};
use crate::retry::classify::OpClass;
use crate::table::{ExecResult, Table, Value};
use crate::transport::Delivered;

/// The request body of protocol v1.
#[derive(Serialize)]
pub(crate) struct RequestBody<'a> {
    pub(crate) sql: &'a str,
    #[serde(skip_serializing_if = "<[Value]>::is_empty")]
    pub(crate) params: &'a [Value],
}

impl RequestBody<'_> {
    pub(crate) fn encode(&self) -> Bytes {
        Bytes::from(
            serde_json::to_vec(self).expect("a request body of JSON scalars always serializes"),
        )
    }
}

/// Checks that a value can travel as a parameter: null, a bool, an integer in `i64`, a float, or a string.
pub(crate) fn check_scalar(value: &Value) -> Result<(), String> {
    match value {
        Value::Null | Value::Bool(_) | Value::String(_) => Ok(()),
        Value::Number(n) if n.is_i64() || n.is_f64() => Ok(()),
        Value::Number(_) => {
            Err("an integer above i64::MAX does not fit in a signed 64-bit integer".to_owned())
        }
        Value::Array(_) => Err("a sequence cannot be bound; bind each element".to_owned()),
        Value::Object(_) => Err("a struct or map cannot be bound as one parameter".to_owned()),
    }
}

/// SQL, parameters and cancellation, shared by every request builder. Its `Debug` shows how many
/// parameters are bound, never their values.
#[derive(Clone)]
pub(crate) struct Statement {
    sql: String,
    params: Vec<Value>,
    invalid: Option<ErrorKind>,
    cancel: Option<CancellationToken>,
}

impl std::fmt::Debug for Statement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Statement")
            .field("sql", &self.sql)
            .field("params", &format_args!("<{} bound>", self.params.len()))
            .field("cancellable", &self.cancel.is_some())
            .finish_non_exhaustive()
    }
}

impl Statement {
    pub(crate) fn new(sql: String) -> Self {
        Self {
            sql,
            params: Vec::new(),
            invalid: None,
            cancel: None,
        }
    }

    fn bind<T: Serialize + ?Sized>(&mut self, value: &T) {
        if self.invalid.is_some() {
            return;
        }
        let index = self.params.len();
        let checked = serde_json::to_value(value)
            .map_err(|err| err.to_string())
            .and_then(|value| check_scalar(&value).map(|()| value));
        match checked {
            Ok(value) => self.params.push(value),
            Err(message) => {
                self.invalid = Some(ErrorKind::InvalidParameter {
                    index: Some(index),
                    message,
                });
            }
        }
    }

    /// Sends the statement as an operation of `class`; a parameter that could not be bound fails here,
    /// before anything is sent.
    async fn send(self, client: &Client, class: OpClass) -> Result<Delivered> {
        if let Some(kind) = self.invalid {
            return Err(Error::new(kind));
        }
        let body = RequestBody {
            sql: &self.sql,
            params: &self.params,
        }
        .encode();
        client
            .send(class, body, &self.sql, self.cancel.as_ref(), None)
            .await
    }
}

/// The boxed future returned by `.await` on a request builder.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T>> + Send + 'a>>;

macro_rules! statement_builder {
    ($builder:ident) => {
        impl $builder {
            /// Binds the next positional parameter (`?` in SQLite). Any `Serialize` value that is a
            /// scalar: `Option::None` and `()` bind `NULL`; bools, integers within `i64`, floats and
            /// strings bind as themselves (a NaN or infinite float binds `NULL`: JSON has no such
            /// numbers). Anything else fails the call before it is sent.
            pub fn bind<T: Serialize>(mut self, value: T) -> Self {
                self.statement.bind(&value);
                self
            }

            /// Cancels this call when `token` is cancelled: at once, mid-attempt or mid-backoff, with
            /// [`ErrorKind::Cancelled`]. The client's own token, if any, applies as well. Cancelling
            /// stops the client, not the server: a statement already sent may still commit.
            pub fn cancel_on(mut self, token: &CancellationToken) -> Self {
                self.statement.cancel = Some(token.clone());
                self
            }
        }
    };
}

/// A read returning typed rows, made by [`Client::query`]. Finish it with [`fetch_all`](Self::fetch_all),
/// [`fetch_one`](Self::fetch_one) or [`fetch_optional`](Self::fetch_optional).
#[derive(Debug, Clone)]
#[must_use = "a query does nothing until it is fetched"]
pub struct Query {
    client: Client,
    statement: Statement,
}

statement_builder!(Query);

impl Query {
    pub(crate) fn new(client: Client, sql: String) -> Self {
        Self {
            client,
            statement: Statement::new(sql),
        }
    }

    /// Every row, each decoded into a `T`: a struct (by column name), a tuple (by position), a map, or a
    /// scalar when the result has one column. `Option<_>` fields read `NULL`.
    ///
    /// # Errors
    ///
    /// Any failure of the call (see [`ErrorKind`]); [`ErrorKind::Decode`] naming the row and column when a
    /// cell is not what `T` expects.
    pub async fn fetch_all<T: DeserializeOwned>(self) -> Result<Vec<T>> {
        let delivered = self.statement.send(&self.client, OpClass::Read).await?;
        delivered.decode(decode::rows)
    }

    /// The first row.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::RowNotFound`] when the query returned no rows; otherwise as [`fetch_all`](Self::fetch_all).
    pub async fn fetch_one<T: DeserializeOwned>(self) -> Result<T> {
        let delivered = self.statement.send(&self.client, OpClass::Read).await?;
        let rows: Vec<T> = delivered.decode(decode::rows)?;
        rows.into_iter()
            .next()
            .ok_or_else(|| delivered.attach(Error::new(ErrorKind::RowNotFound)))
    }

    /// The first row, or `None` when there is none.
    ///
    /// # Errors
    ///
    /// As [`fetch_all`](Self::fetch_all).
    pub async fn fetch_optional<T: DeserializeOwned>(self) -> Result<Option<T>> {
        Ok(self.fetch_all().await?.into_iter().next())
    }
}

/// A read returning a [`Table`], made by [`Client::query_table`]. `.await` it.
///
/// # Errors
///
/// Any failure of the call after retries (see [`ErrorKind`]); [`ErrorKind::InvalidParameter`] before
/// anything is sent when a bound value is not a scalar.
#[derive(Debug, Clone)]
#[must_use = "a query does nothing until it is awaited"]
pub struct TableQuery {
    client: Client,
    statement: Statement,
}

statement_builder!(TableQuery);

impl TableQuery {
    pub(crate) fn new(client: Client, sql: String) -> Self {
        Self {
            client,
            statement: Statement::new(sql),
        }
    }
}

impl IntoFuture for TableQuery {
    type Output = Result<Table>;
    type IntoFuture = BoxFuture<'static, Table>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(async move {
            let delivered = self.statement.send(&self.client, OpClass::Read).await?;
            delivered.decode(decode::table)
        })
    }
}

/// A statement run for its effect, made by [`Client::execute`]. `.await` it. Never retried.
///
/// # Errors
///
/// Any failure of the one attempt (see [`ErrorKind`]); [`ErrorKind::InvalidParameter`] before anything
/// is sent when a bound value is not a scalar.
#[derive(Debug, Clone)]
#[must_use = "a statement does nothing until it is awaited"]
pub struct Execute {
    client: Client,
    statement: Statement,
}

statement_builder!(Execute);

impl Execute {
    pub(crate) fn new(client: Client, sql: String) -> Self {
        Self {
            client,
            statement: Statement::new(sql),
        }
    }
}

impl IntoFuture for Execute {
    type Output = Result<ExecResult>;
    type IntoFuture = BoxFuture<'static, ExecResult>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(async move {
            let delivered = self.statement.send(&self.client, OpClass::Execute).await?;
            delivered.decode(decode::exec_result)
        })
    }
}
