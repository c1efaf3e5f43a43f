//! `GET /v1/models` and `GET /v1/models/{id}`: the one model this server serves.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::{AppState, error_response};
use crate::error::ApiError;

fn model_card(s: &AppState) -> Value {
    json!({"id": s.model_name, "object": "model", "created": s.created, "owned_by": "headcount",
           "max_model_len": s.max_model_len})
}

pub(super) async fn models(State(s): State<Arc<AppState>>) -> Response {
    axum::Json(json!({"object": "list", "data": [model_card(&s)]})).into_response()
}

pub(super) async fn model(State(s): State<Arc<AppState>>, Path(id): Path<String>) -> Response {
    if id == s.model_name {
        return axum::Json(model_card(&s)).into_response();
    }
    error_response(&ApiError::NoModel { id, served: s.model_name.clone() }, &s.metrics)
}
