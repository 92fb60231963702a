"""Write a tiny word-level tokenizer (`DIR/tokenizer.json`) for sglang's benchmark client on a lab host.

    ssh root@HOST /root/venv_sglang/bin/python - /root/tok < lab/standin/tokenizer.py
    MEASURE_TOKENIZER=/root/tok MEASURE_SERVICES=... pyinfra INVENTORY measure.py -y

The lab's stand-in models carry no vocabulary (their `tokenizer_config.json` names Qwen2Tokenizer, without its
files), and the client loads a tokenizer before it sends anything: it samples random token ids below the
vocabulary's size, decodes them into the prompt, and counts the answer's tokens by encoding it again. Here a
token is a word: the stand-in's own output words (it answers with whole words,
`sglang_standin.bench_endpoints`), then filler words, split on whitespace. So a prompt of N ids is N words,
which the stand-in counts as N prompt tokens, and its answer re-encodes to as many tokens as it says it made.

Run by the venv's own python (it needs `tokenizers`, which the `lab-cpu-sglang-bench` stack installs); reads
nothing from the network, writes only DIR/tokenizer.json.
"""

from __future__ import annotations

import sys
from pathlib import Path

from sglang_standin.bench_endpoints import _WORDS
from tokenizers import Tokenizer, models, pre_tokenizers

FILLER = 500


def vocabulary() -> list[str]:
    return ["[UNK]", *_WORDS, *(f"w{i}" for i in range(FILLER))]


def build(directory: Path) -> Path:
    tokenizer = Tokenizer(models.WordLevel({word: i for i, word in enumerate(vocabulary())}, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(directory / "tokenizer.json"))
    return directory / "tokenizer.json"


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: VENV/bin/python lab/standin/tokenizer.py DIR   (or: VENV/bin/python - DIR < lab/standin/tokenizer.py)")
    print(build(Path(sys.argv[1])))
