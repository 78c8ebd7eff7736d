"""`segrep apply` with a site whose store cannot be used: refused by name before anything changes.

Each case is checked through the command (exit 2, one line naming the site and its URI, nothing written: the
catalog's rows and every file under the environment's root as before) and, where the definitions loader
might refuse the URI on its own, also through ``apply_definitions`` and the probe itself, so the probe is what
is tested. A dry run only looks: it creates nothing, not even a missing root.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from segrep.catalog.apply import apply_definitions
from segrep.config.definitions import Definitions, SiteDef
from segrep.core.errors import SegrepError
from segrep.storage import probe
from segrep.storage.identity import MARKER_NAME
from segrep.storage.probe import PROBE_PREFIX, SiteUnusableError, check_sites
from segrep.storage.site import Site
from tests.support.badinput import assert_user_error, tree_state, unchanged
from tests.support.cli import cli
from tests.support.env import ORDERS_YAML, Env, make_env

IS_ROOT = os.geteuid() == 0


def _with_site_uri(env: Env, site: str, uri: str) -> Path:
    """A definitions file beside the environment's, with ``site`` moved to ``uri``."""
    old = f"{site}: {{id: {_SITE_IDS[site]}, uri: sites/{site}}}"
    assert old in ORDERS_YAML
    path = env.root / f"{site}-moved.yaml"
    path.write_text(ORDERS_YAML.replace(old, f"{site}: {{id: {_SITE_IDS[site]}, uri: '{uri}'}}"))
    return path


_SITE_IDS = {"primary": 1, "dr": 2, "edge": 3}


def _defs_with(defs: Definitions, site: str, uri: str) -> Definitions:
    """The loaded definitions with one site's URI replaced (past the loader's own checks)."""
    sites = dict(defs.sites)
    sites[site] = SiteDef(site, sites[site].site_id, uri)
    return dataclasses.replace(defs, sites=sites)


def _unwritable_dir(tmp_path: Path) -> Path:
    """A directory this process cannot create anything in. As root a mode does not stop writes, so /proc
    (where even root cannot create a file) stands in."""
    if IS_ROOT:
        return Path("/proc/segrep-unwritable")
    d = tmp_path / "locked"
    d.mkdir()
    d.chmod(0o500)
    return d


def _probe_leftovers(root: Path) -> list[Path]:
    return [p for p in root.rglob(f"{PROBE_PREFIX}*")]


# -- through the command -------------------------------------------------------------------------------------


@pytest.mark.parametrize("dry_run", [False, True], ids=["apply", "dry-run"])
def test_a_root_under_a_plain_file_is_refused_by_name(env: Env, dry_run: bool) -> None:
    blocker = env.root / "blocker"
    blocker.write_text("not a directory\n")
    config = _with_site_uri(env, "dr", str(blocker / "dr"))
    with unchanged(env):
        code, out, err = cli(env, "apply", *(["--dry-run"] if dry_run else []), config=config)
    assert_user_error(code, out, err, "site dr", str(blocker / "dr"), "not a directory")


@pytest.mark.parametrize("dry_run", [False, True], ids=["apply", "dry-run"])
def test_a_root_that_is_a_plain_file_is_refused_by_name(env: Env, dry_run: bool) -> None:
    plain = env.root / "plain"
    plain.write_text("not a directory\n")
    config = _with_site_uri(env, "edge", str(plain))
    with unchanged(env):
        code, out, err = cli(env, "apply", *(["--dry-run"] if dry_run else []), config=config)
    assert_user_error(code, out, err, "site edge", str(plain))


def test_an_unwritable_root_is_refused_by_name(env: Env, tmp_path: Path) -> None:
    root = _unwritable_dir(tmp_path) / "dr"
    config = _with_site_uri(env, "dr", str(root))
    with unchanged(env):
        code, out, err = cli(env, "apply", config=config)
    assert_user_error(code, out, err, "site dr", str(root))
    assert not root.exists()


class _HangingFS:
    """A store that never answers: every call waits until the test lets it go."""

    def __init__(self, release: threading.Event) -> None:
        self.release = release

    def __getattr__(self, name: str) -> Any:
        def hang(*args: Any, **kwargs: Any) -> Any:
            self.release.wait(60)
            raise OSError("released")

        return hang


@pytest.mark.parametrize("dry_run", [False, True], ids=["apply", "dry-run"])
def test_a_store_that_does_not_answer_is_named_within_the_timeout(
    env: Env, monkeypatch: pytest.MonkeyPatch, dry_run: bool
) -> None:
    release = threading.Event()

    def open_site(name: str, uri: str) -> Site:
        site = Site(name, uri)
        if name == "edge":
            site.fs = _HangingFS(release)  # type: ignore[assignment]
        return site

    monkeypatch.setattr(probe, "open_site", open_site)
    monkeypatch.setenv(probe.TIMEOUT_ENV, "0.3")
    try:
        with unchanged(env):
            started = time.monotonic()
            code, out, err = cli(env, "apply", *(["--dry-run"] if dry_run else []))
            elapsed = time.monotonic() - started
        assert_user_error(code, out, err, "site edge", str(env.site_dir("edge")), "did not answer within 0.3 s")
        assert "site dr" not in err and "site primary" not in err  # the others answered
        assert elapsed < 10, elapsed
    finally:
        release.set()


