"""The emulated GPU: utilisation from the engine's busy time, memory from its KV-cache use.

Utilisation is what NVML's `utilization.gpu` approximates: the fraction of a recent window during
which the GPU was executing, here the time the engine spent inside steps. Memory is the weights
plus the KV blocks in use. (A real vLLM reserves its whole KV pool at start, so NVML shows it
constant; the emulator shows the part in use, which is the signal the control loop wants.)
"""

from __future__ import annotations

from collections import deque

from engine_sim.profiles import effective_profile
from slotshift.config import EngineSimConfig


class BusyTracker:
    """Busy intervals of the last window, and the busy fraction of that window."""

    def __init__(self, window_s: float) -> None:
        if window_s <= 0:
            raise ValueError("window_s must be positive")
        self._window_s = window_s
        self._intervals: deque[tuple[float, float]] = deque()
        self._busy_since: float | None = None

    def begin(self, now_s: float) -> None:
        """The GPU starts working (a step begins)."""
        if self._busy_since is not None:
            raise RuntimeError("already busy")
        self._busy_since = now_s

    def end(self, now_s: float) -> None:
        """The GPU stops working (the step is done)."""
        if self._busy_since is None:
            raise RuntimeError("not busy")
        self._intervals.append((self._busy_since, now_s))
        self._busy_since = None
        self._forget_before(now_s - self._window_s)

    def utilization(self, now_s: float) -> float:
        """Busy fraction of the window ending at now_s, 0 to 1 (a step in progress counts)."""
        window_start = now_s - self._window_s
        busy = 0.0
        for start, end in self._intervals:
            busy += max(0.0, min(end, now_s) - max(start, window_start))
        if self._busy_since is not None:
            busy += max(0.0, now_s - max(self._busy_since, window_start))
        return min(1.0, busy / self._window_s)

    def _forget_before(self, cutoff_s: float) -> None:
        while self._intervals and self._intervals[0][1] <= cutoff_s:
            self._intervals.popleft()


class GpuMemoryModel:
    """Memory in use: the model's weights plus the KV-cache blocks the engine holds."""

    def __init__(self, config: EngineSimConfig) -> None:
        profile = effective_profile(config)
        self._total_bytes = profile.gpu_memory_total_bytes
        self._weights_bytes = profile.model_weights_bytes
        self._bytes_per_block = profile.kv_cache_bytes_per_token * config.block_size_tokens

    @property
    def total_bytes(self) -> int:
        return self._total_bytes

    def used_bytes(self, used_blocks: int) -> int:
        return min(self._total_bytes, self._weights_bytes + used_blocks * self._bytes_per_block)
