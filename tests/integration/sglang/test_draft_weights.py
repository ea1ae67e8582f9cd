"""``cpu_draft_dtype`` in SGLang (``runtimes/sglang/draft_weights.py``): which of a draft's layers are stored in
bfloat16, that nothing shared with the target or tied to an embedding changes, and that SGLang's CPU linear hook
computes such a layer in float32 (the serving runs, every output equal to plain SGLang, are ``test_e2e_serving.py``).
Stand-in layers carry SGLang's class names, which ``test_hook_targets.py`` checks upstream."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("sglang")

from sage_plugin.config import CpuConfig, SageConfig  # noqa: E402
from sage_plugin.runtimes.sglang.draft_weights import DraftHeadRows, store_draft_linears  # noqa: E402
from sage_plugin.runtimes.sglang.hooks import compute_lm_head, unquantized_linear  # noqa: E402


class UnquantizedLinearMethod:
    def apply(self, layer, x, bias=None):
        raise AssertionError("the hook computes CPU float32 rows itself")


class UnquantizedEmbeddingMethod:
    pass


class Fp8LinearMethod:
    pass


def _layer(cls_name: str, weight: torch.Tensor, quant=None, **attrs) -> torch.nn.Module:
    layer = type(cls_name, (torch.nn.Module,), {})()
    layer.weight = torch.nn.Parameter(weight, requires_grad=False)
    layer.weight.weight_loader = "loader"  # an attribute SGLang's loaders set on the parameter
    layer.quant_method = quant
    for k, v in attrs.items():
        setattr(layer, k, v)
    return layer


def _draft(target: torch.nn.Module) -> torch.nn.Module:
    g = torch.Generator().manual_seed(0)
    m = torch.nn.Module()
    m.embed_tokens = _layer("VocabParallelEmbedding", torch.randn(50, 32, generator=g), UnquantizedEmbeddingMethod())
    m.qkv_proj = _layer("QKVParallelLinear", torch.randn(48, 32, generator=g), UnquantizedLinearMethod())
    m.down_proj = _layer("RowParallelLinear", torch.randn(32, 64, generator=g), UnquantizedLinearMethod())
    m.amx = _layer("RowParallelLinear", torch.randn(32, 32, generator=g), UnquantizedLinearMethod(),
                   use_intel_amx_backend=True)  # fmt: skip
    m.fp8 = _layer("RowParallelLinear", torch.randn(32, 32, generator=g), Fp8LinearMethod())
    m.lm_head = _layer("ParallelLMHead", torch.randn(50, 32, generator=g), UnquantizedEmbeddingMethod())
    m.fc = _layer("ReplicatedLinear", torch.randn(32, 96, generator=g), UnquantizedLinearMethod())
    if hasattr(target, "shared"):
        m.fc.weight = target.shared  # an EAGLE head's layer sharing a target tensor
    m.head_rows = DraftHeadRows(torch.randn(50, 32, generator=g), torch.tensor([1, 4, 9]))
    return m


def test_the_drafts_own_plain_layers_are_stored_in_bfloat16_and_nothing_else_changes():
    target = torch.nn.Module()
    target.shared = torch.nn.Parameter(torch.randn(32, 96), requires_grad=False)
    target_before = target.shared.detach().clone()
    draft = _draft(target)
    before = {n: p.detach().clone() for n, p in draft.named_parameters()}
    assert store_draft_linears(draft, CpuConfig(cpu_draft_dtype="float32"), target) == 0
    assert all(p.dtype == torch.float32 for p in draft.parameters())

    assert store_draft_linears(draft, CpuConfig(), target) == 4  # the default: bfloat16
    stored = {"qkv_proj", "down_proj", "lm_head", "head_rows"}
    for name, module in draft.named_children():
        want = torch.bfloat16 if name in stored else torch.float32
        assert module.weight.dtype == want, name
        assert torch.equal(module.weight.float(), before[f"{name}.weight"].bfloat16().float() if name in stored
                           else before[f"{name}.weight"]), name  # fmt: skip
    assert draft.qkv_proj.weight.weight_loader == "loader"  # the loader's attributes move to the new parameter
    assert draft.fc.weight is target.shared and torch.equal(target.shared, target_before)
    assert store_draft_linears(draft, CpuConfig(), target) == 0  # once stored, nothing left to store


def test_the_cpu_hooks_compute_a_bfloat16_draft_layer_in_float32():
    draft = _draft(torch.nn.Module())
    store_draft_linears(draft, CpuConfig())
    x = torch.randn(3, 32)
    w = draft.qkv_proj.weight
    got = unquantized_linear(None, UnquantizedLinearMethod(), draft.qkv_proj, x)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, F.linear(x, w.float()), rtol=1e-5, atol=1e-4)
    proc = type("LogitsProcessor", (), {"rl_on_policy_target": None})()
    head = compute_lm_head(None, proc, x, draft.head_rows)
    torch.testing.assert_close(head, F.linear(x, draft.head_rows.weight.float()), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("cls_name", ["SageDraftWorker", "SageEagleDraftWorker"])
def test_init_lm_head_stores_the_draft_with_or_without_a_token_map(cls_name, monkeypatch):
    """Both SAGE draft workers apply ``cpu_draft_dtype`` in ``init_lm_head``, a standalone draft without a token map
    (nothing to cut) included; the EAGLE worker after upstream's head sharing (stood in for here).  The standalone
    worker then offers the draft to the lean decoder (``cpu_lean_draft``), which leaves this stand-in (no ``.model``
    decoder) as it is."""
    import types

    from sage_plugin.runtimes.sglang import draft_worker as worker_mod

    cls = getattr(worker_mod, cls_name)
    w = object.__new__(cls)
    w.draft_runner = types.SimpleNamespace(model=_draft(torch.nn.Module()))
    w.hot_token_id = None
    w.sage_cfg = SageConfig()
    w.device = "cpu"
    monkeypatch.setattr(worker_mod, "get_tp_group", lambda: types.SimpleNamespace(world_size=1))  # one rank
    w.target_worker = types.SimpleNamespace(model_runner=types.SimpleNamespace(model=torch.nn.Module()))
    upstream = [c for c in cls.__mro__ if "init_lm_head" in c.__dict__ and c.__module__.startswith("sglang")][0]
    shared = []
    original = upstream.init_lm_head
    try:
        upstream.init_lm_head = lambda self: shared.append(self)  # upstream's own step, recorded
        w.init_lm_head()
    finally:
        upstream.init_lm_head = original
    assert shared == [w]
    assert w.draft_runner.model.qkv_proj.weight.dtype == torch.bfloat16
    assert w.draft_runner.model.embed_tokens.weight.dtype == torch.float32
    assert "forward" not in w.draft_runner.model.__dict__  # no lean decoder on a model without one
