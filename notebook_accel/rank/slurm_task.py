"""A rank as a task of a Slurm job step: ``srun ... python -m notebook_accel.rank.slurm_task``.

Every rank of a launch with ``cluster="slurm"`` is one task of one ``srun`` (``backends.slurm``). Its place comes
from Slurm — ``SLURM_PROCID`` is ``RANK``, ``SLURM_LOCALID`` ``LOCAL_RANK``, ``SLURM_NODEID`` ``GROUP_RANK``,
``SLURM_NTASKS`` ``WORLD_SIZE`` — and it talks to the kernel only through the stdin and stdout ``srun`` forwards
(munge-authenticated by Slurm, no port of ours), in frame lines (``wire.text_frames``):

1. at once, ``("hello", where)``: its node, pid, job step, and the address and interface it offers its peers (the
   address of this node on the route to the node ``srun`` runs on, ``SLURM_LAUNCH_NODE_IPADDR``: never the host
   name, which may resolve to loopback); rank 0 then hosts the store every rank meets at (a port it holds) and says
   ``("store", port)``;
2. it waits for ``("run", setup)`` (the launch's environment, ``MASTER_ADDR``/``MASTER_PORT``, the function), then
   runs it as a Ray rank runs (``rank.actor.RankActor``: the same fd capture, events, result, failure), sending its
   events as ``("events", events, last)`` while it runs — or, for a warm ``Session``, serves its tasks (the
   commands the kernel sends) until ``Shutdown``;
3. ``("returned", exit code)``, and the process ends with that code.

Meanwhile it reads the kernel's messages for it: a ``Command`` (``Interrupt``, a line typed at its prompt),
``("stacks",)`` (it answers ``("stacks", text)``), ``("kill",)`` (it ends at once, as SIGKILL would end a process
rank). The end of stdin means the kernel (or ``srun``) is gone: the task ends.
"""
from __future__ import annotations

import os
import queue
import socket
import sys
import threading
from typing import Any, Dict, List, Optional, Tuple

from ..wire.text_frames import EVERY_RANK, FrameWriter, LineDecoder
from .actor import ActorRankSpec, RankActor
from .network import interface_of, rank_network, route_address
from .time_warning import install_termination_warning, install_warning_handler

KILLED_EXIT = 137                 # as a process killed by SIGKILL reports itself in a shell
POLL_WAIT = 0.2
# s the events of a batch wait for the task's end that follows them (``EventQueue.take``): sent apart, the second write
# would wait for the first's delayed ACK, 40 ms (``wire.text_frames``); a long task's output comes this much later.
TASK_END_LINGER = 0.05


def node_network(launch_address: Optional[str]) -> Tuple[str, Optional[str]]:
    """The address this rank offers its peers and the interface that carries it (see the module docstring)."""
    address = route_address(launch_address) if launch_address else "127.0.0.1"
    return address, interface_of(address)


def slurm_place(environ: Dict[str, str]) -> Dict[str, int]:
    """The task's place, from Slurm's variables."""
    return {"rank": int(environ["SLURM_PROCID"]), "local_rank": int(environ.get("SLURM_LOCALID", "0")),
            "node_rank": int(environ.get("SLURM_NODEID", "0")), "world_size": int(environ["SLURM_NTASKS"])}


