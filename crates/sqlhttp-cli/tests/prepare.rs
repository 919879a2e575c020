//! `sqlhttp prepare` against a live server, then `--check` without one: it fills an
//! application's `.sqlhttp/` cache, passes offline while every statement has its entry, and
//! fails once a statement's SQL changed without a refresh (no entry for the new text, the old
//! entry stale), or, with `--server`, once the schema changed under an entry.

use std::process::Output;
use std::time::Duration;

use assert_cmd::Command;
use sqlhttp_testkit::TestServer;

/// A URL where no server answers.
const NOWHERE: &str = "http://127.0.0.1:9";

async fn sqlhttp(url: &str, args: &[&str]) -> Output {
    sqlhttp_with(url, args, None).await
}

/// `sqlhttp` with `SQLHTTP_OFFLINE_DIR` set to `offline_dir`, or unset.
async fn sqlhttp_with(url: &str, args: &[&str], offline_dir: Option<&str>) -> Output {
    let mut command = Command::cargo_bin("sqlhttp").unwrap();
    command
        .env_remove("SQLHTTP_TOKEN")
        .env_remove("SQLHTTP_OFFLINE_DIR")
        .env("SQLHTTP_URL", url)
        .args(args)
        .timeout(Duration::from_secs(60));
    if let Some(dir) = offline_dir {
        command.env("SQLHTTP_OFFLINE_DIR", dir);
    }
    tokio::task::spawn_blocking(move || command.output().unwrap())
        .await
        .unwrap()
}

fn said(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

const MAIN: &str = r#"
fn main() {
    let _ = sqlhttp::query!("SELECT id, title FROM books WHERE id = ?", 1);
    let _ = sqlhttp::execute!("DELETE FROM books");
}
"#;

/// A server holding the applications' one table.
async fn books_server() -> TestServer {
    let server = TestServer::start().await;
    server
        .client()
        .execute("CREATE TABLE books (id INTEGER PRIMARY KEY, title TEXT NOT NULL)")
        .await
        .unwrap();
    server
}

/// An application package in a fresh directory whose `src/main.rs` is `main`.
fn application(main: &str) -> tempfile::TempDir {
    let app = tempfile::tempdir().unwrap();
    std::fs::write(app.path().join("Cargo.toml"), "[package]\nname = \"app\"\n").unwrap();
    std::fs::create_dir(app.path().join("src")).unwrap();
    std::fs::write(app.path().join("src/main.rs"), main).unwrap();
    app
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prepare_fills_the_cache_and_check_needs_no_server() {
    let server = books_server().await;
    let url = server.url();
    let app = application(MAIN);
    let dir = app.path().to_str().unwrap();

    let prepared = sqlhttp(&url, &["prepare", dir]).await;
    assert!(prepared.status.success(), "{}", said(&prepared));
    let cache = app.path().join(".sqlhttp");
    let mut entries: Vec<String> = std::fs::read_dir(&cache)
        .unwrap()
        .map(|e| std::fs::read_to_string(e.unwrap().path()).unwrap())
        .collect();
    entries.sort();
    assert_eq!(entries.len(), 2);
    let select: serde_json::Value = serde_json::from_str(
        entries
            .iter()
            .find(|e| e.contains("SELECT"))
            .expect("the SELECT's entry"),
    )
    .unwrap();
    assert_eq!(select["engine"], "sqlite");
    assert_eq!(
        select["describe"]["params"],
        serde_json::json!([{"type": null}])
    );
    assert_eq!(select["describe"]["columns"][1]["nullable"], false);

    // Offline: no server answers at NOWHERE, and none is needed.
    let checked = sqlhttp(NOWHERE, &["prepare", "--check", dir]).await;
    assert!(checked.status.success(), "{}", said(&checked));

    // The SQL changed without a refresh: its new text has no entry, the old entry is stale.
    let changed = MAIN.replace("SELECT id, title", "SELECT title");
    std::fs::write(app.path().join("src/main.rs"), &changed).unwrap();
    let checked = sqlhttp(NOWHERE, &["prepare", "--check", dir]).await;
    assert!(!checked.status.success());
    let text = said(&checked);
    assert!(
        text.contains("no entry for `SELECT title FROM books WHERE id = ?`"),
        "{text}"
    );
    assert!(text.contains("is stale: no statement uses it"), "{text}");

    // Refreshed, it passes again; then the schema moves under the entry.
    let prepared = sqlhttp(&url, &["prepare", dir]).await;
    assert!(prepared.status.success(), "{}", said(&prepared));
    assert_eq!(std::fs::read_dir(&cache).unwrap().count(), 2);
    assert!(
        sqlhttp(NOWHERE, &["prepare", "--check", dir])
            .await
            .status
            .success()
    );
    let client = server.client();
    client.execute("DROP TABLE books").await.unwrap();
    client
        .execute("CREATE TABLE books (id INTEGER PRIMARY KEY, title TEXT)")
        .await
        .unwrap();
    let checked = sqlhttp(&url, &["prepare", "--check", "--server", dir]).await;
    assert!(!checked.status.success());
    assert!(
        said(&checked).contains("is stale (the server describes it otherwise)"),
        "{}",
        said(&checked)
    );
}

/// `SQLHTTP_OFFLINE_DIR` moves the cache for `prepare` and `--check` as it does for the macros
/// (a check of `.sqlhttp/` would pass while the build reads another directory), and a source
/// file with CRLF line ends is read as rustc reads it: a multi-line statement's entry is keyed
/// by its text with LF line ends, which is what the macro hashes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prepare_honours_the_offline_dir_and_reads_crlf_sources_as_rustc_does() {
    let server = books_server().await;
    let url = server.url();
    let main = "fn main() {\n    let _ = sqlhttp::query!(r#\"SELECT id, title\n        FROM books\"#);\n}\n";
    let app = application(&main.replace('\n', "\r\n"));
    let dir = app.path().to_str().unwrap();
    let offline = tempfile::tempdir().unwrap();
    let offline_dir = offline.path().to_str().unwrap();

    let prepared = sqlhttp_with(&url, &["prepare", dir], Some(offline_dir)).await;
    assert!(prepared.status.success(), "{}", said(&prepared));
    assert!(!app.path().join(".sqlhttp").exists());
    let entries: Vec<String> = std::fs::read_dir(offline.path())
        .unwrap()
        .map(|e| std::fs::read_to_string(e.unwrap().path()).unwrap())
        .collect();
    assert_eq!(entries.len(), 1);
    let entry: serde_json::Value = serde_json::from_str(&entries[0]).unwrap();
    assert_eq!(entry["sql"], "SELECT id, title\n        FROM books");

    let checked = sqlhttp_with(NOWHERE, &["prepare", "--check", dir], Some(offline_dir)).await;
    assert!(checked.status.success(), "{}", said(&checked));
    // Without the variable, the package's own `.sqlhttp/` is checked, and it has nothing.
    let checked = sqlhttp(NOWHERE, &["prepare", "--check", dir]).await;
    assert!(!checked.status.success(), "{}", said(&checked));
}
