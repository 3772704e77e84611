"""The public entry points' options are in their ``def`` lines, typed as ``plan/options.py`` says — so an editor's
static completion offers them — and every bad option, on every entry point, is a ``LaunchConfigError`` naming the
entry point, raised before any process starts.

(The table's own checks — the config file, the CLI's choices, the values each option allows — are in test_options.py.)
"""
from __future__ import annotations

import inspect
import typing

import psutil
import pytest

from notebook_accel import Session, launch_panel, notebook_launcher, start_launch

pytestmark = pytest.mark.timeout(120)

# name -> the function its calls run (a class's __init__)
ENTRY_POINTS = {
    "notebook_launcher": notebook_launcher,
    "start_launch": start_launch,
    "launch_panel": launch_panel,
    "Session": Session.__init__,
    "Session.run": Session.run,
    "Session.execute": Session.execute,
}


def test_the_table_names_every_entry_point():
    from notebook_accel.plan.options import ENTRY_POINTS as TABLE

    assert set(TABLE) == set(ENTRY_POINTS)


@pytest.mark.parametrize("entry", list(ENTRY_POINTS))
def test_each_entry_point_writes_its_options_in_its_def_as_the_table_says(entry):
    from notebook_accel.plan.entry_points import signature_drift

    assert signature_drift(entry, ENTRY_POINTS[entry]) == []
    parameters = inspect.signature(ENTRY_POINTS[entry]).parameters.values()
    assert not [parameter for parameter in parameters if parameter.kind is parameter.VAR_KEYWORD]  # no **options


# The entry points whose options become a launch's (the launch panel passes its own to start_launch, by name).
PLANNING = {"notebook_launcher": "LaunchOptions", "start_launch": "LaunchOptions", "Session": "LaunchOptions",
            "launch_panel": "dict"}


@pytest.mark.parametrize("entry", sorted(PLANNING))
def test_each_entry_point_passes_every_option_it_takes_by_name_into_one_object(entry):
    """A reader (or a tool) follows ``timeout`` from the ``def`` to where it acts: the body writes each option the
    entry point takes, by name, into the one object planning reads — not ``locals()``, not a name left out (it
    would silently take the default)."""
    import ast
    import textwrap

    from notebook_accel.plan.options import OPTIONS, options_for

    function = inspect.unwrap(ENTRY_POINTS[entry])
    tree = ast.parse(textwrap.dedent(inspect.getsource(function)))
    calls = [node for node in ast.walk(tree) if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)]
    assert not [call for call in calls if call.func.id == "locals"]
    made = [call for call in calls if call.func.id == PLANNING[entry]]
    assert len(made) == 1
    written = {keyword.arg: keyword.value.id if isinstance(keyword.value, ast.Name) else None
               for keyword in made[0].keywords}
    taken = [option.name for option in options_for(entry) if option.name in OPTIONS]
    assert written == {name: name for name in taken}


def _drifted(entry, change):
    """A stand-in for ``entry``'s function whose ``def`` differs by ``change(parameters, hints)``."""
    real = ENTRY_POINTS[entry]
    hints = typing.get_type_hints(real)
    parameters = [parameter.replace(annotation=hints.get(parameter.name, parameter.empty))
                  for parameter in inspect.signature(real).parameters.values()]

    def stand_in(*args, **kwargs):
        pass

    changed = change(parameters, hints)
    stand_in.__signature__ = inspect.Signature(changed, return_annotation=hints.get("return", inspect.Signature.empty))
    stand_in.__annotations__ = {parameter.name: parameter.annotation for parameter in changed
                                if parameter.annotation is not parameter.empty}
    if "return" in hints:
        stand_in.__annotations__["return"] = hints["return"]
    return stand_in


def _named(parameters, name):
    return next(index for index, parameter in enumerate(parameters) if parameter.name == name)


def _set(name, **change):
    def apply(parameters, hints):
        index = _named(parameters, name)
        return parameters[:index] + [parameters[index].replace(**change)] + parameters[index + 1:]
    return apply


def _drop(name):
    return lambda parameters, hints: [parameter for parameter in parameters if parameter.name != name]


