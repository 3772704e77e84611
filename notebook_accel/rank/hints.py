"""Hints a rank adds to the exception of a known pitfall, as a note (``add_note``, Python 3.11+).

The one pitfall every notebook user of a launcher meets once: the function assigns a name the notebook defines
(``model = accelerator.prepare(model, ...)``). The assignment makes the name local to the whole function, so
its first read fails with ``UnboundLocalError`` — though the notebook plainly has ``model``. Python's message
does not say why; the note does, and what to do.

>>> model = "the notebook's"
>>> def train():
...     model = model + " prepared"
>>> try:
...     train()
... except UnboundLocalError as error:
...     explain_pitfalls(error)
...     print(error.__notes__[0][:64])
(notebook_accel: `model` is assigned somewhere in `train`, which
"""
from __future__ import annotations

import re
from typing import Optional

# "cannot access local variable 'model' where it is not associated with a value" (3.11+);
# "local variable 'model' referenced before assignment" (before)
_LOCAL_NAME = re.compile(r"local variable '(\w+)'")


def explain_pitfalls(exc: BaseException) -> None:
    """Add a note to ``exc`` when it is a known pitfall (once; without ``add_note``, nothing)."""
    note = unbound_notebook_name(exc)
    if note is None or not hasattr(exc, "add_note") or note in getattr(exc, "__notes__", ()):
        return
    exc.add_note(note)


def unbound_notebook_name(exc: BaseException) -> Optional[str]:
    """The note for an ``UnboundLocalError`` whose name the function's globals (the notebook's, or a session
    rank's namespace) do have; None for any other error."""
    if not isinstance(exc, UnboundLocalError):
        return None
    found = _LOCAL_NAME.search(str(exc))
    tb = exc.__traceback__
    if found is None or tb is None:
        return None
    while tb.tb_next is not None:  # the frame that read the name
        tb = tb.tb_next
    name, frame = found.group(1), tb.tb_frame
    if name not in frame.f_globals:
        return None
    function = frame.f_code.co_name
    return (f"(notebook_accel: `{name}` is assigned somewhere in `{function}`, which makes it local to the whole "
            f"function: the global `{name}` (the notebook's) is never read there. Build it inside the function, or "
            f"pass it in: `def {function}({name}, ...)` with `args=({name}, ...)`; or give the result another name, "
            f"e.g. `prepared_{name} = ...`)")
