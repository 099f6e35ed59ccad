//! The workspace routes: files, disk usage, export and import.
//!
//! Paths are workspace-relative and sent percent-encoded byte by byte, so
//! any name (also one that is not UTF-8, given as bytes) reaches the broker
//! as it is; the broker decides what is refused. Exports stream into a
//! writer; uploads (file writes, imports) are sent from memory, because the
//! client's HTTP stack is built without streaming request bodies: for
//! archives larger than memory, upload with any HTTP client
//! (`curl -T ws.tar`), the route is the same.

use std::io::Write;
use std::time::Duration;

use dormouse_protocol::api::ComputerStatus;
use dormouse_protocol::workspace::{
    Deleted, DiskUsage, Imported, Listing, Written, TAR_CONTENT_TYPE, WORKSPACE_TAR_QUERY,
};
use reqwest::{Method, StatusCode};
use uuid::Uuid;

use crate::{answer_error, computer, transport, Client, Error};

/// Bound of one streamed export or import (a large workspace takes long;
/// the broker cuts uploads that stall on its own).
pub const STREAM_TIMEOUT: Duration = Duration::from_secs(6 * 3600);

/// `/v1/computers/{id}/files/{path}` with every byte of `path` outside
/// `A-Z a-z 0-9 - . _ ~ /` percent-encoded. A path with a `.` or `..`
/// component has its slashes encoded too, so no URL library on the way
/// resolves the dots: the broker sees (and refuses) the path as given.
fn files_path(id: Uuid, path: &[u8], query: &str) -> String {
    let mut out = computer(id, "/files");
    if !path.is_empty() {
        out.push('/');
    }
    let dotted = path.split(|b| *b == b'/').any(|c| c == b"." || c == b"..");
    let keep: &[u8] = if dotted { b"-._~" } else { b"-._~/" };
    for &b in path {
        if b.is_ascii_alphanumeric() || keep.contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out.push_str(query);
    out
}

/// What `GET …/files/{path}` found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fetched {
    /// A regular file's bytes.
    File(Vec<u8>),
    /// A directory's listing.
    Dir(Listing),
}

impl Client {
    /// `GET /v1/computers/{id}/files/{path}`: a file's bytes or a
    /// directory's listing (`path` empty: the workspace root). Never wakes
    /// the desktop.
    pub async fn fetch(&self, id: Uuid, path: impl AsRef<[u8]>) -> Result<Fetched, Error> {
        let route = files_path(id, path.as_ref(), "");
        let response = self
            .request(Method::GET, &route)
            .timeout(STREAM_TIMEOUT)
            .send()
            .await
            .map_err(|e| transport(&Method::GET, &route, e))?;
        let json = response
            .headers()
            .get(reqwest::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("application/json"));
        let status = response.status();
        let bytes = response
            .bytes()
            .await
            .map_err(|e| transport(&Method::GET, &route, e))?;
        if !status.is_success() {
            return Err(answer_error(Method::GET, &route, status, &bytes));
        }
        if json {
            serde_json::from_slice(&bytes)
                .map(Fetched::Dir)
                .map_err(|source| Error::Decode {
                    method: Method::GET,
                    path: route,
                    source,
                })
        } else {
            Ok(Fetched::File(bytes.to_vec()))
        }
    }

    /// `PUT /v1/computers/{id}/files/{path}`: writes `bytes` atomically
    /// (owned by `desk`); `parents` creates missing directories (fenced).
    pub async fn write_file(
        &self,
        id: Uuid,
        path: impl AsRef<[u8]>,
        bytes: Vec<u8>,
        parents: bool,
    ) -> Result<Written, Error> {
        let query = if parents { "?parents=true" } else { "" };
        let route = files_path(id, path.as_ref(), query);
        self.upload(Method::PUT, &route, "application/octet-stream", bytes)
            .await
    }

    /// `DELETE /v1/computers/{id}/files/{path}[?recursive=true]` (fenced).
    pub async fn delete_file(
        &self,
        id: Uuid,
        path: impl AsRef<[u8]>,
        recursive: bool,
    ) -> Result<Deleted, Error> {
        let query = if recursive { "?recursive=true" } else { "" };
        let route = files_path(id, path.as_ref(), query);
        self.call(Method::DELETE, &route, None::<&()>).await
    }

