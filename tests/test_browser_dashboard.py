"""The dashboard in a real browser: JupyterLab on localhost, headless Chromium driven by Playwright.

The test starts JupyterLab (free port, random token, everything in a temp dir), opens a notebook, runs the
launch cell, and checks the page: one progress row per rank reaching 100 %, a metric plot with one line per
rank, the finished status. A screenshot is saved to ``tests/artifacts/dashboard.png``.

The README's and the docs' picture of the dashboard, ``docs/images/dashboard.png``, is this test's picture of the
launch cell, so it stays true: ``docs/images/dashboard.json`` records what it shows (our elements in the cell, in
order: header items, rank rows, bars, plots). When the dashboard shows something else, the test writes both anew
and fails, saying to look at the new picture and commit it; timings and memory figures that differ from run to run
do not count. ``NOTEBOOK_ACCEL_UPDATE_PICTURES=1`` rewrites them anyway (fresh figures), without failing.
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

import nbformat
import pytest

from scripts import PACKAGE_ROOT, REPO
ARTIFACTS = os.path.join(REPO, "tests", "artifacts")
PICTURE = os.path.join(REPO, "docs", "images", "dashboard.png")
PICTURE_SHOWS = os.path.join(REPO, "docs", "images", "dashboard.json")
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--no-first-run"]

SETUP = f"""import sys, time
sys.path.insert(0, {PACKAGE_ROOT!r})
from notebook_accel import notebook_launcher, progress, report, launch_panel"""

LAUNCH = """def train(steps):
    import os
    rank = int(os.environ["RANK"])
    print(f"rank {rank} starts")
    for epoch in progress(range(2), desc="epoch"):
        for step in progress(range(steps), desc="step", leave=False):
            time.sleep(0.01)
            report(step=epoch * steps + step, loss=1.0 / (1 + epoch * steps + step) + 0.05 * rank)
    return rank

