//! `FaultConnector` through a real reqwest client against a loopback upstream: injected
//! failures must look to reqwest exactly like real connection failures.

mod support;

use std::io;
use std::time::{Duration, Instant};

use sqlhttp_testkit::{ConnectFault, FaultConnector};
use support::{Upstream, io_kind};

fn client_with(faults: &FaultConnector) -> reqwest::Client {
    reqwest::Client::builder()
        .connector_layer(faults.clone())
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap()
}

#[tokio::test]
async fn refused_attempts_are_connect_errors_then_the_real_connection_succeeds() {
    let upstream = Upstream::start().await;
    let faults = FaultConnector::new().fail_first(2, ConnectFault::Refused);
    let http = client_with(&faults);

    for _ in 0..2 {
        let error = http.get(upstream.url()).send().await.unwrap_err();
        assert!(error.is_connect(), "{error:?}");
        assert_eq!(io_kind(&error), Some(io::ErrorKind::ConnectionRefused));
    }
    let response = http.get(upstream.url()).send().await.unwrap();
    assert_eq!(response.text().await.unwrap(), "hello");

    assert_eq!(faults.attempts(), 3);
    assert_eq!(faults.faults_injected(), 2);
    assert_eq!(faults.pending(), 0);
    assert_eq!(upstream.served(), 1);
}

#[tokio::test]
async fn reset_is_a_connect_error_with_connection_reset() {
    let upstream = Upstream::start().await;
    let faults = FaultConnector::new().then(ConnectFault::Reset);
    let http = client_with(&faults);

    let error = http.get(upstream.url()).send().await.unwrap_err();
    assert!(error.is_connect(), "{error:?}");
    assert_eq!(io_kind(&error), Some(io::ErrorKind::ConnectionReset));
    assert_eq!(upstream.served(), 0);
    assert!(http.get(upstream.url()).send().await.is_ok());
    assert_eq!(faults.attempts(), 2);
}

#[tokio::test]
async fn hang_ends_at_the_connect_timeout_as_a_connect_timeout() {
    let upstream = Upstream::start().await;
    let faults = FaultConnector::new().then(ConnectFault::Hang);
    let http = reqwest::Client::builder()
        .connector_layer(faults.clone())
        .connect_timeout(Duration::from_millis(50))
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap();

    let error = http.get(upstream.url()).send().await.unwrap_err();
    assert!(error.is_connect(), "{error:?}");
    assert!(error.is_timeout(), "{error:?}");
    assert!(http.get(upstream.url()).send().await.is_ok());
    assert_eq!(faults.attempts(), 2);
    assert_eq!(upstream.served(), 1);
}

#[tokio::test]
async fn hang_without_connect_timeout_ends_at_the_request_timeout() {
    let upstream = Upstream::start().await;
    let faults = FaultConnector::new().then(ConnectFault::Hang);
    let http = reqwest::Client::builder()
        .connector_layer(faults.clone())
        .timeout(Duration::from_millis(50))
        .build()
        .unwrap();

    let error = http.get(upstream.url()).send().await.unwrap_err();
    assert!(error.is_timeout(), "{error:?}");
    assert_eq!(upstream.served(), 0);
}

#[tokio::test]
async fn delays_postpone_the_connection_but_let_it_through() {
    let upstream = Upstream::start().await;
    let faults = FaultConnector::new()
        .delay_each(Duration::from_millis(20))
        .then(ConnectFault::Delay(Duration::from_millis(30)));
    let http = client_with(&faults);

    let started = Instant::now();
    assert!(http.get(upstream.url()).send().await.is_ok());
    assert!(started.elapsed() >= Duration::from_millis(50));

    let started = Instant::now();
    assert!(http.get(upstream.url()).send().await.is_ok());
    assert!(started.elapsed() >= Duration::from_millis(20));

    assert_eq!(faults.faults_injected(), 1);
    assert_eq!(upstream.served(), 2);
}

#[tokio::test]
async fn clones_share_the_plan_and_counters_across_clients() {
    let upstream = Upstream::start().await;
    let faults = FaultConnector::new();
    let first = client_with(&faults);
    let second = client_with(&faults.clone());

    faults.push_all([ConnectFault::Refused, ConnectFault::Reset]);
    let error = second.get(upstream.url()).send().await.unwrap_err();
    assert_eq!(io_kind(&error), Some(io::ErrorKind::ConnectionRefused));
    let error = first.get(upstream.url()).send().await.unwrap_err();
    assert_eq!(io_kind(&error), Some(io::ErrorKind::ConnectionReset));

    faults.push(ConnectFault::Refused);
    faults.clear();
    assert!(first.get(upstream.url()).send().await.is_ok());
    assert_eq!(faults.attempts(), 3);
    assert_eq!(faults.faults_injected(), 2);
}
