//! Peers: the sqlhttpd processes that serve one database, and how they trust each other when
//! one forwards a request for an interactive transaction to the process that holds it (ADR
//! 0036, "Replicas forward", as amended by issue 35).
//!
//! - **Where a process is reached** ([`advertise`], [`leave`]): a process with `--advertise-url`
//!   stores `{"url", "heartbeat"}` under `sqlhttp replica <instance>` in the engine's
//!   idempotency store when its first transaction opens, then again every [`HEARTBEAT_EVERY`]
//!   from a task of its own, and at a graceful shutdown stores it with a heartbeat of 0. A
//!   record whose heartbeat is older than [`DEAD_AFTER`] names a dead process: nothing is
//!   forwarded to it, and the commit record answers.
//! - **The peer secret**: 256 random bits under `sqlhttp peer secret` (see
//!   `engine::keyed::PEER_SECRET_KEY`: each engine stores it at start unless it is there),
//!   read once by each process, never shown to a client. The store's keys hold a space: no
//!   client's Idempotency-Key can name them, and clients can reach the store through neither
//!   engine.
//! - **A forwarded request** ([`forward`]) carries no client credential. It names the target
//!   instance, the owner's identity and the credential's role, with a time and a nonce, and a
//!   HMAC-SHA256 under the secret over those, the path, the body's digest and the
//!   Idempotency-Key. The receiver ([`serve`], from `credentials::authenticate`, for the
//!   forwarded transaction endpoints only) checks the MAC in constant time, that the target is
//!   its own instance, that the time is within [`REPLAY_WINDOW`] of its clock and that the
//!   nonce is new; then it serves the request as the owner's (`401` otherwise, as for a wrong
//!   token).
//! - **The answer** carries the holder's MAC over its instance, the request's MAC, its status,
//!   the headers passed back and the body's digest. The forwarder passes back only an answer
//!   that proves so; any other (a stand-in listening on a dead peer's address) counts as a
//!   dead holder.
//!
//! - **A silent process commits nothing** ([`Peers::fit_to_commit`]): its own heartbeat is
//!   what the others judge it by, so once its last stored heartbeat is [`STALE_AFTER`] old
//!   (the database did not take it: a lost connection, SQLite's write lock held) it rolls back
//!   every transaction it holds before it would run a COMMIT, and again before it says it is
//!   alive once more. The others answer "nothing committed" only past [`DEAD_AFTER`]; what is
//!   left is a COMMIT already running when the heartbeat fell silent that runs on past the gap
//!   between the two.
//!
//! Knows HTTP, the MACs, and the records' form through the engine contract's record calls;
//! nothing about how transactions are kept (the caller says which instance holds a token),
//! either engine's SQL, or client tokens (a forwarded request's credential is vouched for by
//! `auth::Tokens::vouched`).

use std::collections::{HashSet, VecDeque};
use std::error::Error as _;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::Request;
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode, Uri, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use hmac::{Hmac, KeyInit, Mac};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};
use tokio::sync::{OnceCell, watch};

use crate::engine::keyed::{PEER_SECRET_KEY, millis, now_millis, peer_secret_hash};
use crate::engine::{Backend, Engine as _};
use crate::http::credentials::{Credential, Identity, Role};
use crate::http::{ATTEMPT, IDEMPOTENCY_KEY, IDEMPOTENT_REPLAYED};
use crate::protocol::bookmark::{BOOKMARK_HEADER, SERVED_BY_HEADER};
use crate::protocol::error::{ApiError, ErrorCode};
use crate::state::{AppState, Shared};

/// How often a process with `--advertise-url` stores its record again.
pub(crate) const HEARTBEAT_EVERY: Duration = Duration::from_secs(1);

/// A record whose heartbeat is older than this names a dead process.
pub(crate) const DEAD_AFTER: Duration = Duration::from_secs(5);

/// A process whose own last stored heartbeat is older than this commits nothing more of what it
/// holds: it rolls its open transactions back (see [`Peers::fit_to_commit`]), well before the
/// others take it for dead at [`DEAD_AFTER`] and answer its transactions from their commit
/// records ("nothing committed"), so that answer never meets a COMMIT it runs afterwards.
pub(crate) const STALE_AFTER: Duration = Duration::from_secs(3);