notebook_launcher(train, args=(100,), num_processes=2)"""

PANEL = """panel = launch_panel(train, args=(40,), num_processes=2)
panel"""


@contextlib.contextmanager
def chromium_page(height: int):
    """A 1280-wide page in headless Chromium, closed after. Playwright's driver and Chromium's profile go to
    a temp dir of their own, removed after; short, as Chromium's singleton socket path must fit in a
    sockaddr_un."""
    from playwright import sync_api  # the tests call pytest.importorskip for it first

    old_tmp = os.environ.get("TMPDIR")
    short_tmp = tempfile.mkdtemp(prefix="na-")
    os.environ["TMPDIR"] = short_tmp
    try:
        with sync_api.sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
            try:
                yield browser.new_page(viewport={"width": 1280, "height": height})
            finally:
                browser.close()
    finally:
        if old_tmp is None:
            os.environ.pop("TMPDIR", None)
        else:
            os.environ["TMPDIR"] = old_tmp
        shutil.rmtree(short_tmp, ignore_errors=True)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def jupyter_lab(tmp_path):
    """A JupyterLab server on a free localhost port; yields (base_url, token, root_dir); killed after."""
    yield from _jupyter_server(tmp_path)


def _jupyter_server(tmp_path, app="jupyterlab", theme=None):
    """A Jupyter server (``app``: "jupyterlab" or "notebook" for Notebook 7) with ``theme`` ("JupyterLab
    Light" / "JupyterLab Dark"; None: the default); yields (base_url, token, root_dir); killed after."""
    root = tmp_path / "root"
    root.mkdir()
    config = tmp_path / "config"
    (config / "labconfig").mkdir(parents=True)
    # No "news" pop-up (it would try the network and cover part of the page).
    (config / "labconfig" / "page_config.json").write_text(json.dumps(
        {"disabledExtensions": {"@jupyterlab/apputils-extension:announcements": True}}))
    settings = tmp_path / "user-settings"
    if theme is not None:
        themes = settings / "@jupyterlab" / "apputils-extension"
        themes.mkdir(parents=True)
        (themes / "themes.jupyterlab-settings").write_text(json.dumps({"theme": theme}))
    env = dict(os.environ, JUPYTER_CONFIG_DIR=str(config), JUPYTER_RUNTIME_DIR=str(tmp_path / "runtime"),
               JUPYTERLAB_WORKSPACES_DIR=str(tmp_path / "workspaces"), IPYTHONDIR=str(tmp_path / "ipython"),
               JUPYTERLAB_SETTINGS_DIR=str(settings), TMPDIR=str(tmp_path), PYTHONPATH=PACKAGE_ROOT)
    port, token = _free_port(), secrets.token_hex(16)
    server = subprocess.Popen(
        [sys.executable, "-m", app, "--no-browser", f"--port={port}", "--ip=127.0.0.1",
         f"--IdentityProvider.token={token}", "--allow-root", f"--ServerApp.root_dir={root}", "--ServerApp.port_retries=0",
         *(["--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"] if app == "jupyterlab" else [])],
        env=env, stdout=subprocess.DEVNULL, stderr=open(tmp_path / "server.log", "w"), start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=2)
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("JupyterLab did not start:\n" + (tmp_path / "server.log").read_text())
                time.sleep(0.3)
        yield base, token, root
    finally:
        # SIGTERM lets the server shut its kernels down (and the kernels' ranks die with them); then the group.
        server.send_signal(signal.SIGINT)
        try:
            server.wait(timeout=3)
        except subprocess.TimeoutExpired:
            pass
        try:
            os.killpg(server.pid, signal.SIGTERM)
            server.wait(timeout=10)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            try:
                os.killpg(server.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            server.wait(timeout=10)


@pytest.mark.browser
@pytest.mark.skipif(not os.path.exists(CHROMIUM), reason=f"needs Chromium at {CHROMIUM} (.ci/run installs it)")
@pytest.mark.timeout(240)
def test_dashboard_in_jupyterlab(jupyter_lab, tmp_path):
    pytest.importorskip("playwright.sync_api")
    base, token, root = jupyter_lab
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(source)
                                         for source in (SETUP, LAUNCH, PANEL)])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, str(root / "dashboard.ipynb"))

    os.makedirs(ARTIFACTS, exist_ok=True)
    screenshot = os.path.join(ARTIFACTS, "dashboard.png")
    with chromium_page(height=1100) as page:
        page.goto(f"{base}/lab/tree/dashboard.ipynb?token={token}", wait_until="domcontentloaded")
        try:
            _run_all_cells(page)
            page.wait_for_selector(".notebook-accel-dashboard", timeout=60_000)
            page.wait_for_function(
                "() => [...document.querySelectorAll('.notebook-accel-header .na-status')]"
                ".some(e => e.textContent.trim() === 'finished')", timeout=120_000)
        except Exception:
            page.screenshot(path=os.path.join(ARTIFACTS, "dashboard-failure.png"))
            raise
        page.wait_for_timeout(500)  # let the last widget messages render
        dashboard = page.locator(".notebook-accel-dashboard").first
        dashboard.scroll_into_view_if_needed()
        page.screenshot(path=screenshot, full_page=False)
        facts = page.evaluate(_FACTS_JS)
        stale_picture = _keep_the_picture_true(page.locator(".jp-Cell", has=dashboard).first)
        panel_facts = _press_launch_in_the_panel(page)

    assert facts["ranks"] == 2, facts
    # one visible progress row per rank (the inner leave=False bar is gone), each at 100 %
    assert facts["visible_bars_per_rank"] == [1, 1], facts
    assert all(width == "100%" for width in facts["bar_widths"]), facts
    assert all("2/2" in text for text in facts["bar_texts"]), facts
    # the bars end in one place, whatever their postfix (seen red with a long metric name on rank 1 only: the old
    # content-sized text put the two bars' ends 246 px apart)
    assert len(set(facts["bar_right_edges"])) == 1, facts
    # a metric plot with axes, a legend and one line per rank
    assert facts["plots"] >= 1 and facts["plot_lines"] >= 2, facts
    assert "rank 0:" in facts["plot_text"] and "rank 1:" in facts["plot_text"] and "step" in facts["plot_text"]
    # rank output reached the cell as labelled stream output
    assert "[rank 0] rank 0 starts" in facts["stream"] and "[rank 1] rank 1 starts" in facts["stream"]
    assert os.path.getsize(screenshot) > 10_000
    # the panel: Launch pressed in the page, the launch ran in the background, its dashboard under the panel
    assert panel_facts["slider"] == "2" and panel_facts["ranks"] == 2, panel_facts
    assert all(width == "100%" for width in panel_facts["bar_widths"]) and len(panel_facts["bar_widths"]) == 2
    assert panel_facts["launch_enabled"] and not panel_facts["stop_enabled"], panel_facts
    assert stale_picture is None, stale_picture


