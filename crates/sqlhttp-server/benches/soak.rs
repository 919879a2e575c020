//! A soak: one long-lived `sqlhttpd` (a child process, so only its memory is measured) serves
//! 1.2 million requests through loopback, 64 in flight, and after every 100 000 of them the
//! bench prints the server's resident memory (`VmRSS`), open file descriptors and threads, and
//! the answers so far by status. What it sends, interleaved:
//!
//! - 1 000 000 point reads, `SELECT k, v FROM kv WHERE k = ?` over 10 000 rows, every other one
//!   a verified read (`"read_only": true`, as the SDK's `query` sends it: on PostgreSQL, one
//!   flight on the primary, ADR 0061);
//! - 100 000 keyed writes, each with an `Idempotency-Key` of its own, and 10 000 of them sent a
//!   second time, which must be replayed (`Idempotent-Replayed: true`);
//! - 100 000 requests that must fail: bad SQL or a wrong parameter count (400), a statement the
//!   sandbox refuses (`ATTACH` on SQLite, `SET` on PostgreSQL) and a write with a read-only
//!   token (403), a body over the limit (413; the server runs with `--max-body-bytes 65536` so
//!   that these stay cheap), no token or a wrong one (401);
//! - 10 000 streamed results of 5.5 MB, abandoned after four chunks, every other period's
//!   verified;
//! - a `/readyz` probe every 1 000 requests, and a schema change every 50 000 (a column added,
//!   an index created or dropped, a side table created, filled and dropped) while reads go on.
//!
//! Any status other than the one a request must get (a 500, a 503, a transport error, a replay
//! that was not replayed, ...) is counted as unexpected and shown. At the end it prints the
//! memory growth per million requests after the first 100 000, against the target of at most
//! 1 MiB per million. With `SQLHTTPD_BENCH_POSTGRES_URL` (a superuser's URL on loopback) the
//! same soak runs again on PostgreSQL, a quarter as long (the engine answers a fifth as fast on
//! this kind of machine). `SQLHTTPD_SOAK_SCALE` (a factor, default 1) shrinks or stretches
//! both; every section also stops at a time cap (480 s, or `SQLHTTPD_SOAK_CAP_SECONDS`).
//! `SQLHTTPD_SOAK_ENGINES=postgres` (or `sqlite`) runs one engine's section: a million
//! requests on PostgreSQL alone is `SQLHTTPD_SOAK_ENGINES=postgres SQLHTTPD_SOAK_SCALE=4
//! SQLHTTPD_SOAK_CAP_SECONDS=900` with its URL.
//!
//! Run with `cargo bench -p sqlhttp-server --bench soak`, or
//! `SQLHTTPD_BENCH_POSTGRES_URL=$(scripts/start-postgres) cargo bench -p sqlhttp-server --bench soak`.

#[path = "support/chosen.rs"]
mod chosen;
#[path = "support/scratch_database.rs"]
mod scratch_database;

use scratch_database::ScratchDatabase;

use std::collections::BTreeMap;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde_json::json;
use sqlhttp_testkit::ServerProcess;

const IN_FLIGHT: usize = 64;
/// Requests between two printed lines (counted in slots, see [`Op::of`]).
const PHASE: u64 = 100_000;
/// One period of the interleaving: 100 reads, 10 writes (one of them sent twice), 10 failures
/// and one abandoned stream.
const PERIOD: u64 = 121;
/// Periods of a full-length soak: 1 210 000 slots, 1 220 000 requests with the replays.
const PERIODS: u64 = 10_000;
/// A `/readyz` probe rides along every this many slots.
const PROBE_EVERY: u64 = 1_000;
/// A schema change rides along every this many slots (of a full-length soak).
const SCHEMA_EVERY: u64 = 50_000;
/// Rows of the point-read table.
const KV_ROWS: u64 = 10_000;
/// Rows of the table whose whole result is streamed and abandoned (about 110 bytes a row).
const BIG_ROWS: u64 = 50_000;
/// Chunks of a streamed body read before it is dropped.
const STREAM_CHUNKS: usize = 4;
/// The server's body limit for this soak, and the size of the body sent over it.
const BODY_LIMIT: usize = 65_536;
const OVERSIZED: usize = 70_000;
/// A section stops issuing requests past this, whatever its count, unless
/// `SQLHTTPD_SOAK_CAP_SECONDS` says otherwise (see [`time_cap`]).
const TIME_CAP: Duration = Duration::from_secs(480);

