"""Orbax checkpoints: the last N for resume, plus the best by validation accuracy.

Checkpoints are written atomically by orbax (to a temporary directory, renamed on success), so
an interrupted save is never restored.
"""

from __future__ import annotations

import os
from typing import Any

import orbax.checkpoint as ocp
from orbax.checkpoint import checkpoint_managers as policies

CHECKPOINT_DIR = 'checkpoints'


class Checkpointer:
  """Saves and restores a train state in ``workdir/checkpoints``."""

  def __init__(self, workdir: str, keep: int):
    options = ocp.CheckpointManagerOptions(
        preservation_policy=policies.AnyPreservationPolicy([
            policies.LatestN(keep),
            policies.BestN(get_metric_fn=lambda m: m['accuracy'], n=1,
                           keep_checkpoints_without_metrics=False),
        ]),
        best_fn=lambda m: m['accuracy'], best_mode='max')
    self.manager = ocp.CheckpointManager(
        os.path.abspath(os.path.join(workdir, CHECKPOINT_DIR)), options=options)

  def latest_step(self) -> int | None:
    return self.manager.latest_step()

  def best_step(self) -> int | None:
    return self.manager.best_step()

  def save(self, step: int, state: Any, accuracy: float | None = None) -> None:
    """Saves asynchronously; ``accuracy`` (mean validation accuracy) ranks the best checkpoint."""
    metrics = None if accuracy is None else {'accuracy': float(accuracy)}
    self.manager.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state)),
                      metrics=metrics, force=True)

  def restore(self, step: int, abstract_state: Any) -> Any:
    """Restores onto the shardings given by ``abstract_state`` (jax.ShapeDtypeStruct leaves)."""
    restored = self.manager.restore(
        step, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract_state)))
    return restored['state']

  def restore_latest(self, abstract_state: Any) -> tuple[int, Any]:
    """(step, state) of the newest checkpoint, or (0, None) when there is none."""
    step = self.latest_step()
    if step is None:
      return 0, None
    return step, self.restore(step, abstract_state)

  def wait(self) -> None:
    self.manager.wait_until_finished()

  def close(self) -> None:
    self.manager.close()
