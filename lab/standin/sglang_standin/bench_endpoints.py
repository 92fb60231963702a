"""What sglang's own benchmark client needs from a server, answered by the stand-in.

``python -m sglang.bench_serving --backend sglang`` (sglang 0.5.23's client, read from its
source) calls, in order: ``GET /v1/models`` (ready check, model id), ``GET /model_info``
(tokenizer path), the streaming ``POST /generate`` for every request (one warm-up first),
``POST /flush_cache`` when asked, and ``GET /server_info`` at the end (its
``internal_states[0].avg_spec_accept_length`` is the JSON's ``accept_length``). The first two
and ``/health`` are launch_server's; this module answers the rest.

Speed follows the speculative flags, deterministically, so that two services differ in the
direction their real counterparts would. Each "forward step" takes ``STANDIN_STEP_S``
seconds (default 0.01); the prompt's step gives the first token; each later step accepts:

| service | tokens per step (accept length) |
|---|---|
| no ``--speculative-algorithm`` | 1 (no accept length is reported, as by sglang) |
| ``DFLASH`` (any other algorithm too) | 2.0 |
| ``DDTREE`` with budget <= block size - 1 (the spine: PR #27509's ``ad7ab160`` runs it as DFLASH) | 2.0 |
| ``DDTREE`` with budget > block size - 1 (a tree) | 3.0 |

The block size is ``--speculative-num-draft-tokens`` (``--speculative-dflash-block-size``), else
the draft's ``config.json`` ``dflash_config.block_size``, else 16; the budget is
``--speculative-ddtree-budget``, else block size - 1. These are the stand-in's numbers, not a
prediction of any GPU's: a test can only rely on their order.

``/generate``'s ``meta_info`` carries what sglang's does for a speculative request
(``completion_tokens``, ``spec_verify_ct``, ``spec_accept_length`` = completion tokens over
verify steps), and ``/server_info`` the cumulative ``avg_spec_accept_length`` since start.

Tokens and the "target model" (for the readiness gate's speculative check): a token is a word of
``VOCAB`` (the lab tokenizer's words, lab/standin/tokenizer.py; an unknown word is id 0). The
target's greedy choice after a prefix is a deterministic function of the prefix's ids
(``target_top``: its top token at logprob -0.05, the next id at -3.05); a server answers
``output_ids`` (the target's greedy tokens) and, with ``return_logprob``, sglang's
``input_token_logprobs`` / ``input_top_logprobs`` (from ``logprob_start_len``; entry 0 None) and
``output_token_logprobs`` / ``output_top_logprobs`` from that same function. Two settings, read
from the environment, make a speculative server wrong or slow on purpose:
``STANDIN_SPEC_DIVERGE_AT=N``: its greedy output departs from the target's choice at output token
N (it serves neither of the target's top two there, then goes on greedily from what it served);
the scoring route still answers the target's choices. ``STANDIN_ACCEPT_LENGTH=X``: the acceptance
it reports (and paces its steps by), in place of the table's.
Stdlib only.
"""

from __future__ import annotations

import json
import math
import os
import threading
import time

ACCEPT_SPEC = 2.0  # DFLASH, other algorithms, and DDTREE's spine
ACCEPT_TREE = 3.0  # DDTREE with a budget beyond the spine
DEFAULT_BLOCK = 16
_WORDS = ("alpha", "beta", "gamma", "delta", "eps", "zeta", "eta", "theta", "iota", "kappa", "lambda")


def _int(value) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def block_size(args: dict) -> int:
    for key in ("speculative_num_draft_tokens", "speculative_dflash_block_size"):
        if _int(args.get(key)):
            return _int(args.get(key))
    draft = args.get("speculative_draft_model_path")
    if draft:
        try:
            with open(os.path.join(str(draft), "config.json"), encoding="utf-8") as fh:
                found = _int((json.load(fh).get("dflash_config") or {}).get("block_size"))
            if found:
                return found
        except (OSError, ValueError, AttributeError):
            pass
    return DEFAULT_BLOCK


def accept_length(args: dict) -> float | None:
    """Tokens each verify step accepts for these server args; None without speculative decoding."""
    algorithm = str(args.get("speculative_algorithm") or "").upper()
    if algorithm in ("", "NONE"):
        return None
    if algorithm == "DDTREE":
        block = block_size(args)
        budget = _int(args.get("speculative_ddtree_budget")) or block - 1
        return ACCEPT_TREE if budget > block - 1 else ACCEPT_SPEC
    return ACCEPT_SPEC


