#!/usr/bin/env bash
# sglang 0.5.13's own prepare_server_args on DDTREE flags, with and without the built patch set, on a CPU:
#
#   bash bench/ddtree/cpu_parser_venv.sh VENV SGLANG_WHEEL   # once
#   bash bench/ddtree/parse_check.sh VENV
#
# The patch set (files/patches/ddtree-0_5_13, bench/ddtree/build_patchset.sh) is laid over a copy of the
# venv's sglang, as `tools.engine_flags generate --patch-set` does; the models are bench/gpu/tiny_models.py's
# (draft block size 4) and a copy of its draft with block size 16 (the Qwen3.6 drafters' 16-token block), so
# that budget 15 is the spine of a 16-token draft (no tree in ad7ab160) and 31 a tree. --device cpu: the parser's
# accelerator check is not what is tested here. The parser needs a few more modules than the flag dump: added here.
set -euo pipefail
VENV=${1:?usage: parse_check.sh VENV}
HERE=$(cd "$(dirname "$0")/../.." && pwd)
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
"$VENV/bin/pip" install -q einops==0.8.2 networkx==3.6.1 compressed-tensors gguf==0.19.0 2>&1 | grep -v 'WARNING\|requires\|incompatible\|resolver' || true
python3 "$HERE/bench/gpu/tiny_models.py" "$WORK/models" >/dev/null
cp -r "$WORK/models/tiny-qwen3-dflash" "$WORK/models/tiny-qwen3-dflash16"
python3 - "$WORK/models/tiny-qwen3-dflash16/config.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1])); c["dflash_config"]["block_size"] = 16; json.dump(c, open(sys.argv[1], "w"), indent=1)
PY
SITE=$("$VENV/bin/python" -c 'import sglang, os; print(os.path.dirname(os.path.dirname(sglang.__file__)))')
mkdir -p "$WORK/patched" && cp -r "$SITE/sglang" "$WORK/patched/"
(cd "$HERE/files/patches/ddtree-0_5_13" && find sglang -type f -name '*.py' -exec cp {} "$WORK/patched/{}" \;)
parse() {  # PYTHONPATH DRAFT BUDGET
    (cd / && CUDA_VISIBLE_DEVICES= PYTHONPATH="$1" "$VENV/bin/python" - "$WORK/models" "$2" "$3" 2>&1 <<'PY'
import sys
from sglang.srt.server_args import prepare_server_args
models, draft, budget = sys.argv[1:]
a = prepare_server_args(["--model-path", f"{models}/tiny-qwen3", "--speculative-algorithm", "DDTREE",
    "--speculative-draft-model-path", f"{models}/{draft}", "--speculative-ddtree-budget", budget,
    "--attention-backend", "triton", "--load-format", "dummy", "--device", "cpu"])
print(f"parsed: algorithm {a.speculative_algorithm}, budget {a.speculative_ddtree_budget}, draft tokens "
      f"{a.speculative_num_draft_tokens}, overlap off {a.disable_overlap_schedule}, piecewise graph off {a.disable_piecewise_cuda_graph}")
PY
    ) | grep -E 'parsed:|DDTREE|error' | sed -E 's/^\[[0-9: -]+\] //' || true
}
for case in "tiny-qwen3-dflash 3" "tiny-qwen3-dflash 15" "tiny-qwen3-dflash16 15" "tiny-qwen3-dflash16 31"; do
    set -- $case
    echo "== patched 0.5.13, draft $1, --speculative-ddtree-budget $2"
    parse "$WORK/patched" "$1" "$2"
done
echo "== unpatched 0.5.13, draft tiny-qwen3-dflash16, --speculative-ddtree-budget 15"
parse "" tiny-qwen3-dflash16 15
