"""``--sage-*`` flags through SGLang's real parser: types, precedence, YAML files, errors, resolution.

Runs in this process after ``load_plugins()`` (fixture ``sglang_plugins``): the hooks are applied to
``ServerArgs`` exactly as in ``python -m sglang.launch_server``.
"""

from __future__ import annotations

import argparse
import json
import pickle
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("sglang")

from sglang.srt.arg_groups.overrides import record_foreign_defaults, resolving_view  # noqa: E402
from sglang.srt.server_args import ServerArgs, prepare_server_args  # noqa: E402
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm  # noqa: E402

from sage_plugin.config import ConfigError, SageConfig, knob_fields  # noqa: E402
from sage_plugin.runtimes.sglang.algo import validate_server_args  # noqa: E402
from sage_plugin.runtimes.sglang.args import FLAGS, SageCliArgs, flag_name, flag_value, sage_config_of  # noqa: E402
from sage_plugin.runtimes.sglang.support import SGLANG_SUPPORT  # noqa: E402

from ...unit.config_cases import OTHER_VALUES  # noqa: E402

CASES = [(name, value) for name, values in OTHER_VALUES.items() for value in values]

REPO = Path(__file__).resolve().parents[3]
REFERENCE_YAML = REPO / "engine_configs" / "reference" / "smollm2_cpu_sage.yaml"
BASE = ["--model-path", "target", "--speculative-algorithm", "sage", "--speculative-draft-model-path", "draft"]

pytestmark = pytest.mark.usefixtures("sglang_plugins")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="sglang serve")
    ServerArgs.add_cli_args(p)
    return p


def record(*argv: str, base: list[str] = BASE) -> ServerArgs:
    return ServerArgs.from_cli_args(parser().parse_args([*base, *argv]))


def config(*argv: str) -> SageConfig:
    return sage_config_of(record(*argv))


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


# -- the generated flags ----------------------------------------------------------------------------


def test_one_flag_per_field_in_help():
    help_text = parser().format_help()
    assert "SAGE speculative decoding (--speculative-algorithm sage)" in help_text
    fields = [f.name for f in knob_fields()]
    assert [f.field for f in FLAGS] == fields
    for name in fields:
        assert flag_name(name) in help_text
    assert "--sage-config" in help_text


def test_no_flags_means_defaults():
    sa = record()
    assert sa._sage_cli == SageCliArgs()
    assert sage_config_of(sa) == SageConfig()


def test_typed_values():
    cfg = config(
        "--sage-w-max", "6",
        "--sage-theta0", "0.25",
        "--sage-use-history", "false",
        "--sage-keep-top1", "False",
        "--sage-first-round-static", "true",
        "--sage-policy", "eagle2",
        "--sage-history-cooldown", "none",
    )  # fmt: skip
    alg = cfg.algorithm
    assert (alg.w_max, alg.theta0, alg.use_history, alg.keep_top1) == (6, 0.25, False, False)
    assert (alg.first_round_static, alg.policy, alg.history_cooldown) == (True, "eagle2", "none")


@pytest.mark.parametrize(
    "argv",
    [["--sage-static-tree", "[[0], [1], [0, 0]]"], ["--sage-static-tree", "[0]", "[1]", "[0,0]"]],
    ids=["one-json-tree", "one-json-path-per-value"],
)
def test_static_tree_json(argv):
    assert config(*argv).algorithm.static_tree == ((0,), (1,), (0, 0))


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--sage-w-max", "abc"], "argument --sage-w-max: invalid int value: 'abc'"),
        (["--sage-use-history", "maybe"], "argument --sage-use-history: expected true or false, got 'maybe'"),
        (["--sage-static-tree", "[[0]"], "argument --sage-static-tree: expected JSON"),
    ],
)
def test_unparsable_values_are_argparse_errors(argv, expected, capsys):
    with pytest.raises(SystemExit) as exc:
        parser().parse_args([*BASE, *argv])
    assert exc.value.code == 2
    assert expected in capsys.readouterr().err


# -- precedence: defaults < --sage-config < --sage-* ---------------------------------------------


