//! The live-screen routes: mint, list and revoke screen capabilities, and
//! give a lease back. One method per route; the RFB WebSocket itself is
//! the viewer's (its credential is the screen token, not this client's).

use dormouse_protocol::screen::{CreateScreen, ScreenGrant, ScreenInfo};
use reqwest::Method;
use uuid::Uuid;

use super::{computer, Client, Error, NO_BODY};

impl Client {
    /// `POST /v1/computers/{id}/screens`: a view or control capability
    /// (control is fenced: send the lease's generation).
    pub async fn create_screen(
        &self,
        id: Uuid,
        request: &CreateScreen,
    ) -> Result<ScreenGrant, Error> {
        self.call(Method::POST, &computer(id, "/screens"), Some(request))
            .await
    }

    /// `GET /v1/computers/{id}/screens`: the live capabilities (no tokens).
    pub async fn screens(&self, id: Uuid) -> Result<Vec<ScreenInfo>, Error> {
        self.call(Method::GET, &computer(id, "/screens"), NO_BODY)
            .await
    }

    /// `DELETE /v1/screens/{screen_id}`: revoke one; its connections close.
    pub async fn revoke_screen(&self, screen_id: Uuid) -> Result<(), Error> {
        self.call_bytes(Method::DELETE, &format!("/v1/screens/{screen_id}"), NO_BODY)
            .await
            .map(drop)
    }

    /// `DELETE /v1/computers/{id}/lease`: give the lease back (fenced).
    pub async fn release_lease(&self, id: Uuid) -> Result<(), Error> {
        self.call_bytes(Method::DELETE, &computer(id, "/lease"), NO_BODY)
            .await
            .map(drop)
    }
}
