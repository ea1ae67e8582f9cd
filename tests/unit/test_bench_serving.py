"""``sage bench-serving`` pieces that need no SGLang: the plain server's flags, the report table, running servers
(``--url``) and the batch / stream loads, against fake HTTP servers."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
import yaml

from sage_plugin.bench.serving import (
    SERVING_METHODS,
    format_table,
    method_args,
    parse_serving_methods,
    plain_flags,
    serving_variants,
    write_serving_plot,
)
from sage_plugin.config import ConfigError
from sage_plugin.runtimes.sglang.args import SageCliArgs, add_sage_arguments, build_sage_config

CPU_CONFIG = Path(__file__).resolve().parents[2] / "engine_configs" / "sglang" / "smollm2_cpu_sage.yaml"


def test_plain_flags_are_the_yaml_without_speculative_keys(tmp_path):
    argv = plain_flags(CPU_CONFIG)
    assert not any(a.startswith(("--speculative", "--sage")) for a in argv)
    data = yaml.safe_load(CPU_CONFIG.read_text())
    for key, value in data.items():
        if key.startswith(("speculative-", "sage-")):
            continue
        i = argv.index(f"--{key}")
        if value is not True:
            assert argv[i + 1] == str(value)
    odd = tmp_path / "c.yaml"
    odd.write_text("device: cpu\nsleep-on-idle: true\nenable-metrics: false\nsage-k: 4\nspeculative-algorithm: sage\n")
    assert plain_flags(odd) == ["--device", "cpu", "--sleep-on-idle"]


def _row(method, bs, tok_s, speedup, accept, sage_means, same):
    a, d, w = sage_means
    return {"method": method, "batch_size": bs, "tok_s": tok_s, "speedup": speedup, "identical": same,
            "accept_length": accept, "p50_latency_s": 4.25, "p99_latency_s": 5.5, "mean_alpha": a, "mean_depth": d,
            "mean_width": w, "requests": 3 * bs}  # fmt: skip


def test_format_table_and_plot(tmp_path):
    report = {
        "max_new_tokens": 64, "draft": "d", "methods": ["plain", "sage"],
        "rows": [_row("plain", 1, 14.8, 1.0, None, (None, None, None), True),
                 _row("sage", 1, 7.7, 0.52, 1.8, (0.41, 2.6, 2.8), True),
                 _row("plain", 8, 52.4, 1.0, None, (None, None, None), True),
                 _row("sage", 8, 28.4, 0.54, None, (None, None, None), False)],
    }  # fmt: skip
    report["rows"][0]["tok_s_repeats"] = [10.0, 20.0]
    report["rows"][1]["tok_s_repeats"] = [8.0, 12.0]  # 0.80x and 0.60x of plain in the same repeats
    table = format_table(report).splitlines()
    assert table[0].startswith("SGLang serving, greedy, 64 new tokens per request")
    assert table[1].startswith("load: batch")  # a report without "load" was measured in batch mode
    assert table[2].startswith("servers: together")  # ... and without "servers" with all servers up at once
    assert table[6] == "| 1 | plain | 14.8 | 1.00x | 1.00-1.00x | - | 4.25 / 5.50 | - | - | - | yes |"
    assert table[7] == "| 1 | sage | 7.7 | 0.52x | 0.60-0.80x | 1.80 | 4.25 / 5.50 | 0.41 | 2.60 | 2.80 | yes |"
    assert table[9] == "| 8 | sage | 28.4 | 0.54x | - | - | 4.25 / 5.50 | - | - | - | NO |"
    assert (
        format_table({**report, "load": "stream", "stream_per_slot": 4})
        .splitlines()[1]
        .startswith("load: stream, 4 requests per client slot")
    )
    assert format_table({**report, "servers": "alternate"}).splitlines()[2].startswith("servers: alternate")
    path = write_serving_plot(report, tmp_path)
    assert path.name == "serving_tok_s.png" and path.stat().st_size > 1000


def test_methods_are_checked_before_any_server_starts():
    assert parse_serving_methods("sage,standalone") == ["plain", "sage", "standalone"]
    assert parse_serving_methods("standalone,plain") == ["plain", "standalone"]
    with pytest.raises(ConfigError, match="unknown 'eagle'"):
        parse_serving_methods("plain,eagle")
    with pytest.raises(ConfigError, match="eagle3-adaptive: needs a trained EAGLE-3 head"):
        parse_serving_methods("sage,eagle3-adaptive")
    assert parse_serving_methods("eagle3,eagle3-adaptive,sage-eagle3", Path("/h")) == [
        "plain", "eagle3", "eagle3-adaptive", "sage-eagle3"]  # fmt: skip
    with pytest.raises(ConfigError, match="distinct"):
        parse_serving_methods("sage,sage")


def test_method_args_launch_sglangs_own_modes_with_the_same_draft():
    t, d = Path("/t"), Path("/d")
    assert method_args("plain", CPU_CONFIG, t, d, None) == ["--model-path", "/t", *plain_flags(CPU_CONFIG)]
    assert method_args("sage", CPU_CONFIG, t, d, None)[:2] == ["--config", str(CPU_CONFIG)]
    single = method_args("sage-single", CPU_CONFIG, t, d, None)
    assert single[:2] == ["--config", str(CPU_CONFIG)] and single[-2:] == ["--sage-tiers", "[]"]
    parser = argparse.ArgumentParser()
    add_sage_arguments(parser)
    cli = SageCliArgs.from_namespace(parser.parse_args(["--sage-tiers", "[[0, 1], [4, 8]]", *single[-2:]]))
    assert build_sage_config(cli).serving.tiers == ()  # the last flag wins: no tiers
    chain = method_args("standalone", CPU_CONFIG, t, d, None)
    flags = dict(zip(chain, chain[1:]))
    assert flags["--speculative-algorithm"] == "STANDALONE" and flags["--speculative-draft-model-path"] == "/d"
    assert (flags["--speculative-num-steps"], flags["--speculative-eagle-topk"],
            flags["--speculative-num-draft-tokens"]) == ("3", "1", "4")  # fmt: skip
    assert flags["--speculative-draft-attention-backend"] == "intel_amx"  # the config's other speculative flags
    assert not any(a.startswith("--sage") for a in chain)
    sizes = {"speculative-num-steps": 6, "speculative-eagle-topk": 4, "speculative-num-draft-tokens": 12}
    tree = method_args("standalone-tree", CPU_CONFIG, t, d, sizes)
    flags = dict(zip(tree, tree[1:]))
    assert (flags["--speculative-num-steps"], flags["--speculative-eagle-topk"],
            flags["--speculative-num-draft-tokens"]) == ("6", "4", "12")  # fmt: skip
    with pytest.raises(ConfigError, match="list sage before it"):
        method_args("standalone-tree", CPU_CONFIG, t, d, None)


def test_method_args_of_the_eagle3_methods():
    """SGLang's EAGLE-3 static tree and its adaptive chain on the head; SAGE over the head from its own config."""
    t, d, h, c3 = Path("/t"), Path("/d"), Path("/h"), Path("/c3.yaml")
    tree = method_args("eagle3", CPU_CONFIG, t, d, None, h, c3)
    flags = dict(zip(tree, tree[1:]))
    assert flags["--speculative-algorithm"] == "EAGLE3" and flags["--speculative-draft-model-path"] == "/h"
    assert (flags["--speculative-num-steps"], flags["--speculative-eagle-topk"],
            flags["--speculative-num-draft-tokens"]) == ("4", "4", "8")  # fmt: skip
    assert "--speculative-adaptive" not in tree and not any(a.startswith("--sage") for a in tree)
    adaptive = method_args("eagle3-adaptive", CPU_CONFIG, t, d, None, h, c3)
    flags = dict(zip(adaptive, adaptive[1:]))
    assert adaptive[-1] == "--speculative-adaptive" and flags["--speculative-eagle-topk"] == "1"  # SGLang: topk 1
    assert method_args("sage-eagle3", CPU_CONFIG, t, d, None, h, c3) == [
        "--config", "/c3.yaml", "--model-path", "/t", "--speculative-draft-model-path", "/h"]  # fmt: skip


