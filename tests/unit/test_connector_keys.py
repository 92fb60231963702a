"""pyinfra's connector keys in the data: one rule over every key pyinfra's connectors read (connection.CONNECTOR_KEYS).

Each key is classified (fine, weakens authentication, carries a credential); a key the installed pyinfra reads
that the rule has not classified fails the first test here (and is refused in the data, its value unseen); a
credential's value is never in a message. Hosts are built from plain data (tests/unit/hosts.py), none contacted.
"""

from __future__ import annotations

import inspect
import os

import paramiko
import pytest

from configuration import connection, settings
from configuration.errors import DataError
from tests.unit.hosts import make_host

SECRET = "hunter2-not-to-be-shown"
HOST = "inventory (host gpu-a)"


def validate(host_data: dict, override: dict | None = None):
    """The whole-inventory validation of one host with no service placed (only its connector keys matter here)."""
    return settings.host_config(make_host({"stack": "lab-standin"}, {"run_services": [], **host_data}, override=override))


def refused(host_data: dict, override: dict | None = None) -> DataError:
    with pytest.raises(DataError) as caught:
        validate(host_data, override)
    assert SECRET not in str(caught.value) and SECRET not in repr(caught.value.value)
    return caught.value


# The rule covers every key pyinfra reads -------------------------------------------------------------------------


def test_every_key_pyinfras_connectors_read_is_classified():
    """A key a later pyinfra adds (to any connector's data_meta) fails here until it is judged in CONNECTOR_KEYS."""
    unclassified = sorted(set(connection.connector_data_keys()) - set(connection.CONNECTOR_KEYS))
    assert unclassified == [], f"pyinfra's connectors read keys the rule has not classified: {unclassified}"


def test_every_argument_of_paramikos_connect_is_classified():
    """`ssh_paramiko_connect_kwargs` reaches SSHClient.connect: each of its arguments has a rule of its own."""
    arguments = set(inspect.signature(paramiko.SSHClient.connect).parameters) - {"self"}
    assert sorted(arguments - set(connection.PARAMIKO_CONNECT_ARGUMENTS)) == []


@pytest.mark.parametrize("table", ["CONNECTOR_KEYS", "PARAMIKO_CONNECT_ARGUMENTS"])
def test_every_rule_is_one_of_the_classes_and_a_judged_one_says_how(table):
    for key, rule in getattr(connection, table).items():
        assert rule.kind in (connection.FINE, connection.WEAKENS, connection.CREDENTIAL, connection.OVERRIDES), key
        assert (rule.judge is not None) == (rule.kind == connection.WEAKENS), key
        assert rule.kind == connection.FINE or rule.fix, f"{key}: a refusal needs its fix"
        assert rule.kind not in (connection.CREDENTIAL, connection.OVERRIDES) or rule.why, key


@pytest.mark.parametrize("table", ["CONNECTOR_KEYS", "PARAMIKO_CONNECT_ARGUMENTS"])
def test_a_key_whose_name_says_credential_is_classified_as_one(table):
    for key, rule in getattr(connection, table).items():
        if settings.CREDENTIAL_FLAG_WORDS.search(key.removeprefix("ssh_")) or key in ("pkey", "passphrase"):
            assert rule.kind == connection.CREDENTIAL, key


def test_a_connector_key_the_rule_does_not_know_is_refused_with_its_value_hidden(monkeypatch):
    """What the runtime does with a key the test above would catch: refused, as it might carry a credential."""
    keys = {**connection.connector_data_keys(), "ssh_new_secret_thing": "ssh"}
    monkeypatch.setattr(connection, "connector_data_keys", lambda: keys)
    monkeypatch.setattr(connection, "pyinfra_keys", lambda: frozenset(keys))
    error = refused({"ssh_new_secret_thing": SECRET})
    assert (error.source, error.key_path, error.value) == (HOST, "ssh_new_secret_thing", "<hidden>")
    assert "ssh connector that this deploy has not judged" in error.fix and "CONNECTOR_KEYS" in error.fix


