"""``progress``, ``patch_tqdm`` and ``report`` inside a (simulated) rank: what they send, what they cost."""
from __future__ import annotations

import asyncio
import sys
import time

import pytest
import tqdm
import tqdm.asyncio
import tqdm.auto
import tqdm.std

from notebook_accel.rank import metrics
from notebook_accel.wire.channel import set_rank_channel
from notebook_accel.wire.events import MetricReport, ProgressUpdate
from notebook_accel.rank.progress import patch_tqdm, progress, trange
from scripts import run_script
from waiting import wait_until


class Recorder:
    """A rank's event sender that keeps the events."""

    def __init__(self, rank: int = 0) -> None:
        self.rank = rank
        self.events = []

    def send(self, event) -> None:
        self.events.append(event)

    def bars(self):
        return [e for e in self.events if isinstance(e, ProgressUpdate)]

    def metrics(self):
        return [e for e in self.events if isinstance(e, MetricReport)]


@pytest.fixture
def rank():
    """This process as rank 0 of a launch, tqdm patched; everything undone afterwards."""
    sender = Recorder()
    set_rank_channel(sender)
    undo = patch_tqdm()
    try:
        yield sender
    finally:
        undo()
        set_rank_channel(None)


def test_outside_a_launch_progress_is_tqdm_auto():
    bar = progress(range(3), disable=True)
    assert type(bar) is tqdm.auto.tqdm
    assert list(bar) == [0, 1, 2]
    assert isinstance(progress, type) and issubclass(progress, tqdm.std.tqdm)


def test_a_fast_loop_sends_few_updates_and_an_exact_final_state(rank):
    n = 1_000_000
    start = time.monotonic()
    for _ in progress(range(n), desc="fast"):
        pass
    seconds = time.monotonic() - start
    updates = rank.bars()
    # open + one per mininterval (0.1 s) + close
    assert 2 <= len(updates) <= seconds / 0.1 + 3, (len(updates), seconds)
    assert updates[0].n == 0 and not updates[0].closed
    final = updates[-1]
    assert final.closed and final.n == final.total == n and final.desc == "fast"
    assert final.format_dict["total"] == n and final.rate is None  # overall average rate, as tqdm's close
    assert len({u.bar_id for u in updates}) == 1


def test_tqdm_names_resolve_to_progress_inside_a_rank(rank):
    import tqdm.notebook

    assert tqdm.tqdm is progress and tqdm.auto.tqdm is progress and tqdm.notebook.tqdm is progress
    assert tqdm.trange is trange and tqdm.auto.trange is trange and tqdm.notebook.tnrange is trange
    for name, make in [("a", lambda: tqdm.tqdm(range(5), desc="a")), ("b", lambda: tqdm.auto.trange(5, desc="b")),
                       ("c", lambda: tqdm.notebook.trange(5, desc="c"))]:
        assert list(make()) == list(range(5))
        assert rank.bars()[-1].desc == name and rank.bars()[-1].closed and rank.bars()[-1].n == 5


def test_names_bound_before_the_patch_report_too():
    """``from tqdm.auto import tqdm`` run before the launch (in the kernel, inherited by a forked rank)."""
    early_std, early_asyncio = tqdm.std.tqdm, tqdm.asyncio.tqdm
    sender = Recorder()
    set_rank_channel(sender)
    undo = patch_tqdm()
    try:
        for cls in (early_std, early_asyncio):
            bar = cls(total=7, desc=cls.__name__)
            bar.update(7)
            bar.close()
    finally:
        undo()
        set_rank_channel(None)
    closed = [e for e in sender.bars() if e.closed]
    assert [(e.desc, e.n, e.total) for e in closed] == [("tqdm", 7, 7), ("tqdm_asyncio", 7, 7)]