@pytest.mark.parametrize("value", ["soon", "0", "-1", "nan", "inf", "1e9"])
def test_a_bad_probe_timeout_is_refused(env: Env, monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv(probe.TIMEOUT_ENV, value)
    with unchanged(env):
        code, out, err = cli(env, "apply")
    assert_user_error(code, out, err, probe.TIMEOUT_ENV, repr(value))


_ENV_TEXT = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=12)


@settings(max_examples=60)
@given(st.one_of(_ENV_TEXT, st.floats().map(repr)))
def test_the_probe_timeout_is_a_bounded_number_of_seconds_or_a_clear_error(text: str) -> None:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(probe.TIMEOUT_ENV, text)
        try:
            value = probe.probe_timeout_s()
        except SegrepError as exc:
            assert probe.TIMEOUT_ENV in str(exc) and "\n" not in str(exc)
        else:
            assert 0 < value <= 3600


def test_dry_run_creates_nothing_and_apply_leaves_no_probe_behind(catalog_url: str, tmp_path: Path) -> None:
    env = make_env(tmp_path, catalog_url, apply=False)
    try:
        assert not (env.root / "data" / "sites").exists()  # no site root exists yet
        with unchanged(env):
            code, out, err = cli(env, "apply", "--dry-run")
        assert code == 0, err
        assert "would add     site dr" in out
        before = tree_state(env.root)
        code, out, err = cli(env, "apply")
        assert code == 0, err
        # the probe removed what it made for itself; each new site's root holds its identity marker only
        added = sorted(set(tree_state(env.root)) - set(before))
        markers = [f"data/sites/{site}/{MARKER_NAME}" for site in ("dr", "edge", "primary")]
        assert added == sorted(["data", "data/sites", *(m.rsplit("/", 1)[0] for m in markers), *markers]), added
        code, out, err = cli(env, "apply")
        assert code == 0 and "nothing to change" in out, err
        assert _probe_leftovers(env.root) == [] and env.site_dir("dr").is_dir()
    finally:
        env.catalog.dispose()


# -- past the definitions loader: apply_definitions and the probe itself -----------------------------------------


def test_a_root_replaced_by_a_plain_file_after_loading_is_refused(env: Env) -> None:
    defs = env.defs
    shutil.rmtree(env.site_dir("dr"))  # it held only its identity marker
    env.site_dir("dr").write_text("down for maintenance\n")
    with unchanged(env), pytest.raises(SiteUnusableError) as caught:
        apply_definitions(env.catalog, _defs_with(defs, "dr", str(env.site_dir("dr"))))
    message = str(caught.value)
    assert f"site dr ({env.site_dir('dr')})" in message and "is a plain file, not a directory" in message, message


def test_an_unwritable_root_is_refused_by_apply_definitions(env: Env, tmp_path: Path) -> None:
    root = _unwritable_dir(tmp_path) / "edge"
    with unchanged(env), pytest.raises(SiteUnusableError) as caught:
        apply_definitions(env.catalog, _defs_with(env.defs, "edge", str(root)))
    assert f"site edge ({root}) is not usable" in str(caught.value), caught.value


@pytest.mark.parametrize(
    ("uri", "reason"),
    [
        ("ftp://host/segrep", "cannot open its store: ArrowInvalid"),
        ("/proc/segrep-probe-test/root", "cannot write under its root"),
    ],
    ids=["unsupported-scheme", "under-proc"],
)
def test_the_probe_names_the_site_uri_and_reason(uri: str, reason: str) -> None:
    if uri.startswith("/proc") and not IS_ROOT:
        reason = "is not writable"  # seen by the read-only check before any write
    with pytest.raises(SiteUnusableError) as caught:
        check_sites([SiteDef("far", 9, uri)], write=True, timeout_s=10)
    message = str(caught.value)
    assert message.startswith(f"site far ({uri}) is not usable: ") and reason in message, message
    assert "\n" not in message


def test_every_unusable_site_is_named_in_one_line(tmp_path: Path) -> None:
    plain = tmp_path / "plain"
    plain.write_text("x")
    good = tmp_path / "good"
    sites = [SiteDef("a", 1, str(plain)), SiteDef("b", 2, str(good)), SiteDef("c", 3, str(plain / "under"))]
    with pytest.raises(SiteUnusableError) as caught:
        check_sites(sites, write=True, timeout_s=10)
    message = str(caught.value)
    assert "site a (" in message and "site c (" in message and "site b" not in message, message
    assert not good.exists()  # made for the probe and removed again
    check_sites([SiteDef("b", 2, str(good))], write=False, timeout_s=10)
    assert not good.exists()
