// Dormouse web panel: a list of desktops over the broker's public API only
// (the same routes any frontend uses), so it doubles as the reference client.
//
// State flows one way: the WebSocket /v1/events (or, while it is down, a poll
// of GET /v1/computers every 2 s) updates `computers`; render() draws it.
// A button click sends exactly one request and never retries by itself.
//
// Live screen: once a desktop is ready the panel mints a view capability
// (POST /v1/computers/{id}/screens) and shows it with noVNC, loaded from
// /novnc/ (Debian's novnc package on the broker's host). Take control takes
// the lease as holder "panel" and a control capability bound to its
// generation; Release gives both back. The gateway enforces view and
// control and closes a revoked screen with a code and a reason the card
// shows in words. Without noVNC or the screen routes the still screenshot
// stays, refreshed every 10 s.
"use strict";

(function () {
  const TOKEN_KEY = "dormouse.token";
  const POLL_MS = 2000;
  const SCREENSHOT_REFRESH_MS = 10000;
  const WS_RETRY_MAX_MS = 30000;
  const SCREEN_TTL_MS = 60 * 60 * 1000;
  const LEASE_TTL_MS = 60 * 1000;
  const LEASE_RENEW_MS = 20 * 1000;
  const FIRST_FRAME_WAIT_MS = 3000;
  const PANEL_HOLDER = "panel";
  const EGRESS_REFRESH_MS = 10000;
  const REFUSED_SHOWN = 3;
  const ASKS_REFRESH_MS = 3000;

  /** @type {Map<string, object>} id -> ComputerStatus */
  const computers = new Map();
  /** Ids whose Start request is in flight (the button is busy meanwhile). */
  const starting = new Set();
  /** Ids with another request in flight (stop, remove). */
  const acting = new Set();
  /** id -> { url, fetchedAt, loading, failed } */
  const previews = new Map();
  /** id -> { policy, refused: [entry], fetchedAt, loading } (web access) */
  const egress = new Map();
  /** id -> { list: [ScreenInfo with a reason, not this panel's], fetchedAt, loading } */
  const asks = new Map();
  /** id -> live screen session (see openScreen) */
  const screens = new Map();
  /** id -> { key, url, takenAt, loading, missing }: a stopped desktop's last screen */
  const lastScreens = new Map();
  /** The dock (dock.js): one desktop's files, terminal, clipboard, activity. */
  let dock = null;
  /** noVNC's RFB class, once loaded. */
  let RFB = null;
  /** "unknown" | "loading" | "yes" | "no": can this panel show live screens? */
  let liveSupport = "unknown";

  let token = sessionStorage.getItem(TOKEN_KEY);
  let socket = null;
  let socketRetryMs = 1000;
  let socketTimer = null;
  let pollTimer = null;
  let signedIn = false;

  const $ = (id) => document.getElementById(id);

  // ---- API -------------------------------------------------------------

  class ApiError extends Error {
    constructor(status, code, message) {
      super(message);
      this.status = status;
      this.code = code;
    }
  }

  async function api(method, path, body, extraHeaders) {
    const headers = Object.assign({ Authorization: "Bearer " + token }, extraHeaders || {});
    const init = { method, headers, cache: "no-store" };
    if (body instanceof Blob) {
      // A file's bytes as they are (an upload).
      headers["Content-Type"] = "application/octet-stream";
      init.body = body;
    } else if (body !== undefined) {
      headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(body);
    }
    let response;
    try {
      response = await fetch(path, init);
    } catch (e) {
      throw new ApiError(0, "unreachable", "The broker cannot be reached.");
    }
    if (response.status === 401) {
      signOut("The broker refused the token. Was it rotated? Sign in again.");
      throw new ApiError(401, "unauthorized", "The token was refused.");
    }
    if (!response.ok) {
      let code = String(response.status);
      let message = response.statusText;
      try {
        const err = (await response.json()).error;
        code = err.code;
        message = err.message;
      } catch (_) { /* not our JSON: keep the status line */ }
      throw new ApiError(response.status, code, message);
    }
    return response;
  }

  // ---- live updates: WebSocket, polling while it is down -----------------

  function connect() {
    clearTimeout(socketTimer);
    if (!signedIn) return;
    const scheme = location.protocol === "https:" ? "wss:" : "ws:";
    // Browsers cannot set headers on a WebSocket: the token travels as a
    // subprotocol, and the broker answers with "dormouse.v1".
    let ws;
    try {
      ws = new WebSocket(scheme + "//" + location.host + "/v1/events",
        ["dormouse.v1", "dormouse.bearer." + token]);
    } catch (e) {
      startPolling();
      socketTimer = setTimeout(connect, socketRetryMs);
      socketRetryMs = Math.min(socketRetryMs * 2, WS_RETRY_MAX_MS);
      return;
    }
    socket = ws;
    ws.onopen = () => {
      socketRetryMs = 1000;
      stopPolling();
      setConnection("live", "Live");
      // The stream's snapshot carries no end marker; one list makes sure
      // computers removed while we were away disappear.
      refreshAll();
    };
    ws.onmessage = (message) => {
      let event;
      try { event = JSON.parse(message.data); } catch (_) { return; }
      if (event.type === "status" && event.computer) {
        upsert(event.computer);
      } else if (event.type === "removed") {
        remove(event.id);
      } else if (event.type === "egress" && event.entry) {
        egressDecided(event.entry);
      } else if (event.type === "activity" && event.entry && dock) {
        dock.activityEvent(event.id, event.entry);
      }
    };
    ws.onclose = () => {
      if (socket !== ws) return;
      socket = null;
      if (!signedIn) return;
      startPolling();
      socketTimer = setTimeout(connect, socketRetryMs);
      socketRetryMs = Math.min(socketRetryMs * 2, WS_RETRY_MAX_MS);
    };
  }

  function startPolling() {
    if (pollTimer !== null || !signedIn) return;
    setConnection("polling", "Polling every 2 s");
    const tick = async () => {
      await refreshAll();
      if (pollTimer !== null) pollTimer = setTimeout(tick, POLL_MS);
    };
    pollTimer = setTimeout(tick, 0);
  }

  function stopPolling() {
    clearTimeout(pollTimer);
    pollTimer = null;
  }

  async function refreshAll() {
    try {
      const list = await (await api("GET", "/v1/computers")).json();
      const seen = new Set();
      for (const c of list) {
        seen.add(c.id);
        upsert(c, false);
      }
      for (const id of Array.from(computers.keys())) {
        if (!seen.has(id)) remove(id, false);
      }
      render();
      if (!socket) setConnection("polling", "Polling every 2 s");
    } catch (e) {
      if (e.status !== 401) setConnection("offline", "Broker unreachable, retrying");
    }
  }

  function setConnection(mode, text) {
    const el = $("connection");
    el.dataset.mode = mode;
    el.textContent = text;
  }

  function upsert(status, draw = true) {
    const before = computers.get(status.id);
    computers.set(status.id, status);
    if (status.ready && (!before || !before.ready)) {
      // Became ready: the preview replaces the empty state now.
      loadPreview(status.id);
    }
    if (!status.ready) {
      dropPreview(status.id);
    }
    if (status.ready) ensureScreen(status.id);
    if (!before) loadEgress(status.id);
    if (!status.ready && status.container === "stopped") loadLastScreen(status);
    if (draw) render();
  }

  function remove(id, draw = true) {
    computers.delete(id);
    starting.delete(id);
    acting.delete(id);
    dropPreview(id);
    egress.delete(id);
    asks.delete(id);
    dropLastScreen(id);
    closeScreen(id, false);
    if (dock) dock.forget(id);
    if (draw) render();
  }

  // ---- screenshots ---------------------------------------------------------

  async function loadPreview(id) {
    const entry = previews.get(id) || { url: null, fetchedAt: 0, loading: false, failed: null };
    if (entry.loading) return;
    entry.loading = true;
    previews.set(id, entry);
    try {
      // An <img src> cannot carry the token, so fetch the PNG as a blob.
      const blob = await (await api("GET", "/v1/computers/" + id + "/screenshot")).blob();
      const current = previews.get(id);
      const status = computers.get(id);
      if (current !== entry || !status || !status.ready) return;
      if (entry.url) URL.revokeObjectURL(entry.url);
      entry.url = URL.createObjectURL(blob);
      entry.failed = null;
    } catch (e) {
      entry.failed = e.message;
    } finally {
      entry.loading = false;
      entry.fetchedAt = Date.now();
      render();
    }
  }

  function dropPreview(id) {
    const entry = previews.get(id);
    if (entry && entry.url) URL.revokeObjectURL(entry.url);
    previews.delete(id);
  }

  function refreshPreviews() {
    if (document.hidden) return;
    for (const [id, status] of computers) {
      const entry = previews.get(id);
      const every = entry && entry.failed ? POLL_MS : SCREENSHOT_REFRESH_MS;
      if (liveShown(id)) continue; // the live screen is newer than any still
      if (status.ready && entry && !entry.loading && Date.now() - entry.fetchedAt >= every) {
        loadPreview(id);
      }
    }
  }

  // ---- a stopped desktop's last screen ----------------------------------------

  /** Fetches the screen the broker kept at `c`'s last stop, once per stop
   *  (GET …/screenshot?last=true never starts the desktop). */
  async function loadLastScreen(c) {
    const key = c.stopped_at || "stopped";
    const entry = lastScreens.get(c.id);
    if (entry && (entry.key === key || entry.loading)) return;
    const next = { key, url: entry ? entry.url : null, takenAt: entry ? entry.takenAt : null,
      loading: true, missing: false };
    lastScreens.set(c.id, next);
    try {
      const response = await api("GET", "/v1/computers/" + c.id + "/screenshot?last=true");
      const blob = await response.blob();
      if (lastScreens.get(c.id) !== next) return;
      if (next.url) URL.revokeObjectURL(next.url);
      next.url = URL.createObjectURL(blob);
      next.takenAt = response.headers.get("Dormouse-Taken-At");
    } catch (e) {
      // 404: none was kept (a desktop never stopped by this broker).
      if (lastScreens.get(c.id) === next) next.missing = e.status === 404;
    } finally {
      next.loading = false;
      render();
    }
  }

  function dropLastScreen(id) {
    const entry = lastScreens.get(id);
    if (entry && entry.url) URL.revokeObjectURL(entry.url);
    lastScreens.delete(id);
  }

  // ---- web access (egress) -----------------------------------------------------

  /** Loads `id`'s entry of `cache` (a card's facts fetched beside its
   *  status) with `fetch(id)`, unless a load is in flight; a failure keeps
   *  what was shown, and the next refresh tries again. */
  async function loadInto(cache, id, initial, fetch) {
    const entry = cache.get(id) || Object.assign({ fetchedAt: 0, loading: false }, initial);
    if (entry.loading) return;
    entry.loading = true;
    cache.set(id, entry);
    try {
      const update = await fetch(id);
      if (cache.get(id) === entry) Object.assign(entry, update);
    } catch (_) {
      /* keep what was shown */
    } finally {
      entry.loading = false;
      entry.fetchedAt = Date.now();
      render();
    }
  }

  /** Whether `id`'s entry of `cache` is older than `every` ms. */
  function due(cache, id, every) {
    const entry = cache.get(id);
    return !entry || (!entry.loading && Date.now() - entry.fetchedAt >= every);
  }

  /** The policy and the last refusals of `id`. */
  async function fetchEgress(id) {
    const [policy, refused] = await Promise.all([
      api("GET", "/v1/computers/" + id + "/egress").then((r) => r.json()),
      api("GET", "/v1/computers/" + id + "/egress/refused?limit=" + REFUSED_SHOWN).then((r) => r.json()),
    ]);
    return { policy, refused: refused.entries };
  }

  function loadEgress(id) {
    return loadInto(egress, id, { policy: null, refused: [] }, fetchEgress);
  }

  function refreshEgress() {
    if (document.hidden) return;
    for (const id of computers.keys()) {
      if (due(egress, id, EGRESS_REFRESH_MS)) loadEgress(id);
    }
  }

  /** An `egress` event: a refusal goes on top of the card's list at once. */
  function egressDecided(e) {
    if (e.decision === "allowed") return;
    const entry = egress.get(e.computer);
    if (!entry) return;
    entry.refused = [e].concat(entry.refused).slice(0, REFUSED_SHOWN);
    render();
  }

  function egressText(entry) {
    if (!entry || !entry.policy) return "\u2014";
    const p = entry.policy;
    const rules = (n) => n + (n === 1 ? " rule" : " rules");
    switch (p.mode) {
      case "off":
        return "Off \u00b7 no site reachable";
      case "allowlist":
        return "Allow list \u00b7 " + rules(p.allow.length) + (p.deny.length ? ", " + p.deny.length + " denied" : "");
      case "open":
        return "Open \u00b7 private ranges denied" + (p.deny.length ? ", " + rules(p.deny.length) + " denied" : "");
      default:
        return p.mode;
    }
  }

  function drawRefused(li, entry) {
    const box = li.querySelector(".refused");
    const list = li.querySelector(".refused-list");
    const shown = entry ? entry.refused : [];
    box.hidden = shown.length === 0;
    const key = shown.map((e) => e.seq + e.host + e.time).join("|");
    if (list.dataset.key === key) return;
    list.dataset.key = key;
    list.replaceChildren(...shown.map((e) => {
      const item = document.createElement("li");
      const host = document.createElement("span");
      host.className = "host";
      host.textContent = e.host + ":" + e.port;
      const why = document.createElement("span");
      why.className = "why";
      why.textContent = " \u2014 " + (e.reason || e.decision);
      const at = document.createElement("time");
      at.dateTime = e.time;
      at.className = "why";
      at.textContent = " (" + new Date(e.time).toLocaleTimeString() + ")";
      item.append(host, why, at);
      return item;
    }));
  }

  // ---- a person asked for (screen links minted with a reason) ---------------

  /** The live capabilities of `id` minted with a reason (an agent's
   *  `screen_link`; the panel's own never carry one). */
  async function fetchAsks(id) {
    const all = await (await api("GET", "/v1/computers/" + id + "/screens")).json();
    return { list: all.filter((s) => s.reason) };
  }

  function refreshAsks() {
    if (document.hidden) return;
    for (const [id, c] of computers) {
      const entry = asks.get(id);
      if (c.container !== "running") {
        if (entry && entry.list.length) { entry.list = []; render(); }
        continue;
      }
      if (due(asks, id, ASKS_REFRESH_MS)) loadInto(asks, id, { list: [] }, fetchAsks);
    }
  }

  function drawAsks(li, entry) {
    const box = li.querySelector(".asks");
    const list = li.querySelector(".asks-list");
    const shown = entry ? entry.list : [];
    box.hidden = shown.length === 0;
    const key = shown.map((s) => s.screen_id).join("|");
    if (list.dataset.key === key) return;
    list.dataset.key = key;
    list.replaceChildren(...shown.map((s) => {
      const item = document.createElement("li");
      const what = document.createElement("span");
      what.className = "reason";
      what.textContent = s.reason;
      const how = document.createElement("span");
      how.className = "why";
      how.textContent = " — " + (s.mode === "control" ? "a control link" : "a view link") +
        " until " + new Date(s.expires_at).toLocaleTimeString() +
        (s.connections ? ", open now" : ", not opened yet");
      item.append(what, how);
      return item;
    }));
  }

  // ---- live screen ---------------------------------------------------------

  /** Loads noVNC once; without it (or without the screen routes) the
   *  panel keeps the still preview. */
  async function loadViewer() {
    if (liveSupport !== "unknown") return;
    liveSupport = "loading";
    try {
      RFB = (await import("/novnc/core/rfb.js")).default;
      liveSupport = typeof RFB === "function" ? "yes" : "no";
    } catch (_) {
      liveSupport = "no";
    }
    if (liveSupport === "yes") {
      for (const [id, c] of computers) if (c.ready) ensureScreen(id);
    }
    render();
  }

  function liveShown(id) {
    const s = screens.get(id);
    return Boolean(s && s.shown && (s.state === "live" || s.state === "control"));
  }

  /** A ready desktop gets a view screen unless it has one, or one that
   *  failed (that waits for Retry). A revoked one is reopened: the desktop
   *  is ready again. */
  function ensureScreen(id) {
    if (!signedIn) return;
    if (liveSupport === "unknown") { loadViewer(); return; }
    if (liveSupport !== "yes") return;
    const s = screens.get(id);
    if (s && s.state !== "revoked") return;
    openScreen(id, "view", null, null);
  }

  const REVOKED_WORDS = {
    "revoked: desktop stopped": "Revoked because the desktop stopped",
    "revoked: desktop killed": "Revoked because the desktop was killed",
    "revoked: desktop removed": "Revoked because the desktop was removed",
    "revoked: desktop restarted": "Revoked because the desktop restarted",
    "revoked: the lease changed hands": "Revoked because another controller took the lease",
    "revoked: capability deleted": "Revoked",
    "expired": "Expired",
  };

  /** Mints a capability and connects to it; replaces any screen of `id`. */
  async function openScreen(id, mode, generation, note) {
    closeScreen(id, true);
    const s = {
      id, mode, generation, note,
      state: "connecting", text: "Connecting\u2026",
      grant: null, rfb: null, ws: null, shown: false, busy: false,
      frameTimer: null, leaseTimer: null, done: false,
    };
    screens.set(id, s);
    render();
    let grant;
    try {
      const headers = generation === null ? undefined : { "Dormouse-Generation": String(generation) };
      grant = await (await api("POST", "/v1/computers/" + id + "/screens",
        { mode, ttl_ms: SCREEN_TTL_MS }, headers)).json();
    } catch (e) {
      if (screens.get(id) !== s) return;
      if (e.status === 404 && e.code === "no_route") {
        // This broker has no screen gateway: keep the still preview.
        liveSupport = "no";
        screens.delete(id);
        render();
        return;
      }
      failScreen(s, e.message);
      return;
    }
    if (screens.get(id) !== s) {
      revokeQuietly(grant.screen_id);
      return;
    }
    s.grant = grant;
    connectScreen(s);
  }

  function connectScreen(s) {
    const card = document.querySelector('li[data-id="' + s.id + '"]');
    const target = card && card.querySelector(".live");
    if (!target) { failScreen(s, "the card is gone"); return; }
    target.textContent = "";
    target.dataset.shown = "false";
    target.hidden = false;
    const scheme = location.protocol === "https:" ? "wss:" : "ws:";
    let ws;
    try {
      // The token travels as a subprotocol; the gateway answers "binary".
      ws = new WebSocket(scheme + "//" + location.host + s.grant.websocket,
        ["binary", "dormouse.screen." + s.grant.token]);
    } catch (e) {
      failScreen(s, "the browser refused the connection");
      return;
    }
    s.ws = ws;
    ws.addEventListener("close", (ev) => screenClosed(s, ev.code, ev.reason));
    try {
      s.rfb = new RFB(target, ws, {});
    } catch (e) {
      failScreen(s, "the viewer could not start");
      return;
    }
    // The gateway enforces view; this only keeps the browser from trying.
    s.rfb.viewOnly = s.mode !== "control";
    s.rfb.scaleViewport = true;
    s.rfb.resizeSession = false;
    s.rfb.focusOnClick = s.mode === "control";
    s.rfb.addEventListener("connect", () => waitForFirstFrame(s, target));
    // The gateway gives only a control screen the desktop's clipboard.
    s.rfb.addEventListener("clipboard", (ev) => {
      if (s.mode === "control" && dock) dock.fromDesktop(s.id, ev.detail.text);
    });
  }

  /** Shows the live canvas once it holds a drawn frame (or after a bound),
   *  so the card never flips from the still preview to an empty canvas. */
  function waitForFirstFrame(s, target) {
    const started = Date.now();
    const look = () => {
      if (s.done) return;
      const canvas = target.querySelector("canvas");
      let drawn = false;
      if (canvas && canvas.width > 0 && canvas.height > 0) {
        try {
          const ctx = canvas.getContext("2d");
          for (let i = 1; i < 8 && !drawn; i++) {
            for (let j = 1; j < 8 && !drawn; j++) {
              const px = ctx.getImageData(Math.floor(canvas.width * i / 8),
                Math.floor(canvas.height * j / 8), 1, 1).data;
              drawn = px[3] > 0;
            }
          }
        } catch (_) { drawn = true; }
      }
      if (drawn || Date.now() - started > FIRST_FRAME_WAIT_MS) {
        s.shown = true;
        s.state = s.mode === "control" ? "control" : "live";
        s.text = s.mode === "control" ? "Control \u00b7 you hold the lease" : "Live \u00b7 view only";
        target.dataset.shown = "true";
        render();
      } else {
        s.frameTimer = setTimeout(look, 50);
      }
    };
    look();
  }

  function screenClosed(s, code, reason) {
    if (s.done || screens.get(s.id) !== s) return;
    const c = computers.get(s.id);
    teardown(s);
    if (code === 4001 || code === 4002) {
      const words = REVOKED_WORDS[reason] || ("Revoked: " + (reason || "no reason given"));
      if (c && c.ready && reason === "revoked: the lease changed hands") {
        // Someone else holds the desktop now: watch it, and say why.
        openScreen(s.id, "view", null, "control passed to another lease holder");
        return;
      }
      if (c && c.ready && code === 4002) {
        openScreen(s.id, s.mode === "control" ? "view" : s.mode, null, null);
        return;
      }
      s.state = "revoked";
      s.text = words;
    } else if (code === 1001) {
      s.state = "failed";
      s.text = "Failed: the broker is shutting down";
    } else {
      s.state = "failed";
      s.text = "Failed: " + (reason || ("the connection closed (" + code + ")"));
    }
    render();
  }

  function failScreen(s, why) {
    teardown(s);
    s.state = "failed";
    s.text = "Failed: " + why;
    render();
  }

  /** Ends a session's connection and timers; it is inert afterwards. */
  function teardown(s) {
    s.done = true;
    s.shown = false;
    clearTimeout(s.frameTimer);
    clearInterval(s.leaseTimer);
    s.leaseTimer = null;
    if (s.rfb) {
      try { s.rfb.disconnect(); } catch (_) { /* already closed */ }
    } else if (s.ws) {
      try { s.ws.close(); } catch (_) { /* already closed */ }
    }
    s.rfb = null;
    s.ws = null;
    const card = document.querySelector('li[data-id="' + s.id + '"]');
    const target = card && card.querySelector(".live");
    if (target) {
      target.textContent = "";
      target.dataset.shown = "false";
    }
  }

  /** Forgets a screen; `revoke` also revokes its capability. */
  function closeScreen(id, revoke) {
    const s = screens.get(id);
    if (!s) return;
    screens.delete(id);
    teardown(s);
    if (revoke && s.grant) revokeQuietly(s.grant.screen_id);
  }

  /** DELETE /v1/screens/{id} in the background. Not through api(): a 401
   *  here must not sign out (this also runs while signing out). */
  function revokeQuietly(screenId) {
    if (!token) return;
    fetch("/v1/screens/" + screenId, {
      method: "DELETE",
      headers: { Authorization: "Bearer " + token },
      cache: "no-store",
    }).catch(() => {});
  }

  async function takeControl(id) {
    const s = screens.get(id);
    if (s) { s.busy = true; render(); }
    let lease;
    try {
      lease = await (await api("POST", "/v1/computers/" + id + "/lease",
        { holder: PANEL_HOLDER, ttl_ms: LEASE_TTL_MS })).json();
    } catch (e) {
      if (s) s.busy = false;
      showError("Take control failed: " + e.message);
      render();
      return;
    }
    await openScreen(id, "control", lease.generation, null);
    const now = screens.get(id);
    if (now && now.mode === "control" && !now.done) {
      now.leaseTimer = setInterval(() => renewLease(now), LEASE_RENEW_MS);
    }
  }

  async function renewLease(s) {
    try {
      await api("POST", "/v1/computers/" + s.id + "/lease",
        { holder: PANEL_HOLDER, ttl_ms: LEASE_TTL_MS });
    } catch (_) {
      // Another holder has it: the gateway revokes this control screen.
    }
  }

  async function release(id) {
    const s = screens.get(id);
    if (!s) return;
    const generation = s.generation;
    closeScreen(id, true);
    // Give the lease back where the broker supports it; otherwise it lapses
    // within LEASE_TTL_MS since the panel stops renewing it.
    api("DELETE", "/v1/computers/" + id + "/lease", undefined,
      generation === null ? undefined : { "Dormouse-Generation": String(generation) }).catch(() => {});
    const c = computers.get(id);
    if (c && c.ready) openScreen(id, "view", null, null);
    render();
  }

  function retryScreen(id) {
    closeScreen(id, true);
    const c = computers.get(id);
    if (c && c.ready) openScreen(id, "view", null, null);
  }

  // ---- actions: one request per click ----------------------------------------

  async function start(id) {
    if (starting.has(id)) return;
    starting.add(id);
    render();
    try {
      const status = await (await api("POST", "/v1/computers/" + id + "/start")).json();
      starting.delete(id);
      upsert(status);
    } catch (e) {
      starting.delete(id);
      showError("Start failed: " + e.message);
      render();
    }
  }

  async function stop(id) {
    if (acting.has(id)) return;
    acting.add(id);
    render();
    try {
      const status = await (await api("POST", "/v1/computers/" + id + "/stop")).json();
      acting.delete(id);
      upsert(status);
    } catch (e) {
      acting.delete(id);
      showError("Stop failed: " + e.message);
      render();
    }
  }

  async function removeDesktop(id) {
    const c = computers.get(id);
    const name = c ? c.name : id;
    if (!window.confirm("Remove desktop \u201c" + name + "\u201d? Its container is deleted; " +
        "the workspace is kept on the host.")) {
      return;
    }
    if (acting.has(id)) return;
    acting.add(id);
    render();
    try {
      await api("DELETE", "/v1/computers/" + id);
      remove(id);
    } catch (e) {
      acting.delete(id);
      showError("Remove failed: " + e.message);
      render();
    }
  }

  async function create(name) {
    const button = $("create");
    button.disabled = true;
    button.setAttribute("aria-busy", "true");
    try {
      const body = name ? { name } : {};
      const status = await (await api("POST", "/v1/computers", body)).json();
      $("create-name").value = "";
      upsert(status);
    } catch (e) {
      showError("Create failed: " + e.message);
    } finally {
      button.disabled = false;
      button.removeAttribute("aria-busy");
    }
  }

  // ---- drawing -----------------------------------------------------------------

  const STOP_REASONS = {
    idle: "Stopped because idle",
    manual: "Stopped manually",
    shutdown: "Stopped because the host shut down",
    fenced: "Stopped because another controller took over",
    killed: "Stopped because it was killed",
    oom: "Stopped because it ran out of memory",
  };

  const PHASES = {
    preparing: "Preparing",
    starting: "Starting services",
    ready: "Ready",
    degraded: "Degraded",
    stopping: "Stopping",
  };

  function stateText(c) {
    if (starting.has(c.id) && c.container !== "running") return "Starting\u2026";
    switch (c.container) {
      case "running":
        return c.ready ? "Running" : "Starting\u2026";
      case "stopped":
        return STOP_REASONS[c.stop_reason] || "Stopped";
      case "missing":
        return "Container missing";
      default:
        return "Unknown (engine unreachable)";
    }
  }

  function readinessText(c) {
    if (c.ready) return "Ready";
    if (starting.has(c.id)) return "Not ready \u00b7 resuming";
    if (c.container !== "running") return "Not running";
    return "Not ready" + (c.phase ? " \u00b7 " + (PHASES[c.phase] || c.phase) : "");
  }

  function idleText(c) {
    const idle = c.idle;
    if (c.container !== "running" || !idle) return "\u2014";
    if (!idle.stops_at) return "Busy \u00b7 timer paused";
    const left = Math.max(0, Date.parse(idle.stops_at) - Date.now());
    return "Stops in " + duration(left) + " if idle";
  }

  function duration(ms) {
    const s = Math.floor(ms / 1000);
    const h = Math.floor(s / 3600);
    const m = Math.floor((s % 3600) / 60);
    const sec = s % 60;
    const pad = (n) => String(n).padStart(2, "0");
    return (h > 0 ? h + ":" + pad(m) : String(m)) + ":" + pad(sec);
  }

  function emptyStateText(c, preview) {
    if (c.ready) {
      if (preview && preview.failed) return "Preview unavailable: " + preview.failed;
      return "Loading preview\u2026";
    }
    if (c.container === "running" || starting.has(c.id)) return "Starting\u2026 the preview appears when the desktop is ready";
    if (c.container === "stopped") return "Stopped \u2014 start it to see the screen";
    return "No preview";
  }

  function render() {
    const list = $("desktops");
    const ordered = Array.from(computers.values()).sort((a, b) =>
      a.name.localeCompare(b.name) || a.id.localeCompare(b.id));
    const cards = new Map();
    for (const li of Array.from(list.children)) cards.set(li.dataset.id, li);

    let running = 0;
    ordered.forEach((c, index) => {
      if (c.container === "running") running += 1;
      let li = cards.get(c.id);
      if (!li) li = newCard(c.id);
      cards.delete(c.id);
      if (list.children[index] !== li) list.insertBefore(li, list.children[index] || null);
      drawCard(li, c);
    });
    for (const li of cards.values()) li.remove();

    $("no-desktops").hidden = ordered.length > 0;
    if (dock) dock.draw();
    $("summary").textContent = ordered.length === 0 ? "" :
      ordered.length + (ordered.length === 1 ? " desktop" : " desktops") + " \u00b7 " + running + " running";
  }

  function newCard(id) {
    const li = $("desktop-template").content.firstElementChild.cloneNode(true);
    li.dataset.id = id;
    li.querySelector(".start").addEventListener("click", () => start(id));
    li.querySelector(".stop").addEventListener("click", () => stop(id));
    li.querySelector(".remove").addEventListener("click", () => removeDesktop(id));
    li.querySelector(".take-control").addEventListener("click", () => takeControl(id));
    li.querySelector(".release").addEventListener("click", () => release(id));
    li.querySelector(".retry").addEventListener("click", () => retryScreen(id));
    for (const tab of ["files", "terminal", "clipboard", "activity"]) {
      li.querySelector(".open-" + tab).addEventListener("click", () => dock.open(id, tab));
    }
    return li;
  }

  function drawCard(li, c) {
    const q = (sel) => li.querySelector(sel);
    li.dataset.container = c.container;
    li.dataset.ready = String(c.ready);
    q(".name").textContent = c.name;
    q(".id").textContent = c.id;
    q(".state").textContent = stateText(c);
    q(".readiness").textContent = readinessText(c);
    q(".idle").textContent = idleText(c);
    q(".egress").textContent = egressText(egress.get(c.id));
    drawRefused(li, egress.get(c.id));
    drawAsks(li, asks.get(c.id));

    // Why it cannot start, unless a start is what is going on.
    const blocked = c.container !== "running" && !c.resumable && !starting.has(c.id);
    const problem = c.problem || (blocked ? c.resumable_problem : null);
    q(".problem").hidden = !problem;
    q(".problem").textContent = problem || "";

    // Preview: the screenshot replaces the empty state once ready.
    const preview = previews.get(c.id);
    const img = q(".screenshot");
    const empty = q(".empty-state");
    // The live screen, once it has drawn a frame, replaces both.
    const screen = screens.get(c.id);
    const live = liveShown(c.id);
    const last = lastScreens.get(c.id);
    const showLast = !c.ready && c.container === "stopped" && !starting.has(c.id) &&
      Boolean(last && last.url);
    const showImage = (Boolean(c.ready && preview && preview.url) && !live) || showLast;
    const src = showLast ? last.url : preview && preview.url;
    if (showImage && img.getAttribute("src") !== src) img.src = src;
    if (!showImage && !live) img.removeAttribute("src");
    img.dataset.last = String(showLast);
    const takenAt = showLast && last.takenAt ? new Date(last.takenAt) : null;
    img.alt = showLast ? "Last screen of " + c.name + " before it stopped (not live)" : "Screen of " + c.name;
    img.hidden = !showImage;
    const note = q(".last-note");
    note.hidden = !showLast;
    note.textContent = showLast ? "Last screen" + (takenAt ? " · " + takenAt.toLocaleString() : "") +
      " · not live" : "";
    empty.hidden = showImage || live;
    empty.textContent = emptyStateText(c, preview);
    const liveEl = q(".live");
    liveEl.hidden = !screen || screen.done;
    liveEl.dataset.mode = screen ? screen.mode : "";
    liveEl.setAttribute("aria-label", "Live screen of " + c.name);

    const bar = q(".screen-bar");
    bar.hidden = !screen;
    if (screen) {
      bar.dataset.state = screen.state;
      q(".screen-state").textContent = screen.text + (screen.note ? " \u00b7 " + screen.note : "");
      const take = q(".take-control");
      take.hidden = screen.mode !== "view" || screen.state === "failed" || screen.state === "revoked";
      take.disabled = screen.busy || !c.ready || screen.state !== "live";
      q(".release").hidden = screen.mode !== "control" || screen.done;
      q(".retry").hidden = screen.state !== "failed";
    }

    // Start: busy from the click until the desktop is ready.
    const startButton = q(".start");
    const busy = starting.has(c.id) || (c.container === "running" && !c.ready);
    const label = busy ? "Starting\u2026" : "Start";
    if (startButton.textContent !== label) startButton.textContent = label;
    startButton.hidden = c.container === "running" && c.ready;
    startButton.disabled = busy || !c.resumable || acting.has(c.id);
    if (busy) {
      startButton.setAttribute("aria-busy", "true");
    } else {
      startButton.removeAttribute("aria-busy");
    }
    startButton.title = !busy && !c.resumable && c.resumable_problem ? c.resumable_problem : "";

    const stopButton = q(".stop");
    stopButton.hidden = c.container !== "running";
    stopButton.disabled = acting.has(c.id) || starting.has(c.id);
    q(".remove").disabled = acting.has(c.id) || starting.has(c.id);
  }

  function tickIdle() {
    for (const li of $("desktops").children) {
      const c = computers.get(li.dataset.id);
      if (c) li.querySelector(".idle").textContent = idleText(c);
    }
  }

  // ---- errors and sign-in ------------------------------------------------------------

  function showError(text) {
    $("error-text").textContent = text;
    $("error").hidden = false;
  }

  function hideError() {
    $("error").hidden = true;
    $("error-text").textContent = "";
  }

  function signOut(reason) {
    // Revoke the screens while the token is still at hand.
    for (const id of Array.from(screens.keys())) closeScreen(id, true);
    signedIn = false;
    token = null;
    sessionStorage.removeItem(TOKEN_KEY);
    stopPolling();
    clearTimeout(socketTimer);
    if (socket) {
      const ws = socket;
      socket = null;
      ws.close();
    }
    for (const id of Array.from(previews.keys())) dropPreview(id);
    for (const id of Array.from(lastScreens.keys())) dropLastScreen(id);
    if (dock) dock.forget();
    egress.clear();
    asks.clear();
    computers.clear();
    starting.clear();
    acting.clear();
    render();
    $("app").hidden = true;
    $("sign-out").hidden = true;
    $("login").hidden = false;
    setConnection("offline", "Not connected");
    if (reason) showError(reason);
    $("token").focus();
  }

  async function signIn(candidate) {
    token = candidate;
    signedIn = true;
    try {
      await api("GET", "/v1/computers");
    } catch (e) {
      if (e.status !== 401) {
        signedIn = false;
        showError("Cannot sign in: " + e.message);
      }
      return;
    }
    sessionStorage.setItem(TOKEN_KEY, token);
    hideError();
    $("login").hidden = true;
    $("app").hidden = false;
    $("sign-out").hidden = false;
    await refreshAll();
    connect();
  }

  /** The panel's control screen of `id` with its lease generation, if it
   *  holds control now (the dock's terminal and clipboard need it). */
  function control(id) {
    const s = screens.get(id);
    if (!s || s.mode !== "control" || s.done || !s.rfb || s.generation === null) return null;
    return { generation: s.generation, rfb: s.rfb };
  }

  document.addEventListener("DOMContentLoaded", () => {
    dock = window.DormouseDock.create({
      api,
      token: () => token,
      computer: (id) => computers.get(id),
      control,
      takeControl,
    });
    $("login-form").addEventListener("submit", (e) => {
      e.preventDefault();
      const value = $("token").value.trim();
      $("token").value = "";
      if (value) signIn(value);
    });
    $("create-form").addEventListener("submit", (e) => {
      e.preventDefault();
      create($("create-name").value.trim());
    });
    $("sign-out").addEventListener("click", () => signOut(null));
    $("error-dismiss").addEventListener("click", hideError);
    setInterval(tickIdle, 1000);
    setInterval(refreshPreviews, 1000);
    setInterval(refreshEgress, 1000);
    setInterval(refreshAsks, 1000);
    if (token) {
      signIn(token);
    } else {
      signOut(null);
    }
  });
})();
