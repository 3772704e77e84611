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

import dataclasses
import pickle
import time
from typing import Callable, Dict, List, Optional, Tuple

from ...errors import LaunchError
from ...outcome.death import exit_code_of
from ...outcome.raising import root_cause_exception
from ...outcome.root_cause import Failure, Outcome, choose_root_cause, is_system_exit
from ...plan.nodes import NodeOptions
from ...plan.plan import LaunchPlan
from ...plan.sites import LocalProcesses, SeveralNodes
from ...rank.network import NETWORK_VARIABLE, rank_network, route_address
from ...wire.events import Status
from ..base import Backend, LaunchSink, StopPolicy, run_attempts
from ..rendezvous import HostedStore
from .attempt import AttemptEnd, AttemptWatch, NodeFailure
from .membership import CLOSING_KEY, PREFIX, Membership

_GOODBYE_SECONDS = 15.0      # how long a node waits for the others before releasing the stores, when ending early
# After every node left, linger a few monitor intervals before releasing the stores: we do not know which
# node hosts the rendezvous store (c10d picks one), and one still polling must not find it gone.
_LINGER_INTERVALS = 3


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
    announces_start = True  # once the rendezvous placed this node

    def __init__(self, plan: LaunchPlan) -> None:
        super().__init__(plan)
        assert isinstance(plan.site, SeveralNodes)
        self.site: SeveralNodes = plan.site
        self.options: NodeOptions = plan.site.nodes
        self._ranks_backend = None  # this attempt's ProcessBackend, for dump_stacks
        self._membership: Optional[Membership] = None

    def open_rendezvous(self) -> NoStore:  # type: ignore[override]
        return NoStore()

    def _start(self, rendezvous_env: Dict[str, str], sink: LaunchSink) -> None:
        self._membership = Membership(self.options)
        self._membership.join()

    def _supervise(self, sink: LaunchSink, policy: StopPolicy) -> Outcome:
        return self._run_attempts(self._membership, sink.deliver, sink.tick, policy)

    def _close(self) -> None:
        if self._membership is not None:
            self._membership.release()
            self._membership = None

    def dump_stacks(self, timeout: float = 2.0) -> Dict[int, str]:
        backend = self._ranks_backend
        return backend.dump_stacks(timeout) if backend is not None else {}

    # ------------------------------------------------------------------------------------------- attempts

    def _run_attempts(self, membership: Membership, deliver, tick, policy: StopPolicy) -> Outcome:

        options, store = self.options, membership.store
        node = self._place(store, membership.group_rank, tick)
        sizes = self._exchange_sizes(store, node, tick)
        offset, world_size = sum(sizes[:node]), sum(sizes)
        ranks = list(range(offset, offset + sizes[node]))
        deliver(self.plan.started_event(world_size=world_size, num_nodes=options.num_nodes, node_rank=node,
                               ranks=ranks))
        plan = dataclasses.replace(self.plan, rank_offset=offset, global_world_size=world_size, group_rank=node)

        def restartable(attempt: Tuple[Outcome, AttemptEnd]) -> Optional[NodeFailure]:
            end = attempt[1]
            if end.status == Status.FAILED and end.root is not None and not end.node_lost \
                    and not _payload_failed(end.root):
                return end.root
            return None

        (local, end), history = run_attempts(
            options.max_restarts, deliver,
            lambda attempt: self._run_attempt(membership, node, plan, attempt, policy, deliver, tick),
            restartable, describe=NodeFailure.describe)
        self._say_goodbye(membership, options.num_nodes - end.node_lost)
        return self._outcome(end, local, ranks, world_size, history)

    def _place(self, store, arrival: int, tick) -> int:
        """This node's place: its ``node_rank`` where the nodes gave one, else the rendezvous' order. torch's
        c10d (and etcd) rendezvous numbers nodes by arrival, so the node ranks are exchanged and checked here;
        the static rendezvous already numbers them by the rank each one gave."""
        options = self.options
        if options.rdzv_backend == "static" or options.num_nodes == 1:
            return arrival
        store.set(f"{PREFIX}/node_rank/{arrival}", "" if options.node_rank is None else str(options.node_rank))
        keys = [f"{PREFIX}/node_rank/{other}" for other in range(options.num_nodes)]
        self._wait_until(lambda: store.check(keys), tick, what="the other nodes' node_rank")
        wanted = [store.get(key).decode() for key in keys]
        if all(value == "" for value in wanted):
            return arrival
        if any(value == "" for value in wanted):
            raise LaunchError(f"node_rank was given on {sum(v != '' for v in wanted)} of the {options.num_nodes} "
                              f"nodes: give it on every node, or on none to number the nodes in the order they "
                              f"joined the {options.rdzv_backend!r} rendezvous")
        numbers = [int(value) for value in wanted]
        repeated = sorted({number for number in numbers if numbers.count(number) > 1})
        if repeated:
            raise LaunchError(f"node_rank={repeated[0]} was given on {numbers.count(repeated[0])} nodes: each node "
                              f"needs its own node_rank in 0..{options.num_nodes - 1}")
        return numbers[arrival]

    def _exchange_sizes(self, store, node: int, tick) -> List[int]:
        store.set(f"{PREFIX}/size/{node}", str(self.plan.world_size))
        keys = [f"{PREFIX}/size/{other}" for other in range(self.options.num_nodes)]
        self._wait_until(lambda: store.check(keys), tick, what="the other nodes' process counts")
        return [int(store.get(key)) for key in keys]

    def _run_attempt(self, membership: Membership, node: int, plan: LaunchPlan, attempt: int, policy: StopPolicy,
                     deliver, tick):
        store = membership.store
        prefix = f"{PREFIX}/attempt{attempt}"
        watch = AttemptWatch(store, prefix, node, attempt, deliver, tick, policy.stop_requested, self.options)
        hosted: Optional[HostedStore] = None
        ended = False
        try:
            # A fresh store per attempt (nothing of the previous attempt can be read from it), hosted by the node
            # the rendezvous made first: its address is the one every node knows.
            if membership.group_rank == 0:
                hosted = HostedStore(membership.node0_addr, None, plan.global_world_size or plan.world_size)
                store.set(watch.key("master"), f"{hosted.addr}:{hosted.port}")
            self._wait_until(lambda: bool(store.check([watch.key("master")]) or watch.aborted()), watch.tick,
                             what="this attempt's store (the first node of the rendezvous hosts it)")
            local = self._run_local_ranks(plan, attempt, policy, watch)
            if watch.store_error is not None:
                raise LaunchError(f"node {node} lost the rendezvous store during attempt {attempt + 1} "
                                  f"({watch.store_error}); the node hosting it (node 0 for 'static') may be gone")
            if local.status == Status.FAILED and not watch.published and local.root is not None:
                watch.publish(local.root.rank, event=local.root.event, exitcode=local.root.exitcode)
            elif local.status == Status.TIMEOUT:
                watch.abort(Status.TIMEOUT)
            watch.say_ended()
            ended = True
            self._wait_for_all_nodes(watch, policy)
            return local, self._decide(watch)
        except BaseException:  # Ctrl-C here, or an error: tell the others, give them a moment, then go
            watch.abort(Status.STOPPED)
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

    def _run_local_ranks(self, plan: LaunchPlan, attempt: int, policy: StopPolicy, watch: AttemptWatch) -> Outcome:
        """This node's ranks under the process backend's supervisor, for one attempt."""
        from ..processes import ProcessBackend

        if watch.aborted() is not None:  # another node gave up before we could start
            return Outcome(Status.STOPPED)
        host, _, port = watch.store.get(watch.key("master")).decode().rpartition(":")
        env = {"MASTER_ADDR": host, "MASTER_PORT": port, "TORCHELASTIC_USE_AGENT_STORE": "True",
               "TORCHELASTIC_RESTART_COUNT": str(attempt),
               "TORCHELASTIC_MAX_RESTARTS": str(self.options.max_restarts),
               "TORCHELASTIC_RUN_ID": self.options.rdzv_id, "GROUP_WORLD_SIZE": str(self.options.num_nodes)}
        env.update(network_env(host))
        # This node's ranks are local processes meeting at the attempt's store; the launch's one timeout, counted
        # over every attempt: this attempt gets what is left of it.
        here = LocalProcesses(start_method=self.site.start_method, master_addr=host, use_port=int(port))
        self._ranks_backend = ProcessBackend(dataclasses.replace(plan, site=here, timeout=policy.remaining()))
        try:
            return self._ranks_backend.run(env, LaunchSink(watch.deliver, watch.tick, watch.stop))
        finally:
            self._ranks_backend = None

    def _wait_for_all_nodes(self, watch: AttemptWatch, policy: StopPolicy) -> None:
        """This node's ranks are done; wait for the other nodes' (Stop, the timeout and the check for lost
        nodes still apply, and this node keeps beating)."""
        def all_ended() -> bool:
            if policy.reason() == Status.TIMEOUT:
                watch.abort(Status.TIMEOUT)
            return watch.all_ended()

        self._wait_until(all_ended, watch.tick, what="the other nodes to finish")

    def _decide(self, watch: AttemptWatch) -> AttemptEnd:
        """The same reading of the store on every node gives the same ending and root cause."""
        store = watch.store
        reason = watch.aborted()
        kind, _, by = (reason or "").partition(":")
        if kind in (Status.STOPPED, Status.TIMEOUT):
            return AttemptEnd(Status(kind), by_node=int(by))
        count = int(store.add(watch.key("failures"), 0))
        failures = [pickle.loads(store.get(watch.key(f"failure/{seq}"))) for seq in range(1, count + 1)]
        if not failures:
            return AttemptEnd(Status.FINISHED)
        lost = len({failure.node for failure in failures if failure.lost_after is not None})
        root = choose_root_cause(failures, order=lambda failure: failure.seq)  # the store's order: no clocks
        return AttemptEnd(Status.FAILED, root=root, node_lost=lost)

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
            if int(store.add(f"{PREFIX}/left", 1)) >= expected:
                # The last to leave marks the store as over: a node that joins it by mistake (the next launch
                # racing this one's release) sees the mark and joins again.
                store.set(CLOSING_KEY, "1")
        except Exception:
            return
        self._wait_quietly(lambda: bool(store.check([CLOSING_KEY])))
        time.sleep(_LINGER_INTERVALS * self.options.monitor_interval)  # let the others see it too

    def _outcome(self, end: AttemptEnd, local: Outcome, ranks: List[int], world_size: int,
                 history: List[NodeFailure]) -> Outcome:
        common = dict(results=local.results, exitcodes=local.exitcodes, still_running=local.still_running,
                      ranks=ranks)
        if end.status == Status.FAILED and end.root is not None:
            root = end.root
            return Outcome(Status.FAILED, root=_as_failure(root),
                           local_exception=root_exception(root, world_size, history), **common)
        if end.status == Status.STOPPED:
            return Outcome(Status.STOPPED, local_exception=KeyboardInterrupt(
                f"the launch was stopped on node {end.by_node}"), **common)
        return Outcome(end.status, **common)