class SlurmTask:
    """One task's side of the conversation (see the module docstring)."""

    def __init__(self) -> None:
        # srun's stdin and stdout are the channel: kept on fds of their own before the rank's capture takes 0-2.
        self.wire_in = os.dup(0)
        self.wire_out = os.dup(1)
        self.place = slurm_place(dict(os.environ))
        self.rank = self.place["rank"]
        self.writer = FrameWriter(self.wire_out, self.rank)
        self.node = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
        self.address, self.interface = node_network(os.environ.get("SLURM_LAUNCH_NODE_IPADDR"))
        self.actor = RankActor(self.rank, self.node)
        self.setups: "queue.Queue[Optional[Dict[str, Any]]]" = queue.Queue()
        self._started = False   # the run (or a session's task loop) began: the end of stdin must end it
        self._last: List[Any] = []   # the rank's last events, sent with its exit code

    def serve(self) -> int:
        self.writer.send(("hello", {
            "node": self.node, "pid": os.getpid(), "address": self.address, "interface": self.interface,
            "step": f"{os.environ.get('SLURM_JOB_ID', '?')}.{os.environ.get('SLURM_STEP_ID', '?')}",
            "gpus": os.environ.get("CUDA_VISIBLE_DEVICES"), **self.place}))
        threading.Thread(target=self._read_kernel, name="notebook_accel-slurm-commands", daemon=True).start()
        if self.rank == 0:
            self.writer.send(("store", self.actor.host_store(self.place["world_size"])))
        setup = self.setups.get()
        if setup is None:  # the kernel went away before the run
            return 1
        pump = threading.Thread(target=self._pump, name="notebook_accel-slurm-events", daemon=True)
        pump.start()
        self._started = True
        spec = self._spec(setup)
        if setup.get("serve"):   # a warm session's rank: its task loop, until Shutdown
            spec.group_backend, spec.group_generation = setup["group_backend"], setup["group_generation"]
            code = self.actor.serve(spec)
        else:
            code = self.actor.run(spec, setup["payload"])
        pump.join()
        self.writer.send_many([("events", self._last, True), ("returned", code)])   # one write: see TASK_END_LINGER
        return code

    def _spec(self, setup: Dict[str, Any]) -> ActorRankSpec:
        env = dict(setup["env"])   # the launch's own variables, then the rank's place as Slurm gave it
        env.update(RANK=str(self.rank), LOCAL_RANK=str(self.place["local_rank"]),
                   GROUP_RANK=str(self.place["node_rank"]), ROLE_RANK=str(self.rank),
                   WORLD_SIZE=str(self.place["world_size"]), ROLE_WORLD_SIZE=str(self.place["world_size"]),
                   LOCAL_WORLD_SIZE=str(setup["ranks_per_node"]))
        # gloo's interface: the one carrying this node's address, unless the user named one (here or in the kernel)
        env.update(rank_network(self.address, {**os.environ, **setup["env"]}).env)
        return ActorRankSpec(rank=self.rank, world_size=self.place["world_size"], env=env,
                             send_result=setup["return_all"] or self.rank == 0, node=self.node,
                             no_one_types=setup.get("no_one_types"), post_mortem=setup.get("post_mortem", False))

    def _pump(self) -> None:
        """The rank's events to the kernel as they come, a batch with the task's end that follows it; the last batch
        is kept (``_last``) for ``serve`` to send with the rank's exit code."""
        while True:
            events, last = self.actor.poll(POLL_WAIT, linger=TASK_END_LINGER)
            if last:
                self._last = events
                return
            if events:
                self.writer.send(("events", events, False))

    def _read_kernel(self) -> None:
        decoder = LineDecoder()
        with os.fdopen(self.wire_in, "r", encoding="ascii", errors="replace") as lines:
            for line in lines:
                decoded = decoder.feed(line)
                if decoded is None or decoded[0] not in (EVERY_RANK, self.rank):
                    continue
                self._handle(decoded[1])
        # stdin ended: the kernel or srun is gone. Nothing will read what this rank makes.
        self.setups.put(None)
        if self._started:   # the rank runs (or waits for a session's tasks): end it, as a process rank dies with
            os._exit(1)     # its kernel

    def _handle(self, message: Any) -> None:
        if isinstance(message, tuple) and message and message[0] == "run":
            self.setups.put(message[1])
        elif isinstance(message, tuple) and message and message[0] == "stacks":
            threading.Thread(target=lambda: self.writer.send(("stacks", self.actor.stacks())), daemon=True).start()
        elif isinstance(message, tuple) and message and message[0] == "kill":
            os._exit(KILLED_EXIT)
        else:  # a Command: Interrupt, a PromptAnswer
            self.actor.command(message)


def main() -> None:
    install_warning_handler(fresh=True)  # Slurm's --signal=USR2@N reaches this task: a flag, not the default death
    install_termination_warning()        # a detached job's preemption (SIGTERM) too
    code = SlurmTask().serve()
    sys.stdout.flush()
    os._exit(code)


if __name__ == "__main__":
    main()
