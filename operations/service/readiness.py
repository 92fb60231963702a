"""Readiness: `readiness.ready(unit, ...)` gates on a service really serving.

SGLang opens its port only after loading and answers `/health` with 503 until warm-up
succeeds; `/v1/models` answers earlier and proves nothing. After a (re)start the gate
polls `/ready` on the host until 200 (sglang 0.5.23: 503 while warming up, paused or draining;
an engine without it answers 404, and the gate polls `/health` instead: `ready_by` says which
proved it, operations/service/on_host/wait_ready.py), then sends one chat completion; a speculative
service must then decode its target's own greedy tokens on fixed probes and accept enough tokens per
verify step (`speculative_check`, docs/speculative-gate.md). It fails in seconds, with the
journal tail, when the unit dies or is restarting, rather than waiting out the timeout. A
service that was not restarted and already answers 200 is a no-op.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from typing import Callable

import gevent
from pyinfra import host, logger
from pyinfra.api import FactBase, FunctionCommand, OperationError

from operations import remote
from operations.run import host_reads, read_batch, redact, this_run
from operations.run.host_reads import operation
from operations.service import rollback
from report import rollouts
from report.summary import record

# A speculative service's gate (operations/service/on_host/wait_ready.py, docs/speculative-gate.md):
# these prompts, and the first once more (a radix-cache hit), each decoded greedily for the
# service's `lossless_tokens` and compared with the target's own choices. The near-tie rule, one
# everywhere: a position where the target's top two logprobs are closer than NEAR_TIE_NATS does not
# count (prefill and verify run different kernels), and there the served token must be one of the
# two.
PROBES = (
    "The capital of France is",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "Explain in one paragraph why the sky is blue.",
)
NEAR_TIE_NATS = 0.1


@dataclass(frozen=True)
class Baseline:
    """A replica of a canary's service still on the old version (another host's, or this one's):
    where the canary's probe figures are compared (`rollout.old_replica`)."""

    host: str
    replica: str
    unit: str
    address: str
    port: int
    config_file: str

    @classmethod
    def of(cls, host_name: str, service) -> Baseline:
        return cls(host_name, service.name, service.unit_name, probe_address(service.bind),
                   service.port, service.config_file or "-")


def canary_regression(new: dict, old: dict, accept_drop: float, slowdown: float) -> str | None:
    """Why a canary's probe figures are worse than its old version's, or None. Greedy outputs must
    be equal where both serve the same model path; acceptance and single-request decode speed may
    be lower by at most the fractions given."""
    why = []
    if new.get("model_path") and new.get("model_path") == old.get("model_path"):
        differ = [i + 1 for i, (a, b) in enumerate(zip(new.get("outputs") or [], old.get("outputs")
                                                       or [])) if a != b]
        if differ:
            why.append(f"its greedy output differs from the old version's on probe(s) "
                       f"{', '.join(map(str, differ))} (both serve {new['model_path']})")
    a_new, a_old = new.get("accept_length"), old.get("accept_length")
    if a_new is not None and a_old is not None and a_new < a_old * (1 - accept_drop):
        why.append(f"it accepts {a_new:.2f} tokens per verify step against the old version's "
                   f"{a_old:.2f} (more than {accept_drop:.0%} lower)")
    s_new, s_old = new.get("decode_tok_s"), old.get("decode_tok_s")
    if s_new and s_old and s_new < s_old * (1 - slowdown):
        why.append(f"it decodes {s_new:.1f} tokens/s on one request against the old version's "
                   f"{s_old:.1f} (more than {slowdown:.0%} slower)")
    return "; ".join(why) or None


def side_by_side(new: dict, old: dict) -> str:
    def accept(figures):
        value = figures.get("accept_length")
        return "-" if value is None else f"{value:.2f}"

    same = sum(a == b for a, b in zip(new.get("outputs") or [], old.get("outputs") or []))
    return (f"accept {accept(new)} (old {accept(old)}), decode {new.get('decode_tok_s', 0):.1f} "
            f"tok/s (old {old.get('decode_tok_s', 0):.1f}), greedy output equal on {same} of "
            f"{len(new.get('outputs') or [])} probes")


def speculative_check(service) -> dict | None:
    """What the gate asks of `service` beyond serving (None: it decodes without speculation, or
    its data turned both checks off)."""
    if service.speculative_algorithm is None:
        return None
    if not service.lossless_check and not service.min_accept_length:
        return None  # the data turned both checks off: nothing to ask beyond serving
    return {"algorithm": service.speculative_algorithm, "prompts": list(PROBES),
            "tokens": service.lossless_tokens, "near_tie": NEAR_TIE_NATS,
            "lossless": service.lossless_check, "min_accept": service.min_accept_length,
            "accept_drop": service.canary_accept_drop, "slowdown": service.canary_slowdown}


