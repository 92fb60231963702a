"""The operators' data as typed models: every key, its kind, its default and its documentation.

Three models, one per table of docs/variables.md (generated from them, see `readme_tables`; a unit
test fails when docs/variables.md and the schema differ): `GroupData` (keys any group, or a host,
may set), `HostData` (keys of the inventory's hosts) and `ServiceSpec` (the keys of
`services.<name>`, after a host's `run_services` overrides). Models are strict (no string read as a
number, no bool as an int) and forbid unknown keys; each field's type is a kind of value from
configuration/kinds.py, which checks the whole value and says how to fix it; a value of several
shapes (a stack source, a model source, `run_services`, an engine flag's value) is a union read by
its shape (`kinds.one_of`). What only several values together can show (paths apart from each other,
a name that must be a host of the inventory or a defined service, engine flags resolved as the
engine resolves them, exposure, clashes between services) is checked on the validated models by the
modules configuration/settings.py calls (host.py, sources.py, placement.py, services.py,
service_args.py, ...).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Optional

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, create_model

from configuration import kinds
from configuration.kinds import (
    AcceptLength,
    ArgMap,
    Bool,
    Canary,
    EnvName,
    EnvValue,
    FailedGpus,
    Fraction,
    Gpus,
    IndexUrl,
    IpAddress,
    MaxSurge,
    MaxUnavailable,
    ModelName,
    ModuleName,
    PatchSetName,
    Port,
    SecretName,
    ServiceName,
    ServiceUserName,
    ShmDir,
    Text,
    TrustedHostPath,
    choice,
    one_of,
    refuse,
    seconds,
    whole_number,
)

STRICT = ConfigDict(strict=True, extra="forbid", frozen=True)


def var(default: Any = None, doc: str = "", when: str = "", kind: str = "",
        required: bool = False) -> Any:
    """A field with what the variables table (docs/variables.md) says of it: the kind's name, what
    it does, when to change it."""
    extra = {"when": when, "kind": kind, "required": required}
    if required:
        return Field(description=doc, json_schema_extra=extra)
    return Field(default=default, description=doc, json_schema_extra=extra)


def shaped(container: type, fix: str) -> BeforeValidator:
    """The container itself (a map, a list) is refused with `fix`; its items keep their own rules
    and key paths."""

    def check(value: Any) -> Any:
        if not isinstance(value, container):
            raise refuse(fix)
        return value

    return BeforeValidator(check)


def _unique(what: str):
    def check(items: list) -> list:
        if len(set(items)) != len(items):
            raise refuse(f"names a {what} twice; list each once")
        return items

    return AfterValidator(check)


def _env_names_allowed(env: dict[str, str]) -> dict[str, str]:
    """Names the unit derives, or that steer a loader or interpreter, and credentials in values:
    refused at `env.<NAME>`, showing the value as set."""
    for name, value in env.items():
        reason = kinds.env_name_refusal(name)
        if reason:
            raise refuse(reason, shown=value, at=name)
        if kinds.credential_env_name(name):
            raise refuse(f"`{name}` names a credential: " + kinds.SECRETS_FIX,
                         shown="<hidden>", at=name)
    return env


EnvMap = Annotated[dict[EnvName, EnvValue],
                   shaped(dict, "must be a map of NAME -> value, e.g. `SGLANG_DDTREE_MAX_TOPK: 8`"),
                   AfterValidator(_env_names_allowed)]
PatchSets = Annotated[list[PatchSetName], shaped(list, kinds.PATCH_SETS_FIX), _unique("patch set"),
                      kinds.with_fix(kinds.PATCH_SETS_FIX)]
VerifyModels = choice("fast", "full",
                      fix="must be `fast` (names and sizes) or `full` (re-hash the staged files)")
VerifyEnv = choice("fast", "full", fix="must be `fast` (sizes, and files modified since the last "
                                       "install hashed) or `full` (hash every file)")
Installer = choice("auto", "uv", "pip",
                   fix="must be `auto` (uv when the wheelhouse ships it, else pip), `uv` or `pip`")
Location = choice("shm", "store",
                  fix="must be `shm` (staged into shm_dir) or `store` (loaded from model_store)")
STREAMS_FIX = "must be a whole number of streams, from 1 to 32"


def _streams(value: int) -> int:
    if not 1 <= value <= 32:
        raise refuse(STREAMS_FIX)
    return value


TransferStreams = Annotated[kinds.Int, AfterValidator(_streams), kinds.with_fix(STREAMS_FIX)]


def control_path(what: str) -> Any:
    """A path on the control machine (read there, never written into a unit): one line, not
    empty."""
    fix = f"must be a {what} path on the control machine"
    return Annotated[Text, kinds.matching(r"[^\x00-\x1f\x7f]{1,4096}", fix), kinds.with_fix(fix)]


ControlDir = control_path("directory")
ControlFile = control_path("file")
# A host of the inventory, by its inventory name: which hosts there are is the inventory's
# (configuration/sources.py).
InventoryHost = Annotated[Text, kinds.with_fix("must name a host of the inventory")]


# Where a host's stack and models come from --------------------------------------------------------

STACK_SOURCES_FIX = ("must be a non-empty list of `wheelhouse`, `{index: https://...}` and "
                     "`{donor: <inventory host>}` entries, tried in order")


class IndexSource(BaseModel):
    """`{index: URL}`: the host downloads the stack's files from a package index (hashes
    required)."""

    model_config = STRICT

    index: IndexUrl


class DonorSource(BaseModel):
    """`{donor: HOST}`: installed distributions copied from that host's live venv; with `path`, from
    the venv at that path on that host (this one included)."""

    model_config = STRICT

    donor: InventoryHost
    # Root copies the donor venv's files into its own: the donor venv is trusted like venv_path.
    path: Optional[TrustedHostPath] = None


def _non_empty_list(fix: str) -> BeforeValidator:
    def check(value: Any) -> Any:
        if not isinstance(value, list) or not value:
            raise refuse(fix)
        return value

    return BeforeValidator(check)


StackSource = one_of(STACK_SOURCES_FIX,
                     (lambda v: v == "wheelhouse", Literal["wheelhouse"]),
                     (lambda v: isinstance(v, dict) and list(v) == ["index"], IndexSource),
                     (lambda v: isinstance(v, dict) and "donor" in v
                      and set(v) <= {"donor", "path"}, DonorSource))
StackSources = Annotated[list[StackSource], _non_empty_list(STACK_SOURCES_FIX)]


def _is_path(value: Any) -> bool:
    return isinstance(value, str) and ("/" in value or value.startswith("."))


# A model streamed from a host of the inventory, or from a directory on the control machine (a path:
# it holds `/` or starts with `.`).
ModelSource = one_of("must name a host of the inventory or the model's directory on the control "
                     "machine (a path that exists here)",
                     (_is_path, ControlDir),
                     (lambda v: isinstance(v, str), InventoryHost))
ModelSources = Annotated[dict[ModelName, ModelSource],
                         shaped(dict, "must be a map of model name -> inventory host name")]


class GroupData(BaseModel):
    """Keys any group (or host) may set. Defaults mirror the hand-run deployment this replaces."""

    model_config = STRICT

    stack: Annotated[Text, kinds.matching(kinds.STACK_NAME, "unknown stack")] = var(
        "sglang-0.5.23-cu130",
        "Named, pinned package set for the serving venv (a file in `files/stacks/`).",
        "another engine release or CUDA build", "stack name")
    venv_path: TrustedHostPath = var(
        "/root/venv_sglang", "Serving virtualenv on the host.", "hosts with another layout",
        "host path (root's)")
    model_store: TrustedHostPath = var(
        "/root/models", "Directory on the host holding the models (the durable copy).",
        "models kept elsewhere", "host path (root's)")
    shm_dir: ShmDir = var(
        "/dev/shm", "RAM disk the services load `shm` models from; emptied on reboot.",
        "another tmpfs", "host path")
    verify_models: VerifyModels = var(
        "fast", "How staged models are checked: `fast` (names, sizes and mtimes against the "
                "manifests; only staged files modified after staging are hashed) or `full` "
                "(re-hash every staged file, repair what differs).",
        "after a suspected memory or disk fault: `--data verify_models=full`", "`fast` or `full`")
    verify_env: VerifyEnv = var(
        "fast", "How venvs are checked against each distribution's RECORD: `fast` (sizes; files "
                "modified after the deploy's last install into the generation are hashed) or "
                "`full` (the sha256 of every file); what differs is reinstalled from its wheel.",
        "after a suspected disk fault or a hand edit that kept mtimes: `--data verify_env=full`",
        "`fast` or `full`")
    wheelhouse: ControlDir = var(
        "wheelhouse", "Directory on the control machine with the stack's wheel files (relative to "
                      "the deploy dir).",
        "fill it with `python -m tools.wheelhouse STACK DIR`", "control-machine path")
    host_wheel_cache: TrustedHostPath = var(
        "/var/cache/sglang-deploy/wheels",
        "Where pushed wheels land on the host (uv and its cache live under it too).",
        "small root disk", "host path (root's)")
    stack_sources: StackSources = var(
        ["wheelhouse"], "Where the stack's files come from, tried in order per file: `wheelhouse` "
                        "(pushed from the control machine), `{index: URL}` (the host downloads, "
                        "hashes required) or `{donor: HOST}` (installed distributions copied from "
                        "that host's live venv).",
        "hosts that reach a package index or mirror; a new host beside one already serving the "
        "stack", "list of sources")
    installer: Installer = var(
        "auto", "What installs the stack on the host: `auto` (uv when the wheelhouse ships it, "
                "else pip), `uv` or `pip`.",
        "a host where uv misbehaves", "`auto`, `uv` or `pip`")
    launcher: ModuleName = var(
        "sglang.launch_server", "Python module the unit runs (`python -m <launcher> <flags>`).",
        "the lab uses `sglang_standin.launch_server`", "module name")
    readiness_timeout_s: seconds(1, 86400) = var(
        1800, "Seconds a (re)started service may take to answer `/health` with 200.",
        "very large models, first JIT", "seconds")
    smoke_test: Bool = var(
        True, "After a (re)start, send one chat completion and require an answer.",
        "servers without chat templates", "boolean")
    lock_wait_s: seconds(0, 86400) = var(
        300, "Seconds a deploy waits for another deploy's lock on a host (holding no other lock "
             "meanwhile); then that host alone fails, naming the holder.",
        "long deploys by colleagues", "seconds")
    model_sources: ModelSources = var(
        {}, "Map model name -> where to stream it from when a host's store lacks it: an inventory "
            "host (e.g. the one a service moves away from) or a directory on the control machine.",
        "migrating to a host without the models", "map model name -> host or path")
    transfer_streams: TransferStreams = var(
        4, "How many OpenSSH streams at once carry bytes in bulk to a host: a model's files from "
           "`model_sources`, the wheels pushed from the wheelhouse (a file is never split between "
           "streams).",
        "more on fast links with cores to spare; fewer where the control machine or its uplink is "
        "shared", "whole number")
    service_user: ServiceUserName = var(
        "sglang", "Unix user the services run as: a system user the deploy creates (no login "
                  "shell, home `/var/lib/sglang`), in a systemd sandbox (see \"Service user and "
                  "sandbox\"); `root` runs them as root, in the same sandbox. Not a privileged or "
                  "shared account or group (`sudo`, `docker`, `adm`, `systemd-journal`, `nobody`, "
                  "...); where the account exists, it must be the deploy's own (its own group "
                  "alone, no other group, no login shell, not uid 0).",
        "`root` (per host, in the inventory) where the engine must run as root", "user name")
    secrets_file: ControlFile = var(
        ".secrets/secrets.yml", "Git-ignored YAML map secret name -> value on the control machine "
        "($SGLANG_DEPLOY_SECRET_<NAME> wins).", "keep secrets elsewhere", "control-machine path")
    services: ServiceMap = var(
        {}, "Map of service name -> service definition (keys below).", "always",
        "map service name -> service")


class HostData(BaseModel):
    """Keys that belong in the inventory's host data (pyinfra's own keys, `ssh_*` and the like, pass
    beside them)."""

    model_config = ConfigDict(strict=True, extra="ignore", frozen=True)

    run_services: RunServices = var(
        [], "Which services run on this host: a list of names, or a map name -> overrides of "
            "service keys (e.g. `gpu`, `port`), or name -> a list of overrides, one replica each "
            "(`dflash`, `dflash@2`, ...). A service placed on several hosts is one service with a "
            "replica on each. A service no longer listed is stopped, disabled and its unit removed "
            "(after the run's readiness gates, once another replica answers).",
        "placing or moving a service", "list or map of service names")
    failed_gpus: FailedGpus = var(
        [], "GPU indexes on this host that no service may use, whatever `nvidia-smi` says.",
        "a GPU that crashes but still looks healthy", "list of GPU indexes")


class ServiceSpec(BaseModel):
    """The keys of `services.<name>`, merged with the host's `run_services` overrides."""

    model_config = STRICT

    gpu: Gpus = var(
        doc="GPU index, or a list of indexes, the service uses (`CUDA_VISIBLE_DEVICES`); `auto`: "
            "the lowest healthy free GPU, then kept across runs (read back from the unit).",
        when="`auto` for a server that may go anywhere",
        kind="GPU index, list or `auto`", required=True)
    port: Port = var(
        doc="TCP port the server listens on, 1024 to 65535 (the sandbox grants no capability to "
            "bind lower).", kind="port",
        required=True)
    bind: IpAddress = var(
        "127.0.0.1", "Address the server binds (`--host`).",
        "serving other machines (put an API key in front)", "IP address")
    model: ModelName = var(doc="Target model: a directory name in `model_store`.",
                           kind="model name", required=True)
    model_in: Location = var(
        "shm", "Where the target is loaded from: `shm` (staged into `shm_dir`) or `store`.",
        "model larger than RAM", "`shm` or `store`")
    draft_model: Optional[ModelName] = var(
        None, "Draft model directory name in `model_store` (speculative decoding), or null.", "",
        "model name or null")
    draft_in: Location = var("store", "Where the draft is loaded from: `shm` or `store`.", "",
                             "`shm` or `store`")
    patch_sets: PatchSets = var(
        [], "Patch sets from `files/patches/` copied into the installed engine.", "DDTree",
        "list of patch set names")
    args: ArgMap = var(
        {}, "Map of sglang flag -> value, one `--flag value` line each; `true` = bare flag, "
            "`false`/null = omitted. `attention-backend: auto` becomes `triton` on compute "
            "capability 12.x and sglang's default elsewhere.",
        "tuning", "map engine flag -> value")
    env: EnvMap = var(
        {}, "Map of environment variables for the unit (not the ones the unit derives, steer a "
            "loader or interpreter, or name a credential).", "e.g. `SGLANG_DDTREE_MAX_TOPK`",
        "map env name -> value")
    api_key_secret: Optional[SecretName] = var(
        None, "Name of the secret holding the service's API key (`--api-key`, passed in a "
              "root-only `--config` file).",
        "any bind beyond loopback", "secret name or null")
    admin_api_key_secret: Optional[SecretName] = var(
        None, "Name of the secret holding the service's admin API key (`--admin-api-key`).",
        "admin endpoints", "secret name or null")
    allow_unauthenticated: Bool = var(
        False, "Allow listening beyond loopback without an API key (anyone who reaches the port "
               "can use it).",
        "a trusted, isolated network only", "boolean")
    stop_timeout_s: seconds(1, 3600) = var(
        60, "Seconds a stop of the service (a restart, a removal) waits for the engine to "
            "drain: systemd sends SIGTERM, sglang finishes the requests in flight, and what still "
            "runs after this long is killed (the unit's `TimeoutStopSec`).",
        "long generations that must not be cut by a restart", "seconds")
    max_unavailable: MaxUnavailable = var(
        1, "Replicas of the service that a rollout may have not serving at once: a number, or a "
           "percentage of its replicas (rounded down, at least 1). A change that restarts the "
           "service reaches its replicas in waves of this size, each wave gated by the readiness "
           "gate before the next (docs/replicas.md).", "many replicas, spare capacity",
        "number or percentage")
    max_surge: MaxSurge = var(
        0, "1: a rollout that restarts a replica first starts its new version beside the old one, "
           "on a GPU of its host that the GPU check finds free (and the lowest free port above "
           "its own), gates it, stops the old one (drained), restarts the replica on its own GPU "
           "and port, gates it, and only then stops the surge: the replica never stops serving. "
           "Where no GPU is free it restarts in place; 0: always in place (docs/replicas.md).",
        "spare GPUs, replicas that must not go down", "0 or 1")
    canary: Canary = var(
        0, "Replicas that go first in a rollout, alone in their wave: a count (the first ones in "
           "inventory order), or a list of `host` / `host/replica`. The rest wait until they "
           "passed their gates (and `canary_soak_s`).",
        "a change you want proven on one replica", "count or list")
    canary_soak_s: seconds(0, 86400) = var(
        0, "Seconds the canaries must keep serving after their gates before the rest of the "
           "rollout goes on.",
        "changes that fail under load, not at start", "seconds")
    lossless_check: Bool = var(
        True, "A speculative service's gate checks that its greedy output is its target's own, "
              "token by token, re-scored by the same server (docs/speculative-gate.md); `false` "
              "serves it unchecked (an engine that cannot re-score: DFLASH on sglang 0.5.13).",
        "an engine that cannot answer the check", "boolean")
    lossless_tokens: whole_number(1, 4096, "tokens") = var(
        64, "Tokens of each probe prompt that the lossless check decodes and compares.",
        "a longer proof at a slower gate", "tokens")
    canary_accept_drop: Fraction = var(
        0.1, "A canary of a speculative service whose acceptance over the gate's probes is lower "
             "than a replica's still on the old version by more than this fraction halts its "
             "rollout and is rolled back (docs/speculative-gate.md).",
        "drafts whose acceptance varies", "fraction")
    canary_slowdown: Fraction = var(
        0.25, "A canary whose single-request decode speed over the gate's probes is lower than the "
              "old version's by more than this fraction halts its rollout and is rolled back.",
        "noisy hosts", "fraction")
    min_accept_length: AcceptLength = var(
        1.5, "Accepted tokens per verify step, over the gate's probes, below which a speculative "
             "service fails its gate (its draft is not worth its GPU); 0: no floor.",
        "drafts you know to be weak, models with random weights", "number")


