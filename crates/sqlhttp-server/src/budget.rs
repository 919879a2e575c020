//! [`Budget`]: the server-wide memory budget for what requests make it buffer (request bodies
//! while they are read and run, and results built whole: keyed outcomes and batch results, until
//! they are sent), `--max-buffered-bytes` in all. A request's share is a [`Held`], given back
//! when it is dropped. Past the budget a request is refused with `503 UNAVAILABLE` and
//! `Retry-After`, always before anything of it has run.
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

/// What one request holds of the [`Budget`]; given back when dropped.
#[derive(Debug, Default)]
pub(crate) struct Held(Option<OwnedSemaphorePermit>);

impl Held {
    fn kib(&self) -> usize {
        self.0.as_ref().map_or(0, OwnedSemaphorePermit::num_permits)
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
        match &mut held.0 {
            Some(permit) => permit.merge(more),
            None => held.0 = Some(more),
        }
        Ok(())
    }

    /// Gives back what `held` holds beyond `total` bytes.
    pub(crate) fn shrink(held: &mut Held, total: usize) {
        let keep = total.div_ceil(1024);
        if let Some(permit) = &mut held.0
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
}
