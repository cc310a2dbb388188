"""What a decision sends to Redis, and its one RESP encoder.

A :class:`Check` is one rate of one limit for one identity: one key of a script call. The
checks of a plan become :class:`ScriptCall` objects (keys and arguments, see decide.lua),
each encoded here once, and :func:`pack` turns a call into the command a wire writes:
FCALL of the library's function, EVALSHA by the script's SHA, or EVAL with its text.
Every byte of RESP the limiter writes is made in this module: what every request of a
limit and tier sends the same (:class:`Block`) and a call's parts shared by every call of a
remembered plan (:class:`CallParts`) are encoded once; a call of one check, most
decisions', is packed in one format (:func:`one_call`).

No I/O. Compiled by mypyc (setup.py): every decision passes through it. What an error
reply means, and what to send after one, is ``_protocol.py``'s.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from edgegen_policy import CALENDAR, LEASE, burst_for

from . import _script
from ._memo import Memo
from ._rules import AppRule, QuotaSpec, RateSpec

# What a decision does: hit consumes, peek only reads (the script also knows "refund",
# which only a denied decision's follow-up calls use).
Operation = Literal["hit", "peek"]
# Under a test clock the script's time does not run with the server's, so expiry (which
# does) is pushed out by this much: state the fake clock still needs is never dropped.
TEST_CLOCK_TTL_SLACK_MS = 600_000


# --- RESP --------------------------------------------------------------------------------


def _bulk_of(data: bytes) -> bytes:
    """``data`` as a RESP bulk string."""
    return b"$%d\r\n%b\r\n" % (len(data), data)


def bulk(value: str) -> bytes:
    """``value`` as a RESP bulk string, UTF-8 encoded as hiredis encodes a str."""
    return _bulk_of(value.encode())


def _pack_in_python(args: tuple[str | bytes | int, ...]) -> bytes:
    """One RESP command, packed here: what hiredis.pack_command gives, without hiredis."""
    parts = [b"*%d\r\n" % len(args)]
    for arg in args:
        parts.append(_bulk_of(arg if isinstance(arg, bytes) else str(arg).encode("utf-8")))
    return b"".join(parts)


_hiredis_pack: Any
try:
    from hiredis import pack_command as _hiredis_pack
except ImportError:  # hiredis is in the app extra, but optional: packed in Python then
    _hiredis_pack = None


def pack_command(args: tuple[str | bytes | int, ...]) -> bytes:
    """One RESP command, packed by hiredis in one C call (in Python without hiredis)."""
    if _hiredis_pack is None:
        return _pack_in_python(args)
    return bytes(_hiredis_pack(args))


# --- what a check sends ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Block:
    """What one rate of one limit and tier sends with every call, encoded once.

    ``key_head`` and ``key_tail`` are the state key before and after the hash tag;
    ``head`` and ``tail`` the check's spec (its one script argument, see decide.lua) before
    and after the cost; ``result_head`` the fixed fields of the block's LimitResult
    (limit, tier, algorithm, quota, window, shadow).
    """

    rate: RateSpec
    key_head: str
    key_tail: str
    head: str
    tail: str
    result_head: tuple[str, str, str, int, float, bool]
    # A concurrency limit's block: its check takes a lease the request gives back.
    lease: bool = False
    spec_cost_1: str = ""
    packed_cost_1: bytes = b""
    # A calendar quota's block as the plans keep it, without its period: the plan of each
    # call puts the period in (QuotaCore.prepare, ``dated_block``). None for a rate's block.
    calendar: QuotaSpec | None = None

    def __post_init__(self) -> None:
        # The spec of a request of cost 1, nearly every request's, made once, and its
        # RESP encoding.
        spec = f"{self.head}1{self.tail}"
        object.__setattr__(self, "spec_cost_1", spec)
        object.__setattr__(self, "packed_cost_1", bulk(spec))


# The kinds of block (block_kind), each what one field of a tier (and of an override,
# which replaces its tier's blocks kind by kind) gives.
RATES = "rates"
QUOTAS = "quotas"
LEASES = "concurrency"


def block_kind(block: Block) -> str:
    """What ``block`` checks: a rate, a calendar quota or a concurrency limit."""
    if block.calendar is not None:
        return QUOTAS
    return LEASES if block.lease else RATES


def blocks(prefix: str, rule: AppRule, tier: str, *, record: bool = False) -> tuple[Block, ...]:
    """The encoded blocks of ``rule`` for ``tier``: one per rate (none if it has none),
    then one per calendar quota (:func:`quota_blocks`), then the concurrency limit's.

    A count_when limit's rate and quota blocks carry decide.lua's "after" flag, so that a
    hit checks them and counts nothing; ``record``: the blocks without it, with which a
    hit counts the response (``Core.for_record``)."""
    flags = (1 if rule.shadow else 0) | (2 if rule.count_when and not record else 0)
    out = []
    for rate in rule.tiers.get(tier, ()):
        burst = burst_for(rule.algorithm, rule.burst, rate.quota)
        out.append(
            Block(
                rate=rate,
                key_head=f"{prefix}:{rule.key_name}:{{",
                key_tail=f"}}:{rate.period_text}:{rule.key_suffix}",
                head=f"{rule.algorithm} {rate.quota} {rate.period_us} ",
                tail=f" {burst} {flags}",
                # The first fields of every LimitResult of this block, in their order.
                result_head=(rule.name, tier, rule.algorithm, rate.quota, rate.window, rule.shadow),
            )
        )
    if rule.quotas:
        out.extend(quota_blocks(prefix, rule, tier, flags))
    leases = rule.concurrency.get(tier)
    if leases is not None and not record:
        # The concurrency limit: one more check, whose lease the request gives back when
        # it ends (Limiter.release). A record counts a response, and takes no lease.
        lease = RateSpec(leases, rule.lease_us, LEASE)
        out.append(
            Block(
                rate=lease,
                key_head=f"{prefix}:{rule.key_name}:{{",
                key_tail=f"}}:{LEASE}",
                head=f"{LEASE} {leases} {rule.lease_us} ",
                # Shadow or not; never "after": a count_when limit's lease is taken too.
                tail=f" 0 {1 if rule.shadow else 0}",
                result_head=(rule.name, tier, LEASE, leases, lease.window, rule.shadow),
                lease=True,
            )
        )
    return tuple(out)


def quota_blocks(prefix: str, rule: AppRule, tier: str, flags: int) -> tuple[Block, ...]:
    """The blocks of ``rule``'s calendar quotas for ``tier``, without their periods: the
    key ``<prefix>:<limit>:{<tag>}:<period>:quota``, to which each call's plan adds the
    period's first day (:func:`dated_block`). ``flags``: decide.lua's, as the rates'."""
    return tuple(
        Block(
            rate=RateSpec(quota=spec.quota, period_us=0, period_text=spec.period),
            key_head=f"{prefix}:{rule.key_name}:{{",
            key_tail=f"}}:{spec.period}:{CALENDAR}",
            head=f"{CALENDAR} {spec.quota} 0 ",
            tail=f" 0 {flags}",
            result_head=(
                rule.name,
                tier,
                f"{CALENDAR}:{spec.period}",
                spec.quota,
                0.0,
                rule.shadow,
            ),
            calendar=spec,
        )
        for spec in rule.quotas.get(tier, ())
    )


