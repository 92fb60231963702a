#!/usr/bin/env bash
# Build the DDTree patch set for sglang 0.5.13 from sglang PR #27509, as README "Stacks and patch sets" says:
# the PR's change (its base commit to its last commit, in the fork HaiyuZhou/sglang) three-way merged into
# sglang 0.5.13's own files by `python -m tools.patchset_build`. The DDTree source is the operator's input,
# not the project's: this fetches it and builds into files/patches/ddtree-0_5_13/ (ignored by git); what is
# committed is this script, the manifest it must reproduce (bench/ddtree/ddtree-0_5_13.patchset.yml) and
# the results (bench/results/ddtree-0.5.13-port-*.txt).
#
#   bash bench/ddtree/build_patchset.sh [FORK_CLONE] [WHEEL_DIR]
#
# FORK_CLONE: a clone of https://github.com/HaiyuZhou/sglang (bare or not) holding both commits; without it,
#   one is cloned (blobless) into ~/.cache/sglang-deploy/HaiyuZhou-sglang.git.
# WHEEL_DIR: where the sglang 0.5.13 cp312 wheel is, or is downloaded to (checked against the stack's sha256).
set -euo pipefail
HERE=$(cd "$(dirname "$0")/../.." && pwd)
cd "$HERE"
PY=${PYTHON:-$HERE/.venv/bin/python}
BASE=eab2e02fa0c49595098a715d331cb9ba10692c63   # upstream main, 2026-06-07: the PR's base
CHANGE=ad7ab160cbb37c2a537c3179439d2e4f3177bb46 # the PR's second (last) commit
NAME=ddtree-0_5_13
FORK=${1:-$HOME/.cache/sglang-deploy/HaiyuZhou-sglang.git}
WHEELS=${2:-$HOME/.cache/sglang-deploy/wheels}

if ! git -C "$FORK" cat-file -e "$CHANGE^{commit}" 2>/dev/null; then
    [ -n "${1:-}" ] && { echo "build_patchset: $FORK lacks commit $CHANGE" >&2; exit 1; }
    mkdir -p "$(dirname "$FORK")"
    git clone --bare --filter=blob:none https://github.com/HaiyuZhou/sglang "$FORK"
fi

# The release's own files: the stack's pinned wheel, sha256-checked.
read -r FILE SHA < <("$PY" -c 'from configuration.stacks import load_stack
p = next(p for p in load_stack("sglang-0.5.13-cu130").packages if p.name == "sglang"); print(p.file, p.sha256)')
mkdir -p "$WHEELS"
if [ ! -f "$WHEELS/$FILE" ]; then
    PIP_CONFIG_FILE=/dev/null PIP_FIND_LINKS= PIP_EXTRA_INDEX_URL= pip download --quiet sglang==0.5.13 --no-deps \
        --only-binary=:all: --python-version 3.12 --implementation cp --abi cp312 \
        --platform manylinux_2_34_x86_64 --index-url https://pypi.org/simple -d "$WHEELS"
fi
echo "$SHA  $WHEELS/$FILE" | sha256sum --check --quiet

"$PY" -m tools.patchset_build "$NAME" --base sglang==0.5.13 --pristine "$WHEELS/$FILE" \
    --git "$FORK" --change-base "$BASE" --change "$CHANGE" --change-root python \
    --fix bench/ddtree/fixes/ddtree-verify-width.patch --fix bench/ddtree/fixes/ddtree-triton-tree-mask.patch \
    --attention-backend triton --force
# The same inputs must give the committed manifest, byte for byte.
diff -u bench/ddtree/$NAME.patchset.yml "files/patches/$NAME/patchset.yml"
echo "manifest: files/patches/$NAME/patchset.yml is bench/ddtree/$NAME.patchset.yml"
"$PY" bench/ddtree/check_imports.py "files/patches/$NAME" "$WHEELS/$FILE"
