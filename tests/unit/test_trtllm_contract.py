"""The recorded TensorRT-LLM contract: the adapter matches it, and the installed-version check catches a drift.

TensorRT-LLM is not installed here; "installed" TensorRT-LLMs are fake modules planted in ``sys.modules`` with the
recorded signatures of each pinned version (or a changed one).
"""

from __future__ import annotations

import ast
import sys
import types
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Optional

import pytest

import sage_plugin.runtimes.trtllm as trtllm_pkg
from sage_plugin.runtimes.trtllm import contract, dynamic_tree, installed
from sage_plugin.runtimes.trtllm.contract import (
    DRAFTER,
    DYNAMIC_TREE_COMMIT,
    PINNED,
    REQUEST_FIELDS_READ,
    REQUEST_FIELDS_WRITTEN,
    SIGNATURES,
    TREE_WORKER,
    ContractMismatchError,
    TrtllmUnavailableError,
    check_installed_contract,
    signature_text,
)
from sage_plugin.runtimes.trtllm.drafter import SageChainDrafter, trtllm_drafter_class

PACKAGE = Path(trtllm_pkg.__file__).parent


def _recorded(symbol_suffix: str) -> dict[str, str]:
    return next(i for i in SIGNATURES if i.symbol.endswith(symbol_suffix)).signatures


# -- the records themselves ---------------------------------------------------------------------------------------


def test_pinned_versions_name_where_each_file_was_read():
    names = [p.name for p in PINNED]
    assert names == ["1.2-early", "1.2-late", "main", "serve-older"]
    for pinned in PINNED:
        assert pinned.read_at and all(v.startswith(("commit ", "content ")) for v in pinned.read_at.values())
    main = dict(PINNED[2].read_at)
    assert main["_torch/speculative/eagle3_dynamic_tree.py"] == f"commit {DYNAMIC_TREE_COMMIT}"
    assert "0004396720054fd8e205cbf616f21f0b57c6b412" in main["_torch/pyexecutor/py_executor.py"]


def test_every_exact_item_records_a_known_version():
    for item in SIGNATURES:
        assert set(item.signatures) <= {p.name for p in PINNED}, item.symbol
        assert item.signatures or item.fillable, item.symbol


# -- the adapter against the records ------------------------------------------------------------------------------


def test_drafter_override_has_the_recorded_signature():
    assert signature_text(SageChainDrafter.prepare_draft_tokens) in _recorded("Drafter.prepare_draft_tokens").values()


def test_tree_replacements_have_the_recorded_signatures():
    for name, fn in dynamic_tree._REPLACEMENTS.items():
        assert signature_text(fn) == _recorded(f"{TREE_WORKER.split(':')[1]}.{name}")["main"], name
    assert set(dynamic_tree.PATCHED) < {i.symbol.rsplit(".", 1)[1] for i in SIGNATURES if i.tier == "tree"}


def _request_attributes(path: Path) -> tuple[set[str], set[str]]:
    """Attributes read / written on request variables (``req``, ``r``) in a module, ``getattr(req, "x")`` included."""
    read, written = set(), set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in ("req", "r"):
            (written if isinstance(node.ctx, ast.Store) else read).add(node.attr)
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "getattr"
            and isinstance(node.args[0], ast.Name)
            and node.args[0].id == "req"
            and isinstance(node.args[1], ast.Constant)
        ):
            read.add(node.args[1].value)
    return read, written


def test_drafter_reads_and_writes_only_recorded_request_fields():
    read, written = _request_attributes(PACKAGE / "drafter.py")
    dummy_flags = {"is_dummy", "is_cuda_graph_dummy", "is_attention_dp_dummy"}  # read through a getattr loop
    assert read - written <= REQUEST_FIELDS_READ, read - written - REQUEST_FIELDS_READ
    assert written == REQUEST_FIELDS_WRITTEN
    assert (read | dummy_flags) >= REQUEST_FIELDS_READ - {"is_dummy"}
    source = (PACKAGE / "drafter.py").read_text()
    assert all(f'"{flag}"' in source for flag in dummy_flags)


def test_only_installed_imports_tensorrt_llm():
    for path in sorted(PACKAGE.glob("*.py")):
        imports = [
            n
            for n in ast.walk(ast.parse(path.read_text()))
            if isinstance(n, (ast.Import, ast.ImportFrom))
            and any(
                (a.name if isinstance(n, ast.Import) else (n.module or "")).startswith("tensorrt_llm") for a in n.names
            )
        ]
        assert not imports or path.name == "installed.py", path.name


