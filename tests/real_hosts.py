"""Real hosts for the tests: network namespaces with distinct addresses on a bridge, as two machines on one LAN.

Each "host" is a network namespace with one veth interface on a bridge of its own and an address in 10.77.0.0/24;
the bridge's side in this (the root) namespace has one too, so a process here reaches the hosts as a laptop on the
same network would (Ray Client, ``ray://``). Host names are not touched: the machine's name resolves to loopback in
every namespace (``/etc/hosts``), as on Debian's default ``127.0.1.1 hostname`` and in many containers — which is
what breaks gloo across hosts when no interface is named. Each host's ``/etc/hosts`` also names every host's
address (a reverse lookup does not ask a DNS server no namespace reaches).

Only addresses inside the namespaces made here are used; no traffic leaves them. Several test runs on one machine
(xdist workers, two people's suites, two fixtures of one module) each take one /28 slice of 10.77.0.0/24, held by an
abstract Unix socket of this process (gone with it, no file left behind); the namespace, bridge and veth names carry
the pid and the slice.

Anything may be started in a host (``start``: a ``ray start --block``, a node's launch, later a ``slurmd``); ``close``
ends every process of the namespaces (the ones started here by their process group, then whatever
``ip netns pids`` still lists) and deletes the namespaces, the veths and the bridge, whatever happened before.

Example::

    with RealHosts(2) as hosts:
        server = hosts.start(0, [sys.executable, "-m", "http.server", "--bind", hosts.address(0), "8000"])
        url = f"http://{hosts.address(0)}:8000"
        hosts.run(1, [sys.executable, "-c", f"import urllib.request; urllib.request.urlopen({url!r})"])
"""
from __future__ import annotations

import ipaddress
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from typing import Dict, List, Optional, Sequence, Tuple

import psutil

SUBNET = "10.77.0"            # the only addresses the harness uses: 10.77.0.0/24
SLICE = 16                    # one run's slice: a /28 (13 hosts and the bridge's side)
SLICES = 256 // SLICE
# The pids at the top of the process trees a module's hosts keep up between its tests (``conftest.is_kept_helper``
# looks them up here, as ``ray_cluster.KEPT_TREES``); ``close`` ends them.
KEPT_TREES: set = set()


def unavailable() -> Optional[str]:
    """Why real hosts cannot be made here (for ``pytest.skip``), or None."""
    if os.geteuid() != 0:
        return "real hosts need root (network namespaces, a bridge, veth pairs)"
    if shutil.which("ip") is None:
        return "real hosts need iproute2's `ip` (apt-get install -y iproute2)"
    return None


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check, timeout=30)


