//! The one error type of every client call, and the error of a record a producer did not
//! store.

use broker_core::BrokerError;
use broker_proto::ErrorReply;

/// Why a client call failed.
///
/// The variants keep apart what the caller can act on: a broker rule refused the call
/// ([`Error::Broker`], the same error the in-process core returns), the server refused it for its
/// own reasons ([`Error::Server`]), the connection could not be opened ([`Error::Io`],
/// [`Error::Refused`]) or was lost ([`Error::ConnectionLost`]), the answer took too long
/// ([`Error::Timeout`]), the answer made no sense ([`Error::Protocol`]), or a producer's record
/// was not stored ([`Error::Producer`]).
///
/// A call that fails with `ConnectionLost` or `Timeout` may or may not have been applied by the
/// server: the request may have been sent before the answer was lost.
///
/// ```no_run
/// # async fn run(client: broker_client::Client) {
/// use broker_client::{BrokerError, Error};
///
/// match client.create("orders", 3).await {
///     Ok(created) => println!("created: {created}"),
///     // Refused by the broker: nothing changed.
///     Err(Error::Broker(BrokerError::InvalidArgument(why))) => eprintln!("refused: {why}"),
///     // May or may not have been applied: ask again (creating is idempotent).
///     Err(Error::ConnectionLost(_) | Error::Timeout) => eprintln!("unknown outcome"),
///     Err(other) => eprintln!("failed: {other}"),
/// }
/// # }
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The broker refused the call (wire error codes 0 and 1), exactly as
    /// `broker_core::EventBroker` would have: the call changed nothing.
    /// `Error::Broker(BrokerError::InvalidArgument(_))` is the network form of the core's
    /// invalid-argument exception.
    #[error(transparent)]
    Broker(BrokerError),
    /// The server refused the request for a reason of its own (every wire error code but 0 and
    /// 1): too large, shutting down, malformed, unauthenticated, storage failure. A request
    /// larger than the frame limit the server announced fails with
    /// [`ErrorReply::TooLarge`] here without being sent.
    #[error("server error: {0}")]
    Server(ErrorReply),
    /// Opening a connection failed: name resolution, TCP connect, or the hello exchange (an I/O
    /// error, the server closing the connection, or the connect timeout, as
    /// [`std::io::ErrorKind::TimedOut`]).
    #[error("cannot connect: {0}")]
    Io(std::io::Error),
    /// The connection died (end of stream, I/O error, protocol error) while the call was
    /// outstanding or being sent, or the call waited for a reconnection another call attempted
    /// and that failed. The next call opens a new connection.
    #[error("connection lost: {0}")]
    ConnectionLost(String),
    /// No answer came within the request timeout (extended by the call's maximum wait).
    #[error("request timed out")]
    Timeout,
    /// The server refused the hello: wrong protocol version, wrong auth token.
    #[error("the server refused the connection: {0}")]
    Refused(ErrorReply),
    /// TLS could not be set up or its handshake failed: an unreadable CA file, an invalid
    /// server name, a server certificate that is not trusted or does not carry the server name,
    /// a server that speaks TLS to a plain client or the other way round.
    #[error("tls error: {0}")]
    Tls(String),
    /// The server answered something this client cannot understand: an undecodable response, an
    /// outcome of the wrong kind for the call, an unknown protocol version.
    #[error("protocol error: {0}")]
    Protocol(String),
    /// A record sent through a [`crate::Producer`] was not stored: its
    /// [`ProducerError`], so that a function returning this crate's one error type takes
    /// a producer's error with `?`.
    #[error(transparent)]
    Producer(Box<ProducerError>),
}

impl From<ProducerError> for Error {
    fn from(error: ProducerError) -> Error {
        Error::Producer(Box::new(error))
    }
}

impl Error {
    /// The client-side form of an error reply: codes 0 and 1 become [`Error::Broker`], the rest
    /// [`Error::Server`].
    pub(crate) fn from_reply(reply: ErrorReply) -> Error {
        match reply.to_broker_error() {
            Some(broker) => Error::Broker(broker),
            None => Error::Server(reply),
        }
    }
}

