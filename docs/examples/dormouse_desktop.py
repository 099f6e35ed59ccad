"""The one call both example loops make: a batch of actions to
`POST /v1/computers/{id}/actions` of a Dormouse broker (standard library
only). Configured by DORMOUSE_URL, DORMOUSE_TOKEN, DORMOUSE_DESKTOP (an id)
and, with a lease, DORMOUSE_GENERATION."""

import json
import os
import urllib.error
import urllib.request


class Desktop:
    def __init__(self, url=None, token=None, desktop=None, generation=None):
        self.url = (url or os.environ.get("DORMOUSE_URL", "http://127.0.0.1:7480")).rstrip("/")
        self.token = token or os.environ["DORMOUSE_TOKEN"]
        self.desktop = desktop or os.environ["DORMOUSE_DESKTOP"]
        self.generation = generation or os.environ.get("DORMOUSE_GENERATION")

    def actions(self, body):
        """Runs a batch; answers (status, JSON answer)."""
        headers = {"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"}
        if self.generation:
            headers["Dormouse-Generation"] = str(self.generation)
        request = urllib.request.Request(
            f"{self.url}/v1/computers/{self.desktop}/actions",
            data=json.dumps(body).encode(), headers=headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=120) as r:
                return r.status, json.load(r)
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"{}")
