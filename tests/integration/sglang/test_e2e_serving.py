"""End to end on CPU: ``python -m sglang.launch_server --config engine_configs/sglang/smollm2_cpu_sage.yaml``.

Two servers started as a user would (the tier's ``servers`` pair, ``conftest.py``: in their own process groups, torn
down after the tier): plain decoding and SAGE (from the YAML engine config, draft = the bundled trained draft, else
the target's first 4 layers).  Greedy outputs must be token-identical; concurrency, abort and KV-pool accounting are
checked on the SAGE server; tiers, overlap scheduling and tensor parallelism on servers of their own.  EAGLE heads and
every request parameter: ``test_conformance.py``.
"""

from __future__ import annotations

import threading
import time

import pytest

pytest.importorskip("sglang")

from sage_plugin.bench.serving import Server, parallel, plain_flags  # noqa: E402

from .conftest import CPU_CONFIG, draft_dir, launch_servers  # noqa: E402
from .mm_client import kv_returns  # noqa: E402

pytestmark = pytest.mark.slow

#: the plain server: the same YAML without its speculative / SAGE keys (what ``sage bench-serving`` compares)
PLAIN_FLAGS = plain_flags(CPU_CONFIG)


def _prompts(n: int) -> list[str]:
    from sage_plugin.data.prompts import mixed_text_prompts, render_chat
    from sage_plugin.models import load_tokenizer

    from .conftest import TARGET_DIR

    tok = load_tokenizer(TARGET_DIR)
    return [tok.decode(render_chat(tok, p)) for p in mixed_text_prompts(n)]


@pytest.mark.fresh_pair  # its drafted rounds need a control no other test's traffic has turned off (conftest.py)
def test_greedy_outputs_equal_plain_serving_on_20_prompts(servers, kv_start):
    plain, sage = servers
    prompts = _prompts(20)
    ref = parallel(lambda p: plain.generate(p, 32), prompts)
    got = parallel(lambda p: sage.generate(p, 32), prompts)
    same = [r["output_ids"] == g["output_ids"] for r, g in zip(ref, got)]
    assert all(same), [(i, r["text"], g["text"]) for i, (r, g, s) in enumerate(zip(ref, got, same)) if not s]
    accept = [g["meta_info"]["spec_accept_length"] for g in got]
    assert sum(accept) / len(accept) > 1.0, accept
    for (
        g
    ) in got:  # per-request SAGE summary (request_meta.py): one entry, a drafted round or an off step per verify step
        meta = g["meta_info"]
        [summary] = meta["sage"]
        assert summary["rounds"] + summary["off_steps"] == meta["spec_verify_ct"], meta
        if summary["rounds"]:
            assert 0.0 <= summary["mean_alpha"] <= 1.0 and 2 <= summary["mean_depth"] <= 6, summary
            assert 1 <= summary["mean_width"] <= 4 and 1 <= summary["mean_shaped_nodes"] <= 11, summary
    assert sum(g["meta_info"]["sage"][0]["rounds"] for g in got) > 0
    assert "sage" not in ref[0]["meta_info"]  # plain serving is untouched


def test_16_concurrent_mixed_lengths_equal_plain(servers, kv_start):
    plain, sage = servers
    prompts = _prompts(16)
    lengths = [4 + 5 * (i % 7) for i in range(16)]
    jobs = list(zip(prompts, lengths))
    ref = parallel(lambda j: plain.generate(*j), jobs)
    got = parallel(lambda j: sage.generate(*j), jobs)
    for (_, n), r, g in zip(jobs, ref, got):
        assert g["output_ids"] == r["output_ids"], (n, r["text"], g["text"])
        assert g["meta_info"]["completion_tokens"] <= n


