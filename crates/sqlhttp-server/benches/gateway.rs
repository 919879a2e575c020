//! `sqlhttpd` beside the HTTP gateway a user would write by hand instead, on the same engine, in
//! the same process and the same run: point reads (`SELECT k, v FROM kv WHERE k = ?` over 10 000
//! rows) at 64 in flight over loopback, and the ratio of requests per second.
//!
//! `sqlhttpd` is sent each read two ways, both compared with the same gateway in every round: a
//! *verified read* (`"read_only": true`, what the SDK's `query` sends: the server checks the
//! statement only reads and runs it as a read) and an *unflagged read* (the same body without the
//! flag, what `execute`, a batch step or a raw client sends: the server runs it in a read-write
//! transaction). The gateway is sent the unflagged body; it ignores the flag either way.
//!
//! The hand-written gateways are what fifty lines of axum give: on SQLite, rusqlite with a
//! connection per blocking thread and `prepare_cached`; on PostgreSQL, deadpool-postgres with 16
//! connections and `prepare_cached`; each parses `{"sql", "params"}` and writes
//! `{"columns", "rows"}` with serde_json. They have no sandbox, no limits, no auth, no metrics and
//! no request ids; `sqlhttpd` runs with all of those on (a bearer token included).
//!
//! Each side serves in turn (the gateway, then `sqlhttpd` with each kind of read), three rounds
//! of four seconds after a warm-up, and the best round of each counts; the load generator (bare
//! hyper connections, 64 tasks) runs in the same process for all. The targets: at least 0.8x the
//! gateway on SQLite (issue 22); on PostgreSQL 0.7x for a verified read (issue 22) and 0.5x for
//! an unflagged one (issue 38).
//!
//! Run with `cargo bench -p sqlhttp-server --bench gateway`, and with
//! `SQLHTTPD_BENCH_POSTGRES_URL=$(scripts/start-postgres)` for PostgreSQL too (a superuser's URL
//! on loopback; the bench makes a database of its own and drops it). `SQLHTTPD_GATEWAY_SECONDS`
//! sets a round's length; `SQLHTTPD_GATEWAY_ENGINES=postgres` (or `sqlite`) runs one engine, and
//! `SQLHTTPD_GATEWAY_READS=verified` (or `unflagged`) one kind of read (both by default);
//! `SQLHTTPD_GATEWAY_POOL=N` gives sqlhttpd's PostgreSQL pool N connections (its default
//! otherwise, `Limits::default_pool_size`; the gateway keeps its 16).
//! `SQLHTTPD_GATEWAY_STATEMENTS=N` has every connection of both sides prepare N more distinct
//! statements before the rounds, as an application's statement cache would hold them (the
//! bench's own read is one statement); with `SQLHTTPD_GATEWAY_HELD_THROUGH=batch` sqlhttpd's
//! side prepares them through one-statement batches, into the driver's cache (ADR 0068), where
//! the gateway's still read them.
//! `SQLHTTPD_GATEWAY_BASELINE=protected` has the PostgreSQL gateway run each read as a user who
//! wants a read's main guarantees would write it with the same crates (ADR 0075): in a
//! `READ ONLY, REPEATABLE READ` transaction, rolled back, with statement and lock timeouts set
//! once per connection (its startup options), on a pool that cleans a session before lending it
//! again (deadpool-postgres's `RecyclingMethod::Clean`): four round trips a read. It has no
//! bookmark position, no look for statements a function prepared, no new random seed.
//! Each round also prints the machine's busy CPU time per request on each side (Linux's
//! `/proc/stat`: the load generator, the server and the database together), which holds still
//! where requests per second follow a shared machine's speed.

#[path = "support/chosen.rs"]
mod chosen;
#[path = "support/scratch_database.rs"]
mod scratch_database;

use scratch_database::ScratchDatabase;

use std::cell::RefCell;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use axum::Json;
use axum::extract::State;
use axum::routing::post;
use serde::Deserialize;
use serde_json::{Value, json};
use sqlhttp_server::{Config, Database, Server};

const IN_FLIGHT: usize = 64;
const ROWS: i64 = 10_000;
const ROUNDS: usize = 3;
const TOKEN: &str = "gateway-bench-token";

#[derive(Deserialize)]
struct SqlBody {
    sql: String,
    #[serde(default)]
    params: Vec<Value>,
}

/// How `sqlhttpd` is sent a read: its body with `"read_only": true` or without it.
#[derive(Clone, Copy)]
enum Reads {
    Verified,
    Unflagged,
}

