//! `ServerProcess` against stand-in servers written in `sh`: the `--listen` argument it passes,
//! the announce line it parses, its errors, and the kill on drop.
#![cfg(unix)]

use std::io;

use sqlhttp_testkit::ServerProcess;

/// Spawns `sh -c script`; the script sees `--listen 127.0.0.1:0` as `$0 $1`.
async fn spawn_sh(script: &str) -> io::Result<ServerProcess> {
    ServerProcess::spawn("sh", ["-c", script]).await
}

#[tokio::test]
async fn reads_the_announced_address_after_passing_listen() {
    let server = spawn_sh(
        r#"[ "$0 $1" = "--listen 127.0.0.1:0" ] || exit 2
           echo "listening on http://127.0.0.1:4242"
           echo "more output is drained"
           exec sleep 30"#,
    )
    .await
    .unwrap();
    assert_eq!(server.url(), "http://127.0.0.1:4242");
    assert_eq!(server.addr(), "127.0.0.1:4242".parse().unwrap());
    server.kill().await.unwrap();
}

#[tokio::test]
async fn another_first_line_is_invalid_data() {
    let error = spawn_sh("echo 'starting up'; exec sleep 30")
        .await
        .unwrap_err();
    assert_eq!(error.kind(), io::ErrorKind::InvalidData, "{error}");
    let error = spawn_sh("echo 'listening on ftp://x'; exec sleep 30")
        .await
        .unwrap_err();
    assert_eq!(error.kind(), io::ErrorKind::InvalidData, "{error}");
}

#[tokio::test]
async fn a_prepared_command_keeps_its_environment_and_gets_listen_appended() {
    let mut command = std::process::Command::new("sh");
    command
        .args([
            "-c",
            r#"[ "$0 $1" = "--listen 127.0.0.1:0" ] || exit 2
               echo "listening on http://127.0.0.1:$ANNOUNCED_PORT"
               exec sleep 30"#,
        ])
        .env("ANNOUNCED_PORT", "4343");
    let server = ServerProcess::spawn_command(command).await.unwrap();
    assert_eq!(server.url(), "http://127.0.0.1:4343");
    server.kill().await.unwrap();
}

#[tokio::test]
async fn exiting_before_announcing_is_unexpected_eof() {
    let error = spawn_sh("exit 3").await.unwrap_err();
    assert_eq!(error.kind(), io::ErrorKind::UnexpectedEof, "{error}");
}

#[tokio::test]
async fn a_missing_binary_is_not_found() {
    let error = ServerProcess::spawn("./no-such-sqlhttpd-binary", std::iter::empty::<&str>())
        .await
        .unwrap_err();
    assert_eq!(error.kind(), io::ErrorKind::NotFound, "{error}");
}

#[cfg(target_os = "linux")]
#[tokio::test]
async fn dropping_kills_the_child() {
    let server = spawn_sh("echo 'listening on http://127.0.0.1:4242'; exec sleep 30")
        .await
        .unwrap();
    let pid = server.id().unwrap();
    drop(server);
    // Killed means gone, or a zombie until the runtime reaps it.
    let mut dead = false;
    for _ in 0..500 {
        match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
            Err(_) => dead = true,
            Ok(stat) => {
                dead = stat
                    .rsplit(')')
                    .next()
                    .is_some_and(|rest| rest.trim_start().starts_with('Z'))
            }
        }
        if dead {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(2)).await;
    }
    assert!(dead, "the child {pid} is still running");
}
