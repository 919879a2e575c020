//! Connection-level faults from the testkit's connector: refused and reset connects, and a hung
//! connect cut by the per-attempt timeout, each recovered by a read.

use std::time::Duration;

use sqlhttp::Client;
use sqlhttp_testkit::{ConnectFault, FaultConnector};

use crate::harness::*;

fn client(live: &Live, faults: &FaultConnector) -> Client {
    let http = reqwest::Client::builder()
        .connector_layer(faults.clone())
        .retry(reqwest::retry::never())
        .redirect(reqwest::redirect::Policy::none())
        .pool_max_idle_per_host(0)
        .build()
        .unwrap();
    live.builder()
        .http_client(http)
        .timeout(Duration::from_millis(500))
        .build()
        .unwrap()
}

#[tokio::test]
async fn refused_connects_are_retried() {
    let live = Live::start().await;
    let table = unique_table("refused");
    let rows = seed(&live.client(), &table, 12).await;
    let faults = FaultConnector::new().fail_first(2, ConnectFault::Refused);
    assert_eq!(all_rows(&client(&live, &faults), &table).await, rows);
    assert_eq!((faults.attempts(), faults.faults_injected()), (3, 2));
}

#[tokio::test]
async fn reset_connects_are_retried() {
    let live = Live::start().await;
    let table = unique_table("reset");
    let rows = seed(&live.client(), &table, 12).await;
    let faults = FaultConnector::new().fail_first(1, ConnectFault::Reset);
    assert_eq!(all_rows(&client(&live, &faults), &table).await, rows);
    assert_eq!(faults.attempts(), 2);
}

#[tokio::test]
async fn a_hung_connect_is_cut_by_the_attempt_timeout() {
    let live = Live::start().await;
    let faults = FaultConnector::new().fail_first(1, ConnectFault::Hang);
    client(&live, &faults).ping().await.unwrap();
    assert_eq!(faults.attempts(), 2);
}

#[tokio::test]
async fn refused_connects_beyond_the_attempts_fail_as_connection_errors() {
    let live = Live::start().await;
    let faults = FaultConnector::new().fail_first(5, ConnectFault::Refused);
    let err = client(&live, &faults).ping().await.unwrap_err();
    assert!(err.is_connection(), "{err:?}");
    assert_eq!((err.attempts(), faults.attempts()), (3, 3));
    assert!(err.to_string().to_lowercase().contains("refused"), "{err}");
}
