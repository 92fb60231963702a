"""Drift that must converge in one run and restart only what loads it (issue 12: items 1-3).

Two services on LAB_CONVERGE_HOST (default gpu-b, which no lab service uses): `cva` runs the patched venv
(`/root/venv_sglang+ddtree-sample`), `cvb` the plain one (`/root/venv_sglang`); both load one model staged in
/dev/shm. The tests run in order and share that host:

- files of cva's live venv edited in place (appended, truncated, a byte flipped with a new mtime, a byte
  flipped with its mtime put back): the fast check repairs the first three and says what it compared, a
  `verify_env=full` run the fourth; cvb's venv and uv's cache keep their bytes, cvb keeps its PID, nothing
  in either venv shares an inode with anything, and a further run changes nothing;
- a touched unit, a touched staged file and a junk file beside the staged model: no change, no restart;
- a byte flipped in the staged model (its mtime changed) with `verify_models: fast`: re-staged, the junk
  file gone with the old copy, and a further run changes nothing.
"""

from __future__ import annotations

import os
import shlex

import pytest

from tests.lab.labutil import clean_host, deploy, main_pid, ssh, write_inventory

pytestmark = pytest.mark.lab

HOST = os.environ.get("LAB_CONVERGE_HOST", "gpu-b")
PLAIN, PATCHED = "/root/venv_sglang", "/root/venv_sglang+ddtree-sample"
SITE = "lib/python3.11/site-packages"
UV_CACHE = "/var/cache/sglang-deploy/wheels/.uv-cache"
UNIT_A, UNIT_B = "sglang-cva.service", "sglang-cvb.service"
MODEL = "/dev/shm/Qwen3.6-27B"
# One file per kind of edit, each in another distribution, none of them replaced by the patch set.
APPENDED, TRUNCATED, FLIPPED, FLIPPED_KEPT = "tqdm/std.py", "pygments/lexer.py", "requests/api.py", "idna/core.py"
EDITED = (APPENDED, TRUNCATED, FLIPPED, FLIPPED_KEPT)


def inventory():
    services = {
        "cva": {"gpu": 0, "port": 30400, "model": "Qwen3.6-27B", "model_in": "shm", "patch_sets": ["ddtree-sample"]},
        "cvb": {"gpu": 1, "port": 30401, "model": "Qwen3.6-27B", "model_in": "shm"},
    }
    return write_inventory("test_convergence", {HOST: {"services": services, "run_services": list(services)}})


def sh(command: str, timeout: int = 120) -> str:
    return ssh(HOST, command, timeout=timeout).stdout


def digests(paths: list[str]) -> dict[str, str]:
    out = sh("sha256sum " + " ".join(shlex.quote(p) for p in paths))
    return {line.split(None, 1)[1].strip(): line.split()[0] for line in out.splitlines()}


def cached() -> dict[str, set[str]]:
    """The digests of every copy of the edited files in uv's cache (a repair re-extracts into a new entry)."""
    paths = sh(f"find {UV_CACHE} -type f \\( " + " -o ".join(f"-path '*/{rel}'" for rel in EDITED) + " \\)").split()
    out: dict[str, set[str]] = {}
    for path, digest in digests(paths).items():
        out.setdefault(next(rel for rel in EDITED if path.endswith("/" + rel)), set()).add(digest)
    return out


def flip(path: str, keep_mtime: bool) -> None:
    """Change one byte at offset 100 in place (same size, same inode); optionally put the mtime back."""
    script = (
        "import os, sys\n"
        "p = sys.argv[1]; st = os.stat(p)\n"
        "with open(p, 'r+b') as f:\n"
        "    f.seek(100); b = f.read(1); f.seek(100); f.write(bytes([b[0] ^ 0x01]))\n"
        "if sys.argv[2] == '1':\n"
        "    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))\n"
    )
    sh(f"python3 -c {shlex.quote(script)} {shlex.quote(path)} {int(keep_mtime)}")


def changed_names(result) -> list[str]:
    return [name for name, _hosts in result.changed]


@pytest.fixture(scope="module", autouse=True)
def converged():
    clean_host(HOST)
    result = deploy(inventory())
    assert result.returncode == 0, result
    again = deploy(inventory())
    assert again.returncode == 0 and again.changed == [], again
    yield
    clean_host(HOST)


