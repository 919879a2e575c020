//! `sqlhttp prepare`: the checked-query cache the `query!` macros read (ADR 0055). Finds each
//! package under a directory (each `Cargo.toml` outside `target/` and hidden directories), the
//! SQL of every `query!`, `query_as!`, `query_scalar!` and `execute!` in its Rust files, and
//! writes the server's description of each to `.sqlhttp/query-<sha256 of the SQL>.json` beside
//! its `Cargo.toml`, removing entries no statement uses. `--check` changes nothing and needs no
//! server: a statement without an entry (its SQL changed since the last refresh) or an entry no
//! statement uses fails it; `--check --server` also asks the server and fails on an entry that
//! differs from its answer.
//!
//! Knows files, the macros' invocation syntax and the entry format (the macros' `cache` module
//! reads the same); the server is reached through the SDK's `describe_statement`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context as _, bail};
use sha2::{Digest as _, Sha256};

use crate::args::Connection;
use crate::exit::UsageError;

/// The macros whose first string literal (after `query_as!`'s type) is a statement.
const MACROS: &[&str] = &["query_as", "query_scalar", "query", "execute"];

/// The cache directory's name, beside a package's `Cargo.toml`.
const CACHE_DIR: &str = ".sqlhttp";

/// The variable that puts the cache elsewhere, for the macros and for this command alike.
const OFFLINE_DIR: &str = "SQLHTTP_OFFLINE_DIR";

/// Runs `sqlhttp prepare` over `dir`.
pub(crate) async fn run(
    connection: &Connection,
    dir: &Path,
    check: bool,
    server: bool,
) -> anyhow::Result<()> {
    let mut client = None;
    let mut problems = Vec::new();
    let mut written = 0;
    for (cache, statements) in caches(dir)? {
        let existing = entries(&cache)?;
        if statements.is_empty() && existing.is_empty() {
            continue;
        }
        let mut wanted = BTreeMap::new();
        for sql in &statements {
            wanted.insert(file_name(sql), sql.as_str());
        }
        if check {
            for (name, sql) in &wanted {
                let found = existing.get(name).and_then(|text| stored_sql(text));
                if found.as_deref() != Some(*sql) {
                    problems.push(format!(
                        "{}: no entry for `{}` (its SQL changed, or it was never prepared)",
                        cache.display(),
                        one_line(sql)
                    ));
                } else if server {
                    let client = connect(&mut client, connection, dir)?;
                    let fresh = entry(client, sql).await?;
                    if Some(fresh.trim()) != existing.get(name).map(|t| t.trim()) {
                        problems.push(format!(
                            "{}: the entry for `{}` is stale (the server describes it otherwise)",
                            cache.display(),
                            one_line(sql)
                        ));
                    }
                }
            }
            for name in existing.keys().filter(|name| !wanted.contains_key(*name)) {
                problems.push(format!(
                    "{}: {name} is stale: no statement uses it",
                    cache.display()
                ));
            }
            continue;
        }
        std::fs::create_dir_all(&cache)
            .with_context(|| format!("cannot create {}", cache.display()))?;
        for (name, sql) in &wanted {
            let client = connect(&mut client, connection, dir)?;
            let text = entry(client, sql)
                .await
                .with_context(|| format!("cannot describe `{}`", one_line(sql)))?;
            if existing.get(name) != Some(&text) {
                std::fs::write(cache.join(name), &text)
                    .with_context(|| format!("cannot write {}", cache.join(name).display()))?;
                written += 1;
            }
        }
        for name in existing.keys().filter(|name| !wanted.contains_key(*name)) {
            std::fs::remove_file(cache.join(name))
                .with_context(|| format!("cannot remove {}", cache.join(name).display()))?;
        }
        println!(
            "{}: {} statement{} described ({written} written)",
            cache.display(),
            wanted.len(),
            if wanted.len() == 1 { "" } else { "s" }
        );
    }
    if !problems.is_empty() {
        bail!(
            "the checked-query cache is not up to date (run `sqlhttp prepare`):\n  {}",
            problems.join("\n  ")
        );
    }
    if check {
        println!("ok: every statement has its entry");
    }
    Ok(())
}

