"""The demo (``rollcut demo``): a collection told as it happens, a crash mid-episode, its recovery,
and the same crash recovered without rollcut on copies, side by side; its generated task sets.

Built on the public APIs below it: the collector (:mod:`rollcut.collect`), the process harness
(:mod:`rollcut.testing`), the work tally (:func:`rollcut.replay.count_work`).
"""

from . import _story
from ._phase import DEMO_NAMESPACE
from ._run import ALTERNATIVES, ENGINE_TASK_PARAMS, run_demo
from ._story import *  # noqa: F403  (the story's events, whole: their own ``__all__`` is the list)
from ._tasks import demo_rows, demo_tasks

__all__ = [
    *_story.__all__,
    "ALTERNATIVES",
    "DEMO_NAMESPACE",
    "ENGINE_TASK_PARAMS",
    "demo_rows",
    "demo_tasks",
    "run_demo",
]
