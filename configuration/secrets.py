"""Secrets on the control machine: what a secret name in the data resolves to, checked before any
host is touched.

Keys never live in the repo's YAML: the data names a secret (`api_key_secret: ddtree-key`)
and its value comes from a git-ignored file on the control machine (`secrets_file`, a YAML
map name -> value) or from the environment (`SGLANG_DEPLOY_SECRET_DDTREE_KEY`), which wins.
A value is a `Secret`, which never shows itself; every value loaded here is registered for
redaction (configuration/redaction.py), so no message the run prints quotes one.

On the host the value lives only in `config_path(service)`
(`/etc/sglang-deploy/secrets/<service>.yml`), which sglang reads through `--config`; writing that
file is operations/service/secrets.py's.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from configuration import redaction
from configuration.errors import DataError
from configuration.host_paths import SECRETS_DIR
from configuration.yamlload import load_file

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
    registered for redaction (configuration/redaction.py), whether a service uses it or not."""
    if not path.exists():
        return {}
    if path.is_dir():
        raise DataError(str(path), "(file)", str(path),
                        "is a directory: `secrets_file` names a YAML file (secret name -> value), "
                        "e.g. .secrets/secrets.yml")
    _owner_alone(path)
    # Never echo the file: its content is secret (secret=True). Say where and what to fix.
    data = load_file(path, str(path), secret=True) or {}
    if (not isinstance(data, dict)
            or not all(isinstance(k, str) and isinstance(v, (str, int)) for k, v in data.items())):
        raise DataError(str(path), "(top level)", "<not shown>",
                        "must be a map of secret name -> string value")
    values = {k: str(v) for k, v in data.items()}
    for name, value in values.items():
        redaction.register(name, value)
    return values


def _owner_alone(path: Path) -> None:
    """The secrets file is yours and yours alone, as OpenSSH holds a private key: another user who
    reads it holds every service's key; one who writes it chooses them."""
    st = path.stat()
    if st.st_uid not in (os.geteuid(), 0):
        raise DataError(str(path), "(file)", f"uid {st.st_uid}",
                        f"belongs to another user (uid {st.st_uid}), who can read and change every "
                        f"key in it: keep your own copy (cp it, then chmod 600 it) and name that "
                        f"in `secrets_file`")
    if st.st_mode & 0o077:
        raise DataError(str(path), "(file)", f"mode {st.st_mode & 0o777:o}",
                        f"others than its owner may read or write it (mode "
                        f"{st.st_mode & 0o777:o}): every key in it is theirs too: chmod 600 {path} "
                        "(as OpenSSH requires of a private key)")


def register_environment_secrets() -> None:
    """Register every `$SGLANG_DEPLOY_SECRET_<NAME>` value for redaction: the run knows them all,
    used or not. A value known already keeps its name (the secret's, once a service asked for
    it)."""
    for variable, value in os.environ.items():
        if variable.startswith(_ENV_PREFIX) and not redaction.known(value):
            redaction.register(variable, value)


# Bytes a key may hold: printable ASCII without spaces. A carriage return, a line break or another
# control character would end or split the `Authorization` header and the key file's line (and an
# HTTP client quotes the whole key back in its error); a space at either end is stripped from a
# header value; non-ASCII is encoded differently by each client.
KEY_CHARACTERS = re.compile(r"[!-~]+")
MIN_KEY_LENGTH = 16


def value_problem(value: str) -> str | None:
    """What makes `value` unusable as a key, in words that never quote it; None when it is
    usable."""
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


def resolve_secret(name: str, secrets_file: Path, source: str, key_path: str) -> Secret:
    """The secret called `name`, from the environment or the secrets file, or a DataError saying
    where to put it.

    Every secret value the run can know (the environment's, the secrets file's) is registered for
    redaction first, so that no message printed from here on shows one, this one's refusal
    included."""
    register_environment_secrets()
    value = os.environ.get(env_name(name))
    if value is None:
        value = load_secrets_file(secrets_file).get(name)
    if not value:
        raise DataError(
            source, key_path, name,
            f"no such secret: set ${env_name(name)}, or add `{name}: <value>` to {secrets_file} "
            "(git-ignored, on the control machine)",
        )
    redaction.register(name, value)  # known by the name the data gives it from here on
    problem = value_problem(value)
    if problem:
        raise DataError(
            source, key_path, name,
            f"the secret must be a single line of at least {MIN_KEY_LENGTH} characters, printable "
            f"ASCII without spaces (letters, digits, punctuation); {problem}: set "
            f"${env_name(name)}, or `{name}` in {secrets_file}, again",
        )
    return Secret(name, value)


def config_path(service: str) -> str:
    """The root-only `--config` file on the host that carries `service`'s API keys."""
    return f"{SECRETS_DIR}/{service}.yml"
