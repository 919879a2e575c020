//! Unit tests of the SQLite engine (`mod.rs`), beside it rather than in it so that the file holds its code alone.

use super::*;
use crate::engine::Engine as _;

fn engine_with(limits: Limits) -> SqliteEngine {
    SqliteEngine::start(&Database::Memory, None, limits, Budget::new(1 << 30)).unwrap()
}

fn engine() -> SqliteEngine {
    engine_with(Limits::default())
}

fn statement(sql: &str) -> SqlRequest {
    SqlRequest {
        sql: sql.into(),
        params: vec![],
        read_only: false,
    }
}

const ENDLESS: &str =
    "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c";

#[tokio::test]
async fn a_panicking_job_is_a_500_and_the_engine_lives_on() {
    let engine = engine();
    let err = SqliteEngine::run(&engine.writer, |conn| -> Result<(), ApiError> {
        conn.conn.execute_batch("BEGIN").unwrap();
        panic!("boom")
    })
    .await
    .unwrap_err();
    assert_eq!(err.code, ErrorCode::Internal);
    assert_eq!(err.message, crate::protocol::error::INTERNAL_MESSAGE);
    let autocommit = SqliteEngine::run(&engine.writer, |conn| Ok(conn.conn.is_autocommit()))
        .await
        .unwrap();
    assert!(
        autocommit,
        "the panicking job's transaction was rolled back"
    );
    let ok = engine
        .execute_buffered(statement("SELECT 1"))
        .await
        .unwrap();
    assert_eq!(ok.status, 200);
}

/// Waits (a bounded while) until nothing but the test holds `control`.
async fn released(control: &Arc<JobControl>) -> bool {
    for _ in 0..200 {
        if Arc::strong_count(control) == 1 {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    false
}

#[tokio::test]
async fn nothing_of_a_finished_job_outlives_it() {
    let engine = engine();
    for outcome in [Ok(()), Err(ApiError::internal())] {
        let control = Arc::new(JobControl::default());
        let result =
            SqliteEngine::run_controlled(&engine.writer, Arc::clone(&control), move |_| outcome)
                .await;
        drop(result);
        assert!(released(&control).await, "the job's control leaked");
        assert!(!control.is_cancelled(), "a finished job is not cancelled");
    }
}

#[tokio::test]
async fn close_interrupts_a_running_statement_and_later_jobs_get_503() {
    let engine = engine();
    let endless = engine.execute_buffered(statement(ENDLESS));
    let (endless, ()) = tokio::join!(endless, async {
        tokio::time::sleep(Duration::from_millis(50)).await;
        engine.close().await;
    });
    assert_eq!(endless.unwrap_err().code, ErrorCode::Unavailable);
    let after = engine
        .execute_buffered(statement("SELECT 1"))
        .await
        .unwrap_err();
    assert_eq!(after.code, ErrorCode::Unavailable);
}

#[tokio::test]
async fn a_runaway_statement_times_out_and_the_engine_serves_on() {
    let engine = engine_with(Limits {
        statement_timeout: Duration::from_millis(100),
        ..Limits::default()
    });
    let err = engine
        .execute_buffered(statement(ENDLESS))
        .await
        .unwrap_err();
    assert_eq!(err.code, ErrorCode::StatementTimeout);
    assert!(err.message.contains("100 ms"), "{}", err.message);
    engine
        .execute_buffered(statement("SELECT 1"))
        .await
        .unwrap();
}

#[tokio::test]
async fn a_dropped_request_stops_its_statement() {
    let engine = engine_with(Limits {
        read_connections: 1,
        ..Limits::default()
    });
    let abandoned = tokio::time::timeout(
        Duration::from_millis(50),
        engine.execute_buffered(statement(ENDLESS)),
    )
    .await;
    assert!(
        abandoned.is_err(),
        "the endless statement was still running"
    );
    // The only reader is free again well within the statement timeout.
    let quick = tokio::time::timeout(
        Duration::from_secs(5),
        engine.execute_buffered(statement("SELECT 1")),
    )
    .await
    .expect("the reader was released");
    assert_eq!(quick.unwrap().status, 200);
}

#[tokio::test]
async fn a_full_queue_answers_503_at_once() {
    let engine = engine_with(Limits {
        read_connections: 1,
        queue_depth: 1,
        statement_timeout: Duration::from_millis(500),
        ..Limits::default()
    });
    let running = engine.execute_buffered(statement(ENDLESS));
    let queued = async {
        tokio::time::sleep(Duration::from_millis(50)).await;
        engine.execute_buffered(statement(ENDLESS)).await
    };
    let refused = async {
        tokio::time::sleep(Duration::from_millis(100)).await;
        engine.execute_buffered(statement("SELECT 1")).await
    };
    let (running, queued, refused) = tokio::join!(running, queued, refused);
    assert_eq!(running.unwrap_err().code, ErrorCode::StatementTimeout);
    assert_eq!(queued.unwrap_err().code, ErrorCode::StatementTimeout);
    let refused = refused.unwrap_err();
    assert_eq!(refused.code, ErrorCode::Unavailable);
    assert!(refused.message.contains("busy"), "{}", refused.message);
}

#[tokio::test]
async fn read_only_requests_never_write_with_or_without_readers() {
    for read_connections in [0, 2] {
        let engine = engine_with(Limits {
            read_connections,
            ..Limits::default()
        });
        engine
            .execute_buffered(statement("CREATE TABLE t (x)"))
            .await
            .unwrap();
        for sql in [
            "INSERT INTO t VALUES (1)",
            "CREATE TABLE u (x)",
            "DROP TABLE t",
            "INSERT INTO t VALUES (1) RETURNING x",
        ] {
            let err = engine.execute_read_only(statement(sql)).await.unwrap_err();
            assert_eq!(err.code, ErrorCode::ReadOnly, "{sql}");
        }
        let count = engine
            .execute_read_only(statement("SELECT count(*) FROM t"))
            .await
            .unwrap();
        let Reply::Whole(count) = count else {
            panic!("a one-row result is answered whole")
        };
        assert!(String::from_utf8_lossy(&count.body).contains("[[0]]"));
        // The writer still writes for everyone else.
        engine
            .execute_buffered(statement("INSERT INTO t VALUES (2)"))
            .await
            .unwrap();
        assert_eq!(engine.queue_depths()[0], ("writer", 0));
        assert_eq!(
            engine.queue_depths().len(),
            1 + usize::from(read_connections > 0)
        );
    }
}

#[tokio::test]
async fn reads_run_beside_a_long_read() {
    let engine = engine_with(Limits {
        read_connections: 2,
        statement_timeout: Duration::from_secs(2),
        ..Limits::default()
    });
    let long = engine.execute_buffered(statement(ENDLESS));
    let quick = async {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let started = std::time::Instant::now();
        engine
            .execute_buffered(statement("SELECT 1"))
            .await
            .unwrap();
        engine
            .execute_buffered(statement("CREATE TABLE t (x)"))
            .await
            .unwrap();
        engine
            .execute_buffered(statement("INSERT INTO t VALUES (1)"))
            .await
            .unwrap();
        let count = engine
            .execute_buffered(statement("SELECT count(*) FROM t"))
            .await
            .unwrap();
        (started.elapsed(), count)
    };
    let (long, (elapsed, count)) = tokio::join!(long, quick);
    assert_eq!(long.unwrap_err().code, ErrorCode::StatementTimeout);
    assert!(
        elapsed < Duration::from_secs(1),
        "quick work waited {elapsed:?}"
    );
    assert!(String::from_utf8_lossy(&count.body).contains("[[1]]"));
}
