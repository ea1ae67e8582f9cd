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
draft steps.

**The plan in the draft graph** (``--only plan-in-graph`` runs this part alone; ``gpu_plan_in_graph.json``): the
SAGE worker's ``draft_forward`` runs :func:`~sage_plugin.runtimes.sglang.selection.planned_draft` (plan, load, the
selection, metrics, round record) inside SGLang's captured draft graph.

4. **cost against the former split**, batch 1 / 8 / 32 / 128 at the default config, 6 draft steps: (i) the former
   split, ``planned_draft`` run eagerly around the selection replayed from its own graph (the plan, its load and the
   metrics were eager in ``SageDraftMixin.draft``), against (ii) all of ``planned_draft`` replayed from one graph;
   GPU time (CUDA events) and host time (``perf_counter``) per step, medians of repeats;
5. **SGLang's padding**: ``planned_draft`` captured at a batch size (8 and 32) on all-padding buffers (slot 0, zero
   ``topk_p``, as SGLang's runner captures), replayed with 1 to that many real rows and the rest padded as
   ``EagleDraftCudaGraphRunner.execute`` pads: the real rows' outputs, round record and slot state (slot 0 aside)
   equal an eager run of the raw batch, and the metrics equal the eager run's, round after round.

Usage (repository root, CUDA torch; nothing else needed but PyYAML)::

    python tools/gpu_step_graph.py --out results/      # writes gpu_step_graph.json and gpu_plan_in_graph.json
    python tools/gpu_step_graph.py --only plan-in-graph --out results/     # parts 4-5 alone
    python tools/gpu_step_graph.py --device cpu --iters 2 --out /tmp/x    # parts 4-5 dry run, no GPU: no capture

``--device cpu`` is a dry run of the script's plumbing (the "graph" is the same callable run eagerly, its timings
host only): it proves nothing about CUDA graphs.  Exit status 1 when any check fails.  Not a test: CI has no GPU.
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

from sage_plugin.runtimes.sglang.selection import planned_draft  # noqa: E402
from sage_plugin.serving.slots import SlotState  # noqa: E402

DEV = "cuda"  # --device


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
        self.twin, self.twin_sel, self.twin_counters = gs.copies(self.state, self.sel, self.counters)

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
            res[f"{label}_ms"], res[f"{label}_host_launch_ms"] = per_step_ms(fn, iters)
        rows.append(res)
    return rows


def sync() -> None:
    if DEV == "cuda":
        torch.cuda.synchronize()


def per_step_ms(fn, iters: int, repeats: int = 5) -> tuple[float | None, float]:
    """``(GPU ms, host ms)`` per call of ``fn``: medians over ``repeats`` loops of ``iters`` calls, after 10 warm-up
    calls; GPU time from CUDA events around the loop (None on CPU), host time from ``perf_counter`` (the launches)."""
    for _ in range(10):
        fn()
    sync()
    gpu, host = [], []
    for _ in range(repeats):
        if DEV == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        t1 = time.perf_counter()
        if DEV == "cuda":
            end.record()
            torch.cuda.synchronize()
            gpu.append(start.elapsed_time(end) / iters)
        host.append((t1 - t0) * 1e3 / iters)
    return (statistics.median(gpu) if gpu else None), statistics.median(host)


# -- the plan in the draft graph (parts 4-5) ----------------------------------------------------------------------
class Replay:
    """``fn()`` captured in a CUDA graph (warm-up on a side stream first, as SGLang's runners do); :meth:`run`
    replays it and returns the captured outputs.  On CPU (dry run) ``fn`` is called each time instead."""

    def __init__(self, fn) -> None:
        self.fn, self.graph = fn, None
        if DEV != "cuda":
            self.fn()
            return
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                fn()
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.out = fn()
        torch.cuda.synchronize()

    def run(self):
        if self.graph is None:
            return self.fn()
        self.graph.replay()
        return self.out


