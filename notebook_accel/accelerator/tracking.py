"""Experiment trackers for ``Accelerator(log_with=...)``: TensorBoard, Weights & Biases, MLflow, or your own.

HF accelerate's tracker API under its names: ``GeneralTracker`` (subclass it for your own: ``name``,
``requires_logging_directory``, a ``tracker`` property, ``start`` / ``store_init_configuration`` / ``log`` /
``finish``), and the three built-in ones, each importing its package only when a run starts (optional extras:
``pip install "notebook_accel[tensorboard]"``, ``[wandb]``, ``[mlflow]``).

Only the main process writes: the built-in trackers are made and started there alone (as HF's, whose methods run
on the main process only). What :meth:`Accelerator.log` also does on every rank — the dashboard and
``Launch.metrics``, through :func:`notebook_accel.report` — is in :func:`report_to_dashboard`.
"""
from __future__ import annotations

import importlib.util
import os
import time
from numbers import Number
from typing import Any, Dict, List, Optional, Sequence, Union

from ..rank.metrics import report

__all__ = [
    "GeneralTracker",
    "TensorBoardTracker",
    "WandBTracker",
    "MLflowTracker",
    "LOGGER_TYPE_TO_CLASS",
    "filter_trackers",
    "get_available_trackers",
    "report_to_dashboard",
]


class GeneralTracker:
    """Base class of a tracker: subclass it with ``name``, ``requires_logging_directory`` and a ``tracker`` property,
    and override ``start``, ``store_init_configuration``, ``log`` and ``finish`` as needed.

    Example::

        class PrintTracker(GeneralTracker):
            name = "print"
            requires_logging_directory = False

            @property
            def tracker(self):
                return None

            def log(self, values, step=None, **kwargs):
                print(step, values)

        accelerator = Accelerator(log_with=PrintTracker())
    """

    main_process_only = True

    def __init__(self, _blank: bool = False) -> None:
        if _blank:
            return
        missing = [attribute for attribute in ("name", "requires_logging_directory") if not hasattr(self, attribute)]
        if "tracker" not in dir(self):
            missing.append("tracker")
        if missing:
            raise NotImplementedError(
                "The implementation for this tracker class is missing the following required attributes. Please "
                "define them in the class definition: " + ", ".join(f"`{name}`" for name in missing)
            )

    def start(self) -> None:
        """Make the underlying run (called by ``init_trackers``)."""

    def store_init_configuration(self, values: Dict[str, Any]) -> None:
        """Record the hyperparameters (``init_trackers(config=...)``)."""

    def log(self, values: Dict[str, Any], step: Optional[int] = None, **kwargs: Any) -> None:
        """Record ``values`` at ``step``."""

    def finish(self) -> None:
        """Close the run (``end_training``)."""


class TensorBoardTracker(GeneralTracker):
    """Event files under ``<logging_dir>/<project_name>``, written by ``torch.utils.tensorboard`` (the tensorboard
    package) or tensorboardX."""

    name = "tensorboard"
    requires_logging_directory = True

    def __init__(self, run_name: str, logging_dir: Union[str, "os.PathLike[str]"], **kwargs: Any) -> None:
        super().__init__()
        self.run_name = run_name
        self.logging_dir_param = logging_dir
        self.init_kwargs = kwargs
        self.writer: Any = None

    def start(self) -> None:
        try:
            from torch.utils import tensorboard
        except ModuleNotFoundError:
            try:
                import tensorboardX as tensorboard  # type: ignore[no-redef]
            except ModuleNotFoundError:
                raise ImportError('log_with="tensorboard" writes with the tensorboard package: '
                                  'pip install "notebook_accel[tensorboard]"') from None
        self.logging_dir = os.path.join(self.logging_dir_param, self.run_name)
        self.writer = tensorboard.SummaryWriter(self.logging_dir, **self.init_kwargs)

    @property
    def tracker(self) -> Any:
        return self.writer

    def store_init_configuration(self, values: Dict[str, Any]) -> None:
        import yaml

        self.writer.add_hparams(values, metric_dict={})
        self.writer.flush()
        directory = os.path.join(self.logging_dir, str(time.time()))
        os.makedirs(directory, exist_ok=True)
        with open(os.path.join(directory, "hparams.yml"), "w") as handle:
            yaml.dump(values, handle)

    def log(self, values: Dict[str, Any], step: Optional[int] = None, **kwargs: Any) -> None:
        for key, value in _listify(values).items():
            if isinstance(value, (int, float)):
                self.writer.add_scalar(key, value, global_step=step, **kwargs)
            elif isinstance(value, str):
                self.writer.add_text(key, value, global_step=step, **kwargs)
            elif isinstance(value, dict):
                self.writer.add_scalars(key, value, global_step=step, **kwargs)
        self.writer.flush()

    def log_images(self, values: Dict[str, Any], step: Optional[int] = None, **kwargs: Any) -> None:
        for key, value in values.items():
            self.writer.add_images(key, value, global_step=step, **kwargs)

    def finish(self) -> None:
        self.writer.close()


