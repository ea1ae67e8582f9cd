"""The TensorRT-LLM interfaces the adapter builds on, recorded as data, and the check against an installed copy.

TensorRT-LLM cannot be installed on the machines this project is developed on (PyPI's ``tensorrt-llm`` is a stub
pointing at NVIDIA's index, and it needs CUDA), so the adapter is written against its public Python interfaces as
read from its source at the versions in :data:`PINNED`.  Everything the adapter calls, subclasses, reads or writes is
listed here (what the drafter reads and writes on the executor's objects, and the step order it was written against,
in :mod:`.executor_contract`); ``tests/unit/test_trtllm_contract.py`` checks the adapter against these records, and
:func:`check_installed_contract` (run by :mod:`.installed` right where ``tensorrt_llm`` is imported) compares an
installed TensorRT-LLM with them and stops with one message naming the installed version, the item that differs and
the pinned versions.  ``docs/design/trtllm.md`` lists what each record is for.

Signatures are compared as text without annotations (:func:`signature_text`)::

    >>> def prepare_draft_tokens(self, scheduled_requests: "ScheduledRequests", resource_manager=None) -> None: ...
    >>> signature_text(prepare_draft_tokens)
    '(self, scheduled_requests, resource_manager=None)'
"""

from __future__ import annotations

import importlib
import inspect
import logging
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from ...compat import installed_version
from ...config import ConfigError
from .executor_contract import CALL_ORDER, REQUEST_FIELDS_READ, REQUEST_FIELDS_WRITTEN, TREE_WORKER_READ

__all__ = [
    "CALL_ORDER",
    "CONFIG_FIELDS",
    "ContractMismatchError",
    "DRAFTER",
    "DYNAMIC_TREE_COMMIT",
    "FieldsItem",
    "PINNED",
    "Pinned",
    "REQUEST_FIELDS_READ",
    "REQUEST_FIELDS_WRITTEN",
    "SignatureItem",
    "TREE_WORKER",
    "TREE_WORKER_READ",
    "TrtllmUnavailableError",
    "check_class_against_contract",
    "check_installed_contract",
    "items_for",
    "signature_text",
]

logger = logging.getLogger(__name__)


class TrtllmUnavailableError(ConfigError):
    """The launch cannot start with the TensorRT-LLM at hand (not installed, or not matching :data:`PINNED`).

    A :class:`~sage_plugin.config.ConfigError` so that ``sage trtllm-serve`` reports it like a bad option: one
    message, before any model loads.
    """


class ContractMismatchError(TrtllmUnavailableError):
    """The installed TensorRT-LLM differs from the recorded interfaces (the message names the item)."""


@dataclass(frozen=True)
class Pinned:
    """One TensorRT-LLM version the interfaces were read at.

    Attributes:
        name: short name used in :class:`SignatureItem` (``1.2-early``, ``1.2-late``, ``main``).
        version: the release line or version string.
        read_at: file -> where its text came from: ``commit <sha>`` or ``content <id>`` (the id of one exact file
            text in the source index, where no commit was named).
    """

    name: str
    version: str
    read_at: Mapping[str, str]


#: The versions read (``docs/design/trtllm.md``, "Versions read").
PINNED: tuple[Pinned, ...] = (
    Pinned(
        "1.2-early",
        "1.2.0rc2 (tensorrt_llm/version.py @ b35ac1b64368513d215c57d2ed01d62d910df8da)",
        {
            "_torch/speculative/drafter.py": "commit 83ab45a50d169b08e29e9bf2f46fc66b3838cc37",
            "llmapi/llm_args.py": "content 1090804222 (= the 1.2.0rc2.post2 API docs)",
            "_torch/speculative/interface.py": "commit b35ac1b64368513d215c57d2ed01d62d910df8da",
        },
    ),
    Pinned(
        "1.2-late",
        "1.2.x after PR #8194 (dynamic draft length stage 1), before PR #10860",
        {
            "_torch/speculative/drafter.py": "content 4409156300",
            "_torch/pyexecutor/py_executor.py": "content 3542389387",
            "_torch/pyexecutor/sampler.py": "content 440197692",
            "llmapi/llm_args.py": "content 7019226376",
        },
    ),
    Pinned(
        "main",
        "main, 1.3 era (2026)",
        {
            "_torch/pyexecutor/py_executor.py": "commit 0004396720054fd8e205cbf616f21f0b57c6b412",
            "llmapi/llm_args.py": "commit 0004396720054fd8e205cbf616f21f0b57c6b412",
            "_torch/pyexecutor/llm_request.py": "commit 002f3cc3d0554c4ebd530d1354f96e89666d93b8",
            "_torch/pyexecutor/scheduler/scheduler.py": "commit 002f3cc3d0554c4ebd530d1354f96e89666d93b8",
            "_torch/speculative/eagle3_dynamic_tree.py": "commit 057c8a65145bb53caf3939ba4fbcabbad46ea3dc",
            "_torch/speculative/drafter.py": "content 52287007051",
            "serve/openai_server.py": "commit 00057725d9a6591f033e44f31c219e2426827bb7",
            "commands/serve.py": "commit 00209af149e7774406881a37283dce303571eb11",
        },
    ),
    Pinned(
        "serve-older",
        "an earlier openai_server.py (release not identified; LLM parameter named llm)",
        {"serve/openai_server.py": "content 456200087"},
    ),
)

