"""``sage bench-serving --load``: batch and closed-loop stream load against fake SGLang servers (no SGLang needed)."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from sage_plugin.bench.serving import parallel, run_serving_bench
from sage_plugin.config import ConfigError


class _FakeServer:
    """``/generate`` answers ``[len(text), n]`` after a short sleep (``shift`` changes the answer of one prompt);
    records every request's text and the most requests ever in flight at once."""

    def __init__(self, shift_text: str | None = None) -> None:
        self.texts: list[str] = []
        self.in_flight = self.max_in_flight = 0
        lock = threading.Lock()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def _send(self, obj: dict) -> None:
                body = json.dumps(obj).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):  # /server_info
                self._send({"speculative_algorithm": None})

            def do_POST(self):  # /generate
                req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with lock:
                    fake.texts.append(req["text"])
                    fake.in_flight += 1
                    fake.max_in_flight = max(fake.max_in_flight, fake.in_flight)
                time.sleep(0.02)
                n = req["sampling_params"]["max_new_tokens"]
                out = [len(req["text"]) + (1 if req["text"] == shift_text else 0), n]
                with lock:
                    fake.in_flight -= 1
                self._send({"output_ids": out, "meta_info": {"completion_tokens": n}})

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def fakes():
    made: list[_FakeServer] = []

    def make(**kw) -> _FakeServer:
        made.append(_FakeServer(**kw))
        return made[-1]

    yield make
    for f in made:
        f.close()


def _bench(tmp_path, plain, other, load, **kw):
    requests = [{"text": "p" * (i + 1)} for i in range(10)]
    return run_serving_bench(
        config=tmp_path / "unused.yaml", target=tmp_path, draft=tmp_path, env={}, log_dir=tmp_path / "logs",
        batch_sizes=[3], max_new_tokens=5, repeats=2, requests=requests, methods=["plain", "sage"],
        urls={"plain": plain.url, "sage": other.url}, warmup=0, load=load, **kw,
    )  # fmt: skip


def test_parallel_caps_requests_in_flight_and_keeps_order():
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
    report = _bench(tmp_path, plain, sage, "stream", stream_per_slot=4)
    rows = {r["method"]: r for r in report["rows"]}
    assert report["load"] == "stream" and report["stream_per_slot"] == 4
    assert rows["sage"]["requests"] == 2 * 4 * 3 and rows["sage"]["load"] == "stream"
    assert rows["sage"]["identical"] and rows["plain"]["speedup"] == 1.0
    for fake in (plain, sage):
        measured = fake.texts[2:]  # after the start-up warm-up's two requests
        assert len(measured) == 24 and fake.max_in_flight == 3
        # repeat r serves the next 12 prompts of the 10, wrapping around
        assert sorted(measured[:12]) == sorted(["p" * ((i % 10) + 1) for i in range(12)])
    # 24 requests x 5 tokens at 3 in flight, 20 ms each: at most 3 * 5 / 0.02 = 750 tok/s
    assert 0 < rows["sage"]["tok_s"] <= 750


def test_batch_load_sends_each_batch_at_once(tmp_path, fakes):
    plain, sage = fakes(), fakes()
    report = _bench(tmp_path, plain, sage, "batch")
    rows = {r["method"]: r for r in report["rows"]}
    assert rows["sage"]["requests"] == 2 * 3 and rows["sage"]["load"] == "batch"
    assert len(sage.texts) == 2 + 6 and sage.max_in_flight == 3


def test_stream_load_compares_every_output_with_plain(tmp_path, fakes):
    plain, sage = fakes(), fakes(shift_text="p" * 2)  # one prompt's answer differs
    rows = {r["method"]: r for r in _bench(tmp_path, plain, sage, "stream", stream_per_slot=2)["rows"]}
    assert rows["plain"]["identical"] and not rows["sage"]["identical"]


def test_bad_load_is_refused(tmp_path, fakes):
    plain, sage = fakes(), fakes()
    with pytest.raises(ConfigError, match="--stream-per-slot"):
        _bench(tmp_path, plain, sage, "stream", stream_per_slot=0)
    with pytest.raises(ConfigError, match="--load"):
        _bench(tmp_path, plain, sage, "flood")
