# Wait until a just-(re)started service is ready, then send one chat completion. Fails fast, with
# the journal tail, as soon as the unit is dead or restarting.
# Ready means GET /ready answers 200. sglang 0.5.23 serves it (http_server.py: `ready()` answers 200
# when `tokenizer_manager.is_ready()`, that is startup done, not paused, not shutting down - a
# SIGTERM sets `gracefully_exit` - else 503; its auth middleware lets /health*, /ready* and
# /metrics* through without a key). An older engine has no /ready: it answers 404, or, with an API
# key, 401 (0.5.13's middleware guards every path but /health* and /metrics*); then the gate polls
# GET /health (503 until warm-up, then 200) as before. The answer says which endpoint proved
# readiness (`ready_by`). Neither is sent the key.
# The API key, if any, is read here from the service's root-only --config file (CONFIG_FILE,
# or "-"), so that it never travels in a command line.
# What this prints holds none of that file's values: sglang logs its server_args, keys included
# (sgl-project/sglang#37457), and the journal tail goes to the deploy's output and CI logs. The
# file's values, and the value of every secret-named `key=value` in the journal, are masked here,
# on the host, before anything leaves it (operations/run/redact.py does the same on the control
# machine). Every request goes only to the unit's own process: after connecting and before sending a
# byte (the key is in the smoke completion's header), the server's end of the connection must be a
# socket a process of the unit's cgroup holds (_common.peer_untrusted). Whoever else holds the port
# is named, and the gate fails: the engine opens its port only after minutes of loading, and any
# local user may bind it first.
# A speculative service (SPEC_JSON, else "-") must then prove what it is for, on probe prompts sent
# to /generate (sglang's native API): its greedy output is what its target decodes (each output
# token against the target's own choice at that position, re-scored by the same server in one
# prefill: `input_top_logprobs`, which sglang computes from the target's logits before the draft
# runs; a position whose top two are closer than NEAR_TIE nats does not count, and there the
# output token must be one of the two), and its acceptance (tokens per verify step, from the
# response's `meta_info`) is at least the service's `min_accept_length`. The first failing probe
# fails the gate, naming the prompt, the position, the two tokens and the target's margin.
# argv: UNIT ADDRESS PORT TIMEOUT_S SMOKE(0/1) CONFIG_FILE [SPEC_JSON]
import functools
import hashlib
import http.client
import json
import os
import re
import subprocess
import sys
import time

from _common import peer_untrusted, private_dir  # noqa: E402 - remote.script puts _common.py here

# What a speculative service's gate proved, kept beside the record of what it started with
# (service_state.py's RECORD_DIR, root's alone) for the process it proved it of: the status view
# shows it while that process runs.
RECORD_DIR = "/var/lib/sglang-deploy/started"

headers = {"Content-Type": "application/json"}
READY, HEALTH = "/ready", "/health"
# What /ready answers on an engine that has none: not found, or refused for want of the key it
# guards unknown paths with (sglang 0.5.23's /ready needs none, so it never answers these).
NO_READY = (401, 403, 404)
SECRETS = []  # the key file's values in their printed forms (read in the main part)
# Equal to operations/run/redact.py's SECRET_ASSIGNMENT (tests/unit/test_redact.py compares them).
SECRET_ASSIGNMENT = re.compile(
    r"""(?P<name>\b[\w.-]*?(?:api[_-]?key|access[_-]?key|private[_-]?key|secret|token"""
    r"""|passw(?:or)?d|credentials?)['"]?\s*[=:]\s*)"""
    r"""(?:(?P<quote>['"])(?P<quoted>(?:\\.|(?!(?P=quote))[^\\\n])*)(?P=quote)"""
    r"""|(?P<bare>[^\s'",)}\]]+))""",
    re.IGNORECASE,
)
NOT_A_VALUE = {"", "none", "null", "true", "false", "<redacted>"}


def read_config(path):
    """name -> value of each line (`api-key: "<JSON string>"`) of the service's --config file."""
    values = {}
    with open(path) as handle:
        for line in handle:
            key, _, value = line.partition(":")
            if value.strip():
                values[key.strip()] = json.loads(value.strip())
    return values


def secret_forms(values):
    """Each value as printed as-is, in a Python repr (sglang's server_args line) and in JSON."""
    forms = set()
    for value in values:
        forms.update({value, repr(value)[1:-1], json.dumps(value)[1:-1]})
    return sorted((f for f in forms if f), key=len, reverse=True)


def masked_assignment(match):
    value = match.group("quoted") if match.group("quote") else match.group("bare")
    if value.lower() in NOT_A_VALUE:
        return match.group(0)
    quote = match.group("quote") or ""
    return match.group("name") + quote + "<redacted>" + quote


