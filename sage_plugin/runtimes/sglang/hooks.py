"""The only place SAGE patches SGLang: four ``HookRegistry`` AROUND hooks (flags, verified-node choice, metrics).

SGLang 0.5.23 has no API for plugin-owned command-line flags (``patches/SGLANG_PLUGIN_RESEARCH.md`` §2a),
so the plugin wraps the two functions of its parse path.  Each hook has an entry in ``patches/INDEX.md``;
``tests/integration/sglang/test_hook_targets.py`` checks that the targets still exist.

* :func:`add_cli_args` (AROUND ``ServerArgs.add_cli_args``, a staticmethod): after SGLang's own flags,
  adds the SAGE argument group (:func:`.args.add_sage_arguments`).  ``launch_server --help`` lists it,
  and SGLang's ``--config`` YAML accepts the same keys (``sage-w-max: 6``).
* :func:`from_cli_args` (AROUND ``ServerArgs.from_cli_args``, a classmethod): after SGLang builds its
  record, stores the SAGE flags on it as ``_sage_cli`` (a :class:`.args.SageCliArgs`).  ``ServerArgs``
  accepts underscore non-field attributes as bookkeeping, pickles them, and restores them in the
  spawned scheduler processes, so the record carries the flags everywhere SGLang sends it
  (``validate_server_args``, ``handle_server_args``, the worker factory).  Read them back with
  :func:`sage_cli_of`.

* :func:`organize_draft_results` (AROUND ``sglang.srt.speculative.eagle_utils.organize_draft_results``): when a
  SAGE draft worker is drafting (:data:`ACTIVE_SELECTION` is set), the verified nodes are SAGE's choice
  (:class:`.worker.BeamSelection`); otherwise SGLang's own top-N.  ``HookRegistry`` also rebinds the copy
  ``eagle_worker_v2`` imported, which is the one the draft step calls.

* :func:`add_speculative_state` (AROUND ``SchedulerInternalStateController._add_speculative``): adds a ``"sage"``
  section to each scheduler's state in ``GET /server_info`` (``internal_states``): the SAGE worker's counters
  (mean alpha / D / W / shaped nodes / accept length, lagged one step) and the KV pool's free and evictable
  token counts.

Hooks are registered by :func:`install_hooks` (from ``register()``) and applied by SGLang's
``load_plugins()`` after every plugin ran.  Hook functions here import nothing from SGLang.
"""

from __future__ import annotations

import argparse
import logging
from contextvars import ContextVar
from typing import Any, Callable

from .args import SageCliArgs, add_sage_arguments

__all__ = [
    "ACTIVE_SELECTION",
    "HOOK_TARGETS",
    "STASH_ATTR",
    "add_cli_args",
    "from_cli_args",
    "install_hooks",
    "organize_draft_results",
    "add_speculative_state",
    "sage_cli_of",
]

logger = logging.getLogger(__name__)

ADD_CLI_ARGS = "sglang.srt.server_args.ServerArgs.add_cli_args"
FROM_CLI_ARGS = "sglang.srt.server_args.ServerArgs.from_cli_args"
ORGANIZE_DRAFT_RESULTS = "sglang.srt.speculative.eagle_utils.organize_draft_results"
ADD_SPECULATIVE_STATE = (
    "sglang.srt.managers.scheduler_components.internal_state.SchedulerInternalStateController._add_speculative"
)

#: The SAGE selection of the draft step in progress (set by ``SageDraftWorker.draft``), else None.
ACTIVE_SELECTION: ContextVar[Callable[..., Any] | None] = ContextVar("sage_active_selection", default=None)

#: Name of the bookkeeping attribute on SGLang's ``ServerArgs`` record that carries the SAGE flags.
STASH_ATTR = "_sage_cli"


def add_cli_args(original: Callable[[argparse.ArgumentParser], None], parser: argparse.ArgumentParser) -> None:
    """AROUND ``ServerArgs.add_cli_args(parser)``: SGLang's flags, then the ``--sage-*`` group."""
    original(parser)
    add_sage_arguments(parser)


def from_cli_args(original: Callable[..., Any], cls: type, args: argparse.Namespace) -> Any:
    """AROUND ``ServerArgs.from_cli_args(cls, args)``: SGLang's record, with the SAGE flags stored on it."""
    record = original(cls, args)
    cli = SageCliArgs.from_namespace(args)
    setattr(record, STASH_ATTR, cli)
    algorithm = getattr(args, "speculative_algorithm", None)
    if cli.given and (algorithm or "").upper() != "SAGE":
        logger.warning("--sage-* flags are ignored: --speculative-algorithm is %s, not sage", algorithm)
    return record


def sage_cli_of(server_args: Any) -> SageCliArgs | None:
    """The SAGE flags a ``ServerArgs`` record (or SGLang's resolution stand-in) carries; ``None`` if it has none.

    A record built without SGLang's parser (``Engine(**kwargs)``) has none: SAGE then uses the defaults.
    """
    return getattr(server_args, STASH_ATTR, None)


def organize_draft_results(original: Callable[..., Any], score_list, token_list, parents_list, num_draft_token):
    """AROUND ``organize_draft_results``: SAGE's verified nodes while a SAGE draft worker drafts, else SGLang's."""
    selection = ACTIVE_SELECTION.get()
    if selection is None:
        return original(score_list, token_list, parents_list, num_draft_token)
    return selection(score_list, token_list, parents_list, num_draft_token)


def add_speculative_state(original: Callable[..., Any], self: Any, state: dict) -> None:
    """AROUND ``_add_speculative(self, state)``: SGLang's speculative fields, then ``state["sage"]``."""
    original(self, state)
    scheduler = self.scheduler
    draft = getattr(getattr(scheduler, "draft_worker", None), "_draft_worker", None)
    if draft is None or not hasattr(draft, "sage_stats"):
        return
    section = dict(draft.sage_stats())
    section["kv_available_tokens"] = int(scheduler.token_to_kv_pool_allocator.available_size())
    section["kv_evictable_tokens"] = int(scheduler.tree_cache.evictable_size())
    state["sage"] = section


#: (target, hook) pairs, all AROUND; the targets are listed in patches/INDEX.md.
HOOKS: tuple[tuple[str, Callable[..., Any]], ...] = (
    (ADD_CLI_ARGS, add_cli_args),
    (FROM_CLI_ARGS, from_cli_args),
    (ORGANIZE_DRAFT_RESULTS, organize_draft_results),
    (ADD_SPECULATIVE_STATE, add_speculative_state),
)
HOOK_TARGETS: tuple[str, ...] = tuple(target for target, _ in HOOKS)


def install_hooks() -> int:
    """Register every hook in :data:`HOOKS` with SGLang's ``HookRegistry`` once; return how many were new.

    Idempotent: a hook already registered for its target (an earlier call, or an earlier copy of this
    module) is skipped, because ``HookRegistry`` would otherwise wrap the target twice and
    ``add_cli_args`` would add every flag twice (an argparse conflict).
    """
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    added = 0
    for target, hook in HOOKS:
        existing = HookRegistry._hooks.get(target, ())  # private, 0.5.23: no public "is registered" query
        if any(_same_function(registered, hook) for _, registered, _ in existing):
            continue
        HookRegistry.register(target, hook, HookType.AROUND)
        added += 1
    return added


def _same_function(a: Any, b: Callable[..., Any]) -> bool:
    return a is b or (
        getattr(a, "__module__", None) == b.__module__ and getattr(a, "__qualname__", None) == b.__qualname__
    )