impl Error {
    /// Whether the call may have been applied although it failed: its answer was lost or late
    /// ([`Error::ConnectionLost`], [`Error::Timeout`]).
    ///
    /// ```no_run
    /// # async fn run(client: broker_client::Client) -> Result<(), broker_client::Error> {
    /// match client.publish("orders", 0, "order 1").await {
    ///     Ok(offset) => println!("stored at offset {offset}"),
    ///     // Maybe stored: publishing it again could store it twice. Look at the partition's
    ///     // end first (or let a `Producer` resend it: it stores a record once).
    ///     Err(error) if error.may_have_been_applied() => {
    ///         let end = client.end_offset("orders", 0).await?;
    ///         println!("orders/0 now ends at {end}; check whether order 1 is there");
    ///     }
    ///     Err(error) => return Err(error),
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub fn may_have_been_applied(&self) -> bool {
        matches!(self, Error::ConnectionLost(_) | Error::Timeout)
    }

    /// Whether the same call may succeed if made again later, unchanged: the server could not
    /// be reached or the connection was lost ([`Error::Io`], [`Error::ConnectionLost`]), the
    /// answer was late ([`Error::Timeout`]), or the server refused for a passing reason (it is
    /// shutting down, its storage fails until it is restarted, or it is a node of a cluster
    /// that has no leader now: nothing was applied). [`crate::Producer`] and
    /// [`crate::Consumer`] retry these by themselves.
    ///
    /// ```no_run
    /// # async fn run(client: broker_client::Client) -> Result<(), broker_client::Error> {
    /// use std::time::Duration;
    ///
    /// let mut attempt = 0;
    /// let end = loop {
    ///     match client.end_offset("orders", 0).await {
    ///         Err(error) if error.is_retriable() && attempt < 5 => {
    ///             attempt += 1;
    ///             tokio::time::sleep(Duration::from_millis(100 << attempt)).await;
    ///         }
    ///         answered => break answered?,
    ///     }
    /// };
    /// # Ok(())
    /// # }
    /// ```
    pub fn is_retriable(&self) -> bool {
        matches!(
            self,
            Error::Io(_)
                | Error::ConnectionLost(_)
                | Error::Timeout
                | Error::Broker(BrokerError::Storage(_))
                | Error::Server(
                    ErrorReply::Storage(_)
                        | ErrorReply::ShuttingDown
                        | ErrorReply::NotLeader { .. }
                )
        )
    }

    /// The same error again, for each of many waiters on one failed call.
    pub(crate) fn copy(&self) -> Error {
        match self {
            Error::Broker(error) => Error::Broker(error.clone()),
            Error::Server(reply) => Error::Server(reply.clone()),
            Error::Io(error) => Error::Io(std::io::Error::new(error.kind(), error.to_string())),
            Error::ConnectionLost(why) => Error::ConnectionLost(why.clone()),
            Error::Timeout => Error::Timeout,
            Error::Refused(reply) => Error::Refused(reply.clone()),
            Error::Tls(why) => Error::Tls(why.clone()),
            Error::Protocol(why) => Error::Protocol(why.clone()),
            Error::Producer(error) => Error::Producer(Box::new(error.copy())),
        }
    }
}

