#!/bin/bash
# The real stack on a real GPU, the deploy's way (not run by `make test`: CI has no GPU).
#
#   bash bench/gpu_serve_check.sh WHEELHOUSE CONTROL_WHEELS [SERVICES]
#
# WHEELHOUSE: the stack's wheels that the donor venv lacks (and the uv wheel); CONTROL_WHEELS:
# wheels of requirements.txt for this machine's python3 (the machine may have no network).
# GPU_DONOR (default /opt/torch/.venv): a venv here holding part of the stack (torch, triton,
# the nvidia-* set), copied as installed. SERVICES (default: all four of bench/gpu/inventory.py,
# one after another): plain-auto, plain-triton, dflash-auto, dflash-triton.
#
# 1. A control venv with pyinfra (uv from the wheelhouse, offline).
# 2. `pyinfra bench/gpu/inventory.py bench/gpu/deploy_gpu.py` with the first service placed: the
#    deploy's GPU check, a generation of the stack (donor copy + wheelhouse, uv), the ABI probe,
#    the switch, the engine's parser on the unit's exact flags, the unit written. Run twice: the
#    second must change nothing.
# 3. Per service: the deploy placing it (its unit rendered and checked), then bench/gpu/serve.py
#    starting the unit's exact ExecStart with its Environment= and gating on the deploy's own
#    wait_ready.py (/health 200, one chat completion), /server_info read back.
# Everything printed also goes to $RESULTS (default bench/results/gpu_serve_check.txt).
set -u
WHEELHOUSE=$(readlink -f "$1"); CONTROL_WHEELS=$(readlink -f "$2")
SERVICES=${3:-plain-auto,plain-triton,dflash-auto,dflash-triton}
HERE=$(cd "$(dirname "$0")/.." && pwd)
cd "$HERE"
RESULTS=${RESULTS:-$HERE/bench/results/gpu_serve_check.txt}
mkdir -p "$(dirname "$RESULTS")"
exec > >(tee -a "$RESULTS") 2>&1
export GPU_WHEELHOUSE=$WHEELHOUSE GPU_DONOR=${GPU_DONOR:-/opt/torch/.venv} GPU_STORE=${GPU_STORE:-/root/gpu-check-models}
CTL=${CTL:-/root/gpu-check-control}
now() { date +%s.%N; }
secs() { python3 -c "print(f'{$2 - $1:.1f}')"; }

echo "== $(date -u '+%F %T UTC') $(hostname): $(nvidia-smi --query-gpu=name,compute_cap,driver_version --format=csv,noheader | head -1)"
echo "wheelhouse: $(ls "$WHEELHOUSE" | wc -l) files, $(du -sm "$WHEELHOUSE" | cut -f1) MiB; donor $GPU_DONOR: $("$GPU_DONOR/bin/python" -c 'import torch, sys; print("python", sys.version.split()[0], "torch", torch.__version__)' 2>&1 | tail -1)"

if [ ! -x "$CTL/bin/pyinfra" ]; then
    uvwheel=$(ls "$WHEELHOUSE"/uv-*.whl | head -1)
    mkdir -p "$CTL.uv" && python3 -c "import sys, zipfile; z = zipfile.ZipFile(sys.argv[1]); n = next(n for n in z.namelist() if n.endswith('/scripts/uv')); open(sys.argv[2], 'wb').write(z.read(n))" "$uvwheel" "$CTL.uv/uv" && chmod +x "$CTL.uv/uv"
    "$CTL.uv/uv" venv -q -p python3 "$CTL" && "$CTL.uv/uv" pip install -q -p "$CTL/bin/python" --offline --no-index -f "$CONTROL_WHEELS" -r requirements.txt || exit 1
fi
mkdir -p "$GPU_STORE" && python3 bench/gpu/tiny_models.py "$GPU_STORE"

deploy() {  # deploy SERVICES LABEL
    local t0 t1 rc
    t0=$(now)
    GPU_SERVICES=$1 "$CTL/bin/pyinfra" -y bench/gpu/inventory.py bench/gpu/deploy_gpu.py > "/tmp/gpu-deploy-$2.log" 2>&1
    rc=$?
    t1=$(now)
    grep -E "^\s*\[@local\]|Grand total|PREFLIGHT|ABI probe|error|Error" "/tmp/gpu-deploy-$2.log" | grep -v "^\s*$" | tail -40
    echo "deploy $2 ($1): exit $rc in $(secs "$t0" "$t1") s"
    return $rc
}

first=${SERVICES%%,*}
deploy "$first" build || { tail -60 /tmp/gpu-deploy-build.log; exit 1; }
deploy "$first" again
grep -q "Grand total.*" /tmp/gpu-deploy-again.log && grep "Grand total" /tmp/gpu-deploy-again.log
venv=$(readlink -f "${GPU_VENV:-/root/venv_sglang}")
echo "live generation: $venv ($(du -sm "$venv" | cut -f1) MiB); files with more than one link (shared with a cache or another generation): $(find "$venv" -type f -links +1 | wc -l)"
"$venv/bin/python" -c 'import importlib.metadata as md, torch, sgl_kernel, flashinfer, sglang, xgrammar; print("imports: torch", torch.__version__, "cuda", torch.version.cuda, "| " + " | ".join(f"{d} {md.version(d)}" for d in ("sglang-kernel", "flashinfer-python", "sglang", "xgrammar")))' 2>&1 | tail -1

status=0
for svc in ${SERVICES//,/ }; do
    deploy "$svc" "unit-$svc" || { status=1; continue; }
    echo "== serve $svc"
    python3 bench/gpu/serve.py "/etc/systemd/system/sglang-$svc.service" "${READY_TIMEOUT:-600}" > "/tmp/gpu-serve-$svc.json"
    rc=$?
    python3 - "/tmp/gpu-serve-$svc.json" <<'PYEOF'
import json, sys
r = json.load(open(sys.argv[1]))
g = r["gate"]
print("argv:", " ".join(r["argv"]))
print("env:", " ".join(f"{k}={v}" for k, v in sorted(r["env"].items())))
print("gate:", json.dumps(g) if not g.get("ok") else f"ready (/health 200) {g['ready_s']} s after start; smoke completion: {g['reply']!r}")
print("server_info:", json.dumps(r.get("server_info")))
PYEOF
    [ $rc -eq 0 ] || { status=1; tail -40 "/run/gpu-check/sglang-$svc.service.log"; }
done
echo "== done: exit $status"
exit $status
