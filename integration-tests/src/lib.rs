//! End-to-end tests of `sqlhttp` against a live `sqlhttpd` live in `tests/it/`.
