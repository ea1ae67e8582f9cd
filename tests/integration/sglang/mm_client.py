"""Client helpers of the multimodal end-to-end tests: OpenAI chat requests, their answers and status codes, and the
KV pool's return to its starting size.

``chat(server, messages)`` posts a greedy ``/v1/chat/completions`` request (``max_tokens`` 24 unless given) and
returns the JSON reply; ``answer(reply)`` is ``(text, completion_tokens)``, what two servers must agree on;
``post_status`` returns ``(HTTP status, body)`` instead of raising on a 4xx (a bad image or video must be a 400).
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from typing import Any

__all__ = ["NEW_TOKENS", "answer", "chat", "kv_returns", "post_status"]

NEW_TOKENS = 24


def chat(server: Any, messages: list[dict], max_tokens: int = NEW_TOKENS) -> dict:
    payload = {"model": "default", "messages": messages, "max_tokens": max_tokens, "temperature": 0}
    return server.post("/v1/chat/completions", payload)


def answer(reply: dict) -> tuple[str, int]:
    return reply["choices"][0]["message"]["content"], reply["usage"]["completion_tokens"]


def post_status(server: Any, payload: dict, path: str = "/v1/chat/completions") -> tuple[int, str]:
    req = urllib.request.Request(f"http://127.0.0.1:{server.port}{path}", data=json.dumps(payload).encode(),
                                 headers={"Content-Type": "application/json"})  # fmt: skip
    try:
        with urllib.request.urlopen(req, timeout=300) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def kv_returns(server: Any, kv_start: int, timeout: float = 60) -> dict:
    """Flush the radix cache and wait until the SAGE server's free KV tokens are back at ``kv_start``; returns the
    SAGE part of ``/server_info`` last read (the caller asserts on it)."""
    server.post("/flush_cache", {})
    deadline = time.monotonic() + timeout
    while True:
        info = server.get("/server_info")["internal_states"][0]["sage"]
        if info["kv_available_tokens"] == kv_start or time.monotonic() > deadline:
            return info
        time.sleep(1)
