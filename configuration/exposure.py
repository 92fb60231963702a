"""Exposure and credentials in a service's data: every way it makes the service listen beyond
loopback (which then needs an API key, or `allow_unauthenticated: true`), and engine flags that
would carry a credential in the world-readable unit and argv. Read on the `args` as the engine's
parser resolves them (configuration/service_args.py).
"""

from __future__ import annotations

from typing import Any

from configuration import kinds
from configuration.errors import DataError
from configuration.secrets import Secret
from configuration.typed import Arg


def listens_beyond_loopback(bind: tuple[str, str, Any],
                            args: list[Arg]) -> list[tuple[str, str, Any, str]]:
    """(source, key path, value, why) for every way the data makes the service listen beyond
    loopback: `bind` (`--host`); any engine flag whose value names an address beyond loopback,
    whatever the flag is called (`kinds.addresses_in`: URLs, `host:port`, zmq's `*`, bare IP
    addresses, inside JSON values too); and setups that are reached from other machines by design
    (several nodes, prefill/decode disaggregation).

    An address the engine only connects out to counts too: a value does not say whether the engine
    binds it or connects to it (a zmq endpoint is bound by one side and connected by the other,
    `dist-init-addr` is bound by node 0 and reached by the rest), and a wrong guess of "connects"
    serves the model to the network, while a wrong guess of "listens" costs an API key, or
    `allow_unauthenticated: true` written once."""
    found = []
    if not kinds.is_loopback_host(bind[2]):
        found.append((*bind, "binding beyond loopback"))
    for arg in args:
        beyond = [a for a in kinds.addresses_in(arg.value) if a.beyond_loopback]
        if beyond:
            found.append((arg.source, arg.key_path, arg.value,
                          f"`--{arg.flag}` naming `{beyond[0].written}`, an address beyond "
                          "loopback that the engine may listen at or that other machines reach,"))
        elif arg.dest == "nnodes" and kinds.positive_whole_number(arg.value) not in (None, 1):
            found.append((arg.source, arg.key_path, arg.value,
                          "several nodes, which reach each other beyond loopback,"))
        elif arg.dest == "disaggregation_mode" and arg.value not in (None, False, "null"):
            found.append(
                (arg.source, arg.key_path, arg.value,
                 "prefill/decode disaggregation, which the other side reaches beyond loopback,"))
    return found


def resolved_beyond_loopback(resolved: list) -> str | None:
    """Why the engine's own resolved settings, its defaults included (`[setting, text]` as the
    service's preflight read them on the host), make the service listen at or be reached from beyond
    loopback, or None: the first setting naming such an address, or a listener configuration the
    host could not resolve. The data's own values were judged before connecting
    (`listens_beyond_loopback`); this is what the engine fills in (a KV-events publisher set with no
    endpoint binds every interface)."""
    for setting, text in resolved:
        if str(text).startswith("unresolved"):
            return (f"the engine's `{setting}` is set and where it listens could not be read "
                    f"on the host: {text}")
        beyond = [a for a in kinds.addresses_in(text) if a.beyond_loopback]
        if beyond:
            return (f"the engine resolves `{setting}` to `{text}`, naming "
                    f"`{beyond[0].written}`, an address beyond loopback the data does not name")
    return None


def exposure_needs_a_key(listening: list[tuple[str, str, Any, str]], api_key: Secret | None,
                         allow_open: bool) -> None:
    if listening and not api_key and not allow_open:
        source, key_path, value, why = listening[0]
        raise DataError(
            source, key_path, value,
            f"{why} without an API key lets anyone who reaches the port use the model: "
            "set `api_key_secret` (a secret on the control machine), or "
            "`allow_unauthenticated: true` to accept that",
        )


def no_credential(src: str, key_path: str, flag: str, dest: str | None) -> None:
    name = dest or flag.replace("-", "_")
    if kinds.CREDENTIAL_FLAG_WORDS.search(name):
        raise DataError(src, key_path, "<hidden>",
                        f"`--{flag}` carries a credential: " + kinds.SECRETS_FIX)


def no_credential_in_urls(src: str, key_path: str, flag: str, flag_value: Any) -> None:
    """A URL's `user:password@` in a flag's value (or in a JSON document it holds) is a credential
    in the world-readable unit and argv, whatever the flag is called; never shown, not even in the
    exposure rule's message."""
    if any(address.userinfo for address in kinds.addresses_in(flag_value)):
        raise DataError(src, key_path, "<hidden>",
                        f"`--{flag}` holds a URL with a user name or password (user:pass@): "
                        + kinds.SECRETS_FIX)