/// The time cap of a section: `SQLHTTPD_SOAK_CAP_SECONDS`, or [`TIME_CAP`].
fn time_cap() -> Duration {
    std::env::var("SQLHTTPD_SOAK_CAP_SECONDS")
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
        .filter(|s| *s > 0)
        .map_or(TIME_CAP, Duration::from_secs)
}
/// The target: resident memory growth per million requests after the first 100 000.
const TARGET_MIB_PER_MILLION: f64 = 1.0;

const TOKEN: &str = "soak-full-token";
const READ_TOKEN: &str = "soak-read-token";

/// Which engine a section runs on; the few statements that differ between them.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Engine {
    Sqlite,
    Postgres,
}

impl Engine {
    fn name(self) -> &'static str {
        match self {
            Engine::Sqlite => "SQLite",
            Engine::Postgres => "PostgreSQL",
        }
    }

    /// A statement the sandbox refuses with `403 STATEMENT_NOT_ALLOWED`.
    fn refused(self) -> &'static str {
        match self {
            Engine::Sqlite => "ATTACH DATABASE ':memory:' AS soak_other",
            Engine::Postgres => "SET search_path TO public",
        }
    }
}

/// The requests meant to fail, and what each must get.
#[derive(Clone, Copy)]
enum Failure {
    BadSql,
    WrongParams,
    Sandbox,
    ReadOnly,
    TooLarge,
    NoToken,
    WrongToken,
}

impl Failure {
    /// Ten per period: 30 % bad SQL, 20 % sandbox, 20 % read-only, 10 % too large, 20 % 401.
    const PER_PERIOD: [Failure; 10] = [
        Failure::BadSql,
        Failure::Sandbox,
        Failure::NoToken,
        Failure::ReadOnly,
        Failure::WrongParams,
        Failure::TooLarge,
        Failure::Sandbox,
        Failure::WrongToken,
        Failure::ReadOnly,
        Failure::BadSql,
    ];

    fn label(self) -> &'static str {
        match self {
            Failure::BadSql => "bad SQL",
            Failure::WrongParams => "wrong parameter count",
            Failure::Sandbox => "sandbox",
            Failure::ReadOnly => "read-only write",
            Failure::TooLarge => "body too large",
            Failure::NoToken => "no token",
            Failure::WrongToken => "wrong token",
        }
    }

    /// The status and error code it must be answered with.
    fn expected(self) -> (u16, &'static str) {
        match self {
            Failure::BadSql | Failure::WrongParams => (400, "SQL_ERROR"),
            Failure::Sandbox => (403, "STATEMENT_NOT_ALLOWED"),
            Failure::ReadOnly => (403, "READ_ONLY"),
            Failure::TooLarge => (413, "PAYLOAD_TOO_LARGE"),
            Failure::NoToken | Failure::WrongToken => (401, "UNAUTHORIZED"),
        }
    }
}

/// What one slot of the soak sends.
#[derive(Clone, Copy)]
enum Op {
    Read(u64),
    /// A keyed write of row `id`; `again` sends it a second time once answered.
    Write {
        id: u64,
        again: bool,
    },
    Fail(Failure),
    /// The big result, abandoned; sent as a verified read when `verified`.
    Stream {
        verified: bool,
    },
}