/// How far a forwarded request's time may be from the receiver's clock.
pub(crate) const REPLAY_WINDOW: Duration = Duration::from_secs(5);

/// How long connecting to a holder may take: past it, it cannot be reached.
pub(crate) const CONNECT_WITHIN: Duration = Duration::from_secs(1);

/// How long a forwarded request may take past the statement timeout.
const FORWARD_MARGIN: Duration = Duration::from_secs(5);

/// The most nonces kept to refuse a replay (the oldest go first past it; a replay must also
/// fall within [`REPLAY_WINDOW`]).
const MAX_NONCES: usize = 1 << 16;

/// Marks a request one process forwarded to the one holding its transaction: never forwarded
/// again.
const FORWARDED: HeaderName = HeaderName::from_static("sqlhttp-forwarded");
/// The instance a forwarded request is for.
const TARGET: HeaderName = HeaderName::from_static("sqlhttp-peer-target");
/// The identity of the credential the forwarder authenticated (32 hex digits).
const OWNER: HeaderName = HeaderName::from_static("sqlhttp-peer-owner");
/// That credential's role: `read_write` or `read_only`.
const ROLE: HeaderName = HeaderName::from_static("sqlhttp-peer-role");
/// When the request was forwarded, in milliseconds since the epoch.
const TIME: HeaderName = HeaderName::from_static("sqlhttp-peer-time");
/// 128 random bits (32 hex digits), new for each forwarded request.
const NONCE: HeaderName = HeaderName::from_static("sqlhttp-peer-nonce");
/// The request's MAC (64 hex digits).
const MAC: HeaderName = HeaderName::from_static("sqlhttp-peer-mac");
/// The answer's MAC (64 hex digits).
const ANSWER_MAC: HeaderName = HeaderName::from_static("sqlhttp-peer-answer");

/// The answer's headers passed back to the client, each bound by the answer's MAC.
const PASSED_BACK: [HeaderName; 5] = [
    header::CONTENT_TYPE,
    IDEMPOTENT_REPLAYED,
    header::RETRY_AFTER,
    HeaderName::from_static(BOOKMARK_HEADER),
    HeaderName::from_static(SERVED_BY_HEADER),
];

/// The paths a request may be forwarded to (the transaction endpoints that name a token).
const FORWARDED_PATHS: [&str; 4] = [
    crate::http::transaction::STATEMENT_PATH,
    crate::http::transaction::COMMIT_PATH,
    crate::http::transaction::ROLLBACK_PATH,
    crate::http::transaction::OUTCOME_PATH,
];

type HmacSha256 = Hmac<Sha256>;

/// The peer secret.
#[derive(Clone, Copy)]
struct Secret([u8; 32]);

impl Secret {
    /// The MAC of `fields` (each length-prefixed, after a tag naming what they are).
    fn mac(&self, tag: &str, fields: &[&[u8]]) -> HmacSha256 {
        let mut mac = <HmacSha256 as KeyInit>::new_from_slice(&self.0)
            .unwrap_or_else(|_| unreachable!("HMAC takes a key of any length"));
        for field in std::iter::once(&tag.as_bytes()).chain(fields) {
            let len = u32::try_from(field.len()).unwrap_or(u32::MAX);
            mac.update(&len.to_be_bytes());
            mac.update(field);
        }
        mac
    }
}

/// One process's record in the store.
#[derive(Debug, Serialize, Deserialize)]
struct Record {
    url: String,
    /// When it was last stored, in milliseconds since the epoch; 0 once the process left.
    heartbeat: i64,
}

/// The key under which process `instance` stores its record.
fn record_key(instance: &str) -> String {
    format!("sqlhttp replica {instance}")
}

/// A record's identity.
fn record_hash() -> [u8; 32] {
    Sha256::digest(b"sqlhttp replica").into()
}

