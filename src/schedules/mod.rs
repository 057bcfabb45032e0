//! Schedules: periodic jobs, fired by the database's worker (or by any
//! scheduler calling `pgque.run_schedules()` in manual mode).
//!
//! - `cron`  the cron grammar and slot arithmetic (pure Rust, time zones)
//!
//! Exactly once per slot, by construction: `run_schedules()` locks each due
//! schedule row (FOR UPDATE SKIP LOCKED; a concurrent caller skips it, and
//! one that comes after the commit re-checks `next_run_at <= now()` on the
//! new row version and leaves it), enqueues the slot's job and advances
//! `next_run_at` in the same transaction. A crash before the commit leaves
//! neither; after it, both.
//!
//! The table is in `sql/32_schedules.sql`; user documentation in
//! docs/schedules.md.
use crate::error::{self, raise, required, valid_name};
use crate::jobs::log::stmt::{prepared, ty, with_generic_plans};
use pgrx::prelude::*;
use pgrx::{pg_sys, JsonB};
use std::sync::atomic::{AtomicI64, Ordering};

pub mod cron;

extension_sql_file!(
    "../../sql/32_schedules.sql",
    name = "schedules",
    requires = ["job_log"]
);

/// Longest schedule name.
pub const MAX_SCHEDULE_NAME: usize = 200;
/// Most schedules one `run_schedules()` call fires (one transaction); when
/// more are due the worker calls it again at once.
pub const RUN_BATCH: i64 = 1000;

/// Seconds between the Unix epoch and PostgreSQL's (2000-01-01).
const PG_EPOCH_UNIX: i64 = 946_684_800;

/// now() of the statements, in whole Unix seconds (rounded down: slots are
/// whole seconds, so `slot <= now()` iff `slot <= floor(now())`).
fn now_unix() -> i64 {
    let us = unsafe { pg_sys::GetCurrentTransactionStartTimestamp() };
    us.div_euclid(1_000_000) + PG_EPOCH_UNIX
}

/// The next slot due, as Unix seconds, as the last `run_schedules()` in this
/// process left it: i64::MAX when no active schedule exists, i64::MIN before
/// the first run. Read by the worker (same process) to sleep no longer.
static NEXT_DUE: AtomicI64 = AtomicI64::new(i64::MIN);

/// How long until the next slot is due, per the last `run_schedules()` in
/// this process (None: not known, or nothing scheduled).
pub fn until_next_due() -> Option<std::time::Duration> {
    let due = NEXT_DUE.load(Ordering::Relaxed);
    if due == i64::MIN || due == i64::MAX {
        return None;
    }
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .ok()?;
    let due = std::time::Duration::from_secs(due.max(0) as u64);
    Some(due.saturating_sub(now))
}

fn check_cron(text: &str) -> cron::Cron {
    cron::Cron::parse(text).unwrap_or_else(|e| {
        raise(
            pgrx::PgSqlErrorCode::ERRCODE_INVALID_DATETIME_FORMAT,
            format!("invalid cron expression {text:?}: {e}"),
        )
    })
}

fn check_zone(name: &str) -> chrono_tz::Tz {
    cron::zone(name).unwrap_or_else(|e| raise(error::INVALID_PARAMETER_VALUE, e))
}

fn check_misfire(m: &str) {
    if m != "skip" && m != "catch_up" {
        raise(
            error::INVALID_PARAMETER_VALUE,
            format!("misfire must be 'skip' or 'catch_up', not {m:?}"),
        );
    }
}

fn check_kind(kind: &str) {
    if kind.is_empty() {
        raise(error::INVALID_PARAMETER_VALUE, "kind must not be empty");
    }
}

fn check_args(args: &JsonB) {
    if !args.0.is_object() {
        raise(
            error::INVALID_PARAMETER_VALUE,
            "args must be a JSON object (the fired job's args get its slot time as \"scheduled_for\")",
        );
    }
}

