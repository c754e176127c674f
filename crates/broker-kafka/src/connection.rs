//! One Kafka client's connection: requests read one after the other and answered in order, as
//! Kafka's brokers answer them.

use std::future::Future;
use std::net::SocketAddr;

use bytes::Bytes;
use futures::{SinkExt, StreamExt};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_util::codec::{Framed, LengthDelimitedCodec};
use tracing::{debug, trace};

use crate::frame::{
    encode_refusal, encode_response, encode_unsupported_api_versions, parse, Parsed,
};
use crate::handler::{Answer, Endpoint, Handler};
use crate::sasl::{Gate, Sasl};
use crate::{Backend, Coordinator, KafkaError, KafkaSettings};

/// Serves one connection from `peer` whose socket's own address is `local`, until the client
/// closes it, an error, the idle timeout or `closing` completes; its consumer groups are
/// `coordinator`'s. Returns how many requests it answered.
///
/// # Errors
/// [`KafkaError`] when the socket fails or a request is larger than the limit (the stream can
/// no longer be read in frames).
pub async fn serve_connection<S, B>(
    stream: S,
    (local, peer): (SocketAddr, SocketAddr),
    backend: &B,
    coordinator: &Coordinator,
    settings: &KafkaSettings,
    closing: impl Future<Output = ()>,
) -> Result<u64, KafkaError>
where
    S: AsyncRead + AsyncWrite + Unpin,
    B: Backend,
{
    let endpoint = match &settings.advertise {
        Some((host, port)) => Endpoint {
            host: host.clone(),
            port: i32::from(*port),
        },
        None => Endpoint {
            host: local.ip().to_string(),
            port: i32::from(local.port()),
        },
    };
    let handler = Handler {
        backend,
        settings,
        coordinator,
        endpoint,
        client_host: format!("/{}", peer.ip()),
    };
    let codec = LengthDelimitedCodec::builder()
        .big_endian()
        .length_field_length(4)
        .max_frame_length(settings.max_frame_bytes)
        .new_codec();
    let mut framed = Framed::new(stream, codec);
    let mut sasl = Sasl::start(backend);
    tokio::pin!(closing);
    let mut answered = 0;
    loop {
        let frame = tokio::select! {
            () = &mut closing => return Ok(answered),
            frame = tokio::time::timeout(settings.idle_timeout, framed.next()) => frame,
        };
        let frame = match frame {
            Err(_) | Ok(None) => return Ok(answered),
            Ok(Some(Err(error))) if error.kind() == std::io::ErrorKind::InvalidData => {
                debug!(cause = %error, "an unreadable Kafka frame");
                return Err(KafkaError::FrameTooLarge {
                    limit: settings.max_frame_bytes,
                });
            }
            Ok(Some(Err(error))) => return Err(error.into()),
            Ok(Some(Ok(frame))) => frame.freeze(),
        };
        // A request that waits (a rebalance, a fetch) ends with the connection's closing.
        let started = tokio::time::Instant::now();
        let reply = tokio::select! {
            () = &mut closing => return Ok(answered),
            reply = reply(&handler, &mut sasl, frame) => reply?,
        };
        trace!(
            elapsed_us = started.elapsed().as_micros() as u64,
            "answered a Kafka request"
        );
        let (answer, close) = match reply {
            Reply::Send(answer) => (answer, false),
            Reply::Nothing => continue,
            Reply::Close => {
                debug!(
                    "closing the connection of a producer without acks whose records were refused"
                );
                return Ok(answered);
            }
            Reply::SendAndClose(answer) => (answer, true),
        };
        tokio::time::timeout(settings.write_timeout, framed.send(answer))
            .await
            .map_err(|_| KafkaError::WriteTimeout)??;
        if close {
            return Err(KafkaError::Unauthenticated);
        }
        answered += 1;
    }
}

/// What to write back for one request.
enum Reply {
    /// This answer.
    Send(Bytes),
    /// Nothing (a produce with `acks=0`).
    Nothing,
    /// Nothing, then close the connection (a refused produce with `acks=0`).
    Close,
    /// This answer, then close the connection (a client that did not authenticate).
    SendAndClose(Bytes),
}

/// The reply to the request in `frame`.
async fn reply<B: Backend>(
    handler: &Handler<'_, B>,
    sasl: &mut Sasl,
    frame: Bytes,
) -> Result<Reply, KafkaError> {
    Ok(match parse(frame) {
        Parsed::Request {
            header,
            api_key,
            body,
        } => {
            trace!(api = ?api_key, version = header.request_api_version, "Kafka request");
            let version = header.request_api_version;
            let correlation_id = header.correlation_id;
            let client_id = header.client_id.as_ref().map_or("", |id| id.as_str());
            match sasl.gate(handler.backend, api_key, version, *body) {
                Gate::Pass(request) => match handler.handle(version, client_id, request).await {
                    Answer::Response(response) => Reply::Send(encode_response(
                        api_key,
                        version,
                        correlation_id,
                        &response,
                    )?),
                    Answer::Nothing => Reply::Nothing,
                    Answer::Close => Reply::Close,
                    Answer::Refused(error) => Reply::Send(encode_refusal(correlation_id, error)),
                },
                Gate::Answer(response) => Reply::Send(encode_response(
                    api_key,
                    version,
                    correlation_id,
                    &response,
                )?),
                Gate::AnswerAndClose(response) => Reply::SendAndClose(encode_response(
                    api_key,
                    version,
                    correlation_id,
                    &response,
                )?),
                // As Kafka's brokers do: a request before authentication closes the connection
                // unanswered (an answer in no request's format would only confuse the client).
                Gate::Refuse => return Err(KafkaError::Unauthenticated),
            }
        }
        Parsed::UnsupportedApiVersions { correlation_id } => {
            Reply::Send(encode_unsupported_api_versions(correlation_id)?)
        }
        Parsed::Refused {
            correlation_id,
            error,
            reason,
        } => {
            debug!(cause = %reason, "refusing a Kafka request");
            Reply::Send(encode_refusal(correlation_id, error))
        }
    })
}
