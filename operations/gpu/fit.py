"""Whether a service fits its GPUs, by the GPU check's rules: the attention backend for their
compute capability (`backend`, the engine advisories' `engine_use`), its models' size against their
memory and `mem-fraction-static` (`memory`), the backends its patch sets were served on
(`served_backends`); and the check's refusal as data (`Refusal`). Pure: operations/gpu/gpus.py
decides with them, for a placed service and for a surge.
"""

from __future__ import annotations

import dataclasses

from configuration import advisories, engine_flags, patch_sets
from configuration.settings import Service
from operations.gpu.gpu_read import MIB, GpuFacts, int_or_none
from report.sizes import human_bytes


class Refusal(str):
    """An error of the GPU check, as text (`dflash: GPU 1 is in use ...`), and the service it is
    about as data (`service`; None: the host's own, which stops every service on it). Decided where
    the error is made, never read back from the text (a service may be named like the first word of
    a host's error)."""

    service: str | None

    def __new__(cls, service: Service, why: str) -> Refusal:
        made = super().__new__(cls, f"{service.name}: {why}")
        made.service = service.name
        return made


def arg(service: Service, flag: str):
    return dict(service.args).get(flag)


def engine_use(service: Service, engine: str | None) -> advisories.EngineUse:
    """`service` as the advisories judge it: its engine version, its flags as that engine's parser
    reads them, its patch sets."""
    return advisories.EngineUse(engine, dict(service.args),
                                engine_flags.for_engine(engine, service.patch_sets),
                                service.patch_sets)


def caps_of(service: Service, facts: GpuFacts) -> list[str]:
    return [facts.by_index()[i].compute_cap for i in service.gpus if i in facts.by_index()]


def backend(service: Service, facts: GpuFacts, engine: str | None,
             decisions: list[str]) -> Service:
    """`attention-backend: auto` resolved on this GPU: the backend an advisory that holds for
    sglang's default here prefers (files/engine_advisories.yml: FlashInfer's JIT on sm 12.x prefers
    triton), else sglang's default."""
    if arg(service, "attention-backend") != "auto":
        return service
    caps = caps_of(service, facts)
    use = engine_use(service, engine)
    held = [a for cap in caps for a in advisories.applying(use, cap, advisories.DEFAULT_BACKEND)
            if a.prefer]
    if held:
        args = [(f, held[0].prefer if f == "attention-backend" else v) for f, v in service.args]
        decisions.append(f"{service.name}: attention-backend auto -> {held[0].prefer} (sm "
                         f"{caps[0]}: {held[0].summary} [{held[0].id}])")
    else:
        args = [(flag, value) for flag, value in service.args if flag != "attention-backend"]
        shown = f"sm {caps[0]}" if caps else "GPU not known"
        decisions.append(f"{service.name}: attention-backend auto -> sglang's default ({shown})")
    return dataclasses.replace(service, args=tuple(args))


def memory(service: Service, facts: GpuFacts, decisions: list[str], warnings: list[str],
            errors: list[str]) -> None:
    gpus = [facts.by_index()[i] for i in service.gpus if i in facts.by_index()]
    totals = [g.memory_total_mib for g in gpus if g.memory_total_mib]
    if not totals:
        return
    sizes = {m.name: facts.model_bytes.get(m.store_path) for m in service.models}
    unknown = [name for name, size in sizes.items() if size is None]
    if unknown:
        decisions.append(f"{service.name}: size of {', '.join(unknown)} unknown (not in the model "
                         "store yet): GPU memory not checked")
        return
    tp = int_or_none(str(arg(service, "tp-size") or arg(service, "tp") or 1)) or 1
    need = sum(sizes.values()) / tp
    total = min(totals) * MIB
    gpu_text = (f"GPU {service.gpus[0]}" if len(service.gpus) == 1
                else f"GPUs {','.join(map(str, service.gpus))}")
    models = " + ".join(f"{name} {human_bytes(size)}" for name, size in sizes.items())
    per = f"{human_bytes(need)} per GPU ({models}{f', tp {tp}' if tp > 1 else ''})"
    fraction = arg(service, "mem-fraction-static")
    if need > total:
        errors.append(Refusal(service, f"models need {per}, {gpu_text} has {human_bytes(total)}: "
                                       f"short by {human_bytes(need - total)}; use more GPUs "
                                       "(tp-size) or a smaller model"))
        return
    if fraction is None:
        if need > 0.9 * total:
            warnings.append(f"{service.name}: models take {need / total:.0%} of {gpu_text}'s "
                            f"{human_bytes(total)} ({per}): little or no room for the KV cache "
                            "once sglang sizes mem-fraction-static itself")
        else:
            decisions.append(f"{service.name}: models {per} fit {gpu_text} ({human_bytes(total)}; "
                             "mem-fraction-static: sglang's choice)")
        return
    try:
        fraction = float(fraction)
    except ValueError:
        errors.append(Refusal(service, f"mem-fraction-static {fraction!r} is not a number"))
        return
    pool = fraction * total
    if need > pool:
        wanted = need / total
        errors.append(Refusal(service, f"models need {per}, mem-fraction-static {fraction} of "
                                       f"{gpu_text}'s {human_bytes(total)} gives "
                                       f"{human_bytes(pool)}: short by {human_bytes(need - pool)}; "
                                       f"raise mem-fraction-static to more than {wanted:.2f} (and "
                                       "leave room for the KV cache)"))
    elif pool - need < 0.1 * pool:
        warnings.append(f"{service.name}: models {per} leave {human_bytes(pool - need)} "
                        f"({(pool - need) / pool:.0%}) of the static pool (mem-fraction-static "
                        f"{fraction} of {human_bytes(total)}) for the KV cache")
    else:
        decisions.append(f"{service.name}: models {per} fit mem-fraction-static {fraction} of "
                         f"{gpu_text} ({human_bytes(pool)}), {human_bytes(pool - need)} left for "
                         "the KV cache")


def served_backends(service: Service, facts: GpuFacts, errors: list[str]) -> None:
    """The backend `attention-backend: auto` resolved to on this host's GPU, held to the service's
    patch sets' served backends (configuration.patch_sets.unserved_backend). The control machine
    checked every backend the data names; only `auto` waits for the GPU."""
    unserved = patch_sets.first_unserved(service.patch_sets, dict(service.args))
    if unserved is None:
        return
    caps = [facts.by_index()[i].compute_cap for i in service.gpus if i in facts.by_index()]
    shown = (arg(service, "attention-backend")
             or f"sglang's default on {'sm ' + caps[0] if caps else 'this GPU'}")
    what = f"`attention-backend: auto` gives {shown} here"
    errors.append(Refusal(service, patch_sets.unserved_reason(*unserved, what=what)))
