"""The off tier's verify forward as a DECODE forward (``off_decode.py``, ``tier_off_decode``).

What the served check cannot see: which batches are turned (one token per request in TARGET_VERIFY mode, nothing
else), that the decode batch counts the root in its lengths, and that upstream's verify still hands its forward to
the target worker the way the proxy intercepts it (the served check, ``test_e2e_serving.py::
test_tiers_cycle_and_equal_plain``, runs the decode off steps against plain outputs).
"""

from __future__ import annotations

import inspect
from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("sglang")

from sglang.srt.model_executor.forward_batch_info import ForwardMode  # noqa: E402
from sglang.srt.speculative import eagle_worker_common, eagle_worker_v2  # noqa: E402
from sglang.srt.speculative.base_spec_worker import BaseSpecWorker  # noqa: E402

from sage_plugin.config import ConfigError, SageConfig  # noqa: E402
from sage_plugin.runtimes.sglang.off_decode import DecodeVerifyTarget, as_decode  # noqa: E402


def _verify_batch(seq_lens: list[int], draft_tokens: int = 1, mode: ForwardMode = ForwardMode.TARGET_VERIFY):
    seq = torch.tensor(seq_lens, dtype=torch.int64)
    return SimpleNamespace(
        forward_mode=mode,
        spec_info=SimpleNamespace(draft_token_num=draft_tokens),
        seq_lens=seq,
        seq_lens_cpu=seq.clone(),
        seq_lens_sum=int(seq.sum()),
        batch_size=len(seq_lens),
        positions=seq.clone(),
    )


def test_one_node_verify_becomes_decode_of_the_same_tokens():
    fb = _verify_batch([40, 7])
    out = as_decode(fb)
    assert out is fb and fb.forward_mode == ForwardMode.DECODE
    # a decode batch's lengths count the token being decoded; positions (the root's, = old lengths) are kept
    assert fb.seq_lens.tolist() == [41, 8] and fb.seq_lens_cpu.tolist() == [41, 8] and fb.seq_lens_sum == 49
    assert fb.positions.tolist() == [40, 7]


@pytest.mark.parametrize(
    "fb",
    [
        _verify_batch([40, 7], draft_tokens=2),  # a drafted tier: a tree, not a decode
        _verify_batch([40, 7], mode=ForwardMode.DECODE),
        _verify_batch([40, 7], mode=ForwardMode.EXTEND),
    ],
)
def test_anything_else_is_left_alone(fb):
    before = (fb.forward_mode, fb.seq_lens.tolist(), fb.seq_lens_cpu.tolist(), fb.seq_lens_sum)
    assert as_decode(fb) is fb
    assert (fb.forward_mode, fb.seq_lens.tolist(), fb.seq_lens_cpu.tolist(), fb.seq_lens_sum) == before


def test_lengths_without_host_copies():
    fb = _verify_batch([3])
    fb.seq_lens_cpu, fb.seq_lens_sum = None, None  # a batch planned without host lengths keeps none
    as_decode(fb)
    assert fb.seq_lens.tolist() == [4] and fb.seq_lens_cpu is None and fb.seq_lens_sum is None


class _Target:
    def __init__(self):
        self.model_runner = "runner"
        self.calls = []

    def forward_batch_generation(self, batch=None, forward_batch=None, **kwargs):
        self.calls.append((batch, forward_batch.forward_mode if forward_batch is not None else None, kwargs))
        return "result"


def test_the_proxy_turns_only_the_verify_forward():
    target = _Target()
    proxy = DecodeVerifyTarget(target)
    assert proxy.model_runner == "runner"  # everything else is the target's
    assert proxy.forward_batch_generation(batch=None, forward_batch=_verify_batch([5]), is_verify=True) == "result"
    sched = object()
    proxy.forward_batch_generation(sched, forward_batch=None)  # a ScheduleBatch forward: untouched
    assert target.calls == [(None, ForwardMode.DECODE, {"is_verify": True}), (sched, None, {})]


def test_upstream_verify_hands_its_forward_batch_to_the_target_worker():
    """The contract the proxy relies on (sglang 0.5.23): ``EAGLEWorkerV2.verify`` passes ``self.target_worker``
    (``BaseSpecWorker.target_worker`` returns ``_target_worker``) to ``run_eagle_verify``, which runs the verify
    forward as ``target_worker.forward_batch_generation(batch=None, forward_batch=..., is_verify=True)`` and the off
    tier verifies a one-node tree (``draft_token_num=1``)."""
    verify = inspect.getsource(eagle_worker_v2.EAGLEWorkerV2.verify)
    assert "run_eagle_verify(" in verify and "target_worker=self.target_worker" in verify
    assert "return self._target_worker" in inspect.getsource(BaseSpecWorker.target_worker.fget)
    run = inspect.getsource(eagle_worker_common.run_eagle_verify)
    call = run[run.index("target_worker.forward_batch_generation(") :]
    call = call[: call.index(")")]
    assert "batch=None" in call and "forward_batch=verify_forward_batch" in call and "is_verify=True" in call
    assert "draft_token_num=1" in inspect.getsource(eagle_worker_v2.EAGLEWorkerV2._build_trivial_verify_input)


def test_config_field():
    assert SageConfig().serving.tier_off_decode is True
    with pytest.raises(ConfigError, match="tier_off_decode"):
        SageConfig(tier_off_decode="yes")
