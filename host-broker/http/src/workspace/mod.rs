//! Handlers of the workspace routes: files (`/files/{path}`), disk usage
//! (`/disk`), export and import (`/workspace`), and `POST /v1/computers`
//! with a workspace archive as its body.
//!
//! Each asks the broker core first (which authorises and says where the
//! workspace is), then does the blocking work on the blocking pool and
//! streams bodies through bounded channels in both directions. They never
//! run disk work on an async task, never start a desktop and never renew
//! an idle timer. Paths are taken from the raw request path and
//! percent-decoded here, so names that are not UTF-8 can be addressed; the
//! workspace module refuses every bad one before touching the disk.

use std::future::Future;
use std::io;
use std::os::unix::fs::DirBuilderExt as _;

use axum::body::Body;
use axum::extract::{FromRequest, Request, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use dormouse_protocol::activity::Happened;
use dormouse_protocol::api::CreateComputer;
use dormouse_protocol::workspace::{Compression, COMPRESSION_QUERY, WORKSPACE_TAR_QUERY};
use futures_util::StreamExt as _;
use tokio::sync::mpsc;
use uuid::Uuid;

mod encoding;

use super::body::{stream_from, BodyDeadline};
use super::error::HttpError;
use super::extract::{ComputerId, Generation, JsonBody};
use super::{computers, ApiState};
use dormouse_core::error::BrokerError;
use dormouse_core::faults;
use dormouse_core::owner::workspace::{WorkspaceAccess, WorkspaceGrant};
use dormouse_core::workspace::stream::Chunk;
use dormouse_core::workspace::{
    create_from_tar, delete, export_archive, export_check, make_dir, open, write_file,
    ChannelReader, Opened, WorkspaceError, WorkspacePath, WorkspaceRoot, WriteOptions,
};
use encoding::{accepted_encoding, check_upload_format};

/// Chunks in flight between a blocking end and an HTTP body.
const CHANNEL_DEPTH: usize = 8;

// ---------------------------------------------------------------- files

/// `GET /v1/computers/{id}/files` and `…/files/{path}`: a file's bytes, or
/// a directory's listing as JSON.
pub async fn get_file(State(state): State<ApiState>, request: Request) -> Response {
    answer(async move {
        let (id, rel, _) = target(&request)?;
        let grant = state.broker.workspace(id, WorkspaceAccess::Read).await?;
        let cfg = grant.limits.files.clone();
        let opened = blocking(move || open(&root(&grant)?, &rel, &cfg)).await?;
        Ok(match opened {
            Opened::Dir(listing) => Json(listing).into_response(),
            Opened::File(file) => {
                let size = file.size;
                let body = stream_from(move |w| io::copy(&mut file.into_reader(), w).map(drop));
                (
                    [
                        (header::CONTENT_TYPE, "application/octet-stream".to_owned()),
                        (header::CONTENT_LENGTH, size.to_string()),
                        (header::CACHE_CONTROL, "no-store".to_owned()),
                    ],
                    body,
                )
                    .into_response()
            }
        })
    })
    .await
}

/// `PUT /v1/computers/{id}/files/{path}[?parents=true][&mode=0644]`: an
/// atomic write of the body, owned by `desk`; 201 when it created the file.
/// With `?dir=true` (and no body) it makes the directory instead.
pub async fn put_file(
    State(state): State<ApiState>,
    Generation(fence): Generation,
    request: Request,
) -> Response {
    answer_upload(async move {
        let (id, rel, query) = target(&request)?;
        let mut options = WriteOptions::default();
        let mut dir = false;
        for (key, value) in query {
            match key.as_str() {
                "parents" => options.create_parents = flag("parents", &value)?,
                "dir" => dir = flag("dir", &value)?,
                "mode" => {
                    let mode = u32::from_str_radix(&value, 8)
                        .ok()
                        .filter(|m| *m <= 0o7777)
                        .ok_or_else(|| HttpError::bad_request("mode must be octal, e.g. 0644"))?;
                    options.mode = Some(mode);
                }
                other => return Err(unknown_query(other)),
            }
        }
        if dir && options.mode.is_some() {
            return Err(HttpError::bad_request(
                "mode applies to files, not to dir=true",
            ));
        }
        let grant = state
            .broker
            .workspace(id, WorkspaceAccess::Write(fence))
            .await?;
        if dir {
            axum::body::to_bytes(request.into_body(), 0)
                .await
                .map_err(|_| HttpError::bad_request("dir=true takes no body"))?;
            let cfg = grant.limits.files.clone();
            let (path, actor) = (rel.to_string(), grant.actor.clone());
            let parents = options.create_parents;
            let outcome = blocking(move || make_dir(&root(&grant)?, &rel, parents, &cfg)).await?;
            if outcome.created {
                state
                    .broker
                    .record_activity(id, actor, &Happened::Mkdir { path });
            }
            return Ok((created_or_ok(outcome.created), Json(outcome)).into_response());
        }
        let cap = grant.limits.files.max_write_bytes;
        if declared_length(&request).is_some_and(|n| n > cap) {
            return Err(BrokerError::from(WorkspaceError::TooLarge {
                path: String::from_utf8_lossy(rel.as_bytes()).into_owned(),
                limit: cap,
            })
            .into());
        }
        let cfg = grant.limits.files.clone();
        let (path, actor) = (rel.to_string(), grant.actor.clone());
        let write = with_body(request, move |body| {
            faults::step("write: granted");
            write_file(&root(&grant)?, &rel, body, options, &cfg)
        });
        let outcome = faults::within(faults::op::FILE_WRITE, write).await?;
        let what = Happened::FileWrite {
            path,
            bytes: outcome.bytes,
        };
        state.broker.record_activity(id, actor, &what);
        faults::within(faults::op::FILE_WRITE, async {
            faults::step("write: activity recorded");
        })
        .await;
        Ok((created_or_ok(outcome.created), Json(outcome)).into_response())
    })
    .await
}

fn created_or_ok(created: bool) -> StatusCode {
    if created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    }
}

