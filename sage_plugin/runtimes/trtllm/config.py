"""The ``sage trtllm-serve`` launch file and TensorRT-LLM's ``--config`` YAML, checked before anything starts.

A live drafter object cannot be named in YAML (``UserProvidedDecodingConfig.drafter`` is a plain object field and
TensorRT-LLM has no import-path form for it), so ``sage trtllm-serve --config FILE`` reads a launch file, builds
the drafter (or installs the dynamic-tree policy) and the ``LLM``, and starts TensorRT-LLM's own OpenAI server
(:mod:`.serve`).  The launch file (``engine_configs/trtllm/``)::

    tier: drafter                 # drafter (TensorRT-LLM 1.2.x) | dynamic_tree (main, EAGLE-3)
    model: smollm2                # target: HF dir or hub id; smollm2 = the bundled SmolLM2 target
    trtllm_config: other.yaml     # optional: a trtllm-serve --config YAML (LLM(...) options), relative to this file
    llm: {max_batch_size: 8}      # LLM(...) options, over trtllm_config's
    drafter: {model: bundled, max_draft_len: 6, device: cuda, dtype: bfloat16}   # drafter tier only
    sage: {d_min: 2, d_max: 4, d_cap: 6}   # SageConfig fields, checked against the tier's support table
    serve: {host: localhost, port: 8000}

A bad value raises one :class:`~sage_plugin.config.ConfigError` naming the field::

    >>> parse_launch({"tier": "drafter", "model": "m", "drafter": {"max_draft_len": 0}})
    Traceback (most recent call last):
    ...
    sage_plugin.config.ConfigError: drafter.max_draft_len must be an integer in [1, 64], got 0
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from ...config import ConfigError, SageConfig, from_mapping
from ...config.files import read_yaml_mapping
from .drafter import DEFAULT_SLOTS, DrafterSpec
from .support import TRTLLM_SUPPORT, TRTLLM_TREE_SUPPORT

__all__ = [
    "DraftOptions",
    "TIERS",
    "TrtllmLaunch",
    "check_llm_options",
    "check_sage_config",
    "check_speculative_config",
    "drafter_spec",
    "load_launch",
    "parse_launch",
    "user_provided_kwargs",
]

logger = logging.getLogger(__name__)

TIERS = {"drafter": TRTLLM_SUPPORT, "dynamic_tree": TRTLLM_TREE_SUPPORT}
_TOP = ("tier", "model", "trtllm_config", "llm", "drafter", "sage", "serve")
_DRAFTER = ("model", "max_draft_len", "device", "dtype", "max_concurrency", "draft_logits", "num_slots")
_SERVE = ("host", "port", "served_model_name")
_DTYPES = ("float32", "float16", "bfloat16")
_POSITIVE = ("max_batch_size", "max_num_tokens", "max_seq_len", "max_beam_width", "tensor_parallel_size")


@dataclass(frozen=True)
class DraftOptions:
    """The drafter tier's draft model: ``model`` (``bundled`` = the shipped SmolLM2 draft), ``max_draft_len`` (K),
    ``device``, ``dtype``, ``max_concurrency``, ``draft_logits``, ``num_slots``."""

    model: str
    max_draft_len: int
    device: str
    dtype: str
    max_concurrency: int | None
    draft_logits: bool
    num_slots: int


@dataclass(frozen=True)
class TrtllmLaunch:
    """A checked launch: ``tier``, target ``model``, the ``sage`` config, ``llm`` options (``LLM(...)`` keywords; the
    dynamic-tree tier's ``speculative_config`` among them), ``draft`` (drafter tier), and the server address."""

    tier: str
    model: str
    sage: SageConfig
    llm: Mapping[str, Any]
    draft: DraftOptions | None
    host: str
    port: int
    served_model_name: str


def _mapping(where: str, value: Any) -> dict:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ConfigError(f"{where} must be a mapping, got {type(value).__name__}")
    return dict(value)


def _known(where: str, data: Mapping, keys: tuple[str, ...]) -> None:
    unknown = sorted(str(k) for k in data if k not in keys)
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {', '.join(unknown)} (known: {', '.join(keys)})")


def _int(where: str, value: Any, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise ConfigError(f"{where} must be an integer in [{lo}, {hi}], got {value!r}")
    return value


def _str(where: str, value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"{where} must be a non-empty string, got {value!r}")
    return value


def _bool(where: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"{where} must be true or false, got {value!r}")
    return value


def check_sage_config(cfg: SageConfig, tier: str) -> None:
    """Refuse what the tier does not honour (``TRTLLM_SUPPORT`` / ``TRTLLM_TREE_SUPPORT``); log defaults it does not
    apply."""
    support = TIERS[tier]
    support.check(cfg)
    if cfg.algorithm.node_budget == "auto":
        logger.info("node_budget auto acts as fixed on %s (a fixed number of tokens is verified)", support.runtime)
    if cfg.algorithm.first_round_static:
        logger.info("first_round_static is not applied on %s", support.runtime)


def check_speculative_config(block: Any, where: str = "speculative_config") -> dict:
    """The EAGLE-3 dynamic-tree block of a ``--config`` YAML (what the SAGE tree policy needs), checked.

    Requires ``decoding_type: Eagle3``, ``use_dynamic_tree: true``, ``dynamic_tree_max_topK >= 2`` (the worker is
    chosen only then), ``max_draft_len >= 1``, ``max_draft_len <= max_total_draft_tokens <= topK * max_draft_len``
    (default ``topK * max_draft_len``) and a ``speculative_model`` (or ``speculative_model_dir``).  Other keys pass
    through to TensorRT-LLM, which validates them when the ``LLM`` is built.
    """
    spec = _mapping(where, block)
    if spec.get("decoding_type") != "Eagle3":
        raise ConfigError(
            f"{where}.decoding_type: the SAGE tree tier runs on Eagle3, got {spec.get('decoding_type')!r}"
        )
    if spec.get("use_dynamic_tree") is not True:
        raise ConfigError(
            f"{where}.use_dynamic_tree must be true (the dynamic-tree worker), got {spec.get('use_dynamic_tree')!r}"
        )
    if spec.get("eagle3_one_model", True) is not True:
        raise ConfigError(f"{where}.eagle3_one_model must be true (the dynamic tree is a one-model worker)")
    depth = _int(f"{where}.max_draft_len", spec.get("max_draft_len"), 1, 64)
    topk = _int(f"{where}.dynamic_tree_max_topK", spec.get("dynamic_tree_max_topK"), 2, 64)
    spec.setdefault("max_total_draft_tokens", topk * depth)
    _int(f"{where}.max_total_draft_tokens", spec["max_total_draft_tokens"], depth, topk * depth)
    model = spec.get("speculative_model", spec.get("speculative_model_dir"))
    _str(f"{where}.speculative_model", model)
    return spec


def check_llm_options(options: Any, tier: str, where: str = "llm") -> dict:
    """``LLM(...)`` options of a launch (or a whole ``trtllm-serve --config`` YAML), checked for the tier.

    The options the adapter depends on are checked here; the rest pass through to TensorRT-LLM, which validates them
    when the ``LLM`` is built (before the engine starts).
    """
    opts = _mapping(where, options)
    for key in _POSITIVE:
        if key in opts:
            _int(f"{where}.{key}", opts[key], 1, 1 << 30)
    for key in ("kv_cache_config", "cuda_graph_config"):
        if opts.get(key) is not None:
            _mapping(f"{where}.{key}", opts[key])
    if tier == "drafter":
        if "speculative_config" in opts:
            raise ConfigError(
                f"{where}.speculative_config: the drafter tier builds it (UserProvidedDecodingConfig with the SAGE "
                "drafter); set drafter.max_draft_len instead"
            )
        if _bool(f"{where}.disable_overlap_scheduler", opts.setdefault("disable_overlap_scheduler", True)) is not True:
            raise ConfigError(
                f"{where}.disable_overlap_scheduler must be true: TensorRT-LLM's user-provided drafter does not "
                "support the overlap scheduler"
            )
    else:
        opts["speculative_config"] = check_speculative_config(
            opts.get("speculative_config"), f"{where}.speculative_config"
        )
    return opts


def _draft_options(data: Any, cfg: SageConfig, llm: Mapping[str, Any]) -> DraftOptions:
    d = _mapping("drafter", data)
    _known("drafter", d, _DRAFTER)
    longest = min(cfg.algorithm.d_cap, cfg.algorithm.n_max)  # the longest chain SAGE can plan
    k = _int("drafter.max_draft_len", d.get("max_draft_len", longest), 1, 64)
    if k < longest:
        raise ConfigError(
            f"drafter.max_draft_len must be >= min(sage.d_cap, sage.n_max) = {longest} (the longest chain SAGE can "
            f"plan), got {k}"
        )
    dtype = d.get("dtype", "float32")
    if dtype not in _DTYPES:
        raise ConfigError(f"drafter.dtype must be one of {', '.join(_DTYPES)}; got {dtype!r}")
    concurrency = d.get("max_concurrency")
    if concurrency is not None:
        _int("drafter.max_concurrency", concurrency, 1, 1 << 20)
    batch = llm.get("max_batch_size", 1)
    slots = _int("drafter.num_slots", d.get("num_slots", llm.get("max_batch_size", DEFAULT_SLOTS)), batch, 1 << 20)
    return DraftOptions(
        model=_str("drafter.model", d.get("model", "bundled")),
        max_draft_len=k,
        device=_str("drafter.device", d.get("device", "cuda")),
        dtype=dtype,
        max_concurrency=concurrency,
        draft_logits=_bool("drafter.draft_logits", d.get("draft_logits", True)),
        num_slots=slots,  # py_seq_slot < max_batch_size
    )


def parse_launch(data: Any, base_dir: Path | None = None) -> TrtllmLaunch:
    """Check a launch mapping (``trtllm_config`` paths are relative to ``base_dir``)."""
    top = _mapping("launch file", data)
    _known("launch file", top, _TOP)
    tier = top.get("tier", "drafter")
    if tier not in TIERS:
        raise ConfigError(f"tier must be one of {', '.join(TIERS)}; got {tier!r}")
    cfg = from_mapping(_mapping("sage", top.get("sage")))
    check_sage_config(cfg, tier)
    options: dict[str, Any] = {}
    if top.get("trtllm_config") is not None:
        path = Path(_str("trtllm_config", top["trtllm_config"])).expanduser()
        path = path if path.is_absolute() or base_dir is None else base_dir / path
        options.update(read_yaml(path, "trtllm_config"))
    options.update(_mapping("llm", top.get("llm")))
    llm = check_llm_options(options, tier)
    if tier == "drafter":
        draft = _draft_options(top.get("drafter"), cfg, llm)
    elif top.get("drafter") is not None:
        raise ConfigError("drafter: only the drafter tier has a draft model (the tree tier's is the EAGLE-3 head)")
    else:
        draft = None
    serve = _mapping("serve", top.get("serve"))
    _known("serve", serve, _SERVE)
    model = _str("model", top.get("model"))
    return TrtllmLaunch(
        tier=tier,
        model=model,
        sage=cfg,
        llm=llm,
        draft=draft,
        host=_str("serve.host", serve.get("host", "localhost")),
        port=_int("serve.port", serve.get("port", 8000), 1, 65535),
        served_model_name=_str("serve.served_model_name", serve.get("served_model_name", model)),
    )


def read_yaml(path: Path, where: str) -> dict:
    """A YAML mapping, or one ConfigError naming ``where`` and the path (:func:`~sage_plugin.config.files.
    read_yaml_mapping`)."""
    return read_yaml_mapping(path, f"{where} {path}")


def load_launch(path: str | Path, overrides: Mapping[str, Any] | None = None) -> TrtllmLaunch:
    """Read and check a launch file; ``overrides`` replace top-level keys (``model``) or ``serve`` keys."""
    data = read_yaml(Path(path), "--config")
    for key, value in (overrides or {}).items():
        if value is None:
            continue
        if key in _SERVE:
            data["serve"] = {**_mapping("serve", data.get("serve")), key: value}
        else:
            data[key] = value
    return parse_launch(data, Path(path).resolve().parent)


def drafter_spec(launch: TrtllmLaunch, draft_model: str | None = None) -> DrafterSpec:
    """The :class:`~.drafter.DrafterSpec` of a drafter-tier launch (``draft_model``: the resolved path)."""
    if launch.draft is None:
        raise ConfigError("tier: only the drafter tier builds a drafter")
    d = launch.draft
    return DrafterSpec(
        sage=launch.sage.to_dict(), draft_model=draft_model or d.model, max_draft_len=d.max_draft_len,
        device=d.device, dtype=d.dtype, num_slots=d.num_slots, max_concurrency=d.max_concurrency,
        draft_logits=d.draft_logits,
    )  # fmt: skip


def user_provided_kwargs(launch: TrtllmLaunch, drafter: Any) -> dict[str, Any]:
    """``UserProvidedDecodingConfig(**kwargs)`` for the drafter tier."""
    if launch.draft is None:
        raise ConfigError("tier: only the drafter tier uses UserProvidedDecodingConfig")
    kwargs: dict[str, Any] = {"max_draft_len": launch.draft.max_draft_len, "drafter": drafter, "resource_manager": None}
    if launch.draft.max_concurrency is not None:
        kwargs["max_concurrency"] = launch.draft.max_concurrency
    return kwargs
