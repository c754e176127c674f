//! Authentication of a Kafka connection with SASL/PLAIN, when the server has a token: the
//! client names the mechanism (SaslHandshake version 1), then sends `authzid NUL username NUL
//! password` (SaslAuthenticate), the password being the server's token (the user name is not
//! checked). Until then a connection may only ask for the API versions.

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

    /// Passes `request` (of `api_key`) on, or answers it as the authentication says.
    pub(crate) fn gate<B: Backend>(
        &mut self,
        backend: &B,
        api_key: ApiKey,
        request: RequestKind,
    ) -> Gate {
        match (request, *self) {
            (RequestKind::SaslHandshake(request), Sasl::Required) => {
                let mechanisms = vec![StrBytes::from_static_str(PLAIN)];
                let response = SaslHandshakeResponse::default().with_mechanisms(mechanisms);
                if request.mechanism.as_str() == PLAIN {
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
