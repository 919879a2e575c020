//! Interactive transactions (`POST /api/v1/transaction/...`) in-process, on both engines: a
//! read-decide-write transaction, re-sent statements answered from their stored result and
//! statements out of order refused, rollback, idle expiry, `--max-transactions`, the binding of
//! a token to its credential and a read credential's read-only transactions, the commit record
//! another server (or this one after a restart) answers a re-sent COMMIT from, and, on SQLite,
//! the write lock a write transaction holds.

use std::time::Duration;

use axum::Router;
use serde_json::{Value, json};
use sqlhttp_server::Config;

use crate::common::{Reply, ok, post_with, send};
use crate::engines::{Engine, needs_postgres, on_both_engines};

on_both_engines!(
    a_transaction_reads_decides_writes_and_commits_once,
    a_resent_statement_is_answered_again_and_one_out_of_order_is_refused,
    a_rolled_back_transaction_keeps_nothing,
    an_idle_transaction_expires_and_nothing_of_it_is_kept,
    past_max_transactions_an_open_is_refused_with_retry_after,
    a_token_is_its_credentials_and_a_read_credential_only_reads,
    another_server_answers_a_resent_commit_from_the_commit_record,
    isolation_levels_are_the_engines,
    opens_under_one_key_answer_one_transaction,
);

pub(crate) async fn post(router: &Router, path: &str, token: Option<&str>, body: &Value) -> Reply {
    let bearer = token.map(|t| format!("Bearer {t}"));
    let mut headers = vec![("content-type", "application/json")];
    if let Some(bearer) = &bearer {
        headers.push(("authorization", bearer.as_str()));
    }
    send(
        router,
        "POST",
        &format!("/api/v1/transaction/{path}"),
        &headers,
        body.to_string(),
    )
    .await
}

/// Opens a transaction with `options`, asserting a 200; its token.
pub(crate) async fn open(router: &Router, credential: Option<&str>, options: &Value) -> String {
    let reply = post(router, "open", credential, options).await;
    assert_eq!(
        reply.status,
        200,
        "{}",
        String::from_utf8_lossy(&reply.body)
    );
    reply.json()["transaction"].as_str().unwrap().to_owned()
}

pub(crate) async fn step(router: &Router, tx: &str, seq: u64, sql: &str, params: Value) -> Reply {
    post(
        router,
        "statement",
        None,
        &json!({ "transaction": tx, "seq": seq, "sql": sql, "params": params }),
    )
    .await
}

async fn end(router: &Router, what: &str, tx: &str) -> Reply {
    post(router, what, None, &json!({ "transaction": tx })).await
}

async fn balances(router: &Router) -> Value {
    balances_as(router, None).await
}

async fn balances_as(router: &Router, credential: Option<&str>) -> Value {
    let reply = sql_as(
        router,
        credential,
        "SELECT id, balance FROM accounts ORDER BY id",
    )
    .await;
    assert_eq!(reply.status, 200);
    reply.json()["rows"].clone()
}

async fn sql_as(router: &Router, credential: Option<&str>, sql: &str) -> Reply {
    let bearer = credential.map(|t| format!("Bearer {t}"));
    let headers: Vec<(&str, &str)> = bearer
        .iter()
        .map(|bearer| ("authorization", bearer.as_str()))
        .collect();
    post_with(router, &headers, &json!({ "sql": sql })).await
}

/// An app on `engine` (tweaked) with accounts 1: 100 and 2: 0; `None` without PostgreSQL.
async fn bank(engine: Engine, tweak: impl FnOnce(&mut Config)) -> Option<Router> {
    bank_as(engine, None, tweak).await
}

/// [`bank`], set up by `credential`.
async fn bank_as(
    engine: Engine,
    credential: Option<&str>,
    tweak: impl FnOnce(&mut Config),
) -> Option<Router> {
    let router = engine.app(tweak).await?;
    for sql in [
        "CREATE TABLE accounts (id INTEGER PRIMARY KEY, balance INTEGER NOT NULL)",
        "INSERT INTO accounts VALUES (1, 100), (2, 0)",
    ] {
        let reply = sql_as(&router, credential, sql).await;
        assert_eq!(
            reply.status,
            200,
            "{}",
            String::from_utf8_lossy(&reply.body)
        );
    }
    Some(router)
}