def test_abort_request_and_sage_metrics(servers, kv_start):
    _, sage = servers
    rid = "sage-abort-test"
    box: dict = {}
    t = threading.Thread(target=lambda: box.update(sage.generate(_prompts(1)[0], 2000, rid=rid)))
    t.start()
    time.sleep(8)
    sage.post("/abort_request", {"rid": rid})
    t.join(timeout=300)
    assert not t.is_alive()
    finish = box["meta_info"]["finish_reason"]
    assert finish["type"] == "abort", finish
    assert box["meta_info"]["completion_tokens"] < 2000
    info = sage.get("/server_info")["internal_states"][0]["sage"]
    assert info["sage_rounds"] > 0
    assert 0.0 <= info["sage_mean_alpha"] <= 1.0
    assert 2 <= info["sage_mean_depth"] <= 6 and 1 <= info["sage_mean_width"] <= 4
    assert info["sage_mean_accept_length"] >= 1.0
    # the same counters as Prometheus gauges (--enable-metrics), next to SGLang's own spec gauges
    metrics = {line.split("{")[0]: float(line.rsplit(" ", 1)[1]) for line in sage.get_text("/metrics").splitlines()
               if line.startswith("sglang:sage_") or line.startswith("sglang:spec_accept_length")}  # fmt: skip
    assert metrics.get("sglang:sage_rounds", 0) > 0, metrics
    assert 0.0 <= metrics["sglang:sage_mean_alpha"] <= 1.0 and 2 <= metrics["sglang:sage_mean_depth"] <= 6, metrics
    assert metrics["sglang:sage_mean_accept_length"] >= 1.0 and "sglang:spec_accept_length" in metrics


def test_kv_pool_returns_to_its_starting_free_size(servers, kv_start):
    _, sage = servers
    info = kv_returns(sage, kv_start)
    assert info["kv_available_tokens"] == kv_start, (info, kv_start)


def test_logprobs_match_plain(servers):
    """``return_logprob`` through SAGE's steps (whichever tiers the chooser runs: drafted ones, the off tier's DECODE
    forward of off_decode.py): the same tokens with the log-probabilities plain serving reports for them, and the same
    top alternatives."""
    plain, sage = servers
    prompts = _prompts(4)
    params = {"max_new_tokens": 24, "temperature": 0.0}
    body = {"sampling_params": params, "return_logprob": True, "top_logprobs_num": 2}
    ref = parallel(lambda p: plain.post("/generate", {"text": p, **body}), prompts)
    got = parallel(lambda p: sage.post("/generate", {"text": p, **body}), prompts)
    for r, g in zip(ref, got):
        assert g["output_ids"] == r["output_ids"]
        rl, gl = r["meta_info"]["output_token_logprobs"], g["meta_info"]["output_token_logprobs"]
        assert len(gl) == len(rl) == len(r["output_ids"])
        for (rv, rt, _), (gv, gt, _) in zip(rl, gl):
            assert gt == rt and gv == pytest.approx(rv, abs=1e-3)
        rtop, gtop = r["meta_info"]["output_top_logprobs"], g["meta_info"]["output_top_logprobs"]
        for ra, ga in zip(rtop, gtop):
            assert [t for _, t, _ in ga] == [t for _, t, _ in ra]
            assert [v for v, _, _ in ga] == pytest.approx([v for v, _, _ in ra], abs=1e-3)


def test_sampling_requests_are_sampled_not_argmax(servers, kv_start):
    """temperature > 0 on CPU: SGLang 0.5.23 alone would verify greedily (argmax text); with the plugin's CPU
    sampling kernels the SAGE server samples (the kernels' losslessness is tested in tests/unit)."""
    plain, sage = servers
    prompts = _prompts(4)
    greedy = parallel(lambda p: plain.generate(p, 24), prompts)
    params = {"max_new_tokens": 24, "temperature": 1.0, "top_p": 0.95, "top_k": 50}
    sampled = parallel(lambda p: sage.post("/generate", {"text": p, "sampling_params": params}), prompts)
    assert any(s["output_ids"] != g["output_ids"] for s, g in zip(sampled, greedy))
    for s in sampled:
        assert s["meta_info"]["completion_tokens"] >= 1 and s["meta_info"]["spec_verify_ct"] >= 1