# A service's keys as a definition (`services.<name>`) or a placement's overrides (`run_services`) w
#
# ServiceSpec's keys and kinds, each optional: a required key may be given by the host's overrides
# instead; the merged service is validated as a ServiceSpec (configuration/services.py).

class _GivenKeys(BaseModel):
    model_config = STRICT

    def given(self) -> dict[str, Any]:
        """The keys written, with their validated values."""
        return self.model_dump(exclude_unset=True)


ServiceKeys = create_model(
    "ServiceKeys", __base__=_GivenKeys,
    __doc__="Some of a service's keys, each of its ServiceSpec kind.",
    **{name: (Optional[Annotated[(f.annotation, *f.metadata)]] if f.metadata
              else Optional[f.annotation], None)
       for name, f in ServiceSpec.model_fields.items()})


def _known_service_keys(value: Any, fix: str) -> Any:
    if not isinstance(value, dict):
        raise refuse(fix)
    for key in value:
        if key not in ServiceSpec.model_fields:
            raise refuse(f"unknown service key; allowed: {', '.join(ServiceSpec.model_fields)}",
                         shown=value[key], at=str(key))
    return value


def _definition(value: Any) -> Any:
    return _known_service_keys(
        value, "must be a map of service keys: " + ", ".join(ServiceSpec.model_fields))


