"""Worker kills for the seed's-profile cells (w12, w13; issue 34's proofs).

Two kinds, at random times of a cell, each landing inside a worker's ack
transaction, alternately after the batch's effects were written and after
ack_partitioned ran, before the commit: the killer arms a worker, which holds
0.3 s at that point of its next batch (the windows between statements are far
shorter than a kill takes to arrive on a loaded machine), and kills it there:

  sigkill    the worker process is killed with SIGKILL (its backend sees the
             socket close and rolls back the transaction) and a new process is
             started in its place, alternately under the same worker name and
             under a new one: either way the killed worker's lease must lapse
             and be taken over, and its open batch redelivered;
  terminate  pg_terminate_backend of the worker's backend; the worker
             reconnects under its name and goes on.

A kill counts as mid-batch when the batch the worker had in hand was received
again after it (bench_pk_recv): it was not acked, and was redelivered.

Workers publish their state in shared arrays without locks (a process killed
while holding a multiprocessing lock would leave it locked for every other):
their backend's pid, the slot they hold, the batch in hand and where they are
in it.
"""
import os
import queue
import random
import signal
import threading
import time

from . import db

IDLE, CLAIMED, IN_BATCH, IN_ACK = 0, 1, 2, 3
# where an armed worker holds inside its ack transaction
HOLD_AFTER_EFFECTS, HOLD_AFTER_ACK = 1, 2
HOLD_S = 0.3


class Ctl:
    """What each worker process shares with the killer, by worker index."""

    def __init__(self, mp, m):
        self.pid = mp.RawArray("q", m)  # the worker's backend pid
        self.state = mp.RawArray("i", m)  # IDLE / CLAIMED / IN_BATCH / IN_ACK (holding, armed)
        self.slot = mp.RawArray("i", m)  # the slot claimed (valid unless IDLE)
        self.reconnects = mp.RawArray("i", m)
        self.batch = mp.RawArray("q", m)  # the batch in hand (valid when IN_BATCH / IN_ACK)
        self.arm = mp.RawArray("i", m)  # HOLD_* : hold in the next ack transaction

    def set(self, idx, state, slot=-1):
        self.slot[idx] = slot
        self.state[idx] = state


class Killer:
    """Runs the kills of one cell in a thread (start(), then stop() before the
    workers are told to stop). procs[i + 1] is worker i's process (procs[0] the
    producer); spawn(idx, name) starts a replacement worker and returns it.
    now(kind) asks for one kill at once (the abort cell's resizer uses it to
    hold an old slot undrained). Each kill is logged in .log as a dict:
    kind, at, idx, worker, slot (None when the worker held none), mid_batch."""

    def __init__(self, procs, spawn, ctl, candidates, per_kind, secs, t0, seed):
        self.procs, self.spawn, self.ctl = procs, spawn, ctl
        self.candidates = candidates
        rnd = random.Random(seed * 7919 + 17)
        self.rnd = rnd
        # a few of each kind, at random times inside the sending window
        plan = [(rnd.uniform(0.1, 0.9) * secs, "sigkill") for _ in range(per_kind)]
        plan += [(rnd.uniform(0.1, 0.9) * secs, "terminate") for _ in range(per_kind)]
        self.plan = sorted(plan)
        self.t0 = t0
        self.names = {i: f"w{i}" for i in candidates}
        self.sigkills = 0
        self.terminates = 0
        self.log = []
        self.errors = []
        self._now = queue.Queue()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self):
        self._thread.start()

    def stop(self):
        self._stop.set()
        self._thread.join(timeout=30)

    def now(self, kind):
        self._now.put(kind)

    def _run(self):
        conn = db.connect()
        try:
            plan = list(self.plan)
            while not self._stop.is_set():
                try:
                    kind = self._now.get(timeout=0.02)
                except queue.Empty:
                    kind = None
                if kind is None and plan and time.time() >= self.t0 + plan[0][0]:
                    kind = plan.pop(0)[1]
                if kind:
                    self._kill(conn, kind)
        except Exception as e:  # reported by the cell, which then fails
            self.errors.append(repr(e))
        conn.close()

    def _kill(self, conn, kind):
        idx = self.rnd.choice(self.candidates)
        self.terminates += kind == "terminate"
        nth = self.terminates if kind == "terminate" else self.sigkills + 1
        point = HOLD_AFTER_EFFECTS if nth % 2 else HOLD_AFTER_ACK
        self.ctl.arm[idx] = point
        deadline = time.time() + 3.0
        while self.ctl.state[idx] != IN_ACK and time.time() < deadline and not self._stop.is_set():
            time.sleep(0.0005)
        self.ctl.arm[idx] = 0
        state, slot = self.ctl.state[idx], self.ctl.slot[idx]
        at = time.time()
        entry = {"kind": kind, "at": at, "idx": idx, "worker": self.names[idx],
                 "slot": slot if state != IDLE else None,
                 "batch": self.ctl.batch[idx] if state in (IN_BATCH, IN_ACK) else None}
        entry["point"] = ("after effects" if point == HOLD_AFTER_EFFECTS else "after ack") if state == IN_ACK else "missed"
        if kind == "terminate":
            db.scalar(conn, "SELECT pg_terminate_backend(%s)", (self.ctl.pid[idx],))
        else:
            p = self.procs[idx + 1]
            os.kill(p.pid, signal.SIGKILL)
            p.join(timeout=10)
            self.ctl.set(idx, IDLE)
            self.sigkills += 1
            # alternately the same name (its own stale lease is not handed back
            # to it by claim_next_slot: it lapses) and a new one
            name = f"w{idx}" if self.sigkills % 2 == 0 else f"w{idx}k{self.sigkills}"
            self.names[idx] = name
            self.procs[idx + 1] = self.spawn(idx, name)
            entry["restarted_as"] = name
        self.log.append(entry)


def summary(kills, acked):
    """Per-kind counts and the time until each killed worker's slot was served
    again (the first ack of that slot, by any worker, after the kill).
    acked: (tenant, seq, bid, pos, slot, lag, at) tuples."""
    out = {}
    for kind in ("sigkill", "terminate"):
        ks = [k for k in kills if k["kind"] == kind]
        served = []
        for k in ks:
            if k["slot"] is None:
                continue
            after = [at for *_, slot, _lag, at in acked if slot == k["slot"] and at > k["at"]]
            if after:
                served.append(min(after) - k["at"])
        out[kind] = {"n": len(ks), "mid_batch": sum(1 for k in ks if k.get("mid_batch")), "served": served,
                     "after_ack": sum(1 for k in ks if k.get("mid_batch") and k.get("point") == "after ack")}
    return out
