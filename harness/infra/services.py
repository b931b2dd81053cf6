"""Outside services (an MLflow server, a PostgreSQL store, a Ray cluster) are checked with a deadline
before the harness hands them to a library that would wait for minutes.

Without this, an unreachable ``MLFLOW_TRACKING_URI`` keeps every command silent for minutes (MLflow
retries each request 7 times with exponential backoff) and an unreachable ``RAY_ADDRESS`` waits on
Ray's GCS client indefinitely. Each check here connects once within :func:`connect_timeout` seconds
(``$HARNESS_CONNECT_TIMEOUT``, default :data:`DEFAULT_CONNECT_TIMEOUT`) and otherwise raises
:class:`harness.errors.ServiceError`: one line that names the service and its address with the
credentials redacted (:func:`harness.infra.safety.redact`); the CLI prints it and exits 1.

PostgreSQL connections opened later by MLflow's or Optuna's SQLAlchemy engines get the same bound
through libpq's own ``PGCONNECT_TIMEOUT`` (set, unless the environment sets it, by
:func:`bound_database_connects`).

A successful check is remembered for the process, so a worker that opens many clients pays once.
"""

from __future__ import annotations

import os
import socket
import sys
import urllib.error
import urllib.request
from typing import Optional
from urllib.parse import urlsplit

from harness.errors import HarnessError, ServiceError

#: Environment variable: seconds a connection to an outside service may take.
TIMEOUT_ENV = "HARNESS_CONNECT_TIMEOUT"
#: Seconds allowed to connect to an outside service when ``$HARNESS_CONNECT_TIMEOUT`` is unset.
DEFAULT_CONNECT_TIMEOUT = 15.0
#: Default ports of the database schemes SQLAlchemy URLs name.
_DB_PORTS = {"postgresql": 5432, "postgres": 5432, "mysql": 3306, "mariadb": 3306, "mssql": 1433}

_REACHED: set[tuple[str, str]] = set()


def connect_timeout() -> float:
    """Seconds allowed to reach an outside service: ``$HARNESS_CONNECT_TIMEOUT``, else 15.

    Raises:
        HarnessError: the variable is not a number in (0, 600].
    """
    raw = os.environ.get(TIMEOUT_ENV)
    if raw is None or raw == "":
        return DEFAULT_CONNECT_TIMEOUT
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not 0 < value <= 600:
        raise HarnessError(f"{TIMEOUT_ENV}: must be a number of seconds in (0, 600], got {raw!r}")
    return value


def _fail(service: str, address: str, why: str, timeout: float) -> ServiceError:
    from harness.infra.safety import one_line, redact

    return ServiceError(f"{service} at {redact(address)} is unreachable ({one_line(why, 160)}; "
                        f"gave up after at most {timeout:g} s, set {TIMEOUT_ENV} to wait longer)")


def check_tcp(service: str, address: str, host: str, port: int, timeout: Optional[float] = None) -> None:
    """Open (and close) a TCP connection to ``host:port`` within ``timeout`` seconds.

    Args:
        service: what is being reached, for the message (e.g. ``"Ray cluster"``).
        address: the address as the user gave it (shown redacted).
    Raises:
        ServiceError: refused, unresolvable, or not connected within the timeout.
    """
    timeout = connect_timeout() if timeout is None else timeout
    try:
        with socket.create_connection((host, port), timeout=timeout):
            pass
    except OSError as e:  # refused, timed out, no route, unknown host
        raise _fail(service, address, str(e) or type(e).__name__, timeout) from None


def check_http(service: str, url: str, timeout: Optional[float] = None) -> None:
    """GET ``url``'s ``/health`` within ``timeout`` seconds; any HTTP answer (even 401 or 404) counts as
    reached. The request carries no credentials: the user info of ``url`` is dropped.

    Raises:
        ServiceError: no HTTP answer within the timeout (refused, a server that accepts and never
            answers, an unresolvable host).
    """
    timeout = connect_timeout() if timeout is None else timeout
    parts = urlsplit(url)
    host = parts.hostname or ""
    netloc = f"[{host}]" if ":" in host else host
    if parts.port is not None:
        netloc += f":{parts.port}"
    probe = f"{parts.scheme}://{netloc}{parts.path.rstrip('/')}/health"
    try:
        with urllib.request.urlopen(probe, timeout=timeout):  # noqa: S310  (http(s) only: the caller checks the scheme)
            pass
    except urllib.error.HTTPError:
        return  # it answered
    except (urllib.error.URLError, OSError, ValueError) as e:
        reason = getattr(e, "reason", None) or e
        raise _fail(service, url, str(reason) or type(e).__name__, timeout) from None


def check_database(service: str, url: str, timeout: Optional[float] = None) -> None:
    """Reach the database of a SQLAlchemy ``url`` within ``timeout`` seconds: PostgreSQL by a real
    ``psycopg`` connection (``connect_timeout``), other servers by a TCP connection; sqlite and other
    file stores are not checked. Later connections get the same bound (:func:`bound_database_connects`).

    Raises:
        ServiceError: the server does not answer, or refuses the connection (bad credentials included).
    """
    timeout = connect_timeout() if timeout is None else timeout
    bound_database_connects()
    parts = urlsplit(url)
    scheme = parts.scheme.split("+", 1)[0]
    if scheme not in _DB_PORTS:
        return
    if scheme in ("postgresql", "postgres"):
        try:
            import psycopg
        except ImportError:  # no driver: the library's own error says so when it opens the store
            return
        try:
            with psycopg.connect(parts._replace(scheme="postgresql").geturl(), connect_timeout=max(2, round(timeout))):
                pass
        except psycopg.Error as e:
            raise _fail(service, url, str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__, timeout) from None
        return
    check_tcp(service, url, parts.hostname or "localhost", parts.port or _DB_PORTS[scheme], timeout)


