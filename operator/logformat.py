"""The operator's log lines: readable text, or one JSON object per line for a cluster's log pipeline."""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from typing import Literal

LogFormat = Literal["text", "json"]
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
STANDARD_FIELDS = frozenset(vars(logging.makeLogRecord({})))
"""The attributes every record has; anything else on a record came as `extra=` and is kept as a field."""


class JsonFormatter(logging.Formatter):
    """`{"time", "level", "logger", "message", ...}`: the record's `extra=` fields (kopf's `object`, say) too,
    and the traceback as `exception`. Values that are not JSON become their text."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in STANDARD_FIELDS and key not in entry and not key.startswith("_"):
                entry[key] = value
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


def configure(level: str, log_format: LogFormat) -> None:
    """Set up the root logger in the chosen format (replacing any handler set before)."""
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter() if log_format == "json" else logging.Formatter(TEXT_FORMAT))
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)
