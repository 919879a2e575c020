//! What a verified point read costs on each side of the connection, sent the way sqlhttpd's
//! engine sends it today (tokio-postgres: BEGIN's message, the statement, the end's message,
//! three `Sync`s) and as one flight of this crate (one `Sync`), with its rows in binary and in
//! text, with the reset as today's PL/pgSQL call, written inline, or left out (the floor), and with
//! the server's fixed statements (BEGIN, the settings, ROLLBACK, the reset) sent unnamed or
//! prepared once per connection (through tokio-postgres too), and as the engine sends it now
//! (ADR 0063: `ROLLBACK` prepared, the reset the unnamed statement parsed once); beside them
//! the bare statement a hand-written gateway sends, through each driver (ADR 0060 has the
//! figures). It
//! answers what ADR 0059 left to measurement: how much of the read's CPU the flight saves in
//! sqlhttpd's own process (PostgreSQL's share is `scripts/pgbench-read-cost`'s), and which
//! result format the row writer should ask for.
//!
//! Each variant runs [`CONNECTIONS`] connections, each reading in a loop, for a round of
//! `SQLHTTPD_PGWIRE_BENCH_SECONDS` (default 4); the variants take turns for three rounds after
//! a warm-up. Per read it prints this process's CPU (`/proc/self/stat`: the driver, its tasks and
//! the loop; the same loop for every variant) and PostgreSQL's (`/proc/PID/stat` of the
//! variant's own backends, so other load on the machine is not counted), each the median of the
//! three rounds, and the ratio of both to today's way.
//!
//! Run with `SQLHTTPD_BENCH_POSTGRES_URL=$(scripts/start-postgres) cargo bench -p sqlhttp-pgwire
//! --bench read_flight` (a superuser's URL on loopback, as the script prints; the bench makes a
//! schema of its own, `pgwire_bench`, and drops it). Linux only (it reads `/proc`).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use sqlhttp_pgwire::{Answer, Connection, Format, Limits, Param, Startup};
use tokio::net::TcpStream;

/// Connections per variant, reading at once.
const CONNECTIONS: usize = 8;
const ROWS: i64 = 10_000;
const ROUNDS: usize = 3;

/// The read's statement, its table in the bench's own schema.
const READ: &str = "SELECT k, v FROM pgwire_bench.kv WHERE k = $1";

/// The server's transaction around a read, as the engine opens it (`transaction.rs`).
const BEGIN: &str = "BEGIN READ ONLY, ISOLATION LEVEL REPEATABLE READ";
const SETTINGS: &str = "SELECT pg_catalog.set_config('statement_timeout', '5000', true), \
     pg_catalog.set_config('lock_timeout', '1000', true), \
     pg_catalog.pg_current_wal_lsn()::pg_catalog.text";
/// The reset after a read, as `session::after_read` sends it, its function in the bench's
/// schema (the body is `engine/postgres/setup.rs`'s, without the link check's extension).
const RESET: &str = "SELECT pgwire_bench.reset_after_read(0.5)";
/// The same reset written inline (ADR 0059): the seed, advisory locks, and the checks whose
/// answer says whether the rare part (statements a client's function prepared, links) must follow.
const INLINE_RESET: &str = "SELECT pg_catalog.setseed(0.5), pg_catalog.pg_advisory_unlock_all(), \
     EXISTS (SELECT FROM pg_catalog.pg_prepared_statements AS p WHERE p.from_sql), \
     EXISTS (SELECT FROM pg_catalog.pg_extension AS e \
             WHERE e.extname OPERATOR(pg_catalog.=) ANY ('{dblink,postgres_fdw}'::pg_catalog.name[]))";

const SETUP: &str = "
DROP SCHEMA IF EXISTS pgwire_bench CASCADE;
CREATE SCHEMA pgwire_bench;
CREATE TABLE pgwire_bench.kv (k bigint PRIMARY KEY, v text NOT NULL);
INSERT INTO pgwire_bench.kv SELECT g, 'value-' || g FROM generate_series(0, 9999) AS g;
ANALYZE pgwire_bench.kv;
CREATE FUNCTION pgwire_bench.reset_after_read(seed pg_catalog.float8) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    statement text;
BEGIN
    FOR statement IN SELECT p.name FROM pg_catalog.pg_prepared_statements AS p WHERE p.from_sql
    LOOP
        EXECUTE pg_catalog.format('DEALLOCATE %I', statement);
    END LOOP;
    PERFORM pg_catalog.setseed(seed);
    PERFORM pg_catalog.pg_advisory_unlock_all();
