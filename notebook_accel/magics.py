"""``%%ranks``: run a cell on every rank of a warm ``Session``, in each rank's namespace.

    %load_ext notebook_accel
    session = Session(num_processes=2)

    %%ranks
    print(model.weight.grad.norm())       # each rank prints its own, labelled [rank N]

``%%ranks`` uses the most recently opened session that is still open; ``%%ranks NAME`` the session the notebook
calls ``NAME``. A rank's exception is raised in the cell, as ``Session.run`` raises it.
"""
from __future__ import annotations

from typing import Any


def ranks(line: str, cell: str) -> None:
    """Run this cell on every rank of a Session (``%%ranks [SESSION_VARIABLE]``)."""
    __tracebackhide__ = True  # noqa: F841
    from IPython import get_ipython
    from IPython.core.error import UsageError

    from .session import Session, last_session

    name = line.strip()
    if name:
        shell = get_ipython()
        session: Any = shell.user_ns.get(name) if shell is not None else None
        if not isinstance(session, Session):
            found = "is not defined" if session is None else f"is a {type(session).__name__}, not a Session"
            raise UsageError(f"%%ranks {name}: {name!r} {found}")
    else:
        session = last_session()
        if session is None:
            raise UsageError("%%ranks needs an open Session: run `session = Session(num_processes=2)` first "
                             "(or name one: %%ranks my_session)")
    session.execute(cell)


def load_ipython_extension(ipython: Any) -> None:
    """``%load_ext notebook_accel``: registers the ``%%ranks`` cell magic."""
    ipython.register_magic_function(ranks, magic_kind="cell", magic_name="ranks")