def test_serving_requests_render_text_and_image_prompts(tmp_path):
    """Text prompts become the target's chat text; image prompts the processor's text with the image placeholder
    and the image as base64 ``image_data`` (SGLang's native /generate API)."""
    from sage_plugin.bench.serving import serving_requests
    from sage_plugin.data.prompts import load_prompts, mixed_text_prompts
    from sage_plugin.engines.vlm import build_tiny_vlm

    target = build_tiny_vlm("qwen2_vl", tmp_path / "tiny")
    text, image = mixed_text_prompts(1)[0], load_prompts("vlm", 1)[0]
    plain, vlm = serving_requests([text, image], target)
    assert set(plain) == {"text"} and text.messages[-1]["content"] in plain["text"]
    assert plain["text"].rstrip().endswith("assistant")
    assert "<|vision_start|><|image_pad|><|vision_end|>" in vlm["text"]
    assert image.messages[-1]["content"] in vlm["text"]
    assert len(vlm["image_data"]) == 1 and vlm["image_data"][0].startswith("data:image/png;base64,")


class _FakeSGLang:
    """A stand-in for a running SGLang server: ``/health``, ``/server_info`` and a greedy ``/generate`` whose output
    ids are a function of the prompt text (``shift`` changes them, as a server with another model would; with
    ``shift_text`` only that prompt's).  Each ``/generate`` takes ``delay`` seconds; ``max_in_flight`` is the most
    requests it ever served at once."""

    def __init__(
        self, shift: int = 0, accept: float | None = None, delay: float = 0.0, shift_text: str | None = None
    ) -> None:
        import http.server
        import json
        import threading
        import time

        self.requests: list[dict] = []
        self.in_flight = self.max_in_flight = 0
        lock = threading.Lock()
        fake = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def _send(self, body: dict) -> None:
                data = json.dumps(body).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                if self.path == "/health":
                    self._send({})
                elif self.path == "/server_info":
                    self._send({"speculative_algorithm": None if accept is None else "SAGE", "internal_states": [{}]})
                else:
                    self.send_error(404)

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with lock:
                    fake.requests.append(body)
                    fake.in_flight += 1
                    fake.max_in_flight = max(fake.max_in_flight, fake.in_flight)
                time.sleep(delay)
                with lock:
                    fake.in_flight -= 1
                n = body["sampling_params"]["max_new_tokens"]
                k = shift if shift_text in (None, body["text"]) else 0
                ids = [(len(body["text"]) + i + k) % 97 for i in range(n)]
                meta = {"completion_tokens": n}
                if accept is not None:
                    meta["spec_accept_length"] = accept
                self._send({"output_ids": ids, "meta_info": meta})

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def test_url_names_are_parsed_and_join_the_methods():
    from sage_plugin.bench.serving import parse_urls

    urls = parse_urls(["plain=http://h:1", "gpu-sage=https://g.example:8443/"])
    assert urls == {"plain": "http://h:1", "gpu-sage": "https://g.example:8443/"}
    assert parse_serving_methods("sage", None, urls) == ["plain", "sage", "gpu-sage"]
    assert parse_serving_methods("gpu-sage,plain", None, urls) == ["plain", "gpu-sage"]
    # a running EAGLE-3 server needs no local head
    assert parse_serving_methods("eagle3", None, {"eagle3": "http://h:2"}) == ["plain", "eagle3"]
    for bad in ("plain", "plain=", "=http://h:1", "plain=h:1", "plain=ftp://h:1", "plain=http://"):
        with pytest.raises(ConfigError, match="--url must be NAME=http://HOST:PORT"):
            parse_urls([bad])
    with pytest.raises(ConfigError, match="'plain' given twice"):
        parse_urls(["plain=http://a:1", "plain=http://b:1"])
    with pytest.raises(ConfigError, match="unknown 'gpu'.*or a --url NAME"):
        parse_serving_methods("gpu", None, urls)


