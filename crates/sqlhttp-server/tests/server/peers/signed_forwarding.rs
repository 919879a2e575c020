//! Peers proving who they are (issue 35, finding 6): two servers on one database (a SQLite
//! file, or a PostgreSQL database), each with its `--advertise-url`. A request for a transaction
//! the other one holds is forwarded without the client's token and signed with the peer
//! secret, and only an answer the holder proves is passed back. A holder that died (here: its
//! runtime dropped, as a killed process leaves everything) is not believed whatever now listens
//! on its address (an answer it does not sign is `OUTCOME_UNKNOWN` while its heartbeat is
//! fresh), and its address is not waited for: the commit record answers once its heartbeat is
//! stale, `503` (`OUTCOME_UNKNOWN` for a COMMIT) while it may still be alive.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sqlhttp_server::{Config, Server, ServerHandle};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

use crate::common::{TempDb, http_client, post_over_http};
use crate::engines::{Engine, on_both_engines};

on_both_engines!(
    a_stand_in_on_a_dead_peers_address_gets_no_token_and_is_not_believed,
    an_address_that_drops_packets_is_not_waited_for,
    forwarding_between_live_peers_is_proven_both_ways,
    a_token_the_other_server_revoked_is_refused_there_and_nothing_is_forwarded,
);

/// The client's token: it must never reach anything but the server it was sent to.
const TOKEN: &str = "peers-test-token-7f3a9c51e2";
const BEARER: (&str, &str) = ("authorization", "Bearer peers-test-token-7f3a9c51e2");

/// How long a dead peer's heartbeat stays fresh (`peers::DEAD_AFTER`), with a margin.
const STALE_AFTER: Duration = Duration::from_millis(6_500);

/// A configuration with [`TOKEN`] for a database two servers share, with what keeps it alive;
/// `None` without PostgreSQL.
async fn shared(engine: Engine) -> Option<(Config, Option<TempDb>)> {
    let (config, file) = match engine {
        Engine::Sqlite => {
            let file = TempDb::new("peers");
            let config = Config {
                database: file.database(),
                ..Config::default()
            };
            (config, Some(file))
        }
        Engine::Postgres => {
            let url = crate::engines::database("peers").await?;
            (crate::engines::config(&url), None)
        }
    };
    Some((
        Config {
            tokens: vec![TOKEN.to_owned()],
            ..config
        },
        file,
    ))
}

/// A free loopback address.
fn free_addr() -> SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

fn at(config: &Config, addr: SocketAddr) -> Config {
    Config {
        listen: addr,
        advertise_url: Some(format!("http://{addr}")),
        ..config.clone()
    }
}

/// A server of `config` at `addr`, advertising it, in a task of this runtime.
async fn live(config: &Config, addr: SocketAddr) -> ServerHandle {
    Server::bind(at(config, addr)).await.unwrap().spawn()
}

/// A server on a runtime of its own, so it can die as a killed process does: no graceful
/// shutdown, its record left in the store as its last heartbeat wrote it.
struct Doomed {
    runtime: Option<tokio::runtime::Runtime>,
}

impl Doomed {
    async fn start(config: &Config, addr: SocketAddr) -> Doomed {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let (ready, bound) = tokio::sync::oneshot::channel();
        let config = at(config, addr);
        runtime.spawn(async move {
            let server = Server::bind(config).await.unwrap();
            let _ = ready.send(());
            let _ = server.serve_until(std::future::pending()).await;
        });
        bound.await.unwrap();
        Doomed {
            runtime: Some(runtime),
        }
    }