# What is refused ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("data", "key", "said"), [
    ({"ssh_strict_host_key_checking": "no"}, "ssh_strict_host_key_checking", "does not check host keys"),
    ({"ssh_strict_host_key_checking": "off"}, "ssh_strict_host_key_checking", "does not check host keys"),
    ({"ssh_strict_host_key_checking": "No"}, "ssh_strict_host_key_checking", "does not check host keys"),
    ({"ssh_known_hosts_file": "/dev/null"}, "ssh_known_hosts_file", "/dev/null, which keeps no host key"),
    ({"ssh_forward_agent": True}, "ssh_forward_agent", "forwards your SSH agent to the host"),
    ({"ssh_paramiko_connect_kwargs": {"gss_auth": True}}, "ssh_paramiko_connect_kwargs.gss_auth", "delegating your Kerberos"),
    ({"ssh_paramiko_connect_kwargs": {"gss_kex": True}}, "ssh_paramiko_connect_kwargs.gss_kex", "skips its known_hosts check"),
    ({"ssh_paramiko_connect_kwargs": {"transport_factory": "x"}}, "ssh_paramiko_connect_kwargs.transport_factory",
     "says what the host's key is"),
    ({"ssh_paramiko_connect_kwargs": {"port": 2222}}, "ssh_paramiko_connect_kwargs.port", "set `ssh_port` instead"),
    ({"ssh_paramiko_connect_kwargs": {"username": "root"}}, "ssh_paramiko_connect_kwargs.username", "set `ssh_user` instead"),
], ids=["no", "off", "No", "known-hosts-dev-null", "forward-agent", "gss-auth", "gss-kex", "transport-factory",
        "paramiko-port", "paramiko-username"])
def test_a_setting_that_weakens_authentication_is_refused_with_key_reason_and_fix(data, key, said):
    error = refused(data)
    assert (error.source, error.key_path) == (HOST, key)
    assert said in error.fix, error.fix


@pytest.mark.parametrize(("data", "key"), [
    ({"ssh_password": SECRET}, "ssh_password"),
    ({"ssh_key": "/root/.ssh/id_ed25519", "ssh_key_password": SECRET}, "ssh_key_password"),
    ({"ssh_paramiko_connect_kwargs": {"timeout": 5, "password": SECRET}}, "ssh_paramiko_connect_kwargs.password"),
    ({"ssh_paramiko_connect_kwargs": {"passphrase": SECRET}}, "ssh_paramiko_connect_kwargs.passphrase"),
    ({"ssh_paramiko_connect_kwargs": {"pkey": SECRET}}, "ssh_paramiko_connect_kwargs.pkey"),
    ({"ssh_paramiko_connect_kwargs": {"some_new_argument": SECRET}}, "ssh_paramiko_connect_kwargs.some_new_argument"),
    ({"_sudo_password": SECRET}, "_sudo_password"),
    ({"_su_password": SECRET}, "_su_password"),
    ({"ssh_pasword": SECRET}, "ssh_pasword"),  # a typo of a credential key: hidden too
], ids=["ssh-password", "key-passphrase", "paramiko-password", "paramiko-passphrase", "paramiko-pkey",
        "paramiko-unknown", "sudo-password", "su-password", "mistyped-password"])
def test_a_credential_is_refused_and_its_value_never_shown(data, key):
    error = refused(data)
    assert (error.source, error.key_path, error.value) == (HOST, key, "<hidden>")


def test_a_credential_in_the_data_flag_is_refused_there_and_hidden():
    error = refused({}, override={"ssh_password": SECRET})
    assert (error.source, error.key_path, error.value) == ("--data", "ssh_password", "<hidden>")
    assert "log in with a key" in error.fix


def test_a_known_hosts_file_that_keeps_nothing_or_that_others_write_is_refused(tmp_path):
    link = tmp_path / "known_hosts_link"
    link.symlink_to("/dev/null")
    assert "/dev/null, which keeps no host key" in refused({"ssh_known_hosts_file": str(link)}).fix
    assert "which keeps no host key" in refused({"ssh_known_hosts_file": str(tmp_path)}).fix
    shared = tmp_path / "known_hosts"
    shared.write_text("")
    os.chmod(shared, 0o666)
    assert "which others than its owner may write (mode 666)" in refused({"ssh_known_hosts_file": str(shared)}).fix


@pytest.mark.parametrize(("config", "said"), [
    ("Host gpu-a 10.0.0.1\n  UserKnownHostsFile /dev/null\n", "`UserKnownHostsFile /dev/null`, and that file is /dev/null, which keeps no host key"),
    ("Host *\n  StrictHostKeyChecking no\n", "`StrictHostKeyChecking no`, which does not check host keys"),
    ("Host 10.0.0.*\n  ForwardAgent yes\n", "`ForwardAgent yes`: forwards your SSH agent"),
])
def test_an_ssh_config_file_that_weakens_authentication_for_the_host_is_refused(tmp_path, config, said):
    path = tmp_path / "ssh_config"
    path.write_text(config)
    error = refused({"ssh_hostname": "10.0.0.1", "ssh_config_file": str(path)})
    assert (error.key_path, error.value) == ("ssh_config_file", str(path))
    assert said in error.fix and f"{path} sets, for 10.0.0.1" in error.fix


