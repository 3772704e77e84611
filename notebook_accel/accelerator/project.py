"""Where a run writes, under HF accelerate's names: ``project_dir`` / ``logging_dir``, checkpoints named
``checkpoints/checkpoint_<i>`` (``ProjectConfiguration(automatic_checkpoint_naming=True, total_limit=N)``), objects
of one's own in every checkpoint (``register_for_checkpointing``), and hooks before saving or loading.

A mixin of :class:`~.accelerator.Accelerator` (which owns ``project_configuration``); the checkpoint files
themselves are :mod:`.checkpointing`'s.
"""
from __future__ import annotations

import collections
import os
import re
import shutil
from typing import Any, Callable, Dict, List, Optional

import torch
from torch.utils.hooks import RemovableHandle

from .configs import ProjectConfiguration
from .operations import barrier

__all__ = ["ProjectMembers", "CUSTOM_CHECKPOINT"]

CUSTOM_CHECKPOINT = "custom_checkpoint_{index}.pkl"  # HF accelerate's file name for registered objects
_NUMBER_AT_END = re.compile(r"[\/]?([0-9]+)(?=[^\/]*$)")


def checkpoint_number(folder: str) -> int:
    """The ``i`` of an automatic checkpoint's folder ``.../checkpoint_<i>``."""
    return int(_NUMBER_AT_END.findall(folder)[0])