/// `DELETE /v1/computers/{id}/files/{path}[?recursive=true]`: removes a
/// file, a link (never its target) or a directory.
pub async fn delete_file(
    State(state): State<ApiState>,
    Generation(fence): Generation,
    request: Request,
) -> Response {
    answer(async move {
        let (id, rel, query) = target(&request)?;
        let mut recursive = false;
        for (key, value) in query {
            match key.as_str() {
                "recursive" => recursive = flag("recursive", &value)?,
                other => return Err(unknown_query(other)),
            }
        }
        let grant = state
            .broker
            .workspace(id, WorkspaceAccess::Write(fence))
            .await?;
        let cfg = grant.limits.files.clone();
        let (path, actor) = (rel.to_string(), grant.actor.clone());
        let outcome = blocking(move || delete(&root(&grant)?, &rel, recursive, &cfg)).await?;
        let what = Happened::FileDelete {
            path,
            removed: outcome.removed,
        };
        state.broker.record_activity(id, actor, &what);
        Ok(Json(outcome).into_response())
    })
    .await
}

// ---------------------------------------------------------------- disk

/// `GET /v1/computers/{id}/disk`: usage measured now.
pub async fn disk(State(state): State<ApiState>, ComputerId(id): ComputerId) -> Response {
    answer(async move { Ok(Json(state.broker.disk(id).await?).into_response()) }).await
}

// ---------------------------------------------------------------- archive

