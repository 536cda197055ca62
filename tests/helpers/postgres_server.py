"""A throwaway PostgreSQL server on loopback for tests (Debian's `postgresql` package).

PostgreSQL refuses to run as root, so when the tests run as root (CI does) the server runs as the
`postgres` system user.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
from glob import glob
from pathlib import Path


def _bin(name: str) -> str:
    candidates = sorted(glob(f"/usr/lib/postgresql/*/bin/{name}"))
    if not candidates:
        raise FileNotFoundError(f"PostgreSQL's {name} is missing: apt-get install postgresql (.ci/run does)")
    return candidates[-1]


def _as_server_user(command: list[str]) -> list[str]:
    return ["runuser", "-u", "postgres", "--", *command] if os.geteuid() == 0 else command


class PostgresServer:
    """`with PostgresServer() as pg:` a fresh cluster in its own temp folder; `pg.env()` for dagster.yaml."""

    def __init__(self) -> None:
        # Its own folder under /tmp: pytest's tmp_path sits below a root-only (0700) folder the
        # `postgres` user could not enter.
        self.base = Path(tempfile.mkdtemp(prefix="zero-pg-"))
        self.data, self.sockets = self.base / "data", self.base / "sockets"
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.user, self.db = "zero", "zero_dagster"

    def __enter__(self) -> PostgresServer:
        self.sockets.mkdir(parents=True)
        if os.geteuid() == 0:
            shutil.chown(self.base, "postgres")
            shutil.chown(self.sockets, "postgres")
        run = lambda cmd: subprocess.run(_as_server_user(cmd), check=True, capture_output=True, text=True)  # noqa: E731
        run([_bin("initdb"), "-D", str(self.data), "-U", self.user, "--auth=trust", "-E", "UTF8"])
        run(
            [
                _bin("pg_ctl"),
                "-D",
                str(self.data),
                "-l",
                str(self.base / "server.log"),
                "-w",
                "-t",
                "60",
                "start",
                "-o",
                f"-h 127.0.0.1 -p {self.port} -k {self.sockets}",
            ]
        )
        run([_bin("createdb"), "-h", "127.0.0.1", "-p", str(self.port), "-U", self.user, self.db])
        return self

    def __exit__(self, *exc) -> None:
        subprocess.run(
            _as_server_user([_bin("pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "stop"]), capture_output=True
        )
        shutil.rmtree(self.base, ignore_errors=True)

    def env(self) -> dict[str, str]:
        return {
            "DAGSTER_PG_HOST": "127.0.0.1",
            "DAGSTER_PG_PORT": str(self.port),
            "DAGSTER_PG_USER": self.user,
            "DAGSTER_PG_PASSWORD": "",
            "DAGSTER_PG_DB": self.db,
        }
