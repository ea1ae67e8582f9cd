"""Lossless tree sampling verification on CPU: what SGLang's CUDA ``tree_speculative_sampling_target_only`` does.

SGLang 0.5.23 has no CPU kernel for sampling verification (``verify_sampling.py`` leaves the name ``None`` off
CUDA/MUSA/NPU), so its CPU verify commits the target's argmax even for ``temperature > 0`` requests.  This
function gives the same results as the CUDA kernel (``kernels/jit/include/sgl_kernel/speculative/sampling.cuh``)
for the same coins, so the CPU path samples from the target distribution exactly.

Per request, walking down from the root (node 0) one tree level at a time with the current node's coin
``u = uniform_samples[b, node]`` and target distribution ``q = target_probs[b, node]``: the children are tried in
sibling order, accumulating ``acc += q[token]``; a child is accepted when ``q[token] > 0`` and
(``u < acc / threshold_acc`` or ``q[token] >= threshold_single``).  With both thresholds 1 this is inverse-CDF
sampling from ``q`` over the children, so child ``x`` is accepted with probability exactly ``q(x)``.  A tried
child's ``q[token]`` is copied into ``draft_probs[b, node, token]``.  When no child is accepted (or the tree ends),
the bonus token is drawn with ``uniform_samples_for_final_sampling[b]`` from ``relu(q - draft_probs)``
(renormalised), i.e. ``q`` without the rejected children -- or from ``q`` itself when the whole depth was
accepted.  ``predicts[retrive_index[b, node]]`` is the token that follows node ``node`` on the accepted path.

Worked example (one request, root with children a, b; vocabulary {a, b, c}; q_root = [0.5, 0.3, 0.2];
thresholds 1): coin 0.6 -> a: acc 0.5, 0.6 >= 0.5, rejected (draft_probs[root, a] = 0.5) -> b: acc 0.8,
0.6 < 0.8, accepted.  Coin 0.9 -> a and b rejected -> bonus from relu(q - [0.5, 0.3, 0]) = [0, 0, 0.2]: c.
"""

from __future__ import annotations

import sys

import torch

from sage_plugin.core.filters import renormalise, top_k_keep, top_p_keep

from ._common import _flat_out, _write_accepted_paths

__all__ = [
    "cpu_sampling_kernels_in_place",
    "top_k_renorm_prob_cpu",
    "top_p_renorm_prob_cpu",
    "tree_speculative_sampling_target_only_cpu",
]

EAGLE_UTILS = "sglang.srt.speculative.eagle_utils"
_cpu_kernels_ready = False  # eagle_utils holds the CPU sampling kernels (set once by cpu_sampling_kernels_in_place)


def _per_row(value: torch.Tensor | float | int, rows: int, dtype: torch.dtype) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value.reshape(-1).to(dtype).expand(rows) if value.numel() == 1 else value.reshape(rows).to(dtype)
    return torch.full((rows,), value, dtype=dtype)


def top_k_renorm_prob_cpu(probs: torch.Tensor, top_ks: torch.Tensor | int) -> torch.Tensor:
    """Keep each row's ``top_ks`` most probable tokens (``probs [R, V]``, ``top_ks [R]``), renormalised.

    SGLang's CPU sampler rule for plain decoding (rank in a descending sort ``< k``, :func:`~sage_plugin.core.filters.
    top_k_keep` with ``ties=False``), so the speculative path samples from the distribution plain decoding samples from.
    """
    rows, _ = probs.shape
    return renormalise(probs, top_k_keep(probs, _per_row(top_ks, rows, torch.long)[:, None], ties=False))


def top_p_renorm_prob_cpu(probs: torch.Tensor, top_ps: torch.Tensor | float) -> torch.Tensor:
    """Keep each row's smallest most-probable prefix reaching ``top_ps`` mass (``[R, V]``, ``[R]``), renormalised.

    SGLang's CPU sampler rule: in descending order, a token is dropped when the mass before it exceeds ``p``
    (:func:`~sage_plugin.core.filters.top_p_keep`, ``"exceed"``).
    """
    rows, _ = probs.shape
    return renormalise(probs, top_p_keep(probs, _per_row(top_ps, rows, probs.dtype)[:, None], "exceed"))