def test_sage_config_file_then_flags(tmp_path):
    path = write(tmp_path, "sage.yaml", "sage:\n  w_max: 6\n  d_max: 5\n  theta0: 0.3\n")
    cfg = config("--sage-config", str(path), "--sage-w-max", "7")
    alg = cfg.algorithm
    assert (alg.w_max, alg.d_max, alg.theta0, alg.k) == (7, 5, 0.3, SageConfig().algorithm.k)


def test_sage_config_file_without_section(tmp_path):
    path = write(tmp_path, "flat.yaml", "d_max: 4\nuse_history: false\n")
    cfg = config("--sage-config", str(path))
    assert (cfg.algorithm.d_max, cfg.algorithm.use_history) == (4, False)


def test_reference_config_file():
    assert config("--sage-config", str(REFERENCE_YAML)) == SageConfig.from_yaml(REFERENCE_YAML)


def test_merged_config_is_validated_once(tmp_path):
    """A file valid only with the flags (d_max 12 needs d_cap >= 12) is accepted: merge, then validate."""
    path = write(tmp_path, "deep.yaml", "sage:\n  d_max: 12\n")
    assert config("--sage-config", str(path), "--sage-d-cap", "12").algorithm.d_max == 12


def test_relative_config_path_is_made_absolute(tmp_path, monkeypatch):
    write(tmp_path, "rel.yaml", "sage:\n  k: 8\n  w_max: 8\n")
    monkeypatch.chdir(tmp_path)
    sa = record("--sage-config", "rel.yaml")
    assert sa._sage_cli.config_path == str(tmp_path / "rel.yaml")
    monkeypatch.chdir(REPO)  # a subprocess with another cwd still finds it
    assert sage_config_of(sa).algorithm.k == 8


def test_sglang_config_yaml_with_dash_keys(tmp_path):
    """SGLang's own --config YAML: dash keys become --sage-* flags, the command line wins over them."""
    sage_file = write(tmp_path, "sage.yaml", "sage:\n  theta0: 0.3\n  w_max: 5\n")
    sgl = write(
        tmp_path,
        "sglang.yaml",
        f"sage-config: {sage_file}\nsage-w-max: 6\nsage-d-max: 5\nsage-use-history: false\n"
        "sage-static-tree: [[0], [1], [0, 0]]\n",
    )
    sa = prepare_server_args(["--config", str(sgl), *BASE, "--sage-d-max", "7"])
    cfg = sage_config_of(sa)
    alg = cfg.algorithm
    assert (alg.theta0, alg.w_max, alg.d_max, alg.use_history) == (0.3, 6, 7, False)
    assert alg.static_tree == ((0,), (1,), (0, 0))


def test_sglang_config_yaml_underscore_keys_are_rejected(tmp_path):
    """Like every SGLang key, sage keys must use dashes (SGLang passes the raw key as the flag)."""
    sgl = write(tmp_path, "sglang.yaml", "sage_w_max: 6\n")
    with pytest.raises(SystemExit):
        prepare_server_args(["--config", str(sgl), *BASE])


# -- validation: one message naming the flag ----------------------------------------------------


def validate(sa: ServerArgs) -> None:
    """Run validate_server_args the way SGLang's resolution does (on its recording stand-in)."""
    record_foreign_defaults(sa, "test.validate", validate_server_args)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--sage-w-max", "99"], "--sage-w-max must be an integer in [2, 10] (--sage-w-min <= --sage-w-max <= --sage-k), got 99"),
        (["--sage-d-max", "12"], "--sage-d-cap must be an integer in [12, 64] (--sage-d-max <= --sage-d-cap: raise --sage-d-cap together with --sage-d-max), got 10"),
        (["--sage-policy", "beam"], "--sage-policy must be one of sage, eagle2, static, chain, topn; got 'beam'"),
        (["--sage-theta0", "1.5"], "--sage-theta0 must be a number in [0.0, 1.0], got 1.5"),
        (["--sage-static-tree", "[[0], [0, 0, 1], [0, 1]]"], "--sage-static-tree: path [0, 0, 1] has no parent path [0, 0]"),
        (["--speculative-eagle-topk", "1"], "--speculative-eagle-topk must be >= 2 with --speculative-algorithm sage"),
        (["--speculative-num-draft-tokens", "999"], "--speculative-num-draft-tokens must be in [2, "),
    ],
)  # fmt: skip
def test_bad_values_name_the_flag(argv, message):
    with pytest.raises(ConfigError) as exc:
        validate(record(*argv))
    assert str(exc.value).startswith(message), str(exc.value)


