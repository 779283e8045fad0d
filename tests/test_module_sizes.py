"""The ingest tier stays in small modules, each holding one concept (docs/architecture.md): a module
that grows past these bounds is holding a second concept, which goes to a module of its own."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MOST_LINES = 450
BROKER_MOST_LINES = 300  # the composition of the ingest parts, no rules of its own


def _lines(path: Path) -> int:
    return len(path.read_text().splitlines())


def test_no_ingest_module_is_over_its_bound() -> None:
    sizes = {str(p.relative_to(ROOT)): _lines(p) for p in (ROOT / "ingest_api").rglob("*.py")}
    assert len(sizes) > 40
    assert {p: n for p, n in sizes.items() if n > MOST_LINES} == {}
    assert sizes["ingest_api/broker.py"] < BROKER_MOST_LINES
