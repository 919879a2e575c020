//! The PostgreSQL request pipeline (ADR 0034): statements prepared once per connection and
//! cached, answering after DDL as a fresh Parse would (the request runs again when a cached
//! statement went stale), the transaction check that rides in COMMIT's message, and the
//! position a read's transaction names.
//!
//! The cache's tests run on a pool of one connection, so a statement prepared by one request is
//! the one the next request's cache holds.

use serde_json::json;

use crate::common::{batch_with as batch, ok, post_with};
use crate::engines::{needs_postgres, postgres_app};

fn one_connection(config: &mut sqlhttp_server::Config) {
    config.limits.pool_size = 1;
}

needs_postgres! {
    #[tokio::test]
    async fn a_statement_cached_before_ddl_answers_as_after_it() {
        let router = postgres_app!(
            "a_statement_cached_before_ddl_answers_as_after_it",
            one_connection
        );
        ok(
            &router,
            "CREATE TABLE t (k int PRIMARY KEY, v int)",
            json!([]),
        )
        .await;
        ok(&router, "INSERT INTO t VALUES (1, 10)", json!([])).await;
        let read = "SELECT v FROM t WHERE k = ?";
        for _ in 0..2 {
            let rows = ok(&router, read, json!([1])).await;
            assert_eq!(rows["columns"], json!([{"name": "v", "type": "int4"}]));
            assert_eq!(rows["rows"], json!([[10]]));
        }
        // The result's type changes: PostgreSQL refuses the cached plan (0A000).
        ok(&router, "ALTER TABLE t ALTER COLUMN v TYPE text", json!([])).await;
        let rows = ok(&router, read, json!([1])).await;
        assert_eq!(rows["columns"], json!([{"name": "v", "type": "text"}]));
        assert_eq!(rows["rows"], json!([["10"]]));

        // The parameter's type changes: the cached statement would bind an int.
        ok(&router, "SELECT v FROM t WHERE k = ?", json!([1])).await;
        ok(&router, "ALTER TABLE t ALTER COLUMN k TYPE text", json!([])).await;
        let rows = ok(&router, read, json!(["1"])).await;
        assert_eq!(rows["rows"], json!([["10"]]));

        // A keyed request whose cached statement went stale stores the fresh run's outcome.
        ok(
            &router,
            "ALTER TABLE t ALTER COLUMN v TYPE bigint USING v::bigint",
            json!([]),
        )
        .await;
        let body = json!({"sql": read, "params": ["1"]});
        let key = [("idempotency-key", "after-ddl")];
        let first = post_with(&router, &key, &body).await;
        assert_eq!(
            first.status,
            200,
            "{}",
            String::from_utf8_lossy(&first.body)
        );
        assert_eq!(
            first.json()["columns"],
            json!([{"name": "v", "type": "int8"}])
        );
        let again = post_with(&router, &key, &body).await;
        assert_eq!(again.header("idempotent-replayed"), Some("true"));
        assert_eq!(again.body, first.body);

        // Inside one batch: the third statement is the first's text, cached before the DDL of the
        // second, in the same transaction.
        let statements = json!({"statements": [
            {"sql": read, "params": ["1"]},
            {"sql": "ALTER TABLE t ALTER COLUMN v TYPE numeric"},
            {"sql": read, "params": ["1"]}
        ]});
        let done = batch(&router, &[], &statements).await;
        assert_eq!(done.status, 200, "{}", String::from_utf8_lossy(&done.body));
        assert_eq!(done.json()["results"][0]["columns"][0]["type"], "int8");
        assert_eq!(done.json()["results"][2]["columns"][0]["type"], "numeric");
        // The batch's DDL was kept once, not twice or never.
        let rows = ok(&router, read, json!(["1"])).await;
        assert_eq!(rows["columns"], json!([{"name": "v", "type": "numeric"}]));

        // A statement that fails on its own still fails, once.
        let missing = post_with(&router, &[], &json!({"sql": "SELECT nope FROM t"})).await;
        assert_eq!(missing.status, 400);
    }
}

needs_postgres! {
    #[tokio::test]
    async fn many_texts_keep_the_cache_bounded_and_answering() {
        let router = postgres_app!(
            "many_texts_keep_the_cache_bounded_and_answering",
            one_connection
        );
        // Past the cache's bound (256 per connection) it is emptied and fills again.
        for n in 0..300 {
            let rows = ok(&router, &format!("SELECT {n}::int AS n"), json!([])).await;
            assert_eq!(rows["rows"], json!([[n]]));
        }
        let held = ok(
            &router,
            "SELECT count(*)::int FROM pg_prepared_statements",
            json!([]),
        )
        .await;
        let held = held["rows"][0][0].as_i64().unwrap();
        assert!(held <= 256 + 8, "{held} statements prepared on the session");
    }
}

needs_postgres! {
    #[tokio::test]
    async fn commit_checks_the_transaction_is_the_one_begun() {
        let router = postgres_app!(
            "commit_checks_the_transaction_is_the_one_begun",
            one_connection
        );
        // The check COMMIT's message runs: it passes for the transaction it runs in...
        ok(
            &router,
            "SELECT _sqlhttp.check_transaction(EXTRACT(EPOCH FROM transaction_timestamp()))",
            json!([]),
        )
        .await;
        // ...and raises for another's start, so that COMMIT is never reached.
        let refused = post_with(
            &router,
            &[],
            &json!({"sql": "SELECT _sqlhttp.check_transaction(EXTRACT(EPOCH FROM transaction_timestamp()) - 1)"}),
        )
        .await;
        assert_ne!(refused.status, 200);
        assert!(
            String::from_utf8_lossy(&refused.body).contains("not the transaction the server opened"),
            "{}",
            String::from_utf8_lossy(&refused.body)
        );
    }
}

