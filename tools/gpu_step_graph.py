"""The SAGE worker's per-step path on a real NVIDIA GPU: what the CPU proofs cannot show.

``tests/unit/test_graph_safety.py`` proves on the CPU that the per-step path of the SGLang worker (slot reset, plan,
the plan loaded into :class:`BeamSelection`'s persistent buffers, the selection inside the draft step, observe) has
no host sync and no data-dependent shape, stays on the device under fake CUDA, and replays a ``make_fx`` capture like
eager.  This script runs the same path (``tests/unit/graph_step.py``) on a GPU and checks what only one can show:

1. **no sync inside CUDA kernels**: every eager step runs under ``torch.cuda.set_sync_debug_mode("error")``, which
   raises on any synchronizing CUDA call (a ``sort`` / ``topk`` / ``scatter`` kernel that syncs internally, an
   implicit device -> host copy);
2. **CUDA-graph capture and replay**: the reset and the decode step are captured with ``torch.cuda.graph`` (after
   warm-up on a side stream, as SGLang's runners do), then replayed over many rounds with new slot ids, beams and
   accept lengths copied into the static inputs; every output and the whole slot state and selection buffers equal
   an eager twin's, round after round (values frozen at capture, or state written outside the graph, would differ);
3. **cost**: per-step time of the path eager and replayed, by batch size (CUDA events, median of repeats).

Every switch of the path (``SWITCHES``) is tried alone on the small and the default config; batch sizes 1-16, 1-6
draft steps.  Usage (repository root, CUDA torch; nothing else needed but PyYAML)::

    python tools/gpu_step_graph.py --out results/      # writes gpu_step_graph.json, prints a summary

Exit status 1 when any check fails.  Not a test: CI has no GPU.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import unit.graph_step as gs  # noqa: E402  (the repository's tests/ is put on the path above)

from sage_plugin.core.slots import SlotState  # noqa: E402

DEV = "cuda"


def to_dev(round_):
    slots, beam, accept = round_
    return (
        slots.to(DEV),
        gs.Beam.of([t.to(DEV).contiguous() for t in beam.tensors()], len(beam.score_list)),
        accept.to(DEV),
    )


class Captured:
    """The reset and decode-step graphs of one (config, batch, steps) on a live slot state, and an eager twin."""

    def __init__(self, cfg, bsz: int, steps: int, max_bs: int, gen: torch.Generator) -> None:
        self.cfg, self.bsz, self.steps = cfg, bsz, steps
        self.num_slots = 2 * max_bs + 1
        self.num_draft = gs.n_select(cfg, steps) + 1
        self.state = SlotState(cfg, self.num_slots, DEV)
        self.sel = gs.new_selection(cfg, DEV, max_bs)
        self.counters = gs.new_counters(DEV, max_bs)
        slots, beam, accept = to_dev(gs.random_round(gen, bsz, steps, torch.arange(self.num_slots)))
        self.slots, self.accept = slots.clone(), accept.clone()
        self.beam = gs.Beam.of([t.clone() for t in beam.tensors()], steps)
        self.reset_slots = slots[:1].clone()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up (lazy inits, allocator) as SGLang does before capture
            for _ in range(3):
                self.state.reset(self.reset_slots)
                gs.decode_step(self.state, self.sel, self.counters, self.slots, self.beam, self.accept, self.num_draft)
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        self.pool = torch.cuda.graph_pool_handle()
        self.reset_graph, self.step_graph = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.reset_graph, pool=self.pool):
            self.state.reset(self.reset_slots)
        with torch.cuda.graph(self.step_graph, pool=self.pool):
            self.out = gs.decode_step(
                self.state, self.sel, self.counters, self.slots, self.beam, self.accept, self.num_draft
            )
        torch.cuda.synchronize()
        # the eager twin starts from the same state (capture runs no kernel, so the state is the warm-up's)
        self.twin = gs.bind(self.state, [t.clone() for t in gs.state_tensors(self.state)])
        self.twin_sel = gs.bind_selection(self.sel, [t.clone() for t in gs.selection_buffers(self.sel)])
        self.twin_counters = gs.bind_counters([t.clone() for t in gs.counter_buffers(self.counters)])

    def load(self, slots, beam, accept) -> None:
        self.slots.copy_(slots)
        self.reset_slots.copy_(slots[:1])
        self.accept.copy_(accept)
        for dst, src in zip(self.beam.tensors(), beam.tensors()):
            dst.copy_(src)

    def round(self, r: int, gen: torch.Generator) -> str | None:
        """One round, replayed and eager; None when they agree, else what differed."""
        slots, beam, accept = to_dev(gs.random_round(gen, self.bsz, self.steps, torch.arange(self.num_slots)))
        self.load(slots, beam, accept)
        if r % 3 == 0:
            self.reset_graph.replay()
        self.step_graph.replay()
        with torch.cuda.device(DEV):
            torch.cuda.set_sync_debug_mode("error")
            try:
                if r % 3 == 0:
                    self.twin.reset(slots[:1])
                want = gs.decode_step(self.twin, self.twin_sel, self.twin_counters, slots, beam, accept, self.num_draft)
            finally:
                torch.cuda.set_sync_debug_mode("default")
        torch.cuda.synchronize()
        for name, g, w in zip(gs.STEP_OUTPUTS, self.out, want):
            if not torch.equal(g, w):
                return f"round {r}: output {name} differs"
        for i, (g, w) in enumerate(
            zip(
                gs.state_tensors(self.state) + gs.selection_buffers(self.sel) + gs.counter_buffers(self.counters),
                gs.state_tensors(self.twin)
                + gs.selection_buffers(self.twin_sel)
                + gs.counter_buffers(self.twin_counters),
            )
        ):
            if not torch.equal(g, w):
                return f"round {r}: state tensor {i} differs"
        return None


def configs():
    """(name, config): each switch value alone on the small and the default config."""
    out = [("small", gs.SMALL.replace(history_window=2)), ("defaults", gs.DEFAULTS)]
    for base_name, base in list(out):
        for field, values in gs.SWITCHES.items():
            for v in values:
                if getattr(base, field) != v:
                    out.append((f"{base_name}:{field}={v}", base.replace(**{field: v})))
    return out


def check(rounds: int, seed: int) -> tuple[int, list[str]]:
    gen = torch.Generator().manual_seed(seed)
    failures, cases = [], 0
    for name, cfg in configs():
        for bsz, steps in ((1, 1), (1, 6), (5, 3), (16, 4), (16, 6)):
            cases += 1
            try:
                cap = Captured(cfg, bsz, steps, 16, gen)
                seen = set()
                for r in range(rounds):
                    why = cap.round(r, gen)
                    if why:
                        failures.append(f"{name} bs={bsz} steps={steps}: {why}")
                        break
                    seen.add(tuple(cap.out[6].flatten().tolist()))  # the verified tokens: new beams every round
                if len(seen) < 2 and not why:
                    failures.append(f"{name} bs={bsz} steps={steps}: every round gave the same draft tokens")
            except Exception as e:  # a sync under the debug mode, a capture error
                failures.append(f"{name} bs={bsz} steps={steps}: {type(e).__name__}: {e}")
    return cases, failures


def timing(batch_sizes, steps: int, iters: int) -> list[dict]:
    gen = torch.Generator().manual_seed(1)
    rows = []
    max_bs = max(batch_sizes)
    for bsz in batch_sizes:
        cap = Captured(gs.DEFAULTS, bsz, steps, max_bs, gen)
        eager = functools.partial(
            gs.decode_step, cap.twin, cap.twin_sel, cap.twin_counters, cap.slots, cap.beam, cap.accept, cap.num_draft
        )
        twin, sel, slots, beam, accept = cap.twin, cap.twin_sel, cap.slots, cap.beam, cap.accept

        def plan_load(twin=twin, sel=sel, slots=slots, beam=beam):  # eager in the worker, before the draft graph
            sel.load(twin.plan(slots, beam.root))

        select = functools.partial(sel, beam.score_list, beam.token_list, beam.parents_list, cap.num_draft)
        observe = functools.partial(twin.observe, slots, accept)
        res = {"batch_size": bsz, "steps": steps, "num_draft_tokens": cap.num_draft}
        parts = (("eager", eager), ("graph", cap.step_graph.replay), ("plan_load", plan_load))
        for label, fn in parts + (("select", select), ("observe", observe)):
            for _ in range(10):
                fn()
            torch.cuda.synchronize()
            gpu, host = [], []
            for _ in range(5):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                t0 = time.perf_counter()
                start.record()
                for _ in range(iters):
                    fn()
                end.record()
                t1 = time.perf_counter()
                torch.cuda.synchronize()
                gpu.append(start.elapsed_time(end) / iters)
                host.append((t1 - t0) * 1e3 / iters)
            res[f"{label}_ms"] = statistics.median(gpu)
            res[f"{label}_host_launch_ms"] = statistics.median(host)
        rows.append(res)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=Path("."))
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--iters", type=int, default=50)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA device", file=sys.stderr)
        return 2
    t0 = time.time()
    cases, failures = check(args.rounds, args.seed)
    times = timing([1, 8, 32, 64, 128], 6, args.iters)
    report = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "cases": cases,
        "rounds_per_case": args.rounds,
        "failures": failures,
        "timing": times,
        "seconds": round(time.time() - t0, 1),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "gpu_step_graph.json").write_text(json.dumps(report, indent=1))
    print(f"{report['device']}, torch {report['torch']}: {cases} cases x {args.rounds} rounds, {len(failures)} failed")
    for f in failures[:40]:
        print("  FAIL", f)
    print("bs  steps  N   eager ms (host launch)     graph ms (host launch)")
    for r in times:
        print(
            f"{r['batch_size']:<4}{r['steps']:<7}{r['num_draft_tokens']:<4}"
            f"{r['eager_ms']:.3f} ({r['eager_host_launch_ms']:.3f})    {r['graph_ms']:.3f} ({r['graph_host_launch_ms']:.3f})"
            f"    eager parts: plan+load {r['plan_load_ms']:.3f}, select {r['select_ms']:.3f}, observe {r['observe_ms']:.3f}"
        )
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
