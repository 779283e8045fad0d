"""A CPU-time stack sampler for a server process (py-spy is not installed here).

`python -m bench.sampler --out PROFILE.json -- <lakebroker CLI args>` runs `lakebroker` in this
process. SIGUSR1 toggles sampling: the first turns it on (load starts) with empty counts, the second turns
it off and writes PROFILE.json (load ends), so startup and shutdown are left out and the file exists
even if the server is later killed.

While on, an ITIMER_PROF timer raises SIGPROF every `--interval` seconds of process CPU. The
handler runs in the main thread (the event loop) and gets the frame it interrupted, so it sees
inside uvloop callbacks. (A sampling *thread* cannot: uvloop drops the GIL between callbacks, so
such a thread always gets the GIL, and takes its sample, with the loop between callbacks.) Each
thread's stack is weighted by the CPU time that thread used since its previous sample, read from
its own CPU clock, so an idle event loop or an idle pool thread weighs nothing, and C code (a
socket send, a delta-rs commit) is charged to the Python frame that called it.

Seconds are kept per thread kind ("main" is the event loop, "worker" any other thread) as
- self: the innermost Python frame;
- total: each function once per sample in which it is anywhere on the stack;
- stacks: collapsed stacks, for a flame graph (`flamegraph.pl` or speedscope read them).

The handler costs some tens of microseconds per sample; the harness reports the throughput under
sampling beside the unsampled figure, so the overhead is visible.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path
from types import CodeType, FrameType
from typing import Any

import orjson

_REPO = str(Path(__file__).resolve().parents[2]) + "/"


def code_label(code: CodeType) -> str:
    path = code.co_filename
    if "site-packages/" in path:
        path = path.split("site-packages/", 1)[1]
    elif path.startswith(_REPO):
        path = path[len(_REPO):]
    elif "/lib/python3" in path:
        path = "stdlib/" + path.split("/lib/python3", 1)[1].split("/", 1)[-1]
    return f"{path}:{code.co_firstlineno}({code.co_name})"


def most_common(counts: dict[Any, float]) -> list[tuple[Any, float]]:
    return sorted(counts.items(), key=lambda kv: kv[1], reverse=True)


class Sampler:
    def __init__(self, interval: float) -> None:
        self.interval = interval
        self.on = False
        self.samples = 0
        self.started = 0.0
        self.wall = 0.0
        self._main = threading.main_thread().ident
        self._main_cpu = 0.0
        self._clocks: dict[int, int] = {}
        self._cpu: dict[int, float] = {}
        self._stacks: defaultdict[tuple[str, tuple[CodeType, ...]], float] = defaultdict(float)

    def toggle(self) -> bool:
        """Flip sampling; return True when it was switched off (time to dump)."""
        if self.on:
            signal.setitimer(signal.ITIMER_PROF, 0, 0)
            self.on = False
            self.wall += time.perf_counter() - self.started
            return True
        self.started = time.perf_counter()
        self.wall, self.samples = 0.0, 0
        self._stacks = defaultdict(float)  # each on/off window is its own profile
        self._main_cpu = time.thread_time()
        self._cpu = {}
        for ident in sys._current_frames():
            if ident != self._main:
                self._thread_cpu(ident)
        self.on = True
        signal.setitimer(signal.ITIMER_PROF, self.interval, self.interval)
        return False

    def _thread_cpu(self, ident: int) -> float | None:
        """CPU used by a thread since the last call for it (None the first time)."""
        try:
            clock = self._clocks.get(ident)
            if clock is None:
                clock = self._clocks[ident] = time.pthread_getcpuclockid(ident)
            now = time.clock_gettime(clock)
        except OSError:  # the thread has ended
            return None
        before = self._cpu.get(ident)
        self._cpu[ident] = now
        return None if before is None else now - before

    @staticmethod
    def _codes(frame: FrameType | None) -> tuple[CodeType, ...]:
        codes: list[CodeType] = []
        while frame is not None:
            codes.append(frame.f_code)
            frame = frame.f_back
        return tuple(codes)

    def on_prof(self, signum: int, frame: FrameType | None) -> None:
        if not self.on:
            return
        now = time.thread_time()
        self._stacks[("main", self._codes(frame))] += now - self._main_cpu
        self._main_cpu = now
        for ident, other in sys._current_frames().items():
            if ident == self._main:
                continue
            used = self._thread_cpu(ident)
            if used:
                self._stacks[("worker", self._codes(other))] += used
        self.samples += 1

    def dump(self, path: Path) -> None:
        labels: dict[CodeType, str] = {}
        self_s: defaultdict[tuple[str, str], float] = defaultdict(float)
        total_s: defaultdict[tuple[str, str], float] = defaultdict(float)
        folded: defaultdict[str, float] = defaultdict(float)
        thread_s: defaultdict[str, float] = defaultdict(float)
        for (kind, codes), seconds in self._stacks.items():
            names = [labels.get(c) or labels.setdefault(c, code_label(c)) for c in codes]
            thread_s[kind] += seconds
            self_s[(kind, names[0] if names else "?")] += seconds
            for name in set(names):
                total_s[(kind, name)] += seconds
            folded[kind + ";" + ";".join(reversed(names))] += seconds

        def table(counts: dict[tuple[str, str], float]) -> list[list[Any]]:
            return [[kind, label, round(s, 6)] for (kind, label), s in most_common(counts)]

        path.write_bytes(orjson.dumps({
            "interval_s": self.interval, "samples": self.samples, "wall_s": self.wall,
            "thread_seconds": dict(thread_s), "self": table(self_s), "total": table(total_s),
            "stacks": {k: round(v, 6) for k, v in most_common(folded)[:2000]},
        }))


def main() -> None:
    parser = argparse.ArgumentParser(description="Run `lakebroker` under a stack sampler.")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--interval", type=float, default=0.001, help="seconds of process CPU")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="-- then the lakebroker CLI arguments")
    options = parser.parse_args()
    args = options.args[1:] if options.args[:1] == ["--"] else options.args
    sampler = Sampler(options.interval)

    def on_usr1(signum: int, frame: FrameType | None) -> None:
        if sampler.toggle():
            sampler.dump(options.out)

    signal.signal(signal.SIGPROF, sampler.on_prof)
    signal.signal(signal.SIGUSR1, on_usr1)
    sys.argv = ["lakebroker", *args]
    from lakebroker.cli import main as lakebroker_main

    lakebroker_main()


if __name__ == "__main__":
    main()
