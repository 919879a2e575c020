//! The checked-query macros at compile time (trybuild): each mistake a developer can make is
//! caught with a message naming what is wrong (a column the struct lacks, a field of the wrong
//! type, the number of arguments, an argument of the wrong type for a PostgreSQL parameter, a
//! statement with no cache entry offline), and correct uses compile. The cases read
//! `tests/ui-cache/`, entries as `sqlhttp prepare` writes them, copied to where the macros look
//! in trybuild's project (`.sqlhttp/` beside its `Cargo.toml`); no server is involved.

use std::path::PathBuf;

/// trybuild's project directory for this package (`<target>/tests/trybuild/<package>/`).
fn project_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .parent()
        .expect("the target directory")
        .join("tests/trybuild")
        .join(env!("CARGO_PKG_NAME"))
}

#[test]
fn mistakes_are_caught_at_compile_time() {
    let cache = project_dir().join(".sqlhttp");
    let _ = std::fs::remove_dir_all(&cache);
    std::fs::create_dir_all(&cache).unwrap();
    let fixtures = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/ui-cache");
    for entry in std::fs::read_dir(fixtures).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), cache.join(entry.file_name())).unwrap();
    }
    let cases = trybuild::TestCases::new();
    cases.pass("tests/ui/pass.rs");
    cases.compile_fail("tests/ui/wrong_column.rs");
    cases.compile_fail("tests/ui/wrong_type.rs");
    cases.compile_fail("tests/ui/wrong_parameter_count.rs");
    cases.compile_fail("tests/ui/wrong_parameter_type.rs");
    cases.compile_fail("tests/ui/missing_entry.rs");
}
