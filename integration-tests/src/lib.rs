//! End-to-end tests of `sqlhttp` against a live `sqlhttpd` live in `tests/it/`; SQLite's
//! sqllogictest scripts (`sqllogictest/`), run through the SDK on one server, in `tests/slt/`.
