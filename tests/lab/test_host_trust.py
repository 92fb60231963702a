"""Root trusts only what root wrote, on a real lab host: a squatted model directory in /dev/shm.

Another local user (made here with useradd, no privileges) copies the staged marker while it is world-readable,
then, once /dev/shm no longer holds the model (a reboot empties it; here the test removes it), makes a
directory of that name with the marker's names and sizes, a config.json the stand-in accepts, and the copied
marker. Before, the next deploy found it "already staged" and served it (the next restart loaded it). Now it is moved aside (never
deleted), the model staged afresh from the store, and the service serves root's copy of the real files.

Runs on the spare host (SPARE), cleaned before and after; the user is removed at the end.
"""

from __future__ import annotations

import json
import shlex

import pytest

from operations.model import models
from tests.lab.labutil import (
    deploy,
    http_get,
    main_pid,
    refused_by_its_preflight,
    ssh,
    write_inventory,
)

pytestmark = pytest.mark.lab

MODEL = "Qwen3.6-27B-DFlash"
STAGED = f"/dev/shm/{MODEL}"
STORE = f"/root/models/{MODEL}"
PORT = 30140
SERVICE = {"gpu": 0, "port": PORT, "model": MODEL, "model_in": "shm"}
UNIT = "sglang-trust.service"
SQUATTER = "squatter"
MARKER = models.MARKER

# Run as the squatter: rebuild a model directory from a copy of its marker (names and sizes only: the store
# under /root is not readable to it), config.json a JSON object the stand-in loads.
PLANT = r"""
import json, os, shutil, sys
marker, dest, marker_name = sys.argv[1:4]
files = json.load(open(marker))["files"]
os.makedirs(dest)
for rel, (size, _sha, _crc) in files.items():
    path = os.path.join(dest, rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    body = b"P" * size
    if rel == "config.json":
        body = (b'{"planted": "' + b"P" * size)[: size - 2] + b'"}'
    open(path, "wb").write(body)
shutil.copyfile(marker, os.path.join(dest, marker_name))
"""


@pytest.fixture
def host(spare_with_venv):
    """The spare host, cleaned before and after (its venv kept), with an unprivileged user of its own."""
    ssh(spare_with_venv, f"id {SQUATTER} >/dev/null 2>&1 || useradd --system --no-create-home --shell /usr/sbin/nologin {SQUATTER}")
    yield spare_with_venv
    ssh(spare_with_venv, f"rm -f /var/tmp/{SQUATTER}-marker.json /var/tmp/plant.py; userdel {SQUATTER}; true", check=False)


def as_squatter(host: str, command: str) -> str:
    return ssh(host, f"runuser -u {SQUATTER} -- sh -c {shlex.quote(command)}").stdout


def sha256s(host: str, root: str) -> str:
    return ssh(host, f"cd {root} && find . -type f ! -name '.sglang-deploy-*' | sort | xargs sha256sum").stdout


