"""Every request parameter, SAGE against plain serving, over the three draft kinds; SGLang's own STANDALONE recorded.

Servers, side by side on CPU (the tier's ``servers`` pair and three of this module's): plain SGLang (without the
overlap scheduler: ``conftest.servers``), SAGE with the bundled standalone draft (the shipped CPU YAML: tiers, ragged
verify), SAGE with a random EAGLE head (``SAGE_EAGLE``), SAGE with the bundled trained EAGLE-3 head (``SAGE_EAGLE3``,
one shape, SGLang's overlap scheduler on: the GPU's code path) and SGLang's own STANDALONE mode with the bundled draft
(a chain of 3).  Each case of :data:`CASES` is sent to every server, all cases at once (the servers batch them
together, opted-out requests beside speculating ones), through the stock ``openai`` client or the native
``/generate``.  Greedy cases must give plain's output on every SAGE server; STANDALONE's divergences must be exactly
:data:`STANDALONE_MAY_DIVERGE`, and include :data:`STANDALONE_WRONG` (the rows ``docs/user-guide/serving-sglang.md``
lists as wrong in SGLang's own modes).
Sampling groups compare the distribution of the last of four sampled tokens with a chi-square test.
"""

from __future__ import annotations

from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable

import pytest

pytest.importorskip("sglang")

from sage_plugin.bench.serving import Server, parallel, plain_flags  # noqa: E402
from sage_plugin.models import bundled_eagle3_dir, load_tokenizer  # noqa: E402

from .conftest import CPU_CONFIG, TARGET_DIR, draft_dir, launch_servers  # noqa: E402
from .heads import make_eagle_head  # noqa: E402

pytestmark = pytest.mark.slow

SAGE_KINDS = ("sage", "sage_eagle", "sage_eagle3")
#: the bundled EAGLE-3 head's mean SGLang accept length must reach this (its model card)
EAGLE3_MIN_ACCEPT = 1.3
POEM = "Write a short poem about the sea."
FRUITS = "List ten fruits, separated by commas."
STORY = "Write a story about a robot who learns to paint."
#: the cases SGLang 0.5.23's STANDALONE mode may get wrong: its verify repeats the root's penalty state over the tree
#: and feeds the penalizers one token per step (how far a penalised output drifts depends on when drafts are accepted)
STANDALONE_MAY_DIVERGE = {
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "min_tokens",
    "penalties_combined",
    "completions_penalties",
    "native_penalties",
    "custom_logit_processor",
}
#: ... and the ones it always gets wrong: it runs no custom logit processor in its verify, and counts min_tokens by steps
STANDALONE_WRONG = {"custom_logit_processor", "min_tokens"}


@dataclass(frozen=True)
class Case:
    """One request: ``call(server)`` returns its comparable output and the raw response (for meta_info checks)."""

    call: Callable[[Any], tuple[Any, Any]]
    close: bool = False  # logprobs: values compared to 1e-3


def _client(server: Any) -> Any:
    from openai import OpenAI

    return OpenAI(base_url=f"{server.base_url}/v1", api_key="none", max_retries=0, timeout=900)


def chat(question: str | list[dict], max_tokens: int = 32, **params: Any) -> Case:
    messages = [{"role": "user", "content": question}] if isinstance(question, str) else question

    def call(server: Any) -> tuple[Any, Any]:
        out = _client(server).chat.completions.create(model="default", messages=messages, max_tokens=max_tokens,
                                                      temperature=0, **params)  # fmt: skip
        got = [(c.message.content, c.finish_reason) for c in out.choices], out.usage.completion_tokens
        return got, out

    return Case(call)


def chat_logprobs(question: str) -> Case:
    def call(server: Any) -> tuple[Any, Any]:
        out = _client(server).chat.completions.create(model="default", messages=[{"role": "user", "content": question}],
                                                      max_tokens=24, temperature=0, logprobs=True, top_logprobs=3)  # fmt: skip
        rows = out.choices[0].logprobs.content
        return [(r.token, r.logprob, [(t.token, t.logprob) for t in r.top_logprobs]) for r in rows], out

    return Case(call, close=True)


