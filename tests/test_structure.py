"""The house stays as it is built: no import cycles, and the rank side never loads the kernel side.

The package's imports are read from its source (every ``import`` statement, also those inside functions and
in ``if TYPE_CHECKING:`` blocks), so a cycle hidden behind a function-level import fails here too. A type-only
import never runs, but it is a design arrow all the same: a module that names another's types depends on it,
and two modules that name each other's are one module in two files. A spawn rank running a trivial function is
then asked which of our modules it loaded.
"""
from __future__ import annotations

import ast
import inspect
import os
from typing import Dict, Iterator, List, Set

import pytest

import notebook_accel
from notebook_accel import notebook_launcher

PACKAGE = "notebook_accel"
ROOT = os.path.dirname(os.path.abspath(notebook_accel.__file__))

# Imported by both sides and importing nothing of ours: exception classes, text formatting, and which kind of process
# this is (the package's import asks it in every process, ranks included).
LEAVES = {f"{PACKAGE}.errors", f"{PACKAGE}.formatting", f"{PACKAGE}.process_role"}
# Code that runs inside a rank: it may import only these packages (and the leaves).
RANK_SIDE = (f"{PACKAGE}.rank", f"{PACKAGE}.wire")
# What each folder may import of ours, beyond itself and the leaves (the arrows of the flow).
ALLOWED = {
    f"{PACKAGE}.rank": RANK_SIDE,
    f"{PACKAGE}.wire": (f"{PACKAGE}.wire",),
    f"{PACKAGE}.accelerator": (f"{PACKAGE}.accelerator",) + RANK_SIDE,
}


def module_files() -> Dict[str, str]:
    """Every module of the package (dotted name -> file)."""
    found = {}
    for folder, _, files in os.walk(ROOT):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                relative = os.path.relpath(path, os.path.dirname(ROOT))[:-3].replace(os.sep, ".")
                found[relative[: -len(".__init__")] if relative.endswith(".__init__") else relative] = path
    return found


MODULES = module_files()


def _import_nodes(tree: ast.AST) -> Iterator[ast.AST]:
    """Every import statement: at module level, in functions, in classes, under ``if TYPE_CHECKING:``."""
    return (node for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom)))


def imports_of(module: str) -> Set[str]:
    """Our modules that ``module`` imports (``from a import b`` counts as ``a.b`` when that is a module)."""
    path = MODULES[module]
    tree = ast.parse(open(path, encoding="utf-8").read(), path)
    package = module if path.endswith("__init__.py") else module.rpartition(".")[0]
    targets: Set[str] = set()
    for node in _import_nodes(tree):
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names if alias.name.split(".")[0] == PACKAGE)
            continue
        if node.level:
            parts = package.split(".")
            base = ".".join(parts[: len(parts) - node.level + 1] + ([node.module] if node.module else []))
        else:
            base = node.module or ""
        if base.split(".")[0] != PACKAGE:
            continue
        for alias in node.names:
            targets.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base)
    return {target for target in targets if target in MODULES and target != module}


GRAPH = {module: imports_of(module) for module in MODULES}


