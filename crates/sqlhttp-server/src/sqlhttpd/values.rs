//! The parsers of the flags' values (URLs, tokens, durations) and the gathering of the values
//! that may also come from environment variables or files (tokens, read replicas).
//!
//! Each takes text and returns a value or the message clap shows; nothing here knows the
//! [`Cli`](super::flags::Cli) struct or builds a configuration.

use std::path::PathBuf;
use std::time::Duration;

use sqlhttp_server::{Database, PostgresUrl, parse_duration, read_token_file};

/// Environment variable with the read replicas' URLs (separated by spaces or commas), used when
/// no `--read-replica` is given.
const READ_REPLICAS_ENV: &str = "SQLHTTPD_READ_REPLICAS";

pub(crate) fn parse_otlp_endpoint(url: &str) -> Result<String, String> {
    match url.parse::<axum::http::Uri>() {
        // Plain HTTP: the binary carries no TLS client for this (a collector agent beside it
        // takes the spans on to a TLS endpoint).
        Ok(uri) if uri.scheme_str() == Some("http") && uri.host().is_some() => {
            Ok(format!("{}/v1/traces", url.trim_end_matches('/')))
        }
        _ => Err(format!(
            "{url:?} is not an http:// URL (for a TLS collector, send to an agent beside sqlhttpd)"
        )),
    }
}

/// Where spans are exported, when they are: the flag's URL, or the standard environment's.
pub(crate) fn otlp_target(flag: Option<String>) -> Option<Option<String>> {
    if flag.is_some() {
        return Some(flag);
    }
    let set = |name: &str| std::env::var_os(name).is_some_and(|value| !value.is_empty());
    (set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") || set("OTEL_EXPORTER_OTLP_ENDPOINT"))
        .then_some(None)
}

pub(crate) fn parse_database(url: &str) -> Result<Database, String> {
    url.parse()
        .map_err(|e: sqlhttp_server::ServerError| e.to_string())
}

pub(crate) fn parse_replica(url: &str) -> Result<PostgresUrl, String> {
    match parse_database(url.trim())? {
        Database::Postgres(url) => Ok(url),
        _ => Err("a read replica is a postgres:// URL".to_owned()),
    }
}

pub(crate) fn parse_duration_or_zero(input: &str) -> Result<Duration, String> {
    if input.trim() == "0" {
        return Ok(Duration::ZERO);
    }
    parse_positive_duration(input)
}

/// The replicas of the flags, or else of `SQLHTTPD_READ_REPLICAS`.
pub(crate) fn gather_replicas(flags: Vec<PostgresUrl>) -> Result<Vec<PostgresUrl>, String> {
    if !flags.is_empty() {
        return Ok(flags);
    }
    std::env::var(READ_REPLICAS_ENV)
        .unwrap_or_default()
        .split(|c: char| c == ',' || c.is_whitespace())
        .filter(|url| !url.is_empty())
        .map(|url| parse_replica(url).map_err(|e| format!("{READ_REPLICAS_ENV}: {e}")))
        .collect()
}

pub(crate) fn parse_token(token: &str) -> Result<String, String> {
    let token = token.trim();
    if token.is_empty() {
        Err("a token must not be empty (omit --token for an open server)".to_owned())
    } else {
        Ok(token.to_owned())
    }
}

pub(crate) fn parse_advertise_url(input: &str) -> Result<String, String> {
    let url = input.trim().trim_end_matches('/');
    match url.parse::<http::Uri>() {
        Ok(uri)
            if uri.scheme_str() == Some("http")
                && uri.authority().is_some()
                && uri.path() == "/" =>
        {
            Ok(url.to_owned())
        }
        _ => Err(
            "an http://HOST:PORT URL (peers forward over plain HTTP, inside the network)"
                .to_owned(),
        ),
    }
}

pub(crate) fn parse_positive_duration(input: &str) -> Result<Duration, String> {
    parse_duration(input).map_err(|e| e.to_string())
}

/// The tokens of the flags (or else of the environment variable `env`), then of the files.
pub(crate) fn gather_tokens(
    flags: Vec<String>,
    env: &str,
    files: &[PathBuf],
) -> Result<Vec<String>, String> {
    let mut tokens = if flags.is_empty() {
        std::env::var(env)
            .map(|list| split_tokens(&list))
            .unwrap_or_default()
    } else {
        flags
    };
    tokens.retain(|t| !t.is_empty());
    for file in files {
        tokens.extend(read_token_file(file).map_err(|e| e.to_string())?);
    }
    Ok(tokens)
}

pub(crate) fn split_tokens(list: &str) -> Vec<String> {
    list.split(',').map(|t| t.trim().to_owned()).collect()
}