def test_a_squatted_shm_directory_is_moved_aside_staged_afresh_and_the_real_files_served(host):
    inventory = write_inventory("test_host_trust", {host: {"services": {"trust": SERVICE}, "run_services": ["trust"]}})
    first = deploy(inventory)
    assert first.returncode == 0, first
    assert http_get(host, PORT, "/health")[0] == 200
    # The deploy's state (saved units, the started records with the key file's sha256) is root's alone.
    modes = ssh(host, "stat -c '%a %U %n' /var/lib/sglang-deploy /var/lib/sglang-deploy/started /var/lib/sglang-deploy/rollback "
                      f"/var/lib/sglang-deploy/started/{UNIT}.json").stdout.split("\n")
    assert [line.split()[:2] for line in modes if line] == [["700", "root"]] * 3 + [["600", "root"]], modes

    # The marker is world-readable (names, sizes, hashes): the squatter keeps a copy.
    as_squatter(host, f"cp {STAGED}/{MARKER} /var/tmp/{SQUATTER}-marker.json")
    # The staged copy gone (as after a reboot, before anything staged it again): the squatter gets there first.
    before = main_pid(host, UNIT)
    ssh(host, f"rm -rf {STAGED}")
    ssh(host, f"cat > /var/tmp/plant.py <<'EOF'\n{PLANT}\nEOF\nchmod 644 /var/tmp/plant.py")
    as_squatter(host, f"python3 /var/tmp/plant.py /var/tmp/{SQUATTER}-marker.json {STAGED} {MARKER}")
    assert ssh(host, f"stat -c %U {STAGED} {STAGED}/{MARKER}").stdout.split() == [SQUATTER, SQUATTER]
    planted = sha256s(host, STAGED)
    assert planted != sha256s(host, STORE)

    again = deploy(inventory)
    assert again.returncode == 0, again
    changed = [name for name, _hosts in again.changed]
    assert f"Model {MODEL} staged in /dev/shm" in changed, again
    # Served: root's copy of the store's files, with the service (re)started on it.
    assert sha256s(host, STAGED) == sha256s(host, STORE)
    found = [line.split() for line in ssh(host, f"find {STAGED} -printf '%u %m\\n'").stdout.splitlines()]
    assert {owner for owner, _ in found} == {"root"} and not [mode for _, mode in found if int(mode, 8) & 0o022]
    assert main_pid(host, UNIT) not in (0, before) and http_get(host, PORT, "/health")[0] == 200  # restarted onto it
    assert "adopted" not in json.loads(ssh(host, f"cat {STAGED}/{MARKER}").stdout)
    # The planted directory is kept, whole and still the squatter's: it may be someone's data.
    aside = ssh(host, f"ls -d /dev/shm/.{MODEL}.untrusted-*").stdout.split()
    assert len(aside) == 1
    assert ssh(host, f"stat -c %U {aside[0]}").stdout.strip() == SQUATTER and sha256s(host, aside[0]) == planted
    # Converged: the planted copy is neither in the way nor removed by the unused-model pass.
    third = deploy(inventory)
    assert third.returncode == 0 and third.changed == [], third
    assert ssh(host, f"ls -d /dev/shm/.{MODEL}.untrusted-*").stdout.split() == aside


# A shm dir the deploy must make (shm_dir: /dev/shm/models, absent): the squatter takes the name first --------------

SHM_DIR = "/dev/shm/models"
SQUAT = f"/var/tmp/{SQUATTER}-models"  # the squatter's own directory, where their links lead


def owner_and_mode(host: str, path: str) -> list[str]:
    return ssh(host, f"stat -c '%U %a %F' {path}").stdout.strip().split(maxsplit=2)