# How old a kept answer may be when it decides that a service serves. A converged run reaches this
# gate about a second after its read at the lock; a run whose other hosts install for minutes
# (operations run in step) reads again.
VERDICT_MAX_AGE_S = 30


@read_batch.batched()
class ServiceState(FactBase):
    """systemd state of a unit and the HTTP status of its `/health` (None when nothing answers)."""

    def command(self, unit: str, address: str, port: int, inputs: tuple[str, ...] = ()) -> str:
        return remote.command("service_state", shlex.quote(unit), shlex.quote(address),
                              str(int(port)), *(shlex.quote(p) for p in inputs))

    def process(self, output):
        return json.loads("\n".join(output))


def service_state(unit: str, address: str, port: int, inputs: tuple[str, ...] = ()) -> dict:
    """The `ServiceState` fact; a clear error where pyinfra returned nothing (it has failed the host
    already)."""
    state = host_reads.get(host, ServiceState, unit=unit, address=address, port=port, inputs=inputs)
    if not isinstance(state, dict):
        raise OperationError(
            f"{host.name}: could not read the state of {unit} (systemd and "
            f"{address}:{port}/health): the connection dropped or the command failed (pyinfra's "
            "error above says which); run the deploy again once the host answers"
        )
    return state


def probe_address(bind: str) -> str:
    """Where to reach a server from its own host."""
    return "127.0.0.1" if bind in ("0.0.0.0", "::", "localhost") else bind


def endpoint_text(bind: str, port: int, open_to_all: bool) -> str:
    """The service's endpoint as the summary shows it (an exposed service without a key says so)."""
    return f"http://{bind}:{port}" + (" (NO API KEY)" if open_to_all else "")


def already(state: dict) -> str:
    """The summary's words for a service that serves and was not restarted, from its `ServiceState`
    read."""
    uptime = f"up {state['uptime_s']:.0f} s" if state.get("uptime_s") is not None else "up"
    return f"already ({uptime}, pid {state.get('pid')})"