#: The commit of ``eagle3_dynamic_tree.py`` the dynamic-tree policy (:mod:`.dynamic_tree`) is written against.
DYNAMIC_TREE_COMMIT = "057c8a65145bb53caf3939ba4fbcabbad46ea3dc"

DRAFTER = "tensorrt_llm._torch.speculative.drafter:Drafter"
TREE_WORKER = "tensorrt_llm._torch.speculative.eagle3_dynamic_tree:Eagle3OneModelDynamicTreeWorker"
_LATE_INIT = "(self, max_draft_len=None, max_total_draft_tokens=None, max_concurrency=None, draft_len_schedule=None)"


@dataclass(frozen=True)
class SignatureItem:
    """A callable the adapter calls, overrides or patches.

    Attributes:
        symbol: ``module:Qualified.name``.
        tier: ``drafter``, ``tree`` or ``serve`` (which part of the adapter needs it).
        role: what the adapter does with it.
        signatures: pinned version name -> signature text (:func:`signature_text`), for ``exact`` items.
        fillable: for ``fillable`` items (called with keywords chosen by ``inspect.signature``): the parameter names
            the adapter can fill; an installed signature matches when every required parameter is one of them.
    """

    symbol: str
    tier: str
    role: str
    signatures: Mapping[str, str]
    fillable: frozenset[str] | None = None


@dataclass(frozen=True)
class FieldsItem:
    """A config class whose fields the adapter sets: the fields must exist, ``decoding_type`` must equal ``literal``."""

    symbol: str
    tier: str
    fields: frozenset[str]
    literal: str | None = None


