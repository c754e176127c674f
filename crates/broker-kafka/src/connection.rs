//! One Kafka client's connection: requests read one after the other and answered in order, as
//! Kafka's brokers answer them.

use std::future::Future;
use std::net::SocketAddr;

use broker_net::{Foreign, FrameError, FrameReader, FrameTimeouts, RequestMemory, LENGTH_PREFIX};
use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tracing::{debug, trace};

use crate::errors::answered_errors;
use crate::frame::{
    encode_refusal, encode_response, encode_unsupported_api_versions, parse, Parsed,
};
use crate::handler::{Answer, Endpoint, Handler};
use crate::sasl::{Gate, Sasl};
use crate::{Backend, KafkaError, KafkaSettings, KafkaState};
use kafka_protocol::messages::{ApiKey, ResponseKind};
use kafka_protocol::ResponseError;

/// The largest request a connection may send before it authenticates (when the server has a
/// token): ApiVersions and the SASL requests are small, and a client that has not proven
/// anything holds no more of the server's memory than this.
const MAX_UNAUTHENTICATED_FRAME: usize = 64 * 1024;

/// Serves one connection from `peer` whose socket's own address is `local`, until the client
/// closes it, an error, the idle timeout or `closing` completes; its consumer groups and
/// producers are `state`'s. Each request is read once it has room in `memory`, the process's request
/// memory, and holds it until it is answered. Returns how many requests it answered.
///
/// # Errors
/// [`KafkaError`] when the socket fails, a request is larger than the limit (the stream can
/// no longer be read in frames; before the connection authenticates the limit is 64 KiB) or
/// does not arrive whole within the read timeout.
pub async fn serve_connection<S, B>(
    stream: S,
    (local, peer): (SocketAddr, SocketAddr),
    backend: &B,
    state: &KafkaState,
    settings: &KafkaSettings,
    memory: RequestMemory,
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
        state,
        endpoint,
        client_host: format!("/{}", peer.ip()),
    };
    let mut reader = FrameReader::new(stream);
    let mut sasl = Sasl::start(backend);
    tokio::pin!(closing);
    let mut answered = 0;
    loop {
        // Until it authenticates, a connection may only send small requests.
        let limit = match sasl {
            Sasl::Done => settings.max_frame_bytes,
            Sasl::Required | Sasl::Handshaken => {
                MAX_UNAUTHENTICATED_FRAME.min(settings.max_frame_bytes)
            }
        };
        let timeouts = FrameTimeouts {
            idle: settings.idle_timeout,
            frame: settings.read_timeout,
        };
        // One request at a time: while one is worked on nothing more is read, so the
        // connection is never busy when it waits for a frame.
        let frame = tokio::select! {
            () = &mut closing => return Ok(answered),
            frame = reader.next(limit, &memory, timeouts, || false) => frame,
        };
        // The frame's room is held until its answer is written.
        let (frame, _room) = match frame {
            Ok(Some((mut frame, room))) => (frame.split_off(LENGTH_PREFIX).freeze(), room),
            Ok(None) | Err(FrameError::Idle) => return Ok(answered),
            Err(FrameError::TooLarge { size, .. }) => {
                // The length of no Kafka frame: maybe another protocol's first bytes.
                if let Some(foreign) = Foreign::from_start(reader.buffered()) {
                    let text = format!(
                        "This port speaks Kafka's protocol, not {}; {}.",
                        foreign.name(),
                        foreign.where_to_go()
                    );
                    if let Some(refusal) = foreign.refusal(&text) {
                        let written = reader.stream_mut().write_all(&refusal);
                        // The peer may be gone; it is refused either way.
                        let _ = tokio::time::timeout(settings.write_timeout, written).await;
                    }
                    return Err(KafkaError::Foreign(foreign));
                }
                return Err(KafkaError::FrameTooLarge { size, limit });
            }
            Err(FrameError::Slow) => {
                return Err(KafkaError::ReadTimeout {
                    limit: settings.read_timeout,
                });
            }
            Err(FrameError::Truncated { .. }) => {
                return Err(std::io::Error::from(std::io::ErrorKind::UnexpectedEof).into());
            }
            Err(FrameError::Io(error)) => return Err(error.into()),
        };
        // A client of the broker's own protocol: answered as a Kafka request of an API the
        // listener does not know (which the broker's client recognises), then closed.
        let native = answered == 0 && Foreign::from_body(&frame) == Some(Foreign::Broker);
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
            Reply::Send(answer) if native => (answer, Some(KafkaError::Foreign(Foreign::Broker))),
            Reply::Send(answer) => (answer, None),
            Reply::Nothing => continue,
            Reply::Close => {
                debug!(
                    "closing the connection of a producer without acks whose records were refused"
                );
                return Ok(answered);
            }
            Reply::SendAndClose(answer, error) => (answer, Some(error)),
        };
        tokio::time::timeout(settings.write_timeout, send(reader.stream_mut(), &answer))
            .await
            .map_err(|_| KafkaError::WriteTimeout)??;
        if let Some(error) = close {
            return Err(error);
        }
        answered += 1;
    }
}

