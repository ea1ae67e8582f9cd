"""The plugin's CPU kernels, each a PyTorch custom op in the ``sage_plugin`` namespace with its torch path beside it.

Decoding and verification on a CPU run the same few-row products and small attention calls thousands of times;
these kernels take those paths (``docs/design/architecture.md``, "The CPU kernels: why they exist").  Each module
holds one kernel's loader, the fake kernels that let ``torch.compile`` and ``FakeTensorMode`` trace its ops, the rule
of when it runs, and the torch path taken where it does not (or where it cannot be built):

* :mod:`.linear`: ``rows_linear``, a linear layer at 1-64 rows (the rows kernel; weight-major or ``F.linear``
  otherwise);
* :mod:`.paged_attention`: ``paged_attention``, attention read in place from a paged K/V cache (the SGLang CPU ops;
  gather and :mod:`.attention`'s folded SDPA otherwise);
* :mod:`.attention`: grouped-query SDPA with each KV head's query heads folded into its rows (torch only);
* :mod:`.llama_decoder`: ``llama_decoder`` / ``llama_layer_before`` / ``llama_layer_after``, a Llama-family draft's
  decoder in one call (each runtime's own layers otherwise);
* :mod:`.beam_level`: ``beam_level`` / ``level_pays``, one level of SAGE's beam pool (the algorithm core calls them by
  name and keeps its operator path otherwise);
* :mod:`.spec_cache`: the speculative step's per-step index ops (``assign_req_to_token_pool`` ..., the EAGLE tree
  build, ``verify_tree_greedy``), one loop over the batch each (SGLang's CPU ops in ``runtimes/sglang/cpu_ops`` call
  them, their torch paths otherwise).

:mod:`.native` is the one loader and builder (``sage setup`` builds every library ahead); ``csrc/`` holds the sources
(``simd.h`` the vector type and fixed-order lane sums, ``rows_kernel.h`` the rows kernel shared by ``rows_linear.cpp``
and ``llama_decoder.cpp``).  Nothing here imports the rest of the package: torch and the standard library only.
"""
