"""`lakebroker spark setup|paths`: fill the per-user cache that Spark sessions need (tables/user_cache.py),
and say where it and the Airflow DAG file are."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer

from lakebroker.console import out
from lakebroker.spark_pipeline import spark_setup
from lakebroker.spark_pipeline.spark_setup import Resolver
from lakebroker.tables import user_cache
from lakebroker.tables.settings import Settings


def dags_folder() -> Path:
    """The installed DAG file's folder: point Airflow's dags_folder here, or copy the file into yours."""
    import lakebroker.airflow_dags

    return Path(lakebroker.airflow_dags.__file__).resolve().parent


def register(app: typer.Typer, settings: Callable[[], Settings], fail: Callable[[str, int], typer.Exit]) -> None:
    spark_app = typer.Typer(no_args_is_help=True, help="Set up the jars Spark sessions need; show where they are.")
    app.add_typer(spark_app, name="spark")

    @spark_app.command("setup")
    def setup(
        resolver: Annotated[Resolver, typer.Option(help="auto: Maven when `mvn` is on PATH, else Spark's own "
                                                        "resolver.")] = Resolver.AUTO,
        repositories: Annotated[str, typer.Option(help="Extra Maven repositories for Spark's resolver, "
                                                       "comma-separated URLs.")] = "",
        class_archive: Annotated[bool, typer.Option(help="Also build the JVM class archive (faster session "
                                                         "starts).")] = True,
    ) -> None:
        """Fetch the Delta and S3A jars and compile the LogStores into the per-user cache
        ($LAKEBROKER_CACHE_DIR, else ~/.cache/lakebroker); a no-op while they are current."""
        from lakebroker.spark_pipeline.extra import missing_spark_message, spark_installed

        if not spark_installed():
            raise fail(missing_spark_message("lakebroker spark setup"), 1)
        from lakebroker.spark_pipeline.class_archive import build

        try:
            jars, rebuilt = spark_setup.fetch_jars(resolver=resolver, repositories=repositories,
                                                   say=lambda line: out.print(line, highlight=False))
            if class_archive and (rebuilt or not user_cache.class_archive().is_file()):
                out.print("building the JVM class archive", highlight=False)
                out.print(f"class archive: {build(jars)}", highlight=False)
        except (spark_setup.SetupError, RuntimeError) as exc:
            raise fail(str(exc), 1) from exc

    @spark_app.command("paths")
    def paths() -> None:
        """Where the cache, the jars, the class archive and the Airflow DAG file are."""
        out.print(f"cache: {user_cache.cache_dir()}", highlight=False)
        out.print(f"jars: {settings().spark_jars_dir}", highlight=False)
        out.print(f"class archive: {user_cache.class_archive()}", highlight=False)
        out.print(f"airflow dags folder: {dags_folder()}", highlight=False)
