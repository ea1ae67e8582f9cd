"""Request parameters that may turn speculation off for the requests that use them (``opt_out_params``).

Every parameter SAGE serves is exact under speculation; a deployment may still prefer some requests to run without
it (``--sage-opt-out-params``).  Such a request verifies its root only while the rest of its batch speculates.
"""

from __future__ import annotations

__all__ = ["OPT_OUT_PARAMS", "opt_out_names"]

#: request parameters ``opt_out_params`` may name (a request using one runs without speculation)
OPT_OUT_PARAMS = (
    "frequency_penalty",
    "presence_penalty",
    "repetition_penalty",
    "min_new_tokens",
    "logit_bias",
    "json_schema",
    "regex",
    "ebnf",
    "structural_tag",
    "sampling",
)


def opt_out_names(opt_out_params: str) -> tuple[str, ...]:
    """``opt_out_params`` as names.

    >>> opt_out_names("presence_penalty, sampling")
    ('presence_penalty', 'sampling')
    """
    return tuple(p.strip() for p in opt_out_params.split(",") if p.strip())