def _swap(first, second):
    def apply(parameters, hints):
        parameters = list(parameters)
        one, two = _named(parameters, first), _named(parameters, second)
        parameters[one], parameters[two] = parameters[two], parameters[one]
        return parameters
    return apply


def _add(name):
    return lambda parameters, hints: parameters + [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY,
                                                                     default=None, annotation=typing.Optional[str])]


@pytest.mark.parametrize("entry, change", [
    ("notebook_launcher", _set("timeout", default=60.0)),
    ("notebook_launcher", _set("display", annotation=str)),
    ("notebook_launcher", _set("device", kind=inspect.Parameter.POSITIONAL_OR_KEYWORD)),
    ("start_launch", _drop("max_restarts")),
    ("Session", _swap("timeout", "display")),
    ("Session.run", _set("timeout", default=5.0)),
    ("launch_panel", _add("spot_instances")),  # a new option written in a def but not in the table
    ("Session", _add("node_rank")),      # in the table, but not for sessions
])
def test_a_def_that_drifts_from_the_table_is_caught(entry, change):
    from notebook_accel.plan.entry_points import signature_drift

    assert signature_drift(entry, _drifted(entry, change))


def test_the_literal_types_are_the_enums():
    from notebook_accel.plan.options import ALL_OPTIONS

    def literals(annotation):
        if typing.get_origin(annotation) is typing.Literal:
            return [annotation]
        return [found for member in typing.get_args(annotation) for found in literals(member)]

    with_choices = [option for option in ALL_OPTIONS if option.choices is not None]
    assert {option.name for option in with_choices} >= {"device", "mixed_precision", "start_method", "display",
                                                        "rdzv_backend"}
    for option in with_choices:  # the type editors offer is the Enum the checks use
        (literal,) = literals(option.annotation)
        assert typing.get_args(literal) == option.choices.values(), option.name


@pytest.mark.parametrize("entry", list(ENTRY_POINTS))
def test_each_entry_points_help_lists_its_options(entry):
    from notebook_accel.plan.options import options_for

    shown = " ".join(inspect.getdoc(ENTRY_POINTS[entry]).split())
    assert "{options}" not in shown
    for option in options_for(entry):
        assert f"{option.name}: {' '.join(option.help.split())}" in shown, option.name


# ----------------------------------------------------------------------------------------- editors

HEADER = """\
from notebook_accel import Session, launch_panel, notebook_launcher, start_launch

session = Session()
"""
CALLS = {"notebook_launcher": "notebook_launcher(print, ", "start_launch": "start_launch(print, ",
         "launch_panel": "launch_panel(print, ", "Session": "Session(", "Session.run": "session.run(print, ",
         "Session.execute": "session.execute('1', "}


def test_static_completion_offers_every_option_of_every_entry_point(tmp_path):
    """Jedi reads the source, as VS Code and other editors do (no import of ours, unlike IPython's Tab)."""
    jedi = pytest.importorskip("jedi")
    from notebook_accel.plan.options import options_for

    environment = jedi.InterpreterEnvironment()  # this Python's sys.path; the analysis is still of the source
    for entry, call in CALLS.items():
        script = jedi.Script(HEADER + call, path=str(tmp_path / "cell.py"), environment=environment)
        line, column = HEADER.count("\n") + 1, len(call)
        offered = {completion.name for completion in script.complete(line, column)}
        wanted = {f"{option.name}=" for option in options_for(entry)}
        assert wanted <= offered, (entry, sorted(wanted - offered))
        (signature,) = script.get_signatures(line, column)
        shown = signature.to_string()
        assert "**" not in shown, shown
        if entry == "notebook_launcher":  # the types and defaults are shown too
            assert "timeout: Optional[float]=None" in shown and 'display: DisplayName="auto"' in shown, shown


