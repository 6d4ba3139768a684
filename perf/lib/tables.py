"""Result tables: rows are dicts; written as Markdown, CSV and JSON.

A row measured successfully has ``status == "ok"`` and numbers in its value columns.  A
row that failed has its status ("OOM", "unsupported", "skipped", "error: ...") and None
in its value columns; the Markdown writers print the status in those cells, so a table
reads "OOM" exactly where a measurement ran out of memory.  CSV and JSON keep the raw
values (empty / null) next to the status column.
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import Iterable, Sequence


def format_value(value) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        magnitude = abs(value)
        if magnitude >= 100:
            return f"{value:.0f}" if magnitude >= 1e4 else f"{value:.1f}"
        return f"{value:.3f}" if magnitude >= 0.01 or value == 0 else f"{value:.2e}"
    return str(value)


def _status(row: dict) -> str:
    status = row.get("status", "ok")
    return "" if status == "ok" else str(status)


def _short_status(status: str) -> str:
    """A failed status in one word for the value cells: "OOM", "error", "skipped"; the
    whole message stays in the status column (a line-long message in every cell hides
    the table)."""
    if "OutOfMemoryError" in status or "out of memory" in status:
        return "OOM"
    return status.split(":", 1)[0].strip()


def cell(row: dict, column: str) -> str:
    """A row's value in a column; a failed row shows its status where a value is missing
    (in one word, but in the status column itself)."""
    value = row.get(column)
    if value is None and _status(row):
        return _status(row) if column == "status" else _short_status(_status(row))
    return format_value(value)


def _escape(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def markdown_table(rows: Sequence[dict], columns: Sequence[str], headers: Sequence[str] | None = None) -> str:
    headers = list(headers or columns)
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    for row in rows:
        lines.append("| " + " | ".join(_escape(cell(row, c)) for c in columns) + " |")
    return "\n".join(lines) + "\n"


def pivot_markdown(rows: Sequence[dict], index: Sequence[str], column: str, value: str,
                   column_order: Sequence[str] | None = None) -> str:
    """One line per distinct ``index`` tuple, one column per distinct ``column`` value.

    A cell is the ``value`` of the row with that index and column, or its status where the
    measurement failed; empty where no such row was measured.
    """
    keys, by_key, seen_columns = [], {}, []
    for row in rows:
        key = tuple(row.get(i) for i in index)
        if key not in by_key:
            keys.append(key)
            by_key[key] = {}
        by_key[key][row.get(column)] = row
        if row.get(column) not in seen_columns:
            seen_columns.append(row.get(column))
    columns = [c for c in (column_order or seen_columns) if c in seen_columns]
    lines = ["| " + " | ".join([*index, *map(str, columns)]) + " |",
             "|" + "|".join("---" for _ in [*index, *columns]) + "|"]
    for key in keys:
        cells = [format_value(k) for k in key]
        for c in columns:
            row = by_key[key].get(c)
            cells.append("" if row is None else cell(row, value))
        lines.append("| " + " | ".join(_escape(x) for x in cells) + " |")
    return "\n".join(lines) + "\n"


def write_markdown(path: str | Path, sections: Iterable[tuple[str, str]], title: str | None = None) -> Path:
    """A Markdown file of (heading, body) sections."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    parts = [f"# {title}\n"] if title else []
    for heading, body in sections:
        parts.append(f"## {heading}\n\n{body.rstrip()}\n")
    path.write_text("\n".join(parts))
    return path


def write_csv(path: str | Path, rows: Sequence[dict], columns: Sequence[str] | None = None) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if columns is None:
        columns = []
        for row in rows:
            columns.extend(k for k in row if k not in columns)
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(columns), extrasaction="ignore")
        writer.writeheader()
        for row in rows:
            writer.writerow({c: ("" if row.get(c) is None else row.get(c)) for c in columns})
    return path


def _json_safe(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return str(value)


def write_json(path: str | Path, payload) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(_json_safe(payload), indent=1) + "\n")
    return path
