//! Fuzz target: arbitrary bytes as a Kafka client's connection (see
//! `broker_fuzz::serve_kafka_bytes`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| broker_fuzz::serve_kafka_bytes(data));
