"""Where a host's stack and models come from, as only the inventory can check it: a donor
(`stack_sources`) is another host of the inventory, or, with a `path`, a venv on one that is not
this host's own; a model source (`model_sources`) is another host of the inventory or a directory on
the control machine that exists and is no system directory. The shapes are the schema's
(configuration/schema.py: `StackSources`, `ModelSources`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from configuration import kinds, schema
from configuration.refusals import require


def stack_sources(src: str, entries: list, wheelhouse: str, hosts: list[str], this_host: str,
                  venv_path: str) -> tuple[tuple[str, ...], ...]:
    """`stack_sources` as ((kind, location[, path]), ...): `wheelhouse` -> the wheelhouse dir,
    `{index: URL}` -> the URL, `{donor: HOST[, path: DIR]}`."""
    out = []
    for i, entry in enumerate(entries):
        if entry == "wheelhouse":
            out.append(("wheelhouse", wheelhouse))
        elif isinstance(entry, schema.IndexSource):
            out.append(("index", entry.index))
        else:
            # A donor is another host's live venv, or, with `path`, any venv on an inventory host,
            # this one included (a venv built by hand beside the one the deploy builds).
            donor, path = entry.donor, entry.path
            if path is None:
                require(donor in hosts and donor != this_host, src, f"stack_sources[{i}].donor",
                        donor, "must name another host of the inventory "
                               f"({', '.join(h for h in hosts if h != this_host) or 'none'}) whose "
                               "live venv holds the stack's pins, or add `path:` to copy from a "
                               "venv at that path")
                out.append(("donor", donor))
            else:
                require(donor in hosts, src, f"stack_sources[{i}].donor", donor,
                        f"must name a host of the inventory ({', '.join(hosts)}), this one "
                        "included, that has a venv at `path`")
                require(donor != this_host or path.rstrip("/") != venv_path.rstrip("/"), src,
                        f"stack_sources[{i}].path", path,
                        "is this host's own venv_path: name the other venv to copy from")
                out.append(("donor", donor, path))
    return tuple(out)


def check_model_sources(src: str, sources: dict[str, str], host) -> None:
    for model_name, source in sources.items():
        key_path = f"model_sources.{model_name}"
        is_path = "/" in source or source.startswith(".")
        if is_path:
            _control_dir(src, key_path, source)
        require(
            is_path or host.inventory.get_host(source, None) is not None,
            src, key_path, source,
            f"must name a host of the inventory ({', '.join(h.name for h in host.inventory)}) "
            "or the model's directory on the control machine (a path that exists here)",
        )
        require(source != host.name, src, key_path,
                source, "names this host itself: name the host (or control-machine directory) that "
                        "holds the model")


def _control_dir(src: str, path: str, value: Any) -> Path:
    """A directory on the control machine the deploy reads from (streams a model out of)."""
    resolved = Path(value).resolve()
    for denied in kinds.DENIED_PATHS:
        require(not kinds.inside(denied, str(resolved)), src, path, value,
                f"resolves to {resolved}, which is or contains {denied}: name the model's own "
                "directory")
    require(resolved.is_dir(), src, path, value,
            "must be an existing directory on the control machine")
    return resolved
