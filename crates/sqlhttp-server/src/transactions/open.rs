//! Opening an interactive transaction: the registry's bounds (`--max-transactions`, each owner's
//! share), the engine's session asked for through [`Engine::begin`](crate::engine::Engine::begin), its token
//! (`<instance>.<128 random bits>`), and a re-sent open under the same Idempotency-Key, which
//! waits for the first one and answers its transaction.
//!
//! Knows the engine contract and the protocol's errors and bodies; nothing about HTTP or either
//! engine's SQL.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use crate::engine::interactive::{Interactive as _, TxOptions};
use crate::engine::{Engine as _, Outcome};
use crate::protocol::bookmark::ReadAt;
use crate::protocol::error::{ApiError, ErrorCode};
use crate::transactions::entry::{Entry, Live, OpenSlot, lock};
use crate::transactions::registry::Transactions;

/// Removes an open's slot from the registry when the open ends without a transaction: it
/// failed, or its future was dropped (the client went away mid-open).
pub(super) struct OpenGuard<'a> {
    pub(super) opens: &'a Mutex<HashMap<(String, String), OpenSlot>>,
    pub(super) key: (String, String),
    pub(super) slot: OpenSlot,
    pub(super) armed: bool,
}

impl Drop for OpenGuard<'_> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let mut opens = lock(self.opens);
        if opens
            .get(&self.key)
            .is_some_and(|slot| Arc::ptr_eq(slot, &self.slot))
        {
            opens.remove(&self.key);
        }
    }
}

impl Transactions {
    /// Opens a transaction for `owner` with `options`; a re-sent open under the same `key`
    /// answers the same transaction while it is open.
    pub(crate) async fn open(
        self: &Arc<Self>,
        owner: &str,
        key: Option<String>,
        options: TxOptions,
        at: ReadAt,
    ) -> Result<Outcome, ApiError> {
        if self.limits.max_open == 0 {
            return Err(ApiError::new(
                ErrorCode::NotFound,
                "this server does not offer interactive transactions (--max-transactions 0)",
            ));
        }
        let options = options.check()?;
        if self.closed.load(Ordering::Acquire) {
            return Err(crate::engine::shutting_down());
        }
        self.start_reaper();
        let Some(key) = key else {
            return self
                .open_now(owner, None, options, at)
                .await
                .map(|(_, outcome)| outcome);
        };
        let slot_key = (owner.to_owned(), key.clone());
        let slot = Arc::clone(lock(&self.opens).entry(slot_key.clone()).or_default());
        // A re-sent open waits for the first one with its key, then answers its transaction.
        let mut claim = Arc::clone(&slot).lock_owned().await;
        if let Some(entry) = claim
            .as_ref()
            .and_then(|token| lock(&self.live).get(token).cloned())
        {
            if entry.options != options {
                return Err(ApiError::new(
                    ErrorCode::IdempotencyKeyReused,
                    "this Idempotency-Key opened a transaction with other options (read_only, \
                     isolation, deferrable): a re-sent open must ask for the same; use a new key \
                     for another transaction",
                ));
            }
            return Ok(Outcome {
                status: 200,
                body: entry.opened.clone(),
                replayed: true,
                position: entry.opened_at_position,
            });
        }
        // Until this open has a transaction, the slot goes with it, however it ends (an error,
        // or its client gone mid-open, which drops this future): nothing of a cut open stays.
        let mut guard = OpenGuard {
            opens: &self.opens,
            key: slot_key,
            slot: Arc::clone(&slot),
            armed: true,
        };
        let opened = self.open_now(owner, Some(key), options, at).await;
        if let Ok((token, _)) = &opened {
            // The transaction's end removes the slot (see `finish`).
            *claim = Some(token.clone());
            guard.armed = false;
        }
        opened.map(|(_, outcome)| outcome)
    }

    /// Opens a transaction on the engine and registers it: its token and the open's answer.
    pub(super) async fn open_now(
        self: &Arc<Self>,
        owner: &str,
        key: Option<String>,
        options: TxOptions,
        at: ReadAt,
    ) -> Result<(String, Outcome), ApiError> {
        let owner_share = self.owners.open(owner)?;
        let permit = Arc::clone(&self.slots).try_acquire_owned().map_err(|_| {
            ApiError::unavailable(format!(
                "the server holds as many open transactions as it allows ({}, \
                 --max-transactions); retry later",
                self.limits.max_open
            ))
        })?;
        let session = self.engine.begin(options, at).await?;
        let position = session.position();
        if self.closed.load(Ordering::Acquire) {
            session.rollback().await;
            return Err(crate::engine::shutting_down());
        }
        let token = format!("{}.{:032x}", self.instance, rand::random::<u128>());
        let opened = crate::protocol::transaction::opened(
            &token,
            options.read_only,
            options.isolation,
            self.limits.idle_timeout,
            self.limits.max_lifetime,
        )?;
        let now = Instant::now();
        let entry = Arc::new(Entry {
            token: token.clone(),
            owner: owner.to_owned(),
            options,
            opened_at: now,
            open_key: key,
            opened: opened.clone(),
            opened_at_position: position,
            state: Arc::new(tokio::sync::Mutex::new(Live {
                session: Some(session),
                seq: 0,
                last: None,
                last_used: now,
            })),
            owner_share,
            _permit: permit,
        });
        lock(&self.live).insert(token.clone(), entry);
        Ok((token, Outcome::fresh(opened).at(position)))
    }
}
