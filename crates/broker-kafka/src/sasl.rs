//! Authentication of a Kafka connection with SASL/PLAIN, when the server has a token: the
//! client names the mechanism (SaslHandshake version 1), then sends `authzid NUL username NUL
//! password` (SaslAuthenticate), the password being the server's token (the user name is not
//! checked). Until then a connection may only ask for the API versions. A handshake of version
//! 0 (after which the mechanism's bytes would come outside Kafka's framing) is answered
//! `UNSUPPORTED_VERSION`, and the connection closes.

use kafka_protocol::messages::{
    ApiKey, RequestKind, ResponseKind, SaslAuthenticateResponse, SaslHandshakeResponse,
};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;

use crate::Backend;

/// The only mechanism the listener speaks.
const PLAIN: &str = "PLAIN";

/// Where a connection is in its authentication.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Sasl {
    /// It must name a mechanism, then authenticate.
    Required,
    /// It named PLAIN: it must authenticate next.
    Handshaken,
    /// It authenticated, or the server has no token.
    Done,
}

/// What the authentication makes of a request.
#[derive(Debug)]
pub(crate) enum Gate {
    /// Handled as the listener handles it.
    Pass(RequestKind),
    /// Answered here.
    Answer(ResponseKind),
    /// Answered here, then the connection closes (a failed authentication).
    AnswerAndClose(ResponseKind),
    /// The connection closes unanswered: a request before authentication, or out of turn.
    Refuse,
}

impl Sasl {
    /// The state a new connection starts in.
    pub(crate) fn start<B: Backend>(backend: &B) -> Sasl {
        if backend.requires_authentication() {
            Sasl::Required
        } else {
            Sasl::Done
        }
    }

    /// Whether a request of API key `key` (as the frame's first two bytes give it) may be
    /// decoded at all: before authentication, only the APIs that lead to it are (decoding
    /// another could already take memory its claimed counts ask for).
    pub(crate) fn decodes(self, key: i16) -> bool {
        self == Sasl::Done
            || [
                ApiKey::ApiVersions,
                ApiKey::SaslHandshake,
                ApiKey::SaslAuthenticate,
            ]
            .iter()
            .any(|api| *api as i16 == key)
    }