def test_tiers_with_tensor_parallelism_are_accepted(tmp_path):
    """Tiers under ``--tp-size`` > 1 launch: every rank's chooser is fed rank 0's step timings (``RankZeroTimes``)."""
    sa = record("--sage-tiers", "[[0, 1], [3, 5]]", "--tp-size", "2",
                base=["--model-path", "target", "--speculative-algorithm", "sage",
                      "--speculative-draft-model-path", str(draft_dir(tmp_path, "LlamaForCausalLM"))])  # fmt: skip
    validate(sa)
    assert sage_config_of(sa).serving.tiers and sa.tp_size == 2


def test_bad_file_value_names_the_file(tmp_path):
    path = write(tmp_path, "bad.yaml", "sage:\n  w_max: 99\n")
    with pytest.raises(ConfigError) as exc:
        validate(record("--sage-config", str(path)))
    assert str(exc.value) == (
        "--sage-w-max must be an integer in [2, 10] (--sage-w-min <= --sage-w-max <= --sage-k), got 99"
        f" (value from --sage-config {path})"
    )


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("sage:\n  w_mx: 3\n", "unknown SAGE option(s): w_mx (known: "),
        ("sage: [1, 2]\n", "expected a mapping of SageConfig fields, got list"),
        ("sage: {\n", "not valid YAML"),
    ],
)
def test_bad_config_file(tmp_path, text, message):
    path = write(tmp_path, "bad.yaml", text)
    with pytest.raises(ConfigError) as exc:
        validate(record("--sage-config", str(path)))
    assert str(exc.value).startswith(f"--sage-config {path}: {message}"), str(exc.value)


def test_missing_config_file(tmp_path):
    with pytest.raises(ConfigError, match=r"--sage-config .*missing\.yaml: cannot read the file"):
        validate(record("--sage-config", str(tmp_path / "missing.yaml")))


def test_draft_model_is_required():
    sa = record(base=["--model-path", "target", "--speculative-algorithm", "sage"])
    with pytest.raises(ConfigError, match="needs --speculative-draft-model-path"):
        validate(sa)


def test_flags_without_sage_warn(caplog):
    with caplog.at_level("WARNING", logger="sage_plugin"):
        record("--sage-w-max", "4", base=["--model-path", "target"])
    assert "--sage-* flags are ignored: --speculative-algorithm is None, not sage" in caplog.text


# -- the record carries the flags; handle_server_args derives SGLang's sizes -----------------------


def test_flags_survive_pickling():
    """Schedulers are spawned with a pickled record: the flags must come along."""
    sa = record("--sage-w-max", "4", "--sage-static-tree", "[[0]]")
    clone = pickle.loads(pickle.dumps(sa))
    assert clone._sage_cli == sa._sage_cli
    assert sage_config_of(clone).algorithm.w_max == 4


def resolved(sa: ServerArgs):
    algo = SpeculativeAlgorithm.from_string("sage")
    record_foreign_defaults(sa, "test.handle", algo.handle_server_args)
    return resolving_view(sa)


def test_handle_server_args_defaults():
    view = resolved(record("--device", "cpu"))
    assert (view.speculative_eagle_topk, view.speculative_num_steps, view.speculative_num_draft_tokens) == (10, 10, 65)
    assert view.disable_overlap_schedule is True
    assert view.max_running_requests == 48


def test_overlap_scheduling_on_cpu_only_with_cpu_overlap():
    """SAGE registers overlap support; a CPU server turns it off unless --sage-cpu-overlap (measured slower there)."""
    assert SpeculativeAlgorithm.from_string("sage").supports_overlap
    assert resolved(record("--device", "cpu", "--sage-cpu-overlap", "true")).disable_overlap_schedule is False
    assert resolved(
        record("--device", "cpu", "--disable-overlap-schedule", "--sage-cpu-overlap", "true")
    ).disable_overlap_schedule
    assert resolved(record("--device", "cuda")).disable_overlap_schedule is False


