//! One attempt on the wire: which endpoint a call goes to, the request of one attempt
//! ([`AttemptRequest`]), the [`Exchange`] seam the retry loop sends it through, and the real
//! exchange over reqwest ([`HttpExchange`]), which sets the protocol's headers and maps a
//! non-success response or a failure of the HTTP stack through `response`.
//!
//! It makes exactly one exchange per call of `send`: it knows nothing of retries, backoff, the
//! budget, cancellation or timeouts (the loop in the parent module applies them around it), nor of
//! rows or SQL.

use std::pin::Pin;

use bytes::Bytes;
use http::HeaderValue;
use http::header::{ACCEPT, AUTHORIZATION, CONTENT_TYPE, USER_AGENT};

use super::body::Body;
use sqlhttp_protocol::{header, path};

use crate::bookmark::{self, Bookmark, Consistency};
use crate::response::{self, Failure};

/// The header naming an attempt's number and the most the call will make, e.g. `2/3`.
pub(crate) const ATTEMPT_HEADER: &str = header::ATTEMPT;
/// The header carrying a write's idempotency key.
pub(crate) const IDEMPOTENCY_KEY_HEADER: &str = header::IDEMPOTENCY_KEY;

/// Which of the protocol's endpoints a call goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Endpoint {
    /// `POST /api/v1/sql`: one statement.
    Sql,
    /// `POST /api/v1/batch`: several statements in one transaction.
    Batch,
    /// `POST /api/v1/describe`: the tables, or one table's columns.
    Describe,
    /// `POST /api/v1/describe/statement`: one statement's parameters and columns, nothing run.
    DescribeStatement,
    /// `POST /api/v1/transaction/...`: a step of an interactive transaction.
    Transaction(TxStep),
}

/// Which step of an interactive transaction a request is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TxStep {
    Open,
    Statement,
    Commit,
    Rollback,
    /// `/outcome`: how the transaction ended, asked after a COMMIT whose outcome is unknown.
    Outcome,
}

impl TxStep {
    /// The step's path.
    fn path(self) -> &'static str {
        match self {
            TxStep::Open => path::TRANSACTION_OPEN,
            TxStep::Statement => path::TRANSACTION_STATEMENT,
            TxStep::Commit => path::TRANSACTION_COMMIT,
            TxStep::Rollback => path::TRANSACTION_ROLLBACK,
            TxStep::Outcome => path::TRANSACTION_OUTCOME,
        }
    }
}

impl Endpoint {
    /// The endpoint's URL, for a client whose SQL endpoint is `sql` (the others are its
    /// siblings).
    pub(crate) fn url(
        self,
        sql: &reqwest::Url,
        batch: &reqwest::Url,
        describe: &reqwest::Url,
    ) -> reqwest::Url {
        match self {
            Endpoint::Sql => sql.clone(),
            Endpoint::Batch => batch.clone(),
            Endpoint::Describe => describe.clone(),
            Endpoint::DescribeStatement | Endpoint::Transaction(_) => {
                let full = match self {
                    Endpoint::Transaction(step) => step.path(),
                    _ => path::DESCRIBE_STATEMENT,
                };
                // Relative to `/api/v1/`: a sibling of `/api/v1/sql` always joins.
                let relative = full
                    .strip_prefix(path::API_PREFIX)
                    .unwrap_or(full)
                    .trim_start_matches('/');
                sql.join(relative).unwrap_or_else(|_| sql.clone())
            }
        }
    }
}

/// One attempt's request, as the exchange sends it.
pub(crate) struct AttemptRequest<'a> {
    pub(crate) endpoint: Endpoint,
    pub(crate) body: &'a Bytes,
    pub(crate) attempt: u32,
    pub(crate) max_attempts: u32,
    pub(crate) idempotency_key: Option<&'a HeaderValue>,
    /// The least position the answer must be consistent with: the greatest bookmark known when
    /// this attempt is sent.
    pub(crate) bookmark: Option<Bookmark>,
    /// Which server may answer; only [`Consistency::Primary`] is sent (the others are the server's
    /// default once the bookmark says how fresh).
    pub(crate) consistency: Consistency,
}