/// `GET /v1/computers/{id}/workspace[?quiesce=false][&compression=gzip|zstd]`:
/// a tar of the workspace, streamed; a running desktop's browsers are
/// quiesced first. `compression` makes the body a `.tar.gz` or `.tar.zst`
/// file; without it, an `Accept-Encoding` naming zstd or gzip compresses
/// the transfer (`Content-Encoding`) of what stays a tar.
pub async fn export(State(state): State<ApiState>, request: Request) -> Response {
    answer(faults::within(faults::op::EXPORT, async move {
        let id = computer_of(&request)?;
        let mut quiesce = true;
        let mut asked = None;
        for (key, value) in query_pairs(request.uri().query())? {
            match key.as_str() {
                "quiesce" => quiesce = flag("quiesce", &value)?,
                COMPRESSION_QUERY => {
                    asked = Some(Compression::parse(&value).ok_or_else(|| {
                        HttpError::bad_request("compression must be gzip, zstd or none")
                    })?);
                }
                other => return Err(unknown_query(other)),
            }
        }
        let (compression, as_encoding) = match asked {
            Some(c) => (c, false),
            None => (accepted_encoding(&request), true),
        };
        let mut grant = state
            .broker
            .workspace(id, WorkspaceAccess::Export { quiesce })
            .await?;
        faults::step("export: granted");
        // Opened before answering, so a missing workspace is a clean error
        // (and the hold, dropped with the grant, ends at once).
        let path = grant.path.clone();
        // What the import would refuse is refused here, before a byte is
        // sent (the walk itself holds the same bound if the tree grows).
        let limits = grant.limits.import.clone();
        let root = blocking(move || {
            let root = WorkspaceRoot::open(&path)?;
            export_check(&root, &limits)?;
            Ok(root)
        })
        .await?;
        faults::step("export: checked");
        let limits = grant.limits.import.clone();
        let quiesced = grant.quiesced;
        let hold = grant.hold.take();
        let (broker, actor) = (state.broker.clone(), grant.actor.clone());
        let body = stream_from(move |w| {
            let _op = faults::scope(faults::op::EXPORT);
            faults::step("export: streaming begun");
            let result = export_archive(&root, w, compression, &limits);
            faults::step("export: archive written");
            // The archive is read (or given up: a client that went away
            // fails the next write): the guest may reopen the browsers.
            drop(hold);
            match result {
                Ok(summary) => {
                    tracing::info!(computer = %id, quiesced, compression = compression.name(), ?summary, "workspace exported");
                    let entries = summary.files + summary.dirs + summary.symlinks + summary.hard_links;
                    let what = Happened::Export {
                        bytes: summary.bytes,
                        entries,
                    };
                    broker.record_activity(id, actor, &what);
                    faults::step("export: activity recorded");
                    Ok(())
                }
                Err(e) => {
                    tracing::warn!(computer = %id, error = %e, "workspace export failed");
                    Err(io::Error::other("the export failed"))
                }
            }
        });
        let mut response = (
            [
                (header::CONTENT_TYPE, compression.content_type()),
                (header::CACHE_CONTROL, "no-store"),
                (header::VARY, "accept-encoding"),
            ],
            body,
        )
            .into_response();
        if as_encoding {
            let tar = Compression::None.content_type();
            response
                .headers_mut()
                .insert(header::CONTENT_TYPE, header::HeaderValue::from_static(tar));
            if let Some(encoding) = compression.content_encoding() {
                response.headers_mut().insert(
                    header::CONTENT_ENCODING,
                    header::HeaderValue::from_static(encoding),
                );
            }
        }
        Ok(response)
    }))
    .await
}

/// `PUT /v1/computers/{id}/workspace`: replaces a stopped desktop's
/// workspace from the tar in the body (plain, gzip or zstd), atomically.
pub async fn import(
    State(state): State<ApiState>,
    Generation(fence): Generation,
    request: Request,
) -> Response {
    answer_upload(async move {
        let id = computer_of(&request)?;
        if let Some(pair) = query_pairs(request.uri().query())?.first() {
            return Err(unknown_query(&pair.0));
        }
        check_upload_format(&request)?;
        per_frame(&request);
        let (tx, rx) = mpsc::channel(CHANNEL_DEPTH);
        let ask = state.broker.import(id, fence, ChannelReader::new(rx));
        let summary = pump_while(request.into_body(), tx, ask).await?;
        Ok(Json(summary).into_response())
    })
    .await
}

/// `POST /v1/computers`: JSON creates as before; with
/// `?workspace_tar=true[&name=…][&owner=…]` the body is a tar of the new
/// desktop's workspace. It is staged in a fresh slot (after the create's
/// own checks), then the create adopts it like a kept workspace
/// (`workspace_from`), so a refused archive leaves no computer behind.
pub async fn create(State(state): State<ApiState>, request: Request) -> Response {
    answer_upload(async move {
        let mut tar = false;
        let mut req = CreateComputer::default();
        for (key, value) in query_pairs(request.uri().query())? {
            match key.as_str() {
                WORKSPACE_TAR_QUERY => tar = flag(WORKSPACE_TAR_QUERY, &value)?,
                "name" => req.name = Some(value),
                "owner" => req.owner = Some(value),
                other => return Err(unknown_query(other)),
            }
        }
        if !tar {
            if req.name.is_some() || req.owner.is_some() {
                return Err(HttpError::bad_request(
                    "name and owner go in the JSON body (query parameters only with workspace_tar=true)",
                ));
            }
            let body = JsonBody::<CreateComputer>::from_request(request, &state).await?;
            return Ok(computers::create(State(state), body).await?.into_response());
        }
        check_upload_format(&request)?;
        per_frame(&request);
        let slot = state.broker.import_slot(req.clone()).await?;
        let staged = stage_slot(&slot, request.into_body()).await;
        if let Err(e) = staged {
            discard_slot(&slot).await;
            return Err(e);
        }
        req.workspace_from = Some(slot.id);
        match state.broker.create(req).await {
            Ok(status) => {
                discard_slot(&slot).await;
                Ok((StatusCode::CREATED, Json(status)).into_response())
            }
            Err(e) => {
                discard_slot(&slot).await;
                Err(e.into())
            }
        }
    })
    .await
}

