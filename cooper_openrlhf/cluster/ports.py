"""Ports for several Ray nodes on one host (the launchers' CPU mode, the local Slurm cluster): a base that is free.

`python -m cooper_openrlhf.cluster.ports --job-id ID --nodes N` prints a RAY_PORT_BASE for the job.

With RAY_PORT_BASE set, launch_scripts/ray_cluster.sh gives node i the ports BASE + 100 i + 0..9 and its workers
BASE + 500 + 100 i + 0..99 (`node_ports` there; `ports_of` here is the same layout). The base starts from the job
id, so two jobs on one host usually differ, and moves on, a step of 1000 at a time, past any base with a port that
something on this host already listens on or holds: a slurmd, another job's Ray, a service. The check runs where
the batch script runs, the head node; on the local cluster every node is this host.
"""

import argparse
import socket
import sys

FIRST_BASE = 10_000   # below Linux's ephemeral ports (32768+), where outgoing connections would take ports
BASES = 20            # 10000, 11000, ..., 29000
STEP = 1000
MAX_NODES = 5         # node i's ports end at BASE + 500 + 100 i + 99 < BASE + STEP


def ports_of(base: int, nodes: int) -> list[int]:
    """Every port the nodes of one cluster take from `base` (ray_cluster.sh's layout)."""
    ports = []
    for i in range(nodes):
        ports += range(base + 100 * i, base + 100 * i + 10)
        ports += range(base + 500 + 100 * i, base + 500 + 100 * i + 100)
    return ports


def port_free(port: int, host: str = "0.0.0.0") -> bool:
    """Whether a listening socket could take `port` on `host` now (no one listens on it or holds it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def pick_port_base(job_id: int, nodes: int, port_free=port_free) -> int:
    """The first base, from the job id's own, whose ports are all free; ValueError naming what was tried."""
    if not 1 <= nodes <= MAX_NODES:
        raise ValueError(f"{nodes} nodes: one host's port layout holds 1 to {MAX_NODES} Ray nodes")
    first = job_id % BASES
    tried = []
    for k in range(BASES):
        base = FIRST_BASE + (first + k) % BASES * STEP
        busy = next((port for port in ports_of(base, nodes) if not port_free(port)), None)
        if busy is None:
            return base
        tried.append(f"{base} (port {busy} in use)")
    raise ValueError(f"no free port range for {nodes} Ray node(s) on this host; tried: {', '.join(tried)}; "
                     "set RAY_PORT_BASE")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cooper_openrlhf.cluster.ports",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--job-id", type=int, required=True, help="the Slurm job id (where the search starts)")
    parser.add_argument("--nodes", type=int, required=True, help="Ray nodes on this host")
    args = parser.parse_args(argv)
    try:
        print(pick_port_base(args.job_id, args.nodes))
    except ValueError as exc:
        print(f"ports: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