class WandBTracker(GeneralTracker):
    """A Weights & Biases run (``wandb.init(project=project_name, **init_kwargs)``); ``WANDB_MODE=offline`` keeps it
    on disk."""

    name = "wandb"
    requires_logging_directory = False

    def __init__(self, run_name: str, **kwargs: Any) -> None:
        super().__init__()
        self.run_name = run_name
        self.init_kwargs = kwargs
        self.run: Any = None

    def start(self) -> None:
        wandb = _import("wandb", "wandb")
        self.run = wandb.init(project=self.run_name, **self.init_kwargs)

    @property
    def tracker(self) -> Any:
        return self.run

    def store_init_configuration(self, values: Dict[str, Any]) -> None:
        self.run.config.update(values, allow_val_change=True)

    def log(self, values: Dict[str, Any], step: Optional[int] = None, **kwargs: Any) -> None:
        self.run.log(values, step=step, **kwargs)

    def finish(self) -> None:
        self.run.finish()


class MLflowTracker(GeneralTracker):
    """An MLflow run in the experiment ``project_name`` (``MLFLOW_TRACKING_URI`` says where: a ``file:`` store
    works without a server). ``MLFLOW_EXPERIMENT_NAME``, ``MLFLOW_RUN_ID``, ``MLFLOW_TAGS`` are read as HF reads them.
    """

    name = "mlflow"
    requires_logging_directory = False

    def __init__(self, experiment_name: Optional[str] = None, logging_dir: Optional[str] = None,
                 run_id: Optional[str] = None, tags: Optional[Union[Dict[str, Any], str]] = None,
                 nested_run: bool = False, run_name: Optional[str] = None, description: Optional[str] = None) -> None:
        import json

        super().__init__()
        tags = os.environ.get("MLFLOW_TAGS", tags)  # type: ignore[assignment]
        self.experiment_name = os.environ.get("MLFLOW_EXPERIMENT_NAME", experiment_name)
        self.logging_dir = logging_dir
        self.run_id = os.environ.get("MLFLOW_RUN_ID", run_id)
        self.tags = json.loads(tags) if isinstance(tags, str) else tags
        self.nested_run = nested_run
        self.run_name = run_name
        self.description = description
        self.active_run: Any = None

    def start(self) -> None:
        mlflow = _import("mlflow", "mlflow")
        found = mlflow.search_experiments(filter_string=f"name = '{self.experiment_name}'")
        if found:
            experiment_id = found[0].experiment_id
        else:
            experiment_id = mlflow.create_experiment(name=self.experiment_name, artifact_location=self.logging_dir,
                                                     tags=self.tags)  # fmt: skip
        self.active_run = mlflow.start_run(run_id=self.run_id, experiment_id=experiment_id, run_name=self.run_name,
                                           nested=self.nested_run, tags=self.tags, description=self.description)

    @property
    def tracker(self) -> Any:
        return self.active_run

    def store_init_configuration(self, values: Dict[str, Any]) -> None:
        import mlflow

        mlflow.log_params(values)

    def log(self, values: Dict[str, Any], step: Optional[int] = None, **kwargs: Any) -> None:
        import mlflow

        mlflow.log_metrics({key: value for key, value in values.items() if isinstance(value, (int, float))},
                           step=step)  # fmt: skip

    def finish(self) -> None:
        import mlflow

        mlflow.end_run()


LOGGER_TYPE_TO_CLASS = {"tensorboard": TensorBoardTracker, "wandb": WandBTracker, "mlflow": MLflowTracker}
_PACKAGES = {"tensorboard": ("tensorboard", "tensorboardX"), "wandb": ("wandb",), "mlflow": ("mlflow",)}


def get_available_trackers() -> List[str]:
    """The built-in trackers whose package is installed."""
    return [name for name, packages in _PACKAGES.items()
            if any(importlib.util.find_spec(package) is not None for package in packages)]  # fmt: skip


def filter_trackers(log_with: Any, logging_dir: Optional[str]) -> List[Union[str, GeneralTracker]]:
    """``log_with`` checked: names of built-in trackers (``"all"``: every installed one) and tracker instances."""
    if log_with is None:
        return []
    wanted = list(log_with) if isinstance(log_with, (list, tuple)) else [log_with]
    if any(str(item) == "all" for item in wanted):
        return [item for item in wanted if isinstance(item, GeneralTracker)] + get_available_trackers()  # type: ignore
    chosen: List[Union[str, GeneralTracker]] = []
    for item in wanted:
        if isinstance(item, GeneralTracker):
            chosen.append(item)
            continue
        name = str(item)
        if name not in LOGGER_TYPE_TO_CLASS:
            raise ValueError(f"Unsupported logging capability: {name}. Choose between "
                             f"{['all'] + list(LOGGER_TYPE_TO_CLASS)} or a GeneralTracker instance")  # fmt: skip
        if LOGGER_TYPE_TO_CLASS[name].requires_logging_directory and logging_dir is None:
            raise ValueError(f"Logging with `{name}` requires a `logging_dir` to be passed in (Accelerator(project_dir="
                             "...) or ProjectConfiguration(logging_dir=...))")  # fmt: skip
        if name not in chosen:
            chosen.append(name)
    return chosen


