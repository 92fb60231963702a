"""Secrets: a service's API keys, from the control machine to a root-only file on the host.

Keys never live in the repo's YAML: the data names a secret (`api_key_secret: ddtree-key`)
and its value comes from a git-ignored file on the control machine (`secrets_file`, a YAML
map name -> value) or from the environment (`SGLANG_DEPLOY_SECRET_DDTREE_KEY`), which wins.
On the host the value lives only in `/etc/sglang-deploy/secrets/<service>.yml`, which sglang
reads through `--config`: owned by root, readable by the service user's group only (0640 in a
0710 directory; 0600 in a 0700 one when the services run as root): so it is in no unit file, no
process argv, and - because the value is never an operation argument and the file is never
diffed - in no command pyinfra prints, `-vvv` and `--diff` included. The engine itself logs it
(sglang's `server_args=ServerArgs(...)` line, sgl-project/sglang#37457): every value loaded here
is registered with `operations/redact.py`, which keeps it out of everything the run prints.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
from pathlib import Path

from pyinfra import host
from pyinfra.api import FactBase

from configuration.errors import DataError
from configuration.yamlload import load_file
from operations import directory, host_reads, redact
from operations.file_write import replace_file
from operations.host_reads import operation

SECRETS_DIR = "/etc/sglang-deploy/secrets"
_ENV_PREFIX = "SGLANG_DEPLOY_SECRET_"


class Secret:
    """A secret value that never shows itself (repr, str, logs, operation arguments)."""

    __slots__ = ("name", "_value")

    def __init__(self, name: str, value: str):
        self.name = name
        self._value = value

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return f"<secret {self.name}>"

    __str__ = __repr__

    def __eq__(self, other) -> bool:
        return isinstance(other, Secret) and (self.name, self._value) == (other.name, other._value)

    def __hash__(self) -> int:
        return hash(self.name)


def env_name(secret_name: str) -> str:
    return _ENV_PREFIX + re.sub(r"[^A-Za-z0-9]", "_", secret_name).upper()


def load_secrets_file(path: Path) -> dict[str, str]:
    """name -> value from the control machine's secrets file ({} when there is none); each value is
    registered for redaction (operations/redact.py), whether a service uses it or not."""
    if not path.exists():
        return {}
    if path.is_dir():
        raise DataError(str(path), "(file)", str(path), "is a directory: `secrets_file` names a YAML file (secret name -> value), e.g. .secrets/secrets.yml")
    # Never echo the file: its content is secret (secret=True). Say where and what to fix.
    data = load_file(path, str(path), secret=True) or {}
    if not isinstance(data, dict) or not all(isinstance(k, str) and isinstance(v, (str, int)) for k, v in data.items()):
        raise DataError(str(path), "(top level)", "<not shown>", "must be a map of secret name -> string value")
    values = {k: str(v) for k, v in data.items()}
    for name, value in values.items():
        redact.register(name, value)
    return values


def register_environment_secrets() -> None:
    """Register every `$SGLANG_DEPLOY_SECRET_<NAME>` value for redaction: the run knows them all, used or not.
    A value known already keeps its name (the secret's, once a service asked for it)."""
    for variable, value in os.environ.items():
        if variable.startswith(_ENV_PREFIX) and not redact.known(value):
            redact.register(variable, value)


# Bytes a key may hold: printable ASCII without spaces. A carriage return, a line break or another control
# character would end or split the `Authorization` header and the key file's line (and an HTTP client quotes
# the whole key back in its error); a space at either end is stripped from a header value; non-ASCII is
# encoded differently by each client.
KEY_CHARACTERS = re.compile(r"[!-~]+")
MIN_KEY_LENGTH = 16


def value_problem(value: str) -> str | None:
    """What makes `value` unusable as a key, in words that never quote it; None when it is usable."""
    if len(value) < MIN_KEY_LENGTH:
        return f"it has {len(value)} characters"
    if KEY_CHARACTERS.fullmatch(value):
        return None
    kinds = []
    for char in value:
        if char == "\n":
            kind = "a line break (\\n)"
        elif char == "\r":
            kind = "a carriage return (\\r)"
        elif char in " \t":
            kind = "a space or tab"
        elif ord(char) < 0x20 or ord(char) == 0x7F:
            kind = f"a control character (0x{ord(char):02x})"
        elif ord(char) > 0x7F:
            kind = "a non-ASCII character"
        else:
            continue
        if kind not in kinds:
            kinds.append(kind)
    return "it holds " + " and ".join(kinds)


def resolve(name: str, secrets_file: Path, source: str, key_path: str) -> Secret:
    """The secret called `name`, from the environment or the secrets file, or a DataError saying where to put it.

    Every secret value the run can know (the environment's, the secrets file's) is registered for redaction
    first, so that no message printed from here on shows one, this one's refusal included."""
    register_environment_secrets()
    value = os.environ.get(env_name(name))
    if value is None:
        value = load_secrets_file(secrets_file).get(name)
    if not value:
        raise DataError(
            source, key_path, name,
            f"no such secret: set ${env_name(name)}, or add `{name}: <value>` to {secrets_file} (git-ignored, on the control machine)",
        )
    redact.register(name, value)  # known by the name the data gives it from here on
    problem = value_problem(value)
    if problem:
        raise DataError(
            source, key_path, name,
            f"the secret must be a single line of at least {MIN_KEY_LENGTH} characters, printable ASCII without spaces "
            f"(letters, digits, punctuation); {problem}: set ${env_name(name)}, or `{name}` in {secrets_file}, again",
        )
    return Secret(name, value)


def config_path(service: str) -> str:
    return f"{SECRETS_DIR}/{service}.yml"


def config_text(api_key: Secret | None, admin_api_key: Secret | None) -> str:
    """The `--config` YAML for sglang: JSON strings are valid YAML and need no escaping rules of our own."""
    lines = []
    if api_key:
        lines.append(f"api-key: {json.dumps(api_key.reveal())}")
    if admin_api_key:
        lines.append(f"admin-api-key: {json.dumps(admin_api_key.reveal())}")
    return "\n".join(lines) + "\n"


@host_reads.batched()
class SecretFileState(FactBase):
    """sha256 and mode of a secret file (never its content), or None if absent."""

    def command(self, path: str) -> str:
        quoted = shlex.quote(path)
        return f"if [ -f {quoted} ]; then stat -c '%a %U %G' {quoted} && sha256sum < {quoted}; fi"

    def process(self, output):
        lines = [line for line in output if line.strip()]
        if len(lines) < 2:
            return None
        mode, owner, group = lines[0].split()
        return {"mode": mode, "owner": owner, "group": group, "sha256": lines[1].split()[0]}


def file_modes(group: str) -> tuple[str, str]:
    """(directory mode, file mode) of the secrets for a service running with `group`: root-only for root."""
    return ("700", "600") if group == "root" else ("710", "640")


def ensure_directory(group: str) -> None:
    """Add the operation that keeps the key files' directory root's and only the service group's to enter.

    Its own operation, apart from the key files: putting back a mode changed by hand changes no key, so it
    restarts no service (a key file's operation is one of its service's inputs).
    """
    dir_mode, _ = file_modes(group)
    directory.present(name=f"Secrets directory {SECRETS_DIR} is {dir_mode} root:{group}", path=SECRETS_DIR,
                      user="root", group=group, mode=dir_mode)


@operation()
def config_file(service: str, api_key: Secret | None, admin_api_key: Secret | None, present: bool = True, group: str = "root"):
    """
    Keep the `--config` file holding a service's API keys: root's, readable by ``group`` only.

    + service: the service's name (the file is ``/etc/sglang-deploy/secrets/<service>.yml``)
    + api_key, admin_api_key: `Secret` objects (never plain strings: operation arguments are printed)
    + present: ``False`` removes the file
    + group: the service user's group (``root``: the file is 0600 root-only; else 0640 root:group in a 0710 directory)

    Secrecy:
        The content is uploaded into a root-only (0600) file beside the target, made 0600/0640,
        then renamed into place; the directory stays 0700/0710 throughout. Only the file's
        sha256 is read back. Nothing prints its content.

    **Example:**

    .. code:: python

        secrets.config_file(name="API key file of ddtree", service="ddtree", api_key=secret, admin_api_key=None)
    """
    path = config_path(service)
    content = config_text(api_key, admin_api_key).encode()
    digest = hashlib.sha256(content).hexdigest()
    if present:
        # The file's sha256 is derived from the keys (a weak key could be guessed from it): `-vvv` prints it
        # (this fact's output, the started record's), so it is redacted like the keys themselves.
        redact.register(f"sha256 of the key file of {service}", digest)
    state = host_reads.get(host, SecretFileState, path=path)
    if not present:
        if state is None:
            host.noop(f"secret file of {service} is absent")
        else:
            yield f"rm -f {shlex.quote(path)}"
        return
    dir_mode, file_mode = file_modes(group)
    wanted = {"sha256": digest, "mode": file_mode, "owner": "root", "group": group}
    if state and all(state.get(k) == v for k, v in wanted.items()):
        host.noop(f"secret file of {service} is current ({file_mode} root:{group})")
        return
    host.log(f"secret file of {service}: {'writing' if state is None else 'updating'} {path} (content not shown)")
    # The directory keeps its final mode and group throughout (a service starting meanwhile can still read its
    # key); the upload fills a root-only file beside the target (replace_file), which is then made 0640/0600.
    yield from replace_file(path, content, file_mode, "root", group, make_parent=dir_mode, parent_group=group)
