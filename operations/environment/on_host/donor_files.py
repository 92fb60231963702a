# Run on a donor host: list, relative to the venv's root, every file of the named
# distributions (their RECORD entries, the .dist-info directory included), for `tar -T -`.
# The venv is the live generation behind LIVE. Exits 1 naming a distribution that is missing
# or has another version, so that nothing is streamed from a donor that does not hold the pin.
# argv: LIVE NAME==VERSION...
import csv
import glob
import os
import sys

from _common import norm  # noqa: E402 - remote.script puts _common.py here

root = os.path.realpath(sys.argv[1])
wanted = dict(spec.split("==", 1) for spec in sys.argv[2:])


sites = glob.glob(os.path.join(root, "lib", "python3*", "site-packages"))
if not sites:
    sys.exit(f"{sys.argv[1]} holds no venv")
site = sites[0]
found = {}
for info in glob.glob(os.path.join(site, "*.dist-info")):
    name = version = None
    with open(os.path.join(info, "METADATA"), encoding="utf-8", errors="replace") as handle:
        for line in handle:
            if not line.strip():
                break
            if line.startswith("Name:"):
                name = norm(line[5:].strip())
            elif line.startswith("Version:"):
                version = line[8:].strip()
    if name in wanted:
        found[name] = (version, info)
out = []
for name, version in sorted(wanted.items()):
    if name not in found or found[name][0] != version:
        have = found.get(name, ("not installed",))[0]
        sys.exit(f"donor venv {root}: {name} is {have}, the stack pins {version}")
    with open(os.path.join(found[name][1], "RECORD"), newline="", encoding="utf-8") as handle:
        for row in csv.reader(handle):
            if row and row[0]:
                path = os.path.normpath(os.path.join(site, row[0]))
                if os.path.lexists(path):
                    out.append(os.path.relpath(path, root))
sys.stdout.write("\n".join(out) + "\n")