END $$;";

/// Where the cluster is, from its URL (`postgres://USER[:PASSWORD]@HOST:PORT/DATABASE`).
struct Target {
    address: String,
    user: String,
    database: String,
    url: String,
}

fn target(url: &str) -> Target {
    let rest = url
        .strip_prefix("postgres://")
        .or_else(|| url.strip_prefix("postgresql://"))
        .expect("a postgres:// URL");
    let (user, rest) = rest.split_once('@').expect("USER@HOST:PORT/DATABASE");
    let (address, database) = rest.split_once('/').expect("HOST:PORT/DATABASE");
    Target {
        address: address.to_owned(),
        user: user.split(':').next().unwrap_or(user).to_owned(),
        database: database.split('?').next().unwrap_or(database).to_owned(),
        url: url.to_owned(),
    }
}

/// The ways a read is sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Way {
    /// tokio-postgres, as the engine sends a verified read today: three requests, three `Sync`s.
    Today,
    /// tokio-postgres with the server's fixed statements prepared too (BEGIN, the settings with
    /// their values bound, ROLLBACK, the reset's call): five requests, five `Sync`s, written
    /// together.
    TodayPrepared,
    /// One flight of this crate: the same statements, one `Sync`, rows in binary.
    FlightBinary,
    /// The same flight, rows in text.
    FlightText,
    /// The binary flight with the reset written inline instead of the PL/pgSQL call.
    FlightInlineReset,
    /// The binary flight without any reset: the floor of a read in a transaction of its own.
    FlightNoReset,
    /// The binary flight with its fixed statements (BEGIN, the settings, ROLLBACK, the reset's
    /// call) prepared once per connection, as the read's own statement is.
    FlightPrepared,
    /// [`Way::FlightPrepared`] with the reset written inline, prepared too.
    FlightPreparedInline,
    /// As sqlhttpd's engine sends a verified read (ADR 0063): BEGIN, the settings and ROLLBACK
    /// prepared, the reset's call the unnamed statement, parsed once per connection.
    FlightServed,
    /// The bare statement through tokio-postgres, as a hand-written gateway sends it.
    GatewayDriver,
    /// The bare statement as one flight of this crate.
    GatewayFlight,
}

impl Way {
    const ALL: [Way; 11] = [
        Way::Today,
        Way::TodayPrepared,
        Way::FlightBinary,
        Way::FlightText,
        Way::FlightInlineReset,
        Way::FlightNoReset,
        Way::FlightPrepared,
        Way::FlightPreparedInline,
        Way::FlightServed,
        Way::GatewayDriver,
        Way::GatewayFlight,
    ];

    fn name(self) -> &'static str {
        match self {
            Way::Today => "today: tokio-postgres, 3 Syncs",
            Way::TodayPrepared => "tokio-postgres, all prepared, 5 Syncs",
            Way::FlightBinary => "one flight, 1 Sync, binary rows",
            Way::FlightText => "one flight, 1 Sync, text rows",
            Way::FlightInlineReset => "one flight, binary, reset inline",
            Way::FlightNoReset => "one flight, binary, no reset",
            Way::FlightPrepared => "one flight, binary, all prepared",
            Way::FlightPreparedInline => "one flight, all prepared, reset inline",
            Way::FlightServed => "as served: end prepared, reset unnamed once",
            Way::GatewayDriver => "gateway: bare statement, tokio-postgres",
            Way::GatewayFlight => "gateway: bare statement, one flight",
        }
    }
}

/// One connection of a variant, and its backend's process id.
enum Session {
    Driver(tokio_postgres::Client, tokio_postgres::Statement),
    /// The read's statement, then BEGIN, the settings, ROLLBACK and the reset, prepared.
    Prepared(tokio_postgres::Client, Box<[tokio_postgres::Statement; 5]>),
    Wire(Box<Connection<TcpStream>>),
}

