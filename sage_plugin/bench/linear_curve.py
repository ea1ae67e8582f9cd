"""``python -m sage_plugin.bench.linear_curve``: what each CPU linear product costs on this machine, by rows.

Two measurements, every product interleaved per repeat so that the machine's drift hits them alike (medians, ms):

* **layers**: the target's linear layers (its real weights, in forward order, the head last) run one after the other
  at ``M`` rows, as one forward runs them: a decoder's weights do not stay in cache from one layer to the next, which
  is what a loop over one layer would hide.  Products: ``F.linear``, weight-major (``(weight @ x.T).T``, padded as
  ``kernels/linear.py`` pads it) and the rows kernel (``kernels/csrc/rows_linear.cpp``), each at every ``M``.
* **forward**: the whole HF target over ``M`` new tokens after a 200-token context (KV cache), with every linear layer
  set to ``F.linear``, to weight-major, and to :func:`sage_plugin.kernels.linear.linear` (the rule every consumer takes).

``docs/benchmarks.md`` ("Linear layers by rows") shows its output::

    python -m sage_plugin.bench.linear_curve --rows 1,2,3,4,6,8,12,16,24,32 --repeats 9
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from ..kernels import linear as rule


def _weight_major(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
    k = x.shape[-1]
    out = rule._weight_major(x.reshape(-1, k), w)
    return (out if b is None else out + b).reshape(*x.shape[:-1], w.shape[0])


def _kernel(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    kernel = rule.rows_kernel()
    if kernel is None:
        raise SystemExit("the rows kernel could not be built on this machine (see the warning above)")
    return kernel.rows_linear(x, w)


def layer_curve(weights: list[torch.Tensor], rows: list[int], repeats: int) -> dict[str, dict[int, float]]:
    """Median ms of one pass over ``weights`` at each row count, per product."""
    products: dict[str, Callable] = {"F.linear": F.linear, "weight-major": _weight_major, "rows kernel": _kernel}
    times: dict[str, dict[int, list[float]]] = {name: {m: [] for m in rows} for name in products}
    for _ in range(repeats):
        for m in rows:
            xs = [torch.randn(m, w.shape[1]) for w in weights]
            for name, fn in products.items():
                start = time.perf_counter()
                for x, w in zip(xs, weights):
                    fn(x, w)
                times[name][m].append((time.perf_counter() - start) * 1e3)
    return {name: {m: statistics.median(v) for m, v in per.items()} for name, per in times.items()}


class _Linear(torch.nn.Linear):
    product: Callable = F.linear

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return type(self).product(x, self.weight, self.bias)


def forward_curve(model, rows: list[int], repeats: int, context: int = 200) -> dict[str, dict[int, float]]:
    """Median ms of a whole forward over ``m`` new tokens after ``context`` cached ones, per product."""
    products = {"F.linear": F.linear, "weight-major": _weight_major, "rule": rule.linear}
    layers = [mod for mod in model.modules() if isinstance(mod, torch.nn.Linear)]
    classes = {name: type(name, (_Linear,), {"product": staticmethod(fn)}) for name, fn in products.items()}
    vocab = model.config.vocab_size
    with torch.inference_mode():
        cache = model(torch.randint(0, vocab, (1, context)), use_cache=True).past_key_values
    times: dict[str, dict[int, list[float]]] = {name: {m: [] for m in rows} for name in products}

    def once(m: int) -> float:
        ids, kv = torch.randint(0, vocab, (1, m)), copy.deepcopy(cache)
        with torch.inference_mode():
            start = time.perf_counter()
            model(ids, past_key_values=kv, use_cache=True, logits_to_keep=m)
            return (time.perf_counter() - start) * 1e3

    for _ in range(repeats):
        for name, cls in classes.items():
            for layer in layers:
                layer.__class__ = cls
            for m in rows:
                once(m)  # warm this size under this product
                times[name][m].append(once(m))
    return {name: {m: statistics.median(v) for m, v in per.items()} for name, per in times.items()}


def _table(title: str, curves: dict[str, dict[int, float]], rows: list[int]) -> str:
    lines = [
        f"{title} (median ms)",
        "| product | " + " | ".join(str(m) for m in rows) + " |",
        "|---|" + "---|" * len(rows),
    ]
    for name, per in curves.items():
        lines.append(f"| {name} | " + " | ".join(f"{per[m]:.1f}" for m in rows) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m sage_plugin.bench.linear_curve", description=__doc__.split("\n")[0])
    p.add_argument("--rows", default="1,2,3,4,6,8,12,16,24,32", help="comma list of row counts (new tokens)")
    p.add_argument("--repeats", type=int, default=9)
    p.add_argument("--threads", type=int, default=2, help="torch threads (default 2, this project's CPU)")
    p.add_argument("--target", default=None, help="HF target dir (default: the bundled SmolLM2-135M-Instruct)")
    p.add_argument("--skip-forward", action="store_true", help="the layer pass only")
    args = p.parse_args(argv)
    from ..engines.lm import load_causal_lm
    from ..models import ensure_smollm2

    torch.set_num_threads(args.threads)
    rows = [int(r) for r in args.rows.split(",")]
    model = load_causal_lm(args.target or ensure_smollm2(), "cpu")
    layers = [mod.weight.detach() for mod in model.modules() if isinstance(mod, torch.nn.Linear)]
    print(f"{len(layers)} linear layers, {sum(w.numel() for w in layers) * 4 / 1e6:.0f} MB float32, "
          f"{torch.get_num_threads()} threads, CPU capability {torch.backends.cpu.get_cpu_capability()}")  # fmt: skip
    print(_table("layers", layer_curve(layers, rows, args.repeats), rows))
    if not args.skip_forward:
        print(_table("whole forward after 200 cached tokens", forward_curve(model, rows, args.repeats), rows))


if __name__ == "__main__":
    main()