def step_s() -> float:
    raw = os.environ.get("STANDIN_STEP_S", "").strip()
    try:
        return max(0.0, float(raw)) if raw else 0.01
    except ValueError:
        return 0.01


class Totals:
    """Cumulative counts since start, as the scheduler keeps them for /server_info."""

    def __init__(self):
        self.lock = threading.Lock()
        self.accepted = 0  # tokens from verify steps
        self.verify_ct = 0

    def add(self, accepted: int, verify_ct: int) -> None:
        with self.lock:
            self.accepted += accepted
            self.verify_ct += verify_ct

    def average(self) -> float | None:
        with self.lock:
            return self.accepted / self.verify_ct if self.verify_ct else None


_TOTALS: dict[int, Totals] = {}


def totals(state) -> Totals:
    return _TOTALS.setdefault(id(state), Totals())


def schedule(max_new_tokens: int, accept: float | None) -> list[int]:
    """Completion tokens after each step: the prompt's step gives 1, then `accept` per step (1 without speculation)."""
    if max_new_tokens <= 0:
        return []
    per_step = accept or 1.0
    counts, done, credit = [1], 1, 0.0
    while done < max_new_tokens:
        credit += per_step
        take = max(1, math.floor(credit))
        credit -= take
        done = min(max_new_tokens, done + take)
        counts.append(done)
    return counts


VOCAB = ("[UNK]", *_WORDS, *(f"w{i}" for i in range(500)))  # lab/standin/tokenizer.py's words
_INDEX = {word: i for i, word in enumerate(VOCAB)}
TOP_LOGPROB, SECOND_LOGPROB, OTHER_LOGPROB = -0.05, -3.05, -9.0


def encode(text: str) -> list[int]:
    return [_INDEX.get(word, 0) for word in str(text).split()]


def decode(ids) -> str:
    return " ".join(VOCAB[i % len(VOCAB)] for i in ids)


def _fold(state: int, token: int) -> int:
    return (state * 1_000_003 + token + 1) % ((1 << 61) - 1)


def target_top(state: int) -> tuple[int, int]:
    """The target's two best next tokens after a prefix folded into `state`."""
    first = state % len(VOCAB)
    return first, (first + 1) % len(VOCAB)


def _env_int(name: str) -> int | None:
    return _int(os.environ.get(name, "").strip() or None)


def _env_accept() -> float | None:
    raw = os.environ.get("STANDIN_ACCEPT_LENGTH", "").strip()
    try:
        return max(1.0, float(raw)) if raw else None
    except ValueError:
        return None


def greedy(prompt_ids: list[int], count: int, speculative: bool) -> list[int]:
    """The server's greedy output: the target's choices, but for a speculative server told to
    diverge (STANDIN_SPEC_DIVERGE_AT)."""
    diverge = _env_int("STANDIN_SPEC_DIVERGE_AT") if speculative else None
    state = 0
    for token in prompt_ids:
        state = _fold(state, token)
    out = []
    for j in range(count):
        token = target_top(state)[0]
        if j == diverge:
            token = (token + 2) % len(VOCAB)  # neither of the target's top two
        out.append(token)
        state = _fold(state, token)
    return out


def _entry(logprob, token, with_text):
    return [logprob, token, VOCAB[token % len(VOCAB)] if with_text else None]


def logprobs(ids: list[int], start: int, top_n: int, with_text: bool) -> tuple[list, list]:
    """sglang's (token logprobs, top logprobs) for positions `start`.. of `ids`: entry 0 None."""
    state = 0
    for token in ids[:start]:
        state = _fold(state, token)
    tokens, tops = [], []
    for k in range(start, len(ids)):
        if k == start or k == 0:
            tokens.append(_entry(None, ids[k], with_text))
            tops.append(None)
        else:
            first, second = target_top(state)
            logprob = (TOP_LOGPROB if ids[k] == first else SECOND_LOGPROB if ids[k] == second
                       else OTHER_LOGPROB)
            tokens.append(_entry(logprob, ids[k], with_text))
            tops.append([_entry(TOP_LOGPROB, first, with_text),
                         _entry(SECOND_LOGPROB, second, with_text)][:top_n])
        state = _fold(state, ids[k])
    return tokens, tops