impl Reads {
    /// The kinds `SQLHTTPD_GATEWAY_READS` picks (`verified`, `unflagged`; both when unset).
    fn chosen() -> Vec<Reads> {
        let chosen = chosen::chosen("SQLHTTPD_GATEWAY_READS", &["verified", "unflagged"]);
        [Reads::Verified, Reads::Unflagged]
            .into_iter()
            .filter(|reads| chosen.contains(&reads.key()))
            .collect()
    }

    fn key(self) -> &'static str {
        match self {
            Reads::Verified => "verified",
            Reads::Unflagged => "unflagged",
        }
    }

    fn read_only(self) -> bool {
        matches!(self, Reads::Verified)
    }
}

/// Whether the PostgreSQL gateway runs its reads protected (`SQLHTTPD_GATEWAY_BASELINE=protected`).
fn protected_baseline() -> bool {
    std::env::var("SQLHTTPD_GATEWAY_BASELINE").is_ok_and(|baseline| baseline == "protected")
}

/// What the gateway `engine`'s rounds are compared with is called in the bench's lines.
fn gateway_name(engine: &str) -> &'static str {
    if engine == "PostgreSQL" && protected_baseline() {
        "protected gateway"
    } else {
        "hand-written gateway"
    }
}

fn round_length() -> Duration {
    let seconds = std::env::var("SQLHTTPD_GATEWAY_SECONDS")
        .ok()
        .and_then(|s| s.parse::<f64>().ok())
        .filter(|s| *s > 0.0)
        .unwrap_or(4.0);
    Duration::from_secs_f64(seconds)
}

/// A request body of one piece, for the bare hyper client.
struct Whole(Option<bytes::Bytes>);

impl hyper::body::Body for Whole {
    type Data = bytes::Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<bytes::Bytes>, Self::Error>>> {
        std::task::Poll::Ready(self.0.take().map(|data| Ok(hyper::body::Frame::data(data))))
    }
}

/// Reads a response body whole.
async fn read_body(mut body: hyper::body::Incoming) -> Vec<u8> {
    use hyper::body::Body as _;
    let mut out = Vec::new();
    while let Some(frame) =
        std::future::poll_fn(|cx| std::pin::Pin::new(&mut body).poll_frame(cx)).await
    {
        if let Ok(data) = frame.expect("a body frame").into_data() {
            out.extend_from_slice(&data);
        }
    }
    out
}

/// The machine's busy CPU time so far (every core's user, system and interrupt time, not idle
/// or stolen time), from `/proc/stat`; `None` where there is none.
fn busy_cpu() -> Option<Duration> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let ticks: Vec<u64> = stat
        .lines()
        .next()?
        .split_whitespace()
        .skip(1)
        .map(|field| field.parse().ok())
        .collect::<Option<_>>()?;
    // user, nice, system, irq, softirq; at the kernel's usual 100 ticks a second.
    let busy = ticks.first()? + ticks.get(1)? + ticks.get(2)? + ticks.get(5)? + ticks.get(6)?;
    Some(Duration::from_millis(busy * 10))
}

/// What one side served in a round: requests per second, and the machine's busy CPU time per
/// request (load generator, server and database together) when it can be read. The second
/// holds still on a machine whose speed varies from minute to minute, as a shared one's does.
struct Served {
    per_second: f64,
    cpu_per_request: Option<Duration>,
}

/// [`load`], with the machine's CPU time it took.
async fn measured(
    addr: SocketAddr,
    sql: &str,
    token: Option<&str>,
    read_only: bool,
    length: Duration,
) -> Served {
    let before = busy_cpu();
    let started = Instant::now();
    let per_second = load(addr, sql, token, read_only, length).await;
    let requests = per_second * started.elapsed().as_secs_f64();
    let cpu_per_request = before
        .zip(busy_cpu())
        .filter(|_| requests >= 1.0)
        .map(|(before, after)| after.saturating_sub(before).div_f64(requests));
    Served {
        per_second,
        cpu_per_request,
    }
}

/// A [`Served`]'s CPU time per request, in microseconds, for the report.
fn micros(served: &Served) -> String {
    served.cpu_per_request.map_or_else(
        || "?".to_owned(),
        |cpu| format!("{:.0}", cpu.as_secs_f64() * 1e6),
    )
}

