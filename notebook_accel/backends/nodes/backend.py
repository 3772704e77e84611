"""Several nodes, and restarts: membership from torch elastic's rendezvous, our own ranks on every node.

Every node runs the same launch (one notebook, or ``notebook-accel launch``, per node)::

    rendezvous (static | c10d | etcd | plugin)  → this node's group rank, a store every node shares
    sizes exchanged through it                  → global rank = lower nodes' process counts + local rank
    every attempt:
        node 0 hosts a *fresh* TCPStore for the ranks and publishes its address through the shared store
        (torch's rendezvous caches one store across rounds, so a restarted world would read the previous
        attempt's gloo addresses: pytorch/pytorch#135712)
        this node's ranks run under the process backend's supervisor: pipes, dashboard, fail-fast
        a failure is published with a sequence number taken from the store (no clocks), and every node
        stops its ranks; when all nodes ended, each reads the same records and names the same root cause
    a failure with restarts left runs the whole world again; an interrupt, a timeout or a payload that
    cannot be unpickled never does

The rendezvous runs once per launch: the nodes stay the same across restarts (a restart replaces ranks,
not machines). ``elastic_launch`` is not used: its log files, ``ChildFailedError`` and defaults would
replace our output capture and root cause.
"""
from __future__ import annotations

import contextlib
import dataclasses
import gc
import os
import pickle
import socket
import threading
import time
from collections import defaultdict, deque
from dataclasses import dataclass
from typing import Callable, Deque, Dict, List, Optional

from ...errors import LaunchError
from ...outcome.raising import rebuild_exception
from ...wire.events import AttemptStarted, OutputLine, RankEvent, RankExited, RankFailed
from ...plan.nodes import OUR_RDZV_KEYS, NodeOptions
from ...outcome.root_cause import Failure, Outcome, signal_name
from ...plan.plan import LaunchPlan
from ..rendezvous import HostedStore
from ..base import Backend, LaunchSink

_PREFIX = "notebook_accel"
_CLOSING_KEY = f"{_PREFIX}/closing"  # set in the shared store once every node left the launch
_TAIL_LINES = 25             # last output lines of a rank that died without an exception, quoted in the error
_GOODBYE_SECONDS = 15.0      # how long a node waits for the others before releasing the stores, when ending early
# After every node left, linger a few monitor intervals before releasing the stores: we do not know which
# node hosts the rendezvous store (c10d picks one), and one still polling must not find it gone.
_LINGER_INTERVALS = 3
_LIVENESS_SECONDS = 1.0      # how often a node checks that the others' launchers still beat
_CLOSED_RETRY_SECONDS = 0.5  # between joins while the previous launch's store is still up


@dataclass
class NodeFailure:
    """A failure candidate as published through the shared store; ``seq`` orders them over all nodes."""

    seq: int
    node: int
    host: str
    attempt: int
    rank: int
    event: Optional[RankFailed] = None   # None: the rank died without an exception
    exitcode: Optional[int] = None
    tail: List[str] = dataclasses.field(default_factory=list)
    lost_after: Optional[float] = None   # set when the whole node stopped responding (rank is then -1)

    @property
    def collateral(self) -> bool:
        return Failure(self.rank, 0.0, self.event, self.exitcode).collateral

    def describe(self) -> str:
        """One line: ``rank 3 on node 1 (host-b): ValueError: boom``."""
        if self.lost_after is not None:
            return (f"node {self.node} stopped responding for {self.lost_after:g} s "
                    f"(its kernel, launcher or machine is gone?)")
        if self.event is not None:
            first_line = (self.event.message.strip().splitlines() or [""])[0]
            what = f"{self.event.exc_type.rpartition('.')[2]}: {first_line}"
        else:
            what = _death(self.exitcode)
        return f"rank {self.rank} on node {self.node} ({self.host}): {what}"


def _death(exitcode: Optional[int]) -> str:
    name = signal_name(exitcode)
    if name:
        return f"was killed by {name}"
    if exitcode == 0:
        return "exited with code 0 without returning a result (os._exit?)"
    return f"exited with code {exitcode}"


