"""The periods of calendar quotas, put into each call's plan. No I/O.

A plan keeps a quota's check without its period (``_calls.quota_blocks``): the period
depends on when the call is made and, for a billing quota, on the caller's billing day.
:class:`Periods` dates such checks for one call: it finds the period that contains the
call's time in the limit's time zone (``edgegen_policy.period_at``), and gives the check
the key of that period and the spec that carries its start and end to the script
(``_calls.dated_block``). The dated block of each quota and billing day is remembered
until its period is over, so the calendar is consulted once per period, not per call.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from edgegen_policy import Period, period_at, time_zone

from ._calls import Block, Check, dated_block
from ._errors import InvalidArgumentError
from ._memo import Memo
from ._rules import AppRule

_BILLING = Period.BILLING.value
_MAX_DAY = 31
# Later than any period's end, in µs since the epoch.
_FOREVER = 2**62


def billing_day(rule: AppRule, keys: object) -> int | None:
    """The caller's billing day for ``rule``'s billing quotas, from the call's app keys
    (``keys[rule.billing_day_from]``): a whole number from 1 to 31, or its digits. None
    when the keys do not hold it; InvalidArgumentError when they hold something else."""
    name = rule.billing_day_from
    if name is None or not isinstance(keys, Mapping):
        return None
    value = keys.get(name)
    if value is None:
        return None
    day = None
    if isinstance(value, int) and not isinstance(value, bool):
        day = value
    elif isinstance(value, str) and value.isascii() and value.isdigit() and len(value) <= 2:
        day = int(value)
    if day is None or not 1 <= day <= _MAX_DAY:
        raise InvalidArgumentError(
            "keys",
            f"keys[{name!r}] is {value!r}, not a billing day; limit {rule.name!r} counts "
            f"billing quotas from the day of the month it names: a number from 1 to 31 "
            f"(29-31 count from a short month's last day).",
        )
    return day


def _missing(rule: AppRule) -> InvalidArgumentError:
    name = rule.billing_day_from
    return InvalidArgumentError(
        "keys",
        f"limit {rule.name!r} has a billing quota, which starts its month on the caller's "
        f"billing day, but no keys[{name!r}] was given; return it from identify "
        f"(Caller(..., keys={{{name!r}: '15'}})) or pass keys={{{name!r}: day}} to hit().",
    )


# The most dated blocks kept (a block per quota, tier and billing day in use).
_DATED = 4096


class Periods:
    """The dated blocks of calendar quotas, each until its period is over."""

    __slots__ = ("_dated",)

    def __init__(self) -> None:
        # (the template block's id, billing day) -> (template, start, end, dated block).
        # The template is kept to make its id unique for as long as the entry lives; every
        # override change makes new templates, so the memo is bounded.
        self._dated: Memo[tuple[int, int], tuple[Block, int, int, Block]] = Memo(_DATED)

    def date(self, checks: Sequence[Check], keys: object, at: int) -> tuple[Check, ...] | None:
        """``checks`` with each quota's check in the period containing ``at`` (µs since
        the epoch); None when none of them is a quota's. A billing quota without a
        billing day in ``keys`` raises InvalidArgumentError."""
        found = self.span(checks, keys, at)
        return None if found is None else found[0]

    def date_known(self, checks: Sequence[Check], keys: object, at: int) -> list[Check]:
        """As :meth:`date`, leaving out a billing quota whose billing day ``keys`` lacks."""
        found = self._date(checks, keys, at, strict=False)
        return list(checks if found is None else found[0])

    def span(
        self, checks: Sequence[Check], keys: object, at: int
    ) -> tuple[tuple[Check, ...], int, int] | None:
        """As :meth:`date`, with the times between which the dated checks hold: from the
        latest start of their periods to the earliest end."""
        return self._date(checks, keys, at, strict=True)

    def _date(
        self, checks: Sequence[Check], keys: object, at: int, *, strict: bool
    ) -> tuple[tuple[Check, ...], int, int] | None:
        if not any(check.block.calendar is not None for check in checks):
            return None
        out: list[Check] = []
        # The span every dated check holds in: within each one's period.
        first, last = 0, _FOREVER
        for check in checks:
            spec = check.block.calendar
            if spec is None:
                out.append(check)
                continue
            day = 1
            if spec.period == _BILLING:
                found = billing_day(check.rule, keys)
                if found is None:
                    if strict:
                        raise _missing(check.rule)
                    continue
                day = found
            start, end, block = self._block(check.block, check.rule, day, at)
            first, last = max(first, start), min(last, end)
            out.append(
                Check(
                    check.rule,
                    check.tier,
                    block.rate,
                    check.key + block.key_tail[len(check.block.key_tail) :],
                    check.cost,
                    block,
                )
            )
        return tuple(out), first, last

    def _block(self, template: Block, rule: AppRule, day: int, at: int) -> tuple[int, int, Block]:
        """The period containing ``at`` (start and end) and ``template``'s dated block."""
        memo = (id(template), day)
        found = self._dated.entries.get(memo)
        if found is not None and found[0] is template and found[1] <= at < found[2]:
            return found[1], found[2], found[3]
        spec = template.calendar
        assert spec is not None
        start, end, first = period_at(Period(spec.period), at, time_zone(rule.quota_zone), day)
        block = dated_block(template, start, end, first.isoformat())
        self._dated.keep(memo, (template, start, end, block))
        return start, end, block
