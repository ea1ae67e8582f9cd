"""``engine_configs/trtllm/``: every launch file and TensorRT-LLM ``--config`` YAML validates; a bad value stops the
launch naming the field, before anything starts; ``sage trtllm-serve`` builds the LLM and the server through the
recorded interfaces (fake TensorRT-LLM modules) and fails clearly without TensorRT-LLM."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import yaml

from sage_plugin.cli import main
from sage_plugin.config import ConfigError
from sage_plugin.runtimes.trtllm import serve as serve_mod
from sage_plugin.runtimes.trtllm.config import check_llm_options, load_launch, parse_launch, user_provided_kwargs
from sage_plugin.runtimes.trtllm.contract import CONFIG_FIELDS
from sage_plugin.runtimes.trtllm.drafter import SageChainDrafter

from .test_trtllm_contract import DrafterLate, FakeLLM, OpenAIServerMain, plant

ROOT = Path(__file__).resolve().parents[2] / "engine_configs" / "trtllm"
LAUNCHES = sorted(p for p in ROOT.glob("*.yaml") if "tier" in yaml.safe_load(p.read_text()))
TRTLLM_OPTIONS = sorted(p for p in ROOT.glob("*.yaml") if p not in LAUNCHES)


def test_there_are_both_kinds_of_config():
    assert {load_launch(p).tier for p in LAUNCHES} == {"drafter", "dynamic_tree"}
    assert TRTLLM_OPTIONS


@pytest.mark.parametrize("path", LAUNCHES, ids=lambda p: p.name)
def test_launch_files_validate(path):
    launch = load_launch(path)
    if launch.tier == "drafter":
        assert launch.llm["disable_overlap_scheduler"] is True and "speculative_config" not in launch.llm
        assert launch.draft.max_draft_len >= min(launch.sage.algorithm.d_cap, launch.sage.algorithm.n_max)
    else:
        spec = launch.llm["speculative_config"]
        assert spec["decoding_type"] == "Eagle3" and spec["use_dynamic_tree"] is True
        assert launch.sage.algorithm.k <= spec["dynamic_tree_max_topK"]
    assert launch.sage.algorithm.first_round_static is False and launch.sage.algorithm.node_budget == "fixed"


@pytest.mark.parametrize("path", LAUNCHES, ids=lambda p: p.name)
def test_configs_set_only_recorded_fields(path):
    launch = load_launch(path)
    assert set(launch.llm) <= CONFIG_FIELDS["TorchLlmArgs"]
    if launch.tier == "dynamic_tree":
        assert set(launch.llm["speculative_config"]) <= CONFIG_FIELDS["Eagle3DecodingConfig"] | {"decoding_type"}
    else:
        assert set(user_provided_kwargs(launch, object())) <= CONFIG_FIELDS["UserProvidedDecodingConfig"]


@pytest.mark.parametrize("path", TRTLLM_OPTIONS, ids=lambda p: p.name)
def test_trtllm_serve_configs_are_dynamic_tree_options(path):
    opts = check_llm_options(yaml.safe_load(path.read_text()), "dynamic_tree", where=path.name)
    spec = opts["speculative_config"]
    assert (
        spec["max_draft_len"] <= spec["max_total_draft_tokens"] <= spec["dynamic_tree_max_topK"] * spec["max_draft_len"]
    )


BASE = {"tier": "drafter", "model": "m"}
TREE = {
    "tier": "dynamic_tree",
    "model": "m",
    "llm": {
        "speculative_config": {
            "decoding_type": "Eagle3", "use_dynamic_tree": True, "dynamic_tree_max_topK": 4, "max_draft_len": 3,
            "speculative_model": "head",
        }
    },
}  # fmt: skip
BAD = [
    ({**BASE, "tier": "tree"}, "tier must be one of drafter, dynamic_tree"),
    ({**BASE, "model": ""}, "model must be a non-empty string"),
    ({**BASE, "extra": 1}, "launch file: unknown key(s) extra"),
    ({**BASE, "sage": {"d_min": 0}}, "d_min must be an integer"),
    ({**BASE, "sage": {"w_max": 6}}, "w_max: TensorRT-LLM drafter does not honour it"),
    ({**BASE, "sage": {"policy": "eagle2"}}, "policy: TensorRT-LLM drafter honours only 'sage'"),
    ({**BASE, "drafter": {"max_draft_len": 4}}, "drafter.max_draft_len must be >= min(sage.d_cap, sage.n_max) = 10"),
    ({**BASE, "drafter": {"dtype": "int8"}}, "drafter.dtype must be one of"),
    ({**BASE, "drafter": {"device": 3}}, "drafter.device must be a non-empty string"),
    ({**BASE, "drafter": {"max_concurrency": 0}}, "drafter.max_concurrency must be an integer"),
    ({**BASE, "drafter": {"draft": "x"}}, "drafter: unknown key(s) draft"),
    (
        {**BASE, "drafter": {"num_slots": 4}, "llm": {"max_batch_size": 8}},
        "drafter.num_slots must be an integer in [8,",
    ),
    ({**BASE, "llm": {"max_batch_size": 0}}, "llm.max_batch_size must be an integer"),
    ({**BASE, "llm": {"kv_cache_config": 0.5}}, "llm.kv_cache_config must be a mapping"),
    ({**BASE, "llm": {"disable_overlap_scheduler": False}}, "llm.disable_overlap_scheduler must be true"),
    ({**BASE, "llm": {"speculative_config": {}}}, "llm.speculative_config: the drafter tier builds it"),
    ({**BASE, "serve": {"port": 0}}, "serve.port must be an integer"),
    ({**TREE, "drafter": {}}, "drafter: only the drafter tier"),
    ({**TREE, "sage": {"static_tree": [[0]]}}, "static_tree: TensorRT-LLM dynamic tree does not honour it"),
    ({**TREE, "llm": {}}, "llm.speculative_config.decoding_type: the SAGE tree tier runs on Eagle3"),
]
for key, value, message in [
    ("use_dynamic_tree", False, "use_dynamic_tree must be true"),
    ("dynamic_tree_max_topK", 1, "dynamic_tree_max_topK must be an integer in [2, 64]"),
    ("max_draft_len", 0, "max_draft_len must be an integer in [1, 64]"),
    ("max_total_draft_tokens", 13, "max_total_draft_tokens must be an integer in [3, 12]"),
    ("speculative_model", None, "speculative_model must be a non-empty string"),
    ("eagle3_one_model", False, "eagle3_one_model must be true"),
]:
    spec = {**TREE["llm"]["speculative_config"], key: value}
    BAD.append(({**TREE, "llm": {"speculative_config": spec}}, f"llm.speculative_config.{message}"))


@pytest.mark.parametrize(("data", "message"), BAD, ids=[m.split(" ")[0] for _, m in BAD])
def test_bad_values_name_the_field(data, message):
    with pytest.raises(ConfigError) as err:
        parse_launch(data)
    assert str(err.value).startswith(message), str(err.value)


def test_trtllm_config_file_is_merged_under_llm(tmp_path):
    (tmp_path / "opts.yaml").write_text(yaml.safe_dump({**TREE["llm"], "max_batch_size": 4}))
    launch = load_launch(_write(tmp_path, {**TREE, "llm": {"max_batch_size": 2}, "trtllm_config": "opts.yaml"}))
    assert launch.llm["max_batch_size"] == 2 and launch.llm["speculative_config"]["max_total_draft_tokens"] == 12
    with pytest.raises(ConfigError, match=r"^trtllm_config .*missing\.yaml: cannot read the file"):
        load_launch(_write(tmp_path, {**TREE, "trtllm_config": "missing.yaml"}))


def _write(tmp_path: Path, data: dict) -> Path:
    path = tmp_path / "launch.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_cli_check_prints_the_launch(capsys):
    assert main(["trtllm-serve", "--config", str(ROOT / "smollm2_sage_drafter.yaml"), "--check", "--port", "9001"]) == 0
    out = capsys.readouterr().out
    assert "tier: drafter" in out and "UserProvidedDecodingConfig(max_draft_len=6" in out and ":9001" in out


@pytest.mark.skipif(importlib.util.find_spec("tensorrt_llm") is not None, reason="TensorRT-LLM is installed")
def test_cli_without_tensorrt_llm_fails_clearly(capsys):
    assert main(["trtllm-serve", "--config", str(ROOT / "llama3_8b_sage_drafter.yaml")]) == 2
    assert "sage: error: TensorRT-LLM is not installed" in capsys.readouterr().err


def test_cli_bad_file_names_the_field(tmp_path, capsys):
    path = _write(tmp_path, {**BASE, "drafter": {"dtype": "int8"}})
    assert main(["trtllm-serve", "--config", str(path), "--check"]) == 2
    assert "sage: error: drafter.dtype must be one of" in capsys.readouterr().err


def test_serve_builds_the_llm_and_the_server_through_the_recorded_interfaces(monkeypatch):
    plant(monkeypatch, drafter=DrafterLate)
    launch = load_launch(ROOT / "llama3_8b_sage_drafter.yaml")
    assert serve_mod.serve(launch) == 0
    llm, model, host, port = OpenAIServerMain.served
    assert isinstance(llm, FakeLLM) and (model, host, port) == ("meta-llama/Llama-3.1-8B-Instruct", "0.0.0.0", 8000)
    kwargs = llm.kwargs
    assert kwargs["model"] == "meta-llama/Llama-3.1-8B-Instruct" and kwargs["disable_overlap_scheduler"] is True
    spec = kwargs["speculative_config"]
    assert spec.max_draft_len == 10 and spec.resource_manager is None
    assert isinstance(spec.drafter, DrafterLate) and isinstance(spec.drafter, SageChainDrafter)
    assert spec.drafter._spec.draft_model == "meta-llama/Llama-3.2-1B-Instruct" and spec.drafter._runner is None


def test_openai_server_kwargs_follow_the_signature():
    class Old:
        def __init__(self, llm, model, server_role, metadata_server_cfg, disagg_cluster_config=None): ...

    assert serve_mod.openai_server_kwargs(Old, "L", "m") == {
        "llm": "L", "model": "m", "server_role": None, "metadata_server_cfg": None,
    }  # fmt: skip
    new = serve_mod.openai_server_kwargs(OpenAIServerMain, "L", "m")
    assert new["generator"] == "L" and "llm" not in new and new["tool_parser"] is None


def test_user_provided_kwargs_carry_max_concurrency():
    launch = parse_launch({**BASE, "drafter": {"max_concurrency": 4}})
    assert user_provided_kwargs(launch, "D") == {
        "max_draft_len": 10, "drafter": "D", "resource_manager": None, "max_concurrency": 4,
    }  # fmt: skip
