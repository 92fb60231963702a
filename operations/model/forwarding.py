"""Holders forward while they receive: a host getting a model serves each file onward as soon as it
is whole and checked, so four hosts cost close to one.

Fan-out (operations/transport/fanout.py) lets a host serve the next ones once it holds the bytes
whole. Where the control machine's uplink is slow and the links between hosts fast, the next hosts
then wait a whole transfer for the first, and each round after it is another transfer. Here a
receiver that cannot get an idle holder follows one that is receiving (`fanout.choose`, `follow`):
the receivers form a chain, and each reads, as they come, the files the one before it has checked.

What keeps every trust property of a host-to-host transfer (docs/threat-model.md):

- A forwarder serves only verified bytes. Its partial copy (`.NAME.partial`, root's) holds a file
  under its own name only once root's unpacker wrote it whole and its sha256 matched the origin's
  digest (operations/transport/on_host/untar_as_root.py `--listing`), or once RESUME checked it
  against that digest (operations/model/transfer.py): a forwarder becomes one (`Swarm.receiving`)
  only after that check of what an earlier run left. `ready` takes from its listing only names the
  origin's digests list, at the origin's size; the unpacker's temporary names are never among them.
- The follower reads on one one-time key (operations/transport/peer_keys.py) for exactly the
  model's files under that copy (its forced command sends nothing else, and only names that are
  there: whole and checked), asks only for files `ready` found there, and the key is taken back
  when it stops following (another key once the copy is renamed into place).
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

from operations import remote
from operations.model import model_digests
from operations.run import remote_call
from operations.transport import openssh, peer_keys, streaming

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
    access = _Access(forwarder_host, host, sorted(want), log)
    try:
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
                    moved = _read(access.under(root), host, partial, names, digests, streams)
            finally:
                swarm.done_reading(forwarder)
            if moved is None:
                swarm.changed(POLL_S)
                continue
            if not moved.ok:
                return False, moved.why
            have |= set(names)
            log(f"{len(names)} file(s), {moved.sent / 2**20:.0f} MiB from {forwarder} "
                f"({'its copy in place' if state == 'held' else 'while it receives'}) in "
                f"{moved.elapsed_s:.1f} s; {len(have)} of {len(want)}")
        return True, ""
    finally:
        access.close()


class _Access:
    """The follower's one-time key to its forwarder's copy (operations/transport/peer_keys.py), for
    exactly the model's files under that copy: made at the first read, made again once the copy is
    renamed into place, taken back when the following ends. The forced command sends only names on
    that list that are there, and a file has its name there only once whole and checked (the
    unpacker's temporary names are never on it)."""

    def __init__(self, source, receiver, names: list[str], log):
        self.source, self.receiver, self.names, self.log = source, receiver, names, log
        self.root, self.grant = None, None

    def under(self, root: str):
        """The grant for `root` (None: the receiver cannot read from the source directly)."""
        if root != self.root:
            self.close()
            self.root = root
            self.grant = peer_keys.granted(self.source, self.receiver, root, self.names, self.log)
        return self.grant

    def close(self) -> None:
        if self.grant is not None:
            self.grant.close()
        self.grant = None


def _read(grant, host, partial: str, names: list[str], digests: model_digests.Digests,
          streams: int) -> streaming.Moved:
    """`names` from the grant's copy into `partial` on `host`, every file checked against the
    origin's digests as it lands."""
    if grant is None:
        return streaming.Moved(False, 0, 0.0, [f"{host.name} cannot read from its forwarder "
                                               "directly"])
    sizes = {name: model_digests.sent_size(digests[name]) for name in names}
    jobs = [grant.job(f"{len(batch)} file(s) from {grant.source.name}",
                      sum(sizes[n] for n in batch), batch,
                      streaming.unpack_command(partial, listing={n: digests[n] for n in batch}))
            for batch in streaming.batches(sizes, streams)]
    return streaming.transfer(jobs, streams)