# -- fake installed TensorRT-LLMs ---------------------------------------------------------------------------------


class DrafterLate(ABC):
    def __init__(self, max_draft_len=None, max_total_draft_tokens=None, max_concurrency=None, draft_len_schedule=None):
        self.max_draft_len, self.max_total_draft_tokens = max_draft_len, max_total_draft_tokens
        self._static_max_total_draft_tokens = max_total_draft_tokens
        self.max_concurrency, self.draft_len_schedule = max_concurrency, draft_len_schedule

    @abstractmethod
    def prepare_draft_tokens(self, scheduled_requests, resource_manager=None) -> None: ...

    def should_use_spec_decode(self, requests, max_batch_size, max_num_tokens, max_total_draft_tokens) -> bool:
        return True

    def pad_draft_tokens_for_cuda_graph(self, scheduled_requests) -> None:
        for req in scheduled_requests.generation_requests:
            req.py_draft_tokens.extend([0] * (self._static_max_total_draft_tokens - len(req.py_draft_tokens)))


class DrafterEarly(ABC):
    def __init__(self, max_concurrency: Optional[int] = None) -> None:
        self.max_concurrency = max_concurrency

    @abstractmethod
    def prepare_draft_tokens(self, scheduled_requests, resource_manager=None) -> None: ...

    def should_use_spec_decode(self, requests, max_batch_size, max_num_tokens, max_total_draft_tokens) -> bool:
        return True

    def pad_draft_tokens_for_cuda_graph(self, scheduled_requests) -> None:
        for req in scheduled_requests.generation_requests:
            req.py_draft_tokens.extend([0] * (self.max_draft_len - len(req.py_draft_tokens)))


class DrafterMain(DrafterLate):
    def pad_draft_tokens_for_cuda_graph(self, scheduled_requests, resource_manager=None) -> None:
        super().pad_draft_tokens_for_cuda_graph(scheduled_requests)


class _Field:
    def __init__(self, default=None) -> None:
        self.default = default


class UserProvidedDecodingConfig:
    model_fields = {
        n: _Field("User_Provided" if n == "decoding_type" else None)
        for n in ("decoding_type", "max_draft_len", "drafter", "resource_manager", "max_concurrency")
    }

    def __init__(self, **kwargs) -> None:
        self.__dict__.update(kwargs)


class TorchLlmArgs:
    model_fields = {n: _Field() for n in contract.CONFIG_FIELDS["TorchLlmArgs"]}


class OpenAIServerMain:
    def __init__(self, generator, model, tool_parser, server_role, metadata_server_cfg, disagg_cluster_config=None):
        self.generator, self.model = generator, model

    async def __call__(self, host, port, sockets=None) -> None:
        OpenAIServerMain.served = (self.generator, self.model, host, port)


def update_llm_args_with_extra_dict(llm_args, llm_args_dict, extra_llm_api_options=None):
    return {**llm_args, **llm_args_dict}


class FakeLLM:
    def __init__(self, **kwargs) -> None:
        self.kwargs = kwargs


def plant(monkeypatch, drafter=DrafterLate, server=OpenAIServerMain, version="1.2.1", upc=UserProvidedDecodingConfig):
    """Fake ``tensorrt_llm`` modules in ``sys.modules`` (what ``importlib.import_module`` returns)."""
    modules = {
        "tensorrt_llm": {"__version__": version, "LLM": FakeLLM},
        "tensorrt_llm._torch": {},
        "tensorrt_llm._torch.speculative": {},
        "tensorrt_llm._torch.speculative.drafter": {"Drafter": drafter},
        "tensorrt_llm.llmapi": {"UserProvidedDecodingConfig": upc},
        "tensorrt_llm.llmapi.llm_args": {"TorchLlmArgs": TorchLlmArgs},
        "tensorrt_llm.llmapi.llm_utils": {"update_llm_args_with_extra_dict": update_llm_args_with_extra_dict},
        "tensorrt_llm.serve": {"OpenAIServer": server},
    }
    for name, attrs in modules.items():
        module = types.ModuleType(name)
        module.__dict__.update(attrs)
        monkeypatch.setitem(sys.modules, name, module)
    for parent, child in (("tensorrt_llm", "_torch"), ("tensorrt_llm", "llmapi"), ("tensorrt_llm", "serve")):
        setattr(sys.modules[parent], child, sys.modules[f"{parent}.{child}"])
    monkeypatch.setattr(installed, "_checked", set())


