// Dormouse web panel: a list of desktops over the broker's public API only
// (the same routes any frontend uses), so it doubles as the reference client.
//
// State flows one way: the WebSocket /v1/events (or, while it is down, a poll
// of GET /v1/computers every 2 s) updates `computers`; render() draws it.
// A button click sends exactly one request and never retries by itself.
"use strict";

(function () {
  const TOKEN_KEY = "dormouse.token";
  const POLL_MS = 2000;
  const SCREENSHOT_REFRESH_MS = 10000;
  const WS_RETRY_MAX_MS = 30000;

  /** @type {Map<string, object>} id -> ComputerStatus */
  const computers = new Map();
  /** Ids whose Start request is in flight (the button is busy meanwhile). */
  const starting = new Set();
  /** Ids with another request in flight (stop, remove). */
  const acting = new Set();
  /** id -> { url, fetchedAt, loading, failed } */
  const previews = new Map();

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

  async function api(method, path, body) {
    const headers = { Authorization: "Bearer " + token };
    const init = { method, headers, cache: "no-store" };
    if (body !== undefined) {
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
    if (draw) render();
  }

  function remove(id, draw = true) {
    computers.delete(id);
    starting.delete(id);
    acting.delete(id);
    dropPreview(id);
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
      if (status.ready && entry && !entry.loading && Date.now() - entry.fetchedAt >= every) {
        loadPreview(id);
      }
    }
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
    $("summary").textContent = ordered.length === 0 ? "" :
      ordered.length + (ordered.length === 1 ? " desktop" : " desktops") + " \u00b7 " + running + " running";
  }

  function newCard(id) {
    const li = $("desktop-template").content.firstElementChild.cloneNode(true);
    li.dataset.id = id;
    li.querySelector(".start").addEventListener("click", () => start(id));
    li.querySelector(".stop").addEventListener("click", () => stop(id));
    li.querySelector(".remove").addEventListener("click", () => removeDesktop(id));
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

    // Why it cannot start, unless a start is what is going on.
    const blocked = c.container !== "running" && !c.resumable && !starting.has(c.id);
    const problem = c.problem || (blocked ? c.resumable_problem : null);
    q(".problem").hidden = !problem;
    q(".problem").textContent = problem || "";

    // Preview: the screenshot replaces the empty state once ready.
    const preview = previews.get(c.id);
    const img = q(".screenshot");
    const empty = q(".empty-state");
    const showImage = Boolean(c.ready && preview && preview.url);
    if (showImage && img.getAttribute("src") !== preview.url) img.src = preview.url;
    if (!showImage) img.removeAttribute("src");
    img.alt = "Screen of " + c.name;
    img.hidden = !showImage;
    empty.hidden = showImage;
    empty.textContent = emptyStateText(c, preview);

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

  document.addEventListener("DOMContentLoaded", () => {
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
    if (token) {
      signIn(token);
    } else {
      signOut(null);
    }
  });
})();
