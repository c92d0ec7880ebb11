"""The reward service's HTTP face (FastAPI): OpenRLHF's `/get_reward`, `/metrics`, `/health`; auth and limits.

OpenRLHF's client (0.11.2) gives a sample 5 tries, 1 s apart, and then leaves its reward None, which crashes the
trainer: every non-2xx is a failed try. So the service waits rather than refuses, and refuses only what waiting
cannot fix or what no trainer sends.
- Auth: with a token configured every route but `/healthz` needs it, as `Authorization: Bearer TOKEN` or, because
  OpenRLHF's client can only be given a URL, as `?token=TOKEN`; compared in constant time (`hmac.compare_digest`);
  401 without it. `cli.serve` refuses to listen beyond loopback without a token. `/healthz` is a load balancer's
  liveness probe: it says only that the process is up (`/health`, with the token, says how it is doing).
- Bad input: a body over `max_body_bytes` is 413 (read no further); a body that has not all arrived within
  `body_timeout_s` 408; a malformed body 400 naming the field, JSON nested deeper than the parser goes included; a
  sample whose text is not encodable or over `max_sample_chars` 400 naming the sample and field
  (`serve/validation.py`), before it joins a batch; more samples than `max_request_samples` 413. A body over
  `INLINE_BODY_BYTES` is decoded, checked and split into questions in a worker thread: a 1 M-character prompt
  does not hold the event loop.
- Connections (`server_options`, uvicorn's): at most `max_connections` at once (then 503, uvicorn's
  `limit_concurrency`); idle keep-alive connections closed after `keep_alive_s`; a connection that has not sent a
  whole request head within `header_timeout_s` of opening or of its last answer closed (uvicorn has no such
  timeout of its own: a socket that never finishes its headers would hold a file descriptor for ever).
- Load: a request that finds the scorer busy waits its turn; one not answered within `request_timeout_s` is 504
  (below the 180 s after which OpenRLHF's client gives up). Only past the memory bound on work in flight
  (`max_queued_samples`, `max_queued_bytes`: `serve/admission.py`, bytes counted as they arrive) is a new request
  refused, 503 with `Retry-After`.
- Every answer is a real score: an error inside scoring is a 500 with its message (only the samples that fail on
  their own fail: `serve/batcher.py`), never a 0; a non-finite RM score is its request's 500.
- `/metrics` stays the same size whatever is requested: the request counter's route label is one of the app's
  routes or "other".
"""

import asyncio
import hmac
import json
import logging
import time
from urllib.parse import parse_qsl

from fastapi import FastAPI
from fastapi.responses import Response

from cooper_openrlhf.serve.admission import Admission, Overloaded
from cooper_openrlhf.serve.contract import RewardHost
from cooper_openrlhf.serve.metrics import CONTENT_TYPE_LATEST
from cooper_openrlhf.serve.protocol import PromptSplitter, RequestError, build_response, parse_request
from cooper_openrlhf.serve.validation import DEFAULT_MAX_SAMPLE_CHARS, check_sample_texts

logger = logging.getLogger(__name__)

ROUTES = ("/get_reward", "/metrics", "/health", "/healthz")
LIVENESS = "/healthz"  # no token: it says only that the process is up
DEFAULT_MAX_QUEUED_SAMPLES = 1 << 16  # 4x a rollout batch of 1,024 prompts x 16 samples (serve/admission.py)
DEFAULT_MAX_QUEUED_BYTES = 1 << 30
DEFAULT_BODY_TIMEOUT_S = 60.0  # a 4 MiB body (--max-body-bytes) at 1 Mbit/s takes ~34 s
DEFAULT_HEADER_TIMEOUT_S = 10.0
DEFAULT_KEEP_ALIVE_S = 5  # uvicorn's own default, said explicitly
DEFAULT_MAX_CONNECTIONS = 16384  # a rollout batch of 1,024 prompts x 16 samples sent at once, one connection each
INLINE_BODY_BYTES = 64 << 10  # bodies up to this are decoded and split on the event loop (microseconds)


def route_label(path: str) -> str:
    """The request counter's route label: a known route, else "other" (a label per path would grow /metrics with
    every path anyone tries)."""
    return path if path in ROUTES else "other"


def token_matches(expected: str | None, scope: dict) -> bool:
    """Whether the ASGI request `scope` carries `expected` (no token configured: always)."""
    if not expected:
        return True
    header = next((value.decode("latin-1") for name, value in scope["headers"] if name == b"authorization"), "")
    if header[:7].lower() == "bearer ":
        given = header[7:]
    else:
        tokens = [value for name, value in parse_qsl(scope.get("query_string", b"").decode("latin-1"),
                                                     keep_blank_values=True) if name == "token"]
        given = tokens[-1] if tokens else ""
    return hmac.compare_digest(given.encode(), expected.encode())