/// The first slot after now, or 22023 when the expression never fires.
fn first_slot(c: &cron::Cron, tz: &chrono_tz::Tz, text: &str) -> i64 {
    cron::next_after(c, tz, now_unix()).unwrap_or_else(|| {
        raise(
            error::INVALID_PARAMETER_VALUE,
            format!("cron expression {text:?} names no time in the next years"),
        )
    })
}

fn require_job_queue(queue: &str) {
    crate::jobs::queues::require_queue(queue);
}

/// Creates a schedule: from now on, each slot of `cron` (in `timezone`)
/// enqueues one job (`kind`, `args` plus `scheduled_for`, `priority`,
/// `max_attempts`) into job queue `queue_name`. Returns the schedule id.
/// Touches pgque.schedules_def.
#[allow(clippy::too_many_arguments)]
#[pg_extern(security_definer)]
#[search_path(pg_catalog, pgque, pg_temp)]
fn create_schedule(
    name: Option<&str>,
    cron: Option<&str>,
    queue_name: Option<&str>,
    kind: Option<&str>,
    args: default!(Option<JsonB>, "'{}'"),
    timezone: default!(Option<&str>, "'UTC'"),
    priority: default!(Option<i32>, 0),
    misfire: default!(Option<&str>, "'skip'"),
    max_attempts: default!(Option<i32>, "NULL"),
) -> i64 {
    // an idle worker reads the next slot again (schedules duty)
    crate::wake::recheck_at_commit();
    let name = valid_name(name, "name", MAX_SCHEDULE_NAME);
    let cron_text = required(cron, "cron");
    let queue = valid_name(queue_name, "queue_name", error::MAX_QUEUE_NAME);
    let kind = required(kind, "kind");
    check_kind(kind);
    let args = required(args, "args");
    check_args(&args);
    let tz_name = required(timezone, "timezone");
    let priority = required(priority, "priority");
    crate::jobs::args::check_priority(priority);
    let misfire = required(misfire, "misfire");
    check_misfire(misfire);
    if let Some(m) = max_attempts {
        crate::jobs::args::check_max_attempts(m);
    }
    let c = check_cron(cron_text);
    let tz = check_zone(tz_name);
    require_job_queue(queue);
    let next = first_slot(&c, &tz, cron_text);
    let id = Spi::get_one_with_args::<i64>(
        "INSERT INTO pgque.schedules_def (name, cron, timezone, queue_name, kind, args, priority,
                                          misfire, max_attempts, next_run_at)
         VALUES ($1, $2, $3, $4, $5, $6, $7::smallint, $8, $9, pg_catalog.to_timestamp($10))
         ON CONFLICT (name) DO NOTHING
         RETURNING schedule_id",
        &[
            name.into(),
            cron_text.into(),
            tz_name.into(),
            queue.into(),
            kind.into(),
            args.into(),
            priority.into(),
            misfire.into(),
            max_attempts.into(),
            (next as f64).into(),
        ],
    );
    // no row back: the name was taken (SPI reports an empty result as InvalidPosition)
    let id = match id {
        Ok(v) => v,
        Err(pgrx::spi::SpiError::InvalidPosition) => None,
        Err(e) => pgrx::error!("{e}"),
    };
    match id {
        Some(id) => id,
        None => raise(
            error::DUPLICATE_OBJECT,
            format!("schedule {name:?} exists already"),
        ),
    }
}

/// Locks schedule `name`'s row; 42704 if there is none. Returns (cron,
/// timezone, queue_name, paused).
fn lock_schedule(name: &str) -> (String, String, String, bool) {
    let row = Spi::connect_mut(|c| {
        let t = c
            .update(
                "SELECT cron, timezone, queue_name, paused FROM pgque.schedules_def
                 WHERE name = $1 FOR UPDATE",
                Some(1),
                &[name.into()],
            )
            .unwrap_or_else(|e| pgrx::error!("{e}"));
        if t.is_empty() {
            return None;
        }
        let r = t.first();
        Some((
            r.get::<String>(1).ok().flatten().unwrap_or_default(),
            r.get::<String>(2).ok().flatten().unwrap_or_default(),
            r.get::<String>(3).ok().flatten().unwrap_or_default(),
            r.get::<bool>(4).ok().flatten().unwrap_or(false),
        ))
    });
    row.unwrap_or_else(|| {
        raise(
            error::UNDEFINED_OBJECT,
            format!("schedule {name:?} does not exist"),
        )
    })
}