def tree_speculative_sampling_target_only_cpu(
    predicts: torch.Tensor,
    accept_index: torch.Tensor,
    accept_token_num: torch.Tensor,
    candidates: torch.Tensor,
    retrive_index: torch.Tensor,
    retrive_next_token: torch.Tensor,
    retrive_next_sibling: torch.Tensor,
    uniform_samples: torch.Tensor,
    uniform_samples_for_final_sampling: torch.Tensor,
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    threshold_single: float = 1.0,
    threshold_acc: float = 1.0,
    deterministic: bool = True,
) -> None:
    """Sampling verification of ``bs`` trees of ``N`` nodes (CUDA kernel semantics, module docstring).

    Shapes: ``candidates``, ``retrive_*``, ``uniform_samples`` ``[bs, N]``; ``target_probs``/``draft_probs``
    ``[bs, N, V]`` (``draft_probs`` is written); ``uniform_samples_for_final_sampling`` ``[bs]``;
    ``accept_index`` ``[bs, steps]`` and ``accept_token_num`` ``[bs]`` (written); ``predicts`` ``[bs * N]``
    (written at the accepted path's global indices).  ``deterministic`` has no effect on CPU.
    """
    bs, n = candidates.shape
    steps = accept_index.shape[1]
    vocab = target_probs.shape[-1]
    cand = candidates.to(torch.long)
    ri = retrive_index.reshape(bs, n).to(torch.long)
    nt = retrive_next_token.reshape(bs, n).to(torch.long)
    ns = retrive_next_sibling.reshape(bs, n).to(torch.long)
    q = target_probs.reshape(bs, n, vocab)
    p = draft_probs.view(bs, n, vocab)  # written through
    coins = uniform_samples.reshape(bs, n)
    t_acc = max(float(threshold_acc), 1e-9)
    b = torch.arange(bs)
    none = torch.full((bs,), -1, dtype=torch.long)

    node = torch.zeros(bs, dtype=torch.long)  # the last accepted node
    live = torch.ones(bs, dtype=torch.bool)
    acc = torch.full((bs, steps), -1, dtype=torch.long)
    acc[:, 0] = ri[:, 0]
    num = torch.zeros(bs, dtype=torch.long)
    out = _flat_out(predicts, "predicts")
    for j in range(1, steps):
        cur = torch.where(live, nt[b, node], none)
        coin = coins[b, node]
        mass = torch.zeros(bs, dtype=q.dtype)
        child = none.clone()
        active = cur >= 0
        while bool(active.any()):
            c = cur.clamp(min=0)
            tok = torch.where(active, cand[b, c], 0)  # inactive rows read a dummy in-vocabulary entry
            tp = q[b, node, tok]
            mass = torch.where(active, mass + tp, mass)
            hit = active & (tp > 0) & ((coin < mass / t_acc) | (tp >= threshold_single))
            child = torch.where(hit, c, child)
            miss = active & ~hit
            p[b[miss], node[miss], tok[miss]] = tp[miss]
            cur = torch.where(miss, ns[b, c], none)
            active = miss & (cur >= 0)
        got = child >= 0
        out[ri[b, node][got]] = cand[b, child][got].to(out.dtype)
        node = torch.where(got, child, node)
        acc[:, j] = torch.where(got, ri[b, node], acc[:, j])
        num += got.to(num.dtype)
        live = got
        if not bool(live.any()):
            break

    # bonus token: inverse CDF of relu(q - p) at the last accepted node (q itself after a full-depth path)
    qq = q[b, node]
    resid = torch.where((num == steps - 1)[:, None], qq, (qq - p[b, node]).clamp(min=0))
    cdf = resid.cumsum(-1)
    u = uniform_samples_for_final_sampling.reshape(bs).to(cdf.dtype) * cdf[:, -1]
    above = cdf > u[:, None]
    first = torch.where(above.any(-1), above.to(torch.int8).argmax(-1), torch.full_like(node, vocab))
    # u at the very top (rounding): the last token with mass, else the last token (the kernel's fallback)
    positive = resid > 0
    last_valid = torch.where(positive.any(-1), vocab - 1 - positive.flip(-1).to(torch.int8).argmax(-1),
                             torch.full_like(node, vocab - 1))  # fmt: skip
    sampled = torch.where(first == vocab, last_valid, first)
    out[ri[b, node]] = sampled.to(out.dtype)

    _write_accepted_paths(accept_index, accept_token_num, acc)


def cpu_sampling_kernels_in_place() -> bool:
    """Fill ``eagle_utils``' missing (``None``) sampling kernels with the CPU ones; whether all three are there.

    Done once per process: the answer is kept, so a verify step pays one global lookup.
    """
    global _cpu_kernels_ready
    if _cpu_kernels_ready:
        return True
    module = sys.modules.get(EAGLE_UTILS)  # the caller's module: already imported
    if module is None:
        return False
    kernels = {
        "tree_speculative_sampling_target_only": tree_speculative_sampling_target_only_cpu,
        "top_k_renorm_prob": top_k_renorm_prob_cpu,
        "top_p_renorm_prob": top_p_renorm_prob_cpu,
    }
    for name, kernel in kernels.items():
        if getattr(module, name, None) is None:
            setattr(module, name, kernel)
    _cpu_kernels_ready = all(getattr(module, name, None) is not None for name in kernels)
    return _cpu_kernels_ready
