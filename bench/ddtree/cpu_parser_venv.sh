#!/usr/bin/env bash
# A CPU-only venv in which sglang 0.5.13's own argument parser runs: what
# `python -m tools.engine_flags generate VENV/bin/python [--patch-set NAME]` needs to write
# files/engine_flags/sglang-0.5.13*.json. Not a serving venv (that is the stack sglang-0.5.13-cu130).
#
#   bash bench/ddtree/cpu_parser_venv.sh VENV SGLANG_WHEEL
#
# SGLANG_WHEEL: sglang 0.5.13 for this machine's Python (pip download sglang==0.5.13 --no-deps -d DIR).
# The lab's CPU stack (lab-cpu-sglang, from lab/cache/wheelhouse: `make wheelhouse`) gives torch 2.13.0+cpu
# and the small packages a parser needs; transformers 5.8.1 (0.5.13's pin) and four more come from PyPI.
# sglang 0.5.13 imports torchvision on the way to its parser, and PyPI has no CPU torchvision (its wheels
# link libtorch_cuda: "operator torchvision::nms does not exist" beside a CPU torch), so the venv gets the
# lab's torchvision stand-in (lab/standin_torchvision: its names import, every one refuses to run).
set -euo pipefail
VENV=${1:?usage: cpu_parser_venv.sh VENV SGLANG_WHEEL}
WHEEL=${2:?usage: cpu_parser_venv.sh VENV SGLANG_WHEEL}
HERE=$(cd "$(dirname "$0")/../.." && pwd)
WHEELHOUSE=$HERE/lab/cache/wheelhouse
STACK=$HERE/files/stacks/lab-cpu-sglang.yml

python3 -m venv "$VENV"
mapfile -t LAB < <(grep -E '^  [a-z0-9-]+: \{' "$STACK" | grep -vE '^  (sglang|sglang-standin|sglang-kernel):' \
    | sed -E 's/.*file: "([^"]+)".*/\1/' | sed "s#^#$WHEELHOUSE/#")
"$VENV/bin/pip" install -q --no-deps --no-index "${LAB[@]}"
"$VENV/bin/pip" install -q transformers==5.8.1 openai==2.6.1 partial-json-parser==0.2.1.1.post7 \
    sympy==1.14.0 dill==0.4.1 sentencepiece==0.2.1
"$VENV/bin/pip" install -q --no-deps "$WHEEL"
STANDIN_DIR=$(mktemp -d)
python3 "$HERE/lab/standin_torchvision/build.py" "$STANDIN_DIR" >/dev/null
"$VENV/bin/pip" install -q --no-deps --no-index "$STANDIN_DIR"/torchvision-*.whl
rm -rf "$STANDIN_DIR"
cd / && CUDA_VISIBLE_DEVICES= "$VENV/bin/python" -c \
    'import argparse; from sglang.srt.server_args import ServerArgs; p = argparse.ArgumentParser(); ServerArgs.add_cli_args(p); print("parser ok:", len(p._actions), "actions")'
