//! Peers on the wire: how a request for an interactive transaction is forwarded, signed, to the
//! peer (another sqlhttpd process on the same database) that holds it, and how the peer checks
//! it and proves its answer (ADR 0036, "Replicas forward", as amended by issue 35 and ADR 0058).
//! Where a peer is reached, whether it lives, the peer secret and the client are the
//! transaction layer's (`transactions::peers`).
//!
//! - **A forwarded request** ([`forward`]) carries no client credential. It names the target
//!   instance, the owner's identity and the credential's role, with a time and a nonce, and a
//!   HMAC-SHA256 under the secret over those, the path, the body's digest and the
//!   Idempotency-Key. The receiver ([`serve`], from `credentials::authenticate`, for the
//!   forwarded transaction endpoints only) checks the MAC in constant time, that the target is
//!   its own instance, that the time is within `REPLAY_WINDOW` of its clock and that the
//!   nonce is new; then it serves the request as the owner's (`401` otherwise, as for a wrong
//!   token).
//! - **The answer** carries the holder's MAC over its instance, the request's MAC, its status,
//!   the headers passed back and the body's digest. The forwarder passes back only an answer
//!   that proves so; any other (a stand-in listening on a dead peer's address) counts as a
//!   dead holder.
//!
//! Knows HTTP and the MACs; nothing about how transactions are kept (the caller says which
//! instance holds a token), either engine's SQL, or client tokens (a forwarded request's
//! credential is vouched for by `auth::Tokens::vouched`).

use std::error::Error as _;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::Request;
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use hmac::Mac;
use sha2::{Digest as _, Sha256};

use crate::engine::keyed::now_millis;
use crate::http::credentials::{Credential, Identity, Role};
use crate::http::{ATTEMPT, IDEMPOTENCY_KEY, IDEMPOTENT_REPLAYED};
use crate::protocol::bookmark::{BOOKMARK_HEADER, SERVED_BY_HEADER};
use crate::protocol::error::{ApiError, ErrorCode};
use crate::state::{AppState, Shared};
use crate::transactions::peers::{HmacSha256, REPLAY_WINDOW, Secret};

/// How long a forwarded request may take past the statement timeout.
const FORWARD_MARGIN: Duration = Duration::from_secs(5);

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

/// The paths a request may be forwarded to (the transaction endpoints that name a token: the
/// protocol's, as `http::transaction` routes them).
const FORWARDED_PATHS: [&str; 4] = [
    sqlhttp_protocol::path::TRANSACTION_STATEMENT,
    sqlhttp_protocol::path::TRANSACTION_COMMIT,
    sqlhttp_protocol::path::TRANSACTION_ROLLBACK,
    sqlhttp_protocol::path::TRANSACTION_OUTCOME,
];

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
    let url = match peers.reach(holder).await {
        Ok(Some(url)) => url,
        Ok(None) => return Forwarded::Here,
        Err(()) => return Forwarded::Unknown,
    };
    let Ok(uri) = format!("{url}{path}").parse::<Uri>() else {
        return Forwarded::Here;
    };
    // The holder is alive: without the secret it cannot be asked, and its answer not trusted.
    let Some(secret) = peers.secret().await else {
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
    let response = match tokio::time::timeout_at(deadline, peers.client().request(request)).await {
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
/// has `then` run it as the credential the peer vouches for, its answer carrying this process's
/// proof; `Err` with the `401` when the proof does not hold.
pub(crate) async fn serve<Then, Ran>(
    state: &AppState,
    request: Request,
    then: Then,
) -> Result<Response, Response>
where
    Then: FnOnce(Request) -> Ran,
    Ran: Future<Output = Response>,
{
    let shared = &state.inner;
    let peers = &shared.peers;
    if !FORWARDED_PATHS.contains(&request.uri().path()) {
        return Err(refused_peer("not a path requests are forwarded to"));
    }
    let Some(secret) = peers.secret().await else {
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
    if claim.target != peers.instance() {
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
    let response = then(Request::from_parts(parts, Body::from(bytes))).await;
    let mut signed = sign(response, &secret, peers.instance(), &mac, shared).await;
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
            path: sqlhttp_protocol::path::TRANSACTION_COMMIT,
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
        let secret = Secret::of([7; 32]);
        let nonce = [1; 16];
        let mac: [u8; 32] = claim(&nonce).mac(&secret).finalize().into_bytes().into();
        assert!(!claim(&nonce).fails(&secret, &mac));
        assert!(claim(&nonce).fails(&Secret::of([8; 32]), &mac));
        let changed: [fn(&mut Claim<'static>); 8] = [
            |c| c.target = "0badcaff",
            |c| c.path = sqlhttp_protocol::path::TRANSACTION_ROLLBACK,
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
        let secret = Secret::of([7; 32]);
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
