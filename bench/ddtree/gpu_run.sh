#!/bin/bash
# DDTree on a real GPU: plain, DFLASH, DDTREE(15) and DDTREE(31) on sglang-0.5.13-cu130, each served through
# its unit's exact command line, then measured side by side (measure.py). Not run by `make test`.
#
# Here (the control machine), once:
#   bash bench/ddtree/build_patchset.sh FORK_CLONE              # files/patches/ddtree-0_5_13 (ignored)
#   bash bench/ddtree/gpu_run.sh prepare                         # gpucarry/: wheels the donor lacks, in 60 MiB parts
# On the GPU machine (run tool; carry files/patches/ddtree-0_5_13 and the gpucarry/ parts, a few per call:
# each call carries at most 64 MiB, ignored files stay on a warm machine between calls):
#   bash bench/ddtree/gpu_run.sh run CONTROL_WHEELS [SERVICES]   # default: plain,dflash,ddtree15,ddtree31
#
# `prepare` fills /tmp/wh513 with the stack (python -m tools.wheelhouse, sha256-checked), keeps the files the H200
# donor venv does not hold exactly (bench/results/h200-donor-pip-freeze.txt: 48 of the 187 it has), and splits
# them into gpucarry/wh513.tar.part-* (60 MiB each, as bench/gpu_serve_check.sh's 983 MiB went: about 5.5 s of
# device time a part). CONTROL_WHEELS: requirements.txt's wheels for the GPU machine's python3 (as for
# bench/gpu_serve_check.sh). `run` joins the parts, builds the generation (donor copy + wheelhouse, patch set
# applied, ABI probe), and per service: deploys it (the engine's own parser on its flags, the unit written),
# starts the unit's ExecStart with its Environment (bench/gpu/serve.py's parse), gates on /health, records
# /server_info and the first lines naming DDTree in its log, measures it, stops it. The four runs combine into
# one table (python -m operations.measure combine). Everything goes to $RESULTS.
set -u
HERE=$(cd "$(dirname "$0")/../.." && pwd)
cd "$HERE"
MODE=${1:?usage: gpu_run.sh prepare | run CONTROL_WHEELS [SERVICES]}

if [ "$MODE" = prepare ]; then
    set -e
    .venv/bin/python -m tools.wheelhouse sglang-0.5.13-cu130 /tmp/wh513
    mkdir -p gpucarry
    .venv/bin/python - /tmp/wh513 <<'PY' > /tmp/wh513.list
import re, sys, yaml
stack = yaml.safe_load(open("files/stacks/sglang-0.5.13-cu130.yml"))["packages"]
donor = {}
for line in open("bench/results/h200-donor-pip-freeze.txt"):
    m = re.match(r"([A-Za-z0-9_.-]+)==(\S+)", line.strip())
    if m:
        donor[re.sub(r"[-_.]+", "-", m.group(1)).lower()] = m.group(2)
import glob, os
names = [p["file"] for n, p in stack.items() if donor.get(n) != p["version"]] + [os.path.basename(u) for u in glob.glob(sys.argv[1] + "/uv-*.whl")]
print("\n".join(names))
PY
    tar -C /tmp/wh513 -cf - -T /tmp/wh513.list | split -b 60M -d - gpucarry/wh513.tar.part-
    echo "gpucarry/: $(ls gpucarry/wh513.tar.part-* | wc -l) parts, $(wc -l < /tmp/wh513.list) wheels, $(du -cm gpucarry/wh513.tar.part-* | tail -1 | cut -f1) MiB"
    exit 0
fi

CONTROL_WHEELS=$(readlink -f "${2:?CONTROL_WHEELS}")
SERVICES=${3:-plain,dflash,ddtree15,ddtree31}
RESULTS=${RESULTS:-$HERE/bench/results/h200-ddtree-$(date -u +%F).txt}
mkdir -p "$(dirname "$RESULTS")"
exec > >(tee -a "$RESULTS") 2>&1
export GPU_WHEELHOUSE=${GPU_WHEELHOUSE:-/root/wh513} GPU_DONOR=${GPU_DONOR:-/opt/torch/.venv} GPU_STORE=${GPU_STORE:-/root/gpu-check-models}
CTL=${CTL:-/root/gpu-check-control}
echo "== $(date -u '+%F %T UTC') commit $(git rev-parse HEAD 2>/dev/null || echo '?'): $(nvidia-smi --query-gpu=name,compute_cap,driver_version --format=csv,noheader | head -1)"
if [ ! -d "$GPU_WHEELHOUSE" ]; then
    mkdir -p "$GPU_WHEELHOUSE" && cat gpucarry/wh513.tar.part-* | tar -C "$GPU_WHEELHOUSE" -xf - || exit 1
