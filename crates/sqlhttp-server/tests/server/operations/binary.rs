//! The `sqlhttpd` binary: the first stdout line, serving, clean errors for bad flags and
//! databases, and a graceful exit on SIGTERM.

use std::process::Command;

use serde_json::{Value, json};

use crate::common::{TempDb, http_client, read_url, sqlhttpd, start};

async fn select(url: &str, token: Option<&str>) -> (u16, Value) {
    let mut request = http_client()
        .post(format!("{url}/api/v1/sql"))
        .header("content-type", "application/json")
        .body(json!({"sql": "SELECT 40 + 2 AS answer"}).to_string());
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    (
        status,
        serde_json::from_slice(&response.bytes().await.unwrap()).unwrap(),
    )
}

#[tokio::test]
async fn first_stdout_line_names_the_bound_port() {
    let (mut child, url) = start(&["--listen", "127.0.0.1:0"]);
    let port: u16 = url
        .strip_prefix("http://127.0.0.1:")
        .unwrap_or_else(|| panic!("{url}"))
        .parse()
        .unwrap();
    assert_ne!(port, 0);
    let (status, body) = select(&url, None).await;
    assert_eq!(status, 200);
    assert_eq!(body["rows"], json!([[42]]));
    child.kill().unwrap();
    child.wait().unwrap();
}

#[tokio::test]
async fn tokens_come_from_flags_or_the_environment() {
    let (mut child, url) = start(&["--listen", "127.0.0.1:0", "--token", "flag-token"]);
    assert_eq!(select(&url, None).await.0, 401);
    assert_eq!(select(&url, Some("flag-token")).await.0, 200);
    child.kill().unwrap();
    child.wait().unwrap();

    let mut command = sqlhttpd();
    command
        .env("SQLHTTPD_TOKENS", "one, two")
        .args(["--listen", "127.0.0.1:0"]);
    let mut child = command.spawn().unwrap();
    let url = read_url(&mut child);
    assert_eq!(select(&url, Some("two")).await.0, 200);
    assert_eq!(select(&url, Some("three")).await.0, 401);
    child.kill().unwrap();
    child.wait().unwrap();
}

#[test]
fn bad_flags_and_databases_fail_cleanly() {
    let missing_dir = TempDb::new("bin-missing-dir");
    let database = format!("sqlite:{}", missing_dir.path().join("x.db").display());
    let cases: [(&[&str], &str); 4] = [
        (&["--database", "mysql://nope"], "invalid database URL"),
        (&["--idempotency-ttl", "forever"], "invalid duration"),
        (&["--listen", "not-an-address"], "--listen"),
        (
            &["--listen", "127.0.0.1:0", "--database", &database],
            "cannot open database",
        ),
    ];
    for (args, needle) in cases {
        let output = sqlhttpd().args(args).output().unwrap();
        assert!(!output.status.success(), "{args:?}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains(needle), "{args:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
        assert!(output.stdout.is_empty(), "{args:?}");
    }
}

#[cfg(unix)]
#[tokio::test]
async fn sigterm_shuts_down_gracefully() {
    let (mut child, url) = start(&["--listen", "127.0.0.1:0"]);
    assert_eq!(select(&url, None).await.0, 200);
    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let exit = child.wait().unwrap();
    assert!(exit.success(), "{exit:?}");
}
