"""``notebook-accel config``: the questionnaire, or ``config default`` with no prompts."""
from __future__ import annotations

import argparse
import sys

from ..errors import LaunchConfigError
from ..plan.config import ask_config, default_config_path, save_config, write_basic_config
from ..wire.choices import MixedPrecision
from .sharding_flags import add_sharding_arguments, sharding_from_flags


def add_config_parser(commands) -> argparse.ArgumentParser:
    parser = commands.add_parser(
        "config", help="save launch defaults (interactive; `config default` asks nothing)",
        description="Save launch defaults to a YAML file that `notebook-accel launch` reads.")
    parser.add_argument("mode", nargs="?", choices=("default",),
                        help="'default': write this machine's defaults without asking (for Colab cells)")
    parser.add_argument("--config-file", "--config_file", dest="config_file", default=None,
                        help=f"where to write (default: {default_config_path()})")
    parser.add_argument("--mixed-precision", "--mixed_precision", dest="mixed_precision",
                        default=MixedPrecision.NO.value,
                        choices=MixedPrecision.values(), help="for `config default`")
    parser.add_argument("--overwrite", action="store_true", help="for `config default`: replace an existing file")
    add_sharding_arguments(parser)  # for `config default`
    return parser


def run_config(options: argparse.Namespace) -> int:
    if options.mode == "default":
        try:
            written = write_basic_config(options.mixed_precision, options.config_file, overwrite=options.overwrite,
                                         overwrite_hint="add --overwrite", **sharding_from_flags(options))
        except LaunchConfigError as refused:
            print(f"notebook-accel config: {refused}; nothing saved", file=sys.stderr)
            return 2
        if written:
            print(f"notebook_accel configuration saved at {written}")
        return 0
    try:
        config = ask_config()
    except (EOFError, KeyboardInterrupt):
        print("\nno answers, nothing saved (use `notebook-accel config default` where prompts cannot be answered)")
        return 1
    print(f"notebook_accel configuration saved at {save_config(config, options.config_file)}")
    return 0
