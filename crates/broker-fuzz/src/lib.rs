//! The broker's fuzz targets as ordinary functions.
//!
//! The cargo-fuzz project in `fuzz/` (outside the workspace, run with `cargo fuzz`) calls these
//! functions with the fuzzer's inputs; `tests/corpus.rs` calls them with every input of the
//! committed corpus (`fuzz/corpus/<target>/`), so `cargo test` catches regressions without a
//! fuzzer. Each function panics, with a message naming the broken property, when an input
//! breaks one; that panic is what the fuzzer reports.
//!
//! - [`decode_frames`]: arbitrary bytes through the wire codec, fed in arbitrary chunks.
//! - [`apply_sequence`]: arbitrary command sequences applied to the core, with its invariants
//!   checked after every command.
//! - [`serve_kafka_bytes`]: arbitrary bytes as a Kafka client's connection to the Kafka
//!   listener.

mod frames;
mod input;
mod kafka;
mod sequence;

pub use frames::decode_frames;
pub use kafka::serve_kafka_bytes;
pub use sequence::apply_sequence;
