//! A request whose `Accept-Encoding` admits no coding the server sends is refused before it
//! runs: the answer is `400` and nothing was written, where the compression layer alone ran the
//! write and then answered `406`, reporting as refused a write that committed. Codings the
//! server can send still serve, whatever else is excluded.

use serde_json::json;

use crate::common::{memory_app, ok, send};

#[tokio::test]
async fn an_accept_encoding_that_admits_nothing_is_refused_before_the_write_runs() {
    let router = memory_app();
    ok(&router, "CREATE TABLE t (v INTEGER)", json!([])).await;
    let insert = json!({"sql": "INSERT INTO t VALUES (1)", "params": []}).to_string();
    let count =
        || async { ok(&router, "SELECT count(*) FROM t", json!([])).await["rows"][0][0].clone() };

    for excluded in [
        "identity;q=0",
        "*;q=0",
        "br, identity;q=0",
        "gzip;q=0, zstd;q=0, identity;Q=0.0",
    ] {
        let reply = send(
            &router,
            "POST",
            "/api/v1/sql",
            &[
                ("content-type", "application/json"),
                ("accept-encoding", excluded),
            ],
            insert.clone(),
        )
        .await;
        assert_eq!(
            reply.status,
            400,
            "{excluded}: {}",
            String::from_utf8_lossy(&reply.body)
        );
        assert_eq!(reply.code(), "BAD_REQUEST");
        assert_eq!(count().await, json!(0), "{excluded}: nothing ran");
    }

    // A coding the server sends is acceptable, even with identity excluded.
    for accepted in [
        "gzip, identity;q=0",
        "zstd;q=0.5, *;q=0",
        "identity",
        "gzip;q=0",
    ] {
        let reply = send(
            &router,
            "POST",
            "/api/v1/sql",
            &[
                ("content-type", "application/json"),
                ("accept-encoding", accepted),
            ],
            insert.clone(),
        )
        .await;
        assert_eq!(reply.status, 200, "{accepted}");
    }
    assert_eq!(count().await, json!(4));
}
