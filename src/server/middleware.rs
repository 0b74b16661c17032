//! The host's middleware: the bearer-token check (constant time) and the body limit and
//! timeout (a declared length over the limit is refused before the body is read; a stalled
//! body gets a 408), with non-JSON error responses given the OpenAI error shape.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::error::ApiError;
use super::state::AppState;

/// Equality of two secrets in time that does not depend on where they differ.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    let mut diff = a.len() ^ b.len();
    for i in 0..a.len().max(b.len()) {
        let x = a.get(i).copied().unwrap_or(0);
        let y = b.get(i).copied().unwrap_or(0);
        diff |= (x ^ y) as usize;
    }
    diff == 0
}

/// Refuses a declared body over the limit before reading it, and gives the body-limit
/// rejection (a plain-text 413 from the extractor) the OpenAI error shape.
pub(super) async fn body_limit(
    State(st): State<Arc<AppState>>,
    req: Request,
    next: Next,
) -> Response {
    let limit = st.cfg.max_body_bytes;
    let too_large = || {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "request_too_large",
            format!("the request body is over the limit of {limit} bytes"),
        )
        .into_response()
    };
    // A refusal that leaves (part of) the body unread ends the connection, and says so:
    // the unread bytes would otherwise be parsed as the next request, and a client that
    // reused the connection would see it closed under its next request.
    let unread = |mut resp: Response| {
        resp.headers_mut().insert(
            header::CONNECTION,
            header::HeaderValue::from_static("close"),
        );
        resp
    };
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u128>().ok());
    if declared.is_some_and(|n| n > limit as u128) {
        return unread(too_large());
    }
    // The body is read here, within the body timeout and the limit, so that a client that
    // stalls mid-body gets a 408 instead of holding the connection forever.
    let (parts, body) = req.into_parts();
    let timeout = Duration::from_secs(st.cfg.body_timeout_secs);
    let bytes = match tokio::time::timeout(timeout, axum::body::to_bytes(body, limit)).await {
        Err(_) => {
            return unread(
                ApiError::new(
                    StatusCode::REQUEST_TIMEOUT,
                    "request_timeout",
                    format!(
                        "the request body did not arrive within {} s",
                        st.cfg.body_timeout_secs
                    ),
                )
                .into_response(),
            );
        }
        Ok(Err(_)) => return unread(too_large()),
        Ok(Ok(b)) => b,
    };
    let req = Request::from_parts(parts, axum::body::Body::from(bytes));
    let resp = next.run(req).await;
    let is_json = resp
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    match resp.status() {
        StatusCode::PAYLOAD_TOO_LARGE if !is_json => too_large(),
        s if (s.is_client_error() || s.is_server_error()) && !is_json => ApiError::new(
            s,
            if s.is_server_error() {
                "server_error"
            } else {
                "invalid_request_error"
            },
            s.canonical_reason().unwrap_or("error"),
        )
        .into_response(),
        _ => resp,
    }
}

/// The token of an `Authorization` header value with the bearer scheme: the scheme is
/// case-insensitive and one or more spaces follow it (RFC 7235 / 6750).
fn bearer_token(value: &str) -> Option<&str> {
    let (scheme, rest) = value.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| rest.trim_start_matches(' '))
}

/// The bearer-token check, the outermost layer: it runs before routing and before the body
/// is read, so an unauthenticated client can neither hold body buffers nor learn which routes
/// exist (every path but `/health` answers 401 without the token).
pub(super) async fn auth(State(st): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    if let Some(token) = &st.cfg.token
        && req.uri().path() != "/health"
    {
        let ok = req
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(bearer_token)
            .is_some_and(|t| constant_time_eq(t.as_bytes(), token.as_bytes()));
        if !ok {
            let mut resp = ApiError::new(
                StatusCode::UNAUTHORIZED,
                "invalid_api_key",
                "missing or wrong bearer token (Authorization: Bearer <token>)",
            )
            .into_response();
            // The body was not read: the connection ends.
            resp.headers_mut().insert(
                header::CONNECTION,
                header::HeaderValue::from_static("close"),
            );
            return resp;
        }
    }
    next.run(req).await
}

#[cfg(test)]
mod tests {
    use super::bearer_token;

    #[test]
    fn the_bearer_scheme_is_case_insensitive_and_takes_one_or_more_spaces() {
        for v in [
            "Bearer s",
            "bearer s",
            "BEARER s",
            "Bearer  s",
            "bEaReR   s",
        ] {
            assert_eq!(bearer_token(v), Some("s"), "{v}");
        }
        for v in ["Basic s", "Bearers", "Bearer", "Token s"] {
            assert_ne!(bearer_token(v), Some("s"), "{v}");
        }
    }
}
