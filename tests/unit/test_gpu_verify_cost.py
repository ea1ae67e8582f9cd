"""``tools/gpu_verify_cost.py`` (run on a lent GPU, not in CI): its plumbing runs on CPU with tiny shapes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch


def _load():
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
    try:
        import gpu_verify_cost
    finally:
        sys.path.pop(0)
    return gpu_verify_cost


@pytest.mark.slow
def test_dry_run_writes_every_shape(tmp_path):
    repo = Path(__file__).resolve().parents[2]
    cmd = [sys.executable, str(repo / "tools" / "gpu_verify_cost.py"), "--device", "cpu", "--tiny", "--context", "8",
           "--reps", "1", "--out", str(tmp_path)]  # fmt: skip
    subprocess.run(cmd, check=True, capture_output=True, timeout=120)
    res = json.loads((tmp_path / "gpu_verify_cost.json").read_text())
    assert set(res["verify"]["tiny"]) == {"1", "2", "4"}
    assert all(set(row) == {"1", "2", "4"} and min(row.values()) > 0 for row in res["verify"]["tiny"].values())
    assert set(res["draft"]["tiny-eagle3"]) == {"1", "8"}
    assert set(res["decode"]["tiny"]) == {"1", "2", "4"}
    report = [sys.executable, str(repo / "tools" / "gpu_verify_cost.py"), "--report", str(tmp_path / "gpu_verify_cost.json"),
              "--tiers", "1,2;2,4", "--topk", "2"]  # fmt: skip
    out = subprocess.run(report, check=True, capture_output=True, text=True, timeout=60).stdout
    assert "| batch | decode ms | `[1, 2]` | `[2, 4]` |" in out


def test_break_even_prices_a_step_from_its_parts():
    """``[2, 4]`` at batch 2, topk 3: a draft step on 2 rows, one on 6, the verify of 4, an extend on 8 (scaled)."""
    mod = _load()
    res = {
        "decode": {"tiny": {"2": 10.0}},
        "verify": {"tiny": {"2": {"4": 12.0}}},
        "draft": {"tiny-eagle3": {"2": 1.0, "4": 2.0}},
    }
    want = (1.0 + 2.0 * 6 / 4 + 12.0 + 2.0 * 8 / 4) / 10.0
    assert mod.break_even(res, "tiny", [(2, 4)], 3).splitlines()[-1] == f"| 2 | 10.00 | {want:.2f} |"


def test_forward_matches_a_naive_decoder_with_the_kv_cache():
    """Verifying ``t`` tokens after a context in the cache gives the logits of one causal pass over all of them."""
    mod = _load()
    shape = mod.MODELS["tiny"]
    dec = mod.Decoder(shape, 2, 12, "cpu", torch.float32)
    ids = torch.randint(0, shape.vocab, (2, 10))
    full = dec.forward(ids, 0, mod.tree_mask(0, 10, "cpu"))
    dec.forward(ids[:, :6], 0, mod.tree_mask(0, 6, "cpu"))  # the context, written into the cache
    tail = dec.forward(ids[:, 6:], 6, mod.tree_mask(6, 4, "cpu"))
    torch.testing.assert_close(tail, full[:, 6:], rtol=1e-4, atol=1e-4)
    top = dec.forward(ids[:, 6:], 6, mod.tree_mask(6, 4, "cpu"), topk=3)
    assert torch.equal(top, full[:, 6:].topk(3, dim=-1).indices)


def test_split_attention_equals_masked_attention_on_random_trees():
    mod = _load()
    g = torch.Generator().manual_seed(3)
    for ctx, t in ((1, 1), (5, 3), (17, 8)):
        q = torch.randn(2, 4, t, 16, generator=g)
        k, v = (torch.randn(2, 2, ctx + t, 16, generator=g) for _ in range(2))
        mask = mod.tree_mask(ctx, t, "cpu")
        mask[:, ctx:] &= torch.rand(t, t, generator=g) < 0.5
        mask[:, ctx:] |= torch.eye(t, dtype=torch.bool)
        want = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
        torch.testing.assert_close(mod.split_attention(q, k, v, ctx, mask), want, rtol=1e-5, atol=1e-5)
