"""Sites on S3-compatible stores (DESIGN 14), against two moto servers on loopback with their own keys.

The store options and the credentials reference are checked strictly when the definitions load; a site opens
its own S3 file system with its own endpoint and keys (no AWS_* variable is set); verified copies go between
any two kinds of site, streamed and hashed on the way, and a failed copy leaves nothing under the final key.
"""

from __future__ import annotations

import os
import uuid
from dataclasses import replace
from pathlib import Path

import pyarrow as pa
import pyarrow.fs as pafs
import pytest

from segrep.config.definitions import load_definitions
from segrep.config.locations import redact_uri
from segrep.config.stores import CredentialsRef, StoreOptions
from segrep.core import schema as sch
from segrep.core.errors import ConfigError, CorruptSegmentError, SegrepError
from segrep.storage.segment_meta import ExpectedSegment, entry_stats, stamp_rows
from segrep.storage.site import Site
from segrep.storage.store_errors import StoreRefusedError
from segrep.storage.transfer import copy_verified
from tests.support.s3 import BUCKETS, S3Endpoint, s3_events_yaml

Endpoints = tuple[S3Endpoint, S3Endpoint]
REL = "events/1/0123456789abcdef0123456789abcdef.parquet"


@pytest.fixture(autouse=True)
def _no_aws_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(var, raising=False)


def _options(e: S3Endpoint, prefix: str) -> StoreOptions:
    return StoreOptions(
        endpoint=e.url, region=e.region, connect_timeout_s=2, retries=1, credentials=CredentialsRef(env_prefix=prefix)
    )


def _s3_site(e: S3Endpoint, name: str, prefix: str, monkeypatch: pytest.MonkeyPatch, bucket: str = BUCKETS[0]) -> Site:
    for var, value in e.env(prefix).items():
        monkeypatch.setenv(var, value)
    return Site(name, f"s3://{bucket}/{uuid.uuid4().hex[:12]}/{name}", _options(e, prefix))


def _payload(n: int = 9 * 1024 * 1024 + 123) -> bytes:
    return os.urandom(n)  # above pyarrow's first part size: a real multipart upload


def _put(site: Site, data: bytes) -> tuple[int, str]:
    import hashlib

    if site.local:
        path = Path(site.path(REL))
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    else:
        with site.fs.open_output_stream(site.path(REL)) as out:
            out.write(data)
    return len(data), hashlib.sha256(data).hexdigest()


def _get(site: Site) -> bytes:
    with site.fs.open_input_stream(site.path(REL)) as f:
        data: bytes = f.read()
    return data


def _keys(e: S3Endpoint, site: Site) -> list[str]:
    """The objects under the site's root, leaving out the empty ``dir/`` markers pyarrow's delete_file leaves so
    that the parent "directory" still exists."""
    bucket, _, prefix = site.root.partition("/")
    return [k for k in e.keys(bucket, prefix) if not k.endswith("/")]


# -- definitions -------------------------------------------------------------------------------------------------


def _load(tmp_path: Path, text: str) -> object:
    path = tmp_path / "segrep.yaml"
    path.write_text(text)
    return load_definitions(path)


def test_storage_options_and_a_credentials_reference_load(s3_endpoints: Endpoints, tmp_path: Path) -> None:
    a, b = s3_endpoints
    defs = _load(tmp_path, s3_events_yaml(a, b, "p"))
    dr = defs.site("dr")  # type: ignore[attr-defined]
    assert dr.uri == "s3://segrep-a/p/dr"
    assert dr.store == StoreOptions(
        endpoint=a.url, region=a.region, connect_timeout_s=2.0, retries=1, credentials=CredentialsRef("DR_S3")
    )
    assert defs.site("primary").store == StoreOptions()  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("site_body", "needle"),
    [
        ("{id: 2, uri: 's3://AKIAX:hunter2secret@bucket/dr'}", "credentials in a uri are refused"),
        ("{id: 2, uri: 's3://bucket/dr?secret_key=hunter2secret'}", "options in the uri are refused"),
        (
            "{id: 2, uri: s3://bucket/dr, storage_options: {endpoint: 'http://h:1', colour: red}}",
            "unknown key(s) colour",
        ),
        ("{id: 2, uri: s3://bucket/dr, storage_options: {endpoint: 'ftp://h:1'}}", "endpoint must be http"),
        ("{id: 2, uri: s3://bucket/dr, storage_options: {endpoint: 'http://u:hunter2secret@h:1'}}", "must not hold"),
        ("{id: 2, uri: s3://bucket/dr, storage_options: {retries: 99}}", "retries must be an integer"),
        ("{id: 2, uri: s3://bucket/dr, storage_options: {connect_timeout_s: 0}}", "connect_timeout_s must be"),
        ("{id: 2, uri: s3://bucket/dr, storage_options: {path_style: 'yes'}}", "path_style must be true or false"),
        ("{id: 2, uri: s3://bucket/dr, credentials: {secret_access_key: hunter2secret}}", "unknown key(s) secret"),
        ("{id: 2, uri: s3://bucket/dr, credentials: {env_prefix: dr}}", "env_prefix must be upper case"),
        ("{id: 2, uri: s3://bucket/dr, credentials: {}}", "exactly one of env_prefix"),
        ("{id: 2, uri: s3://bucket/dr, credentials: {env_prefix: A, airflow_conn_id: b}}", "exactly one of"),
        ("{id: 2, uri: sites/dr, storage_options: {region: eu-west-1}}", "apply to s3:// sites only"),
    ],
)
def test_bad_store_definitions_are_one_clear_error_without_the_secret(
    tmp_path: Path, site_body: str, needle: str
) -> None:
    text = f"sites:\n  primary: {{id: 1, uri: sites/primary}}\n  dr: {site_body}\ntables: {{}}\n"
    with pytest.raises(ConfigError) as err:
        _load(tmp_path, text)
    message = str(err.value)
    assert needle.lower() in message.lower(), message
    assert "site dr" in message and len(message.splitlines()) == 1
    assert "hunter2secret" not in message


