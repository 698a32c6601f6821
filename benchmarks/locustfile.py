"""Locust users for benchmarks/load_test.py: streaming completions against the OpenAI API.

Locust's own row "completion" times a streamed request only to its response headers, so each
request reports three more rows through Locust's event hook (its CSV carries them): "e2e" (to
the last frame), "ttft" (to the first text frame) and "itl" (mean gap between text frames).
Environment: LOAD_MODEL (served name), LOAD_MAX_TOKENS, LOAD_PROMPT.
"""

from __future__ import annotations

import json
import os
import time

from locust import HttpUser, constant, task

MODEL = os.environ.get("LOAD_MODEL", "tiny")
MAX_TOKENS = int(os.environ.get("LOAD_MAX_TOKENS", "32"))
PROMPT = os.environ.get("LOAD_PROMPT", "def main(): return")


class CompletionUser(HttpUser):
    wait_time = constant(0)

    @task
    def stream_completion(self) -> None:
        body = {
            "model": MODEL,
            "prompt": PROMPT,
            "max_tokens": MAX_TOKENS,
            "ignore_eos": True,
            "temperature": 0,
            "stream": True,
        }
        start = time.perf_counter()
        stamps: list[float] = []
        with self.client.post(
            "/v1/completions", json=body, stream=True, catch_response=True, name="completion"
        ) as resp:
            if resp.status_code != 200:
                resp.failure(f"HTTP {resp.status_code}")
                return
            for line in resp.iter_lines():
                if not line or not line.startswith(b"data: ") or line == b"data: [DONE]":
                    continue
                frame = json.loads(line[6:])
                if "error" in frame:
                    resp.failure(frame["error"]["message"])
                    return
                if frame.get("choices") and frame["choices"][0].get("text"):
                    stamps.append(time.perf_counter())
            resp.success()
        self._report("e2e", (time.perf_counter() - start) * 1000)
        if stamps:
            self._report("ttft", (stamps[0] - start) * 1000)
        if len(stamps) > 1:
            self._report("itl", (stamps[-1] - stamps[0]) / (len(stamps) - 1) * 1000)

    def _report(self, name: str, ms: float) -> None:
        self.environment.events.request.fire(
            request_type="METRIC",
            name=name,
            response_time=ms,
            response_length=0,
            exception=None,
            context={},
        )
