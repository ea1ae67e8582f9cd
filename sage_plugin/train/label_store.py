"""The label shards of a draft-distillation run read back for training (:mod:`.labels` writes them).

:class:`LabelStore` memory-maps every shard of ``DIR/labels`` (``chat_K.pt`` then ``text_K.pt``), keeps the first
windows of each source apart as the validation slice, and indexes the rest (chat windows ``chat_repeat`` times) as
``(shard, row)`` pairs that :meth:`LabelStore.batch` stacks into a training batch.
"""

from __future__ import annotations

from pathlib import Path

import torch

__all__ = ["LabelStore", "load_shard"]


def load_shard(path: Path) -> dict:
    """A label (or generation) shard, memory-mapped on CPU."""
    return torch.load(path, map_location="cpu", weights_only=True, mmap=True)


class LabelStore:
    """All label shards of a run (memory-mapped), a fixed validation slice and the training index."""

    def __init__(self, label_dir: Path, val_windows: int, chat_repeat: int):
        files = sorted(label_dir.glob("chat_*.pt")) + sorted(label_dir.glob("text_*.pt"))
        if not files:
            raise SystemExit(f"no label shards in {label_dir}")
        self.shards = [load_shard(f) for f in files]
        self.sources = ["chat" if f.name.startswith("chat_") else "text" for f in files]
        train, val = [], []
        seen: set[str] = set()  # the first shard of each source gives the validation windows
        for s, (sh, src) in enumerate(zip(self.shards, self.sources, strict=False)):
            n = int(sh["input_ids"].shape[0])
            n_val = 0
            if src not in seen:
                seen.add(src)
                n_val = min(val_windows, n // 2)
            val += [(s, r) for r in range(n_val)]
            rows = [(s, r) for r in range(n_val, n)]
            train += rows * (chat_repeat if src == "chat" else 1)
        self.train_index = torch.tensor(train, dtype=torch.long).view(-1, 2)
        self.val_index = torch.tensor(val, dtype=torch.long).view(-1, 2)

    def num_tokens(self, source: str | None = None) -> int:
        return sum(
            int(sh["input_ids"].numel())
            for sh, src in zip(self.shards, self.sources, strict=False)
            if source in (None, src)
        )

    def batch(self, pairs: torch.Tensor) -> dict[str, torch.Tensor]:
        keys = ("input_ids", "topk_ids", "topk_logprobs")
        out = {k: torch.stack([self.shards[int(s)][k][int(r)] for s, r in pairs.tolist()]) for k in keys}
        out["source"] = [self.sources[int(s)] for s in pairs[:, 0].tolist()]
        return out

    def label_counts(self, vocab_size: int, inputs: bool = True) -> torch.Tensor:
        """Per-token counts of the target's top-1 labels, plus of the input tokens unless ``inputs`` is False."""
        counts = torch.zeros(vocab_size, dtype=torch.long)
        for sh in self.shards:
            counts += torch.bincount(sh["topk_ids"][..., 0].reshape(-1).long(), minlength=vocab_size)[:vocab_size]
            if inputs:
                counts += torch.bincount(sh["input_ids"].reshape(-1).long(), minlength=vocab_size)[:vocab_size]
        return counts
