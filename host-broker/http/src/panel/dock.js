// Dormouse web panel, the dock: one desktop's files, terminal, clipboard and
// activity, under the list of desktops. panel.js owns the desktops, the
// token and the live screens and creates the dock with what it needs
// (window.DormouseDock.create(env)); the dock only calls the public API.
//
// - Files: the workspace through /v1/computers/{id}/files, which works
//   whether the desktop runs or not and never starts it.
// - Terminal: a shell over /v1/computers/{id}/exec/ws for whoever holds
//   control (the panel's lease generation travels as ?generation=, the
//   token as a subprotocol), drawn with xterm.js served by the broker.
// - Clipboard: through the panel's control screen only (noVNC's RFB
//   cut-text); the gateway never gives a view screen the clipboard.
// - Activity: GET /v1/computers/{id}/activity, then the `activity` events.
"use strict";

(function () {
  const ACTIVITY_SHOWN = 50;
  const TABS = ["files", "terminal", "clipboard", "activity"];
  const ACTORS = { api: "the API", broker: "Dormouse" };

  function create(env) {
    const $ = (id) => document.getElementById(id);
    let current = null;      // the desktop shown
    let tab = "files";
    let folder = [];         // path components of the listed folder
    let listing = null;      // { entries, truncated } | null
    let filesBusy = false;
    let filesText = "";
    let activity = [];       // newest first
    let activityText = "";
    let terminal = null;     // { id, ws, term, state }
    let Terminal = null;     // xterm's class, once loaded
    let clipboardFromDesktop = "";

    const url = (id, parts) => "/v1/computers/" + id + "/files" +
      (parts.length ? "/" + parts.map(encodeURIComponent).join("/") : "");

    // ---- opening and tabs ------------------------------------------------

    function open(id, which) {
      const c = env.computer(id);
      if (!c) return;
      if (current !== id) {
        closeTerminal("closed: another desktop was opened");
        current = id;
        folder = [];
        listing = null;
        activity = [];
        clipboardFromDesktop = "";
        $("clipboard-text").value = "";
        loadFiles();
        loadActivity();
      }
      $("dock").hidden = false;
      select(which || tab, true);
      draw();
      $("dock").scrollIntoView({ block: "nearest" });
    }

    function close() {
      closeTerminal("closed");
      current = null;
      $("dock").hidden = true;
    }

    function select(which, focus) {
      tab = which;
      for (const name of TABS) {
        const button = $("tab-" + name);
        const on = name === which;
        button.setAttribute("aria-selected", String(on));
        button.tabIndex = on ? 0 : -1;
        $("pane-" + name).hidden = !on;
        if (on && focus) button.focus();
      }
      if (which === "terminal" && terminal && terminal.term) fitTerminal();
    }

    /** Arrow keys move between the tabs (the ARIA tabs pattern). */
    function tabKeys(e) {
      const at = TABS.indexOf(tab);
      let to = null;
      if (e.key === "ArrowRight") to = (at + 1) % TABS.length;
      if (e.key === "ArrowLeft") to = (at + TABS.length - 1) % TABS.length;
      if (e.key === "Home") to = 0;
      if (e.key === "End") to = TABS.length - 1;
      if (to === null) return;
      e.preventDefault();
      select(TABS[to], true);
      draw();
    }

    // ---- files -------------------------------------------------------------

    async function loadFiles() {
      const id = current;
      const at = folder.slice();
      filesBusy = true;
      filesText = "Loading\u2026";
      draw();
      try {
        const body = await (await env.api("GET", url(id, at))).json();
        if (current !== id || at.join("/") !== folder.join("/")) return;
        listing = body;
        filesText = body.entries.length === 0 ? "This folder is empty." :
          body.entries.length + (body.entries.length === 1 ? " entry" : " entries") +
          (body.truncated ? " (only the first 10,000 are listed)" : "");
      } catch (e) {
        if (current !== id) return;
        listing = null;
        filesText = "Cannot list this folder: " + e.message;
      } finally {
        if (current === id) {
          filesBusy = false;
          draw();
        }
      }
    }

    function enter(parts) {
      folder = parts;
      listing = null;
      loadFiles();
    }

    async function download(name) {
      const id = current;
      try {
        const blob = await (await env.api("GET", url(id, folder.concat([name])))).blob();
        const link = document.createElement("a");
        link.href = URL.createObjectURL(blob);
        link.download = name;
        link.hidden = true;
        document.body.append(link);
        link.click();
        link.remove();
        setTimeout(() => URL.revokeObjectURL(link.href), 60000);
        filesText = "Downloaded " + name + " (" + size(blob.size) + ")";
      } catch (e) {
        filesText = "Download failed: " + e.message;
      }
      draw();
    }

    async function upload(files) {
      const id = current;
      const at = folder.slice();
      for (const file of files) {
        filesText = "Uploading " + file.name + "\u2026";
        filesBusy = true;
        draw();
        try {
          await env.api("PUT", url(id, at.concat([file.name])), file);
          filesText = "Uploaded " + file.name + " (" + size(file.size) + ")";
        } catch (e) {
          filesText = "Upload of " + file.name + " failed: " + e.message;
          break;
        } finally {
          filesBusy = false;
        }
      }
      await relist(id);
    }

    async function removeEntry(entry) {
      const what = entry.type === "dir" ? "the folder \u201c" + entry.name + "\u201d and everything in it" :
        "\u201c" + entry.name + "\u201d";
      if (!window.confirm("Delete " + what + " from the workspace? This cannot be undone.")) return;
      const id = current;
      const path = url(id, folder.concat([entry.name])) + (entry.type === "dir" ? "?recursive=true" : "");
      try {
        await env.api("DELETE", path);
        filesText = "Deleted " + entry.name;
      } catch (e) {
        filesText = "Delete failed: " + e.message;
      }
      await relist(id);
    }

    /** After a change: shows what was said, lists the folder again (if
     *  `id` is still the dock's desktop) and keeps saying it. */
    async function relist(id) {
      draw();
      if (current !== id) return;
      const said = filesText;
      await loadFiles();
      filesText = said;
      draw();
    }

    async function newFolder() {
      const name = (window.prompt("Name of the new folder") || "").trim();
      if (!name) return;
      if (name === "." || name === ".." || name.includes("/")) {
        filesText = "A folder name cannot be \u201c.\u201d, \u201c..\u201d or contain \u201c/\u201d.";
        draw();
        return;
      }
      const id = current;
      try {
        await env.api("PUT", url(id, folder.concat([name])) + "?dir=true");
        filesText = "Made the folder " + name;
      } catch (e) {
        filesText = "New folder failed: " + e.message;
      }
      await relist(id);
    }

    function size(n) {
      if (n < 1024) return n + " B";
      const units = ["KiB", "MiB", "GiB", "TiB"];
      let v = n;
      let u = -1;
      do { v /= 1024; u += 1; } while (v >= 1024 && u < units.length - 1);
      return v.toFixed(v < 10 ? 1 : 0) + " " + units[u];
    }

    function drawFiles() {
      const crumbs = $("files-crumbs");
      const parts = [{ label: "workspace", at: [] }].concat(folder.map((name, i) =>
        ({ label: name, at: folder.slice(0, i + 1) })));
      crumbs.replaceChildren(...parts.map((p, i) => {
        const last = i === parts.length - 1;
        const el = document.createElement(last ? "span" : "button");
        el.textContent = p.label;
        if (last) {
          el.setAttribute("aria-current", "location");
        } else {
          el.type = "button";
          el.className = "link";
          el.addEventListener("click", () => enter(p.at));
        }
        const wrap = document.createElement("li");
        wrap.append(el);
        return wrap;
      }));
      $("files-state").textContent = filesText;
      $("files").setAttribute("aria-busy", String(filesBusy));
      const body = $("files-body");
      const entries = listing ? listing.entries.slice().sort((a, b) =>
        (a.type === "dir" ? 0 : 1) - (b.type === "dir" ? 0 : 1) || a.name.localeCompare(b.name)) : [];
      const key = current + "|" + folder.join("/") + "|" +
        entries.map((e) => e.name + e.type + e.size + e.mtime).join("|");
      if (body.dataset.key === key) return;
      body.dataset.key = key;
      body.replaceChildren(...entries.map((e) => {
        const row = document.createElement("tr");
        row.dataset.name = e.name;
        row.dataset.type = e.type;
        const name = document.createElement("td");
        if (e.type === "dir") {
          const b = document.createElement("button");
          b.type = "button";
          b.className = "link";
          b.textContent = e.name + "/";
          b.addEventListener("click", () => enter(folder.concat([e.name])));
          name.append(b);
        } else {
          name.textContent = e.name + (e.type === "symlink" ? " \u2192 (link)" : "");
        }
        const bytes = document.createElement("td");
        bytes.textContent = e.type === "file" ? size(e.size) : "\u2014";
        const when = document.createElement("td");
        const t = document.createElement("time");
        t.dateTime = e.mtime;
        t.textContent = new Date(e.mtime).toLocaleString();
        when.append(t);
        const acts = document.createElement("td");
        acts.className = "row-actions";
        if (e.type === "file") {
          const d = document.createElement("button");
          d.type = "button";
          d.className = "quiet download";
          d.textContent = "Download";
          d.setAttribute("aria-label", "Download " + e.name);
          d.addEventListener("click", () => download(e.name));
          acts.append(d);
        }
        const x = document.createElement("button");
        x.type = "button";
        x.className = "quiet danger delete";
        x.textContent = "Delete";
        x.setAttribute("aria-label", "Delete " + e.name);
        x.addEventListener("click", () => removeEntry(e));
        acts.append(x);
        row.append(name, bytes, when, acts);
        return row;
      }));
    }

    // ---- terminal ------------------------------------------------------------

    async function loadTerminal() {
      if (Terminal) return true;
      if (!window.DormouseXterm) {
        await new Promise((resolve) => {
          const s = document.createElement("script");
          s.src = "/xterm/xterm.js";
          s.onload = resolve;
          s.onerror = resolve;
          document.head.append(s);
          const css = document.createElement("link");
          css.rel = "stylesheet";
          css.href = "/xterm/xterm.css";
          document.head.append(css);
        });
      }
      if (window.DormouseXterm) Terminal = window.DormouseXterm.Terminal;
      return Boolean(Terminal);
    }

    async function openTerminal() {
      const id = current;
      const control = env.control(id);
      if (!control) return;
      closeTerminal(null);
      terminal = { id, ws: null, term: null, state: "Loading the terminal\u2026" };
      draw();
      if (!(await loadTerminal())) {
        terminal.state = "The terminal is not available: the broker's host lacks Debian's node-xterm package.";
        terminal.failed = true;
        draw();
        return;
      }
      if (!terminal || terminal.id !== id) return;
      const box = $("terminal");
      box.replaceChildren();
      // screenReaderMode keeps the rows as text in the page too (for screen
      // readers, and for anything else that reads the page).
      const term = new Terminal({ fontSize: 14, cursorBlink: true, scrollback: 2000, screenReaderMode: true });
      term.open(box);
      terminal.term = term;
      const dims = fitTerminal();
      const scheme = location.protocol === "https:" ? "wss:" : "ws:";
      const q = "?rows=" + dims.rows + "&cols=" + dims.cols + "&generation=" + control.generation;
      let ws;
      try {
        ws = new WebSocket(scheme + "//" + location.host + "/v1/computers/" + id + "/exec/ws" + q,
          ["dormouse.v1", "dormouse.bearer." + env.token()]);
      } catch (e) {
        terminal.state = "Failed: the browser refused the connection";
        draw();
        return;
      }
      ws.binaryType = "arraybuffer";
      terminal.ws = ws;
      const session = terminal;
      const decoder = new TextDecoder();
      const encoder = new TextEncoder();
      ws.onopen = () => {
        session.state = "Shell open \u00b7 closing this tab's terminal ends it";
        draw();
        term.focus();
      };
      ws.onmessage = (m) => {
        if (typeof m.data === "string") {
          let msg = null;
          try { msg = JSON.parse(m.data); } catch (_) { return; }
          if (msg.type === "exit") {
            session.state = "The shell ended (exit code " + (msg.exit_code === null ? "none, signal " + msg.signal : msg.exit_code) + ")";
          } else if (msg.type === "error") {
            session.state = msg.code === "revoked" ? "Closed: control passed to another lease holder" : "Failed: " + msg.message;
          }
          draw();
          return;
        }
        term.write(decoder.decode(new Uint8Array(m.data), { stream: true }));
      };
      ws.onclose = (ev) => {
        if (session.ws !== ws) return;
        session.ws = null;
        if (/^Shell open/.test(session.state) || /^Loading/.test(session.state)) {
          session.state = "Closed" + (ev.reason ? ": " + ev.reason : " (" + ev.code + ")");
        }
        draw();
      };
      term.on("data", (data) => {
        if (ws.readyState === WebSocket.OPEN) ws.send(encoder.encode(data));
      });
      term.on("resize", (s) => {
        if (ws.readyState === WebSocket.OPEN) {
          ws.send(JSON.stringify({ type: "resize", rows: s.rows, cols: s.cols }));
        }
      });
      draw();
    }

    function fitTerminal() {
      const term = terminal && terminal.term;
      if (!term) return { rows: 24, cols: 80 };
      if (window.DormouseXterm.fit && !$("pane-terminal").hidden) {
        try { term.fit(); } catch (_) { /* not laid out yet */ }
      }
      return { rows: term.rows, cols: term.cols };
    }

    /** Ends the terminal session (the broker then kills its processes). */
    function closeTerminal(why) {
      if (!terminal) return;
      const t = terminal;
      terminal = null;
      if (t.ws) {
        const ws = t.ws;
        t.ws = null;
        try { ws.close(1000, "closed by the panel"); } catch (_) { /* closed */ }
      }
      if (t.term) t.term.dispose();
      $("terminal").replaceChildren();
      if (why) $("terminal-state").textContent = "Terminal " + why;
    }

    function drawTerminal() {
      const control = current && env.control(current);
      const live = terminal && terminal.id === current && (terminal.ws || terminal.term);
      const state = $("terminal-state");
      const openButton = $("terminal-open");
      const takeButton = $("terminal-take");
      const closeButton = $("terminal-close");
      if (!control) {
        if (terminal && terminal.ws) closeTerminal(null);
        const c = current && env.computer(current);
        state.textContent = !c || !c.ready ? "The terminal needs the desktop running and ready." :
          "A shell is for whoever holds control: take control of this desktop first.";
        openButton.hidden = true;
        takeButton.hidden = !c || !c.ready;
        closeButton.hidden = true;
        return;
      }
      takeButton.hidden = true;
      openButton.hidden = Boolean(live && terminal.ws);
      openButton.textContent = live ? "Open a new shell" : "Open a shell";
      closeButton.hidden = !(live && terminal.ws);
      if (terminal && terminal.id === current) {
        state.textContent = terminal.state;
      } else if (!/^Terminal /.test(state.textContent)) {
        state.textContent = "You hold control: open a shell as the desktop user.";
      }
    }

    // ---- clipboard ------------------------------------------------------------

    function sendClipboard() {
      const control = env.control(current);
      const text = $("clipboard-text").value;
      if (!control || !control.rfb) return;
      control.rfb.clipboardPasteFrom(text);
      $("clipboard-state").textContent = "Sent " + text.length + " characters to the desktop's clipboard (paste there with Ctrl+V or the middle button).";
    }

    /** The desktop's clipboard changed (a control screen's cut-text). */
    function fromDesktop(id, text) {
      if (id !== current) return;
      clipboardFromDesktop = text;
      $("clipboard-text").value = text;
      $("clipboard-state").textContent = "The desktop's clipboard: " + text.length + " characters, shown below.";
    }

    function drawClipboard() {
      const control = current && env.control(current);
      $("clipboard-send").disabled = !control || !control.rfb;
      $("clipboard-take").hidden = Boolean(control) || !(current && env.computer(current) && env.computer(current).ready);
      if (!control) {
        $("clipboard-state").textContent = "The clipboard is carried only while you hold control (a view screen never receives it).";
      } else if (/^The clipboard is carried only/.test($("clipboard-state").textContent)) {
        $("clipboard-state").textContent = clipboardFromDesktop ? "The desktop's clipboard is shown below." :
          "Type or paste text below and send it, or copy in the desktop to see it here.";
      }
    }

    // ---- activity --------------------------------------------------------------

    async function loadActivity() {
      const id = current;
      activityText = "Loading\u2026";
      try {
        const body = await (await env.api("GET", "/v1/computers/" + id + "/activity?limit=" + ACTIVITY_SHOWN)).json();
        if (current !== id) return;
        const seen = new Set(activity.map((e) => e.seq));
        activity = activity.concat(body.entries.filter((e) => !seen.has(e.seq)))
          .sort((a, b) => b.seq - a.seq).slice(0, ACTIVITY_SHOWN);
        activityText = activity.length ? "" : "Nothing was done to this desktop yet.";
      } catch (e) {
        if (current === id) activityText = "Cannot read the activity: " + e.message;
      }
      if (current === id) draw();
    }

    /** An `activity` event: a new entry goes on top at once. */
    function activityEvent(id, entry) {
      if (id !== current || activity.some((e) => e.seq === entry.seq)) return;
      activity = [entry].concat(activity).slice(0, ACTIVITY_SHOWN);
      activityText = "";
      draw();
    }

    function actorText(actor) {
      if (ACTORS[actor]) return ACTORS[actor];
      if (actor.startsWith("lease:")) return "lease holder " + actor.slice(6);
      if (actor.startsWith("screen:")) return "screen " + actor.slice(7, 15);
      return actor;
    }

    function drawActivity() {
      $("activity-state").textContent = activityText;
      const list = $("activity-list");
      const key = current + "|" + activity.map((e) => e.seq).join(",");
      if (list.dataset.key === key) return;
      list.dataset.key = key;
      list.replaceChildren(...activity.map((e) => {
        const li = document.createElement("li");
        li.dataset.kind = e.kind;
        const at = document.createElement("time");
        at.dateTime = e.at;
        at.textContent = new Date(e.at).toLocaleTimeString();
        const what = document.createElement("span");
        what.className = "summary";
        what.textContent = e.summary;
        const who = document.createElement("span");
        who.className = "why";
        who.textContent = " \u2014 " + actorText(e.actor);
        li.append(at, " ", what, who);
        return li;
      }));
    }

    // ---- drawing ---------------------------------------------------------------

    function draw() {
      if (!current) return;
      const c = env.computer(current);
      if (!c) { close(); return; }
      $("dock-title").textContent = c.name;
      drawFiles();
      drawTerminal();
      drawClipboard();
      drawActivity();
    }

    /** The desktop is gone (removed, or the user signed out). */
    function forget(id) {
      if (id === undefined || id === current) close();
    }

    // ---- wiring ----------------------------------------------------------------

    for (const name of TABS) {
      $("tab-" + name).addEventListener("click", () => { select(name, false); draw(); });
      $("tab-" + name).addEventListener("keydown", tabKeys);
    }
    $("dock-close").addEventListener("click", close);
    $("files-upload").addEventListener("click", () => $("files-input").click());
    $("files-input").addEventListener("change", (e) => {
      const files = Array.from(e.target.files || []);
      e.target.value = "";
      if (files.length) upload(files);
    });
    $("files-new-folder").addEventListener("click", newFolder);
    $("files-refresh").addEventListener("click", loadFiles);
    $("terminal-open").addEventListener("click", openTerminal);
    $("terminal-close").addEventListener("click", () => closeTerminal("closed"));
    $("terminal-take").addEventListener("click", () => env.takeControl(current));
    $("clipboard-take").addEventListener("click", () => env.takeControl(current));
    $("clipboard-send").addEventListener("click", sendClipboard);
    $("activity-refresh").addEventListener("click", loadActivity);
    window.addEventListener("resize", () => { if (terminal && terminal.term) fitTerminal(); });

    return { open, close, draw, forget, fromDesktop, activityEvent };
  }

  window.DormouseDock = { create };
})();
