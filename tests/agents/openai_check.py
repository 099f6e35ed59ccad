"""The OpenAI Responses computer-action dialect, with the action objects
built from the official `openai` package's own pydantic types, serialised
as that package serialises them, and sent as `openai_actions`. Run by
tests/tests/agents.rs (see common.py for the environment)."""

import base64
import json

import httpx2
from openai.types.responses.response_computer_tool_call import (
    ActionClick, ActionDrag, ActionDragPath, ActionKeypress, ActionMove,
    ActionScreenshot, ActionType, ActionWait,
)

from common import (
    DESK, GEN, OX, OY, SAMPLE, TOKEN, URL, check, done, page_state, page_text, png_size,
    wait_for,
)

SPACE = (1024, 640)
HEADERS = {"Authorization": f"Bearer {TOKEN}", "Dormouse-Generation": GEN}


def to_space(x, y):
    return x * SPACE[0] // 1280, y * SPACE[1] // 800


def send(actions, raw=None):
    body = raw if raw is not None else json.dumps({
        "openai_actions": [a.model_dump(mode="json") for a in actions],
        "scale": {"width": SPACE[0], "height": SPACE[1]},
    })
    r = httpx2.post(f"{URL}/v1/computers/{DESK}/actions", content=body,
                    headers={**HEADERS, "Content-Type": "application/json"}, timeout=120)
    return r.status_code, r.json() if r.headers.get("content-type", "").startswith("application/json") else r.text


def main():
    tx, ty = to_space(OX + 200, OY + 100)
    status, answer = send([
        ActionClick(type="click", button="left", x=tx, y=ty),
        ActionKeypress(type="keypress", keys=["CTRL", "A"]),
        ActionKeypress(type="keypress", keys=["BACKSPACE"]),
        ActionType(type="type", text=SAMPLE),
        ActionScreenshot(type="screenshot"),
    ])
    check(status == 200, f"a batch of the package's actions is accepted ({status} {str(answer)[:200]})")
    state = wait_for(lambda s: s.get("t") == SAMPLE)
    check(state.get("t") == SAMPLE, f"click + keypress + type put the exact text in the page: {state}")
    shot = answer["results"][-1] if status == 200 else {}
    out = shot.get("output") or {}
    check(out.get("type") == "computer_screenshot", "the screenshot carries a computer_call_output image")
    url = out.get("image_url", "")
    check(url.startswith("data:image/png;base64,"), "its image_url is a PNG data URL")
    check(png_size(base64.b64decode(url.split(",", 1)[-1] or "")) == SPACE, "at the declared size")
    check(shot.get("openai_index") == 4, "results name the dialect action they belong to")

    # keypress CTRL+A selects everything: typing replaces it.
    status, _ = send([ActionKeypress(type="keypress", keys=["CTRL", "A"]),
                      ActionType(type="type", text="x")])
    state = wait_for(lambda s: s.get("t") == "x")
    check(status == 200 and state.get("t") == "x", f"keypress CTRL+A selected all the text: {state}")

    # A drag along a path over the page's drop zone (#d at 500..620 px).
    a, b, c = to_space(OX + 100, OY + 540), to_space(OX + 300, OY + 560), to_space(OX + 500, OY + 580)
    status, answer = send([
        ActionMove(type="move", x=a[0], y=a[1]),
        ActionDrag(type="drag", path=[ActionDragPath(x=p[0], y=p[1]) for p in (a, b, c)]),
        ActionWait(type="wait"),
    ])
    state = wait_for(lambda s: s.get("up") is not None)
    check(status == 200, f"the drag is accepted ({status})")
    down, up = state.get("down"), state.get("up")
    check(down is not None and up is not None and (state.get("moved") or 0) >= 1,
          f"the page saw the button go down, move held, and come up: {state}")
    if down and up:
        check(abs(down[0] - 100) <= 2 and abs(up[0] - 500) <= 2,
              f"from the path's first point to its last: {down} -> {up}")

    # Bad input: a clear 4xx naming the dialect's index, nothing runs.
    before = page_text()
    keys = ActionKeypress(type="keypress", keys=["A"] * 1000)
    status, answer = send([ActionType(type="type", text="nope"), keys])
    check(status == 400 and "openai_actions[1] (keypress)" in str(answer), f"1000 keys: {status} {answer}")
    status, answer = send([ActionType(type="type", text="nope"),
                           ActionClick(type="click", button="left", x=SPACE[0], y=3)])
    check(status == 400 and "openai_actions[1] (click)" in str(answer) and "outside" in str(answer),
          f"off-space: {status} {answer}")
    raw = json.dumps({"openai_actions": [{"type": "type", "text": "nope"}, {"type": "fly"}]})
    status, answer = send(None, raw=raw)
    check(status == 400 and "fly" in str(answer), f"an unknown action: {status} {answer}")
    status, answer = send([ActionType(type="type", text="y" * (2 * 1024 * 1024))])
    check(status in (400, 413) and ("large" in str(answer) or "bytes" in str(answer)), f"2 MiB text: {status} {str(answer)[:160]}")
    stale = {**HEADERS, "Dormouse-Generation": str(int(GEN) - 1), "Content-Type": "application/json"}
    r = httpx2.post(f"{URL}/v1/computers/{DESK}/actions", headers=stale, timeout=60,
                    content=json.dumps({"openai_actions": [{"type": "type", "text": "stale"}]}))
    check(r.status_code == 409 and "stale_generation" in r.text, f"a stale generation: {r.status_code}")
    check(page_text() == before, "nothing of the refused batches ran")
    done()


if __name__ == "__main__":
    main()
