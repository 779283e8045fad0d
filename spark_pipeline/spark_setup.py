"""`lakebroker spark setup`: fill the per-user cache (tables/user_cache.py) with what a Spark session needs
beyond pyspark, so that no session ever resolves anything over the network:

- the Delta jars (spark_pipeline/maven/delta/pom.xml), less what pyspark already ships;
- Hadoop's S3A filesystem at exactly pyspark's Hadoop version, with the AWS SDK bundle (maven/s3a/pom.xml);
- the put-if-absent LogStores (spark_pipeline/java/), compiled against those jars (needs a JDK's javac);
- the JVM class archive that shortens each session's start (class_archive.py).

Maven resolves the jars when `mvn` is installed; otherwise Spark's own resolver (Ivy, `spark.jars.packages`)
does, with the same exclusions. A stamp over every input makes a second run a no-op, and a run builds into
a scratch directory that replaces the old one only when whole.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from lakebroker.tables import user_cache


class Resolver(StrEnum):
    AUTO = "auto"  # Maven when `mvn` is on PATH, else Spark's
    MAVEN = "maven"
    SPARK = "spark"

HERE = Path(__file__).resolve().parent
DELTA_POM = HERE / "maven" / "delta" / "pom.xml"
S3A_POM = HERE / "maven" / "s3a" / "pom.xml"
JAVA_SOURCES = HERE / "java"
LOGSTORE_JAR = "lakebroker-logstore.jar"
_POM_NS = {"m": "http://maven.apache.org/POM/4.0.0"}


class SetupError(RuntimeError):
    """Set-up could not finish; the message says what to install or fix."""


@dataclass(frozen=True)
class Pom:
    """What a pom asks for: its dependencies with properties filled in, its version pins and exclusions."""

    dependencies: tuple[str, ...]  # group:artifact:version
    pins: tuple[str, ...]  # dependencyManagement's group:artifact:version
    excluded_groups: tuple[str, ...]

    @classmethod
    def read(cls, path: Path, **overrides: str) -> Pom:
        root = ET.parse(path).getroot()
        props = {el.tag.split("}")[1]: (el.text or "") for el in root.findall("m:properties/*", _POM_NS)}
        props.update(overrides)

        def fill(text: str | None) -> str:
            return re.sub(r"\$\{([^}]+)\}", lambda m: props[m.group(1)], text or "")

        def coordinates(parent: str) -> tuple[str, ...]:
            return tuple(":".join(fill(dep.findtext(f"m:{part}", None, _POM_NS))
                                  for part in ("groupId", "artifactId", "version"))
                         for dep in root.findall(f"{parent}/m:dependency", _POM_NS))

        groups = root.findtext(".//m:excludeGroupIds", "", _POM_NS)
        return cls(coordinates("m:dependencies"), coordinates("m:dependencyManagement/m:dependencies"),
                   tuple(g.strip() for g in groups.split(",") if g.strip()))


def pyspark_jars() -> Path:
    """pyspark's own jars (without importing pyspark, which is slow)."""
    spec = importlib.util.find_spec("pyspark")
    if spec is None or not spec.submodule_search_locations:
        raise SetupError("pyspark is not installed: pip install 'lakebroker[spark]'")
    jars = Path(next(iter(spec.submodule_search_locations))) / "jars"
    if not jars.is_dir():
        raise SetupError(f"pyspark has no jars at {jars}")
    return jars


def hadoop_version(spark_jars: Path) -> str:
    """The Hadoop inside pyspark: hadoop-aws must be exactly this version."""
    for jar in spark_jars.glob("hadoop-client-api-*.jar"):
        return jar.name.removeprefix("hadoop-client-api-").removesuffix(".jar")
    raise SetupError(f"no hadoop-client-api jar in {spark_jars}")


def _sources() -> list[Path]:
    return sorted(JAVA_SOURCES.rglob("*.java"))


def stamp(spark_jars: Path) -> str:
    """A digest of every input: the poms, the LogStore sources and pyspark's jar list."""
    digest = hashlib.sha256()
    for path in (DELTA_POM, S3A_POM, *_sources()):
        digest.update(str(path.relative_to(HERE)).encode() + b"\0" + path.read_bytes())
    digest.update("\n".join(sorted(p.name for p in spark_jars.iterdir())).encode())
    return digest.hexdigest()


def is_current(jars: Path, spark_jars: Path) -> bool:
    marker = jars / ".stamp"
    return marker.is_file() and marker.read_text().strip() == stamp(spark_jars)


def _artifact(jar_name: str) -> str:
    """`artifact` of `artifact-1.2.3.jar` (Maven's file names, and Spark's after _retrieve)."""
    return re.sub(r"-\d.*$", "", jar_name)


def _run(argv: list[str], what: str, env: dict[str, str] | None = None) -> None:
    done = subprocess.run(argv, capture_output=True, text=True, env=env, check=False)
    if done.returncode != 0:
        raise SetupError(f"{what} failed (exit {done.returncode}):\n{(done.stdout + done.stderr)[-4000:]}")


def _maven(pom: Path, out: Path, m2: Path, props: dict[str, str]) -> None:
    _run(["mvn", "-q", "-B", "-f", str(pom), f"-Dmaven.repo.local={m2}", *(f"-D{k}={v}" for k, v in props.items()),
          "dependency:copy-dependencies", f"-DoutputDirectory={out}"], f"Maven on {pom.name}")


