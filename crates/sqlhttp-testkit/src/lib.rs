//! Fault injection for testing sqlhttp clients (or any HTTP/1.1 client) against real failures.
//!
//! Three tools, from the lowest layer up:
//!
//! * [`FaultConnector`]: a tower layer for reqwest's connector
//!   (`reqwest::ClientBuilder::connector_layer`) that refuses, resets, delays or hangs planned
//!   connection attempts, then connects for real. reqwest reports its failures as connect errors,
//!   exactly like real ones.
//! * [`ChaosProxy`]: an HTTP/1.1 proxy on loopback that applies one planned [`Fault`] per request:
//!   close or reset before forwarding (the server never saw the request), drop the response after
//!   the server did the work, delay or truncate it, answer `429`/`503`/... itself, or stall. In
//!   front of several upstreams ([`ChaosProxy::start_balanced`]) it is a round-robin load
//!   balancer that fails over past upstreams that are down, for tests with replicas.
//! * [`TestServer`]: the reference server `sqlhttpd` in-process on an ephemeral port, in-memory or
//!   file-backed, with stop/restart on the same port, SDK client builders pointed at it or at a
//!   proxy in front of it; and [`ServerProcess`] for the `sqlhttpd` binary as a child process.
//!   With the `harness` feature it is a test harness for applications:
//!   `TestServer::start().migrations(dir).fixture(sql)` gives each test its own database (SQLite
//!   in memory, or a fresh PostgreSQL database with `.postgres(url)`) with the application's
//!   schema and data, a [`TestServer::client`] for it and the chaos proxy one call away.
//!
//! Everything listens and connects on `127.0.0.1` only. Plans are FIFO queues shared by clones;
//! counters are atomics readable at any time.
//!
//! ```
//! use std::time::Duration;
//! use sqlhttp_testkit::{ChaosProxy, ConnectFault, Fault, FaultConnector};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let upstream = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
//! // A proxy in front of the server under test: the first request is answered with a 503, the
//! // second reaches the server but its response is lost.
//! let proxy = ChaosProxy::start(upstream.local_addr()?).await?;
//! proxy.push_all([Fault::unavailable(1), Fault::DropAfterForward]);
//!
//! // A connector whose first connection attempt is refused.
//! let faults = FaultConnector::new().fail_first(1, ConnectFault::Refused);
//! let http = reqwest::Client::builder()
//!     .connector_layer(faults.clone())
//!     .retry(reqwest::retry::never())
//!     .timeout(Duration::from_secs(5))
//!     .build()?;
//!
//! let error = http.get(proxy.url()).send().await.unwrap_err();
//! assert!(error.is_connect());
//! let response = http.get(proxy.url()).send().await?;
//! assert_eq!(response.status(), 503);
//! assert_eq!(response.headers()["retry-after"], "1");
//! assert_eq!((faults.attempts(), proxy.requests(), proxy.forwarded()), (2, 1, 0));
//! # Ok(())
//! # }
//! ```

// docs.rs builds with `--cfg docsrs` on nightly (Cargo.toml's `[package.metadata.docs.rs]`): there
// the `harness` feature's methods carry its badge.
#![cfg_attr(docsrs, feature(doc_cfg))]

mod connector;
#[cfg(feature = "harness")]
mod harness;
mod process;
mod proxy;
mod server;

pub use connector::{ConnectFault, FaultConnecting, FaultConnector, FaultConnectorService};
pub use process::ServerProcess;
pub use proxy::{ChaosProxy, Fault};
pub use server::{TestServer, TestServerBuilder};
