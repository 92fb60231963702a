#!/bin/bash
# DDTree on a real GPU: plain, DFLASH, DDTREE(15) and DDTREE(31) on sglang-0.5.13-cu130, each served through
# its unit's exact command line, gated like the deploy, then measured side by side (measure.py). Not run by `make test`.
#
# Here (the control machine), once:
#   bash bench/ddtree/build_patchset.sh FORK_CLONE              # files/patches/ddtree-0_5_13 (ignored)
#   bash bench/ddtree/gpu_run.sh prepare                         # gpucarry/: the wheels the donor lacks, in 60 MiB parts
# On the GPU machine (the run tool; each call carries at most 64 MiB, ignored files stay on a warm machine):
#   bash bench/ddtree/gpu_run.sh receive                         # one call per part: carry gpucarry/wh513.tar.part-NN
#   bash bench/ddtree/gpu_run.sh run [SERVICES]                  # default: plain,dflash,ddtree15,ddtree31,ddtree7
#   bash bench/ddtree/gpu_run.sh run hybrid-dflash,hybrid-ddtree15,hybrid-ddtree31,hybrid-plain
#                                                                # the operator's hybrid target (issue #36 item 3)
#   bash bench/ddtree/gpu_run.sh caches [SERVICES]               # default: plain,dflash: what a kernel cache is worth
#                                                                # (issue #48 item 6; no patch set needed)
#
# `prepare` downloads into /tmp/wh513 only the stack's files the H200 donor venv does not hold exactly
# (bench/results/h200-donor-pip-freeze.txt: 139 of the stack's 187, 1362 MiB, sha256-checked against the stack)
# and the uv wheel, with requirements.txt's wheels for the GPU machine's python3 (3.12) under ctl/, tars them
# (control wheels and uv first) and splits the tar into gpucarry/wh513.tar.part-NN (PART_MB, default 60 MiB: a part,
# the tracked tree and the patch set fit one call's 64 MiB; 56 once the tree, untracked files included, nears 4 MiB). `receive` moves the parts that came with a call to
# $PARTS (/root/wh513.parts) and says how many are there. `run` joins the parts once, builds the control
# venv (pyinfra, offline) and the tiny models, and per service: deploys it (bench/gpu/deploy_gpu.py: the
# GPU check, a generation per venv and patch-set combination from the donor and the wheelhouse, the patch set
# applied, the ABI probe, the engine's own parser on the unit's exact flags, the unit written), starts the
# unit's ExecStart with its Environment= (bench/gpu/serve.py's parse_unit; its State/CacheDirectory made),
# gates it with the deploy's own operations/service/on_host/wait_ready.py (as the deploy sends it: `_common` inlined) (/health 200, one chat completion; bench/gpu's
# systemctl/journalctl stand-ins), records /server_info and the log lines naming DDTree/DFlash, measures it
# (measure.py), stops it. Each service's measurement is kept in $RUNS; the runs so far combine into one table
# (python -m views.measure combine). GPU_BACKEND=auto for sglang's default attention backend.
# After the gate, each service answers one greedy request twice (PROBE_TOKENS=300 new tokens after a 40-token
# prompt, the second a radix-cache hit: with the hybrid target's 256-token mamba track interval, the first crosses a
# boundary): at temperature 0 speculative decoding must give the non-speculative output, so the printed digest of
# each service's output is compared across services (hybrid-plain is the hybrid services' reference).
# Printed output goes to $RESULTS; COMMIT names the checkout's commit (the device copy has no .git).
set -u
HERE=$(cd "$(dirname "$0")/../.." && pwd)
cd "$HERE"
MODE=${1:?usage: gpu_run.sh prepare | receive | run [SERVICES] | caches [SERVICES]}
PARTS=${PARTS:-/root/wh513.parts}

if [ "$MODE" = prepare ]; then
    set -e
    W=/tmp/wh513
    mkdir -p "$W/ctl" gpucarry
    .venv/bin/python - "$W" <<'PY'
import re, sys
from pathlib import Path
from configuration.stacks import load_stack
from tools import wheelhouse as W
stack = load_stack("sglang-0.5.13-cu130")
donor = {}
for line in open("bench/results/h200-donor-pip-freeze.txt"):
    m = re.match(r"([A-Za-z0-9_.-]+)==(\S+)", line.strip())
    if m:
        donor[re.sub(r"[-_.]+", "-", m.group(1)).lower()] = m.group(2)
