"""Ray ranks as the supervisor knows ranks: each with local pipes, a sentinel and a handle to stop it.

The supervisor (``backends.supervisor``) watches ranks through ``RankProcess`` handles: pipes it reads (stdout,
stderr, events, stacks), a process sentinel that fires when the rank is gone, and ``signal_group``. A Ray rank has
none of these on the kernel's machine; ``ActorRelay`` makes them. One thread per world of actors keeps a ``poll``
call in flight on every rank's control thread (``rank.actor.RankActor``: it answers as soon as the rank has
events, or after ``POLL_WAIT`` seconds) and writes what comes back into that rank's pipes, in the order the rank
made it: output lines into stdout/stderr, events into the event pipe (framed as a local rank's), a stack dump
into the stacks pipe. When the rank's ``run`` (or ``serve``) answered and its last events are written — or its
actor died — the relay closes its pipes' write ends and fires its sentinel: the supervisor then reads to EOF and
counts the rank gone, exactly as for a local process. Nothing listens on a port; Ray carries every byte.

Each rank's pipes and handle are ``relay.RelayedRank``'s, whose ``RelayedRankProcess`` maps the supervisor's signals
onto this relay: SIGTERM and SIGINT are ``Interrupt`` through the actor's control thread (``KeyboardInterrupt`` in the
rank), SIGKILL is ``ray.kill`` once the events already made are polled; a stack dump is a call to its control thread,
and a line typed at its prompt (pdb) a ``PromptAnswer`` command. So a launch's and a warm session's stop strategies, end
conditions and root-cause rules apply to Ray ranks unchanged.
"""
from __future__ import annotations

import queue
import threading
import time
from typing import Any, Dict, List, Optional

from ...wire.events import RankStarted
from ..relay import RelayedRank, RelayedRankProcess
from .actors import RayRank

POLL_WAIT = 0.5      # s a rank's poll waits for its first event before answering with none
DRAIN_WAIT = 2.0     # s a rank to be killed may take to hand over the events it made before it is killed anyway
_TURN = 0.05         # s the relay waits for Ray before serving the supervisor's requests again


class _ActorRank(RelayedRank):
    """The relay's side of one rank (its pipes' write ends: ``relay.RelayedRank``), and where its calls stand."""

    def __init__(self, relay: "ActorRelay", rank: RayRank) -> None:
        super().__init__(relay, rank.rank, rank.pid)
        self.actor_rank = rank
        self.poll: Any = None                    # the ObjectRef of its poll in flight
        self.ended = False                       # its last events came
        self.running = True                      # its run (serve) call has not answered
        self.returned: Optional[int] = None
        self.killing_since: Optional[float] = None
        self.killed = False
        self.death: Optional[str] = None         # how its actor or node died, when it did (not by our kill)
        self.stack_calls: List[Any] = []


