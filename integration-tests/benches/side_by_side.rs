//! `sqlhttp` side by side with what a user writes without it, against one `sqlhttpd` in one run:
//! * `raw` — reqwest + serde_json: POST the statement, parse `rows` into typed tuples;
//! * `middleware` — the same behind `reqwest-middleware` + `reqwest-retry` (what a user adds for
//!   retries), with the same three attempts in all.
//!
//! Measured: point-query p50 and 64-in-flight throughput, a 100k-row typed fetch, a 1M-row fetch
//! (time, client peak RSS, server growth; `sqlhttp` streams it), `fetch_one` on a 5M-row query, the
//! attempts each call makes against a server answering 503 to everything, and what compression
//! does to a 100k-row fetch on loopback and on a modelled slow link. Ratios are printed beside the
//! figures; the targets are checked and reported, not asserted.
//!
//! The server runs in a child process (this binary again), so that the client's and the server's
//! memory can be told apart. Rows are 8 columns wide, as in the decode bench.
//!
//! Run: `cargo bench -p integration-tests --bench side_by_side` (a couple of minutes on 2 cores).
//!
//! Instruction counts instead of times (load does not move them): with
//! `SQLHTTP_SIDE_BY_SIDE_CALLGRIND=sqlhttp:N` (or `raw:N`) the binary makes N point queries with
//! one client on a current-thread runtime inside `callgrind_sqlhttp_calls` (or
//! `callgrind_raw_calls`), the server in its child process, so that
//! `valgrind --tool=callgrind --trace-children=no --collect-atstart=no
//! --toggle-collect='*callgrind_sqlhttp_calls*' target/release/deps/side_by_side-<hash>` counts
//! the client's call path alone.

use std::io::{BufRead as _, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Deserialize;
use sqlhttp::{Client, RetryPolicy};
use sqlhttp_server::{Config, Server};
use sqlhttp_testkit::{ChaosProxy, Fault};

const SERVE_ENV: &str = "SQLHTTP_SIDE_BY_SIDE_SERVE";
const CALLGRIND_ENV: &str = "SQLHTTP_SIDE_BY_SIDE_CALLGRIND";
const TABLE_ROWS: u64 = 1_000_000;

/// The struct a `sqlhttp` user decodes into (by column name).
#[derive(Debug, Deserialize)]
#[allow(dead_code)]
struct Row {
    id: i64,
    name: String,
    email: String,
    score: f64,
    active: i64,
    age: Option<i64>,
    created_at: String,
    note: Option<String>,
}

/// The tuple a hand-written client decodes into (by position).
type Tuple = (
    i64,
    String,
    String,
    f64,
    i64,
    Option<i64>,
    String,
    Option<String>,
);

#[derive(Deserialize)]
struct Envelope {
    rows: Vec<Tuple>,
}

const WIDE: &str = "SELECT id, name, email, score, active, age, created_at, note FROM wide";

fn main() {
    if std::env::var_os(SERVE_ENV).is_some() {
        serve();
        return;
    }
    if let Some(spec) = std::env::var_os(CALLGRIND_ENV) {
        callgrind(spec.to_str().expect("sqlhttp:N or raw:N"));
        return;
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(run());
}

/// The child: `sqlhttpd` in-memory, until stdin closes.
fn serve() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let config = Config {
            listen: "127.0.0.1:0".parse().unwrap(),
            ..Config::default()
        };
        let server = Server::bind(config).await.unwrap();
        println!("listening on http://{}", server.local_addr());
        let handle = server.spawn();
        tokio::task::spawn_blocking(|| {
            let mut line = String::new();
            while std::io::stdin().read_line(&mut line).is_ok_and(|n| n > 0) {}
        })
        .await
        .unwrap();
        handle.shutdown().await;
    });
}