def chat_stream(question: str, **params: Any) -> Case:
    def call(server: Any) -> tuple[Any, Any]:
        stream = _client(server).chat.completions.create(model="default", messages=[{"role": "user", "content": question}],
                                                         max_tokens=40, temperature=0, stream=True, **params)  # fmt: skip
        parts, finish = [], None
        for chunk in stream:
            if chunk.choices:
                parts.append(chunk.choices[0].delta.content or "")
                finish = chunk.choices[0].finish_reason or finish
        return ("".join(parts), finish), None

    return Case(call)


def completion(prompt: str, max_tokens: int = 32, **params: Any) -> Case:
    def call(server: Any) -> tuple[Any, Any]:
        out = _client(server).completions.create(model="default", prompt=prompt, max_tokens=max_tokens, temperature=0,
                                                 **params)  # fmt: skip
        return [(c.text, c.finish_reason) for c in out.choices], out

    return Case(call)


def generate(question: str, max_new_tokens: int = 32, close: bool = False, **extra: Any) -> Case:
    tok = load_tokenizer(TARGET_DIR)
    text = tok.apply_chat_template([{"role": "user", "content": question}], tokenize=False, add_generation_prompt=True)
    params = {"max_new_tokens": max_new_tokens, "temperature": 0.0, **extra.pop("sampling_params", {})}

    def call(server: Any) -> tuple[Any, Any]:
        out = server.post("/generate", {"text": text, "sampling_params": params, **extra})
        meta = out["meta_info"]
        got: Any = out["output_ids"]
        if close:
            got = [(t, v) for v, t, _ in meta["input_token_logprobs"] + meta["output_token_logprobs"]]
        return got, out

    return Case(call, close=close)


def _custom_processor() -> str:
    from sglang.srt.sampling.custom_logit_processor import DisallowedTokensLogitsProcessor

    return DisallowedTokensLogitsProcessor.to_str()


def _cases() -> dict[str, Case]:
    blue, comma, period = 4461, 28, 30  # SmolLM2's " blue", ",", "."
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
              "required": ["name", "age"]}  # fmt: skip
    opt_out = {"custom_params": {"disable_speculative_decoding": True}}
    cases = {
        "presence_penalty": chat(POEM, max_tokens=40, presence_penalty=1.0),
        "frequency_penalty": chat("List ten fruits.", max_tokens=40, frequency_penalty=0.8),
        "repetition_penalty": chat(POEM, max_tokens=40, extra_body={"repetition_penalty": 1.3}),
        "min_tokens": chat("Say OK.", max_tokens=40, extra_body={"min_tokens": 24}),
        "logit_bias": chat("Name a color.", logit_bias={str(blue): 5.0}),
        "penalties_combined": chat(
            STORY,
            max_tokens=40,
            presence_penalty=0.5,
            frequency_penalty=0.5,
            extra_body={"repetition_penalty": 1.2, "min_tokens": 30},
        ),  # fmt: skip
        "stop_strings": chat(FRUITS, stop=[",", "!"]),
        "stop_token_ids": chat(FRUITS, extra_body={"stop_token_ids": [comma, period]}),
        "logprobs": chat_logprobs(POEM),
        "json_schema": chat(
            "Give a person's name and age as JSON.",
            max_tokens=40,
            response_format={"type": "json_schema", "json_schema": {"name": "p", "schema": schema}},
        ),  # fmt: skip
        "regex": chat("What is 12 times 12?", extra_body={"regex": "[0-9]+ is the answer"}),
        "ebnf": chat("Is the sky blue?", extra_body={"ebnf": 'root ::= ("yes" | "no") ", because " [a-z ]+'}),
        "n_2": chat(POEM, n=2),
        "ignore_eos": chat("Say OK.", max_tokens=48, extra_body={"ignore_eos": True}),
        "stream_stop": chat_stream(FRUITS, stop=["\n"]),
        "multi_turn": chat(
            [
                {"role": "user", "content": "My name is Ada."},
                {"role": "assistant", "content": "Hello Ada!"},
                {"role": "user", "content": "What is my name, and what is 2 + 2?"},
            ]
        ),  # fmt: skip
        "completions_penalties": completion("The history of the bicycle", max_tokens=40, presence_penalty=1.5),
        "native_penalties": generate(STORY, 40, sampling_params={"repetition_penalty": 1.25, "presence_penalty": 0.3}),
        "native_prompt_logprobs": generate(FRUITS, 16, close=True, return_logprob=True, logprob_start_len=0),
        "custom_logit_processor": generate(
            FRUITS,
            32,
            custom_logit_processor=_custom_processor(),
            sampling_params={"custom_params": {"token_ids": [period]}},
        ),  # fmt: skip
        "opt_out_native": generate(POEM, 32, sampling_params=opt_out),
        "opt_out_openai": chat(FRUITS, extra_body={**opt_out, "return_meta_info": True}),
    }
    for n in (1, 2, 3, 5, 8, 13):
        cases[f"max_tokens_{n}"] = chat(STORY, max_tokens=n)
    return cases