class Membership:
    """This node's place in the world, from torch elastic's rendezvous handler registry."""

    def __init__(self, options: NodeOptions) -> None:
        self.options = options
        self.handler = None
        self.store = None
        self.group_rank = 0
        self.node0_addr = "127.0.0.1"
        self._closed = False

    def join(self) -> None:
        """Block until every node joined; a clear ``LaunchError`` after the join timeout."""
        options = self.options
        if options.num_nodes == 1:  # restarts on one machine: nothing to meet, a local store will do
            from torch.distributed import HashStore

            self.store = HashStore()
            return
        from torch.distributed.elastic.rendezvous import RendezvousParameters, rendezvous_handler_registry

        conf = {key: value for key, value in options.rdzv_conf.items() if key not in OUR_RDZV_KEYS}
        if options.rdzv_backend == "static":
            conf.setdefault("rank", options.node_rank)
            conf.setdefault("timeout", int(options.join_timeout))
        local_addr = options.rdzv_conf.get("local_addr")  # this node's address as the others reach it
        params = RendezvousParameters(backend=options.rdzv_backend, endpoint=options.rdzv_endpoint or "",
                                      run_id=options.rdzv_id, min_nodes=options.num_nodes,
                                      max_nodes=options.num_nodes, local_addr=local_addr, **conf)
        try:
            info = self._next_rendezvous(rendezvous_handler_registry, params, options.join_timeout)
        except Exception as err:
            raise LaunchError(
                f"node {options.node_rank}: the {options.num_nodes} nodes did not all join the "
                f"{options.rdzv_backend!r} rendezvous at {options.rdzv_endpoint} within "
                f"{options.join_timeout:g} s ({type(err).__name__}: {err}). Start the same launch on every "
                f"node with num_nodes={options.num_nodes}, the same rdzv_endpoint and rdzv_id, and a "
                f"distinct node_rank; rdzv_conf={{'join_timeout': seconds}} sets the wait.") from err
        self.store = info.store
        self.group_rank = info.rank
        bootstrap = getattr(info, "bootstrap_store_info", None)
        if local_addr and self.group_rank == 0:
            self.node0_addr = local_addr
        elif options.rdzv_backend == "static":  # node 0 is the endpoint's host by definition
            self.node0_addr = (options.rdzv_endpoint or "").rpartition(":")[0] or "127.0.0.1"
        elif bootstrap is not None:  # node 0's own address as torch elastic found it (torchrun's MASTER_ADDR)
            self.node0_addr = bootstrap.master_addr
        else:
            self.node0_addr = socket.getfqdn()

    def _next_rendezvous(self, registry, params, join_timeout: float):
        """``next_rendezvous()``, joining again until the join timeout when the rendezvous was found closed
        (the previous launch's with the same rdzv_id, whose store is about to be released) or its store
        could not be reached (not up yet, or just going away: with c10d any node may host it)."""
        from torch.distributed.elastic.rendezvous import RendezvousClosedError, RendezvousConnectionError

        deadline = time.monotonic() + join_timeout
        while True:
            try:
                self.handler, self._closed = registry.create_handler(params), False
                with _no_shared_tcp_store():
                    info = self.handler.next_rendezvous()
                if not info.store.check([_CLOSING_KEY]):
                    return info
                # A store the previous launch already left (its host releases it in a moment): not ours.
                raise RendezvousClosedError("the previous launch's store")
            except (RendezvousClosedError, RendezvousConnectionError):
                self._drop()  # never joined: nothing to shut down
                if time.monotonic() > deadline:
                    raise
                time.sleep(_CLOSED_RETRY_SECONDS)
            except BaseException:
                self._drop()
                raise

    def shutdown(self) -> None:
        """Close the rendezvous and stop its heartbeats, while every node's store is still up (each node
        does this before saying goodbye, and the node hosting the store leaves last)."""
        if self.handler is not None and not self._closed:
            self._closed = True
            try:
                self.handler.shutdown()
            except Exception:  # the store's host is gone already: nothing left to close
                pass

    def release(self) -> None:
        """Close the rendezvous if still open, then drop the handler and the store."""
        self.shutdown()
        self._drop()

    def _drop(self) -> None:
        """Drop the handler and the store (the host's listener goes with its last reference)."""
        handler, self.handler, self.store = self.handler, None, None
        del handler
        # The c10d handler's objects refer to each other: only a collection frees its store's listener
        # now, so that the next launch with the same endpoint finds the port free.
        gc.collect()


@contextlib.contextmanager
def _no_shared_tcp_store():
    """torch's c10d rendezvous would open one more unauthenticated listener on node 0 for the workers to
    share; ours use the fresh store of each attempt instead, so ask torch not to (its documented opt-out)."""
    variable = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"
    previous = os.environ.get(variable)
    os.environ[variable] = "1"
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(variable, None)
        else:
            os.environ[variable] = previous


