#!/bin/bash
# The ABI probe and the venv fact on a real GPU host (not run by `make test`: CI has no GPU).
#   bash bench/gpu_probe_check.sh [PYTHON]      # PYTHON: a venv's python with a CUDA torch (default python3)
# Each case prints the probe's exit status and its one line. Case D builds a real shared object
# that needs a c10 symbol no torch exports, so the loader's own `undefined symbol` is what the probe reads.
set -u
PY=${1:-python3}
HERE=$(cd "$(dirname "$0")/.." && pwd)
PROBE=$HERE/operations/remote/abi_probe.py
W=$(mktemp -d)
nvidia-smi --query-gpu=name,compute_cap,driver_version --format=csv,noheader
CUDA=$(nvidia-smi | sed -n 's/.*CUDA Version: *\([0-9.]*\).*/\1/p' | head -1)
CAP=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1)
echo "driver CUDA $CUDA, compute capability $CAP"
$PY -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_arch_list())'

kernel() {  # kernel VERSION WITH_SO: a sgl-kernel distribution on PYTHONPATH
    rm -rf "$W/site" && mkdir -p "$W/site/sgl_kernel" "$W/site/sgl_kernel-$1.dist-info"
    printf 'Metadata-Version: 2.1\nName: sgl-kernel\nVersion: %s\n\n' "$1" > "$W/site/sgl_kernel-$1.dist-info/METADATA"
    echo sgl_kernel > "$W/site/sgl_kernel-$1.dist-info/top_level.txt"
    if [ "$2" = yes ]; then
        printf 'extern void _ZN3c1013NotInAnyTorchEv(void);\nvoid sgl_use(void) { _ZN3c1013NotInAnyTorchEv(); }\n' > "$W/k.c"
        gcc -shared -fPIC -o "$W/site/sgl_kernel/common_ops.abi3.so" "$W/k.c"
        echo 'from sgl_kernel import common_ops' > "$W/site/sgl_kernel/__init__.py"
        printf 'sgl_kernel/__init__.py,,\nsgl_kernel/common_ops.abi3.so,,\n' > "$W/site/sgl_kernel-$1.dist-info/RECORD"
    else
        : > "$W/site/sgl_kernel/__init__.py"
        printf 'sgl_kernel/__init__.py,,\n' > "$W/site/sgl_kernel-$1.dist-info/RECORD"
    fi
}
probe() {  # probe NAME JSON
    echo "== $1"
    PYTHONPATH=${PYTHONPATH_CASE:-} $PY - "$2" < "$PROBE" 2>&1 | tail -3
    echo "exit ${PIPESTATUS[0]}"
}
probe "A: this torch on this GPU and driver" "{\"kernels\": [], \"modules\": [], \"driver_cuda\": \"$CUDA\", \"compute_caps\": [\"$CAP\"]}"
probe "B: a driver that supports only CUDA 12.8" "{\"kernels\": [], \"modules\": [], \"driver_cuda\": \"12.8\", \"compute_caps\": [\"$CAP\"]}"
probe "C: a GPU of compute capability 6.0" "{\"kernels\": [], \"modules\": [], \"driver_cuda\": \"$CUDA\", \"compute_caps\": [\"6.0\"]}"
kernel "0.3.21+cu130" yes
PYTHONPATH_CASE=$W/site probe "D: a kernel whose library needs a symbol this torch lacks" "{\"kernels\": [\"sgl-kernel\"], \"modules\": [], \"driver_cuda\": \"$CUDA\", \"compute_caps\": [\"$CAP\"]}"
kernel "0.3.21+cu128" no
PYTHONPATH_CASE=$W/site probe "E: a kernel built for CUDA 12.8" "{\"kernels\": [\"sgl-kernel\"], \"modules\": [], \"driver_cuda\": \"$CUDA\", \"compute_caps\": [\"$CAP\"]}"

VENV=$($PY -c 'import sys; print(sys.prefix)')
echo "== F: the venv fact on $VENV"
start=$(date +%s.%N)
python3 - "$VENV" "$VENV" /nonexistent /nonexistent < "$HERE/operations/remote/venv_state.py" > "$W/state.json"
end=$(date +%s.%N)
python3 -c "
import json, sys
s = json.load(open('$W/state.json'))['wanted']
d = s['dists']
print(len(d), 'distributions,', sum(x['files'] for x in d.values()), 'files checked,', sum(x['damaged_count'] for x in d.values()), 'missing or altered;', 'shared:', s['shared'] or 'none')
print('torch', d.get('torch', {}).get('version'), 'installer', d.get('torch', {}).get('installer'))
"
echo "fact took $(python3 -c "print(round($end - $start, 2))") s"
rm -rf "$W"
