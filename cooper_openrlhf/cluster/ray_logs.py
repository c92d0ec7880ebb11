"""Keep the complete output of one Ray cluster's workers on this node: `python -m cooper_openrlhf.cluster.ray_logs`.

The job's log gets an actor's lines only as Ray forwards them to the driver, asynchronously, and a signal that
ends the job (a requeue, scancel, the time limit) ends the forwarding: the last lines of an attempt can miss it.
Ray's own files hold them whole: `worker-*.out|err` (one pair per worker process) and `job-driver-*.log` in the
node's session log folder, under /tmp, node-local, gone with the node. ray_cluster.sh keeps them in two steps:

    ray_logs record --port P --to NODE_DIR   # once the cluster is up: which folder this cluster's raylet logs to
    ray_logs keep --dir NODE_DIR             # at exit: copy its workers' and drivers' files into NODE_DIR

`keep` reads the folder recorded at the start, so it works after Ray has ended (Slurm ends the job's processes
at a requeue), and only on the host that recorded it: elsewhere the same path is another node's folder.
"""

import argparse
import json
import os
import shutil
import sys
from pathlib import Path

import psutil

from cooper_openrlhf.cluster.ray_stop import cluster_processes

RECORD = "ray_log_dirs.json"
# What the workers and job drivers printed; the rest of the folder is Ray's own logs.
KEPT_PATTERNS = ("worker-*.out", "worker-*.err", "job-driver-*.log")


def log_dirs(port: int) -> list[str]:
    """The log folders (`--log_dir=`) of the cluster's raylets on this node; nodes on one host share one."""
    found = []
    for process in cluster_processes(port):
        try:
            cmdline = process.cmdline()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        for word in cmdline:
            folder = word.removeprefix("--log_dir=")
            if folder != word and folder not in found:
                found.append(folder)
    return found


def record(port: int, node_dir: Path) -> dict:
    entry = {"host": os.uname().nodename, "port": port, "log_dirs": log_dirs(port)}
    node_dir.mkdir(parents=True, exist_ok=True)
    (node_dir / RECORD).write_text(json.dumps(entry) + "\n")
    return entry


def keep(node_dir: Path) -> list[Path]:
    """Copy the recorded folders' worker and driver files into node_dir (again at every call: the newest wins)."""
    path = node_dir / RECORD
    if not path.is_file():
        return []
    entry = json.loads(path.read_text())
    if entry["host"] != os.uname().nodename:
        return []
    kept = []
    for folder in map(Path, entry["log_dirs"]):
        for pattern in KEPT_PATTERNS:
            for source in sorted(folder.glob(pattern)):
                kept.append(Path(shutil.copy2(source, node_dir / source.name)))
    return kept


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cooper_openrlhf.cluster.ray_logs",
                                     description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    record_parser = sub.add_parser("record", help="record which folder this node's raylet of the cluster logs to")
    record_parser.add_argument("--port", type=int, required=True, help="the cluster's GCS port")
    record_parser.add_argument("--to", type=Path, required=True, help="this node's folder of kept logs")
    keep_parser = sub.add_parser("keep", help="copy the workers' and job drivers' files recorded there into it")
    keep_parser.add_argument("--dir", type=Path, required=True, help="this node's folder of kept logs")
    args = parser.parse_args(argv)
    if args.command == "record":
        entry = record(args.port, args.to)
        where = ", ".join(entry["log_dirs"]) or "none found: nothing will be kept"
        print(f"ray_logs: the Ray cluster on port {args.port} logs to {where} on {entry['host']}", flush=True)
    else:
        kept = keep(args.dir)
        print(f"ray_logs: {len(kept)} worker and job-driver log file(s) kept in {args.dir} "
              f"(on {os.uname().nodename})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
