"""The one reader of the project's YAML files (SAGE configs, TensorRT-LLM launch files): a mapping or one error.

Every reader of a YAML file calls :func:`read_yaml_mapping`, so an unreadable file, invalid YAML and a document that
is not a mapping fail the same way everywhere: one :class:`~.checks.ConfigError` that starts with what was being
read (``--sage-config my_sage.yaml: not valid YAML (...)``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from .checks import ConfigError

__all__ = ["read_yaml_mapping"]


def read_yaml_mapping(
    path: str | Path, where: str, section: str | None = None, what: str = "a mapping"
) -> dict[str, Any]:
    """The mapping in the YAML file ``path`` (an empty file: ``{}``); with ``section``, the mapping under that
    top-level key when there is one (``sage:`` in ``engine_configs/``), else the whole document.  Errors start with
    ``where`` (the flag and the path, by convention) and name ``what`` was expected."""
    try:
        data = yaml.safe_load(Path(path).read_text())
    except OSError as exc:
        raise ConfigError(f"{where}: cannot read the file ({exc.strerror or exc})") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{where}: not valid YAML ({exc})") from None
    data = {} if data is None else data
    if section is not None and isinstance(data, dict) and section in data:
        data = data[section]
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: expected {what}, got {type(data).__name__}")
    return dict(data)