def bound_database_connects() -> None:
    """Make libpq (``psycopg``, hence MLflow's and Optuna's PostgreSQL engines) give up connecting after
    :func:`connect_timeout` seconds, unless ``$PGCONNECT_TIMEOUT`` is already set."""
    os.environ.setdefault("PGCONNECT_TIMEOUT", str(max(2, round(connect_timeout()))))


def check_tracking_store(uri: str) -> None:
    """Reach the MLflow tracking store ``uri`` once per process: an MLflow server (``http(s)://``) by
    :func:`check_http`, a database by :func:`check_database`; a local sqlite file needs no check.

    Raises:
        ServiceError: unreachable (one line, credentials redacted).
    """
    key = ("mlflow", uri)
    if key in _REACHED:
        return
    scheme = urlsplit(uri).scheme.lower()
    if scheme in ("http", "https"):
        check_http("the MLflow server", uri)
    elif scheme == "sqlite":
        check_sqlite_store(uri)
    else:
        check_database("the MLflow store", uri)
    _REACHED.add(key)


def check_sqlite_store(uri: str) -> None:
    """Refuse an existing sqlite tracking store that is empty (0 bytes: a truncated file, not a store)
    or not an SQLite database, reading it only (``mode=ro``), so that MLflow never migrates or writes
    over it. A missing file is fine: MLflow creates a new store there.

    Raises:
        ServiceError: one line naming the store; the file is left as it is.
    """
    import sqlite3

    from harness.infra.safety import display_path

    path = uri.removeprefix("sqlite:///").split("?", 1)[0]
    if not path or path == ":memory:" or not os.path.exists(path):
        return
    shown = f"the MLflow store {display_path(path)}"
    advice = "it was left as it is; move it away to start a new store, or point MLFLOW_TRACKING_URI elsewhere"
    if os.path.getsize(path) == 0:
        raise ServiceError(f"{shown} is empty (0 bytes), not a tracking store; {advice}")
    try:
        con = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=connect_timeout())
        try:
            con.execute("SELECT count(*) FROM sqlite_master").fetchone()
        finally:
            con.close()
    except sqlite3.DatabaseError as e:
        raise ServiceError(f"{shown} is not a usable SQLite database ({e}); {advice}") from None


def check_writable(directory: str | os.PathLike, what: str) -> None:
    """Write (and delete) a temporary file in ``directory``, or in its nearest existing ancestor when it
    does not exist yet (nothing is created), so that a read-only results directory stops a command
    before any compute, not after a pipeline stage or a run.

    Raises:
        HarnessError: not writable (or an ancestor is a file); one line naming ``what``, the path and the fix.
    """
    import tempfile
    from pathlib import Path

    from harness.infra.safety import display_path

    d = Path(directory).absolute()
    probe = d
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    try:
        if not probe.is_dir():
            raise NotADirectoryError(20, "Not a directory")
        with tempfile.TemporaryFile(dir=probe):
            pass
    except OSError as e:
        raise HarnessError(f"{what} {display_path(d)} is not writable ({e.strerror or e}); "
                           "set HARNESS_RESULTS to a writable directory") from None


def check_ray_address(address: str) -> None:
    """Reach the Ray cluster at ``address`` (``host:port`` of its GCS, or ``ray://host:port`` of a Ray
    client server) once per process; ``auto`` and ``local`` are Ray's own look-ups and not checked.

    Raises:
        ServiceError: nothing accepts a connection there within the timeout.
        HarnessError: the address has no port.
    """
    key = ("ray", address)
    if key in _REACHED or address in ("auto", "local"):
        return
    parts = urlsplit(address if "://" in address else f"gcs://{address}")
    try:
        port = parts.port
    except ValueError:
        port = None
    if not parts.hostname or port is None:
        from harness.infra.safety import redact

        raise HarnessError(f"RAY_ADDRESS / --address: expected host:port or ray://host:port, got {redact(address)!r}")
    check_tcp("the Ray cluster", address, parts.hostname, port)
    _REACHED.add(key)


def serve_redacted(argv: list[str], what: str) -> None:
    """Run a server process in the foreground with every line it prints passed through
    :func:`harness.infra.safety.redact`; a Python traceback it prints is held back and only its exception
    line kept. Ctrl-C stops the server and returns.

    Raises:
        HarnessError: the server exited with a non-zero status or printed a traceback (some servers
            exit 0 after one); one line with the exception, or the last line it printed.
    """
    import subprocess

    from harness.infra.safety import redact

    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
    last, exception, in_traceback = "", "", False
    try:
        assert proc.stdout is not None
        for raw in proc.stdout:
            line = redact(raw.rstrip("\n"))
            if line.startswith("Traceback (most recent call last)"):
                in_traceback = True
            elif in_traceback and line.strip() and not line[0].isspace():
                if not line.startswith(("During handling of the above exception", "The above exception was")):
                    exception, in_traceback = line, False
            elif not in_traceback:
                print(line, file=sys.stderr, flush=True)
                last = line.strip() or last
        rc = proc.wait()
    except KeyboardInterrupt:
        proc.terminate()
        proc.wait(timeout=30)
        return
    if rc != 0 or exception:
        raise HarnessError(f"{what} stopped (exit status {rc}): {exception or last or 'no output'}")


__all__ = ["TIMEOUT_ENV", "DEFAULT_CONNECT_TIMEOUT", "connect_timeout", "check_tcp", "check_http", "check_database",
           "bound_database_connects", "check_tracking_store", "check_sqlite_store", "check_writable", "check_ray_address", "serve_redacted"]