/// Each cache with the statements it must describe: `.sqlhttp/` beside each package's
/// `Cargo.toml`, or, when `SQLHTTP_OFFLINE_DIR` is set (as the macros read it), that one
/// directory for every package's statements.
fn caches(dir: &Path) -> anyhow::Result<Vec<(PathBuf, Vec<String>)>> {
    let mut caches = Vec::new();
    for package in packages(dir)? {
        caches.push((package.join(CACHE_DIR), statements(&package)?));
    }
    if let Some(shared) = std::env::var_os(OFFLINE_DIR) {
        let all = caches.into_iter().flat_map(|(_, found)| found).collect();
        return Ok(vec![(PathBuf::from(shared), all)]);
    }
    Ok(caches)
}

/// The client, made once when first needed: the flags and environment, else `SQLHTTP_URL`
/// and `SQLHTTP_TOKEN` from a `.env` file in `dir`.
fn connect<'c>(
    client: &'c mut Option<sqlhttp::Client>,
    connection: &Connection,
    dir: &Path,
) -> anyhow::Result<&'c sqlhttp::Client> {
    if client.is_none() {
        let dotenv = dotenv(&dir.join(".env"));
        let mut connection = Connection {
            url: connection.url.clone(),
            token: connection.token.clone(),
            token_file: connection.token_file.clone(),
            timeout: connection.timeout,
            retries: connection.retries,
        };
        if std::env::var_os("SQLHTTP_URL").is_none()
            && let Some(url) = dotenv.get("SQLHTTP_URL")
        {
            connection.url.clone_from(url);
        }
        if connection.token.is_none() && connection.token_file.is_none() {
            connection.token = dotenv.get("SQLHTTP_TOKEN").cloned();
        }
        *client = Some(crate::connect::client(&connection)?);
    }
    Ok(client.as_ref().expect("made above"))
}

/// `KEY=VALUE` lines of a `.env` file (quotes around a value removed); none when it is absent.
fn dotenv(path: &Path) -> BTreeMap<String, String> {
    let Ok(text) = std::fs::read_to_string(path) else {
        return BTreeMap::new();
    };
    text.lines()
        .map(str::trim)
        .filter(|line| !line.is_empty() && !line.starts_with('#'))
        .filter_map(|line| line.strip_prefix("export ").unwrap_or(line).split_once('='))
        .map(|(key, value)| {
            let value = value.trim();
            let unquoted = value
                .strip_prefix('"')
                .and_then(|v| v.strip_suffix('"'))
                .or_else(|| value.strip_prefix('\'').and_then(|v| v.strip_suffix('\'')))
                .unwrap_or(value);
            (key.trim().to_owned(), unquoted.to_owned())
        })
        .collect()
}

/// The cache entry for `sql` as the server describes it now, as the file's text.
async fn entry(client: &sqlhttp::Client, sql: &str) -> anyhow::Result<String> {
    let info = client.describe_statement(sql).await?;
    let Some(engine) = info.engine.clone() else {
        bail!(
            "the server did not name its engine (Sqlhttp-Engine): it is too old for checked queries"
        );
    };
    let describe = serde_json::json!({
        "params": info.params.iter().map(|p| serde_json::json!({"type": p.type_name})).collect::<Vec<_>>(),
        "columns": info.columns.iter().map(|c| serde_json::json!({
            "name": c.name, "type": c.type_name, "nullable": c.nullable,
        })).collect::<Vec<_>>(),
        "may_write": info.may_write,
    });
    let entry = serde_json::json!({ "sql": sql, "engine": engine, "describe": describe });
    let mut text = serde_json::to_string_pretty(&entry)?;
    text.push('\n');
    Ok(text)
}

