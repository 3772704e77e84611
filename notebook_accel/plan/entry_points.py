"""The public entry points' calls, checked one way: bound to the ``def``, options resolved, one error family.

Every entry point (``notebook_launcher``, ``start_launch``, ``launch_panel``, ``Session``, ``Session.run``,
``Session.execute``) writes its options out in its ``def`` line (``plan.options`` says which, typed) and is
decorated with ``@entry_point(name)``. A call is then:

1. bound to the signature: an unknown keyword names the option meant (``timout`` → "did you mean 'timeout'?") or
   the entry points that take it;
2. resolved by ``resolve_options``: what the caller wrote wins (even a value equal to the default — binding the
   call tells), then the saved config file's value (``config=True``), then the default; each value checked
   against the table;
3. run with those values: the body gets the options to use.

Any ``LaunchConfigError`` on the way — also those the body raises, e.g. ``fp16`` on a CPU — names the entry point
(``Session.run: display='bogus' is not one of ...``) and is raised from the user's call, without our frames.

>>> notebook_launcher(train, timout=5)             # doctest: +SKIP
LaunchConfigTypeError: notebook_launcher: unexpected keyword argument 'timout'; did you mean 'timeout'?
"""
from __future__ import annotations

import functools
import inspect
import typing
from typing import Any, Callable, Dict, List, Mapping, Tuple, TypeVar

from ..errors import LaunchConfigError, LaunchConfigTypeError, RemoteTraceback
from ..outcome.shown import show_from_the_call, shown_from_the_call
from ..rank.tracebacks import is_launcher_frame, skip_launcher_frames, without_launcher_frames
from .config import saved_options
from .options import (CONFIG_OPTION, ENTRY_POINTS, check_option, expected_parameters, options_for,
                      options_help, parameter_for, unexpected_keyword)

F = TypeVar("F", bound=Callable[..., Any])

OPTIONS_MARKER = "{options}"  # where a docstring gets its options' "Args" lines


def resolve_options(entry: str, given: Mapping[str, Any]) -> Dict[str, Any]:
    """The value of every option ``entry`` takes, each checked: the ``given`` one (what the caller wrote wins, even
    a value equal to the default), else the saved config's (when ``given`` has ``config``), else the default.

    >>> resolve_options("Session.run", {"display": "none"})
    {'timeout': None, 'return_all': False, 'display': 'none', 'pdb': None}
    >>> resolve_options("Session.run", {"display": "bogus"})
    Traceback (most recent call last):
    ...
    notebook_accel.errors.LaunchConfigError: display='bogus' is not one of 'auto', 'widgets', 'text', 'none'
    """
    taken = options_for(entry)
    for name in given:
        if name not in {option.name for option in taken}:
            raise LaunchConfigTypeError(unexpected_keyword(entry, name, [option.name for option in taken]))
    saved: Dict[str, Any] = {}
    if CONFIG_OPTION in taken:
        check_option(CONFIG_OPTION, given.get("config"))
        saved = saved_options(given.get("config"))
    values: Dict[str, Any] = {}
    for option in taken:
        annotation, default = parameter_for(entry, option)
        if option.name in given:
            value = given[option.name]
        else:   # the saved config's, where this entry point reads it (the options table says)
            value = saved.get(option.name, default) if option.from_saved_config(entry) else default
        check_option(option, value, annotation)
        values[option.name] = value
    return values


def entry_point(name: str) -> Callable[[F], F]:
    """Make the decorated function public entry point ``name`` (a key of ``plan.options.ENTRY_POINTS``): its calls
    are bound, resolved and checked as this module says, and its docstring's ``{options}`` line becomes the
    "Args" of its options. The function keeps its signature for ``inspect``, IPython and editors."""
    if name not in ENTRY_POINTS:
        raise ValueError(f"{name!r} is not an entry point of plan.options.ENTRY_POINTS")

    def decorate(function: F) -> F:
        signature = inspect.signature(function)
        option_names = frozenset(option.name for option in options_for(name))

        @functools.wraps(function)
        def call(*args: Any, **kwargs: Any) -> Any:
            __tracebackhide__ = True  # noqa: F841 -- IPython and pytest fold this frame: the user's call is the story
            try:
                bound = _bind(name, signature, args, kwargs)
                given = {key: value for key, value in bound.arguments.items() if key in option_names}
                bound.arguments.update(resolve_options(name, given))
                return function(*bound.args, **bound.kwargs)
            except LaunchConfigError as refused:  # the user's input, not our bug: the message, none of our frames
                if refused.entry_point is None:
                    refused.entry_point = name
                raise show_from_the_call(without_launcher_frames(refused)) from None
            except BaseException as error:
                raise _from_the_call(error)

        # The one notebook_accel line of a traceback reads "in notebook_launcher", not "in call".
        renamed = {"co_name": function.__name__}
        if hasattr(call.__code__, "co_qualname"):  # Python >= 3.11
            renamed["co_qualname"] = function.__qualname__
        call.__code__ = call.__code__.replace(**renamed)
        call.__doc__ = _with_options_help(function.__doc__ or "", name)
        return call  # type: ignore[return-value]

    return decorate