async fn a_transaction_reads_decides_writes_and_commits_once(engine: Engine) {
    let Some(router) = bank(engine, |_| {}).await else {
        return;
    };
    let tx = open(&router, None, &json!({})).await;
    let read = step(
        &router,
        &tx,
        1,
        "SELECT balance FROM accounts WHERE id = ?",
        json!([1]),
    )
    .await;
    assert_eq!(read.status, 200);
    let balance = read.json()["rows"][0][0].as_i64().unwrap();
    assert_eq!(balance, 100);
    // The application decides, then writes.
    let moved = balance / 4;
    for (seq, (delta, id)) in [(-moved, 1), (moved, 2)].into_iter().enumerate() {
        let seq = u64::try_from(seq).unwrap() + 2;
        let write = step(
            &router,
            &tx,
            seq,
            "UPDATE accounts SET balance = balance + ? WHERE id = ?",
            json!([delta, id]),
        )
        .await;
        assert_eq!(
            write.status,
            200,
            "{}",
            String::from_utf8_lossy(&write.body)
        );
        assert_eq!(write.json()["rows_affected"], 1);
    }
    assert_eq!(
        balances(&router).await,
        json!([[1, 100], [2, 0]]),
        "nothing shows before the commit"
    );
    let committed = end(&router, "commit", &tx).await;
    assert_eq!(committed.status, 200);
    assert_eq!(committed.json()["outcome"], "committed");
    assert!(committed.json()["stats"]["duration_ms"].is_number());
    assert_eq!(committed.header("idempotent-replayed"), None);
    assert_eq!(balances(&router).await, json!([[1, 75], [2, 25]]));

    let again = end(&router, "commit", &tx).await;
    assert_eq!(again.status, 200, "a re-sent COMMIT gets the outcome");
    assert_eq!(again.header("idempotent-replayed"), Some("true"));
    let late = step(&router, &tx, 4, "SELECT 1", json!([])).await;
    assert_eq!(
        (late.status, late.code().as_str()),
        (409, "TRANSACTION_FINISHED")
    );
    let rollback = end(&router, "rollback", &tx).await;
    assert_eq!(
        rollback.code(),
        "TRANSACTION_FINISHED",
        "a committed one stays committed"
    );
    let outcome = end(&router, "outcome", &tx).await;
    assert_eq!(outcome.json(), json!({ "outcome": "committed" }));
    assert_eq!(balances(&router).await, json!([[1, 75], [2, 25]]));
}