/// The instruction-count driver: a small table, a warm-up, then N point queries from one client.
fn callgrind(spec: &str) {
    let (which, n) = spec.split_once(':').expect("sqlhttp:N or raw:N");
    let n: u64 = n.parse().expect("a count of calls");
    let server = ServerChild::start();
    let url = server.url.clone();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let sdk_client = sdk(&url, http());
    let raw = http().build().unwrap();
    runtime.block_on(async {
        sdk_client
            .execute(
                "CREATE TABLE wide (id INTEGER PRIMARY KEY, name TEXT, email TEXT, score REAL, \
                 active INTEGER, age INTEGER, created_at TEXT, note TEXT)",
            )
            .await
            .unwrap();
        sdk_client
            .execute(
                "INSERT INTO wide WITH RECURSIVE c(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM c \
                 LIMIT 1000) SELECT i, 'user ' || i, 'user' || i || '@example.com', i / 7.0, \
                 i % 3 = 0, CASE WHEN i % 5 = 0 THEN NULL ELSE 18 + i % 60 END, \
                 '2026-11-29T12:00:00Z', CASE WHEN i % 2 = 0 THEN NULL ELSE 'a short note' END \
                 FROM c",
            )
            .await
            .unwrap();
    });
    let sql = format!("{WIDE} WHERE id = ?");
    // Warm-up outside the counted function: connections open, lazy statics set.
    callgrind_sqlhttp_warm(&runtime, &sdk_client, &sql, 20);
    runtime.block_on(async {
        for id in 0..20 {
            raw_rows(&raw, &url, body(&sql, &serde_json::json!([id]))).await;
        }
    });
    match which {
        "sqlhttp" => callgrind_sqlhttp_calls(&runtime, &sdk_client, &sql, n),
        "raw" => callgrind_raw_calls(&runtime, &raw, &url, &sql, n),
        other => panic!("{other}: sqlhttp or raw"),
    }
    println!("{n} {which} point queries made");
}

fn callgrind_sqlhttp_warm(runtime: &tokio::runtime::Runtime, client: &Client, sql: &str, n: u64) {
    sqlhttp_point_queries(runtime, client, sql, n);
}

#[inline(never)]
fn callgrind_sqlhttp_calls(runtime: &tokio::runtime::Runtime, client: &Client, sql: &str, n: u64) {
    sqlhttp_point_queries(runtime, client, sql, n);
}

fn sqlhttp_point_queries(runtime: &tokio::runtime::Runtime, client: &Client, sql: &str, n: u64) {
    runtime.block_on(async {
        for i in 0..n {
            let id = i % 1000;
            let row: Row = client.query(sql).bind(id).fetch_one().await.unwrap();
            assert_eq!(row.id, id as i64);
        }
    });
}

#[inline(never)]
fn callgrind_raw_calls(
    runtime: &tokio::runtime::Runtime,
    http: &reqwest::Client,
    url: &str,
    sql: &str,
    n: u64,
) {
    runtime.block_on(async {
        for i in 0..n {
            let id = i % 1000;
            let rows = raw_rows(http, url, body(sql, &serde_json::json!([id]))).await;
            assert_eq!(rows.len(), 1);
        }
    });
}

struct ServerChild {
    child: Child,
    url: String,
}

