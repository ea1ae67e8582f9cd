"""``sage trtllm-serve``: TensorRT-LLM's own OpenAI server, with SAGE as its drafter or dynamic-tree policy.

What ``trtllm-serve --config`` does, plus the part YAML cannot express (``docs/user-guide/trtllm.md``, "sage trtllm-serve"):

1. the launch file is checked (:func:`.config.load_launch`: every bad value stops here, naming the field);
2. TensorRT-LLM is imported and its interfaces are compared with the recorded contract (:mod:`.installed`);
3. drafter tier: a ``SageTrtllmDrafter`` (:func:`.drafter.build_trtllm_drafter`) goes into
   ``UserProvidedDecodingConfig(max_draft_len=K, drafter=..., resource_manager=None)``, with
   ``disable_overlap_scheduler=True``; dynamic-tree tier: the SAGE node policy is patched onto the EAGLE-3
   dynamic-tree worker (:func:`.dynamic_tree.install_dynamic_tree_policy`) and ``speculative_config`` becomes an
   ``Eagle3DecodingConfig``;
4. the other options go through TensorRT-LLM's ``update_llm_args_with_extra_dict`` (as in ``trtllm-serve``), the
   ``LLM`` is built, and ``OpenAIServer`` (keywords chosen by its signature) serves it on ``host:port``.

Without TensorRT-LLM, step 2 stops with ``TensorRT-LLM is not installed``; ``--check`` runs step 1 only and prints
:func:`describe_launch`.
"""

from __future__ import annotations

import asyncio
import inspect
from pathlib import Path
from typing import Any

from ...config import ConfigError
from ...models import bundled_draft_dir, ensure_smollm2
from . import installed
from .config import TrtllmLaunch, drafter_spec, load_launch, user_provided_kwargs
from .drafter import build_trtllm_drafter
from .dynamic_tree import install_dynamic_tree_policy

__all__ = ["build_llm", "describe_launch", "load_cli_launch", "openai_server_kwargs", "resolve_model", "serve"]


def load_cli_launch(
    path: str | Path, *, model: str | None = None, host: str | None = None, port: int | None = None
) -> TrtllmLaunch:
    """The launch file with the command line's ``--model``, ``--host``, ``--port`` over it."""
    return load_launch(path, {"model": model, "host": host, "port": port})


def resolve_model(name: str, *, draft: bool = False) -> str:
    """A model name of the launch file as TensorRT-LLM / transformers take it (``smollm2``, ``bundled``, ``~``)."""
    if not draft and name == "smollm2":
        return str(ensure_smollm2())
    if draft and name == "bundled":
        found = bundled_draft_dir()
        if found is None:
            raise ConfigError("drafter.model: no bundled draft in this installation; name a draft model")
        return str(found)
    return str(Path(name).expanduser()) if name.startswith("~") else name


def describe_launch(launch: TrtllmLaunch) -> str:
    """What the launch would run, one item per line (``sage trtllm-serve --check``)."""
    defaults = type(launch.sage)().to_dict()
    changed = {k: v for k, v in launch.sage.to_dict().items() if v != defaults[k]}
    lines = [f"tier: {launch.tier}", f"target: {launch.model}", f"sage (non-default): {changed}"]
    llm = dict(launch.llm)
    if launch.draft is not None:
        d = launch.draft
        lines.append(f"draft: {d.model} on {d.device} ({d.dtype}), max_draft_len {d.max_draft_len}")
        llm["speculative_config"] = f"UserProvidedDecodingConfig(max_draft_len={d.max_draft_len}, drafter=SAGE)"
    lines.append(f"LLM options: {llm}")
    lines.append(f"serve: http://{launch.host}:{launch.port} as {launch.served_model_name}")
    return "\n".join(lines)


def build_llm(launch: TrtllmLaunch, *, skip_check: bool = False) -> Any:
    """The TensorRT-LLM ``LLM`` of a launch, with SAGE installed (steps 2-4 of the module docstring)."""
    tier = "drafter" if launch.tier == "drafter" else "tree"
    installed.require((tier, "serve"), skip_check=skip_check)
    options = dict(launch.llm)
    spec_block = options.pop("speculative_config", None)
    kwargs = installed.update_llm_args_with_extra_dict({"model": resolve_model(launch.model)}, options)
    if launch.draft is not None:
        spec = drafter_spec(launch, resolve_model(launch.draft.model, draft=True))
        drafter = build_trtllm_drafter(spec, installed.drafter_base(skip_check=skip_check))
        config_cls = installed.spec_config_class("User_Provided")
        kwargs["speculative_config"] = config_cls(**user_provided_kwargs(launch, drafter))
        kwargs["disable_overlap_scheduler"] = True
    else:
        install_dynamic_tree_policy(launch.sage, skip_check=skip_check)
        block = {k: v for k, v in spec_block.items() if k != "decoding_type"}
        kwargs["speculative_config"] = installed.spec_config_class("Eagle3")(**block)
    return installed.llm_class()(**kwargs)


def openai_server_kwargs(server_cls: type, llm: Any, model: str) -> dict[str, Any]:
    """Keywords for ``OpenAIServer.__init__``: the LLM under its parameter's name (``generator`` on main, ``llm``
    before), the served model name, and ``None`` for the roles a plain server leaves unset."""
    params = inspect.signature(server_cls.__init__).parameters
    offered = {
        "generator": llm,
        "llm": llm,
        "model": model,
        "tool_parser": None,
        "server_role": None,
        "metadata_server_cfg": None,
    }
    return {name: value for name, value in offered.items() if name in params}


def serve(launch: TrtllmLaunch, *, skip_check: bool = False) -> int:
    """Build the LLM and run TensorRT-LLM's OpenAI server until it stops; returns the exit code."""
    llm = build_llm(launch, skip_check=skip_check)
    server_cls = installed.openai_server_class(skip_check=skip_check)
    server = server_cls(**openai_server_kwargs(server_cls, llm, launch.served_model_name))
    asyncio.run(server(launch.host, launch.port))
    return 0
