"""A real PostgreSQL server for the tests, started from the locally installed binaries.

One server per test session (initdb takes a second or two); every test gets its own
database in it, so tests never see each other's rows. The server listens on 127.0.0.1 only,
on a free port, with its unix socket in its own temporary directory, and is stopped at the
end of the session. Without the binaries (Debian/Ubuntu package ``postgresql``) the tests
that need it are skipped with a reason saying what to install.

Use it from a test module with ``from tests.integration.postgres import *`` or by listing
this module in ``pytest_plugins``.
"""

from __future__ import annotations

import glob
import itertools
import os
import pwd
import secrets
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.integration.cluster import free_port

__all__ = ["PostgresServer", "postgres", "postgres_url", "db_url", "find_postgres_bin"]

APT_PACKAGE = "postgresql"
BINARIES = ("initdb", "pg_ctl", "postgres")
SYSTEM_USER = "postgres"  # PostgreSQL refuses to run as root
ROLE = "shoal"

_databases = itertools.count(1)


def find_postgres_bin() -> Path | None:
    """The newest PostgreSQL bin directory that has initdb, pg_ctl and postgres, or None."""
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin"),
                        key=lambda p: int(Path(p).parent.name) if Path(p).parent.name.isdigit() else 0,
                        reverse=True)
    on_path = shutil.which("pg_ctl")
    if on_path:
        candidates.append(str(Path(on_path).parent))
    for d in candidates:
        if all(os.access(os.path.join(d, b), os.X_OK) for b in BINARIES):
            return Path(d)
    return None


@dataclass
class PostgresServer:
    """A running server: where it listens and how to reach it as the test role."""

    bindir: Path
    root: Path
    port: int
    password: str
    run_as: str | None

    @property
    def datadir(self) -> Path:
        return self.root / "data"

    def url(self, database: str) -> str:
        return f"postgresql+psycopg://{ROLE}:{self.password}@127.0.0.1:{self.port}/{database}"

    def _cmd(self, argv: list[str], *, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess:
        if self.run_as:
            argv = ["runuser", "-u", self.run_as, "--", *argv]
        out = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=self.root)
        if check and out.returncode != 0:
            log = self.root / "postgres.log"
            tail = log.read_text(errors="replace")[-3000:] if log.exists() else ""
            raise RuntimeError(f"{' '.join(argv)} exited {out.returncode}:\n{out.stdout}\n{out.stderr}\n{tail}")
        return out

    def psql(self, sql: str, database: str = "postgres") -> str:
        """Run SQL as the superuser over the unix socket (no password needed there)."""
        out = self._cmd([str(self.bindir / "psql"), "-X", "-q", "-v", "ON_ERROR_STOP=1", "-h", str(self.root),
                         "-p", str(self.port), "-U", SYSTEM_USER, "-d", database, "-tA", "-c", sql])
        return out.stdout

    def create_database(self) -> str:
        """A fresh, empty database owned by the test role; returns its SQLAlchemy URL."""
        name = f"shoal_test_{os.getpid()}_{next(_databases)}"
        self.psql(f'CREATE DATABASE "{name}" OWNER {ROLE}')
        return self.url(name)

    def start(self) -> None:
        pw_file = self.root / "superuser.pw"
        pw_file.write_text(secrets.token_hex(16) + "\n")
        self._chown(pw_file)
        self._cmd([str(self.bindir / "initdb"), "-D", str(self.datadir), "-U", SYSTEM_USER, "-E", "UTF8",
                   "--locale=C", "--auth-local=trust", "--auth-host=scram-sha-256", f"--pwfile={pw_file}"],
                  timeout=120)
        # Durability settings are off: the tests kill Shoal's server, never PostgreSQL itself,
        # and a committed row is visible to every new connection either way.
        options = " ".join([
            "-c listen_addresses=127.0.0.1", f"-c port={self.port}",
            f"-c unix_socket_directories={self.root}", "-c max_connections=300",
            "-c fsync=off", "-c synchronous_commit=off", "-c full_page_writes=off",
            "-c shared_buffers=64MB", "-c dynamic_shared_memory_type=mmap",
        ])
        self._cmd([str(self.bindir / "pg_ctl"), "-D", str(self.datadir), "-l", str(self.root / "postgres.log"),
                   "-o", options, "-w", "-t", "60", "start"], timeout=90)
        self.psql(f"CREATE ROLE {ROLE} LOGIN CREATEDB PASSWORD '{self.password}'")

    def stop(self) -> None:
        self._cmd([str(self.bindir / "pg_ctl"), "-D", str(self.datadir), "-m", "fast", "-w", "stop"],
                  check=False, timeout=60)

    def _chown(self, path: Path) -> None:
        if self.run_as:
            pw = pwd.getpwnam(self.run_as)
            os.chown(path, pw.pw_uid, pw.pw_gid)


def _system_user() -> str | None:
    """As root, the unprivileged account PostgreSQL runs as (created if missing); else None."""
    if os.geteuid() != 0:
        return None
    try:
        pwd.getpwnam(SYSTEM_USER)
    except KeyError:
        subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", SYSTEM_USER],
                       check=True, capture_output=True)
    if shutil.which("runuser") is None:
        pytest.skip("running as root, PostgreSQL must run as another user, and runuser (util-linux) is missing")
    return SYSTEM_USER


@pytest.fixture(scope="session")
def postgres():
    """A PostgreSQL server for the whole session, or a skip naming the package to install."""
    bindir = find_postgres_bin()
    if bindir is None:
        pytest.skip(f"PostgreSQL is not installed: no {'/'.join(BINARIES)} under /usr/lib/postgresql/*/bin "
                    f"or on PATH (apt-get install -y {APT_PACKAGE})")
    try:
        import psycopg  # noqa: F401
    except ImportError:
        pytest.skip("the PostgreSQL driver is not installed: pip install 'psycopg[binary]' (extra 'postgres')")
    run_as = _system_user()
    # Not under pytest's tmp dir: that is private to the test user, and the server runs as another.
    root = Path(tempfile.mkdtemp(prefix="shoal-pg-"))
    os.chmod(root, 0o700)
    server = PostgresServer(bindir=bindir, root=root, port=free_port(), password=secrets.token_hex(16),
                            run_as=run_as)
    server._chown(root)
    try:
        server.start()
    except Exception:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)
        raise
    yield server
    server.stop()
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def postgres_url(postgres: PostgresServer) -> str:
    """The SQLAlchemy URL of a fresh, empty database on the session's PostgreSQL server."""
    return postgres.create_database()


@pytest.fixture(params=[
    "sqlite",
    pytest.param("postgresql", marks=pytest.mark.postgres),
])
def db_url(request, tmp_path) -> str:
    """An empty database on each engine Shoal supports: an SQLite file, then a PostgreSQL database."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'shoal.db'}"
    return request.getfixturevalue("postgres_url")
