"""Two S3-compatible servers on loopback (moto's server mode), standing for two regions' object stores.

Each server is its own ``moto_server`` process, started with authentication on (moto checks the signature
of every request once ``INITIAL_NO_AUTH_ACTION_COUNT`` unauthenticated calls are used up): the fixture spends
those on creating an IAM user with an access key allowed everything, so each endpoint has its own key pair,
and a request signed with the other endpoint's keys, or a wrong secret, is refused as a real store would.
The buckets are made with the new keys. The servers are stopped when the session ends. Never skipped: moto
is a test requirement (requirements.txt).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import boto3
import pytest

BUCKETS = ("segrep-a", "segrep-b", "segrep-c")
_NO_AUTH_CALLS = 3  # create_user, put_user_policy, create_access_key
_ALLOW_ALL = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}


@dataclass(frozen=True)
class S3Endpoint:
    """One running server: where it listens and its credentials (as a site's env prefix would give them)."""

    name: str
    url: str  # http://127.0.0.1:PORT
    region: str
    access_key: str
    secret_key: str
    buckets: tuple[str, ...]

    def env(self, prefix: str) -> dict[str, str]:
        """The environment variables a site with ``credentials: {env_prefix: PREFIX}`` reads."""
        return {f"{prefix}_ACCESS_KEY_ID": self.access_key, f"{prefix}_SECRET_ACCESS_KEY": self.secret_key}

    def client(self) -> object:
        return boto3.client(
            "s3",
            endpoint_url=self.url,
            region_name=self.region,
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
        )

    def keys(self, bucket: str, prefix: str = "") -> list[str]:
        """Every object key under ``prefix`` in ``bucket`` (for tests that check what was written)."""
        client = self.client()
        pages = client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)  # type: ignore[attr-defined]
        return sorted(obj["Key"] for page in pages for obj in page.get("Contents", []))

    def objects(self, uri: str) -> dict[str, tuple[int, str, str]]:
        """Every object under an ``s3://bucket/prefix`` site root: key -> (size, ETag, last modified), what
        changes when an object is written again (for tests that check nothing was rewritten). The empty
        ``dir/`` markers pyarrow puts (again) when it makes a "directory" are left out."""
        bucket, _, prefix = uri.removeprefix("s3://").partition("/")
        pages = self.client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)  # type: ignore[attr-defined]
        return {
            obj["Key"]: (obj["Size"], obj["ETag"], obj["LastModified"].isoformat())
            for page in pages
            for obj in page.get("Contents", [])
            if not obj["Key"].endswith("/")
        }

    def multipart_uploads(self, bucket: str) -> list[str]:
        listing = self.client().list_multipart_uploads(Bucket=bucket)  # type: ignore[attr-defined]
        return [u["Key"] for u in listing.get("Uploads", [])]


AWS_VARIABLES = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE")


