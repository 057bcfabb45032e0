"""Run pgbench with a custom script and parse what it processed.

pgbench is used where a workload is "N clients each running one statement per
transaction as fast as they can" (sends, batch sends, enqueues). The database is
its LAST argument (its -d is --debug).
"""
import os
import re
import subprocess
import tempfile

from . import db

PGBENCH = os.environ.get("BENCH_PGBENCH", "/usr/lib/postgresql/15/bin/pgbench")


class PgbenchError(RuntimeError):
    pass


def run(script, clients, seconds, variables=None, mode="prepared"):
    """Returns (transactions processed, tps without connection time, failed count)."""
    with tempfile.NamedTemporaryFile("w", suffix=".sql", delete=False) as f:
        f.write(script)
        path = f.name
    try:
        cmd = [PGBENCH, "-n", "-M", mode, "-c", str(clients), "-j", str(clients),
               "-T", str(seconds), "-f", path, "-h", db.HOST, "-p", str(db.PORT), "-U", db.USER]
        for k, v in (variables or {}).items():
            cmd += ["-D", f"{k}={v}"]
        cmd.append(db.DB)
        p = subprocess.run(cmd, capture_output=True, text=True)
        out = p.stdout + p.stderr
        m_tx = re.search(r"number of transactions actually processed: (\d+)", out)
        m_tps = re.search(r"tps = ([\d.]+) \(without initial connection time\)", out)
        m_fail = re.search(r"number of failed transactions: (\d+)", out)
        if p.returncode != 0 or not m_tx or not m_tps:
            raise PgbenchError(f"pgbench failed (rc {p.returncode}): {out.strip()[-1500:]}")
        return int(m_tx.group(1)), float(m_tps.group(1)), int(m_fail.group(1)) if m_fail else 0
    finally:
        os.unlink(path)
