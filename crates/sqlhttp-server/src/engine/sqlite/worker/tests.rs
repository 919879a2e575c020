//! Unit tests of `worker.rs`, beside it rather than in it so that the file holds its code alone.

use std::sync::atomic::AtomicBool;
use std::sync::mpsc::{Sender, channel};

use super::*;
use crate::config::{Database, Limits};
use crate::engine::sqlite::connection::{Role, Target};
use crate::engine::sqlite::control::Hooks;
use crate::protocol::error::ErrorCode;

/// Limits under which every job has had to stop as soon as it starts.
fn limits() -> Limits {
    Limits {
        statement_timeout: Duration::ZERO,
        ..Limits::default()
    }
}

fn opener(target: &Target, role: Role) -> Opener {
    let target = target.clone();
    Arc::new(move || {
        let hooks = Arc::new(Hooks::new(Arc::new(AtomicBool::new(false))));
        Conn::open(&target, role, limits(), hooks)
    })
}

/// A pool of one connection whose jobs are given up at the first look past their time.
fn pool(target: &Target, role: Role, cap: usize) -> (Pool, Arc<Strays>) {
    let open = opener(target, role);
    let strays = Arc::new(Strays::new(cap));
    let first = open().unwrap();
    let pool = Pool::start(
        "test",
        vec![first],
        4,
        open,
        Arc::clone(&strays),
        Duration::ZERO,
    )
    .unwrap();
    (pool, strays)
}

/// Starts a job that runs `before`, says it started, and waits to be let go (a statement
/// that does not stop); the returned sender lets it go.
fn stuck<T: Send + 'static>(
    pool: &Pool,
    before: impl FnOnce(&Conn) + Send + 'static,
    after: impl FnOnce(&Conn) -> Result<T, ApiError> + Send + 'static,
) -> (impl Future<Output = Result<T, ApiError>>, Sender<()>) {
    let (started, is_started) = channel();
    let (release, released) = channel::<()>();
    let result = pool
        .start_job(
            &Arc::new(JobControl::default()),
            move |conn| {
                before(conn);
                started.send(()).unwrap();
                let _ = released.recv_timeout(Duration::from_secs(30));
                after(conn)
            },
            |_| {},
        )
        .unwrap();
    is_started.recv_timeout(Duration::from_secs(10)).unwrap();
    (result, release)
}

