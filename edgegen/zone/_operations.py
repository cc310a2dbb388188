"""The zone, as a library: ``pull`` reads it, ``plan`` compares it with a policy's
artifacts, ``apply`` makes it match. The CLI (``_cli_zone``) only adds the terminal and
exit codes.

``apply`` runs the whole safe sequence. For a plan made just now: show it (an ``output``
event), ask (``confirm``), read the zone again and refuse if it changed while the question
was open (StalePlanError), validate the rules with Cloudflare's dry run if asked, then
write in a safe order (``_apply``). For a saved plan (``SavedPlan``, from a file): read
the zone again and refuse unless it is as it was when the plan was made (StalePlanError)
and the plan writes what it shows (TamperedPlanError), then the same from showing on.
Every failure before the first write says that nothing was written; a failure part-way is
an ApplyError saying what was and was not written.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from edgegen_policy import Policy

from ..cloudflare._state import (
    EDGEGEN_BANNER,
    RemoteState,
    RemoteWorker,
    Scope,
    UrlNormalization,
    canonical_bindings,
    content_sha256,
)
from ..compiler._artifacts import Artifacts
from ..compiler._compile import build as _build
from ..errors import CloudflareAPIError, StalePlanError, TamperedPlanError, ZoneError
from . import _apply
from ._file_formats import write_hashes_of
from ._merge import fingerprints, make_plan
from ._plan import SavedPlan, ZonePlan
from ._saved import check_saved

if TYPE_CHECKING:
    # The client (httpx) only as a type: importing this module needs no edge extra.
    from ..cloudflare._client import Client, Write


def pull(client: Client, scope: Scope, *, zone_settings: bool = True) -> RemoteState:
    """Read the zone's state with GET requests only: its http_ratelimit rules, the policy's
    Worker (by hash), its routes and (``zone_settings``) its URL normalisation setting.

    Any failed or unclear read raises (CloudflareAPIError): a plan made from a partial
    read could delete what it did not see. The one exception is a 403 on the setting,
    which nothing is written from: it is left unknown, with a notice.
    """
    ruleset = client.get_entrypoint(scope.zone_id)
    worker = None
    if scope.worker_name is not None and scope.account_id is not None:
        settings = client.get_script_settings(scope.account_id, scope.worker_name)
        content = (
            client.get_script_content(scope.account_id, scope.worker_name)
            if settings is not None
            else None
        )
        if settings is not None and content is None:
            raise ZoneError(
                f"the Worker {scope.worker_name!r} disappeared while it was being read "
                "(its settings were there, its content was not); run the command again"
            )
        if settings is not None and content is not None:
            main = content.modules.get(content.main_module, b"")
            worker = RemoteWorker(
                name=scope.worker_name,
                main_module=content.main_module,
                content_sha256=content_sha256(content.main_module, content.modules),
                compatibility_date=settings.compatibility_date,
                # Secrets are the user's (wrangler secret put; apply keeps them): never
                # compared, or setting one would look like a change to the Worker.
                bindings=canonical_bindings(
                    b for b in settings.bindings if b.get("type") != "secret_text"
                ),
                generated_by_edgegen=main.lstrip().startswith(EDGEGEN_BANNER),
            )
    routes = client.list_routes(scope.zone_id)
    setting: UrlNormalization | None = None
    notices: tuple[str, ...] = ()
    if zone_settings:
        try:
            setting = client.get_url_normalization(scope.zone_id)
        except CloudflareAPIError as exc:
            if exc.status != 403:
                raise
            notices = (
                f"warning: the API token may not read zone {scope.zone_id}'s URL "
                "normalisation setting (HTTP 403), so edgegen cannot tell whether its rules "
                "see normalised URLs; give the token Zone > Zone Settings > Read to check it",
            )
    return RemoteState(scope, ruleset, worker, routes, setting, notices)


def plan(artifacts: Artifacts, state: RemoteState) -> ZonePlan:
    """What apply would change to make the zone (``state``) hold ``artifacts``. Pure.

    Raises ZoneError when a route the policy wants runs another Worker, or the state was
    read for another Worker.
    """
    return make_plan(artifacts, state)


def verify(client: Client, plan: ZonePlan, *, settings: bool = False) -> RemoteState:
    """Read the zone again; StalePlanError when it is not what the plan was made from.

    ``settings``: read the zone's URL normalisation setting too (for a plan shown again).
    """
    now = pull(client, plan.scope, zone_settings=settings)
    changed = plan.fingerprints.differences(fingerprints(now, plan.route_patterns))
    if changed:
        raise StalePlanError(
            "the zone changed since this plan was made ("
            + "; ".join(changed)
            + "); nothing was written: run edgegen plan again and review the new plan",
            changed,
        )
    return now


def verify_saved(
    client: Client, saved: SavedPlan, *, source: tuple[Policy, Artifacts] | None = None
) -> ZonePlan:
    """A saved plan, checked before anything is written: the zone must be as it was when
    the plan was made (StalePlanError), and the plan's writes must be what it shows, made
    again from them and the zone (TamperedPlanError). Returns the plan to show and apply.

    ``source`` (the reviewed policy and its build) binds the plan to it: the plan must be for
    the policy's zone and Worker, and must write exactly what planning that build against
    the zone writes. Hashes alone cannot tell a consistent edit (the rules, the Worker's
    code and the hashes all changed together) from the plan as made; the policy can.
    """
    now = verify(client, saved.plan, settings=True)
    shown = check_saved(saved.plan, now, saved.source)
    if source is not None:
        bound_to(shown, now, source, saved.source)
    return shown


def bound_to(
    shown: ZonePlan, now: RemoteState, source: tuple[Policy, Artifacts], path: str
) -> None:
    """TamperedPlanError unless ``shown`` writes what ``source`` builds against ``now``."""
    loaded, artifacts = source
    problems: list[str] = []
    cloudflare = loaded.cloudflare
    worker = cloudflare.worker.name if cloudflare and cloudflare.worker else None
    wanted = (cloudflare.zone_id if cloudflare else None, worker)
    if (shown.scope.zone_id, shown.scope.worker_name) != wanted:
        problems.append(
            f"it is for zone {shown.scope.zone_id} and Worker {shown.scope.worker_name}, "
            f"the policy for zone {wanted[0]} and Worker {wanted[1]}"
        )
    else:
        fresh = make_plan(artifacts, now)
        made = write_hashes_of(shown)
        built = write_hashes_of(fresh)
        for part in ("ruleset", "worker_modules", "worker_settings", "routes"):
            if made.get(part) != built.get(part):
                problems.append(f"its {part.replace('_', ' ')} differ from what the policy builds")
    if problems:
        raise TamperedPlanError(
            f"refusing to apply {path}: it does not write what the policy builds ("
            + "; ".join(problems)
            + "). Nothing was written: make the plan again from the reviewed policy with "
            f"edgegen plan POLICY --out {path}",
            problems,
        )


@dataclass(frozen=True, slots=True)
class ApplyEvent:
    """What ``apply`` reports as it goes, to its ``output`` callback.

    ``kind``: ``plan`` (first: the plan it is about to apply, to show), ``validated``
    (Cloudflare's dry run accepted the rules) or ``written`` (one write was made; ``write``
    says what, e.g. ``upload the Worker api-edge-limits``).
    """

    kind: Literal["plan", "validated", "written"]
    plan: ZonePlan
    write: str = ""


@dataclass(frozen=True, slots=True)
class ApplyResult:
    """How ``apply`` ended.

    ``outcome``: ``applied`` (``written`` lists the writes made, in order), ``no_changes``
    (the zone already matches), ``cancelled`` (``confirm`` said no; nothing was written) or
    ``dry_run`` (nothing was written; ``requests`` are the writes apply would send, in
    order). ``plan`` is the plan shown (for a saved plan: as made again from the zone).
    """

    outcome: Literal["applied", "no_changes", "cancelled", "dry_run"]
    plan: ZonePlan
    written: tuple[str, ...] = ()
    requests: tuple[Write, ...] = ()


def apply(
    client: Client,
    plan: ZonePlan | SavedPlan,
    *,
    confirm: Callable[[ZonePlan], bool] | None = None,
    output: Callable[[ApplyEvent], None] | None = None,
    policy: Policy | None = None,
    dry_run: bool = False,
    validate_remote: bool = False,
) -> ApplyResult:
    """Make the zone match ``plan``: a plan made just now, or a saved one (see the module
    docstring for the sequence).

    ``confirm(plan)`` is asked after the plan is shown and before anything is written; only
    True goes on, and then the zone is read again to make sure it did not change meanwhile
    (leave it out to apply without asking, as for a reviewed saved plan). ``output`` gets
    an ApplyEvent for the plan, the dry run's verdict and each write. ``policy`` is the
    policy the plan was made from: rules Cloudflare rejects are reported at its lines, and a
    saved plan must write exactly what it builds (TamperedPlanError otherwise).
    ``dry_run`` stops before the first write and returns the writes it would send;
    ``validate_remote`` first sends the rules with Cloudflare's ``?dry_run=true``.

    Raises StalePlanError, TamperedPlanError, ZoneError or CloudflareAPIError, each saying
    that nothing was written, or ApplyError when it stopped part-way.
    """

    def report(event: ApplyEvent) -> None:
        if output is not None:
            output(event)

    with _apply.nothing_written():
        # A saved plan is applied only to the zone it was made from, and only if it writes
        # exactly what it shows.
        if isinstance(plan, SavedPlan):
            source = (policy, _build(policy)) if policy is not None else None
            shown = verify_saved(client, plan, source=source)
        else:
            shown = plan
        report(ApplyEvent("plan", shown))
        if not shown.has_changes:
            return ApplyResult("no_changes", shown)
        if dry_run:
            if validate_remote and _apply.validate_remote(client, shown, policy):
                report(ApplyEvent("validated", shown))
            return ApplyResult("dry_run", shown, requests=tuple(_apply.writes(client, shown)))
        if confirm is not None:
            if not confirm(shown):
                return ApplyResult("cancelled", shown)
            # Time passed while the question was open: the zone must still be as planned.
            verify(client, shown)
        if validate_remote and _apply.validate_remote(client, shown, policy):
            report(ApplyEvent("validated", shown))
    done = _apply.execute(
        client, shown, lambda what: report(ApplyEvent("written", shown, what)), policy
    )
    return ApplyResult("applied", shown, written=tuple(done))
