//! The client sessions of a run: each speaks the protocol directly over its own HTTP client
//! (reqwest, no retries of its own), keeps the greatest `Sqlhttp-Bookmark` it has seen and sends
//! it on every request, alternates between the sqlhttpd's, and records every attempt in the
//! [history](crate::history). Writes are keyed inserts of unique `(session, seq)` rows, retried
//! with the same key until acknowledged or given up; reads are `"read_only": true` selects of the
//! session's own rows and of everyone's. Now and then a session's process hands its bookmark to
//! a new process (a new HTTP client, nothing else carried over) and ends.
//!
//! Some writes are interactive transactions (issue 35): open, the insert, and a COMMIT sent
//! through a [`ChaosProxy`] of the session's own that forwards it and drops its answer, so the
//! session sends the COMMIT again and takes the bookmark of that answer (a replay); a read of
//! the session's own rows follows at once. A transaction lost before it committed (its
//! sqlhttpd restarted, say: the server says so) is run again, as the SDK's `transact` does.
//!
//! This module knows the wire protocol and the workload (the dropped COMMIT answer is part of
//! that operation); it must not know how the scheduler's faults are made nor how the history is
//! judged.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};
use sqlhttp_testkit::{ChaosProxy, Fault};

use crate::check::parse_bookmark;
use crate::history::{
    Attempt, AttemptResult, Clock, Event, History, Op, ReadKind, Seen, TransportKind, WriteOutcome,
};
use crate::rng::Rng;

/// The longest one write attempt may take.
const WRITE_TIMEOUT: Duration = Duration::from_secs(5);
/// The longest one read attempt may take.
const READ_TIMEOUT: Duration = Duration::from_secs(10);
/// How many attempts a write gets before its outcome is called unknown.
const WRITE_ATTEMPTS: u32 = 40;
/// How many attempts a read gets (alternating servers) before it is recorded as failed.
const READ_ATTEMPTS: u32 = 4;
/// The longest pause between two attempts of one operation.
const MAX_BACKOFF: Duration = Duration::from_secs(1);
/// How many times a transactional write is run before its outcome is called unknown (each run
/// a new transaction, after the one before was lost without committing).
const TX_RUNS: u32 = 8;
/// How many attempts a transaction's statement gets before the run is abandoned.
const STATEMENT_ATTEMPTS: u32 = 5;

/// What every session shares: the servers, the table, the clock and the history.
#[derive(Debug)]
pub(crate) struct Context {
    /// The sqlhttpd base URLs, in the order the history numbers them.
    pub(crate) servers: Vec<String>,
    pub(crate) token: Option<String>,
    /// The table the run writes (`session`, `seq`), unique to the run.
    pub(crate) table: String,
    pub(crate) clock: Clock,
    pub(crate) history: Arc<History>,
    /// Sessions start no operation past this instant of the clock.
    pub(crate) deadline_us: u64,
    /// Whether requests carry the process's bookmark. Off, a replica may serve a read older
    /// than the session's writes: a run that shows the checker catches that.
    pub(crate) send_bookmarks: bool,
    /// What the transactional writes did.
    pub(crate) transactions: TxCounters,
    next_process: AtomicUsize,
}

/// What the transactional writes of a run did, counted as they go (the history records their
/// attempts as those of any write).
#[derive(Debug, Default)]
pub(crate) struct TxCounters {
    writes: AtomicUsize,
    committed: AtomicUsize,
    runs_lost: AtomicUsize,
    commits_dropped: AtomicUsize,
    commits_resent: AtomicUsize,
    replays_without_bookmark: AtomicUsize,
    /// The last answer of each COMMIT whose outcome stayed unknown (the first few).
    unknown_commits: Mutex<Vec<String>>,
}

/// [`TxCounters`] read at the end of a run.
#[derive(Debug, Default, Clone)]
pub(crate) struct TxFigures {
    /// Transactional writes started.
    pub(crate) writes: usize,
    /// Those answered `committed`.
    pub(crate) committed: usize,
    /// Transactions lost before they committed (and run again).
    pub(crate) runs_lost: usize,
    /// COMMITs the proxy forwarded and whose answer it dropped.
    pub(crate) commits_dropped: usize,
    /// COMMITs sent again after a dropped (or failed) answer.
    pub(crate) commits_resent: usize,
    /// `committed` answers to a re-sent COMMIT without `Sqlhttp-Bookmark` (PostgreSQL sends
    /// one on every answer that reports a commit; SQLite on none).
    pub(crate) replays_without_bookmark: usize,
    /// The last answer of each COMMIT whose outcome stayed unknown (the first few; the other
    /// writes of unknown outcome were lost in every run).
    pub(crate) unknown_commits: Vec<String>,
}