impl ServerChild {
    fn start() -> ServerChild {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .env(SERVE_ENV, "1")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let url = line.trim().trim_start_matches("listening on ").to_owned();
        ServerChild { child, url }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for ServerChild {
    fn drop(&mut self) {
        drop(self.child.stdin.take());
        let _ = self.child.wait();
    }
}

fn status_kib(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|line| line.strip_prefix(field))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// Resets a process's peak RSS to its current RSS (Linux `clear_refs`).
fn reset_peak(pid: u32) {
    let _ = std::fs::write(format!("/proc/{pid}/clear_refs"), "5");
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

/// reqwest without compression, retries or redirects: the baseline every client shares.
fn http() -> reqwest::ClientBuilder {
    reqwest::Client::builder()
        .no_gzip()
        .no_zstd()
        .retry(reqwest::retry::never())
        .redirect(reqwest::redirect::Policy::none())
}

fn sdk(url: &str, http: reqwest::ClientBuilder) -> Client {
    Client::builder(url)
        .http_client(http.build().unwrap())
        .build()
        .unwrap()
}

fn middleware(http: reqwest::Client) -> reqwest_middleware::ClientWithMiddleware {
    use reqwest_retry::{RetryTransientMiddleware, policies::ExponentialBackoff};
    let policy = ExponentialBackoff::builder()
        .retry_bounds(Duration::from_millis(1), Duration::from_millis(10))
        .build_with_max_retries(2);
    reqwest_middleware::ClientBuilder::new(http)
        .with(RetryTransientMiddleware::new_with_policy(policy))
        .build()
}

fn body(sql: &str, params: &serde_json::Value) -> String {
    serde_json::json!({ "sql": sql, "params": params }).to_string()
}

async fn raw_rows(http: &reqwest::Client, url: &str, body: String) -> Vec<Tuple> {
    let bytes = http
        .post(format!("{url}/api/v1/sql"))
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .unwrap()
        .error_for_status()
        .unwrap()
        .bytes()
        .await
        .unwrap();
    serde_json::from_slice::<Envelope>(&bytes).unwrap().rows
}

async fn middleware_rows(
    http: &reqwest_middleware::ClientWithMiddleware,
    url: &str,
    body: String,
) -> Vec<Tuple> {
    let bytes = http
        .post(format!("{url}/api/v1/sql"))
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .unwrap()
        .error_for_status()
        .unwrap()
        .bytes()
        .await
        .unwrap();
    serde_json::from_slice::<Envelope>(&bytes).unwrap().rows
}

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort_unstable();
    samples[samples.len() / 2]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn verdict(ok: bool) -> &'static str {
    if ok { "met" } else { "NOT met" }
}

async fn run() {
    let server = ServerChild::start();
    let url = server.url.clone();
    let raw = http().build().unwrap();
    let sdk_client = sdk(&url, http());
    let mw = middleware(http().build().unwrap());

    println!(
        "side by side: sqlhttp vs raw reqwest + serde_json vs reqwest-middleware + reqwest-retry"
    );
    let setup = Instant::now();
    sdk_client
        .execute(
            "CREATE TABLE wide (id INTEGER PRIMARY KEY, name TEXT, email TEXT, score REAL, \
             active INTEGER, age INTEGER, created_at TEXT, note TEXT)",
        )
        .await
        .unwrap();
    sdk_client
        .execute(format!(
            "INSERT INTO wide WITH RECURSIVE c(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM c \
             LIMIT {TABLE_ROWS}) SELECT i * 7919, 'user ' || i, 'user' || i || '@example.com', \
             i / 7.0, i % 3 = 0, CASE WHEN i % 5 = 0 THEN NULL ELSE 18 + i % 60 END, \
             '2026-11-29T12:00:00Z', CASE WHEN i % 2 = 0 THEN NULL ELSE 'a short note' END FROM c"
        ))
        .await
        .unwrap();
    println!(
        "setup: {TABLE_ROWS} rows of 8 columns in {:.1} s\n",
        setup.elapsed().as_secs_f64()
    );

    // 1M rows first, while the client process is still small: its peak RSS is absolute.
    let million = million_rows(&server, &url, &sdk_client, &raw, &mw).await;
    let hundred_k = hundred_k_rows(&url, &sdk_client, &raw, &mw).await;
    println!(
        "  1M/100k time: sqlhttp streamed {:.1}x (target <= 11x: {})\n",
        million / hundred_k,
        verdict(million / hundred_k <= 11.0)
    );
    point_queries(&url, &sdk_client, &raw, &mw).await;
    in_flight(&url, &sdk_client, &raw, &mw).await;
    fetch_one_on_5m(&sdk_client).await;
    outage(&url).await;
    compression(&url).await;
}

/// Returns sqlhttp's time in seconds.
async fn million_rows(
    server: &ServerChild,
    url: &str,
    sdk_client: &Client,
    raw: &reqwest::Client,
    mw: &reqwest_middleware::ClientWithMiddleware,
) -> f64 {
    println!("1M-row fetch (8 columns):");
    let me = std::process::id();
    let server_pid = server.pid();

    reset_peak(me);
    reset_peak(server_pid);
    let server_before = status_kib(server_pid, "VmRSS:");
    let started = Instant::now();
    let mut rows = sdk_client.query(WIDE).fetch::<Row>().await.unwrap();
    let mut count = 0u64;
    while rows.try_next().await.unwrap().is_some() {
        count += 1;
    }
    let sdk_time = started.elapsed();
    assert_eq!(count, TABLE_ROWS);
    let sdk_peak = status_kib(me, "VmHWM:");
    let server_growth = status_kib(server_pid, "VmHWM:").saturating_sub(server_before);
    println!(
        "  sqlhttp fetch (stream)   {:>8.0} ms   client peak RSS {:>6.1} MiB   server grew {:>5.1} MiB",
        ms(sdk_time),
        mib(sdk_peak),
        mib(server_growth)
    );

    reset_peak(me);
    let started = Instant::now();
    let all = raw_rows(raw, url, body(WIDE, &serde_json::json!([]))).await;
    let raw_time = started.elapsed();
    assert_eq!(all.len() as u64, TABLE_ROWS);
    drop(all);
    let raw_peak = status_kib(me, "VmHWM:");
    println!(
        "  raw reqwest (whole body) {:>8.0} ms   client peak RSS {:>6.1} MiB",
        ms(raw_time),
        mib(raw_peak)
    );
    let started = Instant::now();
    let all = middleware_rows(mw, url, body(WIDE, &serde_json::json!([]))).await;
    let mw_time = started.elapsed();
    assert_eq!(all.len() as u64, TABLE_ROWS);
    drop(all);
    println!("  reqwest-middleware       {:>8.0} ms", ms(mw_time));
    println!(
        "  sqlhttp/raw time {:.2}x; targets: client peak <= 32 MiB {}, server growth <= 64 MiB {}",
        sdk_time.as_secs_f64() / raw_time.as_secs_f64(),
        verdict(sdk_peak <= 32 * 1024),
        verdict(server_growth <= 64 * 1024)
    );
    sdk_time.as_secs_f64()
}

/// Returns sqlhttp's best time in seconds.
async fn hundred_k_rows(
    url: &str,
    sdk_client: &Client,
    raw: &reqwest::Client,
    mw: &reqwest_middleware::ClientWithMiddleware,
) -> f64 {
    println!("100k-row typed fetch (best of 5):");
    let sql = format!("{WIDE} LIMIT 100000");
    let (mut sdk_best, mut raw_best, mut mw_best) = (Duration::MAX, Duration::MAX, Duration::MAX);
    for _ in 0..5 {
        let started = Instant::now();
        let rows: Vec<Row> = sdk_client.query(sql.as_str()).fetch_all().await.unwrap();
        sdk_best = sdk_best.min(started.elapsed());
        assert_eq!(rows.len(), 100_000);
        let started = Instant::now();
        let rows = raw_rows(raw, url, body(&sql, &serde_json::json!([]))).await;
        raw_best = raw_best.min(started.elapsed());
        assert_eq!(rows.len(), 100_000);
        let started = Instant::now();
        let rows = middleware_rows(mw, url, body(&sql, &serde_json::json!([]))).await;
        mw_best = mw_best.min(started.elapsed());
        assert_eq!(rows.len(), 100_000);
    }
    println!(
        "  sqlhttp fetch_all {:.0} ms, raw {:.0} ms, middleware {:.0} ms: sqlhttp/raw {:.2}x",
        ms(sdk_best),
        ms(raw_best),
        ms(mw_best),
        sdk_best.as_secs_f64() / raw_best.as_secs_f64()
    );
    sdk_best.as_secs_f64()
}

async fn point_queries(
    url: &str,
    sdk_client: &Client,
    raw: &reqwest::Client,
    mw: &reqwest_middleware::ClientWithMiddleware,
) {
    let sql = format!("{WIDE} WHERE id = ?");
    let (mut sdk_t, mut raw_t, mut mw_t) = (Vec::new(), Vec::new(), Vec::new());
    // Interleaved, so load from elsewhere slows each alike.
    for i in 0..3_000u64 {
        let id = (i * 7_919 % TABLE_ROWS) * 7_919;
        let started = Instant::now();
        let row: Row = sdk_client
            .query(sql.as_str())
            .bind(id)
            .fetch_one()
            .await
            .unwrap();
        sdk_t.push(started.elapsed());
        assert_eq!(row.id, id as i64);
        let started = Instant::now();
        let rows = raw_rows(raw, url, body(&sql, &serde_json::json!([id]))).await;
        raw_t.push(started.elapsed());
        assert_eq!(rows.len(), 1);
        let started = Instant::now();
        let rows = middleware_rows(mw, url, body(&sql, &serde_json::json!([id]))).await;
        mw_t.push(started.elapsed());
        assert_eq!(rows.len(), 1);
    }
    let (sdk_p50, raw_p50, mw_p50) = (median(sdk_t), median(raw_t), median(mw_t));
    let ratio = sdk_p50.as_secs_f64() / raw_p50.as_secs_f64();
    println!("point query p50 (3000 each, interleaved):");
    println!(
        "  sqlhttp {:.0} µs, raw {:.0} µs, middleware {:.0} µs: sqlhttp/raw {:.3}x (target <= 1.05x: {})\n",
        sdk_p50.as_secs_f64() * 1e6,
        raw_p50.as_secs_f64() * 1e6,
        mw_p50.as_secs_f64() * 1e6,
        ratio,
        verdict(ratio <= 1.05)
    );
}

async fn in_flight(
    url: &str,
    sdk_client: &Client,
    raw: &reqwest::Client,
    mw: &reqwest_middleware::ClientWithMiddleware,
) {
    const TASKS: u64 = 64;
    const EACH: u64 = 150;
    let sql = Arc::new(format!("{WIDE} WHERE id = ?"));
    let url = Arc::new(url.to_owned());
    let rate = |elapsed: Duration| (TASKS * EACH) as f64 / elapsed.as_secs_f64();

    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for t in 0..TASKS {
        let (client, sql) = (sdk_client.clone(), Arc::clone(&sql));
        tasks.spawn(async move {
            for i in 0..EACH {
                let id = ((t * EACH + i) * 31 % TABLE_ROWS) * 7_919;
                let _: Row = client
                    .query(sql.as_str())
                    .bind(id)
                    .fetch_one()
                    .await
                    .unwrap();
            }
        });
    }
    tasks.join_all().await;
    let sdk_rate = rate(started.elapsed());

    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for t in 0..TASKS {
        let (client, sql, url) = (raw.clone(), Arc::clone(&sql), Arc::clone(&url));
        tasks.spawn(async move {
            for i in 0..EACH {
                let id = ((t * EACH + i) * 31 % TABLE_ROWS) * 7_919;
                raw_rows(&client, &url, body(&sql, &serde_json::json!([id]))).await;
            }
        });
    }
    tasks.join_all().await;
    let raw_rate = rate(started.elapsed());

    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for t in 0..TASKS {
        let (client, sql, url) = (mw.clone(), Arc::clone(&sql), Arc::clone(&url));
        tasks.spawn(async move {
            for i in 0..EACH {
                let id = ((t * EACH + i) * 31 % TABLE_ROWS) * 7_919;
                middleware_rows(&client, &url, body(&sql, &serde_json::json!([id]))).await;
            }
        });
    }
    tasks.join_all().await;
    let mw_rate = rate(started.elapsed());
    println!("64 in flight ({} point queries each):", TASKS * EACH);
    println!(
        "  sqlhttp {sdk_rate:.0}/s, raw {raw_rate:.0}/s, middleware {mw_rate:.0}/s: sqlhttp/raw {:.2}x\n",
        sdk_rate / raw_rate
    );
}

async fn fetch_one_on_5m(sdk_client: &Client) {
    let five_million = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c LIMIT 5000000) \
                        SELECT x, 'row ' || x FROM c";
    let started = Instant::now();
    let first: (i64, String) = sdk_client.query(five_million).fetch_one().await.unwrap();
    let took = started.elapsed();
    assert_eq!(first.0, 1);
    // Free right after: more endless statements than the server has readers, each stopped by
    // its fetch_one, then a quick query.
    let endless = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT x FROM c";
    for _ in 0..8 {
        let _: i64 = sdk_client.query(endless).fetch_one().await.unwrap();
    }
    let started_free = Instant::now();
    let _: i64 = sdk_client.query("SELECT 1").fetch_one().await.unwrap();
    let free = started_free.elapsed();
    println!("fetch_one on a 5M-row query:");
    println!(
        "  {:.1} ms (target < 1 s: {}); after 8 more on endless queries (4 readers), SELECT 1 took {:.1} ms\n",
        ms(took),
        verdict(took < Duration::from_secs(1)),
        ms(free)
    );
}

async fn outage(url: &str) {
    const CALLS: usize = 200;
    let upstream = url.trim_start_matches("http://").parse().unwrap();
    println!("sustained 503 outage ({CALLS} concurrent reads, Retry-After: 0):");
    for name in ["sqlhttp", "raw", "middleware"] {
        let proxy = ChaosProxy::start(upstream).await.unwrap();
        proxy.push_all(std::iter::repeat_n(Fault::unavailable(0), CALLS * 10));
        let proxied = proxy.url();
        let mut tasks = tokio::task::JoinSet::new();
        let sdk_client = Client::builder(&proxied)
            .http_client(http().build().unwrap())
            .retry(RetryPolicy::new())
            .build()
            .unwrap();
        let raw = http().build().unwrap();
        let mw = middleware(http().build().unwrap());
        for _ in 0..CALLS {
            let (sdk_client, raw, mw, proxied) =
                (sdk_client.clone(), raw.clone(), mw.clone(), proxied.clone());
            tasks.spawn(async move {
                let request = body("SELECT 1", &serde_json::json!([]));
                match name {
                    "sqlhttp" => {
                        let _ = sdk_client.query("SELECT 1").fetch_all::<i64>().await;
                    }
                    "raw" => {
                        let _ = raw
                            .post(format!("{proxied}/api/v1/sql"))
                            .header("content-type", "application/json")
                            .body(request)
                            .send()
                            .await;
                    }
                    _ => {
                        let _ = mw
                            .post(format!("{proxied}/api/v1/sql"))
                            .header("content-type", "application/json")
                            .body(request)
                            .send()
                            .await;
                    }
                }
            });
        }
        tasks.join_all().await;
        println!(
            "  {name:<10} {:.2} attempts per call",
            proxy.requests() as f64 / CALLS as f64
        );
    }
    println!();
}

async fn compression(url: &str) {
    let sql = format!("{WIDE} LIMIT 100000");
    println!("compression, 100k-row typed fetch (best of 3):");
    let mut plain_time = 0.0;
    let mut plain_bytes = 0usize;
    for (name, http, encoding) in [
        ("identity", http(), "identity"),
        ("gzip", http().gzip(true), "gzip"),
        ("zstd", http().zstd(true), "zstd"),
    ] {
        let client = sdk(url, http);
        let mut best = Duration::MAX;
        for _ in 0..3 {
            let started = Instant::now();
            let rows: Vec<Row> = client.query(sql.as_str()).fetch_all().await.unwrap();
            best = best.min(started.elapsed());
            assert_eq!(rows.len(), 100_000);
        }
        // The bytes on the wire: asked for, not decompressed.
        let wire = http_raw_len(url, &sql, encoding).await;
        if name == "identity" {
            plain_time = best.as_secs_f64();
            plain_bytes = wire;
        }
        // A 100 Mbit/s link: the transfer at line rate, plus the loopback time (CPU both ends).
        let slow = best.as_secs_f64() + wire as f64 * 8.0 / 100e6;
        let plain_slow = plain_time + plain_bytes as f64 * 8.0 / 100e6;
        println!(
            "  {name:<8} loopback {:>5.0} ms ({:.2}x)   {:>5.1} MB on the wire   100 Mbit/s link {:>5.0} ms ({:.2}x)",
            ms(best),
            best.as_secs_f64() / plain_time,
            wire as f64 / 1e6,
            slow * 1e3,
            slow / plain_slow
        );
    }
}

async fn http_raw_len(url: &str, sql: &str, encoding: &str) -> usize {
    http()
        .build()
        .unwrap()
        .post(format!("{url}/api/v1/sql"))
        .header("content-type", "application/json")
        .header("accept-encoding", encoding)
        .body(body(sql, &serde_json::json!([])))
        .send()
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap()
        .len()
}
