"""How old a key may be, and whether its adapter still remembers it, as pure functions.

An adapter that declares ``retention_s`` remembers a key at least that long
after it first heard of it; past that, a look-up that finds nothing proves
nothing. The key's age decides, so it must be measured on a clock a skewed
worker cannot fool: a worker whose clock runs 30 s behind would otherwise
read a key that is 20 s old as -10 s old, take an absence within a 5 s
retention as final, and send the write again (a second effect).

So the age is the larger of two measures, each of them an upper bound
where its clocks are honest:

================================  ============================================
measure                           from
================================  ============================================
the store's (``store_age_s``)     the store's clock now, less the store's
                                  clock when it recorded the key's first
                                  ledger row (that row lands before anything
                                  is sent, so the adapter heard of the key
                                  later). Read after the look-up answered.
the runtime's                     the runtime's clock now, less the signed
                                  time the key was minted or first sent
================================  ============================================

The store's clock is the one leases are judged by: every worker that shares
the store agrees on it. Where the store could not say (rows written before
it recorded its clock, a store that keeps none), the runtime's measure is
charged :data:`UNMEASURED_SKEW_S` more, the skew tolerated for signed
documents (``tether.core._evidence.CLOCK_SKEW``). Taking the larger of the
two means a store whose record was edited can never make a key look younger
than the runtime's own clock says.
"""

from __future__ import annotations

from datetime import datetime

#: Seconds added to the runtime's measure of a key's age where the store's clock could not
#: say: the skew tolerated for signed documents (``tether.core._evidence.CLOCK_SKEW``), not
#: imported from there so that the case rules can read this module without a cycle.
UNMEASURED_SKEW_S = 60.0


def key_age(now: datetime, since: datetime, store_age_s: float | None) -> float:
    """The oldest ``since``'s key may be at ``now``: the larger measure (module docstring)."""
    local = (now - since).total_seconds()
    if store_age_s is None:
        return local + UNMEASURED_SKEW_S
    return max(local, store_age_s)


def remembered(
    retention_s: float | None, now: datetime, since: datetime, store_age_s: float | None
) -> bool:
    """Whether an adapter that keeps keys ``retention_s`` seconds still remembers this one.

    ``None`` retention: it keeps them for ever.
    """
    if retention_s is None:
        return True
    return key_age(now, since, store_age_s) <= retention_s
