//! What one large cell costs the server on PostgreSQL (issue 27, finding 4): a fresh `sqlhttpd`
//! (a child process, so only its memory is measured) answers `SELECT repeat('x', 200000000)`
//! once, then five at once (the pool's size), and the bench prints the process's peak resident
//! memory (`VmHWM`) above its idle size, and what it still holds (`VmRSS`) a second after.
//!
//! Two servers: one with the default `--max-value-bytes` (4 MiB), which refuses the cell with
//! `400 SQL_ERROR` as its length arrives, before its bytes do (`engine/postgres/wire.rs`), and one with `--max-value-bytes 268435456` (and a per-row
//! `--max-result-bytes` twice that), which encodes the cell as JSON and sends it, as every server
//! did before the limits applied to results. The client reads each body to its end and keeps
//! none of it.
//!
//! Needs a PostgreSQL: `SQLHTTPD_BENCH_POSTGRES_URL` (a superuser's URL on loopback), else
//! `SQLHTTPD_TEST_POSTGRES_URL`, else a throwaway cluster from `scripts/start-postgres`
//! (stopped at the end); without any it says so and exits.
//!
//! Run with `cargo bench -p sqlhttp-server --bench cells`.

#[path = "support/scratch_database.rs"]
mod scratch_database;

use scratch_database::ScratchDatabase;

use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::json;
use sqlhttp_testkit::ServerProcess;

const TOKEN: &str = "bench-token";
/// The cell: 200 MB of `x`.
const CELL_BYTES: usize = 200_000_000;
/// Requests at once in the second round: the pool's size (one writer and four readers).
const AT_ONCE: usize = 5;

const MIB: f64 = 1024.0 * 1024.0;

