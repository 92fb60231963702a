"""One plan, read three ways, on the lab (issue 37 items 2 and 4): for each class of drift the tests know, applied
on a converged lab host, the status view reports drift exactly in the steps that the JSON plan (`deploy.py --dry`
with PLAN_JSON) names, and the deploy then changes exactly those steps; the next plan is empty (exit 0).

SPARE (default gpu-b) runs `pa` (the patched venv, a model staged in /dev/shm, an API key) and `pb` (the plain
venv, the same model). The cases run in order on the one host; the last changes a flag in the data.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from configuration.patch_sets import load_patch_set
from tests.lab.labutil import PYINFRA, ROOT, SPARE, clean_host, deploy, ssh, write_inventory

pytestmark = pytest.mark.lab

ENV = {"SGLANG_DEPLOY_SECRET_PLAN_KEY": "lab-plan-key-0123456789abcdef"}
PLAIN, PATCHED = "/root/venv_sglang", "/root/venv_sglang+ddtree-sample"
SITE = "lib/python3.11/site-packages"
MODEL = "/dev/shm/Qwen3.6-27B"


def inventory(max_requests: int = 8) -> Path:
    services = {
        "pa": {"gpu": 0, "port": 30600, "model": "Qwen3.6-27B", "model_in": "shm", "patch_sets": ["ddtree-sample"],
               "api_key_secret": "plan-key", "args": {"max-running-requests": max_requests}},
        "pb": {"gpu": 1, "port": 30601, "model": "Qwen3.6-27B", "model_in": "shm"},
    }
    return write_inventory("test_plan", {SPARE: {"services": services, "run_services": list(services)}})


def status_steps(inv: Path, tmp_path: Path) -> tuple[int, set[str]]:
    code, changes = status_plan(inv, tmp_path)
    return code, {c["step"] for c in changes}


def status_plan(inv: Path, tmp_path: Path) -> tuple[int, list[dict]]:
    """The status view's exit code, and the plan its rows show for SPARE."""
    out = tmp_path / "status.json"
    proc = subprocess.run([PYINFRA, str(inv), "status.py", "-y"], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, **ENV, "STATUS_JSON": str(out)})
    rows = [r for r in json.loads(out.read_text())["rows"] if r["host"] == SPARE]
    assert rows and all("plan" in r for r in rows), proc.stdout + proc.stderr
    return proc.returncode, [c for r in rows for c in r["plan"]]


def planned(inv: Path, tmp_path: Path) -> tuple[int, dict]:
    out = tmp_path / "plan.json"
    proc = subprocess.run([PYINFRA, str(inv), "deploy.py", "--dry"], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, env={**os.environ, **ENV, "PLAN_JSON": str(out)})
    doc = json.loads(out.read_text())
    assert doc["exit_code"] == proc.returncode, proc.stdout + proc.stderr
    (host,) = [h for h in doc["hosts"] if h["host"] == SPARE]
    return proc.returncode, host


def changed_steps(result) -> set[str]:
    ops = result.results.get("operations", [])
    return {op["name"].split(" | ", 1)[0] for op in ops if SPARE in (op.get("success") or [])}


def patched_file() -> str:
    return f"{PATCHED}/{SITE}/{load_patch_set('ddtree-sample').files[0].path}"


# (what drifts, the command that makes it drift on SPARE, the steps whose plan must name it)
DRIFTS = [
    ("unit content", "echo '# edited' >> /etc/systemd/system/sglang-pa.service", {"Service"}),
    ("unit mode", "chmod 664 /etc/systemd/system/sglang-pa.service", {"Service"}),
    ("unit owner", "chown nobody /etc/systemd/system/sglang-pb.service", {"Service"}),
    ("venv file changed", f"echo '# edited' >> {PLAIN}/{SITE}/tqdm/std.py", {"Environments", "Service"}),
    ("venv file deleted", f"rm {PLAIN}/{SITE}/idna/core.py", {"Environments", "Service"}),
    ("patched file edited", None, {"Environments", "Service"}),
    ("staged file changed", f"f=$(ls {MODEL}/*.json | head -1); echo ' ' >> $f", {"Models", "Service"}),
    ("staged file deleted", f"rm $(ls {MODEL}/*.json | head -1)", {"Models", "Service"}),
    ("service stopped", "systemctl stop sglang-pb.service", {"Service"}),
    ("service disabled", "systemctl disable sglang-pb.service", {"Service"}),
    ("key file mode", "chmod 604 /etc/sglang-deploy/secrets/pa.yml", {"Service"}),
    ("key file deleted", "rm /etc/sglang-deploy/secrets/pa.yml", {"Service"}),
    ("secrets directory mode", "chmod 755 /etc/sglang-deploy/secrets", {"Service account"}),
    ("boot staging unit disabled", "systemctl disable sglang-stage-models.service", {"Models"}),
    ("state directory mode", "chmod 755 /var/lib/sglang-deploy", {"Environments"}),
    ("a flag changed in the data", "flag", {"Service"}),
]