/// Changes a schedule; each NULL argument leaves its setting as it is. A new
/// cron or time zone starts the schedule afresh from now (slots not yet fired
/// under the old rule are not fired). Touches pgque.schedules_def.
#[allow(clippy::too_many_arguments)]
#[pg_extern(security_definer)]
#[search_path(pg_catalog, pgque, pg_temp)]
fn alter_schedule(
    name: Option<&str>,
    cron: default!(Option<&str>, "NULL"),
    queue_name: default!(Option<&str>, "NULL"),
    kind: default!(Option<&str>, "NULL"),
    args: default!(Option<JsonB>, "NULL"),
    timezone: default!(Option<&str>, "NULL"),
    priority: default!(Option<i32>, "NULL"),
    misfire: default!(Option<&str>, "NULL"),
    max_attempts: default!(Option<i32>, "NULL"),
) {
    // an idle worker reads the next slot again (schedules duty)
    crate::wake::recheck_at_commit();
    let name = valid_name(name, "name", MAX_SCHEDULE_NAME);
    if let Some(c) = cron {
        check_cron(c);
    }
    if let Some(t) = timezone {
        check_zone(t);
    }
    let queue = queue_name.map(|q| valid_name(Some(q), "queue_name", error::MAX_QUEUE_NAME));
    if let Some(k) = kind {
        check_kind(k);
    }
    if let Some(a) = &args {
        check_args(a);
    }
    if let Some(p) = priority {
        crate::jobs::args::check_priority(p);
    }
    if let Some(m) = misfire {
        check_misfire(m);
    }
    if let Some(m) = max_attempts {
        crate::jobs::args::check_max_attempts(m);
    }
    let (old_cron, old_tz, _, _) = lock_schedule(name);
    if let Some(q) = queue {
        require_job_queue(q);
    }
    let retimed = cron.is_some_and(|c| c != old_cron) || timezone.is_some_and(|t| t != old_tz);
    let next: Option<f64> = retimed.then(|| {
        let text = cron.unwrap_or(&old_cron);
        let c = check_cron(text);
        let tz = check_zone(timezone.unwrap_or(&old_tz));
        first_slot(&c, &tz, text) as f64
    });
    Spi::run_with_args(
        "UPDATE pgque.schedules_def SET
             cron = coalesce($2, cron), timezone = coalesce($3, timezone),
             queue_name = coalesce($4, queue_name), kind = coalesce($5, kind),
             args = coalesce($6, args), priority = coalesce($7::smallint, priority),
             misfire = coalesce($8, misfire), max_attempts = coalesce($9, max_attempts),
             next_run_at = coalesce(pg_catalog.to_timestamp($10), next_run_at)
         WHERE name = $1",
        &[
            name.into(),
            cron.into(),
            timezone.into(),
            queue.into(),
            kind.into(),
            args.into(),
            priority.into(),
            misfire.into(),
            max_attempts.into(),
            next.into(),
        ],
    )
    .unwrap_or_else(|e| pgrx::error!("{e}"));
}

/// Stops a schedule from firing (its next slots are not fired, also not
/// after resume_schedule). Touches pgque.schedules_def.
#[pg_extern(security_definer)]
#[search_path(pg_catalog, pgque, pg_temp)]
fn pause_schedule(name: Option<&str>) {
    let name = valid_name(name, "name", MAX_SCHEDULE_NAME);
    lock_schedule(name);
    Spi::run_with_args(
        "UPDATE pgque.schedules_def SET paused = true WHERE name = $1 AND NOT paused",
        &[name.into()],
    )
    .unwrap_or_else(|e| pgrx::error!("{e}"));
}