def test_undo_restores_tqdm_exactly():
    before = {name: tqdm.std.tqdm.__dict__.get(name) for name in ("display", "close", "clear", "__init__")}
    modules = (tqdm.tqdm, tqdm.trange, tqdm.auto.tqdm, tqdm.auto.trange)
    had_notebook = "tqdm.notebook" in sys.modules
    set_rank_channel(Recorder())
    undo = patch_tqdm()
    undo()
    undo()  # idempotent
    set_rank_channel(None)
    assert {name: tqdm.std.tqdm.__dict__.get(name) for name in before} == before
    assert (tqdm.tqdm, tqdm.trange, tqdm.auto.tqdm, tqdm.auto.trange) == modules
    assert ("tqdm.notebook" in sys.modules) == had_notebook


def test_nested_bars_have_positions_and_leave(rank):
    for _ in progress(range(2), desc="epoch"):
        for _ in progress(range(3), desc="step", leave=False):
            pass
    closed = [e for e in rank.bars() if e.closed]
    steps = [e for e in closed if e.desc == "step"]
    epoch = [e for e in closed if e.desc == "epoch"]
    assert len(steps) == 2 and all(e.position == 1 and e.leave is False and e.n == 3 for e in steps)
    assert len(epoch) == 1 and epoch[0].position == 0 and epoch[0].leave is True and epoch[0].n == 2
    assert steps[0].bar_id != steps[1].bar_id


def test_disabled_bars_send_nothing_and_disable_none_means_on(rank):
    list(progress(range(10), disable=True))
    assert rank.bars() == []
    list(progress(range(10), disable=None))  # "off when not a TTY": a rank's stderr is a pipe, still shown
    assert rank.bars()[-1].closed and rank.bars()[-1].n == 10


def test_set_postfix_every_step_does_not_flood(rank):
    bar = progress(total=20_000)
    for i in range(20_000):
        bar.set_postfix(loss=1.0 / (i + 1))
        bar.update()
    bar.close()
    assert len(rank.bars()) < 30
    assert rank.bars()[-1].postfix.startswith("loss=") and rank.bars()[-1].n == 20_000


def test_async_iteration_works(rank):
    async def consume():
        return [x async for x in progress(range(4), desc="async")]

    assert asyncio.run(consume()) == [0, 1, 2, 3]
    assert rank.bars()[-1].closed and rank.bars()[-1].n == 4


def test_nothing_is_written_to_the_rank_stderr(rank, capsys):
    for _ in tqdm.tqdm(range(1000)):
        pass
    bar = progress(total=3)
    bar.write("via tqdm.write")  # tqdm.write still prints the message itself
    bar.update(3)
    bar.close()
    captured = capsys.readouterr()
    assert captured.err == "" and captured.out == "via tqdm.write\n"


def test_report_sends_scalars_and_merges_bursts(rank):
    class Scalar:  # stands for a one-element tensor / numpy scalar
        def __float__(self):
            return 0.25

    metrics.report(step=1, loss=Scalar(), acc=1)
    for step in range(2, 1000):
        metrics.report(step=step, loss=1.0 / step)
    metrics.report(step=1000, val_loss=0.5)
    metrics.flush()
    sent = rank.metrics()
    assert sent[0].step == 1 and sent[0].metrics == {"loss": 0.25, "acc": 1.0}
    assert len(sent) < 200  # at most ~50 a second
    last = sent[-1]
    assert last.step == 1000 and last.metrics["val_loss"] == 0.5 and last.metrics["loss"] == 1.0 / 999
    assert last.seq == 1000
    with pytest.raises(TypeError, match="needs a number"):
        metrics.report(loss="high")


def test_report_is_delivered_by_the_timer_and_by_a_closing_bar(rank):
    metrics.report(a=1.0)
    metrics.report(a=2.0)  # held back
    wait_until(lambda: rank.metrics() and rank.metrics()[-1].metrics == {"a": 2.0}, timeout=30,
               what="the timer to send the held-back report")
    bar = progress(total=1)
    metrics.report(a=3.0)
    metrics.report(a=4.0)
    bar.update()
    bar.close()
    assert rank.metrics()[-1].metrics == {"a": 4.0}


