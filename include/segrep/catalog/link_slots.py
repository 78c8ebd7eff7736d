"""Link slots, on SQLite and PostgreSQL: who holds a share of a link's byte-rate cap, who waits, and how much
each may send (DESIGN section 17, issue 36). Every write of ``link_slots`` and ``link_budgets`` is here.

A copier that sends over a (source, target) link holds a slot: a row with its class (``CopyPriority``), its
share in bytes per second and an expiry its heartbeat pushes on (``renew``, about every second), so a holder
that died stops counting within one TTL, like a round's leases. Every change of a link's slots first locks the
link's ``link_budgets`` row (INSERT ... ON CONFLICT DO NOTHING, then SELECT ... FOR UPDATE; on SQLite the
write transaction is the lock), so two holders never both read the slots and then both write: nothing here
reads and then writes across transactions.

Shares. The cap is split among the admitted (not waiting) holders by their class's weight
(``core.links``: rounds 8, failback and catch-up 4, bootstrap 2, repair, scrub and verify 1): no class
starves, rounds take most. A holder's share changes only when it renews, so the sum of the stored shares is
kept within the cap at every commit: a holder takes ``min(its fair share, cap - what the others hold now)``.
A newcomer may start below its fair share (even at 0) and reaches it at its next renew, once the others have
given up theirs at their own renews: within two beats of any change (a holder arriving or leaving, the cap
changing). Each holder paces itself at its stored share, so what crosses the link never exceeds the cap.

Concurrency. With ``max_concurrent`` set, a holder beyond it is recorded as waiting (share 0) and admitted
at a renew when a slot is free, the highest class first, then the oldest: a waiting round goes before a
waiting bootstrap. When none is free, the head of the queue pauses the newest admitted holder of a lower class
and takes its place: a long bootstrap holding the only slot never keeps a round waiting. The paused holder
is recorded as waiting and holds its copies at its next renew (paused at a chunk, never cut off mid-file);
its share counts against the cap until then, so the round's share grows only once it has paused. It resumes
when a slot frees. Under a concurrency of 1, rounds that follow one another keep a bootstrap paused: the
operator asked for one copy at a time, and rounds go first; with room for two, the weights share the cap.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from segrep.catalog import models as m
from segrep.catalog.sql import insert_ignore, rowcount
from segrep.core.links import CopyPriority


@dataclass(frozen=True)
class Link:
    """A direction between two sites, by site id."""

    source_site_id: int
    target_site_id: int


@dataclass(frozen=True)
class Limits:
    """What a link allows now: bytes per second for the sum of its holders (None: unlimited) and how many
    holders may send at once (None: any number)."""

    cap_bytes_per_s: int | None = None
    max_concurrent: int | None = None

    def __post_init__(self) -> None:
        if self.cap_bytes_per_s is not None and self.cap_bytes_per_s <= 0:
            raise ValueError(f"a link's cap must be more than 0 bytes per second, not {self.cap_bytes_per_s}")
        if self.max_concurrent is not None and self.max_concurrent <= 0:
            raise ValueError(f"a link's concurrency must be at least 1, not {self.max_concurrent}")


@dataclass(frozen=True)
class Grant:
    """What a holder may do after an acquire or a renew: send at ``share`` bytes per second (None: unpaced),
    or wait (``waiting``: the link's concurrency is full); ``lost`` if its slot lapsed (it stopped renewing for
    a TTL and was expired): it must acquire again."""

    share: int | None
    waiting: bool
    lost: bool = False


@dataclass(frozen=True)
class SlotView:
    """A live slot as status shows it."""

    holder: str
    link: Link
    what: CopyPriority
    share: int | None
    waiting: bool
    acquired_us: int
    expires_us: int
    sent_bytes: int = 0
    rate: int | None = None  # measured at its beats (smoothed over the last few)


def fair_shares(cap: int | None, holders: dict[str, CopyPriority]) -> dict[str, int | None]:
    """Each admitted holder's share of ``cap`` by its class's weight (None for all when unlimited); the sum
    never exceeds the cap (shares are rounded down)."""
    if cap is None:
        return dict.fromkeys(holders)
    total = sum(what.weight for what in holders.values())
    return {holder: cap * what.weight // total for holder, what in holders.items()}


def acquire(s: Session, link: Link, holder: str, what: CopyPriority, limits: Limits, now_us: int, ttl_us: int) -> Grant:
    """Take a slot on ``link`` for ``holder`` (new: a uuid per lease), admitted at once if the link's
    concurrency allows, else recorded as waiting."""
    _lock(s, link, limits, now_us)
    s.add(
        m.LinkSlot(
            holder=holder,
            source_site_id=link.source_site_id,
            target_site_id=link.target_site_id,
            what=str(what),
            priority=what.weight,
            share_bytes_per_s=0,
            waiting=True,
            acquired_us=now_us,
            heartbeat_us=now_us,
            expires_us=now_us + ttl_us,
        )
    )
    s.flush()
    return _settle(s, link, holder, limits)


def renew(
    s: Session, link: Link, holder: str, limits: Limits, now_us: int, ttl_us: int, sent_bytes: int | None = None
) -> Grant:
    """Push the holder's expiry on, admit it if it waits and a slot is free, and store its share under the
    limits in force now (the caller supplies them each time: a time window may have changed the cap). With
    ``sent_bytes`` (what the holder has sent so far), its rate since the last beat is stored too."""
    _lock(s, link, limits, now_us)
    row = s.get(m.LinkSlot, holder, populate_existing=True)
    if row is None:
        return Grant(share=0, waiting=True, lost=True)
    if sent_bytes is not None:
        elapsed_us = now_us - row.heartbeat_us
        if elapsed_us > 0:  # smoothed: a beat sees whole chunks (a MiB) sent, not a steady flow
            now_rate = max(0, sent_bytes - (row.sent_bytes or 0)) * 1_000_000 // elapsed_us
            old = row.rate_bytes_per_s
            row.rate_bytes_per_s = now_rate if old is None else (old + now_rate) // 2
        row.sent_bytes = sent_bytes
    row.heartbeat_us = now_us
    row.expires_us = now_us + ttl_us
    return _settle(s, link, holder, limits)


def release(s: Session, holder: str) -> bool:
    """Give the slot up; False if it had already lapsed."""
    res = s.execute(delete(m.LinkSlot).where(m.LinkSlot.holder == holder).execution_options(synchronize_session=False))
    return bool(rowcount(res))


def expire(s: Session, link: Link, now_us: int) -> int:
    """Drop the link's slots whose holders stopped renewing; how many."""
    res = s.execute(
        delete(m.LinkSlot)
        .where(
            m.LinkSlot.source_site_id == link.source_site_id,
            m.LinkSlot.target_site_id == link.target_site_id,
            m.LinkSlot.expires_us <= now_us,
        )
        .execution_options(synchronize_session=False)
    )
    return rowcount(res)