def _overrides(value: Any) -> Any:
    """An empty value (`{dflash: null}`) overrides nothing."""
    return _known_service_keys(value, "overrides must be a map of service keys, e.g. {gpu: 1, "
                                      "port: 30001}") if value else None


ServiceDefinition = Annotated[ServiceKeys, BeforeValidator(_definition)]
ServiceMap = Annotated[dict[ServiceName, ServiceDefinition],
                       shaped(dict, "must be a map of service name -> service definition")]
Overrides = Annotated[Optional[ServiceKeys], BeforeValidator(_overrides)]
# Several replicas of a service on one host: a list of overrides, one per replica (each its own GPUs
# and port).
def _some_replica(items: list) -> list:
    if not items:
        raise refuse("places no replica: list one map of overrides per replica, or remove the "
                     "service from run_services")
    return items


ReplicaList = Annotated[list[Overrides], AfterValidator(_some_replica),
                        kinds.with_fix("must list one map of overrides per replica, e.g. "
                                       "[{gpu: 0, port: 30001}, {gpu: 1, port: 30002}]")]
Placement = one_of("must be a map of overrides (e.g. {gpu: 1, port: 30001}), null, or a list of "
                   "them, one per replica",
                   (lambda v: v is None or isinstance(v, dict), Overrides),
                   (lambda v: isinstance(v, list), ReplicaList))
