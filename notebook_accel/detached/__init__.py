"""Detached launches: ranks that run on when the kernel ends, and any later kernel attaching to them.

``protocol``: where events go and come from (``EventSink``, ``EventSource``); ``ending``: how a launch ended, as a
record; ``recording``: the view that writes a launch's events; ``log`` and ``folder``: the file implementation (a job
folder on the shared file system); ``attaching``: ``attach``, ``DetachedJob``, ``detached_jobs``. Slurm: ``slurm_submit``
(``sbatch`` of a driver), ``slurm_driver`` (runs the launch inside the batch job), ``slurm_control``
(``squeue``/``scancel`` of it).
"""
from .attaching import DetachedJob, attach, detached_jobs, follow
from .ending import Ending
from .folder import JobFolder, jobs_root
from .protocol import EventSink, EventSource
from .recording import RecordingView

__all__ = ["DetachedJob", "attach", "detached_jobs", "follow", "Ending", "JobFolder", "jobs_root", "EventSink",
           "EventSource", "RecordingView"]