class RealHosts:
    """``count`` hosts (network namespaces) on one bridge; see the module docstring."""

    def __init__(self, count: int) -> None:
        assert 1 <= count <= SLICE - 3
        self.count = count
        self.slice, self._lock = _take_slice()
        base = self.slice * SLICE
        self._addresses = [f"{SUBNET}.{base + 1 + index}" for index in range(count)]
        self.outside_address = f"{SUBNET}.{base + SLICE - 2}"   # the bridge's side, in this namespace
        self.prefix = 28
        tag = f"{os.getpid() % 100000}s{self.slice}"               # unique while held: the slice is this run's
        self.bridge = f"nab{tag}"                                 # interface names: at most 15 characters
        self.namespaces = [f"nahost{tag}-{index}" for index in range(count)]
        self._veths = [f"nav{tag}-{index}" for index in range(count)]
        self.interfaces = [f"nae{tag}-{index}" for index in range(count)]   # each host's own interface
        self._started: List[subprocess.Popen] = []
        self._made_namespaces: List[str] = []   # what ``close`` deletes: only what this instance made
        self._links: List[str] = []
        try:
            self._build()
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> "RealHosts":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def addresses(self) -> List[str]:
        """Every host's address, by host."""
        return list(self._addresses)

    def address(self, host: int) -> str:
        """Host ``host``'s address on the bridge."""
        return self._addresses[host]

    # ------------------------------------------------------------------------------------------------ build

    def _build(self) -> None:
        ip("link", "add", self.bridge, "type", "bridge")
        self._links.append(self.bridge)
        ip("addr", "add", f"{self.outside_address}/{self.prefix}", "dev", self.bridge)
        ip("link", "set", self.bridge, "up")
        for namespace, veth, inside, address in zip(self.namespaces, self._veths, self.interfaces, self._addresses):
            ip("netns", "add", namespace)
            self._made_namespaces.append(namespace)
            ip("link", "add", veth, "type", "veth", "peer", "name", inside)
            self._links.insert(0, veth)
            ip("link", "set", inside, "netns", namespace)
            ip("link", "set", veth, "master", self.bridge)
            ip("link", "set", veth, "up")
            ip("-n", namespace, "link", "set", "lo", "up")
            ip("-n", namespace, "addr", "add", f"{address}/{self.prefix}", "dev", inside)
            ip("-n", namespace, "link", "set", inside, "up")
        self._write_hosts_files()

    def _write_hosts_files(self) -> None:
        """Each host's ``/etc/hosts`` (``ip netns exec`` mounts ``/etc/netns/NAME/hosts`` over it): this machine's,
        so its own name still resolves to loopback, plus every host's address and name, and this machine's address
        on the bridge (each also IPv4-mapped, as IPv6 sockets see it). Without it a reverse lookup of a peer's
        address asks a DNS server no namespace can reach and fails at once (EAI_AGAIN), and torch's c10d said
        "[c10d] The hostname of the client socket cannot be retrieved. err=-3" in every launch across hosts; a real
        cluster's DNS or /etc/hosts names its nodes."""
        with open("/etc/hosts") as handle:
            machine = handle.read()
        named = list(zip(self._addresses, self.namespaces)) + [(self.outside_address, f"{self.bridge}-outside")]
        # each address also as IPv6 maps it: torch's store sockets are IPv6 ones, and their peer is ::ffff:10.77.0.x
        names = "".join(f"{address} {name}\n::ffff:{address} {name}\n" for address, name in named)
        for namespace in self._made_namespaces:
            os.makedirs(f"/etc/netns/{namespace}", exist_ok=True)
            with open(f"/etc/netns/{namespace}/hosts", "w") as handle:
                handle.write(machine.rstrip("\n") + "\n" + names)

    # ------------------------------------------------------------------------------------------------ run

    def command(self, host: int, argv: Sequence[str]) -> List[str]:
        """``argv`` run in host ``host``'s namespace."""
        return ["ip", "netns", "exec", self.namespaces[host], *argv]

    def start(self, host: int, argv: Sequence[str], env: Optional[Dict[str, str]] = None, keep: bool = False,
              **popen_options) -> subprocess.Popen:
        """Start ``argv`` in host ``host`` (its own process group); ``close`` ends it. ``keep``: it stays up between
        tests (a node of the module's cluster), so the suite's per-test leftover check leaves its tree alone."""
        process = subprocess.Popen(self.command(host, argv), env=env, start_new_session=True, **popen_options)
        self._started.append(process)
        if keep:
            KEPT_TREES.add(process.pid)
        return process

    def run(self, host: int, argv: Sequence[str], env: Optional[Dict[str, str]] = None, timeout: float = 120,
            ) -> subprocess.CompletedProcess:
        """Run ``argv`` in host ``host`` to its end; its output as text. A run past ``timeout`` is killed (its
        process group) and raises ``subprocess.TimeoutExpired`` with what it wrote."""
        process = self.start(host, argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            out, err = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            _end_group(process)
            out, err = process.communicate()
            raise subprocess.TimeoutExpired(process.args, timeout, output=out, stderr=err) from None
        finally:
            self._started.remove(process)
        return subprocess.CompletedProcess(process.args, process.returncode, out, err)

    def stop(self, processes: Sequence[subprocess.Popen], since: Sequence[int], grace: float = 10.0) -> None:
        """End ``processes`` (started here) before the hosts end, and every process of the namespaces that was not
        there at ``since`` (``pids()`` taken before they started: what they started and left their groups, as Ray's
        nodes do), so that hosts a run shares hold only what their next user starts; an ``AssertionError`` if one
        outlived that. Their groups are signalled together and given ``grace`` seconds together (SIGTERM, then
        SIGKILL), not one after the other."""
        _end_groups(processes, grace=grace)
        for process in processes:
            self._started.remove(process)
            KEPT_TREES.discard(process.pid)
        stubborn = self._kill_namespace_processes(spare=set(since))
        assert not stubborn, f"processes of the real hosts outlived their stop: {stubborn}"

    def pids(self) -> List[int]:
        """Every process in the hosts' namespaces now."""
        found: List[int] = []
        for namespace in self._made_namespaces:
            listed = ip("netns", "pids", namespace, check=False)
            found += [int(pid) for pid in listed.stdout.split()]
        return found

    # ------------------------------------------------------------------------------------------------ end

    def close(self) -> None:
        """End every process in the hosts, delete the namespaces, the veths and the bridge (idempotent); an
        ``AssertionError`` if a process of the namespaces outlived that."""
        for process in self._started:
            _end_group(process, grace=10.0)
        stubborn = self._kill_namespace_processes()
        KEPT_TREES.difference_update(process.pid for process in self._started)  # only this instance's: a module
        self._started = []                                                       # may hold two
        for namespace in self._made_namespaces:
            ip("netns", "del", namespace, check=False)          # takes its veth end, and so the pair, with it
            shutil.rmtree(f"/etc/netns/{namespace}", ignore_errors=True)
        for link in self._links:                                # veths left outside (a build cut short), the bridge
            if ip("link", "show", link, check=False).returncode == 0:
                ip("link", "del", link, check=False)
        self._made_namespaces, self._links = [], []
        if self._lock is not None:
            self._lock.close()
            self._lock = None
        assert not stubborn, f"processes of the real hosts outlived their end: {stubborn}"

    def _kill_namespace_processes(self, spare: frozenset = frozenset()) -> List[str]:
        """SIGKILL whatever still runs in the namespaces (a daemon that left its process group), but ``spare``;
        what survives."""
        pids = [pid for pid in self.pids() if pid != os.getpid() and pid not in spare]   # (this one never enters one)
        processes = []
        for pid in pids:
            try:
                processes.append(psutil.Process(pid))
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, psutil.Error):
                pass
        _, alive = psutil.wait_procs(processes, timeout=10)
        return [f"{process.pid} {_command_line(process)}" for process in alive
                if process.status() != psutil.STATUS_ZOMBIE]


