"""Every launcher option is described once (``plan.options``) and every allowed value once
(``wire.choices``): the launcher, the plan, the CLI, the config file, the panel and the Accelerator read them."""
from __future__ import annotations

import argparse
import dataclasses
import inspect
import os
import re

import pytest

from notebook_accel import notebook_launcher
from notebook_accel.accelerator.precision import PRECISIONS
from notebook_accel.cli.config_command import add_config_parser
from notebook_accel.cli.launch import COMMAND_LINE_OPTIONS, add_launch_parser
from notebook_accel.errors import LaunchConfigError, LaunchConfigTypeError
from notebook_accel.launcher import start_launch
from notebook_accel.plan.config import LaunchConfig
from notebook_accel.plan.options import LAUNCHER_OPTIONS, OPTIONS, SAVED_OPTIONS
from notebook_accel.plan.plan import plan_launch
from notebook_accel.wire.choices import Device, Display, MixedPrecision, StartMethod


@pytest.mark.parametrize("launcher", [notebook_launcher, start_launch])
def test_the_launchers_show_every_option_with_its_default(launcher):
    shown = inspect.signature(launcher).parameters
    taken = [option for option in LAUNCHER_OPTIONS if launcher.__name__ in option.takers]
    assert {option.name: option.default for option in taken} == {
        name: parameter.default for name, parameter in shown.items() if name in OPTIONS}
    for option in taken:  # and document it
        assert f"{option.name}: " in launcher.__doc__


def test_an_unknown_option_is_a_type_error_before_anything_starts():
    with pytest.raises(LaunchConfigTypeError, match="^notebook_launcher: unexpected keyword argument "
                                                    "'mixed_precison'; did you mean 'mixed_precision'"):
        notebook_launcher(print, num_processes=1, mixed_precison="bf16")
    with pytest.raises(LaunchConfigTypeError, match="^start_launch: unexpected keyword argument 'favourite_colour'$"):
        start_launch(print, num_processes=1, favourite_colour="red")
    with pytest.raises(LaunchConfigTypeError, match="unexpected keyword argument 'favourite_colour'"):
        plan_launch(print, num_processes=1, favourite_colour="red")  # the planner, for the CLI


@pytest.mark.parametrize("name, enum", [("device", Device), ("mixed_precision", MixedPrecision),
                                        ("start_method", StartMethod), ("display", Display)])
def test_a_value_outside_the_enum_is_refused_with_the_allowed_ones(name, enum):
    with pytest.raises(LaunchConfigError) as refused:
        plan_launch(print, num_processes=1, **{name: "nonsense"})
    assert str(refused.value) == f"{name}='nonsense' is not one of " + ", ".join(repr(v) for v in enum.values())


def _parser(add) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    add(parser.add_subparsers())
    return parser


def _choices(parser: argparse.ArgumentParser, dest: str):
    sub = next(action for action in parser._actions if isinstance(action, argparse._SubParsersAction))
    command = next(iter(sub.choices.values()))
    return next(tuple(action.choices) for action in command._actions if action.dest == dest)


def test_the_command_line_offers_the_enums():
    launch = _parser(add_launch_parser)
    assert _choices(launch, "device") == Device.values()
    assert _choices(launch, "mixed_precision") == MixedPrecision.values()
    assert _choices(launch, "start_method") == StartMethod.values()
    assert _choices(_parser(add_config_parser), "mixed_precision") == MixedPrecision.values()
    assert set(COMMAND_LINE_OPTIONS) <= set(OPTIONS)


def test_the_config_file_saves_the_saved_options_with_the_launchers_defaults():
    fields = {field.name: field.default for field in dataclasses.fields(LaunchConfig)}
    assert fields == {option.name: option.default for option in SAVED_OPTIONS}
    assert PRECISIONS == MixedPrecision.values()


def test_the_launch_options_object_has_every_launch_option_with_its_type_and_default():
    import typing

    from notebook_accel.plan.options import LaunchOptions

    fields = dataclasses.fields(LaunchOptions)
    hints = typing.get_type_hints(LaunchOptions)
    assert [field.name for field in fields] == list(OPTIONS)
    assert {field.name: field.default for field in fields} == {name: option.default for name, option in OPTIONS.items()}
    assert {field.name: hints[field.name] for field in fields} == {
        name: option.annotation for name, option in OPTIONS.items()}
    with pytest.raises(LaunchConfigError, match="timeout must be None or a positive number of seconds, got -1"):
        LaunchOptions.checked(timeout=-1)  # made from keywords, it checks them against the table


def test_every_environment_variable_the_package_reads_is_in_the_table():
    import notebook_accel
    from notebook_accel.plan.variables import ENVIRONMENT_VARIABLES

    root = os.path.dirname(notebook_accel.__file__)
    found = set()
    for folder, _, files in os.walk(root):
        for name in files:
            if name.endswith(".py"):
                with open(os.path.join(folder, name), encoding="utf-8") as source:
                    found.update(re.findall(r"NOTEBOOK_ACCEL_[A-Z_]*[A-Z]", source.read()))
    assert found and found <= {variable.name for variable in ENVIRONMENT_VARIABLES}, \
        f"not in plan/variables.py (the docs' reference): {sorted(found - {v.name for v in ENVIRONMENT_VARIABLES})}"