def _meta(rid: str, prompt_tokens: int, done: int, steps: int, accept: float | None, finished: bool) -> dict:
    meta = {"id": rid, "prompt_tokens": prompt_tokens, "completion_tokens": done, "cached_tokens": 0,
            "finish_reason": {"type": "length", "length": done} if finished else None}
    if accept is not None and steps > 0:
        meta["spec_verify_ct"] = steps
        meta["spec_accept_length"] = done / steps
    return meta


def generate(handler, body: dict) -> None:
    """POST /generate: sglang's native endpoint, streamed (SSE) or not."""
    state = handler.state
    params = body.get("sampling_params") or {}
    max_new = _int(params.get("max_new_tokens"))
    max_new = 128 if max_new is None else max(0, max_new)
    prompt = body.get("input_ids") if body.get("input_ids") is not None else body.get("text") or ""
    prompt_ids = ([_int(t) or 0 for t in prompt] if isinstance(prompt, list) else encode(prompt))
    prompt_tokens = len(prompt_ids)
    accept = accept_length(state.args)
    if accept is not None:
        accept = _env_accept() or accept
    counts = schedule(max_new, accept)
    output_ids = greedy(prompt_ids, counts[-1] if counts else 0, accept is not None)
    rid = "standin-%d" % int(time.monotonic() * 1e6)
    step = step_s()
    stream = bool(body.get("stream"))
    if stream:
        handler.send_response(200)
        handler.send_header("Content-Type", "text/event-stream")
        handler.send_header("Cache-Control", "no-cache")
        handler.send_header("Connection", "close")
        handler.end_headers()
        handler.close_connection = True
    for index, done in enumerate(counts):
        time.sleep(step)
        if stream:
            chunk = {"text": decode(output_ids[:done]),
                     "meta_info": _meta(rid, prompt_tokens, done, index, accept, index == len(counts) - 1)}
            handler.wfile.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
            handler.wfile.flush()
    verify_steps = max(0, len(counts) - 1)
    final = counts[-1] if counts else 0
    if accept is not None and verify_steps:
        totals(state).add(final - 1, verify_steps)
    if stream:
        handler.wfile.write(b"data: [DONE]\n\n")
        handler.wfile.flush()
        return
    meta = _meta(rid, prompt_tokens, final, verify_steps, accept, True)
    if body.get("return_logprob"):
        start = max(0, min(_int(body.get("logprob_start_len")) or 0, len(prompt_ids)))
        top_n = max(0, _int(body.get("top_logprobs_num")) or 0)
        with_text = bool(body.get("return_text_in_logprobs"))
        every_token, every_top = logprobs(prompt_ids + output_ids, start, top_n, with_text)
        cut = len(prompt_ids) - start
        meta.update(input_token_logprobs=every_token[:cut], input_top_logprobs=every_top[:cut],
                    output_token_logprobs=every_token[cut:], output_top_logprobs=every_top[cut:])
    handler._json(200, {"text": decode(output_ids), "output_ids": output_ids, "meta_info": meta})


def server_info(handler) -> None:
    info = handler.state.server_info()
    internal = {"last_gen_throughput": 0.0}
    average = totals(handler.state).average()
    if average is not None:
        internal["avg_spec_accept_length"] = average
    info["internal_states"] = [internal]
    handler._json(200, info)


def handle(handler, method: str, path: str, raw: bytes = b"") -> bool:
    """Answer `path` if it is one of this module's; False to let launch_server answer it."""
    if method == "GET" and path in ("/server_info", "/get_server_info"):
        server_info(handler)
        return True
    if method != "POST" or path not in ("/generate", "/flush_cache"):
        return False
    if not handler.state.ready():
        handler._error(503, "server is %s (sglang-standin)" % handler.state.not_ready_status(),
                       "ServiceUnavailableError")
        return True
    if path == "/flush_cache":
        handler._send(200, b"Cache flushed.\n", "text/plain")
        return True
    try:
        body = json.loads(raw.decode("utf-8") or "{}")
    except (UnicodeDecodeError, ValueError) as exc:
        handler._error(400, "invalid JSON body: %s" % exc, "BadRequestError")
        return True
    if not isinstance(body, dict):
        handler._error(400, "request body must be a JSON object", "BadRequestError")
        return True
    generate(handler, body)
    return True
