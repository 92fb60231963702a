# Make generation ID the live venv: LIVE (the link the deploy switches) becomes a symlink to
# LIVE.generations/ID in one rename, so a process starting at any moment sees either the old
# or the new environment, whole. The generation it replaces is kept as `previous` (for
# rollback, which is this same switch back); older generations are deleted, but one a unit of
# ours still runs (its ExecStart names its generation: a replica kept on its old version).
# A plain venv directory at LIVE (from before generations) is moved in as a generation, but only a
# venv (pyvenv.cfg, bin/python) of root's: anything else is refused, named, and never moved or
# deleted. Root runs what LIVE leads to: LIVE, the generations directory and the generation switched
# to must be root's and writable by root alone, as every directory above them
# (_common.why_untrusted); a generation that is not is never deleted either.
# argv: LIVE ID, or LIVE --previous (roll back to the kept generation)
import json
import os
import re
import shutil
import sys
import time

from _common import (  # noqa: E402 - remote.script puts _common.py here
    exchange,
    new_file,
    parents_untrusted,
    why_untrusted,
)

live, wanted = sys.argv[1:3]
UNIT_DIR = "/etc/systemd/system"  # configuration/host_paths.py UNIT_DIR
generations = live + ".generations"
state_path = os.path.join(generations, "state.json")


def refuse(why):
    sys.exit(
        f"{why}: root runs {live}/bin/python; refusing to switch (nothing was moved or deleted): "
        "make it root's and writable by root alone (chown root: / chmod go-w), or move it away, "
        "and re-run")


def legacy_venv_problem(path):
    """Why the plain directory at LIVE may not be adopted as a generation, or None."""
    why = why_untrusted(path)
    if why:
        return why
    missing = [name for name in ("pyvenv.cfg", "bin/python")
               if not os.path.lexists(os.path.join(path, name))]
    if missing:
        return (f"{path}: expected a venv (pyvenv.cfg, bin/python) or a symlink to a generation; "
                f"found a directory without {' or '.join(missing)}")
    return (why_untrusted(os.path.join(path, "pyvenv.cfg"))
            or why_untrusted(os.path.join(path, "bin")))


why = why_untrusted(generations) or parents_untrusted(live)
if why:
    refuse(why)
try:
    if why_untrusted(state_path):
        raise OSError("not trusted")  # the rollback target is root's word alone
    with open(state_path) as handle:
        state = json.load(handle)
except (OSError, ValueError):
    state = {}
if wanted == "--previous":
    wanted = state.get("previous")
    if not wanted:
        sys.exit(
            f"{live}: no previous generation is recorded in {state_path}: nothing to roll back to")
target = os.path.join(generations, wanted)
if not os.path.isdir(target):
    sys.exit(f"{target} does not exist: nothing to switch to")
if why_untrusted(target):
    refuse(why_untrusted(target))


tmp = f"{live}.switch-{os.getpid()}"
os.symlink(target, tmp)
previous = None
if os.path.islink(live):
    previous = os.path.basename(os.path.realpath(live))
    os.rename(tmp, live)
elif os.path.isdir(live):
    why = legacy_venv_problem(live)
    if why:
        os.unlink(tmp)
        refuse(why)
    # The plain venv becomes a generation. It keeps working where it lies now: units run
    # `<venv>/bin/python -m ...`, and Python finds its site-packages from pyvenv.cfg beside bin/.
    previous = "legacy-%d" % int(time.time())
    exchange(tmp, live)
    os.rename(tmp, os.path.join(generations, previous))
elif not os.path.lexists(live):
    os.rename(tmp, live)
else:
    os.unlink(tmp)
    sys.exit(f"{live} is neither a venv directory nor a symlink: move it away and re-run")

if previous == wanted:
    previous = state.get("previous")
state = {"live": wanted, "previous": previous, "switched_at": int(time.time())}
# made afresh (O_EXCL|O_NOFOLLOW), never through a link
with new_file(state_path + ".tmp") as handle:
    json.dump(state, handle)
os.rename(state_path + ".tmp", state_path)


def named_by_units():
    """The generations a unit of ours runs (its ExecStart names the generation, not the link): a
    replica kept on its old version restarts there, so its generation stays."""
    named = set()
    prefix = os.path.join(generations, "")
    try:
        units = os.listdir(UNIT_DIR)
    except OSError:
        units = []
    for unit in units:
        if not (unit.startswith("sglang-") and unit.endswith(".service")):
            continue
        try:
            with open(os.path.join(UNIT_DIR, unit), errors="replace") as handle:
                text = handle.read()
        except OSError:
            continue
        named.update(re.findall(re.escape(prefix) + r"([^/\s]+)/", text))
    return named


kept = {wanted, previous} | named_by_units()
for name in os.listdir(generations):
    if name in kept or name.endswith(".json") or name.endswith(".tmp"):
        continue
    if why_untrusted(os.path.join(generations, name)):
        continue  # not root's: never deleted (it may be someone's data), and never run either
    shutil.rmtree(os.path.join(generations, name), ignore_errors=True)
print(json.dumps(state))
