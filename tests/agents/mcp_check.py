"""The official MCP Python SDK against Dormouse's MCP server, over
streamable HTTP (`python mcp_check.py http`) or over `dormouse mcp` stdio
(`python mcp_check.py stdio`). Run by tests/tests/agents.rs, which starts
the broker and the desktops and sets the environment (see common.py)."""

import asyncio
import base64
import contextlib
import json
import os
import sys

import httpx2
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client

from common import (
    CLI, CONTAINER, DESK, GEN, OX, OY, SAMPLE, STALE_GEN, STOPPED, STOPPED_CONTAINER,
    TOKEN, URL, b64png_size, check, container_state, done, page_text, wait_for,
)

MODE = sys.argv[1] if len(sys.argv) > 1 else "http"
# The published actions and fields of the vendor's computer_20251124 tool.
PUBLISHED_ACTIONS = [
    "key", "hold_key", "type", "cursor_position", "mouse_move", "left_mouse_down",
    "left_mouse_up", "left_click", "left_click_drag", "right_click", "middle_click",
    "double_click", "triple_click", "scroll", "wait", "screenshot", "zoom",
]
PUBLISHED_FIELDS = {
    "action", "coordinate", "start_coordinate", "text", "duration",
    "scroll_direction", "scroll_amount", "region",
}
TOOLS = {
    "computer", "shell", "read_file", "write_file", "list_files", "desktops",
    "create_desktop", "start_desktop", "stop_desktop", "screen_link",
    "clipboard_get", "clipboard_set",
}
# stdio declares a scaled space; HTTP uses the default (the 1280x800 screen).
SPACE = (1024, 640) if MODE == "stdio" else (1280, 800)