def dated_block(template: Block, start: int, end: int, first: str) -> Block:
    """A quota's block (:func:`quota_blocks`) for the period from ``start`` to ``end`` (µs
    since the epoch) whose first local day is ``first``: the script's spec carries the
    times (see quota.lua), the key's tail the day, so each period counts on its own key."""
    spec = template.calendar
    assert spec is not None
    rate = RateSpec(quota=spec.quota, period_us=end - start, period_text=spec.period)
    name, tier, algorithm, quota, _window, shadow = template.result_head
    return Block(
        rate=rate,
        key_head=template.key_head,
        key_tail=f"{template.key_tail}:{first}",
        head=f"{CALENDAR} {spec.quota} {end} ",
        tail=f" {start} {template.tail[-1]}",
        result_head=(name, tier, algorithm, quota, rate.window, shadow),
        # Dated: a plan of these checks needs no more dating (QuotaCore.prepare).
        calendar=None,
    )


# Built for every decision: plain slotted dataclasses, not frozen ones, whose __init__ pays
# an object.__setattr__ per field. Nothing changes them after construction.
@dataclass(slots=True)
class Check:
    """One rate of one limit for one identity: one key in one script call."""

    rule: AppRule
    tier: str
    rate: RateSpec
    key: str
    cost: int
    block: Block

    def spec(self) -> str:
        """This check's script argument, its spec (see decide.lua)."""
        block = self.block
        if self.cost == 1:
            return block.spec_cost_1
        return f"{block.head}{self.cost}{block.tail}"


