"""Pure: how long to wait before attempt n. Exponential with full jitter, capped, honouring Retry-After.

Randomness is passed in; nothing here sleeps. The caller keeps the attempt count and resets it
to zero on success (ship/sender.py).
"""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Backoff:
    initial_s: float = 1.0
    max_s: float = 60.0

    def ceiling(self, attempt: int) -> float:
        """The upper bound for attempt n (1-based): initial * 2^(n-1), capped at max_s."""
        if attempt < 1:
            return 0.0
        return min(self.max_s, self.initial_s * (2.0 ** min(attempt - 1, 62)))

    def delay(self, attempt: int, rng: random.Random, retry_after_s: float | None = None) -> float:
        """Seconds to wait before attempt n: uniform in [initial, ceiling(n)] (full jitter above the
        floor, so a first retry is never hot), never below Retry-After (itself capped at max_s)."""
        if attempt < 1:
            return 0.0
        top = self.ceiling(attempt)
        low = min(self.initial_s, top)
        d = low + rng.random() * (top - low)
        if retry_after_s is not None and retry_after_s > 0:
            d = max(d, min(retry_after_s, self.max_s))
        return d