def slots(s: Session, now_us: int) -> list[SlotView]:
    """Every live slot of every link, admitted ones first, then by class and age (status's order)."""
    q = (
        select(m.LinkSlot)
        .where(m.LinkSlot.expires_us > now_us)
        .order_by(
            m.LinkSlot.source_site_id,
            m.LinkSlot.target_site_id,
            m.LinkSlot.waiting,
            m.LinkSlot.priority.desc(),
            m.LinkSlot.acquired_us,
        )
    )
    return [
        SlotView(
            r.holder,
            Link(r.source_site_id, r.target_site_id),
            CopyPriority(r.what),
            r.share_bytes_per_s,
            r.waiting,
            r.acquired_us,
            r.expires_us,
            r.sent_bytes or 0,
            r.rate_bytes_per_s,
        )
        for r in s.scalars(q)
    ]


@dataclass(frozen=True)
class LinkState:
    """One link as status shows it: the limits in force, the rate its admitted holders may send together now
    (None: some holder is unpaced), what they send, measured at their beats (``sending``), who sends and who
    waits, and why each waits."""

    link: Link
    limits: Limits
    rate: int | None
    holders: list[SlotView]
    waiting: list[tuple[SlotView, str]]

    @property
    def sending(self) -> int:
        return sum(v.rate or 0 for v in self.holders)


