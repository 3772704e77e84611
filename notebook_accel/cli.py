"""``notebook-accel``: ``env`` (what a launch would use here) and ``demo`` (the 2-process CPU demo)."""
from __future__ import annotations

import argparse
import sys
from typing import List, Optional


def describe_environment() -> str:
    """A few lines saying which devices a launch would find here and how it would start ranks."""
    from . import environment

    safe, reason = environment.fork_safety()
    found = environment.available_devices()
    lines = [f"best device:   {found[0].kind} ({found[0].description})"]
    lines += [f"{info.kind + ':':<14} up to {info.count} rank(s) - {info.description}" for info in found]
    missing = [kind for kind in environment.DEVICES if kind not in {info.kind for info in found}]
    lines.append(f"not here:      {', '.join(missing)}" if missing else "")
    lines.append("start method:  " + ("fork (safe here)" if safe else f"forkserver ({reason})"))
    return "\n".join(line for line in lines if line)


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
