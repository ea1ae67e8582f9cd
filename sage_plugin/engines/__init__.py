"""Consumers of the SAGE core that run real models.

* :mod:`.kv` / :mod:`.lm` / :mod:`.speculative`: the reference speculative-decoding engine
  on HF transformers (ragged batches, tree masks, in-place KV commit).
* :mod:`.vlm`: VLM engine models (Qwen2-VL / Qwen2.5-VL M-RoPE, LLaVA-OneVision, SmolVLM), SpecVLM
  draft-side visual-token pruning and the offline demo VLM builders.
"""