impl Op {
    fn label(self) -> String {
        match self {
            Op::Read(_) => "point read".to_owned(),
            Op::Write { again: false, .. } => "keyed write".to_owned(),
            Op::Write { again: true, .. } => "keyed write sent twice".to_owned(),
            Op::Fail(failure) => failure.label().to_owned(),
            Op::Stream { .. } => "abandoned stream".to_owned(),
        }
    }

    /// Slot `slot`'s operation: a fixed permutation of one period (37 is prime to 121), so the
    /// kinds interleave evenly.
    fn of(slot: u64) -> Op {
        let period = slot / PERIOD;
        let kind = (slot % PERIOD) * 37 % PERIOD;
        match kind {
            0..100 => Op::Read(slot.wrapping_mul(7_919) % KV_ROWS),
            100..110 => Op::Write {
                id: period * 10 + (kind - 100),
                again: kind == 100,
            },
            110..120 => Op::Fail(Failure::PER_PERIOD[(kind - 110) as usize]),
            _ => Op::Stream {
                verified: period % 2 == 1,
            },
        }
    }
}

/// One answer: its status, whether it was a replay, its body.
struct Answer {
    status: u16,
    replayed: bool,
    body: bytes::Bytes,
}

impl Answer {
    /// Sends `request` and reads the whole answer; `None` on a transport error.
    async fn of(request: reqwest::RequestBuilder) -> Option<Answer> {
        let response = request.send().await.ok()?;
        let status = response.status().as_u16();
        let replayed = response
            .headers()
            .get("idempotent-replayed")
            .is_some_and(|v| v == "true");
        let body = response.bytes().await.ok()?;
        Some(Answer {
            status,
            replayed,
            body,
        })
    }

    fn says(&self, needle: &str) -> bool {
        self.body
            .windows(needle.len())
            .any(|window| window == needle.as_bytes())
    }
}

/// Answers counted by status, and those that were not what the request must get.
struct Tally {
    /// When the soak started.
    started: Instant,
    /// Slots run (a slot is one request, two for a write sent again, more with a ride-along).
    slots: u64,
    requests: u64,
    by_status: BTreeMap<u16, u64>,
    /// `"what was sent -> what came back"` to how often, when first (seconds into the soak)
    /// and the first such body.
    unexpected: BTreeMap<String, (u64, f64, String)>,
    replayed: u64,
    /// The slowest request: seconds, and what it was.
    slowest: (f64, String),
}

impl Tally {
    fn new(started: Instant) -> Tally {
        Tally {
            started,
            slots: 0,
            requests: 0,
            by_status: BTreeMap::new(),
            unexpected: BTreeMap::new(),
            replayed: 0,
            slowest: (0.0, String::new()),
        }
    }

    fn merge(&mut self, other: Tally) {
        self.slots += other.slots;
        self.requests += other.requests;
        for (status, n) in other.by_status {
            *self.by_status.entry(status).or_default() += n;
        }
        for (what, (n, at, body)) in other.unexpected {
            let entry = self.unexpected.entry(what).or_insert((0, at, body.clone()));
            entry.0 += n;
            if at < entry.1 {
                (entry.1, entry.2) = (at, body);
            }
        }
        self.replayed += other.replayed;
        if other.slowest.0 > self.slowest.0 {
            self.slowest = other.slowest;
        }
    }

    /// Counts one answer (`None`: a transport error) to a request that must get `expected`.
    fn count(&mut self, what: &str, answer: Option<&Answer>, expected: u16) {
        self.requests += 1;
        match answer {
            Some(answer) => {
                *self.by_status.entry(answer.status).or_default() += 1;
                if answer.status != expected {
                    self.odd(format!("{what} -> {}", answer.status), Some(answer));
                }
            }
            None => self.odd(format!("{what} -> transport error"), None),
        }
    }

    fn odd(&mut self, what: String, answer: Option<&Answer>) {
        let body = answer.map_or_else(String::new, |answer| {
            String::from_utf8_lossy(&answer.body[..answer.body.len().min(300)]).into_owned()
        });
        let at = self.started.elapsed().as_secs_f64();
        self.unexpected.entry(what).or_insert((0, at, body)).0 += 1;
    }

