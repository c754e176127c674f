//! Reading fuzzer bytes as a stream of small choices.

/// A cursor over the fuzzer's bytes. Reading past the end yields zeros, so every input, however
/// short, describes one complete run.
#[derive(Debug)]
pub(crate) struct Input<'a> {
    data: &'a [u8],
}

impl<'a> Input<'a> {
    /// A cursor at the start of `data`.
    pub(crate) fn new(data: &'a [u8]) -> Self {
        Input { data }
    }

    /// Whether every byte has been read.
    pub(crate) fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    /// Every byte not read yet, consuming them.
    pub(crate) fn rest(&mut self) -> &'a [u8] {
        std::mem::take(&mut self.data)
    }

    /// The next byte, or 0 past the end.
    pub(crate) fn byte(&mut self) -> u8 {
        match self.data.split_first() {
            Some((&first, rest)) => {
                self.data = rest;
                first
            }
            None => 0,
        }
    }

    /// One of `choices`, picked by the next byte.
    pub(crate) fn pick<T: Copy>(&mut self, choices: &[T]) -> T {
        choices[usize::from(self.byte()) % choices.len()]
    }

    /// The next byte reduced to `0..n` as an `i64`.
    pub(crate) fn below(&mut self, n: u8) -> i64 {
        i64::from(self.byte() % n)
    }
}
