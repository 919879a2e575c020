//! Tells the test suite whether this machine can run its PostgreSQL tests, so a test that cannot
//! run is reported as ignored rather than passed: `cfg(sqlhttpd_no_postgres)` is set when there
//! is neither a cluster to use (`SQLHTTPD_TEST_POSTGRES_URL`) nor PostgreSQL's binaries to start
//! one (`PG_BIN`, or `/usr/lib/postgresql/*/bin`, where `scripts/start-postgres` looks).
//!
//! Knows nothing of the server; it builds nothing.

use std::path::Path;

fn main() {
    println!("cargo::rustc-check-cfg=cfg(sqlhttpd_no_postgres)");
    println!("cargo::rerun-if-env-changed=SQLHTTPD_TEST_POSTGRES_URL");
    println!("cargo::rerun-if-env-changed=PG_BIN");
    println!("cargo::rerun-if-changed=/usr/lib/postgresql");
    println!("cargo::rerun-if-changed=build.rs");
    if !postgres_available() {
        println!("cargo::rustc-cfg=sqlhttpd_no_postgres");
    }
}

fn postgres_available() -> bool {
    if std::env::var_os("SQLHTTPD_TEST_POSTGRES_URL").is_some() {
        return true;
    }
    if let Some(bin) = std::env::var_os("PG_BIN") {
        return Path::new(&bin).join("initdb").exists();
    }
    let Ok(versions) = std::fs::read_dir("/usr/lib/postgresql") else {
        return false;
    };
    versions
        .flatten()
        .any(|version| version.path().join("bin/initdb").exists())
}