/// The SQL an entry's text holds.
fn stored_sql(text: &str) -> Option<String> {
    let entry: serde_json::Value = serde_json::from_str(text).ok()?;
    entry.get("sql")?.as_str().map(str::to_owned)
}

/// The entry's file name for `sql` (the macros' `cache::file_name`).
fn file_name(sql: &str) -> String {
    let digest = Sha256::digest(sql.as_bytes());
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    format!("query-{hex}.json")
}

fn one_line(sql: &str) -> String {
    let line: String = sql.split_whitespace().collect::<Vec<_>>().join(" ");
    if line.chars().count() > 80 {
        format!("{}...", line.chars().take(77).collect::<String>())
    } else {
        line
    }
}

/// The cache's entries by file name, with their text.
fn entries(cache: &Path) -> anyhow::Result<BTreeMap<String, String>> {
    let mut found = BTreeMap::new();
    let Ok(listing) = std::fs::read_dir(cache) else {
        return Ok(found);
    };
    for item in listing {
        let path = item?.path();
        let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
            continue;
        };
        if name.starts_with("query-") && name.ends_with(".json") {
            let text = std::fs::read_to_string(&path)
                .with_context(|| format!("cannot read {}", path.display()))?;
            found.insert(name.to_owned(), text);
        }
    }
    Ok(found)
}

/// Every package directory under `dir` (itself included), skipping `target/` and hidden ones.
fn packages(dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    if !dir.is_dir() {
        return Err(UsageError(format!("{} is not a directory", dir.display())).into());
    }
    let mut found = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(at) = todo.pop() {
        if at.join("Cargo.toml").is_file() {
            found.push(at.clone());
        }
        for item in
            std::fs::read_dir(&at).with_context(|| format!("cannot read {}", at.display()))?
        {
            let item = item?;
            let name = item.file_name();
            let name = name.to_string_lossy();
            if item.file_type()?.is_dir() && !name.starts_with('.') && name != "target" {
                todo.push(item.path());
            }
        }
    }
    found.sort();
    Ok(found)
}

/// The statements of the package at `package`: its Rust files' checked-query macros, outside
/// nested packages, and those of the files its modules name with `#[path = "..."]`.
fn statements(package: &Path) -> anyhow::Result<Vec<String>> {
    let mut found = Vec::new();
    let mut todo = vec![package.to_path_buf()];
    while let Some(at) = todo.pop() {
        for item in
            std::fs::read_dir(&at).with_context(|| format!("cannot read {}", at.display()))?
        {
            let item = item?;
            let path = item.path();
            let name = item.file_name();
            let name = name.to_string_lossy();
            if item.file_type()?.is_dir() {
                if !name.starts_with('.') && name != "target" && !path.join("Cargo.toml").is_file()
                {
                    todo.push(path);
                }
            } else if name.ends_with(".rs") {
                // rustc reads a source file's CRLF line ends as LF, in string literals too.
                let text = std::fs::read_to_string(&path)
                    .with_context(|| format!("cannot read {}", path.display()))?
                    .replace("\r\n", "\n");
                found.extend(statements_in(&text));
                for named in module_paths(&text) {
                    let module = at.join(named);
                    let inside = match (module.canonicalize(), package.canonicalize()) {
                        (Ok(module), Ok(package)) => module.starts_with(package),
                        _ => false,
                    };
                    if !inside {
                        let text = std::fs::read_to_string(&module)
                            .with_context(|| format!("cannot read {}", module.display()))?
                            .replace("\r\n", "\n");
                        found.extend(statements_in(&text));
                    }
                }
            }
        }
    }
    found.sort();
    found.dedup();
    Ok(found)
}

