"""A zone plan's values: ``ZonePlan`` (what apply would change in a zone, and everything it
needs to do it), its parts (rule, Worker and route changes, the foreign rules kept, the
fingerprints of the state it was made from) and ``SavedPlan``. Plain values: ``_merge``
makes them, ``_saved`` checks a saved one against the zone, ``_format`` shows them.

The change types are also the plan file's parts: their annotations say how each is read
from a file (``_file_formats`` holds the file's model and its JSON Schema).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any, Final, Literal

from pydantic import Field, GetCoreSchemaHandler, StrictInt
from pydantic_core import core_schema

from ..cloudflare._state import Flag, Scope
from ..compiler._artifacts import WorkerArtifact

RuleAction = Literal["create", "update", "move", "delete"]


class _Absent:
    """The value of a field that is not there (shown as ``(none)``)."""

    _instance: _Absent | None = None

    def __new__(cls) -> _Absent:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "(none)"


ABSENT: Final = _Absent()


@dataclass(frozen=True, slots=True)
class FieldChange:
    """One field that differs: dotted ``path``, ``old`` and ``new`` (ABSENT when missing).

    In a file: ``{"path", "old"?, "new"?}``, a side that is absent left out.
    """

    path: str
    old: Any
    new: Any

    def to_json(self) -> dict[str, Any]:
        """``{"path", "old"?, "new"?}``: a side that is absent is left out."""
        out: dict[str, Any] = {"path": self.path}
        if self.old is not ABSENT:
            out["old"] = self.old
        if self.new is not ABSENT:
            out["new"] = self.new
        return out

    @classmethod
    def __get_pydantic_core_schema__(
        cls, source: Any, handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        """How a file holds a FieldChange: an object with a path, and old and new only
        when that side is there."""
        shape = core_schema.typed_dict_schema(
            {
                "path": core_schema.typed_dict_field(core_schema.str_schema()),
                "old": core_schema.typed_dict_field(core_schema.any_schema(), required=False),
                "new": core_schema.typed_dict_field(core_schema.any_schema(), required=False),
            }
        )

        def read(value: Any, check: core_schema.ValidatorFunctionWrapHandler) -> FieldChange:
            if isinstance(value, cls):
                return value
            data = check(value)
            return cls(data["path"], data.get("old", ABSENT), data.get("new", ABSENT))

        return core_schema.no_info_wrap_validator_function(
            read,
            shape,
            serialization=core_schema.plain_serializer_function_ser_schema(
                cls.to_json, return_schema=shape
            ),
        )


@dataclass(frozen=True, slots=True)
class RuleChange:
    """A rule to ``create``, ``update``, ``move`` (order only) or ``delete``.

    ``limit`` is the policy limit the rule was made from (None for a rule whose limit is
    gone); ``position`` its place in the rules written (None for a delete).
    """

    action: RuleAction
    ref: str
    limit: str | None = None
    description: str = ""
    position: StrictInt | None = None
    fields: tuple[FieldChange, ...] = ()


@dataclass(frozen=True, slots=True)
class ForeignRule:
    """A rule edgegen does not manage, kept as it is."""

    position: StrictInt
    ref: str
    description: str


@dataclass(frozen=True, slots=True)
class WorkerChange:
    """The Worker to ``create`` or ``update`` (upload), and what differs."""

    action: Literal["create", "update"]
    name: str
    replaces_foreign: Flag = False
    fields: tuple[FieldChange, ...] = ()


@dataclass(frozen=True, slots=True)
class RouteChange:
    """A route to ``create`` or ``delete``."""

    action: Literal["create", "delete"]
    pattern: str
    script: str | None = None
    route_id: str | None = None


@dataclass(frozen=True, slots=True)
class Fingerprints:
    """What the remote state looked like: enough to tell whether it changed since."""

    ruleset_version: Annotated[str | None, Field(default=None)]
    ruleset_sha256: Annotated[str | None, Field(default=None)]
    worker_sha256: Annotated[str | None, Field(default=None)]
    routes_sha256: str

    def differences(self, now: Fingerprints) -> list[str]:
        """What changed from ``self`` (the plan's) to ``now``, in words."""
        out = []
        if (self.ruleset_version, self.ruleset_sha256) != (now.ruleset_version, now.ruleset_sha256):
            out.append(
                f"the http_ratelimit rules (version {self.ruleset_version or 'none'} when "
                f"planned, {now.ruleset_version or 'none'} now)"
            )
        if self.worker_sha256 != now.worker_sha256:
            out.append("the Worker script or its bindings")
        if self.routes_sha256 != now.routes_sha256:
            out.append("the Worker routes")
        return out


@dataclass(frozen=True)
class ZonePlan:
    """What apply would change in a zone, and everything it needs to do it.

    ``ruleset_body`` is the PUT body (None: the rules stay as they are); ``worker`` the
    Worker to upload when ``worker_change`` is set; ``route_patterns`` the routes the
    policy wants (fingerprints cover them and every route of our Worker);
    ``limits_by_ref`` the policy limit each generated rule was made from.
    """

    scope: Scope
    fingerprints: Fingerprints
    rule_changes: tuple[RuleChange, ...]
    foreign_rules: tuple[ForeignRule, ...]
    ruleset_body: dict[str, Any] | None
    ruleset_version: str | None
    worker_change: WorkerChange | None
    worker: WorkerArtifact | None
    route_changes: tuple[RouteChange, ...]
    route_patterns: tuple[str, ...]
    limits_by_ref: Mapping[str, str] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    # About the zone rather than the changes (its URL normalisation): for stderr, each
    # starting "warning: " or "note: ".
    warnings: tuple[str, ...] = ()

    @property
    def has_changes(self) -> bool:
        """Whether apply would write anything."""
        return bool(self.ruleset_body is not None or self.worker_change or self.route_changes)

    def count(self, action: str) -> int:
        """How many rules the plan would ``create``, ``update``, ``move`` or ``delete``."""
        return sum(1 for c in self.rule_changes if c.action == action)


@dataclass(frozen=True, slots=True)
class SavedPlan:
    """A plan read from a file (``source``), its write hashes checked, but not yet checked
    against the zone: ``edgegen.apply`` does that (the zone must be as it was when the plan
    was made, and the plan must write what it shows) before it shows or writes anything."""

    plan: ZonePlan
    source: str