class AttemptWatch:
    """Between this node's supervisor and the view for one attempt: publishes this node's failures and
    interrupts, and stops this node's ranks once another node aborted the attempt."""

    def __init__(self, store, prefix: str, node: int, attempt: int, deliver: Callable[[RankEvent], None],
                 tick: Callable[[], None], user_stop: threading.Event, options: NodeOptions) -> None:
        self.store = store
        self.num_nodes = options.num_nodes
        self.silence_limit = options.node_timeout
        self.ended_nodes: set = set()      # other nodes known to have ended this attempt
        self.lost_nodes: set = set()       # other nodes whose launcher stopped beating
        self._beats: Dict[int, tuple] = {}  # node -> (its beat count, when we saw it change)
        self._liveness_at = time.monotonic()
        self.prefix = prefix
        self.node = node
        self.host = socket.gethostname()
        self.attempt = attempt
        self._deliver = deliver
        self._tick = tick
        self.user_stop = user_stop
        self.interval = options.monitor_interval
        self.stop = threading.Event()      # the local supervisor's stop_requested
        self.published = 0
        self.store_error: Optional[str] = None
        self._failed_ranks: set = set()
        self._tails: Dict[int, Deque[str]] = defaultdict(lambda: deque(maxlen=_TAIL_LINES))
        self._checked_at = 0.0

    # ------------------------------------------------------------------------------- the sink's side
    def deliver(self, event: RankEvent) -> None:
        if isinstance(event, OutputLine):
            self._tails[event.rank].append(event.text)
        elif isinstance(event, RankFailed):
            self._failed_ranks.add(event.rank)
            if event.exc_type == "builtins.KeyboardInterrupt":
                self.abort("stopped")
            else:
                self.publish(event.rank, event=event)
        elif isinstance(event, RankExited):
            if not event.stopped and event.exitcode != 0 and event.rank not in self._failed_ranks:
                self.publish(event.rank, exitcode=event.exitcode)
        self._deliver(event)

    def tick(self) -> None:
        self._tick()
        now = time.monotonic()
        if now - self._checked_at < self.interval:
            return
        self._checked_at = now
        if self.user_stop.is_set():
            self.abort("stopped")
            self.stop.set()
        elif self.aborted() is not None:
            self.stop.set()
        try:
            self.store.add(self.key(f"beat/{self.node}"), 1)  # "this node's launcher is alive"
        except Exception as err:
            self._lost(err)
        if now - self._liveness_at >= _LIVENESS_SECONDS:
            self._liveness_at = now
            self.check_nodes(now)

    def check_nodes(self, now: float) -> None:
        """Notice other nodes whose launcher stopped beating (a killed kernel, a lost machine): they will
        never say they ended, so they are published as a failure and no longer waited for."""
        for other in range(self.num_nodes):
            if other == self.node or other in self.lost_nodes or other in self.ended_nodes:
                continue
            try:
                if self.store.check([self.key(f"ended/{other}")]):
                    self.ended_nodes.add(other)
                    continue
                count = int(self.store.add(self.key(f"beat/{other}"), 0))
            except Exception as err:
                self._lost(err)
                return
            seen = self._beats.get(other)
            if seen is None or seen[0] != count:
                self._beats[other] = (count, now)
            elif now - seen[1] > self.silence_limit:
                self.lost_nodes.add(other)
                self.publish_record(NodeFailure(0, other, "?", self.attempt, -1, lost_after=round(now - seen[1])))

    def all_ended(self) -> bool:
        """Every node said it ended this attempt, or was found lost."""
        waiting = [other for other in range(self.num_nodes) if other not in self.lost_nodes]
        return bool(self.store.check([self.key(f"ended/{other}") for other in waiting]))

    def say_ended(self) -> None:
        self.store.set(self.key(f"ended/{self.node}"), "1")

    # ------------------------------------------------------------------------------- the store's side
    def key(self, name: str) -> str:
        return f"{self.prefix}/{name}"

    def publish(self, rank: int, event: Optional[RankFailed] = None, exitcode: Optional[int] = None) -> None:
        """Add a failure candidate; its sequence number orders it among every node's."""
        self.publish_record(NodeFailure(0, self.node, self.host, self.attempt, rank, event, exitcode,
                                        list(self._tails[rank])))

    def publish_record(self, record: NodeFailure) -> None:
        try:
            record.seq = int(self.store.add(self.key("failures"), 1))
            self.store.set(self.key(f"failure/{record.seq}"), pickle.dumps(record))
            self.published += 1
        except Exception as err:
            self._lost(err)
        self.abort("failed")

    def abort(self, reason: str) -> None:
        """Tell every node to stop this attempt; the first reason given wins."""
        try:
            self.store.compare_set(self.key("abort"), "", f"{reason}:{self.node}")
        except Exception as err:
            self._lost(err)

    def aborted(self) -> Optional[str]:
        try:
            if self.store.check([self.key("abort")]):
                return self.store.get(self.key("abort")).decode()
        except Exception as err:
            self._lost(err)
            return "lost:-1"
        return None

    def _lost(self, err: Exception) -> None:
        if self.store_error is None:
            self.store_error = f"{type(err).__name__}: {err}"
        self.stop.set()