# Our own elements in the launch cell, in page order, each as its sorted class names: what the picture shows,
# without the figures (elapsed, memory, rates) that differ from run to run.
_SHOWS_JS = """(cell) => [...cell.querySelectorAll('[class]')]
  .filter(e => e.getClientRects().length > 0)
  .map(e => [...e.classList].filter(c => c.startsWith('notebook-accel') || c.startsWith('na-')).sort().join(' '))
  .filter(classes => classes)"""


def _keep_the_picture_true(cell) -> "str | None":
    """Compare what the launch cell shows with what the committed picture shows; when they differ (or
    ``NOTEBOOK_ACCEL_UPDATE_PICTURES=1``), write the cell's picture and its description anew. Returns what to
    say when the committed picture was out of date, else None."""
    shows = cell.evaluate(_SHOWS_JS)
    assert shows, "no notebook_accel element in the launch cell"
    committed = None
    if os.path.exists(PICTURE) and os.path.exists(PICTURE_SHOWS):
        with open(PICTURE_SHOWS) as handle:
            committed = json.load(handle)["shows"]
    update = os.environ.get("NOTEBOOK_ACCEL_UPDATE_PICTURES") == "1"
    if committed == shows and not update:
        return None
    os.makedirs(os.path.dirname(PICTURE), exist_ok=True)
    cell.screenshot(path=PICTURE)
    with open(PICTURE_SHOWS, "w") as handle:
        json.dump({"about": "what docs/images/dashboard.png shows, written by tests/test_browser_dashboard.py",
                   "shows": shows}, handle, indent=1)
        handle.write("\n")
    if update:
        return None
    return (f"the dashboard now shows something else than {os.path.relpath(PICTURE, REPO)}: the test wrote the new "
            f"picture and {os.path.relpath(PICTURE_SHOWS, REPO)}; look at the picture and commit both")


def _press_launch_in_the_panel(page) -> dict:
    panel = page.locator(".notebook-accel-panel").first
    panel.wait_for(timeout=60_000)
    panel.scroll_into_view_if_needed()
    panel.get_by_role("button", name="Launch").click()
    page.wait_for_function(
        "() => [...document.querySelectorAll('.notebook-accel-panel .notebook-accel-header .na-status')]"
        ".some(e => e.textContent.trim() === 'finished')", timeout=120_000)
    page.wait_for_timeout(500)
    panel.scroll_into_view_if_needed()
    page.screenshot(path=os.path.join(ARTIFACTS, "panel.png"), full_page=False)
    return page.evaluate("""() => {
      const panel = document.querySelector('.notebook-accel-panel');
      const buttons = [...panel.querySelectorAll('button')];
      const button = name => buttons.find(b => b.textContent.trim() === name);
      return {
        slider: (panel.querySelector('.widget-readout') || {}).textContent,
        ranks: panel.querySelectorAll('.notebook-accel-rank').length,
        bar_widths: [...panel.querySelectorAll('.notebook-accel-rank .progress-bar')]
                      .filter(b => b.offsetParent !== null).map(b => b.style.width),
        launch_enabled: !button('Launch').disabled,
        stop_enabled: !button('Stop').disabled,
      };
    }""")


def _run_all_cells(page) -> None:
    """Wait for the notebook and an idle kernel, then Run > Run All Cells (retried once if it was early)."""
    page.wait_for_selector(".jp-Notebook .jp-Cell .cm-content", timeout=60_000)
    page.wait_for_function(  # the status bar reads "Python 3 (ipykernel) | Idle"
        "() => [...document.querySelectorAll('.jp-StatusBar-TextItem')].some(e => /\\| Idle/.test(e.textContent))",
        timeout=60_000)
    first_prompt = page.locator(".jp-Notebook .jp-Cell .jp-InputPrompt").first
    for attempt in range(3):
        page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(r"^Run$")).first.click()
        page.locator(".lm-Menu-itemLabel", has_text=re.compile(r"^Run All Cells$")).first.click()
        try:
            page.wait_for_function(
                "(el) => /\\[(\\d+|\\*)\\]/.test(el.textContent)", arg=first_prompt.element_handle(),
                timeout=15_000)
            return
        except Exception:
            if attempt == 2:
                raise


