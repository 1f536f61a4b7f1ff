"""The HTTP service of ``pulse up``, one module per part, put together by
``ops.service.create_app``:

- ``guard``: what every request must show (Origin, JSON, a bearer credential, a body
  within the limit) and who it acts for; the request metrics;
- ``errors``: the one error body, for every refusal and failure;
- ``api``: ``POST /v1/<name>``, one route per operation of the declaration;
- ``watch``: ``GET /v1/watch_experiences``, server-sent events;
- ``health``, ``metrics``: ``GET /health``, ``GET /metrics`` (and the scrapers' own
  address);
- ``docs``: ``GET /docs``, Swagger UI from the package.

What the OpenAPI schema promises of every route is ``ops.contract``'s.
"""
