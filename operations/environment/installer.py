"""How distributions get into a venv on the host: uv when the wheelhouse ships it, else pip.

uv is a single static binary, shipped as a wheel beside the stack's wheels (the wheelhouse
builder fetches it) and unpacked once per host under the host wheel cache; it installs a
stack several times faster than pip. It copies from its cache (`--link-mode copy`), never
hard-links: a venv file that shared its inode with the cache (uv's default) would carry a hand
edit into the cache, and every "reinstall" would link the edited file back. pip (the venv's own)
is the fallback: a host whose architecture has no pinned uv wheel, or `installer: pip` in
the data. Both are driven the same way: `--no-deps`, exact files, nothing resolved.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path

from configuration.stacks import Package
from operations import remote

UV_VERSION = "0.13.9"
# The uv wheel per host architecture (`uname -m`), pinned like a stack's files.
UV_WHEELS = {
    "x86_64": Package(
        "uv", UV_VERSION, "uv-0.13.9-py3-none-manylinux_2_17_x86_64.manylinux2014_x86_64.whl",
        "d7f459fe4fd247d830351c75686d3996ace3c6f3f728eb0e85a30b7ada0cef19",
    ),
    "aarch64": Package(
        "uv", UV_VERSION,
        "uv-0.13.9-py3-none-manylinux_2_17_aarch64.manylinux2014_aarch64.musllinux_1_1_aarch64.whl",
        "5435c5ce14a56431208ca0996416d310f1598e8c2c8ba707688985a16bb82dbe",
    ),
}
CHOICES = ("auto", "uv", "pip")


def uv_binary(host_cache: str) -> str:
    return f"{host_cache}/.tools/uv-{UV_VERSION}/uv"


def uv_cache(host_cache: str) -> str:
    return f"{host_cache}/.uv-cache"


def uv_wheel(wheelhouse: Path, machine: str) -> Path | None:
    package = UV_WHEELS.get(machine)
    if package is None:
        return None
    path = wheelhouse / package.file
    return path if path.is_file() else None


def unpack_uv_command(wheel: str, host_cache: str) -> str:
    """Unpack the uv binary from its wheel (a zip) into place, atomically."""
    binary = uv_binary(host_cache)
    script = (
        "import os, sys, zipfile\n"
        "wheel, binary, member = sys.argv[1:4]\n"
        "os.makedirs(os.path.dirname(binary), exist_ok=True)\n"
        "with zipfile.ZipFile(wheel) as z, open(binary + '.tmp', 'wb') as out:\n"
        "    out.write(z.read(member))\n"
        "os.chmod(binary + '.tmp', 0o755)\n"
        "os.rename(binary + '.tmp', binary)\n"
    )
    member = f"uv-{UV_VERSION}.data/scripts/uv"
    return remote.isolated("python3", f"-c {shlex.quote(script)} {shlex.quote(wheel)} "
                                      f"{shlex.quote(binary)} {shlex.quote(member)}")


@dataclass(frozen=True)
class Installer:
    """Commands that install into / remove from the venv at `venv` (a generation directory)."""

    kind: str  # "uv" or "pip"
    venv: str
    host_cache: str

    @property
    def python(self) -> str:
        return shlex.quote(f"{self.venv}/bin/python")

    def _pip(self, rest: str) -> str:
        """The venv's pip with `rest`, run as root isolated (remote.isolated): `-m` would put the
        working directory first on `sys.path`."""
        return remote.isolated(self.python, f"-m pip {rest}")

    def _uv(self, subcommand: str) -> str:
        return (f"{shlex.quote(uv_binary(self.host_cache))} pip {subcommand} --quiet --no-config "
                f"--python {self.python} ")

    def _uv_install(self) -> str:
        return f"{self._env()}{self._uv('install')}--link-mode copy "

    def _env(self) -> str:
        return f"UV_CACHE_DIR={shlex.quote(uv_cache(self.host_cache))} "

    def install_files(self, paths: list[str], repair: list[str] = ()) -> str:
        """Install wheel files; `repair`: distributions whose installed files are damaged at the
        same version.

        uv replaces another version by itself; `--reinstall` would also drop its unpacked-wheel
        cache (it implies `--refresh`), so only the repaired distributions are named. Their
        cache entries are dropped first (`uv cache clean NAME`): a repair re-extracts from the
        wheel, never from an unpacked copy that an edit may have reached (hard-linked by an older
        deploy). `--refresh-package` would do it but uv refuses it with `--offline`.
        """
        quoted = " ".join(shlex.quote(p) for p in paths)
        if self.kind == "uv":
            again = "".join(f"--reinstall-package {shlex.quote(name)} " for name in repair)
            clean = ""
            if repair:
                names = " ".join(shlex.quote(name) for name in repair)
                clean = (f"{self._env()}{shlex.quote(uv_binary(self.host_cache))} cache clean "
                         f"--quiet --no-config {names} && ")
            return f"{clean}{self._uv_install()}--no-deps --no-index --offline {again}{quoted}"
        return self._pip(f"install --quiet --no-index --no-deps --force-reinstall "
                         f"--disable-pip-version-check {quoted}")

    def install_from_index(self, index_url: str, requirements: str) -> str:
        url, reqs = shlex.quote(index_url), shlex.quote(requirements)
        if self.kind == "uv":
            return (f"{self._uv_install()}--no-deps --reinstall --require-hashes --index-url {url} "
                    f"-r {reqs}")
        return self._pip(f"install --quiet --no-deps --force-reinstall --require-hashes "
                         f"--disable-pip-version-check --index-url {url} -r {reqs}")

    def uninstall(self, names: list[str]) -> str:
        if self.kind == "uv":
            return f"{self._env()}{self._uv('uninstall')}" + " ".join(names)
        return self._pip("uninstall --quiet --yes " + " ".join(names))

    def new_venv(self, python: str, with_pip: bool | None = None) -> str:
        """Create the venv; uv's installs (and copies from a donor) need no pip inside it."""
        with_pip = self.kind == "pip" if with_pip is None else with_pip
        return remote.isolated(python, f"-m venv{'' if with_pip else ' --without-pip'} "
                                       f"{shlex.quote(self.venv)}")