def test_bench_serving_runs_against_running_servers(tmp_path, monkeypatch):
    """``--url`` servers are benched in the same rotation, nothing is launched, outputs are compared with plain's."""
    import sage_plugin.bench.serving as serving

    def no_launch(*args, **kwargs):
        raise AssertionError("a --url method must not launch a server")

    monkeypatch.setattr(serving, "Server", no_launch)
    plain, same, other = _FakeSGLang(), _FakeSGLang(accept=2.5), _FakeSGLang(shift=1, accept=1.5)
    try:
        requests = [{"text": "a" * n} for n in (3, 5, 8)]
        urls = {"plain": plain.url, "sage": same.url, "elsewhere": other.url}
        methods = parse_serving_methods("sage", None, urls)
        report = serving.run_serving_bench(
            config=CPU_CONFIG, target=Path("/t"), draft=Path("/d"), env={}, log_dir=tmp_path, batch_sizes=[1, 2],
            max_new_tokens=4, repeats=2, requests=requests, methods=methods, urls=urls,
        )  # fmt: skip
    finally:
        for s in (plain, same, other):
            s.close()
    rows = {(r["method"], r["batch_size"]): r for r in report["rows"]}
    assert set(rows) == {(m, b) for m in ("plain", "sage", "elsewhere") for b in (1, 2)}
    assert all(rows[("sage", b)]["identical"] and not rows[("elsewhere", b)]["identical"] for b in (1, 2))
    assert rows[("sage", 2)]["accept_length"] == 2.5 and rows[("plain", 1)]["accept_length"] is None
    assert rows[("plain", 2)]["speedup"] == 1.0 and rows[("sage", 1)]["requests"] == 2
    assert report["urls"] == urls and report["sage_state"] == {"sage": None}
    # every server got the warm-up (2 requests of 8 tokens), then at each batch size one unmeasured batch of that
    # size (the first measured batch's requests) and the same measured batches: 2 x 1 + 2 x 2 requests
    assert report["warmup"] == 1
    for fake in (plain, same, other):
        sizes = [r["sampling_params"]["max_new_tokens"] for r in fake.requests]
        assert sizes.count(8) == 2 and sizes.count(4) == 1 + 2 + 6
        assert [r["text"] for r in fake.requests[2:4]] == ["aaa", "aaa"]  # batch size 1: warm-up, then repeat 0
        assert sorted(r["text"] for r in fake.requests[2:]) == sorted(r["text"] for r in plain.requests[2:])


