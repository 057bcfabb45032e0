#!/usr/bin/python3
"""The dashboard tier: pgque-web against a real PostgreSQL with pgque, pages
in a real headless Chromium driven over WebDriver.

Run through web/tests/run.sh (it starts the server and sets WEBTEST_*).
Uses Debian's python3-psycopg2 and python3-prometheus-client, and a
WebDriver client of its own below (the protocol is a few JSON calls).
"""
import base64
import copy
import http.client
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import traceback
import urllib.error
import urllib.parse
import urllib.request

import psycopg2
from prometheus_client.parser import text_string_to_metric_families

HOST = os.environ["WEBTEST_PGHOST"]
BINDIR = os.environ.get("WEBTEST_PGBINDIR", "")
PORT = os.environ["WEBTEST_PGPORT"]
BIN = os.environ["WEBTEST_BIN"]
ROOT = os.environ["WEBTEST_ROOT"]
DB = "webtest"
SECRET = "s3cr3t-Pw-never-shown"
# The dashboard's logins: an auth file for the admin dashboard (an admin
# and a read credential), the environment for the reader's.
ADMIN_TOKEN = "adm-" + os.urandom(16).hex()
READ_TOKEN = "read-" + os.urandom(16).hex()
ENV_READ_TOKEN = "env-read-" + os.urandom(16).hex()
SHOTS = os.path.join(ROOT, "docs", "screenshots")
PAGES = ["/", "/events", "/jobs", "/schedules", "/worker"]

# Figures that stay put once the fixture is in place (the worker's idle
# ticks move ages and rates, not these counts).
STABLE = {
    "pgque_event_queue_pending_events", "pgque_event_queue_unticked_events",
    "pgque_event_queue_consumers", "pgque_event_queue_ticker_paused", "pgque_dead_letters",
    "pgque_consumer_pending_events", "pgque_consumer_batch_open",
    "pgque_partition_slot_pending_events", "pgque_partition_slot_leased",
    "pgque_jobs", "pgque_job_queue_paused", "pgque_preloaded", "pgque_worker_enabled",
    "pgque_worker_up", "pgque_worker_start_time_seconds",
}


def connect(user="postgres"):
    c = psycopg2.connect(host=HOST, port=PORT, user=user, dbname=DB)
    c.autocommit = True
    return c


def q(c, sql, args=None):
    with c.cursor() as cur:
        cur.execute(sql, args)
        return cur.fetchall() if cur.description else None


def one(c, sql, args=None):
    return q(c, sql, args)[0][0]


def wait_for(what, f, timeout=20.0):
    end = time.time() + timeout
    while True:
        v = f()
        if v:
            return v
        if time.time() > end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


# ---- fixture -------------------------------------------------------------------
def make_database():
    a = psycopg2.connect(host=HOST, port=PORT, user="postgres", dbname="postgres")
    a.autocommit = True
    q(a, f"DROP DATABASE IF EXISTS {DB} WITH (FORCE)")
    q(a, f"CREATE DATABASE {DB}")
    a.close()
    c = connect()
    q(c, "CREATE EXTENSION pgque")
    for role, grant in (("web_admin", "pgque_admin"), ("web_reader", "pgque_reader")):
        q(c, f"DROP ROLE IF EXISTS {role}")
        q(c, f"CREATE ROLE {role} LOGIN PASSWORD %s IN ROLE {grant}", (SECRET,))
    # Event queues: orders (two consumers, one caught up), mail (dead
    # letters), clicks (a partitioned consumer with 4 slots).
    q(c, "SELECT pgque.create_queue('orders')")
    q(c, "SELECT pgque.subscribe('orders', 'billing')")
    q(c, "SELECT pgque.subscribe('orders', 'audit')")
    q(c, "SELECT pgque.create_queue('mail')")
    q(c, "SELECT pgque.set_queue_config('mail', 'max_retries', '0')")
    q(c, "SELECT pgque.subscribe('mail', 'sender')")
    q(c, "SELECT pgque.create_queue('clicks')")
    q(c, "SELECT pgque.subscribe_partitioned('clicks', 'agg', 4)")
    q(c, "SELECT pgque.send_batch('orders', 'order', array_agg(g::text)) FROM generate_series(1, 10) g")
    q(c, "SELECT pgque.send_batch('mail', 'mail', ARRAY['a', 'b', 'c'])")
    q(c, "SELECT pgque.send('clicks', 'click', 'c' || g, 'user' || (g % 7)) FROM generate_series(1, 20) g")
    wait_for("the worker's ticks", lambda: one(
        c, "SELECT coalesce(sum(ev_new), 1) = 0 FROM pgque.get_queue_info()"))
    rows = q(c, "SELECT batch_id FROM pgque.receive('orders', 'billing', 100)")
    assert len(rows) == 10, rows
    q(c, "SELECT pgque.ack(%s)", (rows[0][0],))
    rows = q(c, "SELECT pgque.nack(m.batch_id, m, '0 seconds', 'smtp down'), m.batch_id "
                "FROM pgque.receive('mail', 'sender', 100) m")
    assert len(rows) == 3, rows
    q(c, "SELECT pgque.ack(%s)", (rows[0][1],))
    # Job queues: emails with every state, reports empty.
    q(c, "SELECT pgque.create_job_queue('emails')")
    q(c, "SELECT pgque.create_job_queue('reports')")
    q(c, "SELECT pgque.enqueue('emails', 'send', jsonb_build_object('n', g), max_attempts => 1) "
         "FROM generate_series(1, 7) g")
    q(c, "SELECT pgque.enqueue('emails', 'send', '{}', run_at => now() + interval '1 hour')")
    if one(c, "SELECT to_regproc('pgque.run_schedules') IS NOT NULL"):
        q(c, "SELECT pgque.create_schedule('nightly-report', '0 3 * * *', 'reports', 'report')")
    got = q(c, "SELECT job_id, lease_token FROM pgque.dispatch(ARRAY['emails'], 3, 'w1', '10 minutes')")
    assert len(got) == 3, got
    q(c, "SELECT pgque.complete(%s, %s)", got[0])
    q(c, "SELECT pgque.fail(%s, %s, 'mailbox full')", got[1])
    c.close()
    return got[1][0]  # the failed job


def metrics_rows(c):
    return {(n, json.dumps(l, sort_keys=True)): v for n, l, v in q(c, "SELECT name, labels, value FROM pgque.metrics()")}


# ---- pgque-web ----------------------------------------------------------------------
class Web:
    """A pgque-web process, and an HTTP client of it with a cookie of its own
    (None until login())."""

    def __init__(self, role, *extra, env=None, wait=True, listen="127.0.0.1", pghost=None, pgport=None,
                 db=DB):
        self.port = free_port()
        url = (f"postgres://{role}:{urllib.parse.quote(SECRET)}@/{db}"
               f"?host={urllib.parse.quote(pghost or HOST)}&port={pgport or PORT}")
        self.log = tempfile.NamedTemporaryFile("w+", prefix=f"pgque_web_{role}_", suffix=".log")
        penv = {k: v for k, v in os.environ.items() if not k.startswith("PGQUE_WEB_")}
        penv.update(env or {})
        self.proc = subprocess.Popen(
            [BIN, "--database-url", url, "--listen", f"{listen}:{self.port}",
             "--refresh-ms", "500", "--sample-ms", "300", *extra],
            stdout=self.log, stderr=subprocess.STDOUT, env=penv)
        self.base = f"http://127.0.0.1:{self.port}"
        self.cookie = None
        if wait:
            wait_for(f"pgque-web as {role}", lambda: self.up())

    def up(self):
        if self.proc.poll() is not None:
            raise AssertionError(f"pgque-web exited: {self.logtext()}")
        try:
            return self.get("/healthz")[0] == 200
        except OSError:
            return False

    def request(self, method, path, data=None, headers=None, cookie=True):
        """(status, body, headers lower-cased); redirects are not followed."""
        h = dict(headers or {})
        if cookie and self.cookie and "Cookie" not in h:
            h["Cookie"] = self.cookie
        req = urllib.request.Request(self.base + path, data=data, method=method, headers=h)

        class NoRedirect(urllib.request.HTTPRedirectHandler):
            def redirect_request(self, *a, **k):
                return None
        opener = urllib.request.build_opener(NoRedirect)
        try:
            with opener.open(req, timeout=30) as r:
                return r.status, r.read().decode(), {k.lower(): v for k, v in r.headers.items()}
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode(), {k.lower(): v for k, v in e.headers.items()}

    def get(self, path, headers=None, cookie=True):
        return self.request("GET", path, None, headers, cookie)

    def post(self, path, fields, headers=None, cookie=True, origin=True):
        """A form POST; from this dashboard's own origin unless `headers`
        says otherwise (or origin=False: no Origin at all)."""
        h = {"Content-Type": "application/x-www-form-urlencoded"}
        if origin:
            h["Origin"] = self.base
        h.update(headers or {})
        st, body, _ = self.request("POST", path, urllib.parse.urlencode(fields).encode(), h, cookie)
        return st, body

    def login(self, secret):
        """Logs this client in; returns the Set-Cookie header."""
        st, body, h = self.request("POST", "/login", urllib.parse.urlencode(
            {"secret": secret, "next": "/"}).encode(), {
            "Content-Type": "application/x-www-form-urlencoded", "Origin": self.base}, cookie=False)
        assert st == 303, (st, body)
        self.cookie = h["set-cookie"].split(";", 1)[0]
        return h["set-cookie"]

    def csrf(self, path="/jobs"):
        """The session's CSRF token, from a page's forms."""
        st, body, _ = self.get(path)
        assert st == 200, (st, body[:300])
        return re.search(r'name="csrf" value="([0-9a-f]{64})"', body).group(1)

    def logtext(self):
        self.log.flush()
        with open(self.log.name) as f:
            return f.read()

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def raw(port, method, path, headers, body=None):
    """One request with exactly these headers (Host included): (status, body)."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        c.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
        for k, v in headers.items():
            c.putheader(k, v)
        if body is not None:
            c.putheader("Content-Length", str(len(body)))
        c.endheaders(body)
        r = c.getresponse()
        return r.status, r.read().decode()
    finally:
        c.close()


# ---- a WebDriver client -------------------------------------------------------------
ELEMENT = "element-6066-11e4-a52f-4f735466cecf"


class Browser:
    def __init__(self):
        self.port = free_port()
        self.profile = tempfile.mkdtemp(prefix="pgque_chromium_")
        self.driver = subprocess.Popen(["/usr/bin/chromedriver", f"--port={self.port}"],
                                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.url = f"http://127.0.0.1:{self.port}"
        wait_for("chromedriver", self._ready)
        caps = {"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:loggingPrefs": {"browser": "ALL"},
            "goog:chromeOptions": {
                "binary": "/usr/bin/chromium",
                "args": ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                         "--no-first-run", "--disable-background-networking",
                         "--disable-component-update", "--disable-sync",
                         "--disable-dev-shm-usage", "--window-size=1280,1000",
                         f"--user-data-dir={self.profile}"]}}}}
        self.sid = self.cmd("POST", "/session", caps, base=True)["sessionId"]

    def _ready(self):
        try:
            with urllib.request.urlopen(self.url + "/status", timeout=2) as r:
                return json.load(r)["value"]["ready"]
        except OSError:
            return False

    def cmd(self, method, path, body=None, base=False):
        url = self.url + (path if base else f"/session/{self.sid}{path}")
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(url, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=90) as r:
                return json.load(r)["value"]
        except urllib.error.HTTPError as e:
            raise AssertionError(f"WebDriver {method} {path}: {e.read().decode()[:500]}")

    def go(self, url):
        self.cmd("POST", "/url", {"url": url})

    def js(self, script, *args):
        return self.cmd("POST", "/execute/sync", {"script": script, "args": list(args)})

    def find(self, css):
        found = self.cmd("POST", "/elements", {"using": "css selector", "value": css})
        # {"element-6066-...": id} in W3C mode ({"ELEMENT": id} in the legacy one)
        return [e.get(ELEMENT) or next(iter(e.values())) for e in found]

    def click(self, element):
        self.cmd("POST", f"/element/{element}/click", {})

    def click_css(self, css):
        """Clicks the first element matching css, found again when the page's
        refresh in place replaced it between the find and the click (a stale
        element: more likely the busier the machine)."""
        for attempt in range(5):
            found = self.find(css)
            assert found, f"nothing matches {css}"
            try:
                return self.click(found[0])
            except AssertionError as e:
                if "stale element reference" not in str(e) or attempt == 4:
                    raise

    def type(self, element, text):
        self.cmd("POST", f"/element/{element}/value", {"text": text})

    def console(self):
        return self.cmd("POST", "/se/log", {"type": "browser"})

    def cookies(self):
        """Every cookie of the current page, HttpOnly ones included."""
        return self.cmd("GET", "/cookie")

    def screenshot(self, path):
        png = base64.b64decode(self.cmd("GET", "/screenshot"))
        with open(path, "wb") as f:
            f.write(png)

    def quit(self):
        try:
            self.cmd("DELETE", "")
        finally:
            self.driver.terminate()
            self.driver.wait(10)
            shutil.rmtree(self.profile, ignore_errors=True)


def errors_in(entries):
    return [e for e in entries if e.get("level") == "SEVERE"]


def cells(b):
    """The metric cells of the page: (name, labels dict, value shown, raw value)."""
    out = []
    for name, labels, text, raw in b.js(
            "return Array.from(document.querySelectorAll('[data-metric]'))"
            ".map(e => [e.dataset.metric, e.dataset.labels, e.textContent, e.dataset.value])"):
        ls = dict(kv.split("=", 1) for kv in labels.split(",")) if labels else {}
        out.append((name, ls, text, float(raw)))
    return out


# ---- the tests ----------------------------------------------------------------------------
def test_metrics_endpoint_equals_pgque_metrics(ctx):
    c = ctx["c"]
    # A duty's first run adds its timestamps between two reads: read again then.
    for _ in range(5):
        before = metrics_rows(c)
        status, body, headers = ctx["admin"].get("/metrics")
        after = metrics_rows(c)
        if set(before) == set(after):
            break
    assert status == 200, body
    assert headers["content-type"].startswith("text/plain; version=0.0.4"), headers
    scraped = {}
    types = {}
    for fam in text_string_to_metric_families(body):
        types[fam.name] = fam.type
        for s in fam.samples:
            scraped[(s.name, json.dumps(s.labels, sort_keys=True))] = s.value
    assert set(scraped) == set(before) == set(after), (set(scraped) ^ set(before))
    for k, v in scraped.items():
        name = k[0]
        lo, hi = min(before[k], after[k]), max(before[k], after[k])
        if name in STABLE or name.endswith("_total") or "timestamp" in name:
            assert lo <= v <= hi, (k, before[k], v, after[k])
        else:  # ages and rates move with the clock between the three reads
            assert lo - 5 <= v <= hi + 5, (k, before[k], v, after[k])
    # The spec's names, with the fixture's figures.
    want = [
        ("pgque_event_queue_pending_events", {"queue": "orders"}, 10),
        ("pgque_consumer_pending_events", {"queue": "orders", "consumer": "billing"}, 0),
        ("pgque_consumer_pending_events", {"queue": "orders", "consumer": "audit"}, 10),
        ("pgque_dead_letters", {"queue": "mail"}, 3),
        ("pgque_jobs", {"queue": "emails", "state": "ready"}, 4),
        ("pgque_jobs", {"queue": "emails", "state": "running"}, 1),
        ("pgque_jobs", {"queue": "emails", "state": "completed"}, 1),
        ("pgque_jobs", {"queue": "emails", "state": "failed"}, 1),
        ("pgque_jobs", {"queue": "emails", "state": "scheduled"}, 1),
        ("pgque_jobs", {"queue": "reports", "state": "ready"}, 0),
        ("pgque_worker_up", {}, 1),
    ]
    for n, l, v in want:
        assert scraped[(n, json.dumps(l, sort_keys=True))] == v, (n, l, scraped.get((n, json.dumps(l, sort_keys=True))))
    slot_total = sum(v for (n, _), v in scraped.items() if n == "pgque_partition_slot_pending_events")
    assert slot_total == 20, slot_total
    # prometheus_client names a counter's family without its _total suffix.
    assert types.get("pgque_duty_runs") == "counter", types
    assert types.get("pgque_jobs") == "gauge", types
    for n in ("pgque_job_oldest_ready_age_seconds", "pgque_consumer_lag_seconds",
              "pgque_duty_failures_total", "pgque_event_queue_last_tick_age_seconds"):
        assert any(k[0] == n for k in scraped), n
    ctx["exported"] = {k[0] for k in scraped}


def test_monitoring_files_use_only_exported_names(ctx):
    exported = ctx.get("exported") or {k[0] for k in metrics_rows(ctx["c"])}
    folder = os.path.join(ROOT, "docs", "monitoring")
    used = set()
    files = [f for f in sorted(os.listdir(folder)) if f.endswith((".json", ".yml", ".yaml"))]
    assert len(files) >= 2, files
    for f in files:
        text = open(os.path.join(folder, f)).read()
        if f.endswith(".json"):
            json.loads(text)  # Grafana must be able to import it
        used |= set(re.findall(r"\bpgque_[a-z0-9_]+", text))
    # PromQL over a counter may use the sample name; nothing else is allowed.
    unknown = sorted(used - exported)
    assert not unknown, f"docs/monitoring uses names pgque-web does not export: {unknown}"
    for need in ("pgque_consumer_lag_seconds", "pgque_dead_letters", "pgque_duty_failures_total",
                 "pgque_job_oldest_ready_age_seconds"):
        assert need in used, f"the alert rules do not watch {need}"


def visit(b, web, path, shot=None):
    b.go(web.base + path)
    wait_for(f"{path} rendered", lambda: b.js("return document.readyState") == "complete"
             and b.find("#content"))
    # Let at least one in-place refresh happen (and any script error with it).
    wait_for(f"{path} refreshed", lambda: (b.js("return document.getElementById('updated').textContent")
                                           or "").startswith("updated"), timeout=10)
    errs = errors_in(b.console())
    assert not errs, f"console errors on {path}: {errs}"
    if shot:
        shoot(b, shot)


def shoot(b, name):
    if os.environ.get("WEBTEST_SCREENSHOTS", "1") != "0":
        os.makedirs(SHOTS, exist_ok=True)
        b.screenshot(os.path.join(SHOTS, name))


def session_cookie(b, web):
    """The browser's session cookie of this dashboard (None: logged out)."""
    b.go(web.base + "/healthz")
    for ck in b.cookies():
        if ck["name"] == f"pgque_session_{web.port}":
            return ck
    return None