/// Lets a paused schedule fire again, from its first slot after now (the
/// slots that passed while it was paused are not fired). A schedule that is
/// not paused is left as it is. 42704 if its job queue no longer exists.
#[pg_extern(security_definer)]
#[search_path(pg_catalog, pgque, pg_temp)]
fn resume_schedule(name: Option<&str>) {
    // an idle worker reads the next slot again (schedules duty)
    crate::wake::recheck_at_commit();
    let name = valid_name(name, "name", MAX_SCHEDULE_NAME);
    let (cron_text, tz_name, queue, paused) = lock_schedule(name);
    if !paused {
        return;
    }
    require_job_queue(&queue);
    let next = first_slot(&check_cron(&cron_text), &check_zone(&tz_name), &cron_text);
    Spi::run_with_args(
        "UPDATE pgque.schedules_def SET paused = false, next_run_at = pg_catalog.to_timestamp($2)
         WHERE name = $1",
        &[name.into(), (next as f64).into()],
    )
    .unwrap_or_else(|e| pgrx::error!("{e}"));
}

/// Drops a schedule (jobs it fired stay). Returns true; 42704 if unknown.
#[pg_extern(security_definer)]
#[search_path(pg_catalog, pgque, pg_temp)]
fn drop_schedule(name: Option<&str>) -> bool {
    let name = valid_name(name, "name", MAX_SCHEDULE_NAME);
    let gone = Spi::get_one_with_args::<bool>(
        "DELETE FROM pgque.schedules_def WHERE name = $1 RETURNING true",
        &[name.into()],
    )
    .unwrap_or(None);
    if gone.is_none() {
        raise(
            error::UNDEFINED_OBJECT,
            format!("schedule {name:?} does not exist"),
        );
    }
    true
}

/// The due schedules, locked; a row another caller holds is skipped (it is
/// that caller's to fire). Through schedules_due: no row is read that is not
/// due.
const DUE_SQL: &str = "
SELECT s.schedule_id, s.cron, s.timezone, s.queue_name, s.priority::int, s.misfire,
       EXTRACT(epoch FROM s.next_run_at)::bigint,
       EXISTS (SELECT 1 FROM pgque.job_queues q WHERE q.queue_name = s.queue_name)
FROM pgque.schedules_def s
WHERE s.next_run_at <= pg_catalog.now() AND NOT s.paused
ORDER BY s.next_run_at
LIMIT $1
FOR UPDATE OF s SKIP LOCKED";

/// One schedule's due slots ($2, RFC 3339 texts, ascending) as one batch of
/// ordinary jobs; returns the last job's id (ids follow input order).
const FIRE_SQL: &str = "
SELECT max(r.job_id)
FROM pgque.schedules_def s
CROSS JOIN LATERAL (
    SELECT pg_catalog.array_agg(s.args || pg_catalog.jsonb_build_object('scheduled_for', u.sf)
                                ORDER BY u.o) AS args,
           pg_catalog.count(*)::int AS n
    FROM pg_catalog.unnest($2::text[]) WITH ORDINALITY AS u(sf, o)) a
CROSS JOIN LATERAL pgque.enqueue_ready_rows(
    s.queue_name,
    pg_catalog.array_fill(s.kind, ARRAY[a.n]),
    a.args,
    pg_catalog.array_fill(s.priority, ARRAY[a.n]),
    NULL, NULL, NULL, NULL, NULL,
    CASE WHEN s.max_attempts IS NOT NULL THEN pg_catalog.array_fill(s.max_attempts, ARRAY[a.n]) END,
    'skip') r
WHERE s.schedule_id = $1";

/// The fired schedules' new positions, in one statement, each with the job
/// it fired in front of its recent ones (at most 10 kept). A next of NULL
/// (the expression names no further time) pauses the schedule.
const ADVANCE_SQL: &str = "
UPDATE pgque.schedules_def s
SET next_run_at = coalesce(pg_catalog.to_timestamp(u.next), s.next_run_at),
    paused = s.paused OR u.next IS NULL,
    last_run_at = coalesce(pg_catalog.to_timestamp(u.last), s.last_run_at),
    last_job_id = coalesce(u.job, s.last_job_id),
    recent_job_ids = CASE WHEN u.job IS NULL THEN s.recent_job_ids
                          ELSE (u.job || s.recent_job_ids)[1:10] END
