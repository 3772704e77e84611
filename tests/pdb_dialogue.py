"""One pdb dialogue for ranks on a cluster (tests/test_ray_cluster.py, tests/test_slurm_session.py): a kernel script
whose rank 1 stops at ``breakpoint()`` in a launch and in a Session run, then fails for ``Session.debug()`` and a
launch's ``pdb=True``; and what a user at the terminal types to it (``talk_to_rank_1``)."""
from __future__ import annotations

import textwrap


def kernel_script(prelude: str, launch: str, session: str) -> str:
    """The script: ``prelude`` first (e.g. ``ray.init``), ``launch`` and ``session`` the options of its launches and
    of its Session (Python keyword text)."""
    return textwrap.dedent(prelude) + textwrap.dedent(f'''
        import os
        from notebook_accel import Session, notebook_launcher

        def train():
            rank = int(os.environ["RANK"])
            x = 40 + rank
            if rank == 1:
                breakpoint()
            return x

        def fails():
            if os.environ["RANK"] == "1":
                marker = "failing frame of rank 1"
                raise ValueError("rank 1 breaks")

        print("RESULT", notebook_launcher(train, {launch}, display="text", return_all=True), flush=True)
        with Session({session}, display="text") as session:
            print("WARM", session.run(train, return_all=True), flush=True)
            try:
                session.run(fails)
            except ValueError as error:
                print("SESSION RAISED", error, flush=True)
            session.debug()  # pdb in the failed run's frame, in the rank that raised
            print("DEBUGGED", flush=True)
        try:
            notebook_launcher(fails, {launch}, display="text", pdb=True)
        except ValueError as error:
            print("RAISED", error, flush=True)
    ''')


def talk_to_rank_1(child) -> None:
    """At each prompt of ``kernel_script``'s rank 1 (a ``pexpect`` child): read ``x``, change it, go on (the results
    show the change); then in each failing frame read ``marker`` and quit. Ends when the script does, exit code 0."""
    import pexpect

    for done in ("RESULT", "WARM"):
        child.expect(r"\[rank 1\] \(Pdb\) ")
        child.sendline("p x")
        child.expect(r"\[rank 1\] 41")
        child.expect(r"\[rank 1\] \(Pdb\) ")
        child.sendline("x = 100")
        child.expect(r"\[rank 1\] \(Pdb\) ")
        child.sendline("c")
        child.expect(rf"{done} \[40, 100\]")
    child.expect("SESSION RAISED rank 1 breaks")
    for done in ("DEBUGGED", "RAISED rank 1 breaks"):  # Session.debug(), then pdb=True's post-mortem
        child.expect(r"\[rank 1\] \(Pdb\) ")
        child.sendline("p marker")
        child.expect(r"\[rank 1\] 'failing frame of rank 1'")
        child.expect(r"\[rank 1\] \(Pdb\) ")
        child.sendline("q")
        child.expect(done)
    child.expect(pexpect.EOF, timeout=120)
    child.close()
    assert child.exitstatus == 0, child.before
