//! An in-process server in place of HTTP, for simulations and tests of code built on the SDK
//! (feature `test-util`, tokio's and clickhouse-rs's name for it; off by default).
//!
//! [`ClientBuilder::simulated_server`](crate::ClientBuilder::simulated_server) hands every attempt to a
//! function of yours instead of the network: it receives the request the client would have sent (method,
//! URL, headers such as `Sqlhttp-Attempt`, `Idempotency-Key` and `Sqlhttp-Bookmark`, the JSON body)
//! and answers with a response (whose `Sqlhttp-Bookmark` header, if any, the client keeps as a real
//! server's), or with an I/O error standing for a failed connection. Everything else is the real client:
//! the retry rules, backoff and jitter, `Retry-After`, timeouts, the retry budget, the mapping of
//! statuses to [`ErrorKind`]s, decoding. No socket is opened, so on tokio's paused
//! clock (`tokio::time::pause`) a simulation is deterministic and runs as fast as the CPU allows.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> sqlhttp::Result<()> {
//! use bytes::Bytes;
//! use sqlhttp::simulation::{Request, Response};
//!
//! let client = sqlhttp::Client::builder("http://simulated")
//!     .simulated_server(|request: Request| async move {
//!         assert_eq!(request.headers()["content-type"], "application/json");
//!         let body = r#"{"columns":[{"name":"n","type":""}],"rows":[[1]],"rows_affected":0,"last_insert_id":null}"#;
//!         Ok(Response::new(Bytes::from_static(body.as_bytes())))
//!     })
//!     .build()?;
//! assert_eq!(client.query("SELECT 1").fetch_one::<i64>().await?, 1);
//! # Ok(())
//! # }
//! ```

use std::fmt;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;

use bytes::Bytes;
use http::HeaderValue;
use http::header::{ACCEPT, AUTHORIZATION, CONTENT_TYPE, USER_AGENT};

use crate::ErrorKind;
use crate::bookmark;
use crate::response::{self, Failure};
use crate::transport::Body;
use crate::transport::exchange::{
    ATTEMPT_HEADER, AttemptRequest, Exchange, ExchangeFuture, IDEMPOTENCY_KEY_HEADER,
};

/// The request of one attempt, as the client would send it.
pub type Request = http::Request<Bytes>;
/// The simulated server's answer.
pub type Response = http::Response<Bytes>;

type Handler =
    dyn Fn(Request) -> Pin<Box<dyn Future<Output = io::Result<Response>> + Send>> + Send + Sync;

/// A simulated server: a function from a request to a response or a connection failure.
#[derive(Clone)]
pub(crate) struct SimulatedServer {
    handler: Arc<Handler>,
}

impl SimulatedServer {
    pub(crate) fn new<F, Fut>(handler: F) -> Self
    where
        F: Fn(Request) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = io::Result<Response>> + Send + 'static,
    {
        Self {
            handler: Arc::new(move |request| Box::pin(handler(request))),
        }
    }
}

impl fmt::Debug for SimulatedServer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SimulatedServer").finish_non_exhaustive()
    }
}

/// The exchange over a simulated server: the same request headers as over HTTP.
pub(crate) struct SimulatedExchange {
    pub(crate) server: SimulatedServer,
    pub(crate) endpoint: reqwest::Url,
    pub(crate) batch_endpoint: reqwest::Url,
    pub(crate) describe_endpoint: reqwest::Url,
    pub(crate) authorization: Option<HeaderValue>,
    pub(crate) user_agent: HeaderValue,
}

impl Exchange for SimulatedExchange {
    fn send<'a>(&'a self, request: AttemptRequest<'a>) -> ExchangeFuture<'a> {
        let url = request.endpoint.url(
            &self.endpoint,
            &self.batch_endpoint,
            &self.describe_endpoint,
        );
        let mut builder = http::Request::post(url.as_str())
            .header(CONTENT_TYPE, "application/json")
            .header(ACCEPT, "application/json")
            .header(USER_AGENT, self.user_agent.clone())
            .header(
                ATTEMPT_HEADER,
                format!("{}/{}", request.attempt, request.max_attempts),
            );
        if let Some(authorization) = &self.authorization {
            builder = builder.header(AUTHORIZATION, authorization.clone());
        }
        if let Some(key) = request.idempotency_key {
            builder = builder.header(IDEMPOTENCY_KEY_HEADER, key.clone());
        }
        for (name, value) in request.freshness_headers() {
            builder = builder.header(name, value);
        }
        let built = builder
            .body(request.body.clone())
            .expect("the endpoint and headers were validated by build()");
        let answer = (self.server.handler)(built);
        Box::pin(async move {
            match answer.await {
                Ok(response) if response.status().is_success() => {
                    let bookmark = bookmark::from_headers(response.headers());
                    Ok(Body::from(response.into_body()).with_bookmark(bookmark))
                }
                Ok(response) => {
                    let status = response.status().as_u16();
                    Err(response::failure_from_status(
                        status,
                        response.headers(),
                        response.body(),
                    ))
                }
                Err(err) => Err(Failure {
                    kind: ErrorKind::Connection {
                        message: err.to_string(),
                    },
                    // A refused connection sent nothing; anything else may have been sent.
                    sent: err.kind() != io::ErrorKind::ConnectionRefused,
                    source: Some(Box::new(err)),
                    statement: None,
                    request_id: None,
                }),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;

    /// A simulated server's `Sqlhttp-Bookmark` is kept as a real one's, and sent on the next request.
    #[tokio::test(flavor = "current_thread")]
    async fn a_simulated_answer_s_bookmark_is_kept_and_sent() {
        let seen: Arc<Mutex<Vec<Option<String>>>> = Arc::default();
        let log = seen.clone();
        let client = crate::Client::builder("http://simulated")
            .simulated_server(move |request: Request| {
                let sent = request
                    .headers()
                    .get("sqlhttp-bookmark")
                    .map(|v| v.to_str().unwrap().to_owned());
                log.lock().unwrap().push(sent);
                async move {
                    let body = r#"{"columns":[{"name":"n","type":""}],"rows":[[1]],"rows_affected":0,"last_insert_id":null}"#;
                    let response = http::Response::builder()
                        .header("sqlhttp-bookmark", "00000000000000ff")
                        .body(Bytes::from_static(body.as_bytes()))
                        .unwrap();
                    Ok(response)
                }
            })
            .build()
            .unwrap();
        client.ping().await.unwrap();
        client.ping().await.unwrap();
        assert_eq!(
            client.bookmark().map(|b| b.to_string()).as_deref(),
            Some("00000000000000ff")
        );
        assert_eq!(
            *seen.lock().unwrap(),
            [None, Some("00000000000000ff".to_owned())]
        );
    }
}
