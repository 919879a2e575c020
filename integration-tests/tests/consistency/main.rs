//! The consistency checker under faults (issue 24): several client sessions do keyed writes and
//! verified reads through two `sqlhttpd`s (in front of a PostgreSQL primary and its streaming
//! replicas) while a scheduler partitions a replica from the primary, pauses one, and kills
//! and restarts one `sqlhttpd`; the recorded history is then checked (every acknowledged write
//! present exactly once, read-your-writes and monotonic reads within a session and across the
//! processes it handed its bookmark to, reads never failing because a replica did). Some writes
//! are interactive transactions whose COMMIT answer a proxy drops, so that every such COMMIT is
//! sent twice (issue 35): the answer to the second must carry the commit's bookmark for the read
//! that follows it to see the row.
//!
//! `scripts/consistency-check` builds the images, brings the topology up in Docker, runs this
//! target and tears everything down. The run itself is [`under_faults`], which does nothing
//! unless `SQLHTTP_CONSISTENCY=1`, so `cargo test --workspace` never needs Docker; the checker's
//! rules, the fault plan and a short run against an in-process server are ordinary tests here.
//!
//! Environment of the run (the script sets it):
//! * `SQLHTTP_CONSISTENCY=1` — run it.
//! * `SQLHTTP_CONSISTENCY_SERVERS` — comma-separated `[CONTAINER=]URL` of each sqlhttpd.
//! * `SQLHTTP_CONSISTENCY_TOKEN` — their bearer token.
//! * `SQLHTTP_CONSISTENCY_PRIMARY` — the primary's `postgres://` URL, to read the final table
//!   from (otherwise it is read through the first sqlhttpd with a request that may write,
//!   which the primary serves).
//! * `SQLHTTP_CONSISTENCY_REPLICAS` — the replicas' container names (comma-separated), and
//!   `SQLHTTP_CONSISTENCY_REPLICATION_NETWORK` the network they replicate on.
//! * `SQLHTTP_CONSISTENCY_FAULTS` — `partition,pause,kill,stop` (the default: all), or `none`.
//! * `SQLHTTP_CONSISTENCY_REPLICA_HOLD_MS` — `LOW-HIGH`: how long replica faults last (1000-6000).
//! * `SQLHTTP_CONSISTENCY_SECONDS` (30), `SQLHTTP_CONSISTENCY_SESSIONS` (6),
//!   `SQLHTTP_CONSISTENCY_SEED` (from the clock; printed, so a run can be replayed).
//! * `SQLHTTP_CONSISTENCY_HISTORY` — a file to write the history to (JSON lines).
//! * `SQLHTTP_CONSISTENCY_NO_BOOKMARKS=1` — requests carry no bookmark: with replicas, the
//!   checker must then find stale reads (it shows the checker can).
//!
//! `history` records, `session` drives the workload, `faults` schedules faults, `check`
//! judges, `summary` prints the figures.

mod check;
mod faults;
mod history;
mod rng;
mod session;
mod summary;

use std::collections::BTreeMap;
use std::io::Write as _;
use std::sync::Arc;
use std::time::Duration;

use check::Verdict;
use faults::Topology;
use history::{Clock, Event, FaultKind, FaultRecord, History};
use rng::Rng;
use session::{Context, Session};

/// What one run is asked to do.
#[derive(Debug, Clone)]
struct RunConfig {
    topology: Topology,
    token: Option<String>,
    primary: Option<String>,
    faults: Vec<FaultKind>,
    seconds: u64,
    sessions: usize,
    seed: u64,
    history_file: Option<String>,
    send_bookmarks: bool,
}