    /// Notes how long something that began at `began` took, if it is the slowest yet.
    fn timed(&mut self, began: Instant, what: impl FnOnce() -> String) {
        let took = began.elapsed().as_secs_f64();
        if took > self.slowest.0 {
            let at = self.started.elapsed().as_secs_f64();
            self.slowest = (took, format!("{}, ended {at:.1} s in", what()));
        }
    }

    fn unexpected_total(&self) -> u64 {
        self.unexpected.values().map(|(n, _, _)| n).sum()
    }

    fn status(&self, status: u16) -> u64 {
        self.by_status.get(&status).copied().unwrap_or(0)
    }
}

/// The server process's figures from `/proc`.
#[derive(Clone, Copy)]
struct Sample {
    rss_kib: u64,
    fds: usize,
    threads: usize,
}

impl Sample {
    fn of(pid: u32) -> Sample {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        let rss_kib = status
            .lines()
            .find_map(|line| line.strip_prefix("VmRSS:"))
            .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or(0);
        let count = |dir: &str| {
            std::fs::read_dir(format!("/proc/{pid}/{dir}")).map_or(0, |entries| entries.count())
        };
        Sample {
            rss_kib,
            fds: count("fd"),
            threads: count("task"),
        }
    }

    fn rss_mib(self) -> f64 {
        self.rss_kib as f64 / 1024.0
    }
}

/// What the workers share: the server, the client, the plan.
struct Soak {
    engine: Engine,
    url: String,
    http: reqwest::Client,
    /// Slots handed out so far.
    next: AtomicU64,
    slots: u64,
    schema_every: u64,
    started: Instant,
    deadline: Instant,
    oversized: bytes::Bytes,
}

impl Soak {
    fn post(&self, token: Option<&str>, body: impl Into<reqwest::Body>) -> reqwest::RequestBuilder {
        let request = self
            .http
            .post(format!("{}/api/v1/sql", self.url))
            .header("content-type", "application/json")
            .body(body);
        match token {
            Some(token) => request.bearer_auth(token),
            None => request,
        }
    }

    /// Sends `sql` with the full token.
    async fn sql(&self, sql: &str, params: serde_json::Value) -> Option<Answer> {
        self.sql_as(sql, params, false).await
    }

    /// Sends `sql` with the full token, as a verified read when `read_only`.
    async fn sql_as(
        &self,
        sql: &str,
        params: serde_json::Value,
        read_only: bool,
    ) -> Option<Answer> {
        let body = json!({ "sql": sql, "params": params, "read_only": read_only }).to_string();
        Answer::of(self.post(Some(TOKEN), body)).await
    }

    /// Runs slots until the plan or the phase is done, or the time is up.
    async fn work(&self, phase_end: u64) -> Tally {
        let mut tally = Tally::new(self.started);
        loop {
            let slot = self.next.fetch_add(1, Ordering::Relaxed);
            if slot >= phase_end.min(self.slots) || Instant::now() >= self.deadline {
                return tally;
            }
            tally.slots += 1;
            let op = Op::of(slot);
            let began = Instant::now();
            self.run(op, &mut tally).await;
            tally.timed(began, || op.label());
            if slot % PROBE_EVERY == PROBE_EVERY / 2 {
                let began = Instant::now();
                self.probe(&mut tally).await;
                tally.timed(began, || "/readyz".to_owned());
            }
            if slot % self.schema_every == self.schema_every / 2 {
                let n = slot / self.schema_every;
                let began = Instant::now();
                self.schema_change(n, &mut tally).await;
                tally.timed(began, || format!("schema change {n}"));
            }
        }
    }