/// A tokio-postgres connection to `target`, and its backend's process id.
async fn driver(target: &Target) -> (tokio_postgres::Client, i32) {
    let (client, connection) = tokio_postgres::connect(&target.url, tokio_postgres::NoTls)
        .await
        .expect("tokio-postgres connects");
    tokio::spawn(connection);
    let pid: i32 = client
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .unwrap()
        .get(0);
    (client, pid)
}

async fn open(target: &Target, way: Way) -> (Session, i32) {
    match way {
        Way::Today | Way::GatewayDriver => {
            let (client, pid) = driver(target).await;
            let statement = client.prepare(READ).await.unwrap();
            (Session::Driver(client, statement), pid)
        }
        Way::TodayPrepared => {
            let (client, pid) = driver(target).await;
            let mut prepared = Vec::new();
            for sql in [
                READ,
                BEGIN,
                "SELECT pg_catalog.set_config('statement_timeout', $1, true), \
                 pg_catalog.set_config('lock_timeout', $2, true), \
                 pg_catalog.pg_current_wal_lsn()::pg_catalog.text",
                "ROLLBACK",
                "SELECT pgwire_bench.reset_after_read($1)",
            ] {
                prepared.push(client.prepare(sql).await.unwrap());
            }
            let statements: [tokio_postgres::Statement; 5] =
                prepared.try_into().expect("five statements");
            (Session::Prepared(client, Box::new(statements)), pid)
        }
        Way::FlightBinary
        | Way::FlightText
        | Way::FlightInlineReset
        | Way::FlightNoReset
        | Way::FlightPrepared
        | Way::FlightPreparedInline
        | Way::FlightServed
        | Way::GatewayFlight => {
            let stream = TcpStream::connect(&target.address).await.unwrap();
            stream.set_nodelay(true).unwrap();
            let mut connection = Connection::startup(
                stream,
                &Startup {
                    user: &target.user,
                    database: Some(&target.database),
                    password: None,
                    application_name: Some("read_flight bench"),
                    require_scram: false,
                },
                Limits::default(),
            )
            .await
            .expect("the connection logs in");
            // Prepared once, as the engine's statement cache will.
            let mut flight = connection.flight().unwrap();
            flight.parse("read", READ, &[20]).unwrap();
            for (name, sql) in [
                ("begin", BEGIN),
                ("settings", SETTINGS),
                ("rollback", "ROLLBACK"),
                ("reset", RESET),
                ("inline_reset", INLINE_RESET),
            ] {
                flight.parse(name, sql, &[]).unwrap();
            }
            // The unnamed statement, as `FlightServed` binds it (the others parse their own).
            flight.parse("", RESET, &[]).unwrap();
            flight.sync();
            flight.send().await.unwrap().finish().await.unwrap();
            let pid = connection.backend_key().process_id;
            (Session::Wire(Box::new(connection)), pid)
        }
    }
}

