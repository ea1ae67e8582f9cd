"""Training data for an EAGLE-3 head: the target's own answers with its captured hidden states and top-k labels.

Stage input: the target's greedy answers to the offline chat prompts (``gen/gen_K.pt``, written by
:func:`sage_plugin.train.labels.chat_generations`).  For every sequence one teacher-forced target forward gives

* ``feats`` [N, 3H] fp16: the residual stream entering layers ``l + 1`` for the three ``aux_layers`` ``l``
  (what SGLang captures for EAGLE-3 with ``eagle_aux_hidden_state_layer_ids``), low/mid/high concatenated;
* ``topk_ids`` [N, K] int32 / ``topk_logprobs`` [N, K] fp16: the target's next-token distribution at each position.

Shards ``feat/feat_K.pt`` (sequences packed end to end: ``tokens`` [N] int32, ``offsets`` [S + 1], ``answer_start``
[S] = the first answer token of each sequence) are written atomically and skipped when present.
:class:`FeatureStore` memory-maps them and cuts training windows: each window is a piece of one sequence (no
attention across sequences), right-padded, with a loss mask on answer tokens.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

import torch

from ..common import atomic_save, progress_bar
from ..label_store import load_shard

logger = logging.getLogger(__name__)

__all__ = ["FEATURE_FORMAT", "target_features", "build_feature_shard", "FeatureStore"]

FEATURE_FORMAT = 1


@torch.inference_mode()
def target_features(target, ids: torch.Tensor, aux_layers: Sequence[int], topk: int):
    """(feats [B, T, 3H] fp16, topk ids [B, T, K] int32, topk log-probs [B, T, K] fp16) of right-padded ``ids``."""
    out = target(input_ids=ids, output_hidden_states=True, use_cache=False)
    hs = out.hidden_states
    feats = torch.cat([hs[layer + 1] for layer in aux_layers], dim=-1).to(torch.float16)
    logits = out.logits.float()
    vals, idx = logits.topk(topk, dim=-1)
    lp = vals - torch.logsumexp(logits, dim=-1, keepdim=True)
    return feats, idx.to(torch.int32), lp.to(torch.float16)


def build_feature_shard(
    target, gen: dict, prompt_lens: Sequence[int], path: Path, aux_layers: Sequence[int], topk: int, batch: int = 8
) -> dict:
    """Features of one generation shard's sequences, saved at ``path`` (see module doc); returns the shard."""
    seqs = [s.to(torch.long) for s in gen["sequences"]]
    order = sorted(range(len(seqs)), key=lambda i: len(seqs[i]))
    parts: dict[int, tuple] = {}
    for s in range(0, len(order), batch):
        idx = order[s : s + batch]
        width = max(len(seqs[i]) for i in idx)
        ids = torch.zeros(len(idx), width, dtype=torch.long)
        for r, i in enumerate(idx):
            ids[r, : len(seqs[i])] = seqs[i]
        f, ti, tl = target_features(target, ids, aux_layers, topk)
        for r, i in enumerate(idx):
            n = len(seqs[i])
            parts[i] = (f[r, :n], ti[r, :n], tl[r, :n])
    lens = torch.tensor([len(s) for s in seqs])
    shard = {
        "format": FEATURE_FORMAT,
        "aux_layers": list(aux_layers),
        "tokens": torch.cat(seqs).to(torch.int32),
        "offsets": torch.cat([torch.zeros(1, dtype=torch.long), lens.cumsum(0)]),
        "answer_start": torch.tensor(list(prompt_lens), dtype=torch.long),
        "feats": torch.cat([parts[i][0] for i in range(len(seqs))]),
        "topk_ids": torch.cat([parts[i][1] for i in range(len(seqs))]),
        "topk_logprobs": torch.cat([parts[i][2] for i in range(len(seqs))]),
    }
    atomic_save(shard, path)
    return shard


class FeatureStore:
    """Feature shards of a run directory cut into windows of at most ``seq_len`` tokens (one sequence each).

    ``windows`` is a list of (shard, start, length, answer_start) rows; :meth:`batch` returns padded tensors
    ``tokens`` [B, T], ``feats`` [B, T, 3H] (fp32), ``topk_ids``/``topk_logprobs`` [B, T, K], ``mask`` [B, T]
    (True where position ``t`` predicts an answer token ``t + 1``).
    """

    def __init__(self, paths: Sequence[Path], seq_len: int, progress: bool = False):
        self.shards = [load_shard(p) for p in progress_bar(paths, desc="load features", disable=not progress)]
        self.seq_len = seq_len
        self.windows: list[tuple[int, int, int, int]] = []
        for k, sh in enumerate(self.shards):
            off = sh["offsets"].tolist()
            for i, ans in enumerate(sh["answer_start"].tolist()):
                a, b = off[i], off[i + 1]
                for s in range(a, b - 1, seq_len):
                    self.windows.append((k, s, min(seq_len, b - s), a + ans))

    def num_tokens(self) -> int:
        return sum(w[2] for w in self.windows)

    def batch(self, rows: Sequence[int]) -> dict[str, torch.Tensor]:
        ws = [self.windows[r] for r in rows]
        T = max(w[2] for w in ws)
        sh0 = self.shards[ws[0][0]]
        H3, K = sh0["feats"].shape[1], sh0["topk_ids"].shape[1]
        out = {
            "tokens": torch.zeros(len(ws), T, dtype=torch.long),
            "feats": torch.zeros(len(ws), T, H3),
            "topk_ids": torch.zeros(len(ws), T, K, dtype=torch.long),
            "topk_logprobs": torch.full((len(ws), T, K), -1e4),
            "mask": torch.zeros(len(ws), T, dtype=torch.bool),
        }
        for r, (k, s, n, ans) in enumerate(ws):
            sh = self.shards[k]
            out["tokens"][r, :n] = sh["tokens"][s : s + n]
            out["feats"][r, :n] = sh["feats"][s : s + n].float()
            out["topk_ids"][r, :n] = sh["topk_ids"][s : s + n]
            out["topk_logprobs"][r, :n] = sh["topk_logprobs"][s : s + n].float()
            pos = torch.arange(s, s + n)
            out["mask"][r, :n] = pos + 1 >= ans
        return out
