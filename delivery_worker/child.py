"""The entry point of serve's delivery process (`python -m lakebroker.delivery_worker.child`), started and
supervised by delivery_worker/supervisor.py.

It reads one JSON object on stdin: the parent's settings (so overrides made in code reach the
child too), the parent's pid and the worker id. Its metrics go to the files under
PROMETHEUS_MULTIPROC_DIR, which the parent serves on its own /metrics.
"""

from __future__ import annotations

import logging
import os
import sys

import orjson


def main() -> None:
    order = orjson.loads(sys.stdin.buffer.read())
    from lakebroker.delivery_worker.runner import die_with_parent

    die_with_parent(order["parent_pid"])
    from lakebroker.tables.process_memory import keep_small

    keep_small()
    import uvloop
    from prometheus_client import CollectorRegistry

    from lakebroker.delivery_worker.metrics import DeliveryMetrics
    from lakebroker.delivery_worker.runner import run_until_stopped
    from lakebroker.delivery_worker.worker import DeliveryWorker
    from lakebroker.tables.logs import configure_logging, exit_without_teardown
    from lakebroker.tables.settings import Settings

    settings = Settings.model_validate(order["settings"])
    configure_logging(settings)  # serve's format (text or JSON) and level: both write to the same stderr
    worker = DeliveryWorker(settings, DeliveryMetrics(CollectorRegistry()), order["worker_id"])
    logging.getLogger("lakebroker.delivery_worker.child").info("delivery worker %s (pid %d) started for serve %d",
                                                    worker.worker_id, os.getpid(), order["parent_pid"])
    uvloop.run(run_until_stopped(worker, parent_pid=order["parent_pid"]))
    exit_without_teardown(0)


if __name__ == "__main__":
    main()
