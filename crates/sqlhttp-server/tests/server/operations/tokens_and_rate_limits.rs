//! `sqlhttpd` in operation, against the built binary and real TCP servers: read-only tokens,
//! token files (never in the log) and the refusal to serve anonymously on a public address, and
//! rate limits with `Retry-After`. Request ids and `/metrics` are `operations/observability.rs`, with this
//! file's helpers.

use std::io::Read as _;
use std::num::NonZeroU32;
use std::process::Child;

use serde_json::{Value, json};
use sqlhttp_server::{Config, RateLimit, Server, ServerError};

use crate::common::{http_client, post_over_http, read_url, serve, sqlhttpd, start};

/// One exchange with the SQL endpoint: status, headers, JSON body.
pub(crate) struct Answer {
    pub(crate) status: u16,
    pub(crate) headers: reqwest::header::HeaderMap,
    pub(crate) body: Value,
}

impl Answer {
    /// The `error.code` of the body, or `""`.
    pub(crate) fn code(&self) -> &str {
        self.body["error"]["code"].as_str().unwrap_or("")
    }

    /// The value of the header `name`, if it came.
    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(|v| v.to_str().unwrap())
    }
}

/// POSTs `sql` to the server at `url`, with `token` as a bearer token if any and `headers`.
pub(crate) async fn call(
    client: &reqwest::Client,
    url: &str,
    token: Option<&str>,
    headers: &[(&str, &str)],
    sql: &str,
) -> Answer {
    let bearer = token.map(|token| format!("Bearer {token}"));
    let mut all: Vec<(&str, &str)> = bearer
        .iter()
        .map(|bearer| ("authorization", bearer.as_str()))
        .collect();
    all.extend_from_slice(headers);
    let (status, headers, bytes) =
        post_over_http(client, url, "/api/v1/sql", &all, &json!({ "sql": sql })).await;
    Answer {
        status,
        headers,
        body: serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    }
}

/// Stops the binary and returns what it wrote to stderr.
pub(crate) fn stop(mut child: Child) -> String {
    child.kill().unwrap();
    child.wait().unwrap();
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    stderr
}

fn per_second(per_second: u32, burst: u32) -> Option<RateLimit> {
    Some(RateLimit {
        per_second: NonZeroU32::new(per_second).unwrap(),
        burst: NonZeroU32::new(burst).unwrap(),
    })
}