def _take_slice() -> Tuple[int, socket.socket]:
    """One /28 of 10.77.0.0/24 for this run, held by binding an abstract Unix socket named after it (free again when
    this process ends, however it ends), and made ready for use (``_prepare_slice``)."""
    for index in range(SLICES - 1, -1, -1):   # from the top: .224/28 first, away from people's hand-made .1, .2
        lock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            lock.bind(f"\0notebook_accel-real-hosts-{index}")
        except OSError:
            lock.close()
            continue
        if _prepare_slice(index):
            return index, lock
        lock.close()
    raise RuntimeError("every /28 of 10.77.0.0/24 is taken by another test run of this machine, or its addresses are "
                       "in use (`ip -4 addr`, `ip -4 route`)")


def _prepare_slice(index: int) -> bool:
    """With slice ``index``'s lock held: clear what a dead run left of it; whether it is then free to use (False: an
    address or route of the slice belongs to something else of this machine)."""
    _clear_leftovers(index)
    return not _slice_in_use(index)


def _clear_leftovers(index: int) -> None:
    """Delete the namespaces, links and /etc/netns files of slice ``index`` that a run killed before its ``close``
    left (a SIGKILLed pytest, a session's end): network namespaces and links outlive their maker. Only called with the
    slice's lock held, so no live run owns what carries the slice's names. Left in place, the dead run's bridge keeps
    the slice's addresses and its route: a new run's bridge gets the same addresses, the kernel still routes the
    /28 to the dead bridge, and nothing reaches the new hosts (CI saw every slurmd fail to reach its controller)."""
    namespace = re.compile(rf"^nahost\d+s{index}-\d+$")
    link = re.compile(rf"^na[bv]\d+s{index}(-\d+)?$")
    for name in ip("netns", "list", check=False).stdout.split():
        if namespace.match(name):
            for pid in ip("netns", "pids", name, check=False).stdout.split():   # a dead run's daemons
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except ProcessLookupError:
                    pass
            ip("netns", "del", name, check=False)
            shutil.rmtree(f"/etc/netns/{name}", ignore_errors=True)
    for line in ip("-o", "link", "show", check=False).stdout.splitlines():
        name = line.split(":", 2)[1].strip().split("@")[0] if line.count(":") >= 2 else ""
        if link.match(name):
            ip("link", "del", name, check=False)


def _slice_in_use(index: int) -> bool:
    """Whether an address of slice ``index`` is on an interface of this namespace, or routed (someone else's)."""
    block = ipaddress.ip_network(f"{SUBNET}.{index * SLICE}/28")
    for line in ip("-o", "-4", "addr", "show", check=False).stdout.splitlines():
        fields = line.split()
        if "inet" in fields and ipaddress.ip_interface(fields[fields.index("inet") + 1]).ip in block:
            return True
    routes = ip("-4", "route", "show", "to", "match", str(block[1]), check=False).stdout
    # a route as narrow as the slice's own (or narrower) would take its traffic; a wider one loses to the bridge's
    return any(line.split()[0] != "default" and ipaddress.ip_network(line.split()[0], strict=False).prefixlen >= 28
               for line in routes.splitlines() if line.strip())


def _end_group(process: subprocess.Popen, grace: float = 5.0) -> None:
    """SIGTERM to the process's group, SIGKILL after ``grace`` s; reaped."""
    _end_groups([process], grace)


def _end_groups(processes: Sequence[subprocess.Popen], grace: float = 5.0) -> None:
    """SIGTERM to each process's group, SIGKILL after ``grace`` s to the groups still alive; each reaped."""
    left = list(processes)
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 10.0)):
        for process in left:
            try:
                os.killpg(process.pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
        deadline = time.monotonic() + wait   # the groups' other members may outlive their leaders
        while time.monotonic() < deadline and any(process.poll() is None or _group_alive(process.pid)
                                                  for process in left):
            time.sleep(0.1)
        left = [process for process in left if process.poll() is None or _group_alive(process.pid)]
        if not left:
            return
    for process in left:   # still there 10 s after SIGKILL (stuck in the kernel): reaped if it ends in a second
        try:
            process.wait(1.0)
        except subprocess.TimeoutExpired:
            pass


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def _command_line(process: psutil.Process) -> str:
    try:
        return " ".join(process.cmdline())[:300]
    except psutil.Error:
        return "?"
