"""TensorRT-LLM adapter for SAGE: a drafter (1.2.x) and a dynamic-tree node policy (main), plus a launcher.

TensorRT-LLM is imported only by :mod:`.installed` (which checks the recorded contract there); every other module
imports without it, so the tests run on any machine.  ``docs/design/trtllm.md`` describes what runs where.

Modules:

* :mod:`.contract`: the recorded TensorRT-LLM interfaces (pinned versions, signatures, request and config fields,
  the executor's call order) and :func:`~.contract.check_installed_contract`;
* :mod:`.installed`: the one import of ``tensorrt_llm``;
* :mod:`.drafter`: :class:`~.drafter.SageChainDrafter` (SAGE's chain per request) and the ``Drafter`` subclass;
* :mod:`.runner`: the draft model (any HF causal LM) with its own KV cache per request;
* :mod:`.dynamic_tree`: SAGE's node choice in the EAGLE-3 dynamic-tree worker (class-attribute patch);
* :mod:`.support`: which SageConfig fields each tier honours;
* :mod:`.config`, :mod:`.serve`: the ``sage trtllm-serve`` launch file and launcher.
"""
