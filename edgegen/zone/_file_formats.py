"""The files edgegen writes and reads back: plan files and state files.

Each format is a pydantic model (``PlanFile``, ``StateFile``) with ``format`` and
``format_version`` fields, built from the same value types planning uses (``_plan``'s
changes, ``cloudflare._state``'s remote values), so a field is declared once. The JSON Schemas in
docs/schemas/ are generated from these models (``schemas``) and a test holds them equal.

A file is untrusted input, read in three steps:

1. the JSON itself (``parse_json``): at most ``MAX_FILE_BYTES`` read, nesting, lone
   surrogates and NaN refused (``_json``), so nothing later can exhaust the stack or fail
   on text that cannot be encoded;
2. its ``format`` and ``format_version``, with their own messages (a plan file of an older
   version is refused with the fix: make it again);
3. the model: every field of the right JSON type (numbers and booleans are never read
   from strings), a field left out only where older files leave it out.

A plan file then passes the integrity checks of a saved plan: every write must match the
hash recorded with it (``hash_problems``; TamperedPlanError otherwise), and ``apply`` makes
the plan again from its writes and the zone (``_saved.check_saved``) before writing.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, Final, Literal, Required, cast

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SkipValidation,
    ValidationError,
    ValidatorFunctionWrapHandler,
    create_model,
    field_validator,
    with_config,
)
from typing_extensions import TypedDict

from .. import _json
from .._files import write_atomic
from ..cloudflare._state import (
    RemoteRoute,
    RemoteRuleset,
    RemoteState,
    RemoteWorker,
    Scope,
    UrlNormalization,
    canonical_json,
    sha256_text,
)
from ..compiler._artifacts import WorkerArtifact
from ..errors import ZoneError
from ._plan import (
    Fingerprints,
    ForeignRule,
    RouteChange,
    RuleChange,
    SavedPlan,
    WorkerChange,
    ZonePlan,
)
from ._saved import refusal

PLAN_FORMAT: Final = "edgegen-plan"
PLAN_VERSION: Final = 2
STATE_FORMAT: Final = "edgegen-state"
STATE_VERSION: Final = 1
# State and plan files are far smaller (a plan holds the Worker's module, tens of KB).
MAX_FILE_BYTES = 16 * 2**20
_PLAN_FORMAT_FIELD = re.compile(r'"format"\s*:\s*"edgegen-plan"')
_JSON_SCHEMA = "https://json-schema.org/draft/2020-12/schema"


# --- reading and writing JSON files --------------------------------------------------


def write_json_atomic(path: Path, value: Any) -> None:
    """Write JSON to a temporary file beside ``path`` and rename it into place."""
    write_atomic(path, (json.dumps(value, indent=2, ensure_ascii=False) + "\n").encode("utf-8"))


def read_bounded(path: Path, limit: int = MAX_FILE_BYTES) -> bytes:
    """At most ``limit + 1`` bytes of a file (more than ``limit``: too large to be ours).

    Reading stops there, so a path such as /dev/zero cannot fill the memory. Raises
    OSError, or ValueError for a path the system cannot hold (a NUL byte).
    """
    with path.open("rb") as handle:
        return handle.read(limit + 1)


def too_large(path: Path | str, what: str) -> ZoneError:
    """The error for a file over ``MAX_FILE_BYTES``."""
    return ZoneError(
        f"{path} is larger than {MAX_FILE_BYTES // 2**20} MiB, so it is not a {what} file "
        "edgegen wrote; check the path"
    )


def read_json(path: Path, what: str) -> Any:
    """Parse a JSON file; ZoneError with the fix when it is missing or not JSON."""
    try:
        data = read_bounded(path)
        text = data.decode("utf-8")
    except FileNotFoundError:
        raise ZoneError(f"the {what} file {path} does not exist; check the path") from None
    except (OSError, ValueError) as exc:
        if isinstance(exc, UnicodeDecodeError):
            reason = "it is not UTF-8 text"
        elif isinstance(exc, OSError):
            reason = exc.strerror or type(exc).__name__
        else:
            reason = "the path holds a NUL byte"
        raise ZoneError(f"cannot read the {what} file {path} ({reason}); check the path") from None
    if len(data) > MAX_FILE_BYTES:
        raise too_large(path, what)
    return parse_json(text, str(path), what)


def parse_json(text: str, source: str, what: str) -> Any:
    """Parse the text of a state or plan file; ZoneError with the fix when it is not JSON
    edgegen can use (see ``_json``)."""
    try:
        return _json.loads(text)
    except _json.UnusableJSONError as exc:
        raise ZoneError(
            f"the {what} file {source} is not one edgegen wrote ({exc}); make it again"
        ) from None
    except ValueError as exc:
        raise ZoneError(
            f"the {what} file {source} is not JSON (line {getattr(exc, 'lineno', '?')}); "
            "it may have been cut short or edited: make it again"
        ) from None


def _why(error: ValidationError) -> str:
    """The first thing wrong in a file, in words: ``rules[0].action is "x": ...``."""
    first = error.errors(include_url=False)[0]
    where = ""
    for part in first["loc"]:
        where += f"[{part}]" if isinstance(part, int) else f".{part}" if where else str(part)
    where = where or "the file"
    if first["type"] == "missing":
        return f"{where} is missing"
    message = first["msg"]
    return f"{where} is {_json.shown(first['input'])}: {message[:1].lower()}{message[1:]}"


# --- state files ---------------------------------------------------------------------


class StateFile(BaseModel):
    """A zone's state as ``edgegen pull`` saves it, for ``edgegen plan --state``.

    The rules are as Cloudflare returned them; the Worker is there by its hashes and
    bindings, never its script; ``url_normalization`` is null when the token may not read
    it (files pulled by older versions leave it out).
    """

    model_config = ConfigDict(title="edgegen state file")

    format: Annotated[Literal["edgegen-state"], SkipValidation]
    format_version: Annotated[Literal[1], SkipValidation]
    zone_id: str
    account_id: str | None = None
    worker_name: str | None = None
    ruleset: RemoteRuleset | None = None
    worker: RemoteWorker | None = None
    routes: tuple[RemoteRoute, ...] = ()
    url_normalization: UrlNormalization | None = None


def state_to_json(state: RemoteState) -> dict[str, Any]:
    """The state file's content."""
    scope = state.scope
    return StateFile.model_construct(
        format=STATE_FORMAT,
        format_version=STATE_VERSION,
        zone_id=scope.zone_id,
        account_id=scope.account_id,
        worker_name=scope.worker_name,
        ruleset=state.ruleset,
        worker=state.worker,
        routes=state.routes,
        url_normalization=state.url_normalization,
    ).model_dump()