class PlannedDraft:
    """The SAGE draft step at captured size ``bs``: slot state, selection, counters and SGLang's static inputs (slots
    ``[bs]``, a beam of ``bs`` rows), the draft step being :func:`planned_draft` around the selection."""

    def __init__(self, cfg, bs: int, steps: int, max_bs: int, gen: torch.Generator) -> None:
        self.bs, self.steps, self.num_draft = bs, steps, gs.n_select(cfg, steps) + 1
        self.num_slots = 2 * max_bs + 1
        self.state = SlotState(cfg, self.num_slots, DEV)
        self.sel, self.counters = gs.new_selection(cfg, DEV, max_bs), gs.new_counters(DEV, max_bs)
        slots, beam, _ = to_dev(gs.random_round(gen, bs, steps, torch.arange(1, self.num_slots)))
        self.slots, self.beam = slots.clone(), gs.Beam.of([t.clone() for t in beam.tensors()], steps)

    def select(self):
        return self.sel(self.beam.score_list, self.beam.token_list, self.beam.parents_list, self.num_draft)

    def step(self, draft=None):
        """:func:`planned_draft` on the static inputs; ``draft`` (default: the selection) inside it."""
        return planned_draft(self.state, self.sel, self.counters, self.slots, self.beam.root, draft or self.select)

    def twin(self) -> tuple:
        """An eager twin's ``(state, selection, counters)``, copies of the current ones."""
        return gs.copies(self.state, self.sel, self.counters)

    def load(self, slots, beam) -> None:
        self.slots.copy_(slots)
        for dst, src in zip(self.beam.tensors(), beam.tensors()):
            dst.copy_(src)


def split_against_one_graph(batch_sizes, steps: int, iters: int) -> list[dict]:
    """Part 4: (i) the former split, ``planned_draft`` eager around the selection's graph, against (ii) one graph of
    all of ``planned_draft``; per step GPU ms and host ms."""
    gen, rows = torch.Generator().manual_seed(2), []
    for bs in batch_sizes:
        pd = PlannedDraft(gs.DEFAULTS, bs, steps, max(batch_sizes), gen)
        selection, whole = Replay(pd.select), Replay(pd.step)  # each its own memory pool
        row = {"batch_size": bs, "steps": steps, "num_draft_tokens": pd.num_draft}
        for label, fn in (("split", functools.partial(pd.step, selection.run)), ("one_graph", whole.run)):
            row[f"{label}_gpu_ms"], row[f"{label}_host_ms"] = per_step_ms(fn, iters)
        rows.append(row)
    return rows


def compare_padded(pd: PlannedDraft, twin, got, want, raw: int) -> str | None:
    """What differs between a padded replay (``pd``, outputs ``got``) and the eager raw batch (``twin`` = state,
    counters; outputs ``want``), or None."""
    state, counters = twin
    if not all(torch.equal(g[:raw], w) for g, w in zip(got, want)):
        return "the real rows' selection differs"
    if not torch.equal(pd.counters.rounds[:raw], counters.rounds[:raw]):
        return "the round record differs"
    exact = gs.STATS_EXACT
    if not torch.equal(pd.counters.stats[exact], counters.stats[exact]) or not torch.allclose(
        pd.counters.stats, counters.stats, rtol=1e-9, atol=1e-12
    ):
        return f"the metrics differ: {pd.counters.stats.tolist()} against {counters.stats.tolist()}"
    return None


