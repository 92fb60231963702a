"""The deploy's own fixed paths on every host: each has its home here, and only here.

The operations write and read them (operations/service/secrets.py, models.py, rollback.py, units and
the placement, GPU and status reads); the data's rules (configuration/kinds.py) keep every path an
operator configures away from them. The remote scripts (operations/remote/, stdlib only, sent to the
hosts as one file each) are given these paths as arguments, or keep a copy that a unit test
compares.
"""

from __future__ import annotations

# Configuration the deploy writes: the services' API-key files, the boot staging list.
CONFIG_DIR = "/etc/sglang-deploy"
SECRETS_DIR = f"{CONFIG_DIR}/secrets"
BOOT_LIST = f"{CONFIG_DIR}/models.json"
# Scripts the deploy installs (the boot unit's copy of model/on_host/stage_model.py).
SCRIPT_DIR = "/usr/local/lib/sglang-deploy"
BOOT_SCRIPT = f"{SCRIPT_DIR}/stage_model.py"
# The deploy lock (a directory; /run empties at a reboot). operations/lock/lock_record.py keeps its
# own copy.
LOCK_PATH = "/run/sglang-deploy.lock"
# systemd's units, ours among them (`sglang-<service>.service`, the boot staging unit).
UNIT_DIR = "/etc/systemd/system"
# The deploy's state, root's alone: saved units for rollback, the records of what each service
# started with.
STATE_DIR = "/var/lib/sglang-deploy"
# The unit's StateDirectory= and CacheDirectory= (templates/sglang.service.j2): systemd hands them
# to the service user, whose home the first is (operations/service/service_user.py; a unit test
# keeps the template equal).
SERVICE_STATE_DIR = "/var/lib/sglang"
SERVICE_CACHE_DIR = "/var/cache/sglang"

# Root's runtime directory (0700; /run empties at a reboot): the staging lock
# (model/on_host/stage_model.py keeps a copy).
RUN_DIR = "/run/sglang-deploy"

# What no configured directory may be, contain or lie inside (configuration/kinds.py).
OWN_PATHS = (CONFIG_DIR, SCRIPT_DIR, LOCK_PATH, UNIT_DIR, STATE_DIR, RUN_DIR)


def unit_path(unit_name: str) -> str:
    """Where systemd reads unit `unit_name` from (`sglang-ddtree.service` ->
    /etc/systemd/system/sglang-ddtree.service)."""
    return f"{UNIT_DIR}/{unit_name}"

