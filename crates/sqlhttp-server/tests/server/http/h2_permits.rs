//! HTTP/2 stream permits (ADR 0044): clients that give their streams no flow-control window
//! hold responses, and with them permits, until the send timeout. Each connection's first
//! stream runs on its own permit, a stream beyond it takes a shared one counted against its
//! credential (its address when it has none), a request refused by authentication holds none,
//! and when the shared ones run short a connection whose shared-permit response waits on its
//! client is cut within about a second. The servers and clients are `http/tls.rs`'s and
//! `http/https_h2.rs`'s.

use std::time::{Duration, Instant};

use crate::http::https_h2::{h2_client, sql_request};
use crate::http::tls::{certs, https, one, root, sdk};

/// A request maker for [`open_streams`]: `SELECT 1` with `token` as its bearer.
fn select_one_as(
    url: String,
    token: &str,
) -> impl Fn() -> (http::Request<()>, Option<bytes::Bytes>) + use<> {
    let authorization: http::HeaderValue = format!("Bearer {token}").parse().unwrap();
    move || {
        let (mut request, body) = sql_request(&url, "SELECT 1");
        request
            .headers_mut()
            .insert("authorization", authorization.clone());
        (request, Some(body))
    }
}

/// Streams each connection of `send` opens, awaiting every head: the statuses seen.
async fn open_streams(
    send: &mut h2::client::SendRequest<bytes::Bytes>,
    streams: usize,
    request: impl Fn() -> (http::Request<()>, Option<bytes::Bytes>),
    held: &mut Vec<http::Response<h2::RecvStream>>,
) -> Vec<u16> {
    let mut answers = Vec::new();
    for _ in 0..streams {
        let (request, body) = request();
        let (answer, mut stream) = send.send_request(request, body.is_none()).unwrap();
        if let Some(body) = body {
            stream.send_data(body, true).unwrap();
        }
        answers.push(answer);
    }
    let mut statuses = Vec::new();
    for answer in answers {
        let response = tokio::time::timeout(Duration::from_secs(20), answer)
            .await
            .expect("a head within 20 s")
            .unwrap();
        statuses.push(response.status().as_u16());
        held.push(response);
    }
    statuses
}

fn count(statuses: &[u16], status: u16) -> usize {
    statuses.iter().filter(|&&s| s == status).count()
}

/// Issue 36, finding 3: eight anonymous connections of 128 streams that never get window (half
/// of them requests without a token, half probes that need none) took every one of the
/// server-wide permits (`--max-connections`, 1024) for the send timeout, and every other HTTP/2
/// request was answered 503. Now the refused requests hold nothing, the probes hold their
/// connections' own permits and their address's share, and a client with a token is served at
/// once, one request and many at a time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anonymous_streams_starved_of_window_leave_authenticated_clients_served() {
    let dir = certs(&["127.0.0.1"]);
    let server = https(dir.path(), false, |config| {
        config.tokens = vec!["app".into()];
        config.http.send_timeout = Duration::from_secs(30);
    })
    .await;
    let url = server.url();
    let mut attackers = Vec::new();
    let mut held = Vec::new();
    let (mut refused, mut probes) = (Vec::new(), Vec::new());
    for n in 0..8 {
        let (mut send, connection) = h2_client(&server, dir.path(), 0).await;
        if n % 2 == 0 {
            // No token: POST /api/v1/sql, answered 401.
            refused.extend(
                open_streams(
                    &mut send,
                    128,
                    || {
                        let (request, body) = sql_request(&url, "SELECT 1");
                        (request, Some(body))
                    },
                    &mut held,
                )
                .await,
            );
        } else {
            probes.extend(
                open_streams(
                    &mut send,
                    128,
                    || {
                        let request = http::Request::get(format!("{url}/healthz"))
                            .body(())
                            .unwrap();
                        (request, None)
                    },
                    &mut held,
                )
                .await,
            );
        }
        attackers.push((send, connection));
    }
    assert_eq!(count(&refused, 401), 512, "{refused:?}");
    // Each connection's own permit, and 1024 / 8 shared for their one address.
    assert_eq!(count(&probes, 200), 4 + 128, "{probes:?}");
    assert_eq!(count(&probes, 503), 512 - 4 - 128);

    // A client with a token, over HTTP/2 (the SDK's choice when offered): one request...
    let client = sdk(&url)
        .bearer_token("app")
        .add_root_certificate(root(dir.path()))
        .build()
        .unwrap();
    let started = Instant::now();
    assert_eq!(one(&client).await.unwrap(), 42);
    let took = started.elapsed();
    assert!(took < Duration::from_secs(2), "took {took:?}");
    eprintln!("a token holder's request beside 1,024 starved streams: {took:?}");
    // ... and 64 at once on one connection, beyond its own permit.
    let (mut send, connection) = h2_client(&server, dir.path(), 65_535).await;
    let connection = tokio::spawn(connection);
    let mut answers = Vec::new();
    for _ in 0..64 {
        let (mut request, body) = sql_request(&url, "SELECT 41 + 1");
        request
            .headers_mut()
            .insert("authorization", "Bearer app".parse().unwrap());
        let (answer, mut stream) = send.send_request(request, false).unwrap();
        stream.send_data(body, true).unwrap();
        answers.push(answer);
    }
    let mut statuses = Vec::new();
    for answer in answers {
        statuses.push(answer.await.unwrap().status().as_u16());
    }
    assert_eq!(count(&statuses, 200), 64, "{statuses:?}");
    drop(send);
    connection.abort();
    drop(held);
    drop(attackers);
    server.shutdown().await;
}

