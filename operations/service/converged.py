"""A host whose plan is empty: the run adds no step operation there (deploy.py), and says so here.

Its services' rows in the end-of-run summary come from the same `ServiceState` read the plan judged
them by (deploys/service.py: running, enabled, its inputs unchanged since it started, `/health`
200 from a socket of its own unit), as the readiness gate would have written them.
"""

from __future__ import annotations

from operations.gpu import gpus
from operations.run import host_reads
from operations.run.plan import HostPlan
from operations.service import readiness
from operations.service.service_inputs import watched_inputs
from report.summary import record as summary_record


def record(host, decisions, plan: HostPlan) -> None:
    """Show the GPU decisions (as the check's operation would), log that `host` is converged, and
    write each of its services' summary row. `decisions`: the GPU check's (`gpus.GpuDecisions`), its
    config with `auto` resolved."""
    gpus.show(host, decisions)
    config = decisions.config
    for service in config.services:
        state = host_reads.get(host, readiness.ServiceState, unit=service.unit_name,
                               address=readiness.probe_address(service.bind), port=service.port,
                               inputs=watched_inputs(service, service.unit_path))
        endpoint = readiness.endpoint_text(service.bind, service.port, service.exposed_without_key)
        summary_record(host, service.name, endpoint, "ready",
                       readiness.already(state if isinstance(state, dict) else {}))
    placed = f"{len(config.services)} service(s)" if config.services else "nothing placed"
    host.log(f"converged ({placed}): the read shows nothing to change; no operation added")

