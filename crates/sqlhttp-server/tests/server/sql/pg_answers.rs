//! The right answers on PostgreSQL (issue 27, findings 4 and 6): cells past `--max-value-bytes`
//! and rows past `--max-result-bytes` refused as on SQLite, SQLSTATEs a client's function raises answered as its own errors and
//! never retried by the SDK, `rows_affected` counting changes only, `float4` at its own
//! precision, `json` cells the SDK can read back, and years past 9999 with ISO 8601's `+`.
//!
//! Each test runs on a database of its own from [`crate::engines::database`], and skips as the
//! other PostgreSQL tests do when there is no PostgreSQL.

use serde_json::{Value, json};
use sqlhttp::{Client, RetryPolicy};

use crate::common::{ok, serve, sql};
use crate::engines::{config, database, needs_postgres, postgres_app};

needs_postgres! {
    #[tokio::test]
    async fn a_cell_past_the_value_limit_is_refused_and_the_server_goes_on() {
        let router = postgres_app!(
            "a_cell_past_the_value_limit_is_refused_and_the_server_goes_on",
            |config| config.limits.max_value_bytes = 1000
        );
        for statement in [
            "SELECT 1 AS n, repeat('x', 1001) AS big",
            "SELECT decode(repeat('ab', 1001), 'hex') AS big",
            "SELECT ARRAY(SELECT repeat('y', 50) FROM generate_series(1, 40)) AS big",
            "SELECT to_json(repeat('z', 2000)) AS big",
        ] {
            let reply = sql(&router, statement, json!([])).await;
            assert_eq!(reply.status, 400, "{statement}");
            assert_eq!(reply.code(), "SQL_ERROR", "{statement}");
            let message = reply.json()["error"]["message"]
                .as_str()
                .unwrap()
                .to_owned();
            assert!(
                message.contains("--max-value-bytes") && message.contains("`big`"),
                "{statement}: {message}"
            );
        }
        // Past the first chunk the refusal ends the streamed body, after a whole row.
        let reply = sql(
            &router,
            "SELECT CASE WHEN g < 200 THEN repeat('y', 500) ELSE repeat('x', 1001) END AS big \
         FROM generate_series(1, 200) g",
            json!([]),
        )
        .await;
        let text = String::from_utf8_lossy(&reply.body);
        assert!(
            text.contains("SQL_ERROR")
                && text.contains("--max-value-bytes")
                && text.contains("row 200"),
            "{}",
            &text[text.len().saturating_sub(400)..]
        );
        // At the limit the cell is sent, and the server is fine after.
        let body = ok(&router, "SELECT repeat('x', 1000) AS v", json!([])).await;
        assert_eq!(body["rows"][0][0].as_str().unwrap().len(), 1000);
        ok(&router, "SELECT 1", json!([])).await;
    }
}

needs_postgres! {
    /// A connection that answered an ordinary error (here in the middle of its rows) and is then
    /// cut for a cell past `--max-value-bytes` still says so: asking what a connection was cut for
    /// after the error did not forget the connection. The cut is the wire's (the cell passes both
    /// limits, so it is refused before it arrives), not the row writer's.
    #[tokio::test]
    async fn a_cut_after_an_ordinary_error_on_the_same_connection_is_still_named() {
        let router = postgres_app!(
            "a_cut_after_an_ordinary_error_on_the_same_connection_is_still_named",
            |config| {
                config.limits.max_value_bytes = 100_000;
                config.limits.max_result_bytes = 65_536;
                config.limits.pool_size = 1;
            }
        );
        for _ in 0..3 {
            let failed = sql(
                &router,
                "SELECT g, 10 / (g - 5) AS v FROM generate_series(1, 20) AS g",
                json!([]),
            )
            .await;
            assert_eq!(
                failed.status,
                400,
                "{}",
                String::from_utf8_lossy(&failed.body)
            );
            let cut = sql(&router, "SELECT repeat('z', 2000000) AS big", json!([])).await;
            assert_eq!(cut.status, 400, "{}", String::from_utf8_lossy(&cut.body));
            assert_eq!(cut.code(), "SQL_ERROR");
            let message = cut.json()["error"]["message"].as_str().unwrap().to_owned();
            assert!(message.contains("--max-value-bytes"), "{message}");
        }
        ok(&router, "SELECT 1", json!([])).await;
    }
}