def test_tiers_cycle_and_equal_plain(servers, target_dir, launch_env, tmp_path):
    """``--sage-tiers``: every tier (speculation off included) is built at start-up through SGLang's adaptive runtime
    states and runs (a probe every 2 steps cycles them); outputs stay token-identical to plain serving, the KV pool
    returns to its start, and the server reports each tier's steps, expected tokens and measured cost.  The server
    keeps SGLang's overlap scheduler (``--sage-cpu-overlap true``: the path GPU servers take, the tier chooser's
    feedback a step late) where the module's default server runs without it, and verifies ragged
    (``--sage-ragged-verify true``: nodes below the chooser's break-even are neither computed nor accepted)."""
    plain, _ = servers
    tiers = [[0, 1], [1, 2], [3, 5], [6, 11]]
    server = Server(["--config", str(CPU_CONFIG), "--model-path", str(target_dir),
                     "--speculative-draft-model-path", str(draft_dir(target_dir)),
                     "--sage-tiers", str(tiers), "--sage-tier-probe-every", "2", "--sage-tier-off-lag", "8",
                     "--sage-cpu-overlap", "true", "--sage-ragged-verify", "true"],
                    launch_env, tmp_path / "tiers.log")  # fmt: skip
    try:
        assert server.get("/server_info")["disable_overlap_schedule"] is False
        server.post("/flush_cache", {})
        kv0 = server.get("/server_info")["internal_states"][0]["sage"]["kv_available_tokens"]
        prompts = _prompts(12)
        ref = parallel(lambda p: plain.generate(p, 32), prompts)
        got = parallel(lambda p: server.generate(p, 32), prompts)
        seq = [server.generate(p, 32) for p in prompts[:3]]  # batch 1 too: tiers are measured per batch size
        kv_returns(server, kv0)
        info = server.get("/server_info")
    finally:
        server.stop()
    for r, g in zip(ref + ref[:3], got + seq):
        assert g["output_ids"] == r["output_ids"], (r["text"], g["text"])
        meta = g["meta_info"]
        summary = meta["sage"][0]  # drafted rounds, and steps at the off tier (they verify the root alone)
        assert summary["rounds"] + summary["off_steps"] == meta["spec_verify_ct"], meta
    sage = info["internal_states"][0]["sage"]
    report = sage["tiers"]
    for t in tiers:
        row = report[f"{t[0]}:{t[1]}"]
        assert row["steps"] > 0 and row["tokens"] is not None and row["tokens"] >= 1.0, report
        assert any(k.startswith("ms@") and v > 0 for k, v in row.items()), report
    assert report["0:1"]["tokens"] == 1.0
    # the draft is useful (its head ids map back to the vocabulary): the deep tier's mean over all it served (its
    # current estimate follows the last steps, a few batch-1 steps of one prompt)
    assert report["6:11"]["mean_tokens"] > 1.5, report
    # beside what it served, the tokens the chooser expected of the steps it chose (the estimate's bias, per size)
    assert any(k.startswith("served@") and report["6:11"][k.replace("served", "expected")] >= 1.0
               for k in report["6:11"]), report  # fmt: skip
    assert sage["tier_switches"] > 0
    # the off tier skipped its draft extends and the draft caught up before drafting again (off_lag.py)
    assert sage["off_lag"]["skipped_extends"] > 0 and sage["off_lag"]["catch_ups"] > 0, sage
    # ... and the catch-ups were priced apart from the drafted steps they preceded (serving/tiers.py, "A lagging draft")
    assert any(k.startswith("catch_up_ms@") and v > 0 for k, v in report["overhead"].items()), report
    # every off step's verify forward ran as a DECODE forward (tier_off_decode, off_decode.py)
    assert sage["off_decode_steps"] == report["0:1"]["steps"], sage
    # the standalone draft's forwards ran the lean decoder (cpu_lean_draft, lean_draft.py)
    assert sage["lean_draft_forwards"] > 0, sage
    # ... through the one-call-a-layer-side kernel where it builds (csrc/llama_decoder.cpp)
    from sage_plugin.kernels.llama_decoder import decoder_kernel

    assert (sage["lean_draft_kernel_forwards"] > 0) == (decoder_kernel() is not None), sage
    # drafted steps verified ragged, some rows dropped (ragged_verify.py)
    ragged = sage["ragged_verify"]
    assert ragged["steps"] > 0 and 0 < ragged["rows"] < ragged["rows_drafted"], sage
    assert sage["kv_available_tokens"] == kv0, (sage, kv0)
    # the CPU config bounds SGLang's min-free-slots delayer's hold (admission_hold.py; releases: test_admission_hold.py)
    assert sage["admission_hold"]["steps"] == 10 and sage["admission_hold"]["released"] >= 0, sage
    log = (tmp_path / "tiers.log").read_text()
    assert "Built adaptive runtime state steps=0" in log and "Switch adaptive runtime state" not in log