def test_handle_server_args_follows_the_config():
    view = resolved(record("--sage-k", "4", "--sage-w-max", "4", "--sage-use-history", "false", "--sage-d-max", "6",
                           "--sage-first-round-static", "false", "--sage-n-max", "20"))  # fmt: skip
    assert (view.speculative_eagle_topk, view.speculative_num_steps, view.speculative_num_draft_tokens) == (4, 6, 21)


def test_explicit_sglang_sizes_win():
    view = resolved(record("--speculative-eagle-topk", "2", "--speculative-num-steps", "3",
                           "--speculative-num-draft-tokens", "4", "--max-running-requests", "8"))  # fmt: skip
    assert (view.speculative_eagle_topk, view.speculative_num_steps, view.speculative_num_draft_tokens) == (2, 3, 4)
    assert view.max_running_requests == 8


def test_derived_draft_tokens_are_capped_by_the_beam():
    view = resolved(record("--speculative-eagle-topk", "2", "--speculative-num-steps", "3"))
    assert view.speculative_num_draft_tokens == 2 + 2 * 2 * 2 + 1


@pytest.mark.parametrize("yaml_path", sorted((REPO / "engine_configs" / "sglang").glob("*.yaml")), ids=lambda p: p.name)
def test_every_sglang_engine_config_parses_in_sglang(yaml_path):
    """Every key is an SGLang (or SAGE) flag SGLang's ``--config`` accepts, and the SAGE values are valid."""
    import yaml

    data = yaml.safe_load(yaml_path.read_text())
    extra = [] if "speculative-draft-model-path" in data else ["--speculative-draft-model-path", "draft"]
    extra += [] if "model-path" in data else ["--model-path", "target"]
    args = prepare_server_args(["--config", str(yaml_path), *extra])
    assert args.speculative_algorithm.upper() == "SAGE"
    assert args.model_path == data.get("model-path", args.model_path)
    values = sage_config_of(args).to_dict()  # list-valued fields as lists, as YAML writes them
    fields = {f.flag.removeprefix("--"): f.field for f in FLAGS}
    for key, value in data.items():
        if key.startswith("sage-"):
            assert values[fields[key]] == value, key
        else:  # a JSON-valued flag (mm-process-config) is written as a JSON string and parsed by SGLang
            parsed = getattr(args, key.replace("-", "_"))
            assert parsed == (
                json.loads(value) if isinstance(parsed, (dict, list)) and isinstance(value, str) else value
            ), key


def test_sglang_engine_config_through_sglangs_own_config_parser():
    """``launch_server --config engine_configs/sglang/smollm2_cpu_sage.yaml`` resolves to the YAML's SAGE values."""
    yaml_path = REPO / "engine_configs" / "sglang" / "smollm2_cpu_sage.yaml"
    args = prepare_server_args(["--config", str(yaml_path), "--model-path", "target",
                                "--speculative-draft-model-path", "draft"])  # fmt: skip
    assert args.speculative_algorithm.upper() == "SAGE" and args.device == "cpu"
    cfg = sage_config_of(args)
    alg = cfg.algorithm
    assert (alg.k, alg.d_max, alg.d_cap, alg.n_max, alg.first_round_static) == (4, 4, 6, 11, False)
    assert cfg.serving.tiers == ((0, 1), (1, 2), (3, 4))  # a YAML list of lists reaches the config


# -- the draft checkpoint picks the variant ----------------------------------------------------------


def draft_dir(tmp_path: Path, arch: str) -> Path:
    d = tmp_path / arch
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"architectures": [arch]}))
    return d


def resolved_algorithm(tmp_path: Path, arch: str, algorithm: str = "sage") -> str:
    sa = record(base=["--model-path", "target", "--speculative-algorithm", algorithm,
                      "--speculative-draft-model-path", str(draft_dir(tmp_path, arch))])  # fmt: skip
    validate(sa)
    return resolving_view(sa).speculative_algorithm


