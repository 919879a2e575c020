//! The offline cache the macros read: `.sqlhttp/` beside the application's `Cargo.toml` (or
//! `SQLHTTP_OFFLINE_DIR`), one JSON file per statement, `query-<sha256 of the SQL>.json`,
//! holding the SQL, the engine that described it and its description (the protocol's
//! `StatementDescription`), as `sqlhttp prepare` writes it.
//!
//! Knows files and the entry's format; nothing about Rust syntax or types.

use std::path::PathBuf;

use serde::Deserialize;
use sha2::{Digest, Sha256};
use sqlhttp_protocol::body::StatementDescription;

/// One cached description.
#[derive(Debug, Deserialize)]
pub(crate) struct Entry {
    /// The statement's text, compared with the macro's (a hash is a key, not a proof).
    pub(crate) sql: String,
    /// `sqlite` or `postgresql`: whose type names the description holds.
    pub(crate) engine: String,
    /// What the server answered.
    pub(crate) describe: StatementDescription,
}

/// The cache's directory.
pub(crate) fn dir() -> Result<PathBuf, String> {
    if let Some(dir) = std::env::var_os("SQLHTTP_OFFLINE_DIR") {
        return Ok(PathBuf::from(dir));
    }
    let manifest = std::env::var_os("CARGO_MANIFEST_DIR")
        .ok_or("CARGO_MANIFEST_DIR is not set: the macros run under cargo")?;
    Ok(PathBuf::from(manifest).join(".sqlhttp"))
}

/// The entry's file name for `sql`.
pub(crate) fn file_name(sql: &str) -> String {
    let digest = Sha256::digest(sql.as_bytes());
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    format!("query-{hex}.json")
}

/// The entry for `sql` and its file, or why there is none, said so a developer knows what to run.
pub(crate) fn lookup(sql: &str) -> Result<(Entry, PathBuf), String> {
    let path = dir()?.join(file_name(sql));
    let Ok(text) = std::fs::read_to_string(&path) else {
        return Err(format!(
            "no cached description of this statement: {} is missing (the macros read only the \
             cache, with or without SQLHTTP_OFFLINE); run `sqlhttp prepare` in the \
             application's directory against a server holding its schema, and commit .sqlhttp/",
            path.display()
        ));
    };
    let entry: Entry = serde_json::from_str(&text)
        .map_err(|e| format!("{} is not a statement description: {e}", path.display()))?;
    if entry.sql != sql {
        return Err(format!(
            "{} describes another statement (its SQL differs): run `sqlhttp prepare`",
            path.display()
        ));
    }
    Ok((entry, path))
}
