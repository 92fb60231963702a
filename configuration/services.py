"""One service: its definition (`services.<name>`) merged with the host's overrides
(`run_services`), validated as a `ServiceSpec` (configuration/schema.py), then judged by the rules
that need more than one value: a port the sandbox can bind, a draft other than the target, its
secrets (configuration/secrets.py), its patch sets (configuration/patch_set_fit.py), its engine
flags (configuration/service_args.py) and its exposure (configuration/exposure.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from configuration import engine_flags, engine_paths, schema
from configuration.errors import DataError
from configuration.exposure import exposure_needs_a_key, listens_beyond_loopback
from configuration.group_files import SERVICE_KEYS
from configuration.kinds_base import SERVICE_TEXT_MAX
from configuration.patch_set_fit import check_patch_sets, served_backends
from configuration.refusals import require, validated
from configuration.secrets import resolve_secret
from configuration.service_args import advisories_refused, check_arg_values, resolve_args
from configuration.typed import ModelUse, Service, environment_for


@dataclass(frozen=True)
class ServiceContext:
    """What a service's rules read besides its own keys."""

    data: schema.GroupData
    engine_version: str | None
    secrets_file: Path
    src: str  # where `services` was set
    override_src: str  # where `run_services` was set
    pins: dict[str, str] = field(default_factory=dict)  # the stack's distribution -> version


def validated_service(ctx: ServiceContext, name: str, definition: dict[str, Any],
                      overrides: dict[str, Any], replica: str | None = None,
                      override_path: str | None = None) -> Service:
    """Service `name` (one replica of it: `replica`, by default the service's own name) with this
    host's overrides."""
    spec, origin = _merged(ctx, name, definition, overrides, override_path)

    def at(key: str) -> tuple[str, str, Any]:
        return origin[key][0], origin[key][1], getattr(spec, key)

    gpus = (() if spec.gpu == "auto"
            else ((spec.gpu,) if isinstance(spec.gpu, int) else tuple(spec.gpu)))
    # The unit's sandbox has no capabilities: the engine could not bind a port below 1024, and the
    # readiness check would talk HTTP to whatever already listens there (sshd on 22).
    require(spec.port >= 1024, *at("port"),
            "is a privileged port (below 1024): the service runs without capabilities and could "
            "not bind it; use a port from 1024 to 65535, e.g. 30000")
    target, draft = _models(ctx, spec, at)
    secrets = {key: resolve_secret(getattr(spec, key), ctx.secrets_file, *origin[key])
               if getattr(spec, key) is not None else None
               for key in ("api_key_secret", "admin_api_key_secret")}
    api_key, admin_key = secrets["api_key_secret"], secrets["admin_api_key_secret"]
    if api_key and admin_key and api_key.reveal() == admin_key.reveal():
        raise DataError(*origin["admin_api_key_secret"], spec.admin_api_key_secret,
                        f"holds the same value as api_key_secret ({spec.api_key_secret}): every "
                        "client that may query the service could also administer it (pause, flush, "
                        "reload weights): give the admin key a value of its own")
    patch_sets = tuple(spec.patch_sets)
    check_patch_sets(*at("patch_sets")[:2], patch_sets, ctx.data.stack, ctx.pins)
    args = _judged_args(ctx, at, origin["args"], gpus, patch_sets)
    # What the engine loads is root's or the service's (configuration/engine_paths.py); the models
    # the deploy stages into the shm dir are root's.
    staged = [m.load_path for m in (target, draft) if m is not None and m.location == "shm"]
    engine_paths.check(origin["args"][0], [(a.key_path, a.value) for a in args], staged)
    engine_paths.check(origin["env"][0],
                       [(f"{origin['env'][1]}.{name}", value) for name, value in spec.env.items()],
                       staged)
    _within_the_command_line(origin["args"], args, spec.env)
    listening = listens_beyond_loopback(at("bind"), args)
    exposure_needs_a_key(listening, secrets["api_key_secret"], spec.allow_unauthenticated)
    return Service(
        name=replica or name,
        definition=name,
        spec=spec,
        environment=environment_for(ctx.data.venv_path, patch_sets),
        gpus=gpus,
        target=target,
        draft=draft,
        patch_sets=patch_sets,
        args=tuple((a.flag, a.value) for a in args),
        env=tuple(spec.env.items()),
        api_key=secrets["api_key_secret"],
        admin_api_key=secrets["admin_api_key_secret"],
        listens_beyond_loopback=tuple((where, why) for (_, where, _value, why) in listening
                                      if where != origin["bind"][1]),
        canary=spec.canary if isinstance(spec.canary, int) else tuple(spec.canary),
    )