def browser_login(b, web, secret, shot=None):
    """Logs the browser in through the login form, as a person would."""
    b.go(web.base + "/login")
    wait_for("the login form", lambda: b.find("#secret"))
    if shot:
        shoot(b, shot)
    b.type(b.find("#secret")[0], secret)
    b.click_css("#login button")
    wait_for("a page after the login", lambda: b.js("return document.readyState") == "complete"
             and b.find("#content"))
    errs = errors_in(b.console())
    assert not errs, f"console errors at login: {errs}"


def ensure_login(b, web, secret):
    if not session_cookie(b, web):
        browser_login(b, web, secret)


def test_every_page_renders_without_console_errors_and_shows_the_figures(ctx):
    b, web, c = ctx["browser"], ctx["admin"], ctx["c"]
    if not session_cookie(b, web):
        browser_login(b, web, ADMIN_TOKEN, "login.png")
    for p in PAGES:
        name = "overview" if p == "/" else p.strip("/")
        visit(b, web, p, f"{name}.png")
        shown = cells(b)
        db = metrics_rows(c)
        for n, ls, text, raw in shown:
            k = (n, json.dumps(ls, sort_keys=True))
            assert k in db, f"{p} shows {n}{ls}, which pgque.metrics() does not have"
            if n in STABLE:
                assert raw == db[k], (p, n, ls, raw, db[k])
                assert text == str(int(db[k])), (p, n, ls, text, db[k])
        html = b.js("return document.documentElement.outerHTML")
        assert SECRET not in html
        if p == "/events":
            assert {"orders", "mail", "clicks"} <= {l["queue"] for n, l, _, _ in shown if n == "pgque_dead_letters"}
            assert any(n == "pgque_partition_slot_pending_events" for n, *_ in shown)
            assert "smtp down" in html  # the dead letters' reason
        if p == "/jobs":
            got = {(l["queue"], l["state"]): raw for n, l, _, raw in shown if n == "pgque_jobs"}
            assert got[("emails", "failed")] == 1 and got[("emails", "ready")] == 4, got
            assert b.find("svg.chart"), "no throughput chart"
        if p == "/worker":
            assert any(n == "pgque_duty_runs_total" for n, *_ in shown)
            assert "duty:ticker" in html
        if p == "/schedules":
            if not one(c, "SELECT to_regclass('pgque.schedules') IS NOT NULL"):
                assert b.find("#no-schedules"), "no word on the missing schedules view"
            else:
                assert "nightly-report" in html and "0 3 * * *" in html, "the schedule is not shown"


def test_pages_refresh_in_place(ctx):
    b, web, c = ctx["browser"], ctx["admin"], ctx["c"]
    ensure_login(b, web, ADMIN_TOKEN)
    visit(b, web, "/events")
    b.js("window.pgqueMarker = 42")
    cell = "td[data-metric='pgque_consumer_pending_events'][data-labels='queue=orders,consumer=audit']"
    assert b.js(f"return document.querySelector(\"{cell}\").textContent") == "10"
    q(c, "SELECT pgque.send_batch('orders', 'order', ARRAY['x', 'y'])")
    wait_for("the new events on the page", lambda: b.js(
        f"return document.querySelector(\"{cell}\").textContent") == "12", timeout=15)
    assert b.js("return window.pgqueMarker") == 42, "the page was reloaded"
    assert not errors_in(b.console())


def test_admin_actions_through_the_browser_change_the_database(ctx):
    b, web, c, failed = ctx["browser"], ctx["admin"], ctx["c"], ctx["failed_job"]
    ensure_login(b, web, ADMIN_TOKEN)
    # Retry the failed job.
    visit(b, web, "/jobs")
    btn = b.find(f"button[data-action='retry_job'][data-job_id='{failed}']")
    assert btn, "no retry button for the failed job"
    b.click(btn[0])
    wait_for("the retry", lambda: "msg=" in b.js("return location.search"))
    assert one(c, "SELECT state FROM pgque.get_job(%s)", (failed,)) == "ready"
    assert f"job {failed} is ready again" in b.js("return document.getElementById('msg').textContent")
    # Cancel it through the form.
    b.type(b.find("#cancel-id")[0], str(failed))
    b.click_css("#cancel-form button")
    wait_for("the cancel", lambda: "cancelled" in (b.js("return (document.getElementById('msg')||{}).textContent") or ""))
    assert one(c, "SELECT state FROM pgque.get_job(%s)", (failed,)) == "cancelled"
    # Pause and resume a job queue.
    b.click_css("button[data-action='pause_job_queue'][data-queue='reports']")
    wait_for("the pause", lambda: one(c, "SELECT paused FROM pgque.job_queues WHERE queue_name = 'reports'"))
    visit(b, web, "/jobs")
    b.click_css("button[data-action='resume_job_queue'][data-queue='reports']")
    wait_for("the resume", lambda: not one(c, "SELECT paused FROM pgque.job_queues WHERE queue_name = 'reports'"))
    # Pause an event queue, replay its dead letters.
    visit(b, web, "/events")
    b.click_css("button[data-action='pause_queue'][data-queue='orders']")
    wait_for("the queue pause", lambda: one(c, "SELECT queue_ticker_paused FROM pgque.get_queue_info('orders')"))
    visit(b, web, "/events")
    b.click_css("button[data-action='resume_queue'][data-queue='orders']")
    wait_for("the queue resume", lambda: not one(c, "SELECT queue_ticker_paused FROM pgque.get_queue_info('orders')"))
    visit(b, web, "/events")
    b.click_css("button[data-action='replay_dead_letters'][data-queue='mail']")
    wait_for("the replay", lambda: one(c, "SELECT count(*) FROM pgque.dlq_inspect('mail')") == 0)
    assert "3 dead letters of mail replayed" in b.js("return document.getElementById('msg').textContent")
    assert not errors_in(b.console())
    log = web.logtext()
    assert "as role web_admin" in log and "admin actions ON" in log, log
    assert "login: alice (admin)" in log and 'action "pause_queue" by alice' in log, log
    for secret in (SECRET, ADMIN_TOKEN, READ_TOKEN):
        assert secret not in log


def test_forged_posts_are_refused(ctx):
    web, c = ctx["admin"], ctx["c"]
    token = web.csrf()
    paused = lambda: one(c, "SELECT paused FROM pgque.job_queues WHERE queue_name = 'reports'")
    evil = f"http://evil.example:{web.port}"
    for fields, headers, origin in (
            ({"queue": "reports"}, {}, True),
            ({"queue": "reports", "csrf": "0" * 64}, {}, True),
            ({"queue": "reports", "csrf": token[:-1]}, {}, True),
            ({"queue": "reports", "csrf": token}, {"Sec-Fetch-Site": "cross-site"}, True),
            # The right token and session, from another origin: what a page
            # whose name was rebound to 127.0.0.1 would send.
            ({"queue": "reports", "csrf": token}, {"Origin": evil}, True),
            ({"queue": "reports", "csrf": token}, {"Origin": evil, "Sec-Fetch-Site": "same-origin"}, True),
            ({"queue": "reports", "csrf": token}, {"Origin": "null"}, True),
            ({"queue": "reports", "csrf": token}, {"Referer": evil + "/jobs"}, False),
            ({"queue": "reports", "csrf": token}, {}, False)):  # neither Origin nor Referer
        st, text = web.post("/action/pause_job_queue", fields, headers, origin=origin)
        assert st == 403, (fields, headers, st, text)
        assert not paused(), (fields, headers)
    st, text = web.post("/action/pause_job_queue", {"queue": "reports", "csrf": token},
                        {"Origin": evil, "Sec-Fetch-Site": "same-origin"})
    assert "is not this dashboard" in text, text
    # The real token from this dashboard's own page works, with an Origin or
    # (a browser that sends none) a Referer: the refusals were about the above.
    st, _ = web.post("/action/pause_job_queue", {"queue": "reports", "csrf": token},
                     {"Referer": web.base + "/jobs"}, origin=False)
    assert st == 303 and paused()
    st, _ = web.post("/action/resume_job_queue", {"queue": "reports", "csrf": token})
    assert st == 303 and not paused()


def test_a_foreign_host_is_refused(ctx):
    web, c = ctx["admin"], ctx["c"]
    token = web.csrf()
    for path in ("/", "/jobs", "/metrics", "/healthz", "/login"):
        st, body = raw(web.port, "GET", path, {"Host": f"evil.example:{web.port}", "Cookie": web.cookie})
        assert st == 421, (path, st, body)
        assert "is not a name of this dashboard" in body and "--allowed-host" in body, body
    for host in ("127.0.0.1", f"127.0.0.1:{web.port + 1}", f"localhost.evil.example:{web.port}"):
        st, _ = raw(web.port, "GET", "/healthz", {"Host": host})
        assert st == 421, (host, st)
    assert raw(web.port, "GET", "/healthz", {"Host": f"localhost:{web.port}"})[0] == 200
    # DNS rebinding in full: a name of the attacker's, now 127.0.0.1, and a
    # same-origin POST from its page carrying a token it read.
    body = urllib.parse.urlencode({"queue": "reports", "csrf": token}).encode()
    st, text = raw(web.port, "POST", "/action/pause_job_queue", {
        "Host": f"rebind.example:{web.port}", "Origin": f"http://rebind.example:{web.port}",
        "Sec-Fetch-Site": "same-origin", "Cookie": web.cookie,
        "Content-Type": "application/x-www-form-urlencoded"}, body)
    assert st == 421, (st, text)
    assert not one(c, "SELECT paused FROM pgque.job_queues WHERE queue_name = 'reports'")
    assert 'refused POST "/action/pause_job_queue": Host "rebind.example:' in web.logtext()