def network_env(master_addr: str) -> Dict[str, str]:
    """What this node's ranks offer their peers: the interface of this node's address on the route to
    ``MASTER_ADDR`` as ``GLOO_SOCKET_IFNAME``/``TP_SOCKET_IFNAME`` (unless the kernel's environment, which the ranks
    inherit, sets them), and the rank's start-up info (``NOTEBOOK_ACCEL_NETWORK``). Nothing where no route leads
    there (the ranks' own connect says so)."""
    try:
        network = rank_network(route_address(master_addr))
    except OSError:
        return {}
    return dict(network.env, **{NETWORK_VARIABLE: network.describe()})


def root_exception(root: NodeFailure, world_size: int, history: List[NodeFailure]) -> BaseException:
    """The exception every node raises for the root cause (``outcome.raising``'s rule, the same as on one node),
    naming the rank's node and host, and the earlier attempts' root causes."""
    where = f"node {root.node} ({root.host})"
    note = ""
    if root.lost_after is not None:
        error: BaseException = LaunchError(f"{root.describe()}; its ranks were lost with it", rank=None)
    else:
        error = root_cause_exception(_as_failure(root), world_size, last_output=root.tail, where=f" on {where}")
        if root.event is not None and not is_system_exit(root.event):  # the rank's exception, rebuilt
            note = f"(notebook_accel: rank {root.rank} ran on {where}" + (
                f", attempt {root.attempt + 1})" if root.attempt or history else ")")
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


def _as_failure(root: NodeFailure) -> Failure:
    """The root cause as the outcome's ``Failure`` (ordered by the store's sequence number, not a clock)."""
    return Failure(root.rank, float(root.seq), event=root.event, exitcode=exit_code_of(root.event, root.exitcode))


def _payload_failed(root: NodeFailure) -> bool:
    """The function could not even be loaded in the rank (the rank says so): a restart would fail the same way."""
    return root.event is not None and root.event.loading
