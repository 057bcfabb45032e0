"""The skeptic's proof of exactly-once handlers: many jobs, several worker
processes, SIGKILLs of workers and pg_terminate_backend of their backends at
random throughout, leases short enough that some expire mid-handler; at the
end every job is completed and the application table holds exactly one row
per job, none missing, none twice.

Standalone (starts a private PostgreSQL cluster of its own; pgque must be
installed into that PostgreSQL, as ``clients/run.sh 15`` or ``make run`` do)::

    clients/python/.venv/bin/python clients/python/tests/exactly_once_soak.py \\
        --pg 15 --jobs 100000 --workers 4 --concurrency 8

Against a running server instead: ``--dsn "host=... dbname=..."`` (the
database must have the extension). Not part of the default pytest run (it is
not a ``test_*.py`` file); ``test_exactly_once_soak_small`` in
test_exactly_once.py runs ``soak()`` with 2,000 jobs on every ``make test``.

What a job does: its handler (``def handle(job, tx)``, an exactly-once
handler of the sync Worker) first records the run in ``soak_runs`` on a
connection of its own (autocommit: an effect outside the job's transaction,
which is at-least-once and shows how often handlers really ran), sometimes
sleeps past its lease, inserts ``(job_id, attempt)`` into ``soak_effects``
through ``tx`` and returns ``{"attempt": n}`` as the job's output. The
checks: every job completed; ``soak_effects`` has exactly one row per job and
no other; each job's output names the attempt whose effect row is there (the
completion and the effect come from the same attempt).

Worker processes: half of them send heartbeats (their leases expire only when
they are killed or their control backend is), half send none (a slow handler
outlives its lease, the server's rescue hands the job to another worker and
the slow one's completion is refused). With ``--mode mixed`` (the default)
they alternate between the sync ``pgque_client.Worker`` (threads, ``def
handle(job, tx)``) and ``pgque_client.aio.Worker`` (tasks, ``async def
handle(job, tx)``): of 4 workers, 0 sync with heartbeats, 1 aio without, 2
aio with, 3 sync without.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psycopg

APP = "pgque-soak"


# ---- the worker process --------------------------------------------------------


def worker_main(dsn: str, queue: str, stats_path: str, concurrency: int, lease: float, heartbeats: bool,
                slow_p: float, work_ms: float) -> None:  # fmt: skip
    """One worker process: a sync Worker with an exactly-once handler; its
    counters go to ``stats_path`` every 0.5 s (a SIGKILL loses the last ones)."""
    import pgque_client as pq

    local = threading.local()
    rnd = random.Random(os.getpid())
    w = pq.Worker(
        dsn, [queue], concurrency=concurrency, lease=lease,
        heartbeat_interval=lease / 3 if heartbeats else 3600.0,
        poll_interval=0.5, shutdown_timeout=5.0, connect_kwargs={"application_name": APP},
    )  # fmt: skip

    @w.handler("soak")
    def handle(job: pq.Job, tx: psycopg.Connection[Any]) -> Any:
        side = getattr(local, "side", None)
        if side is None or side.closed:
            side = local.side = psycopg.connect(dsn, autocommit=True, application_name=APP)
        side.execute(
            "INSERT INTO soak_runs (job_id, attempt, pid) VALUES (%s, %s, %s)", (job.id, job.attempt, os.getpid())
        )
        if rnd.random() < slow_p:
            time.sleep(lease * 2)  # past the lease: without heartbeats the rescue takes the job
        elif work_ms:
            time.sleep(rnd.uniform(0, 2 * work_ms) / 1000)
        tx.execute("INSERT INTO soak_effects (job_id, attempt) VALUES (%s, %s)", (job.id, job.attempt))
        return {"attempt": job.attempt}

    def report() -> None:
        while True:
            tmp = stats_path + ".tmp"
            with open(tmp, "w") as f:
                json.dump({"completed": w.completed, "failed": w.failed, "lost": w.lost}, f)
            os.replace(tmp, stats_path)
            time.sleep(0.5)

    threading.Thread(target=report, daemon=True).start()
    print("ready", flush=True)
    w.run()
    with open(stats_path, "w") as f:
        json.dump({"completed": w.completed, "failed": w.failed, "lost": w.lost}, f)


def aio_worker_main(dsn: str, queue: str, stats_path: str, concurrency: int, lease: float, heartbeats: bool,
                    slow_p: float, work_ms: float) -> None:  # fmt: skip
    """The same worker on ``pgque_client.aio.Worker`` with an
    ``async def handle(job, tx)`` handler."""
    import asyncio

    from pgque_client import aio

    rnd = random.Random(os.getpid())

    async def main() -> None:
        w = aio.Worker(
            dsn, [queue], concurrency=concurrency, lease=lease,
            heartbeat_interval=lease / 3 if heartbeats else 3600.0,
            poll_interval=0.5, shutdown_timeout=5.0, connect_kwargs={"application_name": APP},
        )  # fmt: skip
        side: list[psycopg.AsyncConnection[Any]] = []

        @w.handler("soak")
        async def handle(job: aio.Job, tx: psycopg.AsyncConnection[Any]) -> Any:
            if not side or side[0].closed:
                side[:] = [await psycopg.AsyncConnection.connect(dsn, autocommit=True, application_name=APP)]
            await side[0].execute(
                "INSERT INTO soak_runs (job_id, attempt, pid) VALUES (%s, %s, %s)", (job.id, job.attempt, os.getpid())
            )
            if rnd.random() < slow_p:
                await asyncio.sleep(lease * 2)  # past the lease: without heartbeats the rescue takes the job
            elif work_ms:
                await asyncio.sleep(rnd.uniform(0, 2 * work_ms) / 1000)
            await tx.execute("INSERT INTO soak_effects (job_id, attempt) VALUES (%s, %s)", (job.id, job.attempt))
            return {"attempt": job.attempt}

        def write() -> None:
            tmp = stats_path + ".tmp"
            with open(tmp, "w") as f:
                json.dump({"completed": w.completed, "failed": w.failed, "lost": w.lost}, f)
            os.replace(tmp, stats_path)

        async def report() -> None:
            while True:
                write()
                await asyncio.sleep(0.5)

        reporter = asyncio.create_task(report())
        print("ready", flush=True)
        await w.run()
        reporter.cancel()
        write()

    asyncio.run(main())


# ---- the soak -----------------------------------------------------------------------


@dataclass
class Result:
    """The figures of one soak run."""

    jobs: int
    workers: int
    concurrency: int
    lease_s: float
    mode: str
    seconds: float = 0.0
    worker_sigkills: int = 0
    backends_terminated: int = 0
    states: dict[str, int] = field(default_factory=dict)
    effect_rows: int = 0
    jobs_with_effect: int = 0
    missing: int = 0
    duplicated: int = 0
    foreign: int = 0
    output_attempt_mismatch: int = 0
    handler_runs: int = 0
    jobs_run_more_than_once: int = 0
    jobs_completed_after_attempt_1: int = 0
    max_attempt: int = 0
    refused_completions_reported: int = 0
    failures_reported: int = 0

    def ok(self) -> bool:
        """Every job completed, exactly one effect row per job, none other."""
        return (
            self.states == {"completed": self.jobs}
            and self.effect_rows == self.jobs
            and self.jobs_with_effect == self.jobs
            and self.missing == 0
            and self.duplicated == 0
            and self.foreign == 0
            and self.output_attempt_mismatch == 0
        )


def _log(msg: str) -> None:
    print(f"[soak {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def prepare(conn: psycopg.Connection[Any], queue: str, jobs: int) -> list[int]:
    """Creates the queue and the application tables, enqueues the jobs."""
    import pgque_client as pq

    conn.execute("DROP TABLE IF EXISTS soak_effects, soak_runs")
    conn.execute("CREATE TABLE soak_effects (job_id bigint NOT NULL, attempt int NOT NULL)")
    conn.execute("CREATE TABLE soak_runs (job_id bigint NOT NULL, attempt int NOT NULL, pid int NOT NULL)")
    conn.execute("SELECT pgque.create_job_queue(%s)", (queue,))
    # Every job must end completed: far more attempts than kills can use.
    conn.execute("SELECT pgque.set_job_queue_config(%s, 'max_attempts', '1000')", (queue,))
    ids: list[int] = []
    for start in range(0, jobs, 1000):
        chunk = [("soak", {"n": i}) for i in range(start, min(jobs, start + 1000))]
        ids += [e.job_id for e in pq.enqueue_many(conn, queue, chunk)]  # type: ignore[misc]
    return ids


def soak(dsn: str, jobs: int = 2000, workers: int = 3, concurrency: int = 4, lease: float = 2.0,
         chaos_every: float = 2.0, slow_p: float = 0.002, work_ms: float = 2.0,
         timeout: float = 1800.0, queue: str | None = None, mode: str = "mixed") -> Result:  # fmt: skip
    """Runs the soak against ``dsn`` and returns its figures (check ``ok()``).
    ``mode``: the workers' kind, ``sync`` (pgque_client.Worker), ``aio``
    (pgque_client.aio.Worker) or ``mixed`` (both, alternately)."""
    if mode not in ("sync", "aio", "mixed"):
        raise ValueError(f"mode must be sync, aio or mixed, not {mode!r}")
    queue = queue or f"soak_{os.getpid()}_{int(time.time())}"
    res = Result(jobs, workers, concurrency, lease, mode)
    statdir = Path(f"/tmp/pgque_soak_stats_{os.getpid()}")
    shutil.rmtree(statdir, ignore_errors=True)
    statdir.mkdir()
    logdir = Path(f"/tmp/pgque_soak_logs_{os.getpid()}")  # the workers' stderr, kept
    logdir.mkdir(exist_ok=True)
    rnd = random.Random()
    with psycopg.connect(dsn, autocommit=True) as conn:
        _log(f"enqueueing {jobs} jobs into {queue}")
        ids = prepare(conn, queue, jobs)
        procs: dict[int, subprocess.Popen[str]] = {}
        seq = [0]

        def start(slot: int) -> None:
            seq[0] += 1
            cmd = [
                sys.executable, os.path.abspath(__file__), "worker", dsn, queue,
                str(statdir / f"w{seq[0]}.json"), str(concurrency), str(lease),
                "1" if slot % 2 == 0 else "0", str(slow_p), str(work_ms),
                "aio" if mode == "aio" or (mode == "mixed" and slot % 4 in (1, 2)) else "sync",
            ]  # fmt: skip
            with open(logdir / f"w{seq[0]}.log", "w") as err:
                p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True)
            assert p.stdout is not None and p.stdout.readline().strip() == "ready", "a worker did not start"
            procs[slot] = p

        def done() -> int:
            # job_queue_status counts the log by its rows (cheap); all_jobs
            # unpacks every job and is only for the final check.
            return conn.execute(
                "SELECT completed::int FROM pgque.job_queue_status WHERE queue_name = %s", (queue,)
            ).fetchone()[0]  # type: ignore[index]

        t0 = time.monotonic()
        try:
            for i in range(workers):
                start(i)
            _log(f"{workers} {mode} workers x {concurrency} handlers, lease {lease} s, chaos every ~{chaos_every} s")
            next_chaos = time.monotonic() + rnd.uniform(0.5, 1.5) * chaos_every
            last_report = 0.0
            chaos = rnd.randrange(2)
            while True:
                n = done()
                if n >= jobs:
                    break
                now = time.monotonic()
                if now - t0 > timeout:
                    raise AssertionError(f"soak timed out after {timeout} s with {n}/{jobs} completed")
                if now - last_report > 10:
                    _log(f"{n}/{jobs} completed; kills {res.worker_sigkills}, terminated {res.backends_terminated}")
                    last_report = now
                if now >= next_chaos:
                    chaos += 1
                    if chaos % 2 == 0:  # alternately: a worker SIGKILLed, 1-3 backends terminated
                        slot = rnd.randrange(workers)
                        procs[slot].send_signal(signal.SIGKILL)
                        procs[slot].wait()
                        res.worker_sigkills += 1
                        start(slot)
                    else:
                        pids = [r[0] for r in conn.execute(
                            "SELECT pid FROM pg_stat_activity WHERE application_name = %s AND pid <> pg_backend_pid()",
                            (APP,),
                        ).fetchall()]  # fmt: skip
                        for pid in rnd.sample(pids, min(len(pids), rnd.randint(1, 3))):
                            row = conn.execute("SELECT pg_terminate_backend(%s)", (pid,)).fetchone()
                            if row and row[0]:
                                res.backends_terminated += 1
                    next_chaos = now + rnd.uniform(0.5, 1.5) * chaos_every
                time.sleep(0.2)
        except BaseException:
            for p in procs.values():  # no worker outlives a failed soak
                p.kill()
                p.wait()
            raise
        res.seconds = round(time.monotonic() - t0, 1)
        _log(f"all {jobs} completed in {res.seconds} s; stopping the workers (their stderr: {logdir})")
        for p in procs.values():
            p.send_signal(signal.SIGTERM)
        for p in procs.values():
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        for f in statdir.glob("w*.json"):
            try:
                s = json.loads(f.read_text())
            except ValueError:
                continue
            res.refused_completions_reported += s["lost"]
            res.failures_reported += s["failed"]
        shutil.rmtree(statdir, ignore_errors=True)
        verify(conn, queue, ids, res)
    return res


def verify(conn: psycopg.Connection[Any], queue: str, ids: list[int], res: Result) -> None:
    """Fills in the checks' figures from the database."""
    res.states = dict(conn.execute(
        "SELECT state, count(*)::int FROM pgque.all_jobs WHERE queue = %s GROUP BY state", (queue,)
    ).fetchall())  # fmt: skip
    q = """
    WITH want AS (SELECT unnest(%s::bigint[]) AS job_id),
         fx AS (SELECT job_id, count(*) AS n FROM soak_effects GROUP BY job_id)
    SELECT (SELECT count(*) FROM soak_effects)::int,
           (SELECT count(*) FROM fx)::int,
           (SELECT count(*) FROM want w WHERE NOT EXISTS (SELECT 1 FROM fx WHERE fx.job_id = w.job_id))::int,
           (SELECT count(*) FROM fx WHERE n > 1)::int,
           (SELECT count(*) FROM fx WHERE NOT EXISTS (SELECT 1 FROM want w WHERE w.job_id = fx.job_id))::int,
           (SELECT count(*) FROM soak_runs)::int,
           (SELECT count(*) FROM (SELECT job_id FROM soak_runs GROUP BY job_id HAVING count(*) > 1) r)::int
    """
    row = conn.execute(q, (ids,)).fetchone()
    assert row is not None
    (res.effect_rows, res.jobs_with_effect, res.missing, res.duplicated, res.foreign,
     res.handler_runs, res.jobs_run_more_than_once) = row  # fmt: skip
    row = conn.execute(
        """SELECT count(*) FILTER (WHERE j.attempt > 1)::int, coalesce(max(j.attempt), 0)::int,
                  count(*) FILTER (WHERE (j.output->>'attempt')::int IS DISTINCT FROM e.attempt)::int
           FROM pgque.all_jobs j LEFT JOIN soak_effects e ON e.job_id = j.id
           WHERE j.queue = %s""",
        (queue,),
    ).fetchone()
    assert row is not None
    res.jobs_completed_after_attempt_1, res.max_attempt, res.output_attempt_mismatch = row


