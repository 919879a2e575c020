//! The second attempt of an interactive transaction's requests, on both engines (issue 35): a
//! statement refused before it ran leaves the ones before it; a re-sent COMMIT, the outcome
//! and a re-sent read-only open carry the bookmark the first answer carried (PostgreSQL; SQLite
//! answers none, on every attempt alike); a transaction belongs to its token whatever position
//! the token has in the configuration, across a restart that revoked another.

use axum::Router;
use serde_json::{Value, json};

use crate::common::{Reply, ok, send};
use crate::engines::{Engine, on_both_engines};
use crate::transactions::basics::{open, post, step};

on_both_engines!(
    a_refused_statement_leaves_the_statements_before_it,
    a_refused_first_statement_leaves_the_transaction_open,
    a_resent_commit_and_the_outcome_carry_the_commits_bookmark,
    a_resent_read_only_open_carries_its_snapshots_bookmark,
    a_transaction_belongs_to_its_token_not_to_the_tokens_position,
    a_resent_commit_ignores_position_headers_it_never_reads,
);

async fn post_keyed(
    router: &Router,
    path: &str,
    token: Option<&str>,
    key: Option<&str>,
    body: &Value,
) -> Reply {
    let bearer = token.map(|t| format!("Bearer {t}"));
    let mut headers = vec![("content-type", "application/json")];
    if let Some(bearer) = &bearer {
        headers.push(("authorization", bearer.as_str()));
    }
    if let Some(key) = key {
        headers.push(("idempotency-key", key));
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

fn text(reply: &Reply) -> String {
    String::from_utf8_lossy(&reply.body).into_owned()
}

async fn end(router: &Router, token: Option<&str>, what: &str, tx: &str) -> Reply {
    post(router, what, token, &json!({ "transaction": tx })).await
}

async fn bank(engine: Engine) -> Option<Router> {
    let router = engine.app(|_| {}).await?;
    ok(
        &router,
        "CREATE TABLE accounts (id INTEGER PRIMARY KEY, balance INTEGER NOT NULL)",
        json!([]),
    )
    .await;
    ok(
        &router,
        "INSERT INTO accounts VALUES (1, 100), (2, 0)",
        json!([]),
    )
    .await;
    Some(router)
}

async fn balances(router: &Router) -> Value {
    ok(
        router,
        "SELECT id, balance FROM accounts ORDER BY id",
        json!([]),
    )
    .await["rows"]
        .clone()
}

/// The statements each engine refuses before running them, with the code each gets.
fn refused(engine: Engine) -> Vec<(&'static str, Value, &'static str)> {
    let mut refused = vec![
        // One parameter given, two asked for.
        (
            "UPDATE accounts SET balance = ? WHERE id = ?",
            json!([1]),
            "SQL_ERROR",
        ),
        ("ATTACH DATABASE 'x.db' AS x", json!([]), ""),
    ];
    if engine == Engine::Postgres {
        refused.extend([
            (
                "SET LOCAL statement_timeout = 0",
                json!([]),
                "STATEMENT_NOT_ALLOWED",
            ),
            ("PREPARE p AS SELECT 1", json!([]), "STATEMENT_NOT_ALLOWED"),
            (
                "UPDATE accounts SET balance = $1 WHERE id = $2",
                json!([5]),
                "SQL_ERROR",
            ),
        ]);
    }
    refused
}

async fn a_refused_statement_leaves_the_statements_before_it(engine: Engine) {
    let Some(router) = bank(engine).await else {
        return;
    };
    let tx = open(&router, None, &json!({})).await;
    let debit = "UPDATE accounts SET balance = balance - ? WHERE id = ?";
    let mut seq = 0;
    for (delta, id) in [(30, 1), (-30, 2)] {
        seq += 1;
        let moved = step(&router, &tx, seq, debit, json!([delta, id])).await;
        assert_eq!(moved.status, 200, "{}", text(&moved));
    }
    for (sql, params, code) in refused(engine) {
        seq += 1;
        let refusal = step(&router, &tx, seq, sql, params).await;
        assert!(
            (400..500).contains(&refusal.status),
            "{sql}: {}",
            text(&refusal)
        );
        if !code.is_empty() {
            assert_eq!(refusal.code(), code, "{sql}");
        }
        // The transaction still holds both moves after each refusal.
        seq += 1;
        let seen = step(
            &router,
            &tx,
            seq,
            "SELECT balance FROM accounts ORDER BY id",
            json!([]),
        )
        .await;
        assert_eq!(seen.json()["rows"], json!([[70], [30]]), "after {sql}");
    }
    // A function's name inside a string is data, not a call.
    seq += 1;
    let data = step(
        &router,
        &tx,
        seq,
        "SELECT 'dataset_configuration' AS name",
        json!([]),
    )
    .await;
    assert_eq!(data.status, 200, "{}", text(&data));
    let committed = end(&router, None, "commit", &tx).await;
    assert_eq!(committed.status, 200, "{}", text(&committed));
    assert_eq!(
        balances(&router).await,
        json!([[1, 70], [2, 30]]),
        "every statement answered 200 was committed"
    );
}

async fn a_refused_first_statement_leaves_the_transaction_open(engine: Engine) {
    let Some(router) = bank(engine).await else {
        return;
    };
    for (sql, params, _) in refused(engine) {
        let tx = open(&router, None, &json!({})).await;
        let refusal = step(&router, &tx, 1, sql, params).await;
        assert!(
            (400..500).contains(&refusal.status) && refusal.code() != "TRANSACTION_ABORTED",
            "{sql}: {}",
            text(&refusal)
        );
        let moved = step(
            &router,
            &tx,
            2,
            "UPDATE accounts SET balance = balance + 1 WHERE id = 2",
            json!([]),
        )
        .await;
        assert_eq!(moved.status, 200, "after {sql}: {}", text(&moved));
        let committed = end(&router, None, "commit", &tx).await;
        assert_eq!(committed.status, 200, "after {sql}: {}", text(&committed));
    }
    let n = i64::try_from(refused(engine).len()).unwrap();
    assert_eq!(balances(&router).await, json!([[1, 100], [2, n]]));
}

/// The answer's bookmark, asserting it is there on PostgreSQL and absent on SQLite.
fn bookmark(engine: Engine, reply: &Reply, what: &str) -> Option<String> {
    let bookmark = reply.header("sqlhttp-bookmark").map(str::to_owned);
    match engine {
        Engine::Postgres => {
            let found = bookmark.unwrap_or_else(|| panic!("{what} carries no bookmark"));
            assert_eq!(found.len(), 16, "{what}: {found}");
            Some(found)
        }
        Engine::Sqlite => {
            assert_eq!(bookmark, None, "{what}: SQLite answers no bookmark");
            None
        }
    }
}

async fn a_resent_commit_and_the_outcome_carry_the_commits_bookmark(engine: Engine) {
    let Some(shared) = engine.shared_database().await else {
        return;
    };
    let first = shared.app(|_| {});
    let second = shared.app(|_| {});
    ok(&first, "CREATE TABLE t (x INTEGER)", json!([])).await;
    let tx = open(&first, None, &json!({})).await;
    let inserted = step(&first, &tx, 1, "INSERT INTO t VALUES (1)", json!([])).await;
    assert_eq!(inserted.status, 200);
    let committed = end(&first, None, "commit", &tx).await;
    assert_eq!(committed.status, 200, "{}", text(&committed));
    let at = bookmark(engine, &committed, "the COMMIT");

    // The first answer lost: the COMMIT again, to this server and to another.
    for (server, name) in [(&first, "this server"), (&second, "another server")] {
        let again = end(server, None, "commit", &tx).await;
        assert_eq!(again.status, 200, "{name}: {}", text(&again));
        assert_eq!(again.header("idempotent-replayed"), Some("true"));
        let replayed = bookmark(engine, &again, &format!("the re-sent COMMIT on {name}"));
        assert!(replayed >= at, "{name}: {replayed:?} is before {at:?}");
        let outcome = end(server, None, "outcome", &tx).await;
        assert_eq!(outcome.json(), json!({ "outcome": "committed" }));
        let told = bookmark(engine, &outcome, &format!("the outcome on {name}"));
        assert!(told >= at, "{name}: {told:?} is before {at:?}");
    }
}

async fn a_resent_read_only_open_carries_its_snapshots_bookmark(engine: Engine) {
    let Some(router) = bank(engine).await else {
        return;
    };
    let options = engine.pick(
        json!({ "read_only": true }),
        json!({ "read_only": true, "isolation": "repeatable_read" }),
    );
    let first = post_keyed(&router, "open", None, Some("ro-open-1"), &options).await;
    assert_eq!(first.status, 200, "{}", text(&first));
    let at = bookmark(engine, &first, "the open");
    let again = post_keyed(&router, "open", None, Some("ro-open-1"), &options).await;
    assert_eq!(again.status, 200, "{}", text(&again));
    assert_eq!(again.header("idempotent-replayed"), Some("true"));
    assert_eq!(again.json()["transaction"], first.json()["transaction"]);
    assert_eq!(bookmark(engine, &again, "the re-sent open"), at);
    let tx = first.json()["transaction"].as_str().unwrap().to_owned();
    assert_eq!(end(&router, None, "rollback", &tx).await.status, 200);
}

async fn a_transaction_belongs_to_its_token_not_to_the_tokens_position(engine: Engine) {
    let Some(shared) = engine.shared_database().await else {
        return;
    };
    let tokens = |list: &[&str]| {
        let list: Vec<String> = list.iter().map(|t| (*t).to_owned()).collect();
        move |config: &mut sqlhttp_server::Config| config.tokens = list
    };
    // Before: "early" is token#1, "owner" token#2.
    let before = shared.app(tokens(&["early", "owner"]));
    let headers = [("authorization", "Bearer owner")];
    let made = crate::common::post_with(
        &before,
        &headers,
        &json!({ "sql": "CREATE TABLE t (x INTEGER)" }),
    )
    .await;
    assert_eq!(made.status, 200, "{}", text(&made));
    let tx = open(&before, Some("owner"), &json!({})).await;
    let inserted = post(
        &before,
        "statement",
        Some("owner"),
        &json!({ "transaction": tx, "seq": 1, "sql": "INSERT INTO t VALUES (1)" }),
    )
    .await;
    assert_eq!(inserted.status, 200, "{}", text(&inserted));
    assert_eq!(end(&before, Some("owner"), "commit", &tx).await.status, 200);

    // After a restart that revoked "early": "owner" is token#1 now, and "late" token#2.
    let after = shared.app(tokens(&["owner", "late"]));
    let again = end(&after, Some("owner"), "commit", &tx).await;
    assert_eq!(
        (again.status, again.header("idempotent-replayed")),
        (200, Some("true")),
        "the owner's re-sent COMMIT is told it committed: {}",
        text(&again)
    );
    assert_eq!(again.json(), json!({ "outcome": "committed" }));
    // The token that now has the owner's old position is told nothing of it: to another
    // credential, it is no transaction at all.
    for what in ["commit", "outcome", "rollback"] {
        let other = end(&after, Some("late"), what, &tx).await;
        assert_eq!(other.status, 404, "{what}: {}", text(&other));
    }
    let rows = crate::common::post_with(
        &after,
        &[("authorization", "Bearer owner")],
        &json!({ "sql": "SELECT count(*) FROM t" }),
    )
    .await;
    assert_eq!(rows.json()["rows"], json!([[1]]), "committed once");
}

/// The routes of a running transaction never read at a position, so a malformed or doubled
/// `Sqlhttp-Bookmark` / `Sqlhttp-Consistency` (a proxy that added one) does not cost the second
/// attempt of a COMMIT its outcome: the re-sent COMMIT is replayed and the outcome told, as
/// without the headers. The open, which reads at one, still refuses them.
async fn a_resent_commit_ignores_position_headers_it_never_reads(engine: Engine) {
    let Some(router) = bank(engine).await else {
        return;
    };
    let transaction_route = |path: &str, body: &Value, headers: &[(&'static str, &'static str)]| {
        let mut all = vec![("content-type", "application/json")];
        all.extend_from_slice(headers);
        let router = router.clone();
        let path = format!("/api/v1/transaction/{path}");
        let body = body.to_string();
        async move { send(&router, "POST", &path, &all, body).await }
    };
    let garbled: &[(&str, &str)] = &[
        ("sqlhttp-bookmark", "garbage"),
        ("sqlhttp-consistency", "primary"),
        ("sqlhttp-consistency", "primary"),
    ];
    let refused = transaction_route("open", &json!({}), garbled).await;
    assert_eq!(
        refused.status,
        400,
        "the open reads at a position: {}",
        text(&refused)
    );

    let tx = open(&router, None, &json!({})).await;
    let stepped = transaction_route(
        "statement",
        &json!({ "transaction": tx, "seq": 1,
                 "sql": "UPDATE accounts SET balance = balance - 10 WHERE id = 1", "params": [] }),
        garbled,
    )
    .await;
    assert_eq!(stepped.status, 200, "{}", text(&stepped));
    let committed = transaction_route("commit", &json!({ "transaction": tx }), garbled).await;
    assert_eq!(committed.status, 200, "{}", text(&committed));
    // The first answer lost: the same COMMIT again, with the same headers.
    let again = transaction_route("commit", &json!({ "transaction": tx }), garbled).await;
    assert_eq!(again.status, 200, "{}", text(&again));
    assert_eq!(again.header("idempotent-replayed"), Some("true"));
    let outcome = transaction_route("outcome", &json!({ "transaction": tx }), garbled).await;
    assert_eq!(outcome.status, 200, "{}", text(&outcome));
    assert_eq!(outcome.json()["outcome"], json!("committed"));
}
