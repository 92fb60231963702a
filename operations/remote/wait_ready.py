# Wait until a just-(re)started service answers GET /health with 200, then send one chat
# completion. Fails fast, with the journal tail, as soon as the unit is dead or restarting.
# The API key, if any, is read here from the service's root-only --config file (CONFIG_FILE,
# or "-"), so that it never travels in a command line.
# argv: UNIT ADDRESS PORT TIMEOUT_S SMOKE(0/1) CONFIG_FILE
import http.client
import json
import subprocess
import sys
import time
import urllib.error
import urllib.request

unit, address, port, timeout, smoke = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), sys.argv[5] == "1"
config_file = sys.argv[6] if len(sys.argv) > 6 else "-"
headers = {"Content-Type": "application/json"}
if config_file != "-":
    with open(config_file) as handle:
        for line in handle:
            key, _, value = line.partition(":")
            if key.strip() == "api-key":
                headers["Authorization"] = "Bearer " + json.loads(value.strip())
base = f"http://{address}:{port}"
start = time.monotonic()


def unit_state():
    out = subprocess.run(["systemctl", "show", unit, "-p", "ActiveState,SubState,Result"], capture_output=True, text=True)
    return dict(line.partition("=")[::2] for line in out.stdout.splitlines())


def journal_tail(lines=25):
    out = subprocess.run(["journalctl", "-u", unit, "-n", str(lines), "--no-pager", "-o", "cat"], capture_output=True, text=True)
    return out.stdout.rstrip()


def die(reason):
    print(json.dumps({"ok": False, "reason": reason, "elapsed_s": round(time.monotonic() - start, 1), "journal": journal_tail()}))
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
print(json.dumps({"ok": True, "ready_s": ready_s, "reply": reply}))
