//! A server restarted between attempts (file-backed SQLite): the read recovers across the restart and
//! returns the rows written before it.

use std::time::Duration;

use sqlhttp::RetryPolicy;
use sqlhttp_testkit::TestServer;

use crate::harness::*;

#[tokio::test]
async fn a_read_recovers_across_a_server_restart() {
    let mut server = TestServer::file_backed().await;
    let writer = server.client_builder().build().unwrap();
    let table = unique_table("restart");
    let rows = seed(&writer, &table, 30).await;

    server.stop().await;
    let down = server
        .client_builder()
        .retry(RetryPolicy::never())
        .build()
        .unwrap();
    let err = down.ping().await.unwrap_err();
    assert!(
        err.is_connection() && err.is_retryable(),
        "a stopped server refuses: {err:?}"
    );

    let reader = server
        .client_builder()
        .retry(
            RetryPolicy::new()
                .with_max_attempts(30)
                .with_initial_backoff(Duration::from_millis(20))
                .with_max_backoff(Duration::from_millis(100))
                .with_jitter_seed(3),
        )
        .build()
        .unwrap();
    let read = tokio::spawn(async move { all_rows(&reader, &table).await });
    tokio::time::sleep(Duration::from_millis(250)).await;
    assert!(
        !read.is_finished(),
        "the read is retrying while the server is down"
    );
    server.restart().await;
    assert_eq!(read.await.unwrap(), rows);
}
