"""A person at a notebook, for tests: a real Jupyter kernel (``jupyter_client``) whose cells run with
``allow_stdin``, and whose input boxes (``input_request`` messages) are answered by a script.

    kernel = TypingKernel(cwd=str(tmp_path))
    run = kernel.run(cell, Answers([("rank 1", "p x"), ("rank 1", "c")]))
    run.prompts[0].text      # '[rank 1] (Pdb) '
    run.output               # everything the cell showed (streams, errors' tracebacks)
"""
from __future__ import annotations

import queue
import re
import time
from dataclasses import dataclass, field
from typing import Callable, List, Optional, Sequence, Tuple

from jupyter_client.manager import start_new_kernel

from scripts import script_env


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

    def __init__(self, cwd: str, env: Optional[dict] = None) -> None:
        # Not the checkout as cwd: a kernel puts its cwd first on sys.path, and would import the checkout's package
        self.manager, self.client = start_new_kernel(kernel_name="python3", env=env or script_env(), cwd=cwd)

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


ANSI = re.compile(r"\x1b\[[0-9;]*m")


def plain(text: str) -> str:
    """Text without the terminal colours IPython puts in tracebacks."""
    return ANSI.sub("", text)
