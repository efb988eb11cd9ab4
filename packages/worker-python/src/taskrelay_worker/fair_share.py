"""Fair-share priorities (PROTOCOL.md §25, §26.6), as ``fair-share.ts``: a priority level's band of BullMQ
priorities, and how long a child's fair-share entry lives."""

from __future__ import annotations

from typing import Any

#: A fair-share entry of a child outlives its possible wait by this much (FAIR_SHARE_TTL_MS).
FAIR_SHARE_TTL_MS = 3_600_000 + 60_000
#: fair-share.ts: a priority level's band, the levels, the default level.
PRIORITY_BAND = 262_144
MAX_FAIR_PRIORITY = PRIORITY_BAND - 1
PRIORITY_LEVELS = 5
DEFAULT_PRIORITY = 3


def priority_base(level: Any) -> int:
    """What a priority level adds to a fair-share rank (``priorityBase``): 0 for level 1."""
    try:
        whole = int(level) if isinstance(level, (int, float)) and not isinstance(level, bool) else 0
    except (OverflowError, ValueError):
        whole = 0
    clamped = min(PRIORITY_LEVELS, max(1, whole or DEFAULT_PRIORITY))
    return (clamped - 1) * PRIORITY_BAND


def priority_level_of(bull_priority: Any) -> int:
    """The priority level of a BullMQ priority (``priorityLevelOf``): 0, BullMQ's "none", is the default level."""
    value = int(bull_priority) if isinstance(bull_priority, (int, float)) and not isinstance(bull_priority, bool) else 0
    return (value - 1) // PRIORITY_BAND + 1 if value > 0 else DEFAULT_PRIORITY