/// The running heartbeat task, and how to stop it.
struct Heartbeat {
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

/// Nonces of forwarded requests served within the replay window, oldest first.
#[derive(Default)]
struct Nonces {
    seen: HashSet<[u8; 16]>,
    order: VecDeque<(i64, [u8; 16])>,
}

impl Nonces {
    /// Whether `nonce` is new (then it is kept until `until`, in milliseconds).
    fn first(&mut self, nonce: [u8; 16], until: i64, now: i64) -> bool {
        while let Some(&(expiry, old)) = self.order.front() {
            if expiry >= now && self.order.len() < MAX_NONCES {
                break;
            }
            self.order.pop_front();
            self.seen.remove(&old);
        }
        if !self.seen.insert(nonce) {
            return false;
        }
        self.order.push_back((until, nonce));
        true
    }
}

/// This process among its peers: its instance, where it is reached, the peer secret, its
/// heartbeat, and the nonces it has served.
pub(crate) struct Peers {
    instance: String,
    advertise: Option<String>,
    secret: OnceCell<Secret>,
    beating: AtomicBool,
    /// When this process's record was last stored (its heartbeat's time, milliseconds since
    /// the epoch; 0 before the first).
    last_beat: AtomicI64,
    heartbeat: tokio::sync::Mutex<Option<Heartbeat>>,
    nonces: Mutex<Nonces>,
    client: Client<HttpConnector, Body>,
}

impl fmt::Debug for Peers {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Peers")
            .field("instance", &self.instance)
            .field("advertise", &self.advertise)
            .finish_non_exhaustive()
    }
}

impl Peers {
    /// The peers of process `instance`, reached at `advertise` when given.
    pub(crate) fn new(instance: String, advertise: Option<String>) -> Peers {
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(CONNECT_WITHIN));
        connector.set_nodelay(true);
        Peers {
            instance,
            advertise,
            secret: OnceCell::new(),
            beating: AtomicBool::new(false),
            last_beat: AtomicI64::new(0),
            heartbeat: tokio::sync::Mutex::new(None),
            nonces: Mutex::new(Nonces::default()),
            client: Client::builder(TokioExecutor::new()).build(connector),
        }
    }

    /// The peer secret, read from the store once; `None` (logged) when it cannot be read.
    async fn secret(&self, engine: &Backend) -> Option<Secret> {
        let read = self
            .secret
            .get_or_try_init(|| async {
                match engine.recorded(PEER_SECRET_KEY.to_owned()).await {
                    Ok(Some(stored))
                        if stored.request_hash == peer_secret_hash() && stored.body.len() == 32 =>
                    {
                        let mut secret = [0; 32];
                        secret.copy_from_slice(&stored.body);
                        Ok(Secret(secret))
                    }
                    Ok(_) => Err("the store holds no peer secret".to_owned()),
                    Err(err) => Err(err.message),
                }
            })
            .await;
        match read {
            Ok(secret) => Some(*secret),
            Err(error) => {
                tracing::warn!(%error, "cannot read the peer secret");
                None
            }
        }
    }

    /// Where process `instance` is reached, when its heartbeat is fresh and it is not this one;
    /// `Err` when its record cannot be read (then whether it lives is not known).
    async fn reach(&self, engine: &Backend, instance: &str) -> Result<Option<String>, ()> {
        let Some(stored) = engine.recorded(record_key(instance)).await.map_err(drop)? else {
            return Ok(None);
        };
        Ok(self.fresh(instance, &stored))
    }

    /// Where process `instance` is reached, from its record `stored`, when its heartbeat is
    /// fresh and it is not this one.
    fn fresh(&self, instance: &str, stored: &crate::engine::keyed::Stored) -> Option<String> {
        if stored.request_hash != record_hash() {
            return None;
        }
        // A record of an earlier version (a bare URL, stored every ten minutes) does not parse:
        // such a process could not check a peer's MAC anyway.
        let record: Record = serde_json::from_slice(&stored.body).ok()?;
        if now_millis().saturating_sub(record.heartbeat) >= millis(DEAD_AFTER) {
            tracing::debug!(instance, "a peer's heartbeat stopped: not forwarded there");
            return None;
        }
        (self.advertise.as_deref() != Some(record.url.as_str())).then_some(record.url)
    }

    /// Whether this process may commit what it holds: it forwards nothing (no
    /// `--advertise-url`: no other process answers for its transactions), or its own last
    /// stored heartbeat is younger than [`STALE_AFTER`].
    pub(crate) fn fit_to_commit(&self) -> bool {
        if self.advertise.is_none() {
            return true;
        }
        let last = self.last_beat.load(Ordering::Acquire);
        last != 0 && now_millis().saturating_sub(last) < millis(STALE_AFTER)
    }

    /// Whether `nonce`, sent at `time`, was not served before.
    fn first_use(&self, nonce: [u8; 16], time: i64, now: i64) -> bool {
        self.nonces
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .first(nonce, time.saturating_add(millis(REPLAY_WINDOW)), now)
    }
}

