"""The FastAPI app ``serve`` runs over one ``SekvLlama``: request normalisation, the model proxy llama-cpp-python's
routes expect, and every failure mapped to an OpenAI-shaped error (4xx for what a request asked, 500 only for a
fault). The server imports (FastAPI, llama-cpp-python's server pieces) happen in ``create_app``."""

import contextlib
import json
import re
import threading
import time
from typing import Any, Callable, Iterator

from ..errors import SekvError
from .settings import ServeConfig

# llama-cpp-python's message for a prompt over the context (its server turns it into context_length_exceeded)
CONTEXT_EXCEEDED = re.compile(r"Requested tokens \((\d+)\) exceed context window of (\d+)")


class _Proxy:
    """What llama-cpp-python's routes expect as the model proxy: the one model, under its alias."""

    def __init__(self, llm: Any, alias: str):
        self.llm, self.alias = llm, alias

    def __call__(self, model: str | None = None) -> Any:
        return self.llm

    def __iter__(self) -> Iterator[str]:
        yield self.alias


def _error(status: int, message: str, code: str | None = None, kind: str = "invalid_request_error") -> Any:
    from fastapi.responses import JSONResponse

    return JSONResponse({"error": {"message": message, "type": kind, "param": None, "code": code}}, status_code=status)


def _normalise(body: dict, cap: int, chat: bool) -> tuple[dict, bool]:
    """The request as llama-cpp-python's types take it, and whether a streamed reply ends with a usage chunk:
    ``developer`` -> ``system`` (text parts joined), ``max_completion_tokens`` -> ``max_tokens``, the cap when a
    chat names none or a request asks for <= 0 ("no limit"), ``stream_options`` taken out."""
    body = dict(body)
    options = body.pop("stream_options", None) or {}
    include_usage = bool(isinstance(options, dict) and options.get("include_usage"))
    if body.get("max_tokens") is None and body.get("max_completion_tokens") is not None:
        body["max_tokens"] = body["max_completion_tokens"]
    body.pop("max_completion_tokens", None)
    max_tokens = body.get("max_tokens")
    if isinstance(max_tokens, int) and not isinstance(max_tokens, bool) and max_tokens <= 0:
        body["max_tokens"] = max_tokens = None  # "no limit" (-1, 0) as some clients send it: the cap, not n_ctx
    if max_tokens is None and (chat or "max_tokens" in body):
        body["max_tokens"] = cap
    if chat and isinstance(body.get("messages"), list):
        msgs = []
        for m in body["messages"]:
            if isinstance(m, dict) and m.get("role") in ("developer", "system"):
                m = dict(m, role="system")
                if isinstance(m.get("content"), list):  # [{"type": "text", "text": ...}, ...]
                    m["content"] = "".join(p.get("text", "") for p in m["content"] if isinstance(p, dict))
            msgs.append(m)
        body["messages"] = msgs
    return body, include_usage


