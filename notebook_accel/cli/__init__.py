"""``notebook-accel``: ``launch`` a script on every rank, ``config`` its defaults, ``env`` for bug
reports, ``test`` (a 2-rank self-check) and ``demo`` (the 2-process CPU demo).

    notebook-accel config default
    notebook-accel launch --num-processes 2 train.py --epochs 3
    notebook-accel launch -m my_package.train --lr 3e-4
"""
from __future__ import annotations

import argparse
import difflib
import sys
from typing import List, Optional

from .env import describe_environment, environment_report

__all__ = ["main", "describe_environment", "environment_report"]


class CommandParser(argparse.ArgumentParser):
    """The top-level parser. argparse hands an option a sub-command does not know back to the top level, which
    then shows its own usage; here the sub-command says it, with its usage and the closest option it has."""

    commands: Optional["argparse._SubParsersAction"] = None  # set on the top level only

    def parse_known_args(self, args=None, namespace=None):
        options, extras = super().parse_known_args(args, namespace)
        command = self.commands.choices.get(getattr(options, "command", None)) if self.commands else None
        if extras and command is not None:
            command.error(unrecognized_message(command, extras))
        return options, extras


def unrecognized_message(parser: argparse.ArgumentParser, extras: List[str]) -> str:
    """``unrecognized arguments: --num-procesess 2 (did you mean --num-processes?)``"""
    known = [flag for action in parser._actions for flag in action.option_strings]
    guesses = [difflib.get_close_matches(extra.split("=", 1)[0], known, n=1) for extra in extras
               if extra.startswith("-")]
    said = ", ".join(guess[0] for guess in guesses if guess)
    return f"unrecognized arguments: {' '.join(extras)}" + (f" (did you mean {said}?)" if said else "")


def build_parser() -> argparse.ArgumentParser:
    from .config_command import add_config_parser
    from .launch import add_launch_parser

    # Python >= 3.14 suggests the closest sub-command or choice for a mistyped one.
    suggest = {"suggest_on_error": True} if sys.version_info >= (3, 14) else {}
    parser = CommandParser(prog="notebook-accel", description="notebook_accel command line", **suggest)
    commands = parser.commands = parser.add_subparsers(dest="command", required=True)
    add_launch_parser(commands)
    add_config_parser(commands)
    commands.add_parser("env", help="versions, devices, start method and config, for bug reports")
    commands.add_parser("test", help="a 2-rank self-check that ends with PASS or FAIL")
    demo = commands.add_parser("demo", help="train the digits demo over CPU processes")
    demo.add_argument("--processes", type=int, default=2)
    demo.add_argument("--epochs", type=int, default=10)
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    """Entry point of the ``notebook-accel`` command; returns the exit code.

    >>> main(["env"])  # doctest: +SKIP
    """
    options = build_parser().parse_args(argv)
    if options.command == "launch":
        from .launch import run_launch

        return run_launch(options)
    if options.command == "config":
        from .config_command import run_config

        return run_config(options)
    if options.command == "env":
        print(environment_report())
        return 0
    if options.command == "test":
        from .selftest import run_self_test

        return run_self_test()
    from ..demo import main as demo_main

    demo_main(["--processes", str(options.processes), "--epochs", str(options.epochs)])
    return 0


if __name__ == "__main__":
    sys.exit(main())