# A name in `run_services` (a string: whether a service of that name is defined is checked where the
# host's services are built, configuration/host.py).
PlacedName = Annotated[Text, kinds.with_fix("must name a service defined in `services`")]
RunServices = one_of("must be a list of service names or a map name -> overrides (e.g. {dflash: "
                     "{gpu: 1, port: 30001}})",
                     (lambda v: isinstance(v, list),
                      Annotated[list[Text], _unique("service"), kinds.with_fix(
                          "must list service names, e.g. `[ddtree, dflash]`")]),
                     (lambda v: isinstance(v, dict), dict[PlacedName, Placement]))

GroupData.model_rebuild()
HostData.model_rebuild()


# The variables tables (docs/variables.md) ---------------------------------------------------------

TABLES = (("Group data (`group_data/*.yml`)", GroupData), ("Host data (the inventory)", HostData),
          ("Service keys (`services.<name>.*`)", ServiceSpec))


def default_of(model: type[BaseModel], name: str) -> Any:
    field = model.model_fields[name]
    return None if field.is_required() else field.get_default(call_default_factory=True)


def shown_default(model: type[BaseModel], name: str) -> str:
    field = model.model_fields[name]
    if field.json_schema_extra.get("required"):
        return "(required)"
    default = default_of(model, name)
    if default is None:
        return "`null`"
    if isinstance(default, bool):
        return f"`{str(default).lower()}`"
    return f"`{default}`"


def table(model: type[BaseModel]) -> str:
    rows = ["| Name | Kind | Default | What it does | When to change it |", "|---|---|---|---|---|"]
    for name, field in model.model_fields.items():
        extra = field.json_schema_extra
        rows.append(f"| `{name}` | {extra['kind']} | {shown_default(model, name)} | "
                    f"{field.description} | {extra['when']} |")
    return "\n".join(rows)


def readme_tables() -> str:
    """docs/variables.md's tables, as the schema says them (`python -m configuration.schema` prints
    them)."""
    return "\n\n".join(f"{title}:\n\n{table(model)}" for title, model in TABLES)


if __name__ == "__main__":
    print(readme_tables())
