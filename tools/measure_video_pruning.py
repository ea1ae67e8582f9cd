"""Draft-side visual-token pruning (SpecVLM's, which SAGE runs with) on video prompts, in the reference engine: what
each pruning ratio saves in the draft's prefill and what it costs in acceptance.

The target is the demo Qwen2.5-VL on the real SmolLM2 (``ensure_qwen_vl_smollm2("qwen2_5_vl")``); the draft is the
same architecture on SmolLM2's first ``--draft-layers`` layers (``ensure_qwen_vl_draft``, untrained as a draft), a
VLM draft that sees the video.  For each ratio in ``--ratios`` the draft prunes that share of the video's tokens from
its prefill (SpecVLM's two stages, scored by the target's text-to-visual attention) and SAGE decodes the bundled
video prompts greedily; the draft's prefills are timed apart from the rest.  Printed per ratio: video tokens the
draft kept, draft prefill ms a request, accepted drafts a round (tau, bonus excluded), target forwards, and whether
every output equals the unpruned run's (it must: the target verifies everything)::

    .venv/bin/python tools/measure_video_pruning.py --ratios 0,0.5,0.8,0.9 --max-new-tokens 64 --repeats 3

A measurement tool: nothing in the package imports it.  Each ratio's prefills run ``--repeats`` times and the
median is printed (the first run of a shape pays one-off costs).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch


def main(argv: list[str] | None = None) -> int:
    from sage_plugin.config import AlgorithmConfig
    from sage_plugin.core.policies import build_policy
    from sage_plugin.data.prompts import load_prompts
    from sage_plugin.engines.speculative import SamplingParams, SpecEngine
    from sage_plugin.engines.vlm import (
        VLMModel,
        ensure_qwen_vl_draft,
        ensure_qwen_vl_smollm2,
        load_vlm,
        make_vlm_request,
    )

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ratios", default="0,0.5,0.8,0.9")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--draft-layers", type=int, default=4)
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    target_dir, _ = ensure_qwen_vl_smollm2("qwen2_5_vl")
    target, processor = load_vlm(target_dir)
    draft_model, _ = load_vlm(ensure_qwen_vl_draft("qwen2_5_vl", layers=args.draft_layers))
    target_model = VLMModel(target, processor)
    prompts = load_prompts("vlm-video")
    params = SamplingParams(max_new_tokens=args.max_new_tokens, stop_token_ids=(processor.tokenizer.eos_token_id,))
    policy = build_policy(AlgorithmConfig(node_budget="fixed"))
    rows, reference = [], None
    for ratio in [float(r) for r in args.ratios.split(",")]:
        draft = VLMModel(draft_model, processor, role="draft", prune_ratio_video=ratio)
        timed, kept = [], []
        prefill = draft.prefill

        def timed_prefill(request, prefill=prefill, timed=timed, kept=kept, draft=draft):
            t = time.perf_counter()
            out = prefill(request)
            timed.append(time.perf_counter() - t)
            info = draft.last_prefill_info
            kept.append(info["n_visual"] - info["n_dropped"])
            return out

        draft.prefill = timed_prefill
        engine = SpecEngine(target_model, draft)
        per_repeat = []
        for _ in range(args.repeats):
            timed.clear()
            outs = engine.generate([make_vlm_request(processor, p) for p in prompts], params, policy)
            per_repeat.append(1e3 * statistics.fmean(timed))
        tokens = [o.tokens for o in outs]
        reference = tokens if reference is None else reference
        rounds = [r for o in outs for r in o.rounds]
        rows.append((ratio, statistics.fmean(kept), statistics.median(per_repeat),
                     sum(r.tau for r in rounds) / max(1, len(rounds)), sum(o.target_forwards for o in outs),
                     tokens == reference))  # fmt: skip
    n_vis = draft.last_prefill_info["n_visual"]
    print(f"{len(prompts)} video prompts ({n_vis} video tokens each), {args.max_new_tokens} new tokens, SAGE, greedy")
    print("| prune ratio | video tokens kept | draft prefill ms | accepted/round | target forwards | identical |")
    print("|---:|---:|---:|---:|---:|:---:|")
    for ratio, kept_mean, ms, tau, fwd, same in rows:
        print(f"| {ratio:.2f} | {kept_mean:.1f} | {ms:.1f} | {tau:.2f} | {fwd} | {'yes' if same else 'NO'} |")
    return 0 if all(r[-1] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