def test_report_outside_a_launch_sets_the_innermost_postfix():
    with tqdm.std.tqdm(total=2, file=sys.stdout, mininterval=100) as outer:
        with tqdm.std.tqdm(total=2, file=sys.stdout, mininterval=100) as inner:
            metrics.report(loss=0.5)
            assert inner.postfix == "loss=0.5" and outer.postfix is None


def test_patch_in_a_fresh_process_never_imports_ipywidgets():
    """A rank that never imported tqdm.notebook gets a shim: ``from tqdm.notebook import tqdm`` works."""
    result = run_script("""
        import sys
        from notebook_accel.wire.channel import set_rank_channel
        from notebook_accel.rank.progress import patch_tqdm, progress
        class Sender:
            rank = 3
            events = []
            def send(self, event): self.events.append(event)
        sender = Sender()
        set_rank_channel(sender)
        patch_tqdm()
        from tqdm.notebook import tqdm, trange
        from tqdm.auto import tqdm as auto_tqdm
        import tqdm as package
        assert tqdm is progress and auto_tqdm is progress and package.notebook.tqdm is progress
        list(trange(4, desc="shimmed"))
        assert "ipywidgets" not in sys.modules, "patch imported ipywidgets"
        print(sender.events[-1].rank, sender.events[-1].desc, sender.events[-1].n)
    """)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["3", "shimmed", "4"]


def test_notebook_bars_made_before_the_patch_make_no_widgets():
    """A forked rank that inherited ``tqdm.notebook`` (and classes bound to it) reports instead of drawing."""
    result = run_script("""
        import sys
        import tqdm.notebook
        early = tqdm.notebook.tqdm_notebook
        from notebook_accel.wire.channel import set_rank_channel
        from notebook_accel.rank.progress import patch_tqdm
        class Sender:
            rank = 0
            events = []
            def send(self, event): self.events.append(event)
        sender = Sender()
        set_rank_channel(sender)
        undo = patch_tqdm()
        class LibraryBar(early):  # e.g. huggingface_hub's subclass of tqdm.auto
            def __init__(self, *args, name=None, **kwargs):
                super().__init__(*args, **kwargs)
        for cls in (early, LibraryBar):
            bar = cls(range(6), desc=cls.__name__)
            list(bar)
            assert not hasattr(bar, "container"), "a widget was built in the rank"
        print(*[(e.desc, e.n) for e in sender.events if e.closed])
        undo()
        assert tqdm.notebook.tqdm is early and "display" in early.__dict__
    """)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["('tqdm_notebook',", "6)", "('LibraryBar',", "6)"]


def test_mininterval_zero_still_sends_at_most_50_a_second(rank):
    start = time.monotonic()
    for _ in progress(range(200_000), mininterval=0):
        pass
    seconds = time.monotonic() - start
    assert len(rank.bars()) <= seconds * 50 + 3
    assert rank.bars()[-1].n == 200_000


def test_patch_in_a_forked_kernel_child_never_imports_ipywidgets():
    """A rank forked from a kernel (ipykernel loaded) that had not imported tqdm.auto: importing it after the
    patch must not choose tqdm.notebook (which imports ipywidgets and would draw widgets from the rank)."""
    result = run_script("""
        import sys
        import ipykernel.zmqshell  # what tqdm.autonotebook looks for to pick the notebook frontend
        assert "ipywidgets" not in sys.modules
        from notebook_accel.wire.channel import set_rank_channel
        from notebook_accel.rank.progress import patch_tqdm, progress
        class Sender:
            rank = 1
            events = []
            def send(self, event): self.events.append(event)
        set_rank_channel(Sender())
        patch_tqdm()
        from tqdm.auto import tqdm
        list(tqdm(range(3)))
        assert tqdm is progress
        print("ipywidgets" in sys.modules)
    """)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["False"]