CASES = _cases()


@pytest.fixture(scope="module")
def peers(servers, target_dir, launch_env, tmp_path_factory):
    """``{name: server}``: the tier's pair and this module's SAGE EAGLE / EAGLE-3 servers and SGLang's STANDALONE."""
    logs = tmp_path_factory.mktemp("conformance_logs")
    plain, sage = servers
    yaml = ["--config", str(CPU_CONFIG), "--model-path", str(target_dir), "--enable-custom-logit-processor"]
    head = make_eagle_head(target_dir, logs / "eagle")
    chain = ["--speculative-algorithm", "STANDALONE", "--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
             "--speculative-num-draft-tokens", "4"]  # fmt: skip
    started = launch_servers(
        launch_env,
        ([*yaml, "--speculative-draft-model-path", str(head)], logs / "sage_eagle.log"),
        ([*yaml, "--speculative-draft-model-path", str(bundled_eagle3_dir()), "--sage-tiers", "[]",
          "--sage-cpu-overlap", "true"], logs / "sage_eagle3.log"),
        (["--model-path", str(target_dir), *plain_flags(CPU_CONFIG), *chain, "--speculative-draft-model-path",
          str(draft_dir(target_dir)), "--enable-custom-logit-processor"], logs / "standalone.log"),
    )  # fmt: skip
    yield {"plain": plain, "sage": sage, **dict(zip(("sage_eagle", "sage_eagle3", "standalone"), started))}
    for server in started:
        server.stop()


@pytest.fixture(scope="module")
def results(peers):
    """``{server: {case: (output, raw)}}``: every case on every server, all at once."""
    jobs = [(name, case_name) for name in peers for case_name in CASES]
    with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
        outs = list(pool.map(lambda job: CASES[job[1]].call(peers[job[0]]), jobs))
    table: dict[str, dict[str, Any]] = {name: {} for name in peers}
    for (name, case_name), out in zip(jobs, outs):
        table[name][case_name] = out
    return table


def same(case: Case, got: Any, want: Any) -> bool:
    """Equal outputs; for a logprobs case the same tokens with values within 1e-3."""
    if not case.close:
        return got == want
    a, b = _numbers(got), _numbers(want)
    return _strings(got) == _strings(want) and len(a) == len(b) and all(abs(x - y) <= 1e-3 for x, y in zip(a, b))


def _numbers(x: Any) -> list[float]:
    if isinstance(x, float):
        return [x]
    if isinstance(x, (list, tuple)):
        return [v for item in x for v in _numbers(item)]
    return []