@pytest.mark.parametrize(
    ("arch", "expected"),
    [("LlamaForCausalLM", "sage"), ("LlamaForCausalLMEagle", "SAGE_EAGLE"), ("Qwen2ForCausalLMEagle", "SAGE_EAGLE"),
     ("LlamaForCausalLMEagle3", "SAGE_EAGLE3")],
)  # fmt: skip
def test_draft_kind_picks_the_variant(tmp_path, arch, expected):
    """``sage`` + an EAGLE head is declared SAGE_EAGLE(3), so every process sees that variant's predicates."""
    assert resolved_algorithm(tmp_path, arch) == expected
    algo = SpeculativeAlgorithm.from_string(expected)
    assert algo.is_eagle() == ("EAGLE" in expected.upper()) and algo.is_eagle3() == expected.endswith("EAGLE3")


def test_explicit_variant_matching_the_draft(tmp_path):
    assert resolved_algorithm(tmp_path, "LlamaForCausalLMEagle3", "sage_eagle3") == "sage_eagle3"


@pytest.mark.parametrize(
    ("arch", "algorithm"), [("LlamaForCausalLM", "sage_eagle3"), ("LlamaForCausalLMEagle3", "sage_eagle")]
)
def test_explicit_variant_not_matching_the_draft(tmp_path, arch, algorithm):
    with pytest.raises(ConfigError, match=rf"--speculative-algorithm {algorithm} does not match the draft .*{arch}"):
        resolved_algorithm(tmp_path, arch, algorithm)


def test_unreadable_draft_config_needs_an_explicit_variant(tmp_path):
    empty = tmp_path / "no-config"
    empty.mkdir()
    sa = record(base=["--model-path", "target", "--speculative-algorithm", "sage",
                      "--speculative-draft-model-path", str(empty)])  # fmt: skip
    with pytest.raises(ConfigError, match="no config.json readable"):
        validate(sa)


# -- CPU sampling verify (hook #6) ----------------------------------------------------------------------------


def test_cpu_sampling_requests_take_the_sampling_verify():
    """On CPU, SGLang 0.5.23 verifies sampling requests greedily; with the plugin they get the lossless kernels."""
    from sglang.srt.speculative import eagle_utils

    from sage_plugin.runtimes.sglang.cpu_ops import sampling_ops

    def greedy(**kw):
        args = {"is_all_greedy": False, "is_cpu": True, "is_hip": False, "is_xpu": False,
                "use_rejection_sampling": False, **kw}  # fmt: skip
        return eagle_utils._verify_uses_greedy(**args)

    assert greedy() is False
    if not torch_cuda():  # filled by the hook where SGLang has no kernel
        assert (
            eagle_utils.tree_speculative_sampling_target_only is sampling_ops.tree_speculative_sampling_target_only_cpu
        )
        assert eagle_utils.top_k_renorm_prob is sampling_ops.top_k_renorm_prob_cpu
        assert eagle_utils.top_p_renorm_prob is sampling_ops.top_p_renorm_prob_cpu
    assert greedy(is_all_greedy=True) is True  # greedy batches: unchanged
    assert greedy(use_rejection_sampling=True) is True  # the Triton rejection sampler: SGLang's CPU answer kept
    assert greedy(is_cpu=False) is False


def test_parallel_groups_build_no_pynccl_communicator_without_cuda():
    """Hook 10: without CUDA ``use_pynccl`` reaches upstream as False, by keyword or by position; with CUDA as given."""
    import torch

    from sage_plugin.runtimes.sglang.hooks import init_model_parallel_group

    seen = []

    def original(group_ranks, local_rank, backend, use_pynccl=None, **kw):
        seen.append(use_pynccl)
        return "group"

    assert init_model_parallel_group(original, [[0, 1]], 0, "gloo") == "group"
    init_model_parallel_group(original, [[0, 1]], 0, "gloo", use_pynccl=True)
    init_model_parallel_group(original, [[0, 1]], 0, "gloo", True)
    cuda = torch.cuda.is_available()
    assert seen == ([None, True, True] if cuda else [False, False, False])


