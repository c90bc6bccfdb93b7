"""``GET /docs``: the gateway's OpenAPI document as an interactive page (Swagger UI).

The page's scripts and styles come from the ``swagger-ui-bundle`` package, installed with
FlowServe and served by the gateway itself under ``/docs/static/``: no CDN, so the page
works on a cluster without internet access, and nothing a third party serves runs in the
browser of someone holding the cluster's token.
"""

from __future__ import annotations

from starlette.responses import HTMLResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
  <meta charset="utf-8">
  <title>FlowServe gateway</title>
  <link rel="stylesheet" href="/docs/static/swagger-ui.css">
</head>
<body>
  <div id="swagger-ui"></div>
  <script src="/docs/static/swagger-ui-bundle.js"></script>
  <script>
    window.ui = SwaggerUIBundle({url: "/openapi.json", dom_id: "#swagger-ui", deepLinking: true});
  </script>
</body>
</html>
"""


def _static_dir() -> str | None:
    try:
        from swagger_ui_bundle import swagger_ui_path
    except ImportError:  # an install without it: /docs says so instead of a broken page
        return None
    return str(swagger_ui_path)


async def _page(request) -> HTMLResponse:
    if _static_dir() is None:
        return HTMLResponse(
            "<p>The interactive page needs the swagger-ui-bundle package "
            "(pip install swagger-ui-bundle); the document is at "
            '<a href="/openapi.json">/openapi.json</a>.</p>',
            status_code=501,
        )
    return HTMLResponse(PAGE)


def docs_routes() -> list:
    """Routes for ``/docs`` and its static files, to add to the gateway's app."""
    routes = [Route("/docs", _page, methods=["GET"])]
    directory = _static_dir()
    if directory is not None:
        routes.append(Mount("/docs/static", app=StaticFiles(directory=directory), name="docs-static"))
    return routes
