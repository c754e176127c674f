//! Fuzz target: arbitrary command sequences against the core (see
//! `broker_fuzz::apply_sequence`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| broker_fuzz::apply_sequence(data));
