# Wait until a just-(re)started service answers GET /health with 200, then send one chat
# completion. Fails fast, with the journal tail, as soon as the unit is dead or restarting.
# The API key, if any, is read here from the service's root-only --config file (CONFIG_FILE,
# or "-"), so that it never travels in a command line.
# What this prints holds none of that file's values: sglang logs its server_args, keys included
# (sgl-project/sglang#37457), and the journal tail goes to the deploy's output and CI logs. The
# file's values, and the value of every secret-named `key=value` in the journal, are masked here,
# on the host, before anything leaves it (operations/redact.py does the same on the control machine).
# argv: UNIT ADDRESS PORT TIMEOUT_S SMOKE(0/1) CONFIG_FILE
import http.client
import json
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request

unit, address, port, timeout, smoke = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), sys.argv[5] == "1"
config_file = sys.argv[6] if len(sys.argv) > 6 else "-"
headers = {"Content-Type": "application/json"}
# Equal to operations/redact.py's SECRET_ASSIGNMENT (tests/unit/test_redact.py compares them).
SECRET_ASSIGNMENT = re.compile(
    r"""(?P<name>\b[\w.-]*?(?:api[_-]?key|access[_-]?key|private[_-]?key|secret|token|passw(?:or)?d|credentials?)['"]?\s*[=:]\s*)"""
    r"""(?:(?P<quote>['"])(?P<quoted>(?:\\.|(?!(?P=quote))[^\\\n])*)(?P=quote)|(?P<bare>[^\s'",)}\]]+))""",
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
    out = subprocess.run(["systemctl", "show", unit, "-p", "ActiveState,SubState,Result"], capture_output=True, text=True)
    return dict(line.partition("=")[::2] for line in out.stdout.splitlines())


def journal_tail(lines=25):
    out = subprocess.run(["journalctl", "-u", unit, "-n", str(lines), "--no-pager", "-o", "cat"], capture_output=True, text=True)
    return out.stdout.rstrip()


def die(reason):
    print(json.dumps({"ok": False, "reason": mask(reason), "elapsed_s": round(time.monotonic() - start, 1), "journal": mask(journal_tail())}))
    sys.exit(0)


last = "connection refused"
while True:
    state = unit_state()
    if state.get("ActiveState") in ("failed", "inactive") or state.get("SubState") == "auto-restart":
        die(f"{unit} is {state.get('ActiveState')}/{state.get('SubState')} (result: {state.get('Result')}) before it became ready")
    try:
        with urllib.request.urlopen(f"{base}/health", timeout=10) as response:
            if response.status == 200:
                break
            last = f"HTTP {response.status}"
    except urllib.error.HTTPError as exc:
        last = f"HTTP {exc.code}"
    except OSError as exc:
        last = "connection refused (loading)" if "refused" in str(exc) else str(exc)
    except http.client.HTTPException as exc:  # something that is not an HTTP server holds the port (sshd on 22)
        last = f"the port answers, but not with HTTP ({type(exc).__name__}: {str(exc)[:80]})"
    if time.monotonic() - start > timeout:
        die(f"{unit} did not answer {base}/health with 200 within {timeout:.0f} s (last: {last})")
    time.sleep(0.5)

ready_s = round(time.monotonic() - start, 1)
reply = None
if smoke:
    body = json.dumps({"model": "default", "messages": [{"role": "user", "content": "Reply with OK."}], "max_tokens": 8, "temperature": 0}).encode()
    request = urllib.request.Request(f"{base}/v1/chat/completions", data=body, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            reply = json.load(response)["choices"][0]["message"]["content"]
    except (OSError, ValueError, KeyError, IndexError, http.client.HTTPException) as exc:
        die(f"{unit} is healthy but the smoke chat completion failed: {exc}")
print(json.dumps({"ok": True, "ready_s": ready_s, "reply": mask(reply) if isinstance(reply, str) else reply}))
