"""The target answers committed under train-data/answers (docs/design/training-data.md) are well formed and still
match the prompts the trainer would ask: a change to the offline prompt pool or the chat template that orphaned them
shows up here, not as a silent regeneration in the next training run."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from sage_plugin.train.answers import STORE_FORMAT, AnswerStore

ROOT = Path(__file__).resolve().parents[2] / "train-data" / "answers"
SMOLLM2 = "smollm2-135m-instruct-f32"
TOKENIZER = Path.home() / ".cache" / "sage_plugin" / SMOLLM2
POOL, SEED, EOS = 9088, 0, 2


def _records(store_dir: Path) -> list[dict]:
    out = []
    for path in sorted(store_dir.glob("answers-*.jsonl.gz")):
        with gzip.open(path, "rt", encoding="utf-8") as fh:
            out += [json.loads(line) for line in fh]
    return out


def test_store_is_there_and_well_formed():
    store_dir = ROOT / SMOLLM2
    manifest = json.loads((store_dir / "store.json").read_text())
    assert manifest == {"format": STORE_FORMAT, "target": SMOLLM2, "max_new_tokens": 192}
    recs = _records(store_dir)
    assert len(recs) >= 64 * 48  # the store only grows: it holds at least 48 shards of 64
    keys = [r["key"] for r in recs]
    assert len(set(keys)) == len(keys), "a prompt is stored twice"
    cap = manifest["max_new_tokens"]
    bad = [r["key"] for r in recs if not r["answer"] or len(r["answer"]) > cap
           or (r["answer"][-1] != EOS and len(r["answer"]) != cap) or EOS in r["answer"][:-1]]  # fmt: skip
    assert not bad, f"{len(bad)} answers neither end at the first EOS nor run to the cap"
    assert all(r["generator"] for r in recs)
    assert len(AnswerStore(store_dir, SMOLLM2, cap)) == len(recs)


@pytest.mark.slow
def test_every_stored_prompt_is_in_the_offline_pool():
    if not (TOKENIZER / "tokenizer.json").is_file():
        pytest.skip("SmolLM2 tokenizer not cached (run sage_plugin.models.ensure_smollm2() once)")
    from transformers import AutoTokenizer

    from sage_plugin.train.answers import prompt_key
    from sage_plugin.train.data import chat_prompts
    from sage_plugin.train.labels import _chat_ids

    tok = AutoTokenizer.from_pretrained(str(TOKENIZER))
    pool = {prompt_key(ids) for ids in _chat_ids(tok, chat_prompts(POOL, seed=SEED))}
    stored = {r["key"] for r in _records(ROOT / SMOLLM2)}
    orphans = stored - pool
    assert not orphans, f"{len(orphans)} of {len(stored)} stored answers belong to no prompt of the pool"