def test_without_a_session_pages_ask_for_a_login_and_posts_are_refused(ctx):
    web, c = ctx["admin"], ctx["c"]
    token = web.csrf()
    for p in PAGES:
        st, body, h = web.get(p, cookie=False)
        assert st == 401 and 'action="/login"' in body and 'name="next" value="' + p + '"' in body, (p, st)
        assert "data-metric" not in body and "csrf" not in body
    bogus = {"Cookie": f"pgque_session_{web.port}={'0' * 64}"}
    assert web.get("/", bogus)[0] == 401
    assert web.get("/fragment/jobs", cookie=False)[0] == 401
    assert web.get("/healthz", cookie=False)[0] == 200
    st, body, h = web.get("/metrics", cookie=False)
    assert st == 401 and h.get("www-authenticate", "").startswith("Bearer"), (st, h)
    # Prometheus: a bearer token of either role.
    for tok in (READ_TOKEN, ADMIN_TOKEN):
        st, body, _ = web.get("/metrics", {"Authorization": f"Bearer {tok}"}, cookie=False)
        assert st == 200 and "pgque_jobs{" in body, st
    assert web.get("/metrics", {"Authorization": "Bearer " + "x" * 40}, cookie=False)[0] == 401
    for fields, headers in (({"queue": "reports", "csrf": token}, {}), ({"queue": "reports", "csrf": token}, bogus)):
        st, text = web.post("/action/pause_job_queue", fields, headers, cookie=False)
        assert st == 403 and "not logged in" in text, (st, text)
    assert not one(c, "SELECT paused FROM pgque.job_queues WHERE queue_name = 'reports'")
    # An action's name is the percent-decoded path: refused before any login,
    # it reaches the log escaped and cut, and forges no line of its own.
    forged = "refused POST /action/retry_job: this login is read-only"
    path = "/action/x%0A" + urllib.parse.quote(forged, safe="") + "%0A" + "y" * 300
    st, text = web.post(path, {"csrf": token}, cookie=False)
    assert st == 403, (st, text)
    lines = web.logtext().splitlines()
    assert not any(l.startswith("refused POST /action/retry_job") or l == forged for l in lines), lines[-5:]
    line = next(l for l in reversed(lines) if l.startswith('pgque-web: refused POST "/action/x\\n'))
    assert "\\nrefused POST /action/retry_job" in line and len(line) < 250 and "characters)" in line, line
    st, body = web.post("/login", {"secret": "wrong-" + "x" * 20, "next": "/jobs"}, cookie=False)
    assert st == 401 and "Wrong password or token" in body, (st, body[:200])
    assert "failed login" in web.logtext()


def test_a_read_login_cannot_pause_a_queue(ctx):
    c = ctx["c"]
    rd = copy.copy(ctx["admin"])
    set_cookie = rd.login(READ_TOKEN)
    assert rd.cookie != ctx["admin"].cookie
    st, body, _ = rd.get("/jobs")
    assert st == 200 and "signed in as <b id=\"user\">bob</b> (read)" in body, body[:2000]
    assert "data-action=" not in body and 'id="cancel-form"' not in body, "a read login is offered actions"
    read_token, admin_token = rd.csrf("/"), ctx["admin"].csrf()
    for t in (read_token, admin_token):
        st, text = rd.post("/action/pause_job_queue", {"queue": "reports", "csrf": t})
        assert st == 403 and "this login is read-only" in text, (st, text)
    assert not one(c, "SELECT paused FROM pgque.job_queues WHERE queue_name = 'reports'")
    st, body, _ = rd.get("/metrics")
    assert st == 200 and "pgque_jobs{" in body
    assert "login: bob (read)" in rd.logtext()
    for flag in ("HttpOnly", "SameSite=Strict", "Path=/", "Max-Age=28800"):
        assert flag in set_cookie, set_cookie
    assert "Secure" not in set_cookie, set_cookie


def test_an_admin_login_in_the_browser_pauses_a_queue_and_logout_ends_it(ctx):
    b, web, c = ctx["browser"], ctx["admin"], ctx["c"]
    old = session_cookie(b, web)
    if old:  # log out first, so this test logs in through the form itself
        visit(b, web, "/")
        b.click_css("#logout button")
        wait_for("the login page", lambda: b.find("#secret"))
    browser_login(b, web, ADMIN_TOKEN)
    ck = session_cookie(b, web)
    assert ck and ck["httpOnly"] and ck.get("sameSite") == "Strict" and ck["path"] == "/", ck
    visit(b, web, "/jobs")
    assert b.js("return document.getElementById('user').textContent") == "alice"
    b.click_css("button[data-action='pause_job_queue'][data-queue='reports']")
    wait_for("the pause", lambda: one(c, "SELECT paused FROM pgque.job_queues WHERE queue_name = 'reports'"))
    visit(b, web, "/jobs")
    b.click_css("button[data-action='resume_job_queue'][data-queue='reports']")
    wait_for("the resume", lambda: not one(c, "SELECT paused FROM pgque.job_queues WHERE queue_name = 'reports'"))
    # What the browser holds, used from outside it: works until logout.
    stolen = f"{ck['name']}={ck['value']}"
    visit(b, web, "/jobs")
    csrf = b.js("return document.querySelector('#logout input[name=csrf]').value")
    assert web.get("/jobs", {"Cookie": stolen})[0] == 200
    b.click_css("#logout button")
    wait_for("the login page after logout", lambda: b.find("#secret")
             and "logged out" in (b.js("return (document.getElementById('msg')||{}).textContent") or ""))
    shoot(b, "logged-out.png")
    assert session_cookie(b, web) is None, "the cookie outlived the logout"
    b.go(web.base + "/jobs")
    wait_for("the login page in place of /jobs", lambda: b.find("#secret"))
    b.console()  # the 401 of that page load
    st, _, _ = web.get("/jobs", {"Cookie": stolen})
    assert st == 401, "the session outlived the logout"
    st, text = web.post("/action/pause_job_queue", {"queue": "reports", "csrf": csrf}, {"Cookie": stolen})
    assert st == 403, (st, text)
    assert not one(c, "SELECT paused FROM pgque.job_queues WHERE queue_name = 'reports'")
    assert "logout: alice" in web.logtext()
    browser_login(b, web, ADMIN_TOKEN)


def test_a_reader_sees_no_actions_and_cannot_post(ctx):
    b, c = ctx["browser"], ctx["c"]
    web = ctx["reader"]
    ensure_login(b, web, ENV_READ_TOKEN)
    for p in PAGES:
        visit(b, web, p, None)
        offered = b.js("return Array.from(document.querySelectorAll(\"form[method='post'], button\"))"
                       ".filter(e => !e.closest('#logout')).length")
        assert offered == 0, f"{p} offers actions to a reader"
        assert b.js("return document.body.dataset.admin") == "false"
    visit(b, web, "/events", "events-read-only.png")
    token = web.csrf("/")
    for fields in ({"queue": "reports"}, {"queue": "reports", "csrf": token}):
        st, text = web.post("/action/pause_job_queue", fields)
        assert st == 403, (st, text)
    assert not one(c, "SELECT paused FROM pgque.job_queues WHERE queue_name = 'reports'")
    st, body, _ = web.get("/metrics")
    assert st == 200 and "pgque_jobs{" in body
    log = web.logtext()
    assert "as role web_reader" in log and "admin actions OFF" in log, log
    assert "login: read-token (read)" in log, log
    for secret in (SECRET, ENV_READ_TOKEN):
        assert secret not in log


def test_startup_refuses_a_login_without_credentials(ctx):
    cases = [
        (Web("web_admin", wait=False), ["admin actions are on", "PGQUE_WEB_ADMIN_TOKEN",
                                        "PGQUE_WEB_READ_TOKEN", "--auth-file", "--read-only"]),
        (Web("web_reader", wait=False, listen="0.0.0.0"), ["is not a loopback address", "PGQUE_WEB_READ_TOKEN"]),
    ]
    loose = os.path.join(ctx["tmp"], "loose-auth")
    with open(loose, "w") as f:
        f.write(f"admin:alice:{ADMIN_TOKEN}\n")
    os.chmod(loose, 0o644)
    cases.append((Web("web_admin", "--auth-file", loose, wait=False), ["mode 644", "chmod 600"]))
    cases.append((Web("web_admin", wait=False, env={"PGQUE_WEB_ADMIN_TOKEN": "short"}),
                  ["PGQUE_WEB_ADMIN_TOKEN", "at least 16"]))
    for w, want in cases:
        try:
            rc = w.proc.wait(30)
        finally:
            w.stop()
        log = w.logtext()
        assert rc == 2, (rc, log)
        for needle in want:
            assert needle in log, (needle, log)
    # Read-only on loopback needs no login: the dashboard is open, with no
    # forms and no login page.
    w = Web("web_admin", "--read-only")
    try:
        st, body, _ = w.get("/jobs")
        assert st == 200 and "data-action=" not in body and "/logout" not in body, st
        assert w.get("/login")[0] == 303
        assert w.post("/action/pause_job_queue", {"queue": "reports", "csrf": "0" * 64})[0] == 403
        assert "no login: loopback only and read-only" in w.logtext()
    finally:
        w.stop()


def test_logins_back_off_and_the_cookie_is_secure_behind_tls(ctx):
    w = Web("web_reader", "--cookie-secure", "--allowed-host", "dash.test",
            env={"PGQUE_WEB_READ_TOKEN": ENV_READ_TOKEN})
    try:
        # The proxy's name, without a port (https: 443), is accepted.
        assert raw(w.port, "GET", "/healthz", {"Host": "dash.test"})[0] == 200
        body = urllib.parse.urlencode({"secret": ENV_READ_TOKEN, "next": "/events"}).encode()
        c = http.client.HTTPConnection("127.0.0.1", w.port, timeout=30)
        c.request("POST", "/login", body, {"Host": "dash.test", "Origin": "https://dash.test",
                                            "Content-Type": "application/x-www-form-urlencoded"})
        r = c.getresponse()
        r.read()
        assert r.status == 303 and r.getheader("Location") == "/events", r.status
        ck = r.getheader("Set-Cookie")
        c.close()
        for flag in ("HttpOnly", "SameSite=Strict", "Path=/", "; Secure"):
            assert flag in ck, ck
        # Three wrong secrets are free, the fourth starts a back-off in which
        # even the right one is not looked at; after it, the right one works.
        for i in range(4):
            st, text = w.post("/login", {"secret": f"guess-{i}-" + "x" * 20}, cookie=False)
            assert st == 401, (i, st)
        st, text = w.post("/login", {"secret": ENV_READ_TOKEN}, cookie=False)
        assert st == 429 and "Too many failed logins" in text, st
        time.sleep(1.2)
        assert w.post("/login", {"secret": ENV_READ_TOKEN}, cookie=False)[0] == 303
    finally:
        w.stop()


def test_the_chart_history_is_capped(ctx):
    # The fixture has far more than 5 series (each queue, consumer, slot...).
    w = Web("web_reader", "--max-series", "5")
    try:
        wait_for("the cap in the log", lambda: "the charts keep 5 series (--max-series)" in w.logtext())
        st, body, _ = w.get("/jobs")
        assert st == 200 and "svg" in body, st
    finally:
        w.stop()


def test_help_documents_every_flag(ctx):
    out = subprocess.run([BIN, "--help"], capture_output=True, text=True, check=True).stdout
    for flag in ("--database-url", "--listen", "--allowed-host", "--auth-file", "--session-minutes",
                 "--cookie-secure", "--read-only", "--refresh-ms", "--sample-ms", "--history",
                 "--max-series", "--pool-size", "127.0.0.1:8080", "PGQUE_WEB_ADMIN_TOKEN"):
        assert flag in out, flag


# ---- the job explorer (jobs list, job, flow, bulk actions, schedules) --------------------
def visit_static(b, web, path, shot=None):
    """A page that does not refresh in place: loaded, no console errors."""
    b.go(web.base + path)
    wait_for(f"{path} rendered", lambda: b.js("return document.readyState") == "complete"
             and b.find("#content"))
    errs = errors_in(b.console())
    assert not errs, f"console errors on {path}: {errs}"
    if shot:
        shoot(b, shot)


def explorer_fixture(ctx):
    """Queue `explore`: 130 jobs of the log (one batch row each) of kinds mail
    and resize, 60 dispatched: 40 completed, 5 failed (their last attempt,
    an error each), 15 running; 2 of the ready ones cancelled; and a flow of
    four jobs in queue `flows`, its root completed. Returns the flow's id. Made once per run."""
    if "flow" in ctx:
        return ctx["flow"]
    c = ctx["c"]
    q(c, "SELECT pgque.create_job_queue('explore')")
    q(c, "SELECT pgque.enqueue('explore', CASE WHEN g % 3 = 0 THEN 'resize' ELSE 'mail' END, "
         "jsonb_build_object('n', g, 'to', 'user' || g || '@example.test'), max_attempts => 1) "
         "FROM generate_series(1, 130) g")
    got = q(c, "SELECT job_id, lease_token FROM pgque.dispatch(ARRAY['explore'], 60, 'wx', '1 hour')")
    assert len(got) == 60, got
    q(c, "SELECT pgque.complete_many(%s, %s)", ([g[0] for g in got[:40]], [g[1] for g in got[:40]]))
    for jid, tok in got[40:45]:
        q(c, "SELECT pgque.fail(%s, %s, %s)", (jid, tok, f"smtp timeout #{jid}\nTraceback (most recent "
                                                     "call last):\n  File \"mailer.py\", line 12, in send"))
    ready = [r[0] for r in q(c, "SELECT id FROM pgque.list_jobs('explore', 'ready', max_jobs => 2)")]
    for jid in ready:
        q(c, "SELECT pgque.cancel(%s)", (jid,))
    q(c, "SELECT pgque.create_job_queue('flows')")
    rows = q(c, """SELECT flow_id, key, job_id FROM pgque.enqueue_flow('flows', '[
        {"key": "fetch", "kind": "fetch", "args": {"day": "2026-12-01"}},
        {"key": "left", "kind": "render", "depends_on": ["fetch"]},
        {"key": "right", "kind": "render", "depends_on": ["fetch"]},
        {"key": "notify", "kind": "mail", "depends_on": ["left", "right"]}]')""")
    ctx["flow"] = rows[0][0]
    ctx["flow_jobs"] = {k: j for _, k, j in rows}
    # the flow's root runs and completes: left and right become ready
    tok = one(c, "SELECT lease_token FROM pgque.dispatch(ARRAY['flows'], 1, 'wf', '1 hour') "
                 "WHERE job_id = %s", (ctx["flow_jobs"]["fetch"],))
    if tok is not None:
        q(c, "SELECT pgque.complete(%s, %s, '{\"rows\": 3}')", (ctx["flow_jobs"]["fetch"], tok))
    return ctx["flow"]