@dataclass(slots=True)
class ScriptCall:
    """One call of the limiter's script: its keys, its arguments, and on Redis Cluster
    the hash slot of its keys (which tells the shell which node's breaker applies).

    ``packed`` is the number of keys, the keys and the arguments as RESP bulk strings, in
    order, as this module encoded them: :func:`pack` then only puts the command's head
    before it. Most of those bytes are the same for every request of a limit and tier, so
    they are encoded once (``Block.packed_cost_1``); hiredis' packer formats every
    argument's length with ``sprintf``. Empty (a call made elsewhere, in tests): ``pack``
    packs ``keys`` and ``args`` itself.
    """

    keys: tuple[str, ...]
    args: tuple[str, ...]
    slot: int | None = None
    packed: bytes = b""


# The operations' bulk strings, and an empty one (``now`` without a test clock).
_OPERATION_BULKS = {name: bulk(name) for name in ("hit", "peek", "refund")}
_EMPTY_BULK = bulk("")
# "1": the number of keys, and the number of checks, of a call with one check.
_ONE_BULK = bulk("1")
# The slacks a Core sends (see Core.__init__), encoded once.
_SLACK_BULKS = {slack: bulk(slack) for slack in ("0", str(TEST_CLOCK_TTL_SLACK_MS))}


def encoded_lead(operation: str, now: str, nonce: str, slack: str) -> bytes:
    """The encoded arguments every call of a plan starts with: operation, now, nonce,
    slack (see decide.lua)."""
    # The nonce is ASCII (hex digits, or empty): as many bytes as characters.
    return b"%b%b$%d\r\n%b\r\n%b" % (
        _OPERATION_BULKS[operation],
        bulk(now) if now else _EMPTY_BULK,
        len(nonce),
        nonce.encode(),
        _SLACK_BULKS.get(slack) or bulk(slack),
    )


def one_call(
    operation: Operation | Literal["refund"],
    check: Check,
    now: str,
    nonce: str,
    slack: str,
    *,
    slot: int | None = None,
) -> ScriptCall:
    """The call running one check: its key, the lead (:func:`encoded_lead`'s four arguments) and
    the check, packed in one format; most decisions' call."""
    block = check.block
    key = check.key
    encoded = key.encode()
    if check.cost == 1:
        spec = block.spec_cost_1
        packed_spec = block.packed_cost_1
    else:
        spec = check.spec()
        packed_spec = bulk(spec)
    return ScriptCall(
        (key,),
        (operation, now, nonce, slack, "1", spec),
        slot,
        # numkeys, the key, then the lead's four arguments (the nonce is ASCII), n, the check.
        b"%b$%d\r\n%b\r\n%b%b$%d\r\n%b\r\n%b%b%b"
        % (
            _ONE_BULK,
            len(encoded),
            encoded,
            _OPERATION_BULKS[operation],
            bulk(now) if now else _EMPTY_BULK,
            len(nonce),
            nonce.encode(),
            _SLACK_BULKS.get(slack) or bulk(slack),
            _ONE_BULK,
            packed_spec,
        ),
    )


def script_call(
    operation: Operation | Literal["refund"],
    checks: Sequence[Check],
    *,
    now: str,
    nonce: str,
    slack: str,
    slot: int | None,
    lead: bytes,
) -> ScriptCall:
    """The call running ``checks``; ``lead`` is ``encoded_lead(operation, now, nonce, slack)``,
    encoded once for every call of a plan (a call of one check packs its own)."""
    if len(checks) == 1:
        # One rate of one limit (most decisions): no list to build.
        return one_call(operation, checks[0], now, nonce, slack, slot=slot)
    return CallParts.of(checks).call(operation, now, nonce, slack, slot=slot, lead=lead)