FROM unnest($1::bigint[], $2::bigint[], $3::bigint[], $4::bigint[]) AS u(id, next, last, job)
WHERE s.schedule_id = u.id";

const NEXT_DUE_SQL: &str = "
SELECT EXTRACT(epoch FROM s.next_run_at)::bigint
FROM pgque.schedules_def s WHERE NOT s.paused ORDER BY s.next_run_at LIMIT 1";

struct Due {
    id: i64,
    cron: String,
    tz: String,
    queue: String,
    priority: i32,
    misfire: String,
    next: i64,
    queue_exists: bool,
}

/// The schedules duty: fires every due slot of up to RUN_BATCH schedules
/// (per schedule, misfire `skip`: only the latest missed slot; `catch_up`:
/// every missed slot, at most cron::CATCH_UP_MAX), each slot as one ordinary
/// job whose args carry `scheduled_for`, and advances the schedules in the
/// same transaction. A schedule whose job queue is gone, or that names no
/// further time, is paused. Returns the number of jobs enqueued. Touches
/// pgque.schedules_def and, through enqueue_ready_rows, the job tables.
#[pg_extern(security_definer, parallel_unsafe)]
#[search_path(pg_catalog, pgque, pg_temp)]
fn run_schedules() -> i32 {
    let now = now_unix();
    let mut fired = 0i32;
    let mut hit_batch_limit = false;
    with_generic_plans(|| {
        Spi::connect_mut(|client| {
            let due_stmt = prepared(client, DUE_SQL, &[ty(pg_sys::INT8OID)]);
            let mut due: Vec<Due> = Vec::new();
            let table = client
                .update(due_stmt, None, &[RUN_BATCH.into()])
                .unwrap_or_else(|e| pgrx::error!("{e}"));
            for r in table {
                due.push(Due {
                    id: r.get::<i64>(1).ok().flatten().unwrap_or(0),
                    cron: r.get::<String>(2).ok().flatten().unwrap_or_default(),
                    tz: r.get::<String>(3).ok().flatten().unwrap_or_default(),
                    queue: r.get::<String>(4).ok().flatten().unwrap_or_default(),
                    priority: r.get::<i32>(5).ok().flatten().unwrap_or(0),
                    misfire: r.get::<String>(6).ok().flatten().unwrap_or_default(),
                    next: r.get::<i64>(7).ok().flatten().unwrap_or(now),
                    queue_exists: r.get::<bool>(8).ok().flatten().unwrap_or(false),
                });
            }
            hit_batch_limit = due.len() as i64 >= RUN_BATCH;
            // Enqueue takes lane locks held to commit: in (queue, priority)
            // order, so that two callers firing different schedules of the
            // same lanes never wait on each other in a cycle.
            due.sort_by(|a, b| (&a.queue, a.priority, a.id).cmp(&(&b.queue, b.priority, b.id)));
            let fire_stmt = prepared(
                client,
                FIRE_SQL,
                &[ty(pg_sys::INT8OID), ty(pg_sys::TEXTARRAYOID)],
            );
            let (mut ids, mut nexts, mut lasts, mut jobs) = (vec![], vec![], vec![], vec![]);
            for d in &due {
                let parsed = cron::Cron::parse(&d.cron).ok().zip(cron::zone(&d.tz).ok());
                let (c, tz) = match (d.queue_exists, parsed) {
                    (true, Some(p)) => p,
                    _ => {
                        pgrx::warning!(
                            "pgque: schedule {} paused: its job queue {:?} does not exist (or its cron or time zone is no longer understood)",
                            d.id,
                            d.queue
                        );
                        ids.push(d.id);
                        nexts.push(None::<i64>);
                        lasts.push(None::<i64>);
                        jobs.push(None::<i64>);
                        continue;
                    }
                };
                let keep = if d.misfire == "catch_up" {
                    cron::CATCH_UP_MAX
                } else {
                    1
                };
                let slots = cron::due_slots(&c, &tz, d.next, now, keep);
                let last_slot = slots.last().copied();
                let job = if slots.is_empty() {
                    None
                } else {
                    let texts: Vec<String> = slots.iter().map(|s| cron::rfc3339(*s)).collect();
                    let job = client
                        .update(fire_stmt, None, &[d.id.into(), texts.into()])
                        .unwrap_or_else(|e| pgrx::error!("{e}"))
                        .first()
                        .get_one::<i64>()
                        .unwrap_or(None);
                    fired += slots.len() as i32;
                    job
                };
                ids.push(d.id);
                nexts.push(cron::next_after(&c, &tz, last_slot.unwrap_or(now).max(now)));
                lasts.push(last_slot);
                jobs.push(job);
            }
            if !ids.is_empty() {
                let adv = prepared(
                    client,
                    ADVANCE_SQL,
                    &[
                        ty(pg_sys::INT8ARRAYOID),
                        ty(pg_sys::INT8ARRAYOID),
                        ty(pg_sys::INT8ARRAYOID),
                        ty(pg_sys::INT8ARRAYOID),
                    ],
                );
                client
                    .update(
                        adv,
                        None,
                        &[ids.into(), nexts.into(), lasts.into(), jobs.into()],
                    )
                    .unwrap_or_else(|e| pgrx::error!("{e}"));
            }
            let next_stmt = prepared(client, NEXT_DUE_SQL, &[]);
            let next_due = client
                .update(next_stmt, None, &[])
                .ok()
                .and_then(|t| t.first().get_one::<i64>().ok().flatten())
                .unwrap_or(i64::MAX);
            NEXT_DUE.store(
                if hit_batch_limit { now } else { next_due },
                Ordering::Relaxed,
            );
        })
    });
    fired
}

