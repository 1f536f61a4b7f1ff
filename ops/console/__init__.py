"""The console: ``pulse up`` serves a browser console at ``/ui`` (and ``/`` redirects
there), from files in this package (``assets``; its one library, cytoscape.js, is vendored
at a pinned version under ``assets/vendor``), with no CDN and no build step.

The pages hold no data and no credential: they load without one, ask for an access token
(or the operator secret) in the browser, keep it in the tab's ``sessionStorage`` and send
it as ``Authorization: Bearer`` with every call of the public HTTP API (``/v1``), so the
console shows exactly what that token may see and the service checks every action as it
checks any client's. The token never appears in a URL (the pages' state is in the hash,
which no request carries), and the access log holds no header.

Every answer here carries a strict Content-Security-Policy: scripts and styles from this
origin only (no inline script, style or ``eval``), calls to this origin only, no frames,
no form submissions, no ``<base>``.

(No ``from __future__ import annotations`` here: FastAPI reads the endpoint annotations.)
"""

import functools
import hashlib
import mimetypes
from importlib import resources

from fastapi import APIRouter
from fastapi.responses import RedirectResponse, Response
from starlette.requests import Request

PREFIX = "/ui"

CONTENT_SECURITY_POLICY = "; ".join(
    (
        "default-src 'none'",
        "script-src 'self'",
        "style-src 'self'",
        "img-src 'self' data:",
        "connect-src 'self'",
        "base-uri 'none'",
        "form-action 'none'",
        "frame-ancestors 'none'",
    )
)
HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cache-Control": "no-cache",  # (revalidated by ETag: a new release shows at once)
}
TYPES = {".js": "text/javascript; charset=utf-8", ".css": "text/css; charset=utf-8",
         ".html": "text/html; charset=utf-8", ".txt": "text/plain; charset=utf-8",
         ".svg": "image/svg+xml"}  # fmt: skip


@functools.cache
def assets() -> dict[str, tuple[bytes, str, str]]:
    """Every file of ``assets`` by its path under it: (content, media type, ETag). Read
    once, at the first request for one (not when the guard imports ``public``): a
    request can name nothing else (no path is joined to a directory)."""
    found: dict[str, tuple[bytes, str, str]] = {}

    def walk(folder: resources.abc.Traversable, prefix: str) -> None:
        for entry in folder.iterdir():
            if entry.is_dir():
                walk(entry, f"{prefix}{entry.name}/")
                continue
            suffix = "." + entry.name.rsplit(".", 1)[-1]
            kind = TYPES.get(suffix) or mimetypes.guess_type(entry.name)[0]
            if kind is None:
                continue
            body = entry.read_bytes()
            found[prefix + entry.name] = (body, kind, f'"{hashlib.sha256(body).hexdigest()[:32]}"')

    walk(resources.files(__package__) / "assets", "")
    return found


def _answer(request: Request, name: str) -> Response:
    body, kind, etag = assets()[name]
    if etag in request.headers.get("if-none-match", ""):
        return Response(status_code=304, headers={**HEADERS, "ETag": etag})
    return Response(body, media_type=kind, headers={**HEADERS, "ETag": etag})


def router() -> APIRouter:
    """``GET /`` (a redirect), ``GET /ui/`` (the page) and ``GET /ui/<asset>``."""
    routes = APIRouter(include_in_schema=False)

    @routes.api_route("/", methods=["GET", "HEAD"])
    async def root() -> Response:
        return RedirectResponse(f"{PREFIX}/", status_code=307, headers=HEADERS)

    @routes.api_route(PREFIX, methods=["GET", "HEAD"])
    async def bare() -> Response:
        return RedirectResponse(f"{PREFIX}/", status_code=307, headers=HEADERS)

    @routes.api_route(f"{PREFIX}/", methods=["GET", "HEAD"])
    async def page(request: Request) -> Response:
        return _answer(request, "index.html")

    @routes.api_route(PREFIX + "/{name:path}", methods=["GET", "HEAD"])
    async def asset(name: str, request: Request) -> Response:
        if name not in assets():
            return Response(
                b'{"error":"NotFound","message":"path: no such file of the console"}',
                status_code=404, media_type="application/json", headers=HEADERS,
            )  # fmt: skip
        return _answer(request, name)

    return routes


def public(path: str) -> bool:
    """The console's paths, which answer without a credential (they hold no data)."""
    return path == "/" or path == PREFIX or path.startswith(PREFIX + "/")
