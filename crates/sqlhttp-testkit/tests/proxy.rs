//! `ChaosProxy` end to end: a hand-written upstream behind the proxy and a real HTTP client
//! (reqwest, or raw TCP where the wire bytes matter) in front of it, one test per fault; then a
//! balanced proxy in front of several upstreams, some of them down.

mod support;

use std::io;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use sqlhttp_testkit::{ChaosProxy, Fault};
use support::{Upstream, http_client, io_kind};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

async fn proxy_for(upstream: &Upstream) -> ChaosProxy {
    ChaosProxy::start(upstream.addr()).await.unwrap()
}

/// Polls `check` up to 500 times, 2 ms apart; panics if it never holds.
async fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    for _ in 0..500 {
        if check() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    panic!("never happened: {what}");
}

/// Sends raw bytes to `addr` and reads until the proxy closes (bounded).
async fn raw_exchange(addr: std::net::SocketAddr, request: &[u8]) -> io::Result<String> {
    let mut stream = TcpStream::connect(addr).await?;
    stream.write_all(request).await?;
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut out))
        .await
        .map_err(|_| io::Error::from(io::ErrorKind::TimedOut))??;
    Ok(String::from_utf8_lossy(&out).into_owned())
}

#[tokio::test]
async fn pass_forwards_once_with_connection_close_both_ways() {
    let upstream = Upstream::start().await;
    let proxy = proxy_for(&upstream).await;
    let http = http_client();

    let response = http
        .post(format!("{}/api/v1/sql", proxy.url()))
        .header("content-type", "application/json")
        .body(r#"{"sql":"SELECT 1"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["x-upstream"], "yes");
    assert_eq!(response.headers()["connection"], "close");
    assert_eq!(response.text().await.unwrap(), "hello");

    let seen = upstream.requests();
    assert_eq!(seen.len(), 1);
    assert!(
        seen[0].starts_with("POST /api/v1/sql HTTP/1.1\r\n"),
        "{}",
        seen[0]
    );
    assert!(seen[0].contains("\r\nconnection: close\r\n"), "{}", seen[0]);
    assert!(
        seen[0].ends_with("\r\n\r\n{\"sql\":\"SELECT 1\"}"),
        "{}",
        seen[0]
    );
    assert_eq!(
        (proxy.connections(), proxy.requests(), proxy.forwarded()),
        (1, 1, 1)
    );
}

#[tokio::test]
async fn every_request_gets_its_own_connection() {
    let upstream = Upstream::start().await;
    let proxy = proxy_for(&upstream).await;
    let http = http_client();
    for _ in 0..3 {
        let response = http.get(proxy.url()).send().await.unwrap();
        assert_eq!(response.text().await.unwrap(), "hello");
    }
    assert_eq!(
        (proxy.connections(), proxy.requests(), proxy.forwarded()),
        (3, 3, 3)
    );
    assert_eq!(upstream.served(), 3);
}

#[tokio::test]
async fn faults_are_consumed_in_order_then_requests_pass() {
    let upstream = Upstream::start().await;
    let proxy = proxy_for(&upstream).await;
    proxy.push_all([Fault::status(502), Fault::Pass, Fault::status(504)]);
    let http = http_client();

    let mut statuses = Vec::new();
    for _ in 0..4 {
        statuses.push(
            http.get(proxy.url())
                .send()
                .await
                .unwrap()
                .status()
                .as_u16(),
        );
    }
    assert_eq!(statuses, [502, 200, 504, 200]);
    assert_eq!(upstream.served(), 2);
    assert_eq!(
        (proxy.requests(), proxy.forwarded(), proxy.pending()),
        (4, 2, 0)
    );
}

#[tokio::test]
async fn clear_drops_the_remaining_plan() {
    let upstream = Upstream::start().await;
    let proxy = proxy_for(&upstream).await;
    proxy.push_all([Fault::status(503), Fault::status(503)]);
    proxy.clear();
    assert_eq!(proxy.pending(), 0);
    let response = http_client().get(proxy.url()).send().await.unwrap();
    assert_eq!(response.status(), 200);
}

#[tokio::test]
async fn close_before_forward_fails_the_request_and_the_upstream_never_sees_it() {
    let upstream = Upstream::start().await;
    let proxy = proxy_for(&upstream).await;
    proxy.push(Fault::CloseBeforeForward);
    let http = http_client();

    let error = http.get(proxy.url()).send().await.unwrap_err();
    assert!(error.is_request() && !error.is_connect(), "{error:?}");
    assert_eq!(
        (proxy.requests(), proxy.forwarded(), upstream.served()),
        (1, 0, 0)
    );

    assert!(http.get(proxy.url()).send().await.is_ok());
    assert_eq!(upstream.served(), 1);
}

#[tokio::test]
async fn reset_before_forward_resets_the_connection() {
    let upstream = Upstream::start().await;
    let proxy = proxy_for(&upstream).await;
    proxy.push(Fault::ResetBeforeForward);

    let error = http_client().get(proxy.url()).send().await.unwrap_err();
    assert!(!error.is_connect(), "{error:?}");
    assert_eq!(
        io_kind(&error),
        Some(io::ErrorKind::ConnectionReset),
        "{error:?}"
    );
    assert_eq!(
        (proxy.requests(), proxy.forwarded(), upstream.served()),
        (1, 0, 0)
    );
}

#[tokio::test]
async fn drop_after_forward_loses_the_response_of_work_that_was_done() {
    let upstream = Upstream::start().await;
    let proxy = proxy_for(&upstream).await;
    proxy.push(Fault::DropAfterForward);

    let error = http_client()
        .post(proxy.url())
        .body("write")
        .send()
        .await
        .unwrap_err();
    assert!(error.is_request() && !error.is_connect(), "{error:?}");
    assert_eq!(upstream.served(), 1);
    assert_eq!((proxy.requests(), proxy.forwarded()), (1, 1));
}

#[tokio::test]
async fn delay_holds_the_response() {
    let upstream = Upstream::start().await;
    let proxy = proxy_for(&upstream).await;
    proxy.push(Fault::Delay(Duration::from_millis(60)));

    let started = Instant::now();
    let response = http_client().get(proxy.url()).send().await.unwrap();
    assert!(started.elapsed() >= Duration::from_millis(60));
    assert_eq!(response.text().await.unwrap(), "hello");
}

#[tokio::test]
async fn delay_past_the_client_timeout_is_a_timeout_after_the_work_was_done() {
    let upstream = Upstream::start().await;
    let proxy = proxy_for(&upstream).await;
    proxy.push(Fault::Delay(Duration::from_secs(30)));
    let http = reqwest::Client::builder()
        .timeout(Duration::from_millis(100))
        .build()
        .unwrap();

    let error = http.get(proxy.url()).send().await.unwrap_err();
    assert!(error.is_timeout(), "{error:?}");
    assert_eq!(upstream.served(), 1);
    assert_eq!(proxy.forwarded(), 1);
}

#[tokio::test]
async fn truncate_inside_the_head_fails_the_request() {
    let upstream = Upstream::start().await;
    let proxy = proxy_for(&upstream).await;
    proxy.push(Fault::Truncate(10));

    let error = http_client().get(proxy.url()).send().await.unwrap_err();
    assert!(error.is_request() && !error.is_connect(), "{error:?}");
    assert_eq!(upstream.served(), 1);
}

#[tokio::test]
async fn truncate_inside_the_body_fails_reading_the_body() {
    let upstream = Upstream::start().await;
    let proxy = proxy_for(&upstream).await;
    // The relayed head is the upstream's plus `connection: close`; keep it and 2 body bytes.
    let relayed_head = support::RESPONSE.len() - "hello".len() + "connection: close\r\n".len();
    proxy.push(Fault::Truncate(relayed_head + 2));

    let response = http_client().get(proxy.url()).send().await.unwrap();
    assert_eq!(response.status(), 200);
    let error = response.bytes().await.unwrap_err();
    // reqwest reports a body cut short while collecting it as a decode error.
    assert!(error.is_decode(), "{error:?}");
}

#[tokio::test]
async fn truncate_past_the_end_relays_everything() {
    let upstream = Upstream::start().await;
    let proxy = proxy_for(&upstream).await;
    proxy.push(Fault::Truncate(usize::MAX));
    let response = http_client().get(proxy.url()).send().await.unwrap();
    assert_eq!(response.text().await.unwrap(), "hello");
}

#[tokio::test]
async fn respond_answers_without_forwarding() {
    let upstream = Upstream::start().await;
    let proxy = proxy_for(&upstream).await;
    proxy.push_all([
        Fault::rate_limited(2),
        Fault::unavailable(1),
        Fault::status(502),
    ]);
    let http = http_client();

    let limited = http.get(proxy.url()).send().await.unwrap();
    assert_eq!(limited.status(), 429);
    assert_eq!(limited.headers()["retry-after"], "2");
    assert_eq!(limited.headers()["content-type"], "application/json");
    let body: serde_json::Value = serde_json::from_slice(&limited.bytes().await.unwrap()).unwrap();
    assert_eq!(body["error"]["code"], "RATE_LIMITED");

    let unavailable = http.get(proxy.url()).send().await.unwrap();
    assert_eq!(unavailable.status(), 503);
    assert_eq!(unavailable.headers()["retry-after"], "1");

    let gateway = http.get(proxy.url()).send().await.unwrap();
    assert_eq!(gateway.status(), 502);

    assert_eq!(
        (proxy.requests(), proxy.forwarded(), upstream.served()),
        (3, 0, 0)
    );
}

#[tokio::test]
async fn stall_holds_the_client_until_it_gives_up() {
    let upstream = Upstream::start().await;
    let proxy = proxy_for(&upstream).await;
    proxy.push(Fault::Stall);
    let http = reqwest::Client::builder()
        .timeout(Duration::from_millis(100))
        .build()
        .unwrap();

    let error = http.get(proxy.url()).send().await.unwrap_err();
    assert!(error.is_timeout(), "{error:?}");
    assert_eq!(
        (proxy.requests(), proxy.forwarded(), upstream.served()),
        (1, 0, 0)
    );
}

#[tokio::test]
async fn dropping_the_proxy_closes_stalled_connections_and_stops_accepting() {
    let upstream = Upstream::start().await;
    let proxy = proxy_for(&upstream).await;
    let addr = proxy.addr();
    proxy.push(Fault::Stall);

    let mut stalled = TcpStream::connect(addr).await.unwrap();
    stalled
        .write_all(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    eventually("the stalled request arrives", || proxy.requests() == 1).await;
    drop(proxy);

    let mut rest = Vec::new();
    let closed = tokio::time::timeout(Duration::from_secs(5), stalled.read_to_end(&mut rest))
        .await
        .expect("the stalled connection is closed when the proxy is dropped");
    assert!(closed.is_err() || rest.is_empty(), "{closed:?} {rest:?}");

    let mut refused = false;
    for _ in 0..500 {
        if TcpStream::connect(addr).await.is_err() {
            refused = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    assert!(refused, "the proxy still accepts connections after drop");
    assert_eq!(upstream.served(), 0);
}

/// The address of an upstream that was started and dropped: its port refuses connections.
async fn dead_upstream() -> SocketAddr {
    let upstream = Upstream::start().await;
    let addr = upstream.addr();
    drop(upstream);
    // Wait (bounded) until the upstream's port refuses connections.
    for _ in 0..500 {
        if TcpStream::connect(addr).await.is_err() {
            return addr;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    panic!("the dropped upstream at {addr} still accepts connections");
}

#[tokio::test]
async fn an_unreachable_upstream_is_a_bad_gateway() {
    let upstream_addr = dead_upstream().await;
    let proxy = ChaosProxy::start(upstream_addr).await.unwrap();

    let response = http_client().get(proxy.url()).send().await.unwrap();
    assert_eq!(response.status(), 502);
    assert_eq!((proxy.requests(), proxy.forwarded()), (1, 0));
}

#[tokio::test]
async fn chunked_requests_are_refused_without_consuming_a_fault() {
    let upstream = Upstream::start().await;
    let proxy = proxy_for(&upstream).await;
    proxy.push(Fault::status(503));

    let answer = raw_exchange(
        proxy.addr(),
        b"POST / HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n0\r\n\r\n",
    )
    .await
    .unwrap();
    assert!(
        answer.starts_with("HTTP/1.1 400 Bad Request\r\n"),
        "{answer}"
    );
    assert_eq!(
        (proxy.requests(), proxy.pending(), upstream.served()),
        (0, 1, 0)
    );
}

#[tokio::test]
async fn raw_clients_get_a_closed_connection_after_one_exchange() {
    let upstream = Upstream::start().await;
    let proxy = proxy_for(&upstream).await;
    // Two pipelined requests: only the first is answered, then the proxy closes.
    let answer = raw_exchange(
        proxy.addr(),
        b"GET /a HTTP/1.1\r\nhost: x\r\n\r\nGET /b HTTP/1.1\r\nhost: x\r\n\r\n",
    )
    .await
    .unwrap();
    assert!(answer.starts_with("HTTP/1.1 200 OK\r\n"), "{answer}");
    assert!(
        answer.ends_with("connection: close\r\n\r\nhello"),
        "{answer}"
    );
    assert_eq!((proxy.requests(), upstream.served()), (1, 1));
}

#[tokio::test]
async fn a_single_upstream_proxy_lists_its_upstream() {
    let upstream = Upstream::start().await;
    let proxy = proxy_for(&upstream).await;
    assert_eq!(proxy.upstreams(), [upstream.addr()]);
    assert_eq!(proxy.upstream(), upstream.addr());
    assert!(http_client().get(proxy.url()).send().await.is_ok());
    assert_eq!(proxy.forwarded_to(upstream.addr()), 1);
    assert_eq!(proxy.failed_connects_to(upstream.addr()), 0);
}

#[tokio::test]
async fn a_balanced_proxy_needs_an_upstream() {
    let error = ChaosProxy::start_balanced([]).await.unwrap_err();
    assert_eq!(error.kind(), io::ErrorKind::InvalidInput);
}

#[tokio::test]
async fn a_balanced_proxy_sends_requests_round_robin_in_the_order_given() {
    let (a, b) = (Upstream::start().await, Upstream::start().await);
    let proxy = ChaosProxy::start_balanced([a.addr(), b.addr()])
        .await
        .unwrap();
    assert_eq!(proxy.upstreams(), [a.addr(), b.addr()]);
    assert_eq!(proxy.upstream(), a.addr());
    let http = http_client();
    let mut served = Vec::new();
    for _ in 0..5 {
        let response = http.get(proxy.url()).send().await.unwrap();
        assert_eq!(response.text().await.unwrap(), "hello");
        served.push((a.served(), b.served()));
    }
    assert_eq!(served, [(1, 0), (1, 1), (2, 1), (2, 2), (3, 2)]);
    assert_eq!(
        (proxy.forwarded_to(a.addr()), proxy.forwarded_to(b.addr())),
        (3, 2)
    );
    assert_eq!(proxy.forwarded(), 5);
    let stranger: SocketAddr = "127.0.0.1:1".parse().unwrap();
    assert_eq!(proxy.forwarded_to(stranger), 0);
}

#[tokio::test]
async fn a_balanced_proxy_applies_each_fault_to_the_upstream_whose_turn_it_is() {
    let (a, b) = (Upstream::start().await, Upstream::start().await);
    let proxy = ChaosProxy::start_balanced([a.addr(), b.addr()])
        .await
        .unwrap();
    // As with replicas: the first attempt reaches A, which does the work, and its response is
    // lost; the retry reaches B.
    proxy.push(Fault::DropAfterForward);
    let http = http_client();
    assert!(http.post(proxy.url()).body("write").send().await.is_err());
    assert_eq!((a.served(), b.served()), (1, 0));
    let retried = http.post(proxy.url()).body("write").send().await.unwrap();
    assert_eq!(retried.status(), 200);
    assert_eq!((a.served(), b.served()), (1, 1));
    // A fault that forwards nothing still takes its turn: the round robin counts requests
    // forwarded, not requests received.
    proxy.push(Fault::status(503));
    assert_eq!(http.get(proxy.url()).send().await.unwrap().status(), 503);
    assert!(http.get(proxy.url()).send().await.is_ok());
    assert_eq!((a.served(), b.served()), (2, 1));
}

#[tokio::test]
async fn a_balanced_proxy_fails_over_past_an_upstream_that_refuses_connections() {
    let down = dead_upstream().await;
    let up = Upstream::start().await;
    let proxy = ChaosProxy::start_balanced([down, up.addr()]).await.unwrap();
    let http = http_client();
    for _ in 0..3 {
        let response = http.get(proxy.url()).send().await.unwrap();
        assert_eq!(response.status(), 200);
    }
    assert_eq!(up.served(), 3);
    assert_eq!(
        (proxy.forwarded_to(down), proxy.forwarded_to(up.addr())),
        (0, 3)
    );
    // Requests 1 and 3 started at the dead upstream; request 2 started at the live one.
    assert_eq!(
        (
            proxy.failed_connects_to(down),
            proxy.failed_connects_to(up.addr())
        ),
        (2, 0)
    );
}

#[tokio::test]
async fn a_balanced_proxy_with_every_upstream_down_is_a_bad_gateway() {
    let (a, b) = (dead_upstream().await, dead_upstream().await);
    let proxy = ChaosProxy::start_balanced([a, b]).await.unwrap();
    let response = http_client().get(proxy.url()).send().await.unwrap();
    assert_eq!(response.status(), 502);
    assert_eq!(
        (proxy.requests(), proxy.forwarded()),
        (1, 0),
        "nothing was sent"
    );
    assert_eq!(
        (proxy.failed_connects_to(a), proxy.failed_connects_to(b)),
        (1, 1)
    );
}

#[tokio::test]
async fn a_request_whose_upstream_fails_after_receiving_it_is_not_sent_elsewhere() {
    // An upstream that takes the request and hangs up without answering: it may have done the
    // work, so the proxy must not send the request on to another upstream.
    let hangup = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let hangup_addr = hangup.local_addr().unwrap();
    let hangup_task = tokio::spawn(async move {
        let (mut stream, _) = hangup.accept().await.unwrap();
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") && stream.read(&mut byte).await.unwrap() == 1 {
            head.push(byte[0]);
        }
        String::from_utf8(head).unwrap()
    });
    let other = Upstream::start().await;
    let proxy = ChaosProxy::start_balanced([hangup_addr, other.addr()])
        .await
        .unwrap();

    let response = http_client().get(proxy.url()).send().await.unwrap();
    assert_eq!(response.status(), 502);
    let head = hangup_task.await.unwrap();
    assert!(head.starts_with("GET / HTTP/1.1\r\n"), "{head}");
    assert_eq!(other.served(), 0);
    assert_eq!(
        (
            proxy.forwarded_to(hangup_addr),
            proxy.forwarded_to(other.addr())
        ),
        (1, 0)
    );
    assert_eq!(proxy.failed_connects_to(hangup_addr), 0);
}