#[tokio::test]
async fn read_tokens_read_and_never_write_on_any_engine_layout() {
    let dir = tempfile::tempdir().unwrap();
    let read_file = dir.path().join("read-tokens");
    std::fs::write(&read_file, "# dashboards\nviewer-from-file\n").unwrap();
    let client = http_client();
    for readers in ["0", "2"] {
        let mut command = sqlhttpd();
        command
            .env("SQLHTTPD_READ_TOKENS", "viewer-from-env")
            .args([
                "--listen",
                "127.0.0.1:0",
                "--token",
                "admin",
                "--read-token-file",
                read_file.to_str().unwrap(),
                "--read-connections",
                readers,
            ]);
        let mut child = command.spawn().unwrap();
        let url = read_url(&mut child);
        let admin = Some("admin");
        assert_eq!(
            call(&client, &url, admin, &[], "CREATE TABLE t (x)")
                .await
                .status,
            200
        );
        assert_eq!(
            call(&client, &url, admin, &[], "INSERT INTO t VALUES (1)")
                .await
                .status,
            200
        );
        for viewer in ["viewer-from-env", "viewer-from-file"] {
            let read = call(&client, &url, Some(viewer), &[], "SELECT count(*) FROM t").await;
            assert_eq!(
                (read.status, &read.body["rows"]),
                (200, &json!([[1]])),
                "{viewer}"
            );
            for write in [
                "INSERT INTO t VALUES (2)",
                "UPDATE t SET x = 3",
                "DELETE FROM t",
                "CREATE TABLE u (x)",
                "DROP TABLE t",
                "INSERT INTO t VALUES (4) RETURNING x",
            ] {
                for headers in [&[][..], &[("idempotency-key", "viewer-key-1")][..]] {
                    let refused = call(&client, &url, Some(viewer), headers, write).await;
                    assert_eq!(
                        (refused.status, refused.code()),
                        (403, "READ_ONLY"),
                        "{readers} readers, {viewer}: {write} {headers:?}"
                    );
                }
            }
            // A key a read credential sent is not taken: the writer's caller can still use it.
            let keyed_read = call(
                &client,
                &url,
                Some(viewer),
                &[("idempotency-key", "shared-key")],
                "SELECT x FROM t",
            )
            .await;
            assert_eq!(keyed_read.status, 200);
            assert_eq!(keyed_read.header("idempotent-replayed"), None);
            // Batches too: reads run (in one snapshot), a write is refused with its index.
            let batch = |statements: Value| {
                client
                    .post(format!("{url}/api/v1/batch"))
                    .header("content-type", "application/json")
                    .bearer_auth(viewer)
                    .body(json!({ "statements": statements }).to_string())
                    .send()
            };
            let reads = batch(json!([{"sql": "SELECT 1"}, {"sql": "SELECT count(*) FROM t"}]))
                .await
                .unwrap();
            assert_eq!(reads.status(), 200, "{viewer}");
            let writes = batch(json!([{"sql": "SELECT 1"}, {"sql": "DELETE FROM t"}]))
                .await
                .unwrap();
            assert_eq!(writes.status(), 403, "{viewer}");
            let body: Value = serde_json::from_slice(&writes.bytes().await.unwrap()).unwrap();
            assert_eq!(body["error"]["code"], "READ_ONLY");
            assert_eq!(body["error"]["statement"], 1);
        }
        let after = call(&client, &url, admin, &[], "SELECT x FROM t").await;
        assert_eq!(after.body["rows"], json!([[1]]), "nothing was written");
        assert_eq!(
            call(&client, &url, Some("nobody"), &[], "SELECT 1")
                .await
                .status,
            401
        );
        stop(child);
    }
}

/// The request's line is written whatever filter lets it through: one scoped to the request's
/// span (`[request]=info`) as well as a level. Its fields are read from the request only when
/// the line is on, asked in the span the line is written in.
#[tokio::test]
async fn a_filter_scoped_to_the_request_span_still_logs_each_request() {
    let mut command = sqlhttpd();
    command.env("RUST_LOG", "warn,[request]=info").args([
        "--listen",
        "127.0.0.1:0",
        "--token",
        "secret-full-token-1",
    ]);
    let mut child = command.spawn().unwrap();
    let url = read_url(&mut child);
    let client = http_client();
    for attempt in ["1/3", "2/3"] {
        let ok = call(
            &client,
            &url,
            Some("secret-full-token-1"),
            &[("x-request-id", "scoped-1"), ("sqlhttp-attempt", attempt)],
            "SELECT 1",
        )
        .await;
        assert_eq!(ok.status, 200);
    }
    let log = stop(child);
    let lines: Vec<&str> = log
        .lines()
        .filter(|line| line.contains("scoped-1") && line.contains("status=200"))
        .collect();
    assert_eq!(lines.len(), 2, "one line per request:\n{log}");
    for (line, attempt) in lines.iter().zip(["1/3", "2/3"]) {
        for field in [
            "credential=token#1",
            &format!("attempt=\"{attempt}\""),
            "path=\"/api/v1/sql\"",
            "rows=1",
        ] {
            assert!(line.contains(field), "{field} missing: {line}");
        }
    }
}

