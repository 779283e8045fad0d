"""bench.wire_ab, the issue's single-produce A/B, end to end in its smallest form. No figure is
asserted (a one-second run on a shared machine means nothing): both servers answer the issue's
body with 2xx only, and the CPU and thread figures are read."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.wire_ab import ab

pytestmark = pytest.mark.timeout(120)


def test_both_servers_take_the_issues_body_and_their_cpu_is_read(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    [(bare, lake)] = ab(rounds=1, duration_s=1, connections=4, ack="wal", partitions=2, work=tmp_path, warmup_s=0)

    assert bare.load.requests > 0 and bare.load.errors == 0
    assert lake.load.requests > 0 and lake.load.errors == 0  # wrk counts any non-2xx answer as an error
    assert lake.cpu_s > 0 and lake.threads
    assert "ratio" in capsys.readouterr().out
