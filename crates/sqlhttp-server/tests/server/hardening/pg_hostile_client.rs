//! PostgreSQL under a hostile client, issue 36 (ADR 0043): `dblink` cannot write from a read
//! nor carry one request's connection into the next; a standby of another cluster is never a
//! read replica; a shutdown does not wait for a statement running in an interactive
//! transaction.

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sqlhttp_server::{AppState, Database, ReadReplicas, app};

use crate::common::{post_json, post_with, serve};
use crate::engines::{
    client_role, config, database, needs_postgres, owner, replica_cluster, start_postgres,
};

/// Host, port and database name of a test URL (`postgres://postgres@HOST:PORT/DB`).
fn parts(url: &str) -> (String, String, String) {
    let (_, rest) = url.split_once('@').unwrap();
    let (address, name) = rest.split_once('/').unwrap();
    let (host, port) = address.rsplit_once(':').unwrap();
    (host.to_owned(), port.to_owned(), name.to_owned())
}

/// Installs `dblink` in the test database at `url`, and lets its client role open connections
/// without a password (`dblink_connect_u`, as an operator who trusts the role might): `false`,
/// with a message, when this PostgreSQL has no `dblink` (contrib is not installed).
async fn with_dblink(url: &str) -> bool {
    let owner = owner(url).await;
    let available = owner
        .query_opt(
            "SELECT 1 FROM pg_available_extensions WHERE name = 'dblink'",
            &[],
        )
        .await
        .unwrap()
        .is_some();
    if !available {
        // CI's PostgreSQL (Debian's postgresql-15) carries contrib: there it must run.
        assert!(
            std::env::var_os("SQLHTTPD_TEST_REQUIRE_POSTGRES").is_none(),
            "this PostgreSQL has no dblink extension (install postgresql-contrib), and \
             SQLHTTPD_TEST_REQUIRE_POSTGRES asks for every PostgreSQL test to run"
        );
        eprintln!("skipping: this PostgreSQL has no dblink extension (install postgresql-contrib)");
        return false;
    }
    let role = client_role(url);
    owner
        .batch_execute(&format!(
            "CREATE EXTENSION IF NOT EXISTS dblink; \
             GRANT EXECUTE ON FUNCTION dblink_connect_u(text) TO {role}; \
             GRANT EXECUTE ON FUNCTION dblink_connect_u(text, text) TO {role}"
        ))
        .await
        .unwrap();
    true
}

async fn run(router: &axum::Router, body: Value) -> (u16, Value) {
    let reply = post_with(router, &[], &body).await;
    (reply.status, reply.json())
}

