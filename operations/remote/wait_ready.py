# Wait until a just-(re)started service answers GET /health with 200, then send one chat
# completion. Fails fast, with the journal tail, as soon as the unit is dead or restarting.
# The API key, if any, is read here from the service's root-only --config file (CONFIG_FILE,
# or "-"), so that it never travels in a command line.
# What this prints holds none of that file's values: sglang logs its server_args, keys included
# (sgl-project/sglang#37457), and the journal tail goes to the deploy's output and CI logs. The
# file's values, and the value of every secret-named `key=value` in the journal, are masked here,
# on the host, before anything leaves it (operations/redact.py does the same on the control
# machine). Every request goes only to the unit's own process: after connecting and before sending a
# byte (the key is in the smoke completion's header), the server's end of the connection must be a
# socket a process of the unit's cgroup holds (_common.peer_untrusted). Whoever else holds the port
# is named, and the gate fails: the engine opens its port only after minutes of loading, and any
# local user may bind it first.
# argv: UNIT ADDRESS PORT TIMEOUT_S SMOKE(0/1) CONFIG_FILE
import http.client
import json
import re
import subprocess
import sys
import time

from _common import peer_untrusted  # noqa: E402 - remote.script puts _common.py here

unit, address, port, timeout, smoke = (sys.argv[1], sys.argv[2], int(sys.argv[3]),
                                       float(sys.argv[4]), sys.argv[5] == "1")
config_file = sys.argv[6] if len(sys.argv) > 6 else "-"
headers = {"Content-Type": "application/json"}
# Equal to operations/redact.py's SECRET_ASSIGNMENT (tests/unit/test_redact.py compares them).
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


config = read_config(config_file) if config_file != "-" else {}
SECRETS = secret_forms(config.values())
if "api-key" in config:
    headers["Authorization"] = "Bearer " + config["api-key"]
base = f"http://{address}:{port}"
start = time.monotonic()


def unit_state():
    out = subprocess.run(
        ["systemctl", "show", unit, "-p", "ActiveState,SubState,Result,ControlGroup"],
        capture_output=True, text=True)
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
        conn.request(method, path, body=body, headers=headers if body is not None else {})
        response = conn.getresponse()
        return response.status, response.reason, response.read()
    finally:
        conn.close()


def journal_tail(lines=25):
    out = subprocess.run(["journalctl", "-u", unit, "-n", str(lines), "--no-pager", "-o", "cat"],
                         capture_output=True, text=True)
    return out.stdout.rstrip()


def die(reason):
    print(json.dumps({"ok": False, "reason": mask(reason),
                      "elapsed_s": round(time.monotonic() - start, 1),
                      "journal": mask(journal_tail())}))
    sys.exit(0)


last = "connection refused"
while True:
    state = unit_state()
    if (state.get("ActiveState") in ("failed", "inactive")
            or state.get("SubState") == "auto-restart"):
        die(f"{unit} is {state.get('ActiveState')}/{state.get('SubState')} (result: "
            f"{state.get('Result')}) before it became ready")
    try:
        status, _, _ = ask("GET", "/health", state.get("ControlGroup"))
        if status == 200:
            break
        last = f"HTTP {status}"
    except NotTheService as exc:
        die(f"{unit} cannot be asked: {exc} (another process answers on its port: stop it, or move "
            "the service to a free port)")
    except OSError as exc:
        last = "connection refused (loading)" if "refused" in str(exc) else str(exc)
    # something that is not an HTTP server holds the port (sshd on 22)
    except http.client.HTTPException as exc:
        last = f"the port answers, but not with HTTP ({type(exc).__name__}: {str(exc)[:80]})"
    if time.monotonic() - start > timeout:
        die(f"{unit} did not answer {base}/health with 200 within {timeout:.0f} s (last: {last})")
    time.sleep(0.5)

ready_s = round(time.monotonic() - start, 1)
reply = None
if smoke:
    body = json.dumps({"model": "default",
                       "messages": [{"role": "user", "content": "Reply with OK."}],
                       "max_tokens": 8, "temperature": 0}).encode()
    try:
        status, why, answer = ask("POST", "/v1/chat/completions", unit_state().get("ControlGroup"),
                                  body=body, timeout=120)
        if status != 200:
            raise ValueError(f"HTTP Error {status}: {why}")
        reply = json.loads(answer)["choices"][0]["message"]["content"]
    except NotTheService as exc:
        die(f"{unit} answered /health, then its port was not its own: {exc}; the smoke completion "
            "(with the key) was not sent")
    except (OSError, ValueError, KeyError, IndexError, TypeError, http.client.HTTPException) as exc:
        die(f"{unit} is healthy but the smoke chat completion failed: {exc}")
print(json.dumps(
    {"ok": True, "ready_s": ready_s, "reply": mask(reply) if isinstance(reply, str) else reply}))