def shown_jobs(b):
    return b.js("return Array.from(document.querySelectorAll('#job-list tr[data-job]'))"
                ".map(r => [+r.dataset.job, r.dataset.state])")


def oracle(c, where, args=(), limit=50, offset=0):
    """What a list page must show, from the all_jobs view (the test's own
    slow reading of both stores)."""
    return [[i, s] for i, s in q(c, f"SELECT id, state FROM pgque.all_jobs WHERE {where} "
                                    "ORDER BY id DESC LIMIT %s OFFSET %s", (*args, limit, offset))]


def test_the_jobs_list_shows_what_the_database_holds(ctx):
    b, web, c = ctx["browser"], ctx["admin"], ctx["c"]
    explorer_fixture(ctx)
    ensure_login(b, web, ADMIN_TOKEN)
    visit_static(b, web, "/jobs/list?queue=explore", "jobs-list.png")
    assert shown_jobs(b) == oracle(c, "queue = 'explore'"), "page 1"
    # Keyset pages: the "older" link, page after page, to the end.
    seen = shown_jobs(b)
    pages = 1
    while b.find("#older"):
        b.click_css("#older")
        wait_for("the next page", lambda: b.js("return document.readyState") == "complete")
        page = shown_jobs(b)
        assert page == oracle(c, "queue = 'explore'", offset=len(seen)), f"page {pages + 1}"
        seen += page
        pages += 1
    total = one(c, "SELECT count(*) FROM pgque.all_jobs WHERE queue = 'explore'")
    assert len(seen) == total and pages == -(-total // 50), (len(seen), total, pages)
    assert not errors_in(b.console())
    for query, where, args in (
            ("state=failed", "state = 'failed'", ()),
            ("queue=explore&state=completed&kind=resize", "queue = 'explore' AND state = 'completed' AND kind = 'resize'", ()),
            ("queue=explore&state=running", "queue = 'explore' AND state = 'running'", ()),
            ("state=cancelled", "state = 'cancelled'", ()),
            ("kind=render", "kind = 'render'", ()),
            ("q=SMTP+TIMEOUT", "errors -> -1 ->> 'error' ILIKE %s", ("%smtp timeout%",)),
            ("q=user77%40", "args::text ILIKE %s OR errors -> -1 ->> 'error' ILIKE %s", ("%user77@%", "%user77@%")),
            ("queue=explore&state=ready", "queue = 'explore' AND state = 'ready'", ())):
        visit_static(b, web, "/jobs/list?" + query)
        want = oracle(c, where, args)
        assert want, f"the fixture has no job for {query}"
        assert shown_jobs(b) == want, (query, shown_jobs(b), want)
    visit_static(b, web, "/jobs/list?state=bogus")
    assert "unknown job state bogus" in b.js("return document.getElementById('list-error').textContent")


def test_a_job_page_and_a_flow_page_show_what_the_database_holds(ctx):
    b, web, c = ctx["browser"], ctx["admin"], ctx["c"]
    flow = explorer_fixture(ctx)
    ensure_login(b, web, ADMIN_TOKEN)
    failed = one(c, "SELECT id FROM pgque.all_jobs WHERE queue = 'explore' AND state = 'failed' "
                    "ORDER BY id DESC LIMIT 1")
    visit_static(b, web, f"/jobs/{failed}", "job.png")
    job = json.loads(json.dumps(q(c, "SELECT to_jsonb(g) FROM pgque.get_job(%s) g", (failed,))[0][0]))
    fields = dict(b.js("return Array.from(document.querySelectorAll('#job dd[data-field][data-raw]'))"
                       ".map(e => [e.dataset.field, e.dataset.raw])"))
    for k in ("id", "queue", "kind", "state", "attempt", "max_attempts", "priority", "worker",
              "enqueued_at", "dispatched_at", "finished_at", "stored_in"):
        want = "" if job[k] is None else str(job[k])
        assert fields[k] == want, (k, fields[k], want)
    assert json.loads(b.js("return document.getElementById('args').textContent")) == job["args"]
    errs = b.js("return Array.from(document.querySelectorAll('#errors tr.error')).map(r => r.cells[2].dataset.error)")
    assert errs == [e["error"] for e in job["errors"]] and errs[0].startswith(f"smtp timeout #{failed}\n"), errs
    assert "mailer.py" in b.js("return document.querySelector('#errors pre.traceback').textContent")
    events = b.js("return Array.from(document.querySelectorAll('#timeline tr[data-event]')).map(r => r.dataset.event)")
    assert events[0] == "enqueued" and "dispatched" in events and events[-1] == "failed", events
    assert b.find("button[data-action='retry_job']") and not b.find("button[data-action='cancel_job']")
    # The flow: a child's page links its parents; the graph's figures.
    fj = ctx["flow_jobs"]
    visit_static(b, web, f"/jobs/{fj['notify']}")
    parents = b.js("return Array.from(document.querySelectorAll('#parents tr[data-job]')).map(r => +r.dataset.job)")
    assert parents == [fj["left"], fj["right"]], parents
    assert b.find(f"#flow-link[href='/flows/{flow}']")
    visit_static(b, web, f"/jobs/{fj['fetch']}")
    children = b.js("return Array.from(document.querySelectorAll('#children tr[data-job]')).map(r => +r.dataset.job)")
    assert children == [fj["left"], fj["right"]], children
    assert "rows" in b.js("return document.getElementById('output').textContent")
    assert not b.find("#headers"), "a job without headers shows none"
    # A traced job: its page shows the trace context it carries.
    tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    q(c, "SELECT pgque.create_job_queue('explore_traced')")
    traced = one(c, "SELECT pgque.enqueue('explore_traced', 'traced', headers => jsonb_build_object("
                    "'traceparent', %s::text, 'tracestate', 'x=1'))", (tp,))
    visit_static(b, web, f"/jobs/{traced}")
    assert json.loads(b.js("return document.getElementById('headers').textContent")) == {
        "traceparent": tp, "tracestate": "x=1"}
    visit_static(b, web, f"/flows/{flow}", "flow.png")
    status = q(c, "SELECT to_jsonb(s) FROM pgque.flow_status(%s) s", (flow,))[0][0]
    counts = dict(b.js("return Array.from(document.querySelectorAll('#flow-counts [data-count]'))"
                       ".map(e => [e.dataset.count, +e.dataset.value])"))
    for k, v in counts.items():
        assert status[k] == v, (k, status[k], v)
    nodes = dict((int(j), s) for j, s in b.js(
        "return Array.from(document.querySelectorAll('#flow-graph g.node')).map(g => [g.dataset.job, g.dataset.state])"))
    assert nodes == {j: s for j, s in q(c, "SELECT id, state FROM pgque.all_jobs WHERE id = ANY (%s)",
                                        (list(fj.values()),))}, nodes
    edges = sorted(tuple(map(int, e)) for e in b.js(
        "return Array.from(document.querySelectorAll('#flow-graph line.edge')).map(l => [l.dataset.from, l.dataset.to])"))
    assert edges == sorted(q(c, "SELECT parent_id, child_id FROM pgque.job_deps WHERE child_id = ANY (%s)",
                             (list(fj.values()),))), edges
    # laid out by depth: fetch, then left and right in one column, then notify
    xs = dict((int(j), float(x)) for j, x in b.js(
        "return Array.from(document.querySelectorAll('#flow-graph g.node')).map(g => [g.dataset.job, g.querySelector('rect').getAttribute('x')])"))
    assert xs[fj["fetch"]] < xs[fj["left"]] == xs[fj["right"]] < xs[fj["notify"]], xs
    b.click_css(f"#flow-graph a[href='/jobs/{fj['notify']}']")
    wait_for("the node's job page", lambda: b.js("return location.pathname") == f"/jobs/{fj['notify']}")
    assert not errors_in(b.console())
    # An unknown job or flow is a 404 page, not an error.
    assert web.get("/jobs/999999999")[0] == 404 and web.get("/flows/999999999")[0] == 404


def test_bulk_actions_change_exactly_the_jobs_confirmed(ctx):
    b, web, c = ctx["browser"], ctx["admin"], ctx["c"]
    explorer_fixture(ctx)
    ensure_login(b, web, ADMIN_TOKEN)
    states = lambda: dict(q(c, "SELECT id, state FROM pgque.all_jobs WHERE queue = 'explore'"))
    before = states()
    failed = sorted(i for i, s in before.items() if s == "failed")
    assert len(failed) == 5, failed
    # Retry everything matching queue=explore, state=failed.
    visit_static(b, web, "/jobs/list?queue=explore&state=failed")
    b.click_css("button[data-action='bulk-retry-filter']")
    wait_for("the confirmation", lambda: b.find("#confirm-count"))
    shoot(b, "bulk-confirm.png")
    assert int(b.js("return document.getElementById('confirm-count').dataset.count")) == len(failed)
    assert "retry" in b.js("return document.getElementById('confirm-count').textContent")
    b.click_css("#confirm")
    wait_for("the action", lambda: "msg=" in b.js("return location.search"))
    assert f"{len(failed)} of {len(failed)} jobs are ready again" in b.js(
        "return document.getElementById('msg').textContent")
    after = states()
    changed = sorted(i for i in after if after[i] != before.get(i))
    assert changed == failed, (changed, failed)
    assert all(after[i] == "ready" for i in failed)
    # Cancel two selected jobs.
    before = after
    visit_static(b, web, "/jobs/list?queue=explore&state=ready")
    boxes = b.find("#job-list input[name='ids']")
    assert len(boxes) >= 2
    picked = [int(x) for x in b.js("return Array.from(document.querySelectorAll(\"#job-list input[name='ids']\"))"
                                   ".slice(0, 2).map(e => e.value)")]
    for box in boxes[:2]:
        b.click(box)
    b.click_css("button[data-action='bulk-cancel-selected']")
    wait_for("the confirmation", lambda: b.find("#confirm-count"))
    assert int(b.js("return document.getElementById('confirm-count').dataset.count")) == 2
    b.click_css("#confirm")
    wait_for("the action", lambda: "msg=" in b.js("return location.search"))
    after = states()
    assert sorted(i for i in after if after[i] != before.get(i)) == sorted(picked)
    assert all(after[i] == "cancelled" for i in picked)
    assert not errors_in(b.console())
    # A confirmation that no longer holds changes nothing.
    token = web.csrf("/jobs/list")
    n_cancelled = lambda: one(c, "SELECT count(*) FROM pgque.all_jobs WHERE state = 'cancelled'")
    n0 = n_cancelled()
    st, _, h = web.request("POST", "/action/bulk_retry", urllib.parse.urlencode({
        "csrf": token, "queue": "explore", "state": "cancelled", "digest": "0" * 64,
        "back": "/jobs/list"}).encode(), {"Content-Type": "application/x-www-form-urlencoded",
                                          "Origin": web.base})
    assert st == 303 and n_cancelled() == n0, st
    st, body, _ = web.get(h["location"])
    assert "nothing changed" in body, body[:500]
    # Without the CSRF token, or from a read login: refused.
    assert web.post("/jobs/bulk", {"op": "retry-filter", "queue": "explore"})[0] == 403
    assert web.post("/action/bulk_cancel", {"queue": "explore", "digest": "0" * 64})[0] == 403


def test_the_schedules_page_fires_pauses_and_resumes(ctx):
    b, web, c = ctx["browser"], ctx["admin"], ctx["c"]
    ensure_login(b, web, ADMIN_TOKEN)
    if not one(c, "SELECT to_regclass('pgque.schedules') IS NOT NULL"):
        return
    if not one(c, "SELECT count(*) FROM pgque.schedules WHERE name = 'hourly-digest'"):
        q(c, "SELECT pgque.create_schedule('hourly-digest', '0 * * * *', 'reports', 'digest', '{\"to\": \"ops\"}')")
    visit(b, web, "/schedules")
    row = "#schedule-list tr[data-schedule='hourly-digest']"
    raw = lambda f: b.js(f"return document.querySelector(\"{row} td[data-field='{f}']\").dataset.raw")
    nxt = one(c, "SELECT to_jsonb(next_run_at) #>> '{}' FROM pgque.schedules WHERE name = 'hourly-digest'")
    assert raw("next_run_at") == nxt, (raw("next_run_at"), nxt)
    b.click_css(f"{row} button[data-action='run_schedule']")
    wait_for("the run", lambda: "msg=" in b.js("return location.search"))
    job, last = q(c, "SELECT last_job_id, to_jsonb(last_run_at) #>> '{}' FROM pgque.schedules "
                     "WHERE name = 'hourly-digest'")[0]
    assert job and f"fired job {job}" in b.js("return document.getElementById('msg').textContent")
    assert one(c, "SELECT kind FROM pgque.get_job(%s)", (job,)) == "digest"
    assert raw("last_run_at") == last
    assert b.find(f"{row} a[href='/jobs/{job}']"), "no link to the fired job"
    state = b.js(f"return document.querySelector(\"{row} td[data-field='last_job_id']\").dataset.state")
    assert state == one(c, "SELECT state FROM pgque.get_job(%s)", (job,)), state
    assert b.find(f"{row} td[data-field='last_job_id'] span.st"), "no state badge"
    shoot(b, "schedules.png")
    b.click_css(f"{row} button[data-action='pause_schedule']")
    wait_for("the pause", lambda: one(c, "SELECT paused FROM pgque.schedules WHERE name = 'hourly-digest'"))
    visit(b, web, "/schedules")
    b.click_css(f"{row} button[data-action='resume_schedule']")
    wait_for("the resume", lambda: not one(c, "SELECT paused FROM pgque.schedules WHERE name = 'hourly-digest'"))
    assert not errors_in(b.console())


def test_the_schedules_page_shows_each_schedules_recent_firings(ctx):
    c, web = ctx["c"], ctx["admin"]
    if not one(c, "SELECT to_regclass('pgque.schedules') IS NOT NULL"):
        return
    q(c, "SELECT pgque.create_schedule('recent-digest', '0 0 1 1 *', 'reports', 'recent')")
    fired = [one(c, "SELECT pgque.run_schedule_now('recent-digest')") for _ in range(12)]
    # the ten newest, newest first, as the row keeps them
    assert one(c, "SELECT recent_job_ids FROM pgque.schedules WHERE name = 'recent-digest'") \
        == fired[::-1][:10]
    st, html, _ = web.get("/schedules")
    assert st == 200, (st, html[:300])
    m = re.search(r'<tr data-schedule="recent-digest">.*?</tr>', html, re.S)
    assert m, "no row for the schedule"
    shown = re.findall(r'<span class="firing" data-job="(\d+)" data-state="([a-z]*)">'
                       r'<a href="/jobs/(\d+)">', m.group(0))
    assert [int(j) for j, _, _ in shown] == fired[::-1][:10], shown
    assert all(j == link for j, _, link in shown), shown
    for j, state, _ in shown:
        assert state == one(c, "SELECT state FROM pgque.get_job(%s)", (int(j),)), (j, state)
    q(c, "SELECT pgque.drop_schedule('recent-digest')")


def test_a_reader_sees_the_explorer_without_actions(ctx):
    b, c = ctx["browser"], ctx["c"]
    web = ctx["reader"]
    flow = explorer_fixture(ctx)
    ensure_login(b, web, ENV_READ_TOKEN)
    some_job = ctx["flow_jobs"]["fetch"]
    for p in ("/jobs/list?queue=explore", "/jobs/list?state=failed", f"/jobs/{some_job}",
              f"/flows/{flow}", "/schedules"):
        visit_static(b, web, p, "jobs-list-read-only.png" if p == "/jobs/list?queue=explore" else None)
        offered = b.js("return Array.from(document.querySelectorAll(\"form[method='post'], button[data-action], input[name='ids']\"))"
                       ".filter(e => !e.closest('#logout')).length")
        assert offered == 0, f"{p} offers actions to a reader"
    visit_static(b, web, "/jobs/list?queue=explore")
    assert shown_jobs(b) == oracle(c, "queue = 'explore'")
    token = web.csrf("/")
    for path, fields in (("/jobs/bulk", {"op": "cancel-filter", "queue": "explore"}),
                         ("/action/bulk_cancel", {"queue": "explore", "digest": "0" * 64}),
                         ("/action/run_schedule", {"schedule": "nightly-report"}),
                         ("/action/pause_schedule", {"schedule": "nightly-report"})):
        for f in (fields, {**fields, "csrf": token}):
            st, text = web.post(path, f)
            assert st == 403, (path, f, st, text)
    assert not one(c, "SELECT paused FROM pgque.schedules WHERE name = 'nightly-report'")
    # A read login on the admin dashboard: the same pages without actions,
    # its POSTs refused even with its own session's token.
    rd = copy.copy(ctx["admin"])
    rd.login(READ_TOKEN)
    for p in ("/jobs/list?queue=explore", f"/jobs/{some_job}", f"/flows/{flow}", "/schedules"):
        st, body, _ = rd.get(p)
        assert st == 200 and "data-action=" not in body and 'name="ids"' not in body, p
        assert 'method="post" action="/jobs/bulk"' not in body, p
    token = rd.csrf("/")
    cancelled = one(c, "SELECT count(*) FROM pgque.all_jobs WHERE state = 'cancelled'")
    for path, fields in (("/jobs/bulk", {"op": "cancel-filter", "queue": "explore"}),
                         ("/action/bulk_cancel", {"queue": "explore", "digest": "0" * 64}),
                         ("/action/run_schedule", {"schedule": "nightly-report"}),
                         ("/action/pause_schedule", {"schedule": "nightly-report"})):
        st, text = rd.post(path, {**fields, "csrf": token})
        assert st == 403 and "this login is read-only" in text, (path, st, text)
    assert one(c, "SELECT count(*) FROM pgque.all_jobs WHERE state = 'cancelled'") == cancelled
    assert not one(c, "SELECT paused FROM pgque.schedules WHERE name = 'nightly-report'")


def test_list_jobs_pages_match_all_jobs_and_bad_input_is_refused(ctx):
    """pgque.list_jobs paged 7 at a time, every filter combination, equals
    the all_jobs view; bad input gets its SQLSTATE; the roles' grants."""
    c = ctx["c"]
    explorer_fixture(ctx)
    states = [None, "waiting", "scheduled", "ready", "running", "completed", "failed", "cancelled"]
    for st in states:
        for qu in (None, "explore"):
            for kind, search in ((None, None), ("resize", None), (None, "SMTP"), (None, "user7")):
                where, args = ["true"], []
                if st:
                    where.append("state = %s"); args.append(st)
                if qu:
                    where.append("queue = %s"); args.append(qu)
                if kind:
                    where.append("kind = %s"); args.append(kind)
                if search:
                    where.append("(args::text ILIKE %s OR errors -> -1 ->> 'error' ILIKE %s)")
                    args += [f"%{search}%"] * 2
                want = [r[0] for r in q(c, f"SELECT id FROM pgque.all_jobs WHERE {' AND '.join(where)} "
                                           "ORDER BY id DESC", args)]
                got, before = [], None
                for _ in range(1000):
                    page = q(c, "SELECT id, cursor_id FROM pgque.list_jobs(%s, %s, %s, %s, %s, 7)",
                             (qu, st, kind, search, before))
                    got += [i for i, _ in page if i is not None]
                    if not page or (page[-1][0] is not None and len(page) < 7):
                        break
                    before = page[-1][1]
                assert got == want, (st, qu, kind, search, got, want)
    for sql, code in (("SELECT * FROM pgque.list_jobs(in_state => 'done')", "22023"),
                      ("SELECT * FROM pgque.list_jobs(max_jobs => 0)", "22003"),
                      ("SELECT * FROM pgque.list_jobs(max_jobs => 1001)", "22003"),
                      ("SELECT * FROM pgque.list_jobs('no-such-queue')", "42704"),
                      ("SELECT * FROM pgque.list_jobs(search => repeat('x', 201))", "22001"),
                      ("SELECT * FROM pgque.match_jobs('delete')", "22023"),
                      ("SELECT * FROM pgque.flow_graph(1, 0)", "22003"),
                      ("SELECT pgque.run_schedule_now('no-such-schedule')", "42704")):
        try:
            q(c, sql)
            raise AssertionError(f"{sql} did not fail")
        except psycopg2.Error as e:
            assert e.pgcode == code, (sql, e.pgcode, e.pgerror)
    if one(c, "SELECT count(*) FROM pgque.schedules WHERE name = 'nightly-report'"):
        q(c, "SELECT pgque.pause_schedule('nightly-report')")
        try:
            q(c, "SELECT pgque.run_schedule_now('nightly-report')")
            raise AssertionError("a paused schedule ran")
        except psycopg2.Error as e:
            assert e.pgcode == "55000", e.pgcode
        finally:
            q(c, "SELECT pgque.resume_schedule('nightly-report')")
    # A reader reads pages but not pgque's tables, and changes nothing.
    r = psycopg2.connect(host=HOST, port=PORT, user="web_reader", password=SECRET, dbname=DB)
    r.autocommit = True
    try:
        assert len(q(r, "SELECT * FROM pgque.list_jobs(max_jobs => 5)")) == 5
        fj = ctx["flow_jobs"]
        assert one(r, "SELECT pgque.job_detail(%s) ->> 'state'", (fj["fetch"],)) == "completed"
        assert q(r, "SELECT count(*) FROM pgque.job_timeline(%s)", (fj["fetch"],))[0][0] >= 3
        assert [x[0] for x in q(r, "SELECT job_id FROM pgque.job_children(%s)", (fj["fetch"],))] == [fj["left"], fj["right"]]
        assert len(q(r, "SELECT * FROM pgque.flow_graph(%s)", (ctx["flow"],))) == 4
        for sql in ("SELECT count(*) FROM pgque.jobs", "SELECT count(*) FROM pgque.job_log",
                    "SELECT * FROM pgque.match_jobs('retry')",
                    "SELECT pgque.run_schedule_now('nightly-report')"):
            try:
                q(r, sql)
                raise AssertionError(f"a reader ran {sql}")
            except psycopg2.Error as e:
                assert e.pgcode == "42501", (sql, e.pgcode)
    finally:
        r.close()
    # A kind the newest 2,000 jobs lack: the first page ends its window with
    # the cursor row (id NULL), the next one finds the job.
    q(c, "SELECT pgque.create_job_queue('wide')")
    needle = one(c, "SELECT pgque.enqueue('wide', 'needle', '{}')")
    q(c, "SELECT count(*) FROM pgque.enqueue_ready_rows('wide', array_fill('hay'::text, ARRAY[2500]), "
         "array_fill('{}'::jsonb, ARRAY[2500]))")
    page = q(c, "SELECT id, cursor_id FROM pgque.list_jobs('wide', NULL, 'needle')")
    assert len(page) == 1 and page[0][0] is None and page[0][1] > needle, page
    page = q(c, "SELECT id, cursor_id FROM pgque.list_jobs('wide', NULL, 'needle', NULL, %s)", (page[0][1],))
    assert page == [(needle, needle)], page
    assert [r[0] for r in q(c, "SELECT * FROM pgque.match_jobs('cancel', 'wide', NULL, 'needle')")] == [needle]
    # PUBLIC may call none of them.
    assert not one(c, """SELECT bool_or(has_function_privilege('public', p.oid, 'EXECUTE'))
                         FROM pg_proc p WHERE p.pronamespace = 'pgque'::regnamespace
                          AND p.proname IN ('list_jobs', 'match_jobs', 'job_detail', 'job_timeline',
                                            'job_children', 'flow_graph', 'run_schedule_now')""")


# ---- the event browser (one queue's waiting events, open batches, dead letters) ----------
def letters_fixture(ctx):
    """Queue `letters`: 60 keyed events then 3 more; consumer `worker` gave up
    on 5 of the first (dead letters, 'bounced #<id>') and holds the 3 in an
    open batch; `slowpoke` has read nothing, so all 63 wait for it. Returns
    the queue's id. Made once per run."""
    if "letters" in ctx:
        return ctx["letters"]
    c = ctx["c"]
    q(c, "SELECT pgque.create_queue('letters')")
    q(c, "SELECT pgque.set_queue_config('letters', 'max_retries', '0')")
    q(c, "SELECT pgque.subscribe('letters', 'worker')")
    q(c, "SELECT pgque.subscribe('letters', 'slowpoke')")
    q(c, "SELECT pgque.send('letters', 'letter', jsonb_build_object('n', g, 'to', 'user' || g || '@example.test'), "
         "'k' || (g % 3)) FROM generate_series(1, 60) g")
    ticked = lambda: one(c, "SELECT ev_new = 0 FROM pgque.get_queue_info('letters')")
    wait_for("the letters' tick", ticked)
    rows = q(c, "WITH r AS MATERIALIZED (SELECT m FROM pgque.receive('letters', 'worker', 100) m) "
                "SELECT (r.m).batch_id, CASE WHEN (r.m).msg_id <= (SELECT min((x.m).msg_id) + 4 FROM r x) "
                "THEN pgque.nack((r.m).batch_id, r.m, '0 seconds', 'bounced #' || (r.m).msg_id) END FROM r")
    assert len(rows) == 60, rows
    q(c, "SELECT pgque.ack(%s)", (rows[0][0],))
    q(c, "SELECT pgque.send_batch('letters', 'late', ARRAY['l1', 'l2', 'l3'])")
    wait_for("the late letters' tick", ticked)
    assert len(q(c, "SELECT 1 FROM pgque.receive('letters', 'worker', 100)")) == 3
    ctx["letters"] = one(c, "SELECT queue_id FROM pgque.queue WHERE queue_name = 'letters'")
    return ctx["letters"]


def shown_rows(b, table, attr):
    return b.js(f"return Array.from(document.querySelectorAll('#{table} tr[data-{attr}]'))"
                f".map(r => [+r.dataset.{attr}, Array.from(r.cells).map(c => c.title || c.textContent)])")


def test_the_event_queue_page_shows_what_the_database_holds(ctx):
    b, web, c = ctx["browser"], ctx["admin"], ctx["c"]
    qid = letters_fixture(ctx)
    ensure_login(b, web, ADMIN_TOKEN)
    # The events page links each queue to its own page.
    visit(b, web, "/events")
    b.click_css("#event-queues tr[data-queue='letters'] a")
    wait_for("the queue's page", lambda: b.find("#waiting-events"))
    assert b.js("return location.pathname") == "/events/q/letters"
    errs = errors_in(b.console())
    assert not errs, errs
    shoot(b, "event-queue.png")
    # Waiting events: every event slowpoke has still to read, page after page,
    # in (transaction, id) order, each with its type, key and payload.
    want = q(c, f"SELECT ev_id, ev_type, coalesce(ev_extra1, ''), ev_data FROM pgque.event_{qid} "
                "ORDER BY ev_txid, ev_id")
    assert len(want) == 63
    pending = one(c, "SELECT pending_events FROM pgque.get_consumer_info('letters', 'slowpoke')")
    assert pending == 63, pending
    seen = []
    while True:
        rows = shown_rows(b, "waiting-events", "ev")
        assert 0 < len(rows) <= 50, len(rows)
        seen += [(i, cs[1], cs[2], cs[6]) for i, cs in rows]
        nxt = b.find("#events-next")
        if not nxt:
            break
        b.click(nxt[0])
        wait_for("the next events", lambda: "after_id=" in b.js("return location.search"))
        assert not errors_in(b.console())
    assert seen == [tuple(r) for r in want], (seen[:3], want[:3])
    # Open batches: the one worker holds, none for slowpoke.
    batches = {r[0]: r[1] for r in q(c, "SELECT consumer_name, coalesce(current_batch::text, '') "
                                        "FROM pgque.get_consumer_info('letters')")}
    assert batches["worker"] and not batches["slowpoke"], batches
    shown = b.js("return Array.from(document.querySelectorAll('#open-batches tr[data-consumer]'))"
                 ".map(r => [r.dataset.consumer, r.dataset.batch])")
    assert dict(shown) == batches, (shown, batches)
    # Dead letters, newest first, with payload and reason.
    want = q(c, "SELECT dl_id, ev_id, ev_data, dl_reason FROM pgque.dlq_inspect('letters', 50)")
    rows = shown_rows(b, "dead-letters", "dl")
    assert [(i, int(cs[5]), cs[9], cs[4]) for i, cs in rows] == [tuple(r) for r in want], rows
    assert len(want) == 5 and all(r[3] == f"bounced #{r[1]}" for r in want), want
    # Bad input: an unknown queue is a 404, a bad cursor a 400.
    assert web.get("/events/q/nosuchqueue")[0] == 404
    assert web.get("/events/q/letters?after_txid=1")[0] == 400
    assert web.get("/events/q/letters?dl_before=x")[0] == 400
    # A reader sees the page without a selection or a form.
    st, body, _ = ctx["reader"].get("/events/q/letters")
    assert st == 200 and "data-dl=" in body and "dead-form" not in body and "checkbox" not in body


def test_the_event_queue_page_shows_the_trace_headers_events_carry(ctx):
    """An event sent with headers shows them on the queue's page, escaped and
    parsed back to what was sent, among the waiting events and, once
    dead-lettered, among the dead letters; one sent without shows none."""
    b, web, c = ctx["browser"], ctx["admin"], ctx["c"]
    tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    hdrs = {"traceparent": tp, "tracestate": "v=<b>1</b>&x"}
    q(c, "SELECT pgque.create_queue('traced_letters')")
    q(c, "SELECT pgque.set_queue_config('traced_letters', 'max_retries', '0')")
    q(c, "SELECT pgque.subscribe('traced_letters', 'worker')")
    q(c, "SELECT pgque.subscribe('traced_letters', 'slowpoke')")
    traced = one(c, "SELECT pgque.send('traced_letters', 'traced', '{\"n\": 1}'::jsonb, NULL, %s::jsonb)",
                 (json.dumps(hdrs),))
    plain = one(c, "SELECT pgque.send('traced_letters', 'plain', '{\"n\": 2}'::jsonb)")
    ticked = lambda: one(c, "SELECT ev_new = 0 FROM pgque.get_queue_info('traced_letters')")
    wait_for("the traced letters' tick", ticked)
    # worker dead-letters both (max_retries 0); slowpoke keeps both waiting.
    rows = q(c, "WITH r AS MATERIALIZED (SELECT m FROM pgque.receive('traced_letters', 'worker', 10) m) "
                "SELECT (r.m).msg_id, pgque.nack((r.m).batch_id, r.m, '0 seconds', 'bounced') FROM r")
    assert sorted(r[0] for r in rows) == sorted([traced, plain]), rows
    q(c, "SELECT pgque.ack(b) FROM (SELECT current_batch b FROM pgque.get_consumer_info('traced_letters', 'worker')) x "
         "WHERE b IS NOT NULL")
    dead = dict(q(c, "SELECT ev_id, dl_id FROM pgque.dlq_inspect('traced_letters', 10)"))
    assert sorted(dead) == sorted([traced, plain]), dead
    ensure_login(b, web, ADMIN_TOKEN)
    visit_static(b, web, "/events/q/traced_letters")
    cell = "return (document.querySelector(\"#{t} tr[data-{a}='{i}'] td.headers\") || {{}})"
    for table, attr, tid, pid in (("waiting-events", "ev", traced, plain),
                                  ("dead-letters", "dl", dead[traced], dead[plain])):
        shown = b.js(cell.format(t=table, a=attr, i=tid) + ".innerHTML")
        assert shown and "<b>" not in shown, (table, shown)
        assert json.loads(b.js(cell.format(t=table, a=attr, i=tid) + ".textContent")) == hdrs, table
        assert tp in b.js(cell.format(t=table, a=attr, i=tid) + ".innerText"), table
        assert b.js(cell.format(t=table, a=attr, i=pid) + ".textContent") == "", table
        assert not b.js(f"return document.querySelector(\"#{table} tr[data-{attr}='{pid}'] td.headers pre\")")
    errs = errors_in(b.console())
    assert not errs, errs


def test_replaying_and_purging_selected_dead_letters_changes_exactly_those(ctx):
    b, web, c = ctx["browser"], ctx["admin"], ctx["c"]
    letters_fixture(ctx)
    ensure_login(b, web, ADMIN_TOKEN)
    before = [r[0] for r in q(c, "SELECT dl_id FROM pgque.dlq_inspect('letters', 50)")]
    assert len(before) >= 3, before
    pick = before[1:3]
    evs = {r[0]: r[1] for r in q(c, "SELECT dl_id, ev_id FROM pgque.dlq_inspect('letters', 50)")}
    visit_static(b, web, "/events/q/letters")
    for i in pick:
        b.click_css(f"#dead-letters input[name='ids'][value='{i}']")
    b.click_css("#dead-replay")
    wait_for("the confirmation", lambda: b.find("#confirm-count"))
    assert b.js("return document.getElementById('confirm-count').dataset.count") == "2"
    assert not errors_in(b.console())
    shoot(b, "dead-letters-confirm.png")
    # Nothing changed yet.
    assert [r[0] for r in q(c, "SELECT dl_id FROM pgque.dlq_inspect('letters', 50)")] == before
    b.click_css("#confirm")
    wait_for("the replay", lambda: "msg=" in b.js("return location.search"))
    assert "2 dead letters of letters replayed" in b.js("return document.getElementById('msg').textContent")
    after = [r[0] for r in q(c, "SELECT dl_id FROM pgque.dlq_inspect('letters', 50)")]
    assert after == [i for i in before if i not in pick], (before, pick, after)
    # Exactly those two events are redelivered to worker: in the retry queue,
    # or already back in the event table for it (the worker's maint moves
    # them; one statement sees each in one place).
    qid = ctx["letters"]
    got = sorted(r[0] for r in q(c, "WITH s AS (SELECT sub_id FROM pgque.subscription WHERE sub_queue = %s "
                                    "AND sub_consumer = 'worker') "
                                    "SELECT r.ev_id FROM pgque.retry_queue r, s WHERE r.ev_owner = s.sub_id "
                                    f"UNION ALL SELECT e.ev_id FROM pgque.event_{qid} e, s "
                                    "WHERE e.ev_owner = s.sub_id", (qid,)))
    assert got == sorted(evs[i] for i in pick), (got, pick)
    # Purge one: exactly it goes.
    visit_static(b, web, "/events/q/letters")
    gone = after[0]
    b.click_css(f"#dead-letters input[name='ids'][value='{gone}']")
    b.click_css("#dead-purge")
    wait_for("the confirmation", lambda: b.find("#confirm-count"))
    assert b.js("return document.getElementById('confirm-count').dataset.count") == "1"
    b.click_css("#confirm")
    wait_for("the purge", lambda: "msg=" in b.js("return location.search"))
    assert "1 dead letter of letters purged" in b.js("return document.getElementById('msg').textContent")
    assert [r[0] for r in q(c, "SELECT dl_id FROM pgque.dlq_inspect('letters', 50)")] == after[1:]
    assert not errors_in(b.console())
    # A stale confirmation (its letter already gone) changes nothing.
    token = web.csrf()
    left = after[1]
    st, _, h = web.request("POST", "/action/dead_purge", urllib.parse.urlencode({
        "csrf": token, "queue": "letters", "selected": f"{gone},{left}", "count": "2",
        "back": "/events/q/letters"}).encode(), {"Content-Type": "application/x-www-form-urlencoded",
                                                  "Origin": web.base})
    assert st == 303, st
    assert "nothing changed" in urllib.parse.unquote_plus(h["location"]), h["location"]
    assert [r[0] for r in q(c, "SELECT dl_id FROM pgque.dlq_inspect('letters', 50)")] == after[1:]
    # Without the CSRF token, or from a read login: refused.
    assert web.post("/events/confirm", {"op": "purge", "queue": "letters", "ids": str(left)})[0] == 403
    rd = ctx["reader"]
    assert rd.post("/action/dead_purge", {"queue": "letters", "selected": str(left), "count": "1",
                                          "csrf": rd.csrf("/events")})[0] == 403
    assert [r[0] for r in q(c, "SELECT dl_id FROM pgque.dlq_inspect('letters', 50)")] == after[1:]


def test_a_blocked_partition_key_is_shown_and_an_admin_releases_it(ctx):
    """A `pause` consumer's blocked key is on the queue's page with its failed
    event and held events; the admin's Release ends the block (and only an
    admin login with the CSRF token can)."""
    b, web, c = ctx["browser"], ctx["admin"], ctx["c"]
    q(c, "SELECT pgque.create_queue('ordered')")
    q(c, "SELECT pgque.subscribe_partitioned('ordered', 'pc', 2, failure_policy => 'pause')")
    q(c, "SELECT pgque.send('ordered', 'step', jsonb_build_object('n', g), 'k1') FROM generate_series(1, 3) g")
    wait_for("the tick", lambda: one(c, "SELECT ev_new = 0 FROM pgque.get_queue_info('ordered')"))
    slot = one(c, "SELECT pgque.partition_slot('k1', 2)")
    assert one(c, "SELECT pgque.claim_slot('ordered', 'pc', %s, 'w', '1 hour')", (slot,)) is not None
    # The first of k1's events fails: the other two are held back.
    got = one(c, "WITH r AS MATERIALIZED (SELECT m FROM pgque.receive_partitioned('ordered', 'pc', %s, 2, 'w', 10) m) "
                 "SELECT count(*) + sum(CASE WHEN (r.m).msg_id = (SELECT min((x.m).msg_id) FROM r x) THEN "
                 "pgque.nack_partitioned('ordered', 'pc', %s, 2, 'w', r.m, '1 hour', 'boom') ELSE 0 END) FROM r",
              (slot, slot))
    assert got == 4, got  # 3 received, 1 nacked
    q(c, "SELECT pgque.ack_partitioned('ordered', 'pc', %s, 2, 'w')", (slot,))
    want = q(c, "SELECT consumer, slot, partition_key, failed_event, held_events FROM pgque.partition_blocked_keys "
                "WHERE queue_name = 'ordered'")
    assert len(want) == 1 and want[0][2] == "k1" and want[0][4] == 2, want
    ensure_login(b, web, ADMIN_TOKEN)
    visit_static(b, web, "/events/q/ordered")
    rows = b.js("return Array.from(document.querySelectorAll('#blocked-keys tr[data-key]'))"
                ".map(r => Array.from(r.cells).slice(0, 7).map(c => c.textContent))")
    assert rows == [[want[0][0], str(want[0][1]), "k1", "retry", str(want[0][3]), rows[0][5], "2"]], (rows, want)
    assert not errors_in(b.console())
    # A reader sees it without a Release button; a post without the token is refused.
    st, body, _ = ctx["reader"].get("/events/q/ordered")
    assert st == 200 and 'data-key="k1"' in body and "release_key" not in body
    assert web.post("/action/release_key", {"queue": "ordered", "consumer": "pc", "key": "k1"})[0] == 403
    assert one(c, "SELECT count(*) FROM pgque.partition_blocked_keys WHERE queue_name = 'ordered'") == 1
    b.click_css("#blocked-keys tr[data-key='k1'] button.release-key")
    wait_for("the release", lambda: "msg=" in b.js("return location.search"))
    assert "released key k1 of pc" in b.js("return document.getElementById('msg').textContent")
    # Released (no open batch: at once): the failed event and the two held
    # are put back, and the marker stays, in state release, until they are
    # delivered again and acked; then k1 flows again.
    left = q(c, "SELECT state, held_events, redelivering_events FROM pgque.partition_blocked_keys "
                "WHERE queue_name = 'ordered'")
    assert left == [("release", 0, 3)], left
    assert b.js("return document.querySelector('#blocked-keys tr[data-key=k1]').cells[3].textContent") == "release"
    wait_for("the redelivery's tick", lambda: one(c, "SELECT ev_new = 0 FROM pgque.get_queue_info('ordered')"))
    again = []
    deadline = time.time() + 20
    while len(again) < 3 and time.time() < deadline:
        again += [r[0] for r in q(c, "SELECT (payload::jsonb ->> 'n')::int FROM "
                                     "pgque.receive_partitioned('ordered', 'pc', %s, 2, 'w', 10)", (slot,))]
        q(c, "SELECT pgque.ack_partitioned('ordered', 'pc', %s, 2, 'w')", (slot,))
        time.sleep(0.1)
    assert again == [1, 2, 3], again
    assert one(c, "SELECT count(*) FROM pgque.partition_blocked_keys WHERE queue_name = 'ordered'") == 0
    visit_static(b, web, "/events/q/ordered")
    assert b.find("#no-blocked-keys")


# ---- history charts (the minute rollup the worker keeps) ------------------------------
def chart_points(html, chart, series):
    """The point count of `series`' line in the chart with id `chart` (None: no line)."""
    m = re.search(r'<svg[^>]*id="' + re.escape(chart) + r'".*?</svg>', html, re.S)
    assert m, f"no chart {chart}"
    n = re.search(r'data-series="' + re.escape(series) + r'" data-n="(\d+)"', m.group(0))
    return int(n.group(1)) if n else None


def test_a_fresh_dashboard_charts_the_history_the_database_keeps(ctx):
    b, c = ctx["browser"], ctx["c"]
    # Five hours of an earlier life of job queue emails, as the worker's duty
    # writes them (one row a minute); the minutes it wrote itself stay.
    # (into the current piece: the one holding the newest row)
    q(c, "INSERT INTO pgque.metric_history (bucket, kind, queue, total, per_second, depth, lag_seconds, seg) "
         "SELECT date_trunc('minute', now()) - g * interval '1 minute', 'j', 'emails', 1000 - g, "
         "1 / 60.0, g % 7, g % 11, coalesce((SELECT seg FROM pgque.metric_history "
         "ORDER BY bucket DESC LIMIT 1), 0) FROM generate_series(2, 300) g ON CONFLICT DO NOTHING")
    count = lambda rng, col: one(c, f"SELECT count(*) FROM pgque.read_history(%s) "
                                    f"WHERE kind = 'job' AND queue = 'emails' AND {col} IS NOT NULL", (rng,))
    # A dashboard started now draws them at once.
    web = Web("web_reader", env={"PGQUE_WEB_READ_TOKEN": ENV_READ_TOKEN})
    try:
        web.login(ENV_READ_TOKEN)
        for rng, interval in (("1h", "1 hour"), ("6h", "6 hours"), ("24h", "24 hours")):
            for attempt in range(3):  # the worker may add a minute between the two reads
                st, html, _ = web.get(f"/jobs?range={rng}")
                assert st == 200, (st, html[:300])
                got = {k: chart_points(html, f"job-{k}", "emails") for k in ("throughput", "depth", "lag")}
                want = {"throughput": count(interval, "per_second"), "depth": count(interval, "depth"),
                        "lag": count(interval, "lag_seconds")}
                if got == want:
                    break
            assert got == want, (rng, got, want)
            assert f'data-range="{rng}" class="on"' in html
        assert count("6 hours", "depth") >= 299 and count("1 hour", "depth") <= 61
        # The same on the events page for an event queue the worker wrote.
        st, html, _ = web.get("/events?range=1h")
        assert st == 200 and 'id="event-depth"' in html and 'id="event-throughput"' in html
        assert "(/s)" in html and "UTC" in html
    finally:
        web.stop()
    # In the browser: the picker, a refresh in place that keeps the range.
    ensure_login(b, ctx["admin"], ADMIN_TOKEN)
    visit(b, ctx["admin"], "/jobs")
    b.click_css("#range a[data-range='6h']")
    wait_for("the 6 h range", lambda: "range=6h" in b.js("return location.search"))
    visit(b, ctx["admin"], "/jobs?range=6h")
    n = b.js("return +document.querySelector(\"#job-depth polyline[data-series='emails']\").dataset.n")
    assert n >= 299, n
    assert not errors_in(b.console())
    shoot(b, "history.png")


# ---- a hot standby ---------------------------------------------------------------
def as_postgres(*cmd):
    """Runs cmd as the postgres OS user when we are root (PostgreSQL refuses
    root); raises with its output when it fails."""
    full = ["runuser", "-u", "postgres", "--", *cmd] if os.getuid() == 0 else list(cmd)
    r = subprocess.run(full, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, (cmd, r.stdout, r.stderr)
    return r.stdout


def start_standby():
    """A hot standby of the tier's server (pg_basebackup -R, streaming):
    (data directory = socket directory, port)."""
    data = HOST.rstrip("/") + "_standby"
    port = free_port()
    if os.path.exists(os.path.join(data, "postmaster.pid")):
        subprocess.run(["runuser", "-u", "postgres", "--", f"{BINDIR}/pg_ctl", "-D", data,
                        "-m", "immediate", "stop"], capture_output=True)
    shutil.rmtree(data, ignore_errors=True)
    as_postgres(f"{BINDIR}/pg_basebackup", "-D", data, "-h", HOST, "-p", str(PORT), "-U", "postgres",
                "-R", "-X", "stream", "-c", "fast", "--no-sync")
    # -R's primary_conninfo names every option this libpq knows (some that an
    # older server's walreceiver refuses): replaced by the few it needs.
    as_postgres("sh", "-c", f"cat >> '{data}/postgresql.conf' <<'CONF'\n"
                f"port = {port}\nunix_socket_directories = '{data}'\nhot_standby = on\nCONF\n"
                f"cat >> '{data}/postgresql.auto.conf' <<'CONF'\n"
                f"primary_conninfo = 'host={HOST} port={PORT} user=postgres application_name=webstandby'\nCONF\n"
                f"rm -f '{data}/server.log'")
    as_postgres(f"{BINDIR}/pg_ctl", "-D", data, "-l", f"{data}/server.log", "-w", "start")
    return data, port


def stop_standby(data):
    subprocess.run(["runuser", "-u", "postgres", "--", f"{BINDIR}/pg_ctl", "-D", data, "-m", "fast",
                    "-w", "stop"] if os.getuid() == 0 else
                   [f"{BINDIR}/pg_ctl", "-D", data, "-m", "fast", "-w", "stop"], capture_output=True)
    shutil.rmtree(data, ignore_errors=True)


def test_a_standby_serves_every_page_read_only_and_refuses_admin_actions(ctx):
    c = ctx["c"]
    data, port = start_standby()
    web = None
    try:
        s = psycopg2.connect(host=data, port=port, user="postgres", dbname=DB)
        s.autocommit = True
        assert one(s, "SELECT pg_is_in_recovery()")
        # the standby has replayed everything the primary holds now
        lsn = one(c, "SELECT pg_current_wal_lsn()::text")
        wait_for("the standby's replay", lambda: one(
            s, "SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn", (lsn,)), timeout=30)
        failed_job = ctx["failed_job"]
        # An admin role and an admin login: the pages still offer no action.
        web = Web("web_admin", "--auth-file", ctx["auth_file"], pghost=data, pgport=port)
        web.login(ADMIN_TOKEN)
        assert "hot standby" in web.logtext(), web.logtext()
        paths = PAGES + ["/jobs?range=6h", "/events?range=24h", "/jobs/list", "/jobs/list?state=failed",
                         f"/jobs/{failed_job}", "/events/q/orders", "/events/q/mail", "/events/q/clicks",
                         "/fragment/events", "/fragment/jobs", "/fragment/worker", "/fragment/schedules"]
        for path in paths:
            st, body, _ = web.get(path)
            assert st == 200, (path, st, body[:500])
            for bad in ("SQLSTATE", '<p class="bad">'):
                i = body.find(bad)
                assert i < 0, (path, body[max(0, i - 600):i + 300])
            assert 'action="/action/' not in body and 'action="/jobs/bulk"' not in body, path
            if not path.startswith("/fragment/"):
                assert 'id="standby"' in body and "hot standby" in body, path
            if path in ("/", "/fragment/overview"):
                assert '<b class="muted">standby</b><span>background worker' in body, body
        # The figures are the standby's (the replicated queues).
        st, text, _ = web.get("/metrics")
        assert st == 200, (st, text[:300])
        got = {}
        for fam in text_string_to_metric_families(text):
            for smp in fam.samples:
                if smp.name in STABLE:
                    got[(smp.name, json.dumps(smp.labels, sort_keys=True))] = smp.value
        want = {k: v for k, v in metrics_rows(s).items() if k[0] in STABLE}
        assert got == want, set(got.items()) ^ set(want.items())
        primary = metrics_rows(c)
        for k, v in got.items():
            if k[0] in ("pgque_dead_letters", "pgque_jobs"):
                assert primary.get(k) == v, (k, v, primary.get(k))
        assert any(k[0] == "pgque_dead_letters" for k in got), got
        # Admin requests: refused, saying why, before anything is tried.
        token = web.csrf("/")
        paused = lambda: one(c, "SELECT queue_ticker_paused FROM pgque.queue WHERE queue_name = 'orders'")
        before = paused()
        job_state = lambda: one(c, "SELECT state FROM pgque.all_jobs WHERE id = %s", (failed_job,))
        job_before = job_state()
        for path, fields in (
                ("/action/pause_queue", {"queue": "orders", "csrf": token, "back": "/events"}),
                ("/action/retry_job", {"job_id": str(failed_job), "csrf": token, "back": "/jobs"}),
                ("/jobs/bulk", {"op": "retry-selected", "ids": str(failed_job), "csrf": token}),
                ("/events/confirm", {"op": "replay", "queue": "mail", "ids": "1", "csrf": token})):
            st, body = web.post(path, fields)
            assert st == 409 and "hot standby" in body, (path, st, body[:300])
        assert paused() == before
        assert job_state() == job_before
        # Nothing the dashboard did tried a write there.
        with open(os.path.join(data, "server.log")) as f:
            log = f.read()
        for bad in ("read-only transaction", "during recovery", "cannot execute"):
            assert bad not in log, (bad, log[-3000:])
        assert "failed" not in web.logtext(), web.logtext()
        s.close()
    finally:
        if web:
            web.stop()
        stop_standby(data)



# ---- who sees what (issue 42: contents, lease tokens, planted names) -------------
def test_a_read_login_sees_no_contents_and_nobody_a_lease_token(ctx):
    """A read login, on the admin dashboard (whose role is pgque_admin) and on
    the reader's, sees no job args, outputs, error texts, event or dead-letter
    payloads, headers, dead-letter reasons or schedule args on any page, is
    told they are hidden, and cannot search args and errors; an admin login
    sees them; nobody sees a lease token."""
    c = ctx["c"]
    explorer_fixture(ctx)
    letters_fixture(ctx)
    fj = ctx["flow_jobs"]
    # a running job of pgque.jobs (failed once, dispatched again) and one of the log
    q(c, "SELECT pgque.create_job_queue('tokens')")
    in_jobs = one(c, "SELECT pgque.enqueue('tokens', 'tok', '{\"to\": \"tok-secret@example.test\"}', "
                     "max_attempts => 2)")
    got = q(c, "SELECT job_id, lease_token FROM pgque.dispatch(ARRAY['tokens'], 1, 'wt', '1 hour')")
    q(c, "SELECT pgque.fail(%s, %s, 'tok-error-secret', now())", got[0])
    assert q(c, "SELECT job_id FROM pgque.dispatch(ARRAY['tokens'], 1, 'wt', '1 hour')") == [(in_jobs,)]
    in_log = one(c, "SELECT pgque.enqueue('tokens', 'tok', '{\"to\": \"tok2-secret@example.test\"}')")
    assert q(c, "SELECT job_id FROM pgque.dispatch(ARRAY['tokens'], 1, 'wt', '1 hour')") == [(in_log,)]
    for j in (in_jobs, in_log):
        assert one(c, "SELECT lease_token FROM pgque.get_job(%s)", (j,)) is not None
    failed = one(c, "SELECT pgque.enqueue('tokens', 'tok', '{\"to\": \"tok3-secret@example.test\"}', "
                    "max_attempts => 1)")
    got = q(c, "SELECT job_id, lease_token FROM pgque.dispatch(ARRAY['tokens'], 1, 'wt', '1 hour')")
    assert got[0][0] == failed, got
    q(c, "SELECT pgque.fail(%s, %s, E'tok-fail-secret\\nTraceback: tokmailer.py, line 3')", got[0])
    if one(c, "SELECT to_regclass('pgque.schedules') IS NOT NULL"):
        q(c, "SELECT pgque.create_schedule('secret-digest', '0 0 1 1 *', 'reports', 'digest', "
             "'{\"to\": \"sched-secret\"}')")
    job_pages = [f"/jobs/{j}" for j in (in_jobs, in_log, failed, fj["fetch"])]
    pages = job_pages + ["/events/q/letters", "/events", "/jobs", "/jobs/list?queue=explore",
                         "/jobs/list?queue=tokens", "/jobs/list?state=failed", "/schedules", "/"]
    # what each page holds that is contents (in the HTML, escaped or not)
    secrets = ["@example.test", "smtp timeout", "mailer.py", "bounced #", "tok-error-secret", "tok-fail-secret",
               "smtp down", "mailbox full", "sched-secret", '"rows": 3']

    def found(body, s):
        return s in body or s.replace('"', "&quot;") in body

    def no_token(who, p, body):
        assert "lease token" not in body and 'data-field="lease_token"' not in body, (who, p)

    rd = copy.copy(ctx["admin"])
    rd.login(READ_TOKEN)
    try:
        for who, web in (("a read login on the admin dashboard", rd),
                         ("the reader's dashboard", ctx["reader"])):
            for p in pages:
                st, body, _ = web.get(p)
                assert st == 200, (who, p, st, body[:300])
                leaked = [s for s in secrets if found(body, s)]
                assert not leaked, (who, p, leaked)
                no_token(who, p, body)
                if p in job_pages or p.startswith("/events/q/"):
                    assert 'data-hidden="contents"' in body, (who, p, "does not say what is hidden")
            # the search box reads args and errors: not offered, and refused
            st, body, _ = web.get("/jobs/list?queue=explore")
            assert 'id="f-q"' not in body, who
            st, body, _ = web.get("/jobs/list?q=smtp")
            assert st == 200 and 'id="list-error"' in body and "needs an admin login" in body, (who, body[:500])
            assert "data-job=" not in body, (who, "a search of a read login found jobs")
        # The admin login: the contents, and still no token.
        web = ctx["admin"]
        want = {f"/jobs/{in_jobs}": ["tok-secret@example.test", "tok-error-secret"],
                f"/jobs/{in_log}": ["tok2-secret@example.test"],
                f"/jobs/{failed}": ["tok-fail-secret", "tokmailer.py", "tok3-secret@example.test"],
                f"/jobs/{fj['fetch']}": ['"rows": 3', "2026-12-01"],
                "/events/q/letters": ["@example.test", "bounced #"],
                "/jobs/list?state=failed": ["tok-fail-secret"]}
        if one(c, "SELECT to_regclass('pgque.schedules') IS NOT NULL"):
            want["/schedules"] = ["sched-secret"]
        for p in pages:
            st, body, _ = web.get(p)
            assert st == 200, (p, st, body[:300])
            for s in want.get(p, []):
                assert found(body, s), ("an admin login does not see", s, "on", p)
            no_token("the admin login", p, body)
            if p in want:
                assert 'data-hidden="contents"' not in body, p
    finally:
        if one(c, "SELECT to_regclass('pgque.schedules') IS NOT NULL"):
            q(c, "SELECT pgque.drop_schedule('secret-digest')")


PLANTED_DB = "webtest_planted"

# What a database owner without any pgque role can plant: better or equal
# matches for the functions and operators pgque-web's statements name, each
# recording (with the session's application_name) that it ran and then
# answering as pg_catalog's would, and a database search_path that puts them
# first.
PLANTS = r"""
CREATE TABLE public.planted_calls (what text, who text, app text, at timestamptz DEFAULT pg_catalog.now());
GRANT INSERT ON public.planted_calls TO PUBLIC;
CREATE FUNCTION public.planted(w text) RETURNS void LANGUAGE sql AS $$
    INSERT INTO public.planted_calls (what, who, app)
    VALUES (w, current_user, pg_catalog.current_setting('application_name'))
$$;
CREATE FUNCTION public.to_jsonb(r record) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN PERFORM public.planted('to_jsonb(record)'); RETURN pg_catalog.to_jsonb(r); END $$;
CREATE FUNCTION public.jsonb_build_object(text, bigint, text, text, text, text, text, integer,
                                          text, timestamptz, text, text) RETURNS jsonb
LANGUAGE plpgsql AS $$
BEGIN PERFORM public.planted('jsonb_build_object(failed jobs)');
RETURN pg_catalog.jsonb_build_object($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12); END $$;
CREATE FUNCTION public.jsonb_build_object(text, text, text, jsonb) RETURNS jsonb
LANGUAGE plpgsql AS $$
BEGIN PERFORM public.planted('jsonb_build_object(schedules)');
RETURN pg_catalog.jsonb_build_object($1, $2, $3, $4); END $$;
CREATE FUNCTION public.unnest(bigint[]) RETURNS SETOF bigint LANGUAGE plpgsql AS $$
BEGIN PERFORM public.planted('unnest(bigint[])'); RETURN QUERY SELECT pg_catalog.unnest($1); END $$;
CREATE FUNCTION public.current_database() RETURNS name LANGUAGE plpgsql AS $$
BEGIN PERFORM public.planted('current_database()'); RETURN pg_catalog.current_database(); END $$;
CREATE FUNCTION public.pg_is_in_recovery() RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN PERFORM public.planted('pg_is_in_recovery()'); RETURN pg_catalog.pg_is_in_recovery(); END $$;
CREATE FUNCTION public.jget(jsonb, text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN PERFORM public.planted('->>(jsonb, text)'); RETURN $1 OPERATOR(pg_catalog.->>) $2; END $$;
CREATE OPERATOR public.->> (LEFTARG = jsonb, RIGHTARG = text, FUNCTION = public.jget);
CREATE FUNCTION public.jcat(jsonb, jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN PERFORM public.planted('||(jsonb, jsonb)'); RETURN $1 OPERATOR(pg_catalog.||) $2; END $$;
CREATE OPERATOR public.|| (LEFTARG = jsonb, RIGHTARG = jsonb, FUNCTION = public.jcat);
CREATE FUNCTION public.teq(text, text) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN PERFORM public.planted('=(text, text)'); RETURN $1 OPERATOR(pg_catalog.=) $2; END $$;
CREATE OPERATOR public.= (LEFTARG = text, RIGHTARG = text, FUNCTION = public.teq);
CREATE FUNCTION public.i4eq(int4, int4) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN PERFORM public.planted('=(int4, int4)'); RETURN $1 OPERATOR(pg_catalog.=) $2; END $$;
CREATE OPERATOR public.= (LEFTARG = int4, RIGHTARG = int4, FUNCTION = public.i4eq);
CREATE FUNCTION public.i8eq(int8, int8) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN PERFORM public.planted('=(int8, int8)'); RETURN $1 OPERATOR(pg_catalog.=) $2; END $$;
CREATE OPERATOR public.= (LEFTARG = int8, RIGHTARG = int8, FUNCTION = public.i8eq);
CREATE FUNCTION public.neq(name, name) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN PERFORM public.planted('=(name, name)'); RETURN $1 OPERATOR(pg_catalog.=) $2; END $$;
CREATE OPERATOR public.= (LEFTARG = name, RIGHTARG = name, FUNCTION = public.neq);
"""


def test_planted_names_never_run_as_the_dashboards_role(ctx):
    """A database owner with no pgque role plants public.to_jsonb(record),
    jsonb_build_object and unnest overloads and operators (->>, ||, =) that
    record their use, and puts public first on the database's search_path;
    pgque-web (role pgque_admin) pins its own path on every connection and
    qualifies every name: none of them runs on any page or admin action. The
    same statement unqualified, from a plain session of that role, runs them
    (so the plants do catch what they are meant to)."""
    a = psycopg2.connect(host=HOST, port=PORT, user="postgres", dbname="postgres")
    a.autocommit = True
    q(a, f"DROP DATABASE IF EXISTS {PLANTED_DB} WITH (FORCE)")
    q(a, "DO $r$ BEGIN CREATE ROLE web_dbowner LOGIN; EXCEPTION WHEN duplicate_object THEN NULL; END $r$")
    q(a, f"CREATE DATABASE {PLANTED_DB} OWNER web_dbowner")
    a.close()
    su = psycopg2.connect(host=HOST, port=PORT, user="postgres", dbname=PLANTED_DB)
    su.autocommit = True
    web = None
    try:
        q(su, "CREATE EXTENSION pgque")
        q(su, "SELECT pgque.create_queue('pq')")
        q(su, "SELECT pgque.set_queue_config('pq', 'max_retries', '0')")
        q(su, "SELECT pgque.subscribe('pq', 'c1')")
        q(su, "SELECT pgque.subscribe('pq', 'c2')")
        q(su, "SELECT pgque.send('pq', 't', '{\"p\": 1}'::jsonb, 'k1')")
        q(su, "SELECT pgque.force_tick('pq')")
        rows = q(su, "SELECT pgque.nack(m.batch_id, m, '0 seconds', 'planted-reason'), m.batch_id "
                     "FROM pgque.receive('pq', 'c1', 10) m")
        q(su, "SELECT pgque.ack(%s)", (rows[0][1],))
        q(su, "SELECT pgque.create_job_queue('pj')")
        q(su, "SELECT pgque.enqueue('pj', 'k', jsonb_build_object('n', g), max_attempts => 1) "
              "FROM generate_series(1, 4) g")
        got = q(su, "SELECT job_id, lease_token FROM pgque.dispatch(ARRAY['pj'], 2, 'w', '1 hour')")
        q(su, "SELECT pgque.fail(%s, %s, 'planted-error')", got[0])
        failed, running = got[0][0], got[1][0]
        flow = one(su, """SELECT flow_id FROM pgque.enqueue_flow('pj', '[{"key": "a", "kind": "f"},
                          {"key": "b", "kind": "g", "depends_on": ["a"]}]') LIMIT 1""")
        schedules = one(su, "SELECT to_regproc('pgque.run_schedules') IS NOT NULL")
        if schedules:
            q(su, "SELECT pgque.create_schedule('ps', '0 3 * * *', 'pj', 'k', '{\"a\": 1}')")
        o = psycopg2.connect(host=HOST, port=PORT, user="web_dbowner", dbname=PLANTED_DB)
        o.autocommit = True
        q(o, PLANTS)
        q(o, f"ALTER DATABASE {PLANTED_DB} SET search_path = public, pg_catalog")
        o.close()
        # the plants catch an unqualified statement of the dashboard's role
        w = psycopg2.connect(host=HOST, port=PORT, user="web_admin", password=SECRET, dbname=PLANTED_DB,
                             application_name="plant-check")
        w.autocommit = True
        q(w, "SELECT to_jsonb(s) FROM pgque.status() s")
        q(w, "SELECT q.queue_name FROM pgque.queue q WHERE q.queue_name = 'pq'")
        w.close()
        caught = {r[0] for r in q(su, "SELECT what FROM public.planted_calls WHERE app = 'plant-check'")}
        assert {"to_jsonb(record)", "=(text, text)"} <= caught, caught

        web = Web("web_admin", "--auth-file", ctx["auth_file"], db=PLANTED_DB)
        web.login(ADMIN_TOKEN)
        paths = ["/", "/events", "/jobs", "/schedules", "/worker", "/jobs/list", "/jobs/list?q=planted",
                 "/jobs/list?queue=pj&state=failed", f"/jobs/{failed}", f"/jobs/{running}", f"/flows/{flow}",
                 "/events/q/pq", "/metrics", "/fragment/overview", "/fragment/jobs", "/fragment/events",
                 "/fragment/schedules", "/fragment/joblist"]
        # (a planted object that ran can also break a page: its calls are
        # reported first, the pages' answers after)
        answers = [(p, web.get(p)) for p in paths]
        ran = q(su, "SELECT DISTINCT what FROM public.planted_calls WHERE app = 'pgque-web'")
        assert not ran, f"planted objects ran as pgque-web's role on its pages: {ran}"
        for p, (st, body, _) in answers:
            assert st == 200, (p, st, body[:400])
        token = web.csrf("/jobs")
        dl = [r[0] for r in q(su, "SELECT dl_id FROM pgque.dead_letter")]
        actions = [("/action/pause_queue", {"queue": "pq"}), ("/action/resume_queue", {"queue": "pq"}),
                   ("/action/pause_job_queue", {"queue": "pj"}), ("/action/resume_job_queue", {"queue": "pj"}),
                   ("/action/retry_job", {"job_id": str(failed)}), ("/action/cancel_job", {"job_id": str(running)}),
                   ("/events/confirm", {"queue": "pq", "op": "replay", "ids": str(dl[0])}),
                   ("/action/dead_replay", {"queue": "pq", "selected": str(dl[0]), "count": "1"}),
                   ("/jobs/bulk", {"op": "cancel-filter", "queue": "pj"}),
                   ("/action/replay_dead_letters", {"queue": "pq"})]
        if schedules:
            actions += [("/action/pause_schedule", {"schedule": "ps"}),
                        ("/action/resume_schedule", {"schedule": "ps"}),
                        ("/action/run_schedule", {"schedule": "ps"})]
        for path, fields in actions:
            st, body = web.post(path, {**fields, "csrf": token, "back": "/"})
            assert st in (200, 303), (path, st, body[:400])
        # the bulk cancel, confirmed with the digest its page gave
        st, body = web.post("/jobs/bulk", {"op": "cancel-filter", "queue": "pj", "csrf": token})
        digest = re.search(r'name="digest" value="([0-9a-f]{64})"', body).group(1)
        st, body = web.post("/action/bulk_cancel", {"queue": "pj", "digest": digest, "csrf": token,
                                                    "back": "/jobs/list"})
        assert st == 303, (st, body[:300])
        assert one(su, "SELECT count(*) FROM pgque.all_jobs WHERE queue = 'pj' AND state = 'cancelled'") > 1
        ran = q(su, "SELECT what, who FROM public.planted_calls WHERE app = 'pgque-web'")
        assert not ran, f"planted objects ran as pgque-web's role: {ran}"
    finally:
        if web:
            web.stop()
        su.close()
        a = psycopg2.connect(host=HOST, port=PORT, user="postgres", dbname="postgres")
        a.autocommit = True
        q(a, f"DROP DATABASE IF EXISTS {PLANTED_DB} WITH (FORCE)")
        a.close()


TESTS = [
    test_metrics_endpoint_equals_pgque_metrics,
    test_monitoring_files_use_only_exported_names,
    test_every_page_renders_without_console_errors_and_shows_the_figures,
    test_pages_refresh_in_place,
    test_forged_posts_are_refused,
    test_a_foreign_host_is_refused,
    test_without_a_session_pages_ask_for_a_login_and_posts_are_refused,
    test_a_read_login_cannot_pause_a_queue,
    test_admin_actions_through_the_browser_change_the_database,
    test_an_admin_login_in_the_browser_pauses_a_queue_and_logout_ends_it,
    test_a_reader_sees_no_actions_and_cannot_post,
    test_startup_refuses_a_login_without_credentials,
    test_logins_back_off_and_the_cookie_is_secure_behind_tls,
    test_the_chart_history_is_capped,
    test_help_documents_every_flag,
    test_the_jobs_list_shows_what_the_database_holds,
    test_a_job_page_and_a_flow_page_show_what_the_database_holds,
    test_bulk_actions_change_exactly_the_jobs_confirmed,
    test_the_schedules_page_fires_pauses_and_resumes,
    test_the_schedules_page_shows_each_schedules_recent_firings,
    test_a_reader_sees_the_explorer_without_actions,
    test_list_jobs_pages_match_all_jobs_and_bad_input_is_refused,
    test_the_event_queue_page_shows_what_the_database_holds,
    test_the_event_queue_page_shows_the_trace_headers_events_carry,
    test_replaying_and_purging_selected_dead_letters_changes_exactly_those,
    test_a_blocked_partition_key_is_shown_and_an_admin_releases_it,
    test_a_fresh_dashboard_charts_the_history_the_database_keeps,
    test_a_standby_serves_every_page_read_only_and_refuses_admin_actions,
    test_a_read_login_sees_no_contents_and_nobody_a_lease_token,
    test_planted_names_never_run_as_the_dashboards_role,
]


def main():
    pick = sys.argv[1] if len(sys.argv) > 1 else ""
    tests = [t for t in TESTS if pick in t.__name__]
    started = time.time()
    ctx = {"failed_job": make_database()}
    ctx["c"] = connect()
    ctx["tmp"] = tempfile.mkdtemp(prefix="pgque_webtest_")
    auth_file = ctx["auth_file"] = os.path.join(ctx["tmp"], "auth")
    fd = os.open(auth_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(f"# the web tier's logins\nadmin:alice:{ADMIN_TOKEN}\nread:bob:{READ_TOKEN}\n")
    ctx["admin"] = Web("web_admin", "--auth-file", auth_file)
    ctx["admin"].login(ADMIN_TOKEN)
    ctx["reader"] = Web("web_reader", env={"PGQUE_WEB_READ_TOKEN": ENV_READ_TOKEN})
    ctx["reader"].login(ENV_READ_TOKEN)
    ctx["browser"] = Browser()
    # Two samples, so the charts have lines.
    time.sleep(1)
    passed = failed = 0
    try:
        for t in tests:
            t0 = time.time()
            try:
                t(ctx)
                passed += 1
                print(f"ok   {t.__name__} ({time.time() - t0:.1f} s)", flush=True)
            except Exception:
                failed += 1
                print(f"FAIL {t.__name__}", flush=True)
                traceback.print_exc()
    finally:
        ctx["browser"].quit()
        for w in ("admin", "reader"):
            if failed:
                print(f"---- pgque-web ({w}) log:\n{ctx[w].logtext()}")
            ctx[w].stop()
        shutil.rmtree(ctx["tmp"], ignore_errors=True)
    print(f"webtest: {time.time() - started:.0f} s")
    # libtest's closing line too, so .ci/run's summary counts these tests
    print(f"test result: {'FAILED' if failed else 'ok'}. {passed} passed; {failed} failed; 0 ignored")
    print(f"{passed} passed, {failed} failed")
    sys.exit(1 if failed or not tests else 0)


if __name__ == "__main__":
    main()
