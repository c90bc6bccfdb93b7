"""The API page (``GET /docs``, reached from ``GET /``) in a real browser: headless
Chromium (Debian's ``chromium`` package), driven over the DevTools protocol, against a
real cluster that asks for a token. The page asks for the token, lists every deployed
flow, and "Try it out" -> Execute sends a request that the flow answers, shown on the
page. Without Chromium the browser test skips, saying so; the page's HTTP contract (who
may fetch what, its Content-Security-Policy) is checked without it.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import subprocess
import time

import httpx
import numpy as np
import pytest
import websocket  # websocket-client

from executors.hosts.cluster import LocalCluster
from executors.hosts.cluster_config import ClusterConfig
from flow import ColumnType, Flow

TOKEN = "page-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def double(row):
    return row.x * 2


def brightness(row):
    return float(row.img.mean())


@pytest.fixture(scope="module")
def cluster():
    with LocalCluster(ClusterConfig(executors=1, token=TOKEN)) as c:
        f = Flow("double", schema={"x": int})
        f.map(double, names=["y"])
        c.deploy(f)
        g = Flow("brightness", schema={"img": ColumnType.tensor(np.uint8, (2, 2))})
        g.map(brightness, names=["mean"])
        c.deploy(g)
        yield c


def test_root_sends_a_browser_to_the_page(cluster):
    r = httpx.get(cluster.url + "/")
    assert r.status_code == 302 and r.headers["location"] == "/docs"


def test_the_page_and_its_files_need_no_token_but_the_document_does(cluster):
    page = httpx.get(cluster.url + "/docs")  # a browser cannot send a bearer token to open a page
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    csp = page.headers["content-security-policy"]
    assert "script-src 'self'" in csp and "default-src 'self'" in csp  # no CDN, no inline script
    assert "<script>" not in page.text and "http" not in page.text  # nothing from another host
    script = httpx.get(cluster.url + "/docs/page.js")
    assert script.status_code == 200 and "Authorization" in script.text
    bundle = httpx.get(cluster.url + "/docs/static/swagger-ui-bundle.js")
    assert bundle.status_code == 200 and "SwaggerUIBundle" in bundle.text[:2000]
    assert httpx.get(cluster.url + "/docs/static/swagger-ui.css").status_code == 200
    assert httpx.get(cluster.url + "/openapi.json").status_code == 401
    assert httpx.get(cluster.url + "/openapi.json", headers=AUTH).json()["openapi"].startswith("3.1")


# -- a browser, over the DevTools protocol -------------------------------------------------


class PageError(Exception):
    """A JavaScript expression raised in the page."""


def _chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


class Browser:
    """Headless Chromium and one page of it, driven over the DevTools protocol (a JSON
    command per websocket message, answered by id; events are collected)."""

    def __init__(self, executable: str, profile: str, deadline_s: float = 30.0):
        self.process = subprocess.Popen(
            [
                executable,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--no-first-run",
                f"--user-data-dir={profile}",
                "--remote-debugging-port=0",  # it writes the port it took to DevToolsActivePort
                "about:blank",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        port_file = os.path.join(profile, "DevToolsActivePort")
        port = _until(lambda: _read_first_line(port_file), deadline_s, "Chromium to open its DevTools port")
        pages = _until(
            lambda: [t for t in httpx.get(f"http://127.0.0.1:{port}/json/list").json() if t["type"] == "page"],
            deadline_s,
            "Chromium's first page",
        )
        self.socket = websocket.create_connection(
            pages[0]["webSocketDebuggerUrl"], timeout=deadline_s, suppress_origin=True
        )
        self.ids = itertools.count(1)
        self.events: list[dict] = []
        self.call("Runtime.enable")
        self.call("Page.enable")

    def call(self, method: str, **params) -> dict:
        sent = next(self.ids)
        self.socket.send(json.dumps({"id": sent, "method": method, "params": params}))
        while True:
            message = json.loads(self.socket.recv())
            if message.get("id") == sent:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message.get("result", {})
            self.events.append(message)

    def evaluate(self, expression: str):
        """The value of a JavaScript expression in the page (awaited if a promise)."""
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            raise PageError(f"{expression}: {result['exceptionDetails'].get('exception', result['exceptionDetails'])}")
        return result["result"].get("value")

    def wait_for(self, expression: str, what: str, deadline_s: float = 30.0):
        """The expression's value once it is truthy (an element: True), polled under a deadline."""
        value = f"(() => {{ const v = ({expression}); return v instanceof Node ? true : v; }})()"
        return _until(lambda: self.evaluate(value), deadline_s, what, on_timeout=self.page_text)

    def page_text(self) -> str:
        return str(self.evaluate("document.body ? document.body.innerText.slice(0, 3000) : ''"))

    def close(self) -> None:
        self.socket.close()
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def _read_first_line(path: str) -> str | None:
    try:
        with open(path) as f:
            line = f.readline().strip()
    except FileNotFoundError:
        return None
    return line or None