/// The SQL of each checked-query macro in `text`, as the macro reads its literal.
fn statements_in(text: &str) -> Vec<String> {
    let mut found = Vec::new();
    let bytes = text.as_bytes();
    let mut at = 0;
    while let Some(offset) = text[at..].find('!') {
        let bang = at + offset;
        at = bang + 1;
        let Some(name) = MACROS.iter().find(|m| text[..bang].ends_with(**m)) else {
            continue;
        };
        let start = bang - name.len();
        if start > 0 && (bytes[start - 1].is_ascii_alphanumeric() || bytes[start - 1] == b'_') {
            continue;
        }
        // Not in a line comment (a doc comment's example included).
        let line_start = text[..start].rfind('\n').map_or(0, |i| i + 1);
        if text[line_start..start].contains("//") {
            continue;
        }
        let mut i = skip_space(bytes, bang + 1);
        if !matches!(bytes.get(i), Some(b'(' | b'[' | b'{')) {
            continue;
        }
        i = skip_space(bytes, i + 1);
        if *name == "query_as" {
            // The struct's path, up to the first comma outside brackets.
            let mut depth = 0i32;
            while let Some(&b) = bytes.get(i) {
                match b {
                    b'<' | b'(' | b'[' => depth += 1,
                    b'>' | b')' | b']' => depth -= 1,
                    b',' if depth == 0 => break,
                    _ => {}
                }
                i += 1;
            }
            i = skip_space(bytes, i + 1);
        }
        if let Some((literal, end)) = string_literal(text, i)
            && let Ok(parsed) = syn::parse_str::<syn::LitStr>(literal)
        {
            found.push(parsed.value());
            at = end;
        }
    }
    found
}

/// The files `#[path = "..."]` attributes in `text` name.
fn module_paths(text: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find("#[path") {
        rest = &rest[at + "#[path".len()..];
        let Some(open) = rest.find('"') else { break };
        let Some(close) = rest[open + 1..].find('"') else {
            break;
        };
        found.push(rest[open + 1..open + 1 + close].to_owned());
        rest = &rest[open + 1 + close..];
    }
    found
}

fn skip_space(bytes: &[u8], mut i: usize) -> usize {
    while bytes.get(i).is_some_and(u8::is_ascii_whitespace) {
        i += 1;
    }
    i
}

/// The string literal (plain or raw) starting at `i`, and the index after it.
fn string_literal(text: &str, i: usize) -> Option<(&str, usize)> {
    let bytes = text.as_bytes();
    match bytes.get(i)? {
        b'"' => {
            let mut j = i + 1;
            while let Some(&b) = bytes.get(j) {
                match b {
                    b'\\' => j += 2,
                    b'"' => return Some((&text[i..=j], j + 1)),
                    _ => j += 1,
                }
            }
            None
        }
        b'r' => {
            let hashes = bytes[i + 1..].iter().take_while(|b| **b == b'#').count();
            let open = i + 1 + hashes;
            if bytes.get(open) != Some(&b'"') {
                return None;
            }
            let close = format!("\"{}", "#".repeat(hashes));
            let end = text[open + 1..].find(&close)? + open + 1 + close.len();
            Some((&text[i..end], end))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_each_macro_s_sql_as_the_macro_reads_it() {
        let source = r####"
            // query!("SELECT 'a comment'")
            let a = sqlhttp::query!("SELECT id FROM t WHERE x = ?", x);
            let b = query_as!(Book<'_>, "SELECT \"title\"\n FROM t",);
            let c = query_scalar!(r#"SELECT count(*) AS "n!: i64" FROM t"#);
            execute!("DELETE FROM t").on(&client);
            my_query!("not ours");
        "####;
        assert_eq!(
            statements_in(source),
            [
                "SELECT id FROM t WHERE x = ?",
                "SELECT \"title\"\n FROM t",
                "SELECT count(*) AS \"n!: i64\" FROM t",
                "DELETE FROM t",
            ]
        );
    }

    #[test]
    fn a_dotenv_file_is_read() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(".env");
        std::fs::write(
            &path,
            "# c\nSQLHTTP_URL=http://x:1\nexport SQLHTTP_TOKEN=\"t o\"\n",
        )
        .unwrap();
        let read = dotenv(&path);
        assert_eq!(read["SQLHTTP_URL"], "http://x:1");
        assert_eq!(read["SQLHTTP_TOKEN"], "t o");
    }
}