/// Creates the slot's directory and the workspace in it from `body`.
async fn stage_slot(slot: &WorkspaceGrant, body: Body) -> Result<(), HttpError> {
    let path = slot.path.clone();
    let limits = slot.limits.import.clone();
    with_body_of(body, move |reader| {
        if let Some(dir) = path.parent() {
            std::fs::DirBuilder::new()
                .mode(0o700)
                .create(dir)
                .map_err(|e| WorkspaceError::Io {
                    op: "create",
                    path: dir.display().to_string(),
                    source: e,
                })?;
        }
        create_from_tar(&path, reader, &limits)
    })
    .await
    .map(drop)
}

/// Removes what is left of a slot: everything after a refusal or a failed
/// create, only the empty directory after a create adopted its workspace.
async fn discard_slot(slot: &WorkspaceGrant) {
    let Some(dir) = slot.path.parent().map(ToOwned::to_owned) else {
        return;
    };
    let id = slot.id;
    let done = tokio::task::spawn_blocking(move || {
        if dir.exists() {
            dormouse_core::store::remove_tree("remove staging slot", &dir)
        } else {
            Ok(())
        }
    })
    .await;
    match done {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::warn!(slot = %id, error = %e, "cannot remove a staging slot"),
        Err(e) => tracing::warn!(slot = %id, error = %e, "staging slot removal did not finish"),
    }
}

// ---------------------------------------------------------------- plumbing

/// Runs `work` and turns its error into the API's answer.
async fn answer(work: impl Future<Output = Result<Response, HttpError>>) -> Response {
    match work.await {
        Ok(response) => response,
        Err(e) => e.into_response(),
    }
}

/// [`answer`] for a route with an upload: a refusal may come before the
/// body was read, so it closes the connection (the client must not send
/// its next request behind the unread rest of this one).
async fn answer_upload(work: impl Future<Output = Result<Response, HttpError>>) -> Response {
    let mut response = answer(work).await;
    if !response.status().is_success() {
        response.headers_mut().insert(
            header::CONNECTION,
            header::HeaderValue::from_static("close"),
        );
    }
    response
}

/// Runs blocking workspace work on the blocking pool.
async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, WorkspaceError> + Send + 'static,
) -> Result<T, HttpError> {
    // The operation of the calling task (crash points), carried over.
    let op = faults::current();
    let work = move || {
        let _op = faults::scope_of(op);
        work()
    };
    match tokio::task::spawn_blocking(work).await {
        Ok(result) => result.map_err(|e| BrokerError::from(e).into()),
        Err(e) => Err(BrokerError::Internal(format!("workspace task: {e}")).into()),
    }
}

/// Opens the granted workspace's root.
fn root(grant: &WorkspaceGrant) -> Result<WorkspaceRoot, WorkspaceError> {
    WorkspaceRoot::open(&grant.path)
}

/// Runs `consume` on the blocking pool over the request's body.
async fn with_body<T: Send + 'static>(
    request: Request,
    consume: impl FnOnce(ChannelReader) -> Result<T, WorkspaceError> + Send + 'static,
) -> Result<T, HttpError> {
    per_frame(&request);
    with_body_of(request.into_body(), consume).await
}

async fn with_body_of<T: Send + 'static>(
    body: Body,
    consume: impl FnOnce(ChannelReader) -> Result<T, WorkspaceError> + Send + 'static,
) -> Result<T, HttpError> {
    let (tx, rx) = mpsc::channel(CHANNEL_DEPTH);
    let work = blocking(move || consume(ChannelReader::new(rx)));
    pump_while(body, tx, work).await
}

/// Feeds `body` into `tx` while `work` runs, and answers with `work`'s
/// result. A body that breaks off reaches the reader as an error; one that
/// ends cleanly closes the channel.
async fn pump_while<T, E>(
    body: Body,
    tx: mpsc::Sender<Chunk>,
    work: impl Future<Output = Result<T, E>>,
) -> Result<T, HttpError>
where
    HttpError: From<E>,
{
    let pump = async move {
        let mut frames = body.into_data_stream();
        while let Some(frame) = frames.next().await {
            let chunk = frame
                .map(|b| b.to_vec())
                .map_err(|e| io::Error::new(io::ErrorKind::UnexpectedEof, e.to_string()));
            let failed = chunk.is_err();
            if tx.send(chunk).await.is_err() || failed {
                return;
            }
        }
    };
    tokio::pin!(work);
    tokio::pin!(pump);
    let mut pumping = true;
    loop {
        tokio::select! {
            result = &mut work => return result.map_err(HttpError::from),
            () = &mut pump, if pumping => pumping = false,
        }
    }
}