@settings(max_examples=30, deadline=None)
@given(rows=st.integers(1, 9), m=st.integers(0, 12), hidden=st.booleans(), seed=st.integers(0, 2**16))
def test_spec_extras_gather_on_cpu_equals_indexing(rows, m, hidden, seed):
    """Hook 11: the overlap scheduler's relay gather on CPU is row indexing of every buffer by the shared index."""
    from sage_plugin.runtimes.sglang.hooks import gather_spec_extras

    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, rows, (m,), generator=g, dtype=torch.int32)
    bufs = (torch.rand(rows, 4, generator=g), torch.randint(0, 99, (rows, 4), generator=g),
            torch.randint(0, 99, (rows,), generator=g), torch.rand(rows, 3, 5, generator=g) if hidden else None)  # fmt: skip

    def never(*args):
        raise AssertionError("CPU tensors must not reach the Triton kernel")

    out = gather_spec_extras(never, idx, *bufs)
    for got, buf in zip(out, bufs):
        assert (got is None) if buf is None else torch.equal(got, buf[idx.long()])


def torch_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


# -- every field through the real launch check (validate_server_args) --------------------------------


@pytest.mark.parametrize(("field", "value"), CASES, ids=[f"{n}={v}" for n, v in CASES])
def test_every_field_is_honoured_or_refused_at_launch(tmp_path, field, value):
    """The launch accepts what SAGE's SGLang worker honours and refuses the rest, naming the flag."""
    draft = write(tmp_path, "config.json", json.dumps({"architectures": ["LlamaForCausalLM"]})).parent
    entry = SGLANG_SUPPORT.honours.get(field)
    sa = record(flag_name(field), flag_value(value), base=[*BASE[:-1], str(draft)])
    if entry is not None and (entry.values is None or value in entry.values):
        validate(sa)
        assert sage_config_of(sa).knob(field) == value
        return
    with pytest.raises(ConfigError) as exc:
        validate(sa)
    assert str(exc.value).startswith(f"{flag_name(field)}: SGLang 0.5.23"), str(exc.value)


def test_multimodal_draft_is_refused_at_launch(tmp_path):
    """SGLang 0.5.23 misplaces a multimodal draft's image embeddings in the draft prefill (its STANDALONE too)."""
    d = tmp_path / "vlm-draft"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"architectures": ["Qwen2VLForConditionalGeneration"],
                                               "vision_config": {"depth": 1}}))  # fmt: skip
    sa = record(base=["--model-path", "target", "--speculative-algorithm", "sage",
                      "--speculative-draft-model-path", str(d)])  # fmt: skip
    with pytest.raises(ConfigError, match=r"a multimodal draft \(its config has a vision_config\).*use a text draft"):
        validate(sa)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"hidden_size": 32}, "hidden_size 32 != target's 576"),
        ({"vocab_size": 1000}, "vocab_size 1000 != target's 49152"),
        ({"eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 14, 29]}}, "must be 3 ids in \\[0, 28\\]"),
        ({"d2t": "outside"}, "outside the target vocabulary"),
    ],
)
def test_mismatched_eagle3_head_is_refused_at_launch(tmp_path, change, message):
    """A head that does not fit the target is refused before any model loads, naming the mismatch."""
    from safetensors.torch import save_file

    from sage_plugin.models import ensure_smollm2

    target = ensure_smollm2()
    cfg = json.loads((target / "config.json").read_text())
    head = tmp_path / "head"
    head.mkdir()
    d2t = torch.zeros(4, dtype=torch.long) + (49152 if change.get("d2t") == "outside" else 0)
    head_cfg = {**cfg, "architectures": ["LlamaForCausalLMEagle3"], "draft_vocab_size": 4,
                **{k: v for k, v in change.items() if k != "d2t"}}  # fmt: skip
    (head / "config.json").write_text(json.dumps(head_cfg))
    save_file({"d2t": d2t}, str(head / "model.safetensors"))
    sa = record(base=["--model-path", str(target), "--speculative-algorithm", "sage",
                      "--speculative-draft-model-path", str(head)])  # fmt: skip
    with pytest.raises(ConfigError, match=rf"EAGLE-3 head --speculative-draft-model-path {head} .*{message}"):
        validate(sa)
