"""Pipeline parallelism: schedules as data (AFAB/GPipe, 1F1B), stages, and an executor.

    schedule    ``Action(kind, microbatch, stage)``; ``schedule(name, n_stages, m)`` -> per
                rank, the ordered actions; ``bubble_fraction(p, m)``
    stage       ``partition`` / ``stage_module`` (cut layers into consecutive stages);
                tagged point-to-point send/receive of activations and gradients
    executor    ``pipeline_train_step`` (one step on every rank of a group) and
                ``run_actions`` (one rank's actions, with stash statistics)
"""

from .executor import StepStats, pipeline_train_step, run_actions
from .schedule import Action, afab, bubble_fraction, one_f_one_b, schedule
from .stage import partition, stage_module

__all__ = [
    "Action", "StepStats", "afab", "bubble_fraction", "one_f_one_b", "partition",
    "pipeline_train_step", "run_actions", "schedule", "stage_module",
]