    /// Passes `request` (of `api_key`) on, or answers it as the authentication says.
    pub(crate) fn gate<B: Backend>(
        &mut self,
        backend: &B,
        api_key: ApiKey,
        version: i16,
        request: RequestKind,
    ) -> Gate {
        match (request, *self) {
            (RequestKind::SaslHandshake(request), Sasl::Required) => {
                let mechanisms = vec![StrBytes::from_static_str(PLAIN)];
                let response = SaslHandshakeResponse::default().with_mechanisms(mechanisms);
                if version == 0 {
                    Gate::AnswerAndClose(ResponseKind::SaslHandshake(
                        response.with_error_code(ResponseError::UnsupportedVersion.code()),
                    ))
                } else if request.mechanism.as_str() == PLAIN {
                    *self = Sasl::Handshaken;
                    Gate::Answer(ResponseKind::SaslHandshake(response))
                } else {
                    Gate::Answer(ResponseKind::SaslHandshake(
                        response.with_error_code(ResponseError::UnsupportedSaslMechanism.code()),
                    ))
                }
            }
            (RequestKind::SaslAuthenticate(request), Sasl::Handshaken) => {
                // authzid NUL username NUL password
                let mut parts = request.auth_bytes.split(|&byte| byte == 0);
                let password = parts
                    .nth(2)
                    .and_then(|password| std::str::from_utf8(password).ok());
                if password.is_some_and(|password| backend.authenticate(password)) {
                    *self = Sasl::Done;
                    Gate::Answer(ResponseKind::SaslAuthenticate(
                        SaslAuthenticateResponse::default(),
                    ))
                } else {
                    Gate::AnswerAndClose(ResponseKind::SaslAuthenticate(
                        SaslAuthenticateResponse::default()
                            .with_error_code(ResponseError::SaslAuthenticationFailed.code())
                            .with_error_message(Some(StrBytes::from_static_str(
                                "authentication failed: the password must be the server's \
                                 auth token",
                            ))),
                    ))
                }
            }
            (RequestKind::SaslHandshake(_) | RequestKind::SaslAuthenticate(_), _) => Gate::Refuse,
            (request, Sasl::Done) => Gate::Pass(request),
            (request, _) if api_key == ApiKey::ApiVersions => Gate::Pass(request),
            (_, _) => Gate::Refuse,
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use broker_core::EventBroker;
    use kafka_protocol::messages::{
        ApiVersionsRequest, MetadataRequest, SaslAuthenticateRequest, SaslHandshakeRequest,
    };

    use super::*;
    use crate::testing::Shaped;

    fn handshake(mechanism: &'static str) -> RequestKind {
        RequestKind::SaslHandshake(
            SaslHandshakeRequest::default().with_mechanism(StrBytes::from_static_str(mechanism)),
        )
    }

    fn authenticate(password: &str) -> RequestKind {
        RequestKind::SaslAuthenticate(
            SaslAuthenticateRequest::default()
                .with_auth_bytes(format!("\0user\0{password}").into_bytes().into()),
        )
    }

    fn error_code(gate: &Gate) -> i16 {
        match gate {
            Gate::Answer(ResponseKind::SaslHandshake(response))
            | Gate::AnswerAndClose(ResponseKind::SaslHandshake(response)) => response.error_code,
            Gate::Answer(ResponseKind::SaslAuthenticate(response))
            | Gate::AnswerAndClose(ResponseKind::SaslAuthenticate(response)) => response.error_code,
            other => panic!("not an answer of the authentication: {other:?}"),
        }
    }

    /// Before authentication, only the requests that lead to it are decoded: another's body
    /// (a Metadata claiming billions of topics, say) is never read.
    #[test]
    fn only_the_requests_leading_to_authentication_are_decoded_before_it() {
        for state in [Sasl::Required, Sasl::Handshaken] {
            for api in [
                ApiKey::ApiVersions,
                ApiKey::SaslHandshake,
                ApiKey::SaslAuthenticate,
            ] {
                assert!(state.decodes(api as i16), "{state:?} {api:?}");
            }
            for api in [ApiKey::Metadata, ApiKey::Produce, ApiKey::Fetch] {
                assert!(!state.decodes(api as i16), "{state:?} {api:?}");
            }
            assert!(!state.decodes(-1));
        }
        assert!(Sasl::Done.decodes(ApiKey::Metadata as i16));
        assert!(Sasl::Done.decodes(-1));
    }

    #[test]
    fn plain_with_the_token_as_password_opens_the_connection() {
        let backend = Shaped::locked(EventBroker::new(10).unwrap());
        let mut sasl = Sasl::start(&backend);
        let versions = RequestKind::ApiVersions(ApiVersionsRequest::default());
        let metadata = || RequestKind::Metadata(MetadataRequest::default());
        assert!(matches!(
            sasl.gate(&backend, ApiKey::ApiVersions, 3, versions),
            Gate::Pass(_)
        ));
        assert!(matches!(
            sasl.gate(&backend, ApiKey::Metadata, 12, metadata()),
            Gate::Refuse
        ));
        let named = sasl.gate(&backend, ApiKey::SaslHandshake, 1, handshake("PLAIN"));
        assert!(matches!(named, Gate::Answer(_)) && error_code(&named) == 0);
        let passed = sasl.gate(
            &backend,
            ApiKey::SaslAuthenticate,
            2,
            authenticate("secret"),
        );
        assert!(matches!(passed, Gate::Answer(_)) && error_code(&passed) == 0);
        assert!(matches!(
            sasl.gate(&backend, ApiKey::Metadata, 12, metadata()),
            Gate::Pass(_)
        ));
    }

    #[test]
    fn a_wrong_password_or_mechanism_is_answered_with_its_error() {
        let backend = Shaped::locked(EventBroker::new(10).unwrap());
        let mut sasl = Sasl::start(&backend);
        let other = sasl.gate(
            &backend,
            ApiKey::SaslHandshake,
            1,
            handshake("SCRAM-SHA-256"),
        );
        assert_eq!(
            error_code(&other),
            ResponseError::UnsupportedSaslMechanism.code()
        );
        sasl.gate(&backend, ApiKey::SaslHandshake, 1, handshake("PLAIN"));
        let failed = sasl.gate(&backend, ApiKey::SaslAuthenticate, 2, authenticate("wrong"));
        assert!(matches!(failed, Gate::AnswerAndClose(_)));
        assert_eq!(
            error_code(&failed),
            ResponseError::SaslAuthenticationFailed.code()
        );
    }

    #[test]
    fn a_version_0_handshake_is_answered_unsupported_version_and_closes() {
        // Version 0 is advertised (older librdkafka needs to see it), never served.
        assert!(crate::apis::is_supported(ApiKey::SaslHandshake, 0));
        let backend = Shaped::locked(EventBroker::new(10).unwrap());
        let mut sasl = Sasl::start(&backend);
        let answer = sasl.gate(&backend, ApiKey::SaslHandshake, 0, handshake("PLAIN"));
        assert!(matches!(answer, Gate::AnswerAndClose(_)));
        assert_eq!(
            error_code(&answer),
            ResponseError::UnsupportedVersion.code()
        );
        assert_eq!(sasl, Sasl::Required);
    }
}
