//! A small seeded random number generator (SplitMix64) for the workload and the fault plan: a
//! run is described by its seed, and the tests inject one. It must not know what it is used for.

/// SplitMix64: fast, seedable, good enough to pick operations and fault durations.
#[derive(Debug, Clone)]
pub(crate) struct Rng(u64);

impl Rng {
    /// A generator that yields the same numbers for the same seed.
    pub(crate) fn seeded(seed: u64) -> Rng {
        Rng(seed)
    }

    /// The next 64 random bits.
    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (`0` when `n` is `0`).
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        if n == 0 { 0 } else { self.next_u64() % n }
    }

    /// A number in `low..=high` (`low` when `high < low`).
    pub(crate) fn between(&mut self, low: u64, high: u64) -> u64 {
        if high <= low {
            low
        } else {
            low + self.below(high - low + 1)
        }
    }

    /// A generator of its own, for one session or the scheduler, derived from this one.
    pub(crate) fn fork(&mut self) -> Rng {
        Rng(self.next_u64())
    }
}

#[cfg(test)]
mod tests {
    use super::Rng;

    #[test]
    fn the_same_seed_yields_the_same_numbers() {
        let mut a = Rng::seeded(7);
        let mut b = Rng::seeded(7);
        let xs: Vec<u64> = (0..16).map(|_| a.next_u64()).collect();
        let ys: Vec<u64> = (0..16).map(|_| b.next_u64()).collect();
        assert_eq!(xs, ys);
        assert_ne!(xs[0], xs[1]);
    }

    #[test]
    fn between_stays_in_its_bounds_and_reaches_both() {
        let mut rng = Rng::seeded(1);
        let draws: Vec<u64> = (0..1000).map(|_| rng.between(3, 5)).collect();
        assert!(draws.iter().all(|x| (3..=5).contains(x)));
        assert!(draws.contains(&3) && draws.contains(&5));
        assert_eq!(rng.between(9, 2), 9);
        assert_eq!(rng.below(0), 0);
    }
}
