"""Where a served window's time goes: SGLang's scheduler passes under closed-loop clients, plain against SAGE.

``sage bench-serving`` says how many tokens a second each server served; this says why, pass by pass.  Each method's
server is launched alone (the bench's own launch arguments, ``sage_plugin.bench.serving.method_args``) with
``tools/step_trace/`` on its ``PYTHONPATH``, whose ``sitecustomize.py`` times every ``Scheduler.run_batch`` call
(forward mode, batch size, wall time).  ``--clients`` closed-loop clients then send the prompt file's requests
(greedy, ``ignore_eos``, ``--max-new-tokens`` each) for ``--warmup`` seconds unmeasured and ``--seconds`` measured;
the passes inside the measured window are summed:

* **decode** passes (a plain step, or a SAGE step of any tier): count, share of the window, mean ms, mean requests
  (the running batch's occupancy: requests that finish at different steps leave slots empty until their successors
  are admitted);
* **prefill** passes (admissions; every running request waits for each): the same;
* **rest**: the scheduler's own bookkeeping, request intake and idle time;
* **ms a token in decode**: decode seconds over the tokens the decode passes emitted (the window's tokens less one a
  prefilled request), the steady-state cost SAGE's tier table prices, next to the served tokens a second.

Usage (repository root, after ``tools/setup.sh --sglang``; one method at a time, about 2.5 minutes each)::

    .venv/bin/python tools/step_accounting.py --methods plain,sage --clients 16 --seconds 60
    .venv/bin/python tools/step_accounting.py --methods sage --clients 16 -- --min-free-slots-delay 1

Flags after ``--`` go to every launched server (SGLang's command line; later flags win over the ``--config`` file).
A measurement tool: nothing in the package imports it; ``tests/unit/test_step_accounting.py`` checks its summary.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TRACER_DIR = REPO / "tools" / "step_trace"
#: SGLang 0.5.23's ``ForwardMode`` values the summary names; any other is reported by number
MODES = {1: "prefill", 2: "decode", 3: "mixed"}


def summarize(passes: list[list[float]], start: float, end: float, tokens: int) -> dict:
    """Sum the passes ``[mode, batch_size, t0, t1]`` that lie inside ``[start, end]``.

    Returns ``{"window_s", "tokens", "tok_s", "modes": {name: {"passes", "share", "mean_ms", "mean_requests",
    "requests"}}, "rest_share", "decode_ms_per_token"}``.  Worked example: a 1 s window with two decode passes of
    0.4 s over 8 requests and one prefill of 0.1 s admitting 2, 18 tokens served: decode share 0.8, mean 400 ms,
    8 requests; prefill share 0.1; rest 0.1; decode emitted 18 - 2 = 16 tokens, 50 ms a token.
    """
    window = end - start
    modes: dict[str, dict[str, float]] = {}
    for mode, bs, t0, t1 in passes:
        if t0 < start or t1 > end:
            continue
        row = modes.setdefault(MODES.get(int(mode), f"mode {int(mode)}"), {"passes": 0, "seconds": 0.0, "requests": 0})
        row["passes"] += 1
        row["seconds"] += t1 - t0
        row["requests"] += bs
    busy = sum(r["seconds"] for r in modes.values())
    out = {
        name: {"passes": r["passes"], "share": r["seconds"] / window, "mean_ms": 1000 * r["seconds"] / r["passes"],
               "mean_requests": r["requests"] / r["passes"], "requests": r["requests"]}
        for name, r in modes.items()
    }  # fmt: skip
    decode = modes.get("decode")
    emitted = tokens - (modes["prefill"]["requests"] if "prefill" in modes else 0)
    return {
        "window_s": window, "tokens": tokens, "tok_s": tokens / window, "modes": out, "rest_share": 1 - busy / window,
        "decode_ms_per_token": 1000 * decode["seconds"] / emitted if decode and emitted > 0 else None,
    }  # fmt: skip


def format_summary(method: str, s: dict) -> str:
    lines = [f"{method}: {s['tokens']} tokens in {s['window_s']:.1f} s = {s['tok_s']:.1f} tok/s; decode "
             f"{s['decode_ms_per_token']:.2f} ms a token" if s["decode_ms_per_token"] else f"{method}: no decode"]  # fmt: skip
    for name, r in sorted(s["modes"].items(), key=lambda kv: -kv[1]["share"]):
        lines.append(f"  {name:8s} {r['passes']:5d} passes  {100 * r['share']:5.1f}%  mean {r['mean_ms']:6.1f} ms  "
                     f"{r['mean_requests']:5.2f} requests")  # fmt: skip
    lines.append(f"  rest                  {100 * s['rest_share']:5.1f}%")
    for tier, t in (s.get("sage_tiers") or {}).items():
        if "steps" in t:
            lines.append(f"  tier {tier:6s} {t['steps']:5d} steps  {t['mean_tokens']:.2f} tokens a request")
    return "\n".join(lines)


def _drive(server, requests: list[dict], clients: int, seconds: float, max_new_tokens: int) -> tuple[float, float, int]:
    """``clients`` closed-loop slots, each sending the next request as soon as its last returns, until ``seconds``
    have passed; returns the window ``(start, end, tokens)`` on ``time.perf_counter``'s clock."""
    tokens, lock = [0], threading.Lock()
    start = time.perf_counter()
    stop = start + seconds

    def slot(i: int) -> None:
        j = i
        while time.perf_counter() < stop:
            body = dict(requests[j % len(requests)])
            body["sampling_params"] = {"max_new_tokens": max_new_tokens, "temperature": 0.0, "ignore_eos": True}
            out = server.post("/generate", body)
            with lock:
                tokens[0] += out["meta_info"]["completion_tokens"]
            j += clients

    threads = [threading.Thread(target=slot, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return start, time.perf_counter(), tokens[0]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    own = argv[: argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--methods", default="plain,sage", help="comma list of sage bench-serving method names")
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--seconds", type=float, default=60.0)
    p.add_argument("--warmup", type=float, default=20.0)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--prompts", default=str(REPO / "docs" / "examples" / "heldout_prompts.jsonl"))
    p.add_argument("--num-prompts", type=int, default=24)
    p.add_argument("--config", default=str(REPO / "engine_configs" / "sglang" / "smollm2_cpu_sage.yaml"))
    p.add_argument("--json", help="write the summaries here")
    args = p.parse_args(own)

    from sage_plugin.bench.serving import Server, method_args, serving_requests
    from sage_plugin.data.prompts import load_prompt_file
    from sage_plugin.models import bundled_draft_dir, ensure_smollm2
    from sage_plugin.runtimes.sglang.cpu_env import server_env

    target = ensure_smollm2()
    requests = serving_requests(load_prompt_file(args.prompts, limit=args.num_prompts), target)
    base_env = server_env(os.environ, REPO / ".sglang-libcuda")
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for method in args.methods.split(","):
            prefix = str(Path(tmp) / method)
            env = {**base_env, "SAGE_STEP_TRACE": prefix,
                   "PYTHONPATH": os.pathsep.join(filter(None, [str(TRACER_DIR), base_env.get("PYTHONPATH")]))}  # fmt: skip
            launch = method_args(method, Path(args.config), target, bundled_draft_dir().resolve(), None) + extra
            server = Server(launch, env, Path(tmp) / f"{method}.log", cwd=REPO)
            try:
                _drive(server, requests, args.clients, args.warmup, args.max_new_tokens)
                start, end, tokens = _drive(server, requests, args.clients, args.seconds, args.max_new_tokens)
                sage = (server.get("/server_info").get("internal_states") or [{}])[0].get("sage")
            finally:
                server.stop()
            passes = [json.loads(line) for f in glob.glob(prefix + ".*.jsonl") for line in open(f) if line.strip()]
            results[method] = summarize(passes, start, end, tokens)
            if sage:  # the SAGE server's own tier table: steps and mean tokens per tier (warm-up included)
                results[method]["sage_tiers"] = sage.get("tiers")
            print(format_summary(method, results[method]), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