def mask(text):
    """`text` without the key file's values or any secret-named value."""
    for form in SECRETS:
        text = text.replace(form, "<redacted>")
    return SECRET_ASSIGNMENT.sub(masked_assignment, text)


def unit_state():
    out = subprocess.run(
        ["systemctl", "show", unit, "-p", "ActiveState,SubState,Result,ControlGroup"],
        capture_output=True, text=True, timeout=30)
    return dict(line.partition("=")[::2] for line in out.stdout.splitlines())


class NotTheService(Exception):
    """The port answered from a socket no process of the unit holds."""


def ask(method, path, control_group, body=None, timeout=10):
    """(status, reason, body bytes) of one request, sent only once the connection's server end is
    the unit's."""
    conn = http.client.HTTPConnection(address, port, timeout=timeout)
    try:
        conn.connect()
        stranger = peer_untrusted(conn.sock, unit, control_group)
        if stranger:
            raise NotTheService(stranger)
        # the key goes with every request but the readiness probes (which need none)
        conn.request(method, path, body=body,
                     headers=headers if path not in (READY, HEALTH) else {})
        response = conn.getresponse()
        return response.status, response.reason, response.read()
    finally:
        conn.close()


def next_probe(path, status):
    """The endpoint to poll after `path` answered `status`: /health from then on where /ready is
    not the engine's (`NO_READY`), else the same. A 503 from /ready (warming up, paused, draining)
    is an answer: the gate waits, it does not fall back."""
    return HEALTH if path == READY and status in NO_READY else path


def journal_tail(lines=25):
    try:
        out = subprocess.run(
            ["journalctl", "-u", unit, "-n", str(lines), "--no-pager", "-o", "cat"],
            capture_output=True, text=True, timeout=30)
    except subprocess.TimeoutExpired:
        return "(journalctl gave no answer within 30 s)"
    return out.stdout.rstrip()


def die(reason):
    print(json.dumps({"ok": False, "reason": mask(reason),
                      "elapsed_s": round(time.monotonic() - start, 1),
                      "journal": mask(journal_tail())}))
    sys.exit(0)


class NotLossless(Exception):
    """The served tokens are not the target's, or the engine cannot say."""


@functools.lru_cache(maxsize=None)
def control_group():
    """The unit's cgroup, read once for the speculative check's requests (a unit keeps its cgroup
    across restarts: the peer check of each request holds it to the unit all the same)."""
    return unit_state().get("ControlGroup")


def generate(payload):
    """One /generate answer (a dict), asked only of the unit's own process."""
    try:
        status, why, answer = ask("POST", "/generate", control_group(),
                                  body=json.dumps(payload).encode(), timeout=300)
    except NotTheService as exc:
        die(f"{unit} was ready, then its port was not its own: {exc}; its speculative "
            "check (with the key) was not sent")
    if status != 200:
        raise NotLossless(f"/generate answered HTTP {status} {why}: "
                          f"{answer.decode('utf-8', 'replace')[:300]}")
    return json.loads(answer)


def first_departure(output_ids, tops, near_tie):
    """Where `output_ids` leaves the target's greedy choice, as (position, served id, the target's
    id, its margin in nats), or None; and how many positions were near-ties. `tops[j]`: the target's
    top two at output position j, [[logprob, id, text], ...] best first. The rule: at a position
    whose top two are at least `near_tie` apart, the served token must be the top one; closer, it
    must be one of the two (prefill and verify run different kernels: a near-tie may flip)."""
    ties = 0
    for j, served in enumerate(output_ids):
        top = tops[j] or []
        if len(top) < 2:
            raise NotLossless(f"the engine gave fewer than 2 top logprobs at output position {j}")
        margin = top[0][0] - top[1][0]
        if margin < near_tie:
            ties += 1
            if served in (top[0][1], top[1][1]):
                continue
        elif served == top[0][1]:
            continue
        return (j, served, top[0][1], margin, top[0][2] if len(top[0]) > 2 else None), ties
    return None, ties


def check_probe(prompt, tokens):
    """The served greedy output for `prompt`: (output ids, meta_info of the served request, with
    `elapsed_s`: how long the one request took, its single-request decode speed)."""
    began = time.monotonic()
    served = generate({"text": prompt,
                       "sampling_params": {"temperature": 0, "max_new_tokens": tokens}})
    ids, meta = served.get("output_ids"), dict(served.get("meta_info") or {})
    meta["elapsed_s"] = time.monotonic() - began
    if not isinstance(ids, list):
        raise NotLossless("/generate answered without `output_ids`: this engine cannot be "
                          "checked token by token")
    return ids, meta


