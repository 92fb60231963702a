"""Holders forward while they receive: a host getting a model serves each file onward as soon as it
is whole and checked, so four hosts cost close to one.

Fan-out (operations/fanout.py) lets a host serve the next ones once it holds the bytes whole. Where
the control machine's uplink is slow and the links between hosts fast, the next hosts then wait a
whole transfer for the first, and each round after it is another transfer. Here a receiver that
cannot get an idle holder follows one that is receiving (`fanout.choose`, `follow`): the receivers
form a chain, and each reads, as they come, the files the one before it has checked.

What keeps every trust property of a host-to-host transfer (docs/threat-model.md):

- A forwarder serves only verified bytes. Its partial copy (`.NAME.partial`, root's) holds a file
  under its own name only once root's unpacker wrote it whole and its sha256 matched the origin's
  digest (operations/remote/untar_as_root.py `--listing`), or once RESUME checked it against that
  digest (operations/transfer.py): a forwarder becomes one (`Swarm.receiving`) only after that check
  of what an earlier run left. `ready` takes from its listing only names the origin's digests list,
  at the origin's size; the unpacker's temporary names are never among them.
- Each read is one transfer on a one-time key (operations/peer_keys.py) for exactly the names it
  reads under that copy, its forced command sending nothing else; the key is taken back when the
  read ends.
- The follower still checks every file against the origin's digests (its own unpacker with the
  listing, then the listing check before the rename), as from any holder.
- A forwarder renames its copy into place only once no read of it goes on (`Swarm.closing`); a
  follower then reads the rest from the copy in place.

A read that fails, a forwarder that gives up, or a pair of hosts that cannot reach each other ends
the following: the follower's own copy keeps what came whole and right, and the caller gets the
rest from the origin (transfer.py's resume).
"""

from __future__ import annotations

import json
import shlex
from typing import Callable

from operations import model_digests, openssh, peer_keys, remote, remote_call, streaming

POLL_S = 1.0  # how often a follower looks again at what its forwarder has checked


def ready(listing: dict | None, digests: model_digests.Digests, have: set[str]) -> list[str]:
    """The files a follower may read from its forwarder's copy now: named in the origin's digests,
    there at the origin's size (so written whole and checked: see the module's text), and not had
    yet."""
    if not listing:
        return []
    sizes = model_digests.sizes(digests)
    return sorted(name for name, size in listing.items()
                  if name in sizes and name not in have and size == sizes[name])


def _listing(host, root: str) -> dict | None:
    ok, output = remote_call.run(host, remote.command("model_listing", shlex.quote(root)),
                                 f"listing {root}", 60)
    if not ok:
        return None
    try:
        found = json.loads(output.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError, AttributeError):
        return None
    return found if isinstance(found, dict) else None


def follow(swarm, forwarder: str, forwarder_host, host, partial: str,
           digests: model_digests.Digests, have: set[str],
           log: Callable[[str], None]) -> tuple[bool, str]:
    """Read into `partial` (prepared, holding `have` whole and right) every file of `digests` from
    `forwarder`'s copy as it gets and checks them. (True, "") once every file is in, else (False,
    why): the caller gets the rest from the origin."""
    have = set(have)
    want = set(model_digests.sizes(digests))  # the regular files (a link comes with the rest)
    streams = openssh.streams(host)
    reads = 0
    while have < want:
        state, _ = swarm.forwarder(forwarder)
        if state == "gone":
            return False, f"{forwarder} stopped getting it"
        root = swarm.start_reading(forwarder)
        if root is None:  # renaming its copy into place: the copy in place next
            swarm.changed(POLL_S)
            continue
        try:
            names = ready(_listing(forwarder_host, root), digests, have)
            if not names:
                if state == "held":
                    return False, f"{forwarder}'s copy lacks {len(want - have)} file(s)"
                moved = None
            else:
                moved = _read(forwarder_host, host, root, partial, names, digests, streams, log)
        finally:
            swarm.done_reading(forwarder)
        if moved is None:
            swarm.changed(POLL_S)
            continue
        if not moved.ok:
            return False, moved.why
        reads += 1
        have |= set(names)
        log(f"{len(names)} file(s), {moved.sent / 2**20:.0f} MiB from {forwarder} "
            f"({'its copy in place' if state == 'held' else 'while it receives'}) in "
            f"{moved.elapsed_s:.1f} s; {len(have)} of {len(want)}")
    return True, ""


def _read(source, host, root: str, partial: str, names: list[str],
          digests: model_digests.Digests, streams: int, log) -> streaming.Moved:
    """`names` from `root` on `source` into `partial` on `host`: one transfer on a one-time key for
    exactly these names, every file checked against the origin's digests as it lands."""
    grant = peer_keys.granted(source, host, root, names, log)
    if grant is None:
        return streaming.Moved(False, 0, 0.0,
                               [f"{host.name} cannot read from {source.name} directly"])
    sizes = {name: model_digests.sent_size(digests[name]) for name in names}
    jobs = [grant.job(f"{len(batch)} file(s) from {source.name}", sum(sizes[n] for n in batch),
                      batch, streaming.unpack_command(
                          partial, listing={n: digests[n] for n in batch}))
            for batch in streaming.batches(sizes, streams)]
    try:
        return streaming.transfer(jobs, streams)
    finally:
        grant.close()
