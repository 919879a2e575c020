//! The sqllogictest script format, read into [`Record`]s: statements, queries with their expected
//! results, and the control records (`hash-threshold`, `halt`), each with the line it starts on and
//! its `skipif`/`onlyif` conditions.
//!
//! Only the format lives here: nothing of servers, engines or comparison. The format, as SQLite's
//! sqllogictest documentation describes it: records are separated by blank lines (a line of
//! spaces is blank); lines starting with `#` are comments, removed before anything else, so they
//! neither separate records nor reach the SQL.

/// One record of a script.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Record {
    /// The 1-based line of the record's first non-comment line (its first condition, if any).
    pub(crate) line: usize,
    /// `skipif` / `onlyif` prefixes, in order.
    pub(crate) conditions: Vec<Condition>,
    /// What the record asks for.
    pub(crate) kind: Kind,
}

/// A `skipif <engine>` or `onlyif <engine>` prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Condition {
    /// Not run on this engine.
    SkipIf(String),
    /// Run on this engine only.
    OnlyIf(String),
}

/// The kinds of record.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Kind {
    /// `statement ok` / `statement error`: SQL run for its effect, expected to succeed or fail.
    Statement {
        /// Whether the statement must succeed (`ok`) or fail (`error`).
        expect_ok: bool,
        /// The SQL, its lines joined with `\n`.
        sql: String,
    },
    /// `query <types> [<sort>] [<label>]`, the SQL, then `----` and the expected results.
    Query(Query),
    /// `hash-threshold <n>`: results of more than `n` values are given as a hash (0: never).
    HashThreshold(usize),
    /// `halt`: the rest of the script is not run.
    Halt,
}

/// A query record.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Query {
    /// One character per result column: `T` text, `I` integer, `R` floating point.
    pub(crate) types: String,
    /// How the results are ordered before comparison.
    pub(crate) sort: SortMode,
    /// Queries sharing a label must produce the same results.
    pub(crate) label: Option<String>,
    /// The SQL, its lines joined with `\n`.
    pub(crate) sql: String,
    /// What the query must return.
    pub(crate) expected: Expected,
}

/// The sort modes of a query.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SortMode {
    /// As the engine returned them (the query has an `ORDER BY` or one row).
    Unsorted,
    /// Rows sorted by their rendered values, compared as strings.
    Rows,
    /// Every value sorted on its own, rows ignored.
    Values,
}

/// A query's expected results.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Expected {
    /// The rendered values, one per line, in order (empty: no rows).
    Values(Vec<String>),
    /// `N values hashing to <md5>`: how many values, and the MD5 of each value followed by `\n`.
    Hash {
        /// The number of values.
        count: usize,
        /// The lowercase hex MD5.
        md5: String,
    },
}

/// Reads a whole script. An error names the line of the record it cannot read.
pub(crate) fn parse(text: &str) -> Result<Vec<Record>, String> {
    let mut records = Vec::new();
    let mut block: Vec<(usize, &str)> = Vec::new();
    for (index, raw) in text.split('\n').enumerate() {
        let line = raw.strip_suffix('\r').unwrap_or(raw);
        if line.starts_with('#') {
            continue;
        }
        if line.trim().is_empty() {
            if !block.is_empty() {
                records.push(record(&block)?);
                block.clear();
            }
            continue;
        }
        block.push((index + 1, line));
    }
    if !block.is_empty() {
        records.push(record(&block)?);
    }
    Ok(records)
}

/// One record from its lines (comments already gone, none blank).
fn record(lines: &[(usize, &str)]) -> Result<Record, String> {
    let start = lines[0].0;
    let mut conditions = Vec::new();
    let mut rest = lines;
    while let Some(((line, text), tail)) = rest.split_first() {
        let tokens: Vec<&str> = text.split_whitespace().collect();
        match tokens.as_slice() {
            ["skipif", engine, ..] => conditions.push(Condition::SkipIf((*engine).to_owned())),
            ["onlyif", engine, ..] => conditions.push(Condition::OnlyIf((*engine).to_owned())),
            ["skipif" | "onlyif"] => {
                return Err(format!("line {line}: a condition names no engine"));
            }
            _ => break,
        }
        rest = tail;
    }
    let Some(((line, head), body)) = rest.split_first() else {
        return Err(format!(
            "line {start}: conditions with no record after them"
        ));
    };
    let tokens: Vec<&str> = head.split_whitespace().collect();
    let kind = match tokens.as_slice() {
        ["statement", outcome] => {
            let expect_ok = match *outcome {
                "ok" => true,
                "error" => false,
                other => return Err(format!("line {line}: `statement {other}`: not ok/error")),
            };
            if body.is_empty() {
                return Err(format!("line {line}: a statement with no SQL"));
            }
            Kind::Statement {
                expect_ok,
                sql: join(body),
            }
        }
        ["query", types, options @ ..] if options.len() <= 2 => {
            if types.is_empty() || !types.chars().all(|c| matches!(c, 'T' | 'I' | 'R')) {
                return Err(format!(
                    "line {line}: type string `{types}` is not made of T, I, R"
                ));
            }
            let sort = match options.first() {
                None | Some(&"nosort") => SortMode::Unsorted,
                Some(&"rowsort") => SortMode::Rows,
                Some(&"valuesort") => SortMode::Values,
                Some(other) => return Err(format!("line {line}: unknown sort mode `{other}`")),
            };
            let separator = body.iter().position(|(_, text)| *text == "----");
            let (sql, results) = match separator {
                Some(at) => (&body[..at], &body[at + 1..]),
                None => (body, &[][..]),
            };
            if sql.is_empty() {
                return Err(format!("line {line}: a query with no SQL"));
            }
            Kind::Query(Query {
                types: (*types).to_owned(),
                sort,
                label: options.get(1).map(|label| (*label).to_owned()),
                sql: join(sql),
                expected: expected(results),
            })
        }
        ["hash-threshold", n] => Kind::HashThreshold(
            n.parse()
                .map_err(|_| format!("line {line}: hash-threshold `{n}` is not a number"))?,
        ),
        ["halt"] => Kind::Halt,
        _ => return Err(format!("line {line}: not a record: `{head}`")),
    };
    Ok(Record {
        line: start,
        conditions,
        kind,
    })
}

