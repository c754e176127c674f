//! Fuzz target: arbitrary bytes as a Kafka client's connection (see
//! `broker_fuzz::serve_kafka_bytes`).
#![no_main]

// The server's allocator, so that the fuzzer meets what the server does: jemalloc reserves
// the room kafka-protocol asks for a claimed array count without using it (see README.md).
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

libfuzzer_sys::fuzz_target!(|data: &[u8]| broker_fuzz::serve_kafka_bytes(data));
