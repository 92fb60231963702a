"""Settings that lower the bar, on the lab: the service account must be the deploy's own, and connection settings that
turn host-key checking off, forward the agent or carry a password stop the run before any operation.

Uses the spare host (tests/lab/conftest.py `spare_with_venv`).
"""

from __future__ import annotations

import pytest

from tests.lab.labutil import deploy, http_get, main_pid, ssh, write_inventory

pytestmark = pytest.mark.lab

USER = "llmsvc"  # an account of the test's own: never one the lab uses otherwise
PORT = 30150
UNIT = "sglang-lp.service"
SERVICE = {"gpu": 0, "port": PORT, "model": "Qwen3.6-27B-DFlash", "model_in": "store"}
# What the refused run must leave as it found it: the account, its groups, and no unit of ours.
ACCOUNT = f"getent passwd {USER}; id {USER}; getent group adm {USER}; ls /etc/systemd/system | grep sglang- || true"


def inventory(host: str, **host_data):
    return write_inventory("test_least_privilege_settings",
                           {host: {"services": {"lp": SERVICE}, "run_services": ["lp"], "service_user": USER, **host_data}})


def drop_account(host: str) -> None:
    ssh(host, f"userdel {USER} 2>/dev/null; groupdel {USER} 2>/dev/null; true")


@pytest.fixture
def host(spare_with_venv):
    drop_account(spare_with_venv)
    yield spare_with_venv
    drop_account(spare_with_venv)


def test_an_existing_account_in_another_group_is_refused_before_it_changes_then_served_once_it_is_its_own(host):
    # An account of that name a person made, in `adm` (reads the system logs): the deploy would have run the engine
    # with that group, and made the account its own with usermod.
    ssh(host, f"groupadd --system {USER} && useradd --system -g {USER} -G adm -d /var/lib/sglang -M -s /usr/sbin/nologin {USER}")
    before = ssh(host, ACCOUNT).stdout
    result = deploy(inventory(host), as_json=False)
    output = result.stdout + result.stderr
    assert result.returncode != 0, output[-3000:]
    assert f"service_user {USER} is not the services' own account on this host: member of adm." in output, output[-3000:]
    assert f"gpasswd -d {USER} adm" in output
    assert ssh(host, ACCOUNT).stdout == before, "the refused run changed the account or wrote a unit"

    ssh(host, f"gpasswd -d {USER} adm >/dev/null")  # the fix the message names
    result = deploy(inventory(host))
    assert result.returncode == 0, result
    assert ssh(host, f"ps -o user= -p {main_pid(host, UNIT)}").stdout.strip() == USER
    assert http_get(host, PORT, "/health")[0] == 200


def test_a_privileged_group_name_is_refused_before_any_host_is_touched(host):
    result = deploy(inventory(host, service_user="docker"), as_json=False)
    assert result.returncode != 0
    assert f"inventory (host {host}): service_user: 'docker': `docker` is a privileged or shared account" in result.stderr
    assert "Starting operation" not in result.stderr + result.stdout


@pytest.mark.parametrize(("data", "said"), [
    ({"ssh_strict_host_key_checking": "no"}, "ssh_strict_host_key_checking: 'no': `ssh_strict_host_key_checking` does not check host keys"),
    # With pyinfra's default `accept-new` (with `yes` the connection itself fails: the file knows no key).
    ({"ssh_known_hosts_file": "/dev/null", "ssh_strict_host_key_checking": "accept-new"},
     "ssh_known_hosts_file: '/dev/null': `ssh_known_hosts_file` is /dev/null, which keeps no host key"),
    ({"ssh_forward_agent": True}, "ssh_forward_agent: True: `ssh_forward_agent` forwards your SSH agent"),
    ({"ssh_password": "lab-not-a-password-5e1c"}, "ssh_password: '<hidden>': `ssh_password` is a password"),
], ids=["no-host-key-checking", "known-hosts-dev-null", "agent-forwarding", "password"])
def test_a_connection_setting_that_lowers_the_bar_stops_the_run_before_any_operation(host, data, said):
    """pyinfra connects every host (with these settings) before it loads deploy.py, which refuses them before any
    command runs or any file, a key file among them, is uploaded."""
    before = ssh(host, ACCOUNT).stdout
    result = deploy(inventory(host, **data), as_json=False)
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert f"inventory (host {host}): {said}" in output, output[-3000:]
    assert "lab-not-a-password-5e1c" not in output
    assert "Starting operation" not in output and ssh(host, ACCOUNT).stdout == before