/// One read of row `k` the way `way` sends it; checks the row it got.
async fn read(session: &mut Session, way: Way, k: i64) {
    match session {
        Session::Driver(client, statement) => {
            let row = if way == Way::Today {
                // As the engine pipelines them: all three written before any answer is read.
                let begin = format!(
                    "{BEGIN}; SET LOCAL statement_timeout = 5000; SET LOCAL lock_timeout = 1000; \
                     SELECT pg_catalog.pg_current_wal_lsn()::pg_catalog.text"
                );
                let end = format!("ROLLBACK; {RESET}");
                let params: [&(dyn tokio_postgres::types::ToSql + Sync); 1] = [&k];
                let (begun, rows, ended) = tokio::join!(
                    client.simple_query(&begin),
                    client.query(&*statement, &params),
                    client.batch_execute(&end),
                );
                begun.unwrap();
                ended.unwrap();
                rows.unwrap().pop()
            } else {
                client.query(&*statement, &[&k]).await.unwrap().pop()
            };
            let row = row.expect("a row");
            assert_eq!(row.get::<_, i64>(0), k);
            assert!(row.get::<_, &str>(1).starts_with("value-"));
        }
        Session::Prepared(client, statements) => {
            let [statement, begin, settings, rollback, reset] = &**statements;
            let (timeout, lock) = ("5000", "1000");
            let seed = 0.5_f64;
            let read: [&(dyn tokio_postgres::types::ToSql + Sync); 1] = [&k];
            let set: [&(dyn tokio_postgres::types::ToSql + Sync); 2] = [&timeout, &lock];
            let reseed: [&(dyn tokio_postgres::types::ToSql + Sync); 1] = [&seed];
            // All five written before any answer is read.
            let (begun, set, rows, rolled_back, reset) = tokio::join!(
                client.execute(begin, &[]),
                client.query_one(settings, &set),
                client.query(statement, &read),
                client.execute(rollback, &[]),
                client.execute(reset, &reseed),
            );
            begun.unwrap();
            set.unwrap();
            rolled_back.unwrap();
            reset.unwrap();
            let row = rows.unwrap().pop().expect("a row");
            assert_eq!(row.get::<_, i64>(0), k);
            assert!(row.get::<_, &str>(1).starts_with("value-"));
        }
        Session::Wire(connection) => {
            let key = k.to_be_bytes();
            let text = k.to_string();
            let (param, results) = match way {
                Way::FlightText => (
                    Param {
                        format: Format::Text,
                        value: Some(text.as_bytes()),
                    },
                    Format::Text,
                ),
                _ => (
                    Param {
                        format: Format::Binary,
                        value: Some(&key),
                    },
                    Format::Binary,
                ),
            };
            let mut flight = connection.flight().unwrap();
            let prepared = matches!(
                way,
                Way::FlightPrepared | Way::FlightPreparedInline | Way::FlightServed
            );
            let run =
                |flight: &mut sqlhttp_pgwire::Flight<'_, TcpStream>, name: &str, sql: &str| {
                    if prepared {
                        flight
                            .bind("", name, &[], Format::Binary)
                            .and_then(|flight| flight.execute("", 0))
                            .map(drop)
                    } else {
                        flight.statement(sql).map(drop)
                    }
                };
            if way != Way::GatewayFlight {
                run(&mut flight, "begin", BEGIN).unwrap();
                run(&mut flight, "settings", SETTINGS).unwrap();
            }
            flight
                .bind("", "read", &[param], results)
                .unwrap()
                .execute("", 0)
                .unwrap();
            if way != Way::GatewayFlight {
                run(&mut flight, "rollback", "ROLLBACK").unwrap();
            }
            match way {
                Way::FlightBinary | Way::FlightText | Way::FlightPrepared => {
                    run(&mut flight, "reset", RESET).unwrap();
                }
                Way::FlightInlineReset | Way::FlightPreparedInline => {
                    run(&mut flight, "inline_reset", INLINE_RESET).unwrap();
                }
                Way::FlightServed => {
                    flight
                        .bind("", "", &[], Format::Binary)
                        .unwrap()
                        .execute("", 0)
                        .unwrap();
                }
                _ => {}
            }
            flight.sync();
            let mut answers = flight.send().await.unwrap();
            let mut rows = 0;
            while let Some(answer) = answers.next().await.unwrap() {
                match answer {
                    Answer::Row(row) => {
                        let cells = row.cells().unwrap();
                        // The settings' row has three cells, the inline reset's four, the
                        // read's two.
                        if cells.len() == 2 {
                            let v = cells[1].expect("v is not null");
                            assert!(v.starts_with(b"value-"));
                            rows += 1;
                        }
                    }
                    Answer::Error(e) => panic!("the read failed: {} {}", e.code, e.message),
                    _ => {}
                }
            }
            assert_eq!(rows, 1);
        }
    }
}

/// Clock ticks a process has spent (user and system), from `/proc/PID/stat`.
fn ticks(pid: &str) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The command may hold spaces: fields count from after its closing parenthesis.
    let after = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let fields: Vec<&str> = after.split_whitespace().collect();
    let field = |index: usize| {
        fields
            .get(index)
            .and_then(|f| f.parse::<u64>().ok())
            .unwrap_or(0)
    };
    // utime and stime are fields 14 and 15 of the line, 12 and 13 after the command.
    field(11) + field(12)
}

fn ticks_per_second() -> f64 {
    // Linux's USER_HZ is 100 on every architecture Rust targets with /proc.
    100.0
}

/// One round of `way`: reads per second, and this process's and PostgreSQL's CPU per read (µs).
struct Round {
    per_second: f64,
    ours: f64,
    theirs: f64,
}

