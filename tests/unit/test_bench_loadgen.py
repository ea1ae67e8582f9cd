"""``sage bench-serving --load sglang`` without SGLang: the load generator's command line, its recorded JSONL result,
the server counters read around each run, the rows, the table and the plots, and the one-server-at-a-time loop
against stand-in servers and a stand-in load generator.

``data/loadgen_result.jsonl`` is one line that ``python -m sglang.benchmark.serving --output-file X
--output-details`` wrote against a plain SmolLM2 SGLang server on CPU (4 out-of-domain prompts, 32 tokens,
concurrency 2), its ``server_info`` and ``itls`` cut to keep it small.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

from sage_plugin.bench.loadgen import (
    LoadPoint,
    LoadSpec,
    compare_texts,
    loadgen_argv,
    parse_loads,
    read_result,
    run_figures,
    server_counters,
    write_custom_prompts,
)
from sage_plugin.bench.loadgen_run import LoadBench, load_rows, run_loadgen_bench
from sage_plugin.bench.serving_report import format_load_table, write_load_plots
from sage_plugin.config import ConfigError

FIXTURE = Path(__file__).parent / "data" / "loadgen_result.jsonl"
CPU_CONFIG = Path(__file__).resolve().parents[2] / "engine_configs" / "sglang" / "smollm2_cpu_sage.yaml"


def test_loads_are_concurrencies_then_poisson_rates():
    points = parse_loads("1,4,16", "0.5")
    assert [p.name for p in points] == ["c1", "c4", "c16", "r0.5"]
    assert points[0] == LoadPoint(1) and math.isinf(points[0].rate) and points[3].concurrency is None
    assert [p.name for p in parse_loads(None, "0.5,2")] == ["r0.5", "r2"]
    for bad in (("0", None), ("1,1", None), ("x", None), (None, "0"), (None, None)):
        with pytest.raises(ConfigError):
            parse_loads(*bad)


def test_argv_runs_the_load_generator_greedy_offline_with_natural_lengths(tmp_path):
    spec = LoadSpec("custom", Path("/t"), Path("p.jsonl"), num_prompts=4, output_len=32)
    argv = loadgen_argv(spec, "http://h:1", LoadPoint(4), Path("o.jsonl"))
    assert argv[:3] == [sys.executable, "-m", "sglang.benchmark.serving"]
    flags = dict(zip(argv, argv[1:]))
    assert flags["--backend"] == "sglang" and flags["--base-url"] == "http://h:1"
    assert flags["--model"] == flags["--tokenizer"] == "/t"  # the local target: no hub
    assert flags["--dataset-name"] == "custom" and flags["--dataset-path"] == "p.jsonl"
    assert "--apply-chat-template" in argv and flags["--sharegpt-output-len"] == "32"
    assert "--disable-ignore-eos" in argv and flags["--temperature"] == "0"  # greedy, stops at EOS
    assert flags["--output-file"] == "o.jsonl" and "--output-details" in argv
    assert flags["--request-rate"] == "inf" and flags["--max-concurrency"] == "4"
    assert flags["--warmup-requests"] == "4"  # one a client: the server has run the batch size before it is timed
    assert "--flush-cache" in argv  # after the warm-up: no prompt is served from an earlier load point's cache
    poisson = loadgen_argv(spec, "http://h:1", LoadPoint(None, 0.5), Path("o.jsonl"))
    assert dict(zip(poisson, poisson[1:]))["--request-rate"] == "0.5" and "--max-concurrency" not in poisson
    ids = loadgen_argv(LoadSpec("random-ids", Path("/t"), output_len=64, input_len=128), "u", LoadPoint(1), Path("o"))
    flags = dict(zip(ids, ids[1:]))
    assert flags["--random-input-len"] == "128" and flags["--random-output-len"] == "64" and "--dataset-path" not in ids
    image = loadgen_argv(LoadSpec("image", Path("/vlm")), "u", LoadPoint(1), Path("o"))
    assert dict(zip(image, image[1:]))["--image-resolution"] == "360p"  # CPU-sized unless given
    image = LoadSpec("image", Path("/vlm"), extra=("--image-resolution", "720p"))
    assert loadgen_argv(image, "u", LoadPoint(1), Path("o"))[-2:] == ["--image-resolution", "720p"]
    with pytest.raises(ConfigError, match="needs prompts"):
        LoadSpec("custom", Path("/t"))
    with pytest.raises(ConfigError, match="--dataset must be one of"):
        LoadSpec("sharegpt", Path("/t"))


def test_custom_prompts_are_conversations_sglang_reads(tmp_path):
    path = write_custom_prompts(["Translate: hello", 'A "quoted" prompt\nover lines'], tmp_path / "p.jsonl")
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["conversations"][0] for r in rows] == [
        {"role": "user", "content": "Translate: hello"}, {"role": "user", "content": 'A "quoted" prompt\nover lines'}]  # fmt: skip
    assert all(len(r["conversations"]) == 2 for r in rows)  # SGLang's custom loader skips one-turn rows


def test_the_recorded_result_and_the_server_counters_give_a_runs_figures():
    assert FIXTURE.stat().st_size < 20_000
    result = read_result(FIXTURE)
    before = {"accept_tokens": 100.0, "forwards": 80.0, "rounds": 10.0, "alpha_sum": 5.0, "depth_sum": 20.0,
              "width_sum": 30.0, "steps": 50.0, "off_steps": 10.0}  # fmt: skip
    # SGLang's accept counts restart at the load generator's flush after its warm-up; SAGE's counters run on
    after = {**before, "accept_tokens": 150.0, "forwards": 100.0, "rounds": 30.0, "alpha_sum": 15.0, "steps": 150.0,
             "off_steps": 60.0}  # fmt: skip
    f = run_figures(result, before, after)
    assert f["completed"] == 4 and len(f["texts"]) == 4 and f["errors"] == []
    assert f["output_tokens"] == result["total_output_tokens"] and f["duration_s"] == result["duration"]
    assert f["median_tpot_ms"] == result["median_tpot_ms"] > 0 and f["p99_ttft_ms"] >= f["median_ttft_ms"] > 0
    assert (f["accept_tokens"], f["forwards"], f["rounds"], f["steps"], f["off_steps"]) == (150, 100, 20, 100, 50)
    assert f["alpha_sum"] == 10.0 and f["depth_sum"] == 0.0
    assert compare_texts(f["texts"], f["texts"]) == 4 and compare_texts(f["texts"], f["texts"][:2] + ["x", "y"]) == 2


def test_server_counters_read_sglangs_totals_and_sages_section():
    info = {"internal_states": [{
        "spec_totals": {"accept_tokens": 300, "forwards": 200},
        "sage": {"sage_rounds": 40, "sage_mean_alpha": 0.5, "sage_mean_depth": 2.0, "sage_mean_width": 1.5,
                 "tiers": {"0:1": {"steps": 30}, "1:2": {"steps": 50}, "3:4": {"steps": 20}, "overhead": {"ms": 1.0}}},
    }]}  # fmt: skip
    c = server_counters(info)
    assert (c["accept_tokens"], c["forwards"], c["rounds"], c["alpha_sum"], c["depth_sum"]) == (300, 200, 40, 20, 80)
    assert (c["steps"], c["off_steps"]) == (100, 30)
    plain = server_counters({"internal_states": [{}]})  # no speculation: zeros, so differences are zero
    assert set(plain.values()) == {0.0}


def _figures(texts: list[str], tokens: int, seconds: float, tpot: float, **counts: float) -> dict:
    base = {"output_tokens": tokens, "duration_s": seconds, "completed": len(texts), "output_tok_s": tokens / seconds,
            "median_tpot_ms": tpot, "p99_tpot_ms": 2 * tpot, "median_ttft_ms": 50.0, "p99_ttft_ms": 90.0,
            "concurrency": 2.0, "texts": texts, "errors": [], "accept_tokens": 0.0, "forwards": 0.0, "rounds": 0.0,
            "alpha_sum": 0.0, "depth_sum": 0.0, "width_sum": 0.0, "steps": 0.0, "off_steps": 0.0}  # fmt: skip
    return {**base, **counts}


def test_rows_table_and_plots(tmp_path):
    """The module docstring's example (plain 2,000 tokens in 100 s, SAGE in 95 s) over two repeats, one output
    differing, and a Poisson load."""
    points = [LoadPoint(4), LoadPoint(None, 0.5)]
    runs = {}
    for r in range(2):
        for p in points:
            runs["plain", p.name, r] = _figures(["a", "b"], 1000, 50.0, 180.0)
            runs["sage", p.name, r] = _figures(["a", "b" if r else "B"], 1000, 47.5, 171.0, accept_tokens=150.0,
                                               forwards=100.0, rounds=40.0, alpha_sum=24.0, depth_sum=80.0,
                                               width_sum=60.0, steps=100.0, off_steps=25.0)  # fmt: skip
    rows = load_rows(runs, ["plain", "sage"], points, repeats=2)
    sage = rows[1]
    assert (sage["method"], sage["load"], sage["concurrency"]) == ("sage", "c4", 4)
    assert sage["tok_s"] == pytest.approx(2000 / 95) and sage["speedup"] == pytest.approx(100 / 95)
    assert sage["speedup_repeats"] == pytest.approx([100 / 95] * 2)
    assert sage["tpot_vs_plain"] == pytest.approx(0.95) and sage["accept_length"] == pytest.approx(1.5)
    assert (sage["mean_alpha"], sage["mean_depth"], sage["mean_width"], sage["off_share"]) == (0.6, 2.0, 1.5, 0.25)
    assert (sage["identical"], sage["outputs"]) == (3, 4)
    assert rows[0]["accept_length"] is None and rows[0]["identical"] == 4  # plain: no speculation
    assert rows[3]["request_rate"] == 0.5 and rows[3]["concurrency"] is None
    report = {"rows": rows, "methods": ["plain", "sage"], "dataset": "custom", "num_prompts": 2,
              "max_new_tokens": 32, "repeats": 2, "draft": "d"}  # fmt: skip
    table = format_load_table(report).splitlines()
    assert table[0].startswith("SGLang serving through SGLang's load generator")
    assert (
        table[4]
        == "| concurrency 4 | plain | 20.0 | 1.00x | 1.00-1.00x | 180.0 / 360.0 | 1.00 | 50 / 90 | - | - | - | - | - | 4/4 |"
    )
    assert table[5] == "| concurrency 4 | sage | 21.1 | 1.05x | 1.05-1.05x | 171.0 / 342.0 | 0.95 | 50 / 90 | 1.50 | 0.60 | 2.00 | 1.50 | 0.25 | 3/4 NO |"  # fmt: skip
    assert table[7].startswith("| Poisson 0.5/s | sage |")
    paths = write_load_plots(report, tmp_path)
    assert [p.name for p in paths] == ["serving_tok_s.png", "serving_tpot.png"]
    assert all(p.stat().st_size > 1000 for p in paths)


class _Server:
    """A launched server stand-in: ``/server_info`` counters that grow with every run of the load generator."""

    live = 0

    def __init__(self, name: str, runs: list) -> None:
        self.name, self.runs, self.base_url = name, runs, f"http://{name}"
        _Server.live += 1
        assert _Server.live == 1, "two servers up at once"

    def get(self, path: str) -> dict:
        n = sum(1 for m, _ in self.runs if m == self.name)
        sage = {
            "sage_rounds": 10 * n,
            "sage_mean_alpha": 0.5,
            "tiers": {"0:1": {"steps": 4 * n}, "1:2": {"steps": 6 * n}},
        }
        # SGLang's accept counts since the load generator's last flush (after its warm-up): the last run's alone
        state = (
            {"spec_totals": {"accept_tokens": 15 * min(n, 1), "forwards": 10 * min(n, 1)}}
            if self.name != "plain"
            else {}
        )
        if self.name == "sage":
            state["sage"] = sage
        return {"internal_states": [state], "speculative_num_steps": 3, "speculative_eagle_topk": 4,
                "speculative_num_draft_tokens": 4}  # fmt: skip

    def stop(self) -> None:
        _Server.live -= 1


def test_one_server_at_a_time_every_load_compared_with_plain(tmp_path, monkeypatch):
    import sage_plugin.bench.loadgen_run as loadgen_run

    runs: list[tuple[str, list[str]]] = []
    launched: list[tuple[str, list[str]]] = []

    def server(argv, env, log):
        name = log.name.split(".")[0]
        launched.append((name, argv))
        return _Server(name, runs)

    def fake_load_generator(argv, env, check, stdout, stderr):
        flags = dict(zip(argv, argv[1:]))
        name = flags["--base-url"].removeprefix("http://")
        runs.append((name, argv))
        result = json.loads(FIXTURE.read_text())
        if name == "standalone" and flags["--max-concurrency"] == "2":
            result["generated_texts"] = result["generated_texts"][:3] + ["something else"]
        Path(flags["--output-file"]).write_text(json.dumps(result) + "\n")

    monkeypatch.setattr(loadgen_run, "Server", server)
    spec = LoadSpec("custom", Path("/t"), write_custom_prompts(["a", "b"], tmp_path / "p.jsonl"), num_prompts=2)
    bench = LoadBench(CPU_CONFIG, Path("/t"), Path("/d"), {}, tmp_path, spec, parse_loads("1,2", None),
                      ["plain", "sage", "standalone"], repeats=2)  # fmt: skip
    report = run_loadgen_bench(bench, run=fake_load_generator)
    order = [name for name, _ in launched]
    assert order == ["plain", "sage", "standalone", "sage", "standalone", "plain"]  # rotated per repeat
    assert report["launches"] == {"plain": 2, "sage": 2, "standalone": 2} and _Server.live == 0
    rows = {(r["method"], r["load"]): r for r in report["rows"]}
    assert rows["standalone", "c2"]["identical"] == 6 and rows["standalone", "c2"]["outputs"] == 8
    assert rows["sage", "c1"]["identical"] == 8 and rows["sage", "c1"]["accept_length"] == pytest.approx(1.5)
    assert rows["sage", "c1"]["off_share"] == pytest.approx(0.4) and rows["sage", "c1"]["mean_alpha"] == 0.5
    assert rows["plain", "c1"]["speedup"] == 1.0 and rows["plain", "c1"]["accept_length"] is None
    assert report["sage_state"]["sage"]["sage_rounds"] > 0 and set(report["sage_state"]) == {"sage"}
    assert len(report["runs"]) == 12 and "texts" not in report["runs"][0]
    # the outputs compared are the load generator's own JSONL lines, one file per method, repeat and load
    assert (tmp_path / "sage.r1.c2.jsonl").exists() and (tmp_path / "sage.r1.c2.log").exists()


def test_a_failed_run_stops_the_server_and_raises(tmp_path, monkeypatch):
    import subprocess

    import sage_plugin.bench.loadgen_run as loadgen_run

    monkeypatch.setattr(loadgen_run, "Server", lambda argv, env, log: _Server(log.name.split(".")[0], []))

    def failing(argv, env, check, stdout, stderr):
        raise subprocess.CalledProcessError(1, argv)

    spec = LoadSpec("random-ids", Path("/t"))
    bench = LoadBench(CPU_CONFIG, Path("/t"), Path("/d"), {}, tmp_path, spec, [LoadPoint(1)], ["plain", "sage"])
    with pytest.raises(subprocess.CalledProcessError):
        run_loadgen_bench(bench, run=failing)
    assert _Server.live == 0


def test_a_variant_is_its_methods_server_with_the_extra_flags(tmp_path, monkeypatch):
    import sage_plugin.bench.loadgen_run as loadgen_run
    from sage_plugin.bench.serving import serving_variants

    launched = []

    def server(argv, env, log):
        launched.append((log.name, argv))
        return _Server(log.name.split(".")[0], [])

    monkeypatch.setattr(loadgen_run, "Server", server)
    text = "sage,measured=sage:tier_control=measured,offlag=sage:tier_off_lag=128"
    bench = LoadBench(CPU_CONFIG, Path("/t"), Path("/d"), {}, tmp_path, LoadSpec("random-ids", Path("/t")),
                      [LoadPoint(1)], ["plain", "sage", "measured", "offlag"],
                      variants=serving_variants(text, ("plain", "sage")))  # fmt: skip
    bench.server("measured").stop()
    bench.server("offlag").stop()
    (log1, argv1), (log2, argv2) = launched
    assert (log1, log2) == ("measured.1.log", "offlag.1.log") and argv1[:2] == ["--config", str(CPU_CONFIG)]
    assert argv1[-2:] == ["--sage-tier-control", "measured"] and argv2[-2:] == ["--sage-tier-off-lag", "128"]
    assert bench.sizes == {"speculative-num-steps": 3, "speculative-eagle-topk": 4, "speculative-num-draft-tokens": 4}


def test_the_command_line_runs_the_load_generator_bench_on_the_chosen_prompts(tmp_path, monkeypatch):
    import sage_plugin.bench.loadgen_run as loadgen_run
    from sage_plugin.cli import main

    seen = {}

    def fake_bench(bench):
        seen["bench"] = bench
        rows = load_rows({(m, p.name, 0): _figures(["x"], 10, 1.0, 100.0) for m in bench.methods for p in bench.points},
                         bench.methods, bench.points, 1)  # fmt: skip
        return {"rows": rows, "methods": bench.methods, "dataset": bench.spec.dataset, "repeats": 1,
                "num_prompts": bench.spec.num_prompts, "max_new_tokens": bench.spec.output_len, "draft": "d"}  # fmt: skip

    monkeypatch.setattr(loadgen_run, "run_loadgen_bench", fake_bench)
    out = tmp_path / "r.json"
    argv = ["bench-serving", "--datasets", "ood", "--num-prompts", "10", "--max-new-tokens", "32", "--request-rates",
            "0.5", "--methods", "plain,sage", "--target", str(tmp_path), "--draft", str(tmp_path), "--log-dir",
            str(tmp_path / "logs"), "--json", str(out)]  # fmt: skip
    assert main(argv) == 0
    bench = seen["bench"]
    assert [p.name for p in bench.points] == ["c1", "c4", "c16", "r0.5"]  # the default concurrencies
    assert bench.methods == ["plain", "sage"] and bench.spec.dataset == "custom" and bench.spec.num_prompts == 10
    rows = [
        json.loads(line)["conversations"][0]["content"] for line in bench.spec.dataset_path.read_text().splitlines()
    ]
    assert len(rows) == 10 and rows[0].startswith("Summarize this text")  # ood_prompts(10): two of each category
    assert json.loads(out.read_text())["machine"]
    with pytest.raises(SystemExit):
        main([*argv, "--servers", "together", "--load", "nope"])
    assert main([*argv, "--servers", "together"]) == 2  # one server at a time only