/// Waits (a bounded while) until `done`.
fn eventually(what: &str, done: impl Fn() -> bool) {
    let until = Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(Instant::now() < until, "never: {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

async fn count(pool: &Pool) -> i64 {
    pool.run(&Arc::new(JobControl::default()), |conn| {
        Ok(conn
            .conn
            .query_row("SELECT count(*) FROM t", [], |row| row.get(0))
            .unwrap())
    })
    .await
    .unwrap()
}

#[tokio::test]
async fn a_stuck_reader_is_given_up_and_replaced() {
    let target = Target::new(&Database::Memory).unwrap();
    let (pool, strays) = pool(&target, Role::Reader, 1);
    let (result, release) = stuck(&pool, |_| {}, |_| Ok(1));
    pool.watch(Instant::now(), None);
    let err = result.await.unwrap_err();
    assert_eq!(err.code, ErrorCode::StatementTimeout, "{}", err.message);
    assert_eq!(strays.alive(), 1);
    assert_eq!(strays.total(), 1);
    // The replacement serves while the stuck thread goes on.
    let answer = pool
        .run(&Arc::new(JobControl::default()), |_| Ok(2))
        .await
        .unwrap();
    assert_eq!(answer, 2);
    release.send(()).unwrap();
    eventually("the stray ends", || strays.alive() == 0);
    assert_eq!(strays.total(), 1);
}

#[tokio::test]
async fn a_given_up_write_never_commits() {
    let target = Target::new(&Database::Memory).unwrap();
    let (pool, strays) = pool(&target, Role::Writer, 1);
    pool.run(&Arc::new(JobControl::default()), |conn| {
        conn.conn.execute_batch("CREATE TABLE t (x)").unwrap();
        Ok(())
    })
    .await
    .unwrap();
    let (result, release) = stuck(
        &pool,
        |conn| {
            conn.conn
                .execute_batch("SAVEPOINT s; INSERT INTO t VALUES (1)")
                .unwrap();
        },
        |conn| {
            conn.conn
                .execute_batch("RELEASE s")
                .map_err(crate::engine::sqlite::errors::map_engine_error)
        },
    );
    pool.watch(Instant::now(), None);
    assert_eq!(result.await.unwrap_err().code, ErrorCode::StatementTimeout);
    // The stuck write still holds the write lock: the replacement reads, and its writes
    // wait their bounded while.
    assert_eq!(count(&pool).await, 0);
    release.send(()).unwrap();
    eventually("the stray ends", || strays.alive() == 0);
    assert_eq!(count(&pool).await, 0, "the given-up write committed");
    pool.run(&Arc::new(JobControl::default()), |conn| {
        conn.conn.execute_batch("INSERT INTO t VALUES (2)").unwrap();
        Ok(())
    })
    .await
    .unwrap();
    assert_eq!(count(&pool).await, 1, "the write lock is free again");
}

#[tokio::test]
async fn a_write_that_committed_is_not_given_up() {
    let target = Target::new(&Database::Memory).unwrap();
    let (pool, strays) = pool(&target, Role::Writer, 1);
    let (result, release) = stuck(
        &pool,
        |conn| {
            conn.conn
                .execute_batch("CREATE TABLE t (x); INSERT INTO t VALUES (1)")
                .unwrap();
        },
        |_| Ok(()),
    );
    pool.watch(Instant::now(), None);
    assert_eq!(strays.total(), 0, "a job whose commit won was given up");
    release.send(()).unwrap();
    result.await.unwrap();
    assert_eq!(count(&pool).await, 1);
}

#[tokio::test]
async fn past_the_stray_cap_nothing_is_replaced_and_the_pool_refuses() {
    let target = Target::new(&Database::Memory).unwrap();
    let (pool, strays) = pool(&target, Role::Reader, 1);
    let (first, release_first) = stuck(&pool, |_| {}, |_| Ok(()));
    pool.watch(Instant::now(), None);
    assert!(first.await.is_err());
    // The replacement (one stray: within the cap) takes the next stuck job.
    let (second, release_second) = stuck(&pool, |_| {}, |_| Ok(()));
    pool.watch(Instant::now(), None);
    assert!(second.await.is_err());
    assert_eq!(strays.alive(), 2);
    // Two strays, past the cap of one: no connection is left, and none is opened.
    let refused = pool
        .run(&Arc::new(JobControl::default()), |_| Ok(()))
        .await
        .unwrap_err();
    assert_eq!(refused.code, ErrorCode::Unavailable);
    assert!(
        refused.message.contains("did not stop"),
        "{}",
        refused.message
    );
    release_first.send(()).unwrap();
    eventually("a stray ends", || strays.alive() == 1);
    pool.watch(Instant::now(), None);
    eventually("a replacement opens", || !pool.shared.has_no_connection());
    pool.run(&Arc::new(JobControl::default()), |_| Ok(()))
        .await
        .unwrap();
    release_second.send(()).unwrap();
    eventually("the strays end", || strays.alive() == 0);
}

#[tokio::test]
async fn a_closing_pool_settles_without_its_stuck_thread() {
    let target = Target::new(&Database::Memory).unwrap();
    let (pool, strays) = pool(&target, Role::Reader, 1);
    let (result, release) = stuck(&pool, |_| {}, |_| Ok(()));
    pool.close_queue();
    assert!(!pool.settled());
    let closing = Instant::now();
    pool.watch(closing, Some(closing));
    let err = result.await.unwrap_err();
    assert_eq!(err.code, ErrorCode::Unavailable, "{}", err.message);
    assert!(err.message.contains("shutting down"), "{}", err.message);
    assert!(pool.settled(), "nothing else holds the pool open");
    assert!(!pool.shared.has_no_connection() || lock(&pool.shared.live).missing == 1);
    release.send(()).unwrap();
    eventually("the stray ends", || strays.alive() == 0);
}