/// Lets a streamed upload take as long as it keeps moving.
fn per_frame(request: &Request) {
    if let Some(deadline) = request.extensions().get::<BodyDeadline>() {
        deadline.per_frame();
    }
}

fn declared_length(request: &Request) -> Option<u64> {
    request
        .headers()
        .get(header::CONTENT_LENGTH)?
        .to_str()
        .ok()?
        .parse()
        .ok()
}

/// The computer id of `/v1/computers/{id}/…`, and what follows it.
fn split_computer(path: &str) -> Result<(Uuid, &str), HttpError> {
    let rest = path.strip_prefix("/v1/computers/").unwrap_or("");
    let (raw, after) = rest.split_once('/').unwrap_or((rest, ""));
    let id = Uuid::try_parse(raw).map_err(|_| {
        HttpError::bad_request(format!(
            "{:?} is not a computer id (a UUID such as 67e55044-10b1-426f-9247-bb680e5fe0c8)",
            raw.chars().take(64).collect::<String>()
        ))
    })?;
    Ok((id, after))
}

/// The computer id of `/v1/computers/{id}/…`.
fn computer_of(request: &Request) -> Result<Uuid, HttpError> {
    split_computer(request.uri().path()).map(|(id, _)| id)
}

/// The computer, the workspace path and the query of a files route. The
/// path is taken raw and percent-decoded to bytes; `…/files` and
/// `…/files/` both name the workspace root.
pub(crate) fn target(request: &Request) -> Result<(Uuid, WorkspacePath, Query), HttpError> {
    let (id, after) = split_computer(request.uri().path())?;
    let raw = after.strip_prefix("files").unwrap_or("");
    let raw = raw.strip_prefix('/').unwrap_or(raw);
    let rel = if raw.is_empty() {
        WorkspacePath::root()
    } else {
        let bytes = percent_decode(raw.as_bytes())
            .ok_or_else(|| HttpError::bad_request("the path has a malformed percent escape"))?;
        WorkspacePath::parse(&bytes).map_err(|e| BrokerError::from(WorkspaceError::from(e)))?
    };
    Ok((id, rel, query_pairs(request.uri().query())?))
}

/// Decoded `key=value` pairs of a query, in order.
type Query = Vec<(String, String)>;

/// `%XX` escapes to bytes; `None` on a malformed escape.
pub(crate) fn percent_decode(raw: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(raw.len());
    let mut i = 0;
    while i < raw.len() {
        if raw[i] == b'%' {
            let hex = raw.get(i + 1..i + 3)?;
            let text = std::str::from_utf8(hex).ok()?;
            out.push(u8::from_str_radix(text, 16).ok()?);
            i += 3;
        } else {
            out.push(raw[i]);
            i += 1;
        }
    }
    Some(out)
}

/// `key=value` pairs of a query, percent-decoded (`+` is a space); a key
/// alone means `true`.
pub(crate) fn query_pairs(query: Option<&str>) -> Result<Query, HttpError> {
    let mut pairs = Vec::new();
    for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, "true"));
        let decode = |s: &str| {
            percent_decode(s.replace('+', " ").as_bytes())
                .and_then(|b| String::from_utf8(b).ok())
                .ok_or_else(|| HttpError::bad_request("the query has a malformed escape"))
        };
        pairs.push((decode(key)?, decode(value)?));
    }
    Ok(pairs)
}

fn flag(name: &str, value: &str) -> Result<bool, HttpError> {
    match value {
        "true" | "1" => Ok(true),
        "false" | "0" => Ok(false),
        _ => Err(HttpError::bad_request(format!(
            "{name} must be true or false"
        ))),
    }
}

fn unknown_query(key: &str) -> HttpError {
    HttpError::bad_request(format!(
        "unknown query parameter {:?}",
        key.chars().take(64).collect::<String>()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_decode_to_bytes() {
        assert_eq!(percent_decode(b"a%2Fb%00").as_deref(), Some(&b"a/b\0"[..]));
        assert_eq!(
            percent_decode(b"%ff%FE").as_deref(),
            Some(&[0xff, 0xfe][..])
        );
        assert_eq!(percent_decode(b"%zz"), None);
        assert_eq!(percent_decode(b"%4"), None);
    }

    #[test]
    fn queries_parse_and_refuse_bad_escapes() {
        let pairs = query_pairs(Some("name=my+desk&owner=a%40b&parents")).unwrap();
        assert_eq!(
            pairs,
            vec![
                ("name".into(), "my desk".into()),
                ("owner".into(), "a@b".into()),
                ("parents".into(), "true".into())
            ]
        );
        assert!(query_pairs(Some("name=%zz")).is_err());
    }
}