async fn a_resent_statement_is_answered_again_and_one_out_of_order_is_refused(engine: Engine) {
    let Some(router) = bank(engine, |_| {}).await else {
        return;
    };
    let tx = open(&router, None, &json!({})).await;
    let add = "UPDATE accounts SET balance = balance + 10 WHERE id = 2 RETURNING balance";
    let first = step(&router, &tx, 1, add, json!([])).await;
    assert_eq!(first.status, 200);
    assert_eq!(first.json()["rows"], json!([[10]]));
    let resent = step(&router, &tx, 1, add, json!([])).await;
    assert_eq!(resent.status, 200);
    assert_eq!(resent.header("idempotent-replayed"), Some("true"));
    assert_eq!(
        resent.json()["rows"],
        json!([[10]]),
        "answered, not run again"
    );
    let skipped = step(&router, &tx, 3, add, json!([])).await;
    assert_eq!(
        (skipped.status, skipped.code().as_str()),
        (409, "TRANSACTION_STEP_OUT_OF_ORDER")
    );
    let behind = step(&router, &tx, 0, add, json!([])).await;
    assert_eq!(behind.status, 400, "sequence numbers start at 1");
    // JSON has one number type: `1.0` is the integer 1 however large it is, not a float that
    // is almost one.
    let spelled = |seq: &str| {
        let body = format!(r#"{{"transaction":"{tx}","seq":{seq},"sql":"{add}","params":[]}}"#);
        let router = router.clone();
        async move {
            let headers = [("content-type", "application/json")];
            send(
                &router,
                "POST",
                "/api/v1/transaction/statement",
                &headers,
                body,
            )
            .await
        }
    };
    let resent_as_float = spelled("1.0").await;
    assert_eq!(resent_as_float.status, 200);
    assert_eq!(resent_as_float.header("idempotent-replayed"), Some("true"));
    let far_ahead = spelled("4465287181458842.0").await;
    assert_eq!(far_ahead.code(), "TRANSACTION_STEP_OUT_OF_ORDER");
    let fraction = spelled("1.5").await;
    assert_eq!(fraction.status, 400);
    // A statement that fails is its own answer (stored, the sequence moves on) and the
    // transaction goes on as it was before it.
    let failed = step(&router, &tx, 2, "SELECT * FROM no_such_table", json!([])).await;
    assert_eq!(failed.code(), "SQL_ERROR");
    let failed_again = step(&router, &tx, 2, "SELECT * FROM no_such_table", json!([])).await;
    assert_eq!(failed_again.code(), "SQL_ERROR");
    assert_eq!(failed_again.header("idempotent-replayed"), Some("true"));
    let third = step(&router, &tx, 3, add, json!([])).await;
    assert_eq!(third.json()["rows"], json!([[20]]));
    assert_eq!(end(&router, "commit", &tx).await.status, 200);
    assert_eq!(balances(&router).await, json!([[1, 100], [2, 20]]));
}

async fn a_rolled_back_transaction_keeps_nothing(engine: Engine) {
    let Some(router) = bank(engine, |_| {}).await else {
        return;
    };
    let tx = open(&router, None, &json!({})).await;
    let write = step(&router, &tx, 1, "DELETE FROM accounts", json!([])).await;
    assert_eq!(write.json()["rows_affected"], 2);
    let refused = step(&router, &tx, 2, "COMMIT", json!([])).await;
    assert_eq!(
        refused.status, 400,
        "transaction control stays refused inside"
    );
    assert!(
        refused.json()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("transaction"),
        "{}",
        refused.json()
    );
    let rolled = end(&router, "rollback", &tx).await;
    assert_eq!(rolled.json(), json!({ "outcome": "rolled_back" }));
    assert_eq!(balances(&router).await, json!([[1, 100], [2, 0]]));
    let commit = end(&router, "commit", &tx).await;
    assert_eq!(commit.code(), "TRANSACTION_FINISHED");
    let again = end(&router, "rollback", &tx).await;
    assert_eq!(again.status, 200, "a rollback may be re-sent");
    assert_eq!(balances(&router).await, json!([[1, 100], [2, 0]]));
}

async fn an_idle_transaction_expires_and_nothing_of_it_is_kept(engine: Engine) {
    let Some(router) = bank(engine, |config| {
        config.transactions.idle_timeout = Duration::from_millis(300);
    })
    .await
    else {
        return;
    };
    let tx = open(&router, None, &json!({})).await;
    let write = step(
        &router,
        &tx,
        1,
        "UPDATE accounts SET balance = 0",
        json!([]),
    )
    .await;
    assert_eq!(write.status, 200);
    tokio::time::sleep(Duration::from_millis(700)).await;
    // The reaper rolled it back: other writers go on.
    ok(
        &router,
        "UPDATE accounts SET balance = balance + 1 WHERE id = 2",
        json!([]),
    )
    .await;
    let late = step(&router, &tx, 2, "SELECT 1", json!([])).await;
    assert_eq!(
        (late.status, late.code().as_str()),
        (410, "TRANSACTION_EXPIRED")
    );
    assert!(
        late.json()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("nothing of it was committed")
    );
    let commit = end(&router, "commit", &tx).await;
    assert_eq!(commit.code(), "TRANSACTION_EXPIRED");
    assert_eq!(
        end(&router, "outcome", &tx).await.json(),
        json!({ "outcome": "expired" })
    );
    assert_eq!(balances(&router).await, json!([[1, 100], [2, 1]]));
    let metrics = send(&router, "GET", "/metrics", &[], "").await;
    let text = String::from_utf8(metrics.body).unwrap();
    assert!(
        text.contains("sqlhttpd_transaction_expirations_total 1"),
        "{text}"
    );
    assert!(text.contains("sqlhttpd_transactions_open 0"), "{text}");
}

async fn past_max_transactions_an_open_is_refused_with_retry_after(engine: Engine) {
    let Some(router) = bank(engine, |config| config.transactions.max_open = 1).await else {
        return;
    };
    let first = open(&router, None, &json!({ "read_only": true })).await;
    let refused = post(&router, "open", None, &json!({ "read_only": true })).await;
    assert_eq!(
        (refused.status, refused.code().as_str()),
        (503, "UNAVAILABLE")
    );
    assert_eq!(refused.header("retry-after"), Some("1"));
    assert!(
        refused.json()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("--max-transactions")
    );
    assert_eq!(end(&router, "commit", &first).await.status, 200);
    let second = open(&router, None, &json!({})).await;
    assert_eq!(end(&router, "rollback", &second).await.status, 200);
}

async fn a_token_is_its_credentials_and_a_read_credential_only_reads(engine: Engine) {
    let Some(router) = bank_as(engine, Some("writer-a"), |config| {
        config.tokens = vec!["writer-a".into(), "writer-b".into()];
        config.read_tokens = vec!["reader".into()];
    })
    .await
    else {
        return;
    };
    let tx = open(&router, Some("writer-a"), &json!({})).await;
    let body = json!({ "transaction": tx, "seq": 1, "sql": "DELETE FROM accounts" });
    let stranger = post(&router, "statement", Some("writer-b"), &body).await;
    assert_eq!(
        (stranger.status, stranger.code().as_str()),
        (404, "NOT_FOUND")
    );
    let stranger = post(
        &router,
        "commit",
        Some("reader"),
        &json!({ "transaction": tx }),
    )
    .await;
    assert_eq!(stranger.status, 404);
    let owner = post(&router, "statement", Some("writer-a"), &body).await;
    assert_eq!(
        owner.status, 200,
        "the statement was not run for the stranger"
    );
    let outcome = post(
        &router,
        "outcome",
        Some("writer-b"),
        &json!({ "transaction": tx }),
    )
    .await;
    assert_eq!(outcome.status, 404);
    let done = post(
        &router,
        "rollback",
        Some("writer-a"),
        &json!({ "transaction": tx }),
    )
    .await;
    assert_eq!(done.status, 200);
    let done = post(
        &router,
        "outcome",
        Some("writer-b"),
        &json!({ "transaction": tx }),
    )
    .await;
    assert_eq!(done.status, 404, "a finished one is its owner's too");

    let write = post(&router, "open", Some("reader"), &json!({})).await;
    assert_eq!((write.status, write.code().as_str()), (403, "READ_ONLY"));
    let read = open(&router, Some("reader"), &json!({ "read_only": true })).await;
    let select = json!({ "transaction": read, "seq": 1, "sql": "SELECT count(*) FROM accounts" });
    let counted = post(&router, "statement", Some("reader"), &select).await;
    assert_eq!(counted.json()["rows"], json!([[2]]));
    let delete = json!({ "transaction": read, "seq": 2, "sql": "DELETE FROM accounts" });
    let refused = post(&router, "statement", Some("reader"), &delete).await;
    assert_eq!(refused.code(), "READ_ONLY");
    let ended = post(
        &router,
        "commit",
        Some("reader"),
        &json!({ "transaction": read }),
    )
    .await;
    assert_eq!(ended.status, 200);
    assert_eq!(
        balances_as(&router, Some("reader")).await,
        json!([[1, 100], [2, 0]])
    );
}

async fn another_server_answers_a_resent_commit_from_the_commit_record(engine: Engine) {
    let Some(shared) = engine.shared_database().await else {
        return;
    };
    let first = shared.app(|_| {});
    let second = shared.app(|_| {});
    ok(&first, "CREATE TABLE t (x INTEGER)", json!([])).await;
    let tx = open(&first, None, &json!({})).await;
    assert_eq!(
        step(&first, &tx, 1, "INSERT INTO t VALUES (1)", json!([]))
            .await
            .status,
        200
    );
    // Another server (or this one after a restart) does not hold it. On PostgreSQL it answers
    // "nothing committed" and makes that final (a tombstone under the record's key): the
    // holder's own COMMIT afterwards finds it and rolls back. On SQLite the holder's write
    // transaction holds the write lock the tombstone needs: busy, nothing decided.
    let unknown = end(&second, "commit", &tx).await;
    match engine {
        Engine::Postgres => {
            assert_eq!(unknown.code(), "TRANSACTION_EXPIRED");
            // Rolled back either way: the tombstone found (410), or, in a serializable
            // transaction that began before it, a serialization failure on its key (409).
            let fenced = end(&first, "commit", &tx).await;
            assert!(
                ["TRANSACTION_EXPIRED", "TRANSACTION_ABORTED"].contains(&fenced.code().as_str()),
                "the holder must not commit what another server said was not committed: {}",
                String::from_utf8_lossy(&fenced.body)
            );
            assert_eq!(
                ok(&second, "SELECT count(*) FROM t", json!([])).await["rows"],
                json!([[0]])
            );
            assert_eq!(
                end(&second, "commit", &tx).await.code(),
                "TRANSACTION_EXPIRED"
            );
            return;
        }
        Engine::Sqlite => assert_eq!(
            unknown.status,
            503,
            "{}",
            String::from_utf8_lossy(&unknown.body)
        ),
    }
    assert_eq!(end(&first, "commit", &tx).await.status, 200);
    // Once committed, the record answers there too, and only its owner.
    let replayed = end(&second, "commit", &tx).await;
    assert_eq!(
        replayed.status,
        200,
        "{}",
        String::from_utf8_lossy(&replayed.body)
    );
    assert_eq!(replayed.json(), json!({ "outcome": "committed" }));
    assert_eq!(replayed.header("idempotent-replayed"), Some("true"));
    let outcome = end(&second, "outcome", &tx).await;
    assert_eq!(outcome.json(), json!({ "outcome": "committed" }));
    assert_eq!(
        ok(&second, "SELECT count(*) FROM t", json!([])).await["rows"],
        json!([[1]])
    );
    // A token of this server's own that it never issued is no transaction at all.
    let own = format!("{}.{}", tx.split('.').next().unwrap(), "0".repeat(32));
    assert_eq!(end(&first, "commit", &own).await.status, 404);
    let malformed = end(&first, "commit", "not a token!").await;
    assert_eq!(
        malformed.code(),
        "BAD_REQUEST",
        "a malformed token is no token at all"
    );
}

async fn opens_under_one_key_answer_one_transaction(engine: Engine) {
    let Some(router) = bank(engine, |_| {}).await else {
        return;
    };
    let open_with = |key: &'static str| {
        let router = router.clone();
        async move {
            let headers = [
                ("content-type", "application/json"),
                ("idempotency-key", key),
            ];
            let path = "/api/v1/transaction/open";
            let reply = send(&router, "POST", path, &headers, "{}").await;
            assert_eq!(
                reply.status,
                200,
                "{}",
                String::from_utf8_lossy(&reply.body)
            );
            let token = reply.json()["transaction"].as_str().unwrap().to_owned();
            (token, reply.header("idempotent-replayed").is_some())
        }
    };
    // Sent at once (a retry while the first still waits for the database), and again after.
    let ((first, a), (second, b)) = tokio::join!(open_with("open-1"), open_with("open-1"));
    assert_eq!(first, second, "one transaction for one key");
    assert!(a ^ b, "one of them is the replay");
    let (third, replayed) = open_with("open-1").await;
    assert_eq!((third.as_str(), replayed), (first.as_str(), true));
    assert_eq!(end(&router, "rollback", &first).await.status, 200);
    let (other, _) = open_with("open-2").await;
    assert_ne!(other, first);
    assert_eq!(end(&router, "rollback", &other).await.status, 200);
}

