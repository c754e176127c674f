//! A request's header and body out of a frame, and a response into one. Every frame Kafka's
//! protocol sends is a 4-byte big-endian length and that many bytes (the connection's codec
//! splits them); a request's body starts with its API key, version and correlation id, which
//! are read before anything else so that even a request that does not decode is answered.

use bytes::{Buf, Bytes, BytesMut};
use kafka_protocol::messages::{
    ApiKey, ApiVersionsResponse, RequestHeader, RequestKind, ResponseHeader, ResponseKind,
};
use kafka_protocol::protocol::{Decodable, Encodable};
use kafka_protocol::ResponseError;

use crate::apis::{api_versions, is_supported};
use crate::KafkaError;

/// What a request frame holds.
#[derive(Debug)]
pub(crate) enum Parsed {
    /// A request the listener answers.
    Request {
        /// Its header (API key, version, correlation id, client id).
        header: RequestHeader,
        /// Its API.
        api_key: ApiKey,
        /// Its body (boxed: some requests are large).
        body: Box<RequestKind>,
    },
    /// `ApiVersions` of a version the listener does not speak: answered in version 0.
    UnsupportedApiVersions {
        /// The request's correlation id.
        correlation_id: i32,
    },
    /// A request that is not answered as its API says: an unknown API key, a version the
    /// listener does not speak, or a body that does not decode. Answered with its
    /// correlation id and `error` alone.
    Refused {
        /// The request's correlation id (0 when the frame is too short to hold one).
        correlation_id: i32,
        /// The code answered.
        error: ResponseError,
        /// What was wrong, for the log.
        reason: String,
    },
}

/// Reads the request in `frame`.
pub(crate) fn parse(mut frame: Bytes) -> Parsed {
    if frame.len() < 8 {
        return Parsed::Refused {
            correlation_id: 0,
            error: ResponseError::InvalidRequest,
            reason: format!("a request of {} bytes has no header", frame.len()),
        };
    }
    let mut fixed = &frame[..8];
    let (key, version, correlation_id) = (fixed.get_i16(), fixed.get_i16(), fixed.get_i32());
    let refused = |error, reason: String| Parsed::Refused {
        correlation_id,
        error,
        reason,
    };
    let Ok(api_key) = ApiKey::try_from(key) else {
        return refused(
            ResponseError::UnsupportedVersion,
            format!("unknown API key {key}"),
        );
    };
    if !is_supported(api_key, version) {
        if api_key == ApiKey::ApiVersions {
            return Parsed::UnsupportedApiVersions { correlation_id };
        }
        return refused(
            ResponseError::UnsupportedVersion,
            format!("{api_key:?} version {version} is not supported"),
        );
    }
    let header = match RequestHeader::decode(&mut frame, api_key.request_header_version(version)) {
        Ok(header) => header,
        Err(error) => {
            return refused(
                ResponseError::InvalidRequest,
                format!("{api_key:?} v{version}: bad header: {error}"),
            )
        }
    };
    match RequestKind::decode(api_key, &mut frame, version) {
        Ok(body) => Parsed::Request {
            header,
            api_key,
            body: Box::new(body),
        },
        Err(error) => refused(
            ResponseError::InvalidRequest,
            format!("{api_key:?} v{version}: bad body: {error}"),
        ),
    }
}

/// `response` to a request of `api_key` in `version`, as the frame's body (the codec adds the
/// length).
pub(crate) fn encode_response(
    api_key: ApiKey,
    version: i16,
    correlation_id: i32,
    response: &ResponseKind,
) -> Result<Bytes, KafkaError> {
    let mut buffer = BytesMut::new();
    ResponseHeader::default()
        .with_correlation_id(correlation_id)
        .encode(&mut buffer, api_key.response_header_version(version))
        .map_err(|error| KafkaError::Encode(error.to_string()))?;
    response
        .encode(&mut buffer, version)
        .map_err(|error| KafkaError::Encode(error.to_string()))?;
    Ok(buffer.freeze())
}

/// The answer to `ApiVersions` of an unsupported version: version 0, `UNSUPPORTED_VERSION` and
/// the supported APIs, as Kafka answers it.
pub(crate) fn encode_unsupported_api_versions(correlation_id: i32) -> Result<Bytes, KafkaError> {
    let response: ApiVersionsResponse = api_versions(ResponseError::UnsupportedVersion.code());
    encode_response(
        ApiKey::ApiVersions,
        0,
        correlation_id,
        &ResponseKind::ApiVersions(response),
    )
}

/// The answer to a refused request: its correlation id, then the error code.
pub(crate) fn encode_refusal(correlation_id: i32, error: ResponseError) -> Bytes {
    let mut buffer = BytesMut::with_capacity(6);
    bytes::BufMut::put_i32(&mut buffer, correlation_id);
    bytes::BufMut::put_i16(&mut buffer, error.code());
    buffer.freeze()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use bytes::BufMut;
    use kafka_protocol::messages::MetadataRequest;

    use super::*;

    fn request(key: i16, version: i16, correlation_id: i32, body: &[u8]) -> Bytes {
        let mut frame = BytesMut::new();
        frame.put_i16(key);
        frame.put_i16(version);
        frame.put_i32(correlation_id);
        frame.put_i16(-1); // no client id
        frame.put_slice(body);
        frame.freeze()
    }

    #[test]
    fn a_request_decodes_with_its_header() {
        let mut body = BytesMut::new();
        MetadataRequest::default().encode(&mut body, 1).unwrap();
        match parse(request(3, 1, 42, &body)) {
            Parsed::Request {
                header, api_key, ..
            } => {
                assert_eq!(api_key, ApiKey::Metadata);
                assert_eq!(header.correlation_id, 42);
            }
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn unknown_keys_versions_short_and_truncated_frames_are_refused_with_their_id() {
        let refused = |frame| match parse(frame) {
            Parsed::Refused {
                correlation_id,
                error,
                ..
            } => (correlation_id, error),
            other => panic!("unexpected {other:?}"),
        };
        assert_eq!(
            refused(request(999, 0, 7, &[])),
            (7, ResponseError::UnsupportedVersion)
        );
        assert_eq!(
            refused(request(3, 99, 8, &[])),
            (8, ResponseError::UnsupportedVersion)
        );
        assert_eq!(
            refused(Bytes::from_static(&[0, 3])),
            (0, ResponseError::InvalidRequest)
        );
        // Metadata v1 needs its topics array: a body cut short does not decode.
        assert_eq!(
            refused(request(3, 1, 9, &[0, 0])),
            (9, ResponseError::InvalidRequest)
        );
    }

    #[test]
    fn api_versions_of_an_unknown_version_is_answered_in_version_0() {
        match parse(request(18, 77, 5, &[])) {
            Parsed::UnsupportedApiVersions { correlation_id } => assert_eq!(correlation_id, 5),
            other => panic!("unexpected {other:?}"),
        }
        let mut answer = encode_unsupported_api_versions(5).unwrap();
        assert_eq!(answer.get_i32(), 5);
        let response = ApiVersionsResponse::decode(&mut answer, 0).unwrap();
        assert_eq!(response.error_code, 35);
        assert!(response
            .api_keys
            .iter()
            .any(|api| api.api_key == ApiKey::Produce as i16));
    }
}
