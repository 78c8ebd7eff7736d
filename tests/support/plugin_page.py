"""The operator page's tests (tests/plugins): where the plugin lives, the users of Airflow's SimpleAuthManager and
the key that signs their tokens, the definitions with a recovery-point objective, and the page's app over a
segrep environment. The fixtures that use them are in tests/plugins/conftest.py, which also gives Airflow a
throw-away home and puts the plugin package on ``sys.path`` (as the api-server does) before any test runs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tests.support.airflow import REPO
from tests.support.env import ORDERS_YAML, Env

PLUGINS = REPO / "plugins"
JWT_SECRET = "segrep-plugin-tests-only-" + "0123456789abcdef" * 4
USERS = "admin:admin,viewer:viewer,nobody:"  # nobody: no role, so the auth manager allows nothing

# `events` (3 sites) with an objective, `orders` without: the page's rows, chart and RPO column.
RPO_YAML = ORDERS_YAML.replace("    replicas: [dr, edge]\n", "    replicas: [dr, edge]\n    policy: {rpo: 15m}\n")


@dataclass(frozen=True)
class Tokens:
    admin: str
    viewer: str
    nobody: str

    def header(self, who: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {getattr(self, who)}"}


def users() -> list[tuple[str, str]]:
    """(name, role) of each user in USERS; an empty role for a user without one."""
    return [(name, role) for name, _, role in (u.partition(":") for u in USERS.split(","))]


def app_for(env: Env) -> Any:
    """The plugin's app reading ``env`` (its definitions file; the catalog from SEGREP_CATALOG_URL)."""
    from segrep_page.app import create_app
    from segrep_page.source import Source

    return create_app(Source(str(env.config)))
