"""``notebook-accel launch [options] script.py args…`` / ``launch -m module args…``.

The script runs in every rank as ``__main__`` with its own ``sys.argv``, with the text display's labelled
output and progress lines, the same root cause and clean-up as a notebook launch. The exit code is the
root-cause rank's: its ``sys.exit(n)`` code, 1 for an exception, 128+N for death by signal N, 130 when
interrupted, 124 on timeout and 2 for bad options.

Options are ours (``--num-processes`` per node) or the spellings typed for ``accelerate launch``, with
accelerate's meaning (``--num_processes`` is the total over all machines, as there).
"""
from __future__ import annotations

import argparse
import sys
import traceback
from typing import Any, Callable, Dict

from ..errors import LaunchConfigError, LaunchError, LaunchTimeout
from ..plan.config import LaunchConfig, load_config
from ..plan.options import OPTIONS
from ..rank.tracebacks import without_launcher_frames
from ..wire.choices import Cluster, Device, Display, MixedPrecision, Placement, RendezvousBackend, StartMethod
from .sharding_flags import add_sharding_arguments, sharding_from_flags

# Launcher options the command line sets by their own name (others: display, rdzv_conf and accelerate's
# spellings and the sharding flags are translated below; master_addr, use_port, return_all, compile_cache make no
# sense for a script).
COMMAND_LINE_OPTIONS = tuple(name for name in OPTIONS if name not in (
    "display", "rdzv_conf", "master_addr", "use_port", "return_all", "compile_cache", "fsdp_config",
    "deepspeed_config", "detach"))   # detach: start_launch's alone (the command waits for its launch)

EXIT_BAD_OPTIONS = 2
EXIT_INTERRUPTED = 130
EXIT_TIMEOUT = 124


def add_launch_parser(commands) -> argparse.ArgumentParser:
    parser = commands.add_parser(
        "launch", help="run a script (or -m module) on every rank",
        description="Run a Python script, or a module with -m, as __main__ on every rank.",
        epilog="Multi-node: run the same command on every node with --node-rank 0..N-1 and the same "
               "--rdzv-endpoint. The rendezvous store is a TCP listener without authentication: use a "
               "trusted network.")
    add = parser.add_argument
    add("-m", "--module", action="store_true", help="the target is a module name, run as `python -m` does")
    add("--config-file", "--config_file", dest="config_file", default=None,
        help="YAML defaults (default: ours, else accelerate's default_config.yaml)")
    add("--num-processes", dest="num_processes", type=int, default=None, help="ranks per node")
    add("--num_processes", dest="total_processes", type=int, default=None,
        help="accelerate's spelling: ranks over all machines (divided by --num_machines)")
    add("--device", choices=Device.values(), default=None)
    add("--cpu", dest="use_cpu", action="store_true", help="accelerate's spelling of --device cpu")
    add("--mixed-precision", "--mixed_precision", dest="mixed_precision", choices=MixedPrecision.values(),
        default=None)
    add("--start-method", "--start_method", dest="start_method",
        choices=StartMethod.values(), default=None)
    add("--num-nodes", "--num_machines", "--nnodes", dest="num_nodes", type=int, default=None)
    add("--node-rank", "--machine_rank", "--node_rank", dest="node_rank", type=int, default=None)
    add("--rdzv-backend", "--rdzv_backend", dest="rdzv_backend", default=None,
        help=f"{', '.join(RendezvousBackend.values())} or any registered torch rendezvous backend "
             f"(default: {RendezvousBackend.STATIC})")
    add("--rdzv-endpoint", "--rdzv_endpoint", dest="rdzv_endpoint", default=None, metavar="HOST:PORT")
    add("--main_process_ip", "--main-process-ip", dest="main_process_ip", default=None)
    add("--main_process_port", "--main-process-port", dest="main_process_port", type=int, default=None)
    add("--rdzv-id", "--rdzv_id", dest="rdzv_id", default=None)
    add("--rdzv-conf", "--rdzv_conf", dest="rdzv_conf", default=None, metavar="KEY=VALUE,...",
        help="extra rendezvous settings, e.g. join_timeout=60")
    add("--max-restarts", "--max_restarts", dest="max_restarts", type=int, default=None)
    add("--monitor-interval", "--monitor_interval", dest="monitor_interval", type=float, default=None)
    add("--timeout", type=float, default=None, help="seconds before every rank is stopped")
    add("--pdb", action="store_true", default=None,
        help="post-mortem: a rank that raises opens pdb in the failing frame, in this terminal (breakpoint() "
             "works in every rank without it)")
    add("--cluster", choices=Cluster.values(), default=None,
        help="run the ranks on a Ray cluster (RAY_ADDRESS, else a local Ray), or as a Slurm job step (of this "
             "job, or of one asked for with --slurm): the script's text travels there; what it imports must be "
             "installed on the nodes. With slurm, --num-processes counts the ranks in all")
    add("--slurm", type=parse_slurm_request, default=None, metavar="OPTION=VALUE,...",
        help="with --cluster slurm outside an allocation: salloc's long options for the one to ask for, e.g. "
             "partition=gpu,time=01:00:00,account=lab (an OPTION alone is a flag)")
    add("--resources-per-rank", "--resources_per_rank", dest="resources_per_rank", type=parse_resources,
        default=None, metavar="NAME=AMOUNT,...", help="with --cluster: what Ray reserves per rank, e.g. CPU=4,GPU=1")
    add("--placement", choices=Placement.values(), default=None,
        help="with --cluster: Ray's placement group strategy (default PACK)")
    add("--display", choices=(Display.TEXT.value, Display.NONE.value), default=Display.TEXT.value)
    add_sharding_arguments(parser)
    add("target", metavar="script.py | module", help="the script to run (or module name with -m)")
    script_args = add("target_args", metavar="args", nargs=argparse.REMAINDER, help="arguments passed to the script")
    script_args.required = False  # none is fine: only a missing script is an error, named as such
    return parser