def _unusable(source: str, kind: str, command: str) -> Callable[[str], ZoneError]:
    """The error for a ``kind`` file at ``source`` that cannot be read, with the
    ``edgegen command`` that makes a new one."""

    def bad(why: str) -> ZoneError:
        return ZoneError(
            f"{source} is not a usable edgegen {kind} file ({why}); make a new one with "
            f"edgegen {command} POLICY --out {source}"
        )

    return bad


def _check_header(
    data: Any, file_format: str, version: int, bad: Callable[[str], ZoneError]
) -> None:
    """Refuse a file that does not declare this format and version (before any field is
    read: a file of another kind or version must not be half-understood)."""
    if not isinstance(data, dict) or data.get("format") != file_format:
        raise bad(f"it does not say format: {file_format}")
    if data.get("format_version") != version:
        raise bad(f"format_version is {data.get('format_version')!r}, not {version}")


def state_from_json(data: Any, source: str) -> RemoteState:
    """Read a state file's content; ZoneError naming the file when it is not one."""

    bad = _unusable(source, "state", "pull")
    _check_header(data, STATE_FORMAT, STATE_VERSION, bad)
    try:
        file = StateFile.model_validate(data)
    except ValidationError as exc:
        raise bad(f"a field is missing or of the wrong type: {_why(exc)}") from None
    notices: tuple[str, ...] = ()
    if file.url_normalization is None:
        # Files pulled by older versions have no setting: they load, with a notice.
        notices = (
            f"note: {source} holds no URL normalisation setting (pulled by an older "
            "edgegen, or with a token without Zone > Zone Settings > Read), so this "
            "plan cannot tell whether the zone's rules see normalised URLs; pull it "
            "again with such a token",
        )
    scope = Scope(file.zone_id, file.account_id, file.worker_name)
    return RemoteState(
        scope, file.ruleset, file.worker, file.routes, file.url_normalization, notices
    )