def test_sage_means_weigh_drafted_rounds_and_skip_off_only_requests():
    """A request served at the speculation-off tier only carries no alpha/D/W; the means are over drafted rounds."""
    from sage_plugin.bench.serving import _round_mean

    summaries = [{"rounds": 3, "off_steps": 1, "mean_alpha": 0.2}, {"rounds": 0, "off_steps": 9},
                 {"rounds": 1, "off_steps": 0, "mean_alpha": 0.6}]  # fmt: skip
    assert _round_mean(summaries, "mean_alpha") == pytest.approx((3 * 0.2 + 0.6) / 4)
    assert _round_mean([{"rounds": 0, "off_steps": 4}], "mean_alpha") is None and _round_mean([], "mean_alpha") is None


def test_a_url_that_does_not_answer_is_one_clear_error(tmp_path):
    from sage_plugin.bench.serving import RemoteServer

    fake = _FakeSGLang()
    url = fake.url
    fake.close()
    with pytest.raises(ConfigError, match=r"--url sage=http://127\.0\.0\.1:\d+: the server does not answer /health"):
        RemoteServer("sage", url)


# ------------------------------------------------------------------------------------------ --load


def _load_bench(tmp_path, plain: _FakeSGLang, other: _FakeSGLang, load: str, **kw):
    from sage_plugin.bench.serving import run_serving_bench

    requests = [{"text": "p" * (i + 1)} for i in range(10)]
    return run_serving_bench(
        config=CPU_CONFIG, target=Path("/t"), draft=Path("/d"), env={}, log_dir=tmp_path, batch_sizes=[3],
        max_new_tokens=5, repeats=2, requests=requests, methods=["plain", "sage"],
        urls={"plain": plain.url, "sage": other.url}, warmup=0, load=load, **kw,
    )  # fmt: skip