impl TxCounters {
    fn add(counter: &AtomicUsize) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// The counts so far.
    pub(crate) fn figures(&self) -> TxFigures {
        let read = |counter: &AtomicUsize| counter.load(Ordering::Relaxed);
        TxFigures {
            writes: read(&self.writes),
            committed: read(&self.committed),
            runs_lost: read(&self.runs_lost),
            commits_dropped: read(&self.commits_dropped),
            commits_resent: read(&self.commits_resent),
            replays_without_bookmark: read(&self.replays_without_bookmark),
            unknown_commits: self
                .unknown_commits
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .clone(),
        }
    }

    fn unknown_commit(&self, last: &AttemptResult) {
        let mut unknown = self
            .unknown_commits
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if unknown.len() < 5 {
            unknown.push(crate::check::describe(last));
        }
    }
}

impl Context {
    /// A context for a run on `servers` writing `table`, ending at `deadline_us`.
    pub(crate) fn new(
        servers: Vec<String>,
        token: Option<String>,
        table: String,
        clock: Clock,
        history: Arc<History>,
        deadline_us: u64,
    ) -> Context {
        Context {
            servers,
            token,
            table,
            clock,
            history,
            deadline_us,
            send_bookmarks: true,
            transactions: TxCounters::default(),
            next_process: AtomicUsize::new(0),
        }
    }

    fn new_process(&self, bookmark: Option<String>) -> Process {
        Process::new(self.next_process.fetch_add(1, Ordering::Relaxed), bookmark)
    }
}

/// One process of a session: an HTTP client of its own and the greatest bookmark it has seen.
#[derive(Debug)]
pub(crate) struct Process {
    id: usize,
    http: reqwest::Client,
    bookmark: Option<String>,
}

/// Where and what one attempt sends.
struct Request<'a> {
    /// The sqlhttpd it is for (the history's number).
    server: usize,
    /// A base URL to send it to in place of the server's (a proxy in front of it).
    via: Option<&'a str>,
    path: &'a str,
    body: &'a str,
    key: Option<&'a str>,
    timeout: Duration,
}

/// What one attempt brought back, besides its record.
struct Answer {
    attempt: Attempt,
    body: Option<Value>,
    retry_after: Option<Duration>,
}

impl Process {
    fn new(id: usize, bookmark: Option<String>) -> Process {
        let http = reqwest::Client::builder()
            .retry(reqwest::retry::never())
            .no_proxy()
            .connect_timeout(Duration::from_secs(2))
            .pool_idle_timeout(Duration::from_secs(5))
            .build()
            .unwrap_or_else(|_| reqwest::Client::new());
        Process { id, http, bookmark }
    }

    /// Keeps `received` when it is a bookmark greater than the one held.
    fn keep(&mut self, received: &str) {
        let Some(new) = parse_bookmark(received) else {
            return;
        };
        let held = self.bookmark.as_deref().and_then(parse_bookmark);
        if held.is_none_or(|held| new > held) {
            self.bookmark = Some(received.to_ascii_lowercase());
        }
    }

    /// One POST of `body` to `/api/v1/sql` on server `server`.
    async fn send(
        &mut self,
        context: &Context,
        server: usize,
        body: &str,
        key: Option<&str>,
        timeout: Duration,
    ) -> Answer {
        self.exchange(
            context,
            Request {
                server,
                via: None,
                path: "/api/v1/sql",
                body,
                key,
                timeout,
            },
        )
        .await
    }

