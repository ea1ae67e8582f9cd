"""Repository-wide pytest configuration.

``--doctest-modules`` imports every module under ``sage_plugin/``.  Adapter modules that subclass a
runtime's classes import that runtime at module level; without the runtime installed (CI's main venv
has no SGLang) they are left out of doctest collection instead of failing it.  Their tests live in
``tests/integration/<runtime>/`` and skip there.
"""

from __future__ import annotations

import importlib.util

collect_ignore: list[str] = []
if importlib.util.find_spec("sglang") is None:
    collect_ignore += ["sage_plugin/runtimes/sglang/algo.py", "sage_plugin/runtimes/sglang/worker.py"]
