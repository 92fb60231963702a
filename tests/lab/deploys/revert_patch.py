"""A test deploy: revert a patch set in a venv (patches.applied(present=False)).

    pyinfra INVENTORY tests/lab/deploys/revert_patch.py --data patch_set=NAME --data venv=PATH
"""

from pyinfra import host

from configuration import stacks
from operations.environment import patches

stack = stacks.load_stack(host.data.stack)
patches.applied(
    name=f"Patch set {host.data.patch_set} reverted in {host.data.venv}",
    patch_set=patches.load_patch_set(host.data.patch_set),
    venv_path=host.data.venv,
    site_packages=f"{host.data.venv}/{stack.site_packages}",
    present=False,
)