@dataclass(slots=True)
class CallParts:
    """What a call of several checks sends around its lead (see :func:`encoded_lead`), encoded:
    the same for every call of those checks, so a remembered plan keeps it. Never changed
    once made; not frozen because it is also made for every call of a plan that is not
    remembered, and a frozen dataclass sets each field the slow way."""

    keys: tuple[str, ...]
    # numkeys and the keys, as RESP bulk strings: what comes before the lead.
    head: bytes
    # n and each check's spec: the arguments after the lead, as text and as RESP.
    args: tuple[str, ...]
    tail: bytes

    @classmethod
    def of(cls, checks: Sequence[Check]) -> CallParts:
        """The parts of a call of ``checks`` (two or more)."""
        count = str(len(checks))
        head: list[bytes] = [bulk(count)]
        head.extend([bulk(check.key) for check in checks])
        args: list[str] = [count]
        tail: list[bytes] = [bulk(count)]
        for check in checks:
            if check.cost == 1:
                args.append(check.block.spec_cost_1)
                tail.append(check.block.packed_cost_1)
            else:
                spec = check.spec()
                args.append(spec)
                tail.append(bulk(spec))
        return cls(
            tuple([check.key for check in checks]), b"".join(head), tuple(args), b"".join(tail)
        )

    def call(
        self,
        operation: Operation | Literal["refund"],
        now: str,
        nonce: str,
        slack: str,
        *,
        slot: int | None,
        lead: bytes,
    ) -> ScriptCall:
        """The call with this lead (``encoded_lead(operation, now, nonce, slack)``)."""
        return ScriptCall(
            self.keys,
            (operation, now, nonce, slack, *self.args),
            slot,
            self.head + lead + self.tail,
        )


# --- the command -------------------------------------------------------------------------

FCALL = b"FCALL"
EVALSHA = b"EVALSHA"
EVAL = b"EVAL"
_HEADS = {
    FCALL: (FCALL, _script.FUNCTION),
    EVALSHA: (EVALSHA, _script.SHA),
    EVAL: (EVAL, _script.SOURCE),
}

# What a wire writes and how many replies it reads for it.
Write = tuple[bytes, int]

# The head of a call's command (the command, the function's name, SHA or script), by
# command, number of keys and number of arguments: bounded by the policy's limits.
_HEADS_MEMO: Memo[tuple[bytes, int, int], bytes] = Memo(1024)
_PACKED_HEADS = _HEADS_MEMO.entries  # read by every pack()


def _packed_head(how: bytes, keys: int, args: int) -> bytes:
    """The RESP array header and the command's first two bulk strings."""
    command, name = _HEADS[how]
    head = b"*%d\r\n%b%b" % (3 + keys + args, _bulk_of(command), bulk(name))
    _HEADS_MEMO.keep((how, keys, args), head)
    return head


def pack(call: ScriptCall, how: bytes) -> bytes:
    """``call`` as one RESP command: FCALL of the library's function, EVALSHA by the
    script's SHA, or EVAL with the script's text."""
    if call.packed:
        # Encoded here already (ScriptCall.packed): only the head.
        keys, args = len(call.keys), len(call.args)
        head = _PACKED_HEADS.get((how, keys, args)) or _packed_head(how, keys, args)
        return head + call.packed
    return pack_command((*_HEADS[how], len(call.keys), *call.keys, *call.args))


LOAD = pack_command((b"FUNCTION", b"LOAD", _script.LIBRARY))
ASKING = pack_command((b"ASKING",))


def pack_calls(calls: Sequence[ScriptCall], how: bytes, *, asking: bool = False) -> Write:
    """Several calls as one buffer for one write, and the number of replies it gets.

    ``asking`` puts ASKING before each call (an ASK redirection: the node importing the
    call's slot answers it only then); each call then has two replies (see
    ``_protocol.unpair``).
    """
    if len(calls) == 1 and not asking:
        return pack(calls[0], how), 1
    head = ASKING if asking else b""
    packed = b"".join([head + pack(call, how) for call in calls])
    return packed, 2 * len(calls) if asking else len(calls)
