"""``sage bench-serving``: SGLang serving with SAGE against plain SGLang serving, side by side in one run.

Two ``python -m sglang.launch_server`` processes run at once (each in its own process group, on 127.0.0.1): plain
decoding (the SAGE config's flags minus the speculative ones) and SAGE (``--config`` YAML plus target and draft).
For each batch size B the same B prompts (bundled MT-Bench / GSM8K / HumanEval, the bundled image prompts, or a
prompt file; chat template applied, images as base64 ``image_data``) are sent concurrently, greedy, ``max_new_tokens`` each, to one server then the other, alternating which goes first per
repeat, so machine noise hits both alike.  Reported per batch size: output tokens/s of each (completion tokens
over the wall time of the batch, prefill included), the ratio, SGLang's mean ``spec_accept_length``, SAGE's
per-request means (``meta_info["sage"]``), and whether every output equals plain decoding token for token.

Needs SGLang 0.5.23 in the running interpreter (``tools/setup.sh --sglang``); on a machine without an NVIDIA
driver the launch environment gets the user-space libcuda that ``tools/setup_sglang.sh`` unpacked.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import yaml

from ..data.prompts import Prompt, image_data_url, multimodal_messages, render_chat
from ..models import load_tokenizer

__all__ = ["SERVER_START_TIMEOUT_S", "Server", "parallel", "plain_flags", "run_serving_bench", "serving_requests"]

SERVER_START_TIMEOUT_S = 420
#: SGLang flags (YAML keys) that belong to speculative decoding: dropped from the plain server's flags
SPEC_KEY_PREFIXES = ("speculative-", "sage-")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A ``sglang.launch_server`` child in its own process group, with a tiny JSON client.

    Blocks until ``/health`` answers and the log says the server is ready; raises ``RuntimeError`` with the log's
    tail if the process exits or ``timeout`` seconds pass.  :meth:`stop` tears the whole group down.
    """

    def __init__(self, args: list[str], env: dict[str, str], log: Path, cwd: Path | None = None,
                 timeout: float = SERVER_START_TIMEOUT_S) -> None:  # fmt: skip
        self.port = _free_port()
        self.log = log
        self.argv = [sys.executable, "-m", "sglang.launch_server", *args, "--host", "127.0.0.1",
                     "--port", str(self.port)]  # fmt: skip
        self._fh = open(log, "w")  # noqa: SIM115 (closed in stop)
        self.proc = subprocess.Popen(self.argv, env=env, cwd=cwd, stdout=self._fh, stderr=subprocess.STDOUT,
                                     start_new_session=True)  # fmt: skip
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                self._fh.close()
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{log.read_text()[-4000:]}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=5) as r:
                    if r.status == 200 and "fired up" in log.read_text():
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"server not ready in {timeout} s:\n{log.read_text()[-4000:]}")
            time.sleep(2)

    def post(self, path: str, payload: dict, timeout: float = 900) -> dict:
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", data=json.dumps(payload).encode(),
                                     headers={"Content-Type": "application/json"})  # fmt: skip
        with urllib.request.urlopen(req, timeout=timeout) as r:
            body = r.read()
        try:
            return json.loads(body) if body else {}
        except ValueError:  # e.g. /flush_cache answers in plain text
            return {"text": body.decode()}

    def get(self, path: str) -> dict:
        return json.loads(self.get_text(path))

    def get_text(self, path: str) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=60) as r:
            return r.read().decode()

    def generate(self, text: str, max_new_tokens: int, **extra: Any) -> dict:
        params = {"max_new_tokens": max_new_tokens, "temperature": 0.0}
        return self.post("/generate", {"text": text, "sampling_params": params, **extra})

    def stop(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        if not self._fh.closed:
            self._fh.close()


def parallel(fn: Callable[[Any], Any], items: list) -> list:
    """``[fn(x) for x in items]``, all at once in threads (concurrent requests); results in input order."""
    out: list = [None] * len(items)

    def work(i: int, item: Any) -> None:
        out[i] = fn(item)

    threads = [threading.Thread(target=work, args=(i, it)) for i, it in enumerate(items)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def plain_flags(config: Path) -> list[str]:
    """The non-speculative flags of an SGLang ``--config`` YAML, as command-line arguments."""
    data = yaml.safe_load(config.read_text()) or {}
    argv: list[str] = []
    for key, value in data.items():
        if key.startswith(SPEC_KEY_PREFIXES) or value is None or value is False:
            continue
        argv.append(f"--{key}")
        if value is not True:
            argv.append(str(value))
    return argv


@dataclass
class _Side:
    tokens: int = 0
    seconds: float = 0.0
    accept: list[float] = field(default_factory=list)
    sage: list[dict] = field(default_factory=list)


def serving_requests(prompts: list[Prompt], target: Path) -> list[dict[str, Any]]:
    """``/generate`` payloads (``text`` and, for a prompt with an image, ``image_data``) of ``prompts``.

    The text is the prompt rendered by the target's own chat template: its tokenizer's for text prompts, its
    processor's (with the image placeholder where the image goes) for image prompts.
    """
    from transformers import AutoProcessor

    tok = load_tokenizer(target)
    processor = AutoProcessor.from_pretrained(str(target)) if any(p.image for p in prompts) else None
    out = []
    for p in prompts:
        if p.image is None:
            out.append({"text": tok.decode(render_chat(tok, p))})
            continue
        text = processor.apply_chat_template(multimodal_messages(p), add_generation_prompt=True, tokenize=False)
        out.append({"text": text, "image_data": [image_data_url(p.image)]})
    return out


def _run_batch(server: Server, requests: list[dict], max_new_tokens: int, side: _Side) -> list[list[int]]:
    t0 = time.perf_counter()
    params = {"max_new_tokens": max_new_tokens, "temperature": 0.0}
    out = parallel(lambda r: server.post("/generate", {**r, "sampling_params": params}), requests)
    side.seconds += time.perf_counter() - t0
    for o in out:
        meta = o["meta_info"]
        side.tokens += meta["completion_tokens"]
        if meta.get("spec_accept_length") is not None:
            side.accept.append(meta["spec_accept_length"])
        side.sage.extend(meta.get("sage") or [])
    return [o["output_ids"] for o in out]


def run_serving_bench(*, config: Path, target: Path, draft: Path, env: dict[str, str], log_dir: Path,
                      batch_sizes: list[int], max_new_tokens: int, repeats: int,
                      requests: list[dict[str, Any]]) -> dict[str, Any]:  # fmt: skip
    """Launch both servers, measure every batch size ``repeats`` times, stop both; returns the report dict.

    ``requests`` are ``/generate`` payloads without sampling parameters (:func:`serving_requests`).
    """
    log_dir.mkdir(parents=True, exist_ok=True)
    plain = Server(["--model-path", str(target), *plain_flags(config)], env, log_dir / "plain.log")
    try:
        sage = Server(["--config", str(config), "--model-path", str(target), "--speculative-draft-model-path",
                       str(draft)], env, log_dir / "sage.log")  # fmt: skip
    except BaseException:
        plain.stop()
        raise
    rows = []
    try:
        for server in (plain, sage):  # warm-up: first requests pay one-off costs
            parallel(lambda r, s=server: s.post("/generate", {**r, "sampling_params": {"max_new_tokens": 8}}),
                     requests[:2])  # fmt: skip
        for bs in batch_sizes:
            sides = {"plain": _Side(), "sage": _Side()}
            same = True
            for r in range(repeats):
                batch = [requests[(r * bs + i) % len(requests)] for i in range(bs)]
                order = [("plain", plain), ("sage", sage)] if r % 2 == 0 else [("sage", sage), ("plain", plain)]
                outs = {name: _run_batch(server, batch, max_new_tokens, sides[name]) for name, server in order}
                same &= outs["plain"] == outs["sage"]
            p, s = sides["plain"], sides["sage"]
            p_tps, s_tps = p.tokens / p.seconds, s.tokens / s.seconds
            rows.append({
                "batch_size": bs, "plain_tok_s": p_tps, "sage_tok_s": s_tps, "speedup": s_tps / p_tps,
                "sage_accept_length": statistics.fmean(s.accept) if s.accept else None,
                "sage_mean_alpha": statistics.fmean(x["mean_alpha"] for x in s.sage) if s.sage else None,
                "sage_mean_depth": statistics.fmean(x["mean_depth"] for x in s.sage) if s.sage else None,
                "sage_mean_width": statistics.fmean(x["mean_width"] for x in s.sage) if s.sage else None,
                "identical_outputs": same, "requests": repeats * bs,
            })  # fmt: skip
        info = sage.get("/server_info")
    finally:
        sage.stop()
        plain.stop()
    return {"rows": rows, "speculative_algorithm": info.get("speculative_algorithm"),
            "config": str(config), "target": str(target), "draft": str(draft), "max_new_tokens": max_new_tokens}  # fmt: skip


def format_table(report: dict[str, Any]) -> str:
    """Markdown table of :func:`run_serving_bench`'s report."""
    lines = [
        f"SGLang serving, {report['speculative_algorithm']} vs plain, greedy, {report['max_new_tokens']} new tokens "
        f"per request (draft: {report['draft']})",
        "",
        "| batch | plain tok/s | SAGE tok/s | speed-up | accept length | mean alpha | mean D | mean W | identical |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|:---:|",
    ]

    def f(x: float | None, fmt: str = ".2f") -> str:
        return "-" if x is None else format(x, fmt)

    for r in report["rows"]:
        lines.append(
            f"| {r['batch_size']} | {r['plain_tok_s']:.1f} | {r['sage_tok_s']:.1f} | {r['speedup']:.2f}x | "
            f"{f(r['sage_accept_length'])} | {f(r['sage_mean_alpha'])} | {f(r['sage_mean_depth'])} | "
            f"{f(r['sage_mean_width'])} | {'yes' if r['identical_outputs'] else 'NO'} |"
        )
    return "\n".join(lines)
