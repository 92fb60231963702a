"""The service user and the unit's sandbox, without a host: data, rendering, device access, the secrets file's modes."""

from __future__ import annotations

import hashlib

import pytest
from pyinfra.api import OperationError

from configuration import settings, stacks
from configuration.errors import DataError
from operations.gpu import gpus
from operations.run import templates
from operations.service import secrets, service_user, units
from tests.unit.hosts import make_host
from tests.unit.test_operations import run
from tests.unit.test_units import LAB_GPUS, environment_lines, lab_config, lab_data, render

HARDENING = [
    "NoNewPrivileges=yes",
    "CapabilityBoundingSet=",
    "ProtectSystem=strict",
    "ProtectHome=tmpfs",
    "PrivateTmp=yes",
    "ProtectKernelTunables=yes",
    "ProtectKernelModules=yes",
    "ProtectKernelLogs=yes",
    "ProtectControlGroups=yes",
    "ProtectClock=yes",
    "ProtectHostname=yes",
    "ProtectProc=invisible",
    "RestrictSUIDSGID=yes",
    "RestrictRealtime=yes",
    "RestrictNamespaces=yes",
    "LockPersonality=yes",
    "SystemCallArchitectures=native",
    "RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6 AF_NETLINK",
    "StateDirectory=sglang",
    "CacheDirectory=sglang",
    "UMask=0077",
]
# What would break the engine: never set (only named in comments).
NEVER = ("PrivateDevices", "DevicePolicy", "MemoryDenyWriteExecute", "PrivateIPC", "PrivateUsers", "ProcSubset", "SystemCallFilter")


def directives(text: str) -> list[str]:
    return [line for line in text.splitlines() if line and not line.startswith("#")]


# Data ------------------------------------------------------------------------------------


def test_service_user_defaults_to_sglang_and_is_overridable_per_host():
    assert lab_config().service_user == "sglang"
    host = make_host(lab_data(), {"run_services": ["ddtree"], "service_user": "root"})
    assert settings.host_config(host).service_user == "root"


@pytest.mark.parametrize("value", ["Bad User", "1abc", "-x", "a" * 33, "", 7, None, "sg:lang"])
def test_a_bad_service_user_names_the_key_and_the_fix(value):
    host = make_host(lab_data(), {"run_services": ["ddtree"], "service_user": value})
    with pytest.raises(DataError) as caught:
        settings.host_config(host)
    assert str(caught.value).startswith(f"inventory (host gpu-a): service_user: {value!r}: must be a user name")


@pytest.mark.parametrize("value", ["sglang", "root", "svc_llm-2", "_sglang"])
def test_good_service_users(value):
    host = make_host(lab_data(), {"run_services": ["ddtree"], "service_user": value})
    assert settings.host_config(host).service_user == value


# Rendering -------------------------------------------------------------------------------


def test_the_unit_runs_as_the_service_user_in_the_sandbox():
    lines = directives(render(lab_config()))
    assert "User=sglang" in lines and "Group=sglang" in lines
    assert not any(line.startswith("SupplementaryGroups=") for line in lines)
    for directive in HARDENING:
        assert directive in lines, directive
    for name in NEVER:
        assert not any(line.startswith(name + "=") for line in lines), name
    assert "ExecStartPre=-+/usr/bin/nvidia-modprobe -u -c=0" in lines


def test_caches_and_home_point_into_the_units_own_directories():
    env = environment_lines(render(lab_config()), sandbox=True)
    assert env["HOME"] == "/var/lib/sglang" and env["XDG_CACHE_HOME"] == "/var/cache/sglang"
    assert env["TRITON_CACHE_DIR"] == "/var/cache/sglang/triton"
    assert env["FLASHINFER_WORKSPACE_BASE"] == "/var/cache/sglang/flashinfer"
    assert env["CUDA_VISIBLE_DEVICES"] == "0"


def test_a_variable_of_the_service_wins_over_the_sandbox_default():
    text = render(lab_config(env={"TRITON_CACHE_DIR": "/var/cache/sglang/my-triton"}))
    assert [line for line in text.splitlines() if line.startswith("Environment=TRITON_CACHE_DIR=")] == [
        "Environment=TRITON_CACHE_DIR=/var/cache/sglang/my-triton"
    ]


def test_what_the_service_loads_from_a_home_dir_is_bound_back_read_only():
    config = lab_config()  # ddtree: venv under /root, target in /dev/shm, draft in the store under /root
    binds = [line for line in directives(render(config)) if line.startswith("BindReadOnlyPaths=")]
    assert binds == [
        "BindReadOnlyPaths=/root/venv_sglang+ddtree-sample",
        "BindReadOnlyPaths=-/root/venv_sglang+ddtree-sample.generations",
        "BindReadOnlyPaths=-/root/models/Qwen3.6-27B-DFlash",
    ]


def test_nothing_is_bound_when_nothing_lives_in_a_home_dir():
    data = {**lab_data(), "venv_path": "/opt/sglang/venv", "model_store": "/srv/models"}
    config = settings.host_config(make_host(data, {"run_services": ["dflash"]}))
    config = gpus.decide(config, LAB_GPUS).config
    assert not any(line.startswith("BindReadOnlyPaths=") for line in render(config).splitlines())


def test_hidden_paths():
    assert service_user.hidden_paths("/root/venv", ("/home/m/x", "/dev/shm/x", "/root/venv")) == [
        ("/root/venv", True), ("/root/venv.generations", False), ("/home/m/x", False),
    ]
    assert service_user.hidden_paths("/rootfs/venv", ()) == []


