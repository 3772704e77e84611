"""Detached launches on Ray (``start_launch(..., cluster="ray", detach=True)``): the ranks run on when the kernel ends.

The driver is a *detached* named Ray actor (``lifetime="detached"``, in the namespace ``notebook_accel``, named
``notebook_accel-job-<id>``): it runs the ordinary launch with the Ray backend from inside the cluster (Ray is
connected in an actor already, to the same cluster, so its rank actors and placement group are its own, and outlive
the kernel with it) and keeps the events (the ranks' memory samples thinned: ``KEEP_SAMPLE_EVERY``) and the ending in
its memory, which Ray serves to whoever asks: no port of ours is open, no file written. A later kernel connected to the same cluster finds the actor by the job's id (``RayJobSource``: the
``EventSource`` of ``notebook_accel.detached``) and replays, then follows, the same dashboard.

What outlives the kernel: the driver actor with the job's record, events and ending, and — while the launch runs —
its rank actors and placement group. The driver stays after the launch ended, holding the result, until ``forget()``
kills it (its ranks with it: Ray ends the actors and placement groups an actor made when it dies) or the cluster
ends. Nothing outlives the cluster: Ray keeps no detached actor across a restart of the cluster.
"""
from __future__ import annotations

import sys
import threading
import time
from typing import Any, Dict, List, Optional, Tuple

from ...wire.events import RankEvent, ResourceSample

NAMESPACE = "notebook_accel"
PREFIX = "notebook_accel-job-"
JOB_ID_PREFIX = "ray-"           # a Ray job's id says where it lives: ``ray-20261129-034512-3fa2``
READ_WAIT = 0.1                  # seconds a read waits in the driver for a new event (one call per event, not a spin)
# A rank's memory/CPU sample comes every second; the driver keeps one per rank per this many seconds (each carries the
# peaks so far). All of them, for a day of 8 ranks, would be some 700,000 events in the driver's memory.
KEEP_SAMPLE_EVERY = 5.0
_now = time.monotonic
CANCEL_WAIT = 300.0              # a bound on a cancel's wait for the ranks to end (a stop kills them after its grace)


def actor_name(job_id: str) -> str:
    return PREFIX + job_id


class JobDriver:
    """One detached launch, inside the cluster (a detached Ray actor; see the module docstring). It is the
    launch's ``EventSink`` (``append``, ``finish``, through ``detached.RecordingView``) and serves the kernel's
    ``read``, ``cancel`` and ``describe``. Plain Python: ``submit`` makes it a Ray actor."""

    def __init__(self, record: Dict[str, Any]) -> None:
        self.record = dict(record)
        self.events: List[RankEvent] = []
        self.ending: Any = None
        self.launch: Any = None
        self._changed = threading.Condition()
        self._sampled: Dict[int, float] = {}   # when each rank's last kept ResourceSample came

    # ------------------------------------------------------------------------------------- the launch

    def start(self, payload: Any, options: Any) -> Optional[bytes]:
        """Plan and start the launch here, as the kernel planned it (``options``: its own, not detached, no display),
        with the Ray backend and every event recorded; None once it runs, else the error that refused it, pickled
        (a ``LaunchConfigError``: the cluster cannot hold the ranks...), for the kernel to raise."""
        import cloudpickle

        from ...detached.recording import RecordingView
        from ...launcher import Launch
        from ...plan.plan import make_plan

        view = RecordingView(self)
        started = time.monotonic()
        try:
            function, args, kwargs = payload.load()
            self.launch = Launch(make_plan(function, args, kwargs, options, allow_inline=False),
                                 view=view).run_in_background()
        except Exception as error:
            return cloudpickle.dumps(error)
        self.launch.future.add_done_callback(lambda _: view.finish(self.launch, time.monotonic() - started))
        return None

    # ------------------------------------------------------------------------------------- EventSink

    def append(self, event: RankEvent) -> None:
        if isinstance(event, ResourceSample):
            now = _now()
            if now - self._sampled.get(event.rank, -KEEP_SAMPLE_EVERY) < KEEP_SAMPLE_EVERY:
                return
            self._sampled[event.rank] = now
        with self._changed:
            self.events.append(event)
            self._changed.notify_all()

    def finish(self, ending: Any) -> None:
        with self._changed:
            if self.ending is None:  # the first ending stays (a cancel racing the launch's own end)
                self.ending = ending
            self._changed.notify_all()

    # ------------------------------------------------------------------------------------- for the kernel

    def read(self, since: int, wait: float = READ_WAIT) -> Tuple[List[RankEvent], Any]:
        """The events from index ``since`` (after up to ``wait`` s for one), and the ending once there; the ending
        is read first, so that a caller that gets it also gets every event before it."""
        with self._changed:
            if len(self.events) <= since and self.ending is None:
                self._changed.wait(wait)
            ending = self.ending
            return self.events[since:], ending

    def cancel(self) -> None:
        """Stop the launch: every rank actor is ended, the ending says "stopped" (nothing to stop once it ended)."""
        if self.launch is None:
            return
        self.launch.stop()
        with self._changed:  # the ranks are gone and the ending is recorded when this returns
            self._changed.wait_for(lambda: self.ending is not None, timeout=CANCEL_WAIT)

    def describe(self) -> Dict[str, Any]:
        with self._changed:
            ending = self.ending
        state = getattr(ending, "status", None) or ("running" if self.launch is not None else "starting")
        return dict(self.record, state=state)


