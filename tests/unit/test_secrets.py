"""Secrets and exposure: validation before any host is touched, and a value that never shows itself."""

import os

import pytest
import yaml

from configuration import redaction, settings
from configuration import secrets as lookup
from configuration.errors import DataError
from configuration.settings import REPO_ROOT
from operations.service import secrets
from tests.unit.hosts import make_host

KEY = "unit-test-key-0123456789abcdef"


def data(**service_keys) -> dict:
    d = yaml.safe_load((REPO_ROOT / "group_data" / "all.yml").read_text())
    d.update(yaml.safe_load((REPO_ROOT / "lab" / "group_data" / "all.yml").read_text()))
    d["services"]["dflash"].update(service_keys)
    return d


def host_config(d, monkeypatch, env=None, secrets_file=None):
    for name, value in (env or {}).items():
        monkeypatch.setenv(name, value)
    if secrets_file:
        d["secrets_file"] = str(secrets_file)
    return settings.host_config(make_host(d, {"run_services": ["dflash"]}))


def test_key_from_the_environment_reaches_a_config_flag_not_the_argv(monkeypatch):
    config = host_config(data(bind="0.0.0.0", api_key_secret="dflash-key"), monkeypatch, {"SGLANG_DEPLOY_SECRET_DFLASH_KEY": KEY})
    service = config.services[0]
    assert service.api_key.reveal() == KEY
    assert KEY not in repr(service) and KEY not in " ".join(service.argv())
    assert service.argv()[service.argv().index("--config") + 1] == "/etc/sglang-deploy/secrets/dflash.yml"
    assert secrets.config_text(service.api_key, None) == f'api-key: "{KEY}"\n'


def test_key_from_the_secrets_file(monkeypatch, tmp_path):
    path = tmp_path / "secrets.yml"
    path.write_text(f"dflash-key: {KEY}\n")
    path.chmod(0o600)
    config = host_config(data(api_key_secret="dflash-key"), monkeypatch, secrets_file=path)
    assert config.services[0].api_key.reveal() == KEY


SHORT = "short-val-12"  # a secret value too short to use: refused, and never quoted back


@pytest.mark.parametrize(("keys", "env", "path", "fix"), [
    ({"api_key_secret": "dflash-key"}, {}, "services.dflash.api_key_secret", "no such secret: set $SGLANG_DEPLOY_SECRET_DFLASH_KEY"),
    ({"api_key_secret": "dflash-key"}, {"SGLANG_DEPLOY_SECRET_DFLASH_KEY": SHORT}, "services.dflash.api_key_secret", "at least 16 characters"),
    ({"api_key_secret": "sk-Real Key!"}, {}, "services.dflash.api_key_secret", "must be the name of a secret"),
    ({"bind": "0.0.0.0"}, {}, "services.dflash.bind", "binding beyond loopback without an API key"),
    ({"bind": "10.0.0.5", "allow_unauthenticated": "yes"}, {}, "services.dflash.allow_unauthenticated", "must be true or false"),
    ({"args": {"api-key": "x"}}, {}, "services.dflash.args.api-key", "derived from the service key `api_key_secret`"),
    ({"args": {"config": "/tmp/x.yml"}}, {}, "services.dflash.args.config", "derived from the service key `api_key_secret`"),
    # A valid key is set, and the service fails for another reason: the error still never shows the key.
    ({"api_key_secret": "dflash-key", "args": {"api-key": "x"}}, {"SGLANG_DEPLOY_SECRET_DFLASH_KEY": KEY},
     "services.dflash.args.api-key", "derived from the service key `api_key_secret`"),
    ({"api_key_secret": "dflash-key", "bind": "0.0.0.0", "allow_unauthenticated": "yes"},
     {"SGLANG_DEPLOY_SECRET_DFLASH_KEY": KEY}, "services.dflash.allow_unauthenticated", "must be true or false"),
])
def test_bad_secret_and_exposure_input(monkeypatch, keys, env, path, fix):
    monkeypatch.delenv("SGLANG_DEPLOY_SECRET_DFLASH_KEY", raising=False)
    with pytest.raises(DataError) as caught:
        host_config(data(**keys), monkeypatch, env)
    assert f"group_data/all.py: {path}: " in str(caught.value) and fix in str(caught.value)
    for value in env.values():  # the secret values this case supplied
        assert value not in str(caught.value)


