"""Kernel side of a TPU launch: one host process carries every rank; the supervisor watches it and its workers.

torch_xla knows each TPU generation's topology (worker processes per host, chips per process, a thread per
device, the PJRT coordination variables), so we do not re-implement it: the host calls ``xmp.spawn``. What we
keep is ours: the host is started, captured, tied to the kernel's life and stopped like any process rank; each
rank (device) gets its own pre-made stdout, stderr and event pipes, so the supervisor reads it like a process
rank even though it is a thread in a worker that the host forked.
"""
from __future__ import annotations

import os
import shutil
import tempfile
import warnings
from typing import Dict, List, Optional

from ...plan import tpu
from ...rank.xla.host import XlaHostSpec, host_main
from ...wire.fds import PassedFd, rank_pipes
from ..processes.backend import ProcessBackend
from ..processes.starting import ensure_fork_server, starting_rank_process
from ..supervisor import RankProcess


class XlaBackend(ProcessBackend):
    """All ranks of a TPU launch in one host process (``plan.start_method`` starts it); the rest is the
    process backend's: supervisor, stop, timeout, lifeline.

    Example::

        plan = plan_launch(train, device="xla")          # plan.backend == "xla"
        outcome = XlaBackend(plan).run(store.env(), sink)
    """

    name = "xla"
    _temp_dir: Optional[str] = None
    # What the host process runs and the spec it gets: a warm session's host (``backends.session``) differs here.
    host_spec_class = XlaHostSpec
    host_target = staticmethod(host_main)

    def _host_spec_extras(self) -> Dict[str, object]:
        """More fields for the host's spec (none for a launch)."""
        return {}

    def start(self, rendezvous_env: Dict[str, str]) -> List[RankProcess]:
        # The launch's own TMPDIR, removed when it ends: workers leave temp files behind (torch.distributed
        # makes one at import), since a pool worker never runs its interpreter's exit handlers.
        self._temp_dir = tempfile.mkdtemp(prefix="notebook_accel-xla-")
        world = self.plan.world_size
        pipes = [rank_pipes() for _ in range(world)]
        # Each device thread's prompts (pdb, input()) are answered on a socket of its own (a session's: on its
        # command socket).
        answers = [self._answers_socket() for _ in range(world)] if self.answers_own_socket else []
        inherited: List[int] = []
        if self.plan.start_method == "fork":  # the host must close the kernel's ends it inherited
            inherited = [self._lifeline_w] + [read for rank in pipes for read, _ in rank.values()]
        spec = self.host_spec_class(
            world_size=world, env=self.host_env(rendezvous_env), cwd=self.plan.kernel_cwd,
            sys_path=self.plan.kernel_sys_path, payload=self.plan.payload.pickled(),
            return_all=self.plan.return_all, nprocs=1 if world == 1 else None,
            pipes=[tuple(PassedFd(rank[name][1]) for name in ("stdout", "stderr", "events", "stacks"))
                   for rank in pipes],
            lifeline_fd=PassedFd(self._lifeline_r), inherited_fds=inherited,
            compile_cache=getattr(self.plan.site, "compile_cache", None),  # an XlaHost's
            answer_fds=[PassedFd(rank_end.fileno()) for _, rank_end in answers] or None,
            post_mortem=self.plan.post_mortem, no_one_types=self._no_one_types, **self._host_spec_extras())
        process = self.context.Process(target=self.host_target, args=(spec,), name="notebook_accel-xla-host")
        try:
            if self.plan.start_method == "forkserver":
                ensure_fork_server()
            with warnings.catch_warnings(), starting_rank_process():
                warnings.simplefilter("ignore", DeprecationWarning)  # fork in a multi-threaded kernel (3.12+)
                process.start()
        except BaseException:
            for rank in pipes:
                for read, _ in rank.values():
                    os.close(read)
            raise
        finally:
            for rank in pipes:
                for _, write in rank.values():
                    os.close(write)  # the kernel keeps only read ends
            for _, rank_end in answers:
                rank_end.close()
            os.close(self._lifeline_r)
        return [RankProcess(rank, process, pipe["stdout"][0], pipe["stderr"][0], pipe["events"][0],
                            pipe["stacks"][0], answers=answers[rank][0] if answers else None)
                for rank, pipe in enumerate(pipes)]

    def host_env(self, rendezvous_env: Dict[str, str]) -> Dict[str, str]:
        """The environment of the host and its workers: the kernel's, torchrun's world-level variables (a rank
        number is per device thread, so ``RANK`` is set only where a worker runs exactly one device), the
        precision, and ``PJRT_DEVICE`` when we found a TPU and the user chose no client."""
        # The kernel's whole environment as the launch was called: the host comes from a fork server started
        # earlier, and torch_xla reads much of its configuration from it (PJRT_DEVICE, TPU_*, XLA_FLAGS).
        env = dict(self.plan.kernel_env)
        env.update(self.plan.rank_env(0, rendezvous_env))
        for per_rank in ("RANK", "LOCAL_RANK", "ROLE_RANK"):
            env.pop(per_rank, None)
        if "PJRT_DEVICE" not in env and tpu.detect_tpu() is not None:
            env["PJRT_DEVICE"] = "TPU"
        if self._temp_dir:
            env["TMPDIR"] = self._temp_dir
        return env

    def close(self) -> None:
        super().close()
        if self._temp_dir:
            shutil.rmtree(self._temp_dir, ignore_errors=True)
            self._temp_dir = None


__all__ = ["XlaBackend"]