_driver_class: Any = None


def _driver(ray: Any) -> Any:
    global _driver_class
    if _driver_class is None:
        # no CPU of its own: it waits on its ranks; several threads: the kernel's reads beside a cancel
        _driver_class = ray.remote(num_cpus=0, max_concurrency=8)(JobDriver)
    return _driver_class


def submit(plan: Any, options: Any) -> Any:
    """``start_launch(..., cluster="ray", detach=True)`` (``detached.submit``'s row for Ray): start the planned
    launch in a new driver actor on the cluster the kernel is connected to (``connection.connect``) and return its
    ``DetachedJob`` once the ranks are being placed. A launch the cluster refuses raises here, as an attached one does,
    and leaves no actor behind."""
    import pickle
    from dataclasses import replace

    from ...detached.attaching import DetachedJob
    from ...detached.folder import new_job_id
    from .connection import connect

    ray = connect()
    job_id = JOB_ID_PREFIX + new_job_id()
    record = dict(id=job_id, cluster="ray", function=plan.function_name,
                  created=time.strftime("%Y-%m-%d %H:%M:%S", time.localtime()))
    inside = replace(options, detach=False, display="none", pdb=False, num_processes=plan.world_size,
                     device=plan.device)
    driver = _driver(ray).options(name=actor_name(job_id), namespace=NAMESPACE, lifetime="detached",
                                  max_restarts=0).remote(record)
    try:
        refused = ray.get(driver.start.remote(plan.payload.portable(), inside))
    except BaseException:
        ray.kill(driver, no_restart=True)
        raise
    if refused is not None:
        ray.kill(driver, no_restart=True)
        raise pickle.loads(refused)
    return DetachedJob(RayJobSource(job_id, driver))


class RayJobSource:
    """A Ray detached job as a kernel reads it: the ``EventSource`` of ``notebook_accel.detached`` over its driver
    actor, found by name on the cluster this kernel is connected to."""

    def __init__(self, job_id: str, actor: Any = None) -> None:
        self.id = job_id
        self._actor = actor

    def _driver(self) -> Any:
        from .connection import connect

        if self._actor is None:
            ray = connect()
            try:
                self._actor = ray.get_actor(actor_name(self.id), namespace=NAMESPACE)
            except ValueError:
                raise LookupError(f"no detached Ray job {self.id!r} on this Ray cluster (forgotten, or the cluster "
                                  "was restarted); notebook_accel.detached_jobs() lists them") from None
        return self._actor

    def _call(self, method: str, *args: Any) -> Any:
        import ray

        return ray.get(getattr(self._driver(), method).remote(*args))

    def read(self, since: int = 0) -> Tuple[List[RankEvent], Any]:
        """The events from ``since`` and the ending. A driver that died (its node lost, its process killed) reads as
        no news: ``attach`` then finds it gone (``cluster_state``) and ends the job "lost"."""
        from ray.exceptions import RayActorError

        try:
            return self._call("read", since)
        except RayActorError:
            return [], None

    def cancel(self) -> None:
        self._call("cancel")

    def forget(self) -> None:
        """Kill the driver actor: its events and result go, and its ranks with it if it still ran."""
        import ray
        from ray.exceptions import RayActorError

        try:
            self.cancel()
        except RayActorError:  # it died already: nothing left to stop
            pass
        finally:
            ray.kill(self._driver(), no_restart=True)
            self._actor = None

    def describe(self) -> Dict[str, Any]:
        return self._call("describe")

    def cluster_state(self) -> Optional[str]:
        """"running" while the driver actor is there; None once it is gone (``attach`` then says "lost")."""
        try:
            return self.describe()["state"]
        except Exception:
            return None

    def ending(self) -> Any:
        return self.read(sys.maxsize)[1]


def source(job_id: str) -> RayJobSource:
    """The job ``job_id`` (``ray-…``), for ``detached.attaching`` (found on the cluster when first read)."""
    return RayJobSource(job_id)


def jobs() -> List[RayJobSource]:
    """The detached Ray jobs of the cluster this kernel is connected to (none where it never connected: Ray is not
    imported for that)."""
    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return []
    from ray.util import list_named_actors

    names = [entry["name"] for entry in list_named_actors(all_namespaces=True)
             if entry.get("namespace") == NAMESPACE and entry["name"].startswith(PREFIX)]
    return [source(name[len(PREFIX):]) for name in sorted(names)]
