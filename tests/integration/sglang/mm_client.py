"""Helpers of the multimodal end-to-end tests: the plain / SAGE server pair, OpenAI chat requests, their answers and
status codes, and the KV pool's return to its starting size.

``launch_pair(env, logs, config, target, draft, *extra)`` starts, side by side, a plain server (the YAML's
non-speculative flags) and a SAGE server (the YAML, ``draft`` and ``extra`` flags) on ``target``; logs go to
``logs/plain.log`` and ``logs/sage.log``.  ``serving_pair`` is the same for a fixture: it yields ``(plain, sage)`` and
stops both.  ``bad_media(plain, sage, part)`` sends one broken medium (an OpenAI content part) and then a text
request to both servers: ``(status, body, sage's answer, plain's answer)``.

``chat(server, messages)`` posts a greedy ``/v1/chat/completions`` request (``max_tokens`` 24 unless given) and
returns the JSON reply; ``answer(reply)`` is ``(text, completion_tokens)``, what two servers must agree on;
``post_status`` returns ``(HTTP status, body)`` instead of raising on a 4xx (a bad image or video must be a 400).
"""

from __future__ import annotations

import contextlib
import json
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

__all__ = ["NEW_TOKENS", "answer", "bad_media", "chat", "kv_returns", "launch_pair", "post_status", "serving_pair"]

NEW_TOKENS = 24


def launch_pair(env: dict[str, str], logs: Path, config: Path, target: Path, draft: Path, *extra: str) -> list:
    from sage_plugin.bench.serving import plain_flags

    from .conftest import launch_servers

    return launch_servers(
        env,
        (["--model-path", str(target), *plain_flags(config)], logs / "plain.log"),
        (["--config", str(config), "--model-path", str(target), "--speculative-draft-model-path", str(draft), *extra],
         logs / "sage.log"),
    )  # fmt: skip


def serving_pair(env: dict[str, str], logs: Path, config: Path, target: Path, draft: Path, *extra: str):
    plain, sage = launch_pair(env, logs, config, target, draft, *extra)
    yield plain, sage
    sage.stop()
    plain.stop()


def bad_media(plain: Any, sage: Any, part: dict) -> tuple[int, str, tuple[str, int], tuple[str, int]]:
    payload = {"model": "default", "max_tokens": 4, "temperature": 0,
               "messages": [{"role": "user", "content": [part, {"type": "text", "text": "What is this?"}]}]}  # fmt: skip
    status, body = post_status(sage, payload)
    hello = [{"role": "user", "content": "Say hello."}]
    return status, body, answer(chat(sage, hello, max_tokens=8)), answer(chat(plain, hello, max_tokens=8))


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
    SAGE part of ``/server_info`` last read (the caller asserts on it).  SGLang refuses a flush (400) while a finished
    request is still being released, so the flush is retried until the pool is back or ``timeout`` passes."""
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(urllib.error.HTTPError):
            server.post("/flush_cache", {})
        info = server.get("/server_info")["internal_states"][0]["sage"]
        if info["kv_available_tokens"] == kv_start or time.monotonic() > deadline:
            return info
        time.sleep(1)
