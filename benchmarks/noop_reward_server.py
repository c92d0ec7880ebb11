"""The HTTP ceiling: OpenRLHF's reward protocol over the same server stack as `cli.serve`, with no work behind it.

    python benchmarks/noop_reward_server.py --port PORT
    python benchmarks/noop_reward_server.py --port PORT --ray-serve   # the same app behind Ray Serve's proxy

uvicorn (its fastest loop and parser where installed, as `cli.serve` gets them) serving plain ASGI: each POST's
body is read and decoded as JSON, and a fixed reward is answered in the shape `/get_reward` answers. What it
serves a second with the benchmark's client is the bound the single-sample POST protocol itself puts on any
reward server on this machine, before any scoring (`serve_throughput.py` prints it beside the others).

With `--ray-serve` the same app is one ingress replica behind Ray Serve's HTTP proxy on a local Ray cluster of its
own, as `cli.serve --replicas` deploys its ingress: the bound Serve's front (proxy, router, one ingress) puts on the
replicated service on this machine, however many scoring replicas stand behind it.
"""

import argparse
import json

import uvicorn


async def app(scope, receive, send) -> None:
    if scope["type"] != "http":  # the lifespan: nothing to start
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
            await receive()
            await send({"type": "lifespan.shutdown.complete"})
        return
    chunks, more = [], True
    while more:
        message = await receive()
        chunks.append(message.get("body", b""))
        more = message.get("more_body", False)
    decoded = json.loads(b"".join(chunks) or b"{}")
    n = len(decoded.get("query", [])) if isinstance(decoded, dict) else 0
    body = json.dumps({"rewards": [0.5] * n, "scores": [0.5] * n,
                       "extra_logs": {"cooper/rule_correct": [1.0] * n}}, separators=(",", ":")).encode()
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


def serve_on_ray(port: int) -> None:
    """`app` as one ingress replica behind Serve's proxy on 127.0.0.1:`port`, until SIGTERM or SIGINT."""
    import signal
    import threading

    import ray
    from ray import serve

    from cooper_openrlhf.runtime.ray_cluster import init_local_ray
    from cooper_openrlhf.serve.replicated import compat

    compat.install()
    init_local_ray(namespace="noop-serve", runtime_env=compat.RUNTIME_ENV)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})

        def build():
            # Serve's replica registers its error handlers on the ingress app as on a Starlette app; this one
            # raises none, so it takes them and ignores them.
            app.add_exception_handler = lambda *args, **kwargs: None
            return app

        @serve.ingress(build)
        class Noop:
            pass

        serve.run(serve.deployment(Noop, name="Noop", max_ongoing_requests=4096,
                                   ray_actor_options={"num_cpus": 1}).bind(), name="noop", route_prefix="/")
        while not stop.wait(1.0):
            pass
    finally:
        serve.shutdown()
        ray.shutdown()


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--ray-serve", action="store_true", help="behind Ray Serve's proxy, as one ingress replica")
    args = p.parse_args()
    if args.ray_serve:
        serve_on_ray(args.port)
    else:
        uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning", access_log=False)