needs_postgres! {
    #[tokio::test]
    async fn a_row_past_the_result_limit_is_refused_as_on_sqlite() {
        let router = postgres_app!(
            "a_row_past_the_result_limit_is_refused_as_on_sqlite",
            |config| config.limits.max_result_bytes = 4000
        );
        let reply = sql(
            &router,
            "SELECT repeat('a', 900) a, repeat('b', 900) b, repeat('c', 900) c, \
         repeat('d', 900) d, repeat('e', 900) e",
            json!([]),
        )
        .await;
        assert_eq!(
            (reply.status, reply.code().as_str()),
            (422, "RESULT_TOO_LARGE")
        );
        let message = reply.json()["error"]["message"]
            .as_str()
            .unwrap()
            .to_owned();
        assert!(
            message.contains("row 1") && message.contains("--max-result-bytes"),
            "{message}"
        );
        ok(
            &router,
            "SELECT repeat('a', 900) a, repeat('b', 900) b",
            json!([]),
        )
        .await;
    }
}

/// A function of the client's that raises `code` with PL/pgSQL's `RAISE`.
const RAISE_IT: &str = "CREATE FUNCTION raise_it(code text) RETURNS int LANGUAGE plpgsql AS $$ \
     BEGIN RAISE EXCEPTION 'raised %', code USING ERRCODE = code; END $$";

needs_postgres! {
    #[tokio::test]
    async fn sqlstates_a_function_raises_are_the_clients_errors() {
        let router = postgres_app!("sqlstates_a_function_raises_are_the_clients_errors", |_| {});
        ok(&router, RAISE_IT, json!([])).await;
        let cases = [
            ("XX000", 400, "SQL_ERROR"),
            ("57000", 400, "SQL_ERROR"),
            ("57014", 400, "SQL_ERROR"),
            ("57P01", 400, "SQL_ERROR"),
            ("40001", 400, "SQL_ERROR"),
            ("40P01", 400, "SQL_ERROR"),
            ("08006", 400, "SQL_ERROR"),
            ("53100", 400, "SQL_ERROR"),
            ("25006", 400, "SQL_ERROR"),
            ("58030", 400, "SQL_ERROR"),
            ("P0001", 400, "SQL_ERROR"),
            ("22012", 400, "SQL_ERROR"),
            ("42501", 403, "STATEMENT_NOT_ALLOWED"),
            ("23505", 409, "CONSTRAINT_VIOLATION"),
        ];
        for (code, status, error) in cases {
            let reply = sql(&router, "SELECT raise_it(?)", json!([code])).await;
            assert_eq!(
                (reply.status, reply.code().as_str()),
                (status, error),
                "{code}"
            );
            assert!(reply.header("retry-after").is_none(), "{code}");
            let message = reply.json()["error"]["message"]
                .as_str()
                .unwrap()
                .to_owned();
            assert!(
                message.contains(&format!("raised {code}")),
                "{code}: {message}"
            );
        }
        // PostgreSQL's own errors keep their verdicts.
        let reply = sql(&router, "SELECT 1/0", json!([])).await;
        assert_eq!(reply.code(), "SQL_ERROR");
    }
}

needs_postgres! {
    #[tokio::test]
    async fn the_sdk_does_not_retry_a_write_whose_function_raised_a_retryable_code() {
        let Some(url) =
            database("the_sdk_does_not_retry_a_write_whose_function_raised_a_retryable_code").await
        else {
            return;
        };
        let server = serve(config(&url)).await;
        let client = Client::builder(server.url())
            .retry(RetryPolicy::new().with_max_attempts(5))
            .retry_writes(true)
            .build()
            .unwrap();
        client.execute(RAISE_IT).await.unwrap();
        client.execute("CREATE TABLE calls (n int)").await.unwrap();
        client
            .execute(
                "CREATE FUNCTION counted(code text) RETURNS int LANGUAGE plpgsql AS $$ \
             BEGIN INSERT INTO calls VALUES (1); RETURN raise_it(code); END $$",
            )
            .await
            .unwrap();
        for code in ["40001", "40P01", "08006", "57P01", "XX000"] {
            let err = client
                .execute(format!("SELECT counted('{code}')"))
                .await
                .unwrap_err();
            assert_eq!(err.code(), Some("SQL_ERROR"), "{code}: {err}");
            assert_eq!(err.attempts(), 1, "{code}: {err}");
            assert!(!err.is_retryable(), "{code}");
        }
        let calls: Vec<i64> = client
            .query("SELECT count(*) FROM calls")
            .fetch_all()
            .await
            .unwrap();
        assert_eq!(calls, [0], "each write ran once and rolled back");
    }
}

