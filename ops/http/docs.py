"""``GET /docs``: Swagger UI over ``/openapi.json``, its scripts and styles served from
the package (``swagger-ui-bundle``), never from a CDN.

(No ``from __future__ import annotations`` here: FastAPI reads the endpoint annotations.)
"""

from fastapi import APIRouter
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import Response
from starlette.routing import Mount
from starlette.staticfiles import StaticFiles
from swagger_ui_bundle import swagger_ui_path  # type: ignore[import-untyped]

ASSETS = "/docs/assets"


def router() -> APIRouter:
    """``GET /docs``."""
    routes = APIRouter()

    @routes.get("/docs", include_in_schema=False)
    async def docs() -> Response:
        return get_swagger_ui_html(
            openapi_url="/openapi.json", title="Pulse API",
            swagger_js_url=f"{ASSETS}/swagger-ui-bundle.js",
            swagger_css_url=f"{ASSETS}/swagger-ui.css",
            swagger_favicon_url=f"{ASSETS}/favicon-32x32.png",
            oauth2_redirect_url=None,
            swagger_ui_parameters={"validatorUrl": None},  # (its default asks a web service)
        )  # fmt: skip

    return routes


def assets() -> Mount:
    """Swagger UI's files, under ``ASSETS``."""
    return Mount(ASSETS, StaticFiles(directory=str(swagger_ui_path)), name="docs-assets")
