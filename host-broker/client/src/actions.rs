//! The actions route: a batch of computer-use actions and its results.
//!
//! One method over [`Client::call`], like every route; it never validates
//! the batch itself (the broker does, before anything runs, and answers
//! `400 invalid_actions`).

use dormouse_protocol::actions::{ActionBatch, ActionResults};
use uuid::Uuid;

use crate::{computer, Client, Error, Method};

impl Client {
    /// `POST /v1/computers/{id}/actions`: runs `batch` in order, stopping
    /// at the first failure; one result per action that ran, images in
    /// base64 (fenced).
    pub async fn actions(&self, id: Uuid, batch: &ActionBatch) -> Result<ActionResults, Error> {
        self.call(Method::POST, &computer(id, "/actions"), Some(batch))
            .await
    }
}
