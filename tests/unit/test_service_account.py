"""`service_user` is the services' own account: refused by name on the control machine when it is a well-known
privileged or shared one (kinds.PRIVILEGED_ACCOUNTS), and on each host, before any account or group changes, when the
account (or the group of its name) that exists there is someone else's (service_user.dedicated_account).

The host's decision is data: `not_dedicated(user, what AccountStanding read)`; the operation runs on a host whose
facts are given, no host contacted.
"""

from __future__ import annotations

import subprocess
from unittest import mock

import pytest
from pyinfra.api import OperationError
from pyinfra.context import ctx_host, ctx_state

from configuration import settings
from configuration.errors import DataError
from operations.service import service_user
from tests.unit.hosts import make_host
from tests.unit.test_settings import base_data, merged

OWN = {"user": "sglang", "uid": 998, "gid": 997, "home": "/var/lib/sglang", "shell": "/usr/sbin/nologin"}
OWN_GROUP = {"name": "sglang", "gid": 997, "members": []}


def standing(account=OWN, group=OWN_GROUP, sharing=(), listed_in=()) -> dict:
    return {"account": account, "group": group, "sharing": list(sharing), "listed_in": list(listed_in)}


# On the control machine ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["sudo", "wheel", "admin", "docker", "lxd", "adm", "systemd-journal", "systemd-network",
                                  "disk", "shadow", "staff", "nobody", "nogroup", "daemon", "www-data"])
def test_a_privileged_or_shared_account_is_refused_by_name(name):
    with pytest.raises(DataError) as caught:
        settings.host_config(make_host(merged(base_data(), {"service_user": name}), {"run_services": ["ddtree"]}))
    error = caught.value
    assert (error.key_path, error.value) == ("service_user", name)
    assert f"`{name}` is a privileged or shared account or group on most hosts (" in error.fix
    assert "name an account of the services' own, e.g. `sglang`" in error.fix


@pytest.mark.parametrize("name", ["sglang", "root", "sglang-svc", "llm"])
def test_the_services_own_names_and_root_pass(name):
    config = settings.host_config(make_host(merged(base_data(), {"service_user": name}), {"run_services": ["ddtree"]}))
    assert config.service_user == name


# On the host: the decision --------------------------------------------------------------------------------------------


def test_the_deploys_own_account_or_none_at_all_is_dedicated():
    assert service_user.not_dedicated("sglang", standing()) == []
    assert service_user.not_dedicated("sglang", standing(account=None, group=None)) == []
    # Listed in its own group, or with the shell older system accounts have: still its own.
    own = standing(account={**OWN, "shell": "/bin/false"}, group={**OWN_GROUP, "members": ["sglang"]}, listed_in=["sglang"])
    assert service_user.not_dedicated("sglang", own) == []
    # The group made by a run that stopped before useradd: no member, waiting for the account.
    assert service_user.not_dedicated("sglang", standing(account=None)) == []


NOT_OWN = [
    ("uid-0", standing(account={**OWN, "uid": 0}), "uid 0 (root's)", "name another account"),
    ("gid-0", standing(account={**OWN, "gid": 0}, group={"name": "root", "gid": 0, "members": []}),
     "primary group gid 0 (root's)", "usermod -g sglang sglang"),
    ("another-primary-group", standing(account={**OWN, "gid": 100}, group={"name": "users", "gid": 100, "members": []}),
     "primary group users, not its own group sglang", "usermod -g sglang sglang"),
    ("group-with-members", standing(group={**OWN_GROUP, "members": ["alice", "sglang"]}),
     "its group sglang has other members: alice", "gpasswd -d alice sglang"),
    ("group-shared-as-primary", standing(sharing=["bob"]), "its group sglang is the primary group of bob too",
     "usermod -g OTHER_GROUP bob"),
    ("supplementary-groups", standing(listed_in=["docker", "sglang", "video"]), "member of docker, video",
     "gpasswd -d sglang docker; gpasswd -d sglang video"),
    ("login-shell", standing(account={**OWN, "shell": "/bin/bash"}), "login shell /bin/bash", "usermod -s /usr/sbin/nologin sglang"),
    ("empty-shell", standing(account={**OWN, "shell": ""}), "login shell (empty: /bin/sh)", "usermod -s /usr/sbin/nologin sglang"),
    ("another-daemons-home", standing(account={**OWN, "home": "/var/www"}), "home /var/www, not /var/lib/sglang",
     "usermod -d /var/lib/sglang sglang"),
    ("absent-but-its-group-has-members", standing(account=None, group={**OWN_GROUP, "members": ["alice"]}),
     "its group sglang has other members: alice", "gpasswd -d alice sglang"),
    ("absent-but-listed-in-a-group", standing(account=None, group=None, listed_in=["docker"]), "member of docker",
     "gpasswd -d sglang docker"),
]


