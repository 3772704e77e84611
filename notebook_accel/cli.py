"""``notebook-accel``: ``env`` (what a launch would use here) and ``demo`` (the 2-process CPU demo)."""
from __future__ import annotations

import argparse
import sys
from typing import List, Optional


def describe_environment() -> str:
    """A few lines saying which devices a launch would find here and how it would start ranks."""
    from . import environment

    best = environment.best_device()
    safe, reason = environment.fork_safety()
    lines = [f"best device:   {best} ({environment.describe(best).description})"]
    for kind in environment.DEVICES:
        if kind == "xla" and not (environment.tpu_detected() and environment.torch_xla_importable()):
            lines.append("xla:           no TPU detected" + ("" if environment.torch_xla_importable()
                                                            else " (torch_xla not installed)"))
            continue
        info = environment.describe(kind)
        lines.append(f"{kind + ':':<14} {info.count} rank(s) possible - {info.description}")
    lines.append("start method:  " + ("fork (safe here)" if safe else f"forkserver ({reason})"))
    return "\n".join(lines)


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="notebook-accel", description="notebook_accel command line")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("env", help="show the devices a launch would use here")
    demo = commands.add_parser("demo", help="train the digits demo over CPU processes")
    demo.add_argument("--processes", type=int, default=2)
    demo.add_argument("--epochs", type=int, default=10)
    options = parser.parse_args(argv)
    if options.command == "env":
        print(describe_environment())
    else:
        from .demo import main as demo_main

        demo_main(["--processes", str(options.processes), "--epochs", str(options.epochs)])
    return 0


if __name__ == "__main__":
    sys.exit(main())