    /// Dies at once: every task dropped where it stands.
    fn crash(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

impl Drop for Doomed {
    fn drop(&mut self) {
        self.crash();
    }
}

/// Binds `addr` once the process that held it let it go.
async fn rebind(addr: SocketAddr) -> tokio::net::TcpSocket {
    let started = Instant::now();
    loop {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.set_reuseaddr(true).unwrap();
        if socket.bind(addr).is_ok() {
            return socket;
        }
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{addr} still taken"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// An HTTP server on a dead peer's address that answers every request `200
/// {"outcome":"committed"}` (with a made-up proof), keeping what it received.
struct StandIn {
    received: Arc<Mutex<Vec<Vec<u8>>>>,
}

impl StandIn {
    async fn start(addr: SocketAddr) -> StandIn {
        let listener = rebind(addr).await.listen(64).unwrap();
        let received = Arc::new(Mutex::new(Vec::new()));
        let kept = Arc::clone(&received);
        tokio::spawn(async move {
            loop {
                let Ok((mut stream, _)) = listener.accept().await else {
                    return;
                };
                let kept = Arc::clone(&kept);
                tokio::spawn(async move {
                    let mut request = Vec::new();
                    let mut buf = [0_u8; 4096];
                    // Headers, then as much body as they announce.
                    loop {
                        let Ok(n) = stream.read(&mut buf).await else {
                            return;
                        };
                        if n == 0 {
                            return;
                        }
                        request.extend_from_slice(&buf[..n]);
                        let text = String::from_utf8_lossy(&request).to_ascii_lowercase();
                        if let Some(end) = text.find("\r\n\r\n") {
                            let length = text
                                .lines()
                                .find_map(|l| l.strip_prefix("content-length:"))
                                .and_then(|v| v.trim().parse::<usize>().ok())
                                .unwrap_or(0);
                            if request.len() >= end + 4 + length {
                                break;
                            }
                        }
                    }
                    kept.lock().unwrap().push(request);
                    let body = r#"{"outcome":"committed"}"#;
                    let answer = format!(
                        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\
                         sqlhttp-peer-answer: {}\r\ncontent-length: {}\r\n\
                         connection: close\r\n\r\n{body}",
                        "0".repeat(64),
                        body.len()
                    );
                    let _ = stream.write_all(answer.as_bytes()).await;
                });
            }
        });
        StandIn { received }
    }

    fn requests(&self) -> Vec<String> {
        self.received
            .lock()
            .unwrap()
            .iter()
            .map(|r| String::from_utf8_lossy(r).into_owned())
            .collect()
    }
}

/// A listener on `addr` that accepts nothing, its queue full: every further connection's
/// packets are dropped, as on a host that went away. Keep what it returns alive.
async fn black_hole(addr: SocketAddr) -> (tokio::net::TcpListener, Vec<tokio::net::TcpStream>) {
    let listener = rebind(addr).await.listen(0).unwrap();
    let mut queued = Vec::new();
    for _ in 0..16 {
        match tokio::time::timeout(
            Duration::from_millis(300),
            tokio::net::TcpStream::connect(addr),
        )
        .await
        {
            Ok(Ok(stream)) => queued.push(stream),
            Ok(Err(e)) => panic!("{e}"),
            Err(_) => return (listener, queued),
        }
    }
    panic!("the listen queue of {addr} never filled");
}

/// POSTs `body` to `path` at `addr` with `headers`: the status, the headers and the JSON body.
async fn post(
    addr: SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
    body: &Value,
) -> (u16, reqwest::header::HeaderMap, Value) {
    let (status, headers, bytes) = post_over_http(
        &http_client(),
        &format!("http://{addr}"),
        path,
        headers,
        body,
    )
    .await;
    (
        status,
        headers,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}

const OPEN: &str = "/api/v1/transaction/open";
const STATEMENT: &str = "/api/v1/transaction/statement";
const COMMIT: &str = "/api/v1/transaction/commit";
const OUTCOME: &str = "/api/v1/transaction/outcome";

/// Creates `t` through `addr`, opens a transaction on `addr` and inserts one row in it: its
/// token.
async fn open_with_a_row(addr: SocketAddr) -> String {
    let (status, _, body) = post(
        addr,
        "/api/v1/sql",
        &[BEARER],
        &json!({"sql": "CREATE TABLE IF NOT EXISTS t (x INTEGER)"}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let (status, _, body) = post(addr, OPEN, &[BEARER], &json!({})).await;
    assert_eq!(status, 200, "{body}");
    let token = body["transaction"].as_str().unwrap().to_owned();
    let (status, _, body) = post(
        addr,
        STATEMENT,
        &[BEARER],
        &json!({"transaction": token, "seq": 1, "sql": "INSERT INTO t VALUES (1)"}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    token
}

async fn count(addr: SocketAddr) -> i64 {
    let (status, _, body) = post(
        addr,
        "/api/v1/sql",
        &[BEARER],
        &json!({"sql": "SELECT count(*) FROM t"}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    body["rows"][0][0].as_i64().unwrap()
}

async fn a_stand_in_on_a_dead_peers_address_gets_no_token_and_is_not_believed(engine: Engine) {
    let Some((config, _file)) = shared(engine).await else {
        return;
    };
    let (a, b) = (free_addr(), free_addr());
    let mut holder = Doomed::start(&config, a).await;
    let other = live(&config, b).await;
    let token = open_with_a_row(a).await;

    holder.crash();
    let stand_in = StandIn::start(a).await;
    let started = Instant::now();
    let (status, _, body) = post(b, COMMIT, &[BEARER], &json!({"transaction": token})).await;
    // While the holder's heartbeat is fresh, an answer it does not sign could be its own (at its
    // connection cap, say): what it did is not known. The stand-in's `200` is never believed.
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (503, Some("OUTCOME_UNKNOWN")),
        "not the stand-in's answer: {body}"
    );
    assert!(started.elapsed() < Duration::from_secs(3));
    let requests = stand_in.requests();
    assert!(
        !requests.is_empty(),
        "the record was fresh: the request went to the address"
    );
    for request in &requests {
        let lower = request.to_ascii_lowercase();
        assert!(!lower.contains("authorization"), "{request}");
        assert!(!request.contains(TOKEN), "{request}");
        assert!(lower.contains("sqlhttp-peer-mac"), "{request}");
    }
    // Once its heartbeat is stale, the holder is dead: the commit record answers.
    tokio::time::sleep(STALE_AFTER).await;
    let (status, _, body) = post(b, COMMIT, &[BEARER], &json!({"transaction": token})).await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (410, Some("TRANSACTION_EXPIRED")),
        "the commit record answers, not the stand-in: {body}"
    );
    let (status, _, body) = post(b, OUTCOME, &[BEARER], &json!({"transaction": token})).await;
    assert_eq!((status, &body), (200, &json!({"outcome": "expired"})));
    assert_eq!(count(b).await, 0, "nothing of it was committed");
    other.shutdown().await;
}

async fn an_address_that_drops_packets_is_not_waited_for(engine: Engine) {
    let Some((config, _file)) = shared(engine).await else {
        return;
    };
    let (a, b) = (free_addr(), free_addr());
    let mut holder = Doomed::start(&config, a).await;
    let other = live(&config, b).await;
    let token = open_with_a_row(a).await;

    holder.crash();
    let died = Instant::now();
    let _hole = black_hole(a).await;

    // Its heartbeat is fresh: it may be alive, and may still commit. Never "nothing committed".
    let started = Instant::now();
    let named = json!({"transaction": token});
    let step = json!({"transaction": token, "seq": 2, "sql": "INSERT INTO t VALUES (2)"});
    let (commit, statement, outcome) = tokio::join!(
        post(b, COMMIT, &[BEARER], &named),
        post(b, STATEMENT, &[BEARER], &step),
        post(b, OUTCOME, &[BEARER], &named),
    );
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "not waited for: {:?}",
        started.elapsed()
    );
    assert!(died.elapsed() < STALE_AFTER, "the test ran too slowly");
    assert_eq!(
        (commit.0, commit.2["error"]["code"].as_str()),
        (503, Some("OUTCOME_UNKNOWN")),
        "{}",
        commit.2
    );
    assert_eq!(
        (statement.0, statement.2["error"]["code"].as_str()),
        (503, Some("UNAVAILABLE")),
        "{}",
        statement.2
    );
    assert_eq!(
        (outcome.0, &outcome.2),
        (200, &json!({"outcome": "unknown"}))
    );

    // Its heartbeat went stale: it is dead, and the commit record answers at once.
    tokio::time::sleep(STALE_AFTER.saturating_sub(died.elapsed())).await;
    let started = Instant::now();
    let (status, _, body) = post(b, COMMIT, &[BEARER], &named).await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (410, Some("TRANSACTION_EXPIRED")),
        "{body}"
    );
    assert!(started.elapsed() < Duration::from_secs(1));
    assert_eq!(count(b).await, 0);
    other.shutdown().await;
}

async fn forwarding_between_live_peers_is_proven_both_ways(engine: Engine) {
    let Some((config, _file)) = shared(engine).await else {
        return;
    };
    let (a, b) = (free_addr(), free_addr());
    let holder = live(&config, a).await;
    let other = live(&config, b).await;
    let token = open_with_a_row(a).await;

    // Every later step reaches the other server, which forwards it to the holder.
    let (status, _, body) = post(
        b,
        STATEMENT,
        &[BEARER],
        &json!({"transaction": token, "seq": 2, "sql": "INSERT INTO t VALUES (2)"}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let (status, _, body) = post(
        b,
        STATEMENT,
        &[BEARER],
        &json!({"transaction": token, "seq": 3, "sql": "SELECT count(*) FROM t"}),
    )
    .await;
    assert_eq!((status, &body["rows"]), (200, &json!([[2]])), "{body}");
    let (status, headers, body) = post(b, COMMIT, &[BEARER], &json!({"transaction": token})).await;
    assert_eq!((status, &body["outcome"]), (200, &json!("committed")));
    assert!(
        !headers.contains_key("sqlhttp-peer-answer"),
        "the proof is between the servers"
    );
    if engine == Engine::Postgres {
        assert!(
            headers.contains_key("sqlhttp-bookmark"),
            "the holder's bookmark is passed back: {headers:?}"
        );
    }
    let (status, headers, body) = post(b, COMMIT, &[BEARER], &json!({"transaction": token})).await;
    assert_eq!((status, &body["outcome"]), (200, &json!("committed")));
    assert_eq!(
        headers
            .get("idempotent-replayed")
            .map(|v| v.to_str().unwrap()),
        Some("true")
    );
    assert_eq!(count(b).await, 2);
    // Without the token nothing is forwarded: the other server refuses it first.
    let (status, _, _) = post(b, OUTCOME, &[], &json!({"transaction": token})).await;
    assert_eq!(status, 401);

    // A holder that shuts down marks its record gone: nothing is sent to its address after.
    let token = open_with_a_row(a).await;
    holder.shutdown().await;
    let stand_in = StandIn::start(a).await;
    let (status, _, body) = post(b, COMMIT, &[BEARER], &json!({"transaction": token})).await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (410, Some("TRANSACTION_EXPIRED")),
        "{body}"
    );
    assert!(stand_in.requests().is_empty());
    assert_eq!(count(b).await, 2);
    other.shutdown().await;
}

/// A token one server was restarted without (revoked there, still accepted by the holder) is
/// refused by that server before anything is forwarded: the caller is found first, then the
/// route, so the holder's transaction neither moves nor loses a step to the refused attempts,
/// and its owner still drives it where the token holds.
async fn a_token_the_other_server_revoked_is_refused_there_and_nothing_is_forwarded(
    engine: Engine,
) {
    let Some((config, _file)) = shared(engine).await else {
        return;
    };
    let (a, b) = (free_addr(), free_addr());
    let holder = live(&config, a).await;
    let revoked = Config {
        tokens: vec!["peers-test-another-token-1b2c".to_owned()],
        ..config.clone()
    };
    let other = live(&revoked, b).await;
    let token = open_with_a_row(a).await;

    for (path, body) in [
        (
            STATEMENT,
            json!({"transaction": token, "seq": 2, "sql": "INSERT INTO t VALUES (2)"}),
        ),
        (COMMIT, json!({"transaction": token})),
        (OUTCOME, json!({"transaction": token})),
        (
            "/api/v1/transaction/rollback",
            json!({"transaction": token}),
        ),
    ] {
        let (status, _, answer) = post(b, path, &[BEARER], &body).await;
        // This server's own refusal of the token, not a holder's refusal passed back.
        assert_eq!(
            (
                status,
                answer["error"]["code"].as_str(),
                answer["error"]["message"].as_str()
            ),
            (
                401,
                Some("UNAUTHORIZED"),
                Some("the bearer token is not valid")
            ),
            "{path}: {answer}"
        );
    }
    // The holder saw none of it: step 2 is still the next, and only the first row is there.
    let (status, _, body) = post(
        a,
        STATEMENT,
        &[BEARER],
        &json!({"transaction": token, "seq": 2, "sql": "SELECT count(*) FROM t"}),
    )
    .await;
    assert_eq!((status, &body["rows"]), (200, &json!([[1]])), "{body}");
    let (status, _, body) = post(a, COMMIT, &[BEARER], &json!({"transaction": token})).await;
    assert_eq!(
        (status, &body["outcome"]),
        (200, &json!("committed")),
        "{body}"
    );
    assert_eq!(count(a).await, 1);
    other.shutdown().await;
    holder.shutdown().await;
}

/// The proof a forwarded request carries, as `http::peers` computes it: HMAC-SHA256 under the
/// peer secret of a tag and the fields, each length-prefixed.
fn request_mac(secret: &[u8], fields: &[&[u8]]) -> String {
    use hmac::{KeyInit as _, Mac as _};
    let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(secret).unwrap();
    for field in std::iter::once(&&b"sqlhttp peer request 1"[..]).chain(fields) {
        mac.update(&u32::try_from(field.len()).unwrap().to_be_bytes());
        mac.update(field);
    }
    mac.finalize()
        .into_bytes()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn now_millis() -> i64 {
    i64::try_from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis(),
    )
    .unwrap()
}

/// A forwarded request's headers for `target`, signed with `secret` over `body` (the
/// anonymous identity: an open server's).
fn signed(
    secret: &[u8],
    target: &str,
    path: &str,
    body: &Value,
    time: i64,
    nonce: &str,
) -> Vec<(&'static str, String)> {
    use sha2::Digest as _;
    let owner = b"sqlhttp-anonymus"
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect::<String>();
    let digest = sha2::Sha256::digest(body.to_string().as_bytes());
    let nonce_bytes: Vec<u8> = (0..16)
        .map(|i| u8::from_str_radix(&nonce[2 * i..2 * i + 2], 16).unwrap())
        .collect();
    let time_text = time.to_string();
    let mac = request_mac(
        secret,
        &[
            target.as_bytes(),
            path.as_bytes(),
            &digest,
            b"",
            owner.as_bytes(),
            b"read_write",
            time_text.as_bytes(),
            &nonce_bytes,
        ],
    );
    vec![
        ("sqlhttp-forwarded", "1".to_owned()),
        ("sqlhttp-peer-target", target.to_owned()),
        ("sqlhttp-peer-owner", owner),
        ("sqlhttp-peer-role", "read_write".to_owned()),
        ("sqlhttp-peer-time", time_text),
        ("sqlhttp-peer-nonce", nonce.to_owned()),
        ("sqlhttp-peer-mac", mac),
    ]
}

fn borrowed<'a>(headers: &'a [(&'static str, String)]) -> Vec<(&'static str, &'a str)> {
    headers.iter().map(|(n, v)| (*n, v.as_str())).collect()
}

/// A holder whose heartbeat falls silent long enough for the others to take it for dead
/// commits nothing it held: they answer its transaction from the commit record ("nothing
/// committed"), and its own COMMIT afterwards must say the same. On SQLite the silence is its
/// own write transaction, which holds the database's one write lock its heartbeat needs.
#[tokio::test]
async fn a_holder_whose_heartbeat_falls_silent_commits_nothing() {
    let Some((mut config, _file)) = shared(Engine::Sqlite).await else {
        return;
    };
    // The holder's write transaction stays idle past STALE_AFTER: the writer's idle bound
    // (ADR 0042) must not end it first.
    config.limits.transaction_write_idle = Duration::from_secs(60);
    let (a, b) = (free_addr(), free_addr());
    let _holder = live(&config, a).await;
    let _other = live(&config, b).await;
    let token = open_with_a_row(a).await;
    tokio::time::sleep(STALE_AFTER).await;
    // The other server takes the silent holder for dead, but cannot make "nothing committed"
    // final while the holder's write transaction holds the lock its tombstone needs: busy.
    let (status, _, body) = post(b, COMMIT, &[BEARER], &json!({"transaction": token})).await;
    assert_eq!(status, 503, "{body}");
    let (status, _, body) = post(a, COMMIT, &[BEARER], &json!({"transaction": token})).await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (410, Some("TRANSACTION_EXPIRED")),
        "the holder must not commit what the other server said was not committed: {body}"
    );
    assert_eq!(count(a).await, 0);
    // With the lock free, the other server's answer is final, and the same.
    let (status, _, body) = post(b, COMMIT, &[BEARER], &json!({"transaction": token})).await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (410, Some("TRANSACTION_EXPIRED")),
        "{body}"
    );
}

/// A request that claims to come from another server without a valid proof is `401`, bearer
/// token or not; a valid one is served once.
#[tokio::test]
async fn a_forwarded_request_without_a_valid_proof_is_refused() {
    let file = TempDb::new("peer-proof");
    let config = Config {
        database: file.database(),
        tokens: vec![TOKEN.to_owned()],
        ..Config::default()
    };
    let addr = free_addr();
    let server = live(&config, addr).await;
    let token = open_with_a_row(addr).await;
    let target = token.split('.').next().unwrap().to_owned();
    let named = json!({"transaction": token});
    let forged = signed(
        &[0; 32],
        &target,
        COMMIT,
        &named,
        now_millis(),
        &"ab".repeat(16),
    );

    // A made-up proof, with or without a token: refused, and nothing committed.
    for with_token in [false, true] {
        let mut headers = borrowed(&forged);
        if with_token {
            headers.push(BEARER);
        }
        let (status, _, body) = post(addr, COMMIT, &headers, &named).await;
        assert_eq!(
            (status, body["error"]["code"].as_str()),
            (401, Some("UNAUTHORIZED"))
        );
    }
    // Peer headers with a malformed or missing MAC, or on a path nothing is forwarded to.
    let mut malformed = borrowed(&forged);
    malformed.retain(|(n, _)| *n != "sqlhttp-peer-mac");
    let (status, _, _) = post(addr, COMMIT, &malformed, &named).await;
    assert_eq!(status, 401, "no MAC, no token");
    malformed.push(("sqlhttp-peer-mac", "not hex"));
    let (status, _, _) = post(addr, COMMIT, &malformed, &named).await;
    assert_eq!(status, 401);
    let sql = json!({"sql": "SELECT 1"});
    let on_sql = signed(
        &[0; 32],
        &target,
        "/api/v1/sql",
        &sql,
        now_millis(),
        &"cd".repeat(16),
    );
    let mut headers = borrowed(&on_sql);
    headers.push(BEARER);
    let (status, _, _) = post(addr, "/api/v1/sql", &headers, &sql).await;
    assert_eq!(status, 401);
    let (status, _, body) = post(addr, OUTCOME, &[BEARER], &named).await;
    assert_eq!((status, &body), (200, &json!({"outcome": "open"})));
    server.shutdown().await;

    // With the database's own secret (an open server, so the anonymous identity owns it): a
    // stale time, another target, a changed body are refused; the real one is served once.
    let config = Config {
        tokens: Vec::new(),
        ..config
    };
    let server = live(&config, addr).await;
    let (status, _, body) = post(addr, OPEN, &[], &json!({})).await;
    assert_eq!(status, 200, "{body}");
    let token = body["transaction"].as_str().unwrap().to_owned();
    let target = token.split('.').next().unwrap().to_owned();
    let named = json!({"transaction": token});
    let secret: Vec<u8> = rusqlite::Connection::open(file.path())
        .unwrap()
        .query_row(
            "SELECT body FROM _sqlhttp_idempotency WHERE key = 'sqlhttp peer secret'",
            [],
            |row| row.get(0),
        )
        .unwrap();
    assert_eq!(secret.len(), 32);
    let now = now_millis();
    let stale = signed(
        &secret,
        &target,
        COMMIT,
        &named,
        now - 60_000,
        &"01".repeat(16),
    );
    let elsewhere = signed(&secret, "0badcafe", COMMIT, &named, now, &"02".repeat(16));
    let other_body = signed(&secret, &target, COMMIT, &json!({}), now, &"03".repeat(16));
    for refused in [&stale, &elsewhere, &other_body] {
        let (status, _, _) = post(addr, COMMIT, &borrowed(refused), &named).await;
        assert_eq!(status, 401);
    }
    let valid = signed(&secret, &target, COMMIT, &named, now, &"04".repeat(16));
    let (status, headers, body) = post(addr, COMMIT, &borrowed(&valid), &named).await;
    assert_eq!((status, &body["outcome"]), (200, &json!("committed")));
    assert!(headers.contains_key("sqlhttp-peer-answer"), "{headers:?}");
    let (status, _, _) = post(addr, COMMIT, &borrowed(&valid), &named).await;
    assert_eq!(status, 401, "a replay is refused");
    server.shutdown().await;
}
