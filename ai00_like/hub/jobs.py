"""Downloads the server runs for the web page (POST /admin/models/pull): each pull in a
thread of its own, its progress read off the size of its partial file. What can be refused
at once is, before any thread starts: a bad name, a file the hub does not have, a hub that
cannot be asked, a disk without room for the file."""

from __future__ import annotations

import threading
import uuid
from dataclasses import dataclass
from pathlib import Path

from .catalogue import Model, resolve
from .download import PullError, check_room, hub_file, partial_path, pull


@dataclass
class Job:
    id: str
    name: str
    repo: str
    file: str
    model: Model | None
    status: str = "running"  # then "done" or "failed"
    total: int | None = None
    path: str | None = None
    error: str | None = None


class Downloads:
    def __init__(self, folder: Path):
        self.folder = folder
        self.jobs: dict[str, Job] = {}
        self._lock = threading.Lock()

    def start(self, name: str) -> Job:
        """A new download of `name` (an alias or REPO/FILE), or the one already running for
        that file. Raises catalogue.UnknownModel (InvalidName too), and PullError when the hub
        cannot be asked or has no such file, or the folder's disk has no room for it (asked
        here, before anything starts; blocks for that)."""
        repo, file, model = resolve(name)
        metadata, _ = hub_file(repo, file)
        check_room(self.folder, repo, file, metadata.size)
        with self._lock:
            for job in self.jobs.values():
                if job.status == "running" and (job.repo, job.file) == (repo, file):
                    return job
            job = Job(f"pull-{uuid.uuid4().hex[:12]}", name, repo, file, model)
            self.jobs[job.id] = job
        threading.Thread(target=self._run, args=(job,), name=f"pull {file}", daemon=True).start()
        return job

    def done_bytes(self, job: Job) -> int:
        if job.status == "done":
            return job.total or 0
        part = partial_path(self.folder, job.repo, job.file)
        return part.stat().st_size if part.exists() else 0

    def _run(self, job: Job) -> None:
        def heard(size: int) -> None:
            job.total = size

        try:
            job.path = str(pull(job.repo, job.file, self.folder, on_size=heard))
            job.status = "done"
        except PullError as e:
            job.error, job.status = str(e), "failed"
