//! The CLI's peak memory for a 1M-row export, whatever the statement's shape: a plain `SELECT`
//! (the baseline), a `WITH RECURSIVE` query, and an `INSERT ... RETURNING` that writes and
//! returns 1M rows. Each runs as its own `sqlhttp query ... --format csv` process against one
//! in-process `sqlhttpd`, its output thrown away; the bench samples the process's peak RSS
//! (`VmHWM`) until it exits, and prints it with the time, beside the baseline's.
//!
//! Target: every shape under 16 MiB (a `WITH` export was built whole in memory before the CLI
//! sent every statement as a verified, streamed read: 198 MiB).
//!
//! Run with `cargo bench -p sqlhttp-cli --bench export`.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use sqlhttp_server::{Config, Limits};
use sqlhttp_testkit::TestServer;

const ROWS: u64 = 1_000_000;
const TARGET_MIB: f64 = 16.0;

fn peak_kib(pid: u32) -> Option<u64> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()?
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
}

/// Runs the CLI on `sql` and returns its peak RSS in MiB and how long it took.
fn export(url: &str, sql: &str) -> (f64, Duration) {
    let started = Instant::now();
    let mut child = Command::new(env!("CARGO_BIN_EXE_sqlhttp"))
        .env("SQLHTTP_URL", url)
        .env_remove("SQLHTTP_TOKEN")
        .args(["query", sql, "--format", "csv"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("the sqlhttp binary runs");
    let mut peak = 0;
    loop {
        if let Some(kib) = peak_kib(child.id()) {
            peak = peak.max(kib);
        }
        if let Some(status) = child.try_wait().unwrap() {
            assert!(status.success(), "sqlhttp query failed: {sql}");
            break;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    (peak as f64 / 1024.0, started.elapsed())
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let server = runtime.block_on(TestServer::with_config(Config {
        limits: Limits {
            statement_timeout: Duration::from_secs(300),
            ..Limits::default()
        },
        ..Config::default()
    }));
    let url = server.url();
    let client = server.client_builder().build().unwrap();
    let generate = format!(
        "WITH RECURSIVE r(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM r WHERE i < {ROWS}) \
         SELECT i, 'row number ' || i AS label FROM r"
    );
    runtime.block_on(async {
        client
            .execute("CREATE TABLE source (i INTEGER, label TEXT)")
            .await
            .unwrap();
        client
            .execute(format!("INSERT INTO source {generate}"))
            .await
            .unwrap();
        client
            .execute("CREATE TABLE copied (i INTEGER, label TEXT)")
            .await
            .unwrap();
    });

    println!("sqlhttp query ... --format csv, {ROWS} rows each, output discarded");
    println!(
        "{:<34} {:>12} {:>10} {:>12}",
        "statement", "peak RSS", "time", "vs SELECT"
    );
    let shapes = [
        (
            "SELECT (baseline)",
            "SELECT i, label FROM source".to_owned(),
        ),
        ("WITH RECURSIVE ... SELECT", generate.clone()),
        (
            "INSERT ... SELECT ... RETURNING",
            "INSERT INTO copied SELECT i, label FROM source RETURNING i, label".to_owned(),
        ),
    ];
    let mut baseline = None;
    let mut met = true;
    for (name, sql) in &shapes {
        let (peak, took) = export(&url, sql);
        let base = *baseline.get_or_insert(peak);
        met &= peak <= TARGET_MIB;
        println!(
            "{name:<34} {peak:>8.1} MiB {:>8.0} ms {:>11.2}x",
            took.as_secs_f64() * 1000.0,
            peak / base
        );
    }
    let copied: i64 = runtime
        .block_on(client.query("SELECT count(*) FROM copied").fetch_one())
        .unwrap();
    assert_eq!(
        copied as u64, ROWS,
        "the RETURNING export wrote every row once"
    );
    println!(
        "target: every shape under {TARGET_MIB} MiB peak: {}",
        if met { "met" } else { "NOT met" }
    );
    drop(server);
}