    async fn run(&self, op: Op, tally: &mut Tally) {
        match op {
            Op::Read(k) => {
                let answer = self
                    .sql_as("SELECT k, v FROM kv WHERE k = ?", json!([k]), k % 2 == 1)
                    .await;
                tally.count("point read", answer.as_ref(), 200);
                if let Some(answer) = answer
                    && answer.status == 200
                    && !answer.says(&format!("[[{k},\"value {k}\"]]"))
                {
                    tally.odd(
                        "point read -> 200 without its row".to_owned(),
                        Some(&answer),
                    );
                }
            }
            Op::Write { id, again } => {
                let body = json!({
                    "sql": "INSERT INTO writes (id, note) VALUES (?, ?)",
                    "params": [id, format!("write {id}")],
                })
                .to_string();
                let key = format!("soak-{id}");
                let send = || {
                    Answer::of(
                        self.post(Some(TOKEN), body.clone())
                            .header("idempotency-key", &key),
                    )
                };
                let first = send().await;
                tally.count("keyed write", first.as_ref(), 200);
                // Only an outcome that was stored can be replayed.
                let stored = first.is_some_and(|first| first.status == 200);
                if again {
                    let second = send().await;
                    tally.count("keyed write sent again", second.as_ref(), 200);
                    let Some(second) = second else { return };
                    if second.replayed {
                        tally.replayed += 1;
                    } else if stored && second.status == 200 {
                        tally.odd(
                            "keyed write sent again -> 200 not replayed".to_owned(),
                            Some(&second),
                        );
                    }
                }
            }
            Op::Fail(failure) => self.fail(failure, tally).await,
            Op::Stream { verified } => self.stream(verified, tally).await,
        }
    }

    async fn fail(&self, failure: Failure, tally: &mut Tally) {
        let small = |sql: &str, params: serde_json::Value| {
            json!({ "sql": sql, "params": params }).to_string()
        };
        let request = match failure {
            Failure::BadSql => self.post(
                Some(TOKEN),
                small("SELECT k, v FROM kv WHERE k = ? AND", json!([1])),
            ),
            Failure::WrongParams => self.post(
                Some(TOKEN),
                small("SELECT k, v FROM kv WHERE k = ?", json!([1, 2])),
            ),
            Failure::Sandbox => self.post(Some(TOKEN), small(self.engine.refused(), json!([]))),
            Failure::ReadOnly => self.post(
                Some(READ_TOKEN),
                small("UPDATE kv SET v = ? WHERE k = ?", json!(["changed", 1])),
            ),
            Failure::TooLarge => self.post(Some(TOKEN), self.oversized.clone()),
            Failure::NoToken => self.post(None, small("SELECT 1", json!([]))),
            Failure::WrongToken => self.post(Some("not-a-token"), small("SELECT 1", json!([]))),
        };
        let (status, code) = failure.expected();
        let answer = Answer::of(request).await;
        tally.count(failure.label(), answer.as_ref(), status);
        if let Some(answer) = answer
            && answer.status == status
            && !answer.says(&format!("\"{code}\""))
        {
            tally.odd(
                format!("{} -> {status} without {code}", failure.label()),
                Some(&answer),
            );
        }
    }

    /// Starts the big result, reads a few chunks, drops the response.
    async fn stream(&self, verified: bool, tally: &mut Tally) {
        let body = json!({
            "sql": "SELECT id, payload FROM big ORDER BY id",
            "read_only": verified,
        })
        .to_string();
        let Ok(mut response) = self.post(Some(TOKEN), body).send().await else {
            tally.count("abandoned stream", None, 200);
            return;
        };
        let status = response.status().as_u16();
        if status != 200 {
            let body = response.bytes().await.unwrap_or_default();
            let answer = Answer {
                status,
                replayed: false,
                body,
            };
            tally.count("abandoned stream", Some(&answer), 200);
            return;
        }
        tally.requests += 1;
        *tally.by_status.entry(200).or_default() += 1;
        for _ in 0..STREAM_CHUNKS {
            match response.chunk().await {
                Ok(Some(_)) => {}
                Ok(None) => {
                    tally.odd(
                        "abandoned stream -> 200 ended before it was abandoned".to_owned(),
                        None,
                    );
                    return;
                }
                Err(_) => {
                    tally.odd(
                        "abandoned stream -> 200 cut before it was abandoned".to_owned(),
                        None,
                    );
                    return;
                }
            }
        }
        drop(response);
    }

