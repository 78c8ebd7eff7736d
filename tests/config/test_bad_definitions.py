"""Bad definitions files through `segrep apply` (issue 11 items 5, 6 and 8, definitions side).

Each case is the environment's own definitions file with one thing wrong, applied to an initialized catalog:
the command must exit 2 with one line naming the file and the problem, no traceback, and change nothing (no
catalog row, no file or directory under the environment's root: a data_dir of ``['a', 'b']`` must not create
a directory of that name). The same cases, loaded with ``isolate_tables=True`` (the DAG files' load), leave a
bad table out and keep the others, or still raise when the file as a whole is wrong.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from segrep.config.definitions import load_definitions
from segrep.core.errors import ConfigError
from tests.support.badinput import assert_user_error, unchanged
from tests.support.cli import cli
from tests.support.env import ORDERS_YAML, Env, env_fixture, pg_schema_url, sqlite_url

Doc = dict[str, Any]
# A hypothesis example reuses the function-scoped `env`: fine, since every example must leave it unchanged.
CLI_SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def base_doc() -> Doc:
    doc: Doc = yaml.safe_load(ORDERS_YAML)
    return copy.deepcopy(doc)


def policy(**values: Any) -> Callable[[Doc], None]:
    return lambda doc: doc["tables"]["orders"].setdefault("policy", {}).update(values)


def orders(**values: Any) -> Callable[[Doc], None]:
    return lambda doc: doc["tables"]["orders"].update(values)


def site_uri(uri: str) -> Callable[[Doc], None]:
    return lambda doc: doc["sites"]["edge"].update(uri=uri)


def top(**values: Any) -> Callable[[Doc], None]:
    return lambda doc: doc.update(values)


def text_of(doc: Doc) -> bytes:
    return yaml.safe_dump(doc, sort_keys=False, allow_unicode=True).encode()


def replace_text(old: str, new: str) -> bytes:
    assert old in ORDERS_YAML
    return ORDERS_YAML.replace(old, new, 1).encode()


# (id, the file's bytes or a change to the document, the table the problem is local to or None, needles)
CASES: list[tuple[str, bytes | Callable[[Doc], None], str | None, tuple[str, ...]]] = [
    # item 5: policies the DAGs cannot build, or that never run
    ("schedule-words", policy(schedule="every hour"), "orders", ("table orders", "'every hour'")),
    ("schedule-zero", policy(schedule="0m"), "orders", ("table orders", "'0m'")),
    ("schedule-negative", policy(schedule="-5m"), "orders", ("table orders", "'-5m'")),
    ("schedule-unit", policy(schedule="10x"), "orders", ("table orders", "'10x'")),
    ("schedule-preset", policy(schedule="@fortnightly"), "orders", ("table orders", "'@fortnightly'", "preset")),
    ("schedule-minute-61", policy(schedule="61 * * * *"), "orders", ("table orders", "'61 * * * *'")),
    ("schedule-never-fires", policy(schedule="0 0 31 2 *"), "orders", ("table orders", "'0 0 31 2 *'", "never fires")),
    ("schedule-seconds-field", policy(schedule="0 * * * * *"), "orders", ("table orders", "'0 * * * * *'")),
    ("schedule-number", policy(schedule=5), "orders", ("table orders", "schedule 5")),
    ("maintenance-bogus", policy(maintenance_schedule="bogus"), "orders", ("maintenance_schedule", "'bogus'")),
    ("verify-bogus", policy(verify_schedule="@fortnightly"), "orders", ("verify_schedule", "'@fortnightly'")),
    # rounds on write: min_interval bounded, only with schedule: on_write; on_write only for the replication
    ("min-interval-2h", policy(schedule="on_write", min_interval="2h"), "orders", ("min_interval", "out of range")),
    ("min-interval-negative", policy(schedule="on_write", min_interval=-1), "orders", ("min_interval", "-1")),
    ("min-interval-words", policy(schedule="on_write", min_interval="soon"), "orders", ("min_interval", "'soon'")),
    ("min-interval-bool", policy(schedule="on_write", min_interval=True), "orders", ("min_interval", "True")),
    ("min-interval-float", policy(schedule="on_write", min_interval=1.5), "orders", ("min_interval", "1.5")),
    ("min-interval-null", policy(schedule="on_write", min_interval=None), "orders", ("min_interval", "None")),
    ("min-interval-cron", policy(min_interval="10s"), "orders", ("min_interval", "only applies to", "on_write")),
    ("on-write-typo", policy(schedule="on-write"), "orders", ("table orders", "'on-write'", "on_write")),
    ("maintenance-on-write", policy(maintenance_schedule="on_write"), "orders", ("maintenance_schedule", "on_write")),
    ("verify-on-write", policy(verify_schedule="on_write"), "orders", ("verify_schedule", "on_write")),
    ("verify-threshold-zero", policy(verify_spark_threshold_bytes=0), "orders", ("verify_spark_threshold_bytes",)),
    ("retry-delay-huge", policy(retry_delay_s=10**30), "orders", ("retry_delay_s", "out of range")),
    ("retry-delay-2h", policy(retry_delay_s="2h"), "orders", ("retry_delay_s", "out of range")),
    ("retries-huge", policy(retries=10**9), "orders", ("retries", "out of range")),
    ("retries-bool", policy(retries=True), "orders", ("retries", "expected an integer")),
    ("grace-float", policy(orphan_grace_s=1.5), "orders", ("orphan_grace_s", "1.5")),
    ("grace-huge", policy(orphan_grace_s="999999w"), "orders", ("orphan_grace_s", "out of range")),
    ("incoming-zero", policy(max_incoming_segments=0), "orders", ("max_incoming_segments", "out of range")),
    ("threshold-huge", policy(spark_copy_threshold_bytes=2**70), "orders", ("spark_copy_threshold_bytes",)),
    ("merge-rows-negative", policy(in_process_merge_max_rows=-1), "orders", ("in_process_merge_max_rows", "range")),
    ("merge-bytes-text", policy(in_process_merge_max_bytes="1G"), "orders", ("in_process_merge_max_bytes", "'1G'")),
    ("merge-engine-bogus", policy(merge_engine="jvm"), "orders", ("merge_engine", "auto, spark, in_process", "'jvm'")),
    (
        "end-before-start",
        policy(start_date="2026-06-01", end_date="2026-05-31"),
        "orders",
        ("end_date", "before start_date", "never run"),
    ),
    ("start-year-1", policy(start_date="0001-01-01"), "orders", ("start_date", "out of range")),
    ("start-year-9999", policy(start_date="9999-12-31T23:00:00-05:00"), "orders", ("start_date", "out of range")),
    ("start-number", policy(start_date=20260101), "orders", ("start_date", "20260101")),
    ("policy-not-a-mapping", orders(policy=0), "orders", ("table orders policy", "mapping")),
    # item 8: exit codes of plain bad input
    ("not-utf8", "data_dir: caf\xe9\n".encode("latin-1") + ORDERS_YAML.encode(), None, ("not UTF-8",)),
    ("nested-5000", b"data_dir: " + b"[" * 5000 + b"]" * 5000 + b"\n", None, ("nested more than",)),
    ("nested-maps", ("x:\n" + "".join(" " * i + "y:\n" for i in range(1, 200))).encode(), None, ("nested",)),
    ("data-dir-list", top(data_dir=["a", "b"]), None, ("data_dir", "['a', 'b']")),
    ("data-dir-number", top(data_dir=5), None, ("data_dir", "5")),
    ("data-dir-empty", top(data_dir=""), None, ("data_dir",)),
    ("data-dir-uri", top(data_dir="s3://bucket/x"), None, ("data_dir", "not a URI")),
    ("data-dir-proc", top(data_dir="/proc/self"), None, ("data_dir", "/proc")),
    ("data-dir-file", top(data_dir="a_file"), None, ("data_dir", "is not a directory")),
    ("data-dir-under-file", top(data_dir="a_file/data"), None, ("data_dir", "is not a directory")),
    (
        "dup-top",
        replace_text("data_dir: data\n", "data_dir: data\ndata_dir: other\n"),
        None,
        ("duplicate key 'data_dir'",),
    ),
    (
        "dup-site",
        replace_text("  dr: {id: 2, uri: sites/dr}\n", "  dr: {id: 2, uri: sites/dr}\n  dr: {id: 4, uri: x}\n"),
        None,
        ("duplicate key 'dr'",),
    ),
    (
        "dup-flow",
        replace_text("{id: 3, uri: sites/edge}", "{id: 3, uri: sites/edge, id: 4}"),
        None,
        ("duplicate key 'id'",),
    ),
    (
        "dup-column",
        replace_text("      o_clerk: string\n", "      o_clerk: string\n      o_clerk: int64\n"),
        None,
        ("duplicate key 'o_clerk'",),
    ),
    (
        "split-2-70",
        orders(split_points=[2**70]),
        "orders",
        ("split_points[0]", "1180591620717411303424", "out of range"),
    ),
    ("split-true", orders(split_points=[True]), "orders", ("split_points[0]", "True", "int64")),
    ("split-nan", orders(split_points=[float("nan"), 5]), "orders", ("split_points[0]", "nan", "NaN")),
    ("split-inf", orders(split_points=[1, float("inf")]), "orders", ("split_points[1]", "inf")),
    ("split-unsorted", orders(split_points=[300000, 150000]), "orders", ("strictly ascending", "split_points[1]")),
    ("split-equal", orders(split_points=[5, 5]), "orders", ("strictly ascending",)),
    ("split-fraction", orders(split_points=[1.5]), "orders", ("split_points[0]", "fractional")),
    ("split-null", orders(split_points=[1, None]), "orders", ("split_points[1]", "null")),
    ("split-not-list", orders(split_points=0), "orders", ("split_points", "must be a list")),
    (
        "split-number-for-string",
        lambda d: d["tables"]["events"].update(split_points=[5]),
        "events",
        ("split_points[0]", "string"),
    ),
    ("replicas-zero", orders(replicas=0), "orders", ("replicas",)),
    (
        "schema-from-nul",
        lambda d: d["tables"]["orders"].pop("columns") and orders(schema_from="a\x00b")(d),
        "orders",
        ("schema_from",),
    ),
    ("catalog-url-number", top(catalog_url=5), None, ("catalog_url", "5")),
    ("catalog-url-list", top(catalog_url=["x"]), None, ("catalog_url",)),
    ("not-a-mapping", b"- a\n- b\n", None, ("expected a mapping",)),
    ("empty-file", b"", None, ("expected a mapping",)),
    ("nul-byte", b"data_dir: \x00\n", None, ("not valid YAML",)),
    # item 6: site URIs, refused naming the site and the URI
    ("uri-ftp", site_uri("ftp://host/x"), None, ("site edge", "ftp://host/x", "unsupported scheme")),
    ("uri-http", site_uri("http://host/x"), None, ("site edge", "http://host/x", "unsupported scheme")),
    ("uri-https", site_uri("https://host/x"), None, ("site edge", "unsupported scheme")),
    ("uri-gs", site_uri("gs://bucket/x"), None, ("site edge", "gs://bucket/x", "unsupported scheme")),
    ("uri-hdfs", site_uri("hdfs://namenode:8020/x"), None, ("site edge", "unsupported scheme")),
    ("uri-file-empty", site_uri("file://"), None, ("site edge", "'file://'", "absolute path")),
    ("uri-file-relative", site_uri("file://relative/x"), None, ("site edge", "absolute path")),
    ("uri-file-one-slash", site_uri("file:/x"), None, ("site edge", "file:///")),
    ("uri-s3-no-bucket", site_uri("s3://"), None, ("site edge", "s3://bucket")),
    # keys under an S3 prefix get segrep's paths (up to 145 bytes and a slash) appended: 1,024 bytes at most
    ("uri-s3-prefix-too-long", site_uri("s3://bucket/" + "p" * 879), None, ("site edge", "879 bytes", "at most 878")),
    ("uri-s3-prefix-utf8-bytes", site_uri("s3://bucket/" + "é" * 440), None, ("site edge", "880 bytes", "UTF-8")),
    ("uri-proc", site_uri("/proc/self/x"), None, ("site edge", "/proc")),
    ("uri-sys", site_uri("/sys/kernel"), None, ("site edge", "/sys")),
    ("uri-dev", site_uri("/dev/shm/x"), None, ("site edge", "/dev")),
    ("uri-file-proc", site_uri("file:///proc/x"), None, ("site edge", "/proc")),
    ("uri-nul", site_uri("sites/a\x00b"), None, ("site edge", "NUL")),
    ("uri-windows-ish", site_uri("c:/data"), None, ("site edge", "unsupported scheme 'c'")),
]


def bad_file(env: Env, case: bytes | Callable[[Doc], None]) -> Path:
    """The case's definitions file, next to the environment's own (relative paths resolve the same)."""
    if callable(case):
        doc = base_doc()
        case(doc)
        data = text_of(doc)
    else:
        data = case
    path = env.config.with_name("bad.yaml")
    path.write_bytes(data)
    (env.root / "a_file").write_text("not a directory\n")
    return path


@pytest.fixture(scope="module", params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def applied_env(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    """One applied environment per backend for every refused file: each case checks that it changed nothing
    (``unchanged``), so the next case starts from the same catalog and sites."""
    root = tmp_path_factory.mktemp("bad-definitions")
    if request.param == "sqlite":
        yield from env_fixture(root, sqlite_url(root))
    else:
        for url in pg_schema_url(request.getfixturevalue("pg_server")):
            yield from env_fixture(root, url)


@pytest.mark.parametrize(("case", "bad_table", "needles"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_apply_refuses_a_bad_definitions_file(
    applied_env: Env, case: bytes | Callable[[Doc], None], bad_table: str | None, needles: tuple[str, ...]
) -> None:
    env = applied_env
    path = bad_file(env, case)
    for args in (["apply", "--dry-run"], ["apply"]):
        with unchanged(env):
            code, out, err = cli(env, *args, config=path)
        assert_user_error(code, out, err, str(path), *needles)


@pytest.mark.parametrize(("case", "bad_table", "needles"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_isolate_tables_leaves_out_only_the_bad_table(
    tmp_path: Path, case: bytes | Callable[[Doc], None], bad_table: str | None, needles: tuple[str, ...]
) -> None:
    """The DAG files' load: a problem local to one table leaves the other standing and records one line for the
    bad one; a problem of the file as a whole still raises."""
    env = Env(root=tmp_path, config=tmp_path / "segrep.yaml", url="")
    path = bad_file(env, case)
    if bad_table is not None:
        defs = load_definitions(path, isolate_tables=True)
        assert list(defs.tables) == [{"orders": "events", "events": "orders"}[bad_table]]
        assert list(defs.table_errors) == [bad_table]
        message = defs.table_errors[bad_table]
        assert "\n" not in message and str(path) in message
        for needle in needles:
            assert needle.lower() in message.lower(), (needle, message)
    else:
        with pytest.raises(ConfigError):
            load_definitions(path, isolate_tables=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_file", "bad.yaml"]  # loading created nothing


def test_valid_edge_cases_still_apply(env: Env) -> None:
    """Manual-only schedules, an end_date equal to start_date and an s3 site stay valid definitions."""
    doc = base_doc()
    policy(schedule=None, maintenance_schedule=None, start_date="2026-06-01", end_date="2026-06-01")(doc)
    doc["tables"]["events"]["policy"] = {"schedule": "@quarterly", "retry_delay_s": "1h", "retries": 0}
    path = env.config.with_name("edge.yaml")
    path.write_bytes(text_of(doc))
    code, _, err = cli(env, "apply", "--dry-run", config=path)
    assert code == 0, err
    doc["sites"]["far"] = {"id": 9, "uri": "s3://bucket/prefix"}
    longest = "s3://bucket/" + "é" * 219 + "/" + "é" * 219 + "x/"  # 878 bytes of key prefix: the longest allowed
    doc["sites"]["farther"] = {"id": 10, "uri": longest}
    path.write_bytes(text_of(doc))
    defs = load_definitions(path)
    assert defs.site("far").uri == "s3://bucket/prefix" and defs.site("farther").uri == longest
    assert defs.table("orders").policy.schedule is None


# -- generated cases ------------------------------------------------------------------------------------------

OUT_OF_RANGE_CRON = st.sampled_from([(0, 60, 999), (1, 24, 99), (2, 32, 99), (3, 13, 99), (4, 8, 99)]).flatmap(
    lambda f: st.tuples(st.just(f[0]), st.integers(min_value=f[1], max_value=f[2]))
)


@st.composite
def bad_schedules(draw: st.DrawFn) -> object:
    """Schedules that are wrong by construction: a cron field out of range, an interval of zero, below zero
    or over a year, an unknown unit or preset, a wrong number of fields, or not a string."""
    kind = draw(st.sampled_from(["cron-range", "interval", "unit", "preset", "fields", "type"]))
    if kind == "cron-range":
        position, value = draw(OUT_OF_RANGE_CRON)
        fields = ["0", "0", "1", "1", "*"]
        fields[position] = str(value)
        return " ".join(fields)
    if kind == "interval":
        unit, size = draw(st.sampled_from([("s", 1), ("m", 60), ("h", 3600), ("d", 86400), ("w", 604800)]))
        n = draw(st.one_of(st.just(0), st.integers(min_value=365 * 86400 // size + 1, max_value=10**12)))
        return f"{n}{unit}"
    if kind == "unit":
        return f"{draw(st.integers(1, 100))}{draw(st.sampled_from(['x', 'y', 'ms', 'min', 'hours', 'M']))}"
    if kind == "preset":
        return "@" + draw(st.sampled_from(["fortnightly", "once", "reboot", "continuous", "Hourly", "minutely"]))
    if kind == "fields":
        return " ".join(["*"] * draw(st.sampled_from([1, 2, 3, 4, 6, 7])))
    return draw(st.one_of(st.integers(), st.booleans(), st.lists(st.just("@daily"), min_size=1), st.just("")))


@CLI_SETTINGS
@given(value=bad_schedules(), key=st.sampled_from(["schedule", "maintenance_schedule", "verify_schedule"]))
def test_generated_bad_schedules_are_refused_by_apply(env: Env, value: object, key: str) -> None:
    path = bad_file(env, policy(**{key: value}))
    with unchanged(env):
        code, out, err = cli(env, "apply", config=path)
    assert_user_error(code, out, err, str(path), "table orders", key)


DURATIONS = ["retry_delay_s", "tombstone_grace_s", "max_retention_s", "orphan_grace_s"]


@st.composite
def bad_policy_values(draw: st.DrawFn) -> tuple[str, object]:
    """A field and a value outside what it accepts: below its least, over its most (an hour for
    retry_delay_s, ten years for other durations), or of the wrong type."""
    key = draw(st.sampled_from([*DURATIONS, "retries", "max_incoming_segments", "compact_min_segments"]))
    most = {"retry_delay_s": 3600, "retries": 100, "max_incoming_segments": 10_000}.get(key, 3650 * 86400)
    if key == "compact_min_segments":
        most = 1_000_000
    least = 1 if key in ("max_incoming_segments", "compact_min_segments") else 0
    value = draw(
        st.one_of(
            st.integers(max_value=least - 1),
            st.integers(min_value=most + 1, max_value=10**40),
            st.floats(allow_nan=True),
            st.booleans(),
            st.text(alphabet="0123456789smhdwx -.", max_size=8).filter(lambda t: not _valid_duration(t, most)),
        )
    )
    return key, value


def _valid_duration(text: str, most: int) -> bool:
    import re

    m = re.fullmatch(r"(\d{1,12})\s*([smhdw])", text.strip())
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
    return bool(m) and int(m.group(1)) * units[m.group(2)] <= most  # type: ignore[union-attr]


@CLI_SETTINGS
@given(bad=bad_policy_values())
def test_generated_bad_policy_values_are_refused_by_apply(env: Env, bad: tuple[str, object]) -> None:
    key, value = bad
    path = bad_file(env, policy(**{key: value}))
    with unchanged(env):
        code, out, err = cli(env, "apply", config=path)
    assert_user_error(code, out, err, str(path), "table orders policy", key)


@st.composite
def bad_split_points(draw: st.DrawFn) -> list[object]:
    """int64 split points with one bad entry: out of range, a bool, NaN or infinity, a fraction, null, a
    string that is no integer, or an order that is not strictly ascending."""
    points = sorted(set(draw(st.lists(st.integers(-(2**63), 2**63 - 1), max_size=4))))
    bad = draw(
        st.one_of(
            st.integers(min_value=2**63).map(lambda v: v),
            st.integers(max_value=-(2**63) - 1),
            st.booleans(),
            st.sampled_from([float("nan"), float("inf"), float("-inf"), 0.5, None, "x", "1e3"]),
        )
    )
    if points and draw(st.booleans()):
        i = draw(st.integers(0, len(points) - 1))
        return [*points[: i + 1], points[i], *points[i + 1 :]]  # a repeated point: not strictly ascending
    at = draw(st.integers(0, len(points)))
    return [*points[:at], bad, *points[at:]]


@CLI_SETTINGS
@given(points=bad_split_points())
def test_generated_bad_split_points_are_refused_by_apply(env: Env, points: list[object]) -> None:
    path = bad_file(env, orders(split_points=points))
    with unchanged(env):
        code, out, err = cli(env, "apply", config=path)
    assert_user_error(code, out, err, str(path), "table orders", "split_points")
