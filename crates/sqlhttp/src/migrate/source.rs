//! Migrations as written: [`Migration`] (a version, a name, the SQL that applies it and,
//! optionally, the SQL that reverts it, with a checksum of the first), and how a set of them is
//! read from `NNNN_name.sql` / `NNNN_name.down.sql` files, from a directory or embedded.
//!
//! Knows file names, text and checksums; nothing about servers or the history table.

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;

use sha2::{Digest, Sha256};

use super::MigrateError;

/// One migration: the SQL that moves a database from the version before it to `version`, and
/// optionally the SQL that moves it back.
///
/// Made from files by [`Migrator::from_dir`](super::Migrator::from_dir) or
/// [`migrations!`](crate::migrations), or in code:
///
/// ```
/// use sqlhttp::migrate::Migration;
///
/// let m = Migration::new(2, "add_isbn", "ALTER TABLE books ADD COLUMN isbn TEXT;")
///     .with_down("ALTER TABLE books DROP COLUMN isbn;");
/// assert_eq!((m.version(), m.name()), (2, "add_isbn"));
/// assert_eq!(m.checksum().len(), 64);
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct Migration {
    version: u64,
    name: String,
    source: String,
    up: String,
    down: Option<String>,
    checksum: String,
}

impl Migration {
    /// A migration to `version` named `name`, applied by the statements of `up` (a script:
    /// statements ended by `;`, see [`script::split`](crate::script::split)).
    ///
    /// `version` must be at most `i64::MAX` (the history table stores it as a `BIGINT`); the
    /// migrator refuses a larger one.
    pub fn new(version: u64, name: impl Into<String>, up: impl Into<String>) -> Migration {
        let name = name.into();
        let up = up.into();
        Migration {
            source: format!("{version:04}_{name}.sql"),
            checksum: checksum(&up),
            version,
            name,
            up,
            down: None,
        }
    }

    /// The same migration with `down` as the statements that revert it.
    #[must_use]
    pub fn with_down(mut self, down: impl Into<String>) -> Migration {
        self.down = Some(down.into());
        self
    }

    /// The version this migration brings a database to.
    pub fn version(&self) -> u64 {
        self.version
    }

    /// Its name (`add_isbn` for `0002_add_isbn.sql`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Where it came from, for messages: its file name (`0002_add_isbn.sql`), or the name of the
    /// file it would have for one made in code.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// The SQL that applies it.
    pub fn up_sql(&self) -> &str {
        &self.up
    }

    /// The SQL that reverts it, when it has any.
    pub fn down_sql(&self) -> Option<&str> {
        self.down.as_deref()
    }

    /// The SHA-256 of [`up_sql`](Self::up_sql) (lowercase hex), with `\r\n` read as `\n` so
    /// that a checkout's line endings do not change it. The history table keeps the checksum of
    /// each applied migration; a file changed after it was applied is refused.
    pub fn checksum(&self) -> &str {
        &self.checksum
    }

    /// The down file's name, for messages.
    pub(crate) fn down_source(&self) -> String {
        match self.source.strip_suffix(".up.sql") {
            Some(stem) => format!("{stem}.down.sql"),
            None => format!("{}.down.sql", self.source.trim_end_matches(".sql")),
        }
    }
}

/// The SQL is left out: it can be long.
impl fmt::Debug for Migration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Migration")
            .field("version", &self.version)
            .field("name", &self.name)
            .field("source", &self.source)
            .field("reversible", &self.down.is_some())
            .field("checksum", &self.checksum)
            .finish_non_exhaustive()
    }
}

/// SHA-256 of `text`, `\r\n` read as `\n`, in lowercase hex.
fn checksum(text: &str) -> String {
    let mut hasher = Sha256::new();
    let mut pieces = text.split("\r\n");
    if let Some(first) = pieces.next() {
        hasher.update(first.as_bytes());
    }
    for piece in pieces {
        hasher.update(b"\n");
        hasher.update(piece.as_bytes());
    }
    hasher
        .finalize()
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect()
}

/// Which half of a migration a file holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Half {
    Up,
    Down,
}

/// What a file name says: `Ok(None)` for a file that is not SQL (a README beside the
/// migrations), an error for a `.sql` file not named `NNNN_name.sql`.
fn parse_file_name(file: &str) -> Result<Option<(u64, String, Half)>, String> {
    let Some(stem) = file.strip_suffix(".sql") else {
        return Ok(None);
    };
    let (stem, half) = if let Some(stem) = stem.strip_suffix(".down") {
        (stem, Half::Down)
    } else if let Some(stem) = stem.strip_suffix(".up") {
        (stem, Half::Up)
    } else {
        (stem, Half::Up)
    };
    let shape = "a migration file is named NNNN_name.sql (NNNN its version, digits), with \
                 NNNN_name.down.sql beside it to revert it";
    let Some((digits, name)) = stem.split_once('_') else {
        return Err(format!("not a migration file name: {shape}"));
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) || name.is_empty() {
        return Err(format!("not a migration file name: {shape}"));
    }
    let version = digits
        .parse::<u64>()
        .ok()
        .filter(|&v| i64::try_from(v).is_ok())
        .ok_or_else(|| format!("version {digits} is over the largest, {}", i64::MAX))?;
    Ok(Some((version, name.to_owned(), half)))
}