@pytest.fixture
def fakes():
    made: list[_FakeSGLang] = []

    def make(**kw) -> _FakeSGLang:
        made.append(_FakeSGLang(delay=0.02, **kw))
        return made[-1]

    yield make
    for f in made:
        f.close()


def test_parallel_caps_requests_in_flight_and_keeps_order():
    import threading
    import time

    from sage_plugin.bench.serving import parallel

    live = [0]
    peak = [0]
    lock = threading.Lock()

    def work(x: int) -> int:
        with lock:
            live[0] += 1
            peak[0] = max(peak[0], live[0])
        time.sleep(0.05 + 0.01 * (x % 3))
        with lock:
            live[0] -= 1
        return x * x

    assert parallel(work, list(range(12)), concurrency=3) == [x * x for x in range(12)]
    assert peak[0] == 3
    peak[0] = 0
    assert parallel(work, list(range(5))) == [x * x for x in range(5)]  # no cap: all at once
    assert peak[0] == 5


def test_stream_load_serves_slots_times_requests_through_b_slots(tmp_path, fakes):
    plain, sage = fakes(), fakes()
    report = _load_bench(tmp_path, plain, sage, "stream", stream_per_slot=4)
    rows = {r["method"]: r for r in report["rows"]}
    assert report["load"] == "stream" and report["stream_per_slot"] == 4
    assert rows["sage"]["requests"] == 2 * 4 * 3 and rows["sage"]["load"] == "stream"
    assert rows["sage"]["identical"] and rows["plain"]["speedup"] == 1.0
    for fake in (plain, sage):
        measured = [r["text"] for r in fake.requests[2:]]  # after the start-up warm-up's two requests
        assert len(measured) == 24 and fake.max_in_flight == 3
        # repeat r serves the next 12 prompts of the 10, wrapping around
        assert sorted(measured[:12]) == sorted(["p" * ((i % 10) + 1) for i in range(12)])
    # 24 requests x 5 tokens at 3 in flight, 20 ms each: at most 3 * 5 / 0.02 = 750 tok/s
    assert 0 < rows["sage"]["tok_s"] <= 750


def test_batch_load_sends_each_batch_at_once(tmp_path, fakes):
    plain, sage = fakes(), fakes()
    rows = {r["method"]: r for r in _load_bench(tmp_path, plain, sage, "batch")["rows"]}
    assert rows["sage"]["requests"] == 2 * 3 and rows["sage"]["load"] == "batch"
    assert len(sage.requests) == 2 + 6 and sage.max_in_flight == 3


def test_stream_load_compares_every_output_with_plain(tmp_path, fakes):
    plain, sage = fakes(), fakes(shift=1, shift_text="p" * 2)  # one prompt's answer differs
    rows = {r["method"]: r for r in _load_bench(tmp_path, plain, sage, "stream", stream_per_slot=2)["rows"]}
    assert rows["plain"]["identical"] and not rows["sage"]["identical"]


def test_bad_load_is_refused(tmp_path, fakes):
    plain, sage = fakes(), fakes()
    with pytest.raises(ConfigError, match="--stream-per-slot"):
        _load_bench(tmp_path, plain, sage, "stream", stream_per_slot=0)
    with pytest.raises(ConfigError, match="--load"):
        _load_bench(tmp_path, plain, sage, "flood")


