"""A person at a notebook, for tests: a real Jupyter kernel (``jupyter_client``) whose cells run with
``allow_stdin``, and whose input boxes (``input_request`` messages) are answered by a script.

    kernel = TypingKernel(cwd=str(tmp_path))
    run = kernel.run(cell, Answers([("rank 1", "p x"), ("rank 1", "c")]))
    run.prompts[0].text      # '[rank 1] (Pdb) '
    run.output               # everything the cell showed (streams, errors' tracebacks)
"""
from __future__ import annotations

import os
import queue
import re
import time
from dataclasses import dataclass, field
from typing import Callable, List, Optional, Sequence, Tuple

import psutil
from jupyter_client.manager import KernelManager, start_new_kernel

from scripts import script_env

# The kernels a module keeps up for its tests (``SharedKernel``): conftest's leftover check looks them up here (as
# ``ray_cluster.KEPT_TREES``); ``SharedKernel.ranks_left`` checks what runs under them after each test instead.
KEPT_TREES: set = set()


@dataclass
class Prompt:
    """One input box the cell opened: its prompt, what the cell had shown before it, what was typed."""

    text: str
    output_before: str
    answer: str


@dataclass
class CellRun:
    output: str
    prompts: List[Prompt] = field(default_factory=list)
    error: Optional[dict] = None     # the cell's error: ename, evalue, traceback
    seconds: float = 0.0

    def output_after(self, prompt_index: int) -> str:
        """What the cell showed after the ``prompt_index``-th prompt was answered (until the next one)."""
        start = len(self.prompts[prompt_index].output_before)
        end = (len(self.prompts[prompt_index + 1].output_before) if prompt_index + 1 < len(self.prompts)
               else len(self.output))
        return self.output[start:end]


class Answers:
    """What a person types: ``(pattern the prompt must match, line)`` in order, each after ``delay`` seconds
    (a third item). A prompt that does not match, or one too many, is recorded as unexpected and answered
    with ``fallback`` (``c``: go on, so that the cell ends and the test can say what was wrong)."""

    def __init__(self, steps: Sequence[Tuple], fallback: str = "c") -> None:
        self.steps = list(steps)
        self.fallback = fallback
        self.unexpected: List[str] = []

    def __call__(self, prompt: str, output: str) -> str:
        if not self.steps:
            self.unexpected.append(f"one prompt too many: {prompt!r}")
            return self.fallback
        pattern, line, *delay = self.steps.pop(0)
        if not re.search(pattern, prompt):
            self.unexpected.append(f"prompt {prompt!r} does not match {pattern!r} (would have typed {line!r})")
        if delay:
            time.sleep(delay[0])
        return line

    def check(self, run: Optional["CellRun"] = None) -> None:
        shown = f"\nthe cell showed:\n{plain(run.output)[-4000:]}" if run is not None else ""
        assert not self.unexpected, f"{self.unexpected}{shown}"
        assert not self.steps, f"prompts never asked for: {self.steps}{shown}"