def test_redact_uri_hides_embedded_credentials() -> None:
    assert redact_uri("s3://AK:SECRET@bucket/p") == "s3://***@bucket/p"
    assert redact_uri("s3://bucket/p?access_key=AK&secret_key=S") == "s3://bucket/p?access_key=***&secret_key=***"
    assert redact_uri("s3://bucket/p") == "s3://bucket/p"
    assert redact_uri("/data/sites/dr") == "/data/sites/dr"


def test_a_missing_credentials_variable_is_named(s3_endpoints: Endpoints, monkeypatch: pytest.MonkeyPatch) -> None:
    a, _ = s3_endpoints
    monkeypatch.setenv("NOPE_S3_ACCESS_KEY_ID", a.access_key)
    monkeypatch.delenv("NOPE_S3_SECRET_ACCESS_KEY", raising=False)
    with pytest.raises(SegrepError) as err:
        Site("dr", "s3://segrep-a/x", _options(a, "NOPE_S3"))
    assert "site dr" in str(err.value) and "NOPE_S3_SECRET_ACCESS_KEY" in str(err.value)
    assert a.access_key not in str(err.value)


def test_an_airflow_connection_is_not_resolved_outside_airflow(s3_endpoints: Endpoints) -> None:
    a, _ = s3_endpoints
    opts = StoreOptions(endpoint=a.url, credentials=CredentialsRef(airflow_conn_id="aws_dr"))
    with pytest.raises(SegrepError, match=r"site dr: .*airflow_conn_id aws_dr.* resolved inside Airflow tasks"):
        Site("dr", "s3://segrep-a/x", opts)


def test_an_s3_site_without_its_definitions_is_refused_not_opened_with_defaults() -> None:
    """A process that never loaded the definitions (a CLI run given only --catalog) must not reach the
    provider's default endpoint under whatever identity the environment holds: the site is refused by name."""
    uri = f"s3://segrep-a/{uuid.uuid4().hex}/unknown"
    with pytest.raises(SegrepError, match=r"site lost .*storage options and credentials are not known"):
        Site("lost", uri)


def test_each_site_uses_its_own_endpoint_and_keys(s3_endpoints: Endpoints, monkeypatch: pytest.MonkeyPatch) -> None:
    a, b = s3_endpoints
    dr = _s3_site(a, "dr", "DR_S3", monkeypatch)
    edge = _s3_site(b, "edge", "EDGE_S3", monkeypatch, bucket=BUCKETS[1])
    assert isinstance(dr.fs.handler.fs, pafs.S3FileSystem) and not dr.local  # in the site's request limits
    _put(dr, b"on a")
    _put(edge, b"on b")
    assert _get(dr) == b"on a" and _get(edge) == b"on b"
    assert _keys(a, dr) == [f"{dr.root.partition('/')[2]}/{REL}"]


# -- copies between any two sites ---------------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["local->a", "a->local", "a->a", "a->b", "b->a"])
def test_a_verified_copy_between_any_two_sites(
    s3_endpoints: Endpoints, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, path: str
) -> None:
    a, b = s3_endpoints

    def site(kind: str, name: str) -> Site:
        if kind == "local":
            (tmp_path / name).mkdir(exist_ok=True)  # a local root exists: copies never create one
            return Site(name, str(tmp_path / name))
        endpoint = a if kind == "a" else b
        return _s3_site(endpoint, name, f"{name.upper()}_S3", monkeypatch, bucket=BUCKETS[2 if kind == "a" else 1])

    src_kind, dst_kind = path.split("->")
    source, target = site(src_kind, "src"), site(dst_kind, "dst")
    data = _payload()
    size, sha = _put(source, data)
    facts = copy_verified(source, target, REL, size, sha)
    assert (facts.byte_size, facts.sha256) == (size, sha)
    assert _get(target) == data
    target.verify(REL, size, sha)


