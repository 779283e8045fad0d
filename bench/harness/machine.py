"""The machine a run was measured on: CPU, memory, software versions, load and the code's commit."""

from __future__ import annotations

import os
import platform
import subprocess
from dataclasses import dataclass
from importlib import metadata

from bench.harness.servers import REPO

PACKAGES = ("fastapi", "starlette", "uvicorn", "uvloop", "httptools", "pydantic", "deltalake", "pyarrow", "orjson")
_LSCPU_KEYS = ("Architecture", "Model name", "CPU(s)", "Thread(s) per core", "Core(s) per socket", "CPU max MHz",
               "L2 cache", "L3 cache", "Hypervisor vendor")


def _run(argv: list[str]) -> str:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=20, check=False, cwd=REPO)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"({argv[0]} unavailable: {exc})"
    return (done.stdout + done.stderr).strip()


@dataclass
class Machine:
    nproc: str
    free: str
    lscpu: str
    kernel: str
    python: str
    java: str
    wrk: str
    packages: dict[str, str]
    commit: str
    dirty_files: int
    loadavg_start: str

    def loadavg_now(self) -> str:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())


def describe() -> Machine:
    lscpu = "\n".join(ln for ln in _run(["lscpu"]).splitlines() if ln.split(":")[0].strip() in _LSCPU_KEYS)
    java = _run(["java", "-version"]).splitlines()
    wrk = _run(["wrk", "--version"]).splitlines()
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "not installed"
    status = _run(["git", "status", "--porcelain"])
    return Machine(
        nproc=_run(["nproc"]), free=_run(["free", "-m"]), lscpu=lscpu, kernel=platform.release(),
        python=platform.python_version() + " (" + platform.python_implementation() + ")",
        java=java[0] if java else "(none)", wrk=wrk[0].split(" Copyright")[0] if wrk else "(none)",
        packages=versions, commit=_run(["git", "rev-parse", "--short", "HEAD"]),
        dirty_files=len([ln for ln in status.splitlines() if ln.strip()]),
        loadavg_start=" ".join(f"{x:.2f}" for x in os.getloadavg()),
    )
