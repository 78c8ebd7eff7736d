"""The FastAPI app the api-server mounts at ``/segrep``: the page (``/``), its numbers as JSON
(``/api/overview``), the Prometheus endpoint (``/metrics``) and the page's static files (``/static``:
stylesheet, script and the vendored Chart.js; nothing secret).

Every data route is read-only and authorized (``access``): the user comes from Airflow's token (or, for
``/metrics`` only, the scraper token), the tables shown are those whose replication DAG the user may read.
The numbers come from one call of ``segrep.replication.overview.build_overview`` per request (the records of
``segrep status``), the lag chart of the window asked for (``history``), the split progress, and the state of
each table's replication DAG in Airflow (``airflow_state``); the catalog is found as the DAGs find it
(``source``). Synchronous routes: FastAPI runs them in its thread pool, so a catalog read never blocks the
api-server's event loop.

Query parameters: ``table`` keeps one table (a malformed name is 422, a table not in the catalog or not
readable 404: a filter that matches nothing returns nothing), ``window`` the chart's range (1h, 6h, 24h, 7d;
the page shows 6h unless asked, the JSON every window), ``dag_id`` (the page, from a DAG's tab) that DAG's
table. segrep that cannot be read is 503 naming the part (definitions, uninitialised or unreachable catalog),
never a server path.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import urlencode

from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from jinja2 import Environment, FileSystemLoader, select_autoescape
from sqlalchemy import select
from sqlalchemy.exc import SQLAlchemyError

from segrep.catalog import models as m
from segrep.core.names import NAME_RE
from segrep.replication.overview import Overview, build_overview
from segrep.split.candidates import SplitCandidate, split_candidates
from segrep.split.progress import SplitProgress, split_progress
from segrep_page import access, airflow_state, history, metrics, present
from segrep_page.scrape_token import ScrapeToken
from segrep_page.source import UNREACHABLE, Segrep, Source, Unavailable, public

log = logging.getLogger(__name__)

PREFIX = "/segrep"
HERE = Path(__file__).parent
REFRESH_S = 30  # the page's auto-refresh period
_DAG_OF_TABLE = re.compile(r"segrep_(?:replicate|maintain|verify|split)_(?P<table>[a-z][a-z0-9_]*)")
_WINDOW_LABELS = {"1h": "1 h", "6h": "6 h", "24h": "24 h", "7d": "7 days"}
User = Annotated[Any, Depends(access.current_user)]  # module level: FastAPI resolves the string annotations here
_templates = Environment(loader=FileSystemLoader(HERE / "templates"), autoescape=select_autoescape(["html"]))


@dataclass(frozen=True)
class Gathered:
    """One request's numbers for the tables shown."""

    overview: Overview
    series: dict[str, list[history.Series]]
    splits: list[SplitProgress]
    dags: dict[str, dict[str, Any]]  # table -> present.dag_view


def _bases(request: Request) -> tuple[str, str]:
    """(this app's base path, the Airflow UI's base path): the mount's root path, which carries the
    api-server's own base path when Airflow is served under one."""
    root = str(request.scope.get("root_path", "")).rstrip("/")
    return root, root[: -len(PREFIX)] if root.endswith(PREFIX) else ""


def _is_page(request: Request) -> bool:
    return request.url.path.rstrip("/") in ("", PREFIX)


