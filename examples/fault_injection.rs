//! Testing your own retry handling with `sqlhttp-testkit`: a live `sqlhttpd`, a chaos proxy in front
//! of it, and a connector that refuses connections, all on loopback.
//!
//! ```text
//! cargo run --example fault_injection
//! ```
//!
//! It shows, with the counts the proxy and the connector keep:
//! 1. a read recovering from a refused connect, a dropped connection, a 503 and a truncated response;
//! 2. a write whose response is lost after the server committed it: an error without `retry_writes`,
//!    exactly-once success with it (the idempotency key), and the duplicate against a server with keys
//!    off — why `retry_writes` is opt-in;
//! 3. a final failure (bad SQL) that is not retried.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use sqlhttp::{Client, RetryPolicy};
use sqlhttp_server::Config;
use sqlhttp_testkit::{ConnectFault, Fault, FaultConnector, TestServer};

#[derive(Debug, Serialize, Deserialize, PartialEq)]
struct Event {
    id: i64,
    kind: String,
}

type Result<T = ()> = std::result::Result<T, Box<dyn std::error::Error>>;

#[tokio::main]
async fn main() -> Result {
    let server = TestServer::start().await;
    println!("sqlhttpd at {}", server.url());
    let direct = server.client_builder().build()?;
    direct
        .execute("CREATE TABLE events (id INTEGER NOT NULL, kind TEXT NOT NULL)")
        .await?;

    reads_recover(&server).await?;
    writes_with_and_without_keys(&server).await?;
    final_failures_are_not_retried(&server).await?;
    Ok(())
}

/// Backoff in milliseconds so the example runs quickly.
fn quick() -> RetryPolicy {
    RetryPolicy::new()
        .with_max_attempts(6)
        .with_initial_backoff(Duration::from_millis(10))
        .with_max_backoff(Duration::from_millis(100))
}

async fn reads_recover(server: &TestServer) -> Result {
    println!("\n1. a read through faults");
    let proxy = server.proxy().await;
    proxy.push_all([
        Fault::ResetBeforeForward,
        Fault::unavailable(0),
        Fault::Truncate(40),
    ]);
    let faults = FaultConnector::new().fail_first(1, ConnectFault::Refused);
    let http = reqwest::Client::builder()
        .connector_layer(faults.clone())
        .retry(reqwest::retry::never())
        .redirect(reqwest::redirect::Policy::none())
        .build()?;
    let client = server
        .proxied_client_builder(&proxy)
        .http_client(http)
        .retry(quick())
        .build()?;
    let n: i64 = client
        .query("SELECT count(*) FROM events")
        .fetch_one()
        .await?;
    println!(
        "   count(*) = {n} after {} connects ({} refused) and {} requests at the proxy ({} reached the server)",
        faults.attempts(),
        faults.faults_injected(),
        proxy.requests(),
        proxy.forwarded()
    );
    Ok(())
}

async fn writes_with_and_without_keys(server: &TestServer) -> Result {
    println!("\n2. a write whose response is lost after the server committed it");
    let rows = [Event {
        id: 1,
        kind: "signup".into(),
    }];
    let count = |client: Client| async move {
        client
            .query("SELECT count(*) FROM events")
            .fetch_one::<i64>()
            .await
    };
    let direct = server.client_builder().build()?;

    let before = count(direct.clone()).await?;
    let proxy = server.proxy().await;
    proxy.push(Fault::DropAfterForward);
    let plain = server
        .proxied_client_builder(&proxy)
        .retry(quick())
        .build()?;
    let err = plain.insert("events", &rows).await.unwrap_err();
    let after = count(direct.clone()).await?;
    println!("   without retry_writes: {err}");
    println!("     the server committed it once: rows {before} -> {after}");

    let before = after;
    let proxy = server.proxy().await;
    proxy.push(Fault::DropAfterForward);
    let retrying = server
        .proxied_client_builder(&proxy)
        .retry(quick())
        .retry_writes(true)
        .build()?;
    retrying.insert("events", &rows).await?;
    let after = count(direct.clone()).await?;
    println!(
        "   with retry_writes: ok; the server saw the statement {} times and the key kept one effect: rows {before} -> {after}",
        proxy.forwarded()
    );

    let keyless = TestServer::with_config(Config {
        idempotency_ttl: None,
        ..Config::default()
    })
    .await;
    keyless
        .client_builder()
        .build()?
        .execute("CREATE TABLE events (id INTEGER NOT NULL, kind TEXT NOT NULL)")
        .await?;
    let proxy = keyless.proxy().await;
    proxy.push(Fault::DropAfterForward);
    let retrying = keyless
        .proxied_client_builder(&proxy)
        .retry(quick())
        .retry_writes(true)
        .build()?;
    retrying.insert("events", &rows).await?;
    println!(
        "   against a server with keys off: ok, but rows 0 -> {} (the duplicate retry_writes warns about)",
        count(keyless.client_builder().build()?).await?
    );
    Ok(())
}

async fn final_failures_are_not_retried(server: &TestServer) -> Result {
    println!("\n3. a final failure");
    let proxy = server.proxy().await;
    let client = server
        .proxied_client_builder(&proxy)
        .retry(quick())
        .build()?;
    let err = client
        .query("SELEC 1")
        .fetch_all::<i64>()
        .await
        .unwrap_err();
    println!(
        "   {err} — {} attempt, {} request at the proxy",
        err.attempts(),
        proxy.requests()
    );
    Ok(())
}
