//! Building the SDK client from the connection flags: URL, token (flag, environment or file),
//! per-attempt timeout and attempts.
//!
//! Knows the flags and the SDK's builder; nothing about commands or output.

use anyhow::Context as _;
use sqlhttp::{Client, RetryPolicy};

use crate::args::Connection;
use crate::exit::UsageError;

/// The token in a token file: its first line that is neither blank nor a `#` comment.
fn read_token_file(path: &std::path::Path) -> anyhow::Result<String> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        UsageError(format!(
            "cannot read the token file {}: {e}",
            path.display()
        ))
    })?;
    text.lines()
        .map(str::trim)
        .find(|line| !line.is_empty() && !line.starts_with('#'))
        .map(str::to_owned)
        .ok_or_else(|| {
            UsageError(format!("the token file {} holds no token", path.display())).into()
        })
}

/// The client the flags describe.
pub(crate) fn client(connection: &Connection) -> anyhow::Result<Client> {
    let token = match (&connection.token, &connection.token_file) {
        (Some(token), _) => Some(token.clone()),
        (None, Some(path)) => Some(read_token_file(path)?),
        (None, None) => None,
    };
    let mut builder = Client::builder(connection.url.clone())
        .user_agent(concat!("sqlhttp-cli/", env!("CARGO_PKG_VERSION")));
    if let Some(token) = token {
        builder = builder.bearer_token(token);
    }
    if let Some(timeout) = connection.timeout {
        builder = builder.timeout(timeout);
    }
    if let Some(attempts) = connection.retries {
        builder = builder.retry(RetryPolicy::new().with_max_attempts(attempts));
    }
    builder
        .build()
        .map_err(|e| UsageError(e.to_string()))
        .context("invalid connection settings")
}