@pytest.mark.parametrize("drafter", [DrafterEarly, DrafterLate, DrafterMain], ids=["1.2-early", "1.2-late", "main"])
def test_each_pinned_version_passes(monkeypatch, drafter):
    plant(monkeypatch, drafter=drafter)
    check_installed_contract(("drafter", "serve"))
    assert installed.drafter_base() is drafter


def test_changed_signature_fails_with_version_item_and_pins(monkeypatch):
    class Changed(DrafterLate):
        def prepare_draft_tokens(self, scheduled_requests, resource_manager=None, step=0) -> None: ...

    plant(monkeypatch, drafter=Changed, version="1.3.0rc9")
    with pytest.raises(ContractMismatchError) as err:
        installed.drafter_base()
    message = str(err.value)
    assert message.startswith("TensorRT-LLM 1.3.0rc9 does not match")
    assert f"{DRAFTER}.prepare_draft_tokens" in message
    assert "installed (self, scheduled_requests, resource_manager=None, step=0)" in message
    assert all(p.name in message for p in PINNED) and "docs/design/trtllm.md" in message


def test_missing_class_and_wrong_literal_fail(monkeypatch):
    plant(monkeypatch)
    del sys.modules["tensorrt_llm.llmapi"].UserProvidedDecodingConfig
    with pytest.raises(ContractMismatchError, match=r"UserProvidedDecodingConfig: not found"):
        check_installed_contract(("drafter",))

    class Renamed(UserProvidedDecodingConfig):
        model_fields = {**UserProvidedDecodingConfig.model_fields, "decoding_type": _Field("UserProvided")}

    plant(monkeypatch, upc=Renamed)
    with pytest.raises(ContractMismatchError, match=r"decoding_type is 'UserProvided', recorded 'User_Provided'"):
        check_installed_contract(("drafter",))


def test_server_signature_is_checked_by_what_the_launcher_can_fill(monkeypatch):
    class OldServer:
        def __init__(self, llm, model, server_role, metadata_server_cfg, disagg_cluster_config=None): ...

    class NewRequired:
        def __init__(self, generator, model, tokenizer_pool, server_role=None): ...

    plant(monkeypatch, server=OldServer)
    check_installed_contract(("serve",))
    plant(monkeypatch, server=NewRequired)
    with pytest.raises(ContractMismatchError, match=r"needs \['tokenizer_pool'\]"):
        check_installed_contract(("serve",))


def test_skip_warns_instead(monkeypatch, caplog):
    class Changed(DrafterLate):
        def __init__(self, max_draft_len=None): ...

    plant(monkeypatch, drafter=Changed)
    check_installed_contract(("drafter",), skip=True)
    assert "does not match" in caplog.text


def test_not_installed_is_one_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorrt_llm", None)  # import raises ImportError
    with pytest.raises(TrtllmUnavailableError, match=r"^TensorRT-LLM is not installed"):
        installed.require(("drafter",))


def test_the_drafter_class_is_built_on_the_installed_drafter(monkeypatch):
    plant(monkeypatch, drafter=DrafterMain)
    cls = trtllm_drafter_class()
    assert issubclass(cls, DrafterMain) and issubclass(cls, SageChainDrafter)
    assert cls.prepare_draft_tokens is SageChainDrafter.prepare_draft_tokens
    assert cls._needs_padding_kv_extension is True


def test_check_class_against_contract_covers_the_tree_worker():
    class Worker:
        def sample(self, logits, max_top_k): ...

        def update_draft_tokens_and_scores(
            self,
            cur_draft_idx,
            new_draft_tokens,
            new_draft_scores,
            previous_draft_scores,
            batch_size,
            attn_metadata=None,
        ): ...

        def resampling_final_draft_tokens(self, batch_size): ...

    contract.check_class_against_contract(Worker, TREE_WORKER)

    class Drifted(Worker):
        def resampling_final_draft_tokens(self, batch_size, num_contexts): ...

    with pytest.raises(ContractMismatchError, match=r"resampling_final_draft_tokens: installed \(self, batch_size"):
        contract.check_class_against_contract(Drifted, TREE_WORKER)