    /// One POST of `request`; an answer of `/api/v1/sql` or of a transaction's statement is a
    /// success only with a whole result, another one (a transaction's open or end) with any
    /// JSON object but an error.
    async fn exchange(&mut self, context: &Context, request: Request<'_>) -> Answer {
        let Request {
            server,
            via,
            path,
            body,
            key,
            timeout,
        } = request;
        let start_us = context.clock.now_us();
        let sent_bookmark = self.bookmark.clone().filter(|_| context.send_bookmarks);
        let base = via.unwrap_or(&context.servers[server]);
        let needs_result = path == "/api/v1/sql" || path.ends_with("/statement");
        let mut request = self
            .http
            .post(format!("{base}{path}"))
            .header("content-type", "application/json")
            .timeout(timeout)
            .body(body.to_owned());
        if let Some(token) = &context.token {
            request = request.header("authorization", format!("Bearer {token}"));
        }
        if let Some(bookmark) = &sent_bookmark {
            request = request.header("sqlhttp-bookmark", bookmark);
        }
        if let Some(key) = key {
            request = request.header("idempotency-key", key);
        }
        let (result, body, retry_after) = match request.send().await {
            Err(err) => (transport(&err), None, None),
            Ok(response) => {
                let status = response.status().as_u16();
                let header = |name: &str| {
                    response
                        .headers()
                        .get(name)
                        .and_then(|v| v.to_str().ok())
                        .map(str::to_owned)
                };
                let bookmark = header("sqlhttp-bookmark");
                let served_by = header("sqlhttp-served-by");
                let replayed = header("idempotent-replayed").as_deref() == Some("true");
                let retry_after = header("retry-after")
                    .and_then(|v| v.trim().parse::<u64>().ok())
                    .map(Duration::from_secs);
                match response.text().await {
                    Err(err) => (transport(&err), None, retry_after),
                    Ok(text) => {
                        let value: Option<Value> = serde_json::from_str(&text).ok();
                        let answer = Received {
                            status,
                            bookmark,
                            served_by,
                            replayed,
                        };
                        let result = judge(answer, value.as_ref(), &text, needs_result);
                        (result, value, retry_after)
                    }
                }
            }
        };
        if let AttemptResult::Ok {
            bookmark: Some(bookmark),
            ..
        } = &result
        {
            self.keep(bookmark);
        }
        Answer {
            attempt: Attempt {
                server,
                start_us,
                end_us: context.clock.now_us(),
                sent_bookmark,
                result,
            },
            body,
            retry_after,
        }
    }
}

fn transport(err: &reqwest::Error) -> AttemptResult {
    let kind = if err.is_timeout() {
        TransportKind::Timeout
    } else if err.is_connect() {
        TransportKind::Connect
    } else {
        TransportKind::Broken
    };
    // The whole chain: reqwest's own message rarely says what the socket said.
    let mut message = err.to_string();
    let mut source = std::error::Error::source(err);
    while let Some(cause) = source {
        message.push_str(": ");
        message.push_str(&cause.to_string());
        source = cause.source();
    }
    AttemptResult::Transport { kind, message }
}

/// The head of an answer, as far as the history keeps it.
struct Received {
    status: u16,
    bookmark: Option<String>,
    served_by: Option<String>,
    replayed: bool,
}

/// A whole answer's verdict: a `200` is a success only with a whole body (no `error` member: a
/// streamed body may end with one; with `rows_affected` when `needs_result`, for a statement's
/// answer).
fn judge(answer: Received, value: Option<&Value>, text: &str, needs_result: bool) -> AttemptResult {
    let Received {
        status,
        bookmark,
        served_by,
        replayed,
    } = answer;
    let error = value.and_then(|v| v.get("error"));
    let whole =
        value.is_some_and(|v| v.is_object() && (!needs_result || v.get("rows_affected").is_some()));
    if status == 200 && error.is_none() && whole {
        return AttemptResult::Ok {
            bookmark,
            served_by,
            replayed,
        };
    }
    let field = |name: &str| {
        error
            .and_then(|e| e.get(name))
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned()
    };
    let (code, message) = if error.is_some() {
        (field("code"), field("message"))
    } else {
        (
            "UNPARSED".to_owned(),
            text.chars().take(200).collect::<String>(),
        )
    };
    AttemptResult::Status {
        status,
        code,
        message,
    }
}

/// Whether a write that failed so may be sent again with its key (protocol: 503, 429, 408,
/// 409 IDEMPOTENCY_KEY_IN_USE, transport failures; a keyed 5xx was not stored either).
fn write_may_retry(result: &AttemptResult) -> bool {
    match result {
        AttemptResult::Ok { .. } => false,
        AttemptResult::Transport { .. } => true,
        AttemptResult::Status { status, code, .. } => {
            *status >= 500
                || *status == 429
                || *status == 408
                || (*status == 409 && code == "IDEMPOTENCY_KEY_IN_USE")
        }
    }
}