def _strings(x: Any) -> list[Any]:
    if isinstance(x, (list, tuple)):
        return [v for item in x for v in _strings(item)]
    return [] if isinstance(x, float) else [x]


@pytest.mark.parametrize("case_name", sorted(CASES))
@pytest.mark.parametrize("kind", SAGE_KINDS)
def test_greedy_output_equals_plain(results, kind, case_name):
    got, _ = results[kind][case_name]
    want, _ = results["plain"][case_name]
    assert same(CASES[case_name], got, want), (kind, case_name, got, want)


def test_sglang_standalone_diverges_only_where_recorded(results):
    """SGLang's own STANDALONE mode on the same draft: where it changes the output (the rows the docs list)."""
    wrong = {c for c in CASES if not same(CASES[c], results["standalone"][c][0], results["plain"][c][0])}
    assert STANDALONE_WRONG <= wrong <= STANDALONE_MAY_DIVERGE, sorted(wrong)


@pytest.mark.parametrize("kind", SAGE_KINDS)
def test_opted_out_requests_say_so_and_the_rest_speculate(results, kind):
    native = results[kind]["opt_out_native"][1]["meta_info"]
    [summary] = native["sage"]
    assert summary["opt_out"] == "custom_params.disable_speculative_decoding" and summary["rounds"] == 0, summary
    assert native["spec_verify_ct"] == native["completion_tokens"] - 1, native  # one token a step after the prefill
    openai = results[kind]["opt_out_openai"][1].choices[0].model_extra["meta_info"]  # return_meta_info
    assert openai["sage"][0]["opt_out"] == "custom_params.disable_speculative_decoding", openai
    custom = results[kind]["custom_logit_processor"][1]["meta_info"]["sage"][0]
    assert custom["opt_out"] == "custom_logit_processor" and custom["rounds"] == 0, custom
    speculating = results[kind]["native_penalties"][1]["meta_info"]
    assert speculating["sage"][0].get("opt_out") is None and speculating["sage"][0]["rounds"] > 0, speculating


@pytest.mark.parametrize(("kind", "algorithm"), [("sage_eagle", "SAGE_EAGLE"), ("sage_eagle3", "SAGE_EAGLE3")])
def test_eagle_heads_resolve_and_the_trained_head_accepts(peers, kind, algorithm):
    """``--speculative-algorithm sage`` with an EAGLE / EAGLE-3 head runs as its variant; the trained EAGLE-3 head's
    drafts are accepted (its server runs one shape, so every step of every request drafts).  The random EAGLE head's
    server keeps the CPU config's tiers: its drafts are never accepted, so the tier control may rightly serve a whole
    request at the off tier; there every step is a drafted round or an off step, and the server has drafted."""
    server = peers[kind]
    assert f"running as {algorithm}" in server.log.read_text()
    assert server.get("/server_info")["speculative_algorithm"] == algorithm
    prompts = [load_tokenizer(TARGET_DIR).apply_chat_template([{"role": "user", "content": q}], tokenize=False,
               add_generation_prompt=True) for q in (POEM, FRUITS, STORY, "Explain gravity.")]  # fmt: skip
    got = parallel(lambda p: server.generate(p, 24), prompts)
    ref = parallel(lambda p: peers["plain"].generate(p, 24), prompts)
    assert [g["output_ids"] for g in got] == [r["output_ids"] for r in ref]
    accept = [g["meta_info"]["spec_accept_length"] for g in got]
    for g in got:
        summary = g["meta_info"]["sage"][0]
        assert summary["rounds"] + summary["off_steps"] == g["meta_info"]["spec_verify_ct"], g["meta_info"]
    if kind == "sage_eagle3":
        assert all(g["meta_info"]["sage"][0]["rounds"] > 0 for g in got)
        assert sum(accept) / len(accept) >= EAGLE3_MIN_ACCEPT, accept
    else:
        assert server.get("/server_info")["internal_states"][0]["sage"]["sage_rounds"] > 0