def test_length_range_gives_each_prompt_its_own_cap_on_every_server(tmp_path, fakes):
    """``--length-range-ratio``: each prompt carries one output cap drawn from [R, 1] x max_new_tokens, the same on
    every server and repeat; the cap travels as ``max_new_tokens`` and never as a field of the payload."""
    from sage_plugin.bench.serving import CAP_KEY, output_caps

    plain, sage = fakes(), fakes()
    report = _load_bench(tmp_path, plain, sage, "stream", stream_per_slot=4, length_ratio=0.4)
    caps = dict(zip(["p" * (i + 1) for i in range(10)], output_caps(10, 5, 0.4), strict=True))
    assert len(set(caps.values())) > 1 and min(caps.values()) >= 2
    for fake in (plain, sage):
        measured = fake.requests[2:]
        assert len(measured) == 24 and all(CAP_KEY not in r for r in fake.requests)
        assert all(r["sampling_params"]["max_new_tokens"] == caps[r["text"]] for r in measured)
        assert all(r["sampling_params"]["max_new_tokens"] == min(8, caps[r["text"]]) for r in fake.requests[:2])
    assert report["length_range_ratio"] == 0.4 and "output caps drawn per prompt from [0.4, 1] x 5" in format_table(
        report
    )
    assert all(r["identical"] for r in report["rows"])


def test_bad_length_range_is_refused_before_any_request(tmp_path, fakes):
    plain, sage = fakes(), fakes()
    for ratio in (0.0, 1.5):
        with pytest.raises(ConfigError, match="--length-range-ratio must be in"):
            _load_bench(tmp_path, plain, sage, "stream", length_ratio=ratio)
    assert plain.requests == [] and sage.requests == []


def test_variants_are_sage_servers_with_extra_sage_flags():
    text = "sage,ragged=sage:ragged_verify=true,tier_probe_every=4,one=sage-single:tiers=[[0,1],[1,2]]"
    assert parse_serving_methods(text) == ["plain", "sage", "ragged", "one"]
    assert serving_variants(text, SERVING_METHODS) == {
        "ragged": ("sage", ["--sage-ragged-verify", "true", "--sage-tier-probe-every", "4"]),
        "one": ("sage-single", ["--sage-tiers", "[[0, 1], [1, 2]]"]),
    }
    with pytest.raises(ConfigError, match="ragged_verify"):
        serving_variants("bad=sage:ragged_verify=maybe", SERVING_METHODS)
    with pytest.raises(ConfigError, match="SAGE options need a SAGE method"):
        serving_variants("bad=standalone:ragged_verify=true", SERVING_METHODS)
    with pytest.raises(ConfigError, match="variant is NAME=METHOD"):
        serving_variants("bad=nosuch:ragged_verify=true", SERVING_METHODS)
    with pytest.raises(ConfigError, match="distinct"):
        parse_serving_methods("sage,sage=sage:ragged_verify=true")


def test_variants_pass_sglang_flags_on_any_method():
    """An option spelled ``--flag=value`` (or a bare ``--switch``) is an SGLang server flag, for every method (plain
    included), after the SAGE flags; a ``--sage-`` flag or a malformed one is refused (SAGE options are SageConfig
    fields)."""
    text = "sage,pd=plain:--min-free-slots-delay=4,sd=sage:ragged_verify=true,--min-free-slots-delay=4"
    assert parse_serving_methods(text) == ["plain", "sage", "pd", "sd"]
    assert serving_variants(text, SERVING_METHODS) == {
        "pd": ("plain", ["--min-free-slots-delay", "4"]),
        "sd": ("sage", ["--sage-ragged-verify", "true", "--min-free-slots-delay", "4"]),
    }
    switches = "sage,no=plain:--disable-overlap-schedule,ov=sage:cpu_overlap=true,--disable-radix-cache"
    assert parse_serving_methods(switches) == ["plain", "sage", "no", "ov"]
    assert serving_variants(switches, SERVING_METHODS) == {
        "no": ("plain", ["--disable-overlap-schedule"]),
        "ov": ("sage", ["--sage-cpu-overlap", "true", "--disable-radix-cache"]),
    }
    with pytest.raises(ConfigError, match="must be field=value"):
        serving_variants("x=sage:ragged_verify", SERVING_METHODS)
    for bad in ("x=sage:--sage-ragged-verify=true", "x=plain:--Bad_Flag=1", "x=plain:-v=1", "x=plain:--Bad"):
        with pytest.raises(ConfigError, match="not an SGLang flag"):
            serving_variants(bad, SERVING_METHODS)


