"""Stand up and keep converged the SGLang services placed on each host.

    pyinfra inventory.py deploy.py          # real hosts
    pyinfra lab/inventory.py deploy.py -y   # the local lab (make demo)

Each step is a component in deploys/ (a pyinfra @deploy; its operations are named
`<Component> | <operation>`), each operation idempotent: nothing changes on a converged host.
"""

from pyinfra import host, state

from deploys.cleanup import cleanup
from deploys.environments import environments
from deploys.gpu_check import gpu_check
from deploys.models import models
from deploys.plan import plan_host
from deploys.run import HostRun
from deploys.service import (
    gated,
    gates_checked,
    restarted,
    service,
    surge_removed,
    surge_started,
    wave_opened,
)
from deploys.service_account import service_account
from operations.gpu import gpus
from operations.run import host_reads
from operations.service import converged, rollout
from operations.transport import peer_keys
from report import plan_view

# The validated data (a bad value anywhere stops the run before any host is touched), then the
# run's machinery: the summary, the host's one read, its lock, the timers, the plan view.
run = HostRun.of(host)
run.deploying(state)
config, stack, patch_sets = run.config, run.stack, run.patch_sets
# One-time keys a run that died left between hosts: removed by the next run that holds the host
# (operations/transport/peer_keys.py), from the same read.
peer_keys.swept(host, host.log)

# Plan: every step's decision from the host's one read (deploys/plan.py: each step plans in its own
# module, with the deciders its operations apply). A host with nothing to do gets no step operation
# at all; --dry and PLAN_JSON print it.
gpu_decisions = gpus.plan_for_host(config, stack)
plan = plan_host(host.name, gpu_decisions, stack, patch_sets,
                 read=host_reads.reader(run.host))
plan_view.record(state, plan.record())
rollouts = rollout.fleet(run.inventory)
plan_view.record_rollouts(state, {name: r.described() for name, r in rollouts.items()})
if plan.converged:
    converged.record(host, gpu_decisions, plan)
else:
    config = gpu_check(gpu_decisions).config  # `gpu: auto` and `attention-backend: auto` resolved
    envs = environments(config, stack, patch_sets, gpu_decisions.probe_args(), plan.values)
    copies = models(config)
    device_groups = service_account(config)
    # Every replica prepared (key file, flags through the engine's parser) before the first restart;
    # then the rollout's waves, the same list on every host (operations/service/rollout.py): a
    # wave's restarts, then its gates.
    prepared = {placed.name: service(config, placed, stack, patch_sets,
                                     envs[placed.environment.path], copies, device_groups,
                                     gpu_decisions.after_staging.get(placed.name, {}),
                                     arch=gpu_decisions.arch_of(placed),
                                     starts=plan.restarts(placed.name))
                for placed in config.services}
    waves = rollout.host_waves(rollouts, host.name)
    for number, wave in host.loop(enumerate(waves, start=1)):
        wave_opened(number, len(waves))
        # Before a restart, who serves now (asked afresh each wave): a restart that would leave
        # fewer replicas serving than the data allows is held (operations/service/rollout.py
        # `Hold`).
        probe = rollout.probe_of(state, run.inventory)
        restarts = {name: plan.restarts_running(name) for name, _ in wave}  # the plan's, read once
        # A replica the plan surges (operations/service/surge.py) keeps serving through its restart.
        surges = {name: plan.values.get(("surge", name)) for name, _ in wave}
        held = {name: rollout.hold_reason(state, prepared[name].service, host.name,
                                          rollouts[prepared[name].service.definition], probe,
                                          planned=restarts[name] and not surges[name])
                for name, _ in wave}
        for name, _ in wave:
            if surges[name]:
                held[name] = surge_started(config, prepared[name], held[name], surges[name],
                                           stack, patch_sets, device_groups)
            restarted(prepared[name], held[name], restarts[name])
        # a canary's soak: it must keep serving that long before the next wave
        # and, against a replica still on the old version, its probe figures
        for name, canary in wave:
            service_ = prepared[name].service
            gated(config, prepared[name], held[name], plan.restarts(name),
                  soak_s=service_.canary_soak_s if canary else 0,
                  old_replica=(rollout.old_replica(rollouts[service_.definition], run.inventory)
                               if canary else None))
        for name, _ in wave:
            left = plan.values.get(("surge left", name))  # one an earlier run left running
            if surges[name] or left:
                surge_removed(prepared[name], surges[name] or left, leftover=left is not None)
    gates_checked()
    cleanup(config, stack, patch_sets)
