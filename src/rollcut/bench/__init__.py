"""Benchmarks behind ``rollcut bench``: each measures rollcut against a raw baseline in the same run."""

from ._baselines import BASELINES
from ._chaos import FAULTS, bench_chaos
from ._checkpoint import bench_checkpoint
from ._durability import bench_durability
from ._e2e import THROUGHPUT_WAYS, WAYS, bench_e2e
from ._engine import bench_model_engine
from ._log import bench_log, workload
from ._model import bench_model
from ._nemo_gym import bench_nemo_gym
from ._relay import bench_relay
from ._sandbox import bench_sandbox
from ._soak import bench_soak
from ._train import bench_train
from ._workers import bench_workers

__all__ = [
    "BASELINES",
    "FAULTS",
    "THROUGHPUT_WAYS",
    "WAYS",
    "bench_chaos",
    "bench_checkpoint",
    "bench_durability",
    "bench_e2e",
    "bench_log",
    "bench_model",
    "bench_model_engine",
    "bench_nemo_gym",
    "bench_relay",
    "bench_sandbox",
    "bench_soak",
    "bench_train",
    "bench_workers",
    "workload",
]
