"""``RemotePulseDB``: the instance of a running ``pulse up``, over its HTTP API, with the
same async methods and the same typed results as ``sync.PulseDB``.

The CLI and ``pulse mcp`` use it when a service runs on the data directory (DuckDB has
one writer, so a second process cannot open the files): ``RemotePulseDB.from_data_dir``
finds the service and sends the data directory's operator secret (or a given token).
Results travel in msgspec's JSON form (``?format=msgspec``) and are decoded into the
exact return types of PulseDB.

Start-up: the CLI calls this once per command, so the module imports neither the
instance nor an HTTP library. What a call needs of the API (each operation's parameters
and its return type) is its API description (``describe_api``), derived from the
declaration of the API (``sync.api.OPERATIONS``) and PulseDB's methods:
``pulse up`` writes it into ``service.json`` beside its URL, and a client of that service
reads it there, so the declaration stays the one source of truth and the description
is always the running service's own. A client given only a URL derives it from the
declaration (importing it). The return types are imported from their modules
(``projections.queries``, ...) when a result needs them; requests go through
``http.client``.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import json
import operator
import os
import re
import select
import sys
import types
import typing
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, TypeVar
from urllib.parse import urlsplit

from eventlog.errors import (
    LogUnavailable,
    PulseError,
    told,
)

if TYPE_CHECKING:
    import http.client


def __getattr__(name: str) -> Any:
    """``API_METHODS``: PulseDB's method of every declared operation, by name (in the
    order of ``sync.api.OPERATIONS``); computed on first use, since it imports the
    instance."""
    if name == "API_METHODS":
        return _api_methods()
    raise AttributeError(f"module 'ops.remote' has no attribute {name!r}")


@functools.cache
def _api_methods() -> dict[str, Any]:
    from sync.api import OPERATIONS
    from sync.instance import PulseDB

    return {name: getattr(PulseDB, name) for name in OPERATIONS}


@functools.cache
def return_type(name: str) -> Any:
    from sync.api import OPERATIONS

    return OPERATIONS[name].returns


@functools.cache
def optional_getter(name: str) -> bool:
    """A ``get_*`` method that answers None when there is nothing (or nothing the caller
    may see): the service says 404 (``Operation.optional``)."""
    from sync.api import OPERATIONS

    return OPERATIONS[name].optional


def _optional(name: str, returns: Any) -> bool:
    """Whether a getter of a service whose description does not say (an older one) may
    answer None: the rule ``sync.api`` declares by."""
    return name.startswith("get_") and type(None) in typing.get_args(returns)


# -- the API description ------------------------------------------------------------------
#
# {method: {"params": [[name, kind, has default], ...], "returns": type, "optional": bool}},
# a type being
# null (None), {"class": "module:qualname"}, {"union": [types]}, {"generic": type, "args":
# [types]} or {"literal": [values]}: JSON, so that service.json holds data, not code.


def describe_api() -> dict[str, Any]:
    """What a client needs of each operation: its parameters, its return type and
    whether it may answer None (a 404)."""
    described: dict[str, Any] = {}
    for name, func in _api_methods().items():
        params = [
            [p.name, p.kind.name, p.default is not inspect.Parameter.empty]
            for p in inspect.signature(func).parameters.values()
        ][1:]  # (self)
        described[name] = {
            "params": params,
            "returns": _describe(return_type(name)),
            "optional": optional_getter(name),
        }
    return described


def _describe(tp: Any) -> Any:
    if tp is None or tp is type(None):
        return None
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Union or isinstance(tp, types.UnionType):
        return {"union": [_describe(a) for a in args]}
    if origin is typing.Literal:
        return {"literal": list(args)}
    if origin is not None:
        return {"generic": _describe(origin), "args": [_describe(a) for a in args]}
    if tp is typing.Any:
        return {"class": "typing:Any"}
    return {"class": f"{tp.__module__}:{tp.__qualname__}"}


def _type(described: Any) -> Any:
    """The type a description names, importing the modules of its classes."""
    if described is None:
        return type(None)
    if "class" in described:
        module, _, qualname = described["class"].partition(":")
        found: Any = importlib.import_module(module)
        for part in qualname.split("."):
            found = getattr(found, part)
        return found
    if "union" in described:
        return functools.reduce(operator.or_, map(_type, described["union"]))
    if "literal" in described:
        return typing.Literal[tuple(described["literal"])]
    args = tuple(_type(a) for a in described["args"])
    return _type(described["generic"])[args if len(args) > 1 else args[0]]


class _Method:
    """One method of the API as a client calls it: binds arguments, decodes the result."""

    def __init__(self, name: str, described: dict[str, Any]) -> None:
        self.name = name
        self.signature = inspect.Signature(
            [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
            + [
                inspect.Parameter(
                    param,
                    getattr(inspect.Parameter, kind),
                    default=None if has_default else inspect.Parameter.empty,
                )  # fmt: skip
                for param, kind, has_default in described["params"]
            ]
        )
        self._returns = described["returns"]
        self._described = described

    @functools.cached_property
    def returns(self) -> Any:
        try:
            return _type(self._returns)
        except (ImportError, AttributeError):  # a service of another version: this one's
            return return_type(self.name)

    @functools.cached_property
    def optional(self) -> bool:
        said = self._described.get("optional")
        return said if isinstance(said, bool) else _optional(self.name, self.returns)

    def payload(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        bound = self.signature.bind(None, *args, **kwargs)
        payload: dict[str, Any] = {}
        for key, value in list(bound.arguments.items())[1:]:
            kind = self.signature.parameters[key].kind
            if kind is inspect.Parameter.VAR_KEYWORD:
                payload.update({k: v for k, v in value.items() if v is not None})
            elif value is not None:  # None is every parameter's default (or "no change")
                payload[key] = value
        if self.name == "get_context_candidates" and "request" in payload:
            request = payload.pop("request")
            payload.update(_enc_hook(request) if hasattr(request, "model_dump") else request)
        return payload


def _enc_hook(value: Any) -> Any:
    if hasattr(value, "tolist"):  # a numpy array or scalar (numpy is not imported here)
        return value.tolist()
    if hasattr(value, "model_dump"):
        return value.model_dump(mode="json", exclude_unset=True)
    raise NotImplementedError(f"cannot send a {type(value).__name__}")


@functools.cache
def _encoder() -> Any:
    import msgspec  # (here, as PageBody: `pulse --help` goes without)

    return msgspec.json.Encoder(enc_hook=_enc_hook)


T = TypeVar("T")


@functools.cache
def page_body() -> Any:
    import msgspec

    class PageBody(msgspec.Struct, Generic[T]):
        """A page of a listing as the service sends it."""

        items: list[T]
        next: str | None = None

    return PageBody


def decode(name: str, content: bytes, returns: Any = None) -> Any:
    """A method's result from its msgspec JSON, as the method's return type."""
    import msgspec

    returns = return_type(name) if returns is None else returns
    origin = typing.get_origin(returns)
    pages = sys.modules.get("sync.pages")  # (imported with the type, if it is a page)
    if pages is not None and origin is pages.Page:
        item: Any = typing.get_args(returns)[0]
        page = msgspec.json.decode(content, type=page_body()[item])
        return origin(page.items, page.next)
    return msgspec.json.decode(content, type=returns)


_READ_HEADERS = ("pulse-outcome", "pulse-duplicate-of", "pulse-outcomes")


def recorded(result: Any, headers: dict[str, str]) -> Any:
    """A record's id (or a batch's ids) as ``sync.models.Recorded``, with the outcome the
    service's headers say (``ops.http.api.outcome_headers``); any other result as it is."""
    from uuid import UUID

    from eventlog.recorded import Recorded

    outcome = headers.get("pulse-outcome")
    if outcome is not None and isinstance(result, UUID):
        of = headers.get("pulse-duplicate-of")
        return Recorded(result, outcome, None if of is None else UUID(of))  # type: ignore[arg-type]
    outcomes = headers.get("pulse-outcomes")
    if outcomes is not None and isinstance(result, list):
        said = outcomes.split(",")
        if len(said) == len(result):  # (a reinforced one's id is the one it duplicates)
            return [
                Recorded(r, o, r if o == "reinforced" else None)  # type: ignore[arg-type]
                for r, o in zip(result, said, strict=True)
            ]
    return result