# What passes -----------------------------------------------------------------------------------------------------


def test_an_ssh_config_entry_the_data_overrides_or_for_another_host_passes(tmp_path):
    known = tmp_path / "known_hosts"
    known.write_text("")
    os.chmod(known, 0o644)
    config = tmp_path / "ssh_config"
    config.write_text("Host other\n  UserKnownHostsFile /dev/null\n  StrictHostKeyChecking no\n  ForwardAgent yes\n"
                      "Host 10.0.0.1\n  UserKnownHostsFile /dev/null\n  StrictHostKeyChecking no\n  ForwardAgent yes\n")
    validate({"ssh_hostname": "10.0.0.2", "ssh_config_file": str(config)})
    validate({"ssh_hostname": "10.0.0.1", "ssh_config_file": str(config), "ssh_known_hosts_file": str(known),
              "ssh_strict_host_key_checking": "yes", "ssh_forward_agent": False})
    validate({"ssh_config_file": str(tmp_path / "absent")})  # pyinfra reads no config then


def test_the_lab_inventorys_connection_settings_pass():
    """lab/inventory.py's shape: a key file, its own known_hosts (0644, root's), strict checking."""
    known = settings.REPO_ROOT / "lab" / "state" / "known_hosts"
    if not known.is_file():
        pytest.skip("the lab's known_hosts is made by lab/lab.py up")
    validate({"ssh_hostname": "10.213.0.2", "ssh_user": "root", "ssh_key": str(settings.REPO_ROOT / "lab/state/id_ed25519"),
              "ssh_known_hosts_file": str(known), "ssh_strict_host_key_checking": "yes"})


@pytest.mark.parametrize("data", [
    {"ssh_strict_host_key_checking": "accept-new"},
    {"ssh_strict_host_key_checking": "ask"},
    {"ssh_forward_agent": False, "ssh_allow_agent": True, "ssh_look_for_keys": False},
    {"ssh_password": ""},
    {"ssh_paramiko_connect_kwargs": {"timeout": 5, "banner_timeout": 30, "key_filename": "/root/.ssh/id_ed25519",
                                     "gss_kex": False, "disabled_algorithms": {"pubkeys": ["rsa-sha2-512"]}}},
    {"ssh_connect_retries": 2, "ssh_file_transfer_protocol": "scp", "ssh_port": 2222, "ssh_user": "root"},
], ids=["accept-new", "ask", "agent-not-forwarded", "empty-password", "paramiko-fine", "fine"])
def test_settings_that_keep_the_bar_pass(data):
    validate(data)


# pyinfra's operation arguments: none from the data ---------------------------------------------------------------


def _operation_arguments():
    from pyinfra.api.arguments import all_global_arguments

    return [name for name, _ in all_global_arguments() if name.startswith("_")]


@pytest.mark.parametrize("key", _operation_arguments())
@pytest.mark.parametrize("layer", ["host", "--data"])
def test_every_operation_argument_pyinfra_takes_is_refused_in_the_data(key, layer):
    """A rule over pyinfra's own list: each global argument it reads from the data (a later pyinfra's new ones too)
    changes how root runs every operation, so none passes, and the message names the key."""
    value = [0, 1] if key == "_success_exit_codes" else True
    error = refused({key: value}) if layer == "host" else refused({}, override={key: value})
    assert error.key_path == key and f"`{key}`" in error.fix
    assert error.source == (HOST if layer == "host" else "--data")


def test_the_known_harms_say_why_and_the_rest_say_what_they_are():
    why = connection.refused_operation_arguments()
    assert "from that directory" in why["_chdir"] and "into a pass" in why["_success_exit_codes"]
    assert why["_serial"] == connection.OPERATION_ARGUMENT
    assert set(why) == set(_operation_arguments())


@pytest.mark.skipif(os.geteuid() != 0, reason="gives the file to another user")
def test_a_known_hosts_file_of_another_user_is_refused(tmp_path):
    theirs = tmp_path / "known_hosts"
    theirs.write_text("")
    theirs.chmod(0o644)
    os.chown(theirs, 1234, 1234)
    assert "which belongs to uid 1234, neither you nor root" in refused({"ssh_known_hosts_file": str(theirs)}).fix
