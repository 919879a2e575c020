//! Helpers shared by the tests: building apps, sending requests in-process, temporary
//! database files. No assertions about the server live here.

use std::io::{BufRead as _, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};

use axum::Router;
use axum::body::Body;
use axum::http::{HeaderMap, Request};
use serde_json::Value;
use sqlhttp_server::{AppState, Config, Database, Server, ServerHandle, app};
use tower::ServiceExt as _;

/// A response, fully read.
#[derive(Debug)]
pub(crate) struct Reply {
    pub(crate) status: u16,
    pub(crate) headers: HeaderMap,
    pub(crate) body: Vec<u8>,
}

impl Reply {
    pub(crate) fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!(
                "body is not JSON ({e}): {}",
                String::from_utf8_lossy(&self.body)
            )
        })
    }

    /// The `error.code` of an error body.
    pub(crate) fn code(&self) -> String {
        let json = self.json();
        assert!(json["error"]["message"].is_string(), "{json}");
        json["error"]["code"].as_str().unwrap().to_owned()
    }

    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(|v| v.to_str().unwrap())
    }
}

/// The machine, as the tests that time it see it: a test whose bounds are wall-clock times
/// on a two-core machine (a statement answered within 3.5 s, a stray thread gone within a
/// minute) holds it shared; a test that keeps both cores busy for long (the transaction
/// history under replica lag) holds it alone, so the two never overlap.
pub(crate) static MACHINE: tokio::sync::RwLock<()> = tokio::sync::RwLock::const_new(());

/// An app over a fresh in-memory database with the given configuration tweaks.
pub(crate) fn app_with(config: &Config) -> Router {
    app(AppState::new(config).unwrap())
}

pub(crate) fn memory_app() -> Router {
    app_with(&Config::default())
}

/// Sends one request in-process.
pub(crate) async fn send(
    router: &Router,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: impl Into<Body>,
) -> Reply {
    let mut request = Request::builder().method(method).uri(path);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let response = router
        .clone()
        .oneshot(request.body(body.into()).unwrap())
        .await
        .unwrap();
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let body = axum::body::to_bytes(response.into_body(), usize::MAX)
        .await
        .unwrap()
        .to_vec();
    Reply {
        status,
        headers,
        body,
    }
}

/// POSTs a JSON request body to the SQL endpoint with extra headers.
pub(crate) async fn post_with(router: &Router, headers: &[(&str, &str)], body: &Value) -> Reply {
    let mut all = vec![("content-type", "application/json")];
    all.extend_from_slice(headers);
    send(router, "POST", "/api/v1/sql", &all, body.to_string()).await
}

/// POSTs a batch body (`/api/v1/batch`) with extra headers.
pub(crate) async fn batch_with(router: &Router, headers: &[(&str, &str)], body: &Value) -> Reply {
    let mut all = vec![("content-type", "application/json")];
    all.extend_from_slice(headers);
    send(router, "POST", "/api/v1/batch", &all, body.to_string()).await
}

/// A real server on a free loopback port, serving in a task.
pub(crate) async fn serve(config: Config) -> ServerHandle {
    Server::bind(Config {
        listen: "127.0.0.1:0".parse().unwrap(),
        ..config
    })
    .await
    .unwrap()
    .spawn()
}

/// POSTs a JSON `body` to `path` on the real server at `url`: the status and the JSON answer
/// (`null` when the answer is not JSON).
pub(crate) async fn post_json(url: &str, path: &str, body: &Value) -> (u16, Value) {
    let (status, _, bytes) = post_over_http(&http_client(), url, path, &[], body).await;
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}

/// POSTs a JSON `body` with `headers` to `path` on the real server at `url` through `client`:
/// the status, the headers and the body's bytes.
pub(crate) async fn post_over_http(
    client: &reqwest::Client,
    url: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &Value,
) -> (u16, reqwest::header::HeaderMap, Vec<u8>) {
    let mut request = client
        .post(format!("{url}{path}"))
        .header("content-type", "application/json")
        .body(body.to_string());
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let bytes = response.bytes().await.unwrap();
    (status, headers, bytes.to_vec())
}

/// POSTs `{"sql": sql, "params": params}`.
/// Rows that stream on PostgreSQL until the client goes (not one generate_series of 10^8 rows,
/// which PostgreSQL would materialize first, in temporary files past `work_mem`).
pub(crate) const ENDLESS_ON_POSTGRES: &str = "SELECT a * 10000 + b AS x \
    FROM generate_series(0, 9999) AS a, generate_series(1, 10000) AS b";

