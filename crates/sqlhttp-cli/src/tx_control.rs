//! The shell's transaction commands: `BEGIN` / `START TRANSACTION` (with `READ ONLY`,
//! `ISOLATION LEVEL ...` and `DEFERRABLE`, and SQLite's `DEFERRED` / `IMMEDIATE` / `EXCLUSIVE`,
//! which change nothing here), `COMMIT` / `END`, and `ROLLBACK` / `ABORT`, as psql and the
//! sqlite3 shell read them. The shell drives the server's interactive transaction with them
//! (the server refuses transaction control inside a statement: it is the shell's command
//! language, read here, not SQL the server runs).
//!
//! Pure text: knows nothing about the SDK or the terminal.

use sqlhttp::Isolation;

/// A transaction command, or not one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum TxCommand {
    /// Open a transaction.
    Begin(Options),
    /// Commit the open one.
    Commit,
    /// Roll the open one back.
    Rollback,
}

/// What `BEGIN` asked for.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct Options {
    pub(crate) read_only: bool,
    /// `None`: the SDK's default (serializable, the level both engines offer).
    pub(crate) isolation: Option<Isolation>,
    pub(crate) deferrable: bool,
}

/// Reads `sql` (one statement, its `;` already split off) as a transaction command: `Ok(None)`
/// for any other statement, an error for a transaction command the shell cannot run (a
/// `SAVEPOINT`, an unknown option), saying why.
pub(crate) fn parse(sql: &str) -> Result<Option<TxCommand>, String> {
    let text = sql.trim().trim_end_matches(';').trim();
    let words: Vec<String> = text
        .split(|c: char| c.is_whitespace() || c == ',')
        .filter(|w| !w.is_empty())
        .map(str::to_ascii_uppercase)
        .collect();
    let words: Vec<&str> = words.iter().map(String::as_str).collect();
    let Some((&first, rest)) = words.split_first() else {
        return Ok(None);
    };
    match first {
        "BEGIN" => {
            let rest = skip(rest, &["DEFERRED", "IMMEDIATE", "EXCLUSIVE"]);
            let rest = skip(rest, &["TRANSACTION", "WORK"]);
            options(rest).map(|o| Some(TxCommand::Begin(o)))
        }
        "START" => match rest {
            ["TRANSACTION", rest @ ..] => options(rest).map(|o| Some(TxCommand::Begin(o))),
            _ => Ok(None),
        },
        "COMMIT" | "END" => match rest {
            [] | ["TRANSACTION" | "WORK"] => Ok(Some(TxCommand::Commit)),
            _ => Err(format!(
                "the shell cannot run `{text}`: COMMIT takes no options"
            )),
        },
        "ROLLBACK" | "ABORT" => match rest {
            [] | ["TRANSACTION" | "WORK"] => Ok(Some(TxCommand::Rollback)),
            _ => Err(format!(
                "the shell cannot run `{text}`: savepoints are not available; ROLLBACK \
                 ends the whole transaction"
            )),
        },
        "SAVEPOINT" | "RELEASE" => Err(format!(
            "the shell cannot run `{text}`: savepoints are not available in a transaction over \
             HTTP (each statement that fails is undone on its own)"
        )),
        _ => Ok(None),
    }
}

/// `words` past its first one when that is one of `optional`.
fn skip<'w>(words: &'w [&'w str], optional: &[&str]) -> &'w [&'w str] {
    match words.split_first() {
        Some((first, rest)) if optional.contains(first) => rest,
        _ => words,
    }
}

/// `BEGIN`'s options, after `BEGIN [TRANSACTION]` or `START TRANSACTION`.
fn options(mut words: &[&str]) -> Result<Options, String> {
    let mut options = Options::default();
    loop {
        words = match words {
            [] => return Ok(options),
            ["READ", "ONLY", rest @ ..] => {
                options.read_only = true;
                rest
            }
            ["READ", "WRITE", rest @ ..] => {
                options.read_only = false;
                rest
            }
            ["ISOLATION", "LEVEL", "SERIALIZABLE", rest @ ..] => {
                options.isolation = Some(Isolation::Serializable);
                rest
            }
            ["ISOLATION", "LEVEL", "REPEATABLE", "READ", rest @ ..] => {
                options.isolation = Some(Isolation::RepeatableRead);
                rest
            }
            ["ISOLATION", "LEVEL", "READ", "COMMITTED", rest @ ..] => {
                options.isolation = Some(Isolation::ReadCommitted);
                rest
            }
            ["DEFERRABLE", rest @ ..] => {
                options.deferrable = true;
                rest
            }
            ["NOT", "DEFERRABLE", rest @ ..] => {
                options.deferrable = false;
                rest
            }
            other => {
                return Err(format!(
                    "unknown transaction option `{}`: READ ONLY, READ WRITE, ISOLATION LEVEL \
                     (SERIALIZABLE, REPEATABLE READ, READ COMMITTED) or DEFERRABLE",
                    other.join(" ").to_ascii_lowercase()
                ));
            }
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn begin(read_only: bool, isolation: Option<Isolation>, deferrable: bool) -> TxCommand {
        TxCommand::Begin(Options {
            read_only,
            isolation,
            deferrable,
        })
    }

    #[test]
    fn reads_the_commands_as_psql_and_sqlite3_spell_them() {
        let cases = [
            ("BEGIN", begin(false, None, false)),
            ("begin;", begin(false, None, false)),
            ("BEGIN TRANSACTION", begin(false, None, false)),
            ("begin work", begin(false, None, false)),
            ("BEGIN IMMEDIATE", begin(false, None, false)),
            ("BEGIN DEFERRED TRANSACTION", begin(false, None, false)),
            ("BEGIN READ ONLY", begin(true, None, false)),
            (
                "START TRANSACTION ISOLATION LEVEL READ COMMITTED, READ WRITE",
                begin(false, Some(Isolation::ReadCommitted), false),
            ),
            (
                "begin isolation level repeatable read",
                begin(false, Some(Isolation::RepeatableRead), false),
            ),
            (
                "BEGIN READ ONLY ISOLATION LEVEL SERIALIZABLE DEFERRABLE",
                begin(true, Some(Isolation::Serializable), true),
            ),
            ("COMMIT", TxCommand::Commit),
            ("commit work;", TxCommand::Commit),
            ("END", TxCommand::Commit),
            ("ROLLBACK", TxCommand::Rollback),
            ("abort transaction", TxCommand::Rollback),
        ];
        for (text, expected) in cases {
            assert_eq!(parse(text), Ok(Some(expected)), "{text}");
        }
    }

    #[test]
    fn other_statements_are_not_commands() {
        for text in [
            "SELECT 1",
            "START",
            "INSERT INTO begin VALUES (1)",
            "BEGINNING",
            "",
            "  ",
            "CREATE TABLE commit_log (x)",
        ] {
            assert_eq!(parse(text), Ok(None), "{text}");
        }
    }

    #[test]
    fn what_the_shell_cannot_run_is_refused_with_a_reason() {
        for text in [
            "SAVEPOINT a",
            "RELEASE SAVEPOINT a",
            "ROLLBACK TO SAVEPOINT a",
            "BEGIN ISOLATION LEVEL CHAOS",
            "COMMIT AND CHAIN",
            "BEGIN READ",
        ] {
            assert!(parse(text).is_err(), "{text}");
        }
    }
}
