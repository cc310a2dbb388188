"""Writing a ZonePlan, in a safe order; the steps ``edgegen.apply`` (``_operations``) runs.

Order: writes that add protection go before writes that take it away, so a limit moving
between a rule and the Worker is, for a moment, enforced twice rather than not at all.
The Worker is uploaded before routes point at it; routes the policy no longer wants are
removed last. When the rules only gain or change (a limit may be moving from the Worker to
a rule), they are written first; when rules are deleted, the Worker goes first.

A failure part-way raises ApplyError naming what was written, what failed (and whether it
may have happened anyway) and what was not written; ``edgegen plan`` then shows the truth.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from edgegen_policy import Policy

from ..errors import ApplyError, CloudflareAPIError, EdgegenError, Rejection, ZoneError
from ._plan import ZonePlan
from ._rejections import locate_rejections, rejections

if TYPE_CHECKING:
    # The client (httpx) only as a type: importing this module needs no edge extra.
    from ..cloudflare._client import Client, Write


def writes(client: Client, plan: ZonePlan) -> list[Write]:
    """The requests apply sends for a plan, in order."""
    scope = plan.scope
    ruleset: list[Write] = []
    if plan.ruleset_body is not None:
        ruleset.append(client.put_entrypoint_write(scope.zone_id, plan.ruleset_body))
    worker: list[Write] = []
    if plan.worker_change is not None and plan.worker is not None:
        if scope.account_id is None:
            raise ZoneError(
                "the plan uploads a Worker but names no account; set cloudflare.account_id "
                "in the policy (or CLOUDFLARE_ACCOUNT_ID if the policy reads it) and plan again"
            )
        artifact = plan.worker
        metadata = {
            "main_module": artifact.main_module,
            "compatibility_date": artifact.compatibility_date,
            "bindings": list(artifact.bindings),
        }
        if artifact.secrets:
            # The secrets are set with wrangler (or Terraform), never sent by edgegen: keep
            # them across this upload, which would otherwise drop every unlisted binding.
            metadata["keep_bindings"] = ["secret_text"]
        worker.append(
            client.put_script_write(
                scope.account_id,
                artifact.name,
                metadata,
                {artifact.main_module: artifact.module_source},
            )
        )
    for route in plan.route_changes:
        # Only routes of the policy's Worker are ever added or removed.
        if route.script != scope.worker_name or (route.action == "delete" and not route.route_id):
            raise ZoneError(
                f"the plan would {'add' if route.action == 'create' else 'remove'} the route "
                f"{route.pattern}, which does not run the Worker {scope.worker_name!r}; "
                "edgegen only manages routes of its own Worker: make the plan again"
            )
    creates = [
        client.create_route_write(scope.zone_id, r.pattern, r.script or "")
        for r in plan.route_changes
        if r.action == "create"
    ]
    deletes = [
        client.delete_route_write(scope.zone_id, r.route_id or "", r.pattern)
        for r in plan.route_changes
        if r.action == "delete"
    ]
    if plan.count("delete"):
        return [*worker, *creates, *ruleset, *deletes]
    return [*ruleset, *worker, *creates, *deletes]


def validate_remote(client: Client, plan: ZonePlan, source: Policy | None = None) -> bool:
    """Send the ruleset with ``?dry_run=true``; ZoneError naming each limit Cloudflare rejects
    (at its line in ``source``, the policy the plan was made from, when given).

    Returns False when there is no ruleset change to validate.
    """
    if plan.ruleset_body is None:
        return False
    write = client.put_entrypoint_write(plan.scope.zone_id, plan.ruleset_body, dry_run=True)
    try:
        client.send(write)
    except CloudflareAPIError as exc:
        found = _rejected(exc, plan, source)
        if not found:
            raise
        raise ZoneError(
            "Cloudflare's dry run rejected the rules; nothing was written:\n"
            + "\n".join(f"  {r.describe()}" for r in found),
            found,
        ) from None
    return True


def _rejected(error: CloudflareAPIError, plan: ZonePlan, source: Policy | None) -> list[Rejection]:
    if error.status != 400 or plan.ruleset_body is None:
        return []
    found = rejections(error, plan.ruleset_body, plan.limits_by_ref)
    return found if source is None else locate_rejections(found, source)


def _list(items: list[str]) -> str:
    return "; ".join(items) if items else "nothing"


def execute(
    client: Client, plan: ZonePlan, written: Callable[[str], None], source: Policy | None = None
) -> list[str]:
    """Send the plan's writes in order; returns what was written (``written`` is told each,
    as it is made).

    Raises ApplyError at the first failure; rules Cloudflare rejects are reported at their
    line in ``source``, the policy the plan was made from, when given.
    """
    steps = writes(client, plan)
    done: list[str] = []
    for index, write in enumerate(steps):
        try:
            client.send(write)
        except EdgegenError as exc:
            ambiguous = isinstance(exc, CloudflareAPIError) and exc.ambiguous
            found: list[Rejection] = []
            if isinstance(exc, CloudflareAPIError) and write.path == client.entrypoint_path(
                plan.scope.zone_id
            ):
                found = _rejected(exc, plan, source)
            remaining = [w.what for w in steps[index + 1 :]]
            lines = [
                f"apply stopped: {write.what} failed: {exc}",
                f"Written: {_list(done)}.",
                f"Not written: {_list(remaining)}.",
            ]
            if found:
                # Each rejection already says what Cloudflare said, traced to its limit.
                lines[0] = f"apply stopped: {write.what} failed: Cloudflare rejected the rules:"
                lines[1:1] = [f"  {r.describe()}" for r in found]
            if ambiguous:
                lines.append(f"The failed write ({write.what}) may or may not have been made.")
            lines.append("Run edgegen plan to see what the zone holds now, then apply again.")
            raise ApplyError(
                "\n".join(lines),
                written=done,
                failed=write.what,
                not_written=remaining,
                cause=exc,
                ambiguous=ambiguous,
                rejections=found,
            ) from None
        done.append(write.what)
        written(write.what)
    return done


NOTHING_WRITTEN = "nothing was written"


@contextmanager
def nothing_written() -> Iterator[None]:
    """Around the steps before the first write: an error raised there says so.

    Its message gains "; nothing was written" (unless it says so already), so every way
    apply can stop tells whether the zone was changed.
    """
    try:
        yield
    except EdgegenError as exc:
        message = str(exc)
        if NOTHING_WRITTEN not in message.lower():
            exc.args = (f"{message}; {NOTHING_WRITTEN}",)
        raise