@dataclass
class AttemptEnd:
    """How one attempt ended for the whole world (every node computes the same)."""

    status: str                          # finished | failed | stopped | timeout
    root: Optional[NodeFailure] = None
    by_node: Optional[int] = None        # who stopped it or let it time out
    node_lost: int = 0                   # nodes that stopped responding: the world cannot run again


class NoStore:
    """Stands in for the kernel-hosted store: this backend hosts a fresh one for every attempt itself."""

    def env(self) -> Dict[str, str]:
        return {}

    def close(self) -> None:
        pass


class NodesBackend(Backend):
    """Runs this node's ranks of a multi-node (or restarting) launch; see the module docstring.

    Example (one call per node; here node 1 of 2)::

        notebook_launcher(train, num_processes=4, num_nodes=2, node_rank=1,
                          rdzv_endpoint="10.0.0.1:29500", max_restarts=1)
    """

    name = "nodes"

    def __init__(self, plan: LaunchPlan) -> None:
        super().__init__(plan)
        assert plan.nodes is not None
        self.options: NodeOptions = plan.nodes
        self._ranks_backend = None  # this attempt's ProcessBackend, for dump_stacks

    def open_rendezvous(self) -> NoStore:  # type: ignore[override]
        return NoStore()

    def run(self, rendezvous_env: Dict[str, str], sink: LaunchSink) -> Outcome:
        membership = Membership(self.options)
        membership.join()
        try:
            return self._run_attempts(membership, sink.deliver, sink.tick, sink.stop_requested)
        finally:
            membership.release()

    def dump_stacks(self, timeout: float = 2.0) -> Dict[int, str]:
        backend = self._ranks_backend
        return backend.dump_stacks(timeout) if backend is not None else {}

    # ------------------------------------------------------------------------------------------- attempts

    def _run_attempts(self, membership: Membership, deliver, tick, stop_requested) -> Outcome:

        options, store, node = self.options, membership.store, membership.group_rank
        sizes = self._exchange_sizes(store, node, tick)
        offset, world_size = sum(sizes[:node]), sum(sizes)
        ranks = list(range(offset, offset + sizes[node]))
        deliver(self.plan.started_event(world_size=world_size, num_nodes=options.num_nodes, node_rank=node,
                               ranks=ranks))
        deadline = None if self.plan.timeout is None else time.monotonic() + self.plan.timeout
        history: List[NodeFailure] = []
        attempt = 0
        while True:
            if options.max_restarts:
                deliver(AttemptStarted(rank=-1, attempt=attempt, max_restarts=options.max_restarts,
                                       previous_errors=[failure.describe() for failure in history]))
            plan = dataclasses.replace(self.plan, rank_offset=offset, global_world_size=world_size,
                                       group_rank=node, nodes=None)
            local, end = self._run_attempt(membership, plan, attempt, deadline, deliver, tick, stop_requested)
            restartable = (end.status == "failed" and attempt < options.max_restarts and end.root is not None
                           and not end.node_lost and not _payload_failed(end.root))
            if not restartable:
                self._say_goodbye(membership, options.num_nodes - end.node_lost)
                return self._outcome(end, local, ranks, world_size, history)
            history.append(end.root)
            attempt += 1

    def _exchange_sizes(self, store, node: int, tick) -> List[int]:
        store.set(f"{_PREFIX}/size/{node}", str(self.plan.world_size))
        keys = [f"{_PREFIX}/size/{other}" for other in range(self.options.num_nodes)]
        self._wait_until(lambda: store.check(keys), tick, what="the other nodes' process counts")
        return [int(store.get(key)) for key in keys]

    def _run_attempt(self, membership: Membership, plan: LaunchPlan, attempt: int, deadline: Optional[float],
                     deliver, tick, stop_requested: threading.Event):
        store, node = membership.store, membership.group_rank
        prefix = f"{_PREFIX}/attempt{attempt}"
        watch = AttemptWatch(store, prefix, node, attempt, deliver, tick, stop_requested, self.options)
        hosted: Optional[HostedStore] = None
        ended = False
        try:
            if node == 0:  # a fresh store per attempt: nothing of the previous attempt can be read from it
                hosted = HostedStore(membership.node0_addr, None, plan.global_world_size or plan.world_size)
                store.set(watch.key("master"), f"{hosted.addr}:{hosted.port}")
            self._wait_until(lambda: bool(store.check([watch.key("master")]) or watch.aborted()), watch.tick,
                             what="node 0's store for this attempt")
            local = self._run_local_ranks(plan, attempt, deadline, watch)
            if watch.store_error is not None:
                raise LaunchError(f"node {node} lost the rendezvous store during attempt {attempt + 1} "
                                  f"({watch.store_error}); the node hosting it (node 0 for 'static') may be gone")
            if local.status == "failed" and not watch.published and local.root is not None:
                watch.publish(local.root.rank, event=local.root.event, exitcode=local.root.exitcode)
            elif local.status == "timeout":
                watch.abort("timeout")
            watch.say_ended()
            ended = True
            self._wait_for_all_nodes(watch, deadline)
            return local, self._decide(watch)
        except BaseException:  # Ctrl-C here, or an error: tell the others, give them a moment, then go
            watch.abort("stopped")
            if not ended:
                try:
                    watch.say_ended()
                except Exception:
                    pass
            self._say_goodbye(membership, self.options.num_nodes - len(watch.lost_nodes))
            raise
        finally:
            if hosted is not None:
                hosted.close()

    def _run_local_ranks(self, plan: LaunchPlan, attempt: int, deadline: Optional[float],
                         watch: AttemptWatch) -> Outcome:
        """This node's ranks under the process backend's supervisor, for one attempt."""
        from ..processes import ProcessBackend

        if watch.aborted() is not None:  # another node gave up before we could start
            return Outcome("stopped")
        host, _, port = watch.store.get(watch.key("master")).decode().rpartition(":")
        env = {"MASTER_ADDR": host, "MASTER_PORT": port, "TORCHELASTIC_USE_AGENT_STORE": "True",
               "TORCHELASTIC_RESTART_COUNT": str(attempt),
               "TORCHELASTIC_MAX_RESTARTS": str(self.options.max_restarts),
               "TORCHELASTIC_RUN_ID": self.options.rdzv_id, "GROUP_WORLD_SIZE": str(self.options.num_nodes)}
        remaining = None if deadline is None else max(0.001, deadline - time.monotonic())
        self._ranks_backend = ProcessBackend(dataclasses.replace(plan, timeout=remaining))
        try:
            return self._ranks_backend.run(env, LaunchSink(watch.deliver, watch.tick, watch.stop))
        finally:
            self._ranks_backend = None

    def _wait_for_all_nodes(self, watch: AttemptWatch, deadline: Optional[float]) -> None:
        """This node's ranks are done; wait for the other nodes' (Stop, the timeout and the check for lost
        nodes still apply, and this node keeps beating)."""
        def all_ended() -> bool:
            if deadline is not None and time.monotonic() > deadline:
                watch.abort("timeout")
            return watch.all_ended()

        self._wait_until(all_ended, watch.tick, what="the other nodes to finish")

    def _decide(self, watch: AttemptWatch) -> AttemptEnd:
        """The same reading of the store on every node gives the same ending and root cause."""
        store = watch.store
        reason = watch.aborted()
        kind, _, by = (reason or "").partition(":")
        if kind in ("stopped", "timeout"):
            return AttemptEnd(kind, by_node=int(by))
        count = int(store.add(watch.key("failures"), 0))
        failures = [pickle.loads(store.get(watch.key(f"failure/{seq}"))) for seq in range(1, count + 1)]
        if not failures:
            return AttemptEnd("finished")
        primary = [failure for failure in failures if not failure.collateral]
        lost = len({failure.node for failure in failures if failure.lost_after is not None})
        return AttemptEnd("failed", root=min(primary or failures, key=lambda failure: failure.seq), node_lost=lost)

    # ------------------------------------------------------------------------------------------- helpers

    def _wait_until(self, ready: Callable[[], bool], tick, what: str) -> None:
        """Poll ``ready`` every monitor interval, keeping the view's clock going; the store's errors become
        a ``LaunchError`` that says what this node was waiting for."""
        pause = 0.005  # short at first (the others are usually a few ms away), up to the monitor interval
        while True:
            try:
                if ready():
                    return
            except Exception as err:
                raise LaunchError(f"node {self.options.node_rank} lost the rendezvous store while waiting for "
                                  f"{what} ({type(err).__name__}: {err}); the node hosting it may be gone") from err
            tick()
            time.sleep(pause)
            pause = min(pause * 2, self.options.monitor_interval)

    def _wait_quietly(self, ready: Callable[[], bool], seconds: float = _GOODBYE_SECONDS) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            try:
                if ready():
                    return
            except Exception:  # the store's host is gone: nobody left to wait for
                return
            time.sleep(self.options.monitor_interval)

    def _say_goodbye(self, membership: Membership, expected: int) -> None:
        """Every node read the outcome before the node hosting the shared store may release it (bounded:
        a node that ended early, e.g. on Ctrl-C, waits at most ``_GOODBYE_SECONDS``)."""
        membership.shutdown()
        store = membership.store
        try:
            if int(store.add(f"{_PREFIX}/left", 1)) >= expected:
                # The last to leave marks the store as over: a node that joins it by mistake (the next launch
                # racing this one's release) sees the mark and joins again.
                store.set(_CLOSING_KEY, "1")
        except Exception:
            return
        self._wait_quietly(lambda: bool(store.check([_CLOSING_KEY])))
        time.sleep(_LINGER_INTERVALS * self.options.monitor_interval)  # let the others see it too

    def _outcome(self, end: AttemptEnd, local: Outcome, ranks: List[int], world_size: int,
                 history: List[NodeFailure]) -> Outcome:
        common = dict(results=local.results, exitcodes=local.exitcodes, still_running=local.still_running,
                      ranks=ranks)
        if end.status == "failed" and end.root is not None:
            root = end.root
            return Outcome("failed", root=Failure(root.rank, float(root.seq), event=root.event,
                                                  exitcode=_exit_code(root)),
                           local_exception=root_exception(root, world_size, history), **common)
        if end.status == "stopped":
            return Outcome("stopped", local_exception=KeyboardInterrupt(
                f"the launch was stopped on node {end.by_node}"), **common)
        return Outcome(end.status, **common)