def _merged(ctx: ServiceContext, name: str, definition: dict[str, Any],
            overrides: dict[str, Any], override_path: str | None
            ) -> tuple[schema.ServiceSpec, dict[str, tuple[str, str]]]:
    """The service's definition with this host's overrides, validated by the schema, and where each
    key came from (file, key path)."""
    base_path = f"services.{name}"
    origin = {key: (ctx.src, f"{base_path}.{key}") for key in SERVICE_KEYS}
    merged = {**definition}
    for key, value in overrides.items():
        merged[key] = value
        origin[key] = (ctx.override_src, f"{override_path or f'run_services.{name}'}.{key}")
    # A required key given as null is missing, as if it were not written.
    merged = {k: v for k, v in merged.items() if not (SERVICE_KEYS[k].required and v is None)}
    spec: schema.ServiceSpec = validated(
        schema.ServiceSpec, merged, lambda key: origin.get(key, (ctx.src, f"{base_path}.{key}")))
    return spec, origin


def _models(ctx: ServiceContext, spec: schema.ServiceSpec, at) -> tuple[ModelUse, ModelUse | None]:
    """The target and the draft, each with the directory it is loaded from."""
    target = _model_use(ctx.data, spec.model, spec.model_in)
    draft = (_model_use(ctx.data, spec.draft_model, spec.draft_in)
             if spec.draft_model is not None else None)
    if draft is not None and draft.name == target.name:
        raise DataError(*at("draft_model"), f"the draft model is the target model ({target.name}): "
                                            "name the smaller draft model (e.g. "
                                            "Qwen3.6-27B-DFlash), or null for no speculative "
                                            "decoding")
    return target, draft


def _judged_args(ctx: ServiceContext, at, args_origin: tuple[str, str], gpus: tuple[int, ...],
                 patch_sets: tuple[str, ...]) -> list:
    """`args` as the engine's parser (with the service's patch sets) reads them, each judged: its
    value, the backends its patch sets served on, the engine advisories the data decides."""
    engine = engine_flags.for_engine(ctx.engine_version, patch_sets)
    # Unknown flags are judged only against a whole flag list: a patch set without its own (a copy,
    # a new set) may add some.
    whole = (engine is not None
             and all(engine_flags.load(ctx.engine_version, p) is not None for p in patch_sets))
    args = resolve_args(*at("args"), engine, ctx.engine_version if whole else None,
                        judge_unknown=whole)
    check_arg_values(args_origin[0], args, gpus, patch_sets, engine, ctx.engine_version)
    served_backends(*args_origin, args, patch_sets)
    advisories_refused(*args_origin, args, engine, ctx.engine_version, patch_sets)
    return args


def _within_the_command_line(args_origin: tuple[str, str], args: list, env: dict) -> None:
    """Every value is bounded alone (VALUE_MAX); together they must fit the unit's line and the
    kernel's argv and environment, or the engine never starts."""
    total = (sum(len(str(a.flag)) + len(str(a.value)) + 4 for a in args)
             + sum(len(k) + len(str(v)) + 2 for k, v in env.items()))
    require(total <= SERVICE_TEXT_MAX, *args_origin,
            f"{len(args)} flags and {len(env)} variables",
            f"the service's flags and environment are {total} characters together: at most "
            f"{SERVICE_TEXT_MAX} fit its unit's command line and the kernel's argv and "
            "environment; put the long values in files and name the files")


def _model_use(data: schema.GroupData, model: str, location: str) -> ModelUse:
    store_path = f"{data.model_store}/{model}"
    load = f"{data.shm_dir}/{model}" if location == "shm" else store_path
    return ModelUse(model, location, store_path, load)
