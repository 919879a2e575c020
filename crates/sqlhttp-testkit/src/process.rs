//! [`ServerProcess`]: a server binary (normally `sqlhttpd`) run as a child process on an
//! ephemeral loopback port, killed on drop.
//!
//! This module knows only the binary's command-line contract (`--listen ADDR`, then a first
//! stdout line `listening on http://HOST:PORT`). It must not know the server crate, the SDK or
//! the wire protocol.

use std::ffi::OsStr;
use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, ChildStdout, Command};

/// How long the child has to announce its address.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(30);
/// What the child's first stdout line starts with.
const BANNER: &str = "listening on ";

/// A server binary running as a child process, listening on `127.0.0.1` (an ephemeral port).
///
/// [`spawn`](Self::spawn) runs `BINARY ARGS... --listen 127.0.0.1:0` and waits for the child's
/// first stdout line, `listening on http://HOST:PORT`, which gives its address. The rest of its
/// stdout is read and discarded; its stderr is inherited (logs show up with the test's output).
/// [`spawn_command`](Self::spawn_command) does the same for a command the caller prepared (its
/// environment, say). The child is killed when the `ServerProcess` is dropped.
///
/// In the server crate's own tests, the binary is `env!("CARGO_BIN_EXE_sqlhttpd")`.
///
/// ```no_run
/// use sqlhttp_testkit::ServerProcess;
///
/// # async fn run() -> std::io::Result<()> {
/// let server = ServerProcess::spawn("target/debug/sqlhttpd", ["--no-idempotency"]).await?;
/// let client = sqlhttp::Client::builder(server.url()).build().unwrap();
/// client.ping().await.unwrap();
/// # Ok(())
/// # }
/// ```
pub struct ServerProcess {
    child: Child,
    addr: SocketAddr,
    url: String,
}

impl fmt::Debug for ServerProcess {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ServerProcess")
            .field("pid", &self.child.id())
            .field("url", &self.url)
            .finish_non_exhaustive()
    }
}

impl ServerProcess {
    /// Starts `binary` with `args` followed by `--listen 127.0.0.1:0` (so `args` must not set
    /// `--listen`), and waits up to 30 s for it to announce its address.
    ///
    /// # Errors
    /// When the binary cannot be started, exits or closes its stdout before announcing, does not
    /// announce in time (`TimedOut`), or announces something else than
    /// `listening on http://HOST:PORT` (`InvalidData`). The child is killed in every case.
    pub async fn spawn<I, S>(binary: impl AsRef<Path>, args: I) -> io::Result<ServerProcess>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let mut command = Command::new(binary.as_ref());
        command.args(args).stderr(Stdio::inherit());
        ServerProcess::spawn_command(command).await
    }

    /// Like [`spawn`](Self::spawn), for a command the caller prepared: program, arguments,
    /// environment, working directory, and where stderr goes (inherited unless the command
    /// says otherwise; a pipe nobody reads can stall a chatty server). The `ServerProcess` adds
    /// `--listen 127.0.0.1:0` to the arguments and takes over stdin (null) and stdout. Takes a
    /// `std::process::Command` or a `tokio::process::Command`.
    ///
    /// ```no_run
    /// use std::process::Command;
    /// use sqlhttp_testkit::ServerProcess;
    ///
    /// # async fn run() -> std::io::Result<()> {
    /// let mut command = Command::new("target/debug/sqlhttpd");
    /// command.env("RUST_LOG", "warn").env_remove("SQLHTTPD_TOKENS");
    /// let server = ServerProcess::spawn_command(command).await?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    /// As [`spawn`](Self::spawn).
    pub async fn spawn_command(command: impl Into<Command>) -> io::Result<ServerProcess> {
        let mut command = command.into();
        let mut child = command
            .args(["--listen", "127.0.0.1:0"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()?;
        let stdout = child
            .stdout
            .take()
            .ok_or_else(|| io::Error::other("the child's stdout is not piped"))?;
        // On any error below, dropping `child` kills it.
        let (first_line, rest) = tokio::time::timeout(STARTUP_TIMEOUT, first_line(stdout))
            .await
            .map_err(|_| {
                io::Error::new(
                    io::ErrorKind::TimedOut,
                    "the server did not announce its address in time",
                )
            })??;
        let url = first_line
            .strip_prefix(BANNER)
            .ok_or_else(|| unexpected(&first_line))?
            .to_owned();
        let addr = url
            .strip_prefix("http://")
            .and_then(|host_port| host_port.trim_end_matches('/').parse().ok())
            .ok_or_else(|| unexpected(&first_line))?;
        // Keep draining stdout so the child never blocks on a full pipe; ends at the child's exit.
        tokio::spawn(drain(rest));
        Ok(ServerProcess { child, addr, url })
    }

    /// The address the child listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The base URL the child announced, `http://HOST:PORT`.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The child's process id, `None` once it has been reaped.
    pub fn id(&self) -> Option<u32> {
        self.child.id()
    }

    /// Kills the child and waits for it to exit.
    ///
    /// # Errors
    /// When the child cannot be killed or waited for.
    pub async fn kill(mut self) -> io::Result<()> {
        self.child.kill().await
    }
}

/// Reads the first line of `stdout` (without its line ending), handing back the reader.
async fn first_line(stdout: ChildStdout) -> io::Result<(String, BufReader<ChildStdout>)> {
    let mut reader = BufReader::new(stdout);
    let mut line = String::new();
    if reader.read_line(&mut line).await? == 0 {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "the server closed its stdout before announcing its address",
        ));
    }
    let line = line.trim_end_matches(['\r', '\n']).to_owned();
    Ok((line, reader))
}

async fn drain(mut reader: BufReader<ChildStdout>) {
    let mut sink = tokio::io::sink();
    let _ = tokio::io::copy_buf(&mut reader, &mut sink).await;
}

fn unexpected(line: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("expected `{BANNER}http://HOST:PORT` as the first line, got {line:?}"),
    )
}
