//! Runnable examples for `sqlhttp` live beside this file; see `README.md` at the repository root.