/// Why a record sent through a [`crate::Producer`] was not stored.
///
/// ```no_run
/// # async fn run(producer: broker_client::Producer) {
/// use broker_client::{ProducerError, PublishRecord};
///
/// match producer.send("orders", PublishRecord::keyed(None, "order 1")).await {
///     Ok(stored) => println!("offset {}", stored.offset),
///     // Still full after the delivery timeout: consumers behind, or a limit that refuses new
///     // records.
///     Err(ProducerError::Full { topic, partition }) => eprintln!("{topic}/{partition} is full"),
///     // Not stored, and sending it again cannot help.
///     Err(ProducerError::Refused(error)) => eprintln!("refused: {error}"),
///     Err(other) => eprintln!("not stored: {other}"),
/// }
/// # }
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ProducerError {
    /// Its partition stayed full (at its record or byte limit, with interest retention until
    /// every group consumed enough) for the whole delivery timeout.
    #[error("partition {partition} of {topic} stayed full for the delivery timeout")]
    Full {
        /// The topic.
        topic: String,
        /// The partition.
        partition: i32,
    },
    /// The server could not be reached, or did not answer, for the whole delivery timeout;
    /// `last` says what the last attempt met.
    #[error("not stored within the delivery timeout: {last}")]
    Timeout {
        /// The last attempt's error.
        last: Error,
    },
    /// The broker or the server refused the record for good (an unknown topic, a record larger
    /// than the server's payload limit or than a partition of its topic keeps, ...).
    #[error(transparent)]
    Refused(Error),
    /// The producer was dropped before the record was stored.
    #[error("the producer was dropped before the record was stored")]
    Closed,
}

impl ProducerError {
    /// The same error again (see [`Error::copy`]).
    pub(crate) fn copy(&self) -> ProducerError {
        match self {
            ProducerError::Full { topic, partition } => ProducerError::Full {
                topic: topic.clone(),
                partition: *partition,
            },
            ProducerError::Timeout { last } => ProducerError::Timeout { last: last.copy() },
            ProducerError::Refused(error) => ProducerError::Refused(error.copy()),
            ProducerError::Closed => ProducerError::Closed,
        }
    }
}

impl From<BrokerError> for Error {
    fn from(error: BrokerError) -> Self {
        Error::Broker(error)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn broker_codes_become_broker_errors() {
        assert!(matches!(
            Error::from_reply(ErrorReply::InvalidArgument("x".into())),
            Error::Broker(BrokerError::InvalidArgument(message)) if message == "x"
        ));
        assert!(matches!(
            Error::from_reply(ErrorReply::NotAssigned { partition: 3 }),
            Error::Broker(BrokerError::NotAssigned { partition: 3 })
        ));
    }

    #[test]
    fn server_codes_stay_server_errors() {
        assert!(matches!(
            Error::from_reply(ErrorReply::ShuttingDown),
            Error::Server(ErrorReply::ShuttingDown)
        ));
        assert!(matches!(
            Error::from_reply(ErrorReply::MalformedRequest("bad".into())),
            Error::Server(ErrorReply::MalformedRequest(_))
        ));
    }

    #[test]
    fn passing_failures_are_retriable_and_refusals_are_not() {
        assert!(Error::ConnectionLost("reset".into()).is_retriable());
        assert!(Error::Timeout.is_retriable());
        assert!(Error::Io(std::io::Error::other("refused")).is_retriable());
        assert!(Error::Server(ErrorReply::ShuttingDown).is_retriable());
        assert!(Error::Server(ErrorReply::NotLeader { leader: None }).is_retriable());
        assert!(
            !Error::Broker(BrokerError::InvalidArgument("unknown topic".into())).is_retriable()
        );
        assert!(!Error::Refused(ErrorReply::Unauthenticated("no token".into())).is_retriable());
        assert!(!Error::Protocol("bad".into()).is_retriable());
    }

    #[test]
    fn messages_are_lowercase_without_trailing_period() {
        let errors = [
            Error::Broker(BrokerError::NotAssigned { partition: 1 }),
            Error::Server(ErrorReply::ShuttingDown),
            Error::Io(std::io::Error::other("refused")),
            Error::ConnectionLost("end of stream".into()),
            Error::Timeout,
            Error::Refused(ErrorReply::Unauthenticated("no token".into())),
            Error::Protocol("bad".into()),
            Error::Tls("bad certificate".into()),
        ];
        for error in errors {
            let message = error.to_string();
            assert!(message.starts_with(char::is_lowercase), "{message}");
            assert!(!message.ends_with('.'), "{message}");
        }
    }
}