fn join(lines: &[(usize, &str)]) -> String {
    lines
        .iter()
        .map(|(_, text)| *text)
        .collect::<Vec<_>>()
        .join("\n")
}

/// The lines after `----`: a hash line, or one value per line.
fn expected(lines: &[(usize, &str)]) -> Expected {
    if let [(_, only)] = lines
        && let Some((count, md5)) = hash_line(only)
    {
        return Expected::Hash { count, md5 };
    }
    Expected::Values(lines.iter().map(|(_, text)| (*text).to_owned()).collect())
}

/// `N values hashing to <md5>`.
fn hash_line(line: &str) -> Option<(usize, String)> {
    let (count, md5) = line.split_once(" values hashing to ")?;
    let count = count.trim().parse().ok()?;
    let md5 = md5.trim();
    (md5.len() == 32 && md5.bytes().all(|b| b.is_ascii_hexdigit()))
        .then(|| (count, md5.to_ascii_lowercase()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_every_kind_of_record() {
        let script = "\
hash-threshold 8

# a comment between records
statement ok
CREATE TABLE t1(a INTEGER,
# a comment inside the SQL
  b INTEGER)

skipif mysql
onlyif sqlite
query IT rowsort label-1
SELECT a, b
  FROM t1
----
1
(empty)

query I nosort
SELECT count(*) FROM t1
----
30 values hashing to 0123456789ABCDEF0123456789abcdef

query I
SELECT a FROM t1 WHERE 0

statement error
INSERT INTO nowhere VALUES(1)
   \t
halt
";
        let records = parse(script).unwrap();
        assert_eq!(records.len(), 7);
        assert_eq!(records[0].kind, Kind::HashThreshold(8));
        assert_eq!(
            records[1],
            Record {
                line: 4,
                conditions: vec![],
                kind: Kind::Statement {
                    expect_ok: true,
                    sql: "CREATE TABLE t1(a INTEGER,\n  b INTEGER)".into(),
                },
            }
        );
        assert_eq!(
            records[2],
            Record {
                line: 9,
                conditions: vec![
                    Condition::SkipIf("mysql".into()),
                    Condition::OnlyIf("sqlite".into())
                ],
                kind: Kind::Query(Query {
                    types: "IT".into(),
                    sort: SortMode::Rows,
                    label: Some("label-1".into()),
                    sql: "SELECT a, b\n  FROM t1".into(),
                    expected: Expected::Values(vec!["1".into(), "(empty)".into()]),
                }),
            }
        );
        let Kind::Query(hashed) = &records[3].kind else {
            panic!("not a query: {:?}", records[3]);
        };
        assert_eq!(
            hashed.expected,
            Expected::Hash {
                count: 30,
                md5: "0123456789abcdef0123456789abcdef".into()
            }
        );
        let Kind::Query(empty) = &records[4].kind else {
            panic!("not a query: {:?}", records[4]);
        };
        assert_eq!(empty.sort, SortMode::Unsorted);
        assert_eq!(empty.expected, Expected::Values(vec![]));
        assert!(matches!(
            records[5].kind,
            Kind::Statement {
                expect_ok: false,
                ..
            }
        ));
        assert_eq!(records[6].kind, Kind::Halt);
    }

    #[test]
    fn refuses_what_is_not_a_record() {
        assert!(parse("select 1\n").unwrap_err().starts_with("line 1:"));
        assert!(
            parse("\n\nquery X\nSELECT 1\n")
                .unwrap_err()
                .starts_with("line 3:")
        );
        assert!(parse("skipif sqlite\n").is_err());
        assert!(parse("statement maybe\nSELECT 1\n").is_err());
    }
}