SIGNATURES: tuple[SignatureItem, ...] = (
    SignatureItem(
        f"{DRAFTER}.__init__",
        "drafter",
        "called by SageTrtllmDrafter.__init__ with the keywords it accepts",
        {"1.2-early": "(self, max_concurrency=None)", "1.2-late": _LATE_INIT, "main": _LATE_INIT},
    ),
    SignatureItem(
        f"{DRAFTER}.prepare_draft_tokens",
        "drafter",
        "overridden: SAGE's chain per generation request",
        {v: "(self, scheduled_requests, resource_manager=None)" for v in ("1.2-early", "1.2-late", "main")},
    ),
    SignatureItem(
        f"{DRAFTER}.should_use_spec_decode",
        "drafter",
        "inherited (final): the executor's max_concurrency gate",
        {
            v: "(self, requests, max_batch_size, max_num_tokens, max_total_draft_tokens)"
            for v in ("1.2-early", "1.2-late", "main")
        },
    ),
    SignatureItem(
        f"{DRAFTER}.pad_draft_tokens_for_cuda_graph",
        "drafter",
        "inherited (final): zero-pads py_draft_tokens to max_draft_len after prepare_draft_tokens",
        {
            "1.2-early": "(self, scheduled_requests)",
            "1.2-late": "(self, scheduled_requests)",
            "main": "(self, scheduled_requests, resource_manager=None)",
        },
    ),
    SignatureItem(
        f"{TREE_WORKER}.sample",
        "tree",
        "left alone; its top-K probabilities reach update_draft_tokens_and_scores",
        {"main": "(self, logits, max_top_k)"},
    ),
    SignatureItem(
        f"{TREE_WORKER}.update_draft_tokens_and_scores",
        "tree",
        "wrapped: at layer 0 SAGE observes the last verify and plans alpha, D, W per slot",
        {
            "main": "(self, cur_draft_idx, new_draft_tokens, new_draft_scores, previous_draft_scores, batch_size, "
            "attn_metadata=None)"
        },
    ),
    SignatureItem(
        f"{TREE_WORKER}.resampling_final_draft_tokens",
        "tree",
        "replaced: SAGE's nodes are boosted so the worker's own top-M resampling picks them",
        {"main": "(self, batch_size)"},
    ),
    SignatureItem(
        "tensorrt_llm.llmapi.llm_utils:update_llm_args_with_extra_dict",
        "serve",
        "merges the --config YAML into the LLM kwargs, as trtllm-serve does",
        {v: "(llm_args, llm_args_dict, extra_llm_api_options=None)" for v in ("1.2-late", "main")},
        fillable=frozenset({"llm_args", "llm_args_dict"}),
    ),
    SignatureItem(
        "tensorrt_llm.serve:OpenAIServer.__init__",
        "serve",
        "TensorRT-LLM's OpenAI server around the LLM (keywords chosen by inspect.signature)",
        {
            "main": "(self, generator, model, tool_parser, server_role, metadata_server_cfg, disagg_cluster_config=None, "
            "multimodal_server_config=None, chat_template=None)",
            "serve-older": "(self, llm, model, server_role, metadata_server_cfg, disagg_cluster_config=None)",
        },
        fillable=frozenset({"self", "llm", "generator", "model", "tool_parser", "server_role", "metadata_server_cfg"}),
    ),
)

FIELDS: tuple[FieldsItem, ...] = (
    FieldsItem(
        "tensorrt_llm.llmapi:UserProvidedDecodingConfig",
        "drafter",
        frozenset({"max_draft_len", "drafter", "resource_manager", "max_concurrency"}),
        "User_Provided",
    ),
    FieldsItem(
        "tensorrt_llm.llmapi:Eagle3DecodingConfig",
        "tree",
        frozenset(
            "max_draft_len max_total_draft_tokens speculative_model use_dynamic_tree dynamic_tree_max_topK".split()
        ),
        "Eagle3",
    ),
    FieldsItem(
        "tensorrt_llm.llmapi.llm_args:TorchLlmArgs",
        "serve",
        frozenset({"model", "speculative_config", "disable_overlap_scheduler", "max_batch_size", "max_seq_len"}),
    ),
)

#: Config fields the adapter and the engine configs set (``docs/design/trtllm.md``, "Recorded interfaces").
CONFIG_FIELDS: Mapping[str, frozenset[str]] = {
    "UserProvidedDecodingConfig": FIELDS[0].fields,
    "Eagle3DecodingConfig": FIELDS[1].fields,
    "TorchLlmArgs": FIELDS[2].fields | {"max_num_tokens", "kv_cache_config", "cuda_graph_config", "dtype"},
}


def signature_text(fn: Callable[..., Any]) -> str:
    """``inspect.signature`` of ``fn`` as text, without annotations (defaults kept)."""
    sig = inspect.signature(fn)
    params = [p.replace(annotation=inspect.Parameter.empty) for p in sig.parameters.values()]
    return str(sig.replace(parameters=params, return_annotation=inspect.Signature.empty))


def items_for(tiers: tuple[str, ...]) -> tuple[tuple[SignatureItem, ...], tuple[FieldsItem, ...]]:
    """The recorded items of these tiers (``drafter``, ``tree``, ``serve``)."""
    return tuple(i for i in SIGNATURES if i.tier in tiers), tuple(i for i in FIELDS if i.tier in tiers)


def _load(symbol: str) -> Any:
    """The object named ``module:Qualified.name`` (imports the module)."""
    module, _, qualname = symbol.partition(":")
    obj: Any = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def _pinned_summary() -> str:
    return "; ".join(f"{p.name} = {p.version}" for p in PINNED)


def _installed() -> str:
    try:
        found = getattr(importlib.import_module("tensorrt_llm"), "__version__", None)
    except ImportError:
        found = None
    return str(found or installed_version("tensorrt_llm") or installed_version("tensorrt-llm") or "unknown version")


