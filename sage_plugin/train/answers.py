"""The target's greedy answers kept in the repository, so that training data accumulates from run to run.

Generating the target's answers is the slow part of distilling a draft, and a work directory does not outlive its
machine.  With ``--answers-dir DIR`` (the repository keeps one at ``train-data/answers``,
``docs/design/training-data.md``) an :class:`AnswerStore` in ``DIR/<target>/`` keeps every answer a run generates:
both draft kinds (``sage train-draft``, ``--kind eagle3``) look a shard's prompts up there before generating and add
what they generate, so the store grows with every run, on any machine, and the next run reads it.

Layout (one directory per target, e.g. ``smollm2-135m-instruct-f32``)::

    store.json                     {"format": 1, "target": NAME, "max_new_tokens": 192}
    answers-<12 hex>.jsonl.gz      one file per added shard, named by its prompts: {"key", "answer", "generator"}

``key`` is the SHA-1 of the rendered prompt's token ids (:func:`prompt_key`), so an answer is found whatever shard
or prompt pool it came from, and a prompt whose rendering changed (another chat template, another prompt text) is
simply not found.  ``answer`` holds the generated ids (the first EOS included, as
:func:`~sage_plugin.train.common.cut_after_eos` cuts them).  Files are written byte-reproducibly (gzip without a
timestamp), so adding the same shard twice rewrites the same file.

A store whose ``max_new_tokens`` differs from the run's is not used (its answers would be cut elsewhere): the run
generates as if it were absent and logs why.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import logging
import os
from collections.abc import Sequence
from pathlib import Path

logger = logging.getLogger(__name__)

__all__ = ["STORE_FORMAT", "IN_PROCESS", "GEN_CACHE", "AnswerStore", "prompt_key", "answer_store_for"]

STORE_FORMAT = 1
_MANIFEST = "store.json"
#: the ``generator`` recorded with answers made in process, or found in a run's ``gen/`` cache (origin unknown)
IN_PROCESS = "transformers generate (greedy, in process)"
GEN_CACHE = "unrecorded (read from a gen/ cache shard)"


def prompt_key(prompt_ids: Sequence[int]) -> str:
    """SHA-1 (hex) of a rendered prompt's token ids.

    >>> prompt_key([1, 2, 3]) == prompt_key((1, 2, 3)) != prompt_key([1, 2])
    True
    """
    return hashlib.sha1(",".join(str(int(t)) for t in prompt_ids).encode()).hexdigest()


class AnswerStore:
    """Answers to rendered prompts for one target at one ``max_new_tokens`` (see the module docstring).

    Args:
        root: the target's directory (created on the first :meth:`add`).
        target: the target's name, recorded in (and checked against) ``store.json``.
        max_new_tokens: the answers' cap; a store built with another is not used.
    """

    def __init__(self, root: Path, target: str, max_new_tokens: int) -> None:
        self.root = Path(root)
        self.target = target
        self.max_new_tokens = int(max_new_tokens)
        self._answers: dict[str, list[int]] | None = None
        self.usable = True
        mpath = self.root / _MANIFEST
        if mpath.is_file():
            m = json.loads(mpath.read_text())
            want = self._manifest()
            diff = {k: (m.get(k), v) for k, v in want.items() if m.get(k) != v}
            if diff:
                logger.warning("answer store %s not used: built with %s", self.root, diff)
                self.usable = False

    def _manifest(self) -> dict:
        return {"format": STORE_FORMAT, "target": self.target, "max_new_tokens": self.max_new_tokens}

    def answers(self) -> dict[str, list[int]]:
        """Every stored answer by prompt key (read once; :meth:`add` keeps it current)."""
        if self._answers is None:
            self._answers = {}
            if self.usable:
                for path in sorted(self.root.glob("answers-*.jsonl.gz")):
                    with gzip.open(path, "rt", encoding="utf-8") as fh:
                        for line in fh:
                            rec = json.loads(line)
                            self._answers.setdefault(rec["key"], rec["answer"])
        return self._answers

    def __len__(self) -> int:
        return len(self.answers())

    def lookup(self, prompts: Sequence[Sequence[int]]) -> list[list[int]] | None:
        """The stored answers of every prompt in order, or None if any is missing (the shard is generated whole)."""
        have = self.answers()
        keys = [prompt_key(p) for p in prompts]
        if not keys or any(k not in have for k in keys):
            return None
        return [list(have[k]) for k in keys]

    def add(self, prompts: Sequence[Sequence[int]], answers: Sequence[Sequence[int]], generator: str) -> Path | None:
        """Stores one shard's answers (prompt order) in one file; returns it (None: the store is not usable)."""
        if not self.usable:
            return None
        if len(prompts) != len(answers):
            raise ValueError(f"{len(prompts)} prompts but {len(answers)} answers")
        keys = [prompt_key(p) for p in prompts]
        self.root.mkdir(parents=True, exist_ok=True)
        mpath = self.root / _MANIFEST
        if not mpath.is_file():
            mpath.write_text(json.dumps(self._manifest(), indent=1) + "\n")
        name = hashlib.sha1("".join(keys).encode()).hexdigest()[:12]
        path = self.root / f"answers-{name}.jsonl.gz"
        buf = io.BytesIO()
        with gzip.GzipFile(fileobj=buf, mode="wb", mtime=0, compresslevel=9) as gz:
            for k, a in zip(keys, answers, strict=True):
                line = {"key": k, "answer": [int(t) for t in a], "generator": generator}
                gz.write((json.dumps(line, separators=(",", ":")) + "\n").encode())
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_bytes(buf.getvalue())
        os.replace(tmp, path)
        have = self.answers()
        for k, a in zip(keys, answers, strict=True):
            have.setdefault(k, [int(t) for t in a])
        return path


def answer_store_for(args, target_dir: Path) -> AnswerStore | None:
    """The run's store under ``--answers-dir`` (``args.answers_dir``; None: no store).

    The target's directory name names its sub-directory (answers of one target are never read for another).
    """
    choice = getattr(args, "answers_dir", None)
    if not choice:
        return None
    name = Path(target_dir).name
    return AnswerStore(Path(choice).expanduser() / name, name, args.gen_max_new_tokens)
