"""The web console under /console: committed static pages whose script reads the same API the
commands read, a login that keeps the token in an HttpOnly cookie, and the few read-only
routes the pages need that the API has not (the GPU grid, GPU-hours, gateway figures). This
package holds its pages and views; its routes are server/routers/console.py.

Policy stays in one place: every answer here goes through the server's auth and the same
PrivateData rule as the API's job routes; the pages only hide buttons the API would refuse.
See docs/CONSOLE.md.
"""

from __future__ import annotations

from importlib.resources import files

from fastapi.responses import HTMLResponse, Response

from shoal.server.auth import AuthError

COOKIE = "shoal_console"
HEADER = "x-shoal-console"  # the pages' requests carry it: a cross-site form cannot set it
PAGES = ("overview", "queue", "serving", "accounting", "nodes")

_STATIC = files(__package__) / "static"
# The pages' own files only (no inline script, so an injected <script> does not run; inline
# style attributes draw the bars), and never inside another site's frame (a click there on
# Cancel would be the user's).
PAGE_HEADERS = {"cache-control": "no-store", "x-frame-options": "DENY",
                "content-security-policy": "default-src 'self'; style-src 'self' 'unsafe-inline'; "
                                           "img-src 'self' data:; frame-ancestors 'none'"}
_TYPES = {"js": "text/javascript", "css": "text/css", "html": "text/html", "svg": "image/svg+xml"}


def cookie_credential(authorization: str | None, cookie: str | None, marked: str | None) -> str | None:
    """The Authorization header to resolve: the request's own, else the console's cookie when the
    request carries the console's header (so a cross-site page cannot spend the cookie)."""
    if authorization or not cookie or not marked:
        return authorization
    return f"Bearer {cookie}"


def page_html(name: str, job_id: int | None = None) -> HTMLResponse:
    """A page: the shell the pages' script fills in, for one page (and one job)."""
    html = _asset("shell.html").decode().replace("{{page}}", name).replace(
        "{{job}}", "" if job_id is None else str(job_id))
    return HTMLResponse(html, headers=PAGE_HEADERS)


def login_html(next: str, error: str) -> HTMLResponse:
    """The login page, going on to ``next`` (a console path only) and saying why the last try failed."""
    html = _asset("login.html").decode().replace("{{next}}", _attr(local_path(next))).replace(
        "{{error}}", _text(error))
    return HTMLResponse(html, status_code=401 if error else 200, headers=PAGE_HEADERS)


def static(name: str):
    ext = name.rpartition(".")[2]
    if "/" in name or ext not in _TYPES:
        raise AuthError(404, f"no such file: {name}")
    try:
        body = _asset(name)
    except FileNotFoundError:
        raise AuthError(404, f"no such file: {name}") from None
    return Response(body, media_type=_TYPES[ext], headers={"cache-control": "no-cache"})


def _asset(name: str) -> bytes:
    return (_STATIC / name).read_bytes()


def local_path(target: str) -> str:
    """Only a console path may follow a login (no open redirect to another site)."""
    return target if target.startswith("/console/") and "//" not in target and "\\" not in target else "/console/overview"


def _text(s: str) -> str:
    return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _attr(s: str) -> str:
    return _text(s).replace('"', "&quot;")
