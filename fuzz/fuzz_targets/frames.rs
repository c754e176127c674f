//! Fuzz target: arbitrary bytes through the wire codec (see `broker_fuzz::decode_frames`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| broker_fuzz::decode_frames(data));
