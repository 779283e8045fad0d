"""The guides' examples marked `<!-- tested: tests/test_guides.py -->`, run for real.

Each page's marked blocks run in page order against a `lakebroker serve` of the page's own:

- a `bash` block runs in bash, with the server's address for `localhost:8080`, the `lakebroker`
  command on PATH and `LAKEBROKER_DATA_DIR` at the server's data dir. Each `curl` in it is followed
  by a `# -> STATUS BODY` line, which must state its answer: a JSON body equal to the stated one,
  where an object ending in `, ...}` shows only some of its fields and a string ending in `...`
  only its start.
- a `python` block runs in this process, with the server's URL for `http://127.0.0.1:8080`.

Pages: docs/concepts.md, docs/producing.md, docs/security.md (with auth required), docs/kafka.md
(with the server's Kafka listener for `127.0.0.1:9092`).
"""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any

import orjson
import pytest

from lakebroker.ingest_api.partitioner import partition_for_key
from tests.markdown_blocks import Block, code_blocks
from tests.servers import ServerProcess

DOCS = Path(__file__).resolve().parent.parent / "docs"
ME = "tests/test_guides.py"
PAGES: dict[str, dict[str, str]] = {
    "concepts.md": {},
    "producing.md": {},
    # On loopback the API is open unless asked; a new token counts at once, not within auth_cache_ms.
    "security.md": {"LAKEBROKER_AUTH": "required", "LAKEBROKER_AUTH_CACHE_MS": "0"},
    "kafka.md": {},
}
ANSWERED = "@@answered@@"
# Every curl of a block prints its body, then its status and a line of its own.
CURL = f"curl() {{ command curl -sS -w '\\n%{{http_code}}\\n{ANSWERED}\\n' \"$@\"; }}\n"
PARTIAL = '"...": "..."'


def stated_json(text: str) -> Any:
    """A stated body: `, ...}` marks an object shown in part (kept as a `"..."` key)."""
    return orjson.loads(text.replace(", ...}", ", " + PARTIAL + "}"))


def agrees(stated: Any, actual: Any) -> bool:
    if isinstance(stated, dict):
        partial = stated.get("...") == "..."
        fields = {k: v for k, v in stated.items() if k != "..."}
        return (isinstance(actual, dict) and (partial or set(fields) == set(actual))
                and all(k in actual and agrees(v, actual[k]) for k, v in fields.items()))
    if isinstance(stated, list):
        return (isinstance(actual, list) and len(stated) == len(actual)
                and all(agrees(s, a) for s, a in zip(stated, actual, strict=True)))
    if isinstance(stated, str) and stated.endswith("..."):
        return isinstance(actual, str) and actual.startswith(stated[:-3])
    return bool(stated == actual)


def run_shell(block: Block, url: str, data_dir: Path) -> None:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "LAKEBROKER_DATA_DIR": str(data_dir)}
    script = CURL + block.text.replace("localhost:8080", url.removeprefix("http://"))
    done = subprocess.run(["bash", "-eo", "pipefail", "-c", script], capture_output=True, text=True, timeout=120,
                          env=env)
    where = f"the block at line {block.line}"
    assert done.returncode == 0, (where, done.stdout[-2000:], done.stderr[-2000:])
    answers = done.stdout.split(ANSWERED + "\n")[:-1]
    stated = re.findall(r"^ *# -> (\d{3})(?: (.*))?$", block.text, flags=re.M)
    curls = re.findall(r"(?:^[ \t]*|\|\s*)curl ", block.text, flags=re.M)
    assert len(stated) == len(curls) == len(answers), (where, "each curl needs one `# -> STATUS BODY` line",
                                                       len(curls), len(stated), len(answers))
    for answer, (status, body) in zip(answers, stated, strict=True):
        text, code = answer.rstrip("\n").rsplit("\n", 1)
        assert code == status, (where, status, body, code, text)
        if body.startswith(("{", "[")):
            assert agrees(stated_json(body), orjson.loads(text)), (where, body, text)
        else:
            assert text.startswith(body[:-3]) if body.endswith("...") else text == body, (where, body, text)


def run_python(block: Block, server: ServerProcess, namespace: dict[str, Any]) -> str:
    printed = io.StringIO()
    text = block.text.replace("http://127.0.0.1:8080", server.url).replace("127.0.0.1:9092", server.kafka)
    with redirect_stdout(printed):
        exec(compile(text, f"<line {block.line}>", "exec"), namespace)
    return printed.getvalue()


@pytest.mark.parametrize("name", sorted(PAGES))
def test_the_guides_examples_answer_what_they_state(name: str, tmp_path: Path) -> None:
    blocks = [b for b in code_blocks(DOCS / name) if b.tested_by == ME]
    assert blocks, f"docs/{name} has no block marked for {ME}"
    server = ServerProcess(tmp_path / "data", env=PAGES[name])
    url = server.start()
    namespace: dict[str, Any] = {}
    printed = []
    try:
        for block in blocks:
            if block.language == "bash":
                run_shell(block, url, server.data_dir)
            elif block.language == "python":
                printed.append(run_python(block, server, namespace))
            else:
                pytest.fail(f"docs/{name} line {block.line}: {ME} runs bash and python blocks, not {block.language!r}")
    finally:
        server.stop()
    if name == "kafka.md":  # kafka-python's record: the key's murmur2 partition, its first offset; read back
        partition = partition_for_key("user-7", 3)
        record = (partition, 0, b"user-7", b'{"amount": 42}', [("source", b"checkout")])
        assert printed == [f"orders {partition} 0\n", f"{[record]}\n"]
    if name == "producing.md":  # the Python client's producer: the key's partition, as Kafka's partitioner picks
        result = namespace["result"]
        assert (result.topic, result.partition, result.duplicate) == ("orders", partition_for_key("user-7", 3), False)
        arrow_offsets, client_line, frame_line = printed
        assert client_line == f"orders {result.partition} {result.offset}\n"
        # The Arrow batch's answer, read back as Arrow: an offset for each of its two rows.
        offsets = orjson.loads(arrow_offsets)
        assert len(offsets) == 2 and all(isinstance(o, int) and o >= 0 for o in offsets), arrow_offsets
        # send_arrow's DataFrame: two rows stored, each at the partition of its key.
        frame = namespace["results"].to_pylist()
        assert [r["partition"] for r in frame] == [partition_for_key(k, 3) for k in ("user-1", "user-2")]
        assert not any(r["duplicate"] for r in frame) and frame_line.count("'duplicate': False") == 2