def launcher_options(options: argparse.Namespace) -> Dict[str, Any]:
    """Merge built-in defaults < the config file < the command line into ``notebook_launcher`` options."""
    config: LaunchConfig = load_config(options.config_file)
    merged = config.launcher_options()
    for name in COMMAND_LINE_OPTIONS:
        value = getattr(options, name)
        if value is not None:
            merged[name] = value
    if options.use_cpu:
        merged["device"] = "cpu"
    if options.main_process_ip or options.main_process_port:
        host, _, port = (merged.get("rdzv_endpoint") or "").rpartition(":")
        merged["rdzv_endpoint"] = (f"{options.main_process_ip or host or '127.0.0.1'}:"
                                   f"{options.main_process_port or port or 29500}")
    if options.total_processes is not None:
        nodes = merged.get("num_nodes", 1)
        if options.total_processes % nodes:
            raise LaunchConfigError(f"--num_processes={options.total_processes} (accelerate's total over "
                                    f"machines) does not divide evenly over --num_machines={nodes}")
        merged["num_processes"] = options.total_processes // nodes
    if options.rdzv_conf:
        merged["rdzv_conf"] = parse_rdzv_conf(options.rdzv_conf)
    merged.update(sharding_from_flags(options, merged.get("fsdp_config"), merged.get("deepspeed_config")))
    return merged


def parse_slurm_request(text: str) -> Dict[str, Any]:
    """``"partition=gpu,time=01:00:00,exclusive"`` → salloc's long options (``--slurm``); an option alone is a flag.

    >>> parse_slurm_request("partition=gpu, time=01:00:00,exclusive")
    {'partition': 'gpu', 'time': '01:00:00', 'exclusive': True}
    """
    request: Dict[str, Any] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, equals, value = item.partition("=")
        request[key.strip().lstrip("-")] = value.strip() if equals else True
    return request


def parse_resources(text: str) -> Dict[str, float]:
    """``"CPU=4,GPU=1"`` → ``{"CPU": 4.0, "GPU": 1.0}`` (``--resources-per-rank``).

    >>> parse_resources("CPU=4, GPU=0.5")
    {'CPU': 4.0, 'GPU': 0.5}
    """
    resources: Dict[str, float] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, sep, amount = item.partition("=")
        try:
            resources[name.strip()] = float(amount)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{item!r} is not NAME=AMOUNT (e.g. CPU=4,GPU=1)") from None
        if not sep or not name.strip():
            raise argparse.ArgumentTypeError(f"{item!r} is not NAME=AMOUNT (e.g. CPU=4,GPU=1)")
    return resources


def parse_rdzv_conf(text: str) -> Dict[str, str]:
    """``"join_timeout=60,read_timeout=30"`` → ``{"join_timeout": "60", "read_timeout": "30"}``."""
    conf: Dict[str, str] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise LaunchConfigError(f"--rdzv-conf: {item!r} is not KEY=VALUE")
        conf[key.strip()] = value.strip()
    return conf


def run_launch(options: argparse.Namespace) -> int:
    """Plan (errors before any process starts), run, and turn the outcome into an exit code."""
    from ..launcher import Launch
    from ..plan.plan import plan_launch
    from ..rank.script import check_target, run_main, run_source, script_label

    try:
        target = check_target(options.target, options.module)
        merged = launcher_options(options)
        function: Callable[..., None] = run_main
        args: tuple = (target, list(options.target_args), options.module)
        if merged.get("cluster") and not options.module:  # the ranks' machines have no such path: send its text
            with open(target, encoding="utf-8") as script:
                function, args = run_source, (target, script.read(), list(options.target_args))
        plan = plan_launch(function, args, None, merged.pop("num_processes", None), display=options.display,
                           allow_inline=False, **merged)
    except LaunchConfigError as err:  # every bad option, of any kind (plan.options checks them all)
        print(f"notebook-accel launch: {err}", file=sys.stderr)
        return EXIT_BAD_OPTIONS
    plan.function_name = script_label(options.target, options.target_args, options.module)
    try:
        Launch(plan).run()
    except BaseException as error:  # noqa: B036 - every ending becomes an exit code
        return report_error(error)
    return 0


def report_error(error: BaseException) -> int:
    """Print the root cause (with the rank's traceback) and return the exit code it stands for."""
    if isinstance(error, KeyboardInterrupt):
        print("notebook-accel launch: interrupted; every rank was stopped", file=sys.stderr)
        return EXIT_INTERRUPTED
    if isinstance(error, LaunchTimeout):
        print(f"notebook-accel launch: {error}", file=sys.stderr)
        return EXIT_TIMEOUT
    if isinstance(error, SystemExit):
        code = error.code
        if isinstance(code, int):
            return code
        print(code, file=sys.stderr)  # sys.exit("message"): Python prints it and exits with 1
        return 1
    if isinstance(error, LaunchError) and error.exitcode is not None and error.rank is not None:
        print(f"notebook-accel launch: {error}", file=sys.stderr)
        if error.exitcode < 0:
            return 128 + (-error.exitcode)
        return error.exitcode or 1
    # The rank's traceback (its __cause__) first, then the exception: the launcher's frames are folded away.
    error = without_launcher_frames(error)
    traceback.print_exception(type(error), error, error.__traceback__, file=sys.stderr)
    return 1