_FACTS_JS = """() => {
  const dash = document.querySelector('.notebook-accel-dashboard');
  const ranks = [...dash.querySelectorAll('.notebook-accel-rank')];
  const visible = el => el.offsetParent !== null;
  const rows = ranks.map(r => [...r.querySelectorAll('.widget-hprogress, .widget-progress')]
                                 .filter(visible).filter(p => !p.parentElement.closest('.widget-hprogress')));
  const bars = rows.flat();
  const plots = [...dash.querySelectorAll('.notebook-accel-plot svg')];
  const cell = dash.closest('.jp-Cell');
  return {
    ranks: ranks.length,
    visible_bars_per_rank: rows.map(r => r.length),
    bar_widths: bars.map(b => (b.querySelector('.progress-bar') || {style: {}}).style.width),
    bar_right_edges: bars.map(b => Math.round((b.querySelector('.progress') || b).getBoundingClientRect().right)),
    bar_texts: ranks.map(r => r.innerText),
    plots: plots.length,
    plot_lines: plots.length ? plots[0].querySelectorAll('polyline, circle').length : 0,
    plot_text: plots.map(p => p.textContent).join(' '),
    stream: [...cell.querySelectorAll('.jp-RenderedText')].map(e => e.innerText).join('\\n'),
  };
}"""


# ------------------------------------------------------------------------ the debugging dashboard, themes

DEBUG = """def debug_train(steps):
    import os, torch
    rank = int(os.environ["RANK"])
    block = torch.ones((1 + 2 * rank) * 100 * 2 ** 20 // 4)   # rank 0 holds 100 MiB, rank 1 300 MiB
    step = 0
    for epoch in range(3):
        for i in progress(range(steps), desc=f"epoch {epoch}"):
            time.sleep(0.03)
            report(step=step, loss=1e3 * 10 ** (-6 * step / (3 * steps - 1)) * (1 + rank))
            step += 1
    return rank

notebook_launcher(debug_train, args=(50,), num_processes=2)"""

FAILS = """def user_step():
    raise ValueError("bad batch in the user's code")

notebook_launcher(user_step, num_processes=2)"""

_DEBUG_FACTS_JS = """() => {
  const dash = [...document.querySelectorAll('.notebook-accel-dashboard')][0];
  // "rgb(r, g, b)", "rgba(r, g, b, a)", or "color(srgb r g b)" (what color-mix computes to, 0..1)
  const parse = c => { let m = c.match(/[\\d.]+/g).map(Number);
                       if (c.startsWith('color(')) m = m.map((v, i) => i < 3 ? v * 255 : v);
                       return m.length >= 4 && m[3] === 0 ? null : m; };
  const lum = rgb => { const f = v => { v /= 255; return v <= 0.03928 ? v / 12.92 : Math.pow((v + 0.055) / 1.055, 2.4); };
                       return 0.2126 * f(rgb[0]) + 0.7152 * f(rgb[1]) + 0.0722 * f(rgb[2]); };
  const background = el => { for (let e = el; e; e = e.parentElement) {
      const c = parse(getComputedStyle(e).backgroundColor); if (c) return c; } return [255, 255, 255]; };
  const contrast = (el, prop) => { const fg = parse(getComputedStyle(el)[prop]);
      const a = lum(fg), b = lum(background(el)); return (Math.max(a, b) + 0.05) / (Math.min(a, b) + 0.05); };
  const labels = [...dash.querySelectorAll('.notebook-accel-rank-label')];
  const ticks = [...dash.querySelectorAll('.notebook-accel-plot svg text')];
  const plotBackground = parse(getComputedStyle(dash.querySelector('.notebook-accel-plot svg rect')).fill);
  return {
    theme_background: getComputedStyle(document.body).getPropertyValue('--jp-layout-color0').trim(),
    labels: labels.map(l => l.innerText),
    // how many elements each contrast figure below is the minimum over (Math.min() of none is Infinity)
    label_parts: labels.map(l => l.querySelectorAll('b, span').length),
    tick_count: ticks.length,
    finished: [...dash.querySelectorAll('.notebook-accel-finished')].map(e => e.innerText),
    y_labels: [...dash.querySelectorAll('.notebook-accel-y-label')].map(e => e.textContent),
    header: dash.querySelector('.notebook-accel-header').innerText,
    // WCAG contrast ratios of the text people read, against what is behind it
    label_contrast: Math.min(...labels.map(l => Math.min(...[...l.querySelectorAll('b, span')].map(e => contrast(e, 'color'))))),
    tick_contrast: Math.min(...ticks.map(t => { const a = lum(parse(getComputedStyle(t).fill)), b = lum(plotBackground);
                                            return (Math.max(a, b) + 0.05) / (Math.min(a, b) + 0.05); })),
    plot_background: plotBackground,
    error_text: [...document.querySelectorAll('.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"]')]
                  .map(e => e.innerText).join('\\n'),
  };
}"""


