"""Inside a rank: pdb (and ``input()``) read the lines typed where the launch was started.

A rank's stdin is ``/dev/null`` and its stdout a pipe: left alone, pdb at a breakpoint reads end-of-input and quits
(the breakpoint is silently skipped), and ``torch.distributed.breakpoint``'s pdb, which reopens ``/dev/stdin``,
does the same. Every pdb (``breakpoint()``, ``pdb.set_trace()``, torch's, ``interact``'s console) reads its
commands with ``input()``, so ``route_prompts`` makes the rank's ``input()`` ask through its channel: flush the
rank's output, send a ``RankPrompt`` (with the frame pdb stands in), wait for the ``PromptAnswer``. The kernel
asks whoever launched, one prompt at a time (``backends.prompts``). fd 0 stays ``/dev/null``: a subprocess the rank
starts must not wait for a terminal it does not have.

When no one can type (a notebook run by nbclient/papermill/nbval, CI, a script with stdin not a terminal) the rank
is told so as it starts (``no_one_types`` on its channel, with why), or by the answer to its first prompt:
``breakpoint()`` then returns at once and another pdb is told ``continue``, after one line (once per place) saying
what was skipped and why; ``input()`` gets end-of-input. ``PYTHONBREAKPOINT=0`` turns ``breakpoint()`` off, as in
Python.

``post_mortem(exc)`` opens pdb on the frame that raised (``run_rank(post_mortem=True)``, ``Session.debug``).
"""
from __future__ import annotations

import bdb
import builtins
import importlib
import os
import sys
import threading
import types
from types import FrameType
from typing import Any, Callable, Dict, Optional, Set, Tuple

from ..wire.channel import rank_channel
from ..wire.events import PromptKind, RankPrompt
from .streams import flush_std_streams
from .tracebacks import is_launcher_frame, skip_launcher_frames

POST_MORTEM_MARK = "notebook_accel_post_mortem"  # set on the pdb that ``post_mortem`` opens
BREAKPOINT_MARK = "notebook_accel_breakpoint"     # set on the pdb that ``breakpoint()`` opens (not pdb.set_trace())


class PromptInterrupted(BaseException):
    """The rank was interrupted (Stop, a peer's failure, the kernel's interrupt) while its pdb waited for a line.
    pdb takes a ``KeyboardInterrupt`` at its prompt as "cancel this command" and asks again; this one it lets
    through, and ``run_rank`` turns it back into the ``KeyboardInterrupt`` it was."""


_lock = threading.Lock()
_depth = 0
_saved: Optional[Tuple[Callable[..., str], Callable[..., Any]]] = None


def route_prompts() -> Callable[[], None]:
    """Make ``input()`` and ``breakpoint()`` in this process go through the current rank's channel (a thread that
    is no rank's keeps Python's own); returns the undo. Ranks that are threads of one process share the routing:
    the last one to end undoes it. The hook of a debugger a front end is attached to (JupyterLab's, through
    debugpy) is left in place; an idle one (a kernel's debugpy ignores ``breakpoint()`` then) is not.

    Example::

        undo = route_prompts()
        try:
            train()        # breakpoint() in it asks whoever launched
        finally:
            undo()
    """
    global _depth, _saved
    with _lock:
        if _depth == 0:
            _saved = (builtins.input, sys.breakpointhook)
            builtins.input = rank_input
            if not _front_end_debugger_attached():
                sys.breakpointhook = rank_breakpointhook
        _depth += 1
    done = False

    def undo() -> None:
        global _depth
        nonlocal done
        with _lock:
            if done:
                return
            done = True
            _depth -= 1
            if _depth == 0 and _saved is not None:
                builtins.input, sys.breakpointhook = _saved
    return undo


def forget_kernel_hooks() -> None:
    """A rank process's first step: the ``input()`` and ``sys.breakpointhook`` it inherited from a kernel (ipykernel's
    input box, debugpy's hook) talk to the kernel's sockets, which are not this process's, as do its
    ``sys.excepthook`` and ``sys.displayhook`` (an error or a value in pdb's ``interact`` console would be sent there,
    not printed); and its ``pdb`` is Python's again (ipykernel puts IPython's in the module: ``ipdb>``, colours), as
    in a script and a spawned rank."""
    if not isinstance(builtins.input, types.BuiltinFunctionType):
        builtins.input = _plain_input
    sys.breakpointhook = sys.__breakpointhook__
    sys.excepthook, sys.displayhook = sys.__excepthook__, sys.__displayhook__
    if "ipykernel" in sys.modules:  # the kernel's console prompts ("In : "): ``interact`` asks ">>> " again
        for name in ("ps1", "ps2"):
            if hasattr(sys, name):
                delattr(sys, name)
    pdb = sys.modules.get("pdb")
    if pdb is not None and getattr(pdb.Pdb, "__module__", "pdb") != "pdb":
        importlib.reload(pdb)


