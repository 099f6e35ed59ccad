//! The workspace routes: files, disk usage, export and import.
//!
//! Paths are workspace-relative and sent percent-encoded byte by byte, so
//! any name (also one that is not UTF-8, given as bytes) reaches the broker
//! as it is; the broker decides what is refused. Exports stream into a
//! writer; uploads (file writes, imports, a create from an archive) are an
//! [`Upload`]: bytes in memory, or a file or any async reader streamed in
//! chunks, never held whole, so an archive larger than memory goes through.

use std::io::Write;
use std::path::Path;
use std::time::Duration;

use dormouse_protocol::api::ComputerStatus;
use dormouse_protocol::workspace::{
    Compression, Deleted, DiskUsage, Imported, Listing, Written, COMPRESSION_QUERY,
    TAR_CONTENT_TYPE, WORKSPACE_TAR_QUERY,
};
use reqwest::Method;
use uuid::Uuid;

use crate::body::{answer_body, error_of, read_bounded, MAX_ANSWER_BYTES};
use crate::{computer, transport, Client, Error};

/// Bound of one streamed export or import (a large workspace takes long;
/// the broker cuts uploads that stall on its own).
pub const STREAM_TIMEOUT: Duration = Duration::from_secs(6 * 3600);

/// Bytes read per chunk of a streamed upload.
const UPLOAD_CHUNK: usize = 256 * 1024;

/// The body of an upload: bytes in memory, or a reader streamed chunk by
/// chunk as the broker takes them (the whole body is never in memory).
#[derive(Debug)]
pub struct Upload {
    body: reqwest::Body,
    /// Sent as `Content-Length` when known (a file's size), so a broker
    /// can refuse an oversized body before it is sent; otherwise chunked.
    len: Option<u64>,
    /// How an archive in it is compressed, for its `Content-Type` (the
    /// broker goes by the stream's first bytes in the end).
    compression: Compression,
}

impl Upload {
    /// Bytes held in memory.
    pub fn bytes(bytes: impl Into<Vec<u8>>) -> Self {
        let bytes = bytes.into();
        let len = u64::try_from(bytes.len()).ok();
        Self {
            body: reqwest::Body::from(bytes),
            len,
            compression: Compression::None,
        }
    }

    /// Everything `reader` yields until its end, streamed; a read error
    /// breaks the upload off (the broker then changes nothing).
    pub fn reader(reader: impl tokio::io::AsyncRead + Send + 'static) -> Self {
        let chunks = tokio_util::io::ReaderStream::with_capacity(reader, UPLOAD_CHUNK);
        Self {
            body: reqwest::Body::wrap_stream(chunks),
            len: None,
            compression: Compression::None,
        }
    }

    /// Labels an archive upload as compressed this way.
    pub fn compressed_as(mut self, compression: Compression) -> Self {
        self.compression = compression;
        self
    }

    /// A local file, streamed, with its size as the length.
    pub async fn file(path: impl AsRef<Path>) -> std::io::Result<Self> {
        let file = tokio::fs::File::open(path.as_ref()).await?;
        let meta = file.metadata().await?;
        let len = meta.is_file().then_some(meta.len());
        Ok(Self {
            len,
            ..Self::reader(file)
        })
    }
}

impl From<Vec<u8>> for Upload {
    fn from(bytes: Vec<u8>) -> Self {
        Self::bytes(bytes)
    }
}

impl From<&[u8]> for Upload {
    fn from(bytes: &[u8]) -> Self {
        Self::bytes(bytes.to_vec())
    }
}

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

/// What [`Client::fetch_into`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Saved {
    /// A regular file, this many bytes of it written to the writer.
    File(u64),
    /// A directory's listing (nothing was written).
    Dir(Listing),
}

impl Client {
    /// `GET /v1/computers/{id}/files/{path}`, streamed: a file's bytes go
    /// into `out` chunk by chunk as they arrive (never held whole); a
    /// directory's listing is returned instead. A transfer that breaks off
    /// is an error (what `out` got is then incomplete). Never wakes the
    /// desktop.
    pub async fn fetch_into(
        &self,
        id: Uuid,
        path: impl AsRef<[u8]>,
        out: &mut (dyn Write + Send),
    ) -> Result<Saved, Error> {
        let route = files_path(id, path.as_ref(), "");
        let method = Method::GET;
        let mut response = self.get_streamed(&route).await?;
        if !response.status().is_success() {
            return Err(error_of(response, &method, &route).await);
        }
        if is_json(&response) {
            return listing(&mut response, &route).await.map(Saved::Dir);
        }
        let written = copy_body(&mut response, &method, &route, out).await?;
        Ok(Saved::File(written))
    }

    /// `GET /v1/computers/{id}/files/{path}`: a file's bytes or a
    /// directory's listing (`path` empty: the workspace root), a file of
    /// at most [`MAX_ANSWER_BYTES`] bytes ([`Client::fetch_within`]; stream
    /// larger ones with [`Client::fetch_into`]). Never wakes the desktop.
    pub async fn fetch(&self, id: Uuid, path: impl AsRef<[u8]>) -> Result<Fetched, Error> {
        self.fetch_within(id, path, MAX_ANSWER_BYTES).await
    }

    /// [`Client::fetch`] of a file of at most `limit` bytes: a longer one
    /// is [`Error::TooLarge`], refused at its first byte past `limit` (or
    /// at once by its length), so at most `limit + 1` bytes are ever read.
    /// A directory's listing is read as any answer is.
    pub async fn fetch_within(
        &self,
        id: Uuid,
        path: impl AsRef<[u8]>,
        limit: u64,
    ) -> Result<Fetched, Error> {
        let route = files_path(id, path.as_ref(), "");
        let method = Method::GET;
        let mut response = self.get_streamed(&route).await?;
        if !response.status().is_success() {
            return Err(error_of(response, &method, &route).await);
        }
        if is_json(&response) {
            return listing(&mut response, &route).await.map(Fetched::Dir);
        }
        read_bounded(&mut response, limit, &method, &route)
            .await?
            .whole(&method, &route, limit)
            .map(Fetched::File)
    }