def _fields_of(cls: Any) -> set[str]:
    """Field names of a pydantic v2 / v1 model class (or plain annotations)."""
    for attr in ("model_fields", "__fields__"):
        fields = getattr(cls, attr, None)
        if isinstance(fields, Mapping):
            return set(fields)
    return set(getattr(cls, "__annotations__", {}))


def _literal_of(cls: Any) -> Any:
    """``decoding_type``: a ClassVar string (1.2.0rc2) or a pydantic field default (later)."""
    fields = getattr(cls, "model_fields", None)
    if isinstance(fields, Mapping) and "decoding_type" in fields:
        return getattr(fields["decoding_type"], "default", None)
    return getattr(cls, "decoding_type", None)


def _signature_problem(item: SignatureItem, obj: Any) -> str | None:
    text = signature_text(obj)
    if item.fillable is not None:
        params = inspect.signature(obj).parameters.values()
        empty, varargs = inspect.Parameter.empty, (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
        unknown = [
            p.name for p in params if p.default is empty and p.kind not in varargs and p.name not in item.fillable
        ]
        return None if not unknown else f"{text} needs {unknown}, which the adapter cannot fill"
    if text in item.signatures.values():
        return None
    recorded = "; ".join(f"{v}: {s}" for v, s in item.signatures.items())
    return f"installed {text}, recorded {recorded}"


def _fields_problem(item: FieldsItem, cls: Any) -> str | None:
    missing = sorted(item.fields - _fields_of(cls))
    if missing:
        return f"missing fields {missing}"
    if item.literal is not None and _literal_of(cls) != item.literal:
        return f"decoding_type is {_literal_of(cls)!r}, recorded {item.literal!r}"
    return None


def check_installed_contract(
    tiers: tuple[str, ...] = ("drafter", "serve"),
    *,
    load: Callable[[str], Any] = _load,
    version: str | None = None,
    skip: bool = False,
    items: list[SignatureItem] | None = None,
) -> None:
    """Compare the installed TensorRT-LLM with the recorded interfaces of ``tiers``; raise on the first difference.

    Args:
        tiers: ``drafter`` (the UserProvided drafter), ``tree`` (the dynamic-tree policy), ``serve`` (the launcher).
        load: resolves ``module:Qualified.name`` (default: import it).
        version: the installed version shown in the message (default: ``tensorrt_llm.__version__``).
        skip: log a warning instead of raising (``sage trtllm-serve --skip-contract-check``).
        items: check these signature items instead of the tiers' (:func:`check_class_against_contract`).

    Raises:
        ContractMismatchError: naming the installed version, the item, what differs and the pinned versions.
    """
    sigs, fields = items_for(tiers) if items is None else (tuple(items), ())
    checks = [(i.symbol, i, _signature_problem) for i in sigs] + [(i.symbol, i, _fields_problem) for i in fields]
    for symbol, item, problem_of in checks:
        try:
            problem = problem_of(item, load(symbol))
        except (ImportError, AttributeError) as exc:
            problem = f"not found ({exc.__class__.__name__}: {exc})"
        if problem is None:
            continue
        message = (
            f"TensorRT-LLM {version or _installed()} does not match the interface sage-plugin's TensorRT-LLM adapter "
            f"was written against: {symbol}: {problem}. Pinned versions: {_pinned_summary()} (docs/design/trtllm.md)."
        )
        if skip:
            logger.warning("%s Going on (--skip-contract-check).", message)
            continue
        raise ContractMismatchError(message)


def check_class_against_contract(cls: type, symbol: str, *, version: str | None = None) -> None:
    """Check the methods of ``cls`` (the installed class, or a test double) recorded under ``symbol``.

    Example: ``check_class_against_contract(worker_cls, TREE_WORKER)`` checks ``sample``,
    ``update_draft_tokens_and_scores`` and ``resampling_final_draft_tokens`` of ``worker_cls``.

    Raises:
        ContractMismatchError: as :func:`check_installed_contract`.
    """
    prefix = symbol + "."
    items = [i for i in SIGNATURES if i.symbol.startswith(prefix)]
    if not items:
        raise ValueError(f"nothing recorded under {symbol}")
    check_installed_contract(
        (), load=lambda s: getattr(cls, s[len(prefix) :]), version=version or cls.__module__, items=items
    )