class Response:
    """What the service answered: status, body, and the host asked."""

    def __init__(
        self, status_code: int, content: bytes, host: str, headers: dict[str, str] | None = None
    ) -> None:
        self.status_code, self.content, self.host = status_code, content, host
        self.headers = headers or {}  # (the few a client reads, by lower-case name)

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", "replace")

    def json(self) -> Any:
        return json.loads(self.content)


def raise_for(response: Response) -> None:
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
            f"the Pulse service at {response.host} refused the request ({message}): "
            "set $PULSE_TOKEN to an access token, or run as the user whose data directory "
            "it serves (its operator-token file)"
        )
    # a SQL limit's message names its setting ($PULSE_SQL_...), and the setting the limit
    named = re.search(r"\$(PULSE_SQL_[A-Z_]+)", message)
    setting = named.group(1) if named else ""
    raise told(kind, message, limit=_LIMITS.get(setting, "sql"), setting=setting)


# the ``limit`` each setting of the SQL sandbox sets (projections.analytics.SqlLimits)
_LIMITS = {
    "PULSE_SQL_TIME_LIMIT": "time", "PULSE_SQL_MEMORY_LIMIT": "memory",
    "PULSE_SQL_MAX_QUERY_BYTES": "query_bytes", "PULSE_SQL_MAX_NODES": "nodes",
    "PULSE_SQL_MAX_DEPTH": "depth",
}  # fmt: skip


