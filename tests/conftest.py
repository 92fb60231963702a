import random
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def pytest_addoption(parser):
    parser.addoption(
        "--shuffle-modules", metavar="SEED", nargs="?", const="random", default=None,
        help="run test modules in a shuffled order (tests keep their order inside a module); SEED repeats an order",
    )


def pytest_configure(config):
    seed = config.getoption("--shuffle-modules")
    if seed == "random":
        seed = str(random.randrange(1 << 32))
    config._shuffle_seed = seed


def pytest_report_header(config):
    if config._shuffle_seed is not None:
        return f"modules shuffled with seed {config._shuffle_seed} (--shuffle-modules {config._shuffle_seed} repeats it)"


def pytest_collection_modifyitems(session, config, items):
    """Order independence is checked by running whole modules in a random order (pytest-randomly is not installed)."""
    if config._shuffle_seed is None:
        return
    modules: dict[str, list] = {}
    for item in items:
        modules.setdefault(item.nodeid.split("::")[0], []).append(item)
    order = sorted(modules)
    random.Random(config._shuffle_seed).shuffle(order)
    items[:] = [item for name in order for item in modules[name]]


@pytest.fixture(autouse=True)
def _fresh_key_sources(monkeypatch):
    """configuration/group_files.py remembers which group file each key came from (module state, filled by whatever
    test loaded a group file first); every test starts without it, so an error's source name does not depend on test
    order."""
    from configuration import group_files

    monkeypatch.setattr(group_files, "_KEY_SOURCES", {})