def save_state(state: RemoteState, path: str | os.PathLike[str]) -> None:
    """Write a state file atomically (a reader never sees half of it)."""
    write_json_atomic(Path(path), state_to_json(state))


def load_state(path: str | os.PathLike[str]) -> RemoteState:
    """Read a state file written by ``save_state``; ZoneError saying what is wrong."""
    return state_from_json(read_json(Path(path), "state"), str(path))


# --- plan files ----------------------------------------------------------------------


@with_config(ConfigDict(extra="allow"))
class RulesetBody(TypedDict, total=False):
    """The body of ``PUT /zones/{zone}/rulesets/phases/http_ratelimit/entrypoint``: the
    rules (edgegen's and those made by hand, as sent), and the ruleset's description."""

    rules: Required[list[dict[str, Any]]]


class Writes(BaseModel):
    """The exact writes of a plan: the rules body and the Worker upload (null: none)."""

    ruleset: RulesetBody | None = None
    worker: WorkerArtifact | None = None

    @field_validator("ruleset", mode="wrap")
    @classmethod
    def _as_written(cls, value: Any, check: ValidatorFunctionWrapHandler) -> Any:
        # Checked, then kept as written: the body is sent as it is, in its own order.
        check(value)
        return value

    @field_validator("worker", mode="before")
    @classmethod
    def _without_wrangler_toml(cls, value: Any) -> Any:
        # Plan files may leave out the Worker's wrangler.toml, which apply does not send.
        if isinstance(value, dict) and "wrangler_toml" not in value:
            return {**value, "wrangler_toml": ""}
        return value


class WriteHashes(BaseModel):
    """The SHA-256 of each write, recorded when the plan was made and checked when it is
    read: of the rules body and of the Worker's settings (``name``, ``main_module``,
    ``compatibility_date``, ``bindings``, ``routes``) as canonical JSON, of each Worker
    module's source, and of each route change."""

    ruleset: str | None
    worker_modules: dict[str, str] | None
    worker_settings: str | None
    routes: list[str]


class PlanView(BaseModel):
    """A plan as ``edgegen plan --format json`` prints it: what apply would change, and
    the fingerprints of the zone it was made from."""

    model_config = ConfigDict(title="edgegen plan")

    format: Annotated[Literal["edgegen-plan"], SkipValidation]
    format_version: Annotated[Literal[2], SkipValidation]
    # Written for programs; a plan read back works it out from its changes.
    has_changes: Annotated[bool, SkipValidation] = False
    scope: Scope
    fingerprints: Fingerprints
    ruleset_version: str | None = None
    rules: tuple[RuleChange, ...]
    foreign_rules: tuple[ForeignRule, ...] = ()
    worker: WorkerChange | None = None
    routes: tuple[RouteChange, ...]
    route_patterns: tuple[str, ...] = ()
    limits_by_ref: dict[str, str] = Field(default_factory=dict)
    notes: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()


class PlanFile(PlanView):
    """A saved plan (``edgegen plan --out``): the plan, its exact writes, and a hash of
    each write. ``edgegen apply PLANFILE`` refuses it when the zone changed since, or when
    it does not write what it shows."""

    model_config = ConfigDict(title="edgegen plan file")

    writes: Writes
    # Checked against the writes as they are in the file (``hash_problems``).
    writes_sha256: Annotated[WriteHashes, SkipValidation]


