// Dormouse screen viewer: one capability's live screen, for a link a person
// opens (`dormouse screen ID` prints it). The link carries the capability in
// its fragment (#screen=<id>&token=<token>&mode=view|control), which the
// browser never sends to any server; the token then travels only as the
// WebSocket subprotocol dormouse.screen.<token>. The gateway enforces the
// mode; viewOnly below is only a courtesy.
"use strict";

(function () {
  const WORDS = {
    "revoked: desktop stopped": "Revoked because the desktop stopped",
    "revoked: desktop killed": "Revoked because the desktop was killed",
    "revoked: desktop removed": "Revoked because the desktop was removed",
    "revoked: desktop restarted": "Revoked because the desktop restarted",
    "revoked: the lease changed hands": "Revoked because another controller took the lease",
    "revoked: capability deleted": "Revoked",
    "expired": "Expired",
  };
  const $ = (id) => document.getElementById(id);
  const params = new URLSearchParams(location.hash.slice(1));
  const screenId = params.get("screen") || "";
  const token = params.get("token") || "";
  const mode = params.get("mode") === "control" ? "control" : "view";
  let RFB = null;
  let rfb = null;

  function setState(kind, text) {
    const el = $("state");
    el.dataset.mode = kind === "live" ? "live" : kind === "connecting" ? "polling" : "offline";
    el.dataset.state = kind;
    el.textContent = text;
    $("retry").hidden = kind !== "failed";
  }

  function connect() {
    if (!/^[0-9a-f-]{36}$/.test(screenId) || !/^[0-9a-f]{64}$/.test(token)) {
      setState("failed", "Failed: this link has no valid screen capability");
      $("retry").hidden = true;
      return;
    }
    setState("connecting", "Connecting\u2026");
    const scheme = location.protocol === "https:" ? "wss:" : "ws:";
    let ws;
    try {
      ws = new WebSocket(scheme + "//" + location.host + "/v1/screens/" + screenId + "/rfb",
        ["binary", "dormouse.screen." + token]);
    } catch (e) {
      setState("failed", "Failed: the browser refused the connection");
      return;
    }
    ws.addEventListener("close", (ev) => {
      rfb = null;
      if (ev.code === 4001 || ev.code === 4002) {
        setState("revoked", WORDS[ev.reason] || ("Revoked: " + (ev.reason || "no reason given")));
      } else if (ev.code === 1006 && !ev.reason) {
        setState("failed", "Failed: the broker refused or lost the connection");
      } else {
        setState("failed", "Failed: " + (ev.reason || ("the connection closed (" + ev.code + ")")));
      }
    });
    const target = $("screen");
    target.textContent = "";
    rfb = new RFB(target, ws, {});
    rfb.viewOnly = mode !== "control";
    rfb.scaleViewport = true;
    rfb.resizeSession = false;
    rfb.addEventListener("connect", () => {
      setState("live", mode === "control" ? "Control" : "Live \u00b7 view only");
    });
  }

  document.addEventListener("DOMContentLoaded", async () => {
    $("mode").textContent = mode === "control" ? "Control" : "View only";
    $("retry").addEventListener("click", connect);
    try {
      RFB = (await import("/novnc/core/rfb.js")).default;
    } catch (_) {
      setState("failed", "Failed: the viewer (noVNC) is not installed on the broker's host");
      $("retry").hidden = true;
      return;
    }
    connect();
  });
})();