impl RunConfig {
    /// The run the environment asks for, or `None` when `SQLHTTP_CONSISTENCY` is not `1`.
    fn from_env() -> Result<Option<RunConfig>, String> {
        if std::env::var("SQLHTTP_CONSISTENCY").as_deref() != Ok("1") {
            return Ok(None);
        }
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
        let list = |name: &str| -> Vec<String> {
            var(name)
                .unwrap_or_default()
                .split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
                .collect()
        };
        let servers: Vec<(String, String)> = list("SQLHTTP_CONSISTENCY_SERVERS")
            .into_iter()
            .map(|entry| match entry.split_once('=') {
                Some((container, url)) => (container.to_owned(), url.to_owned()),
                None => (String::new(), entry),
            })
            .collect();
        if servers.is_empty() {
            return Err("SQLHTTP_CONSISTENCY_SERVERS names no server".to_owned());
        }
        let number = |name: &str, default: u64| -> Result<u64, String> {
            var(name).map_or(Ok(default), |v| {
                v.parse().map_err(|_| format!("{name}={v} is not a number"))
            })
        };
        let wanted = list("SQLHTTP_CONSISTENCY_FAULTS");
        let mut faults = Vec::new();
        if wanted.is_empty() {
            faults.extend(FaultKind::ALL);
        }
        for name in &wanted {
            match name.as_str() {
                "none" => {}
                "partition" => faults.push(FaultKind::Partition),
                "pause" => faults.push(FaultKind::Pause),
                "kill" => faults.push(FaultKind::Kill),
                "stop" => faults.push(FaultKind::Stop),
                other => {
                    return Err(format!(
                        "unknown fault {other:?} in SQLHTTP_CONSISTENCY_FAULTS"
                    ));
                }
            }
        }
        // A fault on an sqlhttpd needs its container's name.
        if servers.iter().any(|(container, _)| container.is_empty()) {
            faults.retain(|kind| !kind.downs_a_server());
        }
        let seed = number(
            "SQLHTTP_CONSISTENCY_SEED",
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64),
        )?;
        Ok(Some(RunConfig {
            topology: Topology {
                replicas: list("SQLHTTP_CONSISTENCY_REPLICAS"),
                replication_network: var("SQLHTTP_CONSISTENCY_REPLICATION_NETWORK"),
                servers,
                replica_hold_ms: match var("SQLHTTP_CONSISTENCY_REPLICA_HOLD_MS") {
                    None => None,
                    Some(range) => Some(
                        range
                            .split_once('-')
                            .and_then(|(low, high)| Some((low.parse().ok()?, high.parse().ok()?)))
                            .ok_or_else(|| {
                                format!(
                                    "SQLHTTP_CONSISTENCY_REPLICA_HOLD_MS={range} is not LOW-HIGH"
                                )
                            })?,
                    ),
                },
            },
            token: var("SQLHTTP_CONSISTENCY_TOKEN"),
            primary: var("SQLHTTP_CONSISTENCY_PRIMARY"),
            faults,
            seconds: number("SQLHTTP_CONSISTENCY_SECONDS", 30)?,
            sessions: usize::try_from(number("SQLHTTP_CONSISTENCY_SESSIONS", 6)?)
                .map_err(|err| err.to_string())?,
            seed,
            history_file: var("SQLHTTP_CONSISTENCY_HISTORY"),
            send_bookmarks: var("SQLHTTP_CONSISTENCY_NO_BOOKMARKS").as_deref() != Some("1"),
        }))
    }
}

/// What a run recorded and what the checker made of it.
#[derive(Debug)]
struct Outcome {
    events: Vec<Event>,
    faults: Vec<FaultRecord>,
    table_rows: usize,
    verdict: Verdict,
    /// What the transactional writes did.
    transactions: session::TxFigures,
}

/// The final table: the count of rows of each `(session, seq)`, read from the primary.
async fn final_table(
    config: &RunConfig,
    context: &Context,
) -> Result<BTreeMap<(usize, i64), u64>, String> {
    let Some(url) = &config.primary else {
        return session::final_table_via(context, 0).await;
    };
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .map_err(|err| format!("cannot connect to the primary: {err}"))?;
    let driver = tokio::spawn(connection);
    let rows = client
        .query(
            &format!(
                "SELECT session, seq, count(*) FROM {} GROUP BY session, seq",
                context.table
            ),
            &[],
        )
        .await
        .map_err(|err| format!("cannot read the final table: {err}"))?;
    drop(client);
    let _ = driver.await;
    let mut table = BTreeMap::new();
    for row in rows {
        let session: i64 = row.get(0);
        let seq: i64 = row.get(1);
        let count: i64 = row.get(2);
        table.insert(
            (usize::try_from(session).map_err(|e| e.to_string())?, seq),
            u64::try_from(count).map_err(|e| e.to_string())?,
        );
    }
    Ok(table)
}