fi
echo "wheelhouse: $(ls "$GPU_WHEELHOUSE" | wc -l) files, $(du -sm "$GPU_WHEELHOUSE" | cut -f1) MiB"
[ -f files/patches/ddtree-0_5_13/patchset.yml ] || { echo "files/patches/ddtree-0_5_13 missing: carry it"; exit 1; }
if [ ! -x "$CTL/bin/pyinfra" ]; then
    uvwheel=$(ls "$GPU_WHEELHOUSE"/uv-*.whl | head -1)
    mkdir -p "$CTL.uv" && python3 -c "import sys, zipfile; z = zipfile.ZipFile(sys.argv[1]); n = next(n for n in z.namelist() if n.endswith('/scripts/uv')); open(sys.argv[2], 'wb').write(z.read(n))" "$uvwheel" "$CTL.uv/uv" && chmod +x "$CTL.uv/uv"
    "$CTL.uv/uv" venv -q -p python3 "$CTL" && "$CTL.uv/uv" pip install -q -p "$CTL/bin/python" --offline --no-index -f "$CONTROL_WHEELS" -r requirements.txt || exit 1
fi
mkdir -p "$GPU_STORE" && python3 bench/gpu/tiny_models.py "$GPU_STORE"
rm -rf "$GPU_STORE/tiny-qwen3-dflash16" && cp -r "$GPU_STORE/tiny-qwen3-dflash" "$GPU_STORE/tiny-qwen3-dflash16"
python3 -c "import json, sys; p = sys.argv[1]; c = json.load(open(p)); c['dflash_config']['block_size'] = 16; json.dump(c, open(p, 'w'), indent=1)" "$GPU_STORE/tiny-qwen3-dflash16/config.json"

status=0; runs=()
for svc in ${SERVICES//,/ }; do
    echo "== $svc: deploy"
    GPU_SERVICES=$svc "$CTL/bin/pyinfra" -y bench/ddtree/inventory.py bench/ddtree/deploy_gpu.py > "/tmp/ddtree-deploy-$svc.log" 2>&1
    rc=$?; grep -E "Grand total|Patch set|ABI probe|flags pass|rror" "/tmp/ddtree-deploy-$svc.log" | tail -20
    [ $rc -eq 0 ] || { echo "deploy $svc: exit $rc"; tail -40 "/tmp/ddtree-deploy-$svc.log"; status=1; continue; }
    unit=/etc/systemd/system/sglang-$svc.service
    eval "$(python3 - "$unit" <<'PY'
import shlex, sys
sys.path.insert(0, "bench/gpu")
from serve import parse_unit
u = parse_unit(open(sys.argv[1]).read())
print("ARGV=(" + " ".join(shlex.quote(a) for a in u["argv"]) + ")")
print("ENVS=(" + " ".join(shlex.quote(f"{k}={v}") for k, v in u["env"].items()) + ")")
print("PORT=" + next(a.split("=")[-1] for a in [u["argv"][i + 1] for i, x in enumerate(u["argv"]) if x == "--port"]))
PY
)"
    echo "argv: ${ARGV[*]}"
    log=/tmp/ddtree-serve-$svc.log; t0=$(date +%s)
    env -i "${ENVS[@]}" setsid "${ARGV[@]}" > "$log" 2>&1 & pid=$!
    until curl -sf "http://127.0.0.1:$PORT/health" >/dev/null; do
        kill -0 $pid 2>/dev/null || { echo "$svc died at start:"; tail -40 "$log"; status=1; continue 2; }
        [ $(( $(date +%s) - t0 )) -gt ${READY_TIMEOUT:-900} ] && { echo "$svc not ready"; tail -40 "$log"; kill -- -$pid; status=1; continue 2; }
        sleep 2
    done
    echo "$svc ready after $(( $(date +%s) - t0 )) s"
    curl -s "http://127.0.0.1:$PORT/server_info" | python3 -c "import json, sys; d = json.load(sys.stdin); print('server_info:', {k: d.get(k) for k in ('version', 'attention_backend', 'speculative_algorithm', 'speculative_ddtree_budget', 'speculative_num_draft_tokens', 'disable_overlap_schedule', 'disable_piecewise_cuda_graph')})"
    grep -iE "ddtree|dflash" "$log" | grep -v "server_args=" | head -8
    MEASURE_SERVICES=$svc MEASURE_OUT=/tmp/ddtree-measure-$svc.json MEASURE_PROMPTS=${MEASURE_PROMPTS:-64} \
        GPU_SERVICES=$svc "$CTL/bin/pyinfra" -y bench/ddtree/inventory.py measure.py > "/tmp/ddtree-measure-$svc.log" 2>&1 \
        && runs+=("/tmp/ddtree-measure-$svc.json") || { status=1; tail -30 "/tmp/ddtree-measure-$svc.log"; }
    kill -- -$pid; wait $pid 2>/dev/null
done
[ ${#runs[@]} -gt 0 ] && "$CTL/bin/python" -m operations.measure combine "${RESULTS%.txt}.json" "${runs[@]}"
echo "== done: exit $status"
exit $status
