"""Where the tenant API keeps its jobs: a real database, so a job and its outcome survive a restart
of the service and are seen by every replica.

SQLite by default (a file in the service's state directory: one replica), PostgreSQL by URL
(`postgresql+psycopg://user@host/db`: several replicas, a managed database). SQLAlchemy Core
speaks both, so the service has one table definition and no SQL of its own per dialect.

A job's work (a Pulumi operation) runs in the process that accepted it; a job that process did not
finish (it stopped while the job was queued or running) is marked failed when the service starts
again, with what to do: the stacks keep the truth, a `GET` of the tenant shows where it stands.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Any

import sqlalchemy as sa

metadata = sa.MetaData()

jobs = sa.Table(
    "tenant_api_jobs",
    metadata,
    sa.Column("id", sa.String(32), primary_key=True),
    sa.Column("operation", sa.String(16), nullable=False),
    sa.Column("environment", sa.String(63), nullable=False),
    sa.Column("tenant", sa.String(63), nullable=False),
    sa.Column("state", sa.String(16), nullable=False),
    sa.Column("owners", sa.JSON, nullable=False),
    sa.Column("subject", sa.String(255), nullable=False),
    # The job as the API shows it (`JobView`), written at every change of state.
    sa.Column("view", sa.JSON, nullable=False),
    sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
)

UNFINISHED = ("queued", "running")


class JobStore:
    def __init__(self, url: str):
        self.engine = sa.create_engine(url, pool_pre_ping=True)
        metadata.create_all(self.engine)

    def save(self, job_id: str, view: dict[str, Any], owners: frozenset[str], subject: str) -> None:
        row = {
            "operation": view["operation"],
            "environment": view["environment"],
            "tenant": view["tenant"],
            "state": view["state"],
            "owners": sorted(owners),
            "subject": subject,
            "view": json.loads(json.dumps(view, default=str)),
            "updated_at": datetime.now(timezone.utc),
        }
        with self.engine.begin() as db:
            if db.execute(sa.update(jobs).where(jobs.c.id == job_id).values(**row)).rowcount == 0:
                db.execute(sa.insert(jobs).values(id=job_id, **row))

    def load(self, job_id: str) -> tuple[dict[str, Any], frozenset[str], str] | None:
        with self.engine.connect() as db:
            row = db.execute(sa.select(jobs.c.view, jobs.c.owners, jobs.c.subject).where(jobs.c.id == job_id)).first()
        return None if row is None else (row.view, frozenset(row.owners), row.subject)

    def interrupted(self, reason: str) -> int:
        """Mark every job no process is running any more as failed; how many there were."""
        with self.engine.begin() as db:
            rows = db.execute(sa.select(jobs.c.id, jobs.c.view).where(jobs.c.state.in_(UNFINISHED))).all()
            for row in rows:
                view = {**row.view, "state": "failed", "error": f"{reason} while it was {row.view['state']}", "finished_at": datetime.now(timezone.utc).isoformat()}
                db.execute(sa.update(jobs).where(jobs.c.id == row.id).values(state="failed", view=view, updated_at=datetime.now(timezone.utc)))
        return len(rows)
