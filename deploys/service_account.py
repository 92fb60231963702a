"""Service account: the account the services run as (`service_user`, a system user; root where
the data says so), the directory of their key files, and the groups of this host's GPU device files,
for the units' sandbox. Nothing on a host with no service placed on it.

The deploy makes the account its own and runs the engine with its privileges, so an account that is
someone else's, or GPU devices it cannot open, refuse the host before anything changes
(operations/service/service_user.py).
"""

from __future__ import annotations

from pyinfra.api import deploy
from pyinfra.facts.files import Directory
from pyinfra.facts.server import Groups

from configuration.host_paths import SECRETS_DIR
from deploys.planning import Reading, directory_change
from operations.run.plan import Refusal
from operations.service import secrets
from operations.service.service_user import (
    NOLOGIN,
    Account,
    AccountStanding,
    GpuDevices,
    account_fixes,
    ensure_account,
    gpu_device_groups,
    group_of,
    refuse_closed_devices,
    refuse_not_dedicated,
)
from operations.service.service_user import STATE_DIR as ACCOUNT_HOME

STEP = "Service account"


def plan(reading: Reading) -> None:
    """The account's refusals (`refuse_closed_devices`, `refuse_not_dedicated`), its group and user
    (`account_fixes`), and the key files' directory: as `ensure_account` and
    `secrets.ensure_directory` decide them."""
    config, plan_, ask = reading.config, reading.plan, reading.ask
    if not config.services:
        return
    user = config.service_user
    try:
        refuse_closed_devices(ask(GpuDevices), user)
    except Refusal as refusal:
        plan_.refuse(STEP, refusal, user)
    if user != "root":
        try:
            refuse_not_dedicated(user, ask(AccountStanding, user=user))
        except Refusal as refusal:
            plan_.refuse(STEP, refusal, user)
        group = group_of(user)
        if group not in ask(Groups):
            plan_.add(STEP, f"group {group}", "create", "a system group of the service user's")
        account = ask(Account, user=user)
        if account is None:
            plan_.add(STEP, f"user {user}", "create", "a system user without a login shell")
        else:
            fixes = account_fixes(account, group, ACCOUNT_HOME, NOLOGIN)
            if fixes:
                plan_.add(STEP, f"user {user}", "update",
                          ", ".join(f"{k} {account.get(k)}, wanted {v}" for k, v in fixes.items()))
    if any(s.config_file for s in config.services):
        group = group_of(user)
        directory_change(plan_, STEP, SECRETS_DIR, ask(Directory, path=SECRETS_DIR),
                         secrets.file_modes(group)[0], "root", group)


@deploy(STEP)
def service_account(config) -> tuple[str, ...]:
    """Add the account, its key files' directory; the GPU device groups for the units."""
    if not config.services:
        return ()
    ensure_account(config.service_user)
    if any(service.config_file for service in config.services):
        secrets.ensure_directory(group_of(config.service_user))
    return gpu_device_groups(config.service_user)