/// Pairs up and down files into migrations, by version, in version order.
pub(crate) fn assemble<N, T>(
    files: impl IntoIterator<Item = (N, T)>,
) -> Result<Vec<Migration>, MigrateError>
where
    N: AsRef<str>,
    T: Into<String>,
{
    #[derive(Default)]
    struct Pair {
        up: Option<(String, String, String)>,
        down: Option<(String, String, String)>,
    }
    let mut by_version: BTreeMap<u64, Pair> = BTreeMap::new();
    for (path, text) in files {
        let path = path.as_ref();
        let file = Path::new(path)
            .file_name()
            .and_then(|name| name.to_str())
            .unwrap_or(path)
            .to_owned();
        let Some((version, name, half)) =
            parse_file_name(&file).map_err(|message| MigrateError::Source {
                file: file.clone(),
                message,
            })?
        else {
            continue;
        };
        let pair = by_version.entry(version).or_default();
        let slot = match half {
            Half::Up => &mut pair.up,
            Half::Down => &mut pair.down,
        };
        if let Some((other, _, _)) = slot {
            return Err(MigrateError::Source {
                file,
                message: format!("version {version} is also {other}: each version is one file"),
            });
        }
        *slot = Some((file, name, text.into()));
    }
    by_version
        .into_iter()
        .map(|(version, pair)| {
            let Some((file, name, up)) = pair.up else {
                let (down_file, _, _) = pair.down.unwrap_or_default();
                return Err(MigrateError::Source {
                    file: down_file,
                    message: format!(
                        "a down migration without its migration: no {version:04}_NAME.sql"
                    ),
                });
            };
            let mut migration = Migration::new(version, name, up);
            migration.source = file;
            if let Some((down_file, down_name, down)) = pair.down {
                if down_name != migration.name {
                    return Err(MigrateError::Source {
                        file: down_file,
                        message: format!(
                            "its name differs from {}'s: a down file is named as its migration",
                            migration.source
                        ),
                    });
                }
                migration = migration.with_down(down);
            }
            Ok(migration)
        })
        .collect()
}

/// The `.sql` files of `dir` (not of its subdirectories), with their text.
pub(crate) fn read_dir(dir: &Path) -> Result<Vec<(String, String)>, MigrateError> {
    let unreadable = |error: std::io::Error| MigrateError::Source {
        file: dir.display().to_string(),
        message: format!("cannot read the migrations directory: {error}"),
    };
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(unreadable)? {
        let entry = entry.map_err(unreadable)?;
        let path = entry.path();
        if !path.is_file() || path.extension().is_none_or(|ext| ext != "sql") {
            continue;
        }
        let file = entry.file_name().to_string_lossy().into_owned();
        let text = std::fs::read(&path)
            .map_err(|error| format!("cannot read it: {error}"))
            .and_then(|bytes| {
                String::from_utf8(bytes).map_err(|_| "it is not UTF-8 text".to_owned())
            })
            .map_err(|message| MigrateError::Source {
                file: file.clone(),
                message,
            })?;
        files.push((file, text));
    }
    Ok(files)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_names() {
        assert_eq!(
            parse_file_name("0002_add_isbn.sql").unwrap(),
            Some((2, "add_isbn".to_owned(), Half::Up))
        );
        assert_eq!(
            parse_file_name("0002_add_isbn.up.sql").unwrap(),
            Some((2, "add_isbn".to_owned(), Half::Up))
        );
        assert_eq!(
            parse_file_name("20240101120000_x.down.sql").unwrap(),
            Some((20_240_101_120_000, "x".to_owned(), Half::Down))
        );
        assert_eq!(parse_file_name("README.md").unwrap(), None);
        for bad in [
            "add_isbn.sql",
            "0002.sql",
            "0002_.sql",
            "v2_x.sql",
            "99999999999999999999_x.sql",
        ] {
            assert!(parse_file_name(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn checksums_ignore_crlf() {
        let lf = Migration::new(1, "a", "CREATE TABLE t (x INT);\nSELECT 1;\n");
        let crlf = Migration::new(1, "a", "CREATE TABLE t (x INT);\r\nSELECT 1;\r\n");
        assert_eq!(lf.checksum(), crlf.checksum());
        assert_ne!(
            lf.checksum(),
            Migration::new(1, "a", "CREATE TABLE t (x INT);").checksum()
        );
        // SHA-256 of the empty string.
        assert_eq!(
            Migration::new(1, "a", "").checksum(),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
    }

    #[test]
    fn pairs_and_orders_files() {
        let migrations = assemble([
            ("m/0002_b.sql", "B"),
            ("m/0001_a.sql", "A"),
            ("m/0002_b.down.sql", "undo B"),
            ("m/notes.txt", "ignored"),
        ])
        .unwrap();
        assert_eq!(migrations.len(), 2);
        assert_eq!(migrations[0].source(), "0001_a.sql");
        assert_eq!(migrations[1].down_sql(), Some("undo B"));
        assert_eq!(migrations[1].down_source(), "0002_b.down.sql");
    }

    #[test]
    fn refuses_duplicates_strays_and_mismatched_names() {
        let duplicate = assemble([("0001_a.sql", ""), ("0001_b.sql", "")]).unwrap_err();
        assert!(duplicate.to_string().contains("0001_a.sql"), "{duplicate}");
        let stray = assemble([("0003_c.down.sql", "")]).unwrap_err();
        assert!(stray.to_string().contains("0003_c.down.sql"), "{stray}");
        let renamed = assemble([("0001_a.sql", ""), ("0001_b.down.sql", "")]).unwrap_err();
        assert!(
            renamed.to_string().contains("named as its migration"),
            "{renamed}"
        );
    }
}
