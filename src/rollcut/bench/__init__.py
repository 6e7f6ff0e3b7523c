"""Benchmarks behind ``rollcut bench``: each measures rollcut against a raw baseline in the same run."""

from ._checkpoint import bench_checkpoint
from ._log import bench_log, workload

__all__ = ["bench_checkpoint", "bench_log", "workload"]
