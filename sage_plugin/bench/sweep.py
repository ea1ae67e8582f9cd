"""``sage bench --sweep-nodes 4,8,16,32,64``: tau against the verified-node budget N, every tree method at every N.

At each budget ``N`` (draft nodes verified per round, root excluded):

=========================  ===============================================================================================
method                     configuration at budget N
=========================  ===============================================================================================
``eagle2``                 EAGLE-2's expansion, rerank to ``eagle_total_tokens = N``
``topn``                   OPT-Tree's top-N tree, ``topn_nodes = N``
``static``                 the static tree cut to its first N rank paths in level order (ancestor-closed; at most 25)
``sage``                   SAGE as configured (``--config`` / ``--set``, else the defaults: ``rerank_pool: beam``)
                           verifying ``n_max = N`` nodes (``node_budget: fixed``)
``sage-paper``             the paper's rule: SAGE verifying every node its levels keep, ``n_max = N``
                           (``rerank_pool: kept``, ``rerank_nodes: 0``, ``node_budget: fixed``)
``sage-paper-calibrated``  the same with a calibration table fitted for the draft before the run (``sage-calibrated``)
``sage-rerank``            SAGE's kept tree built up to ``n_max = max(N, 64)`` nodes, then its N best by path value
                           (``rerank_pool: kept``, ``rerank_nodes = N``: EAGLE-2's rerank inside SAGE's shape)
``sage-children``          every child of a node SAGE's rules expand is a candidate, the N best verified
                           (``rerank_pool: children``, ``rerank_nodes = N``)
``sage-auto``              SAGE sized to this device (``node_budget: auto``), ``n_max = N``: it verifies fewer
``oracle``                 the bound: the longest run of the target's own tokens the draft's top-k candidates contained,
                           at most N deep (a chain of target-matching candidates is the best tree any selection can verify)
=========================  ===============================================================================================

SAGE's first round keeps the budget (``first_round_static: false``: the static first tree has 25 nodes).  The oracle
needs no extra target work: the draft reads the plain-decoding output once, teacher-forced, and a candidate "matches"
where the target's next token is in the draft's top-k.  ``--sweep-methods`` keeps some of the methods (default all).
Results: ``"sweep": {METHOD: {"N": {"tau", "mean_nodes", "exact_match"}}}`` in the JSON, a table, and
``tau_by_nodes.png``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import torch

from ..config import ConfigError, SageConfig
from .methods import MethodSpec
from .run import MethodResult
from .tune import static_cut

__all__ = ["SWEEP_METHODS", "oracle_tau", "sweep_methods", "sweep_summary", "sweep_table", "write_sweep_plot"]

SWEEP_METHODS = (
    "eagle2", "topn", "static", "sage", "sage-paper", "sage-paper-calibrated", "sage-rerank", "sage-children",
    "sage-auto", "oracle",
)  # fmt: skip


def sweep_methods(base: SageConfig, sizes: list[int], names: list[str] | None = None) -> list[MethodSpec]:
    """The configurations of :data:`SWEEP_METHODS` (``names`` of them, default all; the oracle is computed, not run) at
    each budget, named ``METHOD@N``."""
    names = list(SWEEP_METHODS) if names is None else names
    unknown = sorted(set(names) - set(SWEEP_METHODS))
    if unknown:
        raise ConfigError(f"--sweep-methods: unknown {', '.join(unknown)}; choose from {', '.join(SWEEP_METHODS)}")
    out = []
    for n in sizes:
        sage = dict(policy="sage", n_max=n, first_round_static=False)
        paper = dict(sage, node_budget="fixed", rerank_pool="kept", rerank_nodes=0)
        configs = {
            "eagle2": dict(policy="eagle2", eagle_total_tokens=n),
            "topn": dict(policy="topn", topn_nodes=n),
            "static": dict(policy="static", static_tree=[list(p) for p in static_cut(base, n)]),
            "sage": dict(sage, node_budget="fixed"),
            "sage-paper": paper,
            "sage-rerank": dict(paper, n_max=max(n, 64), rerank_nodes=n),
            "sage-children": dict(paper, n_max=max(n, 64), rerank_nodes=n, rerank_pool="children"),
            "sage-auto": dict(sage, node_budget="auto"),
        }
        out += [MethodSpec(f"{name}@{n}", base.replace(**cfg)) for name, cfg in configs.items() if name in names]
        if "sage-paper-calibrated" in names:  # fitted before the run on the bundled tuning prompts (one table)
            out.append(MethodSpec(f"sage-paper-calibrated@{n}", base.replace(**paper), tuned=True))
    return out


def oracle_tau(
    draft_logits: Callable[[list[int]], torch.Tensor],
    prompts: list[list[int]],
    outputs: list[list[int]],
    k: int,
    n: int,
) -> float:
    """Tokens per target forward of the oracle tree at budget ``n`` (bonus included, as the bench counts tau).

    For each request the draft reads prompt + plain-decoding output once; round after round, starting at the last
    emitted token, the oracle accepts the longest run (at most ``n``) of following output tokens that are each in
    the draft's top-``k`` at their position, then the bonus.

    Args:
        draft_logits: the draft's teacher-forced ``[L, V]`` logits of a token sequence
            (:meth:`~sage_plugin.engines.lm.TextModel.sequence_logits`).
        prompts: prompt token ids per request.
        outputs: plain greedy output per request (its first token comes from the prefill).
    """
    tokens = forwards = 0
    for prompt, out in zip(prompts, outputs):
        if len(out) < 2:
            continue
        logits = draft_logits(prompt + out)[len(prompt) : len(prompt) + len(out) - 1]
        nxt = torch.tensor(out[1:])
        in_topk = (torch.topk(logits, k, dim=-1).indices == nxt[:, None]).any(-1).tolist()  # output j+1 drafted?
        p = 0
        while p < len(out) - 1:
            m = 0
            while m < n and p + m < len(in_topk) and in_topk[p + m]:
                m += 1
            p += m + 1
            forwards += 1
        tokens += len(out) - 1
    return tokens / max(1, forwards)


def sweep_summary(results: dict[str, MethodResult], sizes: list[int], oracle: dict[int, float] | None) -> dict:
    """``{METHOD: {"N": {"tau", "mean_nodes", "exact_match"}}}`` from ``run_methods`` results named ``METHOD@N``."""
    out: dict[str, dict[str, dict]] = {}
    for name, r in results.items():
        if "@" not in name:
            continue
        method, n = name.rsplit("@", 1)
        exact = round(r.exact / r.compared, 4) if r.compared else None
        mean_nodes = round(r.mean("nodes"), 3) if r.rounds else 0.0
        out.setdefault(method, {})[n] = {"tau": round(r.tau, 4), "mean_nodes": mean_nodes, "exact_match": exact}
    if oracle:
        out["oracle"] = {
            str(n): {"tau": round(t, 4), "mean_nodes": None, "exact_match": 1.0} for n, t in oracle.items()
        }
    return out


def sweep_table(sweep: dict, sizes: list[int]) -> str:
    """Markdown: tau (mean verified nodes) per method (rows) and budget N (columns)."""
    rows = ["| method | " + " | ".join(f"N = {n}" for n in sizes) + " |", "|---|" + "---|" * len(sizes)]
    for method, per in sweep.items():
        cells = []
        for n in sizes:
            x = per.get(str(n))
            nodes = "" if x is None or x["mean_nodes"] is None else f" ({x['mean_nodes']:.1f})"
            cells.append("-" if x is None else f"{x['tau']:.2f}{nodes}")
        rows.append(f"| {method} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def write_sweep_plot(sweep: dict, sizes: list[int], out_dir: Path) -> Path:
    """``tau_by_nodes.png``: tau against the budget N, one line per method (log2 x axis)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(6, 4))
    for method, per in sweep.items():
        ns = [n for n in sizes if str(n) in per]
        style = dict(linestyle="--", color="gray") if method == "oracle" else {}
        ax.plot(ns, [per[str(n)]["tau"] for n in ns], marker="o", label=method, **style)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("verified draft nodes per round (budget N)")
    ax.set_ylabel("tokens per target forward (tau)")
    ax.set_title("tau at an equal node budget")
    ax.legend(fontsize=7)
    fig.tight_layout()
    path = out_dir / "tau_by_nodes.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
