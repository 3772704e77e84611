"""Which address and interface each rank offers its peers, and the rank environment on nodes with distinct addresses:
decided from the node's routable address and this machine's own interfaces (``rank.network``), never from the host
name. No cluster: this machine's interfaces, and Ray's placement as plain values (the real-hosts tests run it all in
network namespaces: test_real_hosts.py)."""
from __future__ import annotations

import socket

import psutil
import pytest

from notebook_accel.backends.nodes.backend import network_env
from notebook_accel.backends.nodes.membership import endpoint_route, hosts_c10d_store
from notebook_accel.backends.ray.actors import RayRank
from notebook_accel.backends.ray.placement import RankPlace
from notebook_accel.backends.ray.world import RayWorld
from notebook_accel.plan.plan import plan_launch
from notebook_accel.rank.network import NETWORK_VARIABLE, RankNetwork, interface_of, rank_network, route_address


def an_interface_address():
    """An IPv4 address of one of this machine's interfaces other than loopback, with the interface's name."""
    for name, addresses in psutil.net_if_addrs().items():
        for entry in addresses:
            if entry.family == socket.AF_INET and not entry.address.startswith("127."):
                return name, entry.address
    pytest.skip("this machine has no IPv4 address but loopback")


def test_an_address_maps_to_the_interface_that_carries_it():
    name, address = an_interface_address()
    assert interface_of(address) == name
    assert interface_of("127.0.0.1") is not None            # lo
    assert interface_of("192.0.2.1") is None                # TEST-NET-1: nobody's here


def test_the_route_to_an_address_of_this_machine_starts_at_that_address():
    _, address = an_interface_address()
    assert route_address(address) == address
    assert route_address("127.0.0.1") == "127.0.0.1"


def test_gloo_and_tensorpipe_get_the_interface_unless_the_user_named_one():
    name, address = an_interface_address()
    chosen = rank_network(address, environ={})
    assert chosen.env == {"GLOO_SOCKET_IFNAME": name, "TP_SOCKET_IFNAME": name}
    assert chosen.describe() == f"{name} {address}"
    assert "NCCL_SOCKET_IFNAME" not in chosen.env           # NCCL picks its own interface
    users = rank_network(address, environ={"GLOO_SOCKET_IFNAME": "ib0"})
    assert users.env == {"TP_SOCKET_IFNAME": name}           # the user's value wins, and is not overwritten
    assert users.describe() == f"ib0 {address} (GLOO_SOCKET_IFNAME set by the user)"
    missing = rank_network("192.0.2.1", environ={})          # an address not here: nothing is guessed
    assert missing.env == {} and "no interface of this node has it" in missing.describe()


def test_a_node_of_several_offers_the_interface_on_its_route_to_master_addr():
    name, address = an_interface_address()
    env = network_env(address)
    assert env["GLOO_SOCKET_IFNAME"] == env["TP_SOCKET_IFNAME"] == name
    assert env[NETWORK_VARIABLE] == f"{name} {address}"


def test_this_node_hosts_the_c10d_store_when_the_endpoint_is_one_of_its_addresses_not_by_its_host_name():
    _, address = an_interface_address()
    assert hosts_c10d_store(f"{address}:29400") is True
    assert hosts_c10d_store("192.0.2.1:29400") is False
    # loopback: every node of this machine matches; torch's own rule lets the first that binds host it
    assert hosts_c10d_store("127.0.0.1:29400") is None and hosts_c10d_store("localhost:29400") is None
    # this machine's own name: loopback here too (/etc/hosts), so torch's rule, which matches the name, decides
    if any(info[4][0].startswith("127.") for info in socket.getaddrinfo(socket.gethostname(), None)):
        assert hosts_c10d_store(f"{socket.gethostname()}:29400") is None
    assert endpoint_route(f"{address}:29400") == address and endpoint_route(None) is None


def test_each_rank_on_nodes_with_distinct_addresses_gets_rank_0s_node_as_master_and_its_own_interface():
    """Two nodes, two ranks each; Ray placed rank 0 on the node at 10.77.0.2 (not the first in Ray's list, not the
    driver's). A MASTER_ADDR from any other node, or RANK/LOCAL_RANK/GROUP_RANK off by one on node 1, fails here."""
    plan = plan_launch(print, num_processes=4, cluster="ray")
    world = RayWorld(ray=None, plan=plan)
    nodes = {"b": ("10.77.0.2", "eth-b"), "a": ("10.77.0.1", "eth-a")}
    layout = [("b", 0), ("b", 1), ("a", 0), ("a", 1)]
    for rank, (node, local_rank) in enumerate(layout):
        ip, interface = nodes[node]
        place = RankPlace(rank=rank, bundle=3 - rank, node_id=f"node-{node}", node_ip=ip, node=node,
                          local_rank=local_rank, local_world_size=2, group_rank=rank // 2, group_world_size=2)
        world.ranks.append(RayRank(place, actor=None, pid=100 + rank,
                                   network=RankNetwork(ip, interface, env={"GLOO_SOCKET_IFNAME": interface,
                                                                           "TP_SOCKET_IFNAME": interface})))
    world.store_port = 29555
    envs = [world.rank_env(rank) for rank in world.ranks]
    assert [env["MASTER_ADDR"] for env in envs] == ["10.77.0.2"] * 4
    assert [env["MASTER_PORT"] for env in envs] == ["29555"] * 4
    assert [(env["RANK"], env["LOCAL_RANK"], env["GROUP_RANK"]) for env in envs] == [
        ("0", "0", "0"), ("1", "1", "0"), ("2", "0", "1"), ("3", "1", "1")]
    assert {env["WORLD_SIZE"] for env in envs} == {"4"} and {env["LOCAL_WORLD_SIZE"] for env in envs} == {"2"}
    assert [env["GLOO_SOCKET_IFNAME"] for env in envs] == ["eth-b", "eth-b", "eth-a", "eth-a"]
    assert [env["TP_SOCKET_IFNAME"] for env in envs] == ["eth-b", "eth-b", "eth-a", "eth-a"]
    # a node whose environment names the interface itself: the launcher sets nothing there
    world.ranks[3].network = RankNetwork("10.77.0.1", "eth-a", env={}, user_set={"GLOO_SOCKET_IFNAME": "ib0"})
    assert "GLOO_SOCKET_IFNAME" not in world.rank_env(world.ranks[3])
