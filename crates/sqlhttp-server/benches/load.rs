//! Figures for the engine's concurrency and memory bounds (ADR 0013), printed as ratios
//! against a baseline run in the same process:
//!
//! 1. point-read throughput at 64 requests in flight, one connection for everything
//!    (`read_connections = 0`) versus the reader pool;
//! 2. the same while a long report holds a connection;
//! 3. the `sqlhttpd` binary's resident memory growth for a 300 MB value (refused within its
//!    limit) and a 5-million-row result (streamed, ADR 0016);
//! 4. with `SQLHTTPD_BENCH_POSTGRES_URL` (a superuser's URL), the same point reads on
//!    PostgreSQL: through `sqlhttpd`, against what an application would write instead (a
//!    deadpool-postgres pool of the same size), and what resetting each session between
//!    requests costs that pool (ADR 0020).
//!
//! Run with `cargo bench -p sqlhttp-server --bench load`, or
//! `SQLHTTPD_BENCH_POSTGRES_URL=$(scripts/start-postgres) cargo bench -p sqlhttp-server --bench load`.

#[path = "support/scratch_database.rs"]
mod scratch_database;

use scratch_database::ScratchDatabase;

use std::time::{Duration, Instant};

use serde_json::json;
use sqlhttp_server::{Config, Database, Limits, Server, ServerHandle};

const IN_FLIGHT: usize = 64;
const RUN_FOR: Duration = Duration::from_secs(3);
const REPORT: &str =
    "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c";

async fn serve(database: Database, read_connections: usize) -> ServerHandle {
    let config = Config {
        listen: "127.0.0.1:0".parse().unwrap(),
        database,
        limits: Limits {
            read_connections,
            statement_timeout: Duration::from_secs(60),
            queue_depth: 1024,
            ..Limits::default()
        },
        ..Config::default()
    };
    Server::bind(config).await.unwrap().spawn()
}

async fn post(client: &reqwest::Client, url: &str, sql: &str) -> u16 {
    client
        .post(format!("{url}/api/v1/sql"))
        .header("content-type", "application/json")
        .body(json!({ "sql": sql }).to_string())
        .send()
        .await
        .map(|r| r.status().as_u16())
        .unwrap_or(0)
}

/// Point reads per second with `IN_FLIGHT` requests outstanding for `RUN_FOR`.
async fn point_reads(url: &str) -> f64 {
    let client = reqwest::Client::builder()
        .no_proxy()
        .pool_max_idle_per_host(IN_FLIGHT)
        .build()
        .unwrap();
    let url = url.to_owned();
    in_flight(move |id| {
        let client = client.clone();
        let url = url.clone();
        async move {
            let sql = format!("SELECT v FROM kv WHERE k = {id}");
            assert_eq!(post(&client, &url, &sql).await, 200);
        }
    })
    .await
}

/// Calls of `read` per second with `IN_FLIGHT` outstanding for `RUN_FOR`; `read` gets the key
/// to read.
async fn in_flight<F, Fut>(read: F) -> f64
where
    F: Fn(i64) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let deadline = Instant::now() + RUN_FOR;
    let started = Instant::now();
    let mut tasks = Vec::new();
    for worker in 0..IN_FLIGHT {
        let read = read.clone();
        tasks.push(tokio::spawn(async move {
            let mut done = 0_u64;
            let mut id = worker as i64;
            while Instant::now() < deadline {
                read(id % 10_000).await;
                done += 1;
                id += IN_FLIGHT as i64;
            }
            done
        }));
    }
    let mut total = 0;
    for task in tasks {
        total += task.await.unwrap();
    }
    total as f64 / started.elapsed().as_secs_f64()
}

async fn prepare(url: &str) {
    let client = reqwest::Client::builder().no_proxy().build().unwrap();
    assert_eq!(
        post(
            &client,
            url,
            "CREATE TABLE kv (k INTEGER PRIMARY KEY, v TEXT)"
        )
        .await,
        200
    );
    assert_eq!(
        post(
            &client,
            url,
            "INSERT INTO kv WITH RECURSIVE c(x) AS (SELECT 0 UNION ALL SELECT x + 1 FROM c LIMIT 10000) SELECT x, 'value ' || x FROM c"
        )
        .await,
        200
    );
}

async fn scenario(readers: usize, with_report: bool) -> f64 {
    let dir = tempfile::tempdir().unwrap();
    let handle = serve(Database::File(dir.path().join("bench.db")), readers).await;
    let url = handle.url();
    prepare(&url).await;
    let report = with_report.then(|| {
        let url = url.clone();
        tokio::spawn(async move {
            let client = reqwest::Client::builder().no_proxy().build().unwrap();
            post(&client, &url, REPORT).await
        })
    });
    if report.is_some() {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let rate = point_reads(&url).await;
    if let Some(report) = report {
        report.abort();
    }
    handle.shutdown().await;
    rate
}

fn rss_kib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|line| line.strip_prefix(field))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

