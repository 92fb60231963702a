"""Kinds of network addresses (configuration/kinds.py re-exports them): the address a service binds,
a package index URL, one spelling per machine address, and every address named anywhere in a value
(exposure, configuration/exposure.py)."""

from __future__ import annotations

import ipaddress
import json
import re
import socket
from collections import deque
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import AfterValidator

from configuration.kinds_base import SECRETS_FIX, Text, refuse, with_fix


def _ip(text: str):
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


IP_FIX = "must be an IP address such as 127.0.0.1 or 0.0.0.0"


def _ip_address(text: str) -> str:
    if _ip(text) is None:
        raise refuse(IP_FIX)
    return text


IpAddress = Annotated[Text, AfterValidator(_ip_address), with_fix(IP_FIX)]


def is_loopback_host(host: str) -> bool:
    """Whether an address (an IP, `localhost`, `[::1]`) is on loopback; a DNS name may point
    anywhere."""
    host = host.strip("[]").lower().rstrip(".")
    if host in ("localhost", "localhost.localdomain", "ip6-localhost"):
        return True
    address = _ip(host)
    return address is not None and (address.is_loopback or (
        isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None
        and address.ipv4_mapped.is_loopback))


def canonical_address(host: str, port: Any = None) -> tuple[str, int]:
    """One spelling per machine address, as SSH reaches it: DNS names without case or a final dot,
    IP addresses in one form (IPv6 compressed, IPv4-mapped IPv6 and inet_aton's short forms as
    IPv4), loopback as one, and the SSH port (22 unless given)."""
    text = str(host).strip().strip("[]").lower().rstrip(".")
    address = _ip(text.split("%")[0])
    if address is None and re.fullmatch(r"(0x[0-9a-f]+|[0-9]+)(\.(0x[0-9a-f]+|[0-9]+)){0,3}", text):
        try:
            address = ipaddress.IPv4Address(socket.inet_aton(text))
        except OSError:
            address = None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    if address is not None:
        text = "loopback" if address.is_loopback else address.compressed
    elif text in ("localhost", "localhost.localdomain", "ip6-localhost"):
        text = "loopback"
    # pyinfra itself refuses an ssh_port that is not an int.
    return text, port if isinstance(port, int) and not isinstance(port, bool) else 22


URL_FIX = "must be a package index URL such as https://pypi.org/simple"
URL = re.compile(r"https?://(?P<authority>[^/?#\s]+)(?P<path>/[A-Za-z0-9._~%+=:,/-]*)?")
HOST_PORT = re.compile(r"(?P<host>[A-Za-z0-9.-]{1,253}|\[[0-9A-Fa-f:.]+\])(:[0-9]{1,5})?")


def _index_url(url: str) -> str:
    match = URL.fullmatch(url)
    if match is None:
        raise refuse(URL_FIX)
    if "@" in match["authority"] or "%40" in match["authority"].lower():
        raise refuse("holds a user name or password (user:pass@): " + SECRETS_FIX
                     + "; give the host's root an index it reaches without credentials in the URL "
                       "(e.g. root's own ~/.netrc on the host, put there by hand)")
    if HOST_PORT.fullmatch(match["authority"]) is None:
        raise refuse(URL_FIX)
    return url


IndexUrl = Annotated[Text, AfterValidator(_index_url), with_fix(URL_FIX)]


# Addresses named anywhere in a value --------------------------------------------------------------
#
# The engine takes addresses in many flags, under many names, and inside JSON values
# (`--kv-events-config '{"publisher": "zmq", "endpoint": "tcp://*:5557"}'`): an address is found by
# its shape, wherever it is written, rather than by a list of the flags known to take one.

# URL schemes that name no network address: a local socket, a path, the process itself.
LOCAL_SCHEMES = frozenset({"ipc", "inproc", "file", "unix"})
# A URL is found from its `://` (str.find), its scheme read backwards and its authority forwards:
# a regex that tried each position as a scheme's start rescanned the rest of the value from there,
# quadratic in its length (a 200,000-character flag value held a `--dry` run for minutes).
_SCHEME_CHARACTERS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+.-")
_LETTERS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz")
_AUTHORITY = re.compile(r"[^/?#\s,;'\"<>(){}|\\]*")
_WORD_SEPARATORS = re.compile(r"[\s,;'\"<>(){}|=/@\\]+")
_HOST_AND_PORT = re.compile(r"(?P<host>\[[^\]]*\]|[^:\[\]]*):(?P<port>[0-9]{1,5})")
# inet_aton's forms with at least one dot (`10.1`, `0x7f.1`); a bare `0.85` is a number, not an
# address, unless a port follows it.
_DOTTED_NUMBER = re.compile(r"(0x[0-9a-f]+|[0-9]+)(\.(0x[0-9a-f]+|[0-9]+)){1,3}")
# A DNS name holds a letter: `12:30` is no host and port.
_DNS_NAME = re.compile(r"(?=[A-Za-z0-9.-]*[A-Za-z])[A-Za-z0-9-]{1,63}(\.[A-Za-z0-9-]{1,63})*\.?")
# JSON held in a string, held in JSON, ...: deeper than this is read as text only.
MAX_JSON_DEPTH = 8