#[cfg(any(test, feature = "pg_test"))]
#[pg_schema]
mod tests {
    use pgrx::prelude::*;

    fn setup() {
        Spi::run("SELECT pgque.create_job_queue('sq')").unwrap();
    }

    #[pg_test]
    fn create_schedule_sets_the_first_slot_after_now() {
        setup();
        let id = Spi::get_one::<i64>(
            "SELECT pgque.create_schedule('every-minute', '* * * * *', 'sq', 'tick')",
        )
        .unwrap()
        .unwrap();
        assert!(id > 0);
        let ok = Spi::get_one::<bool>(
            "SELECT next_run_at > now() AND next_run_at <= now() + interval '1 minute'
                    AND extract(second FROM next_run_at) = 0 AND NOT paused
               FROM pgque.schedules WHERE name = 'every-minute'",
        )
        .unwrap()
        .unwrap();
        assert!(ok);
    }

    #[pg_test]
    fn run_schedules_fires_one_job_per_due_slot_and_advances() {
        setup();
        Spi::run("SELECT pgque.create_schedule('m', '* * * * *', 'sq', 'tick', '{\"a\": 1}')")
            .unwrap();
        Spi::run(
            "SELECT pgque.create_schedule('c', '* * * * *', 'sq', 'cu', misfire => 'catch_up')",
        )
        .unwrap();
        // nothing due yet
        assert_eq!(
            Spi::get_one::<i32>("SELECT pgque.run_schedules()").unwrap(),
            Some(0)
        );
        // pretend both were due five minutes ago (slots at whole minutes)
        Spi::run(
            "UPDATE pgque.schedules_def SET next_run_at = date_trunc('minute', now()) - interval '5 minutes'",
        )
        .unwrap();
        // skip: one job (the latest slot); catch_up: six (5 minutes ago .. now's minute)
        assert_eq!(
            Spi::get_one::<i32>("SELECT pgque.run_schedules()").unwrap(),
            Some(7)
        );
        assert_eq!(
            Spi::get_one::<i32>("SELECT pgque.run_schedules()").unwrap(),
            Some(0)
        );
        let skip_ok = Spi::get_one::<bool>(
            "SELECT count(*) = 1 AND bool_and((args->>'a') = '1')
                    AND bool_and((args->>'scheduled_for')::timestamptz = date_trunc('minute', now()))
               FROM pgque.all_jobs WHERE kind = 'tick'",
        )
        .unwrap()
        .unwrap();
        assert!(skip_ok);
        let cu = Spi::get_one::<i64>(
            "SELECT count(DISTINCT args->>'scheduled_for') FROM pgque.all_jobs WHERE kind = 'cu'",
        )
        .unwrap()
        .unwrap();
        assert_eq!(cu, 6);
        let view_ok = Spi::get_one::<bool>(
            "SELECT bool_and(s.next_run_at = date_trunc('minute', now()) + interval '1 minute'
                             AND s.last_run_at = date_trunc('minute', now())
                             AND s.last_job_id = (SELECT max(j.id) FROM pgque.all_jobs j WHERE j.kind = s.kind))
               FROM pgque.schedules s",
        )
        .unwrap()
        .unwrap();
        assert!(view_ok);
    }

    #[pg_test]
    fn paused_schedules_do_not_fire_and_resume_starts_after_now() {
        setup();
        Spi::run("SELECT pgque.create_schedule('p', '* * * * *', 'sq', 'tick')").unwrap();
        Spi::run("SELECT pgque.pause_schedule('p')").unwrap();
        Spi::run("UPDATE pgque.schedules_def SET next_run_at = now() - interval '1 hour'").unwrap();
        assert_eq!(
            Spi::get_one::<i32>("SELECT pgque.run_schedules()").unwrap(),
            Some(0)
        );
        Spi::run("SELECT pgque.resume_schedule('p')").unwrap();
        let after = Spi::get_one::<bool>(
            "SELECT next_run_at > now() AND NOT paused FROM pgque.schedules WHERE name = 'p'",
        )
        .unwrap()
        .unwrap();
        assert!(after);
        assert_eq!(
            Spi::get_one::<i32>("SELECT pgque.run_schedules()").unwrap(),
            Some(0)
        );
    }

    #[pg_test]
    fn alter_changes_only_what_is_given() {
        setup();
        Spi::run("SELECT pgque.create_schedule('a', '0 3 * * *', 'sq', 'k', priority => 5)")
            .unwrap();
        Spi::run("SELECT pgque.alter_schedule('a', kind => 'k2')").unwrap();
        let same = Spi::get_one::<bool>(
            "SELECT kind = 'k2' AND cron = '0 3 * * *' AND priority = 5 FROM pgque.schedules WHERE name = 'a'",
        )
        .unwrap()
        .unwrap();
        assert!(same);
        Spi::run(
            "SELECT pgque.alter_schedule('a', cron => '30 4 * * *', timezone => 'Europe/Berlin')",
        )
        .unwrap();
        let moved = Spi::get_one::<bool>(
            "SELECT (next_run_at AT TIME ZONE 'Europe/Berlin')::time = '04:30'
               FROM pgque.schedules WHERE name = 'a'",
        )
        .unwrap()
        .unwrap();
        assert!(moved);
    }

    #[pg_test]
    fn a_schedule_of_a_dropped_queue_is_paused() {
        setup();
        Spi::run("SELECT pgque.create_schedule('d', '* * * * *', 'sq', 'k')").unwrap();
        Spi::run("SELECT pgque.drop_job_queue('sq', true)").unwrap();
        Spi::run("UPDATE pgque.schedules_def SET next_run_at = now() - interval '1 minute'")
            .unwrap();
        assert_eq!(
            Spi::get_one::<i32>("SELECT pgque.run_schedules()").unwrap(),
            Some(0)
        );
        let paused = Spi::get_one::<bool>("SELECT paused FROM pgque.schedules WHERE name = 'd'")
            .unwrap()
            .unwrap();
        assert!(paused);
    }
}
