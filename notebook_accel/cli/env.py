"""``notebook-accel env``: the block to paste into a bug report (versions, devices, start method, config)."""
from __future__ import annotations

import importlib.metadata
import os
import platform
import sys
from typing import List

_PACKAGES = ("torch", "cloudpickle", "ipywidgets", "ipykernel", "tqdm", "psutil", "PyYAML", "accelerate",
             "torch_xla")


def describe_environment() -> str:
    """A few lines saying which devices a launch would find here and how it would start ranks.

    >>> print(describe_environment())  # doctest: +SKIP
    best device:    cpu (2 CPU cores)
    cpu:            up to 2 ranks - 2 CPU cores
    ...
    """
    from ..formatting import count
    from ..plan import devices as environment

    safe, reason = environment.fork_safety()
    found = environment.available_devices()
    lines = [_row("best device", f"{found[0].kind} ({found[0].description})")]
    lines += [_row(info.kind, f"up to {count(info.count, 'rank')} - {info.description}") for info in found]
    missing = [kind for kind in environment.DEVICES if kind not in {info.kind for info in found}]
    lines.append(_row("not here", ", ".join(missing)) if missing else "")
    lines.append(_row("start method", "fork (safe here)" if safe else f"forkserver ({reason})"))
    return "\n".join(line for line in lines if line)


LABEL_WIDTH = 16  # every "name:  value" line of the report starts its value in the same column


def _row(name: str, value: str) -> str:
    return f"{name + ':':<{LABEL_WIDTH}}{value}"


def versions() -> List[str]:
    from .. import __version__

    lines = [_row("notebook_accel", __version__), _row("python", f"{sys.version.split()[0]} ({sys.executable})"),
             _row("platform", platform.platform())]
    for name in _PACKAGES:
        try:
            version = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            version = "not installed"
        lines.append(_row(name, version))
    return lines


def config_lines() -> List[str]:
    from ..errors import LaunchConfigError
    from ..plan.config import LaunchConfig, find_config_file, load_config

    path = find_config_file()
    if path is None:
        return [_row("config file", "none (built-in defaults; `notebook-accel config default` writes one)")]
    lines = [_row("config file", path)]
    try:
        values = load_config(path).launcher_options()
    except LaunchConfigError as err:
        return lines + [f"  unreadable: {err}"]
    defaults = LaunchConfig().launcher_options()
    lines += [f"  {key}: {value}" for key, value in values.items() if defaults.get(key) != value or key == "device"]
    return lines


def environment_report() -> str:
    """Versions, devices, start method, distributed variables set here and the config in use."""
    distributed = [f"  {key}={os.environ[key]}" for key in sorted(os.environ)
                   if key in ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "GLOO_SOCKET_IFNAME",
                              "NCCL_SOCKET_IFNAME", "CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS", "HF_HOME")]
    parts = ["- notebook_accel environment -"] + versions() + [describe_environment()] + config_lines()
    if distributed:
        parts += ["variables:"] + distributed
    return "\n".join(parts)