/// Stores this process's record with `heartbeat`.
async fn store(
    engine: &Backend,
    instance: &str,
    url: &str,
    heartbeat: i64,
) -> Result<(), ApiError> {
    let record = Record {
        url: url.to_owned(),
        heartbeat,
    };
    let body = serde_json::to_vec(&record).map_err(|_| ApiError::internal())?;
    engine
        .store_record(record_key(instance), record_hash(), body)
        .await
}

/// Stores where the other processes reach this one, before its first transaction opens, and
/// starts the heartbeat that stores it again every [`HEARTBEAT_EVERY`] (until [`leave`]).
pub(crate) async fn advertise(shared: &Arc<Shared>) {
    let peers = &shared.peers;
    let Some(url) = &peers.advertise else { return };
    if peers.beating.load(Ordering::Acquire) {
        return;
    }
    let mut heartbeat = peers.heartbeat.lock().await;
    if heartbeat.is_some() {
        return;
    }
    let first = now_millis();
    if let Err(err) = store(&shared.engine, &peers.instance, url, first).await {
        tracing::warn!(error = %err.message, "cannot record this process's --advertise-url");
        return;
    }
    peers.last_beat.store(first, Ordering::Release);
    let (stop, mut stopped) = watch::channel(false);
    let owner = Arc::downgrade(shared);
    let task = tokio::spawn(async move {
        let mut failing = false;
        loop {
            tokio::select! {
                () = tokio::time::sleep(HEARTBEAT_EVERY) => {}
                _ = stopped.changed() => return,
            }
            let Some(shared) = owner.upgrade() else {
                return;
            };
            let peers = &shared.peers;
            let url = peers.advertise.as_deref().unwrap_or_default();
            let beat = now_millis();
            match store(&shared.engine, &peers.instance, url, beat).await {
                Ok(()) => {
                    failing = false;
                    // After a silence the others may have taken for death, nothing held
                    // across it commits: rolled back before this process says it is alive.
                    let last = peers.last_beat.load(Ordering::Acquire);
                    if beat.saturating_sub(last) >= millis(STALE_AFTER) {
                        tracing::warn!(
                            silent_ms = beat.saturating_sub(last),
                            "this process's heartbeat was silent: its open transactions are \
                             rolled back"
                        );
                        shared.transactions.expire_all().await;
                    }
                    peers.last_beat.store(beat, Ordering::Release);
                }
                Err(err) if !failing => {
                    failing = true;
                    tracing::warn!(
                        error = %err.message,
                        "cannot store this process's heartbeat: past {} s the other processes \
                         take it for dead",
                        DEAD_AFTER.as_secs()
                    );
                }
                Err(_) => {}
            }
        }
    });
    *heartbeat = Some(Heartbeat { stop, task });
    peers.beating.store(true, Ordering::Release);
}

/// Stops the heartbeat and marks this process's record gone (a graceful shutdown, once its
/// transactions have ended): the other processes answer from the commit records at once.
pub(crate) async fn leave(shared: &Shared) {
    let peers = &shared.peers;
    let Some(url) = &peers.advertise else { return };
    let Some(Heartbeat { stop, task }) = peers.heartbeat.lock().await.take() else {
        return;
    };
    let _ = stop.send(true);
    // Its store in flight lands first: none comes after the one below.
    let _ = task.await;
    if let Err(err) = store(&shared.engine, &peers.instance, url, 0).await {
        tracing::debug!(error = %err.message, "cannot mark this process's record gone");
    }
}

/// What a request for another process's transaction came to.
pub(crate) enum Forwarded {
    /// The holder's answer, proven to be its own: pass it back.
    Answer(Response),
    /// Answer here: the request was forwarded already, or the holder is gone (no fresh
    /// heartbeat, nothing listens on its address, or what answers there cannot prove to be it).
    Here,
    /// The holder is alive (its heartbeat is fresh) but did not answer: what it did is unknown.
    Unknown,
}

