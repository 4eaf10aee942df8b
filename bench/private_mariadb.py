"""A private MariaDB server for the growth run at 1M: own data directory and port,
listening on 127.0.0.1, stopped by its own PID; the shared server on 3306 is left alone.

The shared server has a 128 MB buffer pool with ``O_DIRECT`` (no OS page cache under it): a
database of 1M workflows (about 5 GB) would be measured reading its disk, where a deployment
sizes the pool for its working set (PostgreSQL's runs have the OS page cache). This one gets
``--buffer-pool`` (default 4G); everything else is MariaDB's default.

    .venv/bin/python -m bench.private_mariadb start --dir /tmp/gd-mariadb --port 3407
    .venv/bin/python -m bench.engine_growth --server mysql+pymysql://root@127.0.0.1:3407 ...
    .venv/bin/python -m bench.private_mariadb stop --dir /tmp/gd-mariadb
"""

from __future__ import annotations

import argparse
import getpass
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path


def _ready(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


def start(directory: Path, port: int, buffer_pool: str) -> None:
    data = directory / "data"
    if not data.exists():
        data.mkdir(parents=True)
        subprocess.run(
            [
                shutil.which("mariadb-install-db") or "mariadb-install-db",
                "--no-defaults",
                f"--datadir={data}",
                f"--user={getpass.getuser()}",
                "--auth-root-authentication-method=normal",
                "--skip-test-db",
            ],
            check=True,
            capture_output=True,
        )
    log = open(directory / "mariadb.log", "ab")  # noqa: SIM115 - the server's own log
    subprocess.Popen(
        [
            shutil.which("mariadbd") or "/usr/sbin/mariadbd",
            "--no-defaults",
            f"--datadir={data}",
            f"--port={port}",
            f"--socket={directory / 'mariadb.sock'}",
            "--bind-address=127.0.0.1",
            f"--user={getpass.getuser()}",
            "--skip-log-bin",
            "--skip-name-resolve",
            f"--innodb-buffer-pool-size={buffer_pool}",
            "--innodb-log-file-size=1G",
            f"--pid-file={directory / 'mariadb.pid'}",
        ],
        stdout=log,
        stderr=log,
        start_new_session=True,
    )
    deadline = time.monotonic() + 60
    while not _ready(port):
        if time.monotonic() > deadline:
            raise SystemExit(f"MariaDB did not listen on 127.0.0.1:{port}: see {log.name}")
        time.sleep(0.5)
    print(f"MariaDB on 127.0.0.1:{port}, data in {data}")


def stop(directory: Path) -> None:
    pid_file = directory / "mariadb.pid"
    if not pid_file.exists():
        raise SystemExit(f"no {pid_file}: not running")
    pid = int(pid_file.read_text())
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 120
    while pid_file.exists() and time.monotonic() < deadline:
        time.sleep(0.5)
    print(f"stopped MariaDB (pid {pid})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("action", choices=["start", "stop"])
    parser.add_argument("--dir", type=Path, default=Path("/tmp/gd-mariadb"))
    parser.add_argument("--port", type=int, default=3407)
    parser.add_argument("--buffer-pool", default="4G")
    args = parser.parse_args()
    if args.action == "start":
        args.dir.mkdir(parents=True, exist_ok=True)
        start(args.dir, args.port, args.buffer_pool)
    else:
        stop(args.dir)


if __name__ == "__main__":
    main()