class RemotePulseDB:
    def __init__(
        self, url: str, token: str | None = None, *, timeout: float = 120.0,
        api: dict[str, Any] | None = None,
    ) -> None:  # fmt: skip
        self.url = url.rstrip("/")
        self._headers = {"Content-Type": "application/json"}
        if token:
            self._headers["Authorization"] = f"Bearer {token}"
        self._timeout = timeout
        parts = urlsplit(self.url)
        self._tls = parts.scheme == "https"
        self._host = parts.hostname or "127.0.0.1"
        self._port = parts.port or (443 if self._tls else 80)
        self._prefix = parts.path
        described = api if api is not None else _DESCRIBED.get(self.url)
        self._api = described if described is not None else describe_api()
        self._methods: dict[str, _Method] = {}
        self._idle: list[http.client.HTTPConnection] = []  # kept alive between calls

    @classmethod
    def from_data_dir(
        cls, data_dir: str | os.PathLike[str], token: str | None = None, **kwargs: Any
    ) -> RemotePulseDB:
        """The ``pulse up`` serving ``data_dir`` (its URL and API description from
        ``service.json``), acting for ``token``, or, without one, as the local operator
        with the data directory's operator secret (``ops.operator_secret``)::

            db = RemotePulseDB.from_data_dir(".pulse")
            print(await db.list_collectives())

        LogUnavailable when no service runs there."""
        from ops.operator_secret import read_secret

        service = running_service(data_dir)
        if service is None:
            raise LogUnavailable(
                f"service: no pulse up serves {data_dir} (start it: pulse --data-dir {data_dir} up)"
            )
        return cls(service["url"], token or read_secret(data_dir), **kwargs)

    def _method(self, name: str) -> _Method:
        if name not in self._methods:
            if name not in self._api:
                raise AttributeError(name)
            self._methods[name] = _Method(name, self._api[name])
        return self._methods[name]

    async def call(self, name: str, /, *args: Any, **kwargs: Any) -> Any:
        import asyncio

        method = self._method(name)
        body = _encoder().encode(method.payload(args, kwargs))
        path = f"{self._prefix}/v1/{name}?format=msgspec"
        try:
            response = await asyncio.to_thread(self._post, path, body)
        except OSError as exc:  # (http.client's errors are OSErrors too)
            raise LogUnavailable(f"cannot reach the Pulse service at {self.url}: {exc}") from exc
        if response.status_code == 404 and method.optional:
            return None  # the service answers a getter's None with 404
        raise_for(response)
        return recorded(decode(name, response.content, method.returns), response.headers)

    def _post(self, path: str, body: bytes) -> Response:
        """One request, on a kept-alive connection when one is idle (blocking: a thread)."""
        import http.client

        connection = self._connection()
        try:
            connection.request("POST", path, body=body, headers=self._headers)
            answer = connection.getresponse()
            content = answer.read()
        except (OSError, http.client.HTTPException) as exc:
            connection.close()
            if isinstance(exc, OSError):
                raise
            raise ConnectionError(f"{type(exc).__name__}: {exc}") from exc
        if answer.will_close:
            connection.close()
        else:
            self._idle.append(connection)
        said = {k.lower(): v for k, v in answer.getheaders() if k.lower() in _READ_HEADERS}
        return Response(answer.status, content, self._host, said)

    def _connection(self) -> http.client.HTTPConnection:
        import http.client

        while True:
            try:  # (calls run on threads of their own: another may take the last one)
                connection = self._idle.pop()
            except IndexError:
                break
            sock = connection.sock
            # one the service closed (idle too long) reads as ready: at its end
            if sock is not None and not _readable(sock):
                return connection
            connection.close()
        if self._tls:
            import ssl

            return http.client.HTTPSConnection(
                self._host, self._port, timeout=self._timeout,
                context=ssl.create_default_context(),
            )  # fmt: skip
        return http.client.HTTPConnection(self._host, self._port, timeout=self._timeout)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_") or name not in self._api:
            raise AttributeError(name)
        return functools.partial(self.call, name)

    async def close(self) -> None:
        while self._idle:
            self._idle.pop().close()


def _readable(sock: Any) -> bool:
    """Whether ``sock`` has something to read now (poll: select refuses fds past 1023)."""
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    return bool(poller.poll(0))


# -- finding the service of a data directory ----------------------------------------------

# the API description of each service found by running_service, by URL (RemotePulseDB
# takes it from here when it is not given one)
_DESCRIBED: dict[str, dict[str, Any]] = {}


def service_file(data_dir: str | os.PathLike[str]) -> Path:
    return Path(data_dir) / "service.json"


def running_service(data_dir: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The service ``pulse up`` runs on this data directory, if it is alive."""
    try:
        info = json.loads(service_file(data_dir).read_text())
        os.kill(int(info["pid"]), 0)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not isinstance(info, dict):
        return None
    if isinstance(info.get("api"), dict) and isinstance(info.get("url"), str):
        _DESCRIBED[info["url"].rstrip("/")] = info["api"]
    return info
