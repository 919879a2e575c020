//! Which parts of a bench run, from an environment variable of comma-separated names (unset or
//! empty: all of them); a name the bench does not know stops it with the names it knows, so a typo
//! never measures nothing in silence. Shared by the benches with `#[path]`.
//!
//! Knows environment variables only; nothing about what a bench measures.

/// The names of `known` that `variable` asks for (all of them when it is unset or empty).
pub(crate) fn chosen(variable: &str, known: &[&'static str]) -> Vec<&'static str> {
    let asked = std::env::var(variable).unwrap_or_default();
    let asked: Vec<&str> = asked
        .split(',')
        .map(str::trim)
        .filter(|name| !name.is_empty())
        .collect();
    if let Some(unknown) = asked.iter().find(|name| !known.contains(name)) {
        panic!("{variable}: `{unknown}` is none of {known:?}");
    }
    known
        .iter()
        .copied()
        .filter(|name| asked.is_empty() || asked.contains(name))
        .collect()
}