def _open_and_run(page, url, app):
    page.goto(url, wait_until="domcontentloaded")
    if app == "jupyterlab":
        _run_all_cells(page)
        return
    # Notebook 7: no kernel status bar; run all until the first cell gets an execution count
    page.wait_for_selector(".jp-Notebook .jp-Cell .cm-content", timeout=60_000)
    first_prompt = page.locator(".jp-Notebook .jp-Cell .jp-InputPrompt").first
    for attempt in range(6):
        page.wait_for_timeout(2000)
        page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(r"^Run$")).first.click()
        page.locator(".lm-Menu-itemLabel", has_text=re.compile(r"^Run All Cells$")).first.click()
        try:
            page.wait_for_function("(el) => /\\[(\\d+|\\*)\\]/.test(el.textContent)",
                                   arg=first_prompt.element_handle(), timeout=10_000)
            return
        except Exception:
            if attempt == 5:
                raise


@pytest.mark.browser
@pytest.mark.skipif(not os.path.exists(CHROMIUM), reason=f"needs Chromium at {CHROMIUM} (.ci/run installs it)")
@pytest.mark.timeout(300)
@pytest.mark.parametrize("app, theme", [("jupyterlab", "JupyterLab Light"), ("jupyterlab", "JupyterLab Dark"),
                                        ("notebook", "JupyterLab Dark")])
def test_debugging_dashboard_is_readable_in_light_and_dark_themes(tmp_path, app, theme):
    """Resources, finished loops, a log-axis plot and a traceback, in JupyterLab light/dark and Notebook 7."""
    pytest.importorskip("playwright.sync_api")
    if app == "notebook":
        pytest.importorskip("notebook")
    server = _jupyter_server(tmp_path, app=app, theme=theme)
    base, token, root = next(server)
    name = f"debug-{app}-{theme.split()[-1].lower()}"
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(source) for source in (SETUP, DEBUG, FAILS)])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, str(root / "debug.ipynb"))
    os.makedirs(ARTIFACTS, exist_ok=True)
    with chromium_page(height=1300) as page:
        path = "lab/tree" if app == "jupyterlab" else "notebooks"
        try:
            _open_and_run(page, f"{base}/{path}/debug.ipynb?token={token}", app)
            page.wait_for_selector(".notebook-accel-dashboard", timeout=60_000)
            page.wait_for_function(  # the second launch (the failure) has ended
                "() => [...document.querySelectorAll('.notebook-accel-header .na-status')]"
                ".map(e => e.textContent.trim()).join(',') === 'finished,failed'", timeout=150_000)
        except Exception:
            page.screenshot(path=os.path.join(ARTIFACTS, f"{name}-failure.png"))
            raise
        page.wait_for_timeout(800)
        page.locator(".notebook-accel-dashboard").first.scroll_into_view_if_needed()
        page.screenshot(path=os.path.join(ARTIFACTS, f"{name}.png"), full_page=False)
        facts = page.evaluate(_DEBUG_FACTS_JS)
        page.locator(".notebook-accel-dashboard").nth(1).scroll_into_view_if_needed()
        page.screenshot(path=os.path.join(ARTIFACTS, f"{name}-failure-view.png"), full_page=False)
        for _ in server:  # stops the server
            pass

    dark = "Dark" in theme
    assert facts["theme_background"] and (facts["theme_background"].lower() in ("#111", "#111111")) == dark, facts
    assert max(facts["plot_background"][:3]) < 80 if dark else min(facts["plot_background"][:3]) > 200, facts
    # one label per rank, each with text to measure, and ticks on the plot: else the minimums below are of
    # nothing (Infinity) and "every label" is vacuously true
    assert len(facts["labels"]) == 2 and all(parts > 0 for parts in facts["label_parts"]), facts
    assert facts["tick_count"] > 0, facts
    assert 3.0 <= facts["label_contrast"] < 21.01 and 4.5 <= facts["tick_contrast"] < 21.01, facts  # 21: the most
    assert all("peak RSS" in label for label in facts["labels"]), facts["labels"]
    assert "peak RSS" in facts["header"]
    assert any("epoch 0: 50/50" in text and "epoch 1: 50/50" in text for text in facts["finished"]), facts
    assert facts["y_labels"] == ["loss (log)"], facts
    remote = facts["error_text"]
    assert "in user_step" in remote and "notebook_accel/" not in remote.split("The above exception")[0], remote


