"""The control machine's link to the lab's hosts at a stated rate, host-to-host links left fast.

A deployment that fan-out is for has a control machine behind a slow uplink and GPU hosts on a fast
network between them. On the lab every link is as fast as any other: each host's veth pair ends on
this machine, and host-to-host traffic is forwarded by this machine's kernel (tests/lab/labutil.py
`routed`). This caps only what this machine itself sends to, or receives from, the hosts:

- two `ifb` devices, LINK_UP (this machine to the hosts) and LINK_DOWN (the hosts to this machine),
  each an HTB with one class at the rate: one bucket per direction, shared by every host, as one
  uplink is;
- on each host's veth (this side), a `clsact` qdisc whose filters redirect to them the packets whose
  source (egress) or destination (ingress) is one of this machine's lab addresses (the control side
  of a host's /30). A packet forwarded from one host to another carries the hosts' own addresses and
  is never redirected.

`python3 lab/lab.py cap --rate 40mibps` / `uncap`; in Python `with capped("40mibps", links): ...`
(removed when the block ends, however it ends: SIGTERM included). Rates in tc's units (`40mibps` is
40 MiB/s, `320mbit` 320 Mbit/s), or `40MiB/s`. Only the veths of hosts running when the cap is set
are capped (a host rebooted later gets a new veth, uncapped). Python 3.11 stdlib; root.
"""

from __future__ import annotations

import contextlib
import re
import signal
import subprocess

LINK_UP = "lab-cap-up"  # this machine -> the hosts
LINK_DOWN = "lab-cap-down"  # the hosts -> this machine
# the filters' priority on a veth's clsact: ours alone are removed with it
PRIO = 4242
_TC_RATE = re.compile(r"(\d+(?:\.\d+)?)((?:[kmgt]i?)?(?:bit|bps))")
_HUMAN = re.compile(r"(\d+(?:\.\d+)?)\s*([KMGT]i?)B/s")


class CapError(Exception):
    pass


def tc_rate(rate: str) -> str:
    """`rate` in tc's words: tc's own (`40mibps`, `320mbit`) as it is, `40MiB/s` as `40mibps`."""
    text = rate.strip()
    if _TC_RATE.fullmatch(text.lower()):
        return text.lower()
    human = _HUMAN.fullmatch(text)
    if human:
        return f"{human.group(1)}{human.group(2).lower()}bps"
    raise CapError(f"rate {rate!r}: say it in tc's units (40mibps is 40 MiB/s, 320mbit is 320 Mbit/s) or "
                   "as 40MiB/s")


def apply_commands(links: dict[str, str], rate: str) -> list[list[str]]:
    """The commands that cap: `links` is {veth (this side): this machine's address on it}."""
    rate = tc_rate(rate)
    mine = sorted(set(links.values()))
    out = []
    for ifb in (LINK_UP, LINK_DOWN):
        out += [["ip", "link", "add", ifb, "type", "ifb"], ["ip", "link", "set", ifb, "up"],
                ["tc", "qdisc", "replace", "dev", ifb, "root", "handle", "1:", "htb", "default", "10"],
                ["tc", "class", "replace", "dev", ifb, "parent", "1:", "classid", "1:10", "htb",
                 "rate", rate, "ceil", rate]]
    for veth in sorted(links):
        out.append(["tc", "qdisc", "replace", "dev", veth, "clsact"])
        for address in mine:
            for way, field, ifb in (("egress", "src", LINK_UP), ("ingress", "dst", LINK_DOWN)):
                out.append(["tc", "filter", "add", "dev", veth, way, "prio", str(PRIO), "protocol", "ip",
                            "u32", "match", "ip", field, f"{address}/32",
                            "action", "mirred", "egress", "redirect", "dev", ifb])
    return out


def remove_commands(veths: list[str]) -> list[list[str]]:
    """The commands that take the cap away (each may find nothing to remove)."""
    return ([["tc", "qdisc", "del", "dev", veth, "clsact"] for veth in sorted(veths)]
            + [["ip", "link", "del", ifb] for ifb in (LINK_UP, LINK_DOWN)])


def _run(argv: list[str], check: bool) -> None:
    proc = subprocess.run(argv, capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise CapError(f"{' '.join(argv)}: {proc.stderr.strip() or proc.returncode}")


def capped_now() -> bool:
    return subprocess.run(["ip", "link", "show", LINK_UP], capture_output=True).returncode == 0


def cap(links: dict[str, str], rate: str) -> None:
    """Cap (any cap set before is taken away first); all or nothing."""
    if not links:
        raise CapError("no running lab host to cap the link to")
    uncap(list(links))
    try:
        for argv in apply_commands(links, rate):
            _run(argv, check=True)
    except BaseException:
        uncap(list(links))
        raise


def uncap(veths: list[str]) -> None:
    for argv in remove_commands(veths):
        _run(argv, check=False)


@contextlib.contextmanager
def capped(rate: str, links: dict[str, str]):
    """The cap while the block runs, removed when it ends (an exception, Ctrl-C or SIGTERM too)."""
    previous = None
    with contextlib.suppress(ValueError):  # not the main thread: no handler, the block's end still uncaps

        def terminated(signum, frame):
            raise SystemExit(128 + signum)

        previous = signal.signal(signal.SIGTERM, terminated)
    try:
        cap(links, rate)
        yield
    finally:
        uncap(list(links))
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