def create_app(source: Source | None = None) -> FastAPI:
    """The app; ``source`` finds the definitions and catalog (default: as the DAGs do, ``SEGREP_CONFIG``)."""
    src = source or Source()
    app = FastAPI(title="segrep replication", docs_url=None, redoc_url=None, openapi_url=None)
    app.mount("/static", StaticFiles(directory=HERE / "static"), name="static")

    def authorized(user: Any) -> tuple[Segrep, access.Viewer]:
        with _reading():
            seg = src.get()
            with seg.catalog.read() as s:
                names = list(s.scalars(select(m.Table.name).order_by(m.Table.name)))
        return seg, access.authorize(user, names)

    def gather(
        seg: Segrep, viewer: access.Viewer, shown: frozenset[str], windows: list[str], links: present.Links
    ) -> Gathered:
        with _reading():
            overview = build_overview(seg.catalog, rpo=seg.rpo, tables=shown, history=False)
            sites = {t.name: [r.site for r in t.rows if r.target is not None] for t in overview.tables}
            series = history.lag_series(seg.catalog, sites, windows, overview.now_us)
            splits = [sp for sp in split_progress(seg.catalog) if sp.table in shown]
        states = airflow_state.read_states([access.replication_dag_id(t) for t in shown])
        dags = {
            t: present.dag_view(
                t, None if states is None else states[access.replication_dag_id(t)], t in viewer.runs, links
            )
            for t in sorted(shown)
        }
        return Gathered(overview, series, splits, dags)

    @app.exception_handler(HTTPException)
    async def answer(request: Request, exc: HTTPException) -> Response:
        """The page sends a visitor without a session to Airflow's login (and back) and shows its other errors
        as a page; the API answers JSON ``{"detail": ...}``."""
        if _is_page(request) and request.method == "GET":
            if exc.status_code == 401:
                from airflow.api_fastapi.app import get_auth_manager

                _, ui = _bases(request)
                return RedirectResponse(ui + get_auth_manager().get_url_login(next_url=str(request.url)))
            html = _templates.get_template("error.html").render(
                base=_bases(request)[0], status=exc.status_code, detail=exc.detail
            )
            return HTMLResponse(html, status_code=exc.status_code, headers=exc.headers)
        return JSONResponse({"detail": exc.detail}, status_code=exc.status_code, headers=exc.headers)

    @app.get("/", response_class=HTMLResponse)
    def page(
        request: Request, user: User, dag_id: str | None = None, table: str | None = None, window: str | None = None
    ) -> HTMLResponse:
        wanted = _table_param(table)
        shown_window = _window_param(history.DEFAULT_WINDOW if window is None else window)[0]
        seg, viewer = authorized(user)
        base, ui = _bases(request)
        links = present.Links(ui)
        focus = None
        if wanted is not None:
            shown = _only(viewer, wanted)
        elif dag_id is not None:
            focus_table = _table_of(dag_id)
            if focus_table is None:
                shown, note = viewer.tables, "not a DAG of a table: every table shown"
            elif focus_table in viewer.tables:
                shown, note = frozenset({focus_table}), f"table {focus_table}"
            else:  # the filter matches nothing: nothing shown, and why
                shown, note = frozenset(), f"table {focus_table} is not in the catalog, or you may not read its DAG"
            focus = {"dag_id": dag_id, "table": focus_table if shown == {focus_table} else None, "note": note}
        else:
            shown = viewer.tables
        got = gather(seg, viewer, shown, [shown_window], links)
        candidates: list[SplitCandidate] = []
        if focus is not None and focus["table"] and dag_id and dag_id.startswith("segrep_split_"):
            with _reading():  # what its form asks for
                candidates = split_candidates(seg.catalog, focus["table"])
        tables = [present.table_view(t, got.overview.now_us, links, got.dags[t.name]) for t in got.overview.tables]
        html = _templates.get_template("page.html").render(
            base=base,
            generated=present.iso(got.overview.now_us),
            viewer=viewer.name,
            focus=focus,
            problems=_problems(seg),
            attention=[t["dag"] for t in tables if t["dag"]["problem"]],
            tables=tables,
            window=shown_window,
            window_s=history.WINDOWS[shown_window],
            windows=[
                {
                    "name": w,
                    "label": label,
                    "seconds": history.WINDOWS[w],
                    "href": "?" + urlencode({**request.query_params, "window": w}),
                    "current": w == shown_window,
                }
                for w, label in _WINDOW_LABELS.items()
            ],
            refresh_s=REFRESH_S,
            charts=present.chart_data(got.overview.tables, got.series, got.overview.now_us),
            splits=[present.split_view(sp, links) for sp in got.splits],
            candidates=candidates,
            failovers=[
                {**vars(f), "done": present.iso(f.done_us), "runs_url": links.runs_around("segrep_failover", f.done_us)}
                for f in got.overview.failovers
            ],
        )
        return HTMLResponse(html, headers={"Cache-Control": "no-store"})

    @app.get("/api/overview")
    def overview_json(
        request: Request, user: User, table: str | None = None, window: str | None = None
    ) -> JSONResponse:
        """The page's numbers: ``replication`` holds exactly ``segrep status --json``'s records."""
        wanted = _table_param(table)
        windows = _window_param(window)
        seg, viewer = authorized(user)
        shown = viewer.tables if wanted is None else _only(viewer, wanted)
        links = present.Links(_bases(request)[1])
        got = gather(seg, viewer, shown, windows, links)
        overview = got.overview
        return JSONResponse(
            {
                "now_us": overview.now_us,
                "replication": [t.to_dict() for t in overview.targets],
                "sites": [
                    present.row_view(r, overview.now_us, links, got.dags[t.name])
                    for t in overview.tables
                    for r in t.rows
                ],
                "leadership": [t.leadership.to_dict() for t in overview.tables],
                "dags": [got.dags[t.name] for t in overview.tables],
                "splits": [sp.to_dict() for sp in got.splits],
                "failovers": [vars(f) for f in overview.failovers],
                "windows": windows,
                "lag_history": present.chart_data(overview.tables, got.series, overview.now_us),
            },
            headers={"Cache-Control": "no-store"},
        )

    @app.get("/metrics", name=access.SCRAPE_ROUTE)
    def prometheus(user: User) -> Response:
        seg, viewer = authorized(user)
        with _reading():
            overview = build_overview(seg.catalog, rpo=seg.rpo, tables=viewer.tables, history=False)
        return Response(metrics.exposition(overview.targets), media_type=metrics.CONTENT_TYPE)

    app.state.source = src
    app.state.scrape_token = ScrapeToken()
    return app


