"""Verify and draft-step cost curves of GPU-sized models on a real GPU, each shape replayed from a CUDA graph.

The SAGE tiers (``--sage-tiers``, docs/design/sglang-internals.md "Tiers") pay where verifying ``N`` tokens per request costs little
more than verifying one.  On this project's CPU that curve is measured by the server itself; for the GPU engine
configs (``engine_configs/sglang/qwen2_5_vl_*``) nobody had measured it.  This script does, without SGLang or model
weights (neither reaches the lent GPU): a decoder of a real model's shape with random bf16 weights (the cost of a
forward does not depend on the weights' values), each ``(batch, tokens)`` forward captured once with
``torch.cuda.graph`` (as SGLang's runners replay a captured shape) and timed over replays with CUDA events.

* **verify**: ``batch`` requests, each with ``context`` tokens already in a preallocated KV cache, verify ``tokens``
  new tokens (a tree's rows: K/V written at the cache's next positions, attention over the context and an ancestor
  mask among the new rows, logits for every row).  The attention is split as tree-verify kernels do
  (:func:`split_attention`: FlashAttention over the context, no mask, each K/V head read once for its group of
  query heads; the ``t x t``
  ancestor block densely; merged by log-sum-exp), so the mask's content does not change the cost and a causal
  block stands in for the tree.
* **draft**: one step of an EAGLE-3 head (one decoder layer whose Q/K/V read ``2 * hidden``, the head's final norm,
  its reduced-vocabulary lm_head and a top-k over it) on ``rows`` rows (``batch * topk`` after the first step).

Shapes (``MODELS``): ``qwen2.5-7b`` (the text decoder of Qwen2.5-VL-7B-Instruct, biases omitted), its EAGLE-3 head,
one rank's shard of a 72B at tensor parallelism 8 (no all-reduce), and ``smollm2-135m`` for comparison with the CPU.
``--extra`` adds the 7B at context 4096, with one masked ``scaled_dot_product_attention`` instead (PyTorch's dense
path for grouped heads with a mask: what a naive tree attention costs), and with no attention at all (the linear
layers, norms and head alone).  FlashAttention-2 through PyTorch, not FA3 / FlashInfer.

Usage (repository root, CUDA torch; nothing else)::

    python tools/gpu_verify_cost.py --out results/                  # writes gpu_verify_cost.json, prints tables
    python tools/gpu_verify_cost.py --report docs/measurements/gpu_verify_cost_h200.json   # tables + break-even
    python tools/gpu_verify_cost.py --device cpu --tiny --out /tmp/x   # plumbing dry run, no GPU, no graph

Not a test: CI has no GPU (``tests/unit/test_gpu_verify_cost.py`` runs the dry run).
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class Shape:
    """A decoder's shape (Hugging Face config names); ``in_mult`` is 2 for an EAGLE-3 layer's Q/K/V input."""

    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    vocab: int
    in_mult: int = 1
    head_dim: int = 128


MODELS = {
    "qwen2.5-7b": Shape(3584, 18944, 28, 28, 4, 152064),
    "qwen2.5-7b-eagle3": Shape(3584, 18944, 1, 28, 4, 32000, in_mult=2),
    # one rank's shard of Qwen2.5-72B at tensor parallelism 8 (heads, MLP and vocabulary split 8 ways; the
    # all-reduces between ranks are not run, so this prices the rank's own work only)
    "qwen2.5-72b-tp8": Shape(8192, 29568 // 8, 80, 64 // 8, 1, 152064 // 8),
    "smollm2-135m": Shape(576, 1536, 30, 9, 3, 49152, head_dim=64),
    "tiny": Shape(64, 128, 2, 4, 2, 256, head_dim=16),
    "tiny-eagle3": Shape(64, 128, 1, 4, 2, 128, in_mult=2, head_dim=16),
}


class Decoder:
    """Random-weight decoder of ``shape`` with a KV cache for ``max_batch`` requests of ``max_len`` tokens."""

    def __init__(self, shape: Shape, max_batch: int, max_len: int, device: str, dtype: torch.dtype) -> None:
        s, self.shape, self.device = shape, shape, device
        g = torch.Generator(device=device).manual_seed(0)

        def w(*size: int) -> torch.Tensor:
            return torch.randn(*size, generator=g, device=device, dtype=dtype) * 0.02

        hd, qkv = s.head_dim, (s.heads + 2 * s.kv_heads) * s.head_dim
        self.embed = w(s.vocab, s.hidden) if s.in_mult == 1 else None
        self.layers = [
            {
                "qkv": w(qkv, s.hidden * s.in_mult),
                "o": w(s.hidden, s.heads * hd),
                "gate_up": w(2 * s.intermediate, s.hidden),
                "down": w(s.hidden, s.intermediate),
                "k": torch.zeros(max_batch, s.kv_heads, max_len, hd, device=device, dtype=dtype),
                "v": torch.zeros(max_batch, s.kv_heads, max_len, hd, device=device, dtype=dtype),
            }
            for _ in range(s.layers)
        ]
        self.head = w(s.vocab, s.hidden)
        inv = 1.0 / (1e6 ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
        ang = torch.outer(torch.arange(max_len, dtype=torch.float32), inv)
        self.cos, self.sin = ang.cos().to(device, dtype), ang.sin().to(device, dtype)

    def _rope(self, x: torch.Tensor, pos: slice) -> torch.Tensor:
        c, s = self.cos[pos], self.sin[pos]  # [t, hd/2]
        x1, x2 = x[..., ::2], x[..., 1::2]
        return torch.cat((x1 * c - x2 * s, x1 * s + x2 * c), dim=-1)

    def forward(
        self, x: torch.Tensor, context: int, mask: torch.Tensor, topk: int = 0, attention: str = "split"
    ) -> torch.Tensor:
        """``x``: ``[b, t]`` token ids (``in_mult == 1``) or ``[b, t, in_mult * hidden]`` features; ``mask``:
        ``[t, context + t]`` bool.  Returns ``[b, t, vocab]`` logits, or ``[b, t, topk]`` top-k ids when ``topk``.
        ``attention``: ``split`` (:func:`split_attention`), ``mask`` (one ``scaled_dot_product_attention`` with the
        boolean mask: PyTorch then takes a dense path for GQA) or ``none`` (the queries stand in for the attention's
        output: the cost of the rest)."""
        s, hd = self.shape, self.shape.head_dim
        b, t = x.shape[0], x.shape[1]
        h = self.embed[x] if self.embed is not None else x
        pos = slice(context, context + t)
        for lyr in self.layers:
            a = F.rms_norm(h, (h.shape[-1],))
            q, k, v = (a @ lyr["qkv"].T).split([s.heads * hd, s.kv_heads * hd, s.kv_heads * hd], dim=-1)
            q = self._rope(q.view(b, t, s.heads, hd).transpose(1, 2), pos)
            lyr["k"][:b, :, pos] = self._rope(k.view(b, t, s.kv_heads, hd).transpose(1, 2), pos)
            lyr["v"][:b, :, pos] = v.view(b, t, s.kv_heads, hd).transpose(1, 2)
            kv = (lyr["k"][:b, :, : context + t], lyr["v"][:b, :, : context + t])
            if attention == "split" and context > 0:
                o = split_attention(q, *kv, context, mask)
            elif attention in ("mask", "split"):
                o = F.scaled_dot_product_attention(q, *kv, attn_mask=mask, enable_gqa=True)
            else:
                o = q
            h = (h[..., : s.hidden] if s.in_mult > 1 else h) + o.transpose(1, 2).reshape(b, t, -1) @ lyr["o"].T
            gate, up = (F.rms_norm(h, (s.hidden,)) @ lyr["gate_up"].T).chunk(2, dim=-1)
            h = h + (F.silu(gate) * up) @ lyr["down"].T
        logits = F.rms_norm(h, (s.hidden,)) @ self.head.T
        return logits.topk(topk, dim=-1).indices if topk else logits


def _flash_with_lse(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Unmasked attention and its log-sum-exp, ``[b, H, t, d]`` and ``[b, H, t]``, for ``k`` / ``v`` of ``Hkv``
    heads.  The ``H / Hkv`` query heads of a group see the same keys, so they are packed into the query length
    (``[b, Hkv, H / Hkv * t, d]``) and each K/V head is read once, as GQA-packing serving kernels do."""
    b, h, t, d = q.shape
    hk = k.shape[1]
    qp = q.reshape(b, hk, h // hk * t, d)
    if q.is_cuda:
        out = torch.ops.aten._scaled_dot_product_flash_attention(qp, k, v, 0.0, False)
    else:
        out = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(qp, k, v, 0.0, False)
    return out[0].reshape(b, h, t, d), out[1].reshape(b, h, t)


def split_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, context: int, mask: torch.Tensor
) -> torch.Tensor:
    """Tree attention as serving kernels take it: the context without a mask (FlashAttention, GQA packed), the new
    rows' ``t x t`` ancestor block densely, the two merged by their log-sum-exps.  Equals the masked attention.

    ``q``: ``[b, H, t, d]``; ``k`` / ``v``: ``[b, Hkv, context + t, d]``; ``mask``: ``[t, context + t]`` bool."""
    o1, lse1 = _flash_with_lse(q, k[:, :, :context], v[:, :, :context])
    rep = q.shape[1] // k.shape[1]
    kn, vn = (x[:, :, context:].repeat_interleave(rep, dim=1) for x in (k, v))
    scores = (q @ kn.transpose(-1, -2)).float() * q.shape[-1] ** -0.5
    scores = scores.masked_fill(~mask[:, context:], float("-inf"))
    lse2 = scores.logsumexp(-1)
    o2 = (scores - lse2[..., None]).exp().to(q.dtype) @ vn
    lse = torch.logaddexp(lse1, lse2)
    w1, w2 = (lse1 - lse).exp()[..., None], (lse2 - lse).exp()[..., None]
    return (o1.float() * w1 + o2.float() * w2).to(q.dtype)