def root_exception(root: NodeFailure, world_size: int, history: List[NodeFailure]) -> BaseException:
    """The exception every node raises: the rank's own type where it unpickles, else ``LaunchError``;
    both name the rank, its node and host, and the earlier attempts' root causes."""
    where = f"node {root.node} ({root.host})"
    if root.lost_after is not None:
        error: BaseException = LaunchError(f"{root.describe()}; its ranks were lost with it", rank=None)
        note = ""
    elif root.event is not None:
        error = rebuild_exception(root.event, world_size)
        note = f"(notebook_accel: rank {root.rank} ran on {where}" + (
            f", attempt {root.attempt + 1})" if root.attempt or history else ")")
    else:
        tail = ("; its last output:\n    " + "\n    ".join(root.tail)) if root.tail else ""
        error = LaunchError(f"rank {root.rank} on {where} {_death(root.exitcode)}{tail}", rank=root.rank,
                            exitcode=root.exitcode, signal_name=signal_name(root.exitcode))
        note = ""
    try:
        error.host = root.host  # type: ignore[attr-defined]
        error.node = root.node  # type: ignore[attr-defined]
    except Exception:
        pass
    if hasattr(error, "add_note"):
        if note:
            error.add_note(note)
        for number, failure in enumerate(history, start=1):
            error.add_note(f"(notebook_accel: attempt {number} failed first: {failure.describe()})")
    return error


def _exit_code(root: NodeFailure) -> Optional[int]:
    """The rank's exit code; for ``sys.exit(n)`` on another node (known only by its message) n, as there."""
    if root.event is not None and root.event.exc_type == "builtins.SystemExit":
        code = root.event.message.strip()
        return int(code) if code.lstrip("-").isdigit() else 1
    return root.exitcode


def _payload_failed(root: NodeFailure) -> bool:
    """The function could not even be loaded in the rank (its frames in payload.py): a restart would fail
    the same way."""
    return root.event is not None and f"notebook_accel{os.sep}payload.py" in root.event.traceback
