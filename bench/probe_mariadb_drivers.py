"""Which Python driver for MariaDB/MySQL. Measures one engine-shaped transaction
(a locking read of a joined row, two UPDATEs, an INSERT, COMMIT) through SQLAlchemy on each
driver that is installed, against MariaDB at GENEVA_BENCH_MARIADB_URL's server.

    .venv/bin/python -m bench.probe_mariadb_drivers [--rounds 2000]

Prints per driver: microseconds per transaction (wall) and of process CPU. Needs the drivers
importable (PyMySQL comes with geneva-drive; mysqlclient and mariadb need libmariadb-dev to
build). Uses a database gd_bench_drivers that it creates and drops.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from sqlalchemy import create_engine, text

BASE = os.environ.get("GENEVA_BENCH_MARIADB_URL", "mysql+pymysql://root@127.0.0.1:3306/test")
DRIVERS = {"pymysql": "PyMySQL", "mysqldb": "mysqlclient", "mariadbconnector": "mariadb"}


def url_for(driver: str, database: str) -> str:
    rest = BASE.split("://", 1)[1].rsplit("/", 1)[0]
    return f"mysql+{driver}://{rest}/{database}"


def one_round(engine, rounds: int) -> tuple[float, float]:
    wall0, cpu0 = time.perf_counter(), time.process_time()
    with engine.connect() as c:
        for i in range(rounds):
            with c.begin():
                c.execute(
                    text(
                        "SELECT w.*, e.* FROM w JOIN e ON e.wid = w.id WHERE e.id = :id FOR UPDATE"
                    ),
                    {"id": 1},
                ).all()
                c.execute(text("UPDATE w SET state = :s, n = n + 1 WHERE id = 1"), {"s": f"s{i}"})
                c.execute(text("UPDATE e SET state = :s WHERE id = 1"), {"s": f"s{i}"})
                c.execute(text("INSERT INTO log (wid, note) VALUES (1, :n)"), {"n": f"n{i}"})
    return (
        (time.perf_counter() - wall0) / rounds * 1e6,
        (time.process_time() - cpu0) / rounds * 1e6,
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=2000)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    admin = create_engine(url_for("pymysql", "test"))
    with admin.begin() as c:
        c.execute(text("DROP DATABASE IF EXISTS gd_bench_drivers"))
        c.execute(text("CREATE DATABASE gd_bench_drivers"))
    try:
        setup = create_engine(url_for("pymysql", "gd_bench_drivers"))
        with setup.begin() as c:
            c.execute(text("CREATE TABLE w (id INT PRIMARY KEY, state VARCHAR(32), n INT)"))
            c.execute(text("CREATE TABLE e (id INT PRIMARY KEY, wid INT, state VARCHAR(32))"))
            c.execute(
                text("CREATE TABLE log (id BIGINT AUTO_INCREMENT PRIMARY KEY, wid INT, note TEXT)")
            )
            c.execute(text("INSERT INTO w VALUES (1, 'ready', 0)"))
            c.execute(text("INSERT INTO e VALUES (1, 1, 'scheduled')"))
        setup.dispose()
        for driver, package in DRIVERS.items():
            try:
                engine = create_engine(
                    url_for(driver, "gd_bench_drivers"), isolation_level="READ COMMITTED"
                )
                one_round(engine, 50)  # warm up, connect
            except Exception as error:
                print(f"{package:12s} not measured: {type(error).__name__}: {error}")
                continue
            walls, cpus = [], []
            for _ in range(args.repeat):
                wall, cpu = one_round(engine, args.rounds)
                walls.append(wall)
                cpus.append(cpu)
            engine.dispose()
            print(
                f"{package:12s} {statistics.median(walls):7.0f} µs/transaction wall, "
                f"{statistics.median(cpus):7.0f} µs CPU (median of {args.repeat} x {args.rounds})"
            )
    finally:
        with admin.begin() as c:
            c.execute(text("DROP DATABASE IF EXISTS gd_bench_drivers"))
        admin.dispose()


if __name__ == "__main__":
    main()