/// Writes `answer` as one frame (its length, then itself) in one write, and flushes it: two
/// writes would send the length in a packet of its own (the socket has `TCP_NODELAY`).
async fn send<S: AsyncWrite + Unpin>(stream: &mut S, answer: &[u8]) -> std::io::Result<()> {
    let length = u32::try_from(answer.len()).map_err(|_| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "an answer too large for a frame",
        )
    })?;
    let mut frame = Vec::with_capacity(LENGTH_PREFIX + answer.len());
    frame.extend_from_slice(&length.to_be_bytes());
    frame.extend_from_slice(answer);
    stream.write_all(&frame).await?;
    stream.flush().await
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
    SendAndClose(Bytes, KafkaError),
}

/// The reply to the request in `frame`, told to the backend ([`Backend::answered`]).
async fn reply<B: Backend>(
    handler: &Handler<'_, B>,
    sasl: &mut Sasl,
    frame: Bytes,
) -> Result<Reply, KafkaError> {
    let key = frame
        .get(..2)
        .map(|key| i16::from_be_bytes([key[0], key[1]]));
    if key.is_some_and(|key| !sasl.decodes(key)) {
        // As a request before authentication is refused below, but before its body is read.
        return Err(KafkaError::Unauthenticated);
    }
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
            let send = |response: &ResponseKind| {
                handler
                    .backend
                    .answered(Some(api_key), || answered_errors(response));
                encode_response(api_key, version, correlation_id, response)
            };
            match sasl.gate(handler.backend, api_key, version, *body) {
                Gate::Pass(request) => match handler.handle(version, client_id, request).await {
                    Answer::Response(response) => Reply::Send(send(&response)?),
                    Answer::Nothing => {
                        handler.backend.answered(Some(api_key), Vec::new);
                        Reply::Nothing
                    }
                    Answer::Close => {
                        // A refused produce without acks: its batches' errors are not known
                        // here, only that there was one.
                        handler
                            .backend
                            .answered(Some(api_key), || vec![ResponseError::UnknownServerError]);
                        Reply::Close
                    }
                    Answer::Refused(error) => {
                        handler.backend.answered(Some(api_key), || vec![error]);
                        Reply::Send(encode_refusal(correlation_id, error))
                    }
                },
                Gate::Answer(response) => Reply::Send(send(&response)?),
                Gate::AnswerAndClose(response) => {
                    let why = match &response {
                        ResponseKind::SaslAuthenticate(_) => KafkaError::WrongPassword,
                        _ => KafkaError::Unauthenticated,
                    };
                    Reply::SendAndClose(send(&response)?, why)
                }
                // As Kafka's brokers do: a request before authentication closes the connection
                // unanswered (an answer in no request's format would only confuse the client).
                Gate::Refuse => return Err(KafkaError::Unauthenticated),
            }
        }
        Parsed::UnsupportedApiVersions { correlation_id } => {
            handler.backend.answered(Some(ApiKey::ApiVersions), || {
                vec![ResponseError::UnsupportedVersion]
            });
            Reply::Send(encode_unsupported_api_versions(correlation_id)?)
        }
        Parsed::Refused {
            correlation_id,
            error,
            reason,
        } => {
            debug!(cause = %reason, "refusing a Kafka request");
            handler.backend.answered(None, || vec![error]);
            Reply::Send(encode_refusal(correlation_id, error))
        }
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::time::Duration;

    use broker_core::EventBroker;
    use bytes::BytesMut;
    use kafka_protocol::messages::{
        ApiKey, ApiVersionsRequest, RequestHeader, SaslAuthenticateRequest, SaslHandshakeRequest,
    };
    use kafka_protocol::protocol::{Encodable, HeaderVersion, StrBytes};
    use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};
    use tokio::time::Instant;

    use super::*;
    use crate::testing::Shaped;

    fn settings() -> KafkaSettings {
        KafkaSettings {
            node_id: 0,
            cluster_id: "test".into(),
            advertise: None,
            max_frame_bytes: 8 << 20,
            max_record_bytes: 1 << 20,
            max_partitions: 64,
            log_dir: "/var/lib/broker".into(),
            auto_create_partitions: None,
            names: broker_core::NameRules::Broker,
            idle_timeout: Duration::from_secs(600),
            read_timeout: Duration::from_secs(2),
            write_timeout: Duration::from_secs(60),
        }
    }

    /// Serves the server's end of a connection whose client end is returned.
    fn serve<'a>(
        backend: &'a Shaped,
        state: &'a KafkaState,
        settings: &'a KafkaSettings,
    ) -> (
        DuplexStream,
        impl Future<Output = Result<u64, KafkaError>> + 'a,
    ) {
        let (client, server) = tokio::io::duplex(1 << 20);
        let address = SocketAddr::from(([127, 0, 0, 1], 9093));
        let served = serve_connection(
            server,
            (address, address),
            backend,
            state,
            settings,
            RequestMemory::new(1 << 30),
            std::future::pending(),
        );
        (client, served)
    }

    /// `request` framed as a client sends it, with correlation id `id`.
    fn frame<R: Encodable + HeaderVersion>(
        key: ApiKey,
        version: i16,
        id: i32,
        request: &R,
    ) -> Vec<u8> {
        let mut body = BytesMut::new();
        RequestHeader::default()
            .with_request_api_key(key as i16)
            .with_request_api_version(version)
            .with_correlation_id(id)
            .encode(&mut body, R::header_version(version))
            .unwrap();
        request.encode(&mut body, version).unwrap();
        let mut frame = (body.len() as u32).to_be_bytes().to_vec();
        frame.extend_from_slice(&body);
        frame
    }

    /// The correlation id of the next answer on `client`.
    async fn answer_id(client: &mut DuplexStream) -> i32 {
        let length = client.read_u32().await.unwrap();
        let mut body = vec![0; length as usize];
        client.read_exact(&mut body).await.unwrap();
        i32::from_be_bytes(body[..4].try_into().unwrap())
    }

    /// Names SASL/PLAIN and sends `password`, as requests 1 and 2, and reads both answers.
    async fn authenticate(client: &mut DuplexStream, password: &str) {
        let handshake =
            SaslHandshakeRequest::default().with_mechanism(StrBytes::from_static_str("PLAIN"));
        client
            .write_all(&frame(ApiKey::SaslHandshake, 1, 1, &handshake))
            .await
            .unwrap();
        assert_eq!(answer_id(client).await, 1);
        let authenticate = SaslAuthenticateRequest::default()
            .with_auth_bytes(format!("\0user\0{password}").into_bytes().into());
        client
            .write_all(&frame(ApiKey::SaslAuthenticate, 1, 2, &authenticate))
            .await
            .unwrap();
        assert_eq!(answer_id(client).await, 2);
    }

    #[tokio::test(start_paused = true)]
    async fn before_it_authenticates_a_connection_may_send_no_request_over_64_kib() {
        let backend = Shaped::locked(EventBroker::new(10).unwrap());
        let (state, settings) = (KafkaState::default(), settings());
        let (mut client, served) = serve(&backend, &state, &settings);
        let sending = async move {
            client
                .write_all(&(8_u32 << 20).to_be_bytes())
                .await
                .unwrap();
            client.write_all(&[0; 1000]).await.unwrap();
            client
        };
        let (result, _client) = tokio::join!(served, sending);
        assert!(
            matches!(
                result,
                Err(KafkaError::FrameTooLarge {
                    size: 8_388_608,
                    limit: 65_536
                })
            ),
            "{result:?}"
        );
    }

    #[tokio::test]
    async fn once_it_authenticates_a_connection_may_send_requests_up_to_the_frame_limit() {
        let backend = Shaped::locked(EventBroker::new(10).unwrap());
        let (state, settings) = (KafkaState::default(), settings());
        let (mut client, served) = serve(&backend, &state, &settings);
        let talking = async move {
            authenticate(&mut client, "secret").await;
            // A request of 100 kB (an ApiVersions with bytes after it): read and answered.
            let mut large = frame(ApiKey::ApiVersions, 0, 3, &ApiVersionsRequest::default());
            large.extend_from_slice(&[0; 100_000]);
            let length = (large.len() - 4) as u32;
            large[..4].copy_from_slice(&length.to_be_bytes());
            client.write_all(&large).await.unwrap();
            assert_eq!(answer_id(&mut client).await, 3);
        };
        tokio::select! {
            result = served => panic!("the connection ended: {result:?}"),
            () = talking => {}
        }
    }

    #[tokio::test]
    async fn a_wrong_password_is_told_apart_from_no_authentication() {
        let backend = Shaped::locked(EventBroker::new(10).unwrap());
        let (state, settings) = (KafkaState::default(), settings());
        let (mut client, served) = serve(&backend, &state, &settings);
        let talking = async move {
            authenticate(&mut client, "wrong").await;
            client
        };
        let (result, _client) = tokio::join!(served, talking);
        assert!(
            matches!(result, Err(KafkaError::WrongPassword)),
            "{result:?}"
        );
        let (client, served) = serve(&backend, &state, &settings);
        let asking = async move {
            let mut client = client;
            let metadata = kafka_protocol::messages::MetadataRequest::default();
            client
                .write_all(&frame(ApiKey::Metadata, 1, 1, &metadata))
                .await
                .unwrap();
            client
        };
        let (result, _client) = tokio::join!(served, asking);
        assert!(
            matches!(result, Err(KafkaError::Unauthenticated)),
            "{result:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_not_whole_within_the_read_timeout_closes_the_connection() {
        let backend = Shaped::locked(EventBroker::new(10).unwrap());
        let (state, settings) = (KafkaState::default(), settings());
        let (mut client, served) = serve(&backend, &state, &settings);
        let started = Instant::now();
        let sending = async move {
            client.write_all(&100_u32.to_be_bytes()).await.unwrap();
            client.write_all(&[0; 10]).await.unwrap();
            client
        };
        let (result, _client) = tokio::join!(served, sending);
        assert!(
            matches!(result, Err(KafkaError::ReadTimeout { .. })),
            "{result:?}"
        );
        assert!(
            started.elapsed() <= settings.read_timeout * 2,
            "long before the idle timeout"
        );
    }

    /// Records each write it is given.
    #[derive(Default)]
    struct Writes(Vec<Vec<u8>>);

    impl AsyncWrite for Writes {
        fn poll_write(
            mut self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
            bytes: &[u8],
        ) -> std::task::Poll<std::io::Result<usize>> {
            self.0.push(bytes.to_vec());
            std::task::Poll::Ready(Ok(bytes.len()))
        }

        fn poll_flush(
            self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<std::io::Result<()>> {
            std::task::Poll::Ready(Ok(()))
        }

        fn poll_shutdown(
            self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<std::io::Result<()>> {
            std::task::Poll::Ready(Ok(()))
        }
    }

    #[tokio::test]
    async fn an_answer_goes_out_with_its_length_in_one_write() {
        let mut writes = Writes::default();
        send(&mut writes, b"answer").await.unwrap();
        assert_eq!(writes.0, [b"\0\0\0\x06answer".to_vec()]);
    }
}