def _until(fn, deadline_s: float, what: str, on_timeout=None):
    """``fn()`` once it returns something truthy, polled every 50 ms, else a timeout naming
    ``what`` (and ``on_timeout()``, what the page shows)."""
    end = time.monotonic() + deadline_s
    while True:
        try:
            value = fn()
        except (OSError, httpx.HTTPError, ValueError, PageError):  # not there yet (the page still loads)
            value = None
        if value:
            return value
        if time.monotonic() > end:
            shown = f"; the page shows: {on_timeout()!r}" if on_timeout is not None else ""
            raise TimeoutError(f"waited {deadline_s} s for {what}{shown}")
        time.sleep(0.05)  # polling a condition, with a deadline


@pytest.fixture
def browser(tmp_path):
    executable = _chromium()
    if executable is None:
        pytest.skip("needs Chromium (Debian: apt-get install chromium) to open the page in a browser")
    b = Browser(executable, str(tmp_path / "profile"))
    yield b
    b.close()


OPERATION = "[...document.querySelectorAll('.opblock')].find(o => o.querySelector(\"[data-path='{path}']\") && o.classList.contains('opblock-{method}'))"


def test_the_page_lists_the_flows_and_try_it_out_answers(cluster, browser):
    browser.call("Page.navigate", url=cluster.url + "/")  # sent on to /docs
    browser.wait_for("!document.getElementById('token').hidden", "the page to ask for the token")
    for token in ("not-the-token", TOKEN):
        browser.evaluate(
            f"document.getElementById('token-value').value = {json.dumps(token)};"
            "document.getElementById('token-open').click(); true"
        )
        if token != TOKEN:
            refused = browser.wait_for("document.getElementById('token-error').innerText", "the page to refuse it")
            assert "refused" in refused
    paths = browser.wait_for(
        "(() => { const p = [...document.querySelectorAll('.opblock-summary-path')].map(e => e.dataset.path);"
        " return p.includes('/flows/double') && p.includes('/flows/brightness') && p; })()",
        "the page to list the deployed flows",
    )
    assert "/flows/double" in paths and "/flows/brightness" in paths
    assert browser.evaluate("location.pathname") == "/docs"

    op = OPERATION.format(path="/flows/double", method="post")
    browser.evaluate(f"{op}.querySelector('.opblock-summary-control').click(); true")
    browser.wait_for(f"{op}.querySelector('.try-out__btn')", "the operation to open")
    example = browser.wait_for(
        f"{op}.querySelector('.body-param__example, .highlight-code') && {op}.innerText", "its example body"
    )
    assert '"x": 0' in example  # the request body's example, from the document
    browser.evaluate(f"{op}.querySelector('.try-out__btn').click(); true")
    browser.wait_for(f"{op}.querySelector('textarea.body-param__text')", "the body to be editable")
    # type the body as a person would: select what is there, type over it
    browser.evaluate(f"const t = {op}.querySelector('textarea.body-param__text'); t.focus(); t.select(); true")
    browser.call("Input.insertText", text='{"x": 21}')
    browser.evaluate(f"{op}.querySelector('.execute').click(); true")
    status = browser.wait_for(
        f"(() => {{ const s = {op}.querySelector('.live-responses-table tr.response .response-col_status');"
        " return s && s.innerText.trim(); })()",
        "the answer to be shown",
    )
    answer = browser.evaluate(
        f"{op}.querySelector('.live-responses-table tr.response .response-col_description').innerText"
    )
    assert status == "200", answer
    assert '"y": 42' in answer, answer  # the flow's answer, shown on the page