# The fields of a plan file read before the hashes of its writes are checked.
_HEAD_FIELDS: dict[str, Any] = {
    name: (PlanFile.model_fields[name].annotation, PlanFile.model_fields[name])
    for name in ("scope", "writes", "worker", "foreign_rules", "limits_by_ref")
}
_PlanHead = create_model("_PlanHead", **_HEAD_FIELDS)


def plan_to_json(plan: ZonePlan, *, include_writes: bool = True) -> dict[str, Any]:
    """The plan as JSON: the plan file (with ``writes``), or ``plan --format json``."""
    out = PlanView.model_construct(
        format=PLAN_FORMAT,
        format_version=PLAN_VERSION,
        has_changes=plan.has_changes,
        scope=plan.scope,
        fingerprints=plan.fingerprints,
        ruleset_version=plan.ruleset_version,
        rules=plan.rule_changes,
        foreign_rules=plan.foreign_rules,
        worker=plan.worker_change,
        routes=plan.route_changes,
        route_patterns=plan.route_patterns,
        limits_by_ref=dict(plan.limits_by_ref),
        notes=plan.notes,
        warnings=plan.warnings,
    ).model_dump()
    if include_writes:
        body = cast("RulesetBody | None", plan.ruleset_body)
        writes = Writes.model_construct(ruleset=body, worker=plan.worker)
        out["writes"] = writes.model_dump()
        out["writes_sha256"] = write_hashes(out["writes"], out["routes"])
    return out


def write_hashes_of(plan: ZonePlan) -> dict[str, Any]:
    """:func:`write_hashes` of a plan as it would be saved."""
    saved = plan_to_json(plan)
    return dict(saved["writes_sha256"])


# What an upload sets besides its module (the routes are the routes apply adds).
_WORKER_SETTINGS = ("name", "main_module", "compatibility_date", "bindings", "routes")


def write_hashes(writes: Mapping[str, Any], routes: Sequence[Any]) -> dict[str, Any]:
    """The hash of each write of a plan file, from its JSON: the rules body, each Worker
    module, the Worker's settings (bindings, compatibility date, routes), each route."""
    ruleset = writes.get("ruleset")
    worker = writes.get("worker")
    out: dict[str, Any] = {
        "ruleset": None if ruleset is None else sha256_text(canonical_json(ruleset)),
        "worker_modules": None,
        "worker_settings": None,
        "routes": [sha256_text(canonical_json(r)) for r in routes],
    }
    if isinstance(worker, Mapping):
        source = worker.get("module_source")
        out["worker_modules"] = {
            str(worker.get("main_module")): sha256_text(source if isinstance(source, str) else "")
        }
        out["worker_settings"] = sha256_text(
            canonical_json({k: worker.get(k) for k in _WORKER_SETTINGS})
        )
    return out


def hash_problems(data: Mapping[str, Any]) -> list[str]:
    """Each write of a plan file's JSON whose hash is not the one recorded with it.

    TypeError when the file has no ``writes_sha256`` object.
    """
    recorded = _json.obj(data.get("writes_sha256"), "writes_sha256")
    routes = _json.objects(data.get("routes"), "routes")
    now = write_hashes(_json.obj(data.get("writes"), "writes"), routes)
    problems = []
    if recorded.get("ruleset") != now["ruleset"]:
        problems.append("the rules it writes no longer match the hash recorded with them")
    modules = recorded.get("worker_modules")
    for name, digest in (now["worker_modules"] or {}).items():
        if not isinstance(modules, dict) or modules.get(name) != digest:
            problems.append(f"the Worker module {name} no longer matches its recorded hash")
    if now["worker_modules"] is None and modules is not None:
        problems.append("the Worker module it had is gone")
    if recorded.get("worker_settings") != now["worker_settings"]:
        problems.append(
            "the Worker's bindings and compatibility date no longer match their recorded hash"
        )
    hashes = recorded.get("routes")
    if not isinstance(hashes, list) or len(hashes) != len(now["routes"]):
        problems.append("the route changes no longer match their recorded hashes")
    else:
        for index, (route, old, new) in enumerate(zip(routes, hashes, now["routes"], strict=True)):
            if old != new:
                verb = "add" if route.get("action") == "create" else "remove"
                problems.append(
                    f"route change {index + 1} ({verb} {route.get('pattern')}) no longer "
                    "matches its recorded hash"
                )
    return problems


