//! How finished interactive transactions ended, kept for a while so a re-sent COMMIT, rollback
//! or outcome request is answered truthfully ([`Finished`]): by token, for whoever owned the
//! transaction, for a time to live, and within a cap on their number.
//!
//! **A share each.** The cap is shared fairly between owners (credentials): when it is reached,
//! the oldest outcome of the owner that holds the most goes first. So a credential that opens
//! and ends transactions as fast as it can only ever pushes out its own outcomes, never another
//! credential's, as long as that one keeps fewer than its share (the cap over the owners that
//! hold any).
//!
//! Generic over what is kept; knows nothing about tokens' format, engines or HTTP.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

/// Finished outcomes of type `E`, by token, with their owners.
#[derive(Debug)]
pub(crate) struct Finished<E> {
    /// The most outcomes kept, all owners together.
    cap: usize,
    /// How long an outcome is kept.
    ttl: Duration,
    by_token: HashMap<String, Kept<E>>,
    /// Each owner's tokens, oldest first, with when each was kept (a token kept again is in
    /// its queue twice; only the entry whose time matches `by_token` counts).
    by_owner: HashMap<String, VecDeque<(String, Instant)>>,
    /// Entries in all of `by_owner`'s queues.
    queued: usize,
}

#[derive(Debug)]
struct Kept<E> {
    owner: String,
    ending: E,
    at: Instant,
}

impl<E: Clone> Finished<E> {
    /// Empty: at most `cap` outcomes, each for `ttl`.
    pub(crate) fn new(cap: usize, ttl: Duration) -> Finished<E> {
        Finished {
            cap: cap.max(1),
            ttl,
            by_token: HashMap::new(),
            by_owner: HashMap::new(),
            queued: 0,
        }
    }

    /// Whether anything is kept for `token` (whoever owns it).
    pub(crate) fn contains(&self, token: &str) -> bool {
        self.by_token.contains_key(token)
    }

    /// How `token` ended and whose it was.
    pub(crate) fn get(&self, token: &str) -> Option<(&str, &E)> {
        self.by_token
            .get(token)
            .map(|kept| (kept.owner.as_str(), &kept.ending))
    }

    /// How many outcomes are kept.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.by_token.len()
    }

    /// Keeps how `token` of `owner` ended, as of `now`: drops what is past its time to live,
    /// then, at the cap, the oldest outcome of the owner holding the most.
    pub(crate) fn keep(&mut self, token: &str, owner: &str, ending: E, now: Instant) {
        self.expire(now);
        while self.queued >= self.cap {
            let Some(largest) = self
                .by_owner
                .iter()
                .max_by_key(|(_, queue)| queue.len())
                .map(|(owner, _)| owner.clone())
            else {
                break;
            };
            self.pop_oldest(&largest);
        }
        self.by_owner
            .entry(owner.to_owned())
            .or_default()
            .push_back((token.to_owned(), now));
        self.queued += 1;
        self.by_token.insert(
            token.to_owned(),
            Kept {
                owner: owner.to_owned(),
                ending,
                at: now,
            },
        );
    }

    /// Drops every outcome older than the time to live.
    pub(crate) fn expire(&mut self, now: Instant) {
        let owners: Vec<String> = self
            .by_owner
            .iter()
            .filter(|(_, queue)| {
                queue
                    .front()
                    .is_some_and(|(_, at)| now.saturating_duration_since(*at) >= self.ttl)
            })
            .map(|(owner, _)| owner.clone())
            .collect();
        for owner in owners {
            while self.by_owner.get(&owner).is_some_and(|queue| {
                queue
                    .front()
                    .is_some_and(|(_, at)| now.saturating_duration_since(*at) >= self.ttl)
            }) {
                self.pop_oldest(&owner);
            }
        }
    }

    /// Drops `owner`'s oldest entry (and its outcome, unless the token was kept again since).
    fn pop_oldest(&mut self, owner: &str) {
        let Some(queue) = self.by_owner.get_mut(owner) else {
            return;
        };
        if let Some((token, at)) = queue.pop_front() {
            self.queued -= 1;
            if self.by_token.get(&token).is_some_and(|kept| kept.at == at) {
                self.by_token.remove(&token);
            }
        }
        if queue.is_empty() {
            self.by_owner.remove(owner);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOUR: Duration = Duration::from_secs(3600);

    #[test]
    fn one_owner_at_the_cap_pushes_out_only_its_own() {
        let mut finished = Finished::new(100, HOUR);
        let start = Instant::now();
        finished.keep("theirs", "b", "expired", start);
        for n in 0..10_000u32 {
            let at = start + Duration::from_millis(u64::from(n) + 1);
            finished.keep(&format!("mine-{n}"), "a", "rolled_back", at);
        }
        assert_eq!(finished.get("theirs"), Some(("b", &"expired")));
        assert_eq!(finished.len(), 100);
        assert!(finished.contains("mine-9999"));
        assert!(!finished.contains("mine-0"));
    }

    #[test]
    fn outcomes_go_after_their_time_to_live() {
        let mut finished = Finished::new(100, Duration::from_secs(10));
        let start = Instant::now();
        finished.keep("old", "a", 1, start);
        finished.keep("new", "b", 2, start + Duration::from_secs(5));
        finished.expire(start + Duration::from_secs(11));
        assert!(!finished.contains("old"));
        assert_eq!(finished.get("new"), Some(("b", &2)));
    }

    #[test]
    fn a_token_kept_again_keeps_its_latest_outcome() {
        let mut finished = Finished::new(2, HOUR);
        let start = Instant::now();
        finished.keep("t", "a", 1, start);
        finished.keep("t", "a", 2, start + Duration::from_secs(1));
        // The cap counts entries: the first one goes, the token's latest outcome stays.
        finished.keep("u", "a", 3, start + Duration::from_secs(2));
        assert_eq!(finished.get("t"), Some(("a", &2)));
        assert_eq!(finished.get("u"), Some(("a", &3)));
    }
}