def tree_mask(context: int, t: int, device: str) -> torch.Tensor:
    """``[t, context + t]`` bool: every row sees the context and a causal block among the new rows."""
    new = torch.ones(t, t, dtype=torch.bool, device=device).tril()
    return torch.cat((torch.ones(t, context, dtype=torch.bool, device=device), new), dim=1)


def time_shape(fn, device: str, reps: int) -> float:
    """Median ms of ``fn`` replayed from one CUDA graph (``device == "cuda"``) or run eagerly (dry run)."""
    if device != "cuda":
        out = []
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            out.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(out)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    times = []
    for _ in range(reps + 2):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    del graph
    return statistics.median(times[2:])


def verify_curve(model: str, batches, tokens, context: int, device: str, reps: int, attention: str = "split") -> dict:
    """``{batch: {tokens: ms}}`` of a verify forward of ``model``."""
    shape = MODELS[model]
    dec = Decoder(shape, max(batches), context + max(tokens), device, torch.bfloat16)
    out: dict = {}
    for b in batches:
        for t in tokens:
            ids = torch.randint(0, shape.vocab, (b, t), device=device)
            mask = tree_mask(context, t, device)
            fn = functools.partial(dec.forward, ids, context, mask, attention=attention)
            out.setdefault(b, {})[t] = round(time_shape(fn, device, reps), 4)
        print(
            f"verify {model} ctx {context} attn {attention} batch {b}: "
            + " ".join(f"{t}:{ms:.2f}" for t, ms in out[b].items()),
            flush=True,
        )
    del dec
    if device == "cuda":
        torch.cuda.empty_cache()
    return out