async def read_body(scope: dict, receive, limit: int, hold=None, timeout_s: float | None = None) -> bytes:
    """The body, or RequestError(413) as soon as it passes `limit` bytes (a lying Content-Length included), or
    RequestError(408) when it has not all arrived within `timeout_s`. hold(n): called with each chunk's size as it
    arrives (the memory bound's count: `serve/admission.py`), before the chunk is kept."""
    declared = next((value for name, value in scope["headers"] if name == b"content-length"), None)
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise RequestError(f"body of {declared.decode()} bytes; at most {limit} (--max-body-bytes)", status=413)
    chunks, size = [], 0
    deadline = asyncio.get_running_loop().time() + timeout_s if timeout_s is not None else None
    while True:
        try:
            async with asyncio.timeout_at(deadline):
                message = await receive()
        except TimeoutError:
            raise RequestError(f"the body did not arrive within {timeout_s:g}s (--body-timeout-s; {size} bytes "
                               f"came)", status=408) from None
        if message["type"] == "http.disconnect":
            raise ClientLeft()
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise RequestError(f"body over {limit} bytes (--max-body-bytes)", status=413)
        if hold is not None and chunk:
            hold(len(chunk))
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def decode_json(body: bytes):
    """The decoded body; RequestError(400) for what is not JSON, and for JSON nested deeper than the parser goes
    (Python's decoder raises RecursionError there, which is not a ValueError)."""
    try:
        return json.loads(body)
    except ValueError as exc:
        raise RequestError(f"the body is not JSON: {exc}") from None
    except RecursionError:
        raise RequestError("the body is JSON nested too deeply to decode; OpenRLHF sends an object of three lists "
                           "of strings") from None


class ClientLeft(Exception):
    """The client closed the connection before its body arrived: nobody to answer."""


async def send_json(send, status: int, payload: dict, headers: dict | None = None) -> None:
    """One JSON answer, as Starlette's JSONResponse renders it (compact, UTF-8, NaN refused)."""
    body = json.dumps(payload, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode()
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    raw += [(k.lower().encode("latin-1"), str(v).encode("latin-1")) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})


def build_app(service: RewardHost, splitter: PromptSplitter, *, token: str | None = None, max_body_bytes: int = 4 << 20,
              max_request_samples: int = 256, request_timeout_s: float = 150.0,
              max_queued_samples: int = DEFAULT_MAX_QUEUED_SAMPLES, max_queued_bytes: int = DEFAULT_MAX_QUEUED_BYTES,
              max_sample_chars: int = DEFAULT_MAX_SAMPLE_CHARS, body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S,
              on_shutdown=None):
    """The ASGI app around a service (`serve.contract.RewardHost`: one process, or the replicated service's ingress),
    started and stopped (checkpointed) by its lifespan.

    `/get_reward` is served by plain ASGI code, the token checked there too; FastAPI serves the rest (`/metrics`,
    `/health`, the lifespan) behind the same token check. The hot route skips FastAPI's middleware, routing and
    response layers, which cost several times the route's own work per request on a CPU.

    on_shutdown: called after the service stopped (the CLI exports the trained RM and closes the verifier pools
    there: uvicorn re-raises SIGTERM once the app is down, so nothing after `uvicorn.run` would run)."""
    from contextlib import asynccontextmanager

    @asynccontextmanager
    async def lifespan(app):
        await service.start()
        try:
            yield
        finally:
            await service.stop()
            if on_shutdown is not None:
                on_shutdown()

    rest = FastAPI(title="cooper-openrlhf reward service", lifespan=lifespan)
    log = service.log
    admission = Admission(max_queued_samples, max_queued_bytes)

    async def gauges() -> dict[str, float]:
        values = await service.gauges()
        return {**values, "in_flight_samples": float(admission.samples),
                "in_flight_bytes": float(admission.bytes), "refused_over_memory_bound": float(admission.refused)}

    @rest.get("/metrics")
    async def metrics():
        return Response(log.exposition(await gauges()), media_type=CONTENT_TYPE_LATEST)

    @rest.get("/health")
    async def health():
        values = await gauges()  # first: a remote service refreshes what it says of itself here
        return {"status": "ok", "mode": service.mode, "learning": service.learning_status,
                "groups": service.groups_status,
                **values}

    def samples_of(body: bytes) -> list:
        """The request's samples: decoded, checked, each prompt split into its question (RequestError naming what
        is wrong)."""
        queries, prompts, labels = parse_request(decode_json(body), max_request_samples)
        check_sample_texts(queries, prompts, labels, max_sample_chars)
        samples = []
        for i, (query, prompt, label) in enumerate(zip(queries, prompts, labels)):
            try:
                samples.append(splitter.split(query, prompt, label))
            except RequestError as exc:
                raise RequestError(f"sample {i}: {exc}", exc.status) from None
        return samples

    async def get_reward(scope, receive) -> tuple[int, dict, dict | None]:
        """(status, JSON body, headers) of one /get_reward request."""
        start = time.perf_counter()
        try:
            with admission.ticket(_scoring_rate(service)) as ticket:
                body = await read_body(scope, receive, max_body_bytes, lambda size: ticket.add(body_bytes=size),
                                       body_timeout_s)
                if len(body) <= INLINE_BODY_BYTES:
                    samples = samples_of(body)
                else:  # linear work, but on a long prompt long enough to delay every other request
                    samples = await asyncio.to_thread(samples_of, body)
                ticket.add(samples=len(samples))
                scored = await asyncio.wait_for(service.score(samples), request_timeout_s)
        except RequestError as exc:
            if exc.status in (408, 413):  # the rest of the body is not read: the connection cannot be reused
                return _error(log, exc.status, str(exc), headers={"Connection": "close"})
            return _error(log, exc.status, str(exc))
        except Overloaded as exc:
            return _error(log, 503, f"{exc}; retry after {exc.retry_after_s}s",
                          headers={"Retry-After": str(exc.retry_after_s)})
        except asyncio.TimeoutError:
            return _error(log, 504, f"not scored within {request_timeout_s:.0f}s (--request-timeout-s); retry")
        except Exception as exc:  # a bug or a failed model call: the client retries, nobody is paid 0
            logger.exception("scoring failed")
            return _error(log, 500, f"scoring failed: {type(exc).__name__}: {exc}")
        log.requests.labels(route="/get_reward", status="200").inc()
        log.samples.inc(len(scored))
        log.latency.labels(route="/get_reward").observe(time.perf_counter() - start)
        extra = {"cooper/rule_correct": [float(s.verdict.value == "correct") for s in scored],
                 "cooper/rm_logit": [s.logit for s in scored], "cooper/rm_version": [float(s.version) for s in scored]}
        return 200, build_response([s.reward for s in scored], extra), None

    async def app(scope, receive, send) -> None:
        if scope["type"] != "http":  # the lifespan
            return await rest(scope, receive, send)
        path = scope["path"]
        if path == LIVENESS:
            return await send_json(send, 200, {"status": "up"})
        if not token_matches(token, scope):
            log.requests.labels(route=route_label(path), status="401").inc()
            return await send_json(send, 401, {"error": "missing or wrong token (Authorization: Bearer TOKEN, or "
                                                        "?token=TOKEN)"})
        if path != "/get_reward":
            return await rest(scope, receive, send)
        if scope["method"] != "POST":
            return await send_json(send, 405, {"detail": "Method Not Allowed"}, {"Allow": "POST"})
        try:
            status, payload, headers = await get_reward(scope, receive)
        except ClientLeft:
            return
        await send_json(send, status, payload, headers)

    app.fastapi = rest
    return app


