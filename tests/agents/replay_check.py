"""Replays a recorded transcript of each vendor's tool calls, parsed with
the vendor's own SDK types, through the example loops' own `dispatch`
(docs/examples), against the real desktop. Run by tests/tests/agents.rs."""

import json
import os

from anthropic.types.beta import BetaMessage
from openai.types.responses import Response

import anthropic_loop
import openai_loop
from common import CONTAINER, DESK, GEN, TOKEN, URL, b64png_size, check, done, wait_for
from dormouse_desktop import Desktop

HERE = os.path.dirname(os.path.abspath(__file__))


def fixture(name):
    with open(os.path.join(HERE, "fixtures", name), encoding="utf-8") as f:
        return json.load(f)


def main():
    desktop = Desktop(url=URL, token=TOKEN, desktop=DESK, generation=GEN)

    replies = [BetaMessage.model_validate(m) for m in fixture("anthropic_transcript.json")]
    results = []
    for reply in replies:
        for block in reply.content:
            if block.type == "tool_use":
                results.append((block, anthropic_loop.dispatch(desktop, block)))
    check(len(results) == 6, f"six recorded tool calls replayed ({len(results)})")
    for block, result in results:
        check(result["tool_use_id"] == block.id and not result["is_error"],
              f"{block.input['action']}: {str(result)[:160]}")
    first = results[0][1]["content"][0]
    check(first["type"] == "image" and b64png_size(first["source"]["data"]) == (1024, 640),
          "the screenshot's tool_result is an image of the declared size")
    zoom = results[-1][1]["content"][0]
    check(zoom["type"] == "image" and b64png_size(zoom["source"]["data"]) == (640, 200),
          f"zoom answers the region at native resolution ({b64png_size(zoom['source']['data'])})")
    want = "Grüße aus dem Protokoll ✓ 世界"
    state = wait_for(lambda s: s.get("t") == want)
    check(state.get("t") == want, f"the anthropic transcript typed its text: {state}")

    responses = [Response.model_validate(r) for r in fixture("openai_transcript.json")]
    outputs = []
    for response in responses:
        for item in response.output:
            if item.type == "computer_call":
                outputs.append(openai_loop.dispatch(desktop, item))
    check(len(outputs) == 4, f"four recorded computer_calls replayed ({len(outputs)})")
    for out in outputs:
        url = out["output"]["image_url"]
        check(out["type"] == "computer_call_output" and url.startswith("data:image/png;base64,"),
              f"{out['call_id']} has a computer_screenshot output")
    want = "Bonjour depuis la transcription ✓ 世界"
    state = wait_for(lambda s: s.get("t") == want)
    check(state.get("t") == want, f"the openai transcript replaced the text: {state}")
    state = wait_for(lambda s: (s.get("wy") or 0) > 0)
    check((state.get("wy") or 0) > 0, f"the recorded scroll reached the page: {state.get('wy')}")
    done()


if __name__ == "__main__":
    main()
