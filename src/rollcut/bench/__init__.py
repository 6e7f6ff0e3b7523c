"""Benchmarks behind ``rollcut bench``: each measures rollcut against a raw baseline in the same run."""

from ._log import bench_log, workload

__all__ = ["bench_log", "workload"]