    /// `PUT /v1/computers/{id}/files/{path}`: writes `body` (bytes, or a
    /// streamed [`Upload`]) atomically (owned by `desk`); `parents` creates
    /// missing directories (fenced).
    pub async fn write_file(
        &self,
        id: Uuid,
        path: impl AsRef<[u8]>,
        body: impl Into<Upload>,
        parents: bool,
    ) -> Result<Written, Error> {
        let query = if parents { "?parents=true" } else { "" };
        let route = files_path(id, path.as_ref(), query);
        self.upload(Method::PUT, &route, "application/octet-stream", body.into())
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
        self.export_compressed(id, quiesce, Compression::None, out)
            .await
    }

    /// [`Client::export`] of an archive compressed as `compression` says
    /// (`?compression=gzip|zstd`): `out` receives a `.tar.gz` or `.tar.zst`.
    pub async fn export_compressed(
        &self,
        id: Uuid,
        quiesce: bool,
        compression: Compression,
        out: &mut (dyn Write + Send),
    ) -> Result<u64, Error> {
        let mut query = Vec::new();
        if !quiesce {
            query.push("quiesce=false".to_owned());
        }
        if compression != Compression::None {
            query.push(format!("{COMPRESSION_QUERY}={}", compression.name()));
        }
        let route = if query.is_empty() {
            computer(id, "/workspace")
        } else {
            computer(id, &format!("/workspace?{}", query.join("&")))
        };
        let method = Method::GET;
        let mut response = self.get_streamed(&route).await?;
        if !response.status().is_success() {
            return Err(error_of(response, &method, &route).await);
        }
        copy_body(&mut response, &method, &route, out).await
    }

    /// `PUT /v1/computers/{id}/workspace`: replaces a stopped desktop's
    /// workspace with `tar` (bytes, or a streamed [`Upload`]), atomically
    /// (fenced).
    pub async fn import(&self, id: Uuid, tar: impl Into<Upload>) -> Result<Imported, Error> {
        self.upload(
            Method::PUT,
            &computer(id, "/workspace"),
            TAR_CONTENT_TYPE,
            tar.into(),
        )
        .await
    }

    /// `POST /v1/computers?workspace_tar=true`: creates (and starts) a
    /// desktop whose workspace is `tar` (bytes, or a streamed [`Upload`]).
    pub async fn create_from_tar(
        &self,
        name: Option<&str>,
        owner: Option<&str>,
        tar: impl Into<Upload>,
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
        self.upload(Method::POST, &route, TAR_CONTENT_TYPE, tar.into())
            .await
    }

    /// A request with a raw body, answered with JSON.
    async fn upload<T: serde::de::DeserializeOwned>(
        &self,
        method: Method,
        route: &str,
        content_type: &str,
        body: Upload,
    ) -> Result<T, Error> {
        let content_type = match body.compression {
            Compression::None => content_type,
            other => other.content_type(),
        };
        let mut request = self
            .request(method.clone(), route)
            .timeout(STREAM_TIMEOUT)
            .header(reqwest::header::CONTENT_TYPE, content_type);
        if let Some(len) = body.len {
            request = request.header(reqwest::header::CONTENT_LENGTH, len);
        }
        let mut response = request
            .body(body.body)
            .send()
            .await
            .map_err(|e| transport(&method, route, e))?;
        if !response.status().is_success() {
            return Err(error_of(response, &method, route).await);
        }
        let bytes = answer_body(&mut response, &method, route).await?;
        serde_json::from_slice(&bytes).map_err(|source| Error::Decode {
            method,
            path: route.to_owned(),
            source,
        })
    }
}

impl Client {
    /// A `GET` of `route` whose body may take up to [`STREAM_TIMEOUT`]:
    /// the response as soon as its head arrived, the body still to read.
    async fn get_streamed(&self, route: &str) -> Result<reqwest::Response, Error> {
        self.request(Method::GET, route)
            .timeout(STREAM_TIMEOUT)
            .send()
            .await
            .map_err(|e| transport(&Method::GET, route, e))
    }
}

/// A directory's listing from a `GET …/files/{path}` answer.
async fn listing(response: &mut reqwest::Response, route: &str) -> Result<Listing, Error> {
    let bytes = answer_body(response, &Method::GET, route).await?;
    serde_json::from_slice(&bytes).map_err(|source| Error::Decode {
        method: Method::GET,
        path: route.to_owned(),
        source,
    })
}

/// Whether the response is JSON (a directory listing or an error).
fn is_json(response: &reqwest::Response) -> bool {
    response
        .headers()
        .get(reqwest::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"))
}

/// Writes a response's body into `out` chunk by chunk; the bytes written.
async fn copy_body(
    response: &mut reqwest::Response,
    method: &Method,
    route: &str,
    out: &mut (dyn Write + Send),
) -> Result<u64, Error> {
    let mut written = 0u64;
    while let Some(chunk) = response
        .chunk()
        .await
        .map_err(|e| transport(method, route, e))?
    {
        out.write_all(&chunk).map_err(|source| Error::Io {
            method: method.clone(),
            path: route.to_owned(),
            source,
        })?;
        written += u64::try_from(chunk.len()).unwrap_or(u64::MAX);
    }
    out.flush().map_err(|source| Error::Io {
        method: method.clone(),
        path: route.to_owned(),
        source,
    })?;
    Ok(written)
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
