//! Replays the committed fuzz corpus (`fuzz/corpus/<target>/`) through the fuzz targets, so
//! that `cargo test` catches a regression on any input the fuzzers once found interesting
//! without running a fuzzer.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::fs;
use std::path::PathBuf;

/// The corpus directory of `target`.
fn corpus(target: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../fuzz/corpus")
        .join(target)
}

fn replay(target: &str, run: fn(&[u8])) {
    let dir = corpus(target);
    let mut inputs: Vec<PathBuf> = fs::read_dir(&dir)
        .unwrap_or_else(|error| panic!("cannot read {}: {error}", dir.display()))
        .map(|entry| entry.unwrap().path())
        .collect();
    inputs.sort();
    assert!(!inputs.is_empty(), "the corpus of {target} is empty");
    for input in &inputs {
        let data = fs::read(input).unwrap();
        let outcome = std::panic::catch_unwind(|| run(&data));
        assert!(outcome.is_ok(), "{target} fails on {}", input.display());
    }
}

#[test]
fn frames_corpus_replays() {
    replay("frames", broker_fuzz::decode_frames);
}

#[test]
fn kafka_corpus_replays() {
    replay("kafka", broker_fuzz::serve_kafka_bytes);
}

#[test]
fn sequence_corpus_replays() {
    replay("sequence", broker_fuzz::apply_sequence);
}
