"""Scheduler pass trace for ``tools/step_accounting.py``: loaded by every Python process of a server started with
this directory on ``PYTHONPATH``; active only where ``SAGE_STEP_TRACE`` names an output prefix.

When SGLang's scheduler module is first imported, ``Scheduler.run_batch`` is wrapped (sglang==0.5.23; the integration
tier checks the target exists): each call appends ``[forward_mode, batch_size, t0, t1]`` (``time.perf_counter``,
the system-wide monotonic clock on Linux, so the driving process can cut a window from it) to
``<prefix>.<pid>.jsonl``, written through at every pass.  A measurement tool, never part of a served deployment.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import json
import os
import sys
import time

_PREFIX = os.environ.get("SAGE_STEP_TRACE")
_TARGET = "sglang.srt.managers.scheduler"


def _wrap(module) -> None:
    scheduler = module.Scheduler
    run_batch = scheduler.run_batch
    out = open(f"{_PREFIX}.{os.getpid()}.jsonl", "a")  # noqa: SIM115 (lives as long as the process)

    def traced(self, batch, *args, **kwargs):
        t0 = time.perf_counter()
        result = run_batch(self, batch, *args, **kwargs)
        t1 = time.perf_counter()
        out.write(json.dumps([int(batch.forward_mode), batch.batch_size(), t0, t1]) + "\n")
        out.flush()  # a write of ~50 bytes a pass (~100 ms): nothing is left unwritten when the server is stopped
        return result

    scheduler.run_batch = traced


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != _TARGET:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        load = spec.loader.exec_module

        def exec_module(module):
            load(module)
            _wrap(module)

        spec.loader.exec_module = exec_module
        return spec


if _PREFIX:
    sys.meta_path.insert(0, _Finder())
