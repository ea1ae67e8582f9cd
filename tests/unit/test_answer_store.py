"""The answer store (sage_plugin.train.answers): answers kept across runs, keyed by the rendered prompt."""

from __future__ import annotations

import json

import pytest

from sage_plugin.train.answers import AnswerStore, answer_store_for, prompt_key

PROMPTS = [[1, 10, 11], [1, 12], [1, 13, 14, 15]]
ANSWERS = [[5, 6, 2], [7, 2], [8, 9, 9, 9]]


def test_round_trip_and_a_missing_prompt(tmp_path):
    store = AnswerStore(tmp_path / "t", "t", 4)
    assert store.lookup(PROMPTS) is None and len(store) == 0
    path = store.add(PROMPTS[:2], ANSWERS[:2], "gen A")
    assert path.parent == tmp_path / "t" and path.name.startswith("answers-")
    assert store.lookup(PROMPTS[:2]) == ANSWERS[:2]
    assert store.lookup(PROMPTS) is None  # one prompt missing: the shard is generated whole
    store.add(PROMPTS[2:], ANSWERS[2:], "gen B")
    again = AnswerStore(tmp_path / "t", "t", 4)  # a later run reads the files
    assert again.lookup(PROMPTS[::-1]) == ANSWERS[::-1] and len(again) == 3
    assert json.loads((tmp_path / "t" / "store.json").read_text()) == {"format": 1, "target": "t", "max_new_tokens": 4}


def test_adding_a_shard_again_rewrites_the_same_bytes(tmp_path):
    store = AnswerStore(tmp_path, "t", 4)
    first = store.add(PROMPTS, ANSWERS, "gen A").read_bytes()
    path = AnswerStore(tmp_path, "t", 4).add(PROMPTS, ANSWERS, "gen A")
    assert path.read_bytes() == first and len(list(tmp_path.glob("answers-*"))) == 1


def test_the_first_stored_answer_wins(tmp_path):
    store = AnswerStore(tmp_path, "t", 4)
    store.add(PROMPTS[:1], ANSWERS[:1], "gen A")
    store.add(PROMPTS[:2], [[4, 4, 2], ANSWERS[1]], "gen B")  # another file holding a different answer to prompt 0
    assert AnswerStore(tmp_path, "t", 4).lookup(PROMPTS[:1]) == ANSWERS[:1]


def test_a_store_of_another_cap_or_target_is_not_used(tmp_path, caplog):
    AnswerStore(tmp_path, "t", 4).add(PROMPTS, ANSWERS, "gen A")
    for other in (AnswerStore(tmp_path, "t", 8), AnswerStore(tmp_path, "u", 4)):
        assert not other.usable and other.lookup(PROMPTS) is None
        assert other.add(PROMPTS, ANSWERS, "gen B") is None
    assert "not used" in caplog.text and len(list(tmp_path.glob("answers-*"))) == 1


def test_mismatched_lengths_are_refused(tmp_path):
    with pytest.raises(ValueError, match="3 prompts but 2 answers"):
        AnswerStore(tmp_path, "t", 4).add(PROMPTS, ANSWERS[:2], "gen A")


def test_keys_follow_the_token_ids():
    assert prompt_key([1, 2, 3]) == prompt_key((1, 2, 3))
    assert len({prompt_key(p) for p in PROMPTS}) == 3 and prompt_key([12, 3]) != prompt_key([1, 23])


def test_store_of_a_run(tmp_path):
    import argparse

    args = argparse.Namespace(answers_dir=None, gen_max_new_tokens=6)
    assert answer_store_for(args, tmp_path / "model") is None  # no flag: no store, nothing written anywhere
    args.answers_dir = str(tmp_path / "answers")
    store = answer_store_for(args, tmp_path / "model-f32")
    assert store.root == tmp_path / "answers" / "model-f32" and store.max_new_tokens == 6
