#!/usr/bin/env bash
# Install the `[sglang]` extra (sglang==0.5.23, about 8-11 GB, 3-5 min) into a virtualenv, and on a machine
# without an NVIDIA driver fetch the user-space driver library libcuda.so.1 that the CUDA-built
# `sgl_kernel` links, so that SGLang's CPU path imports (docs/user-guide/serving-sglang.md).
#
#   tools/setup_sglang.sh [VENV] [LIBCUDA_DIR]      defaults: .venv  .sglang-libcuda (git-ignored)
#   source .sglang-libcuda/env.sh                   before `python -m sglang.launch_server --device cpu ...`
#
# Idempotent: re-running only checks what is already there. The libcuda step needs root (or sudo) on
# Debian: it adds a `non-free contrib` sources entry for the Debian mirror already configured, then
# `apt-get download libcuda1 libnvidia-ptxjitcompiler1` and unpacks them with `dpkg -x` (nothing is
# installed system-wide). Set PYTHON to choose the interpreter for a new venv.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
VENV=${1:-.venv}
LIBCUDA_DIR=${2:-.sglang-libcuda}
PY=${PYTHON:-python3}
SGLANG_VERSION=0.5.23
SOURCES_FILE=/etc/apt/sources.list.d/sage-debian-nonfree.sources

log() { printf '[setup_sglang] %s\n' "$*"; }
as_root() { if [ "$(id -u)" = 0 ]; then "$@"; elif command -v sudo >/dev/null; then sudo "$@"; else
    log "needs root for: $*"; exit 1; fi; }

# --- 1. virtualenv + the [sglang] extra --------------------------------------------------------------
if [ ! -x "$VENV/bin/python" ]; then
    if ! "$PY" -m venv "$VENV" 2>/dev/null; then
        # Debian's python3 ships venv/ensurepip separately.
        rm -rf "$VENV"
        as_root apt-get update -qq
        as_root apt-get install -y -qq python3-venv
        "$PY" -m venv "$VENV"
    fi
fi
V=$VENV/bin
installed() {
    "$V/python" -I - "$SGLANG_VERSION" <<'EOF'  # -I: not the repo's own egg-info in cwd
import sys
from importlib.metadata import PackageNotFoundError, version
try:
    ok = version("sglang") == sys.argv[1] and version("sage-plugin")
except PackageNotFoundError:
    ok = False
sys.exit(0 if ok else 1)
EOF
}
if installed; then
    log "sglang==$SGLANG_VERSION and sage-plugin already in $VENV"
else
    log "installing sage-plugin[sglang] (sglang==$SGLANG_VERSION) into $VENV: about 8-11 GB, 3-5 min"
    "$V/python" -m pip install -q --upgrade pip
    # Editable: the plugin's `sglang.srt.plugins` entry point must belong to an installed distribution,
    # since every SGLang process (scheduler, detokenizer) discovers plugins on its own.
    "$V/python" -m pip install -q -e "$REPO[sglang]"
fi

# --- 2. libcuda.so.1 for a machine without an NVIDIA driver --------------------------------------------
LIB_SUBDIR=usr/lib/x86_64-linux-gnu/nvidia/current  # = sage_plugin/runtimes/sglang/cpu_env.py LIBCUDA_SUBDIR
if ldconfig -p 2>/dev/null | grep -q 'libcuda\.so\.1 '; then
    log "system libcuda.so.1 found (NVIDIA driver installed): skipping the Debian library"
    LIB_PATH=""
else
    mkdir -p "$LIBCUDA_DIR"
    LIBCUDA_DIR=$(cd "$LIBCUDA_DIR" && pwd)
    LIB_PATH=$LIBCUDA_DIR/$LIB_SUBDIR
    if [ -e "$LIB_PATH/libcuda.so.1" ] && [ -e "$LIB_PATH/libnvidia-ptxjitcompiler.so.1" ]; then
        log "libcuda already unpacked in $LIB_PATH"
    else
        . /etc/os-release
        if [ "${ID:-}" != debian ] || [ -z "${VERSION_CODENAME:-}" ]; then
            log "the libcuda step supports Debian only (found ${PRETTY_NAME:-unknown}); install an NVIDIA driver's libcuda.so.1 instead"
            exit 1
        fi
        if ! apt-cache policy libcuda1 2>/dev/null | grep -q 'Candidate: [0-9]'; then
            if [ ! -e "$SOURCES_FILE" ]; then
                # The main Debian mirror already configured (deb822 or one-line format), else deb.debian.org.
                MIRROR=$(cat /etc/apt/sources.list.d/*.sources 2>/dev/null \
                    | sed -n 's/^URIs:[[:space:]]*//p' | tr ' ' '\n' | grep -E '/debian/?$' | head -n1 || true)
                [ -n "$MIRROR" ] || MIRROR=$(sed -n 's/^deb[[:space:]]\+\(\[[^]]*\][[:space:]]\+\)\?\([^[:space:]]*\/debian\/\?\)[[:space:]].*/\2/p' \
                    /etc/apt/sources.list 2>/dev/null | head -n1 || true)
                [ -n "$MIRROR" ] || MIRROR=http://deb.debian.org/debian
                log "adding Debian non-free ($MIRROR $VERSION_CODENAME) as $SOURCES_FILE"
                printf 'Types: deb\nURIs: %s\nSuites: %s\nComponents: non-free contrib\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' \
                    "$MIRROR" "$VERSION_CODENAME" | as_root tee "$SOURCES_FILE" >/dev/null
            fi
            as_root apt-get update -qq
        fi
        DEBS=$(mktemp -d)
        trap 'rm -rf "$DEBS"' EXIT
        # apt drops privileges to _apt for downloads; let it write here (else it warns and downloads as root).
        chmod 777 "$DEBS"
        (cd "$DEBS" && as_root apt-get download -qq libcuda1 libnvidia-ptxjitcompiler1)
        for f in "$DEBS"/libcuda1_*.deb "$DEBS"/libnvidia-ptxjitcompiler1_*.deb; do
            log "unpacking $(basename "$f") into $LIBCUDA_DIR"
            dpkg -x "$f" "$LIBCUDA_DIR"
        done
    fi
    printf '# source me: CPU-only SGLang (sgl_kernel links libcuda.so.1)\nexport LD_LIBRARY_PATH=%s${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}\nexport SGLANG_USE_CPU_ENGINE=1\n' \
        "$LIB_PATH" > "$LIBCUDA_DIR/env.sh"
fi

# --- 3. check --------------------------------------------------------------------------------------------
[ -z "$LIB_PATH" ] || export LD_LIBRARY_PATH=$LIB_PATH${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
"$V/python" -W ignore -c 'import sglang, sgl_kernel, torch; print("[setup_sglang] ok: sglang", sglang.__version__, "| torch", torch.__version__, "| cuda available:", torch.cuda.is_available())'
[ -z "$LIB_PATH" ] || log "CPU serving: source $LIBCUDA_DIR/env.sh, then python -m sglang.launch_server --device cpu ... (see docs/user-guide/serving-sglang.md)"