needs_postgres! {
    /// `dblink_exec` (and `dblink`, which runs any statement) writes through a connection of its
    /// own, which a read's `READ ONLY` transaction does not reach: refused in reads. And what a
    /// request opens with `dblink_connect` (named or not), from a write or from inside a read's
    /// function, is closed by the session reset: the next request on the same connection (pool of
    /// one) cannot run SQL through it as the role that opened it.
    #[tokio::test]
    async fn dblink_cannot_write_from_a_read_nor_outlive_its_request() {
        let Some(url) = database("dblink").await else {
            return;
        };
        let mut config = config(&url);
        config.limits.pool_size = 1;
        let router = app(AppState::new(&config).unwrap());
        if !with_dblink(&url).await {
            return;
        }
        let (host, port, name) = parts(&url);
        let target = format!("host={host} port={port} dbname={name} user=postgres");
        let (status, body) = run(&router, json!({"sql": "CREATE TABLE t (x int)"})).await;
        assert_eq!(status, 200, "{body}");

        // A read may not write through dblink, whatever form the call takes.
        for sql in [
            format!("SELECT dblink_exec('{target}', 'INSERT INTO t VALUES (1)')"),
            format!(
                "SELECT * FROM dblink('{target}', 'INSERT INTO t VALUES (2) RETURNING 1') AS r(x int)"
            ),
            format!("SELECT public.dblink_connect_u('{target}')"),
        ] {
            let (status, body) = run(&router, json!({"sql": sql, "read_only": true})).await;
            assert_eq!(status, 403, "{sql}: {body}");
            assert_eq!(body["error"]["code"], "READ_ONLY", "{sql}: {body}");
        }
        let (_, body) = run(&router, json!({"sql": "SELECT count(*) AS n FROM t"})).await;
        assert_eq!(body["rows"][0][0], 0, "{body}");

        // A named connection opened by a write is gone by the next request.
        let (status, body) = run(
            &router,
            json!({"sql": format!("SELECT dblink_connect_u('link', '{target}')")}),
        )
        .await;
        assert_eq!(status, 200, "{body}");
        let (status, body) = run(
            &router,
            json!({"sql": "SELECT dblink_get_connections()::text AS open"}),
        )
        .await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["rows"][0][0], Value::Null, "{body}");

        // So is the unnamed one: the next request cannot run SQL through it as `postgres`.
        let (status, body) = run(
            &router,
            json!({"sql": format!("SELECT dblink_connect_u('{target}')")}),
        )
        .await;
        assert_eq!(status, 200, "{body}");
        let (status, body) = run(
            &router,
            json!({"sql": "SELECT u FROM dblink('SELECT current_user::text') AS r(u text)"}),
        )
        .await;
        assert_ne!(
            status, 200,
            "the unnamed connection outlived its request: {body}"
        );

        // A connection a read's function opens (the text names no dblink) is closed after the
        // read too (`_sqlhttp.reset_after_read`).
        let (status, body) = run(
            &router,
            json!({"sql": format!(
                "CREATE FUNCTION sneak() RETURNS text LANGUAGE sql AS \
             $f$ SELECT public.dblink_connect_u('sneak', '{target}') $f$"
            )}),
        )
        .await;
        assert_eq!(status, 200, "{body}");
        let (status, body) = run(&router, json!({"sql": "SELECT sneak()", "read_only": true})).await;
        assert_eq!(status, 200, "{body}");
        let (status, body) = run(
            &router,
            json!({"sql": "SELECT dblink_get_connections()::text AS open"}),
        )
        .await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["rows"][0][0], Value::Null, "{body}");
    }
}

/// Cluster A's test database with a server configuration, and cluster B (a primary and its
/// standby, started for the test), or `None` when there is no PostgreSQL.
async fn two_clusters(test: &str) -> Option<(String, Vec<String>)> {
    let a = replica_cluster(test)?;
    let a = a.database().await.primary;
    let Some(b) = start_postgres(&["--replica", "1"], "trust", &[]) else {
        assert!(
            std::env::var_os("SQLHTTPD_TEST_REQUIRE_POSTGRES").is_none(),
            "cannot start a second cluster for {test}, and SQLHTTPD_TEST_REQUIRE_POSTGRES is set"
        );
        eprintln!("skipping {test}: cannot start a second cluster");
        return None;
    };
    Some((a, b))
}

