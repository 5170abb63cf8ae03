//! Who an HTTP request says it is: the principal its `Authorization`
//! header (`Basic` or `Bearer`) authenticates against `--credentials`,
//! the same on the master and the agent.

use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

/// The challenge a `401` carries.
pub const CHALLENGE: &str = "Basic realm=\"agora\"";

/// The principal `headers` authenticate: `Ok(None)` without credentials
/// to check against, or when none is offered and `required` is false;
/// `Err` the `401` answer (with the challenge) when one is required and
/// missing, or offered and wrong.
#[allow(clippy::result_large_err)] // the error is the answer
pub fn principal(
    credentials: Option<&agora_proto::Credentials>,
    headers: &HeaderMap,
    required: bool,
) -> Result<Option<String>, Response> {
    let Some(credentials) = credentials else {
        return Ok(None);
    };
    let given = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    match credentials.authenticate(given) {
        Ok(principal) => Ok(Some(principal)),
        Err(_) if !required && given.is_none() => Ok(None),
        Err(e) => {
            let mut response = (StatusCode::UNAUTHORIZED, e.to_string()).into_response();
            response.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static(CHALLENGE),
            );
            Err(response)
        }
    }
}