def _scoring_rate(service: RewardHost) -> float:
    """Samples a second the RM batcher has scored while busy (0 before its first batch)."""
    stats = service.rm_batcher.stats
    return stats.items / stats.busy_seconds if stats.busy_seconds > 0 else 0.0


def _error(log, status: int, message: str, headers: dict | None = None) -> tuple[int, dict, dict | None]:
    log.requests.labels(route="/get_reward", status=str(status)).inc()
    return status, {"error": message}, headers


def server_options(*, keep_alive_s: int = DEFAULT_KEEP_ALIVE_S, header_timeout_s: float = DEFAULT_HEADER_TIMEOUT_S,
                   max_connections: int = DEFAULT_MAX_CONNECTIONS) -> dict:
    """uvicorn.Config's keyword arguments for the connection limits (module docstring), set explicitly."""
    from uvicorn.protocols.http.auto import AutoHTTPProtocol

    return {"timeout_keep_alive": keep_alive_s, "limit_concurrency": max_connections,
            "http": with_header_timeout(AutoHTTPProtocol, header_timeout_s)}


def with_header_timeout(base: type, seconds: float) -> type:
    """uvicorn's HTTP protocol `base`, closing a connection that has not sent a whole request head within `seconds`
    of opening or of its last answer. uvicorn's keep-alive timer starts only after an answer and stops at the
    first byte of the next request, so a socket that never sends anything, or sends its headers a byte at a time,
    would otherwise be held for ever."""

    class HeaderTimeout(base):
        _head_timer = None

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self._wait_for_head()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._wait_for_head()

        def connection_lost(self, exc) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
            super().connection_lost(exc)

        def _wait_for_head(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
            self._head_timer = self.loop.call_later(seconds, self._head_overdue)

        def _head_overdue(self) -> None:
            # a request whose head arrived is being answered: its body has the app's own timeout
            if (self.cycle is None or self.cycle.response_complete) and not self.transport.is_closing():
                self.transport.close()

    HeaderTimeout.__name__ = HeaderTimeout.__qualname__ = f"HeaderTimeout{base.__name__}"
    return HeaderTimeout