# ------------------------------------------------------------------------------------------ --servers alternate


class _Launches:
    """A stand-in for ``Server`` (a launched ``sglang.launch_server``): each launch is a new fake HTTP server, the
    SAGE one answering ``/server_info`` with its sizes, the one logging to a name in ``odd`` answering that prompt
    differently; records every launch's method, argv and fake, and how many launched servers were ever up at once."""

    SIZES = {"speculative_num_steps": 6, "speculative_eagle_topk": 4, "speculative_num_draft_tokens": 12}

    def __init__(self, odd: dict[str, str] | None = None) -> None:
        self.odd = odd or {}
        self.launched: list[tuple[str, list[str], _FakeSGLang]] = []
        self.live = self.peak = 0

    def __call__(self, argv: list[str], env: dict, log: Path):
        from sage_plugin.bench.servers import HttpServer

        launches, method = self, log.name.split(".")[0]
        shift = {"shift": 1, "shift_text": self.odd[log.name]} if log.name in self.odd else {}
        fake = _FakeSGLang(accept=None if method == "plain" else 2.0, **shift)
        self.launched.append((method, argv, fake))
        self.live += 1
        self.peak = max(self.peak, self.live)

        class Launched(HttpServer):
            base_url = fake.url

            def get(self, path: str) -> dict:
                info = super().get(path)
                return {**info, **launches.SIZES} if method == "sage" else info

            def stop(self) -> None:
                launches.live -= 1
                fake.close()

        return Launched()


def _alternate_bench(tmp_path, monkeypatch, methods: list[str], repeats: int, odd=None, **kw):
    import sage_plugin.bench.serving as serving

    launches = _Launches(odd)
    monkeypatch.setattr(serving, "Server", launches)
    requests = [{"text": "q" * (i + 1)} for i in range(6)]
    report = serving.run_serving_bench(
        config=CPU_CONFIG, target=Path("/t"), draft=Path("/d"), env={}, log_dir=tmp_path, batch_sizes=[1, 2],
        max_new_tokens=4, repeats=repeats, requests=requests, methods=methods, **{"servers": "alternate", **kw},
    )  # fmt: skip
    return report, launches


def test_alternate_servers_run_one_at_a_time_a_fresh_process_per_repeat(tmp_path, monkeypatch):
    report, launches = _alternate_bench(tmp_path, monkeypatch, ["plain", "sage", "standalone"], repeats=3)
    assert launches.peak == 1 and launches.live == 0  # never two up at once, all stopped
    # per repeat each method once, the order rotating: every method first once
    assert [m for m, _, _ in launches.launched] == ["plain", "sage", "standalone", "sage", "standalone", "plain",
                                                    "standalone", "plain", "sage"]  # fmt: skip
    assert report["servers"] == "alternate" and report["launches"] == {"plain": 3, "sage": 3, "standalone": 3}
    rows = {(r["method"], r["batch_size"]): r for r in report["rows"]}
    assert all(r["identical"] and len(r["tok_s_repeats"]) == 3 and r["requests"] == 3 * r["batch_size"]
               for r in rows.values())  # fmt: skip
    assert rows[("sage", 2)]["accept_length"] == 2.0 and rows[("plain", 1)]["speedup"] == 1.0
    for i, (_, _, fake) in enumerate(launches.launched):
        rep = i // 3
        texts = [(q["text"], q["sampling_params"]["max_new_tokens"]) for q in fake.requests]
        # two short warm-up requests, then per batch size one unmeasured batch (repeat 0's) and this repeat's batch
        assert sorted(texts[:2]) == [("q", 8), ("qq", 8)]
        assert texts[2:4] == [("q", 4), ("q" * (rep + 1), 4)]
        assert sorted(texts[4:6]) == [("q", 4), ("qq", 4)]
        assert sorted(texts[6:]) == [("q" * (2 * rep + 1), 4), ("q" * (2 * rep + 2), 4)]
    assert set(report["sage_state"]) == {"sage"}


