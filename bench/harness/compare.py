"""A closed loop against a server, measured with the server's CPU, and the A-B / B-A alternation that puts
lakebroker beside its baseline in the same run."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from bench.harness.servers import Server
from bench.harness.wrk import LoadResult, closed_loop


def percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


@dataclass
class Measured:
    """One or more closed-loop runs of one target, with the server's CPU time over them."""

    runs: list[LoadResult] = field(default_factory=list)
    cpu_s: float = 0.0

    @property
    def duration_s(self) -> float:
        return sum(r.duration_s for r in self.runs)

    @property
    def requests(self) -> int:
        return sum(r.requests for r in self.runs)

    @property
    def errors(self) -> int:
        return sum(r.errors for r in self.runs)

    @property
    def rps(self) -> float:
        return self.requests / self.duration_s if self.duration_s else 0.0

    @property
    def ok_rps(self) -> float:
        return (self.requests - self.errors) / self.duration_s if self.duration_s else 0.0

    @property
    def p50_ms(self) -> float:
        return percentile([r.p50_ms for r in self.runs], 0.5)

    @property
    def p99_ms(self) -> float:
        return percentile([r.p99_ms for r in self.runs], 0.5)

    @property
    def cpu_us_per_request(self) -> float:
        return self.cpu_s / self.requests * 1e6 if self.requests else 0.0

    @property
    def cpu_share(self) -> float:
        """Server CPU over the runs, in cores (1.0 = one core busy all the time)."""
        return self.cpu_s / self.duration_s if self.duration_s else 0.0

    @property
    def command(self) -> str:
        return self.runs[0].command if self.runs else ""

    def row(self, msg_per_req: int = 1) -> list[str]:
        """msg/s, req/s, p50 ms, p99 ms, server CPU µs per message, server cores, errors."""
        return [f"{self.ok_rps * msg_per_req:,.0f}", f"{self.rps:,.0f}", f"{self.p50_ms:.1f}", f"{self.p99_ms:.1f}",
                f"{self.cpu_us_per_request / msg_per_req:,.1f}", f"{self.cpu_share:.2f}", str(self.errors)]


def measure(server: Server, path: str, work: Path, name: str, body: bytes, content_type: str,
            connections: int, duration_s: float, into: Measured | None = None, accept: str | None = None) -> Measured:
    into = into if into is not None else Measured()
    before = server.cpu()
    into.runs.append(closed_loop(server.url + path, work, name, body, content_type, connections, duration_s,
                                 accept))
    into.cpu_s += server.cpu() - before
    server.settle()
    return into


@dataclass(frozen=True)
class Target:
    """One closed loop's target: a server, a path and the body posted to it."""

    server: Server
    path: str
    name: str
    body: bytes
    content_type: str
    accept: str | None = None


def alternate(rounds: int, duration_s: float, pairs: list[tuple[Server, str]], work: Path, name: str, body: bytes,
              content_type: str, connections: int, accept: str | None = None) -> list[Measured]:
    """Measure each (server, path) in turn, reversing the order every round (A-B, B-A, ...)."""
    return interleave(rounds, duration_s, [Target(server, path, f"{name}-{i}", body, content_type, accept)
                                           for i, (server, path) in enumerate(pairs)], work, connections)


def interleave(rounds: int, duration_s: float, targets: list[Target], work: Path, connections: int) -> list[Measured]:
    """`alternate` over targets that may differ in body too: figures compared with each other are
    measured in the same minutes, so a host that speeds up or slows down between phases moves them
    alike."""
    out = [Measured() for _ in targets]
    for k in range(rounds):
        order = list(range(len(targets)))
        if k % 2:
            order.reverse()
        for i in order:
            t = targets[i]
            measure(t.server, t.path, work, t.name, t.body, t.content_type, connections, duration_s, out[i], t.accept)
    return out