needs_postgres! {
    #[tokio::test]
    async fn a_pooled_session_is_read_only_outside_the_servers_transactions() {
        let router = postgres_app!(
            "a_pooled_session_is_read_only_outside_the_servers_transactions",
            one_connection
        );
        ok(&router, "CREATE TABLE t (v int)", json!([])).await;
        // A client's function turns the default off for the session; the reset after its request
        // turns it on again.
        ok(
            &router,
            "CREATE FUNCTION writable() RETURNS void LANGUAGE plpgsql AS $$ BEGIN \
         EXECUTE 'SELECT set' || '_config(''default_transaction_read_only'', ''off'', false)'; \
         END $$",
            json!([]),
        )
        .await;
        ok(&router, "SELECT writable()", json!([])).await;
        for _ in 0..2 {
            let seen = ok(
                &router,
                "SELECT current_setting('default_transaction_read_only'), \
             current_setting('transaction_read_only')",
                json!([]),
            )
            .await;
            // The session's default is read-only; the server's own transaction writes.
            assert_eq!(seen["rows"], json!([["on", "off"]]));
            ok(&router, "INSERT INTO t VALUES (1)", json!([])).await;
        }
    }
}

needs_postgres! {
    /// What the pipeline leans on should `BEGIN` itself fail, on the PostgreSQL the tests run:
    /// in a session that defaults to read-only, a write sent behind a failed `BEGIN` (so in
    /// autocommit) is refused, and nothing is written.
    #[tokio::test]
    async fn a_write_behind_a_failed_begin_cannot_write() {
        let Some(url) = crate::engines::database("a_write_behind_a_failed_begin_cannot_write").await
        else {
            return;
        };
        let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
            .await
            .unwrap();
        tokio::spawn(connection);
        client
            .batch_execute("CREATE TABLE t (v int); SET default_transaction_read_only = on")
            .await
            .unwrap();
        let insert = client.prepare("INSERT INTO t VALUES (1)").await.unwrap();
        // Both go out in one write, as the engine sends them; this BEGIN fails.
        let (begun, written) = tokio::join!(
            client.simple_query("BEGIN ISOLATION LEVEL NONSENSE; SELECT 1"),
            client.execute(&insert, &[])
        );
        assert!(begun.is_err());
        let refused = written.unwrap_err();
        assert_eq!(refused.code().map(|c| c.code()), Some("25006"), "{refused}");
        // And a failure after BEGIN aborts the transaction: the statement behind it does not run.
        let (begun, written) = tokio::join!(
            client.simple_query("BEGIN READ WRITE; SELECT 1/0"),
            client.execute(&insert, &[])
        );
        assert!(begun.is_err());
        let aborted = written.unwrap_err();
        assert_eq!(aborted.code().map(|c| c.code()), Some("25P02"), "{aborted}");
        client.batch_execute("ROLLBACK").await.unwrap();
        let rows = client
            .query_one("SELECT count(*) FROM t", &[])
            .await
            .unwrap();
        assert_eq!(rows.get::<_, i64>(0), 0);
    }
}

needs_postgres! {
    /// A read-only batch at `READ COMMITTED` takes a snapshot per statement: its bookmark covers
    /// its last statement's, not only what its `BEGIN` saw. A write that commits while the batch
    /// sleeps is seen by the batch's second statement, and is at or before the batch's bookmark
    /// (a read sent with that bookmark to a replica must see it too).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_read_committed_read_batchs_bookmark_covers_what_its_last_statement_saw() {
        let router =
            postgres_app!("a_read_committed_read_batchs_bookmark_covers_what_its_last_statement_saw");
        ok(&router, "CREATE TABLE seen (v int)", json!([])).await;
        let statements = json!({"read_only": true, "isolation": "read_committed", "statements": [
            {"sql": "SELECT 1 AS one FROM pg_catalog.pg_sleep(2)"},
            {"sql": "SELECT count(*) AS n FROM seen"}
        ]});
        let reading = tokio::spawn({
            let router = router.clone();
            async move { batch(&router, &[], &statements).await }
        });
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        let written = post_with(&router, &[], &json!({"sql": "INSERT INTO seen VALUES (1)"})).await;
        assert_eq!(written.status, 200, "{}", String::from_utf8_lossy(&written.body));
        let read = reading.await.unwrap();
        assert_eq!(read.status, 200, "{}", String::from_utf8_lossy(&read.body));
        assert_eq!(
            read.json()["results"][1]["rows"],
            json!([[1]]),
            "the write committed while the batch slept"
        );
        let at = |reply: &crate::common::Reply| {
            u64::from_str_radix(reply.header("sqlhttp-bookmark").unwrap(), 16).unwrap()
        };
        assert!(
            at(&read) >= at(&written),
            "the batch's bookmark {:016x} is short of the write it saw ({:016x})",
            at(&read),
            at(&written)
        );
    }
}
