"""``tools/step_accounting.py`` (a measurement tool, not run in CI): its pass summary, and the scheduler target its
tracer wraps."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _load():
    sys.path.insert(0, str(REPO / "tools"))
    try:
        import step_accounting
    finally:
        sys.path.pop(0)
    return step_accounting


def test_summary_worked_example():
    tool = _load()
    passes = [[2, 8, 10.0, 10.4], [1, 2, 10.4, 10.5], [2, 8, 10.55, 10.95], [2, 9, 11.0, 11.3]]  # the last ends late
    s = tool.summarize(passes, 10.0, 11.0, tokens=18)
    assert s["window_s"] == pytest.approx(1.0) and s["tok_s"] == pytest.approx(18.0)
    dec, pre = s["modes"]["decode"], s["modes"]["prefill"]
    assert (dec["passes"], pre["passes"]) == (2, 1)
    assert dec["share"] == pytest.approx(0.8) and dec["mean_ms"] == pytest.approx(400.0)
    assert dec["mean_requests"] == 8 and pre["mean_requests"] == 2 and pre["share"] == pytest.approx(0.1)
    assert s["rest_share"] == pytest.approx(0.1)
    assert s["decode_ms_per_token"] == pytest.approx(800.0 / 16)
    assert "decode" in tool.format_summary("sage", s)


def test_summary_names_unknown_modes_and_no_decode():
    tool = _load()
    s = tool.summarize([[5, 4, 0.0, 0.5]], 0.0, 1.0, tokens=0)
    assert set(s["modes"]) == {"mode 5"} and s["decode_ms_per_token"] is None


@pytest.mark.skipif(importlib.util.find_spec("sglang") is None, reason="SGLang not installed")
def test_tracer_target_exists():
    """The tracer wraps ``Scheduler.run_batch(self, batch)`` and reads ``forward_mode`` / ``batch_size()``."""
    import inspect

    from sglang.srt.managers.schedule_batch import ScheduleBatch
    from sglang.srt.managers.scheduler import Scheduler

    assert list(inspect.signature(Scheduler.run_batch).parameters)[:2] == ["self", "batch"]
    assert callable(ScheduleBatch.batch_size) and "forward_mode" in ScheduleBatch.__dataclass_fields__
