"""The emulated GPU: busy fraction over a sliding window, memory from KV blocks in use."""

from __future__ import annotations

import pytest

from engine_sim.gpu_model import BusyTracker, GpuMemoryModel
from slotshift.config import EngineSimConfig


def test_utilization_is_busy_time_over_the_window() -> None:
    tracker = BusyTracker(window_s=1.0)
    tracker.begin(10.0)
    tracker.end(10.2)
    tracker.begin(10.5)
    tracker.end(10.6)

    assert tracker.utilization(10.6) == pytest.approx(0.3)
    # The first 0.1 s of the first interval has slid out of the window (10.1 .. 11.1).
    assert tracker.utilization(11.1) == pytest.approx(0.2)
    assert tracker.utilization(20.0) == 0.0


def test_a_step_in_progress_counts_up_to_now_and_never_above_one() -> None:
    tracker = BusyTracker(window_s=0.5)
    tracker.begin(1.0)
    assert tracker.utilization(1.25) == pytest.approx(0.5)
    assert tracker.utilization(3.0) == 1.0


def test_begin_and_end_must_alternate() -> None:
    tracker = BusyTracker(window_s=1.0)
    with pytest.raises(RuntimeError):
        tracker.end(1.0)
    tracker.begin(1.0)
    with pytest.raises(RuntimeError):
        tracker.begin(1.0)


def test_memory_is_weights_plus_blocks_in_use() -> None:
    config = EngineSimConfig(
        gpu_memory_total_bytes=10_000_000_000,
        model_weights_bytes=1_000_000_000,
        kv_cache_bytes_per_token=1000,
        block_size_tokens=16,
        kv_cache_blocks=100_000,
    )
    memory = GpuMemoryModel(config)
    assert memory.total_bytes == 10_000_000_000
    assert memory.used_bytes(0) == 1_000_000_000
    assert memory.used_bytes(10) == 1_000_000_000 + 10 * 16 * 1000
