# Run with a venv's Python that has sglang installed: print, as one JSON object, every option
# string of the parser `prepare_server_args` builds (the same construction: a fresh
# ArgumentParser, ServerArgs.add_cli_args), with the action's dest, whether it takes a value,
# its choices, and the speculative algorithms the engine registers. tools/engine_flags.py
# turns this into files/engine_flags/<dist>-<version>.json (the control machine's copy).
import argparse
import json
from importlib import metadata

from sglang.srt.server_args import ServerArgs

parser = argparse.ArgumentParser(prog="sglang serve")
ServerArgs.add_cli_args(parser)
actions = []
for action in parser._actions:
    if not action.option_strings or action.dest == "help":
        continue
    actions.append({
        "options": sorted(action.option_strings),
        "dest": action.dest,
        "value": action.nargs != 0,
        "choices": sorted(str(c) for c in action.choices) if action.choices is not None else None,
    })
try:
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    algorithms = sorted(m.name for m in SpeculativeAlgorithm)
except Exception:  # an engine without the enum: no algorithm rule for it
    algorithms = None
print(json.dumps({
    "version": metadata.version("sglang"),
    "allow_abbrev": parser.allow_abbrev,
    "prefix_chars": parser.prefix_chars,
    "algorithms": algorithms,
    "actions": sorted(actions, key=lambda a: a["dest"]),
}))