/// What a transaction's COMMIT (or a statement of it) was answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CommitVerdict {
    /// `200`: committed (a statement: ran).
    Committed,
    /// Lost before it committed, said the server: nothing of it was kept; run it again.
    Lost,
    /// Not answered, or not known yet (`503 OUTCOME_UNKNOWN`, busy, a gateway's `5xx`): send it
    /// again.
    Again,
    /// Anything else: whether it committed is not known.
    Unknown,
}

fn commit_verdict(result: &AttemptResult) -> CommitVerdict {
    match result {
        AttemptResult::Ok { .. } => CommitVerdict::Committed,
        AttemptResult::Transport { .. } => CommitVerdict::Again,
        AttemptResult::Status { status, code, .. } => match (*status, code.as_str()) {
            (410, "TRANSACTION_EXPIRED") | (409, "TRANSACTION_ABORTED") => CommitVerdict::Lost,
            (status, _) if status >= 500 || status == 429 || status == 408 => CommitVerdict::Again,
            _ => CommitVerdict::Unknown,
        },
    }
}

fn backoff(attempt: u32, retry_after: Option<Duration>) -> Duration {
    let exponential = Duration::from_millis(50u64 << attempt.min(5));
    retry_after.unwrap_or(exponential).min(MAX_BACKOFF)
}

/// The statements of a run on `table`.
pub(crate) fn create_table_sql(table: &str) -> String {
    format!("CREATE TABLE {table} (session BIGINT NOT NULL, seq BIGINT NOT NULL)")
}

fn insert_body(table: &str, session: usize, seq: i64) -> String {
    json!({
        "sql": format!("INSERT INTO {table} (session, seq) VALUES (?, ?)"),
        "params": [session, seq],
    })
    .to_string()
}

fn read_body(table: &str, kind: ReadKind, session: usize) -> String {
    match kind {
        ReadKind::Own => json!({
            "sql": format!(
                "SELECT session, count(*), max(seq) FROM {table} WHERE session = ? GROUP BY session"
            ),
            "params": [session],
            "read_only": true,
        }),
        ReadKind::All => json!({
            "sql": format!("SELECT session, count(*), max(seq) FROM {table} GROUP BY session"),
            "read_only": true,
        }),
    }
    .to_string()
}

/// The `(session, count, max)` rows of a read's answer.
fn parse_seen(body: &Value) -> Option<BTreeMap<usize, Seen>> {
    let rows = body.get("rows")?.as_array()?;
    let mut seen = BTreeMap::new();
    for row in rows {
        let cells = row.as_array()?;
        let session = usize::try_from(cells.first()?.as_i64()?).ok()?;
        let count = cells.get(1)?.as_i64()?;
        let max = cells.get(2)?.as_i64()?;
        seen.insert(session, Seen { count, max });
    }
    Some(seen)
}

/// One session of the workload, from its first process to the deadline.
#[derive(Debug)]
pub(crate) struct Session {
    context: Arc<Context>,
    id: usize,
    rng: Rng,
    process: Process,
    turn: usize,
    next_seq: i64,
    /// A proxy in front of each sqlhttpd for this session's transactions alone (a proxy's plan
    /// is one queue for every request through it: shared, another session's request could take
    /// the fault meant for this COMMIT); `None` until first needed, and for a server it cannot
    /// stand in front of (HTTPS, an unresolvable name).
    proxies: Vec<Option<ChaosProxy>>,
}

impl Session {
    /// Session `id`, its first process starting with `bookmark` (the deployment's, say).
    pub(crate) fn new(
        context: Arc<Context>,
        id: usize,
        rng: Rng,
        bookmark: Option<String>,
    ) -> Session {
        let process = context.new_process(bookmark);
        Session {
            turn: id,
            context,
            id,
            rng,
            process,
            next_seq: 0,
            proxies: Vec::new(),
        }
    }

