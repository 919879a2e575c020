//! Exit codes and error messages: 0 success, 1 a server or SQL error, 2 usage (bad flags or
//! input files), 3 a connection failure or timeout. Messages go to stderr, with the protocol's
//! code and the attempts made when the server gave them.
//!
//! Knows the SDK's error type; nothing about commands.

use std::fmt;
use std::process::ExitCode;

/// A mistake in how the command was called: bad flags, unreadable files, no SQL.
#[derive(Debug)]
pub(crate) struct UsageError(pub(crate) String);

impl fmt::Display for UsageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for UsageError {}

pub(crate) const SERVER: u8 = 1;
pub(crate) const USAGE: u8 = 2;
pub(crate) const CONNECTION: u8 = 3;

/// The exit code for `error`.
pub(crate) fn code_of(error: &anyhow::Error) -> u8 {
    if error.chain().any(|cause| cause.is::<UsageError>()) {
        return USAGE;
    }
    match error
        .chain()
        .find_map(|cause| cause.downcast_ref::<sqlhttp::Error>())
    {
        Some(sdk) if sdk.is_timeout() || sdk.is_connection() => CONNECTION,
        Some(sdk) if matches!(sdk.kind(), sqlhttp::ErrorKind::Config { .. }) => USAGE,
        _ if error.chain().any(|cause| {
            cause
                .downcast_ref::<std::io::Error>()
                .is_some_and(|io| io.kind() == std::io::ErrorKind::NotFound)
        }) =>
        {
            USAGE
        }
        _ => SERVER,
    }
}

/// Writes `error` to stderr and returns its exit code.
pub(crate) fn report(error: &anyhow::Error) -> ExitCode {
    // The chain of contexts down to the SDK's error, whose message already tells its causes.
    let mut parts: Vec<String> = Vec::new();
    for cause in error.chain() {
        let text = cause.to_string();
        // An error that shows its source already (`{context}: {source}`) is not followed by it.
        if parts.last().is_some_and(|last| last.ends_with(&text)) {
            break;
        }
        parts.push(text);
        if cause.is::<sqlhttp::Error>() {
            break;
        }
    }
    let mut message = format!("sqlhttp: {}", parts.join(": "));
    if let Some(sdk) = error
        .chain()
        .find_map(|cause| cause.downcast_ref::<sqlhttp::Error>())
    {
        let mut details = Vec::new();
        if let Some(code) = sdk.code() {
            details.push(format!("code {code}"));
        }
        // The SDK's message says "(after N attempts)" already when there were several.
        if sdk.attempts() == 1 {
            details.push("1 attempt".to_owned());
        }
        // To find the failed attempt in the server's log.
        if let Some(id) = sdk.request_id() {
            details.push(format!("request {id}"));
        }
        if !details.is_empty() {
            message.push_str(&format!(" [{}]", details.join(", ")));
        }
        if let Some(hint) = credential_hint(sdk) {
            message.push_str(&format!("\n{hint}"));
        }
    }
    eprintln!("{message}");
    ExitCode::from(code_of(error))
}

/// What to do about a refused credential: how this CLI passes a token.
fn credential_hint(error: &sqlhttp::Error) -> Option<&'static str> {
    match error.kind() {
        sqlhttp::ErrorKind::Unauthorized { .. } => Some(
            "hint: pass the server's token with --token TOKEN or the SQLHTTP_TOKEN environment variable",
        ),
        sqlhttp::ErrorKind::ReadOnly { .. } => Some(
            "hint: this token may only read; writes need a full-access token (--token or SQLHTTP_TOKEN)",
        ),
        _ => None,
    }
}
