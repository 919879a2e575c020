//! The `sqlhttp` binary against a live `sqlhttpd` (in-process, through sqlhttp-testkit): every
//! subcommand and format, stdin, script mode, every exit code, an import resumed after an
//! injected fault without duplicates, and the interactive shell through a pseudo-terminal.

use std::process::Output;
use std::time::Duration;

use assert_cmd::Command;
use serde_json::{Value, json};
use sqlhttp_testkit::{ChaosProxy, Fault, TestServer};

/// Runs the binary with `args` (and `stdin`) on a blocking thread, so the in-process server keeps
/// serving.
async fn sqlhttp(url: &str, args: &[&str], stdin: Option<&str>) -> Output {
    let mut command = Command::cargo_bin("sqlhttp").unwrap();
    command
        .env_remove("SQLHTTP_TOKEN")
        .env("SQLHTTP_URL", url)
        .args(args)
        .timeout(Duration::from_secs(60));
    if let Some(stdin) = stdin {
        command.write_stdin(stdin.to_owned());
    }
    tokio::task::spawn_blocking(move || command.output().unwrap())
        .await
        .unwrap()
}

fn stdout(output: &Output) -> String {
    String::from_utf8(output.stdout.clone()).unwrap()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[track_caller]
fn assert_exit(output: &Output, code: i32) {
    assert_eq!(
        output.status.code(),
        Some(code),
        "stdout: {}\nstderr: {}",
        stdout(output),
        stderr(output)
    );
}

async fn ok(url: &str, args: &[&str]) -> String {
    let output = sqlhttp(url, args, None).await;
    assert_exit(&output, 0);
    stdout(&output)
}

const BOOKS: &str =
    "CREATE TABLE books (id INTEGER PRIMARY KEY, title TEXT, year INTEGER, price REAL)";

/// Titles that CSV must carry exactly: commas, quotes, line breaks, non-ASCII, empty, NULL.
const AWKWARD_CSV: &str = "id,title,year,price\r\n\
1,\"Dune, the novel\",1965,9.5\r\n\
2,\"He said \"\"hi\"\"\nthen left\",,\r\n\
3,Caf\u{e9} \u{2603} \u{65e5}\u{672c},1999,\r\n\
4,\"\",2001,1.25\r\n\
5,,2002,\r\n\
6,\" padded \",-7,0.5\r\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ping_exec_and_query_in_every_format() {
    let server = TestServer::start().await;
    let url = server.url();
    assert!(ok(&url, &["ping"]).await.starts_with("ok"));
    assert_eq!(ok(&url, &["exec", BOOKS]).await, "0 rows affected\n");
    assert_eq!(
        ok(
            &url,
            &[
                "exec",
                "INSERT INTO books VALUES (?, ?, ?, ?), (2, 'b', NULL, NULL)",
                "-p",
                "1",
                "-p",
                "a",
                "-p",
                "1965",
                "-p",
                "9.5"
            ]
        )
        .await,
        "2 rows affected\n"
    );
    let select = "SELECT id, title, year FROM books ORDER BY id";
    assert_eq!(
        ok(&url, &["query", select, "--format", "csv"]).await,
        "id,title,year\n1,a,1965\n2,b,\n"
    );
    let json: Value =
        serde_json::from_str(&ok(&url, &["query", select, "--format", "json"]).await).unwrap();
    assert_eq!(
        json,
        json!([{"id": 1, "title": "a", "year": 1965}, {"id": 2, "title": "b", "year": null}])
    );
    let ndjson = ok(&url, &["query", select, "--format", "ndjson"]).await;
    assert_eq!(
        ndjson,
        "{\"id\":1,\"title\":\"a\",\"year\":1965}\n{\"id\":2,\"title\":\"b\",\"year\":null}\n"
    );
    let table = ok(&url, &["query", select, "--format", "table"]).await;
    assert!(
        table.contains("| title |") && table.contains("NULL"),
        "{table}"
    );
    assert!(table.contains("(2 rows, "), "{table}");
    // Parameters are typed by their JSON literal; SQL may come from stdin.
    let from_stdin = sqlhttp(
        &url,
        &["query", "-p", "\"a\"", "--format", "csv"],
        Some("SELECT id FROM books WHERE title = ?;\n"),
    )
    .await;
    assert_exit(&from_stdin, 0);
    assert_eq!(stdout(&from_stdin), "id\n1\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn csv_round_trips_exactly_through_export_and_import() {
    let server = TestServer::start().await;
    let url = server.url();
    ok(&url, &["exec", BOOKS]).await;
    ok(&url, &["exec", &BOOKS.replace("books", "copy")]).await;
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("books.csv");
    std::fs::write(&input, AWKWARD_CSV).unwrap();
    let imported = ok(&url, &["import", "books", input.to_str().unwrap()]).await;
    assert!(
        imported.starts_with("imported 6 rows into books"),
        "{imported}"
    );

    let exported = ok(
        &url,
        &[
            "query",
            "SELECT * FROM books ORDER BY id",
            "--format",
            "csv-crlf",
        ],
    )
    .await;
    assert_eq!(
        exported, AWKWARD_CSV,
        "the RFC 4180 export is the input, byte for byte"
    );
    let with_lf = ok(
        &url,
        &[
            "query",
            "SELECT * FROM books ORDER BY id",
            "--format",
            "csv",
        ],
    )
    .await;
    assert_eq!(
        with_lf,
        AWKWARD_CSV.replace("\r\n", "\n"),
        "the default export ends lines in LF (a line break inside a quoted field stays as it is)"
    );
    let output = dir.path().join("export.csv");
    std::fs::write(&output, &exported).unwrap();
    ok(&url, &["import", "copy", output.to_str().unwrap()]).await;
    let differences = ok(
        &url,
        &["query", "SELECT count(*) FROM (SELECT * FROM books EXCEPT SELECT * FROM copy UNION ALL SELECT * FROM copy EXCEPT SELECT * FROM books)", "--format", "csv"],
    )
    .await;
    assert_eq!(differences, "count(*)\n0\n");
    let nulls = ok(
        &url,
        &["query", "SELECT id FROM copy WHERE title IS NULL UNION ALL SELECT -id FROM copy WHERE title = ''", "--format", "csv"],
    )
    .await;
    assert_eq!(nulls, "id\n5\n-4\n", "NULL and the empty string stay apart");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ndjson_import_converts_to_declared_types() {
    let server = TestServer::start().await;
    let url = server.url();
    ok(&url, &["exec", BOOKS]).await;
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("books.ndjson");
    std::fs::write(
        &input,
        "{\"id\": 1, \"title\": \"x\", \"year\": \"1999\", \"price\": 2}\n\n{\"id\": \"2\", \"title\": null}\n",
    )
    .unwrap();
    ok(&url, &["import", "books", input.to_str().unwrap()]).await;
    let rows = ok(
        &url,
        &[
            "query",
            "SELECT id, typeof(year), year FROM books ORDER BY id",
            "--format",
            "csv",
        ],
    )
    .await;
    assert_eq!(rows, "id,typeof(year),year\n1,integer,1999\n2,null,\n");
    let bad = dir.path().join("bad.csv");
    std::fs::write(&bad, "id,year\n1,not a year\n").unwrap();
    let refused = sqlhttp(&url, &["import", "books", bad.to_str().unwrap()], None).await;
    assert_exit(&refused, 1);
    assert!(
        stderr(&refused).contains("`not a year` is not an integer"),
        "{}",
        stderr(&refused)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interrupted_import_resumes_without_duplicates() {
    let server = TestServer::start().await;
    let url = server.url();
    ok(&url, &["exec", BOOKS]).await;
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("books.csv");
    std::fs::write(&input, AWKWARD_CSV).unwrap();
    let path = input.to_str().unwrap();

    // Chunks of two rows: the second chunk reaches the server, but every answer to it is lost.
    let proxy = ChaosProxy::start(server.addr()).await.unwrap();
    proxy.push_all([Fault::Pass, Fault::Pass]);
    proxy.push_all(std::iter::repeat_n(Fault::DropAfterForward, 3));
    let interrupted = sqlhttp(
        &proxy.url(),
        &["import", "books", path, "--chunk-rows", "2"],
        None,
    )
    .await;
    assert_exit(&interrupted, 3);
    assert!(stdout(&interrupted).is_empty(), "{}", stdout(&interrupted));
    assert!(
        stderr(&interrupted).contains("run the same import again"),
        "{}",
        stderr(&interrupted)
    );
    assert_eq!(
        ok(
            &url,
            &["query", "SELECT count(*) FROM books", "--format", "csv"]
        )
        .await,
        "count(*)\n4\n"
    );

    // The same import again: the chunks already written are replayed, the rest inserted.
    let resumed = ok(&url, &["import", "books", path, "--chunk-rows", "2"]).await;
    assert!(resumed.starts_with("imported 2 rows"), "{resumed}");
    assert!(
        resumed.contains("resumed: 2 chunks (4 rows) written by an earlier run"),
        "{resumed}"
    );
    assert_eq!(
        ok(
            &url,
            &[
                "query",
                "SELECT count(*), count(DISTINCT id) FROM books",
                "--format",
                "csv"
            ]
        )
        .await,
        "count(*),count(DISTINCT id)\n6,6\n"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_re_import_says_it_wrote_nothing_and_again_writes_anew() {
    let server = TestServer::start().await;
    let url = server.url();
    ok(&url, &["exec", BOOKS]).await;
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("books.csv");
    std::fs::write(&input, AWKWARD_CSV).unwrap();
    let path = input.to_str().unwrap();
    let first = ok(&url, &["import", "books", path]).await;
    assert!(first.starts_with("imported 6 rows"), "{first}");
    // The user starts over: the same file into a table made anew.
    ok(&url, &["exec", "DROP TABLE books"]).await;
    ok(&url, &["exec", BOOKS]).await;
    let replayed = ok(&url, &["import", "books", path]).await;
    assert!(
        replayed.starts_with("already imported into books under key sqlhttp-import-"),
        "{replayed}"
    );
    assert!(replayed.contains("nothing written"), "{replayed}");
    assert!(replayed.contains("--again"), "{replayed}");
    let count = || {
        ok(
            &url,
            &["query", "SELECT count(*) FROM books", "--format", "csv"],
        )
    };
    assert_eq!(count().await, "count(*)\n0\n", "the replay wrote nothing");
    let again = ok(&url, &["import", "books", path, "--again"]).await;
    assert!(again.starts_with("imported 6 rows"), "{again}");
    assert_eq!(count().await, "count(*)\n6\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scripts_run_statement_by_statement_and_stop_at_the_first_error() {
    let server = TestServer::start().await;
    let url = server.url();
    let script = "CREATE TABLE t (x INTEGER);\nINSERT INTO t VALUES (1), (2);\n\\timing off\nSELECT sum(x) AS total\n  FROM t;\nINSERT INTO nowhere VALUES (1);\nINSERT INTO t VALUES (3);\n";
    let output = sqlhttp(&url, &["shell", "--format", "csv"], Some(script)).await;
    assert_exit(&output, 1);
    assert_eq!(
        stdout(&output),
        "0 rows affected\n2 rows affected\nTiming is off.\ntotal\n3\n"
    );
    assert!(
        stderr(&output).contains("no such table: nowhere"),
        "{}",
        stderr(&output)
    );
    assert!(
        stderr(&output).contains("statement at line 6: INSERT INTO nowhere VALUES (1)"),
        "the error names the statement's line and text: {}",
        stderr(&output)
    );
    assert_eq!(
        ok(
            &url,
            &["query", "SELECT count(*) FROM t", "--format", "csv"]
        )
        .await,
        "count(*)\n2\n",
        "nothing after the error ran"
    );
    let tables = sqlhttp(&url, &["shell", "--format", "csv"], Some("\\d\n\\d t\n")).await;
    assert_exit(&tables, 0);
    assert_eq!(
        stdout(&tables),
        "name,type\nt,table\ncolumn,type,nullable,default,primary key\nx,INTEGER,yes,,no\n"
    );
    let missing = sqlhttp(&url, &["shell", "--format", "csv"], Some("\\d nowhere\n")).await;
    assert_exit(&missing, 1);
    assert!(
        stderr(&missing).contains("no such table or view: nowhere"),
        "{}",
        stderr(&missing)
    );

    // The same script from a file, and from a file included by another.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("more.sql");
    std::fs::write(
        &file,
        "INSERT INTO t VALUES (10);\n\n  SELECT x FROM t WHERE x > 5;\n",
    )
    .unwrap();
    assert_eq!(
        ok(
            &url,
            &["shell", "--format", "csv", "--file", file.to_str().unwrap()]
        )
        .await,
        "1 row affected\nx\n10\n"
    );
    let include = format!("\\i {}\nSELECT count(*) AS n FROM t;\n", file.display());
    let included = sqlhttp(&url, &["shell", "--format", "csv"], Some(&include)).await;
    assert_exit(&included, 0);
    assert_eq!(stdout(&included), "1 row affected\nx\n10\n10\nn\n4\n");
    let broken = dir.path().join("broken.sql");
    std::fs::write(&broken, "SELECT 1;\n\nSELEC 2;\n").unwrap();
    let failed = sqlhttp(
        &url,
        &[
            "shell",
            "--format",
            "csv",
            "--file",
            broken.to_str().unwrap(),
        ],
        None,
    )
    .await;
    assert_exit(&failed, 1);
    assert!(
        stderr(&failed).contains("statement at line 3: SELEC 2"),
        "{}",
        stderr(&failed)
    );
    assert!(
        stderr(&failed).contains("broken.sql"),
        "{}",
        stderr(&failed)
    );
    // A script that includes itself is refused, not followed until the stack overflows.
    let looping = dir.path().join("self.sql");
    std::fs::write(&looping, format!("SELECT 1;\n\\i {}\n", looping.display())).unwrap();
    let refused = sqlhttp(
        &url,
        &[
            "shell",
            "--format",
            "csv",
            "--file",
            looping.to_str().unwrap(),
        ],
        None,
    )
    .await;
    assert_exit(&refused, 1);
    assert!(
        stderr(&refused).contains("includes itself"),
        "{}",
        stderr(&refused)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exit_codes() {
    let server = TestServer::start().await;
    let url = server.url();
    // 1: the server refused the statement; nothing on stdout, the code, attempts and the
    // request's id (to find it in the server's log) on stderr.
    let sql_error = sqlhttp(&url, &["query", "SELEC 1"], None).await;
    assert_exit(&sql_error, 1);
    assert!(stdout(&sql_error).is_empty());
    assert!(
        stderr(&sql_error).contains("[code SQL_ERROR, 1 attempt, request "),
        "{}",
        stderr(&sql_error)
    );
    let not_allowed = sqlhttp(&url, &["exec", "ATTACH 'x.db' AS x"], None).await;
    assert_exit(&not_allowed, 1);
    assert!(stderr(&not_allowed).contains("STATEMENT_NOT_ALLOWED"));
    // 2: usage.
    assert_exit(&sqlhttp(&url, &["frobnicate"], None).await, 2);
    assert_exit(
        &sqlhttp(&url, &["query", "SELECT 1", "--format", "xml"], None).await,
        2,
    );
    assert_exit(
        &sqlhttp(&url, &["import", "t", "/no/such/file.csv"], None).await,
        2,
    );
    assert_exit(
        &sqlhttp(&url, &["--token-file", "/no/such/token", "ping"], None).await,
        2,
    );
    // 3: no server, or no answer in time.
    let refused = sqlhttp("http://127.0.0.1:1", &["ping", "--retries", "2"], None).await;
    assert_exit(&refused, 3);
    let said = stderr(&refused);
    assert!(
        said.contains("http://127.0.0.1:1"),
        "names the server: {said}"
    );
    assert_eq!(
        said.matches("attempts").count(),
        1,
        "the count once: {said}"
    );
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let silent_url = format!("http://{}", silent.local_addr().unwrap());
    let timed_out = sqlhttp(
        &silent_url,
        &["ping", "--timeout", "300ms", "--retries", "1"],
        None,
    )
    .await;
    assert_exit(&timed_out, 3);
    drop(silent);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_from_a_file() {
    let server = TestServer::with_config(sqlhttp_server::Config {
        tokens: vec!["s3cret".into()],
        ..sqlhttp_server::Config::default()
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, "# the service's token\n\ns3cret\n").unwrap();
    let url = server.url();
    let refused = sqlhttp(&url, &["ping"], None).await;
    assert_exit(&refused, 1);
    assert!(
        stderr(&refused).contains("--token TOKEN or the SQLHTTP_TOKEN"),
        "says how to pass a token: {}",
        stderr(&refused)
    );
    ok(
        &url,
        &["--token-file", token_file.to_str().unwrap(), "ping"],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_interactive_shell_on_a_terminal() {
    let server = TestServer::start().await;
    let url = server.url();
    let dir = tempfile::tempdir().unwrap();
    let history = dir.path().join("history");
    let binary = assert_cmd::cargo::cargo_bin("sqlhttp");
    let history_env = history.clone();
    let transcript = tokio::task::spawn_blocking(move || {
        let mut command = std::process::Command::new(binary);
        command
            .args(["--url", &url, "shell"])
            .env("SQLHTTP_HISTORY", &history_env)
            .env("TERM", "dumb");
        let mut shell = rexpect::session::spawn_command(command, Some(20_000)).unwrap();
        shell.exp_string("sqlhttp> ").unwrap();
        shell.send_line("SELECT 40 + 2").unwrap();
        shell.exp_string("...> ").unwrap();
        shell.send_line("  AS answer;").unwrap();
        let (before, _) = shell.exp_regex(r"\(1 row, [0-9.]+ ms\)").unwrap();
        shell.send_line("\\q").unwrap();
        shell.exp_eof().unwrap();
        before
    })
    .await
    .unwrap();
    assert!(transcript.contains("answer"), "{transcript}");
    assert!(transcript.contains("| 42"), "{transcript}");
    let saved = std::fs::read_to_string(&history).unwrap();
    assert!(saved.contains("AS answer;"), "history is kept: {saved}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn any_statement_is_a_verified_read_first_and_a_write_runs_once() {
    let server = TestServer::start().await;
    ok(&server.url(), &["exec", "CREATE TABLE n (i INTEGER)"]).await;
    let proxy = server.proxy().await;
    let url = proxy.url();
    const FIVE: &str =
        "WITH RECURSIVE r(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM r WHERE i < 5) ";

    // A `WITH` that only reads is a read: its lost answer is asked for again.
    proxy.push(Fault::DropAfterForward);
    let out = ok(
        &url,
        &[
            "query",
            &format!("{FIVE}SELECT i FROM r"),
            "--format",
            "csv",
        ],
    )
    .await;
    assert_eq!(out.lines().count(), 6, "a header and five rows: {out}");
    assert_eq!(proxy.forwarded(), 2, "retried once");

    // A write is refused as a read (nothing written), then sent once for its effect; its
    // returned rows stream out like a query's.
    let write = format!("INSERT INTO n (i) {FIVE}SELECT i FROM r RETURNING i");
    let out = ok(&url, &["query", &write, "--format", "csv"]).await;
    assert_eq!(out.lines().count(), 6, "{out}");
    assert_eq!(proxy.forwarded(), 4, "refused as a read, then run once");
    let count = ok(
        &url,
        &["query", "SELECT count(*) AS c FROM n", "--format", "csv"],
    )
    .await;
    assert_eq!(count.lines().nth(1), Some("5"));

    // A write whose answer is lost is not sent again: the CLI fails, and it ran once.
    proxy.push_all([Fault::Pass, Fault::DropAfterForward]);
    let failed = sqlhttp(&url, &["query", &write, "--format", "csv"], None).await;
    assert_ne!(failed.status.code(), Some(0), "{}", stderr(&failed));
    let count = ok(
        &url,
        &["query", "SELECT count(*) AS c FROM n", "--format", "csv"],
    )
    .await;
    assert_eq!(
        count.lines().nth(1),
        Some("10"),
        "applied exactly once more"
    );

    // A statement with no result set still reports what it changed.
    let out = ok(&url, &["query", "UPDATE n SET i = i + 1"]).await;
    assert!(out.starts_with("10 rows affected"), "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_from_a_file_commits_whole_or_not_at_all() {
    let server = TestServer::start().await;
    let url = server.url();
    ok(
        &url,
        &[
            "exec",
            "CREATE TABLE acct (id INTEGER PRIMARY KEY, balance INTEGER NOT NULL)",
        ],
    )
    .await;
    ok(
        &url,
        &["exec", "INSERT INTO acct VALUES (1, 100), (2, 100)"],
    )
    .await;
    let dir = tempfile::tempdir().unwrap();
    let transfer = dir.path().join("transfer.sql");
    std::fs::write(
        &transfer,
        "UPDATE acct SET balance = balance - 30 WHERE id = 1;\n\
         UPDATE acct SET balance = balance + 30 WHERE id = 2;\n\
         SELECT id, balance FROM acct ORDER BY id\n",
    )
    .unwrap();
    let path = transfer.to_str().unwrap();
    let done = ok(
        &url,
        &["batch", path, "--format", "csv", "--key", "transfer-1"],
    )
    .await;
    assert_eq!(
        done.lines().take(5).collect::<Vec<_>>(),
        [
            "1 row affected",
            "1 row affected",
            "id,balance",
            "1,70",
            "2,130"
        ],
        "{done}"
    );
    assert!(
        done.contains("committed 3 statements in one batch"),
        "{done}"
    );
    // The same file under the same key: replayed, not applied again.
    ok(
        &url,
        &["batch", path, "--format", "csv", "--key", "transfer-1"],
    )
    .await;
    let balances = || {
        ok(
            &url,
            &[
                "query",
                "SELECT balance FROM acct ORDER BY id",
                "--format",
                "csv",
            ],
        )
    };
    assert_eq!(balances().await, "balance\n70\n130\n");

    // A failing statement: nothing of the batch is applied, and the error names it.
    let broken = dir.path().join("broken.sql");
    std::fs::write(
        &broken,
        "UPDATE acct SET balance = 0 WHERE id = 1;\nUPDATE acct SET balance = NULL WHERE id = 2;\n",
    )
    .unwrap();
    let failed = sqlhttp(&url, &["batch", broken.to_str().unwrap()], None).await;
    assert_exit(&failed, 1);
    assert!(
        stderr(&failed).contains("the batch's statement #2 (UPDATE acct SET balance = NULL"),
        "{}",
        stderr(&failed)
    );
    assert_eq!(balances().await, "balance\n70\n130\n", "nothing applied");
    // From stdin too.
    let from_stdin = sqlhttp(
        &url,
        &["batch", "-", "--format", "csv"],
        Some("UPDATE acct SET balance = balance + 1;"),
    )
    .await;
    assert_exit(&from_stdin, 0);
    assert!(stdout(&from_stdin).starts_with("2 rows affected\n"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_add_run_info_revert() {
    let server = TestServer::start().await;
    let url = server.url();
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("migrations");
    let source = source.to_str().unwrap();

    // No directory yet: a usage error that says how to make one.
    let missing = sqlhttp(&url, &["migrate", "run", "--source", source], None).await;
    assert_exit(&missing, 2);
    assert!(
        stderr(&missing).contains("migrate add"),
        "{}",
        stderr(&missing)
    );

    let added = ok(
        &url,
        &["migrate", "--source", source, "add", "Create books"],
    )
    .await;
    assert!(added.contains("0001_create_books.sql"), "{added}");
    let added = ok(
        &url,
        &["migrate", "add", "add isbn", "-r", "--source", source],
    )
    .await;
    assert!(
        added.contains("0002_add_isbn.sql") && added.contains("0002_add_isbn.down.sql"),
        "{added}"
    );
    let file = |name: &str| dir.path().join("migrations").join(name);
    let append = |name: &str, sql: &str| {
        let mut text = std::fs::read_to_string(file(name)).unwrap();
        text.push_str(sql);
        std::fs::write(file(name), text).unwrap();
    };
    append(
        "0001_create_books.sql",
        "CREATE TABLE books (id INTEGER PRIMARY KEY, title TEXT NOT NULL);\n",
    );
    append(
        "0002_add_isbn.sql",
        "ALTER TABLE books ADD COLUMN isbn TEXT;\n",
    );
    append(
        "0002_add_isbn.down.sql",
        "ALTER TABLE books DROP COLUMN isbn;\n",
    );

    let info = ok(&url, &["migrate", "info", "--source", source]).await;
    assert_eq!(info.matches("pending").count(), 2, "{info}");
    let ran = ok(&url, &["migrate", "run", "--source", source]).await;
    assert!(
        ran.contains("applied 0001_create_books")
            && ran.contains("applied 0002_add_isbn")
            && ran.contains("at version 2"),
        "{ran}"
    );
    let again = ok(&url, &["migrate", "run", "--source", source]).await;
    assert_eq!(again.trim(), "nothing to apply: at version 2");
    let reverted = ok(&url, &["migrate", "revert", "--source", source]).await;
    assert_eq!(reverted.trim(), "reverted 0002_add_isbn");
    let info = ok(&url, &["migrate", "info", "--source", source]).await;
    assert!(
        info.contains("applied") && info.matches("pending").count() == 1,
        "{info}"
    );

    // An applied file changed: refused, exit 1, both checksums named.
    append("0001_create_books.sql", "-- an afterthought\n");
    let changed = sqlhttp(&url, &["migrate", "run", "--source", source], None).await;
    assert_exit(&changed, 1);
    let message = stderr(&changed);
    assert!(
        message.contains("0001_create_books.sql")
            && message.contains("changed after it was applied"),
        "{message}"
    );
    // A history table name that cannot be one, and a reserved word that can (it is quoted).
    let bad = sqlhttp(
        &url,
        &["migrate", "info", "--source", source, "--table", "my-table"],
        None,
    )
    .await;
    assert_exit(&bad, 2);
    let order = ok(
        &url,
        &["migrate", "info", "--source", source, "--table", "order"],
    )
    .await;
    assert_eq!(order.matches("pending").count(), 2, "{order}");
    // And a file that is not named as a migration: a usage error naming it.
    std::fs::write(file("books.sql"), "SELECT 1;").unwrap();
    let misnamed = sqlhttp(&url, &["migrate", "info", "--source", source], None).await;
    assert_exit(&misnamed, 2);
    assert!(
        stderr(&misnamed).contains("books.sql"),
        "{}",
        stderr(&misnamed)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn begin_commit_and_rollback_drive_a_transaction_in_the_shell() {
    let server = TestServer::start().await;
    let url = server.url();
    let setup = "CREATE TABLE acct (id INTEGER PRIMARY KEY, balance INTEGER);\n\
                 INSERT INTO acct VALUES (1, 100), (2, 0);\n";
    assert_exit(&sqlhttp(&url, &["shell"], Some(setup)).await, 0);
    let balances = || async {
        ok(
            &url,
            &[
                "query",
                "SELECT id, balance FROM acct ORDER BY id",
                "--format",
                "csv",
            ],
        )
        .await
    };

    // Read, decide, write: one transaction, committed whole.
    let transfer = "BEGIN;\n\
                    UPDATE acct SET balance = balance - 30 WHERE id = 1;\n\
                    SELECT balance FROM acct WHERE id = 1;\n\
                    UPDATE acct SET balance = balance + 30 WHERE id = 2;\n\
                    COMMIT;\n";
    let output = sqlhttp(&url, &["shell", "--format", "csv"], Some(transfer)).await;
    assert_exit(&output, 0);
    assert_eq!(
        stdout(&output),
        "BEGIN\n1 row affected\nbalance\n70\n1 row affected\nCOMMIT\n"
    );
    assert_eq!(balances().await, "id,balance\n1,70\n2,30\n");

    // A script stops at its first error and rolls back what its transaction did.
    let failing = "BEGIN;\n\
                   UPDATE acct SET balance = 0 WHERE id = 1;\n\
                   INSERT INTO nowhere VALUES (1);\n\
                   UPDATE acct SET balance = 0 WHERE id = 2;\n\
                   COMMIT;\n";
    let output = sqlhttp(&url, &["shell", "--format", "csv"], Some(failing)).await;
    assert_exit(&output, 1);
    assert!(
        stderr(&output).contains("no such table: nowhere")
            && stderr(&output).contains("the open transaction was rolled back"),
        "{}",
        stderr(&output)
    );
    assert_eq!(
        balances().await,
        "id,balance\n1,70\n2,30\n",
        "nothing was kept"
    );

    // A script that ends inside a transaction rolls it back, and says so.
    let unfinished = "BEGIN;\nDELETE FROM acct;\n";
    let output = sqlhttp(&url, &["shell", "--format", "csv"], Some(unfinished)).await;
    assert_exit(&output, 0);
    assert!(
        stderr(&output)
            .contains("ended inside a transaction: the open transaction was rolled back"),
        "{}",
        stderr(&output)
    );
    assert_eq!(balances().await, "id,balance\n1,70\n2,30\n");

    // Explicit ROLLBACK; and the commands out of place are errors that say why.
    let rolled = "BEGIN;\nDELETE FROM acct;\nROLLBACK;\n";
    let output = sqlhttp(&url, &["shell", "--format", "csv"], Some(rolled)).await;
    assert_exit(&output, 0);
    assert_eq!(stdout(&output), "BEGIN\n2 rows affected\nROLLBACK\n");
    assert_eq!(balances().await, "id,balance\n1,70\n2,30\n");
    for (script, why) in [
        ("COMMIT;\n", "no transaction is open"),
        ("BEGIN;\nBEGIN;\n", "a transaction is already open"),
        ("BEGIN;\nSAVEPOINT a;\n", "savepoints are not available"),
    ] {
        let output = sqlhttp(&url, &["shell"], Some(script)).await;
        assert_exit(&output, 1);
        assert!(
            stderr(&output).contains(why),
            "{script}: {}",
            stderr(&output)
        );
    }

    // A read-only transaction refuses a write.
    let read_only = "BEGIN READ ONLY;\nSELECT count(*) AS n FROM acct;\nDELETE FROM acct;\n";
    let output = sqlhttp(&url, &["shell", "--format", "csv"], Some(read_only)).await;
    assert_exit(&output, 1);
    assert!(
        stdout(&output).starts_with("BEGIN\nn\n2\n"),
        "{}",
        stdout(&output)
    );
    assert_eq!(balances().await, "id,balance\n1,70\n2,30\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shell_prompt_shows_an_open_transaction() {
    let server = TestServer::start().await;
    let url = server.url();
    let dir = tempfile::tempdir().unwrap();
    let history = dir.path().join("history");
    let binary = assert_cmd::cargo::cargo_bin("sqlhttp");
    let transcript = tokio::task::spawn_blocking(move || {
        let mut command = std::process::Command::new(binary);
        command
            .args(["--url", &url, "shell"])
            .env("SQLHTTP_HISTORY", &history)
            .env("TERM", "dumb");
        let mut shell = rexpect::session::spawn_command(command, Some(20_000)).unwrap();
        shell.exp_string("sqlhttp> ").unwrap();
        shell.send_line("CREATE TABLE t (x INTEGER);").unwrap();
        shell.exp_string("sqlhttp> ").unwrap();
        shell.send_line("BEGIN;").unwrap();
        shell.exp_string("sqlhttp*> ").unwrap();
        shell.send_line("INSERT INTO t VALUES (1);").unwrap();
        shell.exp_string("sqlhttp*> ").unwrap();
        shell.send_line("COMMIT;").unwrap();
        let before = shell.exp_string("sqlhttp> ").unwrap();
        shell.send_line("\\q").unwrap();
        shell.exp_eof().unwrap();
        before
    })
    .await
    .unwrap();
    assert!(transcript.contains("COMMIT"), "{transcript}");
}

/// `--verbose` prints the server's request id and the call's attempts (a read whose first answer
/// was lost takes two); `\timing` puts the server's time beside the round trip.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verbose_names_the_request_and_its_attempts_and_timing_the_server_s_time() {
    let server = TestServer::start().await;
    let proxy = server.proxy().await;
    let url = proxy.url();
    ok(&url, &["exec", "CREATE TABLE v (x INTEGER)"]).await;

    // The first answer of the read is lost after the server ran it: the CLI's read is retried.
    proxy.push(Fault::DropAfterForward);
    let output = sqlhttp(
        &url,
        &[
            "query",
            "SELECT count(*) AS n FROM v",
            "--format",
            "csv",
            "--verbose",
        ],
        None,
    )
    .await;
    assert_exit(&output, 0);
    assert_eq!(stdout(&output), "n\n0\n", "verbose output goes to stderr");
    let verbose = stderr(&output);
    let line = verbose
        .lines()
        .find(|line| line.starts_with("-- request "))
        .unwrap_or_else(|| panic!("no request line: {verbose}"));
    assert!(line.contains(", 2 attempts"), "{line}");
    let id = line["-- request ".len()..].split(',').next().unwrap();
    assert!(!id.is_empty() && !id.contains(' '), "{line}");

    // Without --verbose, nothing of it.
    let quiet = sqlhttp(&url, &["query", "SELECT 1 AS one", "--format", "csv"], None).await;
    assert_exit(&quiet, 0);
    assert!(!stderr(&quiet).contains("-- request"), "{}", stderr(&quiet));

    // \timing: the round trip, and the server's time for the statement beside it.
    let output = sqlhttp(
        &url,
        &["shell", "--format", "csv", "--verbose"],
        Some("\\timing on\nSELECT 1 AS one;\n"),
    )
    .await;
    assert_exit(&output, 0);
    let out = stdout(&output);
    let time = out
        .lines()
        .find(|line| line.starts_with("Time: "))
        .unwrap_or_else(|| panic!("no time line: {out}"));
    assert!(
        time.contains(" ms (server: ") && time.ends_with(" ms)"),
        "{time}"
    );
    assert!(
        stderr(&output).contains(", 1 attempt, server "),
        "{}",
        stderr(&output)
    );
}
