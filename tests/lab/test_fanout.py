"""Fan-out on the lab: four hosts that need the same new stack and the same model in one run (operations/transport/fanout.py).

The control machine pushes the stack's wheels once; the other hosts read them from a host that got them in this
run, each on a one-time key, and check every wheel against its pin before it takes its name. The model, named in
`model_sources` on gpu-a, goes to the first host from gpu-a and on from there. The run then converges, and no
one-time key is left on any host.
"""

from __future__ import annotations

import re

import pytest

from tests.lab.labutil import deploy, lab_hosts, routed, ssh, write_inventory

pytestmark = pytest.mark.lab

VENV = "/root/venv_fanout"
CACHE = "/var/cache/sglang-fanout/wheels"
MODEL = "FanOut-DFlash"
SOURCE = "gpu-a"
RECEIVERS = ["gpu-b", "gpu-c", "gpu-d", "gpu-e"]


def clean(host: str) -> None:
    ssh(host, "for u in $(systemctl list-unit-files 'sglang-fan*' --no-legend | cut -d' ' -f1); do systemctl disable --now $u "
              ">/dev/null 2>&1; done; rm -f /etc/systemd/system/sglang-fan*.service; systemctl daemon-reload; "
              f"rm -rf {VENV} {VENV}.* /var/cache/sglang-fanout /root/models/{MODEL} /root/models/.{MODEL}.partial "
              f"/etc/sglang-deploy/keys/fan* /dev/shm/{MODEL}; true")


def keys_left(host: str) -> str:
    """The one-time keys' lines in root's authorized_keys and the grants and keys (named by their 32-hex ids) left."""
    return ssh(host, "grep -c sglang-deploy-peer /root/.ssh/authorized_keys; ls -A /run/sglang-deploy/peer-keys "
                     "/run/sglang-deploy/peer-grants 2>/dev/null | grep -cE '^[0-9a-f]{32}$'; true").stdout.split()


@pytest.fixture
def fanout_hosts():
    if not set(RECEIVERS) <= set(lab_hosts()):
        pytest.skip(f"needs the lab hosts {RECEIVERS}: make test-lab-hosts")
    for host in RECEIVERS:
        clean(host)
    ssh(SOURCE, f"rm -rf /root/models/{MODEL} && cp -a /root/models/Qwen3.6-27B-DFlash /root/models/{MODEL}")
    with routed([SOURCE, *RECEIVERS]):  # the lab's hosts reach only this machine, unless routed
        yield
    for host in RECEIVERS:
        clean(host)
    ssh(SOURCE, f"rm -rf /root/models/{MODEL}")


def test_four_hosts_get_one_stack_and_one_model_mostly_from_each_other(fanout_hosts):
    data = {
        host: {"venv_path": VENV, "host_wheel_cache": CACHE, "model_sources": {MODEL: SOURCE},
               "services": {"fan": {"gpu": 0, "port": 30170, "model": MODEL, "model_in": "store"}}, "run_services": ["fan"]}
        for host in RECEIVERS
    }
    data[SOURCE] = {"run_services": {"ddtree": {}, "dflash": {}}}  # the source, left as the lab has it
    inventory = write_inventory("test_fanout", data)
    result = deploy(inventory, as_json=False, timeout=1500)
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-6000:]

    # The wheels: pushed from this machine once, fetched by the three others from hosts of the run, directly.
    pushed = re.findall(r"pushed (\d+) wheel\(s\)", out)
    fetched = re.findall(r"fetched (\d+) wheel\(s\), .* from (gpu-\w) directly", out)
    assert len(pushed) == 1, out[-6000:]
    assert len(fetched) == 3 and {count for count, _ in fetched} == {pushed[0]}, out[-6000:]
    assert {source for _, source in fetched} <= set(RECEIVERS)
    # The model: from gpu-a first, then from the hosts that have it.
    streamed = re.findall(rf"streamed {MODEL} from (gpu-\w):", out)
    assert len(streamed) == 4 and streamed.count(SOURCE) < 4, out[-6000:]
    same = f"cd /root/models/{MODEL} && find . -type f ! -name '.sglang-deploy-*' | sort | xargs sha256sum"
    assert {ssh(host, same).stdout for host in RECEIVERS} == {ssh(SOURCE, same).stdout}
    wheels = f"cd {CACHE} && ls *.whl | sort | xargs sha256sum"
    assert len({ssh(host, wheels).stdout for host in RECEIVERS}) == 1
    assert all(keys_left(host) == ["0", "0"] for host in [SOURCE, *RECEIVERS])

    again = deploy(inventory, timeout=900)
    assert again.returncode == 0 and again.changed == [], again
