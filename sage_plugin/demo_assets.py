"""Where the CPU demo's weights and data are: the ``sage-plugin-demo`` distribution (``demo/`` in a checkout).

The plugin's own wheel carries no model weights and no prompt sets (a GPU server uses neither); the trained SmolLM2
drafts, the bundled prompt sets, images and clips ship as ``sage-plugin-demo``, which ``sage setup`` installs from
the checkout.  Every consumer finds them through this module:

* :func:`demo_root`: the installed demo's folder, or None;
* :func:`demo_path`: a path inside it, or :class:`DemoAssetsMissing` saying how to install it;
* :func:`demo_source`: the checkout's ``demo/`` folder ``sage setup`` installs from.

>>> demo_path("drafts", "smollm2-draft").name
'smollm2-draft'
"""

from __future__ import annotations

import importlib
from pathlib import Path

__all__ = ["DISTRIBUTION", "DemoAssetsMissing", "demo_path", "demo_root", "demo_source"]

#: the distribution holding the demo's weights and data, and its import name
DISTRIBUTION = "sage-plugin-demo"
PACKAGE = "sage_plugin_demo"
#: the folder holding this package: a checkout when the plugin is installed from one (``pip install -e .``)
CHECKOUT = Path(__file__).resolve().parents[1]


class DemoAssetsMissing(FileNotFoundError):
    """The demo distribution is not installed; the message names the command that installs it."""


def demo_root() -> Path | None:
    """The installed demo's folder (holding ``drafts/`` and ``data/``), None when it is not installed."""
    try:
        root = getattr(importlib.import_module(PACKAGE), "ROOT", None)
    except ImportError:
        return None
    return Path(root) if root is not None else None  # None: a folder of that name, not the distribution


def demo_source(cwd: Path | None = None) -> Path | None:
    """The checkout's ``demo/`` folder: beside this package when it is installed from a checkout (``pip install
    -e .``), else under ``cwd`` (default: the working directory); None when neither has one."""
    for base in (CHECKOUT, cwd or Path.cwd()):
        if (base / "demo" / "pyproject.toml").is_file() and (base / "demo" / PACKAGE).is_dir():
            return base / "demo"
    return None


def demo_path(*parts: str) -> Path:
    """``parts`` under the demo's folder (which need not exist there); :class:`DemoAssetsMissing` when the demo
    distribution is not installed."""
    root = demo_root()
    if root is None:
        raise DemoAssetsMissing(
            f"the CPU demo's weights and data ({DISTRIBUTION}) are not installed: run `sage setup` in a checkout of "
            "sage-plugin (it installs ./demo), or pip install ./demo"
        )
    return root.joinpath(*parts)
