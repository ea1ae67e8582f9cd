"""The policy registry: ``policy`` names to tree-policy classes, looked up here and nowhere else.

==========  ==========================================  ===========================
name        class                                        what it builds
==========  ==========================================  ===========================
``sage``    :class:`~sage_plugin.core.sage.SagePolicy`  entropy-shaped trees (SAGE)
``eagle2``  :class:`~.baselines.Eagle2Policy`           EAGLE-2 expand + rerank
``static``  :class:`~.baselines.StaticPolicy`           a fixed rank-path tree
``chain``   :class:`~.baselines.ChainPolicy`            the draft's top-1 chain
``topn``    :class:`~.baselines.TopNPolicy`             OPT-Tree's greedy top-N tree
==========  ==========================================  ===========================

:class:`~sage_plugin.config.AlgorithmConfig` validates ``policy`` against :data:`POLICIES` and reads each class's sizes
(``max_depth_for`` / ``max_nodes_for``), so a new policy is one class and one entry here.  The interface and the
driving loop are in :mod:`.policy`.
"""

from __future__ import annotations

from .baselines import ChainPolicy, Eagle2Policy, StaticPolicy, TopNPolicy
from .params import SageParams
from .policy import FixedShapePolicy, PolicyState, RoundPlan, TreePolicy
from .sage import SagePolicy

__all__ = [
    "POLICIES",
    "ChainPolicy",
    "Eagle2Policy",
    "PolicyState",
    "RoundPlan",
    "SagePolicy",
    "StaticPolicy",
    "TopNPolicy",
    "TreePolicy",
    "build_policy",
    "policy_class",
]

#: name -> policy class (the one registry)
POLICIES: dict[str, type[FixedShapePolicy]] = {
    cls.name: cls for cls in (SagePolicy, Eagle2Policy, StaticPolicy, ChainPolicy, TopNPolicy)
}


def policy_class(name: str) -> type[FixedShapePolicy]:
    """The class registered as ``name`` (KeyError naming the known policies otherwise)."""
    try:
        return POLICIES[name]
    except KeyError:
        raise KeyError(f"unknown tree policy {name!r} (known: {', '.join(POLICIES)})") from None


def build_policy(cfg: SageParams) -> TreePolicy:
    """The policy named by ``cfg.policy``, built for ``cfg``."""
    return policy_class(cfg.policy)(cfg)
