# Fact script: the serving venv's generations, read with the host's own python3 (stdlib only),
# so it works before any venv exists and costs one round trip on a converged host.
# argv: LIVE_PATH GENERATION_PATH HOST_CACHE UV_BINARY
#
# LIVE_PATH is what units run (`LIVE_PATH/bin/python`): a symlink to the live generation, or a
# plain venv directory from before generations existed. GENERATION_PATH is the generation this
# deploy wants. For each venv read (the wanted generation, and the live one when it is another
# directory) every distribution is listed from its .dist-info: name, version (local tag kept),
# installer, and the files its RECORD names that are missing or have another size (bytecode is
# left out, and so are files a patch set replaced, which the patch sets check themselves).
# Files that two distributions both claim (two kernel builds owning `sgl_kernel/`) are reported.
import csv
import glob
import json
import os
import platform
import re
import sys

live, wanted, host_cache, uv_binary = sys.argv[1:5]


def norm(name):
    return re.sub(r"[-_.]+", "-", name).lower()


def python_version(venv):
    try:
        with open(os.path.join(venv, "pyvenv.cfg")) as handle:
            for line in handle:
                key, _, value = line.partition("=")
                if key.strip() in ("version", "version_info"):
                    return value.strip()
    except OSError:
        return None
    return None


def patched_files(venv):
    out = set()
    for record in glob.glob(os.path.join(venv, ".sglang-deploy", "patches", "*", "applied.json")):
        try:
            with open(record) as handle:
                out.update(json.load(handle).get("files", {}))
        except (OSError, ValueError):
            pass
    return out


def metadata(dist_info):
    name = version = None
    try:
        with open(os.path.join(dist_info, "METADATA"), encoding="utf-8", errors="replace") as handle:
            for line in handle:
                if not line.strip():
                    break
                if line.startswith("Name:"):
                    name = line[5:].strip()
                elif line.startswith("Version:"):
                    version = line[8:].strip()
    except OSError:
        pass
    return name, version


def read_venv(venv):
    python = python_version(venv)
    if python is None:
        return None
    sites = glob.glob(os.path.join(venv, "lib", "python3*", "site-packages"))
    site = sites[0] if sites else None
    patched = patched_files(venv)
    dists, claims = {}, {}
    for dist_info in sorted(glob.glob(os.path.join(site, "*.dist-info"))) if site else ():
        name, version = metadata(dist_info)
        if not name or not version:
            continue
        try:
            with open(os.path.join(dist_info, "INSTALLER")) as handle:
                installer = handle.read().strip()
        except OSError:
            installer = ""
        damaged, files = [], 0
        try:
            with open(os.path.join(dist_info, "RECORD"), newline="", encoding="utf-8") as handle:
                rows = list(csv.reader(handle))
        except OSError:
            rows = None
        for row in rows or ():
            if not row or not row[0] or row[0].endswith(".pyc"):
                continue
            rel = row[0]
            files += 1
            path = os.path.normpath(os.path.join(site, rel))
            try:
                size = os.lstat(path).st_size
            except OSError:
                damaged.append((rel, None))
                continue
            # Scripts outside site-packages (bin/) name their venv's path, which a generation's
            # copy rewrites: for them only presence counts.
            if len(row) > 2 and row[2].isdigit() and int(row[2]) != size and rel not in patched and not rel.startswith("..") and os.path.isfile(path):
                damaged.append((rel, size))
            if len(row) > 2 and row[2] not in ("", "0") and not rel.startswith("..") and ".dist-info/" not in rel:
                claims.setdefault(rel, []).append((norm(name), row[2]))
        dists[norm(name)] = {
            "version": version,
            "installer": installer,
            "files": files,
            "record": rows is not None,
            "damaged": damaged,
        }
    for dist in dists.values():
        # A file two wheels both ship (sglang 0.5.11's flashinfer-python and torch-c-dlpack-ext
        # each carry their own top-level build_backend.py) holds the copy installed last: it is
        # right if it matches any of its claimants' RECORD.
        damaged = [rel for rel, size in dist["damaged"] if size is None or str(size) not in {s for _, s in claims.get(rel, ())}]
        dist["damaged"], dist["damaged_count"] = damaged[:5], len(damaged)
    shared = {}
    for rel, owners in claims.items():
        # Two distributions owning one package directory (two kernel builds, both `sgl_kernel/`)
        # is a conflict; a loose top-level file both ship is not one (see above).
        if len(owners) > 1 and "/" in rel:
            top = rel.split("/", 1)[0]
            shared.setdefault(top, set()).update(o for o, _ in owners)
    return {
        "path": venv,
        "python": python,
        "dists": dists,
        "shared": {top: sorted(owners) for top, owners in sorted(shared.items())},
    }


if os.path.islink(live):
    kind, target = "link", os.path.realpath(live)
elif os.path.isdir(live):
    kind, target = "dir", os.path.realpath(live)
elif os.path.lexists(live):
    kind, target = "other", None
else:
    kind, target = "absent", None

wanted_state = read_venv(wanted)
live_state = read_venv(target) if target and target != os.path.realpath(wanted) else None
try:
    cache = {n: os.path.getsize(os.path.join(host_cache, n)) for n in os.listdir(host_cache) if n.endswith(".whl")}
except OSError:
    cache = {}
print(json.dumps({
    "machine": platform.machine(),
    "live": {"kind": kind, "target": target},
    "wanted": wanted_state,
    "live_state": live_state,
    "cache": cache,
    "uv": os.access(uv_binary, os.X_OK),
}))
