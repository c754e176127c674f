//! The broker's test harness, shared by every test family of the workspace (the server's, the
//! client's, the command line's and the end-to-end tests of the real binaries). Not published:
//! it exists for the broker's own tests.
//!
//! - [`process`]: the real `broker-server` binary on `127.0.0.1:0`, started and stopped by pid.
//! - [`in_process`]: the server in this process on `127.0.0.1:0`, with a oneshot as shutdown.
//! - [`raw`]: a minimal client over the protocol's codec, for tests of the wire itself.
//! - [`cluster`]: a cluster of real `broker-server` processes, its nodes started, killed and
//!   added.
//! - [`proxy`]: a TCP proxy that can cut every connection through it and change its backend.
//! - [`records`]: delivered records compared by place and content, not time.
//! - [`certs`]: a certificate authority and a server certificate, made at test time.
//! - [`files`]: a data directory's files, to compare before and after a start.
//! - [`rng`]: a deterministic generator, and numbers from the environment for longer runs.
//!
//! Tests panic on failure, so the harness does too: its `unwrap`s are assertions.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::missing_panics_doc)]

pub mod certs;
pub mod cluster;
pub mod files;
pub mod http;
pub mod in_process;
pub mod peer_links;
pub mod process;
pub mod proxy;
pub mod raw;
pub mod records;
pub mod rng;

/// The code blocks of the book's chapter on the Rust client, compiled as doc tests so that the
/// documentation cannot drift from the client's API. (Here rather than in the client's crate,
/// whose published package holds no book.)
#[cfg(doctest)]
#[doc = include_str!("../../../docs/rust-client.md")]
struct RustClientChapterDoctests;

/// The code blocks of the book's chapter on security (a client with TLS), compiled as doc
/// tests.
#[cfg(doctest)]
#[doc = include_str!("../../../docs/security.md")]
struct SecurityChapterDoctests;
