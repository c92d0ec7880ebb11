"""The HTTP ceiling: OpenRLHF's reward protocol over the same server stack as `cli.serve`, with no work behind it.

    python benchmarks/noop_reward_server.py --port PORT

uvicorn (its fastest loop and parser where installed, as `cli.serve` gets them) serving plain ASGI: each POST's
body is read and decoded as JSON, and a fixed reward is answered in the shape `/get_reward` answers. What it
serves a second with the benchmark's client is the bound the single-sample POST protocol itself puts on any
reward server on this machine, before any scoring (`serve_throughput.py` prints it beside the others).
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


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--port", type=int, required=True)
    args = p.parse_args()
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning", access_log=False)