def _with_options_help(doc: str, entry: str) -> str:
    """``doc`` with its ``{options}`` line replaced by the "Args" lines of ``entry``'s options, indented as it is."""
    lines = doc.splitlines()
    for index, line in enumerate(lines):
        if line.strip() == OPTIONS_MARKER:
            lines[index] = options_help(entry, indent=line[: len(line) - len(line.lstrip())])
    return "\n".join(lines)


def _bind(entry: str, signature: inspect.Signature, args: Tuple[Any, ...],
          kwargs: Dict[str, Any]) -> inspect.BoundArguments:
    """The call bound to ``signature``, or Python's own complaint as a ``LaunchConfigTypeError`` (an unknown keyword
    with the option meant)."""
    keywords = [parameter.name for parameter in signature.parameters.values() if parameter.name != "self"
                and parameter.kind in (parameter.POSITIONAL_OR_KEYWORD, parameter.KEYWORD_ONLY)]
    for key in kwargs:
        if key not in keywords:
            raise LaunchConfigTypeError(unexpected_keyword(entry, key, keywords))
    try:
        return signature.bind(*args, **kwargs)
    except TypeError as refused:  # a missing or extra positional argument
        raise LaunchConfigTypeError(str(refused)) from None


def _from_the_call(error: BaseException) -> BaseException:
    """``error`` as the user's call raises it: when the user's code follows the entry point's own frames (an in-kernel
    rank's exception), those frames are dropped; the body's last frame, when it raised the error itself (a closed
    session), is kept: IPython shows it, with the line that says why. A rank's exception re-raised in the kernel,
    a launch's outcome and an interrupt keep none of the body's frames, and IPython shows them from the user's
    frame (``outcome.shown``). A bug of ours — only our frames — keeps them all."""
    below = error.__traceback__.tb_next if error.__traceback__ is not None else None  # past this frame's own
    # A rank's exception re-raised in the kernel carries its rank's traceback as its cause, and the launch's outcome
    # (marked by the body) and an interrupt are no bug of ours: the body's re-raise line adds nothing to them.
    # IPython shows them from the user's frames (``outcome.shown``); a script's traceback, from this frame.
    not_ours = (isinstance(error.__cause__, RemoteTraceback) or isinstance(error, KeyboardInterrupt)
                or shown_from_the_call(error))
    user, _ = skip_launcher_frames(below, keep_if_all=not not_ours)  # (re-raised, this frame comes first: once)
    if not_ours or (user is not None and not is_launcher_frame(user.tb_frame.f_code.co_filename)):
        show_from_the_call(error)
    return error.with_traceback(user)


def signature_drift(entry: str, function: Callable[..., Any]) -> List[str]:
    """How ``function``'s ``def`` differs from what the table gives entry point ``entry``: names, order, kinds,
    defaults and types of its options, its own parameters, a return type. Empty when it matches (a test asks)."""
    problems: List[str] = []
    parameters = inspect.signature(function).parameters
    own = ENTRY_POINTS[entry]
    declared_own = [parameter for parameter in parameters if parameter in own]
    if declared_own != list(own):
        problems.append(f"its own parameters are {declared_own}, the table says {list(own)}")
    hints = typing.get_type_hints(function)
    written = [parameter.replace(annotation=hints.get(parameter.name, parameter.empty))
               for parameter in parameters.values() if parameter.name not in own]
    expected = expected_parameters(entry)
    if written != expected:  # a Parameter compares its name, kind, default and type
        problems.append(f"its options drifted from plan/options.py: the table says\n  {_lines(expected)}\n"
                        f"the def writes\n  {_lines(written)}")
    if "return" not in hints:
        problems.append("it has no return type")
    return problems


def _lines(parameters: List[inspect.Parameter]) -> str:
    return "\n  ".join(f"{parameter}" + ("" if parameter.kind is parameter.KEYWORD_ONLY else
                                          f"  ({parameter.kind.description})") for parameter in parameters)
