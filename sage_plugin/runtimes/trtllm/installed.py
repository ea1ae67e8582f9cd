"""The one place the adapter imports TensorRT-LLM; the recorded contract is checked right there.

Every TensorRT-LLM class the adapter uses is fetched through :func:`require`, which imports ``tensorrt_llm`` and, the
first time each tier is asked for, runs :func:`.contract.check_installed_contract` on it.  So a TensorRT-LLM whose
interfaces differ from the recorded ones stops the adapter at import, with one message, before any model loads.
Nothing here runs when this module is imported: the rest of the package (and its tests) works without TensorRT-LLM.

Example (on a machine without TensorRT-LLM)::

    require(("drafter",))
    # TrtllmUnavailableError: TensorRT-LLM is not installed: No module named 'tensorrt_llm'. It needs ...
"""

from __future__ import annotations

import importlib
from typing import Any

from .contract import TrtllmUnavailableError, check_installed_contract

__all__ = [
    "drafter_base",
    "dynamic_tree_worker_class",
    "llm_class",
    "openai_server_class",
    "require",
    "spec_config_class",
    "update_llm_args_with_extra_dict",
]

_checked: set[str] = set()  # tiers whose contract passed in this process


def require(tiers: tuple[str, ...], *, skip_check: bool = False) -> Any:
    """Import ``tensorrt_llm`` and check the recorded contract of ``tiers`` once per process; return the module.

    Raises:
        TrtllmUnavailableError: TensorRT-LLM is missing or fails to import.
        ContractMismatchError: its interfaces differ from the recorded ones (unless ``skip_check``).
    """
    try:
        module = importlib.import_module("tensorrt_llm")
    except ImportError as exc:
        raise TrtllmUnavailableError(
            f"TensorRT-LLM is not installed: {exc}. It needs an NVIDIA GPU and NVIDIA's package index "
            "(pip install tensorrt-llm --extra-index-url https://pypi.nvidia.com, or the "
            "nvcr.io/nvidia/tensorrt-llm/release container); see docs/user-guide/trtllm.md"
        ) from None
    except (OSError, RuntimeError) as exc:  # CUDA libraries missing at import
        raise TrtllmUnavailableError(f"TensorRT-LLM is installed but does not import: {exc}") from None
    todo = tuple(t for t in tiers if t not in _checked)
    if todo:
        check_installed_contract(todo, skip=skip_check)
        _checked.update(todo)
    return module


def drafter_base(*, skip_check: bool = False) -> type:
    """``tensorrt_llm._torch.speculative.drafter.Drafter``."""
    require(("drafter",), skip_check=skip_check)
    from tensorrt_llm._torch.speculative.drafter import Drafter

    return Drafter


def dynamic_tree_worker_class(*, skip_check: bool = False) -> type:
    """``Eagle3OneModelDynamicTreeWorker`` (TensorRT-LLM main only)."""
    require(("tree",), skip_check=skip_check)
    from tensorrt_llm._torch.speculative.eagle3_dynamic_tree import Eagle3OneModelDynamicTreeWorker

    return Eagle3OneModelDynamicTreeWorker


def spec_config_class(decoding_type: str, *, skip_check: bool = False) -> type:
    """The ``tensorrt_llm.llmapi`` decoding config class of ``decoding_type`` (``User_Provided`` or ``Eagle3``)."""
    tier = "drafter" if decoding_type == "User_Provided" else "tree"
    require((tier,), skip_check=skip_check)
    from tensorrt_llm import llmapi

    name = {"User_Provided": "UserProvidedDecodingConfig", "Eagle3": "Eagle3DecodingConfig"}[decoding_type]
    return getattr(llmapi, name)


def llm_class(*, skip_check: bool = False) -> type:
    """``tensorrt_llm.LLM`` (the PyTorch-backend LLM)."""
    return require(("serve",), skip_check=skip_check).LLM


def openai_server_class(*, skip_check: bool = False) -> type:
    """``tensorrt_llm.serve.OpenAIServer``."""
    require(("serve",), skip_check=skip_check)
    from tensorrt_llm.serve import OpenAIServer

    return OpenAIServer


def update_llm_args_with_extra_dict(llm_args: dict, extra: dict, *, skip_check: bool = False) -> dict:
    """TensorRT-LLM's own merge of a ``--config`` YAML mapping into LLM kwargs (what ``trtllm-serve`` runs)."""
    require(("serve",), skip_check=skip_check)
    from tensorrt_llm.llmapi.llm_utils import update_llm_args_with_extra_dict as merge

    return merge(llm_args, extra)
