//! Secrets from files: [`read_token_file`] and [`parse_token_file`] read bearer tokens kept out
//! of the command line (`--token-file`, `--read-token-file`), one per line.
//!
//! Plain text handling only; knows nothing about HTTP or how tokens are compared. Nothing here
//! ever puts a token in an error message or a log line.

use std::path::Path;

use crate::error::ServerError;

/// Reads the tokens of a token file: one per line, surrounding whitespace trimmed; blank lines
/// and lines starting with `#` are skipped. A file without any token is an error (an operator
/// who points at a file means to require a token), and so is an unreadable or non-UTF-8 one.
/// Error messages name the file and the line number, never its contents.
pub fn read_token_file(path: &Path) -> Result<Vec<String>, ServerError> {
    let error = |reason: String| ServerError::TokenFile {
        path: path.to_owned(),
        reason,
    };
    let bytes = std::fs::read(path).map_err(|e| error(unreadable(path, &e)))?;
    let text = String::from_utf8(bytes).map_err(|_| error("it is not UTF-8 text".to_owned()))?;
    parse_token_file(&text).map_err(error)
}

/// Why `path` could not be read, with what an operator needs to fix a permission: who this
/// process is and who owns the file (a secret written under `umask 077` and mounted into the
/// container image, which runs as uid 10001, is the usual case).
fn unreadable(path: &Path, err: &std::io::Error) -> String {
    if err.kind() != std::io::ErrorKind::PermissionDenied {
        return err.to_string();
    }
    let me = own_uid().map_or_else(|| "this process".to_owned(), |uid| format!("uid {uid}"));
    let file = std::fs::metadata(path).map_or_else(
        |_| String::new(),
        |meta| {
            use std::os::unix::fs::MetadataExt;
            format!(
                "; the file belongs to uid {} with mode {:o}",
                meta.uid(),
                meta.mode() & 0o777
            )
        },
    );
    format!(
        "{err}: sqlhttpd runs as {me}{file} (the container image runs as uid 10001: \
         `chown 10001` the file, or make it readable by a group the server is in)"
    )
}

/// This process's real user id, from `/proc` (Linux); `None` elsewhere.
fn own_uid() -> Option<u32> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|line| line.starts_with("Uid:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// Parses the text of a token file (see [`read_token_file`]).
///
/// ```
/// use sqlhttp_server::parse_token_file;
///
/// let tokens = parse_token_file("# dashboards\nalpha\n\n  beta  \r\n").unwrap();
/// assert_eq!(tokens, ["alpha", "beta"]);
/// assert!(parse_token_file("# nothing here\n").is_err());
/// ```
pub fn parse_token_file(text: &str) -> Result<Vec<String>, String> {
    let mut tokens = Vec::new();
    for (index, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        if line.bytes().any(|b| !(0x21..=0x7e).contains(&b)) {
            return Err(format!(
                "line {} is not a token: a token is visible ASCII without spaces",
                index + 1
            ));
        }
        tokens.push(line.to_owned());
    }
    if tokens.is_empty() {
        return Err("it holds no token (only blank lines and # comments)".to_owned());
    }
    Ok(tokens)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn comments_blank_lines_and_whitespace() {
        let text = "# ops\n\nfirst\n\t second \n#third\n   # indented comment\nfourth";
        assert_eq!(
            parse_token_file(text).unwrap(),
            ["first", "second", "fourth"]
        );
    }

    #[test]
    fn refusals_do_not_quote_the_file() {
        for text in [
            "",
            "\n\n# only comments\n",
            "ok\nhas space-secret\n",
            "tab\there",
        ] {
            let err = parse_token_file(text).unwrap_err();
            assert!(!err.contains("secret"), "{err}");
            assert!(!err.contains("here"), "{err}");
        }
        assert!(
            parse_token_file("a\ncafé\n")
                .unwrap_err()
                .contains("line 2")
        );
    }

    #[test]
    fn a_permission_refused_names_both_users_and_the_mode() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokens");
        std::fs::write(&path, "secret-token\n").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        // Root reads any file, so the refusal is the kernel's answer, given directly.
        let refused = std::io::Error::from(std::io::ErrorKind::PermissionDenied);
        let reason = unreadable(&path, &refused);
        assert!(reason.contains("mode 600"), "{reason}");
        assert!(reason.contains("uid 10001"), "{reason}");
        assert!(reason.contains("sqlhttpd runs as uid "), "{reason}");
        assert!(!reason.contains("secret-token"), "{reason}");
    }

    #[test]
    fn files_are_read_and_missing_ones_named() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokens");
        std::fs::write(&path, "# comment\ns3cret\n").unwrap();
        assert_eq!(read_token_file(&path).unwrap(), ["s3cret"]);
        std::fs::write(&path, b"\xff\xfe").unwrap();
        assert!(
            read_token_file(&path)
                .unwrap_err()
                .to_string()
                .contains("UTF-8")
        );
        let missing = dir.path().join("missing");
        let err = read_token_file(&missing).unwrap_err().to_string();
        assert!(err.contains("missing"), "{err}");
    }
}