@pytest.mark.parametrize(("found", "said", "fix"), [c[1:] for c in NOT_OWN], ids=[c[0] for c in NOT_OWN])
def test_an_account_that_is_someone_elses_is_not_dedicated(found, said, fix):
    problems = service_user.not_dedicated("sglang", found)
    assert any(p.startswith(said) for p, _ in problems), problems
    assert any(f.startswith(fix) for _, f in problems), problems


# On the host: the read ------------------------------------------------------------------------------------------------


def test_the_read_parses_nss_answers():
    fact = service_user.AccountStanding()
    lines = ["sglang:x:998:997::/var/lib/sglang:/usr/sbin/nologin", "@@", "sglang:x:997:alice,sglang", "@@", "bob", "@@",
             "docker", "video"]
    assert fact.process(lines) == standing(group={**OWN_GROUP, "members": ["alice", "sglang"]}, sharing=["bob"],
                                           listed_in=["docker", "video"])
    assert fact.process(["", "@@", "", "@@", "@@"]) == standing(account=None, group=None)
    assert fact.process([]) == standing(account=None, group=None)


@pytest.mark.parametrize("user", ["root", "no-such-account-here", "nobody"])
def test_the_reads_command_answers_on_this_machine_for_present_and_absent_accounts(user):
    fact = service_user.AccountStanding()
    proc = subprocess.run(["sh", "-c", fact.command(user=user)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    read = fact.process(proc.stdout.splitlines())
    if user == "no-such-account-here":
        assert read == standing(account=None, group=None)
    elif user == "root":
        assert (read["account"]["uid"], read["group"]["name"]) == (0, "root")
        assert "uid 0 (root's)" in [p for p, _ in service_user.not_dedicated(user, read)]
    else:
        assert read["account"]["user"] == "nobody" and service_user.not_dedicated(user, read)


# On the host: the operation, before any account changes --------------------------------------------------------------


def run_dedicated(found: dict) -> list:
    host = make_host({})
    with (
        mock.patch.object(host, "get_fact", return_value=found),
        mock.patch.object(host, "noop") as noop,
        ctx_state.use(host.state),
        ctx_host.use(host),
    ):
        commands = list(service_user.dedicated_account._inner(user="sglang"))
    return [commands, [c.args[0] for c in noop.call_args_list]]


def test_the_operation_fails_the_host_naming_the_account_what_was_found_and_the_fix():
    with pytest.raises(OperationError) as caught:
        run_dedicated(standing(listed_in=["docker"], account={**OWN, "shell": "/bin/bash"}))
    message = str(caught.value)
    assert message.startswith("service_user sglang is not the services' own account on this host: login shell /bin/bash; member of docker.")
    assert "Set `service_user` to a name no account or group of this host has" in message
    assert "usermod -s /usr/sbin/nologin sglang; gpasswd -d sglang docker" in message


def test_the_operation_passes_the_deploys_own_account_and_changes_nothing():
    commands, noops = run_dedicated(standing())
    assert commands == [] and noops == ["account sglang is the services' own, or does not exist yet"]


def test_the_check_comes_before_the_account_and_its_group_change_and_not_for_root(monkeypatch):
    calls = []
    for op in ("devices_reachable", "dedicated_account", "group_present", "account"):
        monkeypatch.setattr(service_user, op, lambda op=op, **kwargs: calls.append(op))
    service_user.ensure_account("sglang")
    assert calls == ["devices_reachable", "dedicated_account", "group_present", "account"]
    calls.clear()
    service_user.ensure_account("root")
    assert calls == ["devices_reachable"]
