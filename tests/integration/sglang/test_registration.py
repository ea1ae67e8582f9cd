"""Registration: entry point, ``SpeculativeAlgorithm`` lookup, idempotence, kill switch, version pin, conformance.

Registration tests run in fresh interpreters (SGLang's registries are process-global and a name can be
registered once per process); the conformance tests only instantiate ``SageSpecAlgo``.
"""

from __future__ import annotations

import types
from importlib import metadata

import pytest

pytest.importorskip("sglang")

import torch  # noqa: E402
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm  # noqa: E402
from sglang.srt.speculative.spec_registry import CustomSpecAlgo, _assert_custom_spec_algo_conforms  # noqa: E402

from sage_plugin.runtimes.sglang.algo import (  # noqa: E402
    REGISTRATIONS,
    SageEagle3SpecAlgo,
    SageEagleSpecAlgo,
    SageSpecAlgo,
)

FRESH_PROCESS = """
import argparse, json
import torch
from sglang.srt.plugins import load_plugins
from sglang.srt.plugins.hook_registry import HookRegistry
from sglang.srt.server_args import ServerArgs
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
from sglang.srt.speculative.spec_registry import _REGISTRY
from sglang.srt.utils.common import is_cpu

load_plugins()  # the only way SAGE gets in: its entry point

out = {}
algo = SpeculativeAlgorithm.from_string("sage")
out["class"] = f"{type(algo).__module__}.{type(algo).__qualname__}"
out["name"] = algo.name
out["supports_overlap"] = algo.supports_overlap
out["factory"] = algo.factory.__name__

import sage_plugin.runtimes.sglang as plugin
from sage_plugin.runtimes.sglang.hooks import HOOK_TARGETS

plugin.register()
plugin.register()
plugin._registered = False  # past the module guard: the registry checks must hold on their own
plugin.register()

out["same_algo"] = SpeculativeAlgorithm.from_string("SAGE") is algo
out["variants"] = {n: [type(SpeculativeAlgorithm.from_string(n)).__name__, SpeculativeAlgorithm.from_string(n).factory.__name__]
                   for n in ("sage_eagle", "sage_eagle3")}
out["registry"] = sorted(_REGISTRY)
out["sage_hooks"] = {
    t: sum(1 for _, h, _ in HookRegistry._hooks[t] if getattr(h, "__module__", "").startswith("sage_plugin"))
    for t in HOOK_TARGETS
}
parser = argparse.ArgumentParser()
ServerArgs.add_cli_args(parser)  # a doubly applied hook would raise an argparse conflict here
record = ServerArgs.from_cli_args(parser.parse_args(["--model-path", "m", "--sage-w-max", "4"]))
out["stash"] = dict(record._sage_cli.overrides)
out["is_cpu"] = is_cpu()
import logging
out["log_level"] = logging.getLevelName(logging.getLogger("sage_plugin").level)
out["cpu_ops"] = [n for n in ("verify_tree_greedy_cpu", "build_tree_kernel_efficient_cpu") if hasattr(torch.ops.sgl_kernel, n)]
from sage_plugin.kernels import native
out["kernels_built_at_first_use"] = native._may_build[0]
print("RESULT " + json.dumps(out))
"""


@pytest.fixture(scope="module")
def fresh(run_python):
    return run_python(FRESH_PROCESS, env={"SAGE_LOG_LEVEL": "debug"})


def test_entry_point_is_declared():
    eps = {ep.name: ep.value for ep in metadata.entry_points(group="sglang.srt.plugins")}
    assert eps.get("sage") == "sage_plugin.runtimes.sglang:register", (
        "reinstall the package (pip install --no-deps -e .) so SGLang sees the entry point"
    )


def test_load_plugins_registers_sage(fresh):
    assert fresh["class"] == "sage_plugin.runtimes.sglang.algo.SageSpecAlgo"
    assert fresh["name"] == "SAGE"
    assert fresh["supports_overlap"] is True  # a CPU server turns overlap off unless cpu_overlap (handle_server_args)
    assert fresh["factory"] == "sage_worker_factory"


def test_eagle_variants_registered(fresh):
    assert fresh["variants"] == {
        "sage_eagle": ["SageEagleSpecAlgo", "sage_eagle_worker_factory"],
        "sage_eagle3": ["SageEagle3SpecAlgo", "sage_eagle_worker_factory"],
    }


