"""A minimal agent loop: the OpenAI Responses API's computer tool on a
Dormouse desktop, with the official `openai` SDK.

    export OPENAI_API_KEY=... DORMOUSE_TOKEN=... DORMOUSE_DESKTOP=<id>
    python docs/examples/openai_loop.py "Open a terminal and run uname -a"

A `computer_call`'s actions go unchanged to the desktop as
`openai_actions`, with a screenshot after them; the answer's
`computer_screenshot` is the `computer_call_output`. `dispatch` is all the
glue there is.
"""

import sys

from dormouse_desktop import Desktop

WIDTH, HEIGHT = 1024, 640
MODEL = "computer-use-preview"
TOOL = {"type": "computer_use_preview", "display_width": WIDTH, "display_height": HEIGHT,
        "environment": "linux"}


def dispatch(desktop, call):
    """One `computer_call` item (the SDK's object or its dict) -> its
    `computer_call_output` item."""
    item = call if isinstance(call, dict) else call.model_dump(mode="json")
    actions = item.get("actions") or [item["action"]]
    batch = [a for a in actions if a.get("type") != "screenshot"] + [{"type": "screenshot"}]
    status, answer = desktop.actions({"openai_actions": batch,
                                      "scale": {"width": WIDTH, "height": HEIGHT}})
    if status != 200:
        raise RuntimeError(answer.get("message", f"HTTP {status}"))
    last = answer["results"][-1]
    if not last["ok"]:
        raise RuntimeError(last["error"]["message"])
    return {"type": "computer_call_output", "call_id": item["call_id"], "output": last["output"],
            "acknowledged_safety_checks": item.get("pending_safety_checks") or []}


def run(task, desktop=None, max_turns=50):
    from openai import OpenAI

    client, desktop = OpenAI(), desktop or Desktop()
    response = client.responses.create(model=MODEL, tools=[TOOL], truncation="auto",
                                       input=[{"role": "user", "content": task}])
    for _ in range(max_turns):
        calls = [o for o in response.output if o.type == "computer_call"]
        print(response.output_text)
        if not calls:
            return response
        response = client.responses.create(model=MODEL, tools=[TOOL], truncation="auto",
                                           previous_response_id=response.id,
                                           input=[dispatch(desktop, c) for c in calls])
    return None


if __name__ == "__main__":
    run(" ".join(sys.argv[1:]) or "Take a screenshot and describe the desktop.")