@contextmanager
def _reading() -> Iterator[None]:
    """segrep's definitions and catalog read inside: what cannot be read is a 503 naming the part."""
    try:
        yield
    except Unavailable as exc:
        raise HTTPException(503, str(exc)) from None
    except SQLAlchemyError as exc:
        log.warning("segrep page: the catalog cannot be read: %s", exc)
        raise HTTPException(503, UNREACHABLE) from None


def _short(value: str) -> str:
    return repr(value if len(value) <= 64 else value[:64] + "...")


def _table_param(table: str | None) -> str | None:
    """The ``table`` asked for; 422 for a name no table can have."""
    if table is not None and not NAME_RE.fullmatch(table):
        raise HTTPException(
            422, f"invalid table name {_short(table)}: use 1-63 characters a-z, 0-9 and _, starting with a letter"
        )
    return table


def _window_param(window: str | None) -> list[str]:
    try:
        return history.window_names(window)
    except history.BadWindow as exc:
        raise HTTPException(422, str(exc)) from None


def _only(viewer: access.Viewer, table: str) -> frozenset[str]:
    """Just ``table``; 404 when it is not in the catalog or not the user's to read (the same answer: a table
    the user may not read is not shown to exist)."""
    if table not in viewer.tables:
        raise HTTPException(404, f"no table {_short(table)} in the catalog that you may read")
    return frozenset({table})


def _table_of(dag_id: str | None) -> str | None:
    match = _DAG_OF_TABLE.fullmatch(dag_id or "")
    return match.group("table") if match else None


def _problems(seg: Segrep) -> str | None:
    """Tables the definitions leave out (their DAGs are not built): shown, since their RPO is unknown here."""
    errors = seg.defs.table_errors
    return public("; ".join(errors[name] for name in sorted(errors))) or None
