"""Shared by the agent-client checks: the environment the Rust test sets,
the witness (the page's window title in the guest, read with xdotool
through docker exec, never through Dormouse), and small helpers."""

import base64
import json
import os
import struct
import subprocess
import sys
import urllib.parse

URL = os.environ.get("DORMOUSE_URL", "http://127.0.0.1:7480")
TOKEN = os.environ.get("DORMOUSE_TOKEN", "")
DESK = os.environ.get("DESK", "")
DESK_NAME = os.environ.get("DESK_NAME", "")
CONTAINER = os.environ.get("CONTAINER", "")
STOPPED = os.environ.get("STOPPED", "")
STOPPED_CONTAINER = os.environ.get("STOPPED_CONTAINER", "")
GEN = os.environ.get("GEN", "")
STALE_GEN = os.environ.get("STALE_GEN", "")
CLI = os.environ.get("DORMOUSE_CLI", "dormouse")
# The page's viewport origin on the screen (screen pixels).
OX, OY = (int(v) for v in os.environ.get("ORIGIN", "0,0").split(","))
SAMPLE = "Grüße, 世界 ✓ — ¿qué? «ok»"

failures = []


def check(cond, what):
    """Records a failed check (and goes on, so one run shows them all)."""
    if cond:
        print(f"ok   {what}", flush=True)
    else:
        print(f"FAIL {what}", flush=True)
        failures.append(what)


def done():
    if failures:
        print(f"{len(failures)} checks failed: {failures}", flush=True)
        sys.exit(1)
    print("all checks passed", flush=True)


def docker(*args):
    return subprocess.run(["docker", *args], capture_output=True, text=True, timeout=60)


def page_state():
    """The witness page's state, from its window title (`S:<json>`)."""
    out = docker(
        "exec", "-u", "1000:1000", "-e", "DISPLAY=:1", CONTAINER,
        "sh", "-c", "xdotool getwindowname $(xdotool getactivewindow)",
    )
    title = out.stdout.strip()
    if not title.startswith("S:"):
        return {"title": title, "error": out.stderr.strip()}
    return json.loads(urllib.parse.unquote(title[2:]))


def page_text():
    return page_state().get("t")


def wait_for(pred, seconds=20.0):
    import time

    end = time.monotonic() + seconds
    while True:
        state = page_state()
        if pred(state) or time.monotonic() > end:
            return state
        time.sleep(0.1)


def container_state(name):
    """`Status StartedAt` of a container, from the engine itself."""
    out = docker("inspect", "--format", "{{.State.Status}} {{.State.StartedAt}}", name)
    return out.stdout.strip()


def png_size(data):
    if data[:8] != b"\x89PNG\r\n\x1a\n" or data[12:16] != b"IHDR":
        return None
    return struct.unpack(">II", data[16:24])


def b64png_size(text):
    return png_size(base64.b64decode(text))