#[tokio::test]
async fn tokens_from_files_never_reach_the_log() {
    let dir = tempfile::tempdir().unwrap();
    let full = dir.path().join("tokens");
    std::fs::write(&full, "# the operators\nsecret-full-token-1\n\n").unwrap();
    let mut command = sqlhttpd();
    command.env("RUST_LOG", "debug").args([
        "--listen",
        "127.0.0.1:0",
        "--token-file",
        full.to_str().unwrap(),
        "--read-token",
        "secret-read-token-1",
    ]);
    let mut child = command.spawn().unwrap();
    let url = read_url(&mut child);
    let client = http_client();
    let ok = call(
        &client,
        &url,
        Some("secret-full-token-1"),
        &[("x-request-id", "trace-me-1"), ("sqlhttp-attempt", "2/3")],
        "SELECT 1",
    )
    .await;
    assert_eq!(ok.status, 200);
    assert_eq!(ok.header("x-request-id"), Some("trace-me-1"));
    let read = call(
        &client,
        &url,
        Some("secret-read-token-1"),
        &[],
        "CREATE TABLE t (x)",
    )
    .await;
    assert_eq!(read.status, 403);
    // A forged attempt header cannot make the refused request's line read as a success.
    let forged = "1 status=200 credential=token#1";
    let refused = call(
        &client,
        &url,
        Some("secret-wrong-token"),
        &[("sqlhttp-attempt", forged)],
        "SELECT 1",
    )
    .await;
    assert_eq!(refused.status, 401);
    let log = stop(child);
    for secret in [
        "secret-full-token-1",
        "secret-read-token-1",
        "secret-wrong-token",
    ] {
        assert!(!log.contains(secret), "{secret} in the log:\n{log}");
    }
    let line = log
        .lines()
        .find(|line| line.contains("trace-me-1") && line.contains("status=200"))
        .unwrap_or_else(|| panic!("no log line for the request:\n{log}"));
    for field in [
        "credential=token#1",
        "attempt=\"2/3\"",
        "rows=1",
        "bytes=",
        "duration_us=",
    ] {
        assert!(line.contains(field), "{field} missing: {line}");
    }
    let duration = line.split("duration_us=").nth(1).unwrap_or_default();
    let digits = duration.split(' ').next().unwrap_or_default();
    assert!(
        !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()),
        "a duration in whole microseconds: {line}"
    );
    assert!(log.contains("credential=read#1"), "{log}");
    let refused_line = log
        .lines()
        .find(|line| line.contains("status=401"))
        .unwrap_or_else(|| panic!("no log line for the refused request:\n{log}"));
    assert!(
        refused_line.contains(&format!("attempt=\"{forged}\"")),
        "the client's words are quoted: {refused_line}"
    );
    assert!(
        log.contains("code=\"READ_ONLY\"") || log.contains("code=READ_ONLY"),
        "{log}"
    );
}

#[test]
fn anonymous_on_a_public_address_needs_the_flag() {
    let output = sqlhttpd().args(["--listen", "0.0.0.0:0"]).output().unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("--allow-anonymous"), "{stderr}");
    assert!(output.stdout.is_empty());

    let dir = tempfile::tempdir().unwrap();
    let empty = dir.path().join("empty");
    std::fs::write(&empty, "# no tokens yet\n").unwrap();
    let output = sqlhttpd()
        .args([
            "--listen",
            "0.0.0.0:0",
            "--token-file",
            empty.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("holds no token"), "{stderr}");
}

#[tokio::test]
async fn anonymous_on_a_public_address_serves_when_allowed() {
    let (child, url) = start(&["--listen", "0.0.0.0:0", "--allow-anonymous"]);
    let port = url.rsplit(':').next().unwrap();
    let local = format!("http://127.0.0.1:{port}");
    assert_eq!(
        call(&http_client(), &local, None, &[], "SELECT 1")
            .await
            .status,
        200
    );
    stop(child);

    let (child, url) = start(&["--listen", "0.0.0.0:0", "--read-token", "viewer"]);
    let port = url.rsplit(':').next().unwrap();
    let local = format!("http://127.0.0.1:{port}");
    assert_eq!(
        call(&http_client(), &local, None, &[], "SELECT 1")
            .await
            .status,
        401
    );
    stop(child);
}