/// Gives cluster B (`b`: its primary, then its standby) what cluster A's test database `url`
/// has, with other rows: a database of the same name, the same client role (trusted: no
/// password), and a table `t` whose row is `'B'`; returns once B's standby shows it.
async fn mirror_on(b: &[String], url: &str) {
    let (_, name) = url.rsplit_once('/').unwrap();
    let role = client_role(url);
    let b_primary = owner(&b[0]).await;
    b_primary
        .batch_execute(&format!("CREATE DATABASE {name}"))
        .await
        .unwrap();
    b_primary
        .batch_execute(&format!("CREATE ROLE {role} LOGIN"))
        .await
        .unwrap();
    let (b_base, _) = b[0].rsplit_once('/').unwrap();
    let b_database = owner(&format!("{b_base}/{name}")).await;
    b_database
        .batch_execute(&format!(
            "SET synchronous_commit = on; CREATE TABLE t (who text); \
             INSERT INTO t VALUES ('B'); GRANT SELECT ON t TO {role}"
        ))
        .await
        .unwrap();
    let (standby_base, _) = b[1].rsplit_once('/').unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok((client, connection)) =
            tokio_postgres::connect(&format!("{standby_base}/{name}"), tokio_postgres::NoTls).await
        {
            tokio::spawn(connection);
            if client.query_opt("SELECT who FROM t", &[]).await.is_ok() {
                return;
            }
        }
        assert!(
            Instant::now() < deadline,
            "cluster B's standby did not replay its table"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `url` (a database of cluster A) on `standby` (cluster B's standby): the same database name,
/// logged in to as A's client role.
fn on_standby(url: &str, standby: &str) -> sqlhttp_server::PostgresUrl {
    let (_, name) = url.rsplit_once('/').unwrap();
    let (base, _) = standby.rsplit_once('/').unwrap();
    let Ok(Database::Postgres(replica)) = format!("{base}/{name}").parse() else {
        panic!("a PostgreSQL URL");
    };
    replica.with_client_role(&client_role(url)).unwrap()
}

needs_postgres! {
    /// A `--read-replica` that is a standby of another cluster (its `system_identifier` is not the
    /// primary's) is refused at start, saying so.
    #[tokio::test]
    async fn a_standby_of_another_cluster_is_refused_at_start() {
        let Some((url, b)) = two_clusters("a_standby_of_another_cluster_is_refused_at_start").await
        else {
            return;
        };
        mirror_on(&b, &url).await;
        let mut config = config(&url);
        config.read_replicas = ReadReplicas {
            urls: vec![on_standby(&url, &b[1])],
            ..ReadReplicas::default()
        };
        let err = AppState::new(&config).expect_err("another cluster's standby is refused");
        let said = err.to_string();
        assert!(said.contains("system_identifier"), "{said}");
    }
}

needs_postgres! {
    /// A replica that cannot be reached at start, and turns out to be another cluster's standby
    /// when it answers, is never read: cluster B holds a database of the same name, the same
    /// client role and a table of the same name with other rows, and every read is still answered
    /// by the primary, with A's rows; the metrics show the replica unhealthy.
    #[tokio::test]
    async fn a_standby_of_another_cluster_found_later_is_never_read() {
        let Some((url, b)) =
            two_clusters("a_standby_of_another_cluster_found_later_is_never_read").await
        else {
            return;
        };
        // Nothing listens here yet.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let later = format!("postgres://postgres@127.0.0.1:{port}/postgres");
        let mut config = config(&url);
        config.read_replicas = ReadReplicas {
            urls: vec![on_standby(&url, &later)],
            max_lag: Duration::from_secs(3600),
            ..ReadReplicas::default()
        };
        let router = app(AppState::new(&config).unwrap());
        let (status, body) = run(
            &router,
            json!({"sql": "CREATE TABLE t (who text); INSERT INTO t VALUES ('A')"}),
        )
        .await;
        assert!(status == 200 || status == 400, "{body}");
        if status == 400 {
            run(&router, json!({"sql": "CREATE TABLE t (who text)"})).await;
            run(&router, json!({"sql": "INSERT INTO t VALUES ('A')"})).await;
        }
        mirror_on(&b, &url).await;
        // Now the replica's address answers: as cluster B's standby.
        let (_, standby_port, _) = parts(&b[1]);
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
            .await
            .unwrap();
        let forward = tokio::spawn(async move {
            loop {
                let Ok((mut inbound, _)) = listener.accept().await else {
                    return;
                };
                let standby_port = standby_port.clone();
                tokio::spawn(async move {
                    if let Ok(mut outbound) =
                        tokio::net::TcpStream::connect(format!("127.0.0.1:{standby_port}")).await
                    {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                    }
                });
            }
        });
        // The watcher looks every 250 ms; give it many looks, on a loaded machine too.
        let until = Instant::now() + Duration::from_secs(4);
        let mut reads = 0;
        while Instant::now() < until {
            let reply = post_with(
                &router,
                &[],
                &json!({"sql": "SELECT who FROM t", "read_only": true}),
            )
            .await;
            assert_eq!(
                reply.status,
                200,
                "{}",
                String::from_utf8_lossy(&reply.body)
            );
            assert_eq!(reply.json()["rows"][0][0], "A", "read from another cluster");
            assert_eq!(reply.header("sqlhttp-served-by"), Some("primary"));
            reads += 1;
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(reads > 10);
        let metrics = crate::common::send(&router, "GET", "/metrics", &[], "").await;
        let metrics = String::from_utf8(metrics.body).unwrap();
        let healthy: Vec<&str> = metrics
            .lines()
            .filter(|line| line.starts_with("sqlhttpd_replica_healthy"))
            .collect();
        assert!(
            !healthy.is_empty() && healthy.iter().all(|line| line.ends_with(" 0")),
            "{healthy:?}"
        );
        forward.abort();
    }
}

needs_postgres! {
    /// A shutdown does not wait for a statement running in an interactive transaction: it is
    /// cancelled (its session ended, which rolls the transaction back), as a plain statement is,
    /// and the shutdown takes about as long as with a plain statement (the two-second grace), not
    /// the statement's thirty seconds. The statement's session is gone from PostgreSQL after.
    #[tokio::test]
    async fn shutdown_cancels_a_statement_running_in_a_transaction() {
        let Some(url) = database("shutdown_tx").await else {
            return;
        };
        let mut config = config(&url);
        config.limits.statement_timeout = Duration::from_secs(60);
        let handle = serve(config).await;
        let base = handle.url();
        let (status, body) = post_json(
            &base,
            "/api/v1/sql",
            &json!({"sql": "CREATE TABLE t (x int)"}),
        )
        .await;
        assert_eq!(status, 200, "{body}");
        let (status, opened) = post_json(&base, "/api/v1/transaction/open", &json!({})).await;
        assert_eq!(status, 200, "{opened}");
        let token = opened["transaction"].as_str().unwrap().to_owned();
        let (status, body) = post_json(
            &base,
            "/api/v1/transaction/statement",
            &json!({"transaction": token, "seq": 1, "sql": "INSERT INTO t VALUES (1)"}),
        )
        .await;
        assert_eq!(status, 200, "{body}");
        let slow = {
            let base = base.clone();
            let token = token.clone();
            tokio::spawn(async move {
                crate::common::http_client()
                    .post(format!("{base}/api/v1/transaction/statement"))
                    .header("content-type", "application/json")
                    .body(
                        json!({"transaction": token, "seq": 2, "sql": "SELECT pg_sleep(45)"})
                            .to_string(),
                    )
                    .send()
                    .await
                    .map(|response| response.status().as_u16())
            })
        };
        let watcher = owner(&url).await;
        let deadline = Instant::now() + Duration::from_secs(20);
        while watcher
            .query_opt(
                "SELECT 1 FROM pg_stat_activity WHERE query = 'SELECT pg_sleep(45)' \
             AND state = 'active'",
                &[],
            )
            .await
            .unwrap()
            .is_none()
        {
            assert!(Instant::now() < deadline, "the statement never started");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let started = Instant::now();
        tokio::time::timeout(Duration::from_secs(15), handle.shutdown())
            .await
            .expect("the shutdown does not wait for the transaction's statement");
        let took = started.elapsed();
        eprintln!("shutdown with a statement running in a transaction took {took:?}");
        // Its requester is answered 503, or cut with the grace: never left to hang.
        if let Ok(status) = slow.await.unwrap() {
            assert_eq!(status, 503);
        }
        // Its session is gone, and nothing of the transaction was kept.
        let deadline = Instant::now() + Duration::from_secs(10);
        while watcher
            .query_opt(
                "SELECT 1 FROM pg_stat_activity WHERE query = 'SELECT pg_sleep(45)'",
                &[],
            )
            .await
            .unwrap()
            .is_some()
        {
            assert!(
                Instant::now() < deadline,
                "the statement's session lives on"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let kept: i64 = watcher
            .query_one("SELECT count(*) FROM t", &[])
            .await
            .unwrap()
            .get(0);
        assert_eq!(kept, 0);
    }
}

/// POSTs `body` to `path` in-process: the status, the JSON answer and where it was served.
async fn tx(router: &axum::Router, path: &str, body: Value) -> (u16, Value, Option<String>) {
    let reply = crate::common::send(
        router,
        "POST",
        path,
        &[("content-type", "application/json")],
        body.to_string(),
    )
    .await;
    let served_by = reply.header("sqlhttp-served-by").map(str::to_owned);
    (reply.status, reply.json(), served_by)
}

needs_postgres! {
    /// In a read-only `repeatable_read` transaction held on a replica, a statement the hot standby
    /// refuses for being one (an `UNLOGGED` table: `0A000`, the first time and once its statement
    /// is cached; `lo_create` behind a function: `XX000`) is answered `403 STATEMENT_NOT_ALLOWED`,
    /// saying why and what to do, and the transaction goes on; before, `503` (a replica's refusal,
    /// or a "stale" cached statement) that no retry could ever get past.
    #[tokio::test]
    async fn a_statement_a_standby_refuses_in_a_replica_transaction_is_a_final_answer() {
        let test = "a_statement_a_standby_refuses_in_a_replica_transaction_is_a_final_answer";
        let Some(cluster) = replica_cluster(test) else {
            return;
        };
        let database = cluster.database().await;
        let url = &database.primary;
        let mut config = config(url);
        config.read_replicas = ReadReplicas {
            urls: database
                .replicas
                .iter()
                .map(|replica| {
                    let Ok(Database::Postgres(replica)) = replica.parse() else {
                        panic!("a PostgreSQL URL");
                    };
                    replica.with_client_role(&client_role(url)).unwrap()
                })
                .collect(),
            max_lag: Duration::from_secs(3600),
            ..ReadReplicas::default()
        };
        let router = app(AppState::new(&config).unwrap());
        for sql in [
            "CREATE UNLOGGED TABLE u (x int)",
            "CREATE TABLE t (x int)",
            "INSERT INTO t VALUES (1)",
            "CREATE FUNCTION mk() RETURNS oid LANGUAGE sql AS $$ SELECT lo_create(0) $$",
        ] {
            let (status, body) = run(&router, json!({ "sql": sql })).await;
            assert_eq!(status, 200, "{sql}: {body}");
        }
        database.caught_up().await;
        // Opened where the replicas choose: on a replica once its watcher finds it fit.
        let deadline = Instant::now() + Duration::from_secs(30);
        let token = loop {
            let (status, opened, served_by) = tx(
                &router,
                "/api/v1/transaction/open",
                json!({"read_only": true, "isolation": "repeatable_read"}),
            )
            .await;
            assert_eq!(status, 200, "{opened}");
            let token = opened["transaction"].as_str().unwrap().to_owned();
            if served_by.as_deref() == Some("replica") {
                break token;
            }
            tx(
                &router,
                "/api/v1/transaction/rollback",
                json!({ "transaction": token }),
            )
            .await;
            assert!(
                Instant::now() < deadline,
                "no transaction opened on a replica"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        let step = |seq: u64, sql: &'static str| {
            let router = router.clone();
            let token = token.clone();
            async move {
                let (status, body, _) = tx(
                    &router,
                    "/api/v1/transaction/statement",
                    json!({"transaction": token, "seq": seq, "sql": sql}),
                )
                .await;
                (status, body)
            }
        };
        for (seq, sql) in [
            (1, "SELECT x FROM u"),
            // The same text again: its statement is cached on the connection now.
            (2, "SELECT x FROM u"),
            (3, "SELECT mk()"),
        ] {
            let (status, body) = step(seq, sql).await;
            assert_eq!(status, 403, "{sql}: {body}");
            assert_eq!(
                body["error"]["code"], "STATEMENT_NOT_ALLOWED",
                "{sql}: {body}"
            );
            let message = body["error"]["message"].as_str().unwrap();
            assert!(message.contains("read replica"), "{message}");
        }
        let (status, body) = step(4, "SELECT x FROM t").await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["rows"][0][0], 1, "{body}");
        let (status, body, _) = tx(
            &router,
            "/api/v1/transaction/rollback",
            json!({ "transaction": token }),
        )
        .await;
        assert_eq!(status, 200, "{body}");
    }
}

needs_postgres! {
    /// A row lock held by an idle interactive transaction does not starve the pool: plain writes
    /// blocked on it give their connection back after `lock_timeout` (1 s), answered `503` with
    /// `Retry-After`, so an unrelated read finds a connection in about that long, not after the
    /// statement timeout (10 s here), as it did when each blocked write held its connection for all
    /// of it.
    #[tokio::test]
    async fn writes_blocked_on_an_idle_transactions_row_lock_give_their_connection_back() {
        let Some(url) = database("row_lock").await else {
            return;
        };
        let mut config = config(&url);
        config.limits.pool_size = 2;
        config.limits.statement_timeout = Duration::from_secs(10);
        config.transactions.idle_timeout = Duration::from_secs(60);
        let router = app(AppState::new(&config).unwrap());
        for sql in [
            "CREATE TABLE k (id int PRIMARY KEY, x int)",
            "INSERT INTO k VALUES (1, 0)",
        ] {
            let (status, body) = run(&router, json!({ "sql": sql })).await;
            assert_eq!(status, 200, "{sql}: {body}");
        }
        let (status, opened, _) = tx(
            &router,
            "/api/v1/transaction/open",
            json!({"isolation": "read_committed"}),
        )
        .await;
        assert_eq!(status, 200, "{opened}");
        let token = opened["transaction"].as_str().unwrap().to_owned();
        let (status, body, _) = tx(
            &router,
            "/api/v1/transaction/statement",
            json!({"transaction": token, "seq": 1, "sql": "UPDATE k SET x = 1 WHERE id = 1"}),
        )
        .await;
        assert_eq!(status, 200, "{body}");
        // The transaction now idles, holding the row. Writes that need it pile up behind it.
        let writes: Vec<_> = (0..2)
            .map(|_| {
                let router = router.clone();
                tokio::spawn(async move {
                    let started = Instant::now();
                    let reply = post_with(
                        &router,
                        &[],
                        &json!({"sql": "UPDATE k SET x = 2 WHERE id = 1"}),
                    )
                    .await;
                    (reply, started.elapsed())
                })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(200)).await;
        let started = Instant::now();
        let (status, body) = run(&router, json!({"sql": "SELECT 1", "read_only": true})).await;
        let waited = started.elapsed();
        eprintln!("an unrelated read behind two blocked writes waited {waited:?}");
        assert_eq!(status, 200, "{body}");
        assert!(
            waited < Duration::from_secs(6),
            "the read waited {waited:?} for a connection"
        );
        for write in writes {
            let (reply, took) = write.await.unwrap();
            assert_eq!(
                reply.status,
                503,
                "{}",
                String::from_utf8_lossy(&reply.body)
            );
            assert!(reply.header("retry-after").is_some());
            let message = reply.json()["error"]["message"]
                .as_str()
                .unwrap()
                .to_owned();
            assert!(message.contains("lock"), "{message}");
            assert!(
                took < Duration::from_secs(8),
                "a blocked write held on for {took:?}"
            );
        }
        let (status, body, _) = tx(
            &router,
            "/api/v1/transaction/rollback",
            json!({ "transaction": token }),
        )
        .await;
        assert_eq!(status, 200, "{body}");
        // With the lock gone, the write goes through.
        let (status, body) = run(&router, json!({"sql": "UPDATE k SET x = 2 WHERE id = 1"})).await;
        assert_eq!(status, 200, "{body}");
    }
}
