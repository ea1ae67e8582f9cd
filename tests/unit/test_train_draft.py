"""Draft distillation (sage_plugin.train.draft): a tiny end-to-end run against a tiny random target.

The target is a 2-layer random Llama with the real SmolLM2 vocabulary/tokenizer (skipped when the converted
SmolLM2 checkpoint is not cached); everything runs on CPU in well under a minute.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from sage_plugin.train.data import chat_prompts  # noqa: E402
from sage_plugin.train.draft import (  # noqa: E402
    add_train_args,
    chain_tau,
    evaluate_draft,
    export_draft,
    train_draft,
)
from sage_plugin.train.model import CompactDraft, select_head_vocab  # noqa: E402

SMOLLM2_DIR = Path.home() / ".cache" / "sage_plugin" / "smollm2-135m-instruct-f32"
VOCAB = 49152


@pytest.fixture(scope="module")
def tiny_target(tmp_path_factory) -> Path:
    if not (SMOLLM2_DIR / "tokenizer.json").is_file():
        pytest.skip("SmolLM2 tokenizer not cached (run sage_plugin.models.ensure_smollm2() once)")
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
        rope_parameters={"rope_theta": 1e5, "rope_type": "default"},
        max_position_embeddings=2048,
        initializer_range=0.2,  # spread-out logits: varied argmax labels
    )
    out = tmp_path_factory.mktemp("tiny_target")
    LlamaForCausalLM(cfg).save_pretrained(out)
    AutoTokenizer.from_pretrained(str(SMOLLM2_DIR)).save_pretrained(out)
    return out


def _args(out: Path, target: Path, *extra: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_train_args(parser)
    return parser.parse_args(
        [
            "--out",
            str(out),
            "--target",
            str(target),
            "--device",
            "cpu",
            "--threads",
            "1",
            "--seq-len",
            "32",
            "--text-tokens",
            "1024",
            "--gen-prompts",
            "3",
            "--gen-max-new-tokens",
            "6",
            "--gen-batch",
            "4",
            "--label-batch",
            "8",
            "--shard-windows",
            "16",
            "--val-windows",
            "2",
            "--head-vocab",
            "512",
            "--hidden",
            "32",
            "--heads",
            "2",
            "--intermediate",
            "64",
            "--init-embeddings",
            "pca",
            "--steps",
            "6",
            "--batch-size",
            "4",
            "--warmup",
            "2",
            "--eval-every",
            "3",
            "--ckpt-every",
            "100",
            "--no-progress",
            "--eval-cache",
            str(out.parent / "cache"),
            *extra,
        ]
    )


def _log(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]


def test_chain_tau():
    assert chain_tau([True] * 10) == (10, 2)  # 4 accepted + bonus, twice
    assert chain_tau([False] * 3) == (3, 3)  # one target token per step
    assert chain_tau([True, True, False, True]) == (4, 2)
    assert chain_tau([], 4) == (0, 0)


def test_select_head_vocab_keeps_specials_and_frequent():
    counts = torch.zeros(100, dtype=torch.long)
    counts[[50, 60, 70]] = torch.tensor([5, 9, 7])
    keep = select_head_vocab(counts, 4, always=[2])
    assert keep.tolist() == [2, 50, 60, 70]
    assert select_head_vocab(counts, 0, always=[]).numel() == 100


def test_chat_prompts_hold_out_eval_sets():
    from sage_plugin.data.prompts import load_prompts

    prompts = chat_prompts(40, seed=0)
    assert len(prompts) == len(set(prompts)) == 40
    assert prompts == chat_prompts(40, seed=0)[:40] and chat_prompts(20, seed=0) == prompts[:20]
    held = {m["content"].strip() for ds in ("mt_bench", "humaneval") for p in load_prompts(ds) for m in p.messages}
    assert not held & {p.strip() for p in prompts}


def test_chat_prompts_second_mix_keeps_the_first_and_covers_every_category():
    from sage_plugin.data.prompts import load_prompts
    from sage_plugin.train.data import MIX_V1_PROMPTS
    from sage_plugin.train.instructions import CATEGORIES, instruction_prompts

    n = MIX_V1_PROMPTS + 240
    big = chat_prompts(n, seed=0)
    assert len(big) == len(set(big)) == n
    assert chat_prompts(MIX_V1_PROMPTS + 60, seed=0) == big[: MIX_V1_PROMPTS + 60]
    held = {m["content"].strip() for ds in ("mt_bench", "humaneval") for p in load_prompts(ds) for m in p.messages}
    assert not held & {p.strip() for p in big}
    # the second phase draws mostly from the instruction stream: one prompt per category in turn
    it = instruction_prompts(seed=0)
    stream = [next(it) for _ in range(8 * len(CATEGORIES))]
    assert stream == [p for p, _ in zip(instruction_prompts(seed=0), range(len(stream)), strict=False)]
    assert len(set(big[MIX_V1_PROMPTS:]) & set(stream)) >= len(CATEGORIES)
    reasoning = stream[CATEGORIES.index("reasoning") :: len(CATEGORIES)]
    assert all("?" in p for p in reasoning)
    extraction = stream[CATEGORIES.index("extraction") :: len(CATEGORIES)]
    assert all("\n\n" in p and len(p) > 120 for p in extraction)  # an instruction, then the text to work on


@pytest.mark.slow
def test_chat_prompts_past_9110_keep_the_first_9110_as_a_prefix():
    """The pool goes past 9,110 prompts, and the first 9,110, which the bundled drafts and the stored answers were
    made from, are a prefix of the longer list."""
    from sage_plugin.data.prompts import load_prompts

    big = chat_prompts(9110 + 400, seed=0)
    assert len(big) == len(set(big)) == 9510 and big[:9110] == chat_prompts(9110, seed=0)
    held = {m["content"].strip() for ds in ("mt_bench", "humaneval") for p in load_prompts(ds) for m in p.messages}
    assert not held & {p.strip() for p in big}


def test_rare_rows_never_win():
    from transformers import LlamaConfig

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=10, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, head_dim=8
    )
    keep = torch.tensor([0, 3, 5, 7, 11, 40])
    m = CompactDraft(cfg, keep, 64)
    with torch.no_grad():
        m.rare_logits.normal_(0, 5.0)  # u concentrated on a few head rows: still a convex combination
    full = m.full_embedding()
    h = torch.randn(10000, 16)
    assert torch.isin((h @ full.t()).argmax(-1), keep).all()


@pytest.mark.slow
def test_train_resume_export_evaluate(tiny_target, tmp_path):
    # A: 6 steps in one go.  B: stop at step 3, then --resume to 6.  Same data order -> same weights.
    out_a, out_b = tmp_path / "a", tmp_path / "b"
    assert train_draft(_args(out_a, tiny_target, "--no-export", "--no-eval")) == 0
    assert train_draft(_args(out_b, tiny_target, "--stop-at", "3", "--no-eval")) == 0
    assert not (out_b / "draft").exists()  # unfinished: no export
    ck = torch.load(out_b / "ckpt.pt", weights_only=False)
    assert ck["step"] == 3 and ck["cursor"]["pos"] == 12
    shards = sorted((out_b / "labels").glob("*.pt"))
    assert {p.name.split("_")[0] for p in shards} == {"chat", "text"}
    mtimes = {p: p.stat().st_mtime_ns for p in shards}

    assert train_draft(_args(out_b, tiny_target, "--resume", "--eval-limit", "2", "--eval-gen-tokens", "8")) == 0
    assert {p: p.stat().st_mtime_ns for p in shards} == mtimes  # labels reused, not redone
    log = _log(out_b)
    assert [r["step"] for r in log] == [1, 2, 3, 4, 5, 6]
    assert all(torch.isfinite(torch.tensor(r["loss"])) for r in log)
    assert "val_agree" in log[2] and 0.0 <= log[2]["val_agree"] <= 1.0
    a = torch.load(out_a / "ckpt.pt", weights_only=False)
    b = torch.load(out_b / "ckpt.pt", weights_only=False)
    assert a["step"] == b["step"] == 6
    for k, v in a["model"].items():
        assert torch.equal(v, b["model"][k]), k  # resumption is exact
    with pytest.raises(SystemExit):  # an existing run is never overwritten silently
        train_draft(_args(out_b, tiny_target))

    # export (done by the resumed run) -> a plain HF Llama with the full vocabulary, loadable as fp32
    from transformers import AutoModelForCausalLM, AutoTokenizer

    draft_dir = out_b / "draft"
    for name in ("config.json", "model.safetensors", "tokenizer.json", "README.md", "sage_draft.json"):
        assert (draft_dir / name).is_file(), name
    assert (draft_dir / "model.safetensors").stat().st_size <= 32_000_000
    model = AutoModelForCausalLM.from_pretrained(str(draft_dir))
    assert type(model).__name__ == "LlamaForCausalLM"
    assert model.config.vocab_size == VOCAB and model.dtype == torch.float32
    assert model.get_output_embeddings().weight.shape == (VOCAB, 32)
    assert AutoTokenizer.from_pretrained(str(draft_dir)).eos_token_id == 2

    # the exported model computes the trained compact model's logits (fp16 storage) and argmax stays in S
    from transformers import LlamaConfig

    keep = b["keep_ids"]
    compact = CompactDraft(LlamaConfig.from_dict(b["config"]), keep, VOCAB)
    compact.load_state_dict(b["model"])
    ids = b["model"]["to_compact"].new_tensor([[1, 9690, 198, 504, 3060, 30, 2, 42000, 17, 8]])
    with torch.no_grad():
        ref = compact(ids)
        got = model(input_ids=ids).logits
    assert torch.allclose(got[..., keep], ref, atol=2e-2)
    assert torch.isin(got.argmax(-1), keep).all()

    # evaluation on held-out prompts (continuations cached under tmp)
    res = evaluate_draft(
        tiny_target, draft_dir, limit=2, gen_tokens=8, device="cpu", cache_dir=tmp_path / "cache", verbose=False
    )
    assert 0.0 <= res["agreement"] <= 1.0 and 1.0 <= res["tau"] <= 5.0
    assert res["prompts"] == 4 and set(res["per_dataset"]) == {"mt_bench", "humaneval"}
    assert res["rare_argmax_rate"] == 0.0
    assert "agreement" in (draft_dir / "README.md").read_text()
    # export_draft on its own (no evaluation) rewrites the directory
    assert export_draft(out_b / "ckpt.pt", tmp_path / "exp", evaluate=False) == {}
    assert (tmp_path / "exp" / "config.json").is_file()


def _eagle3_args(out: Path, target: Path, *extra: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_train_args(parser)
    flags = {
        "--kind": "eagle3", "--out": str(out), "--target": str(target), "--threads": "1", "--gen-shards": "1",
        "--gen-prompt-pool": "128", "--gen-max-new-tokens": "6", "--text-tokens": "512", "--aux-layers": "0,0,0",
        "--head-vocab": "256", "--intermediate": "32", "--seq-len": "64", "--steps": "4", "--batch-size": "4",
        "--warmup": "1", "--ttt-steps": "3", "--eval-every": "2", "--ckpt-every": "2", "--val-windows": "2",
        "--eval-limit": "2", "--eval-gen-tokens": "6", "--eval-cache": str(out.parent / "cache"),
    }  # fmt: skip
    return parser.parse_args([x for kv in flags.items() for x in kv] + ["--no-progress", *extra])


@pytest.mark.slow
def test_eagle3_head_end_to_end_and_resume(tiny_target, tmp_path):
    """``--kind eagle3``: answers -> features -> train -> SGLang-format export -> held-out chain figures; resumable."""
    out = tmp_path / "e3"
    assert train_draft(_eagle3_args(out, tiny_target)) == 0
    head = out / "head"
    cfg = json.loads((head / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"] and cfg["draft_vocab_size"] == 256
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [0, 0, 0]
    record = json.loads((head / "sage_eagle3.json").read_text())
    assert record["data"]["shards"] == 1 and record["data"]["text_shards"] == 1
    held = record["heldout"]
    assert set(held["per_dataset"]) == {"mt_bench", "humaneval"} and 0.0 <= held["agreement"] <= 1.0
    assert held["tau5"] >= 1.0 and len(held["step_accuracy"]) == 5
    assert "| all |" in (head / "README.md").read_text()
    steps = [json.loads(line)["step"] for line in (out / "eagle3_log.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4]
    with pytest.raises(SystemExit, match="pass --resume"):
        train_draft(_eagle3_args(out, tiny_target))
    with (out / "eagle3_log.jsonl").open("a") as f:  # a step logged after the last checkpoint, then killed
        f.write(json.dumps({"step": 5, "loss": 0.0}) + "\n")
    assert train_draft(_eagle3_args(out, tiny_target, "--resume", "--steps", "6")) == 0
    steps = [json.loads(line)["step"] for line in (out / "eagle3_log.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4, 5, 6]  # continued from the checkpoint, not restarted


def test_eagle3_refuses_a_gpu_device(tiny_target, tmp_path):
    """The EAGLE-3 trainer runs on CPU only so far: an explicit --device cuda is refused, not silently ignored."""
    with pytest.raises(SystemExit, match="--device cuda: --kind eagle3 trains on CPU only"):
        train_draft(_eagle3_args(tmp_path / "gpu", tiny_target, "--device", "cuda"))


class _FakeSGLang:
    """A stand-in for an SGLang server over ``model``: ``/get_model_info`` and greedy ``/generate`` on ``input_ids``
    (HF's greedy continuation of ``max_new_tokens``, its last tokens replaced by ``tail``); ``requests`` counts the
    generate calls."""

    def __init__(self, model, model_path: Path, tail: tuple[int, ...] = (), fail_on: int | None = None):
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        from sage_plugin.train.labels import greedy_generate

        lock, fake = threading.Lock(), self
        self.requests = 0

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _send(self, body: dict) -> None:
                data = json.dumps(body).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                self._send({"model_path": str(model_path), "is_generation": True})

            def do_POST(self):
                req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if fail_on is not None and fail_on in req["input_ids"]:
                    with lock:
                        fake.requests += 1
                    self.send_error(500)
                    return
                with lock:
                    fake.requests += 1
                    out = greedy_generate(model, [req["input_ids"]], req["sampling_params"]["max_new_tokens"],
                                          batch_size=1, pad_id=2, eos_id=None, device="cpu")[0]  # fmt: skip
                out = out[: req["sampling_params"]["max_new_tokens"] - len(tail)] + list(tail)
                self._send({"output_ids": out, "meta_info": {}})

        class Server(ThreadingHTTPServer):
            request_queue_size = 256  # 64 clients connect at once (uvicorn's backlog is 2048)

        self.httpd = Server(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()


@pytest.fixture()
def fake_server(tiny_target):
    from transformers import AutoModelForCausalLM

    server = _FakeSGLang(AutoModelForCausalLM.from_pretrained(str(tiny_target)).eval(), tiny_target)
    yield server
    server.close()


def test_gen_url_answers_equal_in_process_generation(tiny_target, fake_server, tmp_path, caplog):
    """``--gen-url``: shards answered by a server (per prompt, concurrently, cut after EOS) are the shards
    in-process generation writes for the same greedy continuations; cached shards are not asked again."""
    from transformers import AutoTokenizer

    from sage_plugin.train.labels import _LazyTarget, _Throughput, chat_generations, server_prefetch

    tok = AutoTokenizer.from_pretrained(str(tiny_target))
    msgs = chat_prompts(7, seed=0)
    shards = [(msgs[:4], tmp_path / "srv" / "gen_0.pt"), (msgs[4:], tmp_path / "srv" / "gen_1.pt")]
    (tmp_path / "srv").mkdir()
    args = argparse.Namespace(gen_url=fake_server.url, gen_concurrency=3, gen_max_new_tokens=12, gen_batch=4,
                              no_progress=True)  # fmt: skip
    server_prefetch(tok, shards, args, tiny_target)
    assert fake_server.requests == 7
    target = _LazyTarget(tiny_target, torch.device("cpu"))
    local = argparse.Namespace(**{**vars(args), "gen_url": None})
    for k, (m, path) in enumerate(shards):
        served = torch.load(path, weights_only=True)
        ref = chat_generations(target, tok, m, tmp_path / f"ref_{k}.pt", local, _Throughput())
        assert served["prompts"] == m
        assert [s.tolist() for s in served["sequences"]] == [s.tolist() for s in ref["sequences"]]
        assert fake_server.requests == 7
    server_prefetch(tok, shards, args, tiny_target)
    assert fake_server.requests == 7  # cached: not asked again
    with caplog.at_level("WARNING"):  # a server of another model path: used, with a warning
        server_prefetch(tok, [(msgs[:1], tmp_path / "other.pt")], args, tmp_path)
    assert "not the target" in caplog.text and fake_server.requests == 8


def test_gen_url_answers_are_cut_after_the_first_eos(tiny_target, tmp_path):
    """Whatever a server returns after an EOS id is dropped, as in-process generation drops it; shards are saved
    with their answers in prompt order whatever order the requests finish in."""
    from transformers import AutoModelForCausalLM

    from sage_plugin.train.server_gen import server_generations

    server = _FakeSGLang(AutoModelForCausalLM.from_pretrained(str(tiny_target)).eval(), tiny_target, tail=(2, 9, 9))
    saved = {}
    try:
        prompts = [[1, 5 + i] for i in range(5)]
        n = server_generations(server.url, [(prompts[:3], lambda a: saved.setdefault(0, a)),
                                            (prompts[3:], lambda a: saved.setdefault(1, a))], 8, [2], 4)  # fmt: skip
    finally:
        server.close()
    assert sorted(saved) == [0, 1] and [len(saved[0]), len(saved[1])] == [3, 2]
    answers = saved[0] + saved[1]
    assert all(len(a) == 6 and a[-1] == 2 and 2 not in a[:-1] for a in answers) and n == 30


def test_gen_url_failed_request_stops_the_run(tiny_target):
    """A request the server fails raises at once: the prompts not yet sent are not sent, the shard is not saved."""
    import urllib.error

    from transformers import AutoModelForCausalLM

    from sage_plugin.train.server_gen import server_generations

    server = _FakeSGLang(AutoModelForCausalLM.from_pretrained(str(tiny_target)).eval(), tiny_target, fail_on=777)
    saved = []
    try:
        with pytest.raises(urllib.error.HTTPError):
            server_generations(server.url, [([[1, 777]] + [[1, 5 + i] for i in range(60)], saved.append)], 4, [2], 1)
    finally:
        server.close()
    # the one worker may take the next prompt before the failure reaches the caller; the rest are never sent
    assert saved == [] and 1 <= server.requests < 10


def test_gen_url_that_does_not_answer_is_refused(tiny_target, tmp_path):
    from transformers import AutoTokenizer

    from sage_plugin.config import ConfigError
    from sage_plugin.train.labels import server_prefetch

    args = argparse.Namespace(gen_url="http://127.0.0.1:9", gen_concurrency=2, gen_max_new_tokens=4,
                              no_progress=True)  # fmt: skip
    tok = AutoTokenizer.from_pretrained(str(tiny_target))
    with pytest.raises(ConfigError, match="--gen-url http://127.0.0.1:9: the server does not answer"):
        server_prefetch(tok, [(["hi"], tmp_path / "g.pt")], args, tiny_target)


@pytest.mark.slow
def test_eagle3_trainer_takes_answers_from_gen_url(tiny_target, fake_server, tmp_path):
    """The EAGLE-3 trainer's answer stage goes to ``--gen-url`` (one request per prompt) and trains on them."""
    out = tmp_path / "e3"
    args = _eagle3_args(out, tiny_target, "--gen-url", fake_server.url, "--no-export")
    assert train_draft(args) == 0
    gen = torch.load(next((out / "gen").glob("gen_*.pt")), weights_only=True)
    assert fake_server.requests == len(gen["prompts"]) == 64
    assert (out / "eagle3_ckpt.pt").is_file()


def test_answers_dir_keeps_answers_for_the_next_run(tiny_target, fake_server, tmp_path, monkeypatch):
    """``--answers-dir``: answers a server gave are stored; a later run with an empty work directory reads them
    instead of asking a server or generating, and writes the same ``gen/`` shards; a cached shard's answers are
    added to a store that lacks them."""
    import gzip

    from transformers import AutoTokenizer

    import sage_plugin.train.labels as labels
    from sage_plugin.train.answers import AnswerStore

    tok = AutoTokenizer.from_pretrained(str(tiny_target))
    msgs = chat_prompts(6, seed=0)
    store_dir = tmp_path / "answers"
    args = argparse.Namespace(gen_url=fake_server.url, gen_concurrency=3, gen_max_new_tokens=10, gen_batch=4,
                              no_progress=True, answers_dir=str(store_dir))  # fmt: skip
    first = [(msgs[:4], tmp_path / "run1" / "gen_0.pt"), (msgs[4:], tmp_path / "run1" / "gen_1.pt")]
    (tmp_path / "run1").mkdir()
    labels.server_prefetch(tok, first, args, tiny_target)
    assert fake_server.requests == 6
    store = AnswerStore(store_dir / tiny_target.name, tiny_target.name, 10)
    assert len(store) == 6 and len(list(store.root.glob("answers-*.jsonl.gz"))) == 2
    with gzip.open(next(store.root.glob("answers-*.jsonl.gz")), "rt") as fh:  # the fake has no /get_server_info
        assert {json.loads(line)["generator"] for line in fh} == {"sglang ? /generate (greedy)"}

    def no_generation(*a, **k):
        raise AssertionError("generated although the store holds the answers")

    monkeypatch.setattr(labels, "greedy_generate", no_generation)
    second = [(m, tmp_path / "run2" / p.name) for m, p in first]
    (tmp_path / "run2").mkdir()
    (tmp_path / "run3").mkdir()
    labels.server_prefetch(tok, second, args, tiny_target)  # from the store: the server is not asked
    target = labels._LazyTarget(tiny_target, torch.device("cpu"))
    offline = argparse.Namespace(**{**vars(args), "gen_url": None})
    for (m, p1), (_, p2) in zip(first, second, strict=True):
        g1, g2 = torch.load(p1, weights_only=True), torch.load(p2, weights_only=True)
        assert [s.tolist() for s in g1["sequences"]] == [s.tolist() for s in g2["sequences"]]
        g3 = labels.chat_generations(target, tok, m, tmp_path / "run3" / p1.name, offline, labels._Throughput())
        assert [s.tolist() for s in g3["sequences"]] == [s.tolist() for s in g1["sequences"]]
    assert fake_server.requests == 6 and target._model is None  # the target was never even loaded
    ingest = argparse.Namespace(**{**vars(offline), "answers_dir": str(tmp_path / "fresh")})
    labels.chat_generations(target, tok, msgs[:4], first[0][1], ingest, labels._Throughput())  # a cached shard
    fresh = AnswerStore(tmp_path / "fresh" / tiny_target.name, tiny_target.name, 10)
    assert fresh.lookup(labels._chat_ids(tok, msgs[:4])) == store.lookup(labels._chat_ids(tok, msgs[:4]))


@pytest.mark.slow
def test_answers_only_fills_the_store_and_stops(tiny_target, fake_server, tmp_path):
    """``--answers-only``: the shards the run would train on are answered (here by ``--gen-url``) into ``--out/gen``
    and ``--answers-dir``, and nothing else runs (no features, no checkpoint); a second run asks nothing."""
    from sage_plugin.train.answers import AnswerStore

    out, store_dir = tmp_path / "e3", tmp_path / "answers"
    args = _eagle3_args(out, tiny_target, "--gen-url", fake_server.url, "--answers-only", "--answers-dir",
                        str(store_dir))  # fmt: skip
    assert train_draft(args) == 0
    assert fake_server.requests == 64 and sorted(p.name for p in out.iterdir()) == ["gen"]
    assert len(AnswerStore(store_dir / tiny_target.name, tiny_target.name, 6)) == 64
    assert train_draft(_eagle3_args(tmp_path / "again", tiny_target, "--gen-url", fake_server.url, "--answers-only",
                                    "--answers-dir", str(store_dir))) == 0  # fmt: skip
    assert fake_server.requests == 64
    draft_out = tmp_path / "d"  # the standalone kind, in process: its --gen-prompts, one partial shard
    assert train_draft(_args(draft_out, tiny_target, "--answers-only", "--answers-dir", str(store_dir))) == 0
    assert sorted(p.name for p in draft_out.iterdir()) == ["gen"]
    assert len(torch.load(draft_out / "gen" / "gen_00000.pt", weights_only=True)["sequences"]) == 3


def test_amp_modes():
    """``--amp``: auto autocasts on CUDA only, bf16 on any device, off never; another word is refused by name."""
    from sage_plugin.train.common import use_amp

    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert [use_amp(m, cpu) for m in ("auto", "bf16", "off")] == [False, True, False]
    assert [use_amp(m, cuda) for m in ("auto", "bf16", "off")] == [True, True, False]
    with pytest.raises(ValueError, match="--amp must be one of auto, bf16, off"):
        use_amp("fp16", cpu)


@pytest.mark.slow
def test_eagle3_bf16_autocast_trains_float32_weights(tiny_target, tmp_path):
    """``--amp bf16`` on CPU: the same steps as float32 under bf16 autocast (losses close, not equal: the matmuls
    really ran in bf16), and the checkpoint's weights and optimizer moments stay float32."""
    logs = {}
    for mode in ("off", "bf16"):
        out = tmp_path / mode
        assert train_draft(_eagle3_args(out, tiny_target, "--amp", mode, "--no-export")) == 0
        logs[mode] = [json.loads(line) for line in (out / "eagle3_log.jsonl").read_text().splitlines()]
        ck = torch.load(out / "eagle3_ckpt.pt", map_location="cpu", weights_only=False)
        assert {t.dtype for t in ck["head"].values() if t.is_floating_point()} == {torch.float32}
        moments = [v for s in ck["opt"]["state"].values() for k, v in s.items() if k.startswith("exp_avg")]
        assert moments and {t.dtype for t in moments} == {torch.float32}
    first = [logs[m][0]["loss"] for m in ("off", "bf16")]
    assert first[0] != first[1] and abs(first[0] - first[1]) < 0.02 * first[0], first
    assert [r["step"] for r in logs["bf16"]] == [1, 2, 3, 4]


def test_length_groups_batches():
    """``--length-groups G``: a batch is one length-sorted block of G x batch random rows (little padding), every row
    equally likely; G = 1 draws exactly the uniform batches the trainer always drew; G < 1 is refused by name."""
    from sage_plugin.train.eagle3.loop import batch_rows

    rows = list(range(200))
    lengths = [(7 * r) % 97 + 3 for r in rows]
    for step in range(20):  # G = 1: the old draw (randperm seeded by seed + step, first batch rows)
        perm = torch.randperm(200, generator=torch.Generator().manual_seed(5 + step))[:8].tolist()
        assert batch_rows(rows, lengths, step, 8, 5, 1) == perm
    spread = {g: [] for g in (1, 8)}
    counts = torch.zeros(200)
    for step in range(4000):
        for g in spread:
            b = batch_rows(rows, lengths, step, 8, 5, g)
            assert len(set(b)) == 8 and set(b) <= set(rows)
            spread[g].append(max(lengths[r] for r in b) - min(lengths[r] for r in b))
            if g == 8:
                counts[b] += 1
    assert sum(spread[8]) < 0.3 * sum(spread[1])  # grouped batches span a fraction of the length range
    assert counts.min() > 0.6 * counts.mean() and counts.max() < 1.4 * counts.mean()  # ~160 draws each
    assert batch_rows(rows, lengths, 3, 8, 5, 8) == batch_rows(rows, lengths, 3, 8, 5, 8)  # stateless
    parser = argparse.ArgumentParser()
    add_train_args(parser)
    with pytest.raises(SystemExit):
        parser.parse_args(["--out", "x", "--length-groups", "0"])


def test_eagle3_card_command_rebuilds_the_recorded_arguments():
    """The card's Reproduce command, parsed by the trainer's own parser, gives back every recorded argument that
    shapes the head or its training (``--amp`` and ``--length-groups`` included when not at their defaults)."""
    from sage_plugin.train.eagle3.card import model_card

    parser = argparse.ArgumentParser()
    add_train_args(parser)
    for extra in ([], ["--amp", "bf16", "--length-groups", "8"], ["--length-groups", "3"]):
        args = parser.parse_args(["--kind", "eagle3", "--out", "RUN", "--steps", "1850", "--batch-size", "8",
                                  "--lr", "0.001", "--seq-len", "512", "--text-tokens", "131072",
                                  "--gen-shards", "48", "--answers-dir", "train-data/answers", *extra])  # fmt: skip
        train_args = {k: v for k, v in vars(args).items() if isinstance(v, (int, float, str, bool, type(None)))}
        record = {"aux_layers": [1, 14, 26], "data": {"shards": 48, "text_shards": 8, "tokens": 1},
                  "minutes": {"train": 1.0}, "train_args": train_args}  # fmt: skip
        card = model_card(record)
        command = card.split("## Reproduce\n```\n")[1].split("```")[0].replace("\\\n", " ").split()
        assert command[:2] == ["sage", "train-draft"]
        again = vars(parser.parse_args(command[2:]))
        for key in (
            "kind",
            "steps",
            "batch_size",
            "lr",
            "seq_len",
            "text_tokens",
            "gen_shards",
            "answers_dir",
            "intermediate",
            "head_vocab",
            "ttt_steps",
            "seed",
            "amp",
            "length_groups",
            "gen_max_new_tokens",
        ):
            assert again[key] == train_args[key], key
        assert ("bf16 autocast" in card) == (args.amp == "bf16")