def test_register_is_idempotent(fresh):
    assert fresh["same_algo"]
    assert fresh["registry"].count("SAGE") == 1
    assert fresh["registry"].count("SAGE_EAGLE") == 1 and fresh["registry"].count("SAGE_EAGLE3") == 1
    assert set(fresh["sage_hooks"].values()) == {1}, fresh["sage_hooks"]


def test_sage_log_level(fresh):
    assert fresh["log_level"] == "DEBUG"


def test_flags_reach_the_record_in_a_fresh_process(fresh):
    assert fresh["stash"] == {"w_max": 4}


def test_no_kernel_is_compiled_in_a_process_sglang_registered_sage_in(fresh):
    """A server process loads the CPU kernels ``sage setup`` built and never starts a compiler: a kernel not built
    runs its torch path (tests/unit/test_kernel_isa.py checks that path)."""
    assert fresh["kernels_built_at_first_use"] is False


def test_cpu_ops_registered_on_cpu(fresh):
    if not fresh["is_cpu"]:
        pytest.skip("SGLang is not on CPU here (SGLANG_USE_CPU_ENGINE != 1)")
    assert fresh["cpu_ops"] == ["verify_tree_greedy_cpu", "build_tree_kernel_efficient_cpu"]


KILL_SWITCH = """
import argparse, json
from sglang.srt.plugins import load_plugins
from sglang.srt.plugins.hook_registry import HookRegistry
from sglang.srt.server_args import ServerArgs
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

load_plugins()
out = {}
try:
    SpeculativeAlgorithm.from_string("sage")
    out["sage"] = "registered"
except ValueError as exc:
    out["sage"] = str(exc)
out["sage_hooks"] = sum(
    1 for hooks in HookRegistry._hooks.values() for _, h, _ in hooks
    if getattr(h, "__module__", "").startswith("sage_plugin")
)
parser = argparse.ArgumentParser()
ServerArgs.add_cli_args(parser)
out["has_flag"] = any("--sage-w-max" in a.option_strings for a in parser._actions)
print("RESULT " + json.dumps(out))
"""


def test_sage_enabled_0_registers_nothing(run_python):
    out = run_python(KILL_SWITCH, env={"SAGE_ENABLED": "0"})
    assert out == {"sage": "Unknown speculative algorithm name: sage", "sage_hooks": 0, "has_flag": False}


VERSION_PIN = """
import json
import sage_plugin.compat as compat
compat.SGLANG_VERSION = "0.0.1"  # pretend the adapter were pinned to another release
import sage_plugin.runtimes.sglang as plugin
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

out = {}
try:
    plugin.register()
    out["error"] = None
except compat.RuntimeVersionError as exc:
    out["error"] = str(exc)
try:
    SpeculativeAlgorithm.from_string("sage")
    out["registered"] = True
except ValueError:
    out["registered"] = False
print("RESULT " + json.dumps(out))
"""


def test_version_mismatch_is_one_clear_error(run_python):
    out = run_python(VERSION_PIN)
    installed = metadata.version("sglang")
    assert out["registered"] is False
    assert "sglang==0.0.1" in out["error"] and f"sglang {installed} is installed" in out["error"]
    assert "SAGE_SKIP_VERSION_CHECK=1" in out["error"]


def test_version_check_override(run_python):
    out = run_python(VERSION_PIN, env={"SAGE_SKIP_VERSION_CHECK": "1"})
    assert out == {"error": None, "registered": True}


# -- conformance (no registration) -------------------------------------------------------------


def _sage(cls: type = SageSpecAlgo, name: str = "SAGE") -> SageSpecAlgo:
    return cls(name=name, factory=lambda server_args: None, supports_overlap=False)


SPEC_CLASSES = [SageSpecAlgo, SageEagleSpecAlgo, SageEagle3SpecAlgo]


@pytest.mark.parametrize("cls", SPEC_CLASSES)
def test_spec_class_conforms(cls):
    assert issubclass(cls, CustomSpecAlgo)
    _assert_custom_spec_algo_conforms(cls)  # SGLang's own check (is_* / supports_*)


def test_registrations_cover_every_spec_class():
    assert [spec for spec, _ in REGISTRATIONS.values()] == SPEC_CLASSES