SESSION_CELLS = [
    "from notebook_accel import Session, progress\nimport time\nsession = Session(num_processes=2)",
    """def train(steps):
    global done
    for step in progress(range(steps), desc="train"):
        time.sleep(0.01)
    done = steps
    return steps

session.run(train, args=(50,))""",
    "session.run(train, args=(20,))",
]


@pytest.mark.browser
@pytest.mark.skipif(not os.path.exists(CHROMIUM), reason=f"needs Chromium at {CHROMIUM} (.ci/run installs it)")
@pytest.mark.timeout(240)
def test_session_row_and_runs_in_jupyterlab(jupyter_lab, tmp_path):
    """A warm Session's own row (ranks, status, runs, memory per rank) in the cell that made it, and each run's
    dashboard under its own cell."""
    pytest.importorskip("playwright.sync_api")
    base, token, root = jupyter_lab
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(source) for source in SESSION_CELLS])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, str(root / "session.ipynb"))
    os.makedirs(ARTIFACTS, exist_ok=True)
    with chromium_page(height=900) as page:
        page.goto(f"{base}/lab/tree/session.ipynb?token={token}", wait_until="domcontentloaded")
        try:
            _run_all_cells(page)
            page.wait_for_function(  # both runs finished, and the row counts them
                "() => document.querySelectorAll('.notebook-accel-header .na-status').length === 2 && "
                "[...document.querySelectorAll('.notebook-accel-header .na-status')]"
                ".every(e => e.textContent.trim() === 'finished') && "
                "(document.querySelector('.na-session-runs') || {}).textContent === '2'", timeout=120_000)
        except Exception:
            page.screenshot(path=os.path.join(ARTIFACTS, "session-failure.png"))
            raise
        page.wait_for_timeout(500)
        page.locator(".notebook-accel-session").first.scroll_into_view_if_needed()
        page.screenshot(path=os.path.join(ARTIFACTS, "session.png"), full_page=False)
        facts = page.evaluate("""() => {
          const text = cls => (document.querySelector('.' + cls) || {}).textContent;
          return {rows: document.querySelectorAll('.notebook-accel-session').length,
                  ranks: text('na-session-ranks'), status: text('na-session-status'),
                  memory: text('na-session-memory'), dashboards: document.querySelectorAll(
                    '.notebook-accel-dashboard').length,
                  bars: [...document.querySelectorAll('.notebook-accel-rank .progress-bar')]
                          .filter(b => b.offsetParent !== null).map(b => b.style.width)};
        }""")
    assert facts["rows"] == 1 and facts["ranks"] == "2" and facts["status"] == "idle", facts
    assert re.search(r"rank 0: [\d.]+ MiB · rank 1: [\d.]+ MiB", facts["memory"]), facts
    assert facts["dashboards"] == 2 and facts["bars"] == ["100%"] * 4, facts