/// A credential's streams count against its share, not against other credentials': a client
/// with a token of its own that starves 8 x 128 streams of window gets an eighth of the shared
/// permits, and another credential's requests beyond their connection's first still run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_credential_cannot_take_another_credentials_permits() {
    let dir = certs(&["127.0.0.1"]);
    let server = https(dir.path(), false, |config| {
        config.tokens = vec!["app".into()];
        config.read_tokens = vec!["reader".into()];
        config.http.send_timeout = Duration::from_secs(30);
    })
    .await;
    let with_token = |token: &str| select_one_as(server.url(), token);
    let mut attackers = Vec::new();
    let mut held = Vec::new();
    let mut statuses = Vec::new();
    for _ in 0..8 {
        let (mut send, connection) = h2_client(&server, dir.path(), 0).await;
        statuses.extend(open_streams(&mut send, 128, with_token("reader"), &mut held).await);
        attackers.push((send, connection));
    }
    assert_eq!(count(&statuses, 200), 8 + 128);
    assert_eq!(count(&statuses, 503), 1024 - 8 - 128);
    // The other credential holds 64 starved streams on one connection: its own permit and
    // 63 shared ones, all granted.
    let (mut send, connection) = h2_client(&server, dir.path(), 0).await;
    let mut mine = Vec::new();
    let statuses = open_streams(&mut send, 64, with_token("app"), &mut mine).await;
    assert_eq!(count(&statuses, 200), 64, "{statuses:?}");
    drop((mine, send, connection, held, attackers));
    server.shutdown().await;
}

/// When the shared permits run out (here 16 of them, two per holder, taken by eight tokens'
/// starved streams), a connection whose shared-permit response waits on its client is cut
/// after about a second, not the send timeout (30 s), and the permits come back; a connection
/// that holds only its own permit is left alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn starved_streams_give_shared_permits_back_when_they_run_short() {
    let dir = certs(&["127.0.0.1"]);
    let tokens: Vec<String> = (0..9).map(|n| format!("token-{n}")).collect();
    let server = https(dir.path(), false, |config| {
        config.tokens.clone_from(&tokens);
        config.http.max_connections = 16;
        config.http.send_timeout = Duration::from_secs(30);
    })
    .await;
    let with_token = |token: String| select_one_as(server.url(), &token);
    let mut held = Vec::new();
    let mut connections = Vec::new();
    for token in &tokens[..8] {
        let (mut send, connection) = h2_client(&server, dir.path(), 0).await;
        let statuses = open_streams(&mut send, 3, with_token(token.clone()), &mut held).await;
        assert_eq!(statuses, [200, 200, 200]);
        connections.push((send, connection));
    }
    // The ninth token: its connection's own permit is there, no shared one is.
    let (mut send, mut connection) = h2_client(&server, dir.path(), 0).await;
    let mut mine = Vec::new();
    let ninth = with_token(tokens[8].clone());
    assert_eq!(open_streams(&mut send, 1, &ninth, &mut mine).await, [200]);
    let started = Instant::now();
    assert_eq!(open_streams(&mut send, 1, &ninth, &mut mine).await, [503]);
    // The starved connections holding shared permits are cut, well before the send timeout.
    for (_, starved) in connections.iter_mut() {
        let cut = tokio::time::timeout(Duration::from_secs(5), starved).await;
        assert!(cut.is_ok(), "a starved connection stays open");
    }
    let took = started.elapsed();
    assert!(took < Duration::from_secs(5), "cut after {took:?}");
    eprintln!("starved shared-permit connections cut {took:?} after the refusal");
    assert!(
        !connection.is_finished(),
        "the connection holding only its own permit was cut"
    );
    assert_eq!(
        open_streams(&mut send, 2, &ninth, &mut mine).await,
        [200, 200]
    );
    drop((mine, held, send));
    connection.abort();
    let _ = (&mut connection).await;
    // And a client that reads its answers is served as before.
    let client = sdk(&server.url())
        .bearer_token(tokens[0].clone())
        .add_root_certificate(root(dir.path()))
        .build()
        .unwrap();
    assert_eq!(one(&client).await.unwrap(), 42);
    server.shutdown().await;
}
