"""Rendering of the systemd unit for one service (pure: no host access, tested without one)."""

from __future__ import annotations

import hashlib

from configuration.settings import HostConfig, Service
from configuration.stacks import Stack, load_stack
from operations.run.templates import systemd_quote, template
from operations.service import kernel_cache, service_user

# CUDA numbers GPUs fastest first unless told otherwise; `gpu` (CUDA_VISIBLE_DEVICES) means
# nvidia-smi's numbers, which the GPU check reads: by PCI bus. The data may not set it
# (configuration/kinds.py, DERIVED_ENV).
GPU_ORDER = {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}


def flag_lines(argv: list[str]) -> list[str]:
    """Group argv into one `--flag value...` line per flag."""
    lines: list[list[str]] = []
    for word in argv:
        if word.startswith("--") or not lines:
            lines.append([word])
        else:
            lines[-1].append(word)
    return [" ".join(systemd_quote(w) for w in line) for line in lines]


def inputs_digest(stack: Stack, patch_digests: dict[str, str]) -> str:
    """A short digest of what the process loads besides its flags: the stack's pins and patch sets.

    It is written into the unit, so that a new stack or patch set changes the unit and
    so restarts the service even if an earlier run died between install and restart.
    The stack's resolved content counts (a base stack's pins included), not its file's bytes.
    """
    digest = hashlib.sha256(stack.content_digest.encode())
    for name in sorted(patch_digests):
        digest.update(f"{name}={patch_digests[name]}".encode())
    return f"stack {stack.name} {digest.hexdigest()[:16]}"


def bind_paths(service: Service) -> list[tuple[str, bool]]:
    """(path, required) bound read-only into the unit: what it loads from a home dir that
    `ProtectHome=tmpfs` hides."""
    return service_user.hidden_paths(service.environment.path,
                                     tuple(m.load_path for m in service.models))


def venv_bin_path(venv_path: str) -> str:
    """PATH as an activated venv has it: the engine's JIT runs tools the stack installs there
    (sglang 0.5.11's kernels build with the `ninja` of the `ninja` wheel; without it on PATH the
    first forward pass fails with "No such file or directory: 'ninja'")."""
    return f"{venv_path}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


# The [Service] directives that say what the unit runs and how systemd keeps it running, not the
# sandbox it runs in: `sandbox_properties` leaves them out (a run in the service's sandbox brings
# its own command and environment). Everything else in the template's [Service] section is the
# sandbox, a line added there later included.
NOT_SANDBOX = frozenset(
    {"Type", "ExecStart", "WorkingDirectory", "Environment", "TimeoutStartSec", "TimeoutStopSec",
     "KillMode", "Restart", "RestartSec"})


def sandbox_properties(unit_text: str) -> list[str]:
    """The sandbox of a rendered unit, as `systemd-run -p` assignments: every directive of its
    [Service] section but NOT_SANDBOX, in order, written as the unit writes it (User=, Group=,
    SupplementaryGroups=, StateDirectory=, ..., ProtectHome=tmpfs with its BindReadOnlyPaths=,
    RestrictAddressFamilies=, the ExecStartPre= that makes the GPU device nodes).

    The one source is the template: whatever runs the engine's code outside the unit (the preflight,
    measure.py's client) runs in the same sandbox as the service, as its user, from the unit text
    itself, so the two cannot drift. The values are written as a unit file takes them, which
    `systemd-run -p` takes too (the paths in them have no spaces, quotes, `%` or `$`:
    configuration/kinds.py).
    """
    out: list[str] = []
    section = None
    logical = ""
    for line in unit_text.splitlines():
        if logical:
            logical = logical[:-1] + " " + line.strip()
        elif not line.strip() or line.lstrip().startswith(("#", ";")):
            continue
        elif line.startswith("["):
            section = line.strip()
            continue
        else:
            logical = line
        if logical.endswith("\\"):
            continue
        name, _, value = logical.partition("=")
        if name == "CacheDirectory":
            logical = _without_kernel_caches(value)
        if section == "[Service]" and name not in NOT_SANDBOX and logical:
            out.append(logical)
        logical = ""
    return out


def _without_kernel_caches(value: str) -> str:
    """A `CacheDirectory=` line without the service's kernel cache (kernel_cache.py): a run in the
    service's sandbox (its preflight, a benchmark client) compiles nothing for it, and the cache of
    flags its preflight refused would be made and left for the Cleanup step to remove."""
    root = kernel_cache.unit_setting(kernel_cache.KERNELS_DIR).split()[0]
    kept = [w for w in value.split() if w != root and not w.startswith(root + "/")]
    return f"CacheDirectory={' '.join(kept)}" if kept else ""


def service_sandbox(config: HostConfig, service: Service) -> list[str]:
    """`sandbox_properties` of the unit `render_unit` writes for `service` (without the GPU device
    groups: they only grant access to the GPUs, which a run that opens none does not need)."""
    stack = load_stack(config.stack)
    return sandbox_properties(render_unit(config, service, stack, inputs_digest(stack, {})))


def render_unit(
    config: HostConfig,
    service: Service,
    stack: Stack,
    inputs: str,
    after_units: tuple[str, ...] = (),
    supplementary_groups: tuple[str, ...] = (),
    runs: str | None = None,
) -> str:
    """The unit; `supplementary_groups`: the groups of this host's GPU devices
    (service_user.gpu_device_groups); `runs`: the venv generation it runs (`venv_read.generation`'s
    path: its ExecStart and PATH name it, not the live link, so a unit kept as it was - its
    service's rollout held - restarts on what it ran); None: the live link (a sandbox's
    properties, which name neither)."""
    # A unit's kernel cache is keyed by the generation it runs; a sandbox's run (None) gets none.
    cache = kernel_cache.directory(service, runs) if runs else None
    runs = runs or service.environment.path
    return template("sglang.service.j2").render(
        user=config.service_user,
        group=service_user.group_of(config.service_user),
        supplementary_groups=list(supplementary_groups),
        kernel_cache=kernel_cache.unit_setting(cache) if cache else None,
        runtime_environment={**service_user.runtime_environment(cache),
                             "PATH": venv_bin_path(runs)},
        bind_paths=bind_paths(service),
        service=service,
        host_name=config.host,
        stack=stack,
        inputs=inputs,
        environment={**GPU_ORDER, **service.environment_variables()},
        venv_path=service.environment.path,
        runs=runs,
        launcher=config.launcher,
        flag_lines=flag_lines(service.argv()),
        after_units=list(after_units),
    )