def test_live_venv_files_edited_in_place_are_repaired_and_reach_nothing_else():
    a = {rel: f"{PATCHED}/{SITE}/{rel}" for rel in EDITED}
    b = {rel: f"{PLAIN}/{SITE}/{rel}" for rel in EDITED}
    before_b = digests(list(b.values()))
    wheel_bytes = {rel: {before_b[b[rel]]} for rel in EDITED}
    assert cached() == wheel_bytes
    assert digests(list(a.values())) == {a[rel]: before_b[b[rel]] for rel in EDITED}  # the same wheels
    pid_a, pid_b = main_pid(HOST, UNIT_A), main_pid(HOST, UNIT_B)

    sh(f"echo '# appended by hand' >> {a[APPENDED]} && truncate -s 100 {a[TRUNCATED]}")
    flip(a[FLIPPED], keep_mtime=False)
    flip(a[FLIPPED_KEPT], keep_mtime=True)
    # Nothing else saw the edits: no hard link carried them into the other venv or uv's cache.
    assert digests(list(b.values())) == before_b and cached() == wheel_bytes

    fast = deploy(inventory(), as_json=False)
    assert fast.returncode == 0, fast
    for dist, rel in (("tqdm", APPENDED), ("pygments", TRUNCATED), ("requests", FLIPPED)):
        assert f"venv {PATCHED}: {dist} " in fast.stderr and f"1 installed file(s) missing or altered ({rel}): reinstalling" in fast.stderr, fast.stderr
    # The fast check does not hash a file whose mtime is older than the install: it says so, and misses it.
    assert "idna" not in fast.stderr
    now = digests(list(a.values()))
    assert {rel: now[a[rel]] for rel in (APPENDED, TRUNCATED, FLIPPED)} == {rel: before_b[b[rel]] for rel in (APPENDED, TRUNCATED, FLIPPED)}
    assert now[a[FLIPPED_KEPT]] != before_b[b[FLIPPED_KEPT]]
    assert main_pid(HOST, UNIT_B) == pid_b and main_pid(HOST, UNIT_A) != pid_a

    full = deploy(inventory(), "--data", "verify_env=full", as_json=False)
    assert full.returncode == 0, full
    assert f"1 installed file(s) missing or altered ({FLIPPED_KEPT}): reinstalling" in full.stderr, full.stderr
    assert digests([a[FLIPPED_KEPT]])[a[FLIPPED_KEPT]] == before_b[b[FLIPPED_KEPT]]
    assert digests(list(b.values())) == before_b and cached() == wheel_bytes
    assert main_pid(HOST, UNIT_B) == pid_b

    # Converged: nothing changes, in either mode; no file either service runs shares an inode.
    assert deploy(inventory(), "--data", "verify_env=full").changed == []
    assert deploy(inventory()).changed == []
    shared = sh(f"find {PLAIN}.generations {PATCHED}.generations -type f -links +1 | head -5")
    assert shared == "", shared


def test_a_touched_unit_touched_model_file_and_junk_beside_the_model_change_nothing():
    pids = main_pid(HOST, UNIT_A), main_pid(HOST, UNIT_B)
    sh(f"touch /etc/systemd/system/{UNIT_A} {MODEL}/config.json && echo junk > {MODEL}/notes.txt")
    result = deploy(inventory())
    assert result.returncode == 0 and result.changed == [], result
    assert (main_pid(HOST, UNIT_A), main_pid(HOST, UNIT_B)) == pids
    assert sh(f"cat {MODEL}/notes.txt").strip() == "junk"  # not ours to delete


def test_a_byte_flipped_in_a_staged_model_is_found_by_the_fast_check_and_repaired():
    victim = sh(f"cd {MODEL} && ls -S *.safetensors | head -1").strip()
    source = digests([f"/root/models/Qwen3.6-27B/{victim}"])[f"/root/models/Qwen3.6-27B/{victim}"]
    pids = main_pid(HOST, UNIT_A), main_pid(HOST, UNIT_B)
    flip(f"{MODEL}/{victim}", keep_mtime=False)
    result = deploy(inventory(), as_json=False)
    assert result.returncode == 0, result
    assert f"model {MODEL}: content differs (modified after staging): {victim}: staging from" in result.stderr, result.stderr
    assert digests([f"{MODEL}/{victim}"])[f"{MODEL}/{victim}"] == source
    assert sh(f"ls {MODEL}/notes.txt 2>/dev/null; true").strip() == ""  # gone with the copy it was dropped in
    # Both services load the model: both restarted once.
    assert all(now != before for now, before in zip((main_pid(HOST, UNIT_A), main_pid(HOST, UNIT_B)), pids))
    assert deploy(inventory()).changed == []