/// Sends `body` to `/api/v1/sql` and loses its answer mid-stream: the status is 200, the first
/// frame read when `read_first`, then the body dropped as a client that went away drops it.
pub(crate) async fn abandon_mid_stream(router: &Router, body: &Value, read_first: bool) {
    let request = Request::post("/api/v1/sql")
        .header("content-type", "application/json")
        .body(Body::from(body.to_string()))
        .unwrap();
    let response = router.clone().oneshot(request).await.unwrap();
    assert_eq!(response.status(), 200);
    let mut body = response.into_body();
    if read_first {
        let frame = std::future::poll_fn(|cx| {
            axum::body::HttpBody::poll_frame(std::pin::Pin::new(&mut body), cx)
        })
        .await
        .unwrap()
        .unwrap();
        assert!(frame.is_data());
    }
    drop(body);
}

pub(crate) async fn sql(router: &Router, sql: &str, params: Value) -> Reply {
    post_with(
        router,
        &[],
        &serde_json::json!({ "sql": sql, "params": params }),
    )
    .await
}

/// POSTs and asserts a 200, returning the JSON body without its `stats`.
pub(crate) async fn ok(router: &Router, sql_text: &str, params: Value) -> Value {
    let reply = sql(router, sql_text, params).await;
    assert_eq!(
        reply.status,
        200,
        "{sql_text}: {}",
        String::from_utf8_lossy(&reply.body)
    );
    // What the statement cost (tested in `stats`) is no part of its result.
    let mut body = reply.json();
    let stats = body.as_object_mut().and_then(|body| body.remove("stats"));
    assert!(stats.is_some(), "{sql_text}: no stats");
    body
}

/// A database file path in the system temp dir, removed (with its journals) on drop.
#[derive(Debug)]
pub(crate) struct TempDb {
    path: PathBuf,
}

impl TempDb {
    pub(crate) fn new(name: &str) -> TempDb {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let unique = format!(
            "sqlhttpd-test-{}-{}-{name}.db",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        let db = TempDb {
            path: std::env::temp_dir().join(unique),
        };
        db.remove();
        db
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    pub(crate) fn database(&self) -> Database {
        Database::File(self.path.clone())
    }

    fn remove(&self) {
        for suffix in ["", "-journal", "-wal", "-shm"] {
            let mut name = self.path.clone().into_os_string();
            name.push(suffix);
            let _ = std::fs::remove_file(name);
        }
    }
}

impl Drop for TempDb {
    fn drop(&mut self) {
        self.remove();
    }
}

/// A reqwest client that never uses a proxy (the tests only talk to loopback).
pub(crate) fn http_client() -> reqwest::Client {
    reqwest::Client::builder().no_proxy().build().unwrap()
}

/// The `sqlhttpd` binary with a clean environment and piped output.
pub(crate) fn sqlhttpd() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_sqlhttpd"));
    command
        .env_remove("SQLHTTPD_TOKENS")
        .env_remove("SQLHTTPD_READ_TOKENS")
        .env_remove("SQLHTTPD_TOKEN_FILE")
        .env_remove("SQLHTTPD_READ_TOKEN_FILE")
        .env_remove("SQLHTTPD_ALLOW_ANONYMOUS")
        .env_remove("SQLHTTPD_RATE_LIMIT")
        .env_remove("SQLHTTPD_RATE_BURST")
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    command
}

/// The URL from a started binary's first stdout line, `listening on http://HOST:PORT`.
pub(crate) fn read_url(child: &mut Child) -> String {
    let mut line = String::new();
    BufReader::new(child.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    line.strip_suffix('\n')
        .and_then(|l| l.strip_prefix("listening on "))
        .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
        .to_owned()
}

/// Starts the binary with `args` and returns it with the URL it announced.
pub(crate) fn start(args: &[&str]) -> (Child, String) {
    let mut child = sqlhttpd().args(args).spawn().unwrap();
    let url = read_url(&mut child);
    (child, url)
}

/// The headers of the full-access credential [`with_writer_and_reader`] configures.
pub(crate) const WRITER: [(&str, &str); 1] = [("authorization", "Bearer writer")];
/// The headers of the read-only credential [`with_writer_and_reader`] configures.
pub(crate) const READER: [(&str, &str); 1] = [("authorization", "Bearer reader")];

/// A full-access token `writer` and a read-only token `reader`.
pub(crate) fn with_writer_and_reader(config: &mut Config) {
    config.tokens = vec!["writer".into()];
    config.read_tokens = vec!["reader".into()];
}

/// `text` (a body) without its `stats` members (`,"stats":{...}`, each the last member of its
/// object): what a test of the rest of a body compares. Panics when there is none.
pub(crate) fn without_stats(text: &str) -> String {
    const MEMBER: &str = ",\"stats\":{";
    assert!(text.contains(MEMBER), "no stats in {text}");
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find(MEMBER) {
        out.push_str(&rest[..at]);
        let end = rest[at..].find('}').unwrap();
        rest = &rest[at + end + 1..];
    }
    out.push_str(rest);
    out
}

/// A child process's resident memory (`VmRSS`), in bytes.
pub(crate) fn rss_of(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.split_whitespace().next()?.parse::<u64>().ok())
        .map_or(0, |kib| kib * 1024)
}
