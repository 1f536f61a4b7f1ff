"""The MkDocs hook that renders the HTTP API page's reference from ``docs/openapi.json``
(``ops.docs_schema``).

It lives in a folder of its own because MkDocs puts a hook's folder first on the import
path: loaded from ``ops/``, the service's ``ops/http`` package would hide the standard
library's ``http``, which ``ops.docs_schema`` needs.
"""

from ops.docs_schema import on_page_markdown

__all__ = ["on_page_markdown"]