def draft_curve(model: str, rows, topk: int, context: int, device: str, reps: int) -> dict:
    """``{rows: ms}`` of one EAGLE-3 draft step (one row per request and draft token, one new position each)."""
    shape = MODELS[model]
    dec = Decoder(shape, max(rows), context + 1, device, torch.bfloat16)
    out = {}
    for r in rows:
        x = torch.randn(r, 1, shape.in_mult * shape.hidden, device=device, dtype=torch.bfloat16)
        mask = tree_mask(context, 1, device)
        out[r] = round(time_shape(functools.partial(dec.forward, x, context, mask, topk=topk), device, reps), 4)
    print(f"draft {model}: " + " ".join(f"{r}:{ms:.2f}" for r, ms in out.items()), flush=True)
    del dec
    return out


def split_check(device: str) -> float:
    """Largest difference between split and masked attention's logits (bf16, a small decoder, a random tree mask)."""
    dec = Decoder(MODELS["tiny"], 2, 64, device, torch.bfloat16)
    ids = torch.randint(0, 256, (2, 8), device=device)
    mask = tree_mask(48, 8, device)
    mask[:, 48:] &= torch.rand(8, 8, device=device) < 0.5
    mask[:, 48:] |= torch.eye(8, dtype=torch.bool, device=device)
    a = dec.forward(ids, 48, mask, attention="split").float()
    b = dec.forward(ids, 48, mask, attention="mask").float()
    diff = (a - b).abs().max().item()
    print(f"split vs mask attention, max |logit difference|: {diff:.4g}", flush=True)
    return diff