def cycles(graph: Dict[str, Set[str]]) -> List[List[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on_stack: Set[str] = set()
    found: List[List[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph[node]:
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def _inside(module: str, packages) -> bool:
    return any(module == package or module.startswith(package + ".") for package in packages)


def test_the_import_reader_sees_function_level_imports():
    # rank/run.py imports progress inside run_rank (a function): the graph must have that edge.
    assert f"{PACKAGE}.rank.progress" in GRAPH[f"{PACKAGE}.rank.run"]
    # backends/base.py names LaunchPlan's type only (under TYPE_CHECKING): still an arrow
    assert f"{PACKAGE}.plan.plan" in GRAPH[f"{PACKAGE}.backends.base"]
    # and a cycle of two is found as one
    assert cycles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]


def test_no_import_cycles():
    assert cycles(GRAPH) == []


@pytest.mark.parametrize("folder", sorted(ALLOWED))
def test_each_side_imports_only_what_it_may(folder):
    allowed = ALLOWED[folder]
    wrong = sorted(f"{module} -> {target}" for module, targets in GRAPH.items() if _inside(module, (folder,))
                   for target in targets if target not in LEAVES and not _inside(target, allowed))
    assert wrong == []


def test_leaves_import_nothing_of_ours():
    assert {leaf: sorted(GRAPH[leaf]) for leaf in LEAVES} == {leaf: [] for leaf in LEAVES}


def _third_party_imports(module: str) -> Set[str]:
    tree = ast.parse(open(MODULES[module], encoding="utf-8").read())
    names = set()
    for node in _import_nodes(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif not node.level and node.module:
            names.add(node.module.split(".")[0])
    return names


def test_views_never_import_torch_and_backends_never_ipywidgets():
    wrong = [module for module in MODULES if _inside(module, (f"{PACKAGE}.views",))
             and "torch" in _third_party_imports(module)]
    wrong += [module for module in MODULES if _inside(module, (f"{PACKAGE}.backends",))
              and "ipywidgets" in _third_party_imports(module)]
    assert wrong == []


def test_only_the_ray_backend_imports_ray():
    # Ray is an optional extra (``.[ray]``): the backend for ``cluster="ray"`` is the one place that may import it.
    importers = sorted(module for module in MODULES if "ray" in _third_party_imports(module))
    assert importers, "the ray backend imports ray somewhere"
    assert [module for module in importers if not _inside(module, (f"{PACKAGE}.backends.ray",))] == []


def test_nothing_imports_ray_unless_a_launch_asks_for_a_cluster():
    from scripts import run_script

    out = run_script("""
        import sys
        import notebook_accel
        from notebook_accel import Session, notebook_launcher, start_launch, launch_panel
        import notebook_accel.magics, notebook_accel.cli, notebook_accel.backends.ray
        def rank():
            import os
            return os.environ["RANK"]
        notebook_launcher(rank, num_processes=2, start_method="fork", display="none")
        with Session(num_processes=1, start_method="fork", display="none") as session:
            session.run(rank)
        print("ray imported:", "ray" in sys.modules)
    """, timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "ray imported: False" in out.stdout


def _notebook_function(source: str):
    """A function as a notebook cell defines it (in ``__main__``), so cloudpickle sends it by value and the
    rank does not import this test module (which imports the launcher)."""
    namespace = {"__name__": "__main__"}
    exec(source, namespace)
    return namespace["probe"]


def test_a_spawn_rank_loads_only_rank_side_and_shared_modules():
    probe = _notebook_function(
        "def probe():\n"
        "    import sys\n"
        "    return sorted(name for name in sys.modules if name.split('.')[0] == 'notebook_accel')\n")
    loaded = notebook_launcher(probe, num_processes=1, start_method="spawn", display="none")
    assert f"{PACKAGE}.rank.run" in loaded  # the probe really ran in a rank
    kernel_side = [name for name in loaded
                   if name != PACKAGE and name not in LEAVES and not _inside(name, RANK_SIDE)]
    assert kernel_side == []


def test_every_backend_in_the_table_imports_and_provides_its_contracts():
    # The table names backends by module and class as strings (so a CPU launch never imports the TPU code):
    # the parser above cannot see those imports, so resolve each one here. Each line's launch class is a Backend of
    # the line's name; its session class, where it has one, provides every method of the warm-ranks contract.
    from notebook_accel.backends import BACKENDS, Backend, WarmRanks, backend_class, warm_ranks_class

    assert {name: backend_class(name).name for name in BACKENDS} == {name: name for name in BACKENDS}
    assert all(issubclass(backend_class(name), Backend) for name in BACKENDS)
    for name, entry in BACKENDS.items():   # a line with a session class loads it; one without has none
        cls = warm_ranks_class(name)
        assert (cls is None) == (entry.session is None), name
        if cls is not None:
            assert issubclass(cls, WarmRanks) and not inspect.isabstract(cls), name
            assert cls.__name__ == entry.session[1], name


def test_every_site_has_one_line_in_the_backends_table():
    # Planning makes a site (plan.sites); the table says what runs it. A site without a line could be planned and
    # never run; two lines for one site would make the table's order a hidden rule.
    from notebook_accel.backends import BACKENDS
    from notebook_accel.plan import sites

    concrete = {cls for cls in vars(sites).values() if inspect.isclass(cls) and issubclass(cls, sites.Site)
                and "name" in vars(cls)}
    assert sorted(entry.site.__name__ for entry in BACKENDS.values()) == sorted(cls.__name__ for cls in concrete)
    assert {name: entry.site.name for name, entry in BACKENDS.items()} == {name: name for name in BACKENDS}


def _constructs(module: str, name: str) -> bool:
    tree = ast.parse(open(MODULES[module], encoding="utf-8").read())
    return any(isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == name
               for node in ast.walk(tree))


def test_the_restart_loop_is_written_once_and_each_cluster_is_decided_in_one_place():
    # Every backend that restarts the whole world runs base.run_attempts: only it announces an attempt. (A detached
    # job that Slurm requeued announces its new run as an attempt too: its driver, once per start of the batch job.)
    assert sorted(module for module in MODULES if _constructs(module, "AttemptStarted")) == [
        f"{PACKAGE}.backends.base", f"{PACKAGE}.detached.slurm_driver"]
    # Each cluster's site is made by its planner's module (the planners' row of that ``cluster``), nowhere else: read
    # from the two tables, the backends' line of that name and the planners' row.
    from notebook_accel.backends import BACKENDS
    from notebook_accel.plan.planners import PLANNERS

    clusters = [name for name in PLANNERS if name is not None]
    assert clusters and all(name in BACKENDS for name in clusters), "a cluster row without its backends' line"
    for name in clusters:
        site = BACKENDS[name].site.__name__
        assert [module for module in MODULES if _constructs(module, site)] == [type(PLANNERS[name]).__module__], name


def test_the_session_talks_to_its_ranks_through_the_contract_not_a_supervisor():
    # Session drives any backend's warm ranks through base.WarmRanks and backends.session's task functions (a
    # TaskEnd says what a task left); it neither imports the supervisor nor makes one.
    session = f"{PACKAGE}.session"
    assert f"{PACKAGE}.backends.supervisor" not in GRAPH[session]
    from notebook_accel.backends import BACKENDS

    warm_classes = [entry.session[1] for entry in BACKENDS.values() if entry.session is not None]
    assert warm_classes, "the backends' table names the classes that keep a session's ranks warm"
    for name in ["Supervisor", "SessionSupervisor", *warm_classes]:
        assert not _constructs(session, name), name
    source = open(MODULES[session], encoding="utf-8").read()
    assert ".supervisor" not in source and "SESSION_RANKS" not in source


def test_every_test_file_has_a_tier_and_every_tier_entry_a_file():
    """tests/tiers.py sorts every test file into a tier (conftest.py marks its tests): a new file left out would
    run in no tier of its own, an entry whose file is gone is a stale line."""
    import glob

    import tiers

    here = os.path.dirname(os.path.abspath(__file__))
    files = {os.path.basename(path) for path in glob.glob(os.path.join(here, "test_*.py"))}
    assert files - set(tiers.FILES) == set(), "test files without a tier in tests/tiers.py"
    assert set(tiers.FILES) - files - {"*.ipynb"} == set(), "tiers for test files that do not exist"
    assert set(tiers.FILES.values()) == set(tiers.TIERS)
    assert glob.glob(os.path.join(os.path.dirname(here), "notebooks", "*.ipynb"))  # the "*.ipynb" entry's files


@pytest.mark.parametrize("markexpr, tier, selected", [
    ("unit", "unit", True), ("unit", "ranks", False), ("not xla", "ranks", True), ("not xla", "xla", False),
    ("unit or kernel", "kernel", True), ("not (browser or xla)", "browser", False),
    ("unit and timeout", "ranks", None), ("", "unit", None), ("unit and", "unit", None),
])
def test_a_tier_expression_skips_only_files_it_cannot_select(markexpr, tier, selected):
    import tiers

    assert tiers.selects(markexpr, tier) is selected


def test_the_supervisor_is_extended_through_its_declared_points_not_by_overriding_its_steps():
    # A run on warm ranks differs from a launch in how it stops and when it ends: a StopStrategy and an
    # EndCondition given to the Supervisor. A subclass may configure it (and add accessors), never replace a step.
    from notebook_accel.backends.session import SessionSupervisor
    from notebook_accel.backends.supervisor import Supervisor

    assert SessionSupervisor in Supervisor.__subclasses__()
    overridden = {cls.__name__: sorted(name for name, value in vars(cls).items() if inspect.isfunction(value)
                                       and name != "__init__" and hasattr(Supervisor, name))
                  for cls in Supervisor.__subclasses__()}
    assert overridden == {cls.__name__: [] for cls in Supervisor.__subclasses__()}


def test_no_module_names_what_it_never_defined_or_imported():
    # Code that runs only on hardware this machine lacks (a CUDA tensor pulled to the GPU) can hide a NameError no
    # test reaches: rank/session.py once called CudaHandover without importing it. Pyflakes' undefined-name rules
    # (through ruff, in the test extra) read every module of the installed package.
    import shutil
    import subprocess

    ruff = shutil.which("ruff")
    if ruff is None:
        pytest.skip("ruff is not installed (the test extra installs it)")
    package = os.path.dirname(os.path.abspath(notebook_accel.__file__))
    done = subprocess.run([ruff, "check", "--no-cache", "--isolated", "--select", "F821,F822,F823",
                           "--output-format", "concise", package], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]


def test_the_accelerator_package_map_and_member_map_match_the_files_and_the_class():
    # accelerator/__init__.py lists every module of the package (a new module must say its job there), and the
    # Accelerator's docstring maps each public member to the module that defines it (its class there: the mixins).
    import re

    import notebook_accel.accelerator as package
    from notebook_accel.accelerator import Accelerator

    here = os.path.dirname(package.__file__)
    files = {name[:-3] for name in os.listdir(here) if name.endswith(".py") and name != "__init__.py"}
    listed = re.findall(r"^- :mod:`\.(\w+)`", package.__doc__, re.MULTILINE)
    assert sorted(listed) == sorted(files), "accelerator/__init__.py's package map and the package's modules differ"

    defined: Dict[str, Set[str]] = {}
    for name in dir(Accelerator):
        if not name.startswith("_"):
            owner = next(cls for cls in Accelerator.__mro__ if name in vars(cls))
            defined.setdefault(owner.__module__.rsplit(".", 1)[1], set()).add(name)
    mapped = {module: set(re.findall(r"``(\w+)``", names)) for module, names in
              re.findall(r"^\s*- :mod:`\.(\w+)` \(``\w+``\): (.*?)(?=^\s*- :mod:|^\s*$)", Accelerator.__doc__,
                         re.MULTILINE | re.DOTALL)}
    assert mapped == defined, "the Accelerator docstring's member map and the class differ"