def test_root_keeps_the_sandbox():
    config = lab_config()
    lines = directives(render(config.with_data(service_user="root")))
    assert "User=root" in lines and not any(line.startswith("Group=") for line in lines)
    for directive in HARDENING:
        assert directive in lines, directive


def test_gpu_device_groups_become_supplementary_groups():
    config = lab_config()
    stack = stacks.load_stack(config.stack)
    text = units.render_unit(config, config.services[0], stack, units.inputs_digest(stack, {}), supplementary_groups=("video", "render"))
    lines = directives(text)
    assert "SupplementaryGroups=video render" in lines


# GPU devices -----------------------------------------------------------------------------

DEVICES_0666 = [("666", "root", "/dev/nvidiactl"), ("666", "root", "/dev/nvidia0"), ("666", "root", "/dev/nvidia-uvm")]


@pytest.mark.parametrize(
    ("devices", "user", "groups", "closed"),
    [
        (DEVICES_0666, "sglang", (), ()),
        ([("660", "video", "/dev/nvidia0"), ("660", "video", "/dev/nvidiactl"), ("666", "root", "/dev/nvidia-uvm")], "sglang", ("video",), ()),
        ([("600", "root", "/dev/nvidia0"), ("666", "root", "/dev/nvidiactl")], "sglang", (), ("/dev/nvidia0",)),
        ([("660", "root", "/dev/nvidia0")], "sglang", (), ("/dev/nvidia0",)),
        ([("600", "root", "/dev/nvidia0")], "root", (), ()),
        ([], "sglang", (), ()),
    ],
    ids=["world-0666", "group-video", "root-only", "root-group", "as-root", "no-gpu"],
)
def test_device_access(devices, user, groups, closed):
    assert service_user.device_access(devices, user) == (groups, closed)


def test_gpu_devices_fact_reads_mode_group_and_path():
    fact = service_user.GpuDevices()
    assert fact.process(["666 root /dev/nvidia0", "660 video /dev/nvidia-caps/nvidia-cap1", ""]) == [
        ("666", "root", "/dev/nvidia0"), ("660", "video", "/dev/nvidia-caps/nvidia-cap1"),
    ]
    assert fact.default() == []


def test_a_device_only_root_can_open_fails_the_host_with_the_fix():
    with pytest.raises(OperationError, match="service_user sglang cannot open /dev/nvidia0 .* set `service_user: root`"):
        run(service_user.devices_reachable, {service_user.GpuDevices: [("600", "root", "/dev/nvidia0")]}, user="sglang")
    assert run(service_user.devices_reachable, {service_user.GpuDevices: DEVICES_0666}, user="sglang").commands == []


# The secrets file ------------------------------------------------------------------------

KEY = secrets.Secret("k", "k" * 20)
DIGEST = hashlib.sha256(secrets.config_text(KEY, None).encode()).hexdigest()


@pytest.mark.parametrize(("group", "dir_mode", "file_mode"), [("sglang", "710", "640"), ("root", "700", "600")])
def test_the_secrets_file_is_readable_by_root_and_the_service_group(group, dir_mode, file_mode):
    result = run(secrets.config_file, {secrets.SecretFileState: None}, service="s", api_key=KEY, admin_api_key=None, group=group)
    tmp = "/etc/sglang-deploy/secrets/s.yml.sglang-deploy.tmp"
    # The directory with its final mode and group throughout (a service starting meanwhile still reads its key);
    # the upload fills a root-only file made beforehand; owner and mode on it before its rename.
    assert result.commands[0] == (f"install -d -m {dir_mode} -o root -g {group} /etc/sglang-deploy/secrets && rm -f {tmp} "
                                  f"&& install -m 600 /dev/null {tmp}")
    assert result.commands[1] == ("put", "<bytes>", tmp)
    assert result.commands[2] == f"chown root:{group} {tmp} && chmod {file_mode} {tmp} && mv -f {tmp} /etc/sglang-deploy/secrets/s.yml"
    assert len(result.commands) == 3
    assert KEY.reveal() not in repr(result.commands)


def test_a_secrets_file_of_another_group_is_rewritten_and_a_current_one_left():
    old = {"mode": "600", "owner": "root", "group": "root", "sha256": DIGEST}
    assert run(secrets.config_file, {secrets.SecretFileState: old}, service="s", api_key=KEY, admin_api_key=None, group="sglang").commands
    current = {**old, "mode": "640", "group": "sglang"}
    assert run(secrets.config_file, {secrets.SecretFileState: current}, service="s", api_key=KEY, admin_api_key=None, group="sglang").commands == []


def test_secret_file_state_reads_the_group():
    assert secrets.SecretFileState().process(["640 root sglang", "abc  -"]) == {"mode": "640", "owner": "root", "group": "sglang", "sha256": "abc"}


def test_the_places_the_service_user_writes_are_the_ones_configuration_refuses_for_roots_paths():
    # configuration/kinds.py refuses venv_path, model_store and host_wheel_cache inside the unit's StateDirectory and
    # CacheDirectory (systemd hands them to the service user); they must stay the directories the unit names.
    from pathlib import Path

    from configuration import host_paths, kinds

    assert {host_paths.SERVICE_STATE_DIR, host_paths.SERVICE_CACHE_DIR} <= set(kinds.WRITABLE_BY_OTHERS)
    assert (host_paths.SERVICE_STATE_DIR, host_paths.SERVICE_CACHE_DIR) == (service_user.STATE_DIR, service_user.CACHE_DIR)
    template = (templates.TEMPLATES / "sglang.service.j2").read_text()
    assert f"StateDirectory={Path(service_user.STATE_DIR).name}" in template
    assert f"CacheDirectory={Path(service_user.CACHE_DIR).name}" in template
