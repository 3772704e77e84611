"""``launch_panel``: pick device, number of processes and precision, press Launch, watch, Stop.

The launch runs in the background (``launcher.start_launch``), so the kernel stays usable while it runs;
its dashboard appears under the controls. Everything the buttons do is also a method, for scripts and
tests::

    panel = launch_panel(train, args=(3e-4,))
    panel                      # shows the widget (last expression of a cell)
    panel.num_processes = 2
    panel.launch()
    state = panel.wait()       # or panel.stop(); panel.result / panel.error afterwards
"""
from __future__ import annotations

import threading
from html import escape
from typing import Any, Callable, Dict, List, Mapping, Optional, Union

import ipywidgets as widgets

from .errors import LaunchConfigError, one_line
from .plan.devices import available_devices
from .plan.entry_points import entry_point
from .plan.options import OPTIONS, PathLike, check_option, check_precision_for_device, precisions_for
from .views.widgets import WidgetView
from .wire.choices import (ClusterName, DeviceName, MixedPrecision, MixedPrecisionName, PlacementName,
                           RendezvousBackendName, StartMethodName)
from .wire.events import LaunchFinished, Status

__all__ = ["launch_panel", "LaunchPanel"]


class LaunchPanel(widgets.VBox):
    """Device picker + Launch/Stop buttons + the launch's dashboard. Made by ``launch_panel``, which checks the
    ``options`` (launch settings, but ``display``: the panel shows its own dashboard)."""

    def __init__(self, function: Callable[..., Any], args: tuple = (), kwargs: Optional[Dict[str, Any]] = None,
                 options: Optional[Mapping[str, Any]] = None) -> None:
        self.function = function
        self.args = args
        self.kwargs = kwargs
        self._options = {name: value for name, value in (options or {}).items() if name != "display"}
        self._launch = None
        self._view: Optional[WidgetView] = None
        self._lock = threading.RLock()
        self._display_handles: List[Any] = []

        self.devices = available_devices()
        by_kind = {info.kind: info for info in self.devices}
        wanted_device = self._options.pop("device", None)
        device = wanted_device if wanted_device in by_kind else self.devices[0].kind
        wanted_processes = self._options.pop("num_processes", None)
        wanted_precision = self._options.pop("mixed_precision", MixedPrecision.NO.value)
        check_option(OPTIONS["mixed_precision"], wanted_precision)
        check_precision_for_device(wanted_precision, device)  # what the launcher would refuse, refused now

        self.devices_html = widgets.HTML(value=self._devices_html())
        self.device_picker = widgets.Dropdown(
            options=[(f"{info.kind} ({info.description})", info.kind) for info in self.devices], value=device,
            description="device", disabled=len(self.devices) == 1, style={"description_width": "110px"})
        self.processes_picker = widgets.IntSlider(
            value=1, min=1, max=max(1, by_kind[device].count), step=1, description="processes",
            style={"description_width": "110px"}, continuous_update=False)
        self.precision_picker = widgets.Dropdown(options=precisions_for(device), value=wanted_precision,
                                                 description="mixed precision",
                                                 style={"description_width": "110px"})
        self.launch_button = widgets.Button(description="Launch", button_style="primary", icon="play",
                                            tooltip="start the ranks in the background")
        self.stop_button = widgets.Button(description="Stop", button_style="danger", icon="stop",
                                          disabled=True, tooltip="stop every rank")
        self.status_html = widgets.HTML(value="")
        self.dashboard = widgets.VBox([])

        self._set_processes_range(device, wanted_processes)
        self.device_picker.observe(self._on_device_change, names="value")
        self.launch_button.on_click(self._on_launch_click)
        self.stop_button.on_click(lambda _button: self.stop())

        controls = widgets.VBox([
            self.devices_html,
            widgets.HBox([self.device_picker, self.precision_picker]),
            widgets.HBox([self.processes_picker, self.launch_button, self.stop_button, self.status_html],
                         layout=widgets.Layout(align_items="center")),
        ])
        super().__init__([controls, self.dashboard], layout=widgets.Layout(padding="4px"))
        self.add_class("notebook-accel-panel")

    # ------------------------------------------------------------------------------------ settings
    @property
    def device(self) -> str:
        return self.device_picker.value

    @device.setter
    def device(self, kind: str) -> None:
        kinds = [info.kind for info in self.devices]
        if kind not in kinds:
            raise LaunchConfigError(f"device must be one of {kinds} here, got {kind!r}")
        self.device_picker.value = kind

    @property
    def num_processes(self) -> int:
        return int(self.processes_picker.value)

    @num_processes.setter
    def num_processes(self, value: int) -> None:
        low, high = self.processes_picker.min, self.processes_picker.max
        if not isinstance(value, int) or not low <= value <= high:
            raise LaunchConfigError(f"num_processes must be an int from {low} to {high} on {self.device}, "
                                    f"got {value!r}")
        self.processes_picker.value = value

    @property
    def mixed_precision(self) -> str:
        return self.precision_picker.value

    @mixed_precision.setter
    def mixed_precision(self, value: str) -> None:
        check_option(OPTIONS["mixed_precision"], value)
        check_precision_for_device(value, self.device)  # e.g. fp16 on CPU: the launcher's own message
        self.precision_picker.value = value

    # ------------------------------------------------------------------------------------ the launch
    def launch(self):
        """Start the launch in the background with the current settings; returns the ``Launch`` job."""
        from .launcher import start_launch

        with self._lock:
            if self.running and self._view is not None and self._view.state.finished is not None:
                try:  # the dashboard already shows the end; the launch thread is only tidying up
                    self._launch.wait(5)
                except BaseException:
                    pass
            if self.running:
                raise RuntimeError("a launch from this panel is still running; stop() or wait() first")
            view = WidgetView(display=False, log_to="widget", on_finished=self._on_finished)
            self._launch = None
            self._view = view
            self.dashboard.children = (view.widget,)
            self._set_running(True, "starting…")
            try:
                self._launch = start_launch(self.function, self.args, self.kwargs,
                                            num_processes=self.num_processes, view=view, device=self.device,
                                            mixed_precision=self.mixed_precision, **self._options)
            except BaseException as error:
                self._set_running(False, f'<span style="color:#d62728">{escape(one_line(error))}</span>')
                raise
            return self._launch

    def stop(self) -> None:
        """Stop every rank of the running launch (no-op when none runs). ``wait()`` then raises."""
        launch = self._launch
        if launch is not None and not launch.done:
            self.status_html.value = "stopping…"
            launch.stop()

    def wait(self, timeout: Optional[float] = None) -> Any:
        """Block until the launch ends; return rank 0's result (or all, with ``return_all``) or raise."""
        if self._launch is None:
            raise RuntimeError("nothing was launched yet: call launch() or press Launch")
        return self._launch.wait(timeout)

    @property
    def running(self) -> bool:
        return self._launch is not None and not self._launch.done

    @property
    def result(self) -> Any:
        """The last launch's return value (None while running or after a failure)."""
        return None if self._launch is None else self._launch.result

    @property
    def error(self) -> Optional[BaseException]:
        """The last launch's root-cause exception (``KeyboardInterrupt`` after Stop), else None."""
        return None if self._launch is None else self._launch.error

    @property
    def status(self) -> str:
        """"idle" before the first launch, then the launch's status (running, finished, failed, stopped...)."""
        if self._view is None:
            return "idle"
        return self._view.state.status

    @property
    def metrics(self) -> Any:
        """The last launch's reported metrics (``Launch.metrics``: a pandas DataFrame)."""
        if self._launch is None:
            raise RuntimeError("nothing was launched yet: call launch() or press Launch")
        return self._launch.metrics

    @property
    def view(self) -> Optional[WidgetView]:
        """The dashboard of the last launch."""
        return self._view

    def __repr__(self) -> str:
        name = getattr(self.function, "__name__", "function")
        text = f"LaunchPanel({name}, {self.num_processes} × {self.device}, {self.status})"
        if self._view is not None and self._view.state.started is not None:
            text += "\n" + self._view.summary()
        return text

    def _repr_mimebundle_(self, **kwargs):
        data = super()._repr_mimebundle_(**kwargs)
        if data is not None:
            data["text/plain"] = repr(self)
        return data

    def _ipython_display_(self) -> None:
        # Displayed with a display id, so the saved text/plain can be refreshed when a launch ends (a
        # notebook read without widgets then shows the outcome, not "idle").
        from IPython.display import display

        bundle = self._repr_mimebundle_()
        if bundle is None:
            return
        self._display_handles.append(display(bundle, raw=True, display_id=True))

    def _refresh_displays(self) -> None:
        bundle = self._repr_mimebundle_()
        for handle in self._display_handles:
            try:
                handle.update(bundle, raw=True)
            except Exception:
                pass

    # ------------------------------------------------------------------------------------ internals
    def _on_launch_click(self, _button) -> None:
        try:
            self.launch()
        except Exception:
            pass  # shown in status_html; a button callback has no cell to raise into

    def _on_finished(self, event: LaunchFinished) -> None:
        colour = {Status.FINISHED: "#2ca02c", Status.STOPPED: "#ff7f0e"}.get(event.status, "#d62728")
        text = f'<span style="color:{colour}">{escape(event.status)}</span>'
        if event.error and event.status != Status.STOPPED:
            text += f" — {escape(event.error)}"
        self._set_running(False, text)
        self._refresh_displays()

    def _set_running(self, running: bool, status: str) -> None:
        self.launch_button.disabled = running
        self.stop_button.disabled = not running
        for picker in (self.device_picker, self.processes_picker, self.precision_picker):
            picker.disabled = running or (picker is self.device_picker and len(self.devices) == 1)
        self.status_html.value = status

    def _on_device_change(self, change) -> None:
        self._set_processes_range(change["new"], None)
        self._set_precisions(change["new"])

    def _set_precisions(self, kind: str) -> None:
        """Offer only what ``kind`` can train in (no fp16 off CUDA); a choice it cannot keep becomes "no"."""
        allowed = precisions_for(kind)
        keep = self.precision_picker.value if self.precision_picker.value in allowed else MixedPrecision.NO.value
        self.precision_picker.options = allowed  # resets the value to the first option
        self.precision_picker.value = keep

    def _set_processes_range(self, kind: str, wanted: Optional[int]) -> None:
        info = next(info for info in self.devices if info.kind == kind)
        high = max(1, info.count)
        if wanted is None:  # every accelerator; on CPU two ranks (enough to exercise distributed code)
            wanted = high if kind != "cpu" else min(2, high)
        self.processes_picker.max = high
        self.processes_picker.value = max(1, min(int(wanted), high))

    def _devices_html(self) -> str:
        items = " · ".join(f"<b>{escape(info.kind)}</b>: {escape(info.description)}" for info in self.devices)
        return f'<div style="font-size:13px">Devices here — {items}</div>'