def target_choices(prompt, ids):
    """The target's top two at each position of `ids` after `prompt`, in one prefill."""
    head = generate({"text": prompt, "sampling_params": {"temperature": 0, "max_new_tokens": 1},
                     "return_logprob": True, "logprob_start_len": 0, "top_logprobs_num": 0})
    prompt_ids = [entry[1] for entry in (head.get("meta_info") or {}).get("input_token_logprobs")
                  or []]
    if not prompt_ids:
        raise NotLossless("/generate answered without `input_token_logprobs`: this engine "
                          "cannot re-score its output")
    scored = generate({"input_ids": prompt_ids + ids,
                       "sampling_params": {"temperature": 0, "max_new_tokens": 1},
                       "return_logprob": True, "logprob_start_len": len(prompt_ids) - 1,
                       "top_logprobs_num": 2, "return_text_in_logprobs": True})
    tops = (scored.get("meta_info") or {}).get("input_top_logprobs") or []
    # entry 0 is the last prompt token's own; entry j + 1 the distribution for output token j
    if len(tops) < len(ids) + 1:
        raise NotLossless(f"the engine re-scored {max(0, len(tops) - 1)} of {len(ids)} output "
                          "positions")
    return tops[1:len(ids) + 1]


def acceptance(metas):
    """Accepted tokens per verify step over the probes, and where the engine said it."""
    verify = [m.get("spec_verify_ct") for m in metas]
    if all(isinstance(v, int) and v > 0 for v in verify):
        done = sum(m.get("completion_tokens") or 0 for m in metas)
        return done / sum(verify), "meta_info: completion_tokens / spec_verify_ct"
    lengths = [m.get("spec_accept_length") for m in metas]
    if all(isinstance(v, (int, float)) for v in lengths):
        return sum(lengths) / len(lengths), "meta_info: spec_accept_length"
    return None, "the engine reported no acceptance in meta_info"


def served_model():
    """The model path the server says it serves (`/model_info`), or None: a canary's outputs are
    compared with its old replica's where both serve the same."""
    try:
        status, _, answer = ask("GET", "/model_info", control_group())
        return json.loads(answer).get("model_path") if status == 200 else None
    except (NotTheService, OSError, ValueError, AttributeError, http.client.HTTPException):
        return None


def speculative_check(spec):
    """The gate's second half for a speculative service: a dict of its figures, or die()."""
    prompts = list(spec["prompts"]) + list(spec["prompts"][:1])  # once more: a radix-cache hit
    metas, checked, ties, outputs = [], 0, 0, []
    baseline_only = spec.get("baseline_only", False)  # a canary's old replica: figures, no verdict
    for index, prompt in enumerate(prompts):
        try:
            ids, meta = check_probe(prompt, spec["tokens"])
            metas.append(meta)
            outputs.append(hashlib.sha256(json.dumps(ids).encode()).hexdigest()[:16])
            if not spec["lossless"] or baseline_only:
                continue
            departure, near = first_departure(ids, target_choices(prompt, ids), spec["near_tie"])
        except NotLossless as exc:
            die(f"{unit}: its speculative output cannot be checked against its target: {exc} "
                f"(probe {index + 1}); set `lossless_check: false` for this service to serve "
                "it unchecked")
        except (OSError, ValueError, KeyError, IndexError, TypeError,
                http.client.HTTPException) as exc:
            die(f"{unit}: its speculative check failed at probe {index + 1}: {exc}")
        checked, ties = checked + len(ids), ties + near
        if departure:
            position, served, wanted, margin, text = departure
            again = " (the repeated probe: a radix-cache hit)" if index == len(prompts) - 1 else ""
            die(f"{unit} does not decode what its target would: probe {index + 1}{again} "
                f"{prompt[:40]!r}, output token {position}: served id {served}, the target's "
                f"choice id {wanted} ({text!r}) by {margin:.3f} nats (near-ties below "
                f"{spec['near_tie']} do not count)")
    accept, source = acceptance(metas)
    figures = {"model_path": served_model(), "checked_tokens": checked, "near_ties": ties,
               "probes": len(prompts),
               "lossless": spec["lossless"] and not baseline_only, "accept_length": accept,
               "accept_source": source, "outputs": outputs,
               "decode_tok_s": (sum(m.get("completion_tokens") or 0 for m in metas)
                                / max(sum(m["elapsed_s"] for m in metas), 1e-9))}
    if baseline_only:
        return figures
    if spec["min_accept"] > 0:
        if accept is None:
            die(f"{unit}: {source}, so its acceptance cannot be held to "
                f"min_accept_length {spec['min_accept']}: set `min_accept_length: 0` to serve "
                "it without")
        if accept < spec["min_accept"]:
            die(f"{unit} accepts {accept:.2f} tokens per verify step over its probes ({source}), "
                f"below its min_accept_length {spec['min_accept']}: its draft is not worth its "
                "GPU (a wrong or mismatched draft model, or settings that defeat it)")
    return figures


