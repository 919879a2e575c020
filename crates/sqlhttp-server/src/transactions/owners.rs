//! Each credential's share of the interactive transactions ([`Owners`]): one owner may hold at
//! most half of the open transactions (`max(1, --max-transactions / 2)`) and half of the part
//! of the budget stored results may take (at least one result's limit), so one credential can
//! never take them all from the others.
//!
//! Knows the server's budget and the protocol's errors; nothing about tokens, sessions or HTTP.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use crate::budget::Budget;
use crate::protocol::error::ApiError;

/// Each owner's share of the transactions (see the module's doc), by owner: credentials are
/// the operator's, so there are as many entries as credentials that ever opened one.
pub(super) struct Owners {
    /// The most transactions one owner may hold open.
    pub(super) max_open: usize,
    /// The most of the stored results' part of the budget one owner's may hold.
    pub(super) result_bytes: usize,
    pub(super) by_owner: Mutex<HashMap<String, Arc<OwnerShare>>>,
}

/// One owner's share: its open transactions and its part of the stored results' budget.
pub(super) struct OwnerShare {
    pub(super) open: AtomicUsize,
    pub(super) results: Budget,
}

/// One of an owner's open-transaction places, given back when its transaction's entry goes.
pub(super) struct OwnerSlot(pub(super) Arc<OwnerShare>);

impl Drop for OwnerSlot {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Owners {
    pub(super) fn new(max_open: usize, share_bytes: usize, max_result_bytes: usize) -> Owners {
        Owners {
            max_open: (max_open / 2).max(1),
            result_bytes: (share_bytes / 2).max(max_result_bytes.min(share_bytes)),
            by_owner: Mutex::new(HashMap::new()),
        }
    }

    pub(super) fn share(&self, owner: &str) -> Arc<OwnerShare> {
        Arc::clone(
            self.by_owner
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .entry(owner.to_owned())
                .or_insert_with(|| {
                    Arc::new(OwnerShare {
                        open: AtomicUsize::new(0),
                        results: Budget::new(self.result_bytes),
                    })
                }),
        )
    }

    /// A place for one more open transaction of `owner`, or `503` when it holds its share.
    pub(super) fn open(&self, owner: &str) -> Result<OwnerSlot, ApiError> {
        let share = self.share(owner);
        share
            .open
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |open| {
                (open < self.max_open).then_some(open + 1)
            })
            .map_err(|_| {
                ApiError::unavailable(format!(
                    "this credential holds as many open transactions as one credential may ({}, \
                     half of --max-transactions, so that others always have their share); \
                     commit or roll one back, or retry later",
                    self.max_open
                ))
            })?;
        Ok(OwnerSlot(share))
    }
}