@entry_point("launch_panel")
def launch_panel(function: Callable[..., Any], args: tuple = (), kwargs: Optional[Dict[str, Any]] = None,
                 num_processes: Optional[int] = None, *,
                 device: Optional[DeviceName] = None,
                 mixed_precision: MixedPrecisionName = "no",
                 start_method: StartMethodName = "auto",
                 master_addr: str = "127.0.0.1",
                 use_port: Optional[int] = None,
                 timeout: Optional[float] = None,
                 return_all: bool = False,
                 compile_cache: Optional[PathLike] = None,
                 fsdp_config: Optional[Mapping[str, Any]] = None,
                 deepspeed_config: Optional[Mapping[str, Any]] = None,
                 cluster: Optional[ClusterName] = None,
                 resources_per_rank: Optional[Mapping[str, float]] = None,
                 placement: Optional[PlacementName] = None,
                 slurm: Optional[Mapping[str, Any]] = None,
                 num_nodes: int = 1,
                 node_rank: Optional[int] = None,
                 rdzv_backend: Union[RendezvousBackendName, str] = "static",
                 rdzv_endpoint: Optional[str] = None,
                 rdzv_id: Optional[str] = None,
                 rdzv_conf: Optional[Dict[str, Any]] = None,
                 max_restarts: int = 0,
                 monitor_interval: float = 0.1,
                 config: Union[bool, PathLike, None] = None) -> LaunchPanel:
    """A widget to launch ``function`` interactively: device, number of processes, precision, Launch, Stop.

    The options are ``notebook_launcher``'s but ``display`` (the panel shows its own dashboard):
    ``num_processes``, ``device``, ``mixed_precision`` preset the pickers (``None``: every accelerator; two ranks
    on CPU); the others are passed to each launch. Example::

        panel = launch_panel(train, args=(3e-4,), timeout=3600)
        panel          # in a notebook: press Launch; panel.result holds rank 0's return value afterwards

    Args:
        function: what each launch runs, as for ``notebook_launcher``.
        args: its positional arguments, a tuple.
        kwargs: its keyword arguments.
        {options}
    """
    # @entry_point resolved the options (given > saved config > defaults) and checked them; each launch passes them
    # to start_launch
    return LaunchPanel(function, args, kwargs, dict(
        num_processes=num_processes, device=device, mixed_precision=mixed_precision, start_method=start_method,
        master_addr=master_addr, use_port=use_port, timeout=timeout, return_all=return_all,
        compile_cache=compile_cache, fsdp_config=fsdp_config, deepspeed_config=deepspeed_config, cluster=cluster,
        resources_per_rank=resources_per_rank, placement=placement, slurm=slurm, num_nodes=num_nodes,
        node_rank=node_rank,
        rdzv_backend=rdzv_backend, rdzv_endpoint=rdzv_endpoint, rdzv_id=rdzv_id, rdzv_conf=rdzv_conf,
        max_restarts=max_restarts, monitor_interval=monitor_interval))