CHECKED = """\
from notebook_accel import Session, launch_panel, notebook_launcher, start_launch

def train() -> int:
    return 1

notebook_launcher(train, num_processes=2, mixed_precision="bf16", display="none", timeout=60.0)
session = Session(num_processes=2, device="cpu", recover_timeout=10)
session.run(train, return_all=True, display="none")
notebook_launcher(train, timout=5)                     # error: did you mean "timeout"?
notebook_launcher(train, display="bogus")              # error: not one of the Literal
start_launch(train, mixed_precision="fp64")            # error
launch_panel(train, return_all="yes")                  # error: not a bool
Session(node_rank=1)                                   # error: not an option of Session
session.run(train, display="html")                     # error
session.execute("1", timeout="10")                     # error: not a float
"""
# Our package is followed (py.typed); big third-party ones are not, to keep the check quick.
MYPY_CONFIG = """\
[mypy]
follow_imports = silent
ignore_missing_imports = True
[mypy-torch.*,numpy.*,ipywidgets.*,IPython.*,cloudpickle.*,yaml.*,tqdm.*,deepspeed.*,pandas.*,psutil.*]
follow_imports = skip
"""


@pytest.mark.timeout(300)
def test_a_type_checker_checks_the_options(tmp_path):
    pytest.importorskip("mypy")
    import subprocess
    import sys

    (tmp_path / "cell.py").write_text(CHECKED)
    (tmp_path / "mypy.ini").write_text(MYPY_CONFIG)
    checked = subprocess.run([sys.executable, "-m", "mypy", "--config-file", "mypy.ini", "--cache-dir",
                              str(tmp_path / "cache"), "--no-error-summary", "cell.py"], cwd=tmp_path,
                             capture_output=True, text=True, timeout=280)
    flagged = {int(line.split(":")[1]) for line in checked.stdout.splitlines() if ": error:" in line}
    wanted = {number for number, line in enumerate(CHECKED.splitlines(), 1) if "# error" in line}
    assert flagged == wanted, checked.stdout + checked.stderr
    assert 'did you mean "timeout"' in checked.stdout


def test_ipython_tab_completes_the_options_in_a_kernel():
    from jupyter_client.manager import start_new_kernel

    from scripts import script_env

    manager, client = start_new_kernel(kernel_name="python3", env=script_env())
    try:
        client.execute_interactive("from notebook_accel import Session, notebook_launcher", timeout=60)
        for code, wanted in [("Session(recover_t", "recover_timeout="), ("Session(num_processes=2, mixed_p",
                                                                         "mixed_precision="),
                             ("notebook_launcher(print, rdzv_e", "rdzv_endpoint=")]:
            reply = client.complete(code, len(code), reply=True, timeout=60)["content"]
            assert wanted in reply["matches"], (code, reply["matches"])
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)


# ----------------------------------------------------------------------------------------- bad options

def ok():
    return "ok"


# (keyword, value, is a wrong type): each is refused by every entry point, whether it takes the option or not
BAD_OPTIONS = [
    ("timeout", "10", True),            # wrong type
    ("timeout", -5, False),             # out of range
    ("return_all", "yes", True),
    ("master_addr", 5, True),
    ("use_port", "x", True),
    ("use_port", 70000, False),
    ("num_processes", 0, False),
    ("num_processes", 1.5, True),
    ("display", "bogus", False),        # not one of the choices
    ("display", 5, True),
    ("device", "tpu", False),
    ("mixed_precision", "fp64", False),
    ("recover_timeout", 0, False),
    ("max_restarts", -1, False),
    ("config", 5, True),
    ("colour", "red", True),            # no option of ours
    ("timout", 5, True),                # misspelled
    ("retrun_all", True, True),
]


@pytest.fixture
def session(request):
    """A warm one-rank session for the entry points of a session's runs (none for the others)."""
    if not request.node.callspec.params["entry"].startswith("Session."):
        yield None
        return
    with Session(num_processes=1, display="none") as warm:
        yield warm


def _call(entry, session, keyword, value):
    options = {keyword: value}
    if entry == "notebook_launcher":
        return notebook_launcher(ok, **{"display": "none", **options})
    if entry == "start_launch":
        return start_launch(ok, **{"display": "none", **options}).wait(60)
    if entry == "launch_panel":
        return launch_panel(ok, **options)
    if entry == "Session":
        with Session(**{"num_processes": 1, "display": "none", **options}):
            return None
    if entry == "Session.run":
        return session.run(ok, **options)
    return session.execute("1", **options)


