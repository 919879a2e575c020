//! Cancellation through the public API against a real socket. Cancelling between attempts and dropping
//! the future are shown on the scripted exchange (`src/transport/tests.rs`), where the paused clock
//! has no socket to race.

use std::time::Duration;

use serde_json::json;
use sqlhttp::{CancellationToken, ErrorKind};

use crate::support::*;

#[tokio::test(start_paused = true)]
async fn cancelling_mid_attempt_returns_at_once() {
    let server = server().await;
    respond_always(
        &server,
        ok_rows(&["n"], &json!([[1]])).set_delay(Duration::from_secs(5)),
    )
    .await;
    let client = builder(&server).build().unwrap();
    let token = CancellationToken::new();
    let cancel = token.clone();
    let call = tokio::spawn(async move { client.query_table("SELECT 1").cancel_on(&token).await });
    tokio::time::sleep(Duration::from_millis(200)).await;
    cancel.cancel();
    let err = call.await.unwrap().unwrap_err();
    assert_eq!((err.kind(), err.attempts()), (&ErrorKind::Cancelled, 1));
}

#[tokio::test(start_paused = true)]
async fn a_token_cancelled_before_the_call_sends_nothing() {
    let server = server().await;
    respond_always(&server, ok_effect(1, None)).await;
    let client = builder(&server).build().unwrap();
    let token = CancellationToken::new();
    token.cancel();
    let err = client
        .execute("DELETE FROM t")
        .cancel_on(&token)
        .await
        .unwrap_err();
    assert_eq!((err.kind(), err.attempts()), (&ErrorKind::Cancelled, 0));
    assert_eq!(hits(&server).await, 0);
}

#[tokio::test(start_paused = true)]
async fn the_clients_token_cancels_every_call_of_every_clone() {
    let server = server().await;
    respond_always(
        &server,
        error(503, "UNAVAILABLE", "busy").insert_header("retry-after", "5"),
    )
    .await;
    let token = CancellationToken::new();
    let client = builder(&server).cancel_on(&token).build().unwrap();
    let calls: Vec<_> = (0..3)
        .map(|_| {
            let client = client.clone();
            tokio::spawn(async move { client.ping().await })
        })
        .collect();
    tokio::time::sleep(Duration::from_secs(1)).await;
    token.cancel();
    for call in calls {
        assert_eq!(
            call.await.unwrap().unwrap_err().kind(),
            &ErrorKind::Cancelled
        );
    }
    let err = client.ping().await.unwrap_err();
    assert_eq!(err.attempts(), 0);
}