/// A field of `/proc/<pid>/status`, in KiB.
fn status_kib(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|line| line.strip_prefix(field))
        .and_then(|rest| rest.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// Sends the 200 MB statement and reads the body to its end: its status and size.
async fn one(client: &reqwest::Client, url: &str) -> (u16, usize) {
    let mut response = client
        .post(format!("{url}/api/v1/sql"))
        .bearer_auth(TOKEN)
        .header("content-type", "application/json")
        .body(json!({ "sql": format!("SELECT repeat('x', {CELL_BYTES}) AS big") }).to_string())
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    let mut bytes = 0;
    while let Some(chunk) = response.chunk().await.unwrap_or(None) {
        bytes += chunk.len();
    }
    (status, bytes)
}

/// One server with `max_value_bytes`, measured on one request then on [`AT_ONCE`] at once, each
/// in a fresh process so that `VmHWM` is that round's peak.
async fn measure(database: &str, role: &str, max_value_bytes: Option<usize>) -> [(f64, f64); 2] {
    let client = reqwest::Client::builder().no_proxy().build().unwrap();
    let mut figures = [(0.0, 0.0); 2];
    for (round, at_once) in [1, AT_ONCE].into_iter().enumerate() {
        let mut command = Command::new(env!("CARGO_BIN_EXE_sqlhttpd"));
        command
            .args(["--database", database, "--client-role", role])
            .args(["--token", TOKEN])
            .env("RUST_LOG", "error")
            .env_remove("SQLHTTPD_TOKENS")
            .env_remove("SQLHTTPD_READ_TOKENS")
            .stderr(Stdio::inherit());
        if let Some(limit) = max_value_bytes {
            // A row of one such cell must pass the per-row limit too (`--max-result-bytes`).
            command.args(["--max-value-bytes", &limit.to_string()]);
            command.args(["--max-result-bytes", &(2 * limit).to_string()]);
            command.args(["--max-buffered-bytes", &(4 * limit).to_string()]);
        }
        let process = ServerProcess::spawn_command(command).await.unwrap();
        let pid = process.id().unwrap();
        let url = process.url().to_owned();
        // Warm every pooled session, then take the idle size.
        let warm = (0..AT_ONCE).map(|_| {
            client
                .post(format!("{url}/api/v1/sql"))
                .bearer_auth(TOKEN)
                .header("content-type", "application/json")
                .body(r#"{"sql":"SELECT pg_sleep(0.2)"}"#)
                .send()
        });
        for reply in all(warm).await {
            assert_eq!(reply.unwrap().status(), 200);
        }
        let idle = status_kib(pid, "VmRSS:");
        let answers = all((0..at_once).map(|_| {
            let (client, url) = (client.clone(), url.clone());
            async move { one(&client, &url).await }
        }))
        .await;
        let peak = status_kib(pid, "VmHWM:");
        tokio::time::sleep(Duration::from_secs(1)).await;
        let kept = status_kib(pid, "VmRSS:");
        let statuses: Vec<String> = answers
            .iter()
            .map(|(status, bytes)| format!("{status} ({:.0} MiB)", *bytes as f64 / MIB))
            .collect();
        let above = |kib: u64| kib.saturating_sub(idle) as f64 * 1024.0 / MIB;
        println!(
            "  {at_once} at once: peak +{:.0} MiB ({:.2}x the cells), kept after +{:.0} MiB; \
             answers {}",
            above(peak),
            above(peak) * MIB / (CELL_BYTES * at_once) as f64,
            above(kept),
            statuses.join(", ")
        );
        figures[round] = (above(peak), above(kept));
        process.kill().await.unwrap();
    }
    figures
}

/// Runs every future as a task of its own, at once, and awaits them all in order.
async fn all<F>(futures: impl IntoIterator<Item = F>) -> Vec<F::Output>
where
    F: std::future::Future + Send + 'static,
    F::Output: Send + 'static,
{
    let tasks: Vec<_> = futures.into_iter().map(tokio::spawn).collect();
    let mut outputs = Vec::with_capacity(tasks.len());
    for task in tasks {
        outputs.push(task.await.unwrap());
    }
    outputs
}

/// The cluster to measure on, and whether this bench started it (and must stop it).
fn cluster() -> Option<(String, bool)> {
    for name in ["SQLHTTPD_BENCH_POSTGRES_URL", "SQLHTTPD_TEST_POSTGRES_URL"] {
        if let Ok(url) = std::env::var(name) {
            return Some((url, false));
        }
    }
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../../scripts/start-postgres");
    let output = Command::new(script)
        .env("START_POSTGRES_NO_INSTALL", "1")
        .stderr(Stdio::inherit())
        .output()
        .ok()?;
    output.status.success().then(|| {
        (
            String::from_utf8_lossy(&output.stdout).trim().to_owned(),
            true,
        )
    })
}

#[tokio::main]
async fn main() {
    let Some((url, started)) = cluster() else {
        println!(
            "cells: skipped, no PostgreSQL (set SQLHTTPD_BENCH_POSTGRES_URL, or install the \
             postgresql package for scripts/start-postgres)"
        );
        return;
    };
    let scratch = ScratchDatabase::create(&url, "cells").await;

    println!("## one 200 MB cell on PostgreSQL, the server's memory");
    println!(
        "sent (--max-value-bytes 268435456: the cell is encoded and sent, as before the limits \
         applied):"
    );
    let sent = measure(&scratch.url, &scratch.role, Some(256 * 1024 * 1024)).await;
    println!("refused (default --max-value-bytes, 4 MiB):");
    let refused = measure(&scratch.url, &scratch.role, None).await;
    for (round, at_once) in [1, AT_ONCE].into_iter().enumerate() {
        println!(
            "{at_once} at once: refused peaks at {:.2}x what sent peaks at, and keeps {:.0} MiB \
             against {:.0} MiB",
            refused[round].0 / sent[round].0.max(1.0),
            refused[round].1,
            sent[round].1,
        );
    }

    scratch.drop().await;
    if started {
        let stop = concat!(env!("CARGO_MANIFEST_DIR"), "/../../scripts/stop-postgres");
        let _ = Command::new(stop).arg(&url).status();
    }
}
