//! Sets `cfg(pgwire_no_postgres)` when no test cluster is named (`SQLHTTPD_TEST_POSTGRES_URL`), so
//! the tests that need PostgreSQL are reported as ignored rather than passed.

fn main() {
    println!("cargo::rustc-check-cfg=cfg(pgwire_no_postgres)");
    println!("cargo::rerun-if-env-changed=SQLHTTPD_TEST_POSTGRES_URL");
    if std::env::var_os("SQLHTTPD_TEST_POSTGRES_URL").is_none() {
        println!("cargo::rustc-cfg=pgwire_no_postgres");
    }
}