@pytest.mark.parametrize("squatted", ["link", "directory"])
def test_a_shm_dir_another_user_made_or_linked_first_is_moved_aside_and_nothing_runs_from_it(host, squatted):
    """Before, the deploy judged the absent /dev/shm/models trusted ("root makes it") and made it with `mkdir -p`,
    which takes a directory another user made first as it is: staging then stopped there (or, had that user been
    quicker than the check, copied the model into their directory). Now the stage script makes it itself,
    exclusively and checked on its handle: another user's directory or link there is moved aside (never deleted),
    the directory made afresh as root's, and the service loads root's copy; nothing is written where their link
    leads, and nothing of theirs is run."""
    staged = f"{SHM_DIR}/{MODEL}"
    inventory = write_inventory("test_host_trust_shm_dir", {
        host: {"services": {"trust": SERVICE}, "run_services": ["trust"], "shm_dir": SHM_DIR},
    })
    # Their directory with a config.json the stand-in would load, and a link where the deploy's directory goes.
    as_squatter(host, f"rm -rf {SQUAT} && mkdir -p {SQUAT}/{MODEL} && echo '{{\"planted\": true}}' > {SQUAT}/{MODEL}/config.json")
    if squatted == "link":
        as_squatter(host, f"ln -s {SQUAT} {SHM_DIR}")
    else:
        as_squatter(host, f"mkdir -m 777 {SHM_DIR} && ln -s {SQUAT}/{MODEL} {staged}")
    assert owner_and_mode(host, SHM_DIR)[0] == SQUATTER
    ssh(host, "rm -f /run/lock/sglang-deploy-stage.lock")  # an older deploy's lock file: none is made there now
    planted = ssh(host, f"find {SQUAT} -printf '%u %m %p\\n' | sort").stdout
    try:
        result = deploy(inventory)
        assert result.returncode == 0, result
        assert http_get(host, PORT, "/health")[0] == 200
        # Root's directory, made afresh; theirs kept whole beside it, still theirs.
        assert owner_and_mode(host, SHM_DIR) == ["root", "755", "directory"]
        aside = ssh(host, "ls -d /dev/shm/.models.untrusted-*").stdout.split()
        assert len(aside) == 1 and owner_and_mode(host, aside[0])[0] == SQUATTER
        assert owner_and_mode(host, aside[0])[2] == ("symbolic link" if squatted == "link" else "directory")
        # Nothing written where their link led, nothing of root's put there.
        assert ssh(host, f"find {SQUAT} -printf '%u %m %p\\n' | sort").stdout == planted
        # Served: root's copy of the store, root's throughout; the service runs from it, not from theirs.
        assert sha256s(host, staged) == sha256s(host, STORE)
        found = [line.split() for line in ssh(host, f"find {staged} -printf '%u %m %y\\n'").stdout.splitlines()]
        assert {owner for owner, _, _ in found} == {"root"} and {kind for _, _, kind in found} <= {"d", "f"}
        assert not [mode for _, mode, _ in found if int(mode, 8) & 0o022]
        info = json.loads(http_get(host, PORT, "/model_info")[1])
        assert info["model_path"] == staged
        pid = main_pid(host, UNIT)
        assert SQUAT not in ssh(host, f"cat /proc/{pid}/cmdline | tr '\\0' ' '; ls -l /proc/{pid}/cwd /proc/{pid}/fd 2>/dev/null").stdout
        # The staging lock lies in root's own directory, not in a world-writable one.
        assert owner_and_mode(host, "/run/sglang-deploy") == ["root", "700", "directory"]
        assert ssh(host, "ls /run/lock/sglang-deploy-stage.lock 2>/dev/null || true").stdout.strip() == ""
        assert ssh(host, f"ls {SHM_DIR}/.sglang-deploy-stage.lock /dev/shm/.sglang-deploy-stage.lock 2>/dev/null || true").stdout.strip() == ""
        # Converged: theirs is neither in the way nor removed.
        again = deploy(inventory)
        assert again.returncode == 0 and again.changed == [], again
        assert ssh(host, "ls -d /dev/shm/.models.untrusted-*").stdout.split() == aside
    finally:
        ssh(host, f"rm -rf {SQUAT}", check=False)


def test_a_file_the_engine_would_load_from_another_users_directory_fails_the_preflight_and_nothing_changes(host):
    """Issue 46 item 4 on a real host: a chat template in a directory an unprivileged user owns passes validation (the
    control machine cannot know the owner) and fails the service's preflight, which runs as the service user, naming
    the flag, the path and its owner; no unit is written. Given to root, the same data deploys and serves."""
    ssh(host, "mkdir -p /srv/templates && printf '{{ messages }}' > /srv/templates/t.jinja && "
              f"chown -R {SQUATTER} /srv/templates")
    service = {**SERVICE, "args": {"chat-template": "/srv/templates/t.jinja"}}
    inventory = write_inventory("test_host_trust_engine_paths", {host: {"services": {"trust": service}, "run_services": ["trust"]}})
    try:
        out = refused_by_its_preflight(host, inventory, "trust", "the flag --chat-template names /srv/templates/t.jinja, "
                                       "which the engine loads, runs or searches, and ")
        assert f"({SQUATTER})" in out and "only root or the service account may write what the engine loads" in out
        ssh(host, "chown -R root:root /srv/templates")
        again = deploy(inventory)
        assert again.returncode == 0, again
        assert http_get(host, PORT, "/health")[0] == 200
    finally:
        ssh(host, f"systemctl disable --now {UNIT} >/dev/null 2>&1; rm -f /etc/systemd/system/{UNIT}; "
                  "systemctl daemon-reload; rm -rf /srv/templates /etc/sglang-deploy/secrets/trust.yml; true", check=False)