async fn isolation_levels_are_the_engines(engine: Engine) {
    let Some(router) = bank(engine, |_| {}).await else {
        return;
    };
    for isolation in ["repeatable_read", "read_committed"] {
        let reply = post(&router, "open", None, &json!({ "isolation": isolation })).await;
        match engine {
            Engine::Sqlite => {
                assert_eq!(reply.code(), "BAD_REQUEST");
                assert!(
                    reply.json()["error"]["message"]
                        .as_str()
                        .unwrap()
                        .contains("serializable")
                );
            }
            Engine::Postgres => {
                assert_eq!(reply.status, 200);
                let tx = reply.json()["transaction"].as_str().unwrap().to_owned();
                let level = step(&router, &tx, 1, "SHOW transaction_isolation", json!([])).await;
                assert_eq!(level.json()["rows"][0][0], isolation.replace('_', " "));
                assert_eq!(end(&router, "rollback", &tx).await.status, 200);
            }
        }
    }
    let wrong = post(&router, "open", None, &json!({ "deferrable": true })).await;
    assert_eq!(
        wrong.status, 400,
        "deferrable is for read-only serializable ones"
    );
    let deferrable = open(
        &router,
        None,
        &json!({ "read_only": true, "deferrable": true }),
    )
    .await;
    assert_eq!(end(&router, "commit", &deferrable).await.status, 200);
}