def use_site_keys(monkeypatch: pytest.MonkeyPatch, **endpoints: S3Endpoint) -> None:
    """Each endpoint's keys in the variables of its env prefix (``DR_S3=a``: DR_S3_ACCESS_KEY_ID...), and no
    AWS_* variable set: a site can reach its store only through its own credentials reference."""
    for var in AWS_VARIABLES:
        monkeypatch.delenv(var, raising=False)
    for prefix, endpoint in endpoints.items():
        for name, value in endpoint.env(prefix).items():
            monkeypatch.setenv(name, value)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _wait_listening(port: int, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"moto_server exited with {proc.returncode}: {log.read_text()[-2000:]}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise RuntimeError(f"moto_server on port {port} did not listen within 60 s: {log.read_text()[-2000:]}")


def start_endpoint(name: str, region: str, logdir: Path) -> tuple[S3Endpoint, subprocess.Popen[bytes]]:
    port = free_port()
    log = logdir / f"moto-{name}.log"
    env = {**os.environ, "INITIAL_NO_AUTH_ACTION_COUNT": str(_NO_AUTH_CALLS)}
    for var in AWS_VARIABLES:
        env.pop(var, None)
    moto = Path(sys.executable).with_name("moto_server")
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [str(moto), "-H", "127.0.0.1", "-p", str(port)],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
    try:
        _wait_listening(port, proc, log)
        url = f"http://127.0.0.1:{port}"
        boot = {"aws_access_key_id": "bootstrap", "aws_secret_access_key": "bootstrap"}
        iam = boto3.client("iam", endpoint_url=url, region_name=region, **boot)
        iam.create_user(UserName="segrep")
        iam.put_user_policy(UserName="segrep", PolicyName="all", PolicyDocument=json.dumps(_ALLOW_ALL))
        key = iam.create_access_key(UserName="segrep")["AccessKey"]
        endpoint = S3Endpoint(name, url, region, key["AccessKeyId"], key["SecretAccessKey"], BUCKETS)
        client = endpoint.client()
        for bucket in BUCKETS:
            client.create_bucket(  # type: ignore[attr-defined]
                Bucket=bucket, CreateBucketConfiguration={"LocationConstraint": region}
            )
    except BaseException:
        stop(proc)
        raise
    return endpoint, proc


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def start_s3_endpoints(logdir: Path) -> Iterator[tuple[S3Endpoint, S3Endpoint]]:
    """Two servers, ``a`` (eu-west-1) and ``b`` (us-west-2), each with its own keys; stopped afterwards."""
    procs: list[subprocess.Popen[bytes]] = []
    try:
        a, proc_a = start_endpoint("a", "eu-west-1", logdir)
        procs.append(proc_a)
        b, proc_b = start_endpoint("b", "us-west-2", logdir)
        procs.append(proc_b)
        yield a, b
    finally:
        for proc in procs:
            stop(proc)


# The `events` table of ORDERS_YAML with `primary` local, `dr` on endpoint a and `edge` on endpoint b, each with
# its own credentials by reference (DR_S3_*, EDGE_S3_*); every test gets its own key prefix in the buckets.
S3_EVENTS_YAML = """
data_dir: data
sites:
  primary: {{id: 1, uri: sites/primary}}
  dr:
    id: 2
    uri: s3://{bucket_a}/{prefix}/dr
    storage_options: {{endpoint: '{url_a}', region: {region_a}, connect_timeout_s: 2, retries: 1{options_a}}}
    credentials: {{env_prefix: DR_S3}}
  edge:
    id: 3
    uri: s3://{bucket_b}/{prefix}/edge
    storage_options: {{endpoint: '{url_b}', region: {region_b}, connect_timeout_s: 2, retries: 1}}
    credentials: {{env_prefix: EDGE_S3}}
tables:
  events:
    columns: {{tenant: string, seq: int64, payload: string, at: timestamp}}
    primary_key: [tenant, seq]
    partition_key: tenant
    split_points: [m]
    leader: primary
    replicas: [dr, edge]
    policy: {{retry_delay_s: 0}}
"""


def s3_events_yaml(
    a: S3Endpoint,
    b: S3Endpoint,
    prefix: str,
    bucket_a: str = BUCKETS[0],
    bucket_b: str = BUCKETS[1],
    options_a: str = "",
) -> str:
    """``S3_EVENTS_YAML`` for endpoints ``a`` and ``b``; ``options_a``: more of dr's storage options (``k: v, ...``)."""
    return S3_EVENTS_YAML.format(
        options_a=f", {options_a}" if options_a else "",
        bucket_a=bucket_a,
        bucket_b=bucket_b,
        prefix=prefix,
        url_a=a.url,
        url_b=b.url,
        region_a=a.region,
        region_b=b.region,
    )


def secrets_of(*endpoints: S3Endpoint) -> list[str]:
    """What must never be stored or printed: each endpoint's secret key (and, to be strict, its key id)."""
    return [v for e in endpoints for v in (e.secret_key, e.access_key)]