    /// `GET /v1/computers/{id}/disk`: usage measured now, without waking.
    pub async fn disk(&self, id: Uuid) -> Result<DiskUsage, Error> {
        self.call(Method::GET, &computer(id, "/disk"), None::<&()>)
            .await
    }

    /// `GET /v1/computers/{id}/workspace[?quiesce=false]`: streams the tar
    /// into `out`; returns the bytes written. A transfer that breaks off is
    /// an error (the archive in `out` is then incomplete).
    pub async fn export(
        &self,
        id: Uuid,
        quiesce: bool,
        out: &mut (dyn Write + Send),
    ) -> Result<u64, Error> {
        let route = computer(
            id,
            if quiesce {
                "/workspace"
            } else {
                "/workspace?quiesce=false"
            },
        );
        let method = Method::GET;
        let mut response = self
            .request(method.clone(), &route)
            .timeout(STREAM_TIMEOUT)
            .send()
            .await
            .map_err(|e| transport(&method, &route, e))?;
        let status = response.status();
        if !status.is_success() {
            let bytes = response
                .bytes()
                .await
                .map_err(|e| transport(&method, &route, e))?;
            return Err(answer_error(method, &route, status, &bytes));
        }
        let mut written = 0u64;
        while let Some(chunk) = response
            .chunk()
            .await
            .map_err(|e| transport(&method, &route, e))?
        {
            out.write_all(&chunk).map_err(|source| Error::Io {
                method: method.clone(),
                path: route.clone(),
                source,
            })?;
            written += u64::try_from(chunk.len()).unwrap_or(u64::MAX);
        }
        out.flush().map_err(|source| Error::Io {
            method,
            path: route,
            source,
        })?;
        Ok(written)
    }

    /// `PUT /v1/computers/{id}/workspace`: replaces a stopped desktop's
    /// workspace with `tar`, atomically (fenced).
    pub async fn import(&self, id: Uuid, tar: Vec<u8>) -> Result<Imported, Error> {
        self.upload(
            Method::PUT,
            &computer(id, "/workspace"),
            TAR_CONTENT_TYPE,
            tar,
        )
        .await
    }

    /// `POST /v1/computers?workspace_tar=true`: creates (and starts) a
    /// desktop whose workspace is `tar`.
    pub async fn create_from_tar(
        &self,
        name: Option<&str>,
        owner: Option<&str>,
        tar: Vec<u8>,
    ) -> Result<ComputerStatus, Error> {
        let mut route = format!("/v1/computers?{WORKSPACE_TAR_QUERY}=true");
        for (key, value) in [("name", name), ("owner", owner)] {
            if let Some(value) = value {
                route.push_str(&format!("&{key}="));
                for &b in value.as_bytes() {
                    if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                        route.push(char::from(b));
                    } else {
                        route.push_str(&format!("%{b:02X}"));
                    }
                }
            }
        }
        self.upload(Method::POST, &route, TAR_CONTENT_TYPE, tar)
            .await
    }

    /// A request with a raw body, answered with JSON.
    async fn upload<T: serde::de::DeserializeOwned>(
        &self,
        method: Method,
        route: &str,
        content_type: &str,
        body: Vec<u8>,
    ) -> Result<T, Error> {
        let response = self
            .request(method.clone(), route)
            .timeout(STREAM_TIMEOUT)
            .header(reqwest::header::CONTENT_TYPE, content_type)
            .body(body)
            .send()
            .await
            .map_err(|e| transport(&method, route, e))?;
        let status: StatusCode = response.status();
        let bytes = response
            .bytes()
            .await
            .map_err(|e| transport(&method, route, e))?;
        if !status.is_success() {
            return Err(answer_error(method, route, status, &bytes));
        }
        serde_json::from_slice(&bytes).map_err(|source| Error::Decode {
            method,
            path: route.to_owned(),
            source,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_encoded_byte_by_byte() {
        let id = Uuid::nil();
        assert_eq!(
            files_path(id, b"a b/\xff%.txt", "?parents=true"),
            format!("/v1/computers/{id}/files/a%20b/%FF%25.txt?parents=true")
        );
        assert_eq!(files_path(id, b"", ""), format!("/v1/computers/{id}/files"));
        assert_eq!(
            files_path(id, b"a/../b", ""),
            format!("/v1/computers/{id}/files/a%2F..%2Fb")
        );
    }
}