def link_states(s: Session, now_us: int) -> list[LinkState]:
    """Every link that has live slots, by source and target site id (not a site's request slots, on the
    pseudo-link from the site to itself: ``catalog.request_slots``)."""
    by_link: dict[Link, list[SlotView]] = {}
    for view in slots(s, now_us):
        if view.link.source_site_id != view.link.target_site_id:
            by_link.setdefault(view.link, []).append(view)
    out = []
    for link, views in by_link.items():
        limits = budget(s, link) or Limits()
        admitted = [v for v in views if not v.waiting]
        shares = [v.share for v in admitted]
        rate = None if any(x is None for x in shares) else sum(x or 0 for x in shares)
        held_by = ", ".join(sorted({str(v.what) for v in admitted})) or "nobody"
        waiting = []
        for ahead, view in enumerate(v for v in views if v.waiting):
            why = f"the link allows {limits.max_concurrent} copies at once, all held ({held_by})"
            waiting.append((view, why + (f"; {ahead} waiting ahead of it" if ahead else "")))
        out.append(LinkState(link, limits, rate, admitted, waiting))
    return out


def budget(s: Session, link: Link) -> Limits | None:
    """The limits last supplied for the link (the cap in force), or None if it never had a holder."""
    row = s.get(m.LinkBudget, (link.source_site_id, link.target_site_id))
    return None if row is None else Limits(row.cap_bytes_per_s, row.max_concurrent)


def _lock(s: Session, link: Link, limits: Limits, now_us: int) -> None:
    """Lock the link (its budget row, made on first use), record the limits in force and drop dead holders."""
    key = {"source_site_id": link.source_site_id, "target_site_id": link.target_site_id}
    insert_ignore(s, m.LinkBudget, {**key, "cap_bytes_per_s": None, "max_concurrent": None, "updated_us": now_us})
    row = s.get(m.LinkBudget, (link.source_site_id, link.target_site_id), with_for_update=True, populate_existing=True)
    assert row is not None  # inserted above or already there, and budget rows are never deleted
    row.cap_bytes_per_s, row.max_concurrent, row.updated_us = limits.cap_bytes_per_s, limits.max_concurrent, now_us
    expire(s, link, now_us)


def _settle(s: Session, link: Link, holder: str, limits: Limits) -> Grant:
    """Admit ``holder`` if it waits and may go, then store its share (the module docstring says how)."""
    rows = list(
        s.scalars(
            select(m.LinkSlot)
            .where(m.LinkSlot.source_site_id == link.source_site_id, m.LinkSlot.target_site_id == link.target_site_id)
            .execution_options(populate_existing=True)
        )
    )
    me = next(r for r in rows if r.holder == holder)
    if me.waiting:
        admitted = [r for r in rows if not r.waiting]
        free = len(rows) if limits.max_concurrent is None else limits.max_concurrent - len(admitted)
        queue = sorted((r for r in rows if r.waiting), key=lambda r: (-r.priority, r.acquired_us, r.holder))
        me.waiting = queue.index(me) >= free
        if me.waiting and queue[0] is me:  # the head of the queue pauses the newest holder of a lower class
            lower = sorted(
                (r for r in admitted if r.priority < me.priority), key=lambda r: (r.priority, -r.acquired_us)
            )
            if lower:
                lower[0].waiting = True  # its share stays counted until it renews and holds its copies
                me.waiting = False
    if me.waiting:
        me.share_bytes_per_s = 0
        return Grant(share=0, waiting=True)
    cap = limits.cap_bytes_per_s
    fair = fair_shares(cap, {r.holder: CopyPriority(r.what) for r in rows if not r.waiting})[holder]
    if cap is not None:
        # an unpaced holder (admitted while the link was unlimited) counts as holding all of it until it renews
        others = sum(cap if r.share_bytes_per_s is None else r.share_bytes_per_s for r in rows if r is not me)
        fair = max(0, min(fair or 0, cap - others))
    me.share_bytes_per_s = fair
    s.flush()
    return Grant(share=fair, waiting=False)