def gate_path(unit_name):
    return os.path.join(RECORD_DIR, unit_name.replace("/", "_") + ".gate.json")


def keep_gate(figures):
    """The gate's figures, for the process they were proved of (its MainPID); a record that cannot
    be kept is said, and the gate stands."""
    pid = int(subprocess.run(["systemctl", "show", unit, "-p", "MainPID", "--value"],
                             capture_output=True, text=True, timeout=30).stdout.strip() or 0)
    try:
        private_dir(os.path.dirname(RECORD_DIR))
        private_dir(RECORD_DIR)
        tmp = gate_path(unit) + ".tmp"
        if os.path.lexists(tmp):
            os.unlink(tmp)
        with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600),
                       "w") as handle:
            json.dump({**figures, "pid": pid}, handle, sort_keys=True)
        os.rename(tmp, gate_path(unit))
    except OSError as exc:
        print(f"the gate's figures were not kept for the status view: {exc}", file=sys.stderr)


# Loaded as a module (tests/unit/test_speculative_gate.py), nothing below runs.
if __name__ == "__main__":
    unit, address, port, timeout, smoke = (sys.argv[1], sys.argv[2], int(sys.argv[3]),
                                           float(sys.argv[4]), sys.argv[5] == "1")
    config_file = sys.argv[6] if len(sys.argv) > 6 else "-"
    spec = json.loads(sys.argv[7]) if len(sys.argv) > 7 and sys.argv[7] != "-" else None

    config = read_config(config_file) if config_file != "-" else {}
    SECRETS = secret_forms(config.values())
    if "api-key" in config:
        headers["Authorization"] = "Bearer " + config["api-key"]
    base = f"http://{address}:{port}"
    start = time.monotonic()

    last = "connection refused"
    probe = READY
    while True:
        state = unit_state()
        if (state.get("ActiveState") in ("failed", "inactive")
                or state.get("SubState") == "auto-restart"):
            die(f"{unit} is {state.get('ActiveState')}/{state.get('SubState')} (result: "
                f"{state.get('Result')}) before it became ready")
        try:
            status, _, _ = ask("GET", probe, state.get("ControlGroup"))
            if status == 200:
                break
            last = f"HTTP {status}"
            if next_probe(probe, status) != probe:
                last = f"{probe} answered HTTP {status}: an engine without it"
                probe = next_probe(probe, status)
                continue
        except NotTheService as exc:
            die(f"{unit} cannot be asked: {exc} (another process answers on its port: stop it, "
                "or move "
                "the service to a free port)")
        except OSError as exc:
            last = "connection refused (loading)" if "refused" in str(exc) else str(exc)
        # something that is not an HTTP server holds the port (sshd on 22)
        except http.client.HTTPException as exc:
            last = f"the port answers, but not with HTTP ({type(exc).__name__}: {str(exc)[:80]})"
        if time.monotonic() - start > timeout:
            die(f"{unit} did not answer {base}{probe} with 200 within {timeout:.0f} s "
                f"(last: {last})")
        time.sleep(0.5)

    ready_s = round(time.monotonic() - start, 1)
    reply = None
    if smoke:
        body = json.dumps({"model": "default",
                           "messages": [{"role": "user", "content": "Reply with OK."}],
                           "max_tokens": 8, "temperature": 0}).encode()
        try:
            status, why, answer = ask("POST", "/v1/chat/completions",
                                      unit_state().get("ControlGroup"),
                                      body=body, timeout=120)
            if status != 200:
                raise ValueError(f"HTTP Error {status}: {why}")
            reply = json.loads(answer)["choices"][0]["message"]["content"]
        except NotTheService as exc:
            die(f"{unit} answered {probe}, then its port was not its own: {exc}; the smoke "
                "completion (with the key) was not sent")
        except (OSError, ValueError, KeyError, IndexError, TypeError,
                http.client.HTTPException) as exc:
            die(f"{unit} is healthy but the smoke chat completion failed: {exc}")


    checked = speculative_check(spec) if spec else None
    if checked and not spec.get("baseline_only"):
        keep_gate(checked)
    answer = {"ok": True, "ready_s": ready_s, "ready_by": probe,
              "reply": mask(reply) if isinstance(reply, str) else reply}
    if checked:
        answer["spec"] = checked  # a speculative service's figures (readiness.spec_text)
    print(json.dumps(answer))