    async fn probe(&self, tally: &mut Tally) {
        let answer = Answer::of(self.http.get(format!("{}/readyz", self.url))).await;
        tally.count("/readyz", answer.as_ref(), 200);
    }

    /// Schema change number `n`, cycling through four kinds.
    async fn schema_change(&self, n: u64, tally: &mut Tally) {
        let statements = match n % 4 {
            0 => vec![format!("ALTER TABLE kv ADD COLUMN extra_{n} INTEGER")],
            1 => vec![format!("CREATE INDEX kv_v_{n} ON kv (v)")],
            2 => vec![format!("DROP INDEX kv_v_{}", n - 1)],
            _ => vec![
                format!("CREATE TABLE side_{n} (id INTEGER PRIMARY KEY, note TEXT)"),
                format!("INSERT INTO side_{n} (id, note) SELECT k, v FROM kv WHERE k < 100"),
                format!("DROP TABLE side_{n}"),
            ],
        };
        for sql in statements {
            let answer = self.sql(&sql, json!([])).await;
            tally.count(&format!("schema change `{sql}`"), answer.as_ref(), 200);
        }
    }
}

/// The soak's tables: point reads, the big streamed result, the keyed writes' target.
async fn set_up(soak: &Soak) {
    let filler = "x".repeat(90);
    for sql in [
        "CREATE TABLE kv (k INTEGER PRIMARY KEY, v TEXT)".to_owned(),
        format!(
            "INSERT INTO kv (k, v) WITH RECURSIVE c(x) AS (SELECT 0 UNION ALL SELECT x + 1 FROM c \
             WHERE x < {}) SELECT x, 'value ' || x FROM c",
            KV_ROWS - 1
        ),
        "CREATE TABLE big (id INTEGER PRIMARY KEY, payload TEXT)".to_owned(),
        format!(
            "INSERT INTO big (id, payload) WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 \
             FROM c WHERE x < {BIG_ROWS}) SELECT x, 'row ' || x || ' {filler}' FROM c"
        ),
        "CREATE TABLE writes (id INTEGER PRIMARY KEY, note TEXT)".to_owned(),
    ] {
        let answer = soak.sql(&sql, json!([])).await;
        assert!(
            answer.as_ref().is_some_and(|answer| answer.status == 200),
            "set-up `{sql}`: {:?}",
            answer.map(|answer| (answer.status, answer.body))
        );
    }
    // How big the abandoned result would be, read once to its end.
    let response = soak
        .post(
            Some(TOKEN),
            json!({ "sql": "SELECT id, payload FROM big ORDER BY id" }).to_string(),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let whole = response.bytes().await.unwrap().len();
    println!(
        "set-up: kv {KV_ROWS} rows; big {BIG_ROWS} rows, a {:.1} MB result when read whole",
        whole as f64 / 1e6
    );
}

/// One soak against the server `process`, `scale` times the full length.
async fn soak(engine: Engine, process: &ServerProcess, scale: f64) {
    let url = process.url().to_owned();
    assert!(
        url.starts_with("http://127.0.0.1:"),
        "the soak talks to loopback only, not {url}"
    );
    let pid = process.id().unwrap();
    let periods = ((PERIODS as f64 * scale).round() as u64).max(1);
    let slots = periods * PERIOD;
    let schema_every = ((SCHEMA_EVERY as f64 * scale).round() as u64).max(PERIOD);
    let mut oversized = br#"{"sql": "SELECT ?", "params": [""#.to_vec();
    oversized.resize(OVERSIZED, b'x');
    oversized.extend_from_slice(br#""]}"#);
    let soak = Arc::new(Soak {
        engine,
        url,
        http: reqwest::Client::builder()
            .no_proxy()
            .pool_max_idle_per_host(IN_FLIGHT)
            .connect_timeout(Duration::from_secs(5))
            .timeout(Duration::from_secs(60))
            .build()
            .unwrap(),
        next: AtomicU64::new(0),
        slots,
        schema_every,
        started: Instant::now(),
        deadline: Instant::now() + time_cap(),
        oversized: oversized.into(),
    });
    set_up(&soak).await;
    println!(
        "plan: {} point reads, {} keyed writes ({} sent again), {} failures, {} abandoned \
         streams, a /readyz probe every {PROBE_EVERY} and a schema change every {schema_every}; \
         {IN_FLIGHT} in flight, at most {} s",
        periods * 100,
        periods * 10,
        periods,
        periods * 10,
        periods,
        time_cap().as_secs(),
    );

    let started = soak.started;
    let mut tally = Tally::new(started);
    let mut lines: Vec<(u64, Sample)> = Vec::new();
    let header = "| requests | seconds | RSS MiB | fds | threads |     200 |    400 |    401 |    403 |   413 | unexpected |";
    println!("{header}");
    println!(
        "|{}|",
        header
            .trim_matches('|')
            .split('|')
            .map(|cell| format!("{}:", "-".repeat(cell.len() - 1)))
            .collect::<Vec<_>>()
            .join("|")
    );
    let print = |tally: &Tally, sample: Sample, seconds: f64| {
        println!(
            "| {:>8} | {:>7.1} | {:>7.1} | {:>3} | {:>7} | {:>7} | {:>6} | {:>6} | {:>6} | {:>5} | {:>10} |",
            tally.requests,
            seconds,
            sample.rss_mib(),
            sample.fds,
            sample.threads,
            tally.status(200),
            tally.status(400),
            tally.status(401),
            tally.status(403),
            tally.status(413),
            tally.unexpected_total(),
        );
    };
    let settled = Sample::of(pid);
    print(&tally, settled, 0.0);
    lines.push((0, settled));

    let mut phase_end = 0;
    while phase_end < slots && Instant::now() < soak.deadline {
        phase_end += PHASE;
        let workers: Vec<_> = (0..IN_FLIGHT)
            .map(|_| {
                let soak = Arc::clone(&soak);
                tokio::spawn(async move { soak.work(phase_end).await })
            })
            .collect();
        for worker in workers {
            tally.merge(worker.await.unwrap());
        }
        // Every worker has stopped at the phase's end; let the server finish with the
        // abandoned streams before looking.
        soak.next.store(phase_end, Ordering::Relaxed);
        tokio::time::sleep(Duration::from_millis(300)).await;
        let sample = Sample::of(pid);
        print(&tally, sample, started.elapsed().as_secs_f64());
        lines.push((tally.requests, sample));
    }
    let seconds = started.elapsed().as_secs_f64();
    let done = tally.slots;
    if done < slots {
        println!(
            "stopped at the time cap ({} s) after {done} of {slots} slots",
            time_cap().as_secs()
        );
    }
    println!(
        "{} requests in {seconds:.1} s ({:.0}/s); {} keyed writes replayed; the slowest: {:.2} s \
         ({})",
        tally.requests,
        tally.requests as f64 / seconds,
        tally.replayed,
        tally.slowest.0,
        tally.slowest.1,
    );
    if tally.unexpected.is_empty() {
        println!("unexpected answers: none");
    } else {
        println!("unexpected answers:");
        for (what, (n, at, body)) in &tally.unexpected {
            println!("  {what}: {n}, the first {at:.1} s in: {body}");
        }
    }
    verdict(&lines);
}

/// The growth after the first line past the set-up, per million requests.
fn verdict(lines: &[(u64, Sample)]) {
    let (Some(&(from_requests, from)), Some(&(to_requests, to))) = (lines.get(1), lines.last())
    else {
        return;
    };
    if to_requests <= from_requests {
        println!("growth: not measured (one phase only)");
        return;
    }
    let millions = (to_requests - from_requests) as f64 / 1e6;
    let grown = to.rss_mib() - from.rss_mib();
    let per_million = grown / millions;
    println!(
        "growth after the first {from_requests} requests: RSS {:+.1} MiB over {} requests = \
         {per_million:+.2} MiB per million (target <= {TARGET_MIB_PER_MILLION} MiB per million: {}); \
         fds {:+}, threads {:+}",
        grown,
        to_requests - from_requests,
        if per_million <= TARGET_MIB_PER_MILLION {
            "met"
        } else {
            "NOT met"
        },
        to.fds as i64 - from.fds as i64,
        to.threads as i64 - from.threads as i64,
    );
}

/// `sqlhttpd` with the soak's tokens and body limit, quiet but for errors.
fn sqlhttpd(database: &str, client_role: Option<&str>) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_sqlhttpd"));
    command
        .args(["--database", database])
        .args(["--token", TOKEN, "--read-token", READ_TOKEN])
        .args(["--max-body-bytes", &BODY_LIMIT.to_string()])
        .env("RUST_LOG", "error")
        .env_remove("SQLHTTPD_TOKENS")
        .env_remove("SQLHTTPD_READ_TOKENS");
    if let Some(role) = client_role {
        command.args(["--client-role", role]);
    }
    command
}

async fn sqlite(scale: f64) {
    println!(
        "\n## sqlhttpd on {} (sqlite::memory:, default limits, {BODY_LIMIT}-byte bodies)",
        Engine::Sqlite.name()
    );
    let process = ServerProcess::spawn_command(sqlhttpd("sqlite::memory:", None))
        .await
        .unwrap();
    soak(Engine::Sqlite, &process, scale).await;
    process.kill().await.unwrap();
}

/// The same on a database of its own on the cluster at `url`, dropped afterwards.
async fn postgres(url: &str, scale: f64) {
    let host = url
        .split_once("://")
        .and_then(|(_, rest)| rest.split(['/', '?']).next())
        .and_then(|authority| authority.rsplit('@').next())
        .unwrap_or_default();
    assert!(
        ["127.0.0.1", "localhost", "[::1]"]
            .iter()
            .any(|loopback| host == *loopback || host.starts_with(&format!("{loopback}:"))),
        "SQLHTTPD_BENCH_POSTGRES_URL must name a loopback host, not {host:?}"
    );
    let scratch = ScratchDatabase::create(url, "soak").await;
    let scale = scale / 4.0;
    println!(
        "\n## sqlhttpd on {} (a database of its own, {BODY_LIMIT}-byte bodies), a quarter \
         of the SQLite soak's length: its engine is about five times slower here",
        Engine::Postgres.name()
    );
    let process = ServerProcess::spawn_command(sqlhttpd(&scratch.url, Some(&scratch.role)))
        .await
        .unwrap();
    soak(Engine::Postgres, &process, scale).await;
    process.kill().await.unwrap();
    scratch.drop().await;
}

fn main() {
    let scale = std::env::var("SQLHTTPD_SOAK_SCALE")
        .ok()
        .and_then(|s| s.parse::<f64>().ok())
        .filter(|s| *s > 0.0)
        .unwrap_or(1.0);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        // `SQLHTTPD_SOAK_ENGINES=postgres` soaks PostgreSQL alone (or `sqlite`, SQLite alone).
        let engines = chosen::chosen("SQLHTTPD_SOAK_ENGINES", &["sqlite", "postgres"]);
        if engines.contains(&"sqlite") {
            sqlite(scale).await;
        }
        if !engines.contains(&"postgres") {
            return;
        }
        match std::env::var("SQLHTTPD_BENCH_POSTGRES_URL") {
            Ok(url) => postgres(&url, scale).await,
            Err(_) => println!("\nPostgreSQL: set SQLHTTPD_BENCH_POSTGRES_URL for its soak"),
        }
    });
}
