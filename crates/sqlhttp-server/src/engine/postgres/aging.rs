//! How a connection's caches of client statements forget the ones it stopped using (ADR 0067,
//! amended by ADR 0068): a [`Clock`] counting a cache's lookups with the rule for when a
//! statement went cold, used by the flights' cache (`flights`), and [`DriverAges`], the same
//! rule kept beside the driver's cache (deadpool's `StatementCache`, which keeps no ages) on a
//! clock of the connection's requests.
//!
//! Every statement a session holds costs each read's reset about 0.3 µs of PostgreSQL's CPU:
//! the look for statements prepared from SQL text reads them all (ADR 0066), whichever cache
//! prepared them.
//!
//! Knows lookups and texts; nothing about how a statement is prepared or closed.

use std::collections::HashMap;

/// How many lookups of a connection's client statements a cached one may go without being
/// looked up before it is closed. Preparing one again costs about an extra flight, some 80 µs:
/// one unused for this many of its connection's requests has cost more held than it would
/// have to prepare again.
pub(super) const COLD_AFTER: u64 = 256;

/// How often, in lookups, a cache forgets its cold statements.
pub(super) const SWEEP_EVERY: u64 = 64;

/// One cache's clock: its lookups so far.
#[derive(Debug, Default)]
pub(super) struct Clock {
    lookups: u64,
}

impl Clock {
    /// Counts one lookup: its time, and whether the cache forgets its cold statements now.
    pub(super) fn tick(&mut self) -> (u64, bool) {
        self.lookups += 1;
        (self.lookups, self.lookups.is_multiple_of(SWEEP_EVERY))
    }

    /// The time of the last lookup.
    pub(super) fn now(&self) -> u64 {
        self.lookups
    }

    /// Whether a statement last looked up at `used` went cold.
    pub(super) fn is_cold(&self, used: u64) -> bool {
        self.lookups - used > COLD_AFTER
    }
}

/// When each text in one connection's driver cache was last looked up, on a clock of the
/// connection's requests: its flights never look the driver's cache up, so a clock of the
/// cache's own lookups would stop while the connection serves only verified reads, and the
/// statements would stay. Holds only texts the cache holds (a text is recorded once prepared
/// into it, and every emptying of the cache forgets them all: `Lease::forget_driver_statements`),
/// and of those only the ones looked up in the last [`COLD_AFTER`] + [`SWEEP_EVERY`] requests.
#[derive(Debug, Default)]
pub(crate) struct DriverAges {
    clock: Clock,
    used: HashMap<String, u64>,
}

impl DriverAges {
    /// Counts one request on the connection; the texts that went cold, to be removed from the
    /// driver's cache (which closes their statements on the session).
    pub(super) fn request(&mut self) -> Vec<String> {
        let (_, sweep) = self.clock.tick();
        if !sweep {
            return Vec::new();
        }
        let clock = &self.clock;
        self.used
            .extract_if(|_, used| clock.is_cold(*used))
            .map(|(sql, _)| sql)
            .collect()
    }

    /// Records a lookup of `sql` in the driver's cache by this request.
    pub(super) fn looked_up(&mut self, sql: &str) {
        let now = self.clock.now();
        match self.used.get_mut(sql) {
            Some(used) => *used = now,
            None => {
                self.used.insert(sql.to_owned(), now);
            }
        }
    }

    /// Forgets every text: the driver's cache was emptied.
    pub(super) fn forget_all(&mut self) {
        self.used.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_text_not_looked_up_for_cold_after_requests_is_named_once_at_a_sweep() {
        let mut ages = DriverAges::default();
        assert!(ages.request().is_empty());
        ages.looked_up("SELECT 1");
        let mut cold = Vec::new();
        for n in 0..COLD_AFTER + SWEEP_EVERY {
            cold.extend(ages.request());
            // Every other request uses the driver; the rest are flights, which never look it up.
            if n % 2 == 0 {
                ages.looked_up("SELECT 2");
            }
        }
        assert_eq!(
            cold,
            ["SELECT 1"],
            "named once, when a sweep first found it cold"
        );
        assert_eq!(ages.used.len(), 1, "and no longer held");
    }

    #[test]
    fn a_text_looked_up_within_cold_after_requests_stays() {
        let mut ages = DriverAges::default();
        for n in 0..10 * COLD_AFTER {
            assert!(ages.request().is_empty(), "request {n}");
            if n % COLD_AFTER == 0 {
                ages.looked_up("SELECT 1");
            }
        }
    }

    #[test]
    fn ever_new_texts_are_held_a_bounded_number_at_a_time() {
        let mut ages = DriverAges::default();
        for n in 0..10_000 {
            ages.request();
            ages.looked_up(&format!("SELECT {n}"));
            assert!(ages.used.len() as u64 <= COLD_AFTER + SWEEP_EVERY + 1);
        }
    }
}