/// A forwarded request's claim: what its MAC covers.
struct Claim<'a> {
    target: &'a str,
    path: &'a str,
    body: [u8; 32],
    key: &'a [u8],
    owner: Identity,
    role: Role,
    time: i64,
    nonce: [u8; 16],
}

impl Claim<'_> {
    fn mac(&self, secret: &Secret) -> HmacSha256 {
        secret.mac(
            "sqlhttp peer request 1",
            &[
                self.target.as_bytes(),
                self.path.as_bytes(),
                &self.body,
                self.key,
                self.owner.to_string().as_bytes(),
                role_name(self.role).as_bytes(),
                self.time.to_string().as_bytes(),
                &self.nonce,
            ],
        )
    }

    /// Whether `mac` is not this claim's (compared in constant time).
    fn fails(&self, secret: &Secret, mac: &[u8; 32]) -> bool {
        self.mac(secret).verify_slice(mac).is_err()
    }
}

/// The MAC of an answer from `instance` to the request whose MAC is `request`.
fn answer_mac(
    secret: &Secret,
    instance: &str,
    request: &[u8],
    status: StatusCode,
    headers: &HeaderMap,
    body: &[u8],
) -> HmacSha256 {
    let values: Vec<&[u8]> = PASSED_BACK
        .iter()
        .map(|name| headers.get(name).map_or(&b""[..], HeaderValue::as_bytes))
        .collect();
    let status = status.as_u16().to_be_bytes();
    let digest: [u8; 32] = Sha256::digest(body).into();
    let mut fields: Vec<&[u8]> = vec![instance.as_bytes(), request, &status, &digest];
    fields.extend(values);
    secret.mac("sqlhttp peer answer 1", &fields)
}

fn role_name(role: Role) -> &'static str {
    match role {
        Role::ReadWrite => "read_write",
        Role::ReadOnly => "read_only",
    }
}

