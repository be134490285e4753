"""Reconnection delays: exponential, capped, with jitter."""

from __future__ import annotations

import random


class Backoff:
    """Delays that double from initial_s up to max_s, each drawn from [half, all] of its step.

    The jitter spreads clients that lost the same server, so they do not all come back in
    the same instant when it restarts; drawing below the step (never above) keeps every delay
    within max_s.
    """

    def __init__(self, initial_s: float, max_s: float, rng: random.Random) -> None:
        if initial_s <= 0 or max_s < initial_s:
            raise ValueError(f"need 0 < initial_s <= max_s, got {initial_s} and {max_s}")
        self._initial_s = initial_s
        self._max_s = max_s
        self._rng = rng
        self._step_s = initial_s

    def next_delay_s(self) -> float:
        """The delay before the next attempt; each call doubles the step up to max_s."""
        step = self._step_s
        self._step_s = min(self._max_s, self._step_s * 2)
        return step * self._rng.uniform(0.5, 1.0)

    def reset(self) -> None:
        """Start again from initial_s (after a connection that worked)."""
        self._step_s = self._initial_s
