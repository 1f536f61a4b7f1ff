"""``RemotePulseDB``: the instance of a running ``pulse up``, over its HTTP API, with the
same async methods and the same typed results as ``sync.PulseDB``.

The CLI and ``pulse mcp`` use it when a service runs on the data directory (DuckDB has
one writer, so a second process cannot open the files). Results travel in msgspec's JSON
form (``?format=msgspec``) and are decoded into the exact return types of PulseDB.
"""

from __future__ import annotations

import functools
import inspect
import json
import os
import typing
from pathlib import Path
from typing import Any, Generic, TypeVar

import httpx
import msgspec
import numpy as np

from eventlog.errors import (
    ConflictError,
    Forbidden,
    LogUnavailable,
    NotFollowed,
    NotFoundError,
    PulseError,
    QueryOutOfMemory,
    QueryTimedOut,
    Unauthorized,
    ValidationError,
)
from sync import models
from sync.instance import PulseDB

# every public coroutine of PulseDB is a method of the API
API_METHODS: dict[str, Any] = {
    name: func
    for name, func in inspect.getmembers(PulseDB, inspect.iscoroutinefunction)
    if not name.startswith("_") and name not in ("close", "open", "attach", "export")
}

ERRORS: dict[str, type[PulseError]] = {
    cls.__name__: cls
    for cls in (
        ValidationError,
        NotFollowed,
        NotFoundError,
        ConflictError,
        LogUnavailable,
        QueryTimedOut,
        QueryOutOfMemory,
        Unauthorized,
        Forbidden,
        PulseError,
    )  # fmt: skip
}


@functools.cache
def return_type(name: str) -> Any:
    return typing.get_type_hints(API_METHODS[name])["return"]


@functools.cache
def optional_getter(name: str) -> bool:
    """A ``get_*`` method that answers None when there is nothing (or nothing the caller
    may see): the service says 404."""
    return name.startswith("get_") and type(None) in typing.get_args(return_type(name))


def _enc_hook(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    if hasattr(value, "model_dump"):
        return value.model_dump(mode="json", exclude_unset=True)
    raise NotImplementedError(f"cannot send a {type(value).__name__}")


_encoder = msgspec.json.Encoder(enc_hook=_enc_hook)

T = TypeVar("T")


class PageBody(msgspec.Struct, Generic[T]):
    """A page of a listing as the service sends it."""

    items: list[T]
    next: str | None = None


def decode(name: str, content: bytes) -> Any:
    """A method's result from its msgspec JSON, as the method's return type."""
    returns = return_type(name)
    if typing.get_origin(returns) is models.Page:
        item: Any = typing.get_args(returns)[0]
        page = msgspec.json.decode(content, type=PageBody[item])
        return models.Page(page.items, page.next)
    return msgspec.json.decode(content, type=returns)


def raise_for(response: httpx.Response) -> None:
    """The API's error body as the library's exception (or a PulseError)."""
    if response.status_code < 400:
        return
    try:
        body = response.json()
        kind, message = body["error"], body["message"]
    except (ValueError, KeyError, TypeError):
        raise PulseError(f"HTTP {response.status_code}: {response.text[:200]}") from None
    if response.status_code == 401:
        message = (
            f"the Pulse service at {response.url.host} refused the request ({message}): "
            "set $PULSE_TOKEN to an access token"
        )
    raise ERRORS.get(kind, PulseError)(message)


class RemotePulseDB:
    def __init__(self, url: str, token: str | None = None, *, timeout: float = 120.0) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.url = url
        self._client = httpx.AsyncClient(base_url=url, headers=headers, timeout=timeout)

    async def call(self, name: str, /, *args: Any, **kwargs: Any) -> Any:
        if name not in API_METHODS:
            raise AttributeError(name)
        bound = inspect.signature(API_METHODS[name]).bind(None, *args, **kwargs)
        payload: dict[str, Any] = {}
        for key, value in list(bound.arguments.items())[1:]:
            kind = inspect.signature(API_METHODS[name]).parameters[key].kind
            if kind is inspect.Parameter.VAR_KEYWORD:
                payload.update({k: v for k, v in value.items() if v is not None})
            elif value is not None:  # None is every parameter's default (or "no change")
                payload[key] = value
        if name == "get_context_candidates" and "request" in payload:
            request = payload.pop("request")
            payload.update(_enc_hook(request) if hasattr(request, "model_dump") else request)
        try:
            response = await self._client.post(
                f"/v1/{name}", content=_encoder.encode(payload),
                params={"format": "msgspec"}, headers={"Content-Type": "application/json"},
            )  # fmt: skip
        except httpx.HTTPError as exc:
            raise LogUnavailable(f"cannot reach the Pulse service at {self.url}: {exc}") from exc
        if response.status_code == 404 and optional_getter(name):
            return None  # the service answers a getter's None with 404
        raise_for(response)
        return decode(name, response.content)

    def __getattr__(self, name: str) -> Any:
        if name not in API_METHODS:
            raise AttributeError(name)
        return functools.partial(self.call, name)

    async def close(self) -> None:
        await self._client.aclose()


# -- finding the service of a data directory ----------------------------------------------


def service_file(data_dir: str | os.PathLike[str]) -> Path:
    return Path(data_dir) / "service.json"


def running_service(data_dir: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The service ``pulse up`` runs on this data directory, if it is alive."""
    try:
        info = json.loads(service_file(data_dir).read_text())
        os.kill(int(info["pid"]), 0)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return info if isinstance(info, dict) else None