async fn round(target: &Arc<Target>, way: Way, length: Duration) -> Round {
    let mut sessions = Vec::new();
    for _ in 0..CONNECTIONS {
        sessions.push(open(target, way).await);
    }
    let pids: Vec<String> = sessions.iter().map(|(_, pid)| pid.to_string()).collect();
    let backends = || pids.iter().map(|pid| ticks(pid)).sum::<u64>();
    let done = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let (ours_before, theirs_before) = (ticks("self"), backends());
    let started = Instant::now();
    let mut tasks = Vec::new();
    for (index, (mut session, _)) in sessions.into_iter().enumerate() {
        let done = Arc::clone(&done);
        let stop = Arc::clone(&stop);
        tasks.push(tokio::spawn(async move {
            let mut k = index as i64;
            while !stop.load(Ordering::Relaxed) {
                k = (k * 7_919 + 13) % ROWS;
                read(&mut session, way, k).await;
                done.fetch_add(1, Ordering::Relaxed);
            }
            session
        }));
    }
    tokio::time::sleep(length).await;
    stop.store(true, Ordering::Relaxed);
    let mut sessions = Vec::new();
    for task in tasks {
        sessions.push(task.await.unwrap());
    }
    let elapsed = started.elapsed().as_secs_f64();
    let (ours_after, theirs_after) = (ticks("self"), backends());
    drop(sessions);
    let reads = done.load(Ordering::Relaxed).max(1) as f64;
    let micros = |ticks: u64| ticks as f64 / ticks_per_second() * 1e6 / reads;
    Round {
        per_second: reads / elapsed,
        ours: micros(ours_after.saturating_sub(ours_before)),
        // A backend that ended during the round takes its ticks with it: never a wrapped
        // figure.
        theirs: micros(theirs_after.saturating_sub(theirs_before)),
    }
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn main() {
    let Ok(url) = std::env::var("SQLHTTPD_BENCH_POSTGRES_URL") else {
        println!("read_flight: set SQLHTTPD_BENCH_POSTGRES_URL to run it");
        return;
    };
    let seconds = std::env::var("SQLHTTPD_PGWIRE_BENCH_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(4);
    let length = Duration::from_secs(seconds);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let target = Arc::new(target(&url));
        let (owner, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
            .await
            .expect("the bench's URL connects");
        tokio::spawn(connection);
        owner.batch_execute(SETUP).await.unwrap();
        for way in Way::ALL {
            round(&target, way, Duration::from_secs(1)).await;
        }
        let mut rounds: Vec<Vec<Round>> = Way::ALL.iter().map(|_| Vec::new()).collect();
        for number in 1..=ROUNDS {
            for (index, way) in Way::ALL.into_iter().enumerate() {
                let measured = round(&target, way, length).await;
                println!(
                    "round {number} {:<42} {:>7.0} reads/s, {:>5.1} us CPU/read here, {:>5.1} us in \
                     PostgreSQL",
                    way.name(),
                    measured.per_second,
                    measured.ours,
                    measured.theirs
                );
                rounds[index].push(measured);
            }
        }
        let medians: Vec<(f64, f64, f64)> = rounds
            .iter()
            .map(|rounds| {
                (
                    median(rounds.iter().map(|r| r.per_second).collect()),
                    median(rounds.iter().map(|r| r.ours).collect()),
                    median(rounds.iter().map(|r| r.theirs).collect()),
                )
            })
            .collect();
        let (_, today_ours, today_theirs) = medians[0];
        println!(
            "medians of {ROUNDS} rounds of {seconds} s, {CONNECTIONS} connections each (CPU per \
             read; ratio to today's way):"
        );
        for (way, (per_second, ours, theirs)) in Way::ALL.into_iter().zip(medians) {
            println!(
                "  {:<42} {per_second:>7.0} reads/s  here {ours:>5.1} us ({:.2}x)  PostgreSQL \
                 {theirs:>5.1} us ({:.2}x)",
                way.name(),
                ours / today_ours,
                theirs / today_theirs
            );
        }
        let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
        println!(
            "load average: {}",
            load.split_whitespace().take(3).collect::<Vec<_>>().join(" ")
        );
        owner
            .batch_execute("DROP SCHEMA pgwire_bench CASCADE")
            .await
            .unwrap();
    });
}
