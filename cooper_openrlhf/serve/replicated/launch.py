"""Start the replicated service: Ray (a local cluster, or the one `--ray-address` names), the learner and registry
actors, Serve's HTTP proxy on `--host:--port`, and the app (the ingress and `--replicas` scoring replicas).

`deploy` assumes Ray is up (tests call it on a cluster of their own) and returns what `shutdown` needs;
`serve_replicated` is `cli.serve --replicas N`: it starts Ray, deploys, serves until SIGTERM or SIGINT, then takes
the learner's last checkpoint, exports the RM and stops what it started (on a joined cluster: only its own app and
actors).
"""

import logging
import os
import signal
import threading
from dataclasses import dataclass

import ray

from cooper_openrlhf.serve.replicated import compat
from cooper_openrlhf.serve.replicated.ingress import ingress_class
from cooper_openrlhf.serve.replicated.learner_actor import LearnerActor
from cooper_openrlhf.serve.replicated.registry import GroupRegistry
from cooper_openrlhf.serve.replicated.scoring import Scorer

logger = logging.getLogger(__name__)

APP_NAME = "cooper-serve"
SCORER_NAME = "Scorer"
INGRESS_NAME = "Ingress"
# Calls a scoring replica takes at once: a batch being scored and the next one filling (`@serve.batch`); more wait
# in the ingress's router, which spreads them over the replicas by queue length.
SCORER_ONGOING_BATCHES = 2


@dataclass
class Deployed:
    registry: object  # the group registry's actor handle
    learner: object | None  # the learner actor's handle (None: a service without steps)
    version: int  # the RM version served at start


def deploy(args, config, *, token: str | None) -> Deployed:
    """The actors and the Serve app of `args` (`cli.serve`'s flags with `--replicas`); returns once every replica
    is up. Each part builds what it holds where it runs, with `serve/build.py`'s builders."""
    from ray import serve

    compat.install()
    keeps_groups = args.learn or config.groups_per_update > 0
    learner = None
    if keeps_groups:
        log_dir = os.path.join(args.state_dir, "logs") if args.state_dir else None
        learner = ray.remote(LearnerActor).options(
            max_restarts=-1, max_task_retries=0, num_cpus=1).remote(config, args, log_dir)
    # Ray starts the registry again if it dies (registry.py: it then starts itself and the callers resend).
    registry = ray.remote(GroupRegistry).options(num_cpus=0, max_concurrency=100_000, max_restarts=-1).remote(
        config, learner)
    started = registry.start.remote()  # with a learner: its start-up (DeepSpeed) runs while Serve deploys
    # Without steps the ingress serves the version the registry starts at; with them each place names its version.
    version = ray.get(started) if not keeps_groups else None
    tls = {"ssl_certfile": args.ssl_certfile, "ssl_keyfile": args.ssl_keyfile} if args.ssl_certfile else {}
    # Serve's proxy runs uvicorn (its TLS too); of the connection limits it takes the keep-alive timeout only
    serve.start(http_options={"host": args.host, "port": args.port, "keep_alive_timeout_s": args.keep_alive_s, **tls})
    scorer = serve.deployment(Scorer, name=SCORER_NAME, num_replicas=args.replicas,
                              max_ongoing_requests=SCORER_ONGOING_BATCHES * args.max_batch,
                              ray_actor_options={"num_cpus": 1}).bind(args, registry)
    ingress = serve.deployment(
        ingress_class(config, args, token, registry, keeps_groups, version, SCORER_NAME, APP_NAME),
        name=INGRESS_NAME, num_replicas=args.ingress_replicas, max_ongoing_requests=args.max_queued_samples,
        ray_actor_options={"num_cpus": 1})
    serve.run(ingress.bind(scorer), name=APP_NAME, route_prefix="/")
    return Deployed(registry, learner, ray.get(started))


def shutdown(deployed: Deployed) -> str | None:
    """The learner's last checkpoint and export (its folder, or None), then the app and the actors are removed."""
    from ray import serve

    try:
        exported = ray.get(deployed.registry.shutdown.remote())
    finally:
        serve.delete(APP_NAME)
        for actor in (deployed.registry, deployed.learner):
            if actor is not None:
                ray.kill(actor, no_restart=True)
    return exported


def serve_replicated(args, config, *, token: str | None) -> int:
    """`cli.serve --replicas N`: serve until SIGTERM or SIGINT, then checkpoint, export and stop (exit code)."""
    from cooper_openrlhf.runtime.ray_cluster import init_local_ray
    from cooper_openrlhf.runtime.ray_env import cooper_runtime_env

    started_here = args.ray_address is None
    if started_here:
        init_local_ray(namespace=APP_NAME, runtime_env=compat.RUNTIME_ENV)
    else:
        from cooper_openrlhf.runtime import cpu

        ray.init(address=args.ray_address, namespace=APP_NAME,
                 runtime_env={**cooper_runtime_env(on_cpu=not cpu.cuda_available()), **compat.RUNTIME_ENV})
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    deployed = None
    try:
        deployed = deploy(args, config, token=token)
        logger.info("serving RM version %d on Ray Serve: %d scoring replicas, %d ingress, learning %s, at "
                    "%s://%s:%d/get_reward", deployed.version, args.replicas, args.ingress_replicas,
                    "on" if args.learn else "off", "https" if args.ssl_certfile else "http", args.host, args.port)
        while not stop.wait(1.0):
            pass
        logger.info("stopping: the learner's last checkpoint, then the app")
        exported = shutdown(deployed)
        if exported:
            logger.info("exported the trained RM to %s", exported)
        deployed = None
    finally:
        if deployed is not None:
            from ray import serve

            serve.delete(APP_NAME)
        if started_here:
            from ray import serve

            serve.shutdown()
            ray.shutdown()
    return 0