@pytest.mark.parametrize("kind", SAGE_KINDS)
def test_prefix_cache_hits_keep_plain_output(peers, kind):
    """The same penalised request twice in a row: the second reuses the cached prefix, and both equal plain's."""
    case = generate(STORY, 24, sampling_params={"presence_penalty": 0.8})
    want, _ = case.call(peers["plain"])
    first, _ = case.call(peers[kind])
    second, raw = case.call(peers[kind])
    assert first == want and second == want
    assert raw["meta_info"]["cached_tokens"] > 0


#: sampling groups: sampling params of 200 four-token samples of one prompt each (plain temperature sampling is in
#: every group: the penalised one adds no filter to it)
SAMPLING = {
    "top_k_top_p": {"temperature": 1.0, "top_k": 8, "top_p": 0.8},
    "min_p": {"temperature": 1.5, "min_p": 0.2},
    "penalties": {"temperature": 1.0, "presence_penalty": 1.5, "frequency_penalty": 1.0, "repetition_penalty": 1.3},
}
SAMPLING_PROMPT = "Repeat the word 'cat' five times, then count from one to five."


def _last_tokens(server: Server, params: dict, n: int = 200) -> Counter:
    tok = load_tokenizer(TARGET_DIR)
    text = tok.apply_chat_template([{"role": "user", "content": SAMPLING_PROMPT}], tokenize=False,
                                   add_generation_prompt=True)  # fmt: skip
    sampling = {"max_new_tokens": 4, "ignore_eos": True, **params}
    outs = server.post("/generate", {"text": [text] * n, "sampling_params": sampling})
    return Counter(o["output_ids"][-1] for o in outs)


def chi_square_p(a: Counter, b: Counter) -> float:
    """Two-sample chi-square test of homogeneity; categories with fewer than 5 expected samples pooled."""
    from scipy.stats import chi2_contingency

    total = a + b
    keep = [k for k, v in total.items() if v >= 10]
    rows = [[a[k] for k in keep] + [sum(a.values()) - sum(a[k] for k in keep)],
            [b[k] for k in keep] + [sum(b.values()) - sum(b[k] for k in keep)]]  # fmt: skip
    if rows[0][-1] + rows[1][-1] == 0:
        rows = [r[:-1] for r in rows]
    if len(rows[0]) < 2:
        return 1.0
    return float(chi2_contingency(rows).pvalue)


#: the SAGE servers whose sampling is checked (the tree's draft probabilities come from a draft model, an EAGLE-3 head)
SAMPLED_KINDS = ("sage", "sage_eagle3")


@pytest.fixture(scope="module")
def samples(peers) -> dict[tuple[str, str], Counter]:
    """``{(server, group): last-token counts}`` for plain and each of :data:`SAMPLED_KINDS`: every group to every
    server at once (the servers batch them), plain's counts the one reference for both kinds."""
    jobs = [(name, group) for group in sorted(SAMPLING) for name in ("plain", *SAMPLED_KINDS)]
    counts = parallel(lambda job: _last_tokens(peers[job[0]], SAMPLING[job[1]]), jobs)
    return dict(zip(jobs, counts))


@pytest.mark.parametrize("group", sorted(SAMPLING))
@pytest.mark.parametrize("kind", SAMPLED_KINDS)
def test_sampling_follows_plain_distribution(samples, kind, group):
    """The last of four sampled tokens has the same distribution under SAGE as under plain sampling (its earlier
    tokens are sampled through SAGE's tree: lossless tree sampling, per-node penalties, min-p)."""
    want, got = samples["plain", group], samples[kind, group]
    p = chi_square_p(got, want)
    assert p > 1e-4, (group, p, got.most_common(8), want.most_common(8))