def test_alternate_servers_compare_outputs_repeat_by_repeat(tmp_path, monkeypatch):
    # the second standalone process (repeat 1) answers "qqq" differently: repeat 1 serves "qq" at batch 1 and
    # "qqq" / "qqqq" at batch 2, so only batch 2 sees the wrong answer
    report, _ = _alternate_bench(tmp_path, monkeypatch, ["plain", "standalone"], 2, odd={"standalone.1.log": "qqq"})
    rows = {(r["method"], r["batch_size"]): r["identical"] for r in report["rows"]}
    assert rows == {("plain", 1): True, ("standalone", 1): True, ("plain", 2): True, ("standalone", 2): False}


def test_alternate_standalone_tree_takes_sages_sizes_whichever_runs_first(tmp_path, monkeypatch):
    _, launches = _alternate_bench(tmp_path, monkeypatch, ["plain", "sage", "standalone-tree"], repeats=3)
    trees = [argv for m, argv, _ in launches.launched if m == "standalone-tree"]
    assert len(trees) == 3  # the last repeat launches it before SAGE: the sizes come from SAGE's first server
    for argv in trees:
        flags = dict(zip(argv, argv[1:]))
        assert (flags["--speculative-num-steps"], flags["--speculative-eagle-topk"],
                flags["--speculative-num-draft-tokens"]) == ("6", "4", "12")  # fmt: skip


def test_bad_server_mode_is_refused_before_any_launch(tmp_path, monkeypatch):
    import sage_plugin.bench.serving as serving

    def no_launch(*args, **kwargs):
        raise AssertionError("launched before the mode was checked")

    monkeypatch.setattr(serving, "Server", no_launch)
    with pytest.raises(ConfigError, match="--servers must be one of together, alternate, got 'mixed'"):
        serving.run_serving_bench(
            config=CPU_CONFIG, target=Path("/t"), draft=Path("/d"), env={}, log_dir=tmp_path, batch_sizes=[1],
            max_new_tokens=4, repeats=1, requests=[{"text": "q"}], methods=["plain", "sage"], servers="mixed",
        )  # fmt: skip


def test_alternate_servers_bench_running_servers_in_the_rotation_and_launch_the_rest(tmp_path, monkeypatch):
    """A ``--url`` method under ``--servers alternate`` is that running server in its turn (checked with ``/health``
    each repeat, never launched or stopped); the other methods are launched one at a time."""
    running = _FakeSGLang(accept=3.0)
    try:
        report, launches = _alternate_bench(tmp_path, monkeypatch, ["plain", "sage"], 2, urls={"sage": running.url})
        assert [m for m, _, _ in launches.launched] == ["plain", "plain"] and launches.peak == 1
        assert report["launches"] == {"plain": 2, "sage": 0}
        rows = {(r["method"], r["batch_size"]): r for r in report["rows"]}
        assert rows[("sage", 1)]["accept_length"] == 3.0 and all(r["identical"] for r in rows.values())
        # the running server served its start-up requests and its batches in both repeats
        assert len(running.requests) == 2 * (2 + 1 + 1 + 2 + 2)
    finally:
        running.close()