def make_trackers(chosen: Sequence[Union[str, GeneralTracker]], project_name: str, logging_dir: Optional[str],
                  init_kwargs: Dict[str, Dict[str, Any]]) -> List[GeneralTracker]:
    """The tracker objects for ``init_trackers`` (built-in ones made with ``init_kwargs[name]``)."""
    made: List[GeneralTracker] = []
    for item in chosen:
        if isinstance(item, GeneralTracker):
            made.append(item)
            continue
        cls = LOGGER_TYPE_TO_CLASS[str(item)]
        kwargs = init_kwargs.get(str(item), {})
        made.append(cls(project_name, logging_dir, **kwargs) if cls.requires_logging_directory
                    else cls(project_name, **kwargs))  # fmt: skip
    return made


def report_to_dashboard(values: Dict[str, Any], step: Optional[int]) -> None:
    """The numbers of ``values`` to :func:`notebook_accel.report` (dashboard plots, ``Launch.metrics``): scalars as
    they are, a dict's scalars as ``name/key`` (TensorBoard's ``add_scalars``); text and the rest are left out."""
    scalars: Dict[str, Any] = {}
    for name, value in values.items():
        if isinstance(value, dict):
            scalars.update({f"{name}/{key}": item for key, item in value.items() if _is_scalar(item)})
        elif _is_scalar(value):
            scalars[name] = value
    if scalars:
        report(step=step, **scalars)


def _is_scalar(value: Any) -> bool:
    if isinstance(value, bool) or isinstance(value, str):
        return False
    if isinstance(value, Number):
        return True
    numel = getattr(value, "numel", None) or getattr(value, "size", None)
    try:
        return callable(numel) and numel() == 1 or (isinstance(numel, int) and numel == 1)
    except TypeError:
        return False


def _listify(values: Dict[str, Any]) -> Dict[str, Any]:
    """One-element tensors and numpy scalars as Python numbers (what HF's ``listify`` does for TensorBoard)."""
    converted = {}
    for key, value in values.items():
        item = getattr(value, "item", None)
        if callable(item) and not isinstance(value, (int, float, str, dict)):
            try:
                value = item()
            except (ValueError, RuntimeError):
                pass
        converted[key] = value
    return converted


def _import(module: str, extra: str) -> Any:
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError:
        raise ImportError(f'log_with="{extra}" needs the {module} package: pip install "notebook_accel[{extra}]"') \
            from None


class TrackingMembers:
    """The Accelerator's tracker members (mixed into it): ``init_trackers``, ``log``, ``get_tracker``. The
    Accelerator sets ``log_with`` (checked names and instances), ``trackers`` (made by ``init_trackers``) and calls
    :meth:`_finish_trackers` from ``end_training``."""

    log_with: List[Union[str, GeneralTracker]]
    trackers: List[GeneralTracker]
    is_main_process: bool
    logging_dir: Optional[str]

    def init_trackers(self, project_name: str, config: Optional[Dict[str, Any]] = None,
                      init_kwargs: Optional[Dict[str, Dict[str, Any]]] = None) -> None:
        """Start a run of every tracker of ``log_with`` (on the main process: the others log nothing to them), and
        record ``config`` (hyperparameters) there.

        Example::

            accelerator = Accelerator(log_with="tensorboard", project_dir="runs")
            accelerator.init_trackers("my_project", config={"lr": 1e-3})
            accelerator.log({"loss": loss.item()}, step=step)     # trackers + the dashboard
            accelerator.end_training()
        """
        if not self.is_main_process:
            return
        made = make_trackers(self.log_with, project_name, self.logging_dir, init_kwargs or {})
        self.trackers.extend(made)
        for tracker in made:
            tracker.start()
        if config is not None:
            for tracker in made:
                tracker.store_init_configuration(config)

    def get_tracker(self, name: str, unwrap: bool = False) -> Any:
        """The tracker called ``name`` (``unwrap=True``: its own object: the ``SummaryWriter``, the wandb run...); on
        the other ranks a blank tracker whose methods do nothing."""
        if self.trackers:
            for tracker in self.trackers:
                if tracker.name == name:
                    return tracker.tracker if unwrap else tracker
            raise ValueError(f"{name} is not an available tracker stored inside the `Accelerator`.")
        return GeneralTracker(_blank=True)

    def log(self, values: Dict[str, Any], step: Optional[int] = None,
            log_kwargs: Optional[Dict[str, Dict[str, Any]]] = None) -> None:
        """Log ``values`` at ``step``: to every tracker (main process), and to the dashboard's plots and
        ``Launch.metrics`` exactly as :func:`notebook_accel.report` does (from each rank that calls it).

        Example::

            accelerator.log({"train_loss": loss.item(), "lr": scheduler.get_last_lr()[0]}, step=step)
        """
        report_to_dashboard(values, step)
        if self.trackers:
            for tracker in self.trackers:
                tracker.log(values, step=step, **(log_kwargs or {}).get(tracker.name, {}))

    def _finish_trackers(self) -> None:
        for tracker in self.trackers:
            tracker.finish()
        self.trackers = []
