//! `ApiError`: every error the HTTP host returns, in OpenAI's shape
//! `{"error": {"message", "type", "param", "code"}}` with the right status.
//!
//! Invariant: a 500 carries a request id to find it in the logs, not internals.

use axum::Json;
use axum::http::StatusCode;
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
}

impl ApiError {
    /// An error with this status and type.
    pub fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            kind,
            param: None,
            message: message.into(),
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
            Error::ModelUnavailable { .. }
            | Error::Load { .. }
            | Error::Download { .. }
            | Error::Checkpoint { .. }
            | Error::Unsupported(_) => {
                Self::new(StatusCode::SERVICE_UNAVAILABLE, "model_unavailable", msg)
            }
            Error::InvalidInput(_)
            | Error::TooLarge(_)
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
        (self.status, Json(body)).into_response()
    }
}

/// Results of handlers.
pub type ApiResult<T> = std::result::Result<T, ApiError>;
