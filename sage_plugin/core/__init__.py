"""The runtime-free SAGE algorithm (torch + stdlib only; never imports a runtime).

Glossary (used with these meanings everywhere in the project):

root
    The last token the target produced (the previous round's bonus, or the prefill's token).
    It is not yet in either KV cache; it is node 0 of every draft tree.
node
    A drafted token in a tree, identified by its index in level order (parents first).
frontier
    The nodes of one level whose draft distribution is computed next (one batched draft
    forward per level); they propose the next level's candidates.
depth
    Number of edges from the root (root 0).  ``D`` is the planned depth of a round (Eq. 10).
width
    Candidates kept per parent at a level: ``W`` at level 1 (Eq. 11), decayed ``W_l`` below.
budget
    The node cap of a round (``N_max`` for SAGE, ``total_tokens`` for EAGLE-2).
alpha
    Confidence ``1 - H(top-k renormalised draft probs) / log k`` (Eq. 9), in ``[0, 1]``.
accepted
    Draft nodes on the path the target agrees with (greedy: its argmax; sampling: its draw).
    ``tau`` = number of accepted draft tokens of a round, the bonus excluded.
bonus
    The target's own token after the last accepted node; it becomes the next root.
emitted
    The tokens a round appends to the output: the accepted draft tokens, then the bonus.

Modules (``docs/design/architecture.md`` maps each rule to its function and oracle): :mod:`.entropy` (Eq. 7-9),
:mod:`.tree` (layout, ancestor masks, rank-path codes, tree_choices), :mod:`.level_expansion` (the pool / frontier
machinery), :mod:`.shape` (the SAGE shape rules, Eq. 9-12), :mod:`.controller` (history), :mod:`.policy` (the
``TreePolicy`` interface), :mod:`.baselines` and :mod:`.sage` (the policies), :mod:`.policies` (their registry),
:mod:`.planned_topology` (the planned topology), :mod:`.cost` (the device-sized budget), :mod:`.beam_selection`
(selection in a fixed beam), :mod:`.filters` (top-k / top-p / min-p), :mod:`.verify` (greedy, lossless sampling).
The naive per-request oracles of these rules live with the tests (``tests/oracles/``).
"""
