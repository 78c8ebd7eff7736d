"""Structure of docker-compose.yaml, checked without docker: the services of the stack, the Airflow commands
and executor, mounts that exist in the repository, the sites at the same path in every Airflow and Spark
container, the image's Dockerfile, the Spark connection, and the definitions file the containers load.

The file cannot be run here (no docker engine); these checks keep it correct by construction. Each failure
names the service and the setting that is wrong.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
import yaml

from segrep.config.definitions import load_definitions

ROOT = Path(__file__).resolve().parents[1]
COMPOSE = ROOT / "docker-compose.yaml"

AIRFLOW_COMMANDS = {
    "airflow-apiserver": "api-server",
    "airflow-scheduler": "scheduler",
    "airflow-dag-processor": "dag-processor",
    "airflow-triggerer": "triggerer",
}
AIRFLOW_SERVICES = ["airflow-init", *AIRFLOW_COMMANDS]
SPARK_SERVICES = ["spark-master", "spark-worker"]
SEGREP_SERVICES = [*AIRFLOW_SERVICES, *SPARK_SERVICES, "segrep-init"]  # all run our image and segrep code
REQUIRED_SERVICES = ["postgres", *SEGREP_SERVICES]
WORK_DIR = "/data/work"
SPARK_MASTER_URL = "spark://spark-master:7077"


@pytest.fixture(scope="module")
def compose_services() -> dict[str, dict[str, Any]]:
    """The `services` mapping of docker-compose.yaml (not the Airflow processes of tests/dags' `services`)."""
    assert COMPOSE.is_file(), f"{COMPOSE} is missing"
    doc = yaml.safe_load(COMPOSE.read_text())
    assert isinstance(doc, dict) and isinstance(doc.get("services"), dict), f"{COMPOSE.name}: no 'services' mapping"
    return doc["services"]


def _env(service: dict[str, Any]) -> dict[str, str]:
    raw = service.get("environment") or {}
    if isinstance(raw, list):
        return dict(item.split("=", 1) if "=" in item else (item, "") for item in raw)
    return {k: "" if v is None else str(v) for k, v in raw.items()}


def _command(service: dict[str, Any]) -> list[str]:
    raw = service.get("command") or []
    return shlex.split(raw) if isinstance(raw, str) else [str(part) for part in raw]


def _mounts(service: dict[str, Any]) -> list[tuple[str, str]]:
    """(source, container path) of each volume entry, short or long syntax; source '' for anonymous volumes."""
    mounts = []
    for entry in service.get("volumes") or []:
        if isinstance(entry, dict):
            mounts.append((str(entry.get("source", "")), str(entry["target"])))
        else:
            parts = entry.split(":")
            mounts.append(("", parts[0]) if len(parts) == 1 else (parts[0], parts[1]))
    return mounts


def _is_bind(source: str) -> bool:
    return source.startswith((".", "/", "~"))


def _repo_path_of(service: dict[str, Any], container_path: str) -> Path:
    """Map a container path back into the repository through the service's bind mounts (longest target
    first), else through the image's copy of the repository at /opt/segrep."""
    path = PurePosixPath(container_path)
    for source, target in sorted(_mounts(service), key=lambda m: -len(m[1])):
        if _is_bind(source) and not source.startswith("/") and path.is_relative_to(target):
            return ROOT / source / path.relative_to(target)
    assert path.is_relative_to("/opt/segrep"), f"{container_path} is neither under a bind mount nor /opt/segrep"
    return ROOT / path.relative_to("/opt/segrep")


def test_required_services_exist(compose_services):
    missing = [name for name in REQUIRED_SERVICES if name not in compose_services]
    assert not missing, f"docker-compose.yaml lacks services: {', '.join(missing)}"
    assert str(compose_services["postgres"].get("image", "")).startswith("postgres:15"), (
        "postgres must run image postgres:15"
    )


def test_airflow_services_run_their_component_with_local_executor(compose_services):
    for name, subcommand in AIRFLOW_COMMANDS.items():
        command = _command(compose_services[name])
        assert command[:2] == ["airflow", subcommand], (
            f"{name}: command should be 'airflow {subcommand}', is {' '.join(command)!r}"
        )
        depends = compose_services[name].get("depends_on") or {}
        assert isinstance(depends, dict) and (depends.get("airflow-init") or {}).get("condition") == (
            "service_completed_successfully"
        ), f"{name}: must depend on airflow-init with condition service_completed_successfully"
    assert "airflow db migrate" in " ".join(_command(compose_services["airflow-init"])), (
        "airflow-init must run 'airflow db migrate'"
    )
    for name in AIRFLOW_SERVICES:
        env = _env(compose_services[name])
        assert env.get("AIRFLOW__CORE__EXECUTOR") == "LocalExecutor", (
            f"{name}: AIRFLOW__CORE__EXECUTOR is {env.get('AIRFLOW__CORE__EXECUTOR')!r}, expected LocalExecutor"
        )
        conn = env.get("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", "")
        # The image has psycopg 3 (requirements.txt), not psycopg2 nor asyncpg.
        assert conn.startswith("postgresql+psycopg://") and conn.endswith("@postgres:5432/airflow"), (
            f"{name}: AIRFLOW__DATABASE__SQL_ALCHEMY_CONN {conn!r} should be postgresql+psycopg://...@postgres:5432/airflow"
        )
        assert env.get("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN_ASYNC", "").startswith("postgresql+psycopg://"), (
            f"{name}: set AIRFLOW__DATABASE__SQL_ALCHEMY_CONN_ASYNC to postgresql+psycopg:// (asyncpg is not installed)"
        )
        assert env.get("AIRFLOW__CORE__LOAD_EXAMPLES", "").lower() == "false", f"{name}: load examples must be off"
        for key in ("AIRFLOW__API_AUTH__JWT_SECRET", "AIRFLOW__CORE__FERNET_KEY"):
            assert env.get(key), f"{name}: {key} must be set (the same value in every Airflow component)"
    for key in ("AIRFLOW__API_AUTH__JWT_SECRET", "AIRFLOW__CORE__FERNET_KEY", "AIRFLOW__API__SECRET_KEY"):
        values = {_env(compose_services[name]).get(key) for name in AIRFLOW_SERVICES}
        assert len(values) == 1, f"{key} differs between Airflow services: {values}"


def test_bind_mount_sources_exist_in_the_repository(compose_services):
    for name, service in compose_services.items():
        for source, target in _mounts(service):
            if _is_bind(source) and not source.startswith(("/", "~")):
                assert (ROOT / source).exists(), f"{name}: bind mount {source} -> {target}: {source} is not in the repo"
        build = service.get("build")
        if build is not None:
            context = build if isinstance(build, str) else build.get("context", ".")
            assert (ROOT / context).is_dir(), f"{name}: build context {context} does not exist"


def test_sites_and_work_dir_are_the_same_volume_at_the_same_path_everywhere(compose_services):
    definitions = load_definitions(ROOT / "include" / "segrep.compose.yaml")
    paths = [site.uri for site in definitions.sites.values()] + [WORK_DIR]
    seen: dict[str, tuple[str, str]] = {}  # container path -> (first service, its source)
    for name in SEGREP_SERVICES:
        by_target = {target: source for source, target in _mounts(compose_services[name])}
        for path in paths:
            assert path in by_target, f"{name}: {path} is not mounted (sites and {WORK_DIR} must be in every service)"
            source = by_target[path]
            assert source, f"{name}: {path} is an anonymous volume; it must be shared"
            first, first_source = seen.setdefault(path, (name, source))
            assert source == first_source, f"{path} is {source!r} in {name} but {first_source!r} in {first}"
    sources = [seen[path][1] for path in paths]
    assert len(set(sources)) == len(sources), f"sites and work dir must be distinct volumes, got {sources}"


def test_dockerfile_installs_the_pinned_requirements_and_java_17(compose_services):
    dockerfiles = set()
    for name in SEGREP_SERVICES:
        build = compose_services[name].get("build")
        assert isinstance(build, dict), f"{name}: must build the repository image (build: context + dockerfile)"
        dockerfiles.add((ROOT / build.get("context", ".") / build.get("dockerfile", "Dockerfile")).resolve())
    assert len(dockerfiles) == 1, f"services build from different Dockerfiles: {sorted(map(str, dockerfiles))}"
    images = {compose_services[name].get("image") for name in SEGREP_SERVICES}
    assert len(images) == 1, f"Airflow, Spark and segrep-init must run the same image, got {images}"
    dockerfile = dockerfiles.pop()
    assert dockerfile.is_file(), f"Dockerfile {dockerfile} referenced by build does not exist"
    text = re.sub(r"\\\n", " ", dockerfile.read_text())  # join continued lines
    runs = [line for line in text.splitlines() if line.strip().startswith("RUN")]
    assert re.search(r"^FROM python:3\.11", text, re.M), f"{dockerfile.name}: base image should be python:3.11"
    assert any(re.search(r"pip install[^&;]*-r requirements\.txt[^&;]*-c constraints\.txt", r) for r in runs), (
        f"{dockerfile.name}: no 'pip install -r requirements.txt -c constraints.txt'"
    )
    assert any(re.search(r"pip install[^&;]*(-e )?\.(\s|$)", r) for r in runs), (
        f"{dockerfile.name}: the repository itself (pip install [-e] .) is not installed"
    )
    assert any("openjdk-17-jre" in r for r in runs), f"{dockerfile.name}: Java 17 (openjdk-17-jre-headless) missing"
    assert re.search(r"^WORKDIR /opt/segrep\s*$", text, re.M), f"{dockerfile.name}: WORKDIR must be /opt/segrep"


def test_spark_cluster_and_connection(compose_services):
    master = _command(compose_services["spark-master"])
    assert master[:2] == ["spark-class", "org.apache.spark.deploy.master.Master"], (
        f"spark-master: unexpected command {master}"
    )
    assert "7077" in master, "spark-master must listen on port 7077"
    worker = _command(compose_services["spark-worker"])
    assert worker[:2] == ["spark-class", "org.apache.spark.deploy.worker.Worker"], (
        f"spark-worker: unexpected command {worker}"
    )
    assert SPARK_MASTER_URL in worker, f"spark-worker must join {SPARK_MASTER_URL}"
    for name in AIRFLOW_SERVICES:
        raw = _env(compose_services[name]).get("AIRFLOW_CONN_SPARK_DEFAULT")
        assert raw, f"{name}: AIRFLOW_CONN_SPARK_DEFAULT is not set"
        conn = json.loads(raw)
        # The provider's rule (SparkSubmitHook._resolve_connection): a spark host with a scheme is the master,
        # the port is appended.
        host = conn.get("host", "")
        master_url = host if "://" in host else f"{conn.get('conn_type')}://{host}"
        master_url = f"{master_url}:{conn['port']}" if conn.get("port") else master_url
        assert conn.get("conn_type") == "spark" and master_url == SPARK_MASTER_URL, (
            f"{name}: spark_default resolves to master {master_url!r}, expected {SPARK_MASTER_URL}"
        )
        assert (conn.get("extra") or {}).get("deploy-mode") == "client", (
            f"{name}: spark_default must use deploy-mode client (cluster mode is broken on standalone)"
        )


def test_segrep_config_exists_and_loads_with_the_tables_of_segrep_yaml(compose_services):
    reference = load_definitions(ROOT / "include" / "segrep.yaml")
    for name in SEGREP_SERVICES:
        env = _env(compose_services[name])
        config = env.get("SEGREP_CONFIG")
        assert config, f"{name}: SEGREP_CONFIG is not set"
        local = _repo_path_of(compose_services[name], config)
        assert local.is_file(), f"{name}: SEGREP_CONFIG {config} maps to {local}, which does not exist"
        definitions = load_definitions(local)
        assert definitions.tables == reference.tables, f"{local.name}: tables differ from include/segrep.yaml"
        assert {s.name: s.site_id for s in definitions.sites.values()} == {
            s.name: s.site_id for s in reference.sites.values()
        }, f"{local.name}: site names or ids differ from include/segrep.yaml"
        url = env.get("SEGREP_CATALOG_URL", "")
        assert re.fullmatch(r"postgresql\+psycopg://[^@]+@postgres:5432/segrep", url), (
            f"{name}: SEGREP_CATALOG_URL {url!r} should be postgresql+psycopg://...@postgres:5432/segrep"
        )
        assert env.get("PYSPARK_PYTHON") == "python3", f"{name}: PYSPARK_PYTHON should be python3"
    init = " ".join(_command(compose_services["segrep-init"]))
    assert "segrep init" in init and "segrep apply" in init, f"segrep-init should run segrep init && apply: {init}"


def test_postgres_creates_the_segrep_database(compose_services):
    initdb = [src for src, target in _mounts(compose_services["postgres"]) if target == "/docker-entrypoint-initdb.d"]
    assert initdb, "postgres: nothing is mounted at /docker-entrypoint-initdb.d to create the segrep database"
    scripts = ROOT / initdb[0]
    files = [scripts] if scripts.is_file() else sorted(scripts.iterdir())
    text = "\n".join(f.read_text() for f in files)
    assert re.search(r"CREATE DATABASE segrep\b", text, re.I), f"postgres: {initdb[0]} does not create database segrep"
    assert _env(compose_services["postgres"]).get("POSTGRES_DB") == "airflow", "postgres: POSTGRES_DB should be airflow"