/// Runs the workload and the faults `config` asks for, then checks the history.
async fn run(config: &RunConfig) -> Result<Outcome, String> {
    let clock = Clock::start();
    let history = Arc::new(History::default());
    let mut rng = Rng::seeded(config.seed);
    let table = format!("consistency_{:08x}", rng.next_u64() as u32);
    let servers: Vec<String> = config
        .topology
        .servers
        .iter()
        .map(|(_, url)| url.trim_end_matches('/').to_owned())
        .collect();
    let run_us = config.seconds.saturating_mul(1_000_000);
    let mut context = Context::new(
        servers,
        config.token.clone(),
        table,
        clock,
        Arc::clone(&history),
        u64::MAX,
    );
    let bookmark = session::create_table(&context).await?;
    context.deadline_us = clock.now_us().saturating_add(run_us);
    context.send_bookmarks = config.send_bookmarks;
    let context = Arc::new(context);

    // Faults stop a little before the traffic, so the last one is healed under traffic.
    let stop_us = context.deadline_us.saturating_sub(3_000_000);
    let kinds = config.topology.kinds(&config.faults);
    let scheduler = tokio::spawn(faults::run(
        config.topology.clone(),
        kinds,
        rng.fork(),
        clock,
        stop_us,
        Arc::clone(&history),
    ));
    let sessions: Vec<_> = (0..config.sessions)
        .map(|id| {
            let session = Session::new(Arc::clone(&context), id, rng.fork(), bookmark.clone());
            tokio::spawn(session.run())
        })
        .collect();
    for session in sessions {
        session
            .await
            .map_err(|err| format!("a session failed: {err}"))?;
    }
    scheduler
        .await
        .map_err(|err| format!("the fault scheduler failed: {err}"))?;
    // A write given up on may still be running on a server: let it end before the final read.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let table = final_table(config, &context).await?;
    let (events, faults) = history.take();
    let verdict = check::check(&events, &faults, &table);
    Ok(Outcome {
        events,
        faults,
        table_rows: table.values().map(|&n| n as usize).sum(),
        verdict,
        transactions: context.transactions.figures(),
    })
}

fn write_history(path: &str, outcome: &Outcome) -> std::io::Result<()> {
    let mut file = std::io::BufWriter::new(std::fs::File::create(path)?);
    for fault in &outcome.faults {
        serde_json::to_writer(&mut file, &serde_json::json!({ "fault": fault }))?;
        writeln!(file)?;
    }
    for event in &outcome.events {
        serde_json::to_writer(&mut file, &serde_json::json!({ "event": event }))?;
        writeln!(file)?;
    }
    file.flush()
}

/// The run `scripts/consistency-check` asks for; nothing without `SQLHTTP_CONSISTENCY=1`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_faults() {
    let config = match RunConfig::from_env() {
        Ok(Some(config)) => config,
        Ok(None) => {
            eprintln!("SQLHTTP_CONSISTENCY is not 1: nothing to run (scripts/consistency-check)");
            return;
        }
        Err(err) => panic!("{err}"),
    };
    let outcome = run(&config).await.unwrap_or_else(|err| panic!("{err}"));
    if let Some(path) = &config.history_file
        && let Err(err) = write_history(path, &outcome)
    {
        eprintln!("cannot write the history to {path}: {err}");
    }
    let text = summary::summary(&config, &outcome);
    let _ = std::io::stderr().write_all(text.as_bytes());
    let fault_errors = outcome.faults.iter().filter(|f| f.error.is_some()).count();
    assert!(
        outcome.verdict.anomalies.is_empty() && fault_errors == 0,
        "{} anomalies, {fault_errors} faults that could not be made or healed (summary above)",
        outcome.verdict.anomalies.len()
    );
}

/// The whole pipeline, without Docker: sessions against an in-process sqlhttpd (on SQLite, no
/// replicas, no faults; named twice so sessions alternate), the table read back, the history
/// checked: nothing anomalous, and every operation kind done.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_run_against_an_in_process_server_finds_no_anomaly() {
    let server = sqlhttp_testkit::TestServer::start().await;
    let url = server.url();
    let config = RunConfig {
        topology: Topology {
            servers: vec![(String::new(), url.clone()), (String::new(), url)],
            ..Topology::default()
        },
        token: server.config().tokens.first().cloned(),
        primary: None,
        faults: Vec::new(),
        seconds: 2,
        sessions: 3,
        seed: 24,
        history_file: None,
        send_bookmarks: true,
    };
    let outcome = run(&config).await.unwrap();
    let text = summary::summary(&config, &outcome);
    assert!(outcome.verdict.anomalies.is_empty(), "{text}");
    let figures = summary::Figures::of(&outcome);
    assert!(figures.acknowledged > 0 && figures.reads_ok > 0, "{text}");
    assert_eq!(
        figures.unknown + figures.refused + figures.reads_failed,
        0,
        "{text}"
    );
    assert_eq!(outcome.table_rows, figures.acknowledged, "{text}");
    assert!(outcome.faults.is_empty());
    // Transactional writes ran, each COMMIT's first answer dropped and the COMMIT sent again.
    let tx = &outcome.transactions;
    assert!(tx.committed > 0, "{text}");
    assert!(tx.commits_dropped >= tx.committed, "{text}");
    assert!(tx.commits_resent >= tx.commits_dropped, "{text}");
}