def _wait_once(host, unit: str, address: str, port: int, timeout: int, smoke: bool,
               config_file: str, spec: dict | None = None) -> dict:
    command = remote.command(
        "wait_ready", shlex.quote(unit), shlex.quote(address), str(port), str(timeout),
        "1" if smoke else "0", shlex.quote(config_file),
        shlex.quote(json.dumps(spec, sort_keys=True)) if spec else "-"
    )
    ok, output = host.run_shell_command(command, print_output=False, _timeout=timeout + 180)
    try:
        result = json.loads(output.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        result = {"ok": False, "reason": "readiness probe failed to run: "
                                         f"{output.stderr.strip()[-500:]}", "journal": ""}
    if not ok:
        result["ok"] = False
    # The engine's words (its journal, an error it answered) may hold credentials: the host masked
    # those it knows of; here every value this run knows, and any secret-named value, before
    # anything prints or records it.
    for field in ("reason", "journal"):
        if isinstance(result.get(field), str):
            result[field] = redact.engine_text(result[field])
    return result


def gate_once(host, unit: str, address: str, port: int, timeout: int, smoke: bool,
              config_file: str, spec: dict | None = None) -> dict:
    """One pass of the gate's host script for `unit` on `port`, without this operation's records or
    rollback: for a unit the deploy starts beside a replica (operations/service/surge.py)."""
    return _wait_once(host, unit, address, port, timeout, smoke, config_file, spec)


def _soaked(host, unit: str, service: str, address: str, port: int, smoke: bool, config_file: str,
            soak_s: int) -> dict:
    """A canary's soak: `soak_s` seconds after its gate it must still serve (/health 200 and a
    completion)."""
    host.log(f"{service}: canary: soaking {soak_s} s before the rest of the rollout")
    gevent.sleep(soak_s)
    result = _wait_once(host, unit, address, port, 30, smoke, config_file)
    if not result["ok"]:
        result["reason"] = (f"it passed its gate but failed {soak_s} s later, in the canary's "
                            f"soak: {result['reason']}")
    return result


def ready_by_text(result: dict) -> str:
    """Which endpoint proved readiness, in words: `/ready`, or `/health` where the engine has no
    `/ready` (empty for an answer that does not say)."""
    by = result.get("ready_by")
    return f" (by {by})" if by else ""


def spec_text(spec: dict | None) -> str:
    """What a speculative service's gate proved, in words (empty for another service)."""
    if not spec:
        return ""
    accept = (f"accept length {spec['accept_length']:.2f} ({spec['accept_source']})"
              if spec.get("accept_length") is not None else spec.get("accept_source", ""))
    if not spec.get("lossless"):
        return f"; {accept}; its tokens NOT checked against its target (lossless_check: false)"
    return (f"; its target's own tokens over {spec['checked_tokens']} tokens of {spec['probes']} "
            f"probes ({spec['near_ties']} near-ties); {accept}")


def _against_old_version(state, host, service: str, result: dict, spec: dict,
                         baseline: Baseline) -> dict:
    """A canary that passed its gate, against a replica still on the old version, on the same
    probes: a regression fails it (its rollback and the rollout's halt follow); a baseline that
    cannot be asked is said, and the canary's own gate stands."""
    old_host = state.inventory.get_host(baseline.host)
    old = _wait_once(old_host, baseline.unit, baseline.address, baseline.port, 30, False,
                     baseline.config_file, {**spec, "baseline_only": True})
    where = f"{baseline.host}/{baseline.replica}"
    if not old["ok"] or not old.get("spec"):
        host.log_styled(f"{service}: canary NOT compared with {where} (old version): "
                        f"{old.get('reason', 'no figures')}", fg="yellow", log_func=logger.warning)
        return result
    figures = side_by_side(result["spec"], old["spec"])
    why = canary_regression(result["spec"], old["spec"], spec["accept_drop"], spec["slowdown"])
    if why:
        return {"ok": False, "journal": "",
                "reason": f"the canary regressed against {where}, still on the old version: {why} "
                          f"({figures})"}
    host.log(f"{service}: canary against {where} (old version): {figures}")
    return result


def _wait(state, host, unit: str, service: str, endpoint: str, address: str, port: int,
          timeout: int, smoke: bool, config_file: str, plan=None, rollout: str = "",
          soak_s: int = 0, spec: dict | None = None, baseline: Baseline | None = None) -> bool:
    result = _wait_once(host, unit, address, port, timeout, smoke, config_file, spec)
    if result["ok"] and plan is not None and soak_s:
        ready_s, ready_by = result.get("ready_s"), result.get("ready_by")
        result = {**_soaked(host, unit, service, address, port, smoke, config_file, soak_s),
                  "spec": result.get("spec")}
        result["ready_s"], result["ready_by"] = ready_s, ready_by
    if result["ok"] and plan is not None and baseline is not None and result.get("spec"):
        result = _against_old_version(state, host, service, result, spec, baseline)
    if result["ok"]:
        reply = f", smoke reply {result['reply']!r}" if result.get("reply") is not None else ""
        proved = spec_text(result.get("spec"))
        by = ready_by_text(result)
        host.log(f"{service}: ready in {result['ready_s']} s on {endpoint}{by}{reply}{proved}")
        accept = (result.get("spec") or {}).get("accept_length")
        record(host, service, endpoint, "ready", f"{result['ready_s']} s after (re)start"
               + by + (f", accept {accept:.2f}" if accept is not None else ""))
        return True
    # no later wave restarts another replica of this service; the host fails after its waves
    if rollout:
        rollouts.halt(host.state, rollout, f"{host.name}/{service}", result["reason"])
        rollouts.gate_failed(host.state, host.name, service, result["reason"][:200])
    host.log_styled(f"{service}: NOT READY: {result['reason']}", fg="red", log_func=logger.error)
    journal = result.get("journal") or ""
    if journal:
        host.log(f"{service}: last journal lines of {unit}:\n"
                 + "\n".join(f"    {line}" for line in journal.splitlines()), log_func=logger.error)
    if plan is None:
        record(host, service, endpoint, "FAILED", result["reason"])
        return False
    done, error = rollback.undo(host, plan)
    if error:
        host.log_styled(f"{service}: NOT ROLLED BACK: {error}", fg="red", log_func=logger.error)
        record(host, service, endpoint, "FAILED",
               f"{result['reason']}; not rolled back: {error}")
        return False
    again = _wait_once(host, unit, address, port, timeout, smoke, config_file)
    restored = ("the restored service is ready" if again["ok"]
                else f"the restored service is NOT ready either: {again['reason']}")
    host.log_styled(
        f"{service}: ROLLED BACK {', '.join(done)} because the change failed readiness "
        f"({result['reason']}); {restored}",
        fg="yellow" if again["ok"] else "red", log_func=logger.error,
    )
    state_word = "ROLLED BACK" if again["ok"] else "FAILED"
    record(host, service, endpoint, state_word,
           f"change failed ({result['reason'][:80]}); {restored}")
    return False


def _gate(state, host, unit: str, service: str, *args, rollout: str = "", soak_s: int = 0,
          spec: dict | None = None, baseline: Baseline | None = None) -> bool:
    """The gate as an operation runs it: a replica of a rollout that fails is recorded by `_wait`,
    and its host fails after its waves (`rollout.gates_passed`), so the wave's other gates there
    still run (each with its own rollback).

    A gate that ends without a verdict (the connection dropped, a timeout, any error) halts its
    rollout too, before the error fails the host: no later wave restarts another replica of a
    service whose replica was never seen serving."""
    try:
        passed = _wait(state, host, unit, service, *args, rollout=rollout, soak_s=soak_s,
                       spec=spec, baseline=baseline)
    except BaseException as exc:
        if rollout:
            reason = redact.engine_text(
                f"its readiness gate ended without a verdict ({type(exc).__name__}: {exc})")
            rollouts.halt(host.state, rollout, f"{host.name}/{service}", reason)
            rollouts.gate_failed(host.state, host.name, service, reason[:200])
        raise
    return passed or bool(rollout)


@operation()
def ready(
    service: str,
    unit: str,
    bind: str,
    port: int,
    timeout: int,
    smoke: bool = True,
    config_file: str | None = None,
    open_to_all: bool = False,
    restarted: Callable[[], bool] | None = None,
    rollback_plan=None,
    inputs: tuple[str, ...] = (),
    rollout: str = "",
    held: Callable[[], str | None] | None = None,
    soak_s: int = 0,
    spec: dict | None = None,
    baseline: Baseline | None = None,
):
    """
    Require ``unit`` to serve: ``/ready`` answers 200 (``/health`` on an engine without
    ``/ready``), and one chat completion succeeds.

    + service: the service's name (for messages and the summary)
    + unit: its systemd unit
    + bind: the address it binds; probed from the host itself
    + port: its port
    + timeout: seconds a (re)started service may take to become ready
    + smoke: send one chat completion once healthy
    + config_file: the service's root-only `--config` file: the smoke request reads its API key
      there, on the host
    + open_to_all: the service binds beyond loopback without a key (the summary says so)
    + restarted: callable, true when this run (re)started the unit: then always wait
    + inputs: host paths read with the service's state (see `changed_since_start`); the same
      arguments, so one read (host_reads)
    + rollback_plan: a `rollback.Restorable`: when the restarted service fails, undo this run's
      changes to it (previous unit, previous venv generations), restart, confirm readiness
    + rollout: the service this replica belongs to: a failure halts its rollout (report/rollouts.py)
    + held: callable, why this replica was kept on its old version (its rollout halted), or None
    + soak_s: after a (re)start passed the gate, it must still serve this many seconds later (a
      canary)
    + spec: a speculative service's check after a (re)start (`speculative_check`): its greedy
      tokens are its target's, its acceptance at least its floor
    + baseline: a canary's replica still on the old version (`Baseline`): once the canary passed,
      its probe figures are compared with that replica's (`canary_regression`)

    **Example:**

    .. code:: python

        readiness.ready(
            name="sglang-ddtree is ready",
            service="ddtree", unit="sglang-ddtree.service", bind="127.0.0.1", port=30000,
            timeout=1800,
        )
    """
    address = probe_address(bind)
    endpoint = endpoint_text(bind, port, open_to_all)
    # Whether this run (re)started the unit is known only while executing
    # (operations/run/this_run.py); a dry run or the change check before execution judges by the
    # service's current answer.
    just_started = this_run.changed(restarted)
    why_held = held() if held is not None and this_run.executing() and not just_started else None
    if why_held:
        rollouts.record_held(host.state, rollout, f"{host.name}/{service}")
        record(host, service, endpoint, "HELD", f"old version kept: {why_held}")
    if not just_started:
        # The verdict that it serves is the run's last word on it (and a removal on another host may
        # follow it): an answer from the host's read at the lock that is older than
        # VERDICT_MAX_AGE_S is read again.
        host_reads.fresh(host, ServiceState, VERDICT_MAX_AGE_S)
        state = service_state(unit, address, port, inputs)
        if state["active"] == "active" and state["health"] == 200:
            if not why_held:
                record(host, service, endpoint, "ready", already(state))
            host.noop(f"service {service} answers /health on port {port}")
            return
    yield FunctionCommand(
        _gate, (unit, service, endpoint, address, port, timeout, smoke, config_file or "-",
                rollback_plan if just_started else None),
        {"rollout": rollout, "soak_s": soak_s, "spec": spec, "baseline": baseline})


def changed_since_start(unit: str, bind: str, port: int, inputs: tuple[str, ...]) -> list[str]:
    """Inputs of a running service that changed in content since it started (read now, before this
    run changes anything).

    Its unit file, venv link, staged models' markers and key file are only rewritten when they
    change, and a change restarts the service in the same run; an input whose content differs
    from the record written at that restart (`lifecycle.running`) means a run stopped in between,
    so this run restarts it. A `touch`, or a file dropped beside a staged model, changes no
    identity (operations/service/on_host/service_state.py). Without a record for the running
    process, inputs modified after it started count as changed (the rule before records existed).
    """
    return list(service_state(unit, probe_address(bind), port, inputs).get("newer") or [])
