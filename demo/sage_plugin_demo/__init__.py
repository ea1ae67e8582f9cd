"""The CPU demo's weights and data for ``sage-plugin``, apart from the plugin so a GPU server's install stays lean.

Contents (sources and licences: ``data/SOURCES.md`` and each draft's ``README.md``):

* ``drafts/smollm2-draft``: the trained 4-layer draft of SmolLM2-135M-Instruct (safetensors, fp16);
* ``drafts/smollm2-eagle3``: the trained EAGLE-3 head for the same target;
* ``data/prompts``: MT-Bench, GSM8K, HumanEval and the out-of-domain set; ``data/vlm``: images, clips and questions.

``sage setup`` installs this distribution from a checkout's ``demo/`` folder; the plugin finds it through
``sage_plugin.demo_assets`` and never imports anything from here but :data:`ROOT`.
"""

from pathlib import Path

#: the folder holding ``drafts/`` and ``data/``
ROOT = Path(__file__).resolve().parent