@dataclass(frozen=True)
class NamedAddress:
    """One address a value names: as written (`tcp://*:5557`), and its host (`*`, `10.0.0.1`,
    `node0`)."""

    written: str
    host: str
    userinfo: bool = False  # a URL with `user[:password]@` before its host

    @property
    def beyond_loopback(self) -> bool:
        # canonical_address reads every spelling of loopback (`127.1`, `::ffff:127.0.0.1`,
        # `localhost`) as one; `*`, an empty host before a port and a DNS name other than localhost
        # are beyond it.
        return canonical_address(self.host)[0] != "loopback"


def strings_in(value: Any) -> list[str]:
    """Every string of a value, in the order written: itself, the keys and items of a map or list; a
    string that holds a JSON document, its strings instead (to MAX_JSON_DEPTH), read as the engine's
    JSON parser reads them (`tcp:\\/\\/\\u002a:5557` is `tcp://*:5557`)."""
    found: list[str] = []
    pending: deque[tuple[Any, int]] = deque([(value, 0)])
    while pending:
        item, depth = pending.popleft()
        if isinstance(item, str):
            document = _json_in(item) if depth < MAX_JSON_DEPTH else None
            if document is None:
                found.append(item)
            else:
                pending.append((document[0], depth + 1))
        elif isinstance(item, dict):
            pending += [(part, depth) for pair in item.items() for part in pair]
        elif isinstance(item, list):
            pending += [(part, depth) for part in item]
    return found


def _json_in(text: str) -> tuple[Any] | None:
    """(the document) a string holds as JSON (a map, a list or a quoted string), or None: then it is
    read as text."""
    if text.lstrip()[:1] not in ("{", "[", '"'):
        return None
    try:
        return (json.loads(text),)
    except (ValueError, RecursionError):  # not JSON, or nested past what Python parses
        return None


def addresses_in(value: Any) -> list[NamedAddress]:
    """Every network address a value names, in any of its strings: URLs (`tcp://H:P`,
    `http://user@H/`, but not `ipc://`, `file://`), `H:P` and `[v6]:P`, zmq's `*` and `*:P`, and
    bare IP addresses (`0.0.0.0`, `::`)."""
    return [address for text in strings_in(value) for address in _addresses_in_text(text)]


ALL_INTERFACES = frozenset({"*", "", "0.0.0.0", "::"})


def local_ports_in(value: Any) -> list[int]:
    """The ports of this host that a value's addresses name: each `host:port` or URL whose host is
    loopback or every interface (`tcp://*:5557`, `127.0.0.1:8000`, `[::]:5555`); another machine's
    port is not this host's."""
    ports = []
    for address in addresses_in(value):
        if address.host not in ALL_INTERFACES and not is_loopback_host(address.host):
            continue
        where = address.written.split("://", 1)[-1].rpartition("@")[2]
        split = _HOST_AND_PORT.fullmatch(where)
        if split:
            ports.append(int(split["port"]))
    return ports


def _urls_in(text: str) -> list[tuple[int, int, str, str]]:
    """(start, end, scheme, authority) of each `scheme://authority` in `text`, left to right: the
    scheme is the longest run of scheme characters before `://` that starts with a letter."""
    urls, at, done = [], 0, 0
    while (mark := text.find("://", at)) != -1:
        start = mark
        while start > done and text[start - 1] in _SCHEME_CHARACTERS:
            start -= 1
        while start < mark and text[start] not in _LETTERS:
            start += 1
        authority = _AUTHORITY.match(text, mark + 3)[0]
        if start < mark:
            end = mark + 3 + len(authority)
            urls.append((start, end, text[start:mark], authority))
            done = end
        at = mark + 3
    return urls


def _addresses_in_text(text: str) -> list[NamedAddress]:
    found, rest, last = [], [], 0
    for start, end, scheme, authority in _urls_in(text):
        rest += [text[last:start], " "]
        last = end
        if scheme.lower() in LOCAL_SCHEMES:
            continue
        userinfo = "@" in authority
        host = _url_host(authority.rpartition("@")[2])
        if host is not None or userinfo:
            found.append(NamedAddress(text[start:end], host or "", userinfo))
    rest.append(text[last:])
    for word in _WORD_SEPARATORS.split("".join(rest)):
        host = _word_host(word)
        if host is not None:
            found.append(NamedAddress(word, host))
    return found


def _url_host(host_port: str) -> str | None:
    """The host of a URL's `host[:port]`: a name, an address, `*`; an empty host before a port binds
    every interface (`tcp://:5557`, as Python's `bind(("", port))`); None where the URL names no
    host (`http:///x`)."""
    if host_port == "":
        return None
    split = _HOST_AND_PORT.fullmatch(host_port)
    host = split["host"] if split else host_port
    host = host.strip("[]")
    return host if host else ("*" if split else None)


def _word_host(word: str) -> str | None:
    """The host a word outside a URL names: `*`, `*:P`, `H:P`, `[v6]:P`, a bare IP address; None for
    any other word (a bare name or number could be anything: `triton`, `0.85`)."""
    if word == "*":
        return "*"
    split = _HOST_AND_PORT.fullmatch(word)
    if split:
        host = split["host"]
        if (host == "*"
                or (host.startswith("[") and _ip(host.strip("[]").split("%")[0]) is not None)):
            return host.strip("[]")
        if (_ip(host.split("%")[0]) is not None or _DOTTED_NUMBER.fullmatch(host.lower())
                or _DNS_NAME.fullmatch(host)):
            return host
        return None
    bare = word[1:-1] if word.startswith("[") and word.endswith("]") else word
    return bare if _ip(bare.split("%")[0]) is not None else None
