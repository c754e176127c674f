//! A deterministic generator, so that a failing randomized test reproduces, and numbers from
//! the environment, so that a long run is the same test with a larger count.

/// A small deterministic generator (xorshift64*): the same seed gives the same calls, so a
/// failing run reproduces.
pub struct Rng(pub u64);

impl Rng {
    /// The next number of the sequence.
    pub fn next_u64(&mut self) -> u64 {
        // Xorshift never leaves zero: a zero seed is made odd.
        self.0 |= u64::from(self.0 == 0);
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// A number below `n` (which must not be 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }

    /// One of `choices` (which must not be empty).
    pub fn pick<T: Clone>(&mut self, choices: &[T]) -> T {
        choices[self.below(choices.len() as u64) as usize].clone()
    }
}

/// The number in the environment variable `name`, or `default` when it is not set.
pub fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .map(|value| {
            value
                .parse()
                .unwrap_or_else(|_| panic!("{name} must be a number"))
        })
        .unwrap_or(default)
}