_IVY_SCRIPT = """
import sys
from pyspark.sql import SparkSession
packages, ivy, repositories = sys.argv[1:4]
builder = SparkSession.builder.master("local[1]").appName("lakebroker-spark-setup") \\
    .config("spark.jars.packages", packages).config("spark.jars.ivy", ivy).config("spark.ui.enabled", "false")
if repositories:
    builder = builder.config("spark.jars.repositories", repositories)
builder.getOrCreate().stop()
"""


def _spark_resolver(coordinates: Iterable[str], excluded_groups: Iterable[str], out: Path, ivy: Path,
                    repositories: str) -> None:
    """Spark's own resolver: a local session asks Ivy for `coordinates`; the jars it retrieved
    (named group_artifact-version.jar) are copied out under Maven's names, less excluded groups."""
    wanted = ",".join(coordinates)
    ivy.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(ivy / "jars", ignore_errors=True)
    env = {**os.environ, "PYSPARK_SUBMIT_ARGS": "pyspark-shell"}
    _run([sys.executable, "-c", _IVY_SCRIPT, wanted, str(ivy), repositories], "Spark's resolver", env)
    out.mkdir(parents=True, exist_ok=True)
    skip = tuple(f"{g}_" for g in excluded_groups)
    for jar in sorted((ivy / "jars").glob("*.jar")):
        if jar.name.startswith(skip):
            continue
        _link_or_copy(jar, out / jar.name.split("_", 1)[1])


def _link_or_copy(source: Path, target: Path) -> None:
    try:
        os.link(source, target)  # the AWS bundle is 650 MB: share its blocks when on one filesystem
    except OSError:
        shutil.copy2(source, target)


def _check_clashes(folders: Iterable[Path], spark_jars: Path) -> None:
    ours = {_artifact(p.name) for p in spark_jars.glob("*.jar")}
    clashes = [jar.name for folder in folders for jar in folder.glob("*.jar") if _artifact(jar.name) in ours]
    if clashes:
        raise SetupError(f"these jars are also shipped by pyspark, exclude them in {DELTA_POM}: {', '.join(clashes)}")


def _compile_logstores(jars: Path, spark_jars: Path) -> None:
    javac, jar_tool = shutil.which("javac"), shutil.which("jar")
    if javac is None or jar_tool is None:
        raise SetupError("compiling the LogStores needs a JDK 17 or newer (javac and jar on PATH)")
    classpath = [*jars.glob("delta-storage-*.jar"), *spark_jars.glob("hadoop-client-api-*.jar"),
                 *(jars / "s3a").glob("hadoop-aws-*.jar")]
    with tempfile.TemporaryDirectory() as classes:
        _run([javac, "--release", "17", "-nowarn", "-cp", ":".join(map(str, classpath)), "-d", classes,
              *map(str, _sources())], "javac")
        _run([jar_tool, "--create", "--file", str(jars / LOGSTORE_JAR), "-C", classes, "."], "jar")


def fetch_jars(*, resolver: Resolver = Resolver.AUTO, cache: Path | None = None, repositories: str = "",
               say: Callable[[str], None] = print) -> tuple[Path, bool]:
    """Fill `<cache>/jars` unless it is current; returns it, and whether this call (re)built it."""
    cache = cache or user_cache.cache_dir()
    jars, spark_jars = cache / "jars", pyspark_jars()
    if is_current(jars, spark_jars):
        say(f"Spark jars up to date in {jars}")
        return jars, False
    use_maven = resolver is Resolver.MAVEN or (resolver is Resolver.AUTO and shutil.which("mvn") is not None)
    if resolver is Resolver.MAVEN and shutil.which("mvn") is None:
        raise SetupError("--resolver maven: mvn is not on PATH")
    hadoop = hadoop_version(spark_jars)
    cache.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="jars.new.", dir=cache))
    try:
        delta, s3a = Pom.read(DELTA_POM), Pom.read(S3A_POM, **{"hadoop.version": hadoop})
        if use_maven:
            say(f"resolving the Delta and S3A (Hadoop {hadoop}) jars with Maven")
            _maven(DELTA_POM, scratch, cache / "m2", {})
            _maven(S3A_POM, scratch / "s3a", cache / "m2", {"hadoop.version": hadoop})
        else:
            say(f"resolving the Delta and S3A (Hadoop {hadoop}) jars with Spark's resolver")
            _spark_resolver([*delta.dependencies, *delta.pins], delta.excluded_groups, scratch, cache / "ivy",
                            repositories)
            _spark_resolver(s3a.dependencies, (), scratch / "s3a", cache / "ivy", repositories)
        _check_clashes((scratch, scratch / "s3a"), spark_jars)
        say("compiling the LogStores")
        _compile_logstores(scratch, spark_jars)
        (scratch / ".stamp").write_text(stamp(spark_jars) + "\n")
        old = cache / f"jars.old.{os.getpid()}"
        if jars.exists():
            jars.rename(old)
        scratch.rename(jars)
        shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    say(f"{len(list(jars.glob('*.jar')))} jars in {jars}, {len(list((jars / 's3a').glob('*.jar')))} in {jars / 's3a'}")
    return jars, True
