# SPDX-License-Identifier: Apache-2.0
"""Video job records in SQLite, beside the MP4s (`<video dir>/jobs.sqlite3`), so that a server
started again on the same folder lists and serves the videos finished before it stopped.

One row per job, written when its status changes (created, started, finished), not per step;
what a row holds is the job's own (`VideoJob.record`), and what a server does with the rows of
an earlier run is the job store's (vllm_omni.entrypoints.openai.video_jobs).
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

DATABASE = "jobs.sqlite3"
COLUMNS = (
    "id",
    "model",
    "prompt",
    "size",
    "seconds",
    "created_at",
    "status",
    "progress",
    "completed_at",
    "expires_at",
    "error",
    "path",
    "num_bytes",
)


class VideoRecords:
    """The job table of one video folder."""

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)
        # Autocommit: each status change is on disk when it returns (the event loop is the
        # only writer, a few rows a job).
        self.db = sqlite3.connect(self.folder / DATABASE, isolation_level=None)
        self.db.execute(
            "CREATE TABLE IF NOT EXISTS jobs (seq INTEGER PRIMARY KEY AUTOINCREMENT, "
            "id TEXT UNIQUE NOT NULL, model TEXT, prompt TEXT, size TEXT, seconds TEXT, "
            "created_at INTEGER, status TEXT, progress INTEGER, completed_at INTEGER, "
            "expires_at INTEGER, error TEXT, path TEXT, num_bytes INTEGER)"
        )

    def rows(self) -> list[dict[str, Any]]:
        """Every job's record, oldest first."""
        rows = self.db.execute(f"SELECT {', '.join(COLUMNS)} FROM jobs ORDER BY seq").fetchall()
        records = [dict(zip(COLUMNS, row)) for row in rows]
        for record in records:
            record["error"] = json.loads(record["error"]) if record["error"] else None
            record["path"] = self.folder / record["path"] if record["path"] else None
        return records

    def save(self, record: dict[str, Any]) -> None:
        """Insert or update a job's record (COLUMNS)."""
        values = [record[name] for name in COLUMNS]
        values[COLUMNS.index("error")] = json.dumps(record["error"]) if record["error"] else None
        # The MP4's name in the folder: the folder may move between runs.
        values[COLUMNS.index("path")] = Path(record["path"]).name if record["path"] else None
        updates = ", ".join(f"{name} = excluded.{name}" for name in COLUMNS[1:])
        self.db.execute(
            f"INSERT INTO jobs ({', '.join(COLUMNS)}) VALUES ({', '.join('?' * len(COLUMNS))}) "
            f"ON CONFLICT(id) DO UPDATE SET {updates}",
            values,
        )

    def delete(self, job_id: str) -> None:
        self.db.execute("DELETE FROM jobs WHERE id = ?", (job_id,))

    def close(self) -> None:
        self.db.close()