def _front_end_debugger_attached() -> bool:
    """A debugger front end drives this process (JupyterLab's visual debugger, through debugpy)."""
    debugpy = sys.modules.get("debugpy")
    try:
        return debugpy is not None and bool(debugpy.is_client_connected())
    except Exception:
        return False


def python_pdb() -> type:
    """Python's own ``pdb.Pdb`` (in a kernel, ``pdb.Pdb`` is IPython's subclass of it)."""
    import pdb

    return next(cls for cls in pdb.Pdb.__mro__ if cls.__module__ == "pdb")


def call_user_function(function: Callable[..., Any], args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Any:
    """Call the rank's function (``run_rank`` does): this frame is where a rank's pdb stack begins (``w``, ``up``
    stop at the user's outermost frame), and an interrupt that reached the function's pdb prompt is the
    ``KeyboardInterrupt`` it was."""
    try:
        return function(*args, **kwargs)
    except PromptInterrupted:
        raise KeyboardInterrupt("interrupted at a pdb prompt") from None


def _plain_input(prompt: object = "") -> str:
    """Python's ``input()`` where stdin is no terminal."""
    sys.stdout.write(str(prompt))
    sys.stdout.flush()
    line = sys.stdin.readline()
    if not line:
        raise EOFError
    return line[:-1] if line.endswith("\n") else line


def _python_input(prompt: object = "") -> str:
    return (_saved[0] if _saved is not None else _plain_input)(prompt)


def rank_input(prompt: object = "") -> str:
    """``input()`` in a rank: the line typed where the launch was started, asked for through the rank's channel.

    Raises ``EOFError`` at end of input (Ctrl-D) and when no one can type (after saying so once per place)."""
    channel = rank_channel()
    if channel is None or not hasattr(channel, "ask"):
        return _python_input(prompt)
    debugger = _debugger_asking()
    event = _prompt_event(channel.rank, str(prompt), debugger)
    skipped = channel.no_one_types
    if skipped is None:
        flush_std_streams()  # the kernel shows the rank's output up to here before it asks
        try:
            answer = channel.ask(event)
        except KeyboardInterrupt:
            if debugger is not None:
                raise PromptInterrupted() from None
            raise
        if answer.skipped is None and answer.line is not None:
            if _leaves_console(debugger, str(prompt), answer.line):
                raise EOFError  # back to pdb, as Ctrl-D does
            return answer.line
        if answer.skipped is None:
            raise EOFError  # Ctrl-D: pdb quits (BdbQuit), as in a terminal
        skipped = channel.no_one_types = answer.skipped
    _say_skipped(channel, event, skipped, by_breakpoint=debugger is None or getattr(debugger, BREAKPOINT_MARK, False))
    if debugger is not None:
        return "continue"  # no one to type: the code goes on (pdb's end-of-input would quit with BdbQuit)
    raise EOFError


def _leaves_console(debugger: Optional[bdb.Bdb], prompt: str, line: str) -> bool:
    """``exit()`` (or ``quit()``) typed in pdb's ``interact`` console: a notebook's input box cannot send Ctrl-D,
    and in a rank ``exit()`` would end the rank (Python's) or ask the kernel to shut down (IPython's). It goes back
    to pdb instead, as Python 3.13's pdb does."""
    console = debugger is not None and prompt != getattr(debugger, "prompt", prompt)  # not pdb's own "(Pdb) "
    return console and line.strip() in ("exit()", "quit()")


# ray.init() sets PYTHONBREAKPOINT to its own remote debugger (ray/_private/worker.py) in the driver and in every
# worker; a kernel that used Ray must still debug its ranks here.
RAY_DEBUGGER = "ray.util.rpdb."


def rank_breakpointhook(*args: Any, **kws: Any) -> Any:
    """``breakpoint()`` in a rank: Python's (``PYTHONBREAKPOINT`` honoured), except that once no one can type it
    returns at once, and pdb stops in the caller's frame (not in this hook's)."""
    hook = os.environ.get("PYTHONBREAKPOINT", "")
    if hook.startswith(RAY_DEBUGGER):  # set by ray.init() (in the kernel, or in an actor), not by the user
        hook = ""
    if hook == "0":
        return None
    channel = rank_channel()
    if channel is not None and getattr(channel, "no_one_types", None) is not None:
        caller = sys._getframe(1)
        event = RankPrompt(rank=channel.rank, prompt="", kind=PromptKind.BREAKPOINT,
                           filename=caller.f_code.co_filename, lineno=caller.f_lineno)
        _say_skipped(channel, event, channel.no_one_types)
        return None
    if hook not in ("", "pdb.set_trace"):  # another debugger, named by the user
        return sys.__breakpointhook__(*args, **kws)
    debugger = python_pdb()()
    setattr(debugger, BREAKPOINT_MARK, True)
    header = kws.get("header")
    if header is not None:
        debugger.message(header)
    _set_trace(debugger, sys._getframe(1))
    return None


def _set_trace(debugger: bdb.Bdb, frame: FrameType) -> None:
    """``pdb.set_trace(frame)``, except that the debugger's stack (``w``, ``up``) begins at the user's outermost frame:
    not at the launcher's frames above it, nor at those a forked rank inherited from the kernel (IPython's, asyncio's).
    """
    chain, current = [], frame
    while current is not None and current.f_code is not call_user_function.__code__:
        chain.append(current)
        current = current.f_back
    if current is None:  # not under a rank's function (another thread): pdb's own way
        debugger.set_trace(frame)
        return
    users = [candidate for candidate in reversed(chain) if not is_launcher_frame(candidate.f_code.co_filename)]
    debugger.reset()
    for candidate in chain:
        candidate.f_trace = debugger.trace_dispatch
    debugger.botframe = users[0] if users else chain[-1]
    debugger.set_step()
    sys.settrace(debugger.trace_dispatch)


def post_mortem(exc: BaseException) -> None:
    """pdb on ``exc``'s traceback, standing in the frame that raised it (``up`` climbs to the user's outermost
    frame; the launcher's frames above it are left out). Returns when the person quits (``q``) or continues."""
    tb, _ = skip_launcher_frames(exc.__traceback__)
    if tb is None:
        return
    channel = rank_channel()
    if channel is not None and getattr(channel, "no_one_types", None) is not None:  # the traceback is shown anyway
        while tb.tb_next is not None:
            tb = tb.tb_next
        _say_skipped(channel, RankPrompt(rank=channel.rank, prompt="", kind=PromptKind.POST_MORTEM,
                                         filename=tb.tb_frame.f_code.co_filename, lineno=tb.tb_lineno),
                     channel.no_one_types)
        return
    debugger = python_pdb()()
    setattr(debugger, POST_MORTEM_MARK, True)
    debugger.reset()
    debugger.message(f"post-mortem of {type(exc).__name__}: {exc}  (q ends it)")
    debugger.interaction(None, tb)


# --------------------------------------------------------------------------------------------- the prompt

def _debugger_asking() -> Optional[bdb.Bdb]:
    """The pdb (any ``bdb.Bdb``) whose command loop called ``input()``, if one did: it is a few frames up (its
    ``cmdloop``, or ``interact``'s console inside its ``do_interact``)."""
    frame: Optional[FrameType] = sys._getframe(2)
    while frame is not None:
        candidate = frame.f_locals.get("self") if "self" in frame.f_code.co_varnames else None
        if isinstance(candidate, bdb.Bdb):
            # pdb takes SIGINT over on ``c`` (Ctrl-C breaks into it again); a rank's SIGINT is the launcher's
            # interrupt (a session's Stop), which must stop the task, not open a prompt no one asked for.
            candidate.nosigint = True  # type: ignore[attr-defined]
            return candidate
        frame = frame.f_back
    return None


def _prompt_event(rank: int, prompt: str, debugger: Optional[bdb.Bdb]) -> RankPrompt:
    if debugger is None:
        return RankPrompt(rank=rank, prompt=prompt, kind=PromptKind.INPUT)
    frame = getattr(debugger, "curframe", None)
    if frame is not None and frame.f_code.co_name == "breakpoint" and frame.f_back is not None and \
            "distributed" in frame.f_code.co_filename:
        frame = frame.f_back  # torch.distributed.breakpoint's own frame: the user's call is the place
    kind = PromptKind.POST_MORTEM if getattr(debugger, POST_MORTEM_MARK, False) else PromptKind.BREAKPOINT
    return RankPrompt(rank=rank, prompt=prompt, kind=kind,
                      filename=frame.f_code.co_filename if frame is not None else None,
                      lineno=frame.f_lineno if frame is not None else None)


def _say_skipped(channel: Any, event: RankPrompt, why: str, by_breakpoint: bool = True) -> None:
    """One line on the rank's stderr, once per place: what was skipped, where, and why. ``by_breakpoint``: the pdb
    was opened by ``breakpoint()`` (which ``PYTHONBREAKPOINT=0`` turns off), not by ``pdb.set_trace()`` or torch's
    ``dist.breakpoint``."""
    said: Set[tuple] = channel.__dict__.setdefault("_skipped_said", set())
    key = (event.kind, event.filename, event.lineno)
    if key in said:
        return
    said.add(key)
    what = {PromptKind.BREAKPOINT: "breakpoint" if by_breakpoint else "pdb",
            PromptKind.POST_MORTEM: "post-mortem"}.get(event.kind, "input()")
    where = f" at {event.where}" if event.where else ""
    hint = "; PYTHONBREAKPOINT=0 turns breakpoint() off" if what == "breakpoint" else ""
    print(f"notebook_accel: rank {channel.rank}'s {what}{where} was skipped: {why}{hint}", file=sys.stderr,
          flush=True)
