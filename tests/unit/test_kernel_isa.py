"""Which instruction set level the CPU kernels are built for (``sage_plugin/kernels/native.py``): the best level the
CPU's flags allow, built with that level's explicit compiler flags under a name that carries it, and nothing built off
x86-64.  ``torch.utils.cpp_extension.load`` is replaced by a recorder: no compiler runs here."""

from __future__ import annotations

import warnings

import pytest
import torch.utils.cpp_extension as ext

from sage_plugin.kernels import native

V3 = {"sse2", "avx", "avx2", "fma", "bmi2"}
V4 = V3 | {"avx512f", "avx512bw", "avx512dq", "avx512vl", "avx512cd"}
KERNELS = ("rows_linear", "paged_attention", "llama_decoder", "beam_level", "spec_cache")


@pytest.mark.parametrize(
    ("machine", "flags", "level"),
    [
        ("x86_64", V4, "avx512"),
        ("x86_64", V4 - {"avx512vl"}, "avx2"),  # AVX-512F without VL (Knights Landing): the 8-lane build
        ("x86_64", V3, "avx2"),
        ("AMD64", V3, "avx2"),
        ("x86_64", V3 - {"fma"}, "x86-64"),  # AVX2 without FMA: the baseline build
        ("x86_64", {"sse2"}, "x86-64"),
        ("aarch64", {"asimd", "sve"}, None),
        ("arm64", set(), None),
    ],
)
def test_the_level_is_the_best_one_the_cpu_flags_allow(machine, flags, level):
    assert native.isa_of(machine, frozenset(flags)) == level


@pytest.fixture
def recorded(monkeypatch, tmp_path):
    """Every ``load`` call's keyword arguments, with no library built or loaded (an empty :data:`KERNELS_DIR`), a
    fresh record of built kernels, and building at first use allowed."""
    calls: list[dict] = []
    monkeypatch.setattr(ext, "load", lambda **kw: calls.append(kw))
    monkeypatch.setattr(native, "KERNELS_DIR", tmp_path)
    monkeypatch.setattr(native, "_built", {})
    monkeypatch.setattr(native, "_warned_off_x86", [])
    monkeypatch.setattr(native, "_may_build", [True])
    return calls


def test_a_cpu_of_another_level_gets_its_own_build(monkeypatch, recorded):
    """Two CPUs sharing a cache directory: each level compiles with its own flags under its own name, so neither
    loads a build with instructions it lacks; no build targets ``-march=native``."""
    for level in ("avx512", "avx2", "x86-64"):
        monkeypatch.setattr(native, "host_isa", lambda level=level: level)
        native._built.clear()
        assert native.cpu_ops("rows_linear", "the torch path") is not None
    levels = ("avx512", "avx2", "x86-64")
    names = [call["name"] for call in recorded]
    assert [n.rsplit("_", 1)[0] for n in names] == [f"sage_plugin_rows_linear_{lv.replace('-', '_')}" for lv in levels]
    assert len(set(names)) == 3 and names == [native.library_name("rows_linear", lv) for lv in levels]
    for call, level in zip(recorded, levels):
        flags = [f for f in call["extra_cflags"] if f.startswith("-m") and not f.startswith("-mtune")]
        assert flags == list(native.ISA_LEVELS[level][1]) and "-march=native" not in call["extra_cflags"]
        assert call["build_directory"] == str(native.KERNELS_DIR / call["name"])
    assert [f for f in recorded[0]["extra_cflags"] if f.startswith("-mavx512")] and not [
        f for call in recorded[1:] for f in call["extra_cflags"] if "avx512" in f
    ]


def test_off_x86_nothing_is_compiled_and_one_warning_says_so(monkeypatch, recorded):
    monkeypatch.setattr(native, "host_isa", lambda: None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert all(native.cpu_ops(name, "the torch path") is None for name in KERNELS)
        assert native.cpu_ops("rows_linear", "the torch path") is None
    assert recorded == []
    assert [str(w.message) for w in caught] == [
        f"sage_plugin: the CPU kernels are x86-64 only ({native.platform.machine()} here): torch paths"
    ]


def test_this_machines_level_follows_its_cpu_flags():
    """On Linux the level comes from ``/proc/cpuinfo``'s flags; elsewhere from torch's CPU capability."""
    flags = native._cpu_flags()
    assert native.host_isa() == native.isa_of(native.platform.machine(), flags)
    if flags is not None and native.platform.machine() == "x86_64":
        assert ("avx2" in flags) == (native.host_isa() in ("avx2", "avx512"))


def test_a_library_is_named_after_its_sources_not_where_they_live(monkeypatch, tmp_path):
    """Two checkouts of the same sources share one build; an edited header is another library (never a rebuild of
    the one another process has loaded)."""
    import shutil

    copy = tmp_path / "csrc"
    shutil.copytree(native._CSRC, copy)
    name = native.library_name("rows_linear", "avx2")
    monkeypatch.setattr(native, "_CSRC", copy)
    assert native.library_name("rows_linear", "avx2") == name
    (copy / "simd.h").write_text((copy / "simd.h").read_text() + "\n// edited\n")
    assert native.library_name("rows_linear", "avx2") != name
    assert native.library_name("beam_level", "avx2") != native.library_name("rows_linear", "avx2")


def test_where_building_is_off_a_missing_library_is_the_torch_path_and_nothing_compiles(monkeypatch, recorded):
    """An SGLang server (its registration turns building off): a kernel ``sage setup`` did not build warns once,
    naming ``sage setup``, and its caller runs the torch path; no compiler is started."""
    monkeypatch.setattr(native, "host_isa", lambda: "avx2")
    native.build_at_first_use(False)
    with pytest.warns(UserWarning, match=r"rows_linear is not built here \(`sage setup` builds it\); the torch path"):
        assert native.cpu_ops("rows_linear", "the torch path") is None
    assert native.cpu_ops("rows_linear", "the torch path") is None and recorded == []
