//! [`Budget`]: the server-wide memory budget for what requests make it buffer (request bodies
//! while they are read and run, and results built whole: keyed outcomes and batch results, until
//! they are sent), `--max-buffered-bytes` in all. A request's share is a [`Held`], given back
//! when it is dropped. Past the budget a request is refused with `503 UNAVAILABLE` and
//! `Retry-After`, always before anything of it has run.
//!
//! A share may be *shared*: one buffered answer sent to several clients at once (a transaction's
//! stored result and each replay of it) is one copy in memory, so it is one share, held by
//! every answer that sends it ([`Held::sharing`]) and given back when the last is done.
//!
//! Knows a semaphore counted in KiB; nothing about HTTP, SQL or the engines.

use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::protocol::error::ApiError;

/// The server-wide budget; clones share it.
#[derive(Debug, Clone)]
pub(crate) struct Budget {
    kib: Arc<Semaphore>,
    bytes: usize,
}

/// What one request holds of the [`Budget`]; given back when dropped. It may also hold other
/// shares along with its own ([`Held::with`], [`Held::sharing`]): those are given back when the
/// last holder of each is dropped.
#[derive(Debug, Default)]
pub(crate) struct Held {
    permit: Option<OwnedSemaphorePermit>,
    along: Vec<Arc<Held>>,
}

impl Held {
    fn kib(&self) -> usize {
        self.permit
            .as_ref()
            .map_or(0, OwnedSemaphorePermit::num_permits)
    }

    /// Holds `other` too, until this is dropped.
    pub(crate) fn with(mut self, other: Held) -> Held {
        self.along.push(Arc::new(other));
        self
    }

    /// A holder of `shared`: one more answer that sends what `shared` counts (the share is
    /// given back when its last holder is dropped).
    pub(crate) fn sharing(shared: &Arc<Held>) -> Held {
        Held {
            permit: None,
            along: vec![Arc::clone(shared)],
        }
    }
}

impl Budget {
    /// A budget of `bytes` (at least 1 KiB).
    pub(crate) fn new(bytes: usize) -> Budget {
        Budget {
            kib: Arc::new(Semaphore::new(bytes.div_ceil(1024).max(1))),
            bytes,
        }
    }

    /// The whole budget, in bytes.
    pub(crate) fn bytes(&self) -> usize {
        self.bytes
    }

    /// KiB nobody holds now.
    #[cfg(test)]
    pub(crate) fn available_kib(&self) -> usize {
        self.kib.available_permits()
    }

    /// Bytes held now (in whole KiB), for the metrics.
    pub(crate) fn held_bytes(&self) -> usize {
        (self.bytes.div_ceil(1024).max(1) - self.kib.available_permits()) * 1024
    }

    /// Grows `held` to cover `total` bytes, or refuses with `503` (`held` is unchanged then).
    pub(crate) fn cover(&self, held: &mut Held, total: usize) -> Result<(), ApiError> {
        let need = total.div_ceil(1024).saturating_sub(held.kib());
        if need == 0 {
            return Ok(());
        }
        let more = u32::try_from(need)
            .ok()
            .and_then(|need| Arc::clone(&self.kib).try_acquire_many_owned(need).ok())
            .ok_or_else(|| {
                ApiError::unavailable(format!(
                    "the server is holding as many request bodies and results as it allows at \
                     once ({} bytes, --max-buffered-bytes); nothing of this request ran; retry \
                     later",
                    self.bytes
                ))
            })?;
        match &mut held.permit {
            Some(permit) => permit.merge(more),
            None => held.permit = Some(more),
        }
        Ok(())
    }

    /// Gives back what `held` holds beyond `total` bytes.
    pub(crate) fn shrink(held: &mut Held, total: usize) {
        let keep = total.div_ceil(1024);
        if let Some(permit) = &mut held.permit
            && permit.num_permits() > keep
        {
            drop(permit.split(permit.num_permits() - keep));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_are_held_until_dropped_and_shrink_to_what_is_kept() {
        let budget = Budget::new(100 * 1024);
        let mut a = Held::default();
        budget.cover(&mut a, 60 * 1024).unwrap();
        let mut b = Held::default();
        let refused = budget.cover(&mut b, 50 * 1024).unwrap_err();
        assert!(refused.message.contains("--max-buffered-bytes"));
        assert_eq!(b.kib(), 0, "a refusal holds nothing");
        Budget::shrink(&mut a, 10 * 1024);
        assert_eq!(budget.available_kib(), 90);
        budget.cover(&mut b, 50 * 1024).unwrap();
        drop((a, b));
        assert_eq!(budget.available_kib(), 100);
    }

    #[test]
    fn a_shared_share_is_given_back_when_its_last_holder_is_dropped() {
        let budget = Budget::new(100 * 1024);
        let mut stored = Held::default();
        budget.cover(&mut stored, 40 * 1024).unwrap();
        let mut other = Held::default();
        budget.cover(&mut other, 10 * 1024).unwrap();
        let stored = Arc::new(stored.with(other));
        let answers: Vec<Held> = (0..40).map(|_| Held::sharing(&stored)).collect();
        assert_eq!(budget.held_bytes(), 50 * 1024, "forty answers, one share");
        drop(stored);
        assert_eq!(budget.available_kib(), 50, "held while an answer is unsent");
        drop(answers);
        assert_eq!(budget.available_kib(), 100);
    }
}