@pytest.fixture(scope="module")
def converged_host():
    clean_host(SPARE, keep_venv=True)
    result = deploy(inventory(), env=ENV)
    assert result.returncode == 0, result
    yield
    clean_host(SPARE, keep_venv=True)


@pytest.mark.parametrize(("what", "command", "steps"), DRIFTS, ids=[d[0] for d in DRIFTS])
def test_status_plan_and_deploy_agree_on_each_drift(converged_host, tmp_path, what, command, steps):
    inv = inventory()
    code, plan = planned(inv, tmp_path)
    assert code == 0 and plan["changes"] == [], f"not converged before the drift: {plan}"
    if command == "flag":
        inv = inventory(max_requests=16)
    else:
        ssh(SPARE, command or f"echo '# edited' >> {patched_file()}")

    status_code, seen = status_steps(inv, tmp_path)
    code, plan = planned(inv, tmp_path)
    named = {c["step"] for c in plan["changes"]}
    assert code == 2 and not plan["refusals"] and not plan["unread"], plan
    assert steps <= named, f"{what}: the plan names {named}, the drift is in {steps}: {plan}"
    assert seen == named, f"{what}: the status view shows drift in {seen}, the plan in {named}"
    assert status_code in (1, 2)

    result = deploy(inv, env=ENV)
    assert result.returncode == 0, result
    assert changed_steps(result) == named, f"{what}: the deploy changed {changed_steps(result)}, the plan said {named}: {plan}"

    code, plan = planned(inv, tmp_path)
    assert code == 0 and plan["changes"] == [], f"{what}: not converged after one run: {plan}"


BACKUPS = "/var/lib/sglang-deploy/rollback"
ORIGINALS = f"{PATCHED}/.sglang-deploy/patches/ddtree-sample/original"
# (what the deploy refuses, the command that makes SPARE so, the command that mends it, the step that refuses):
# each refusal the deploy fails the host with, the plan and the status view must show first, with the same text.
REFUSALS = [
    ("a kept directory is a file", f"mv {BACKUPS} {BACKUPS}.away && touch {BACKUPS}",
     f"rm {BACKUPS} && mv {BACKUPS}.away {BACKUPS}", "Environments"),
    ("a patched file changed with no backup of its original",
     f"cp -a {ORIGINALS} /root/originals.away && rm -rf {ORIGINALS} && echo '# edited' >> {{patched}}",
     f"rm -rf {ORIGINALS} && mv /root/originals.away {ORIGINALS}", "Environments"),
    ("the service user is someone else's", "groupadd -f plan-other && gpasswd -a sglang plan-other",
     "gpasswd -d sglang plan-other; groupdel plan-other", "Service account"),
]


@pytest.mark.parametrize(("what", "breaks", "mends", "step"), REFUSALS, ids=[r[0] for r in REFUSALS])
def test_status_plan_and_deploy_refuse_alike(converged_host, tmp_path, what, breaks, mends, step):
    inv = inventory()
    code, plan = planned(inv, tmp_path)
    if plan["changes"]:  # the drift cases above end on another flag's data: converge on this one first
        result = deploy(inv, env=ENV)
        assert result.returncode == 0, result
        code, plan = planned(inv, tmp_path)
    assert code == 0 and plan["changes"] == [], f"not converged before: {plan}"
    ssh(SPARE, breaks.format(patched=patched_file()))
    try:
        code, plan = planned(inv, tmp_path)
        refused = [r for r in plan["refusals"] if r["step"] == step]
        assert code == 1 and len(refused) == 1, f"{what}: {plan}"
        # The status view shows the refusal as drift (its services still serve: exit 2, docs/status.md).
        status_code, shown = status_plan(inv, tmp_path)
        assert status_code == 2 and refused[0] in shown, f"{what}: the status view shows {shown}"
        result = deploy(inv, env=ENV, as_json=False)
        assert result.returncode != 0, result
        assert refused[0]["why"] in result.stdout + result.stderr, f"{what}: the deploy failed otherwise: {result}"
    finally:
        ssh(SPARE, mends)
    result = deploy(inv, env=ENV)
    assert result.returncode == 0, result
    code, plan = planned(inv, tmp_path)
    assert code == 0 and plan["changes"] == [], f"{what}: not converged once mended: {plan}"
