"""Run one function on N real ``torch.distributed`` worker processes.

Defined in chapter 00 (preflight), used by every chapter after it::

    from course_lib import launch
    results = launch(fn, world_size=4, args=(x, y), timeout=60)

Each worker is a real operating-system process with the default process group initialised
(gloo for CPU tensors; on a machine with a GPU per rank also NCCL for CUDA tensors) and the
torchrun environment variables a function needs (RANK, LOCAL_RANK, WORLD_SIZE, ...).

The life of one launch, and the module of each step (start reading at launching.py):

    kernel          launch(fn): checks, holds a port, pickles fn by value  launching.py, protocol.py
      |
    launch server   forks one process per rank (one server per user)       server.py, shared_server.py (grading: sandbox_server.py)
      |
    forked ranks    torchrun's variables, the process group, fn(*args)     worker.py, devices.py
      |
    frames back     per rank a JSON header, then the result, read          protocol.py, wait.py, failures.py
      |             until all have returned, one fails, or time runs out   (grading: measuring.py)
      |
    report          results in rank order and each rank's output, or       output.py, reports.py, errors.py
                    the failing rank's traceback, or every rank's stack    (meanwhile: live.py)
"""

from ..confine.out_of_memory import LAUNCH_SERVER_OOM_SCORE_ADJ, prefer_as_victim
from .devices import available_cpus, choose_backend, rank_device, rank_gpu, threads_per_rank
from .errors import LaunchError, MeasurementRefused, MemoryLimitExceeded, UnsendableResult, WorkerError
from .launching import launch
from .live import report_progress
from .reports import RankWhereabouts, WorkerTimeout
from .server import warm_up

# Inner names that the grader (course_lib.grading.judge), chapter 07's setup cell and the tests
# reach through this package.
from .devices import _placement_line
from .errors import _lost_a_peer
from .failures import _root_cause
from .launching import _launch, _reserve_port
from .live import _BARS_SHOWN_AT_LEAST_S
from .protocol import CodeFilePickler, _Judged, _serialise_call
from .sandbox_server import _sandbox_context
from .server import _choose_start_method
from .wait import _MAX_STRETCH, _Waiter
from .worker import PRELUDE_ERRORS, _data_payload

from .live import _in_notebook_kernel
from .server import _freeze_the_preload, _importing_in_launch_server

__all__ = [
    "launch",
    "LaunchError",
    "WorkerError",
    "WorkerTimeout",
    "UnsendableResult",
    "available_cpus",
    "threads_per_rank",
    "choose_backend",
    "rank_device",
    "report_progress",
    "warm_up",
]

if _importing_in_launch_server():  # the server's preload ends with this package: all of it is imported
    _freeze_the_preload()
    prefer_as_victim(LAUNCH_SERVER_OOM_SCORE_ADJ)  # out of memory: after the ranks, before the kernel

if _in_notebook_kernel():  # start the launch server while the learner reads the first cells
    warm_up()
