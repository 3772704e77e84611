"""The docs' generated parts, from the one table of options (``notebook_accel/plan/options.py``).

mkdocs runs this file as a hook (``hooks:`` in mkdocs.yml): what a page holds from ``<!-- options-reference -->``
to ``<!-- /options-reference -->`` (a note for readers of the unbuilt page) becomes the reference of every option of
every entry point — its ``def`` line, default, allowed values, the entry
points that take it, its ``notebook-accel launch`` flag, whether ``notebook-accel config`` saves it, and its help.
mkdocstrings loads ``OptionsInDocstrings`` from it (a griffe extension, ``extensions:`` in mkdocs.yml): an entry
point's docstring line ``{options}`` becomes the "Args" lines of its options, as ``help()`` shows them at run time.

The docs describe the checkout they are built from, so its root goes first on ``sys.path``.
"""
from __future__ import annotations

import inspect
import os
import re
import sys
from typing import Any, Dict, List

import griffe

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if sys.path[0] != REPO:
    sys.path.insert(0, REPO)

from notebook_accel.cli import build_parser  # noqa: E402  (after the checkout is on the path)
from notebook_accel.plan.entry_points import OPTIONS_MARKER  # noqa: E402
from notebook_accel.plan.options import (ALL_OPTIONS, ENTRY_POINTS, RUNS, SESSION, Option,  # noqa: E402
                                         options_help)
from notebook_accel.plan.variables import ENVIRONMENT_VARIABLES  # noqa: E402

BETWEEN_MARKERS = re.compile(r"<!-- options-reference -->.*?<!-- /options-reference -->", re.S)
# Options the command line sets through flags of their own (accelerate's), not one named after the option.
_FLAG_FOR = {"fsdp_config": "use_fsdp", "deepspeed_config": "use_deepspeed"}


def on_page_markdown(markdown: str, page: Any, **kwargs: Any) -> str:
    """mkdocs' hook: what a page holds between the markers becomes the options reference."""
    return BETWEEN_MARKERS.sub(lambda _: options_reference(), markdown)


def options_reference() -> str:
    """Markdown: which entry point takes which option (a table), then one section per option, in ``def`` order."""
    entries = list(ENTRY_POINTS)
    header = "| option | " + " | ".join(entries) + " |"  # plain text: code spans would break mid-word
    rows = [header, "|---" * (len(entries) + 1) + "|"]
    for option in ALL_OPTIONS:
        marks = " | ".join("✓" if entry in option.takers else "" for entry in entries)
        rows.append(f"| [{option.name}](#{option.name}) | {marks} |")
    flags = _launch_flags()
    sections = [_section(option, flags.get(_FLAG_FOR.get(option.name, option.name))) for option in ALL_OPTIONS]
    return "\n".join(rows) + "\n\n" + "\n\n".join(sections) + "\n\n" + environment_reference() + "\n"


def environment_reference() -> str:
    """Markdown: the ``NOTEBOOK_ACCEL_*`` environment variables (``plan/variables.py``), users' first."""
    lines = ["## Environment variables {#environment-variables}", "",
             "Set in the kernel's environment (or the script's) before the launch; ranks inherit them.", "",
             "| variable | default | what it does |", "|---|---|---|"]
    for variable in ENVIRONMENT_VARIABLES:
        if variable.internal:
            continue
        default = f"`{variable.default}`" if variable.default else "set by the launcher"
        lines.append(f"| `{variable.name}` | {default} | {variable.help} |")
    return "\n".join(lines)


def _section(option: Option, flags: "List[str] | None") -> str:
    parameter = inspect.Parameter(option.name, inspect.Parameter.KEYWORD_ONLY, default=option.default,
                                  annotation=option.annotation)
    facts = [f"Default `{option.default!r}`"]
    if option.choices is not None:
        values = " ".join(f"`{value!r}`" for value in option.choices.values())
        facts.append(f"{'offered' if option.open_choices else 'one of'}: {values}")
    takers = ", ".join(f"`{entry}`" for entry in ENTRY_POINTS if entry in option.takers)
    facts.append(f"taken by {takers}")
    if SESSION in option.takers and option.takers & RUNS:
        facts.append("in `Session.run` / `Session.execute` the default is `None`: the session's value")
    if flags:
        facts.append("`notebook-accel launch` " + " / ".join(f"`{flag}`" for flag in flags)
                     + (" and its flags" if option.name in _FLAG_FOR else ""))
    if option.saved:
        facts.append("saved by `notebook-accel config`")
    return (f"### `{option.name}` {{#{option.name}}}\n\n"
            f"```python\n{_without_typing(str(parameter))}\n```\n\n"
            f"{option.help}\n\n" + "; ".join(facts) + ".")


def _without_typing(text: str) -> str:
    return re.sub(r"\btyping\.", "", text).replace("NoneType", "None")


def _launch_flags() -> Dict[str, List[str]]:
    """``notebook-accel launch``'s flags by destination, from its real parser."""
    launch = build_parser().commands.choices["launch"]  # type: ignore[union-attr]
    return {action.dest: list(action.option_strings) for action in launch._actions if action.option_strings}


class OptionsInDocstrings(griffe.Extension):
    """An entry point's ``{options}`` docstring line (``@entry_point(name)`` fills it at import) becomes its
    options' "Args" lines for mkdocstrings too, which reads the source without importing it."""

    def on_function_instance(self, *, func: griffe.Function, **kwargs: Any) -> None:
        entry = next((match.group(1) for decorator in func.decorators
                      for match in [re.match(r"""entry_point\(["'](.+?)["']\)""", str(decorator.value))] if match),
                     None)
        if entry is None or func.docstring is None:
            return
        lines = func.docstring.value.splitlines()
        for index, line in enumerate(lines):
            if line.strip() == OPTIONS_MARKER:
                lines[index] = options_help(entry, indent=line[: len(line) - len(line.lstrip())])
        func.docstring.value = "\n".join(lines)