def test_every_enum_method_exists():
    """Every method the scheduler may call on a built-in algorithm exists on SageSpecAlgo (research §2b)."""
    enum_methods = {
        name
        for name, value in vars(SpeculativeAlgorithm).items()
        if not name.startswith("_") and callable(value) and not isinstance(value, classmethod)
    }
    assert {"create_future_map", "carries_draft_hidden_states", "need_topk", "get_platform_worker_cls"} <= enum_methods
    missing = sorted(name for name in enum_methods if not callable(getattr(SageSpecAlgo, name, None)))
    assert not missing, f"SpeculativeAlgorithm methods SageSpecAlgo lacks: {missing}"


PREDICATE_PREFIXES = ("is_", "supports_", "has_", "carries_", "need_")


#: predicates where a SAGE variant deliberately differs from the built-in it mirrors (algo.py docstring)
DEVIATIONS = {"supports_mixed_chunk": False}


@pytest.mark.parametrize("cls", SPEC_CLASSES)
@pytest.mark.parametrize(
    "name",
    sorted(n for n in vars(SpeculativeAlgorithm) if n.startswith(PREDICATE_PREFIXES)),
)
def test_predicates_match_the_mirrored_builtin(cls, name):
    """SAGE takes the plumbing of its draft kind: STANDALONE, EAGLE or EAGLE3 (EAGLE's tree verify for all)."""
    ours = getattr(_sage(cls), name)()
    expected = DEVIATIONS.get(name, getattr(SpeculativeAlgorithm[cls.MIRRORS], name)())
    assert ours == expected, (cls.__name__, name)


def test_scheduler_methods():
    algo = _sage()
    assert algo.get_platform_worker_cls() is None
    pool = types.SimpleNamespace(req_to_token=torch.zeros(4, 16, dtype=torch.int32))
    ours = algo.create_future_map(torch.device("cpu"), pool)
    theirs = SpeculativeAlgorithm.STANDALONE.create_future_map(torch.device("cpu"), pool)
    assert type(ours) is type(theirs) and ours.spec_algo is algo

    def buffers(fm):
        return {k: (tuple(v.shape), v.dtype) for k, v in vars(fm).items() if isinstance(v, torch.Tensor)}

    assert buffers(ours) == buffers(theirs)


def test_factory_gives_the_sage_worker():
    """The factory hands SGLang SageWorkerV2, a STANDALONE v2 worker whose draft worker becomes SageDraftWorker."""
    pytest.importorskip("sgl_kernel")
    from sglang.srt.speculative.standalone_worker_v2 import StandaloneDraftWorker, StandaloneWorkerV2

    from sage_plugin.runtimes.sglang.algo import sage_worker_factory
    from sage_plugin.runtimes.sglang.worker import SageDraftWorker, SageWorkerV2

    assert sage_worker_factory(None) is SageWorkerV2
    assert issubclass(SageWorkerV2, StandaloneWorkerV2) and issubclass(SageDraftWorker, StandaloneDraftWorker)
    built = StandaloneDraftWorker.__new__(StandaloneDraftWorker)
    built.__class__ = SageDraftWorker  # what SageWorkerV2 does to the draft worker SGLang built


def test_eagle_factory_gives_the_sage_eagle_worker():
    """EAGLE/EAGLE3 heads: SageEagleWorkerV2, an EAGLE v2 worker whose draft worker becomes SageEagleDraftWorker."""
    pytest.importorskip("sgl_kernel")
    from sglang.srt.speculative.eagle_worker_v2 import EagleDraftWorker, EAGLEWorkerV2
    from sglang.srt.speculative.standalone_worker_v2 import StandaloneWorkerV2

    from sage_plugin.runtimes.sglang.algo import sage_eagle_worker_factory
    from sage_plugin.runtimes.sglang.worker import SageEagleDraftWorker, SageEagleWorkerV2

    assert sage_eagle_worker_factory(None) is SageEagleWorkerV2
    assert issubclass(SageEagleWorkerV2, EAGLEWorkerV2) and not issubclass(SageEagleWorkerV2, StandaloneWorkerV2)
    assert issubclass(SageEagleDraftWorker, EagleDraftWorker)
    built = EagleDraftWorker.__new__(EagleDraftWorker)
    built.__class__ = SageEagleDraftWorker  # the mixins must not change the object layout