/// On SQLite a write transaction holds the one write lock: another writer, and the next write
/// transaction, wait their turn (at most the statement timeout, then 503; ADR 0042) and the
/// next one opens once it ended; reads go on beside it.
#[tokio::test]
async fn on_sqlite_a_write_transaction_holds_the_writer_and_reads_go_on() {
    let Some(router) = bank(Engine::Sqlite, |config| {
        config.limits.statement_timeout = Duration::from_millis(400);
        // Idle here while the others wait: not expired for it on a slow machine.
        config.limits.transaction_write_idle = Duration::from_secs(60);
    })
    .await
    else {
        return;
    };
    let tx = open(&router, None, &json!({})).await;
    let started = std::time::Instant::now();
    let blocked = crate::common::sql(&router, "UPDATE accounts SET balance = 1", json!([])).await;
    assert_eq!(blocked.code(), "UNAVAILABLE");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    let second = post(&router, "open", None, &json!({})).await;
    assert_eq!(
        second.code(),
        "UNAVAILABLE",
        "one write transaction at a time"
    );
    assert_eq!(
        balances(&router).await,
        json!([[1, 100], [2, 0]]),
        "reads go on"
    );
    let read = open(&router, None, &json!({ "read_only": true })).await;
    assert_eq!(end(&router, "commit", &read).await.status, 200);
    let options = json!({});
    let (next, ended) = tokio::join!(open(&router, None, &options), async {
        tokio::time::sleep(Duration::from_millis(100)).await;
        end(&router, "commit", &tx).await
    });
    assert_eq!(ended.status, 200);
    assert_eq!(end(&router, "rollback", &next).await.status, 200);
    ok(&router, "UPDATE accounts SET balance = 1", json!([])).await;
}

