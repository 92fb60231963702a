"""Secrets on the host: a service's API keys, in a root-only file that sglang reads.

Which value a secret name in the data stands for is configuration/secrets.py's (the `Secret` type,
the lookup in the environment and the control machine's secrets file, `config_path`): validated with
the rest of the data, before any host is touched. Here, the host side. The value lives only in
`/etc/sglang-deploy/secrets/<service>.yml`, which sglang reads through `--config`: owned by root,
readable by the service user's group only (0640 in a 0710 directory; 0600 in a 0700 one when the
services run as root): so it is in no unit file, no process argv, and - because the value is never
an operation argument and the file is never diffed - in no command pyinfra prints, `-vvv` and
`--diff` included. The engine itself logs it (sglang's `server_args=ServerArgs(...)` line,
sgl-project/sglang#37457): every value loaded is registered for redaction
(configuration/redaction.py), and `operations/run/redact.py` keeps it out of everything the run
prints.
"""

from __future__ import annotations

import hashlib
import json
import shlex

from pyinfra import host
from pyinfra.api import FactBase

from configuration.host_paths import SECRETS_DIR
from configuration.secrets import Secret, config_path
from operations.run import directory, host_reads, read_batch, redact
from operations.run.file_write import replace_file
from operations.run.host_reads import operation


def config_text(api_key: Secret | None, admin_api_key: Secret | None) -> str:
    """The `--config` YAML for sglang: JSON strings are valid YAML and need no escaping rules of our
    own."""
    lines = []
    if api_key:
        lines.append(f"api-key: {json.dumps(api_key.reveal())}")
    if admin_api_key:
        lines.append(f"admin-api-key: {json.dumps(admin_api_key.reveal())}")
    return "\n".join(lines) + "\n"


@read_batch.batched()
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
    """(directory mode, file mode) of the secrets for a service running with `group`: root-only for
    root."""
    return ("700", "600") if group == "root" else ("710", "640")


def ensure_directory(group: str) -> None:
    """Add the operation that keeps the key files' directory root's and only the service group's to
    enter.

    Its own operation, apart from the key files: putting back a mode changed by hand changes no key,
    so it restarts no service (a key file's operation is one of its service's inputs).
    """
    dir_mode, _ = file_modes(group)
    directory.present(name=f"Secrets directory {SECRETS_DIR} is {dir_mode} root:{group}",
                      path=SECRETS_DIR, user="root", group=group, mode=dir_mode)


def key_file_differs(state: dict | None, digest: str, group: str) -> str | None:
    """Why a key file read as `state` (`SecretFileState`) is not the one holding `digest`, root's
    and `group`'s with the mode `file_modes` gives; None when it is. Never its content: only its
    sha256 is read."""
    if state is None:
        return "absent"
    file_mode = file_modes(group)[1]
    if state.get("sha256") != digest:
        return "its keys differ from the data (content not shown)"
    if (state.get("mode"), state.get("owner"), state.get("group")) != (file_mode, "root", group):
        return (f"mode {state.get('mode')} {state.get('owner')}:{state.get('group')}, wanted "
                f"{file_mode} root:{group}")
    return None


def key_file_digest(service: str, api_key: Secret | None, admin_api_key: Secret | None) -> str:
    """The sha256 of the key file's content, registered for redaction (a weak key could be guessed
    from it: `-vvv` prints this fact's output and the started record's)."""
    digest = hashlib.sha256(config_text(api_key, admin_api_key).encode()).hexdigest()
    redact.register(f"sha256 of the key file of {service}", digest)
    return digest


@operation()
def config_file(service: str, api_key: Secret | None, admin_api_key: Secret | None,
                present: bool = True, group: str = "root"):
    """
    Keep the `--config` file holding a service's API keys: root's, readable by ``group`` only.

    + service: the service's name (the file is ``/etc/sglang-deploy/secrets/<service>.yml``)
    + api_key, admin_api_key: `Secret` objects (never plain strings: operation arguments are
      printed)
    + present: ``False`` removes the file
    + group: the service user's group (``root``: the file is 0600 root-only; else 0640 root:group in
      a 0710 directory)

    Secrecy:
        The content is uploaded into a root-only (0600) file beside the target, made 0600/0640,
        then renamed into place; the directory stays 0700/0710 throughout. Only the file's
        sha256 is read back. Nothing prints its content.

    **Example:**

    .. code:: python

        secrets.config_file(name="API key file of ddtree", service="ddtree", api_key=secret,
                            admin_api_key=None)
    """
    path = config_path(service)
    content = config_text(api_key, admin_api_key).encode()
    digest = key_file_digest(service, api_key, admin_api_key) if present else None
    state = host_reads.get(host, SecretFileState, path=path)
    if not present:
        if state is None:
            host.noop(f"secret file of {service} is absent")
        else:
            yield f"rm -f {shlex.quote(path)}"
        return
    dir_mode, file_mode = file_modes(group)
    if key_file_differs(state, digest, group) is None:
        host.noop(f"secret file of {service} is current ({file_mode} root:{group})")
        return
    host.log(f"secret file of {service}: {'writing' if state is None else 'updating'} {path} "
             "(content not shown)")
    # The directory keeps its final mode and group throughout (a service starting meanwhile can
    # still read its key); the upload fills a root-only file beside the target (replace_file), which
    # is then made 0640/0600.
    yield from replace_file(path, content, file_mode, "root", group, make_parent=dir_mode,
                            parent_group=group)