async fn memory_per_request() {
    use std::io::{BufRead as _, BufReader};
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_sqlhttpd"))
        .args(["--listen", "127.0.0.1:0"])
        .env("RUST_LOG", "error")
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    let url = line
        .trim()
        .strip_prefix("listening on ")
        .unwrap()
        .to_owned();
    let client = reqwest::Client::builder().no_proxy().build().unwrap();
    assert_eq!(post(&client, &url, "SELECT 1").await, 200);
    let pid = child.id();
    let baseline = rss_kib(pid, "VmHWM:");
    let value = post(&client, &url, "SELECT zeroblob(300000000)").await;
    let after_value = rss_kib(pid, "VmHWM:");
    // Read to the end: the server streams it while the client takes it.
    let response = client
        .post(format!("{url}/api/v1/sql"))
        .header("content-type", "application/json")
        .body(json!({ "sql": "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c LIMIT 5000000) SELECT x, 'row ' || x FROM c" }).to_string())
        .send()
        .await
        .unwrap();
    let rows = response.status().as_u16();
    let body_bytes = response.bytes().await.map_or(0, |b| b.len());
    let after_rows = rss_kib(pid, "VmHWM:");
    println!(
        "memory: sqlhttpd peak RSS {:.1} MiB after start-up",
        baseline as f64 / 1024.0
    );
    println!(
        "memory: SELECT zeroblob(300000000) -> {value}; peak RSS grew {:.1} MiB",
        after_value.saturating_sub(baseline) as f64 / 1024.0
    );
    println!(
        "memory: a 5,000,000-row result -> {rows}, {:.0} MB streamed; peak RSS grew {:.1} MiB in all",
        body_bytes as f64 / 1e6,
        after_rows.saturating_sub(baseline) as f64 / 1024.0,
    );
    let _ = child.kill();
    let _ = child.wait();
}

/// Point reads on PostgreSQL: sqlhttpd against a plain pool, and the plain pool with and
/// without a session reset per checkout.
async fn postgres(url: &str) {
    use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};

    let scratch = ScratchDatabase::create(url, "bench").await;
    let db_url = scratch.url.clone();
    let Database::Postgres(database) = db_url.parse().unwrap() else {
        unreachable!("a PostgreSQL URL")
    };
    // A client role of its own: its password is this database's.
    let database = Database::Postgres(database.with_client_role(&scratch.role).unwrap());
    let handle = serve(database, 4).await;
    let server_url = handle.url();
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    for sql in [
        "CREATE TABLE kv (k INTEGER PRIMARY KEY, v TEXT)",
        "INSERT INTO kv SELECT x, 'value ' || x FROM generate_series(0, 9999) AS x",
    ] {
        assert_eq!(post(&http, &server_url, sql).await, 200);
    }
    let through_sqlhttpd = point_reads(&server_url).await;
    handle.shutdown().await;

    let pool = |recycling_method| {
        let manager = Manager::from_config(
            db_url.parse().unwrap(),
            tokio_postgres::NoTls,
            ManagerConfig { recycling_method },
        );
        // The size of sqlhttpd's pool with 4 readers.
        Pool::builder(manager).max_size(5).build().unwrap()
    };
    let plain = |pool: Pool| {
        in_flight(move |id| {
            let pool = pool.clone();
            async move {
                let client = pool.get().await.unwrap();
                let statement = client
                    .prepare_cached("SELECT v FROM kv WHERE k = $1")
                    .await
                    .unwrap();
                client.query_one(&statement, &[&(id as i32)]).await.unwrap();
            }
        })
    };
    let fast = plain(pool(RecyclingMethod::Fast)).await;
    let clean = plain(pool(RecyclingMethod::Clean)).await;
    println!(
        "PostgreSQL point reads, {IN_FLIGHT} in flight, 5 connections: plain pool {fast:.0}/s, \
         plain pool resetting sessions {clean:.0}/s ({:.2}x), through sqlhttpd {through_sqlhttpd:.0}/s \
         ({:.2}x the plain pool)",
        clean / fast,
        through_sqlhttpd / fast
    );
    scratch.drop().await;
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let one = scenario(0, false).await;
        let pool = scenario(4, false).await;
        println!("point reads, {IN_FLIGHT} in flight: one connection {one:.0}/s, reader pool (4) {pool:.0}/s, ratio {:.2}x", pool / one);
        let one = scenario(0, true).await;
        let pool = scenario(4, true).await;
        println!("point reads beside a long report: one connection {one:.0}/s, reader pool (4) {pool:.0}/s, ratio {:.2}x", pool / one);
        memory_per_request().await;
        match std::env::var("SQLHTTPD_BENCH_POSTGRES_URL") {
            Ok(url) => postgres(&url).await,
            Err(_) => println!("PostgreSQL: set SQLHTTPD_BENCH_POSTGRES_URL for its figures"),
        }
    });
}
