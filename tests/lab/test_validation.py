"""A bad value for one host stops the whole run before any host is touched (issue 11).

pyinfra connects every host, then loads deploy.py per host in parallel; the first load validates
the whole inventory (configuration/settings.py `validate_inventory`) and every load raises the same
error, so no host's deploy lock is taken and nothing on any host changes. Checked by a fingerprint
of each host's relevant state (the lock file, units, our directories, the services' processes),
read before and after a real run (`-y`) and a `--dry` run with one bad value on one host.
"""

from __future__ import annotations

import json

import pytest

from configuration import engine_flags
from tests.lab.labutil import ROOT, deploy, lab_hosts, ssh, write_inventory

pytestmark = pytest.mark.lab

# What a deploy could change on a host: the lock file, units, our files and directories (names,
# sizes, mtimes, inodes), and which service processes run.
FINGERPRINT = r"""
for p in /run/sglang-deploy.lock /etc/systemd/system /etc/sglang-deploy /usr/local/lib/sglang-deploy \
         /var/cache/sglang-deploy /root /root/models /dev/shm; do
  [ -e "$p" ] && find "$p" -maxdepth 2 \( -name 'sglang*' -o -path '/root/*' -o -path '/dev/shm/*' -o -path '/var/cache/*' -o -path '/etc/sglang-deploy*' -o -path '/usr/local/lib/sglang-deploy*' -o -path '/run/sglang-deploy.lock' \) -printf '%p %s %T@ %i\n' 2>/dev/null
  [ -e "$p" ] || echo "$p absent"
done | sort
systemctl list-units 'sglang-*' --all --no-legend --plain | sort
for u in $(systemctl list-units 'sglang-*' --all --no-legend --plain | cut -d' ' -f1); do echo "$u $(systemctl show -p MainPID --value $u)"; done
"""


def fingerprints() -> dict[str, str]:
    return {host: ssh(host, FINGERPRINT).stdout for host in lab_hosts()}


def lab_placement() -> dict[str, dict]:
    """Every lab host with its placement as lab/inventory.py has it."""
    hosts = {}
    namespace: dict = {}
    exec((ROOT / "lab" / "inventory.py").read_text(), namespace)
    for name, data in namespace["lab_hosts"]:
        hosts[name] = {"run_services": data.get("run_services", [])}
    return hosts


def test_a_bad_value_for_one_host_touches_no_host():
    hosts = lab_placement()
    spare = next(h for h, data in hosts.items() if not data["run_services"])
    # A service whose flag is a prefix the engine reads as --host: the exposure rule would be bypassed.
    bad = {"gpu": 0, "port": 30140, "model": "Qwen3.6-27B-DFlash", "model_in": "store", "args": {"hos": "0.0.0.0"}}
    hosts[spare] = {"services": {"sneaky": bad}, "run_services": ["sneaky"]}
    inventory = write_inventory("test_validation", hosts)
    before = fingerprints()
    try:
        for extra in ((), ("--dry",)):
            result = deploy(inventory, *extra, as_json=False)
            assert result.returncode != 0, result
            output = result.stdout + result.stderr
            assert (f"inventory (host {spare}): services.sneaky.args.hos: '0.0.0.0': `--host` is derived from the service key "
                    "`bind` (the engine's parser reads `--hos` as `--host`); set that instead") in output
            assert "Traceback" not in output
            assert fingerprints() == before
    finally:
        inventory.unlink(missing_ok=True)


def test_the_checked_in_engine_flags_are_the_lab_venvs_parser():
    """files/engine_flags/sglang-<version>[+<patch set>].json is what the real parser in a lab venv says."""
    found = None
    for host in lab_hosts():
        listing = ssh(host, "for g in /root/venv_sglang*.generations/*; do [ -x $g/bin/python ] && "
                            "[ -d $g/lib/python3.11/site-packages/sglang ] && echo $g $(ls $g/.sglang-deploy/patches 2>/dev/null); done; true").stdout
        if listing.strip():
            found = (host, *listing.splitlines()[0].split())
            break
    if found is None:
        pytest.skip("no lab host holds a venv with sglang yet (run tests/lab/test_deploy.py first)")
    host, generation, *patch_sets = found
    script = (ROOT / "operations" / "environment" / "on_host" / "engine_flags.py").read_text()
    out = ssh(host, f"cd / && CUDA_VISIBLE_DEVICES= {generation}/bin/python - <<'PYEOF'\n{script}\nPYEOF").stdout
    live = json.loads(out.strip().splitlines()[-1])
    assert len(patch_sets) <= 1, patch_sets
    stored = json.loads(engine_flags.file_for(live["version"], patch_sets[0] if patch_sets else None).read_text())
    assert {k: v for k, v in stored.items() if k != "patch_set"} == live, (
        f"{generation} on {host}: regenerate with python -m tools.engine_flags generate VENV_PYTHON"
    )