/// Requests per second of `addr` under [`IN_FLIGHT`] concurrent point reads for `length`, each
/// on a keep-alive connection of its own, with `sql` (its placeholder as the server wants it),
/// its body flagged `"read_only": true` when `read_only`; every answer is checked.
async fn load(
    addr: SocketAddr,
    sql: &str,
    token: Option<&str>,
    read_only: bool,
    length: Duration,
) -> f64 {
    let done = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let deadline = started + length;
    let mut tasks = Vec::new();
    for task in 0..IN_FLIGHT {
        let done = Arc::clone(&done);
        let sql = sql.to_owned();
        let authorization = token.map(|token| format!("Bearer {token}"));
        tasks.push(tokio::spawn(async move {
            let mut sender = connect(addr).await;
            let mut k = task as i64;
            while Instant::now() < deadline {
                k = (k * 7_919 + 13) % ROWS;
                read(&mut sender, &sql, authorization.as_deref(), read_only, k).await;
                done.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    done.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64()
}

/// How many distinct statements each side's connections hold before the rounds
/// (`SQLHTTPD_GATEWAY_STATEMENTS`, 0 by default): an application's statement cache, not the
/// bench's one statement.
fn statements_held() -> usize {
    std::env::var("SQLHTTPD_GATEWAY_STATEMENTS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

/// Whether sqlhttpd's side prepares its held statements through batches
/// (`SQLHTTPD_GATEWAY_HELD_THROUGH=batch`): into the driver's cache, not the flights'.
fn held_through_batches() -> bool {
    std::env::var("SQLHTTPD_GATEWAY_HELD_THROUGH").is_ok_and(|through| through == "batch")
}

/// The `i`th of the statements [`statements_held`] asks for: the point read, with a condition
/// that keeps every row and makes the text its own.
fn held_statement(sql: &str, i: usize) -> String {
    format!("{sql} AND k >= -{i}")
}

/// Sends each of `count` distinct statements ([`held_statement`]) from [`IN_FLIGHT`]
/// connections at once, so that every pooled connection of the server behind `addr` has
/// almost surely prepared each one.
async fn hold_statements(addr: SocketAddr, sql: &str, token: Option<&str>, count: usize) {
    let mut tasks = Vec::new();
    for task in 0..IN_FLIGHT {
        let sql = sql.to_owned();
        let authorization = token.map(|token| format!("Bearer {token}"));
        tasks.push(tokio::spawn(async move {
            let mut sender = connect(addr).await;
            for i in 0..count {
                let held = held_statement(&sql, (i + task) % count);
                let k = (task as i64) % ROWS;
                if authorization.is_some() && held_through_batches() {
                    batch(&mut sender, &held, authorization.as_deref(), k).await;
                } else {
                    read(&mut sender, &held, authorization.as_deref(), true, k).await;
                }
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
}

/// A keep-alive HTTP/1 connection to `addr`.
async fn connect(addr: SocketAddr) -> hyper::client::conn::http1::SendRequest<Whole> {
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream.set_nodelay(true).unwrap();
    let (sender, connection) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .unwrap();
    tokio::spawn(connection);
    sender
}

/// Reads row `k` with `sql` as a batch of one statement (`/api/v1/batch`) over `sender`, with
/// the `Authorization` header's value when given, and checks the answer.
async fn batch(
    sender: &mut hyper::client::conn::http1::SendRequest<Whole>,
    sql: &str,
    authorization: Option<&str>,
    k: i64,
) {
    let body = json!({"statements": [{"sql": sql, "params": [k]}]});
    post_for_row(sender, "/api/v1/batch", &body, authorization, k).await;
}

/// Reads row `k` with `sql` over `sender`, with the `Authorization` header's value when
/// given, and checks the answer.
async fn read(
    sender: &mut hyper::client::conn::http1::SendRequest<Whole>,
    sql: &str,
    authorization: Option<&str>,
    read_only: bool,
    k: i64,
) {
    // Flagged, what the SDK's `query` sends (a read the server verifies); unflagged, what
    // `execute` sends (run in a read-write transaction).
    let mut body = json!({"sql": sql, "params": [k]});
    if read_only {
        body["read_only"] = Value::Bool(true);
    }
    post_for_row(sender, "/api/v1/sql", &body, authorization, k).await;
}

/// POSTs `body` to `path` over `sender`, with the `Authorization` header's value when given,
/// and checks that the answer is a 200 holding row `k`.
async fn post_for_row(
    sender: &mut hyper::client::conn::http1::SendRequest<Whole>,
    path: &str,
    body: &Value,
    authorization: Option<&str>,
    k: i64,
) {
    let mut request = http::Request::post(path)
        .header("host", "127.0.0.1")
        .header("content-type", "application/json");
    if let Some(authorization) = authorization {
        request = request.header("authorization", authorization);
    }
    let request = request.body(Whole(Some(body.to_string().into()))).unwrap();
    let response = sender
        .send_request(request)
        .await
        .expect("the server answers");
    assert_eq!(response.status(), 200);
    let text = String::from_utf8(read_body(response.into_body()).await).unwrap();
    assert!(text.contains(&format!("[{k},\"v{k}\"]")), "{text}");
}

/// Warms up, then runs [`ROUNDS`] rounds: in each, the gateway, then `sqlhttpd` with each kind
/// of read [`Reads::chosen`]; each kind's ratio is to the same round's gateway. The best round
/// of each side counts.
async fn compare(engine: &str, ours: (SocketAddr, &str), theirs: (SocketAddr, &str)) {
    let length = round_length();
    let kinds = Reads::chosen();
    let warm_up = Duration::from_secs(1);
    let held = statements_held();
    if held > 0 {
        hold_statements(theirs.0, theirs.1, None, held).await;
        hold_statements(ours.0, ours.1, Some(TOKEN), held).await;
        let through = if held_through_batches() {
            " (sqlhttpd's through batches)"
        } else {
            ""
        };
        println!("  each side's connections hold {held} more statements{through}");
    }
    load(theirs.0, theirs.1, None, false, warm_up).await;
    for reads in &kinds {
        load(ours.0, ours.1, Some(TOKEN), reads.read_only(), warm_up).await;
    }
    let name = gateway_name(engine);
    let mut best_theirs = 0.0_f64;
    let mut best_ours = vec![0.0_f64; kinds.len()];
    for round in 1..=ROUNDS {
        let gateway = measured(theirs.0, theirs.1, None, false, length).await;
        best_theirs = best_theirs.max(gateway.per_second);
        for (reads, best) in kinds.iter().zip(&mut best_ours) {
            let sqlhttpd = measured(ours.0, ours.1, Some(TOKEN), reads.read_only(), length).await;
            println!(
                "  {engine} round {round}, {} read: {name} {:>8.0} req/s \
                 ({} us CPU/req), sqlhttpd {:>8.0} req/s ({} us CPU/req): {:.2}x",
                reads.key(),
                gateway.per_second,
                micros(&gateway),
                sqlhttpd.per_second,
                micros(&sqlhttpd),
                sqlhttpd.per_second / gateway.per_second
            );
            *best = best.max(sqlhttpd.per_second);
        }
    }
    for (reads, best_ours) in kinds.iter().zip(best_ours) {
        println!(
            "{engine}, {} read: sqlhttpd {best_ours:.0} req/s, {name} \
             {best_theirs:.0} req/s: {:.2}x (best rounds, {IN_FLIGHT} in flight)",
            reads.key(),
            best_ours / best_theirs
        );
    }
}

async fn serve(router: axum::Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    addr
}

// ---- SQLite ---------------------------------------------------------------------------------

thread_local! {
    static SQLITE: RefCell<Option<rusqlite::Connection>> = const { RefCell::new(None) };
}

fn sqlite_rows(path: &str, body: &SqlBody) -> Result<Value, String> {
    SQLITE.with(|cell| {
        let mut cell = cell.borrow_mut();
        if cell.is_none() {
            let connection = rusqlite::Connection::open(path).map_err(|e| e.to_string())?;
            *cell = Some(connection);
        }
        let connection = cell.as_ref().unwrap();
        let mut statement = connection
            .prepare_cached(&body.sql)
            .map_err(|e| e.to_string())?;
        let columns: Vec<String> = statement.column_names().map(str::to_owned).collect();
        let params: Vec<rusqlite::types::Value> = body
            .params
            .iter()
            .map(|p| match p {
                Value::Number(n) if n.is_i64() => {
                    rusqlite::types::Value::Integer(n.as_i64().unwrap())
                }
                Value::Number(n) => rusqlite::types::Value::Real(n.as_f64().unwrap_or_default()),
                Value::String(s) => rusqlite::types::Value::Text(s.clone()),
                _ => rusqlite::types::Value::Null,
            })
            .collect();
        let mut rows = statement
            .query(rusqlite::params_from_iter(params))
            .map_err(|e| e.to_string())?;
        let mut out = Vec::new();
        while let Some(row) = rows.next().map_err(|e| e.to_string())? {
            let mut cells = Vec::with_capacity(columns.len());
            for index in 0..columns.len() {
                cells.push(match row.get_ref(index).map_err(|e| e.to_string())? {
                    rusqlite::types::ValueRef::Integer(i) => json!(i),
                    rusqlite::types::ValueRef::Real(r) => json!(r),
                    rusqlite::types::ValueRef::Text(t) => json!(String::from_utf8_lossy(t)),
                    rusqlite::types::ValueRef::Null | rusqlite::types::ValueRef::Blob(_) => {
                        Value::Null
                    }
                });
            }
            out.push(Value::Array(cells));
        }
        Ok(json!({"columns": columns, "rows": out}))
    })
}

async fn sqlite_gateway(path: Arc<str>) -> SocketAddr {
    async fn handle(State(path): State<Arc<str>>, Json(body): Json<SqlBody>) -> Json<Value> {
        let answer = tokio::task::spawn_blocking(move || sqlite_rows(&path, &body))
            .await
            .unwrap();
        Json(answer.unwrap_or_else(|error| json!({"error": error})))
    }
    serve(
        axum::Router::new()
            .route("/api/v1/sql", post(handle))
            .with_state(path),
    )
    .await
}

async fn sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gateway.db");
    {
        let connection = rusqlite::Connection::open(&path).unwrap();
        connection
            .execute_batch(
                "PRAGMA journal_mode = WAL; \
                 CREATE TABLE kv (k INTEGER PRIMARY KEY, v TEXT NOT NULL);",
            )
            .unwrap();
        let mut insert = connection
            .prepare("INSERT INTO kv VALUES (?, 'v' || ?)")
            .unwrap();
        for k in 0..ROWS {
            insert.execute((k, k)).unwrap();
        }
    }
    let server = Server::bind(Config {
        listen: "127.0.0.1:0".parse().unwrap(),
        database: Database::File(path.clone()),
        tokens: vec![TOKEN.to_owned()],
        ..Config::default()
    })
    .await
    .unwrap()
    .spawn();
    let gateway = sqlite_gateway(Arc::from(path.to_str().unwrap())).await;
    let sql = "SELECT k, v FROM kv WHERE k = ?";
    compare("SQLite", (server.local_addr(), sql), (gateway, sql)).await;
    server.shutdown().await;
}

// ---- PostgreSQL -----------------------------------------------------------------------------

/// The PostgreSQL gateway's parameters: the body's integers (the bench's read takes one).
fn pg_params(body: &SqlBody) -> Vec<i64> {
    body.params.iter().filter_map(Value::as_i64).collect()
}

/// `params` as tokio-postgres binds them.
fn pg_refs(params: &[i64]) -> Vec<&(dyn tokio_postgres::types::ToSql + Sync)> {
    params
        .iter()
        .map(|p| p as &(dyn tokio_postgres::types::ToSql + Sync))
        .collect()
}

/// The PostgreSQL gateway's answer: `{"columns", "rows"}` of the bench's `(k, v)` rows.
fn pg_answer(statement: &tokio_postgres::Statement, rows: &[tokio_postgres::Row]) -> Value {
    let columns: Vec<&str> = statement.columns().iter().map(|c| c.name()).collect();
    let rows: Vec<Value> = rows
        .iter()
        .map(|row| json!([row.get::<_, i64>(0), row.get::<_, String>(1)]))
        .collect();
    json!({"columns": columns, "rows": rows})
}

async fn postgres_gateway(url: &str) -> SocketAddr {
    let mut config: tokio_postgres::Config = url.parse().unwrap();
    let protected = protected_baseline();
    if protected {
        config.options("-c statement_timeout=5000 -c lock_timeout=1000");
    }
    let recycling_method = if protected {
        deadpool_postgres::RecyclingMethod::Clean
    } else {
        deadpool_postgres::RecyclingMethod::Fast
    };
    let manager = deadpool_postgres::Manager::from_config(
        config,
        tokio_postgres::NoTls,
        deadpool_postgres::ManagerConfig { recycling_method },
    );
    let pool = deadpool_postgres::Pool::builder(manager)
        .max_size(16)
        .build()
        .unwrap();
    async fn handle(
        State(pool): State<deadpool_postgres::Pool>,
        Json(body): Json<SqlBody>,
    ) -> Json<Value> {
        let answer = async {
            let client = pool.get().await.map_err(|e| e.to_string())?;
            let statement = client
                .prepare_cached(&body.sql)
                .await
                .map_err(|e| e.to_string())?;
            let params = pg_params(&body);
            let refs = pg_refs(&params);
            let rows = client
                .query(&statement, &refs)
                .await
                .map_err(|e| e.to_string())?;
            Ok::<Value, String>(pg_answer(&statement, &rows))
        }
        .await;
        Json(answer.unwrap_or_else(|error| json!({"error": error})))
    }
    /// The read protected: read-only, its own snapshot, rolled back (bounded in time by the
    /// connection's options; the pool cleans the session before lending it again).
    async fn handle_protected(
        State(pool): State<deadpool_postgres::Pool>,
        Json(body): Json<SqlBody>,
    ) -> Json<Value> {
        let answer = async {
            let mut client = pool.get().await.map_err(|e| e.to_string())?;
            let transaction = client
                .build_transaction()
                .read_only(true)
                .isolation_level(tokio_postgres::IsolationLevel::RepeatableRead)
                .start()
                .await
                .map_err(|e| e.to_string())?;
            let statement = transaction
                .prepare_cached(&body.sql)
                .await
                .map_err(|e| e.to_string())?;
            let params = pg_params(&body);
            let refs = pg_refs(&params);
            let rows = transaction
                .query(&statement, &refs)
                .await
                .map_err(|e| e.to_string())?;
            transaction.rollback().await.map_err(|e| e.to_string())?;
            Ok::<Value, String>(pg_answer(&statement, &rows))
        }
        .await;
        Json(answer.unwrap_or_else(|error| json!({"error": error})))
    }
    let route = if protected {
        post(handle_protected)
    } else {
        post(handle)
    };
    serve(
        axum::Router::new()
            .route("/api/v1/sql", route)
            .with_state(pool),
    )
    .await
}

async fn postgres(url: &str) {
    let scratch = ScratchDatabase::create(url, "gateway").await;
    let Database::Postgres(server_url) = scratch.url.parse().unwrap() else {
        unreachable!()
    };
    let mut config = Config {
        listen: "127.0.0.1:0".parse().unwrap(),
        database: Database::Postgres(server_url.with_client_role(&scratch.role).unwrap()),
        tokens: vec![TOKEN.to_owned()],
        ..Config::default()
    };
    if let Some(size) = std::env::var("SQLHTTPD_GATEWAY_POOL")
        .ok()
        .and_then(|s| s.parse().ok())
    {
        config.limits.pool_size = size;
    }
    let server = Server::bind(config).await.unwrap().spawn();
    // The table is the client role's, made through sqlhttpd as a user would; the gateway reads
    // it as the cluster's superuser.
    let http = reqwest::Client::new();
    for sql in [
        "CREATE TABLE kv (k BIGINT PRIMARY KEY, v TEXT NOT NULL)".to_owned(),
        format!(
            "INSERT INTO kv SELECT g, 'v' || g FROM generate_series(0, {}) AS g",
            ROWS - 1
        ),
    ] {
        let response = http
            .post(format!("{}/api/v1/sql", server.url()))
            .bearer_auth(TOKEN)
            .header("content-type", "application/json")
            .body(json!({"sql": sql}).to_string())
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200, "{}", response.text().await.unwrap());
    }
    let gateway = postgres_gateway(&scratch.url).await;
    compare(
        "PostgreSQL",
        (server.local_addr(), "SELECT k, v FROM kv WHERE k = ?"),
        (gateway, "SELECT k, v FROM kv WHERE k = $1"),
    )
    .await;
    server.shutdown().await;
    scratch.drop().await;
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let kinds: Vec<&str> = Reads::chosen().into_iter().map(Reads::key).collect();
        println!(
            "point reads ({}), {IN_FLIGHT} in flight, best of {ROUNDS} rounds of {:?}",
            kinds.join(" and "),
            round_length()
        );
        // `SQLHTTPD_GATEWAY_ENGINES=postgres` compares PostgreSQL alone.
        let engines = chosen::chosen("SQLHTTPD_GATEWAY_ENGINES", &["sqlite", "postgres"]);
        if engines.contains(&"sqlite") {
            sqlite().await;
        }
        if !engines.contains(&"postgres") {
            return;
        }
        match std::env::var("SQLHTTPD_BENCH_POSTGRES_URL") {
            Ok(url) => postgres(&url).await,
            Err(_) => println!("PostgreSQL: set SQLHTTPD_BENCH_POSTGRES_URL to compare it too"),
        }
    });
}
