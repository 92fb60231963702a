"""One strict YAML loader for every file the deploy reads (group data, stacks, patch-set manifests,
secrets).

PyYAML's `safe_load` implements YAML 1.1, which reads some plain scalars in ways an operator
does not expect, and keeps the last of two equal keys without a word. Here those are refused,
with the file, the line and the fix, instead of being guessed at:

- a key given twice in one mapping (the earlier value would be dropped silently);
- `yes/no/on/off/y/n` as booleans (YAML 1.1): write `true`/`false`, or quote the word;
- integers with a leading zero (`030001` is octal 12289 in YAML 1.1), `0b`/`0o` forms,
  `_` separators (`1_000`) and base-60 numbers (`1:30` is 90): write a plain decimal
  (`0x..` hex stays allowed), or quote it;
- dates and times (`2026-01-01` becomes a date object): quote them;
- a byte sequence that is not UTF-8 (reported with its offset, not as a traceback).

`true/false/null`, decimal and hex integers, and floats (`0.9`, `1e-3`) load as usual.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from configuration.errors import DataError

_BOOL_OK = {"true", "false", "True", "False", "TRUE", "FALSE"}
_INT_OK = re.compile(r"\A([-+]?(0|[1-9][0-9]*)|0x[0-9a-fA-F]+)\Z")
_FLOAT_OK = re.compile(
    r"\A([-+]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][-+]?[0-9]+)?|[-+]?\.(inf|Inf|INF)|\.(nan|NaN|NAN))\Z")


class _Refused(Exception):
    def __init__(self, node: yaml.Node, value: Any, fix: str):
        super().__init__(fix)
        self.node, self.value, self.fix = node, value, fix


# No file of the deploy comes near these: more is a mistake or an attack (a "billion laughs" of
# aliases, each expanding the one before, is a few lines that would take every later step hours and
# all memory).
MAX_NODES = 100_000
MAX_DIGITS = 64


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    return []


def _check_expansion(root: yaml.Node) -> None:
    """Count the nodes the document holds once its aliases are expanded (each alias counts what it
    names, again), without expanding them; refuse a document past MAX_NODES, and an alias inside the
    node it names."""
    sizes: dict[int, int] = {}
    started: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, finished = stack.pop()
        if finished:
            started.discard(id(node))
            sizes[id(node)] = 1 + sum(sizes[id(child)] for child in _children(node))
            if sizes[id(node)] > MAX_NODES:
                raise _Refused(node, "<not shown>", f"expands to more than {MAX_NODES} values "
                                                    "(aliases repeat what they name): write the "
                                                    "values out, or use fewer aliases of aliases")
            continue
        if id(node) in sizes:
            continue
        started.add(id(node))
        stack.append((node, True))
        for child in _children(node):
            if id(child) in started:
                raise _Refused(child, "<not shown>",
                               "an alias inside the node it names repeats without end: remove it")
            if id(child) not in sizes:
                stack.append((child, False))


class _Strict:
    """What a strict loader refuses: duplicate keys, YAML 1.1's surprising plain scalars, documents
    that expand past any size the deploy reads, and numbers too long to convert."""

    def construct_document(self, node):
        _check_expansion(node)
        return super().construct_document(node)

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen: dict[Any, int] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    hash(key)
                except TypeError:
                    raise _Refused(key_node, key, "a mapping key must be a plain value") from None
                if key in seen:
                    raise _Refused(key_node, key, "this key is given twice in one mapping (first "
                                                  f"on line {seen[key] + 1}); YAML would silently "
                                                  "keep only the last: keep one")
                seen[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep=deep)

    def construct_yaml_bool(self, node):
        if node.value not in _BOOL_OK:
            raise _Refused(node, node.value, "YAML 1.1 reads this word as a boolean: write true or "
                                             "false, or quote it for the string")
        return super().construct_yaml_bool(node)

    def construct_yaml_int(self, node):
        if len(node.value) > MAX_DIGITS:
            # Python refuses int() of more than 4300 digits with a ValueError; no value here needs
            # more than 18.
            raise _Refused(node, f"<a number of {len(node.value)} digits>",
                           "is far too long a number: no value here needs more than 18 digits; "
                           "quote it if it is a string")
        if not _INT_OK.match(node.value):
            raise _Refused(node, node.value,
                           "YAML 1.1 reads this as a number in another base (a leading 0 is octal, "
                           "':' is base 60, '_' is dropped): write a plain decimal number, or "
                           "quote it for the string")
        return super().construct_yaml_int(node)

    def construct_yaml_float(self, node):
        if not _FLOAT_OK.match(node.value):
            raise _Refused(node, node.value, "YAML 1.1 reads this as a base-60 or '_'-separated "
                                             "number: write a plain decimal, or quote it")
        return super().construct_yaml_float(node)

    def construct_yaml_timestamp(self, node, values=None):
        raise _Refused(node, node.value, "YAML reads this as a date/time, not a string: quote it")


class StrictLoader(_Strict, yaml.SafeLoader):
    """PyYAML's own parser: its messages name what is wrong in a file that is not valid YAML."""