def to_space(x, y):
    """A screen point in the declared space (the inverse of the rule)."""
    return [x * SPACE[0] // 1280, y * SPACE[1] // 800]


class Session:
    """One MCP client session over the mode's transport."""

    def __init__(self, token=TOKEN, generation=GEN, desktop=DESK, options=None):
        self.token, self.generation, self.desktop = token, generation, desktop
        # {"screenshot": "false", "format": "jpeg", "quality": "50"}: the
        # URL's query over HTTP, `dormouse mcp`'s flags over stdio.
        self.options = options or {}

    async def __aenter__(self):
        self.stack = contextlib.AsyncExitStack()
        await self.stack.__aenter__()
        try:
            if MODE == "http":
                headers = {"Authorization": f"Bearer {self.token}"}
                if self.generation:
                    headers["Dormouse-Generation"] = self.generation
                http = httpx2.AsyncClient(headers=headers, timeout=120)
                self.stack.push_async_callback(http.aclose)
                url = f"{URL}/mcp?desktop={self.desktop}"
                url += "".join(f"&{k}={v}" for k, v in self.options.items())
                transport = streamable_http_client(url, http_client=http)
            else:
                args = ["--url", URL, "mcp", "--desktop", self.desktop, "--display", "1024x640"]
                for k, v in self.options.items():
                    args += ["--no-screenshot"] if (k, v) == ("screenshot", "false") else [f"--{k}", v]
                if self.generation:
                    args = ["--generation", self.generation, *args]
                env = {"DORMOUSE_TOKEN": self.token}
                transport = stdio_client(StdioServerParameters(command=CLI, args=args, env=env))
            read, write = await self.stack.enter_async_context(transport)
            session = await self.stack.enter_async_context(ClientSession(read, write))
            init = await session.initialize()
            session.server_name = (getattr(init, "server_info", None) or init.serverInfo).name
            return session
        except BaseException:
            await self.stack.aclose()
            raise

    async def __aexit__(self, *exc):
        return await self.stack.__aexit__(*exc)


async def computer_once(**args):
    """One `computer` call in a session of its own; its text."""
    async with Session() as s:
        return texts(await computer(s, **args))


def texts(result):
    return "\n".join(c.text for c in result.content if c.type == "text")


def images(result):
    return [c for c in result.content if c.type == "image"]


async def computer(s, **args):
    return await s.call_tool("computer", args)


async def main():
    async with Session() as s:
        listed = await s.list_tools()
        names = {t.name for t in listed.tools}
        check(names == TOOLS, f"the tools are listed: {sorted(names)}")
        schema = next(t.input_schema for t in listed.tools if t.name == "computer")
        check(schema["properties"]["action"]["enum"] == PUBLISHED_ACTIONS,
              "computer's action enum is the published list")
        check(PUBLISHED_FIELDS <= set(schema["properties"]), "computer has every published field")
        check(schema.get("required") == ["action"], "only action is required")
        check(s.server_name == "dormouse", f"the server names itself dormouse: {s.server_name!r}")

        shot = await computer(s, action="screenshot")
        imgs = images(shot)
        check(len(imgs) == 1 and imgs[0].mime_type == "image/png", "screenshot is one PNG image")
        check(imgs and b64png_size(imgs[0].data) == SPACE, f"the PNG is {SPACE} ({imgs and b64png_size(imgs[0].data)})")

        pos = await computer(s, action="mouse_move", coordinate=to_space(OX + 300, OY + 150))
        check(not pos.is_error and len(images(pos)) == 1, "mouse_move answers a screenshot after it")
        pos = await computer(s, action="cursor_position")
        check(texts(pos) == "X={},Y={}".format(*to_space(OX + 300, OY + 150)), f"cursor_position: {texts(pos)}")

        target = to_space(OX + 200, OY + 100)
        await computer(s, action="left_click", coordinate=target)
        await computer(s, action="key", text="ctrl+a BackSpace")
        typed = await computer(s, action="type", text=SAMPLE)
        check(not typed.is_error, f"type: {texts(typed)}")
        state = wait_for(lambda st: st.get("t") == SAMPLE)
        check(state.get("t") == SAMPLE, f"left_click + type put the exact text in the page: {state}")

        out = await s.call_tool("shell", {"command": "id -u"})
        check(not out.is_error and "--- stdout ---\n1000\n" in texts(out), f"shell id -u is 1000: {texts(out)!r}")
        out = await s.call_tool("shell", {"command": "head -c 70000 /dev/zero | tr '\\0' x"})
        check("[stdout cut" in texts(out), "a long output is marked as cut")
        out = await s.call_tool("shell", {"command": "exit 3"})
        check(out.is_error and "exit code: 3" in texts(out), "a failing command is a tool error with its code")

        # Bad input: each refused with a clear message, nothing typed.
        before = page_text()
        bad = await computer(s, action="fly")
        check(bad.is_error and "fly" in texts(bad), f"unknown action: {texts(bad)}")
        bad = await computer(s, action="left_click", coordinate=[SPACE[0], 5])
        check(bad.is_error and "outside" in texts(bad), f"off-space coordinate: {texts(bad)}")
        bad = await computer(s, action="type", text="x" * (2 * 1024 * 1024))
        check(bad.is_error and ("bytes" in texts(bad) or "large" in texts(bad)), f"2 MiB text: {texts(bad)[:200]}")
        bad = await computer(s, action="key", text=" ".join(["a"] * 1000))
        check(bad.is_error and "keys" in texts(bad), f"1000 keys: {texts(bad)}")
        check(page_text() == before, "nothing of the refused calls ran")

        listing = await s.call_tool("desktops", {})
        check(DESK in texts(listing), "desktops lists the desktop")
        link = await s.call_tool("screen_link", {"mode": "view", "ttl": 60})
        check(not link.is_error and "/panel/screen.html#screen=" in texts(link), f"screen_link: {texts(link)[:120]}")
        put = await s.call_tool("clipboard_set", {"text": "mcp-clip-7"})
        check(not put.is_error, f"clipboard_set: {texts(put)[:120]}")
        got = await s.call_tool("clipboard_get", {})
        check(not got.is_error and texts(got) == "mcp-clip-7", f"clipboard_get: {texts(got)[:120]}")

    # The screenshot after actions turned off, and JPEG images.
    async with Session(options={"screenshot": "false", "format": "jpeg", "quality": "50"}) as s:
        moved = await computer(s, action="mouse_move", coordinate=to_space(OX + 310, OY + 160))
        check(not moved.is_error and images(moved) == [], f"with the screenshot off, mouse_move answers no image: {texts(moved)}")
        shot = images(await computer(s, action="screenshot"))
        jpeg = shot and base64.b64decode(shot[0].data)
        check(len(shot) == 1 and shot[0].mime_type == "image/jpeg" and jpeg[:3] == b"\xff\xd8\xff",
              f"a screenshot under format jpeg is one image/jpeg: {[i.mime_type for i in shot]}")
    if MODE == "http":
        async with Session(options={"screenshot": "maybe"}) as s:
            bad = await computer(s, action="mouse_move", coordinate=[5, 5])
            check(bad.is_error and "true or false" in texts(bad), f"?screenshot=maybe is a tool error: {texts(bad)}")
        pos = await computer_once(action="cursor_position")
        check(pos != "X=5,Y=5", f"the refused call moved nothing: {pos}")

    # The stopped desktop: files without starting it.
    before = container_state(STOPPED_CONTAINER)
    async with Session(generation="", desktop=STOPPED) as s:
        data = "é✓\n" * 100
        w = await s.call_tool("write_file", {"path": f"notes/{MODE}.txt", "content": data})
        check(not w.is_error, f"write_file on a stopped desktop: {texts(w)}")
        r = await s.call_tool("read_file", {"path": f"notes/{MODE}.txt"})
        check(texts(r) == data, "read_file gives the bytes back")
        blob = bytes(range(256))
        w = await s.call_tool("write_file", {"path": "blob.bin", "content": base64.b64encode(blob).decode(), "encoding": "base64"})
        r = await s.call_tool("read_file", {"path": "blob.bin", "encoding": "base64"})
        check(base64.b64decode(texts(r)) == blob, "binary bytes round-trip as base64")
        ls = await s.call_tool("list_files", {"path": "notes"})
        check(f"{MODE}.txt" in texts(ls), "list_files lists it")
        shell = await s.call_tool("shell", {"command": "true"})
        check(shell.is_error, f"shell on a stopped desktop is refused: {texts(shell)[:120]}")
    after = container_state(STOPPED_CONTAINER)
    check(before == after and not after.startswith("running"), f"the stopped desktop was never started: {before} / {after}")

    # A stale generation is refused; nothing is typed.
    before = page_text()
    async with Session(generation=STALE_GEN) as s:
        stale = await computer(s, action="type", text="stale")
        check(stale.is_error and "stale_generation" in texts(stale), f"stale generation: {texts(stale)}")
    check(page_text() == before, "the stale call typed nothing")

    # A wrong token is refused.
    if MODE == "http":
        try:
            async with Session(token="wrong") as s:
                await s.list_tools()
            check(False, "a wrong token is refused")
        except Exception as e:  # the SDK raises on the 401
            check(True, f"a wrong token is refused by the SDK session ({type(e).__name__})")
        async with httpx2.AsyncClient(timeout=30) as raw:
            r = await raw.post(f"{URL}/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
                               headers={"Authorization": "Bearer wrong", "Accept": "application/json, text/event-stream"})
            check(r.status_code == 401, f"/mcp with a wrong token is 401 ({r.status_code})")
            r = await raw.post(f"{URL}/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
                               headers={"Authorization": f"Bearer {TOKEN}", "Host": "evil.example:80",
                                        "Accept": "application/json, text/event-stream"})
            check(r.status_code in (400, 403), f"/mcp with a foreign Host is refused ({r.status_code})")
            before = page_text()
            r = await raw.post(
                f"{URL}/mcp",
                content=json.dumps({"jsonrpc": "2.0", "id": {"not": "an id"}, "method": "tools/call",
                                    "params": {"name": "computer", "arguments": {"action": "type", "text": "bad-id"}}}),
                headers={"Authorization": f"Bearer {TOKEN}", "Dormouse-Generation": GEN,
                         "Content-Type": "application/json", "Accept": "application/json, text/event-stream"})
            check(r.status_code >= 400 or "error" in r.text, f"a malformed JSON-RPC id is an error ({r.status_code} {r.text[:160]})")
            check(page_text() == before, "the malformed call typed nothing")
    else:
        async with Session(token="wrong") as s:
            denied = await s.call_tool("desktops", {})
            check(denied.is_error and "unauthorized" in texts(denied), f"a wrong token is refused: {texts(denied)}")
        await malformed_id_over_stdio()
    done()


async def malformed_id_over_stdio():
    """A request whose id is an object: an error answer, nothing typed."""
    before = page_text()
    proc = await asyncio.create_subprocess_exec(
        CLI, "--url", URL, "--generation", GEN, "mcp", "--desktop", DESK,
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        env={**os.environ, "DORMOUSE_TOKEN": TOKEN})
    init = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "raw", "version": "1"}}}
    lines = [init, {"jsonrpc": "2.0", "method": "notifications/initialized"},
             {"jsonrpc": "2.0", "id": {"not": "an id"}, "method": "tools/call",
              "params": {"name": "computer", "arguments": {"action": "type", "text": "bad-id"}}},
             {"jsonrpc": "2.0", "id": 3, "method": "tools/list"}]
    for line in lines:
        proc.stdin.write((json.dumps(line) + "\n").encode())
    await proc.stdin.drain()
    answers = []
    try:
        while len(answers) < 3:
            raw = await asyncio.wait_for(proc.stdout.readline(), 15)
            if not raw:
                break
            answers.append(json.loads(raw))
    except asyncio.TimeoutError:
        pass
    proc.stdin.close()
    try:
        await asyncio.wait_for(proc.wait(), 10)
    except asyncio.TimeoutError:
        proc.kill()
    ids = [a.get("id") for a in answers]
    check(1 in ids and 3 in ids, f"the server answers around a malformed id: {ids}")
    check(any("error" in a for a in answers) or len(answers) == 2, f"the malformed id gets an error or nothing: {answers[-1:]}")
    check(page_text() == before, "the malformed call typed nothing")


if __name__ == "__main__":
    asyncio.run(main())