@pytest.mark.parametrize("source_kind", ["local", "b"])
def test_a_copy_that_does_not_match_leaves_nothing_at_the_target(
    s3_endpoints: Endpoints, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, source_kind: str
) -> None:
    a, b = s3_endpoints
    source = (
        Site("src", str(tmp_path / "src"))
        if source_kind == "local"
        else _s3_site(b, "src", "SRC_S3", monkeypatch, bucket=BUCKETS[1])
    )
    target = _s3_site(a, "dst", "DST_S3", monkeypatch)
    size, _ = _put(source, _payload())
    with pytest.raises(CorruptSegmentError, match="does not match the catalog"):
        copy_verified(source, target, REL, size, "0" * 64)
    assert not target.exists(REL)
    assert _keys(a, target) == []
    assert not [k for k in a.multipart_uploads(BUCKETS[0]) if k.startswith(target.root.partition("/")[2])]


def test_wrong_credentials_fail_naming_the_site_and_write_nothing(
    s3_endpoints: Endpoints, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    a, b = s3_endpoints
    source = Site("src", str(tmp_path / "src"))
    size, sha = _put(source, b"x" * 1000)
    monkeypatch.setenv("BAD_S3_ACCESS_KEY_ID", b.access_key)  # the other region's keys
    monkeypatch.setenv("BAD_S3_SECRET_ACCESS_KEY", b.secret_key)
    prefix = uuid.uuid4().hex[:12]
    target = Site("dr", f"s3://{BUCKETS[0]}/{prefix}/dr", _options(a, "BAD_S3"))
    with pytest.raises(StoreRefusedError) as err:
        copy_verified(source, target, REL, size, sha)
    message = str(err.value)
    assert message.startswith(f"site dr: the store refused to write s3://{BUCKETS[0]}/{prefix}/dr/{REL}: "), message
    assert len(message.splitlines()) == 1 and b.secret_key not in message
    assert a.keys(BUCKETS[0], prefix) == []


def test_a_missing_bucket_fails_naming_the_site_and_writes_nothing(
    s3_endpoints: Endpoints, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    a, _ = s3_endpoints
    source = Site("src", str(tmp_path / "src"))
    size, sha = _put(source, b"x" * 1000)
    target = _s3_site(a, "dr", "DR_S3", monkeypatch, bucket="no-such-bucket")
    with pytest.raises(
        StoreRefusedError, match=r"site dr: the store refused to write s3://no-such-bucket/.*NoSuchBucket"
    ):
        copy_verified(source, target, REL, size, sha)


def test_a_source_that_cannot_be_read_is_named(
    s3_endpoints: Endpoints, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    a, _ = s3_endpoints
    source = _s3_site(a, "dr", "DR_S3", monkeypatch)  # nothing written there
    (tmp_path / "primary").mkdir()
    target = Site("primary", str(tmp_path / "primary"))
    with pytest.raises(FileNotFoundError, match=rf"site dr: cannot read s3://{source.root}/{REL}: it does not exist"):
        copy_verified(source, target, REL, 10, "0" * 64)
    assert not (tmp_path / "primary").exists() or not list((tmp_path / "primary").rglob("*.parquet"))


def test_segments_round_trip_on_an_s3_site(s3_endpoints: Endpoints, monkeypatch: pytest.MonkeyPatch) -> None:
    a, _ = s3_endpoints
    site = _s3_site(a, "dr", "DR_S3", monkeypatch)
    table = pa.table({"k": [1, 2, 3]})
    facts = site.write_segment(REL, table, {"segment_id": "x"})
    site.verify(REL, facts.byte_size, facts.sha256)
    assert site.read_segment(REL).replace_schema_metadata(None).equals(table)
    assert site.read_meta(REL) == {"segment_id": "x"}
    assert list(site.list_segment_files()) == [REL]


def test_read_checked_checks_the_content_of_a_file_on_an_s3_site(
    s3_endpoints: Endpoints, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file on an object store is streamed once into memory, hashed on the way, and parsed from there: the
    catalog's own digest passes, any other is refused naming the site and the file."""
    a, _ = s3_endpoints
    site = _s3_site(a, "dr", "DR_S3", monkeypatch)
    schema = pa.schema([("k", pa.int64())])
    rows = stamp_rows(pa.table({"k": [1, 2, 3]}), schema, version=5, deleted=False, origin=1)
    stats = entry_stats(rows, ["k"])
    segment_id = REL.rsplit("/", 1)[1].removesuffix(".parquet")
    facts = site.write_segment(REL, rows, {"segment_id": segment_id, "table": "events", "partition_id": 1, **stats})
    expected = ExpectedSegment(
        segment_id=segment_id,
        table="events",
        partition_id=1,
        byte_size=facts.byte_size,
        schema=sch.segment_schema(schema),
        sha256=facts.sha256,
        crc64nvme=facts.crc64nvme,
        **stats,
    )
    assert site.read_checked(REL, expected, ["k"]).column("k").to_pylist() == [1, 2, 3]
    for other in (replace(expected, crc64nvme="0" * 16), replace(expected, crc64nvme=None, sha256="0" * 64)):
        with pytest.raises(CorruptSegmentError, match="its bytes are not the catalog's") as caught:
            site.read_checked(REL, other, ["k"])
        assert str(caught.value).startswith(f"site dr: segment file {site.path(REL)} is not segment {segment_id}")