    /// Runs operations until the deadline: about 30% keyed writes, 10% transactional writes
    /// whose COMMIT answer is dropped once (each followed by a read of the session's own rows
    /// when it committed), 30% own reads, 27% reads of everyone, 3% hand-overs (each followed
    /// by a read of the session's own rows).
    pub(crate) async fn run(mut self) {
        while self.context.clock.now_us() < self.context.deadline_us {
            let roll = self.rng.below(100);
            let event = if roll < 30 {
                self.write().await
            } else if roll < 40 {
                let event = self.tx_write().await;
                let committed = matches!(
                    event.op,
                    Op::Write {
                        outcome: WriteOutcome::Acknowledged,
                        ..
                    }
                );
                if committed {
                    self.context.history.push(event);
                    self.read(ReadKind::Own).await
                } else {
                    event
                }
            } else if roll < 70 {
                self.read(ReadKind::Own).await
            } else if roll < 97 {
                self.read(ReadKind::All).await
            } else {
                let event = self.hand_over();
                self.context.history.push(event);
                self.read(ReadKind::Own).await
            };
            self.context.history.push(event);
            let pause = self.rng.between(0, 20);
            tokio::time::sleep(Duration::from_millis(pause)).await;
        }
    }

    fn next_server(&mut self) -> usize {
        self.turn = (self.turn + 1) % self.context.servers.len();
        self.turn
    }

    async fn write(&mut self) -> Event {
        let seq = self.next_seq;
        self.next_seq += 1;
        let context = Arc::clone(&self.context);
        let key = format!("{}-{}-{seq}", context.table, self.id);
        let body = insert_body(&context.table, self.id, seq);
        let start_us = context.clock.now_us();
        let mut attempts = Vec::new();
        let mut outcome = WriteOutcome::Unknown;
        for n in 0..WRITE_ATTEMPTS {
            let server = self.next_server();
            let answer = self
                .process
                .send(&context, server, &body, Some(&key), WRITE_TIMEOUT)
                .await;
            let result = answer.attempt.result.clone();
            attempts.push(answer.attempt);
            if matches!(result, AttemptResult::Ok { .. }) {
                outcome = WriteOutcome::Acknowledged;
                break;
            }
            if !write_may_retry(&result) {
                outcome = WriteOutcome::Refused;
                break;
            }
            tokio::time::sleep(backoff(n, answer.retry_after)).await;
        }
        Event {
            session: self.id,
            process: self.process.id,
            start_us,
            end_us: context.clock.now_us(),
            op: Op::Write {
                seq,
                outcome,
                attempts,
            },
        }
    }

    async fn read(&mut self, kind: ReadKind) -> Event {
        let context = Arc::clone(&self.context);
        let body = read_body(&context.table, kind, self.id);
        let start_us = context.clock.now_us();
        let mut attempts = Vec::new();
        let mut seen = None;
        for n in 0..READ_ATTEMPTS {
            let server = self.next_server();
            let answer = self
                .process
                .send(&context, server, &body, None, READ_TIMEOUT)
                .await;
            let ok = matches!(answer.attempt.result, AttemptResult::Ok { .. });
            let parsed = answer.body.as_ref().and_then(parse_seen);
            let retry_after = answer.retry_after;
            attempts.push(answer.attempt);
            if ok {
                if parsed.is_none() {
                    // A 200 whose rows are not what was asked: recorded as a failed attempt.
                    if let Some(last) = attempts.last_mut() {
                        last.result = AttemptResult::Status {
                            status: 200,
                            code: "UNEXPECTED_ROWS".to_owned(),
                            message: answer.body.map(|b| b.to_string()).unwrap_or_default(),
                        };
                    }
                } else {
                    seen = parsed;
                    break;
                }
            }
            tokio::time::sleep(backoff(n, retry_after)).await;
        }
        Event {
            session: self.id,
            process: self.process.id,
            start_us,
            end_us: context.clock.now_us(),
            op: Op::Read {
                kind,
                seen,
                attempts,
            },
        }
    }

    /// The base URL of this session's proxy in front of `server`, started when first asked for.
    async fn proxy(&mut self, server: usize) -> Option<String> {
        if self.proxies.len() < self.context.servers.len() {
            self.proxies
                .resize_with(self.context.servers.len(), || None);
        }
        if self.proxies[server].is_none() {
            let url = &self.context.servers[server];
            let authority = url.strip_prefix("http://")?.split('/').next()?;
            let addr = tokio::net::lookup_host(authority).await.ok()?.next()?;
            self.proxies[server] = Some(ChaosProxy::start(addr).await.ok()?);
        }
        self.proxies[server].as_ref().map(ChaosProxy::url)
    }

