"""Stop one Ray cluster's processes on this node, and nothing else: `python -m cooper_openrlhf.cluster.ray_stop --port P`.

`ray stop` ends every Ray process of the user on the machine: on a shared node (a cluster with
OverSubscribe, or two "nodes" of scripts/local_slurm.sh on one host) it would end other jobs' Ray too. This
stops only the processes of the cluster whose GCS listens on port P: the GCS itself (`--gcs_server_port=P`),
`ray start ... --port=P` / `--address=HOST:P`, and everything pointed at it (raylet, dashboard, agents, log
monitor, workers: `--gcs-address=HOST:P`). SIGTERM, then SIGKILL after --grace seconds. Prints what it stopped.
"""

import argparse
import os
import re
import sys

import psutil


def belongs_to(cmdline: list[str], port: int) -> bool:
    """Whether a process's command line names the cluster whose GCS port is `port`."""
    flagged = re.compile(rf"^--(gcs[-_]address|address)=\S+:{port}$")
    bare = re.compile(rf"^\S+:{port}$")
    for index, word in enumerate(cmdline):
        if word in (f"--gcs_server_port={port}", f"--port={port}") or flagged.match(word):
            return True
        if index and cmdline[index - 1] in ("--gcs-address", "--gcs_address", "--address") and bare.match(word):
            return True
    return False


def cluster_processes(port: int) -> list[psutil.Process]:
    me = {os.getpid(), *(p.pid for p in psutil.Process().parents())}
    found = []
    for process in psutil.process_iter(["pid", "uids", "cmdline"]):
        try:
            if process.pid in me or process.info["uids"].real != os.getuid():
                continue
            if belongs_to(process.info["cmdline"] or [], port):
                found.append(process)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


def stop_cluster(port: int, grace_s: float = 10.0) -> list[int]:
    """SIGTERM this cluster's processes, SIGKILL what is left after grace_s; returns the pids stopped."""
    processes = cluster_processes(port)
    for process in processes:
        try:
            process.terminate()
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(processes, timeout=grace_s)
    for process in alive:
        try:
            process.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(alive, timeout=5)
    return [p.pid for p in processes]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cooper_openrlhf.cluster.ray_stop", description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, required=True, help="the cluster's GCS port (ray start --head --port)")
    parser.add_argument("--grace", type=float, default=10.0, help="seconds between SIGTERM and SIGKILL")
    args = parser.parse_args(argv)
    stopped = stop_cluster(args.port, args.grace)
    print(f"ray_stop: {len(stopped)} process(es) of the Ray cluster on port {args.port} stopped on "
          f"{os.uname().nodename}" + (f": {stopped}" if stopped else ""), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