needs_postgres! {
    #[tokio::test]
    async fn rows_affected_counts_changes_only() {
        let router = postgres_app!("rows_affected_counts_changes_only", |_| {});
        ok(&router, "CREATE TABLE t (v int)", json!([])).await;
        let cases = [
            ("INSERT INTO t SELECT g FROM generate_series(1, 3) g", 3),
            ("WITH x AS (SELECT * FROM t) SELECT * FROM x", 0),
            (
                "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 3) \
             SELECT i FROM n",
                0,
            ),
            // A writable WITH before a SELECT: PostgreSQL's tag is the SELECT's; its changes are
            // not counted (count them with RETURNING).
            (
                "WITH d AS (DELETE FROM t WHERE v = 1 RETURNING *) SELECT count(*) FROM d",
                0,
            ),
            (
                "WITH n AS (SELECT 10 AS v) INSERT INTO t SELECT v FROM n",
                1,
            ),
            ("UPDATE t SET v = v + 1 RETURNING v", 3),
            (
                "WITH u AS (SELECT 3 AS v) MERGE INTO t USING u ON t.v = u.v \
             WHEN MATCHED THEN DELETE",
                1,
            ),
            ("/* c */ DELETE FROM t WHERE v > 10", 1),
            ("SELECT * FROM t", 0),
            ("VALUES (1), (2)", 0),
            ("CREATE TABLE u AS SELECT * FROM t", 0),
        ];
        for (statement, affected) in cases {
            let body = ok(&router, statement, json!([])).await;
            assert_eq!(body["rows_affected"], affected, "{statement}");
        }
    }
}

