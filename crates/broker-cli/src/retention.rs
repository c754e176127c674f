//! `--retention`, which `broker create` and `broker bench` share.

use broker_client::Retention;
use clap::ValueEnum;

/// `--retention`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum RetentionArg {
    /// A record stays until every group of the topic has consumed it.
    Interest,
    /// Records stay up to the topic's limits, consumed or not.
    Limits,
}

impl From<RetentionArg> for Retention {
    fn from(arg: RetentionArg) -> Self {
        match arg {
            RetentionArg::Interest => Retention::Interest,
            RetentionArg::Limits => Retention::Limits,
        }
    }
}
