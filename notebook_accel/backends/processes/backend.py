"""Local ranks as processes via multiprocessing: fork when safe, else a warm forkserver, else spawn.

``ProcessBackend.run`` is the whole sequence: start one process per rank with its pipes (a ``RankProcess``
handle each), hand them to the ``Supervisor`` (``backends.supervisor``) until every rank is gone, and close the
lifeline so nothing can outlive the launch.
"""
from __future__ import annotations

import multiprocessing
import os
import signal
import socket
import warnings
from collections import ChainMap
from typing import Dict, List, Optional, Tuple

from ...outcome.root_cause import Outcome
from ...plan.plan import LaunchPlan
from ...rank.process import MainNames, RankSpec, environ_changes, main_names_for_fork, rank_main
from ...wire.commands import CommandSender, session_socketpair
from ...wire.fds import PassedFd, rank_pipes
from ..base import Backend, LaunchSink, StopPolicy
from ..supervisor import RankProcess, Supervisor
from .starting import configure_fork_server, ensure_fork_server, starting_rank_process


class ProcessBackend(Backend):
    """One process per rank, started with ``plan.start_method``; the supervisor reads them to the end."""

    name = "processes"
    # What a rank process runs, and the spec it gets: a warm session's ranks (``backends.session``) differ here.
    spec_class = RankSpec
    rank_target = staticmethod(rank_main)
    runs_the_plans_call = True  # the rank runs the plan's payload (a session's runs each task's: it works out its own)

    def __init__(self, plan: LaunchPlan) -> None:
        super().__init__(plan)
        self.context = multiprocessing.get_context(plan.start_method)
        if plan.start_method == "forkserver":
            configure_fork_server(self.context)  # what the server preloads, from the kernel's copy
        self._lifeline_r, self._lifeline_w = os.pipe()
        self._supervisor: Optional[Supervisor] = None
        self._handles: List[RankProcess] = []
        self._answer_senders: List[CommandSender] = []
        self._no_one_types: Optional[str] = None  # told to the ranks: why no one can answer their prompts
        # fork: how the kernel's environment differs from the launch's (to set, to remove), see start()
        self._kernel_env_changes: Optional[Tuple[Dict[str, str], List[str]]] = None
        self._main_names: Optional[MainNames] = None  # fork: see rank.process.main_names_for_fork

    def _start(self, rendezvous_env: Dict[str, str], sink: LaunchSink) -> None:
        self._no_one_types = sink.asker.absent
        self._handles = self.start(rendezvous_env)

    def _supervise(self, sink: LaunchSink, policy: StopPolicy) -> Outcome:
        self._supervisor = Supervisor(
            self._handles, sink.deliver, sink.tick, policy=policy,
            expect_results=lambda rank: self.plan.sends_result(rank - self.plan.rank_offset), asker=sink.asker)
        return self._supervisor.run()

    def _close(self) -> None:
        self.close()

    def dump_stacks(self, timeout: float = 2.0) -> Dict[int, str]:
        supervisor = self._supervisor
        return supervisor.request_stacks(timeout) if supervisor is not None else {}

    def start(self, rendezvous_env: Dict[str, str]) -> List[RankProcess]:
        """Start a process per rank; its handle, by rank."""
        handles: List[RankProcess] = []
        try:
            if self.plan.start_method == "forkserver":
                ensure_fork_server()
            # The environment each forked rank inherits, against the launch's (usually the same): once, here.
            forking = self.plan.start_method == "fork"
            self._kernel_env_changes = environ_changes(os.environ, self.plan.kernel_env) if forking else None
            runs_call = forking and self.runs_the_plans_call
            self._main_names = main_names_for_fork(self.plan.payload.load()) if runs_call else None
            with warnings.catch_warnings(), starting_rank_process():
                # Python >= 3.12 warns on fork in a multi-threaded process (every Jupyter kernel); the rank
                # replaces what it inherited from those threads (streams, signal handlers) first thing.
                warnings.simplefilter("ignore", DeprecationWarning)
                for rank in range(self.plan.world_size):
                    handles.append(self._start_rank(rank, rendezvous_env, handles))
        except BaseException:  # e.g. Ctrl-C between two starts: the supervisor never saw these ranks
            for started in handles:
                started.signal_group(signal.SIGKILL)
                started.process.join()
                started.close_fds()
            raise
        finally:
            os.close(self._lifeline_r)  # only the ranks hold the read end now
        return handles

    def close(self) -> None:
        """The launch is over: closing the lifeline makes any rank still alive kill itself."""
        if self._lifeline_w >= 0:
            os.close(self._lifeline_w)
            self._lifeline_w = -1
        for sender in self._answer_senders:
            sender.close()
        self._answer_senders = []
        self.plan.payload.close()

    def _spec_extras(self, rank: int) -> Dict[str, object]:
        """More fields for ``spec_class``'s spec of ``rank`` (none for a launch's rank)."""
        return {}

    def _inherited_fds(self, rank: int) -> List[int]:
        """More kernel fds a *forked* ``rank`` inherits and must close (none for a launch's rank)."""
        return []

    answers_own_socket = True  # a launch's rank gets its prompts' answers on a socket of its own

    def _answers_socket(self) -> Tuple[CommandSender, socket.socket]:
        """A socket pair for one rank's answers (pdb, input(): ``backends.prompts``): the kernel's end (kept until
        the launch ends) and the rank's end (handed over as the spec's ``answers_fd``, closed here once the rank
        started)."""
        kernel, rank_end = session_socketpair()
        sender = CommandSender(kernel)
        self._answer_senders.append(sender)
        return sender, rank_end

    def _forked_env_changes(self, rank_env: Dict[str, str]) -> Tuple[Dict[str, str], List[str]]:
        """What a forked rank changes in the environment it inherits: the launch's differences (worked out once)
        and the rank's own variables. Every rank's copy of the kernel's whole environment would cost the kernel
        (copying ~100 strings shares their pages with the ranks forked before, so each touch copies a page)
        and each rank (see ``rank.process.as_launched``; with the loggers, ~1 ms of CPU a rank at 16 ranks)."""
        assert self._kernel_env_changes is not None
        launch_set, launch_removed = self._kernel_env_changes
        to_set = {name: value for name, value in launch_set.items() if name not in rank_env}
        to_set.update((name, value) for name, value in rank_env.items() if os.environ.get(name) != value)
        return to_set, [name for name in launch_removed if name not in rank_env]

    def _start_rank(self, rank: int, rendezvous_env: Dict[str, str], started: List[RankProcess]) -> RankProcess:
        pipes = rank_pipes()
        answers, answers_end = self._answers_socket() if self.answers_own_socket else (None, None)
        inherited: List[int] = []
        if self.plan.start_method == "fork":
            # A forked rank inherits every fd of the kernel; it must close the kernel's ends, or a pipe would
            # never reach EOF and the lifeline would never break.
            inherited = [self._lifeline_w] + [read for read, _ in pipes.values()]
            for other in started:
                inherited += other.fds
            inherited += [sender.sock.fileno() for sender in self._answer_senders]
            inherited += self._inherited_fds(rank)
        plan = self.plan
        rank_env = plan.rank_env(rank, rendezvous_env)
        forked = plan.start_method == "fork"
        spec = self.spec_class(
            rank=plan.global_rank(rank), world_size=plan.global_world_size or plan.world_size,
            # fork: a view, not a copy (see _forked_env_changes)
            env=ChainMap(rank_env, plan.kernel_env) if forked else {**plan.kernel_env, **rank_env},
            env_changes=self._forked_env_changes(rank_env) if forked else None, main_names=self._main_names,
            cwd=plan.kernel_cwd, sys_path=plan.kernel_sys_path,
            # fork: the kernel's own objects, inherited; otherwise pickled once, large data in shared memory
            payload=plan.payload if forked else plan.payload.pickled(),
            send_result=plan.sends_result(rank),
            stdout_fd=PassedFd(pipes["stdout"][1]),
            stderr_fd=PassedFd(pipes["stderr"][1]),
            events_fd=PassedFd(pipes["events"][1]),
            stacks_fd=PassedFd(pipes["stacks"][1]),
            lifeline_fd=PassedFd(self._lifeline_r),
            inherited_fds=inherited,
            answers_fd=PassedFd(answers_end.fileno()) if answers_end is not None else None,
            post_mortem=plan.post_mortem, no_one_types=self._no_one_types,
            **self._spec_extras(rank),
        )
        process = self.context.Process(target=self.rank_target, args=(spec,), name=f"notebook_accel-rank-{rank}")
        try:
            process.start()
        finally:
            for _, write in pipes.values():
                os.close(write)  # the kernel keeps only read ends: EOF once the rank is gone
            if answers_end is not None:
                answers_end.close()
        return RankProcess(spec.rank, process, pipes["stdout"][0], pipes["stderr"][0], pipes["events"][0],
                           pipes["stacks"][0], answers=answers)