def test_open_bind_is_allowed_when_said_explicitly(monkeypatch):
    service = host_config(data(bind="0.0.0.0", allow_unauthenticated=True), monkeypatch).services[0]
    assert service.exposed_without_key and service.config_file is None


def test_a_secret_never_shows_itself():
    secret = lookup.Secret("k", KEY)
    assert KEY not in repr(secret) and KEY not in str(secret) and KEY not in f"{secret}"


def test_an_unreadable_secrets_file_is_named_without_its_content(tmp_path):
    path = tmp_path / "secrets.yml"
    path.write_text(f"k: [{KEY}\n")
    path.chmod(0o600)
    with pytest.raises(DataError) as caught:
        lookup.load_secrets_file(path)
    assert str(path) in str(caught.value) and KEY not in str(caught.value)


@pytest.mark.parametrize("flag", ["api-key", "api-ke", "admin-api-key"])
def test_a_key_written_into_args_is_not_echoed(monkeypatch, flag):
    with pytest.raises(DataError) as caught:
        host_config(data(args={flag: KEY}), monkeypatch)
    assert "derived from the service key" in str(caught.value) and "<hidden>" in str(caught.value)
    assert KEY not in str(caught.value)


@pytest.mark.parametrize(("value", "why"), [
    (KEY + "\r", "it holds a carriage return (\\r)"),
    (KEY[:8] + "\n" + KEY[8:], "it holds a line break (\\n)"),
    (KEY + "\x1b[0m", "it holds a control character (0x1b)"),
    (KEY + "\x7f", "it holds a control character (0x7f)"),
    (KEY + "é", "it holds a non-ASCII character"),
    (KEY + "\u2028", "it holds a non-ASCII character"),
    (KEY[:8] + " " + KEY[8:], "it holds a space or tab"),
    (" " + KEY, "it holds a space or tab"),
], ids=["cr", "lf", "escape", "del", "latin", "line-separator", "inner-space", "leading-space"])
def test_a_key_that_is_not_printable_ascii_is_refused_by_name_never_by_value(monkeypatch, value, why):
    """Before any host is touched (validation), naming the secret and the fix, never quoting the value."""
    with pytest.raises(DataError) as caught:
        host_config(data(api_key_secret="dflash-key"), monkeypatch, {"SGLANG_DEPLOY_SECRET_DFLASH_KEY": value})
    message = str(caught.value)
    assert "services.dflash.api_key_secret: 'dflash-key'" in message and "printable ASCII without spaces" in message
    assert why in message and "set $SGLANG_DEPLOY_SECRET_DFLASH_KEY" in message
    assert value not in message and value.strip() not in message and KEY not in message


def test_every_punctuation_character_is_a_usable_key():
    assert lookup.value_problem("".join(chr(c) for c in range(0x21, 0x7F))) is None


def test_every_secret_the_run_knows_is_registered_for_redaction(monkeypatch, tmp_path):
    """The secrets file's values and every $SGLANG_DEPLOY_SECRET_* value, used by a service or not."""
    from operations.run import redact

    monkeypatch.setattr(redaction, "_REGISTERED", {})
    unused = "unit-test-unused-env-secret-31f0"
    in_file = "unit-test-unused-file-secret-8a2d"
    monkeypatch.setenv("SGLANG_DEPLOY_SECRET_UNUSED", unused)
    path = tmp_path / "secrets.yml"
    path.write_text(f"dflash-key: {KEY}\nother: {in_file}\n")
    path.chmod(0o600)
    host_config(data(api_key_secret="dflash-key"), monkeypatch, secrets_file=path)
    printed = redact.redact(f"{KEY} {unused} {in_file}")
    assert printed == "<secret dflash-key> <secret SGLANG_DEPLOY_SECRET_UNUSED> <secret other>"


def test_a_secret_is_redacted_under_its_own_name_however_many_services_ask(monkeypatch):
    """`<secret dflash-key>`, not the variable it came from, also after other secrets were resolved."""
    from operations.run import redact

    monkeypatch.setattr(redaction, "_REGISTERED", {})
    admin = "unit-test-admin-key-77aa01bc9d"
    config = host_config(data(api_key_secret="dflash-key", admin_api_key_secret="dflash-admin"), monkeypatch,
                         {"SGLANG_DEPLOY_SECRET_DFLASH_KEY": KEY, "SGLANG_DEPLOY_SECRET_DFLASH_ADMIN": admin})
    assert config.services[0].admin_api_key.reveal() == admin
    assert redact.redact(f"{KEY} {admin}") == "<secret dflash-key> <secret dflash-admin>"