# ---- a private cluster ---------------------------------------------------------------


class Cluster:
    """A throw-away PostgreSQL cluster with pgque preloaded, as clients/run.sh
    starts one (initdb, trust auth, a Unix socket only; run as the postgres OS
    user when we are root)."""

    def __init__(self, ver: int):
        cfg = Path(os.environ.get("PGRX_HOME", Path.home() / ".pgrx")) / "config.toml"
        m = re.search(rf'^pg{ver} = "(.*)"$', cfg.read_text(), re.M)
        if not m:
            raise SystemExit(f"no pg{ver} in {cfg}: run scripts/setup.sh")
        pg_config = m.group(1)
        self.bindir = subprocess.check_output([pg_config, "--bindir"], text=True).strip()
        share = subprocess.check_output([pg_config, "--sharedir"], text=True).strip()
        if not Path(share, "extension", "pgque.control").exists():
            raise SystemExit(f"pgque is not installed into PostgreSQL {ver}: run clients/run.sh {ver} first")
        self.data = Path(f"/tmp/pgque_soak_{ver}")
        self.port = 54300 + ver

    def _as_pg(self, *cmd: str) -> None:
        full = list(cmd) if os.getuid() != 0 else ["runuser", "-u", "postgres", "--", *cmd]
        subprocess.run(full, check=True, stdout=subprocess.DEVNULL)

    def start(self) -> str:
        """initdb + start; returns the dsn of a database with pgque."""
        if (self.data / "postmaster.pid").exists():
            subprocess.run(
                [*(["runuser", "-u", "postgres", "--"] if os.getuid() == 0 else []),
                 f"{self.bindir}/pg_ctl", "-D", str(self.data), "-m", "immediate", "stop"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )  # fmt: skip
        shutil.rmtree(self.data, ignore_errors=True)
        self.data.mkdir()
        if os.getuid() == 0:
            shutil.chown(self.data, "postgres")
        self._as_pg(f"{self.bindir}/initdb", "-D", str(self.data), "-A", "trust", "-U", "postgres", "--no-sync")
        with open(self.data / "postgresql.conf", "a") as f:
            f.write(
                f"port = {self.port}\nlisten_addresses = ''\nunix_socket_directories = '{self.data}'\n"
                "shared_preload_libraries = 'pgque'\nmax_worker_processes = 32\nmax_connections = 300\n"
                "fsync = off\nfull_page_writes = off\nlog_line_prefix = '%m [%p] %b %d '\n"
                "pgque.job_maint_period_ms = 200\n"
            )
        self._as_pg(f"{self.bindir}/pg_ctl", "-D", str(self.data), "-l", str(self.data / "server.log"), "-w", "start")
        base = f"host={self.data} port={self.port} user=postgres"
        with psycopg.connect(base + " dbname=postgres", autocommit=True) as c:
            c.execute("CREATE DATABASE soak")
        dsn = base + " dbname=soak"
        with psycopg.connect(dsn, autocommit=True) as c:
            c.execute("CREATE EXTENSION pgque")
        return dsn

    def stop(self) -> None:
        """Stops the cluster (its data directory stays for a look at server.log)."""
        subprocess.run(
            [*(["runuser", "-u", "postgres", "--"] if os.getuid() == 0 else []),
             f"{self.bindir}/pg_ctl", "-D", str(self.data), "-m", "fast", "stop"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip


def main() -> int:
    """The command line: see the module docstring."""
    if len(sys.argv) > 1 and sys.argv[1] == "worker":
        a = sys.argv[2:]
        run = aio_worker_main if a[8] == "aio" else worker_main
        run(a[0], a[1], a[2], int(a[3]), float(a[4]), a[5] == "1", float(a[6]), float(a[7]))
        return 0
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pg", type=int, default=15, help="PostgreSQL major of the private cluster (default 15)")
    ap.add_argument("--dsn", help="use this server's database instead of a private cluster")
    ap.add_argument("--jobs", type=int, default=100_000)
    ap.add_argument("--workers", type=int, default=4, help="worker processes")
    ap.add_argument("--concurrency", type=int, default=8, help="handler threads per worker")
    ap.add_argument("--lease", type=float, default=2.0, help="lease seconds")
    ap.add_argument("--chaos-every", type=float, default=2.0, help="mean seconds between kills")
    ap.add_argument("--slow", type=float, default=0.002, help="share of handler runs that sleep 2 leases")
    ap.add_argument("--work-ms", type=float, default=2.0, help="mean handler sleep in ms")
    ap.add_argument("--mode", choices=("sync", "aio", "mixed"), default="mixed",
                    help="worker kind: sync Worker, aio.Worker, or both alternately (default)")  # fmt: skip
    ap.add_argument("--json", help="also write the figures to this file")
    args = ap.parse_args()
    cluster = None
    dsn = args.dsn
    if dsn is None:
        cluster = Cluster(args.pg)
        dsn = cluster.start()
        _log(f"private PostgreSQL {args.pg} in {cluster.data} (port {cluster.port})")
    try:
        res = soak(dsn, args.jobs, args.workers, args.concurrency, args.lease, args.chaos_every, args.slow,
                   args.work_ms, mode=args.mode)  # fmt: skip
    finally:
        if cluster is not None:
            cluster.stop()
    figures = asdict(res)
    print(json.dumps(figures, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2) + "\n")
    print("OK: every job completed, exactly one effect row per job" if res.ok() else "FAILED", flush=True)
    return 0 if res.ok() else 1


if __name__ == "__main__":
    sys.exit(main())
