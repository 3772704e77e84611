"""The exceptions the launcher raises. A leaf: both sides import it, and it imports nothing of ours
(how a rank's exception is rebuilt in the kernel is ``outcome.raising``)."""
from __future__ import annotations

from typing import Dict, Iterable, Optional


class LaunchError(RuntimeError):
    """A launch failed without a re-raisable exception (a rank died, or its exception could not be rebuilt).

    ``rank``, ``exitcode`` and ``signal_name`` say which rank and how, when known.
    """

    def __init__(self, message: str, *, rank: Optional[int] = None, exitcode: Optional[int] = None,
                 signal_name: Optional[str] = None) -> None:
        super().__init__(message)
        self.rank = rank
        self.exitcode = exitcode
        self.signal_name = signal_name


class LaunchTimeout(LaunchError, TimeoutError):
    """The launch ran past ``timeout``; every rank was stopped. ``still_running`` lists the ranks that were,
    ``stacks`` where each was (its Python stacks, all threads, by rank)."""

    def __init__(self, message: str, *, still_running: Iterable[int] = (),
                 stacks: Optional[Dict[int, str]] = None) -> None:
        super().__init__(message)
        self.still_running = list(still_running)
        self.stacks = dict(stacks or {})


class TimeLimitReached(LaunchError):
    """The job's time limit (or a preemption) is near: the ranks were warned (SIGUSR2; Slurm's
    ``--signal=USR2@N``), agreed on a step, saved a checkpoint there and stopped. ``step``: the optimizer steps
    done (counting those a ``load_state()`` restored); ``checkpoint``: the directory saved.
    ``accelerator.load_state()`` in a new launch resumes at the next step."""

    def __init__(self, message: str, *, step: int = 0, checkpoint: Optional[str] = None) -> None:
        super().__init__(message)
        self.step = step
        self.checkpoint = checkpoint


class LaunchConfigError(ValueError):
    """Bad input to the launcher, raised before any process starts.

    ``entry_point`` is the call it was given to (``"Session.run"``), set by that entry point; the message starts
    with it: ``Session.run: display='bogus' is not one of 'auto', 'widgets', 'text', 'none'``.
    """

    entry_point: Optional[str] = None

    def __str__(self) -> str:
        text = super().__str__()
        return f"{self.entry_point}: {text}" if self.entry_point else text


class LaunchConfigTypeError(LaunchConfigError, TypeError):
    """An option or argument of the wrong type (``return_all="yes"``, an unknown keyword): a ``LaunchConfigError``
    that is also the ``TypeError`` Python raises for such mistakes."""


def one_line(error: BaseException) -> str:
    """``"TypeName: first line of the message"``, for headers and status lines; ``"TypeName"`` alone when the
    message is empty (pdb's ``BdbQuit``, a bare ``KeyboardInterrupt``), as Python's own last line says it.

    A first line that ends with a colon (``"rank 1 was killed by SIGKILL; its last output:"``) ends with the last
    of the lines it introduces, not with nothing after the colon.

    >>> one_line(ValueError("bad batch")), one_line(KeyboardInterrupt())
    ('ValueError: bad batch', 'KeyboardInterrupt')
    >>> one_line(LaunchError("rank 1 was killed by SIGKILL; its last output:\\n    step 6\\n    step 7"))
    'LaunchError: rank 1 was killed by SIGKILL; its last output: … step 7'
    """
    lines = str(error).strip().splitlines()
    if not lines or not lines[0].strip():
        return type(error).__name__
    first, rest = lines[0], [line.strip() for line in lines[1:] if line.strip()]
    if first.rstrip().endswith(":") and rest:
        first = f"{first.rstrip()} {'… ' if len(rest) > 1 else ''}{rest[-1]}"
    return f"{type(error).__name__}: {first}"


class RemoteTraceback(Exception):
    """Carries a rank's formatted traceback as the ``__cause__`` of the re-raised exception.

    The same trick as ``concurrent.futures.process``: the kernel's traceback shows the launcher frames,
    then "The above exception was the direct cause...", then the rank's own frames.
    """

    def __init__(self, traceback_text: str, full_text: Optional[str] = None) -> None:
        super().__init__(traceback_text)
        self.traceback_text = traceback_text
        self.full_text = full_text or traceback_text  # with the launcher's frames, for a bug report

    def __str__(self) -> str:
        return self.traceback_text
