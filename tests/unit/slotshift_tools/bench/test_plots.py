"""The plots are written as valid PNG images."""

from __future__ import annotations

from pathlib import Path

from matplotlib.image import imread

from slotshift_tools.bench.plots import (
    RunSeries,
    plot_allocation,
    plot_gpu_utilization,
    plot_reclaim,
    plot_throughput,
)
from slotshift_tools.bench.stats import Window
from tests.unit.slotshift_tools.bench.runs import sample

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _assert_png(path: Path) -> None:
    assert path.read_bytes()[:8] == PNG_SIGNATURE
    height, width, _ = imread(path).shape
    assert height > 100 and width > 100


def test_the_three_plots_are_pngs(tmp_path: Path) -> None:
    series = [
        RunSeries("static", Window(2, 10), [sample(t / 2, {"A": 4, "B": 4}) for t in range(21)]),
        RunSeries("pool", Window(2, 10), [sample(t / 2, {"pool": 8}, gpu=None) for t in range(21)]),
    ]
    policies = {
        name: {"tenants": {"A": {"output_throughput": 10.0}, "B": {"output_throughput": None}}}
        for name in ("static", "pool")
    }
    plot_throughput(policies, ["A", "B"], tmp_path / "throughput.png")
    plot_allocation(series, ["A", "B"], 8, tmp_path / "allocation.png")
    plot_gpu_utilization(series, tmp_path / "gpu.png")
    for name in ("throughput.png", "allocation.png", "gpu.png"):
        _assert_png(tmp_path / name)


def test_the_reclaim_plot_zooms_on_a_burst(tmp_path: Path) -> None:
    series = [
        RunSeries(name, Window(2, 10), [sample(t / 4, {"A": 4, "B": 4}) for t in range(41)])
        for name in ("slo", "slo-no-preempt")
    ]
    plot_reclaim(series, "A", 5.0, 4, tmp_path / "reclaim_A.png")
    _assert_png(tmp_path / "reclaim_A.png")
