"""Keeping a round's leases alive while its process works, and only while it does.

A lease is the receiver's INFLIGHT lock. If it lived as long as the slowest copy or merge could take, a
round killed mid-copy (kill -9, an OOM-killed worker) would block every later round for that long. Leases
are short instead (``round.lease_ttl_us``) and a heartbeat thread renews the holder's live leases every
third of that while the block runs: alive, the round keeps them; dead, they lapse within one TTL.

A beat that cannot reach the catalog (PostgreSQL restarting) is simply tried again at the next beat; the
work itself meets the outage on its own next catalog call.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy.exc import SQLAlchemyError

from segrep.catalog import Catalog
from segrep.catalog import leases as ls
from segrep.core import hlc
from segrep.replication.round import lease_ttl_us


def renew_once(catalog: Catalog, holder: str, ttl_us: int) -> int:
    """One beat: the holder's live leases now expire one TTL from now. Returns how many were renewed."""
    now = hlc.now_us()
    with catalog.write() as s:
        return ls.renew(s, holder, now + ttl_us, now)


@contextmanager
def heartbeat(catalog: Catalog, holder: str, ttl_us: int | None = None) -> Iterator[None]:
    """Renew ``holder``'s leases every third of the TTL until the block ends (however it ends)."""
    ttl = lease_ttl_us() if ttl_us is None else ttl_us
    stop = threading.Event()

    def beat() -> None:
        while not stop.wait(ttl / 3 / 1_000_000):
            try:
                renew_once(catalog, holder, ttl)
            except SQLAlchemyError:  # the catalog is away for a moment: the next beat tries again
                continue

    thread = threading.Thread(target=beat, name=f"segrep-heartbeat-{holder}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