def padded_replays(rounds: int, seed: int) -> tuple[int, list[str]]:
    """Part 5: captured at ``bs`` on all-padding buffers, replayed with padded batches against eager raw batches."""
    gen, failures, cases = torch.Generator().manual_seed(seed), [], 0
    for name, cfg in (("defaults", gs.DEFAULTS), ("small", gs.SMALL.replace(history_window=2))):
        for bs, steps in ((8, 6), (32, 4)):
            cases += 1
            label = f"{name} captured bs={bs} steps={steps}"
            try:
                pd = PlannedDraft(cfg, bs, steps, bs, gen)
                none, beam, _ = gs.random_round(gen, 0, steps, torch.arange(1, pd.num_slots))
                pd.load(*to_dev((*gs.padded(none, beam, bs, gen), none))[:2])  # all padding, as SGLang captures
                graph = Replay(pd.step)
                if pd.counters.stats.abs().sum().item() != 0:
                    failures.append(f"{label}: the all-padding warm-up counted in the metrics")
                state, sel, counters = pd.twin()
                for r in range(rounds):
                    raw = (1, bs, 3, bs - 1, bs // 2)[r % 5]
                    slots, beam, accept = gs.random_round(gen, raw, steps, torch.arange(1, pd.num_slots))
                    pad_slots, pad_beam, _ = to_dev((*gs.padded(slots, beam, bs, gen), accept))
                    slots, beam, accept = to_dev((slots, beam, accept))
                    pd.load(pad_slots, pad_beam)
                    got = graph.run()
                    select = functools.partial(sel, beam.score_list, beam.token_list, beam.parents_list, pd.num_draft)
                    want = planned_draft(state, sel, counters, slots, beam.root, select)
                    sync()
                    why = compare_padded(pd, (state, counters), got, want, raw)
                    if why is None:  # eager after verify, on the raw batch (the worker's observe)
                        pd.state.observe(slots, accept)
                        state.observe(slots, accept)
                        if not all(
                            torch.equal(g[1:], w[1:])
                            for g, w in zip(gs.state_tensors(pd.state), gs.state_tensors(state))
                        ):
                            why = "the slot state (slot 0 aside) differs"
                    if why:
                        failures.append(f"{label}: round {r} ({raw} real rows): {why}")
                        break
                if counters.stats[0].item() == 0:
                    failures.append(f"{label}: no round counted")
            except Exception as e:  # a capture error
                failures.append(f"{label}: {type(e).__name__}: {e}")
    return cases, failures


def plan_in_graph(args) -> dict:
    t0 = time.time()
    cases, failures = padded_replays(args.rounds, args.seed)
    return {
        "device": torch.cuda.get_device_name() if DEV == "cuda" else "cpu (dry run: no CUDA graph)",
        "torch": torch.__version__,
        "padded_cases": cases,
        "rounds_per_case": args.rounds,
        "failures": failures,
        "timing": split_against_one_graph(args.batch_sizes, 6, args.iters),
        "seconds": round(time.time() - t0, 1),
    }


def print_plan_in_graph(report: dict) -> None:
    n = len(report["failures"])
    print(f"plan in the draft graph ({report['device']}): {report['padded_cases']} padded cases x "
          f"{report['rounds_per_case']} rounds, {n} failed")  # fmt: skip
    for f in report["failures"][:40]:
        print("  FAIL", f)
    print("ms per step   former split (plan eager, selection replayed)   one graph (all replayed)")
    print(f"{'bs':<5}{'N':<4}{'GPU':>10}{'host':>10}{'':<33}{'GPU':>10}{'host':>10}")
    for r in report["timing"]:
        gpu = {k: "-" if r[f"{k}_gpu_ms"] is None else f"{r[f'{k}_gpu_ms']:.3f}" for k in ("split", "one_graph")}
        print(f"{r['batch_size']:<5}{r['num_draft_tokens']:<4}{gpu['split']:>10}{r['split_host_ms']:>10.3f}{'':<33}"
              f"{gpu['one_graph']:>10}{r['one_graph_host_ms']:>10.3f}")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    global DEV
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=Path("."))
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--only", choices=("all", "plan-in-graph"), default="all", help="plan-in-graph: parts 4-5 alone")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                    help="cpu: a dry run of parts 4-5 (no CUDA graph, host timings only)")  # fmt: skip
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 32, 128], help="part 4's batch sizes")
    args = ap.parse_args(argv)
    DEV = args.device
    if DEV == "cuda" and not torch.cuda.is_available():
        print("no CUDA device", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    plan = plan_in_graph(args)
    (args.out / "gpu_plan_in_graph.json").write_text(json.dumps(plan, indent=1))
    print_plan_in_graph(plan)
    if args.only == "plan-in-graph" or DEV == "cpu":
        return 1 if plan["failures"] else 0
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
    return 1 if failures or plan["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