    /// One POST of `body` to the transaction endpoint `path` on `server` through `proxy`.
    async fn step(
        &mut self,
        server: usize,
        proxy: &str,
        path: &str,
        body: &str,
        key: Option<&str>,
    ) -> Answer {
        let context = Arc::clone(&self.context);
        self.process
            .exchange(
                &context,
                Request {
                    server,
                    via: Some(proxy),
                    path,
                    body,
                    key,
                    timeout: WRITE_TIMEOUT,
                },
            )
            .await
    }

    /// The insert of `(session, seq)` in an interactive transaction whose COMMIT the session's
    /// proxy forwards and answers with nothing (the connection closed): the COMMIT is sent
    /// again, to the same sqlhttpd, until it is answered. A run lost before it committed (the
    /// server says so, or it failed before its COMMIT) is run again in a new transaction, on
    /// the next sqlhttpd. Recorded as a write: its attempts are every request of every run.
    async fn tx_write(&mut self) -> Event {
        if self.proxy(0).await.is_none() {
            return self.write().await;
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        let context = Arc::clone(&self.context);
        let counters = &context.transactions;
        TxCounters::add(&counters.writes);
        let start_us = context.clock.now_us();
        let mut attempts = Vec::new();
        let mut outcome = WriteOutcome::Unknown;
        for run in 0..TX_RUNS {
            if run > 0 {
                TxCounters::add(&counters.runs_lost);
                tokio::time::sleep(backoff(run, None)).await;
            }
            let server = self.next_server();
            let Some(proxy) = self.proxy(server).await else {
                continue;
            };
            // Open.
            let answer = self
                .step(server, &proxy, "/api/v1/transaction/open", "{}", None)
                .await;
            let token = answer
                .body
                .as_ref()
                .and_then(|body| body.get("transaction"))
                .and_then(Value::as_str)
                .map(str::to_owned);
            let opened = matches!(answer.attempt.result, AttemptResult::Ok { .. });
            attempts.push(answer.attempt);
            let Some(token) = token.filter(|_| opened) else {
                continue;
            };
            // The insert, sent again under its number while its answer is lost or busy.
            let statement = json!({
                "transaction": token,
                "seq": 1,
                "sql": format!("INSERT INTO {} (session, seq) VALUES (?, ?)", context.table),
                "params": [self.id, seq],
            })
            .to_string();
            let mut inserted = false;
            for n in 0..STATEMENT_ATTEMPTS {
                let answer = self
                    .step(
                        server,
                        &proxy,
                        "/api/v1/transaction/statement",
                        &statement,
                        None,
                    )
                    .await;
                let result = answer.attempt.result.clone();
                attempts.push(answer.attempt);
                inserted = matches!(result, AttemptResult::Ok { .. });
                if inserted || commit_verdict(&result) != CommitVerdict::Again {
                    break;
                }
                tokio::time::sleep(backoff(n, answer.retry_after)).await;
            }
            let end = json!({ "transaction": token }).to_string();
            if !inserted {
                // Never committed: roll it back (or let it expire) and run again.
                let _ = self
                    .step(server, &proxy, "/api/v1/transaction/rollback", &end, None)
                    .await;
                continue;
            }
            // The COMMIT: forwarded, its answer dropped; then sent again until answered.
            let key = format!("{}-{}-{seq}-tx{run}", context.table, self.id);
            if let Some(Some(proxy)) = self.proxies.get(server) {
                proxy.push(Fault::DropAfterForward);
            }
            let mut verdict = CommitVerdict::Unknown;
            let mut last = None;
            for n in 0..WRITE_ATTEMPTS {
                let answer = self
                    .step(
                        server,
                        &proxy,
                        "/api/v1/transaction/commit",
                        &end,
                        Some(&key),
                    )
                    .await;
                let result = answer.attempt.result.clone();
                attempts.push(answer.attempt);
                if n == 0 && matches!(result, AttemptResult::Transport { .. }) {
                    TxCounters::add(&counters.commits_dropped);
                }
                if n > 0 {
                    TxCounters::add(&counters.commits_resent);
                    if let AttemptResult::Ok { bookmark: None, .. } = &result {
                        TxCounters::add(&counters.replays_without_bookmark);
                    }
                }
                verdict = commit_verdict(&result);
                last = Some(result);
                if verdict != CommitVerdict::Again {
                    break;
                }
                tokio::time::sleep(backoff(n, answer.retry_after)).await;
            }
            // A fault left over (the COMMIT never reached the proxy) must not hit a later step.
            if let Some(Some(proxy)) = self.proxies.get(server) {
                proxy.clear();
            }
            match verdict {
                CommitVerdict::Committed => {
                    TxCounters::add(&counters.committed);
                    outcome = WriteOutcome::Acknowledged;
                    break;
                }
                CommitVerdict::Lost => {}
                CommitVerdict::Again | CommitVerdict::Unknown => {
                    if let Some(last) = &last {
                        counters.unknown_commit(last);
                    }
                    break;
                }
            }
        }
        Event {
            session: self.id,
            process: self.process.id,
            start_us,
            end_us: context.clock.now_us(),
            op: Op::Write {
                seq,
                outcome,
                attempts,
            },
        }
    }

    /// Ends this process and starts another with nothing but its bookmark.
    fn hand_over(&mut self) -> Event {
        let at_us = self.context.clock.now_us();
        let bookmark = self.process.bookmark.clone();
        let next = self.context.new_process(bookmark.clone());
        let from = std::mem::replace(&mut self.process, next);
        Event {
            session: self.id,
            process: from.id,
            start_us: at_us,
            end_us: at_us,
            op: Op::HandOver {
                to_process: self.process.id,
                bookmark,
            },
        }
    }
}

/// Creates the run's table through server 0, retrying while the servers start; returns the
/// bookmark of its answer, the one every first process starts with.
pub(crate) async fn create_table(context: &Context) -> Result<Option<String>, String> {
    let mut process = context.new_process(None);
    let body = json!({ "sql": create_table_sql(&context.table) }).to_string();
    let mut last = String::new();
    for n in 0..40 {
        let answer = process
            .send(
                context,
                n % context.servers.len(),
                &body,
                None,
                WRITE_TIMEOUT,
            )
            .await;
        match &answer.attempt.result {
            AttemptResult::Ok { .. } => return Ok(process.bookmark),
            other => last = crate::check::describe(other),
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    Err(format!("cannot create {}: {last}", context.table))
}

/// The final table as the primary holds it, read through server `server` with a request that
/// is not read-only (so it is served by the primary): the count of each `(session, seq)`.
pub(crate) async fn final_table_via(
    context: &Context,
    server: usize,
) -> Result<BTreeMap<(usize, i64), u64>, String> {
    let mut process = context.new_process(None);
    let body = json!({
        "sql": format!(
            "SELECT session, seq, count(*) FROM {} GROUP BY session, seq",
            context.table
        ),
    })
    .to_string();
    let mut last = String::new();
    for _ in 0..20 {
        let answer = process
            .send(context, server, &body, None, READ_TIMEOUT)
            .await;
        if let (AttemptResult::Ok { .. }, Some(body)) = (&answer.attempt.result, &answer.body) {
            return table_rows(body).ok_or_else(|| format!("unexpected rows: {body}"));
        }
        last = crate::check::describe(&answer.attempt.result);
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    Err(format!("cannot read the final table: {last}"))
}

fn table_rows(body: &Value) -> Option<BTreeMap<(usize, i64), u64>> {
    let mut table = BTreeMap::new();
    for row in body.get("rows")?.as_array()? {
        let cells = row.as_array()?;
        let session = usize::try_from(cells.first()?.as_i64()?).ok()?;
        let seq = cells.get(1)?.as_i64()?;
        let count = cells.get(2)?.as_u64()?;
        table.insert((session, seq), count);
    }
    Some(table)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_keeps_the_greatest_bookmark_whatever_the_order() {
        let mut process = Process::new(0, None);
        process.keep("0000000000000010");
        process.keep("00000000000000FF");
        process.keep("0000000000000020");
        process.keep("not a bookmark");
        assert_eq!(process.bookmark.as_deref(), Some("00000000000000ff"));
    }

    #[test]
    fn a_streamed_body_that_ended_with_an_error_is_not_a_success() {
        let body: Value = serde_json::from_str(
            r#"{"columns":[],"rows":[],"error":{"code":"UNAVAILABLE","message":"shutting down"}}"#,
        )
        .unwrap();
        let result = judge(received(None, false), Some(&body), "", true);
        assert!(
            matches!(&result, AttemptResult::Status { code, .. } if code == "UNAVAILABLE"),
            "{result:?}"
        );
        let whole: Value = serde_json::from_str(
            r#"{"columns":[],"rows":[],"rows_affected":1,"last_insert_id":null}"#,
        )
        .unwrap();
        assert!(matches!(
            judge(
                received(Some("0000000000000001"), true),
                Some(&whole),
                "",
                true
            ),
            AttemptResult::Ok { replayed: true, .. }
        ));
    }

    fn received(bookmark: Option<&str>, replayed: bool) -> Received {
        Received {
            status: 200,
            bookmark: bookmark.map(str::to_owned),
            served_by: None,
            replayed,
        }
    }

    #[test]
    fn a_transactions_open_and_commit_succeed_without_a_result() {
        let committed: Value = serde_json::from_str(r#"{"outcome":"committed"}"#).unwrap();
        assert!(matches!(
            judge(received(None, true), Some(&committed), "", false),
            AttemptResult::Ok { replayed: true, .. }
        ));
        // A statement's answer still needs its result.
        assert!(matches!(
            judge(received(None, false), Some(&committed), "", true),
            AttemptResult::Status { status: 200, .. }
        ));
        let error: Value = serde_json::from_str(
            r#"{"error":{"code":"TRANSACTION_EXPIRED","message":"nothing was committed"}}"#,
        )
        .unwrap();
        let mut gone = received(None, false);
        gone.status = 410;
        assert!(matches!(
            judge(gone, Some(&error), "", false),
            AttemptResult::Status { status: 410, code, .. } if code == "TRANSACTION_EXPIRED"
        ));
    }

    #[test]
    fn a_commit_answer_says_whether_the_transaction_committed_was_lost_or_is_unknown() {
        let status = |status: u16, code: &str| AttemptResult::Status {
            status,
            code: code.to_owned(),
            message: String::new(),
        };
        let ok = AttemptResult::Ok {
            bookmark: None,
            served_by: None,
            replayed: true,
        };
        assert_eq!(commit_verdict(&ok), CommitVerdict::Committed);
        assert_eq!(
            commit_verdict(&status(410, "TRANSACTION_EXPIRED")),
            CommitVerdict::Lost
        );
        assert_eq!(
            commit_verdict(&status(409, "TRANSACTION_ABORTED")),
            CommitVerdict::Lost
        );
        assert_eq!(
            commit_verdict(&status(503, "OUTCOME_UNKNOWN")),
            CommitVerdict::Again
        );
        let dropped = AttemptResult::Transport {
            kind: TransportKind::Broken,
            message: String::new(),
        };
        assert_eq!(commit_verdict(&dropped), CommitVerdict::Again);
        assert_eq!(
            commit_verdict(&status(400, "BAD_REQUEST")),
            CommitVerdict::Unknown
        );
    }

    #[test]
    fn writes_retry_only_what_the_protocol_lets_a_keyed_write_retry() {
        let status = |status: u16, code: &str| AttemptResult::Status {
            status,
            code: code.to_owned(),
            message: String::new(),
        };
        assert!(write_may_retry(&status(503, "UNAVAILABLE")));
        assert!(write_may_retry(&status(409, "IDEMPOTENCY_KEY_IN_USE")));
        assert!(!write_may_retry(&status(409, "CONSTRAINT_VIOLATION")));
        assert!(!write_may_retry(&status(422, "IDEMPOTENCY_KEY_REUSED")));
        assert_eq!(backoff(0, None), Duration::from_millis(50));
        assert_eq!(backoff(9, None), MAX_BACKOFF);
        assert_eq!(backoff(0, Some(Duration::from_secs(5))), MAX_BACKOFF);
    }

    #[test]
    fn reads_answer_one_row_per_session_with_rows() {
        let body: Value = serde_json::from_str(r#"{"rows":[[0,3,2],[4,1,0]]}"#).unwrap();
        let seen = parse_seen(&body).unwrap();
        assert_eq!(seen[&0], Seen { count: 3, max: 2 });
        assert_eq!(seen[&4], Seen { count: 1, max: 0 });
        assert!(parse_seen(&serde_json::from_str(r#"{"rows":[["x"]]}"#).unwrap()).is_none());
    }
}