impl AttemptRequest<'_> {
    /// The bookmark and consistency headers of this attempt, as the exchanges send them.
    pub(crate) fn freshness_headers(
        &self,
    ) -> impl Iterator<Item = (&'static str, HeaderValue)> + use<> {
        let bookmark = self
            .bookmark
            .map(|at| (header::BOOKMARK, bookmark::header_value(at)));
        let primary = (self.consistency == Consistency::Primary).then(|| {
            (
                header::CONSISTENCY,
                HeaderValue::from_static(header::CONSISTENCY_PRIMARY),
            )
        });
        bookmark.into_iter().chain(primary)
    }
}

/// The future of one exchange.
pub(crate) type ExchangeFuture<'a> =
    Pin<Box<dyn Future<Output = Result<Body, Failure>> + Send + 'a>>;

/// One HTTP exchange: a request out, a success head (its body still to read) or the failure's kind
/// back. The loop around it does not know HTTP; unit tests script this seam to drive the loop on a
/// paused clock.
pub(crate) trait Exchange: Send + Sync {
    fn send<'a>(&'a self, request: AttemptRequest<'a>) -> ExchangeFuture<'a>;
}

/// The real exchange, over reqwest.
pub(crate) struct HttpExchange {
    pub(crate) http: reqwest::Client,
    pub(crate) endpoint: reqwest::Url,
    pub(crate) batch_endpoint: reqwest::Url,
    pub(crate) describe_endpoint: reqwest::Url,
    pub(crate) authorization: Option<HeaderValue>,
    pub(crate) user_agent: HeaderValue,
}

impl Exchange for HttpExchange {
    fn send<'a>(&'a self, request: AttemptRequest<'a>) -> ExchangeFuture<'a> {
        Box::pin(self.exchange(request))
    }
}

/// The most of an error response's body read, decompressed: an error's message is short, and
/// the rest is not waited for (the connection is closed with the response).
const MAX_ERROR_BODY: usize = 64 * 1024;

impl HttpExchange {
    /// One HTTP exchange: the request, the status, and a success body to read (an error's whole).
    async fn exchange(&self, request: AttemptRequest<'_>) -> Result<Body, Failure> {
        let freshness = request.freshness_headers();
        let AttemptRequest {
            endpoint,
            body,
            attempt,
            max_attempts,
            idempotency_key,
            ..
        } = request;
        let mut request = self
            .http
            .post(endpoint.url(
                &self.endpoint,
                &self.batch_endpoint,
                &self.describe_endpoint,
            ))
            .header(CONTENT_TYPE, "application/json")
            .header(ACCEPT, "application/json")
            .header(USER_AGENT, self.user_agent.clone())
            .header(ATTEMPT_HEADER, format!("{attempt}/{max_attempts}"))
            .body(body.clone());
        if let Some(authorization) = &self.authorization {
            request = request.header(AUTHORIZATION, authorization.clone());
        }
        if let Some(key) = idempotency_key {
            request = request.header(IDEMPOTENCY_KEY_HEADER, key.clone());
        }
        for (name, value) in freshness {
            request = request.header(name, value);
        }
        // The attempt's span (the current one) as W3C `traceparent`/`tracestate`.
        #[cfg(feature = "opentelemetry")]
        {
            request = request.headers(super::trace::propagation_headers());
        }
        let mut response = request.send().await.map_err(response::from_transport)?;
        let status = response.status();
        if status.is_success() {
            return Ok(Body::http(response));
        }
        let headers = std::mem::take(response.headers_mut());
        // The status decides; a body cut short only costs the server's message. At most
        // [`MAX_ERROR_BODY`] of it is read, decompressed bytes counted: a server that answers an
        // error with megabytes (or a compression bomb) costs the client no more than that.
        let mut body = Vec::new();
        while body.len() < MAX_ERROR_BODY {
            let Ok(Some(chunk)) = response.chunk().await else {
                break;
            };
            let room = MAX_ERROR_BODY - body.len();
            body.extend_from_slice(chunk.get(..room).unwrap_or(&chunk));
        }
        Err(response::failure_from_status(
            status.as_u16(),
            &headers,
            &body,
        ))
    }
}