need = [p for p in stack.packages if donor.get(p.name) != p.version]
uv = W.uv_package(stack)
house = Path(sys.argv[1])
missing = [p for p in need + [uv] if not (W.find(p, house) and W.sha256_of(W.find(p, house)) == p.sha256)]
for tags, group in W._by_wheel_tags(missing).items():
    W._download(stack, house, group, tags)
W.locate(stack, house, need)
W.locate(stack, house, [uv])
with open(house / "files.list", "w") as out:
    out.write("\n".join([W.find(uv, house).name] + sorted(W.find(p, house).name for p in need)) + "\n")
print(f"{len(need)} of the stack's {len(stack.packages)} files are not in the donor exactly; with uv: "
      f"{sum(W.find(p, house).stat().st_size for p in need + [uv]) / 2**20:.0f} MiB")
PY
    PIP_CONSTRAINT= .venv/bin/python -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp \
        --abi cp312 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_28_x86_64 \
        -d "$W/ctl" -r requirements.txt 2>&1 | grep -v "is ignored: it is neither" || true
    rm -f gpucarry/wh513.tar.part-*
    (cd "$W" && ls ctl/*.whl && cat files.list) | tar -C "$W" -cf - -T - | split -b "${PART_MB:-60}M" -d - gpucarry/wh513.tar.part-
    echo "gpucarry/: $(ls gpucarry/wh513.tar.part-* | wc -l) parts, $(du -cm gpucarry/wh513.tar.part-* | tail -1 | cut -f1) MiB"
    (cd gpucarry && sha256sum wh513.tar.part-* > wh513.sha256)
    exit 0
fi

if [ "$MODE" = receive ]; then
    mkdir -p "$PARTS"
    for p in gpucarry/wh513.tar.part-*; do
        [ -f "$p" ] && mv "$p" "$PARTS/"
    done
    [ -f gpucarry/wh513.sha256 ] && cp gpucarry/wh513.sha256 "$PARTS/"
    echo "received: $(ls "$PARTS" | grep -c part-) parts, $(du -sm "$PARTS" | cut -f1) MiB in $PARTS"
    exit 0
fi

if [ "$MODE" = caches ]; then
    SERVICES=${2:-plain,dflash}
    RESULTS=${RESULTS:-$HERE/bench/results/gpu-$(date -u +%F)-kernel-caches.txt}
else
    SERVICES=${2:-plain,dflash,ddtree15,ddtree31,ddtree7}
fi
BACKEND=${GPU_BACKEND:-triton}
RESULTS=${RESULTS:-$HERE/bench/results/h200-ddtree-$(date -u +%F).txt}
RUNS=${RUNS:-/root/ddtree-runs}
LOGS=${LOGS:-/root/ddtree-logs}
export GPU_RUN=${GPU_RUN:-/run/gpu-check}
# The machine has no systemd: the deploy's preflight and measure.py's client run through `systemd-run` (since ba6612c,
# operations/transient.py), which bench/gpu stands in for, as it does for systemctl and journalctl.
export PATH="$HERE/bench/gpu:$PATH"
mkdir -p "$(dirname "$RESULTS")" "$RUNS" "$LOGS" "$GPU_RUN"
exec > >(tee -a "$RESULTS") 2>&1
export GPU_WHEELHOUSE=${GPU_WHEELHOUSE:-/root/wh513} GPU_DONOR=${GPU_DONOR:-/opt/torch/.venv} GPU_STORE=${GPU_STORE:-/root/gpu-check-models}
export GPU_BACKEND=$BACKEND
CTL=${CTL:-/root/gpu-check-control}
echo "== $(date -u '+%F %T UTC') commit ${COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo '?')}: $(nvidia-smi --query-gpu=name,compute_cap,driver_version --format=csv,noheader | head -1); services $SERVICES, attention-backend $BACKEND"
if [ ! -f "$GPU_WHEELHOUSE/files.list" ]; then
    [ -f "$PARTS/wh513.sha256" ] && { (cd "$PARTS" && sha256sum --check --quiet wh513.sha256) || exit 1; }
    mkdir -p "$GPU_WHEELHOUSE" && cat "$PARTS"/wh513.tar.part-* | tar -C "$GPU_WHEELHOUSE" -xf - || exit 1
fi
echo "wheelhouse: $(ls "$GPU_WHEELHOUSE"/*.whl | wc -l) wheels, $(du -sm "$GPU_WHEELHOUSE" | cut -f1) MiB"
[ "$MODE" = caches ] || [ -f files/patches/ddtree-0_5_13/patchset.yml ] || { echo "files/patches/ddtree-0_5_13 missing: carry it"; exit 1; }
if [ ! -x "$CTL/bin/pyinfra" ]; then
    uvwheel=$(ls "$GPU_WHEELHOUSE"/uv-*.whl | head -1)
    mkdir -p "$CTL.uv" && python3 -c "import sys, zipfile; z = zipfile.ZipFile(sys.argv[1]); n = next(n for n in z.namelist() if n.endswith('/scripts/uv')); open(sys.argv[2], 'wb').write(z.read(n))" "$uvwheel" "$CTL.uv/uv" && chmod +x "$CTL.uv/uv"
    "$CTL.uv/uv" venv -q -p python3 "$CTL" && "$CTL.uv/uv" pip install -q -p "$CTL/bin/python" --offline --no-index -f "$GPU_WHEELHOUSE/ctl" -r requirements.txt || exit 1
fi
if [ ! -d "$GPU_STORE/tiny-qwen3-dflash16" ] || [ ! -d "$GPU_STORE/tiny-qwen35-hybrid-dflash" ]; then
    mkdir -p "$GPU_STORE" && python3 bench/gpu/tiny_models.py "$GPU_STORE"
    rm -rf "$GPU_STORE/tiny-qwen3-dflash16" && cp -r "$GPU_STORE/tiny-qwen3-dflash" "$GPU_STORE/tiny-qwen3-dflash16"
    python3 -c "import json, sys; p = sys.argv[1]; c = json.load(open(p)); c['dflash_config']['block_size'] = 16; json.dump(c, open(p, 'w'), indent=1)" "$GPU_STORE/tiny-qwen3-dflash16/config.json"
fi

# hybrid-w-*: the hybrid target with initialised weights; its directory exists for the deploy's preflight, its
# weights are written once a service venv (transformers) exists, before the first such service starts.
if [[ ",$SERVICES," == *",hybrid-w-"* ]] && [ ! -d "$GPU_STORE/tiny-qwen35-hybrid-w" ]; then
    cp -r "$GPU_STORE/tiny-qwen35-hybrid" "$GPU_STORE/tiny-qwen35-hybrid-w"
fi

# What a unit file runs, as shell assignments (bench/gpu/serve.py's parse_unit): ARGV, ENVS, DIRS (its State- and
# CacheDirectory=), WORKDIR, PORT, and KCACHE and SHOME, its kernel cache and HOME (operations/service/kernel_cache.py).
unit_vars() {
    python3 - "$1" <<'PY'
import shlex, sys
sys.path.insert(0, "bench/gpu")
from serve import parse_unit
u = parse_unit(open(sys.argv[1]).read())
q = lambda xs: " ".join(shlex.quote(x) for x in xs)
print("ARGV=(" + q(u["argv"]) + ")")
print("ENVS=(" + q(["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"] + [f"{k}={v}" for k, v in u["env"].items()]) + ")")
print("DIRS=(" + q(u["dirs"]) + ")")
print("WORKDIR=" + shlex.quote(u["cwd"]))
print("PORT=" + u["argv"][u["argv"].index("--port") + 1])
print("KCACHE=" + shlex.quote(u["env"].get("XDG_CACHE_HOME", "")))
print("SHOME=" + shlex.quote(u["env"].get("HOME", "")))
PY
}

# The readiness gate as the deploy sends it to a host: the script with what it shares inlined (operations/remote).
WAIT_READY=$GPU_RUN/wait_ready.py
"$CTL/bin/python" -c "import sys; sys.path.insert(0, '.'); from operations import remote; sys.stdout.write(remote.script('wait_ready'))" > "$WAIT_READY" || exit 1
status=0
if [ "$MODE" = caches ]; then
    # What a service's kernel cache is worth (operations/service/kernel_cache.py): its unit, as the deploy writes it,
    # started through its exact ExecStart and Environment= (all the engine's cache variables point into
    # /var/cache/sglang/kernels/<key>), gated by the deploy's own wait_ready.py; time from the start to /health 200:
    #   first   the very first start (also the venv's first imports: not a cache figure)
    #   cold    its key's cache and the service's HOME (inside it) and state directory emptied
    #   warm    a restart: the same cache (what a restart, a rollback or a surge's replica finds)
    #   shipped an empty host's start: the state directory emptied, the cache (HOME in it) seeded from a copy taken after the warm start (what
    #           kernel_ship.py seals, ships and seeds)
    #   cold2   cold again (the machine's drift between the first cold and now)
    for svc in ${SERVICES//,/ }; do
        echo "== $svc ($BACKEND): deploy"
        GPU_SERVICES=$svc "$CTL/bin/pyinfra" -y bench/ddtree/inventory.py bench/gpu/deploy_gpu.py > "$LOGS/deploy-$svc-caches.log" 2>&1 \
            || { tail -40 "$LOGS/deploy-$svc-caches.log"; status=1; continue; }
        unit=sglang-$svc.service
        eval "$(unit_vars "/etc/systemd/system/$unit")"
        echo "cache: $KCACHE; HOME: $SHOME"
        declare -A took=()
        for phase in first cold warm shipped cold2; do
            case $phase in
                cold|cold2) rm -rf "$KCACHE" "$SHOME" /var/lib/sglang ;;
                shipped) rm -rf /root/kernels-sealed && cp -a "$KCACHE" /root/kernels-sealed && rm -rf "$KCACHE" "$SHOME" /var/lib/sglang \
                             && mkdir -p "$(dirname "$KCACHE")" && cp -a /root/kernels-sealed "$KCACHE" ;;
            esac
            mkdir -p "${DIRS[@]}"
            log=$GPU_RUN/$unit.log
            (cd "$WORKDIR" && exec env -i "${ENVS[@]}" setsid "${ARGV[@]}") > "$log" 2>&1 &
            pid=$!
            echo $pid > "$GPU_RUN/$unit.pid"
            gate=$(PATH="$HERE/bench/gpu:$PATH" python3 "$WAIT_READY" "$unit" 127.0.0.1 "$PORT" "${READY_TIMEOUT:-900}" 1 - | tail -1)
            cp "$log" "$LOGS/serve-$svc-caches-$phase.log"
            ready=$(python3 -c "import json, sys; g = json.loads(sys.argv[1]); print(g.get('ready_s') if g.get('ok') else 'FAILED')" "$gate" 2>/dev/null || echo FAILED)
            took[$phase]=$ready
            echo "$svc $phase: ready in $ready s; cache $(du -sm "$KCACHE" 2>/dev/null | cut -f1) MiB, $(find "$KCACHE" -type f 2>/dev/null | wc -l) files; HOME $(du -sm "$SHOME" 2>/dev/null | cut -f1) MiB"
            grep -E "Capture cuda graph end|Load weight end" "$log" | sed -E 's/^\[[0-9: -]+( [A-Z]+[0-9]*)?\] //' | head -2
            [ "$ready" = FAILED ] && { echo "gate: $gate"; grep -v "server_args=" "$log" | tail -20; status=1; }
            kill -- -$pid 2>/dev/null; wait $pid 2>/dev/null
            for i in $(seq 30); do curl -s -o /dev/null "http://127.0.0.1:$PORT/health" || break; sleep 1; done
        done
        python3 - "$svc" "${took[cold]}" "${took[cold2]}" "${took[warm]}" "${took[shipped]}" <<'PY'
import sys
svc, *values = sys.argv[1:]
try:
    cold1, cold2, warm, shipped = map(float, values)
except ValueError:
    print(f"{svc}: no figure ({values})"); sys.exit()
cold = (cold1 + cold2) / 2
print(f"kernel_cache.{svc}.warm_vs_cold: {warm / cold:.2f} ({warm:.1f} s against {cold:.1f} s, the mean of {cold1:.1f} and {cold2:.1f}; target at most 0.5)")
print(f"kernel_cache.{svc}.shipped_vs_cold: {shipped / cold:.2f} ({shipped:.1f} s)")
PY
    done
    echo "== done (caches, $BACKEND): exit $status"
    exit $status
fi
for svc in ${SERVICES//,/ }; do
    tag=$svc-$BACKEND
    echo "== $svc ($BACKEND): deploy"
    t0=$(date +%s)
    GPU_SERVICES=$svc "$CTL/bin/pyinfra" -y bench/ddtree/inventory.py bench/gpu/deploy_gpu.py > "$LOGS/deploy-$tag.log" 2>&1
    rc=$?
    if [ $rc -eq 0 ]; then
        # The same deploy again: on a converged host it must change nothing (the repeat deploy that, on 2026-12-03,
        # refused the generation the first one built: nvidia_cutlass_dsl/ from two wheels, since dropped from the stack).
        GPU_SERVICES=$svc "$CTL/bin/pyinfra" -y --json bench/ddtree/inventory.py bench/gpu/deploy_gpu.py > "$LOGS/redeploy-$tag.json" 2> "$LOGS/redeploy-$tag.log"
        rrc=$?
        echo "deploy $svc again: exit $rrc; $(python3 - "$LOGS/redeploy-$tag.json" <<'PY'
import json, sys
try:
    ops = json.load(open(sys.argv[1]))["results"]["operations"]
except Exception as exc:
    print(f"no JSON result ({exc})"); sys.exit()
changed = [op["name"] for op in ops if op.get("success")]
errors = [op["name"] for op in ops if op.get("error")]
print(f"{len(ops)} operations, {len(changed)} changed {changed}, {len(errors)} errors {errors}")
PY
)"
        [ $rrc -eq 0 ] || { tail -30 "$LOGS/redeploy-$tag.log"; status=1; }
    fi
    grep -E "GPUs:|attention-backend|preflight|PREFLIGHT|Patch set|patch set|copying|ABI probe|switching|Grand total|rror" "$LOGS/deploy-$tag.log" | grep -v "^--> Starting" | tail -20
    echo "deploy $svc: exit $rc in $(( $(date +%s) - t0 )) s"
    [ $rc -eq 0 ] || { tail -40 "$LOGS/deploy-$tag.log"; status=1; continue; }
    unit=sglang-$svc.service
    eval "$(unit_vars "/etc/systemd/system/$unit")"
    if [[ $svc == hybrid-w-* ]] && [ ! -f "$GPU_STORE/tiny-qwen35-hybrid-w/model.safetensors" ]; then
        "${ARGV[0]}" bench/gpu/tiny_weights.py "$GPU_STORE/tiny-qwen35-hybrid" "$GPU_STORE/tiny-qwen35-hybrid-w" 2>&1 | tail -1
    fi
    echo "argv: ${ARGV[*]}"
    echo "env: ${ENVS[*]}"
    [ ${#DIRS[@]} -gt 0 ] && mkdir -p "${DIRS[@]}"
    log=$GPU_RUN/$unit.log
    t0=$(date +%s)
    (cd "$WORKDIR" && exec env -i "${ENVS[@]}" setsid "${ARGV[@]}") > "$log" 2>&1 &
    pid=$!
    echo $pid > "$GPU_RUN/$unit.pid"
    gate=$(PATH="$HERE/bench/gpu:$PATH" python3 "$WAIT_READY" "$unit" 127.0.0.1 "$PORT" "${READY_TIMEOUT:-600}" 1 - | tail -1)
    cp "$log" "$LOGS/serve-$tag.log"
    if ! python3 -c "import json, sys; sys.exit(0 if json.loads(sys.argv[1]).get('ok') else 1)" "$gate" 2>/dev/null; then
        echo "gate: $gate"
        echo "$svc ($BACKEND): NOT SERVED; the log's last lines:"
        grep -v "server_args=" "$log" | tail -25
        kill -- -$pid 2>/dev/null; wait $pid 2>/dev/null
        status=1; continue
    fi
    echo "gate: $(python3 -c "import json, sys; g = json.loads(sys.argv[1]); print(f\"ready (/health 200) {g.get('ready_s')} s after start; smoke completion: {g.get('reply')!r}\")" "$gate")"
    curl -s "http://127.0.0.1:$PORT/server_info" | python3 -c "
import json, sys
d = json.load(sys.stdin)
keys = ('version', 'attention_backend', 'speculative_algorithm', 'speculative_ddtree_budget', 'speculative_num_draft_tokens',
        'speculative_num_steps', 'speculative_eagle_topk', 'speculative_dflash_block_size', 'disable_overlap_schedule',
        'disable_piecewise_cuda_graph', 'disable_cuda_graph', 'cuda_graph_max_bs', 'page_size', 'grammar_backend', 'load_format',
        'mem_fraction_static', 'context_length', 'max_running_requests', 'mamba_full_memory_ratio', 'mamba_scheduler_strategy',
        'mamba_track_interval', 'disable_radix_cache', 'enable_multimodal', 'max_total_num_tokens')
print('server_info:', json.dumps({k: d.get(k) for k in keys}))
print('server_info internal_states:', json.dumps([{k: v for k, v in s.items() if 'spec' in k or 'attention' in k} for s in d.get('internal_states') or []]))"
    grep -E "Initialized DDTree worker|Initialized DFLASH|DFLASH draft runner ready|Piecewise CUDA graph is disabled|for DDTREE|DDTREE speculative|verify completed|Mamba Cache is allocated|KV Cache is allocated|max_total_num_tokens=|Capture cuda graph end|Load weight end|mamba|Mamba" "$log" \
        | grep -v "server_args=" | sed -E 's/^\[[0-9: -]+( [A-Z]+[0-9]*)?\] //' | awk '!seen[$0]++' | head -16
    python3 - "$PORT" "${PROBE_TOKENS:-300}" "$svc" "$RUNS/greedy-$BACKEND.txt" <<'PY'
import hashlib, json, sys, urllib.request
port, n, svc, record = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
prompt = [(17 * i + 11) % 1000 + 12 for i in range(200)]
for attempt in ("first", "again (radix-cache hit)"):
    body = {"input_ids": prompt, "sampling_params": {"temperature": 0, "max_new_tokens": n, "ignore_eos": True}}
    try:
        req = urllib.request.Request(f"http://127.0.0.1:{port}/generate", json.dumps(body).encode(), {"Content-Type": "application/json"})
        out = json.load(urllib.request.urlopen(req, timeout=120))
    except Exception as exc:
        print(f"greedy probe ({attempt}): failed: {exc}"); continue
    ids = out.get("output_ids") or []
    text = out.get("text") or ""
    meta = out.get("meta_info") or {}
    digest = hashlib.sha1(json.dumps(ids or text).encode()).hexdigest()[:12]
    spec = {k: meta.get(k) for k in ("spec_verify_ct", "spec_accept_length", "cached_tokens") if k in meta}
    print(f"greedy probe ({attempt}): {len(ids) or meta.get('completion_tokens')} tokens, digest {digest}, "
          f"first 12: {text.split()[:12]}, tokens 250-256: {text.split()[250:256]}, {json.dumps(spec)}")
    with open(record, "a") as out:
        out.write(f"{svc:20} {attempt:24} {digest}  {' '.join(text.split()[:8])}\n")
PY
    echo "== $svc ($BACKEND): measure"
    MEASURE_SERVICES=$svc MEASURE_OUT=$RUNS/$tag.json MEASURE_PROMPTS=${MEASURE_PROMPTS:-64} \
        GPU_SERVICES=$svc "$CTL/bin/pyinfra" -y bench/ddtree/inventory.py measure.py > "$LOGS/measure-$tag.log" 2>&1 \
        || status=1
    sed -n '/prompts of/,/raw results/p' "$LOGS/measure-$tag.log"
    [ -f "$RUNS/$tag.json" ] || tail -30 "$LOGS/measure-$tag.log"
    grep -iE "ddtree|dflash" "$log" | grep -v "server_args=" | sed -E 's/^\[[0-9: -]+( [A-Z]+[0-9]*)?\] //' | grep -i "verify completed" | head -2
    cp "$log" "$LOGS/serve-$tag.log"
    kill -- -$pid 2>/dev/null; wait $pid 2>/dev/null
    for i in $(seq 30); do curl -s -o /dev/null "http://127.0.0.1:$PORT/health" || break; sleep 1; done
done
runs=()
for f in "$RUNS"/{plain,dflash,ddtree15,ddtree31,ddtree7,hybrid-plain,hybrid-dflash,hybrid-ddtree15,hybrid-ddtree31,hybrid-w-plain,hybrid-w-dflash,hybrid-w-ddtree15,hybrid-w-ddtree31}-"$BACKEND".json "$RUNS"/*-"$BACKEND".json; do
    [ -f "$f" ] && [[ " ${runs[*]-} " != *" $f "* ]] && runs+=("$f")
done
[ ${#runs[@]} -gt 0 ] && "$CTL/bin/python" -m views.measure combine "${RESULTS%.txt}.json" "${runs[@]}"
if [ -f "$RUNS/greedy-$BACKEND.txt" ]; then
    echo "greedy probes (${PROBE_TOKENS:-300} tokens after the same 200-token prompt, temperature 0): service, request, digest of the output ids, its first words"
    cat "$RUNS/greedy-$BACKEND.txt"
fi
echo "== done ($BACKEND): exit $status"
exit $status
