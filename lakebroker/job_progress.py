"""The live progress display of the job commands (`compact`, `retention`, `replicate`, `verify-replica`).

It is driven by the job's own events (lakebroker.spark_pipeline.results.TableEvent, one as each table starts
and ends): tables done out of all, the table at work, data files before → after, and the job's
row count. Only on a terminal: piped or redirected output gets no progress, just the result.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from lakebroker.spark_pipeline.results import Progress as ProgressFn
from lakebroker.spark_pipeline.results import TableEvent


@contextmanager
def job_progress(console: Console, title: str, rows_label: str | None = None) -> Iterator[ProgressFn | None]:
    """A callback for the job's `progress` argument that draws on `console`; None off a terminal."""
    if not console.is_terminal:
        yield None
        return
    columns = [SpinnerColumn(), TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
               TextColumn("tables"), TextColumn("{task.fields[files]}"), TextColumn("{task.fields[rows]}"),
               TimeElapsedColumn(), TextColumn("{task.fields[current]}")]
    with Progress(*columns, console=console, transient=True) as bar:
        task = bar.add_task(title, total=None, files="", rows="", current="")
        totals = {"before": 0, "after": 0, "rows": 0}

        def on_event(event: TableEvent) -> None:
            if not event.done:
                bar.update(task, total=event.total, current=event.target)
            else:
                before, after = event.files or (None, None)
                totals["before"] += before or 0
                totals["after"] += after or 0
                totals["rows"] += event.rows or 0
                files = f"files {totals['before']} → {totals['after']}" if event.files else ""
                rows = f"{rows_label} {totals['rows']:,}" if rows_label else ""
                bar.update(task, total=event.total, completed=event.number, current="",
                           files=files or bar.tasks[0].fields["files"], rows=rows)
            bar.refresh()

        yield on_event
