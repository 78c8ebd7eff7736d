"""The FastAPI app the api-server mounts at ``/segrep``: the page (``/``), its numbers as JSON
(``/api/overview``), the Prometheus endpoint (``/metrics``) and the page's static files (``/static``:
stylesheet, script and the vendored Chart.js; nothing secret).

Every data route is read-only and authorized (``access``): the user comes from Airflow's token, the tables
shown are those whose replication DAG the user may read. The numbers come from one call of
``segrep.replication.overview.build_overview`` per request (the records of ``segrep status``) plus the split
progress; the catalog is found as the DAGs find it (``source``). Synchronous routes: FastAPI runs them in its
thread pool, so a catalog read never blocks the api-server's event loop.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any

from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from jinja2 import Environment, FileSystemLoader, select_autoescape
from sqlalchemy import select

from segrep.catalog import models as m
from segrep.core.errors import SegrepError
from segrep.replication.overview import Overview, build_overview
from segrep.split.candidates import SplitCandidate, split_candidates
from segrep.split.progress import SplitProgress, split_progress
from segrep_page import access, metrics, present
from segrep_page.source import Segrep, Source

PREFIX = "/segrep"
HERE = Path(__file__).parent
_DAG_OF_TABLE = re.compile(r"segrep_(?:replicate|maintain|verify|split)_(?P<table>[a-z][a-z0-9_]*)")
User = Annotated[Any, Depends(access.current_user)]  # module level: FastAPI resolves the string annotations here
_templates = Environment(loader=FileSystemLoader(HERE / "templates"), autoescape=select_autoescape(["html"]))


def _bases(request: Request) -> tuple[str, str]:
    """(this app's base path, the Airflow UI's base path): the mount's root path, which carries the
    api-server's own base path when Airflow is served under one."""
    root = str(request.scope.get("root_path", "")).rstrip("/")
    return root, root[: -len(PREFIX)] if root.endswith(PREFIX) else ""


def create_app(source: Source | None = None) -> FastAPI:
    """The app; ``source`` finds the definitions and catalog (default: as the DAGs do, ``SEGREP_CONFIG``)."""
    src = source or Source()
    app = FastAPI(title="segrep replication", docs_url=None, redoc_url=None, openapi_url=None)
    app.mount("/static", StaticFiles(directory=HERE / "static"), name="static")

    def gather(user: Any, table: str | None = None) -> tuple[access.Viewer, Segrep, Overview, list[SplitProgress]]:
        seg = _open(src)
        with seg.catalog.read() as s:
            names = list(s.scalars(select(m.Table.name).order_by(m.Table.name)))
        viewer = access.authorize(user, names)
        shown = viewer.tables & {table} if table and table in viewer.tables else viewer.tables
        overview = build_overview(seg.catalog, rpo=seg.rpo, tables=shown)
        splits = [sp for sp in split_progress(seg.catalog) if sp.table in shown]
        return viewer, seg, overview, splits

    @app.exception_handler(HTTPException)
    async def login_first(request: Request, exc: HTTPException) -> Response:
        """The page sends a visitor without a session to Airflow's login (and back); the API answers 401."""
        if exc.status_code == 401 and request.url.path.rstrip("/") in ("", PREFIX) and request.method == "GET":
            from airflow.api_fastapi.app import get_auth_manager

            _, ui = _bases(request)
            return RedirectResponse(ui + get_auth_manager().get_url_login(next_url=str(request.url)))
        return JSONResponse({"detail": exc.detail}, status_code=exc.status_code, headers=exc.headers)

    @app.get("/", response_class=HTMLResponse)
    def page(request: Request, user: User, dag_id: str | None = None) -> HTMLResponse:
        focus_table = _table_of(dag_id)
        viewer, seg, overview, splits = gather(user, focus_table)
        base, ui = _bases(request)
        links = present.Links(ui)
        focus = None
        candidates: list[SplitCandidate] = []
        if dag_id is not None:
            shown = focus_table is not None and focus_table in viewer.tables
            focus = {
                "dag_id": dag_id,
                "table": focus_table if shown else None,
                "note": f"table {focus_table}" if shown else "not a DAG of a table you may read: every table shown",
            }
            if shown and focus_table is not None and dag_id.startswith("segrep_split_"):  # what its form asks for
                candidates = split_candidates(seg.catalog, focus_table)
        html = _templates.get_template("page.html").render(
            base=base,
            generated=present.iso(overview.now_us),
            viewer=viewer.name,
            focus=focus,
            problems=_problems(seg),
            tables=[present.table_view(t, overview.now_us, links) for t in overview.tables],
            charts=present.chart_data(overview),
            splits=[present.split_view(sp, links) for sp in splits],
            candidates=candidates,
            failovers=[
                {**vars(f), "done": present.iso(f.done_us), "runs_url": links.runs_around("segrep_failover", f.done_us)}
                for f in overview.failovers
            ],
        )
        return HTMLResponse(html, headers={"Cache-Control": "no-store"})

    @app.get("/api/overview")
    def overview_json(request: Request, user: User, table: str | None = None) -> JSONResponse:
        """The page's numbers: ``replication`` holds exactly ``segrep status --json``'s records."""
        _, overview, splits = gather(user, table)[1:]
        links = present.Links(_bases(request)[1])
        return JSONResponse(
            {
                "now_us": overview.now_us,
                "replication": [t.to_dict() for t in overview.targets],
                "sites": [present.row_view(r, overview.now_us, links) for t in overview.tables for r in t.rows],
                "leadership": [t.leadership.to_dict() for t in overview.tables],
                "splits": [sp.to_dict() for sp in splits],
                "failovers": [vars(f) for f in overview.failovers],
                "lag_history": present.chart_data(overview),
            },
            headers={"Cache-Control": "no-store"},
        )

    @app.get("/metrics")
    def prometheus(user: User) -> Response:
        seg = _open(src)
        with seg.catalog.read() as s:
            names = list(s.scalars(select(m.Table.name).order_by(m.Table.name)))
        viewer = access.authorize(user, names)
        overview = build_overview(seg.catalog, rpo=seg.rpo, tables=viewer.tables, history=False)
        return Response(metrics.exposition(overview.targets), media_type=metrics.CONTENT_TYPE)

    app.state.source = src
    return app


def _open(src: Source) -> Segrep:
    """The definitions and catalog; a definitions file that cannot be used is a 503 naming the problem."""
    try:
        return src.get()
    except (SegrepError, OSError) as exc:
        raise HTTPException(503, f"segrep's definitions cannot be read: {exc}") from None


def _table_of(dag_id: str | None) -> str | None:
    match = _DAG_OF_TABLE.fullmatch(dag_id or "")
    return match.group("table") if match else None


def _problems(seg: Segrep) -> str | None:
    """Tables the definitions leave out (their DAGs are not built): shown, since their RPO is unknown here."""
    errors = seg.defs.table_errors
    return "; ".join(errors[name] for name in sorted(errors)) or None