def create_app(llm: Any, cfg: ServeConfig) -> Any:
    """The FastAPI app over ``llm``."""
    import anyio
    from fastapi import APIRouter, Depends, FastAPI, Request
    from fastapi.middleware.cors import CORSMiddleware
    from fastapi.routing import APIRoute
    from pydantic import ValidationError
    from sse_starlette.sse import EventSourceResponse
    from starlette.concurrency import iterate_in_threadpool, run_in_threadpool
    from starlette_context.middleware import RawContextMiddleware
    from starlette_context.plugins import RequestIdPlugin

    import llama_cpp
    import llama_cpp.server.app as lapp
    from llama_cpp.server.errors import ErrorResponseFormatters
    from llama_cpp.server.settings import ServerSettings
    from llama_cpp.server.types import CreateChatCompletionRequest, CreateCompletionRequest

    alias = cfg.alias or llm.model_name
    lapp.set_server_settings(ServerSettings(host=cfg.host, port=cfg.port, api_key=cfg.api_key,
                                            interrupt_requests=False))
    lapp._llama_proxy = _Proxy(llm, alias)

    class Route(APIRoute):
        """Every failure as an OpenAI-shaped error: 4xx for what the request asked, 500 only for a fault."""

        def get_route_handler(self) -> Callable:
            handler = super().get_route_handler()

            async def route(request: Request) -> Any:
                try:
                    return await handler(request)
                except lapp.HTTPException:
                    raise
                except Exception as e:  # noqa: BLE001 - mapped to a response below
                    return _map_error(e, getattr(request.state, "sekv_body", None))

            return route

    def _map_error(e: Exception, body: Any) -> Any:
        from fastapi.exceptions import RequestValidationError

        if isinstance(e, (RequestValidationError, ValidationError)):
            return _error(400, f"invalid request: {e}")
        match = CONTEXT_EXCEEDED.search(str(e))
        if match is not None and body is not None:
            status, err = ErrorResponseFormatters.context_length_exceeded(body, match)
            return _error(status, err["message"], err["code"])
        if isinstance(e, (SekvError, ValueError, TypeError, NotImplementedError)):
            return _error(400, str(e))
        return _error(500, f"{type(e).__name__}: {e}", kind="internal_server_error")

    router = APIRouter(route_class=Route)

    async def parse(request: Request, model: type, chat: bool) -> tuple[Any, bool]:
        try:
            raw = await request.json()
        except Exception:  # noqa: BLE001
            raise ValueError("the request body is not valid JSON") from None
        if not isinstance(raw, dict):
            raise ValueError("the request body must be a JSON object")
        data, include_usage = _normalise(raw, cfg.max_tokens, chat)
        body = model(**data)
        request.state.sekv_body = body
        return body, include_usage

    def call_kwargs(body: Any) -> dict:
        kwargs = body.model_dump(exclude={"n", "best_of", "logit_bias_type", "user", "min_tokens"})
        if getattr(body, "n", 1) not in (None, 1):
            raise ValueError("n > 1 is not supported: one completion per request")
        return kwargs

    async def respond(request: Request, body: Any, call: Callable, include_usage: bool, chat: bool) -> Any:
        kwargs = call_kwargs(body)
        if kwargs.get("stream"):
            send, recv = anyio.create_memory_object_stream(10)
            shutdown = anyio.Event()  # sse-starlette sets it when the server is told to stop
            stop = threading.Event()  # this request's own: llm.cancel while it holds the model

            async def on_close(message: Any) -> None:  # the client went away: free the model at its next step
                stop.set()

            return EventSourceResponse(recv, data_sender_callable=lambda: publish(request, send, body, call, kwargs,
                                                                                  include_usage, chat, shutdown, stop),
                                       sep="\n", ping_message_factory=lapp._ping_message_factory,
                                       client_close_handler_callable=on_close, shutdown_event=shutdown,
                                       shutdown_grace_period=cfg.shutdown_grace_s)
        async with contextlib.asynccontextmanager(lapp.get_llama_proxy)() as proxy:
            llm.cancel = threading.Event()  # this request's, while it holds the model (SIGTERM sets it)
            llama = lapp.prepare_request_resources(body, proxy, body.model, kwargs)
            return await run_in_threadpool(call, llama, **kwargs)

    async def publish(request: Request, send: Any, body: Any, call: Callable, kwargs: dict, include_usage: bool,
                      chat: bool, shutdown: Any, stop: threading.Event) -> None:
        async with contextlib.asynccontextmanager(lapp.get_llama_proxy)() as proxy:
            llm.cancel = stop  # this request holds the model now: its client's disconnect or SIGTERM ends it
            iterator = None
            async with send, anyio.create_task_group() as relay:
                async def stop_on_shutdown() -> None:  # the stream then ends with its last chunk and [DONE]
                    await shutdown.wait()
                    llm.cancel.set()

                relay.start_soon(stop_on_shutdown)
                try:
                    llama = lapp.prepare_request_resources(body, proxy, body.model, kwargs)
                    iterator = await run_in_threadpool(call, llama, **kwargs)
                    last = None
                    async for chunk in iterate_in_threadpool(iterator):
                        last = chunk
                        await send.send(dict(data=json.dumps(chunk)))
                        if await request.is_disconnected():
                            stop.set()
                            raise anyio.get_cancelled_exc_class()()
                    if include_usage and last is not None:
                        await send.send(dict(data=json.dumps(usage_chunk(llama, last, chat))))
                    await send.send(dict(data="[DONE]"))
                except anyio.get_cancelled_exc_class():
                    raise
                except Exception as e:  # noqa: BLE001 - a stream cannot change its status: an error event
                    resp = _map_error(e, body)
                    await send.send(dict(data=resp.body.decode("utf-8")))
                    await send.send(dict(data="[DONE]"))
                finally:
                    relay.cancel_scope.cancel()
                    if iterator is not None:  # end the generation (its memory bookkeeping) while we hold the model
                        with anyio.CancelScope(shield=True):
                            await anyio.to_thread.run_sync(iterator.close)

    def usage_chunk(llama: Any, last: dict, chat: bool) -> dict:
        n_prompt = llama.counters.prompt_tokens
        sampled = list(llama._sampled)
        if sampled and llama_cpp.llama_vocab_is_eog(llama._model.vocab, sampled[-1]):
            sampled = sampled[:-1]
        return {"id": last.get("id"), "object": "chat.completion.chunk" if chat else "text_completion",
                "created": last.get("created"), "model": last.get("model"), "choices": [],
                "usage": {"prompt_tokens": n_prompt, "completion_tokens": len(sampled),
                          "total_tokens": n_prompt + len(sampled),
                          "prompt_tokens_details": {"cached_tokens": llama.counters.cached_tokens}}}

    @router.get("/v1/models", dependencies=[Depends(lapp.authenticate)])
    async def models() -> dict:
        return {"object": "list", "data": [{
            "id": alias, "object": "model", "created": int(time.time()), "owned_by": "sekv_gguf",
            "context_length": llm.n_ctx(), "max_model_len": llm.n_ctx(),
            "meta": {"policy": llm.policy_name, "device_cells": llm.n_cells(), "chat_format": llm.chat_format,
                     "n_ctx_train": llm._model.n_ctx_train()}}]}

    @router.post("/v1/chat/completions", dependencies=[Depends(lapp.authenticate)])
    async def chat(request: Request) -> Any:
        body, include_usage = await parse(request, CreateChatCompletionRequest, chat=True)
        return await respond(request, body, llama_cpp.Llama.create_chat_completion, include_usage, True)

    @router.post("/v1/completions", dependencies=[Depends(lapp.authenticate)])
    async def completions(request: Request) -> Any:
        body, include_usage = await parse(request, CreateCompletionRequest, chat=False)
        if isinstance(body.prompt, list):
            if len(body.prompt) > 1:
                raise ValueError("one prompt per request")
            body.prompt = body.prompt[0] if body.prompt else ""
        return await respond(request, body, llama_cpp.Llama.__call__, include_usage, False)

    @router.post("/v1/embeddings", dependencies=[Depends(lapp.authenticate)])
    async def embeddings(request: Request) -> Any:
        return _error(400, "embeddings are not served by sekv_gguf (its memory is a compressed KV cache)")

    @router.get("/health")
    async def health() -> dict:
        return {"status": "ok"}

    @router.get("/sekv/stats", dependencies=[Depends(lapp.authenticate)])
    async def stats() -> dict:
        """The memory: device and host bytes, tokens, spans, and what the last request evaluated and reused."""
        async with contextlib.asynccontextmanager(lapp.get_llama_proxy)() as proxy:
            return proxy().stats().to_json()

    from fastapi.middleware import Middleware

    app = FastAPI(middleware=[Middleware(RawContextMiddleware, plugins=(RequestIdPlugin(),))], title="sekv_gguf",
                  version="0.1.0")
    app.add_middleware(CORSMiddleware, allow_origins=["*"], allow_credentials=True, allow_methods=["*"],
                       allow_headers=["*"])
    from starlette.exceptions import HTTPException as StarletteHTTPException

    async def http_error(request: Request, exc: StarletteHTTPException) -> Any:  # 401, 404, 405 ... as OpenAI's
        kind = {401: "authentication_error", 403: "permission_error", 404: "not_found_error"}.get(
            exc.status_code, "invalid_request_error")
        detail = exc.detail if isinstance(exc.detail, str) else json.dumps(exc.detail)
        resp = _error(exc.status_code, detail or "error", kind=kind)
        resp.headers.update(exc.headers or {})
        return resp

    app.add_exception_handler(StarletteHTTPException, http_error)
    app.include_router(router)  # ours first: they take precedence over llama-cpp-python's of the same path
    app.include_router(lapp.router)  # /extras/tokenize, /extras/detokenize
    return app