def plan_from_json(data: Any, source: str) -> ZonePlan:
    """Read a plan file's content; ZoneError naming the file when it is not one, and
    TamperedPlanError when a write does not match the hash recorded with it."""

    bad = _unusable(source, "plan", "plan")
    _check_header(data, PLAN_FORMAT, PLAN_VERSION, bad)

    def validated(model: type[BaseModel]) -> Any:
        try:
            return model.model_validate(data)
        except ValidationError as exc:
            raise bad(f"a field is missing or of the wrong type: {_why(exc)}") from None

    # The writes and what they are for first, then their hashes, then the rest: a write
    # that does not match its hash is refused as such, whatever else the file lists.
    head = validated(_PlanHead)
    scope: Scope = head.scope
    worker: WorkerArtifact | None = head.writes.worker
    if worker is not None and worker.name != scope.worker_name:
        raise bad(f"it uploads the Worker {worker.name!r} but was made for {scope.worker_name!r}")
    if (head.worker is None) != (worker is None):
        raise bad("the Worker change and the Worker to upload do not match")
    try:
        problems = hash_problems(data)
    except TypeError as exc:
        raise bad(f"a field is missing or of the wrong type: {exc}") from None
    if problems:
        raise refusal(source, problems)
    file: PlanFile = validated(PlanFile)
    # The body as written (the model checked it and kept it so): it is what is sent.
    body = cast("dict[str, Any] | None", file.writes.ruleset)
    return ZonePlan(
        scope=file.scope,
        fingerprints=file.fingerprints,
        rule_changes=file.rules,
        foreign_rules=file.foreign_rules,
        ruleset_body=body,
        ruleset_version=file.ruleset_version,
        worker_change=file.worker,
        worker=worker,
        route_changes=file.routes,
        route_patterns=file.route_patterns,
        limits_by_ref=file.limits_by_ref,
        notes=file.notes,
        warnings=file.warnings,
    )


def is_plan_file(text: str) -> bool:
    """Whether a file's text is a plan file (JSON naming the plan format), not a policy."""
    stripped = text.lstrip()
    if not stripped.startswith("{"):
        return False
    try:
        data = _json.loads(stripped)
    except ValueError:
        # Cut short or damaged, but meant as a plan: reading it says what is wrong.
        return _PLAN_FORMAT_FIELD.search(stripped) is not None
    return isinstance(data, dict) and data.get("format") == PLAN_FORMAT


def read_plan(text: str, source: str) -> SavedPlan:
    """A plan file's text (of the file ``source``) as a SavedPlan, its hashes checked."""
    return SavedPlan(plan_from_json(parse_json(text, source, "plan"), source), source)


def save_plan(plan: ZonePlan, path: str | os.PathLike[str]) -> None:
    """Write a plan file atomically, with its writes and their hashes."""
    write_json_atomic(Path(path), plan_to_json(plan))


def load_plan(path: str | os.PathLike[str]) -> SavedPlan:
    """Read a plan file written by ``save_plan``: ZoneError when it is not one,
    TamperedPlanError when a write no longer matches its recorded hash."""
    data = read_json(Path(path), "plan")
    return SavedPlan(plan_from_json(data, str(path)), str(path))


# --- the published schemas -------------------------------------------------------------

SCHEMA_FILES: dict[str, type[BaseModel]] = {
    "plan.schema.json": PlanFile,
    "state.schema.json": StateFile,
}


def schemas() -> dict[str, str]:
    """File name -> text of each JSON Schema published in docs/schemas/."""
    out = {}
    for name, model in SCHEMA_FILES.items():
        schema = {"$schema": _JSON_SCHEMA, **model.model_json_schema()}
        out[name] = json.dumps(schema, indent=2, ensure_ascii=False) + "\n"
    return out
