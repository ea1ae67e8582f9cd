"""The tier chooser's host reads on a real NVIDIA GPU: step times and the batch alpha, without a sync.

``tests/unit/test_tiers.py`` checks :class:`StepClock` and :class:`HostScalar` (``sage_plugin/runtimes/sglang/
clock.py``) on the CPU with stand-in events.  This script runs them against real CUDA events while the GPU is kept
busy (a queue of large matmuls ahead of every step, so events are often not complete when the host looks):

1. **StepClock**: every step's time comes back, in launch order, within a few steps; none is lost; the times match
   the GPU time of the work between the step's events; no call blocks (``torch.cuda.set_sync_debug_mode("error")``
   around every call, and the host's time per call).
2. **HostScalar, newest completed copy** (one rank): every value read was pushed earlier, reads never go back in time,
   and no call blocks.
3. **HostScalar at a fixed lag** (tensor parallelism): after push ``k`` the value read is exactly the one pushed at
   ``k - lag``, whatever the GPU's progress; how often that copy was still in flight (and waited for) is counted.

Usage (repository root, CUDA torch, PyYAML)::

    python tools/gpu_host_reads.py --out results/    # writes gpu_host_reads.json, prints it

Exit status 1 when any check fails.  Not a test: CI has no GPU.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sage_plugin.serving.clock import HostScalar, StepClock  # noqa: E402


def busy(a: torch.Tensor, n: int) -> None:
    for _ in range(n):
        a = a @ a
        a = a / a.norm()


def check_step_clock(steps: int, load: int) -> dict:
    clock = StepClock("cuda")
    a = torch.randn(2048, 2048, device="cuda")
    got, host_ms, ref = [], [], {}
    for k in range(steps):
        t0 = time.perf_counter()
        torch.cuda.set_sync_debug_mode("error")
        start = clock.start()
        torch.cuda.set_sync_debug_mode("default")
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        busy(a, load + k % 3)
        e1.record()
        torch.cuda.set_sync_debug_mode("error")
        got += clock.stop(start, k)
        torch.cuda.set_sync_debug_mode("default")
        host_ms.append((time.perf_counter() - t0) * 1e3)
        ref[k] = (e0, e1)
    before_end = len(got)
    torch.cuda.synchronize()
    got += clock.stop(clock.start(), steps)
    keys = [k for k, _ in got]
    err = [abs(s * 1e3 - ref[k][0].elapsed_time(ref[k][1])) for k, s in got if k in ref]
    ok = keys[:steps] == list(range(steps)) and max(err) < 0.2
    return {"ok": ok, "steps": steps, "reported_before_the_end": before_end, "in_order": keys[:steps] == list(range(steps)),
            "max_abs_error_ms": max(err), "median_step_ms": sorted(s * 1e3 for _, s in got)[len(got) // 2],
            "host_ms_per_step_max": max(host_ms)}  # fmt: skip


def check_newest(pushes: int, load: int) -> dict:
    h = HostScalar("cuda")
    a = torch.randn(2048, 2048, device="cuda")
    reads, ok = [], True
    for k in range(pushes):
        busy(a, load)
        v = torch.full((), float(k), device="cuda")
        torch.cuda.set_sync_debug_mode("error")
        h.push(v)
        r = h.latest()
        torch.cuda.set_sync_debug_mode("default")
        if r is not None:
            ok &= r <= k and (not reads or reads[-1] is None or r >= reads[-1])
        reads.append(r)
    return {"ok": bool(ok), "pushes": pushes, "read_none": sum(r is None for r in reads),
            "mean_staleness": sum(k - r for k, r in enumerate(reads) if r is not None) / max(1, sum(r is not None for r in reads))}  # fmt: skip


def check_fixed_lag(pushes: int, load: int, lag: int) -> dict:
    h = HostScalar("cuda", fixed_lag=lag)
    a = torch.randn(2048, 2048, device="cuda")
    waited, reads = 0, []
    for k in range(pushes):
        busy(a, load)
        v = torch.full((), float(k), device="cuda")
        if len(h._lagged) == lag and not h._lagged[0][1].query():
            waited += 1
        h.push(v)
        reads.append(h.latest())
    expect = [None] * lag + [float(k - lag) for k in range(lag, pushes)]
    return {"ok": reads == expect, "lag": lag, "pushes": pushes, "waited_for_copy": waited}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=Path("."))
    ap.add_argument("--steps", type=int, default=200)
    args = ap.parse_args()
    torch.cuda.init()
    res = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__}
    for load in (0, 4):
        res[f"step_clock_load{load}"] = check_step_clock(args.steps, load)
        res[f"newest_load{load}"] = check_newest(args.steps, load)
        for lag in (1, 3):
            res[f"fixed_lag{lag}_load{load}"] = check_fixed_lag(args.steps, load, lag)
    failures = [k for k, v in res.items() if isinstance(v, dict) and not v["ok"]]
    res["failures"] = failures
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "gpu_host_reads.json").write_text(json.dumps(res, indent=1))
    print(json.dumps(res, indent=1))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