fn role_of(name: &str) -> Option<Role> {
    match name {
        "read_write" => Some(Role::ReadWrite),
        "read_only" => Some(Role::ReadOnly),
        _ => None,
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex<const N: usize>(text: &[u8]) -> Option<[u8; N]> {
    if text.len() != 2 * N {
        return None;
    }
    let digit = |c: u8| {
        char::from(c)
            .to_digit(16)
            .and_then(|d| u8::try_from(d).ok())
    };
    let mut out = [0; N];
    for (byte, pair) in out.iter_mut().zip(text.chunks(2)) {
        *byte = digit(pair[0])? << 4 | digit(pair[1])?;
    }
    Some(out)
}

/// Whether `error` is a refused connection: nothing listens on the address.
fn refused(error: &hyper_util::client::legacy::Error) -> bool {
    let mut cause = error.source();
    while let Some(inner) = cause {
        if let Some(io) = inner.downcast_ref::<std::io::Error>() {
            return io.kind() == std::io::ErrorKind::ConnectionRefused;
        }
        cause = inner.source();
    }
    false
}

/// Forwards the request for a transaction of process `holder` (to `path`, with `body`) for
/// `credential`, once, signed; says why not when it was not answered there.
pub(crate) async fn forward(
    shared: &Shared,
    headers: &HeaderMap,
    credential: &Credential,
    holder: &str,
    path: &str,
    body: Bytes,
) -> Forwarded {
    if headers.contains_key(FORWARDED) {
        return Forwarded::Here;
    }
    let peers = &shared.peers;
    let url = match peers.reach(&shared.engine, holder).await {
        Ok(Some(url)) => url,
        Ok(None) => return Forwarded::Here,
        Err(()) => return Forwarded::Unknown,
    };
    let Ok(uri) = format!("{url}{path}").parse::<Uri>() else {
        return Forwarded::Here;
    };
    // The holder is alive: without the secret it cannot be asked, and its answer not trusted.
    let Some(secret) = peers.secret(&shared.engine).await else {
        return Forwarded::Unknown;
    };
    let claim = Claim {
        target: holder,
        path,
        body: Sha256::digest(&body).into(),
        key: headers
            .get(IDEMPOTENCY_KEY)
            .map_or(b"", HeaderValue::as_bytes),
        owner: credential.identity,
        role: credential.role,
        time: now_millis(),
        nonce: rand::random(),
    };
    let mac = claim.mac(&secret).finalize().into_bytes();
    let mut request = axum::http::Request::post(uri)
        .header(header::CONTENT_TYPE, "application/json")
        .header(FORWARDED, "1")
        .header(TARGET, holder)
        .header(OWNER, credential.identity.to_string())
        .header(ROLE, role_name(credential.role))
        .header(TIME, claim.time.to_string())
        .header(NONCE, hex(&claim.nonce))
        .header(MAC, hex(&mac));
    // Never the client's `Authorization`: the MAC vouches for the credential.
    for name in [IDEMPOTENCY_KEY, ATTEMPT] {
        if let Some(value) = headers.get(&name) {
            request = request.header(name, value);
        }
    }
    let Ok(request) = request.body(Body::from(body)) else {
        return Forwarded::Here;
    };
    let within = shared
        .limits
        .statement_timeout
        .saturating_add(FORWARD_MARGIN);
    let deadline = tokio::time::Instant::now() + within;
    let response = match tokio::time::timeout_at(deadline, peers.client.request(request)).await {
        Ok(Ok(response)) => response,
        Ok(Err(e)) if e.is_connect() && refused(&e) => {
            tracing::debug!(url, error = %e, "nothing listens where a peer was: it is gone");
            return Forwarded::Here;
        }
        Ok(Err(e)) => {
            tracing::warn!(url, error = %e, "a live peer holding a transaction did not answer");
            return Forwarded::Unknown;
        }
        Err(_) => {
            tracing::warn!(
                url,
                "a live peer holding a transaction did not answer in time"
            );
            return Forwarded::Unknown;
        }
    };
    let (parts, answer) = response.into_parts();
    let limit = shared.limits.max_result_bytes.saturating_add(1 << 20);
    // The holder's answer is read whole (its proof covers all of it) within the server's
    // budget, and holds its share until it has been passed back; one the budget cannot hold
    // now is not known here (send again).
    let read = super::body::read_limited(Body::new(answer), &parts.headers, limit, &shared.budget);
    let Ok(Ok((answer, held))) = tokio::time::timeout_at(deadline, read).await else {
        return Forwarded::Unknown;
    };
    let proven = parts
        .headers
        .get(ANSWER_MAC)
        .and_then(|value| unhex::<32>(value.as_bytes()))
        .is_some_and(|proof| {
            answer_mac(&secret, holder, &mac, parts.status, &parts.headers, &answer)
                .verify_slice(&proof)
                .is_ok()
        });
    if !proven {
        // The holder's heartbeat is fresh: what answered may be it, unable to sign (at its
        // connection cap, out of memory for the body, a panic), or a stand-in. Either way what
        // it did is not known until its heartbeat goes stale.
        tracing::warn!(
            url,
            status = parts.status.as_u16(),
            "what answers where a live peer is cannot prove to be it: its outcome is unknown"
        );
        return Forwarded::Unknown;
    }
    let mut relayed = Response::new(Body::new(super::body::Holding::new(answer, held)));
    *relayed.status_mut() = parts.status;
    for name in PASSED_BACK {
        if let Some(value) = parts.headers.get(&name) {
            relayed.headers_mut().insert(name, value.clone());
        }
    }
    Forwarded::Answer(relayed)
}

/// Whether a request says another sqlhttpd forwarded it (it carries a peer's MAC): then
/// [`serve`] authenticates it, never a bearer token.
pub(crate) fn is_forwarded(headers: &HeaderMap) -> bool {
    headers.contains_key(MAC)
}

fn refused_peer(why: &str) -> Response {
    tracing::debug!(why, "a forwarded request refused");
    ApiError::new(
        ErrorCode::Unauthorized,
        "this request does not carry a valid proof from another sqlhttpd",
    )
    .into_response()
}

/// The claim a forwarded request's headers make, with its MAC.
fn claim_of<'a>(
    headers: &'a HeaderMap,
    path: &'a str,
    body: &[u8],
) -> Option<(Claim<'a>, [u8; 32])> {
    let text = |name: &HeaderName| headers.get(name).and_then(|v| v.to_str().ok());
    Some((
        Claim {
            target: text(&TARGET)?,
            path,
            body: Sha256::digest(body).into(),
            key: headers
                .get(IDEMPOTENCY_KEY)
                .map_or(b"", HeaderValue::as_bytes),
            owner: Identity::parse(text(&OWNER)?)?,
            role: role_of(text(&ROLE)?)?,
            time: text(&TIME)?.parse().ok()?,
            nonce: unhex(headers.get(NONCE)?.as_bytes())?,
        },
        unhex(headers.get(MAC)?.as_bytes())?,
    ))
}

/// Serves a request another sqlhttpd forwarded (see [`is_forwarded`]): checks its proof and
/// runs it as the credential the peer vouches for, its answer carrying this process's proof;
/// `Err` with the `401` when the proof does not hold.
pub(crate) async fn serve(
    state: &AppState,
    request: Request,
    next: Next,
) -> Result<Response, Response> {
    let shared = &state.inner;
    let peers = &shared.peers;
    if !FORWARDED_PATHS.contains(&request.uri().path()) {
        return Err(refused_peer("not a path requests are forwarded to"));
    }
    let Some(secret) = peers.secret(&shared.engine).await else {
        return Ok(ApiError::unavailable(
            "this server cannot check a forwarded request now (the peer secret cannot be \
             read); send the request again",
        )
        .into_response());
    };
    let (mut parts, body) = request.into_parts();
    let (bytes, held) = match super::body::read_within(
        body,
        &parts.headers,
        shared.max_body_bytes,
        &shared.budget,
        shared.body_timeout,
    )
    .await
    {
        Ok(read) => read,
        Err(err) => return Ok(err.into_response()),
    };
    let path = parts.uri.path().to_owned();
    let Some((claim, mac)) = claim_of(&parts.headers, &path, &bytes) else {
        return Err(refused_peer("missing or malformed peer headers"));
    };
    if claim.fails(&secret, &mac) {
        return Err(refused_peer("wrong MAC"));
    }
    if claim.target != peers.instance {
        return Err(refused_peer("for another instance"));
    }
    let now = now_millis();
    if now.abs_diff(claim.time) > REPLAY_WINDOW.as_millis().try_into().unwrap_or(u64::MAX) {
        return Err(refused_peer("outside the replay window"));
    }
    if !peers.first_use(claim.nonce, claim.time, now) {
        return Err(refused_peer("a nonce served before"));
    }
    let credential = shared.tokens.vouched(claim.owner, claim.role);
    drop(held);
    parts.extensions.insert(credential);
    let response = next
        .run(Request::from_parts(parts, Body::from(bytes)))
        .await;
    let mut signed = sign(response, &secret, &peers.instance, &mac, shared).await;
    signed.extensions_mut().insert(credential.label);
    Ok(signed)
}

/// `response` with this process's proof (see [`answer_mac`]) for the request whose MAC is
/// `request`.
async fn sign(
    response: Response,
    secret: &Secret,
    instance: &str,
    request: &[u8; 32],
    shared: &Shared,
) -> Response {
    let (mut parts, body) = response.into_parts();
    let limit = shared.limits.max_result_bytes.saturating_add(1 << 20);
    let bytes = match axum::body::to_bytes(body, limit).await {
        Ok(bytes) => bytes,
        Err(e) => {
            tracing::warn!(error = %e, "cannot read back an answer to a forwarded request");
            let (failed, body) = ApiError::unavailable(
                "the answer to this forwarded request could not be sent; send it again",
            )
            .into_response()
            .into_parts();
            parts = failed;
            match axum::body::to_bytes(body, usize::MAX).await {
                Ok(bytes) => bytes,
                Err(_) => Bytes::new(),
            }
        }
    };
    let proof = answer_mac(
        secret,
        instance,
        request,
        parts.status,
        &parts.headers,
        &bytes,
    )
    .finalize()
    .into_bytes();
    if let Ok(value) = HeaderValue::from_str(&hex(&proof)) {
        parts.headers.insert(ANSWER_MAC, value);
    }
    parts.headers.remove(header::CONTENT_LENGTH);
    Response::from_parts(parts, Body::from(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim(nonce: &[u8; 16]) -> Claim<'static> {
        Claim {
            target: "0badcafe",
            path: crate::http::transaction::COMMIT_PATH,
            body: Sha256::digest(b"{}").into(),
            key: b"",
            owner: Identity::of_token_digest(&[3; 32]),
            role: Role::ReadWrite,
            time: 1_000,
            nonce: *nonce,
        }
    }

    #[test]
    fn a_claim_verifies_under_its_secret_only_and_every_field_counts() {
        let secret = Secret([7; 32]);
        let nonce = [1; 16];
        let mac: [u8; 32] = claim(&nonce).mac(&secret).finalize().into_bytes().into();
        assert!(!claim(&nonce).fails(&secret, &mac));
        assert!(claim(&nonce).fails(&Secret([8; 32]), &mac));
        let changed: [fn(&mut Claim<'static>); 8] = [
            |c| c.target = "0badcaff",
            |c| c.path = crate::http::transaction::ROLLBACK_PATH,
            |c| c.body = Sha256::digest(b"{ }").into(),
            |c| c.key = b"k",
            |c| c.owner = Identity::ANONYMOUS,
            |c| c.role = Role::ReadOnly,
            |c| c.time = 1_001,
            |c| c.nonce = [2; 16],
        ];
        for change in changed {
            let mut other = claim(&nonce);
            change(&mut other);
            assert!(other.fails(&secret, &mac));
        }
    }

    #[test]
    fn an_answer_proof_binds_its_instance_request_status_headers_and_body() {
        let secret = Secret([7; 32]);
        let mut headers = HeaderMap::new();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        headers.insert(
            BOOKMARK_HEADER,
            HeaderValue::from_static("0000000000000001"),
        );
        let proof: [u8; 32] = answer_mac(&secret, "a", &[1; 32], StatusCode::OK, &headers, b"{}")
            .finalize()
            .into_bytes()
            .into();
        let verifies =
            |instance: &str, request: &[u8], status, headers: &HeaderMap, body: &[u8]| {
                answer_mac(&secret, instance, request, status, headers, body)
                    .verify_slice(&proof)
                    .is_ok()
            };
        assert!(verifies("a", &[1; 32], StatusCode::OK, &headers, b"{}"));
        assert!(!verifies("b", &[1; 32], StatusCode::OK, &headers, b"{}"));
        assert!(!verifies("a", &[2; 32], StatusCode::OK, &headers, b"{}"));
        assert!(!verifies("a", &[1; 32], StatusCode::GONE, &headers, b"{}"));
        assert!(!verifies("a", &[1; 32], StatusCode::OK, &headers, b"{ }"));
        let mut other = headers.clone();
        other.insert(
            BOOKMARK_HEADER,
            HeaderValue::from_static("0000000000000002"),
        );
        assert!(!verifies("a", &[1; 32], StatusCode::OK, &other, b"{}"));
        other.remove(BOOKMARK_HEADER);
        assert!(!verifies("a", &[1; 32], StatusCode::OK, &other, b"{}"));
    }

    #[test]
    fn a_nonce_is_served_once_within_its_window() {
        let mut nonces = Nonces::default();
        assert!(nonces.first([1; 16], 5_000, 0));
        assert!(!nonces.first([1; 16], 5_000, 10));
        assert!(nonces.first([2; 16], 5_000, 10));
        // Past its window it is forgotten (the time check refuses it by then).
        assert!(nonces.first([1; 16], 20_000, 6_000));
        assert_eq!(nonces.order.len(), 1);
    }

    #[test]
    fn hex_reads_back_and_refuses_what_is_not() {
        let bytes = [0x00, 0x7f, 0xab, 0xff];
        assert_eq!(hex(&bytes), "007fabff");
        assert_eq!(unhex::<4>(b"007fabff"), Some(bytes));
        assert_eq!(unhex::<4>(b"007fab"), None);
        assert_eq!(unhex::<4>(b"007fabfg"), None);
        assert_eq!(unhex::<4>(b"+07fabff"), None);
    }

    #[test]
    fn roles_read_back() {
        for role in [Role::ReadWrite, Role::ReadOnly] {
            assert_eq!(role_of(role_name(role)), Some(role));
        }
        assert_eq!(role_of("admin"), None);
    }
}
