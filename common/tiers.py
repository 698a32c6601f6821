"""The three request tiers (R5, docs/requirements.md): one definition for the engine, the API
and config.

interactive  a user is waiting: served first, a low-latency lane
analytical   tolerates hundreds of ms to seconds: the big-batch lane
offline      bulk work: only on idle capacity
"""

from __future__ import annotations

import enum


class Tier(enum.IntEnum):
    """Priority lanes; a lower value is served first."""

    INTERACTIVE = 0
    ANALYTICAL = 1
    OFFLINE = 2

    @classmethod
    def parse(cls, value: str | Tier) -> Tier:
        if isinstance(value, Tier):
            return value
        try:
            return cls[str(value).upper()]
        except KeyError:
            raise ValueError(
                f"tier={value!r} is not allowed; choose one of {list(TIERS)}"
            ) from None


# In serving order: the scheduler admits interactive before analytical before offline.
TIERS: tuple[str, ...] = tuple(t.name.lower() for t in Tier)


def check_tier(value: object, field: str = "priority") -> str:
    """The tier name, or ValueError naming the field, the value and the allowed names."""
    if value not in TIERS:
        raise ValueError(f"{field}={value!r} is not one of {list(TIERS)}")
    return str(value)


def tiers_up_to(tier: str) -> tuple[str, ...]:
    """This tier and every tier served before it."""
    return TIERS[: TIERS.index(tier) + 1]
