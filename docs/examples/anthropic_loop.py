"""A minimal agent loop: Claude's `computer` tool (computer_20251124) on a
Dormouse desktop, with the official `anthropic` SDK.

    export ANTHROPIC_API_KEY=... DORMOUSE_TOKEN=... DORMOUSE_DESKTOP=<id>
    python docs/examples/anthropic_loop.py "Open a terminal and run uname -a"

Each tool call's `input` is forwarded unchanged as one action of a batch,
with a screenshot appended after actions that change the screen; the
answer becomes the `tool_result`. `dispatch` is all the glue there is.
"""

import sys

from dormouse_desktop import Desktop

WIDTH, HEIGHT = 1024, 640
MODEL = "claude-sonnet-4-5"
TOOL = {"type": "computer_20251124", "name": "computer",
        "display_width_px": WIDTH, "display_height_px": HEIGHT}
BETA = "computer-use-2025-11-24"
STILL = {"screenshot", "zoom", "cursor_position"}


def dispatch(desktop, tool_use):
    """One `tool_use` block (the SDK's object or its dict) -> its `tool_result`."""
    block = tool_use if isinstance(tool_use, dict) else tool_use.model_dump()
    action = dict(block["input"])
    batch = [action] if action.get("action") in STILL else [action, {"action": "screenshot"}]
    status, answer = desktop.actions({"actions": batch, "scale": {"width": WIDTH, "height": HEIGHT}})
    if status != 200:
        return {"type": "tool_result", "tool_use_id": block["id"], "is_error": True,
                "content": [{"type": "text", "text": answer.get("message", f"HTTP {status}")}]}
    content, error = [], False
    for result in answer["results"]:
        if not result["ok"]:
            error = True
            content.append({"type": "text", "text": result["error"]["message"]})
        elif "image" in result:
            content.append({"type": "image", "source": {"type": "base64",
                            "media_type": result["image"]["media_type"],
                            "data": result["image"]["data"]}})
        elif "coordinate" in result:
            x, y = result["coordinate"]
            content.append({"type": "text", "text": f"X={x},Y={y}"})
    if not content:
        content.append({"type": "text", "text": "done"})
    return {"type": "tool_result", "tool_use_id": block["id"], "content": content, "is_error": error}


def run(task, desktop=None, max_turns=50):
    import anthropic

    client, desktop = anthropic.Anthropic(), desktop or Desktop()
    messages = [{"role": "user", "content": task}]
    for _ in range(max_turns):
        reply = client.beta.messages.create(model=MODEL, max_tokens=4096, tools=[TOOL],
                                            betas=[BETA], messages=messages)
        messages.append({"role": "assistant", "content": reply.content})
        calls = [b for b in reply.content if b.type == "tool_use"]
        for b in reply.content:
            if b.type == "text":
                print(b.text)
        if not calls:
            return reply
        messages.append({"role": "user", "content": [dispatch(desktop, c) for c in calls]})
    return None


if __name__ == "__main__":
    run(" ".join(sys.argv[1:]) or "Take a screenshot and describe the desktop.")