def test_tensor_parallel_tiers_equal_plain(target_dir, launch_env, tmp_path):
    """``--tp-size 2`` on CPU (gloo, one core per rank; the plugin keeps SGLang from building a PyNccl communicator
    without CUDA): SAGE with its restricted draft vocabulary split across the ranks and tiers chosen from rank 0's
    timings serves the plain TP=2 server's tokens; ranks running different shapes would fail the step.  Sampling
    requests take ``tp_sync: auto``'s tree broadcast."""
    import os

    if (os.cpu_count() or 1) < 2:
        pytest.skip("two tensor-parallel ranks need two cores")
    env = {**launch_env, "SGLANG_CPU_OMP_THREADS_BIND": "0|1"}
    tiers = [[0, 1], [1, 2], [3, 5]]
    plain, sage = launch_servers(
        env,
        (["--model-path", str(target_dir), *PLAIN_FLAGS, "--tp-size", "2"], tmp_path / "plain_tp2.log"),
        (["--config", str(CPU_CONFIG), "--model-path", str(target_dir),
          "--speculative-draft-model-path", str(draft_dir(target_dir)), "--tp-size", "2",
          "--sage-tiers", str(tiers), "--sage-tier-probe-every", "2"], tmp_path / "sage_tp2.log"),
    )  # fmt: skip
    try:
        prompts = _prompts(8)
        ref = parallel(lambda p: plain.generate(p, 32), prompts)
        got = parallel(lambda p: sage.generate(p, 32), prompts)
        # sampling requests: tp_sync auto broadcasts their trees from rank 0 (as SGLang broadcasts their verify)
        params = {"max_new_tokens": 24, "temperature": 1.0, "top_p": 0.95, "top_k": 50}
        syncs = sage.get("/server_info")["internal_states"][0]["sage"]["tp_tree_syncs"]
        sampled = parallel(lambda p: sage.post("/generate", {"text": p, "sampling_params": params}), prompts[:4])
        info = sage.get("/server_info")["internal_states"][0]["sage"]
    finally:
        sage.stop()
        plain.stop()
    for r, g in zip(ref, got):
        assert g["output_ids"] == r["output_ids"], (r["text"], g["text"])
    assert sum(g["meta_info"]["spec_accept_length"] > 1.0 for g in got) >= len(got) // 2  # the drafts are accepted
    for one in sampled:
        assert one["meta_info"]["completion_tokens"] >= 1 and one["meta_info"]["spec_verify_ct"] >= 1, one
    assert syncs == 0 < info["tp_tree_syncs"], info  # greedy batches: no broadcast; sampling ones: rank 0's trees
    report = info["tiers"]
    assert sum(report[f"{s}:{n}"]["steps"] > 0 for s, n in tiers) >= 2 and info["tier_switches"] > 0, info