def test_a_key_file_is_never_staged_under_tmp_even_under_sudo():
    """pyinfra's SSH upload under `_sudo` (or `_su_user`, `_doas`) goes through a predictable file in its temp
    directory (/tmp) unless told where: ours names one beside the target. pyinfra's own put_file is run here
    with a connector that records where the bytes went."""
    from pyinfra.api.command import FileUploadCommand
    from pyinfra.connectors.ssh import SSHConnector

    from operations.run.file_write import replace_file

    path = secrets.config_path("s")
    upload = next(c for c in replace_file(path, secrets.config_text(secrets.Secret("k", KEY), None), "640", "root", "sglang")
                  if isinstance(c, FileUploadCommand))

    class Recorder:
        def __init__(self):
            self.written, self.commands = [], []

        def _put_file(self, source, remote_path):
            self.written.append(remote_path)

        def run_shell_command(self, command, **kwargs):
            self.commands.append(str(command))
            return True, None

    for connector_arguments in ({}, {"_sudo": True}, {"_su_user": "svc"}, {"_doas": True}, {"_sudo": True, "_sudo_user": "svc"}):
        recorder = Recorder()
        recorder.host = type("Host", (), {"get_temp_filename": lambda self, *a, **k: "/tmp/pyinfra-predictable"})()
        SSHConnector.put_file(recorder, upload.src, upload.dest, remote_temp_filename=upload.remote_temp_filename, **connector_arguments)
        assert recorder.written and all(p.startswith(path + ".sglang-deploy.") for p in recorder.written), (connector_arguments, recorder.written)
        assert not any("/tmp/" in c for c in recorder.commands), recorder.commands


def test_the_key_files_sha256_is_redacted_like_the_keys(monkeypatch):
    """-vvv prints the key file's state fact and the started record, which hold the file's sha256: derived from the keys."""
    import hashlib

    from operations.run import redact
    from tests.unit.test_operations import run

    monkeypatch.setattr(redaction, "_REGISTERED", {})
    key = secrets.Secret("k", KEY)
    digest = hashlib.sha256(secrets.config_text(key, None).encode()).hexdigest()
    run(secrets.config_file, {secrets.SecretFileState: None}, service="s", api_key=key, admin_api_key=None, group="sglang")
    record = '{"inputs": {"/etc/sglang-deploy/secrets/s.yml": "sha256 ' + digest + '"}, "pid": 7}'
    assert redact.redact(record) == '{"inputs": {"/etc/sglang-deploy/secrets/s.yml": "sha256 <secret sha256 of the key file of s>"}, "pid": 7}'


# The secrets file, and the keys in it (issue 46 item 6) -------------------------------------------------------------


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o620])
def test_a_secrets_file_others_may_read_or_write_is_refused_with_the_fix(tmp_path, mode):
    path = tmp_path / "secrets.yml"
    path.write_text(f"dflash-key: {KEY}\n")
    path.chmod(mode)
    with pytest.raises(DataError) as caught:
        lookup.load_secrets_file(path)
    assert f"(mode {mode:o})" in str(caught.value) and f"chmod 600 {path}" in str(caught.value)
    assert KEY not in str(caught.value)


@pytest.mark.skipif(os.geteuid() != 0, reason="gives the file to another user")
def test_a_secrets_file_of_another_user_is_refused(tmp_path):
    path = tmp_path / "secrets.yml"
    path.write_text(f"dflash-key: {KEY}\n")
    path.chmod(0o600)
    os.chown(path, 1234, 1234)
    with pytest.raises(DataError) as caught:
        lookup.load_secrets_file(path)
    assert "belongs to another user (uid 1234)" in str(caught.value)


def test_an_admin_key_equal_to_the_api_key_is_refused(monkeypatch):
    monkeypatch.setenv("SGLANG_DEPLOY_SECRET_ADMIN_KEY", KEY)
    monkeypatch.setenv("SGLANG_DEPLOY_SECRET_DFLASH_KEY", KEY)
    with pytest.raises(DataError) as caught:
        host_config(data(api_key_secret="dflash-key", admin_api_key_secret="admin-key"), monkeypatch)
    assert "holds the same value as api_key_secret (dflash-key)" in str(caught.value) and KEY not in str(caught.value)
