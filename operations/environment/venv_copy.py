"""Installed files copied into a generation instead of installed: the live generation cloned as the
base of the next one (`clone_command`), and a donor's installed distributions copied in, from a venv
on the same host (`copy_within_host`) or streamed from another host (`stream_from_donor`); either
way the copied console scripts are pointed at the new generation (`_FIX_PATHS`).

Separate from the decision (venv_decide.py), which only names the clone command and asks a donor's
read, and from the install (venv.py), because this is transport: new inodes on the host, bytes
between hosts (operations/transport), and the rewrite of copied scripts' paths.
"""

from __future__ import annotations

import shlex

from pyinfra import host, logger

from operations import remote
from operations.environment.venv_read import Generation
from operations.run import remote_call
from operations.transport import peer_keys, stream_ends, streaming

_FIX_PATHS = r"""
import os, sys
where, venv, old = sys.argv[1], sys.argv[2], sys.argv[3:]
bindir = os.path.join(where, "bin")
for name in os.listdir(bindir):
    path = os.path.join(bindir, name)
    if os.path.islink(path) or not os.path.isfile(path) or os.path.getsize(path) > 1 << 20:
        continue
    with open(path, "rb") as handle:
        data = handle.read()
    new = data
    for prefix in old:
        new = new.replace(prefix.encode() + b"/", venv.encode() + b"/").replace(
            b"'" + prefix.encode() + b"'", b"'" + venv.encode() + b"'")
    if new != data:  # a new file: the old one may be a hard link shared with the live generation
        with open(path + ".tmp", "wb") as handle:
            handle.write(new)
        os.chmod(path + ".tmp", os.stat(path).st_mode & 0o7777)
        os.rename(path + ".tmp", path)
"""


def clone_command(source: str, gen: Generation, old_prefixes: list[str]) -> str:
    """A copy of `source` as the new generation; scripts' paths pointed at it; renamed in when
    whole.

    `--reflink=auto` shares extents only where the filesystem copies on write (btrfs, XFS): an
    edit there writes new blocks. Never hard links: a hand edit in one generation would reach
    the other, and a repair would find nothing to compare against.
    """
    # One partial directory per attempt: the copy of a deploy killed mid-build can go on running on
    # the host (it takes seconds for a real venv), and would refill a shared name while the next run
    # empties it. Whichever attempt completes first is renamed in; a later one finds the generation
    # there and leaves.
    partial = '"$partial"'
    prefixes = " ".join(shlex.quote(p) for p in old_prefixes)
    target = shlex.quote(gen.path)
    fix_paths = remote.isolated("python3",
                                f"-c {shlex.quote(_FIX_PATHS)} {partial} {target} {prefixes}")
    return (
        f"mkdir -p {shlex.quote(gen.live + '.generations')} && "
        f"{{ rm -rf {shlex.quote(gen.path)}.partial-* 2>/dev/null; true; }} && "
        f"partial=$(mktemp -d {target}.partial-XXXXXX) && rmdir \"$partial\" && "
        f"cp -a --reflink=auto {shlex.quote(source)} {partial} && "
        f"{fix_paths} && "
        f"sed -i '/^command *=/d' {partial}/pyvenv.cfg && "
        f"{{ mv -T {partial} {target} 2>/dev/null "
        f"|| {{ test -d {target} && rm -rf {partial}; }}; }}"
    )


def donor_host(name: str):
    """The donor's inventory host, connected (where it answers) to copy from or to read."""
    donor = host.inventory.get_host(name)
    if not donor.connected:
        donor.connect(reason=f"to copy installed distributions to {host.name}",
                      raise_exceptions=False)
    return donor



def copy_within_host(donor_venv: str, gen: Generation, specs: list[str]) -> str:
    """Copy the donor venv's files of `specs` into the generation on the same host, then point its
    scripts at it.

    `cp -a` (not a pipe, so any failure is the command's status) makes new inodes: the
    generation shares no file with the donor, whose owner may edit or delete it.
    """
    args = " ".join(shlex.quote(a) for a in (donor_venv, *specs))
    prefixes = f"{shlex.quote(donor_venv)} \"$(readlink -f {shlex.quote(donor_venv)})\""
    fix_paths = remote.isolated("python3", f"-c {shlex.quote(_FIX_PATHS)} {shlex.quote(gen.path)} "
                                           f"{shlex.quote(gen.path)} {prefixes}")
    return (
        f"list=$(mktemp) && {remote.heredoc('python3', args, remote.script('donor_files'))}"
        f" > \"$list\" && "
        f"(cd {shlex.quote(donor_venv)}/ && xargs -d '\\n' -a \"$list\" cp -a --parents "
        f"-t {shlex.quote(gen.path)}) && rm -f \"$list\" && {fix_paths}"
    )


def stream_from_donor(state, host, donor_name: str, donor_live: str, gen: Generation,
                       specs: list[str]) -> bool:
    """tar on the donor -> root's unpacker into the generation (no owner, setuid bit, device or link
    out of the tree of the donor's: streaming.unpack_command), relayed here between two OpenSSH
    processes (each over pyinfra's connection where OpenSSH does not reach that host); nothing lands
    on disk twice."""
    donor = donor_host(donor_name)
    if not donor.connected:
        host.log_styled(f"donor {donor_name} is unreachable", fg="red", log_func=logger.error)
        return False
    args = " ".join(shlex.quote(a) for a in (donor_live, *specs))

    def listing(then: str = "") -> str:  # the donor's file list, `then` piped on
        return remote.heredoc("python3", args, remote.script("donor_files")) + then

    # Host to host where this host reaches the donor: a one-time key for exactly the distributions'
    # files, listed first.
    listed, output = remote_call.run(donor, listing(), f"listing donor {donor_name}'s files", 300)
    names = [line for line in output.stdout.splitlines() if line] if listed else []
    direct = peer_keys.granted(donor, host, donor_live, names, host.log) if names else None
    if direct:
        job = direct.job(f"from donor {donor_name}", 0, names, streaming.unpack_command(gen.path))
    else:
        tar = f"tar -C {shlex.quote(donor_live)}/ -cf - -T -"
        job = streaming.Job(f"from donor {donor_name}", 0,
                            stream_ends.sending_end(donor, listing(f" | {tar}"), log=host.log),
                            # as root's files
                            stream_ends.receiving_end(host, streaming.unpack_command(gen.path),
                                                      host.log))
    try:
        moved = streaming.transfer([job], 1)
    finally:
        if direct:
            direct.close()
    if not moved.ok:
        host.log_styled(f"copy from donor {donor_name} failed: {moved.why}", fg="red",
                        log_func=logger.error)
        return False
    # Console scripts name the donor's interpreter; point them at this generation's.
    resolved = remote_call.run(donor, f"readlink -f {shlex.quote(donor_live)}",
                               f"resolving donor {donor_name}'s venv", 60)[1].stdout.strip()
    prefixes = " ".join(shlex.quote(p) for p in sorted({resolved, donor_live}) if p)
    ok, _ = remote_call.run(
        host, remote.isolated("python3", f"-c {shlex.quote(_FIX_PATHS)} {shlex.quote(gen.path)} "
                                         f"{shlex.quote(gen.path)} {prefixes}"),
        "pointing the copied scripts at this generation", 300)
    via = (f"OpenSSH, {host.name} reading from {donor_name} directly" if direct
           else streaming.carried_by(donor, host))
    host.log(f"copied {len(specs)} distribution(s) from {donor_name}: {moved.sent / 2**20:.0f} MiB "
             f"in {moved.elapsed_s:.1f} s over {via}")
    return ok