def markdown(curve: dict) -> str:
    """A ``batch x tokens`` table of ms and, per batch, the cost relative to one token."""
    tokens = list(next(iter(curve.values())))
    lines = ["| batch | " + " | ".join(f"{t} tok" for t in tokens) + " |", "|---" * (len(tokens) + 1) + "|"]
    for b, row in curve.items():
        lines.append(f"| {b} | " + " | ".join(f"{ms:.2f} ({ms / row[tokens[0]]:.2f}x)" for ms in row.values()) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, help="where gpu_verify_cost.json goes (measure)")
    ap.add_argument("--report", type=Path, help="print a saved run's tables and break-even accept lengths, no timing")
    ap.add_argument("--tiers", default="1,2;2,4;4,8;6,16;8,32", help="with --report: steps,tokens;...")
    ap.add_argument("--topk", type=int, default=8, help="with --report: the beam's width")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tiny", action="store_true", help="tiny shapes (plumbing dry run)")
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--extra", action="store_true", help="also: the 7B at context 4096, and without attention")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--models", default="qwen2.5-7b,smollm2-135m")
    args = ap.parse_args(argv)
    if args.report:
        res = json.loads(args.report.read_text())
        tiers = [tuple(int(v) for v in t.split(",")) for t in args.tiers.split(";")]
        print_tables(res)
        for m in res["decode"]:
            if f"{m}-eagle3" in res["draft"]:
                print(
                    f"\n{m}: accept length a step must reach to match the decode step\n"
                    + break_even(res, m, tiers, args.topk)
                )
        return 0
    if args.out is None:
        ap.error("--out is required to measure")
    batches = (1, 2, 4) if args.tiny else (1, 2, 4, 8, 16, 32)
    tokens = (1, 2, 4) if args.tiny else (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)
    rows = (1, 8) if args.tiny else (1, 8, 16, 32, 64, 128, 256)
    models = ["tiny"] if args.tiny else args.models.split(",")
    t0 = time.time()
    res: dict = {
        "device": torch.cuda.get_device_name() if args.device == "cuda" else args.device,
        "torch": torch.__version__, "context": args.context, "reps": args.reps,
        "shapes": {m: asdict(MODELS[m]) for m in models}, "verify": {}, "draft": {},
    }  # fmt: skip
    res["decode"] = {}
    for m in models:
        res["verify"][m] = verify_curve(m, batches, tokens, args.context, args.device, args.reps)
        one = verify_curve(m, batches, (1,), args.context, args.device, args.reps, "mask")
        res["decode"][m] = {b: row[1] for b, row in one.items()}
        head = f"{m}-eagle3"
        if head in MODELS:
            res["shapes"][head] = asdict(MODELS[head])
            res["draft"][head] = draft_curve(head, rows, 8, args.context, args.device, args.reps)
    if args.extra:
        few_b, few_t = (1, 8, 32) if not args.tiny else (1, 2), (1, 2, 3, 4, 8, 16, 32) if not args.tiny else (1, 2)
        m = models[0]
        res["verify_context_4096"] = {m: verify_curve(m, few_b, few_t, 4096, args.device, args.reps)}
        for att in ("mask", "none"):
            curve = verify_curve(m, few_b, few_t, args.context, args.device, args.reps, att)
            res[f"verify_attention_{att}"] = {m: curve}
    res["split_vs_mask_max_abs_diff"] = split_check(args.device)
    res["seconds"] = round(time.time() - t0, 1)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "gpu_verify_cost.json").write_text(json.dumps(res, indent=1))
    print_tables(res)
    return 0


def print_tables(res: dict) -> None:
    for key in ("verify", "verify_context_4096", "verify_attention_mask", "verify_attention_none"):
        for m, curve in res.get(key, {}).items():
            print(f"\n{key} {m}, ms (x one token)\n" + markdown(curve))


def break_even(res: dict, model: str, tiers: list[tuple[int, int]], topk: int) -> str:
    """Markdown: per batch, the decode step's ms and, per tier ``[s, N]``, the accept length (tokens a request gains
    per step, bonus included) at which the step costs what that many decode steps do.  A step is priced as one draft
    step on the batch's roots, ``s - 1`` on ``batch x topk`` rows, the verify of ``N`` tokens, and a draft extend
    priced as one draft step on ``batch x N`` rows; draft steps on more rows than measured scale linearly."""
    draft = {int(r): ms for r, ms in res["draft"][f"{model}-eagle3"].items()}

    def step(rows: int) -> float:
        fits = [r for r in sorted(draft) if r >= rows]
        return draft[fits[0]] if fits else draft[max(draft)] * rows / max(draft)

    lines = ["| batch | decode ms | " + " | ".join(f"`[{s}, {n}]`" for s, n in tiers) + " |"]
    lines.append("|---" * (len(tiers) + 2) + "|")
    for b, plain in res["decode"][model].items():
        verify = res["verify"][model][b]
        bi = int(b)
        cells = [(step(bi) + (s - 1) * step(bi * topk) + verify[str(n)] + step(bi * n)) / plain for s, n in tiers]
        lines.append(f"| {b} | {plain:.2f} | " + " | ".join(f"{c:.2f}" for c in cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
