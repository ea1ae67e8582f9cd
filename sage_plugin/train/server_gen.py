"""The target's greedy answers from an SGLang server already serving it (``sage train-draft --gen-url URL``).

In-process generation (:func:`sage_plugin.train.labels.greedy_generate`, HF ``generate`` over left-padded batches)
pays for padding and for every finished row until its batch's longest answer ends; SGLang batches continuously
(each answered prompt lets one new prompt in, so prefills of one prompt interleave with the decode steps), which on
a CPU generates answers nearly twice as fast.

Every prompt is one ``POST /generate`` (``input_ids``, temperature 0), ``concurrency`` in flight; the answers of
a shard are handed to its ``save`` callback as soon as the shard's last prompt returns, so an interrupted run keeps
every finished shard.  Answers are cut after the first EOS id, as :func:`~sage_plugin.train.labels.greedy_generate`
does (SGLang's ``output_ids`` end with the matched stop token).
"""

from __future__ import annotations

import json
import logging
import urllib.request
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

from sage_plugin.config import ConfigError

from .common import cut_after_eos

logger = logging.getLogger(__name__)

__all__ = ["check_server", "server_generations", "server_generator"]

Shard = tuple[Sequence[Sequence[int]], Callable[[list[list[int]]], None]]


def _request(url: str, path: str, payload: dict | None = None, timeout: float = 1800) -> dict:
    data = None if payload is None else json.dumps(payload).encode()
    req = urllib.request.Request(url.rstrip("/") + path, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def check_server(url: str, target_dir: Path) -> None:
    """Refuses a server that does not answer or does not generate; warns when it serves another model path."""
    try:
        info = _request(url, "/get_model_info", timeout=30)
    except OSError as exc:  # urllib's URLError included
        raise ConfigError(f"--gen-url {url}: the server does not answer /get_model_info ({exc})") from exc
    if not info.get("is_generation", True):
        raise ConfigError(f"--gen-url {url}: the server serves an embedding model, not a generator")
    served = Path(str(info.get("model_path", "")))
    if served.resolve() != Path(target_dir).resolve():
        logger.warning("--gen-url %s serves %s, not the target %s: its answers are used as the target's", url,
                       served, target_dir)  # fmt: skip


def server_generator(url: str) -> str:
    """What produced a server's answers, as recorded in the answer store: SGLang's version (``/get_server_info``)."""
    try:
        version = _request(url, "/get_server_info", timeout=30).get("version", "?")
    except OSError:
        version = "?"
    return f"sglang {version} /generate (greedy)"


def _answer(url: str, ids: Sequence[int], max_new_tokens: int, eos: set[int]) -> list[int]:
    params = {"temperature": 0.0, "max_new_tokens": max_new_tokens}
    return cut_after_eos(
        _request(url, "/generate", {"input_ids": list(ids), "sampling_params": params})["output_ids"], eos
    )


def server_generations(
    url: str, shards: Sequence[Shard], max_new_tokens: int, eos_ids: Sequence[int], concurrency: int, bar=None
) -> int:
    """Greedy answers to every prompt of ``shards`` (``(prompt ids, save)`` pairs); returns the answer tokens.

    ``save(answers)`` is called once per shard with its answers in prompt order.  ``bar`` (a tqdm bar or None) is
    advanced by one per answered prompt.
    """
    eos = set(eos_ids)
    pending = [len(prompts) for prompts, _ in shards]
    answers: list[list[list[int] | None]] = [[None] * len(prompts) for prompts, _ in shards]
    tokens = 0
    pool = ThreadPoolExecutor(max_workers=concurrency)
    try:
        futures = {
            pool.submit(_answer, url, ids, max_new_tokens, eos): (s, i)
            for s, (prompts, _) in enumerate(shards)
            for i, ids in enumerate(prompts)
        }
        for fut in as_completed(futures):
            s, i = futures[fut]
            answers[s][i] = fut.result()  # a failed request stops the run: the prompts not yet sent are dropped
            tokens += len(answers[s][i])
            pending[s] -= 1
            if bar is not None:
                bar.update(1)
            if pending[s] == 0:
                shards[s][1]([a for a in answers[s] if a is not None])
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
    return tokens
