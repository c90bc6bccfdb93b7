"""``GET /docs``: the gateway's OpenAPI document as an interactive page (Swagger UI), and
``GET /`` sending a browser there.

Swagger UI 5 (the first to read OpenAPI 3.1, the version the gateway serves) comes from the
``swagger-ui-py`` package, installed with FlowServe, and the gateway serves its files
itself under ``/docs/static/``: no CDN, so the page works on a cluster without internet
access, and nothing a third party serves runs in the browser of someone holding the
cluster's token. The page's Content-Security-Policy lets it load scripts and styles from
the gateway only.

The page and its files hold nothing of the cluster's, so they are served without the
token (a browser cannot add a bearer token to the page it opens). The document and the
flows still need it: on a cluster with a token the page asks for it once, keeps it in
the tab's ``sessionStorage`` (gone when the tab closes), and sends it as
``Authorization: Bearer`` with the document's fetch and every "Try it out" request.
"""

from __future__ import annotations

import functools
import importlib.util
import os

from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

STATIC = "/docs/static"

PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
  <meta charset="utf-8">
  <title>FlowServe gateway</title>
  <link rel="icon" type="image/png" href="/docs/static/favicon-32x32.png">
  <link rel="stylesheet" href="/docs/static/swagger-ui.css">
  <style>
    #token { font-family: sans-serif; margin: 2em auto; max-width: 40em; }
    #token input { width: 24em; }
    #token-error { color: #b00; }
  </style>
</head>
<body>
  <form id="token" hidden>
    <p>This cluster asks for its bearer token (<code>ClusterConfig.token</code>, <code>flowserve up --token</code>).
    It stays in this tab only.</p>
    <label>Token <input id="token-value" type="password" autocomplete="off"></label>
    <button id="token-open" type="submit">Open</button>
    <p id="token-error"></p>
  </form>
  <noscript><p>The page needs JavaScript; the API's document is at <a href="/openapi.json">/openapi.json</a>.</p></noscript>
  <div id="swagger-ui"></div>
  <script src="/docs/static/swagger-ui-bundle.js"></script>
  <script src="/docs/page.js"></script>
</body>
</html>
"""

# The page's own script: a file, not inline, so the Content-Security-Policy forbids every
# inline script (an injected one included).
SCRIPT = """"use strict";
(function () {
  const KEY = "flowserve-token";
  const form = document.getElementById("token");
  const input = document.getElementById("token-value");
  const error = document.getElementById("token-error");

  function sameOrigin(url) {
    return new URL(url, location.href).origin === location.origin;
  }

  function show(token) {
    window.ui = SwaggerUIBundle({
      url: "/openapi.json",
      dom_id: "#swagger-ui",
      deepLinking: true,
      validatorUrl: null,  // no badge from swagger.io's online validator: nothing leaves the cluster
      // the token goes with the document's fetch and every request the page makes here
      requestInterceptor: (request) => {
        if (token && sameOrigin(request.url)) request.headers.Authorization = "Bearer " + token;
        return request;
      },
      onComplete: () => {
        if (token) window.ui.preauthorizeApiKey("bearer", token);  // shown as authorized
      },
    });
  }

  async function openDocument(token) {
    const headers = token ? {Authorization: "Bearer " + token} : {};
    const answer = await fetch("/openapi.json", {headers: headers});
    if (answer.status === 401) {
      sessionStorage.removeItem(KEY);
      error.textContent = token ? "The cluster refused this token." : "";
      form.hidden = false;
      input.focus();
      return;
    }
    form.hidden = true;
    show(token);
  }

  form.addEventListener("submit", (event) => {
    event.preventDefault();
    const token = input.value.trim();
    sessionStorage.setItem(KEY, token);
    openDocument(token);
  });
  openDocument(sessionStorage.getItem(KEY) || "");
})();
"""

# Swagger UI sets styles on its elements (style-src 'unsafe-inline') and draws some icons
# as data: URIs; everything else comes from the gateway.
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
    "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'"
)
PAGE_HEADERS = {"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff"}


@functools.lru_cache(maxsize=1)
def static_dir() -> str | None:
    """Where Swagger UI's files are (the ``swagger_ui`` package's ``static`` folder, found
    without importing the package's web-framework adapters), or None without it."""
    spec = importlib.util.find_spec("swagger_ui")
    if spec is None or not spec.submodule_search_locations:
        return None
    directory = os.path.join(list(spec.submodule_search_locations)[0], "static")
    return directory if os.path.isfile(os.path.join(directory, "swagger-ui-bundle.js")) else None


def is_page(path: str) -> bool:
    """Whether ``path`` is the page or one of its files: answered without the token."""
    return path in ("/", "/docs", "/docs/page.js") or path.startswith(STATIC + "/")


async def _page(request) -> Response:
    if static_dir() is None:  # an install without it: say so instead of a broken page
        return HTMLResponse(
            "<p>The interactive page needs the swagger-ui-py package "
            "(pip install swagger-ui-py); the document is at "
            '<a href="/openapi.json">/openapi.json</a>.</p>',
            status_code=501,
        )
    return HTMLResponse(PAGE, headers=PAGE_HEADERS)


async def _script(request) -> Response:
    return Response(SCRIPT, media_type="text/javascript", headers=PAGE_HEADERS)


async def _home(request) -> Response:
    return RedirectResponse("/docs", status_code=302)


def docs_routes() -> list:
    """Routes for ``/``, ``/docs`` and the page's files, to add to the gateway's app."""
    routes = [
        Route("/", _home, methods=["GET"]),
        Route("/docs", _page, methods=["GET"]),
        Route("/docs/page.js", _script, methods=["GET"]),
    ]
    directory = static_dir()
    if directory is not None:
        routes.append(Mount(STATIC, app=StaticFiles(directory=directory), name="docs-static"))
    return routes