class TypingKernel:
    """A kernel of the python under test, importing the notebook_accel under test."""

    def __init__(self, cwd: str, env: Optional[dict] = None, connection_file: str = "") -> None:
        """``connection_file``: where the kernel's ports are written (by default a new file in the system's temp
        dir, removed at ``close``; a kernel kept across tests keeps it in its test dir)."""
        # Not the checkout as cwd: a kernel puts its cwd first on sys.path, and would import the checkout's package
        options = {"env": env or script_env(), "cwd": cwd}
        if not connection_file:
            self.manager, self.client = start_new_kernel(kernel_name="python3", **options)
            return
        self.manager = KernelManager(kernel_name="python3", connection_file=connection_file)
        self.manager.start_kernel(**options)
        self.client = self.manager.client()
        self.client.start_channels()
        try:
            self.client.wait_for_ready(timeout=60)
        except RuntimeError:
            self.close()
            raise

    def run(self, code: str, answer: Optional[Callable[[str, str], str]] = None, *, timeout: float = 120.0,
            allow_stdin: bool = True) -> CellRun:
        """Run ``code`` as a cell; every input box it opens gets ``answer(prompt, output so far)``. A cell still
        running after ``timeout`` s is interrupted and ``TimeoutError`` raised (with what it showed)."""
        client = self.client
        started = time.monotonic()
        msg_id = client.execute(code, allow_stdin=allow_stdin, stop_on_error=False)
        run = CellRun(output="")
        replied = idle = False
        while not (replied and idle):
            if time.monotonic() - started > timeout:
                self.manager.interrupt_kernel()
                self._settle(msg_id)
                raise TimeoutError(f"the cell still ran after {timeout:g} s; it showed:\n{run.output[-4000:]}")
            try:
                message = client.get_stdin_msg(timeout=0.02)
            except queue.Empty:
                pass
            else:
                if message["msg_type"] == "input_request":
                    idle = self._read_output(msg_id, run) or idle  # what was shown before the box, as a person sees it
                    prompt = message["content"]["prompt"]
                    line = answer(prompt, run.output) if answer is not None else "c"
                    run.prompts.append(Prompt(prompt, run.output, line))
                    client.input(line)
            try:
                message = client.get_iopub_msg(timeout=0.02)
            except queue.Empty:
                pass
            else:
                if message["parent_header"].get("msg_id") == msg_id:
                    idle = idle or self._take(message, run)
            try:
                reply = client.get_shell_msg(timeout=0)
            except queue.Empty:
                pass
            else:
                replied = replied or reply["parent_header"].get("msg_id") == msg_id
        run.seconds = time.monotonic() - started
        return run

    def _read_output(self, msg_id: str, run: CellRun, quiet: float = 0.3) -> bool:
        """Take the cell's output until none came for ``quiet`` s (output and input boxes come on two channels, so an
        input box may arrive before the output shown above it); True once the kernel said it is idle."""
        idle = False
        while True:
            try:
                message = self.client.get_iopub_msg(timeout=quiet)
            except queue.Empty:
                return idle
            if message["parent_header"].get("msg_id") == msg_id:
                idle = self._take(message, run) or idle

    @staticmethod
    def _take(message: dict, run: CellRun) -> bool:
        kind, content = message["msg_type"], message["content"]
        if kind == "stream":
            run.output += content["text"]
        elif kind == "error":
            run.error = content
            run.output += "\n".join(content["traceback"]) + "\n"
        elif kind in ("execute_result", "display_data"):
            run.output += content["data"].get("text/plain", "") + "\n"
        return kind == "status" and content["execution_state"] == "idle"

    def _settle(self, msg_id: str, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                reply = self.client.get_shell_msg(timeout=0.5)
            except queue.Empty:
                continue
            if reply["parent_header"].get("msg_id") == msg_id:
                return

    def close(self) -> None:
        self.client.stop_channels()
        self.manager.shutdown_kernel(now=True)


class SharedKernel:
    """One kernel for a module's tests (a kernel takes about a second to start, a test one or two to run): each test
    gets it with what the last one left undone (``RESET``); when the reset fails, or the test failed, the next test
    gets a fresh kernel (``close``, then ``reset`` starts one). ``setup``: the cell every fresh kernel runs first."""

    # What a test's cells may leave: ``%pdb on``, the names they defined, the environment variables they set
    # (os.environ goes back to what it was once the kernel started, kept in ``sys``: ``%reset`` clears the names)
    KEEP_ENV = "import os, sys\nsys._typing_kernel_env = dict(os.environ)\n"
    RESET = ("%pdb off\n%reset -f\nimport os, sys\n"
             "os.environ.clear(); os.environ.update(sys._typing_kernel_env)\n")

    def __init__(self, cwd: str, setup: str = "") -> None:
        self.cwd, self.setup = cwd, setup
        self.started = 0  # kernels started: a failed test's kernel is replaced
        self.kernel: Optional[TypingKernel] = None

    def reset(self) -> TypingKernel:
        """The kernel, as a fresh one would be after ``setup``."""
        if self.kernel is not None and self.kernel.manager.is_alive():
            try:
                if self.kernel.run(self.RESET + self.setup, allow_stdin=False, timeout=30).error is None:
                    return self.kernel
            except TimeoutError:
                pass
        self.close()
        self.started += 1
        self.kernel = TypingKernel(cwd=self.cwd, connection_file=os.path.join(self.cwd, f"kernel-{self.started}.json"))
        KEPT_TREES.add(self.kernel.manager.provisioner.pid)
        self.kernel.run(self.KEEP_ENV + self.setup, timeout=120)
        return self.kernel

    def ranks_left(self, timeout: float = 5.0) -> List[str]:
        """The kernel's child processes still running after ``timeout`` s (a test's ranks must all end with it), but
        multiprocessing's own helpers, which stay up on purpose in any kernel that used them."""
        deadline = time.monotonic() + timeout
        while True:
            left = []
            if self.kernel is not None:
                try:
                    children = psutil.Process(self.kernel.manager.provisioner.pid).children(recursive=True)
                except psutil.NoSuchProcess:
                    children = []
                for child in children:
                    try:
                        command = " ".join(child.cmdline())
                        if child.status() != psutil.STATUS_ZOMBIE and not re.search(
                                r"multiprocessing\.(forkserver|resource_tracker)", command):
                            left.append(f"{child.pid}: {command}")
                    except psutil.Error:
                        pass
            if not left or time.monotonic() > deadline:
                return left
            time.sleep(0.05)

    def close(self) -> None:
        if self.kernel is not None:
            KEPT_TREES.discard(self.kernel.manager.provisioner.pid)
            self.kernel.close()
            self.kernel = None


ANSI = re.compile(r"\x1b\[[0-9;]*m")


def plain(text: str) -> str:
    """Text without the terminal colours IPython puts in tracebacks."""
    return ANSI.sub("", text)
