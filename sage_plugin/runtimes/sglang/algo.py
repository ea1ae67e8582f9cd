"""``SageSpecAlgo`` and its EAGLE variants: how SGLang 0.5.23's scheduler sees ``--speculative-algorithm sage``.

SAGE drafts with one of SGLang's two draft kinds and keeps that kind's plumbing; the draft checkpoint decides
which (:func:`draft_kind_of`, from its ``architectures``), so ``--speculative-algorithm sage`` is all a user types:

=========================  ==============  ===========================================================
draft                      registered as   predicates mirror (draft KV sizing, FutureMap, hidden states)
=========================  ==============  ===========================================================
standalone causal LM       ``SAGE``         ``STANDALONE``: own embeddings/lm_head, no hidden-state relay
EAGLE head (``*Eagle``)    ``SAGE_EAGLE``   ``EAGLE``: target hidden states in, target embed/head shared
EAGLE3 head (``*Eagle3``)  ``SAGE_EAGLE3``  ``EAGLE3``: three captured target layers, own reduced head
=========================  ==============  ===========================================================

:func:`validate_server_args` (run by SGLang for ``SAGE`` during resolution) reads the draft's kind and, for an
EAGLE/EAGLE3 head, declares ``speculative_algorithm = SAGE_EAGLE``/``SAGE_EAGLE3``, the way SGLang itself
resolves ``NEXTN`` to ``EAGLE``: every later reader (scheduler, workers, model runner capturing EAGLE3's aux hidden
states) then sees the variant whose predicates match the draft.  The variant names are accepted directly too.
One deviation from the mirrored built-in: ``supports_mixed_chunk`` is False for all three (the SAGE worker keeps
per-request state across decode steps and resets it on a prefill; mixed batches are turned off).
``tests/integration/sglang/test_registration.py`` checks every predicate against the mirrored built-in and that
every method the enum has exists here.

Besides the predicates, SGLang calls four methods that ``CustomSpecAlgo`` lacks in 0.5.23
(``docs/design/sglang-internals.md``, "What a custom algorithm class must provide"): ``create_future_map`` (scheduler), ``carries_draft_hidden_states``
(scheduler), ``need_topk`` (overlap utils) and ``get_platform_worker_cls`` (adaptive params, create_worker).

The two server-args callbacks run in the launcher during SGLang's resolution, on a recording
stand-in of the ``ServerArgs`` record (plain attribute writes only; SGLang declares them):

* :func:`validate_server_args` (first, on the operator's input): builds and validates the SageConfig
  from the ``--sage-*`` flags; any bad value aborts the launch with one message naming the flag,
  before any scheduler process starts.
* :meth:`SageSpecAlgo.handle_server_args` (after SGLang's own resolution): derives topk, steps and the
  number of draft tokens from the SageConfig (:func:`.args.spec_sizes`) and turns overlap scheduling off.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sglang.srt.speculative.spec_registry import CustomSpecAlgo

from sage_plugin.config import ConfigError, SageConfig
from sage_plugin.models import check_eagle3_config
from sage_plugin.serving.tiers import parse_tiers

from .args import SpecSizes, flag_name, sage_config_of, spec_sizes
from .support import SGLANG_SUPPORT

if TYPE_CHECKING:
    import torch
    from sglang.srt.managers.overlap_utils import FutureMap

__all__ = [
    "VARIANTS",
    "SageEagle3SpecAlgo",
    "SageEagleSpecAlgo",
    "SageSpecAlgo",
    "draft_kind_of",
    "sage_eagle_worker_factory",
    "sage_worker_factory",
    "validate_server_args",
]

logger = logging.getLogger(__name__)

#: Page sizes above 1 with a tree (topk > 1) need SGLang's two-pass cascade draft decode, which only
#: these attention backends implement (the same check SGLang runs for EAGLE/STANDALONE).
_PAGE_TREE_BACKENDS = ("flashinfer", "fa3", "triton")


def draft_kind_of(architectures: list[str] | tuple[str, ...]) -> str:
    """``"eagle3"``, ``"eagle"`` or ``"standalone"`` from a draft config's ``architectures``.

    >>> draft_kind_of(["LlamaForCausalLMEagle3"]), draft_kind_of(["Qwen2ForCausalLMEagle"])
    ('eagle3', 'eagle')
    >>> draft_kind_of(["LlamaForCausalLM"])
    'standalone'
    """
    names = [a.lower() for a in architectures or ()]
    if any("eagle3" in a for a in names):
        return "eagle3"
    if any("eagle" in a for a in names):
        return "eagle"
    return "standalone"


def _draft_config(path: str, revision: str | None) -> dict[str, Any] | None:
    """The ``config.json`` of a draft checkpoint (local directory, else the HF cache or hub); None if unknown."""
    local = Path(path).expanduser()
    try:
        if local.exists():
            cfg = json.loads((local / "config.json").read_text())
        else:
            from huggingface_hub import hf_hub_download

            cfg = json.loads(Path(hf_hub_download(path, "config.json", revision=revision)).read_text())
    except Exception as exc:  # noqa: BLE001 (no config reachable: the caller decides)
        logger.debug("draft config of %s not readable: %s", path, exc)
        return None
    return cfg


def _check_eagle3_head(draft: str, draft_cfg: dict, server_args: Any) -> None:
    """Refuse an EAGLE-3 head that does not fit the target (width, vocabulary, its ``d2t`` map, captured layers)."""
    target_cfg = _draft_config(str(server_args.model_path), getattr(server_args, "revision", None))
    if target_cfg is None:
        return
    target_cfg = target_cfg.get("text_config", target_cfg)  # a VLM's language model
    d2t = None
    weights = Path(draft).expanduser() / "model.safetensors"
    if weights.is_file():
        from safetensors import safe_open

        with safe_open(str(weights), "pt") as f:
            d2t = f.get_tensor("d2t") if "d2t" in f.keys() else None
    try:
        check_eagle3_config(draft_cfg, target_cfg, d2t, where=f"--speculative-draft-model-path {draft}")
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def validate_server_args(server_args: Any) -> None:
    """SGLang's ``validate_server_args`` callback: reject a SAGE launch SAGE cannot run, before it starts.

    Runs in the launcher, before :meth:`SageSpecAlgo.handle_server_args`, on the operator's input (so
    topk, steps and draft tokens are ``None`` unless given).  An exception here aborts
    ``python -m sglang.launch_server`` with exit code 1 and its message, with no process left behind.

    Raises:
        ConfigError: a bad ``--sage-*`` value, a value the SGLang worker does not honour
            (:data:`.support.SGLANG_SUPPORT`), an explicit SGLang draft size SAGE cannot use, no draft model, or a
            multimodal draft.
    """
    cfg = sage_config_of(server_args)
    SGLANG_SUPPORT.check(cfg, name=flag_name)
    spec_sizes(
        cfg,
        topk=server_args.speculative_eagle_topk,
        num_steps=server_args.speculative_num_steps,
        num_draft_tokens=server_args.speculative_num_draft_tokens,
    )
    draft = server_args.speculative_draft_model_path
    if draft is None:
        raise ConfigError(
            "--speculative-algorithm sage needs --speculative-draft-model-path: a separate draft model "
            "(STANDALONE-style) or an EAGLE/EAGLE3 head"
        )
    name = str(server_args.speculative_algorithm).upper()
    draft_cfg = _draft_config(str(draft), server_args.speculative_draft_model_revision)
    if draft_cfg is not None and "vision_config" in draft_cfg:
        raise ConfigError(
            f"--speculative-draft-model-path {draft}: a multimodal draft (its config has a vision_config); SGLang "
            "0.5.23 shifts a draft's prefill ids by one token but places the image embeddings by the unshifted "
            "positions (its own STANDALONE fails the same way at the first image), so use a text draft: image "
            'positions read as a placeholder token (docs/user-guide/serving-sglang.md, "VLMs")'
        )
    archs = None if draft_cfg is None else list(draft_cfg.get("architectures") or [])
    if archs is None:  # an explicit variant is taken as given
        if name == "SAGE":
            raise ConfigError(
                f"--speculative-draft-model-path {draft}: no config.json readable, so SAGE cannot tell a "
                "standalone draft from an EAGLE head; pass --speculative-algorithm sage_eagle or sage_eagle3 "
                "for a head (sage itself means a standalone draft once the config is reachable)"
            )
    else:
        kind = draft_kind_of(archs)
        if kind == "eagle3":
            _check_eagle3_head(str(draft), draft_cfg, server_args)
        want = VARIANTS[kind]
        if name == "SAGE" and want != name:
            server_args.speculative_algorithm = want  # declared by SGLang's recorder, read by every process
            logger.info("SAGE: %s is an %s draft head: running as %s", draft, kind.upper(), want)
        elif name != want:
            raise ConfigError(
                f"--speculative-algorithm {name.lower()} does not match the draft {draft} ({', '.join(archs)}: "
                f"{kind}); use --speculative-algorithm sage (it picks {want.lower()})"
            )
    for name, instead in SGLANG_SUPPORT.defaults_not_applied().items():
        logger.info("SAGE: %s keeps its default, which SGLang does not apply: %s", flag_name(name), instead)
    defaults = SageConfig().to_dict()
    changed = {k: v for k, v in cfg.to_dict().items() if v != defaults[k]}
    logger.info("SAGE config: defaults%s", "" if not changed else f" with {changed}")


class SageSpecAlgo(CustomSpecAlgo):
    """The ``SAGE`` speculative algorithm as SGLang's scheduler, workers and resolution see it.

    Predicates mirror ``SpeculativeAlgorithm.STANDALONE`` (a separate draft model, EAGLE's tree
    verify).  Registered with ``supports_overlap=True``: SGLang's overlap scheduler runs the SAGE worker (its
    feedback a step late, matched to its step in launch order); :meth:`handle_server_args` turns it off on CPU
    unless ``cpu_overlap``.
    """

    #: the built-in algorithm whose plumbing this variant takes (see the module table)
    MIRRORS = "STANDALONE"

    def is_standalone(self) -> bool:
        return True

    def supports_mixed_chunk(self) -> bool:
        return False

    def need_topk(self) -> bool:
        return True

    def supports_grammar_overlap(self) -> bool:
        # STANDALONE's answer: the EAGLE V2 verify path (grammar barrier included) is kept.
        return True

    def carries_draft_hidden_states(self) -> bool:
        return False

    def get_platform_worker_cls(self) -> type | None:
        return None

    def create_future_map(
        self,
        device: torch.device,
        req_to_token_pool: Any,
        needs_cpu_seq_lens: bool = True,
        needs_confidence_relay: bool = False,
    ) -> FutureMap:
        from sglang.srt.managers.overlap_utils import FutureMap

        return FutureMap(device, self, req_to_token_pool, needs_cpu_seq_lens, needs_confidence_relay)

    def resolve_max_speculative_num_draft_tokens(self, server_args: Any) -> int | None:
        """The KV slots one request may take per decode step under any tier (SGLang reserves this bound).

        SGLang sizes each decode step's KV reservation from the live step count and this bound, before the worker
        picks the step's tier: with tiers the bound is the largest ``max(steps * topk, draft_tokens)`` over them,
        so a deeper tier never runs on a reservation made for a shallower one.
        """
        from sglang.srt.arg_groups.overrides import resolving_view

        view = resolving_view(server_args)
        n = view.speculative_num_draft_tokens
        cfg = sage_config_of(server_args)
        if n is None or not cfg.serving.tiers:
            return n
        sizes = SpecSizes(view.speculative_eagle_topk, view.speculative_num_steps, n, parse_tiers(cfg.serving.tiers))
        return max(n, sizes.max_alloc_per_decode)

    def handle_server_args(self, server_args: Any) -> None:
        """Derive SGLang's draft sizes from the SageConfig; disable overlap and mixed chunks.

        ``server_args`` is SGLang's recording stand-in: read through the resolving view, write with plain
        attribute assignments (SGLang declares them as this algorithm's resolution).

        * ``speculative_eagle_topk / num_steps / num_draft_tokens``: explicit SGLang flags win, unset ones
          come from :func:`.args.spec_sizes` (topk = k capped at 10, steps = the deepest tree level,
          draft tokens = the node budget + 1);
        * with ``--sage-tiers``: steps and draft tokens are the largest tier's (the worker builds the others);
        * ``max_running_requests`` defaults to 48, as for EAGLE/STANDALONE;
        * ``disable_overlap_schedule``: on for a CPU server unless ``cpu_overlap`` (measured slower there; hook 11
          gives the overlap path its CPU gather), as given elsewhere;
        * ``enable_mixed_chunk``: off (STANDALONE does not support it either).
        """
        cfg = sage_config_of(server_args)
        sizes = spec_sizes(
            cfg,
            topk=server_args.speculative_eagle_topk,
            num_steps=server_args.speculative_num_steps,
            num_draft_tokens=server_args.speculative_num_draft_tokens,
        )
        if server_args.speculative_eagle_topk is None:
            server_args.speculative_eagle_topk = sizes.topk
        if server_args.speculative_num_steps is None:
            server_args.speculative_num_steps = sizes.num_steps
        if server_args.speculative_num_draft_tokens is None:
            server_args.speculative_num_draft_tokens = sizes.num_draft_tokens
        logger.info(
            "SAGE draft sizes: --speculative-eagle-topk %d --speculative-num-steps %d --speculative-num-draft-tokens %d%s",
            sizes.topk,
            sizes.num_steps,
            sizes.num_draft_tokens,
            f"; tiers {[[t.steps, t.draft_tokens] for t in sizes.tiers]}" if sizes.tiers else "",
        )
        if server_args.max_running_requests is None:
            server_args.max_running_requests = 48
        if not server_args.disable_overlap_schedule and server_args.device == "cpu" and not cfg.cpu.cpu_overlap:
            server_args.disable_overlap_schedule = True
            logger.info("SAGE: overlap scheduling off on CPU (--sage-cpu-overlap true keeps it on)")
        if server_args.enable_mixed_chunk:
            server_args.enable_mixed_chunk = False
            logger.warning("SAGE: mixed chunked prefill disabled (not supported by the SAGE worker)")
        page_size = server_args.page_size
        if sizes.topk > 1 and page_size is not None and page_size > 1:
            backend = server_args.attention_backend
            if backend not in _PAGE_TREE_BACKENDS:
                raise ConfigError(
                    f"--page-size > 1 with --speculative-algorithm sage (a tree, topk {sizes.topk}) needs "
                    f"--attention-backend in {_PAGE_TREE_BACKENDS}; got page size {page_size} and {backend!r}"
                )


class SageEagleSpecAlgo(SageSpecAlgo):
    """``SAGE_EAGLE``: SAGE over an EAGLE head (target hidden states in; the target's embeddings and lm_head)."""

    MIRRORS = "EAGLE"

    def is_standalone(self) -> bool:
        return False

    def is_eagle(self) -> bool:
        return True

    def carries_draft_hidden_states(self) -> bool:
        return True


class SageEagle3SpecAlgo(SageEagleSpecAlgo):
    """``SAGE_EAGLE3``: SAGE over an EAGLE3 head (the target captures three layers' hidden states for it)."""

    MIRRORS = "EAGLE3"

    def is_eagle3(self) -> bool:
        return True


def sage_worker_factory(server_args: Any) -> type:
    """SGLang's worker factory for ``SAGE``: :class:`.worker.SageWorkerV2` (imported on first use)."""
    from .worker import SageWorkerV2

    return SageWorkerV2


def sage_eagle_worker_factory(server_args: Any) -> type:
    """SGLang's worker factory for ``SAGE_EAGLE``/``SAGE_EAGLE3``: :class:`.worker.SageEagleWorkerV2`."""
    from .worker import SageEagleWorkerV2

    return SageEagleWorkerV2


#: draft kind -> registered algorithm name
VARIANTS = {"standalone": "SAGE", "eagle": "SAGE_EAGLE", "eagle3": "SAGE_EAGLE3"}
#: registered name -> (spec class, worker factory)
REGISTRATIONS = {
    "SAGE": (SageSpecAlgo, sage_worker_factory),
    "SAGE_EAGLE": (SageEagleSpecAlgo, sage_eagle_worker_factory),
    "SAGE_EAGLE3": (SageEagle3SpecAlgo, sage_eagle_worker_factory),
}
