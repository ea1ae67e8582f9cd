"""The SGLang pin: one version in ``sage_plugin/compat.py``, the same in the ``[sglang]`` extra and installed."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytest.importorskip("sglang")

from sage_plugin.compat import (  # noqa: E402
    SGLANG_VERSION,
    RuntimeVersionError,
    check_runtime_version,
    installed_version,
)

PYPROJECT = Path(__file__).resolve().parents[3] / "pyproject.toml"


def test_extra_pins_the_same_version():
    pins = re.findall(r'^sglang = \["sglang==([^"]+)"\]', PYPROJECT.read_text(), flags=re.M)
    assert pins == [SGLANG_VERSION]


def test_installed_sglang_is_the_pinned_one():
    assert installed_version("sglang") == SGLANG_VERSION


def test_mismatch_message_names_both_versions_and_the_override():
    with pytest.raises(RuntimeVersionError) as exc:
        check_runtime_version("sglang", "0.5.23", installed="0.6.0")
    message = str(exc.value)
    assert "sglang==0.5.23" in message and "sglang 0.6.0 is installed" in message
    assert "SAGE_SKIP_VERSION_CHECK=1" in message


def test_missing_runtime():
    with pytest.raises(RuntimeVersionError, match="but no no-such-dist distribution is installed"):
        check_runtime_version("no-such-dist", "1.0")


def test_skip_only_warns(caplog):
    with caplog.at_level("WARNING", logger="sage_plugin"):
        check_runtime_version("sglang", "0.5.23", installed="0.6.0", skip=True)
    assert "SAGE_SKIP_VERSION_CHECK=1" in caplog.text