/// POSTs `body` to `path` on the real server at `url`: the status, whether it was replayed, and
/// the JSON answer.
async fn post_to(url: &str, path: &str, body: &Value) -> (u16, bool, Value) {
    let response = crate::common::http_client()
        .post(format!("{url}{path}"))
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    let replayed = response.headers().get("idempotent-replayed").is_some();
    let bytes = response.bytes().await.unwrap();
    (
        status,
        replayed,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}

/// `sqlhttpd` killed (SIGKILL) mid-transaction commits nothing: after a restart on the same file
/// the transaction is `410 TRANSACTION_EXPIRED`. Killed after a COMMIT (as when its answer is
/// lost with the process), the commit record survives it: the re-sent COMMIT is answered `200`,
/// replayed, and nothing is applied twice.
#[tokio::test]
async fn a_killed_server_commits_nothing_open_and_keeps_what_committed() {
    let db = crate::common::TempDb::new("tx-kill");
    let database = format!("sqlite:{}", db.path().display());
    let args = ["--database", database.as_str()];
    let (mut server, url) = crate::common::start(&args);
    let created = post_to(
        &url,
        "/api/v1/sql",
        &json!({ "sql": "CREATE TABLE t (x INTEGER)" }),
    )
    .await;
    assert_eq!(created.0, 200);
    let open = async |url: &str| {
        let (status, _, opened) = post_to(url, "/api/v1/transaction/open", &json!({})).await;
        assert_eq!(status, 200);
        opened["transaction"].as_str().unwrap().to_owned()
    };
    let insert =
        |tx: &str| json!({ "transaction": tx, "seq": 1, "sql": "INSERT INTO t VALUES (1)" });
    let named = |tx: &str| json!({ "transaction": tx });

    let open_one = open(&url).await;
    let inserted = post_to(&url, "/api/v1/transaction/statement", &insert(&open_one)).await;
    assert_eq!(inserted.0, 200);
    server.kill().unwrap();
    server.wait().unwrap();
    let (mut server, url) = crate::common::start(&args);
    let commit = post_to(&url, "/api/v1/transaction/commit", &named(&open_one)).await;
    assert_eq!(
        commit.0, 410,
        "the killed server's transaction expired: {}",
        commit.2
    );

    let committed = open(&url).await;
    let inserted = post_to(&url, "/api/v1/transaction/statement", &insert(&committed)).await;
    assert_eq!(inserted.0, 200);
    let commit = post_to(&url, "/api/v1/transaction/commit", &named(&committed)).await;
    assert_eq!((commit.0, commit.1), (200, false));
    server.kill().unwrap();
    server.wait().unwrap();
    let (mut server, url) = crate::common::start(&args);
    let again = post_to(&url, "/api/v1/transaction/commit", &named(&committed)).await;
    assert_eq!((again.0, again.1), (200, true), "{}", again.2);
    let count = post_to(
        &url,
        "/api/v1/sql",
        &json!({ "sql": "SELECT count(*) FROM t" }),
    )
    .await;
    assert_eq!(
        count.2["rows"],
        json!([[1]]),
        "committed once, the open one not at all"
    );
    server.kill().unwrap();
    server.wait().unwrap();
}

needs_postgres! {
    /// On PostgreSQL open transactions hold at most all of the pool's connections but one: idle
    /// transactions never take every connection from plain requests, and an open past them waits
    /// (at most the statement timeout, then 503).
    #[tokio::test]
    async fn on_postgres_idle_transactions_leave_a_connection_to_plain_requests() {
        let router = crate::engines::postgres_app!("idle_transactions_leave_a_connection", |config| {
            config.limits.pool_size = 2;
            config.limits.statement_timeout = Duration::from_millis(500);
        });
        let held = open(&router, None, &json!({})).await;
        let started = std::time::Instant::now();
        let refused = post(&router, "open", None, &json!({})).await;
        assert_eq!(refused.code(), "UNAVAILABLE");
        assert!(
            started.elapsed() >= Duration::from_millis(400),
            "it waited for a connection"
        );
        for _ in 0..3 {
            assert_eq!(
                ok(&router, "SELECT 1", json!([])).await["rows"],
                json!([[1]])
            );
        }
        let read_only = json!({ "read_only": true });
        let (next, ended) = tokio::join!(open(&router, None, &read_only), async {
            tokio::time::sleep(Duration::from_millis(100)).await;
            end(&router, "rollback", &held).await
        });
        assert_eq!(ended.status, 200);
        assert_eq!(end(&router, "commit", &next).await.status, 200);
    }
}
