"""A TPU Session on a fake TPU host (there is no TPU here): the fake torch_xla (tests/fake_torch_xla) mirrors
torch_xla 2.9's ``xmp.spawn`` — worker processes × device threads, blocking collectives. What these tests check
is ours: the XLA host's device threads stay up across runs, each rank keeps its own namespace, a failure while a
peer blocks in a collective is raised and the session recovers. The same on XLA's real CPU client is in
test_xla_real.py (marked ``xla``)."""
from __future__ import annotations

import os
import textwrap

import pytest

from fake_tpu import become_tpu_host
from notebook_accel import Session

pytestmark = pytest.mark.timeout(180)

CELL = {"__name__": "__main__", "os": os}
exec(textwrap.dedent("""
    def load(scale):
        global weight
        import torch
        import torch_xla.core.xla_model as xm
        import torch_xla.runtime as xr
        weight = torch.full((2,), float(xr.global_ordinal()) * scale, device=xm.xla_device())
        return xr.global_ordinal()

    def summed():
        import torch_xla.core.xla_model as xm
        import torch_xla.runtime as xr
        total = xm.all_reduce(xm.REDUCE_SUM, weight.clone())
        return xr.global_ordinal(), total.cpu().tolist(), os.getpid()

    def rank_one_fails_while_zero_waits():
        import torch, time
        import torch_xla.core.xla_model as xm
        import torch_xla.runtime as xr
        if xr.global_ordinal() == 1:
            time.sleep(0.3)
            raise ValueError("core 1 gave up")
        xm.all_reduce(xm.REDUCE_SUM, torch.ones(1, device=xm.xla_device()))
"""), CELL)


@pytest.fixture
def tpu_host(monkeypatch, tmp_path):
    become_tpu_host(monkeypatch, str(tmp_path / "sysfs"), "v5e-2")


def test_device_threads_stay_up_and_keep_their_state(tpu_host, capsys):
    with Session(display="text") as session:
        assert session.num_processes == 2 and session.device == "xla"
        assert session.run(CELL["load"], args=(1.5,), return_all=True) == [0, 1]
        first = session.run(CELL["summed"], return_all=True)
        assert [(ordinal, total) for ordinal, total, _ in first] == [(0, [1.5, 1.5]), (1, [1.5, 1.5])]
        again = session.run(CELL["summed"], return_all=True)
        assert [pid for *_, pid in again] == [pid for *_, pid in first]  # the same workers took both runs
        session.execute("import torch_xla.runtime as xr\nxr.global_ordinal() * 10")
        out = capsys.readouterr().out
        assert "[rank 0] 0" in out and "[rank 1] 10" in out
        assert [float(value[0]) for value in session.pull("weight")] == [0.0, 1.5]  # each rank's own namespace
        CELL["weight"] = "the kernel's weight"  # the kernel has one too: each core's own wins
        try:
            assert [total for _, total, _ in session.run(CELL["summed"], return_all=True)] == [[1.5, 1.5]] * 2
        finally:
            del CELL["weight"]
        assert "`weight`" in capsys.readouterr().err  # said once
        assert [float(value[0]) for value in session.pull("weight")] == [0.0, 1.5]


def test_a_failed_core_is_raised_and_the_session_goes_on(tpu_host):
    with Session(display="none", recover_timeout=2) as session:
        session.run(CELL["load"], args=(2.0,))
        with pytest.raises(ValueError, match="core 1 gave up") as raised:
            session.run(CELL["rank_one_fails_while_zero_waits"])
        notes = " ".join(getattr(raised.value, "__notes__", []))
        # the waiting core is blocked in a collective no Python-level interrupt reaches: the session restarts
        assert "ranks restarted: state lost" in notes, notes
        assert session.run(CELL["load"], args=(1.0,), return_all=True) == [0, 1]
        assert [total for _, total, _ in session.run(CELL["summed"], return_all=True)] == [[1.0, 1.0]] * 2
