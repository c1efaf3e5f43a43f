//! What the server answers when it does not answer a request: each case with its HTTP status
//! and OpenAI's error object (`{"error": {"message", "type", "param", "code"}}`).

use serde_json::{Value, json};

/// An error answered to the client.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// 400: one field of the request is refused; `param` names it (`stop[1]`,
    /// `messages[0].role`) and the message says what is legal.
    #[error("{message}")]
    Invalid { param: String, message: String },
    /// 400: the request as a whole (not JSON, not an object, neither of two fields given).
    #[error("{0}")]
    Body(String),
    /// 404: no route answers this method and path.
    #[error(
        "{method} {path} is not a route of this server: it serves POST /v1/completions, POST /v1/chat/completions, POST /v1/responses, GET /v1/responses/{{id}}, POST /v1/messages, POST /v1/messages/count_tokens, GET /v1/models, POST /tokenize, POST /detokenize, GET /tokenizer_info, GET /version, GET /health and GET /metrics"
    )]
    NoRoute { method: String, path: String },
    /// 404: `GET /v1/models/{id}` of a model this server does not serve.
    #[error("the model {id:?} does not exist: this server serves {served:?}")]
    NoModel { id: String, served: String },
    /// 404: a stored response asked for by id (`GET /v1/responses/{id}`, or the field
    /// `param`, `previous_response_id`) that the store does not hold.
    #[error(
        "no response {id:?} is stored here: it is unknown, was made with store false, or the store (--responses-store) has given it up"
    )]
    NotStored { id: String, param: Option<&'static str> },
    /// 404: a tokenizer route, and the checkpoint has no tokenizer.json.
    #[error("{route}: this model has no tokenizer.json, so the server has no tokenizer to offer")]
    NoTokenizer { route: &'static str },
    /// 405: the path is a route, the method is not its.
    #[error("{path} does not take {method}")]
    MethodNotAllowed { method: String, path: String },
    /// 403: a CORS preflight from an origin that `--allowed-origins` does not name.
    #[error(
        "cross-origin requests from {origin} are not allowed: start the server with --allowed-origins {origin} (or '*')"
    )]
    Origin { origin: String },
    /// The body could not be read (`413` too large, `400` cut off): axum's status and reason.
    #[error("the request body cannot be read: {reason}")]
    Unreadable { status: u16, reason: String },
    /// 429: `--max-queue` requests already wait.
    #[error("the queue is full ({waiting} requests wait): retry later")]
    QueueFull { waiting: u64 },
    /// 503: the server is draining before it exits.
    #[error("the server is shutting down")]
    ShuttingDown,
    /// 500: the engine failed or stopped.
    #[error("{0}")]
    Server(String),
}

impl ApiError {
    pub fn invalid(param: impl Into<String>, message: impl Into<String>) -> ApiError {
        ApiError::Invalid { param: param.into(), message: message.into() }
    }

    pub fn body(message: impl Into<String>) -> ApiError {
        ApiError::Body(message.into())
    }

    pub fn server(message: impl Into<String>) -> ApiError {
        ApiError::Server(message.into())
    }

    pub fn status(&self) -> u16 {
        match self {
            ApiError::Invalid { .. } | ApiError::Body(_) => 400,
            ApiError::NoRoute { .. }
            | ApiError::NoModel { .. }
            | ApiError::NoTokenizer { .. }
            | ApiError::NotStored { .. } => 404,
            ApiError::MethodNotAllowed { .. } => 405,
            ApiError::Origin { .. } => 403,
            ApiError::Unreadable { status, .. } => *status,
            ApiError::QueueFull { .. } => 429,
            ApiError::ShuttingDown => 503,
            ApiError::Server(_) => 500,
        }
    }

    /// OpenAI's `type` of the error.
    pub fn kind(&self) -> &'static str {
        match self {
            ApiError::NoRoute { .. }
            | ApiError::NoModel { .. }
            | ApiError::NoTokenizer { .. }
            | ApiError::NotStored { .. } => "not_found_error",
            ApiError::QueueFull { .. } => "rate_limit_exceeded",
            ApiError::ShuttingDown | ApiError::Server(_) => "server_error",
            _ => "invalid_request_error",
        }
    }

    /// The field the error is about, if one is.
    pub fn param(&self) -> Option<&str> {
        match self {
            ApiError::Invalid { param, .. } => Some(param),
            ApiError::NoModel { .. } => Some("model"),
            ApiError::NotStored { param, .. } => *param,
            _ => None,
        }
    }

    pub fn json(&self) -> Value {
        json!({"error": {"message": self.to_string(), "type": self.kind(), "param": self.param(), "code": self.status()}})
    }
}
