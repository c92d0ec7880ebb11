"""`cli.serve`'s flags for the replicated service, and their checks (no Ray imported: the parser of one process
reads them too)."""


VERIFY_LANES_DEFAULT = 2  # cli.serve's --verify-lanes default; with --replicas any other value is refused
VERIFY_WORKERS_DEFAULT = 4  # cli.serve's --verify-workers default; the same


def add_replicated_flags(parser) -> None:
    g = parser.add_argument_group("more than one process (Ray Serve; docs/serve.md)")
    g.add_argument("--replicas", type=int, default=0,
                   help="scoring replicas on Ray Serve, behind one HTTP front, with one group registry and one "
                        "learner (0: everything in this one process)")
    g.add_argument("--ingress-replicas", type=int, default=1,
                   help="with --replicas: HTTP ingress replicas (auth, parsing, prompt splitting)")
    g.add_argument("--ray-address", default=None,
                   help="with --replicas: the Ray cluster to join (e.g. auto); default: start a local one")


def replicated_flag_problems(args) -> list[str]:
    problems = []
    if args.replicas < 0 or args.ingress_replicas < 1:
        problems.append("--replicas must be >= 0 and --ingress-replicas >= 1")
    if not args.replicas and args.ray_address:
        problems.append("--ray-address applies only with --replicas (one process starts no Ray)")
    if args.replicas and args.verify_lanes != VERIFY_LANES_DEFAULT:
        problems.append(f"--verify-lanes applies to one process; with --replicas each scoring replica has one "
                        f"verifier pool (scale the verification with --replicas), got --verify-lanes {args.verify_lanes}")
    if args.replicas and args.verify_workers != VERIFY_WORKERS_DEFAULT:
        problems.append(f"--verify-workers applies to one process; with --replicas each scoring replica has one "
                        f"verifier pool (scale the verification with --replicas), got --verify-workers "
                        f"{args.verify_workers}")
    return problems