class ActorRelay:
    """Carries the ranks of ``ranks`` (whose ``call`` is set: ``run`` or ``serve`` in flight) into local pipes;
    ``handles`` are what the supervisor watches. ``close`` once the world is killed."""

    def __init__(self, ray: Any, ranks: List[RayRank]) -> None:
        self.ray = ray
        self._requests: "queue.Queue[tuple]" = queue.Queue()
        self._relayed: Dict[int, _ActorRank] = {rank.rank: _ActorRank(self, rank) for rank in ranks}
        self.handles: List[RelayedRankProcess] = [relayed.handle for relayed in self._relayed.values()]
        for relayed in self._relayed.values():
            # The rank's first event, from here: the kernel knows its node, and its row is there even if it dies
            # at once; the supervisor then counts it started (its stacks can be asked for).
            place = relayed.actor_rank.place
            network = relayed.actor_rank.network
            relayed.events.send(RankStarted(rank=place.rank, pid=relayed.actor_rank.pid, host=place.node,
                                            reports_resources=True,
                                            network=network.describe() if network is not None else None))
            relayed.poll = relayed.actor_rank.control("poll", POLL_WAIT)
        self._thread = threading.Thread(target=self._loop, name="notebook_accel-ray-relay", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------------ asked by the supervisor's thread

    def command(self, rank: int, command: Any) -> None:
        """Send ``command`` (a ``Command``, or the ObjectRef of one in the object store) to the rank's control
        thread, from this thread and at once (Ray's calls may come from any thread): handed to the relay thread, it
        waited for that thread's turn in ``ray.wait`` (up to ``_TURN``), on every warm run. Its answer is not
        waited for; an actor gone is the relay thread's to see."""
        relayed = self._relayed[rank]
        if not relayed.closed:
            relayed.actor_rank.control("command", command)

    def kill(self, rank: int) -> None:
        """End the rank's actor once the events it made are here (at most ``DRAIN_WAIT`` s from now)."""
        self._requests.put(("kill", rank, None))

    def ask_stacks(self, rank: int) -> bool:
        relayed = self._relayed[rank]
        if relayed.closed:
            return False
        self._requests.put(("stacks", rank, None))
        return True

    def death(self, rank: int) -> Optional[str]:
        """How the rank's actor (or node) died, when it was not killed by us."""
        return self._relayed[rank].death

    def close(self) -> None:
        """The world is gone (its actors killed): stop relaying and close what is still open. The relay thread
        does it, so that no pipe is closed while it writes there."""
        self._requests.put(("close", -1, None))
        self._thread.join(10.0)
        if self._thread.is_alive():  # stuck writing into a pipe nobody reads: its read end was closed by now
            return
        for relayed in self._relayed.values():
            relayed.process.close()

    # ------------------------------------------------------------------------------------ the relay thread

    def _loop(self) -> None:
        while not all(relayed.closed for relayed in self._relayed.values()):
            self._serve_requests()
            calls = self._calls()
            if not calls:
                time.sleep(_TURN)
                continue
            try:
                ready, rest = self.ray.wait(list(calls), num_returns=1, timeout=_TURN)
                if ready and rest:
                    more, _ = self.ray.wait(rest, num_returns=len(rest), timeout=0)
                    ready += more
            except Exception:  # Ray is gone (the kernel shuts down): every rank with it
                for relayed in self._relayed.values():
                    self._finish(relayed, None)
                return
            # Of one rank, its events first, then its run's answer.
            for ref in sorted(ready, key=lambda ref: calls[ref][1] != "poll"):
                relayed, kind = calls[ref]
                if relayed.closed:
                    continue
                if kind == "poll":
                    self._on_poll(relayed, ref)
                elif kind == "run":
                    self._on_run(relayed, ref)
                else:
                    self._on_stacks(relayed, ref)
            self._kill_due()

    def _calls(self) -> Dict[Any, tuple]:
        calls: Dict[Any, tuple] = {}
        for relayed in self._relayed.values():
            if relayed.closed:
                continue
            if relayed.poll is not None:
                calls[relayed.poll] = (relayed, "poll")
            if relayed.running:
                calls[relayed.actor_rank.call] = (relayed, "run")
            for ref in relayed.stack_calls:
                calls[ref] = (relayed, "stacks")
        return calls

    def _serve_requests(self) -> None:
        while True:
            try:
                kind, rank, argument = self._requests.get_nowait()
            except queue.Empty:
                return
            if kind == "close":
                for relayed in self._relayed.values():
                    self._finish(relayed, relayed.returned)
                return
            relayed = self._relayed[rank]
            if relayed.closed:
                continue
            if kind == "stacks":
                relayed.stack_calls.append(relayed.actor_rank.control("stacks"))
            elif kind == "kill" and relayed.killing_since is None:
                relayed.killing_since = time.monotonic()

    def _on_poll(self, relayed: _ActorRank, ref: Any) -> None:
        relayed.poll = None
        try:
            events, ended = self.ray.get(ref)
        except Exception as error:  # its actor is gone: nothing more will come
            self._actor_gone(relayed, error)
            return
        for event in events:
            relayed.write(event)
        relayed.ended = ended
        if not ended and relayed.killing_since is None:
            relayed.poll = relayed.actor_rank.control("poll", POLL_WAIT)
        if ended and not relayed.running:
            self._finish(relayed, relayed.returned)

    def _on_run(self, relayed: _ActorRank, ref: Any) -> None:
        relayed.running = False
        try:
            relayed.returned = self.ray.get(ref)
        except Exception as error:
            self._actor_gone(relayed, error)
            return
        if relayed.ended:
            self._finish(relayed, relayed.returned)

    def _on_stacks(self, relayed: _ActorRank, ref: Any) -> None:
        relayed.stack_calls.remove(ref)
        try:
            text = self.ray.get(ref)
        except Exception:  # its actor died meanwhile: the poll hears of it
            return
        relayed.write_stacks(text)

    def _actor_gone(self, relayed: _ActorRank, error: BaseException) -> None:
        relayed.running = False
        if not relayed.killed:
            relayed.death = describe_actor_death(self.ray, relayed.actor_rank, error)
        self._finish(relayed, None)

    def _kill_due(self) -> None:
        """Kill the ranks asked to be killed whose poll answered (their events are written), or that took longer
        than ``DRAIN_WAIT``."""
        now = time.monotonic()
        for relayed in self._relayed.values():
            if relayed.killing_since is None or relayed.killed or relayed.closed:
                continue
            if relayed.poll is None or now - relayed.killing_since >= DRAIN_WAIT:
                relayed.killed = True
                try:
                    self.ray.kill(relayed.actor_rank.actor, no_restart=True)
                except Exception:
                    pass

    def _finish(self, relayed: _ActorRank, exitcode: Optional[int]) -> None:
        """The rank is gone: EOF on its pipes, then its sentinel (the supervisor reads to EOF first)."""
        relayed.finish(exitcode)


def describe_actor_death(ray: Any, rank: RayRank, error: BaseException) -> str:
    """Why a rank's actor is gone, in one clause: its node was lost, or its process ended (Ray's own words)."""
    text = str(error)
    node_alive = True
    try:
        node_alive = any(node["NodeID"] == rank.place.node_id and node.get("Alive") for node in ray.nodes())
    except Exception:
        pass
    if not node_alive or "node has died" in text or "node died" in text:
        return f"its node ({rank.place.node_ip}, Ray node {rank.place.node_id[:8]}) was lost"
    detail = ""
    for line in text.splitlines():
        if "Worker exit detail:" in line:
            detail = line.split("Worker exit detail:", 1)[1].strip()
            break
        if line.startswith(("The actor is dead because", "The actor died because")):
            detail = line.strip()
    if not detail:
        detail = text.strip().splitlines()[-1] if text.strip() else type(error).__name__
    detail = detail.split(" Some common causes", 1)[0]  # Ray's guesses (OOM killer, `ray stop`) are its own
    return f"its Ray actor's process (pid {rank.pid}) ended without a result ({detail.rstrip('.')})"
