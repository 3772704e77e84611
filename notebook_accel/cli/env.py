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
    best device:   cpu (CPU (2 cores))
    ...
    """
    from ..plan import devices as environment

    safe, reason = environment.fork_safety()
    found = environment.available_devices()
    lines = [f"best device:   {found[0].kind} ({found[0].description})"]
    lines += [f"{info.kind + ':':<14} up to {info.count} rank(s) - {info.description}" for info in found]
    missing = [kind for kind in environment.DEVICES if kind not in {info.kind for info in found}]
    lines.append(f"not here:      {', '.join(missing)}" if missing else "")
    lines.append("start method:  " + ("fork (safe here)" if safe else f"forkserver ({reason})"))
    return "\n".join(line for line in lines if line)


def versions() -> List[str]:
    from .. import __version__

    lines = [f"notebook_accel: {__version__}", f"python:         {sys.version.split()[0]} ({sys.executable})",
             f"platform:       {platform.platform()}"]
    for name in _PACKAGES:
        try:
            version = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            version = "not installed"
        lines.append(f"{name + ':':<16}{version}")
    return lines


def config_lines() -> List[str]:
    from ..errors import LaunchConfigError
    from ..plan.config import LaunchConfig, find_config_file, load_config

    path = find_config_file()
    if path is None:
        return ["config file:    none (built-in defaults; `notebook-accel config default` writes one)"]
    lines = [f"config file:    {path}"]
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