class _FastStrictLoader(_Strict, getattr(yaml, "CSafeLoader", yaml.SafeLoader)):
    """libyaml's parser where PyYAML has it, several times faster: a run validates every file of the
    inventory. A file it cannot parse is parsed again by StrictLoader, so the message is the same
    either way."""


for _loader in (StrictLoader, _FastStrictLoader):
    _loader.add_constructor("tag:yaml.org,2002:bool", _Strict.construct_yaml_bool)
    _loader.add_constructor("tag:yaml.org,2002:int", _Strict.construct_yaml_int)
    _loader.add_constructor("tag:yaml.org,2002:float", _Strict.construct_yaml_float)
    _loader.add_constructor("tag:yaml.org,2002:timestamp", _Strict.construct_yaml_timestamp)
    _loader.add_constructor("tag:yaml.org,2002:map", yaml.SafeLoader.construct_yaml_map)


def _where(mark) -> str:
    return f"line {mark.line + 1}, column {mark.column + 1}" if mark else "(file)"


def loads(text: str, shown: str, secret: bool = False) -> Any:
    """Parse `text` (from the file shown as `shown`); `secret`: never echo values in messages."""
    try:
        try:
            return yaml.load(text, Loader=_FastStrictLoader)  # noqa: S506 - a SafeLoader
        except yaml.YAMLError:
            # a SafeLoader; raises with PyYAML's message
            return yaml.load(text, Loader=StrictLoader)  # noqa: S506
    except _Refused as exc:
        raise DataError(shown, _where(exc.node.start_mark), "<not shown>" if secret else exc.value,
                        exc.fix) from None
    except RecursionError:
        raise DataError(shown, "(file)", "<not shown>",
                        "nests maps and lists too deeply to read: flatten it") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        problem = ("<not shown>" if secret
                   else (getattr(exc, "problem", None) or str(exc).splitlines()[0]))
        raise DataError(shown, _where(mark), problem,
                        "not valid YAML: fix the syntax at that position") from None


def load_file(path: Path, shown: str | None = None, secret: bool = False) -> Any:
    """Read and parse one YAML file; every way it can be unreadable is a `DataError`, not a
    traceback."""
    shown = shown or str(path)
    try:
        raw = path.read_bytes()
    except IsADirectoryError:
        raise DataError(shown, "(file)", str(path), "is a directory: name a YAML file") from None
    except OSError as exc:
        raise DataError(shown, "(file)", str(path), f"cannot be read ({exc.strerror}): fix the "
                                                    "path or its permissions") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise DataError(shown, f"line {line}, byte {exc.start}",
                        "<not shown>" if secret else raw[exc.start: exc.start + 1],
                        "not UTF-8: save the file as UTF-8 (a Latin-1 or binary byte got "
                        "in)") from None
    return loads(text, shown, secret)