@pytest.mark.parametrize("entry", list(ENTRY_POINTS))
def test_every_bad_option_is_a_launch_config_error_naming_the_entry_point(entry, session):
    from notebook_accel import LaunchConfigError
    from notebook_accel.plan.options import options_for

    taken = {option.name for option in options_for(entry)}
    children = set(psutil.Process().children(recursive=True))
    runs = session.runs if session is not None else 0
    for keyword, value, wrong_type in BAD_OPTIONS:
        with pytest.raises(LaunchConfigError) as refused:
            _call(entry, session, keyword, value)
        said = str(refused.value)
        assert said.startswith(f"{entry}: {keyword}") or said.startswith(
            f"{entry}: unexpected keyword argument {keyword!r}"), said
        # a keyword the entry point does not take is a TypeError, as Python's own
        assert isinstance(refused.value, TypeError) == (wrong_type or keyword not in taken), said
    assert set(psutil.Process().children(recursive=True)) <= children  # nothing started
    assert session is None or session.runs == runs  # nothing ran


@pytest.mark.parametrize("entry", list(ENTRY_POINTS))
def test_a_misspelled_option_names_the_option_meant(entry, session):
    from notebook_accel import LaunchConfigError

    with pytest.raises(LaunchConfigError, match=f"^{entry}: unexpected keyword argument 'timout'; "
                                                f"did you mean 'timeout'\\?$"):
        _call(entry, session, "timout", 5)


def test_an_option_of_another_entry_point_says_who_takes_it():
    from notebook_accel import LaunchConfigError

    with pytest.raises(LaunchConfigError, match="^Session: unexpected keyword argument 'node_rank': "
                                                "notebook_launcher, start_launch and launch_panel take it"):
        Session(node_rank=1)
    with pytest.raises(LaunchConfigError, match="'return_all': .*Session.run take it, Session does not"):
        Session(return_all=True)
    with pytest.raises(LaunchConfigError, match="^launch_panel: unexpected keyword argument 'display'"):
        launch_panel(ok, display="text")


def test_a_missing_argument_is_the_same_family():
    from notebook_accel import LaunchConfigError

    with pytest.raises(LaunchConfigError, match="^notebook_launcher: missing a required argument: 'function'"):
        notebook_launcher()
    with pytest.raises(TypeError, match="^start_launch: function must be callable"):
        start_launch("train")


def test_the_error_family_is_public():
    import notebook_accel
    from notebook_accel.errors import LaunchConfigError, LaunchConfigTypeError

    assert "LaunchConfigError" in notebook_accel.__all__ and "LaunchConfigTypeError" in notebook_accel.__all__
    assert notebook_accel.LaunchConfigError is LaunchConfigError
    assert issubclass(LaunchConfigTypeError, LaunchConfigError) and issubclass(LaunchConfigTypeError, TypeError)
    assert issubclass(LaunchConfigError, ValueError)  # as before


# ----------------------------------------------------------------------------------------- resolving

def test_what_the_caller_wrote_wins_over_the_saved_config_even_a_default(tmp_path):
    from notebook_accel.plan.entry_points import resolve_options

    saved = tmp_path / "saved.yaml"
    saved.write_text("num_processes: 2\nmixed_precision: bf16\nnum_nodes: 3\nrdzv_endpoint: 'node0:29500'\n")
    values = resolve_options("notebook_launcher", {"config": str(saved), "mixed_precision": "no"})
    assert (values["num_processes"], values["mixed_precision"], values["num_nodes"]) == (2, "no", 3)
    session = resolve_options("Session", {"config": str(saved)})  # a saved config's nodes are torch elastic's:
    assert session["num_processes"] == 2 and session["num_nodes"] == 1   # a session takes num_nodes (Slurm's) as given
    assert "rdzv_endpoint" not in session
    assert resolve_options("Session.run", {}) == {"timeout": None, "return_all": False, "display": None,
                                                  "pdb": None}
