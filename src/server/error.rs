//! `ApiError`: every error the HTTP host returns, in OpenAI's shape
//! `{"error": {"message", "type", "param", "code"}}` with the right status.
//!
//! Invariant: a 500 carries a request id to find it in the logs, not internals.

use axum::Json;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use crate::error::Error;

/// An OpenAI-style error response.
#[derive(Debug)]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// OpenAI's `type` (and `code`).
    pub kind: &'static str,
    /// The request field at fault, if one is.
    pub param: Option<&'static str>,
    /// What went wrong and what to do.
    pub message: String,
    /// Seconds after which a retry may succeed (the `Retry-After` header of 429/503).
    pub retry_after: Option<u64>,
}

impl ApiError {
    /// An error with this status and type.
    pub fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> Self {
        let retry_after = match status {
            StatusCode::TOO_MANY_REQUESTS | StatusCode::SERVICE_UNAVAILABLE => Some(5),
            _ => None,
        };
        Self {
            status,
            kind,
            param: None,
            message: message.into(),
            retry_after,
        }
    }

    /// A 400 `invalid_request_error`.
    pub fn bad(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_request_error", message)
    }

    /// A 400 naming the request field at fault.
    pub fn field(param: &'static str, message: impl Into<String>) -> Self {
        Self {
            param: Some(param),
            ..Self::bad(message)
        }
    }

    /// A 500 for a failure of the host itself (a task that panicked or was cancelled).
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", message)
    }
}

impl From<Error> for ApiError {
    fn from(e: Error) -> Self {
        let msg = e.to_string();
        match e {
            Error::UnknownModel { .. } => Self::new(StatusCode::NOT_FOUND, "model_not_found", msg),
            Error::Load { .. }
            | Error::Checkpoint { .. }
            | Error::Adapter { .. }
            | Error::File { .. } => Self::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "model_load_failed",
                redact_paths(&msg),
            ),
            Error::ModelUnavailable { .. } | Error::Download { .. } | Error::Unsupported(_) => {
                Self::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "model_unavailable",
                    redact_paths(&msg),
                )
            }
            Error::Cancelled(_) => Self::new(StatusCode::CONFLICT, "cancelled", msg),
            Error::WeightUpdate(_) => Self::new(
                StatusCode::BAD_REQUEST,
                "weight_update_refused",
                redact_paths(&msg),
            ),
            Error::TooLarge(_) => Self {
                param: Some("max_tokens"),
                ..Self::new(StatusCode::BAD_REQUEST, "context_length_exceeded", msg)
            },
            Error::Grammar(_) => Self::new(StatusCode::BAD_REQUEST, "invalid_constraint", msg),
            Error::InvalidInput(_)
            | Error::Template(_)
            | Error::Tokenizer(_)
            | Error::DemoMisuse { .. } => Self::bad(msg),
            _ => Self::internal(msg),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut message = self.message;
        if self.status == StatusCode::INTERNAL_SERVER_ERROR {
            let id = format!(
                "req_{:x}",
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_nanos())
                    .unwrap_or(0)
            );
            tracing::error!(request_id = %id, error = %message, "internal error");
            message = format!("{message} (request id {id})");
        }
        let body = json!({"error": {"message": message, "type": self.kind, "param": self.param, "code": self.kind}});
        let mut resp = (self.status, Json(body)).into_response();
        if let Some(s) = self.retry_after {
            resp.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(s));
        }
        if self.status == StatusCode::UNAUTHORIZED {
            resp.headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        resp
    }
}

/// Directories whose place the server never tells clients (the model dirs it was given),
/// longest first.
static PRIVATE_DIRS: parking_lot::RwLock<Vec<String>> = parking_lot::RwLock::new(Vec::new());

/// Registers a directory whose path [`redact_paths`] removes from every message, whatever
/// characters (spaces included) it holds.
pub fn register_private_dir(dir: &std::path::Path) {
    let mut d = dir.display().to_string();
    while d.len() > 1 && d.ends_with('/') {
        d.pop();
    }
    if d.is_empty() || d == "/" {
        return;
    }
    let mut dirs = PRIVATE_DIRS.write();
    if !dirs.contains(&d) {
        dirs.push(d);
        dirs.sort_by_key(|d| std::cmp::Reverse(d.len()));
    }
}

/// Replaces every absolute path in `msg` by its file name: clients learn which file of the
/// model is wrong, not where the server keeps it. Registered directories
/// ([`register_private_dir`]) go first, so a path with spaces does not leak its tail.
pub fn redact_paths(msg: &str) -> String {
    let mut msg = msg.to_string();
    for d in PRIVATE_DIRS.read().iter() {
        msg = msg
            .replace(&format!("{d}/"), "")
            .replace(d.as_str(), "(model dir)");
    }
    let mut out = String::with_capacity(msg.len());
    let mut rest = msg.as_str();
    while let Some(at) = rest.find('/') {
        let starts_word = at == 0
            || rest[..at]
                .chars()
                .next_back()
                .is_some_and(|c| c.is_whitespace() || "`'\"(=:".contains(c));
        if !starts_word {
            out.push_str(&rest[..=at]);
            rest = &rest[at + 1..];
            continue;
        }
        out.push_str(&rest[..at]);
        let end = rest[at..]
            .find(|c: char| c.is_whitespace() || "`'\",;)".contains(c))
            .map_or(rest.len(), |e| at + e);
        let path = rest[at..end].trim_end_matches(':');
        let name = path.rsplit('/').find(|p| !p.is_empty()).unwrap_or("");
        out.push_str(name);
        out.push_str(&rest[at + path.len()..end]);
        rest = &rest[end..];
    }
    out.push_str(rest);
    out
}

/// Results of handlers.
pub type ApiResult<T> = std::result::Result<T, ApiError>;

#[cfg(test)]
mod tests {
    use super::redact_paths;

    #[test]
    fn absolute_paths_become_file_names_and_the_rest_stays() {
        assert_eq!(
            redact_paths(
                "failed to load model `m`: /srv/models/m/model.safetensors: not a valid safetensors file"
            ),
            "failed to load model `m`: model.safetensors: not a valid safetensors file"
        );
        assert_eq!(
            redact_paths("tensor `a` in file `/x/y/shard-1.safetensors` (b/c stays)"),
            "tensor `a` in file `shard-1.safetensors` (b/c stays)"
        );
        assert_eq!(redact_paths("no path here, 3/4"), "no path here, 3/4");
        // A registered directory with spaces leaks no part of its path.
        super::register_private_dir(std::path::Path::new("/tmp/a b/secret dir/"));
        let m = redact_paths(
            "cannot read /tmp/a b/secret dir/config.json: no such file; dir /tmp/a b/secret dir",
        );
        assert!(!m.contains("a b") && !m.contains("secret"), "{m}");
        assert!(m.contains("config.json"), "{m}");
    }
}