needs_postgres! {
    #[tokio::test]
    async fn float4_is_written_at_its_own_precision() {
        let router = postgres_app!("float4_is_written_at_its_own_precision", |_| {});
        let reply = sql(
            &router,
            "SELECT 0.1::float4, 3.4028235e38::float4, 1e-45::float4, 'NaN'::float4, \
         ARRAY[0.1, 2.5]::float4[], 0.1::float8",
            json!([]),
        )
        .await;
        let text = String::from_utf8(reply.body).unwrap();
        assert!(
            text.contains(r#""rows":[[0.1,3.4028235e+38,1e-45,null,[0.1,2.5],0.1]]"#),
            "{text}"
        );
    }
}

#[derive(Debug, serde::Deserialize)]
struct Documents {
    big: Value,
    bigb: Value,
    deep: Value,
    fine: Value,
}

needs_postgres! {
    #[tokio::test]
    async fn json_cells_the_sdk_cannot_read_back_arrive_as_their_text() {
        let Some(url) = database("json_cells_the_sdk_cannot_read_back_arrive_as_their_text").await
        else {
            return;
        };
        let server = serve(config(&url)).await;
        let client = Client::builder(server.url()).build().unwrap();
        client
            .execute("CREATE TABLE docs (big json, bigb jsonb, deep json, fine json)")
            .await
            .unwrap();
        client
            .execute(
                "INSERT INTO docs VALUES ('1e400', '1e400', \
             (repeat('[', 5000) || repeat(']', 5000))::json, '{\"x\": [1, 2.5, \"[[\"]}')",
            )
            .await
            .unwrap();
        let rows: Vec<Documents> = client
            .query("SELECT big, bigb, deep, fine FROM docs")
            .fetch_all()
            .await
            .unwrap();
        let row = &rows[0];
        assert_eq!(row.big, json!("1e400"));
        // jsonb keeps the number as numeric: 1 and 400 zeros.
        assert_eq!(row.bigb, json!(format!("1{}", "0".repeat(400))));
        assert_eq!(
            row.deep,
            json!(format!("{}{}", "[".repeat(5000), "]".repeat(5000)))
        );
        assert_eq!(row.fine, json!({"x": [1, 2.5, "[["]}));
        // The server goes on, and the same cells read through the dynamic table as well.
        let again: Vec<Vec<Value>> = client
            .query("SELECT big, deep FROM docs")
            .fetch_all()
            .await
            .unwrap();
        assert_eq!(again[0][0], json!("1e400"));
    }
}

needs_postgres! {
    #[tokio::test]
    async fn years_past_9999_and_before_1_are_written_as_iso_8601_says() {
        let router = postgres_app!(
            "years_past_9999_and_before_1_are_written_as_iso_8601_says",
            |_| {}
        );
        let body = ok(
            &router,
            "SELECT '10000-01-01'::date, '12345-06-07 08:09:10.5'::timestamp, \
         '294276-12-31 23:59:59+00'::timestamptz, '9999-12-31'::date, \
         '0001-01-01 BC'::date, '0002-03-04 12:00 BC'::timestamp",
            json!([]),
        )
        .await;
        assert_eq!(
            body["rows"][0],
            json!([
                "+10000-01-01",
                "+12345-06-07T08:09:10.5",
                "+294276-12-31T23:59:59Z",
                "9999-12-31",
                "0000-01-01",
                "-0001-03-04T12:00:00"
            ])
        );
    }
}

/// This process's resident memory (`VmRSS`) or its peak (`VmHWM`), in bytes.
fn resident(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find_map(|line| line.strip_prefix(field))
        .and_then(|rest| rest.split_whitespace().next()?.parse::<u64>().ok())
        .map_or(0, |kib| kib * 1024)
}

needs_postgres! {
    /// A cell far past `--max-value-bytes` is refused as its length arrives, before its bytes do
    /// (ADR 0028): the server (this process) never holds it, the answer is the cell's `400`, and
    /// the next request is served. A row past `--max-result-bytes` is cut the same way, with the
    /// row's `422`. The peak is read from `VmHWM` (reset through `/proc/self/clear_refs` where the
    /// kernel lets us) and from `VmRSS` sampled while the request runs; the bound is generous,
    /// since other tests share the process.
    #[tokio::test]
    async fn a_cell_far_past_the_limit_is_refused_before_it_arrives() {
        const CELL: u64 = 300_000_000;
        let router = postgres_app!(
            "a_cell_far_past_the_limit_is_refused_before_it_arrives",
            |_| {}
        );
        // Every pooled session open and warm, so that only the statement is measured.
        ok(&router, "SELECT 1", json!([])).await;
        let idle = resident("VmRSS:");
        let peak_reset = std::fs::write("/proc/self/clear_refs", "5").is_ok();
        let sampling = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
        let sampler = {
            let sampling = std::sync::Arc::clone(&sampling);
            tokio::spawn(async move {
                let mut peak = 0;
                while sampling.load(std::sync::atomic::Ordering::Acquire) {
                    peak = peak.max(resident("VmRSS:"));
                    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
                }
                peak
            })
        };
        let reply = sql(
            &router,
            &format!("SELECT 1 AS n, repeat('x', {CELL}) AS big"),
            json!([]),
        )
        .await;
        sampling.store(false, std::sync::atomic::Ordering::Release);
        let mut peak = sampler.await.unwrap();
        if peak_reset {
            peak = peak.max(resident("VmHWM:"));
        }
        assert_eq!((reply.status, reply.code().as_str()), (400, "SQL_ERROR"));
        let message = reply.json()["error"]["message"]
            .as_str()
            .unwrap()
            .to_owned();
        assert!(
            message.contains("`big` of row 1 is 300000000 bytes")
                && message.contains("--max-value-bytes"),
            "{message}"
        );
        let grew = peak.saturating_sub(idle);
        assert!(
            grew < 100 * 1024 * 1024,
            "the server grew by {} MiB for a refused {} MB cell",
            grew / (1024 * 1024),
            CELL / 1_000_000
        );
        ok(&router, "SELECT 1", json!([])).await;

        // Twenty cells of 1 MB each (under --max-value-bytes), 20 MB in all: past the row's limit
        // of 16 MiB and its framing, cut before its end.
        let reply = sql(
            &router,
            &format!(
                "SELECT {}",
                (1..=20)
                    .map(|i| format!("repeat('y', 1000000) AS c{i}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            json!([]),
        )
        .await;
        assert_eq!(
            (reply.status, reply.code().as_str()),
            (422, "RESULT_TOO_LARGE")
        );
        assert!(
            reply.json()["error"]["message"]
                .as_str()
                .unwrap()
                .contains("row 1"),
            "{:?}",
            reply.json()
        );
        let body = ok(&router, "SELECT repeat('z', 3000000) AS fine", json!([])).await;
        assert_eq!(body["rows"][0][0].as_str().unwrap().len(), 3_000_000);
    }
}
