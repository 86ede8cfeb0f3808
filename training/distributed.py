"""Multi-host start-up: ``jax.distributed.initialize`` from flags or the environment (entry
points call ``define_flags()`` at import, ``initialize_from_flags()`` first in ``main``)."""

from __future__ import annotations

import os

import jax
from absl import flags

FLAGS = flags.FLAGS


def define_flags() -> None:
  flags.DEFINE_enum('distributed', 'auto', ['auto', 'on', 'off'],
                    "Start jax.distributed: 'auto' when a coordinator address is given or a "
                    "cluster (TPU pod, SLURM, Open MPI) is detected; 'on' always; 'off' never.")
  flags.DEFINE_string('coordinator_address', None,
                      'host:port of process 0 (multi-host GPU/CPU); env JAX_COORDINATOR_ADDRESS.')
  flags.DEFINE_integer('num_processes', None, 'Number of processes (with --coordinator_address).')
  flags.DEFINE_integer('process_id', None, 'This process, 0..num_processes-1.')
  flags.DEFINE_integer('initialization_timeout_s', 300,
                       'Seconds to wait for all processes to join.')
  flags.DEFINE_integer('heartbeat_timeout_s', 100,
                       'Seconds without a heartbeat after which a process counts as lost and '
                       'the others stop with an error.')


def _cluster_detected() -> bool:
  """Whether a launcher that ``jax.distributed.initialize()`` detects started this process: SLURM
  or Open MPI with several tasks, a multi-host TPU slice, or a Cloud TPU VM."""
  env = os.environ
  if all(k in env for k in ('SLURM_JOB_ID', 'SLURM_STEP_NODELIST', 'SLURM_NTASKS',
                            'SLURM_PROCID', 'SLURM_LOCALID')):
    return int(env['SLURM_NTASKS']) > 1
  if 'OMPI_MCA_orte_hnp_uri' in env:
    return int(env.get('OMPI_COMM_WORLD_SIZE', '1')) > 1
  if ',' in env.get('TPU_PROCESS_ADDRESSES', env.get('TPU_WORKER_HOSTNAMES', '')):
    return True
  return os.path.exists('/dev/accel0') or os.path.isdir('/dev/vfio')


def initialize_from_flags() -> bool:
  """Starts the JAX distributed runtime if asked or detected; returns whether it did."""
  address = FLAGS.coordinator_address or os.environ.get('JAX_COORDINATOR_ADDRESS')
  if FLAGS.distributed == 'off' or (
      FLAGS.distributed == 'auto' and not address and not _cluster_detected()):
    return False
  if address and (FLAGS.num_processes is None) != (FLAGS.process_id is None):
    raise ValueError('Give both --num_processes and --process_id with --coordinator_address '
                     '(or neither, on a cluster JAX detects).')
  jax.distributed.initialize(coordinator_address=address, num_processes=FLAGS.num_processes,
                             process_id=FLAGS.process_id,
                             initialization_timeout=FLAGS.initialization_timeout_s,
                             heartbeat_timeout_seconds=FLAGS.heartbeat_timeout_s)
  return True