class ProjectMembers:
    """Mixed into the Accelerator, which provides ``project_configuration`` and ``is_main_process``."""

    project_configuration: ProjectConfiguration
    is_main_process: bool
    _custom_objects: List[Any]
    _save_state_pre_hooks: Dict[int, Callable[..., None]]
    _load_state_pre_hooks: Dict[int, Callable[..., None]]

    def _init_project(self, project_dir: Optional[str], project_config: Optional[ProjectConfiguration]) -> None:
        self.project_configuration = project_config if project_config is not None else ProjectConfiguration(
            project_dir=project_dir)  # fmt: skip
        if project_dir is not None and self.project_configuration.project_dir is None:
            self.project_configuration.set_directories(os.fspath(project_dir))
        self._custom_objects = []
        self._save_state_pre_hooks = collections.OrderedDict()
        self._load_state_pre_hooks = collections.OrderedDict()

    @property
    def project_dir(self) -> Optional[str]:
        """The project's directory (``Accelerator(project_dir=...)``): automatic checkpoints go under it."""
        return self.project_configuration.project_dir

    @property
    def logging_dir(self) -> Optional[str]:
        """Where the trackers write (``project_dir`` unless the ``ProjectConfiguration`` says otherwise)."""
        return self.project_configuration.logging_dir

    @property
    def save_iteration(self) -> int:
        """The number the next automatically named checkpoint gets."""
        return self.project_configuration.iteration

    def register_for_checkpointing(self, *objects: Any) -> None:
        """Objects with ``state_dict`` / ``load_state_dict`` saved and restored by every ``save_state`` /
        ``load_state`` from now on (``custom_checkpoint_<i>.pkl``, in registration order).

        Example::

            accelerator.register_for_checkpointing(ema_model, step_counter)
        """
        invalid = [obj for obj in objects if not (hasattr(obj, "state_dict") and hasattr(obj, "load_state_dict"))]
        if invalid:
            names = ", ".join(type(obj).__name__ for obj in invalid)
            raise ValueError("All `objects` must include a `state_dict` and `load_state_dict` function to be stored. "
                             f"The following inputs are invalid: {names}")  # fmt: skip
        self._custom_objects.extend(objects)

    def register_save_state_pre_hook(self, hook: Callable[..., None]) -> RemovableHandle:
        """``hook(models, weights, output_dir)`` runs before ``save_state`` writes (``weights``: each model's state
        dict, which the hook may edit; ``handle.remove()`` unregisters it)."""
        handle = RemovableHandle(self._save_state_pre_hooks)
        self._save_state_pre_hooks[handle.id] = hook
        return handle

    def register_load_state_pre_hook(self, hook: Callable[..., None]) -> RemovableHandle:
        """``hook(models, input_dir)`` runs before ``load_state`` reads."""
        handle = RemovableHandle(self._load_state_pre_hooks)
        self._load_state_pre_hooks[handle.id] = hook
        return handle

    # ------------------------------------------------------------------------------- used by save/load_state
    def _directory_to_save(self, output_dir: Optional[str]) -> str:
        """``output_dir``, or with automatic naming the next ``checkpoints/checkpoint_<i>`` (the oldest removed
        beyond ``total_limit``)."""
        config = self.project_configuration
        if not config.automatic_checkpoint_naming:
            if output_dir is None:
                raise ValueError("save_state() needs a directory (or ProjectConfiguration(automatic_checkpoint_naming="
                                 "True) with a project_dir)")  # fmt: skip
            return output_dir
        if self.project_dir is None:
            raise ValueError("automatic_checkpoint_naming needs a project_dir: Accelerator(project_dir=...)")
        root = os.path.join(self.project_dir, "checkpoints")
        os.makedirs(root, exist_ok=True)
        folders = sorted((os.path.join(root, name) for name in os.listdir(root)), key=checkpoint_number)
        if config.total_limit is not None and len(folders) + 1 > config.total_limit and self.is_main_process:
            for folder in folders[: len(folders) + 1 - config.total_limit]:
                shutil.rmtree(folder)
        directory = os.path.join(root, f"checkpoint_{config.iteration}")
        if os.path.exists(directory):
            raise ValueError(f"Checkpoint directory {directory} ({config.iteration}) already exists. Please manually "
                             "override `accelerator.project_configuration.iteration` with what iteration to start "
                             "with.")  # fmt: skip
        barrier()  # the main process removed the old ones before anyone writes
        return directory

    @property
    def latest_checkpoint(self) -> Optional[str]:
        """The latest automatically named checkpoint (``<project_dir>/checkpoints/checkpoint_<i>``), None when there is
        none yet: what ``load_state()`` without a directory restores. A job that may be a requeued one (a detached
        launch resumed after its time limit or a preemption) resumes with it::

            if accelerator.latest_checkpoint is not None:
                accelerator.load_state()
            for step in range(accelerator.optimizer_steps, total): ...
        """
        if self.project_dir is None:
            return None
        root = os.path.join(self.project_dir, "checkpoints")
        try:
            names = [name for name in os.listdir(root) if _NUMBER_AT_END.search(name)]
        except FileNotFoundError:
            return None
        folders = sorted((os.path.join(root, name) for name in names), key=checkpoint_number)
        return folders[-1] if folders else None

    def _directory_to_load(self, input_dir: Optional[str]) -> str:
        if input_dir is not None:
            input_dir = os.path.expanduser(input_dir)
            if not os.path.isdir(input_dir):
                raise ValueError(f"Tried to find {input_dir} but folder does not exist")
            return input_dir
        if not self.project_configuration.automatic_checkpoint_naming or self.project_dir is None:
            raise ValueError("No input_dir provided and automatic checkpoint naming is disabled.")
        root = os.path.join(self.project_dir, "checkpoints")
        folders = sorted((os.path.join(root, name) for name in os.listdir(root)), key=checkpoint_number)
        return folders[-1]

    def _save_custom_objects(self, directory: str, process_index: int) -> None:
        if process_index == 0:
            for index, obj in enumerate(self._custom_objects):
                torch.save(obj.state_dict(), os.path.join(directory, CUSTOM_CHECKPOINT.format(index=index)))

    def _load_custom_objects(self, directory: str) -> None:
        found = [name for name in os.listdir(directory) if re.search(r"^custom_checkpoint_\d+\.pkl$", name)]
        if len(found) != len(self._custom_objects):
            raise RuntimeError(
                f"Number of custom checkpoints in folder {directory} does not match the number of registered objects: "
                f"found {len(found)} checkpoints, {len(self._custom_objects)} registered objects. Load checkpoints "
                "saved with the same register_for_checkpointing() objects."
            )
        for index, obj in enumerate(self._custom_objects):
            path = os.path.join(directory, CUSTOM_CHECKPOINT.format(index=index))
            obj.load_state_dict(torch.load(path, map_location="cpu", weights_only=False))