#[tokio::test]
async fn server_bind_refuses_anonymous_public_addresses() {
    let err = Server::bind(Config {
        listen: "0.0.0.0:0".parse().unwrap(),
        ..Config::default()
    })
    .await
    .unwrap_err();
    assert!(
        matches!(err, ServerError::AnonymousOnPublicAddress { .. }),
        "{err}"
    );
    let err = Server::bind(Config {
        listen: "127.0.0.1:0".parse().unwrap(),
        tokens: vec!["same".into()],
        read_tokens: vec!["same".into()],
        ..Config::default()
    })
    .await
    .unwrap_err();
    assert!(
        matches!(err, ServerError::ConflictingTokens { read_index: 1 }),
        "{err}"
    );
}

#[tokio::test]
async fn each_credential_has_its_own_bucket_and_429_says_when() {
    let (child, url) = start(&[
        "--listen",
        "127.0.0.1:0",
        "--token",
        "one",
        "--token",
        "two",
        "--rate-limit",
        "1",
        "--rate-burst",
        "2",
    ]);
    let client = http_client();
    for _ in 0..2 {
        assert_eq!(
            call(&client, &url, Some("one"), &[], "SELECT 1")
                .await
                .status,
            200
        );
    }
    let limited = call(&client, &url, Some("one"), &[], "SELECT 1").await;
    assert_eq!((limited.status, limited.code()), (429, "RATE_LIMITED"));
    let wait: u64 = limited.header("retry-after").unwrap().parse().unwrap();
    assert!((1..=2).contains(&wait), "{wait}");
    assert!(limited.header("x-request-id").is_some());
    // Another credential is not held back, and neither are the probes and metrics.
    assert_eq!(
        call(&client, &url, Some("two"), &[], "SELECT 1")
            .await
            .status,
        200
    );
    for path in ["/healthz", "/readyz", "/metrics"] {
        for _ in 0..3 {
            let probe = client.get(format!("{url}{path}")).send().await.unwrap();
            assert_eq!(probe.status(), 200, "{path}");
        }
    }
    // After the wait it asked for, the credential is let in again.
    tokio::time::sleep(std::time::Duration::from_secs(wait)).await;
    assert_eq!(
        call(&client, &url, Some("one"), &[], "SELECT 1")
            .await
            .status,
        200
    );
    stop(child);
}

#[tokio::test]
async fn anonymous_requests_and_refused_tokens_are_limited_per_address() {
    let open = serve(Config {
        rate_limit: per_second(1, 1),
        ..Config::default()
    })
    .await;
    let from = |ip: &str| {
        reqwest::Client::builder()
            .no_proxy()
            .local_address(ip.parse::<std::net::IpAddr>().unwrap())
            .build()
            .unwrap()
    };
    let (first, second) = (from("127.0.0.1"), from("127.0.0.2"));
    let url = open.url();
    assert_eq!(call(&first, &url, None, &[], "SELECT 1").await.status, 200);
    assert_eq!(call(&first, &url, None, &[], "SELECT 1").await.status, 429);
    assert_eq!(call(&second, &url, None, &[], "SELECT 1").await.status, 200);
    open.shutdown().await;

    let guarded = serve(Config {
        tokens: vec!["right".into()],
        rate_limit: per_second(1, 1),
        ..Config::default()
    })
    .await;
    let url = guarded.url();
    assert_eq!(
        call(&first, &url, Some("guess-1"), &[], "SELECT 1")
            .await
            .status,
        401
    );
    assert_eq!(
        call(&first, &url, Some("guess-2"), &[], "SELECT 1")
            .await
            .status,
        429
    );
    // The right token has a bucket of its own.
    assert_eq!(
        call(&first, &url, Some("right"), &[], "SELECT 1")
            .await
            .status,
        200
    );
    guarded.shutdown().await;
}
