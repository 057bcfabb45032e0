//! Sending events: send (plain, typed, keyed; jsonb and text payloads),
//! send_batch, and PgQ's insert_event. These run as SECURITY INVOKER and
//! switch to the schema owner themselves (owner.rs says why).
#![allow(clippy::type_complexity)]
use super::owner;
use crate::datum::{ArrayDatum, JsonbArray, JsonbText, TextArray};
use crate::error::{self, raise, required};
use crate::log::events::PgJsonb;
use crate::log::{self, NewEvent};
use pgrx::prelude::*;
use pgrx::JsonB;

fn send_one(
    queue_name: Option<&str>,
    type_name: Option<&str>,
    payload: Option<&str>,
    extra: [Option<&str>; 4],
) -> i64 {
    send_one_with(queue_name, type_name, payload, extra, None)
}

/// send_one with headers (checked first: 22023 / 54000, nothing stored).
fn send_one_with(
    queue_name: Option<&str>,
    type_name: Option<&str>,
    payload: Option<&str>,
    extra: [Option<&str>; 4],
    headers: Option<JsonB>,
) -> i64 {
    error::check_partition_key(extra[0]);
    let headers = headers_arg(headers);
    owner::as_owner(|| {
        log::send_event(
            queue_name,
            &NewEvent {
                ev_type: type_name,
                ev_data: payload,
                extra,
                headers,
            },
        )
    })
}

/// An event's `headers` argument checked (crate::headers::check_headers)
/// and made a jsonb datum; NULL stays None.
pub(crate) fn headers_arg(headers: Option<JsonB>) -> Option<PgJsonb> {
    headers.map(|h| {
        crate::headers::check_headers(&h, "headers");
        PgJsonb::new(h)
    })
}

/// A required, non-empty event type (22004 / 42602).
pub(crate) fn type_arg(type_name: Option<&str>) -> &str {
    let t = required(type_name, "type_name");
    if t.is_empty() {
        raise(error::INVALID_NAME, "type_name must not be empty");
    }
    t
}

/// send(queue_name, payload jsonb): publishes one event of type 'default'.
#[pg_extern(name = "send")]
fn send_jsonb(queue_name: Option<&str>, payload: Option<JsonbText>) -> i64 {
    let p = payload.map(|p| p.0);
    send_one(queue_name, Some("default"), p.as_deref(), [None; 4])
}

/// send(queue_name, payload text): publishes one event of type 'default'.
#[pg_extern(name = "send")]
fn send_text(queue_name: Option<&str>, payload: Option<&str>) -> i64 {
    send_one(queue_name, Some("default"), payload, [None; 4])
}

/// send(queue_name, type_name, payload jsonb).
#[pg_extern(name = "send")]
fn send_typed_jsonb(
    queue_name: Option<&str>,
    type_name: Option<&str>,
    payload: Option<JsonbText>,
) -> i64 {
    let t = type_arg(type_name);
    let p = payload.map(|p| p.0);
    send_one(queue_name, Some(t), p.as_deref(), [None; 4])
}

/// send(queue_name, type_name, payload text).
#[pg_extern(name = "send")]
fn send_typed_text(
    queue_name: Option<&str>,
    type_name: Option<&str>,
    payload: Option<&str>,
) -> i64 {
    let t = type_arg(type_name);
    send_one(queue_name, Some(t), payload, [None; 4])
}

fn send_many(
    queue_name: Option<&str>,
    type_name: &str,
    payloads: ArrayDatum,
    keys: Option<TextArray>,
) -> Vec<i64> {
    send_many_with(queue_name, type_name, payloads, keys, None)
}

/// send_many with one headers object for every event of the call.
fn send_many_with(
    queue_name: Option<&str>,
    type_name: &str,
    payloads: ArrayDatum,
    keys: Option<TextArray>,
    headers: Option<JsonB>,
) -> Vec<i64> {
    if let Some(k) = &keys {
        if k.0.len != payloads.len {
            raise(
                error::INVALID_PARAMETER_VALUE,
                format!(
                    "partition_keys has {} elements, payloads has {}: they must align",
                    k.0.len, payloads.len
                ),
            );
        }
        let (values, nulls) = unsafe { k.0.elements(pg_sys::TEXTOID) };
        for (v, null) in values.iter().zip(nulls) {
            if !null {
                error::check_partition_key_len(unsafe {
                    pgrx::varlena::varsize_any_exhdr(v.cast_mut_ptr::<pg_sys::varlena>())
                });
            }
        }
    }
    let headers = headers_arg(headers);
    owner::as_owner(|| {
        log::send_events(
            queue_name,
            type_name,
            &payloads,
            keys.map(|k| k.0).as_ref(),
            headers,
        )
    })
}

/// send_batch(queue_name, payloads jsonb[]) → ids aligned with the input.
#[pg_extern(name = "send_batch")]
fn send_batch_jsonb(queue_name: Option<&str>, payloads: Option<JsonbArray>) -> Vec<i64> {
    let p = required(payloads, "payloads").0;
    send_many(queue_name, "default", p, None)
}

/// send_batch(queue_name, payloads text[]).
#[pg_extern(name = "send_batch")]
fn send_batch_text(queue_name: Option<&str>, payloads: Option<TextArray>) -> Vec<i64> {
    let p = required(payloads, "payloads").0;
    send_many(queue_name, "default", p, None)
}

/// send_batch(queue_name, type_name, payloads jsonb[]).
#[pg_extern(name = "send_batch")]
fn send_batch_typed_jsonb(
    queue_name: Option<&str>,
    type_name: Option<&str>,
    payloads: Option<JsonbArray>,
) -> Vec<i64> {
    let t = type_arg(type_name).to_string();
    let p = required(payloads, "payloads").0;
    send_many(queue_name, &t, p, None)
}

/// send_batch(queue_name, type_name, payloads text[]).
#[pg_extern(name = "send_batch")]
fn send_batch_typed_text(
    queue_name: Option<&str>,
    type_name: Option<&str>,
    payloads: Option<TextArray>,
) -> Vec<i64> {
    let t = type_arg(type_name).to_string();
    let p = required(payloads, "payloads").0;
    send_many(queue_name, &t, p, None)
}

/// send(queue_name, type_name, payload jsonb, partition_key): a keyed event;
/// the key rides ev_extra1 and picks the event's partition slot (NULL: slot 0).
#[pg_extern(name = "send")]
fn send_keyed_jsonb(
    queue_name: Option<&str>,
    type_name: Option<&str>,
    payload: Option<JsonbText>,
    partition_key: Option<&str>,
) -> i64 {
    let t = type_arg(type_name);
    let p = payload.map(|p| p.0);
    send_one(
        queue_name,
        Some(t),
        p.as_deref(),
        [partition_key, None, None, None],
    )
}

/// send(queue_name, type_name, payload text, partition_key).
#[pg_extern(name = "send")]
fn send_keyed_text(
    queue_name: Option<&str>,
    type_name: Option<&str>,
    payload: Option<&str>,
    partition_key: Option<&str>,
) -> i64 {
    let t = type_arg(type_name);
    send_one(
        queue_name,
        Some(t),
        payload,
        [partition_key, None, None, None],
    )
}

/// send_batch(queue_name, type_name, payloads jsonb[], partition_keys text[]):
/// keyed events in one statement, keys aligned with payloads (22023 when the
/// lengths differ); ids aligned with the input.
#[pg_extern(name = "send_batch")]
fn send_batch_keyed_jsonb(
    queue_name: Option<&str>,
    type_name: Option<&str>,
    payloads: Option<JsonbArray>,
    partition_keys: Option<TextArray>,
) -> Vec<i64> {
    let t = type_arg(type_name).to_string();
    let p = required(payloads, "payloads").0;
    let k = required(partition_keys, "partition_keys");
    send_many(queue_name, &t, p, Some(k))
}

/// send_batch(queue_name, type_name, payloads text[], partition_keys text[]).
#[pg_extern(name = "send_batch")]
fn send_batch_keyed_text(
    queue_name: Option<&str>,
    type_name: Option<&str>,
    payloads: Option<TextArray>,
    partition_keys: Option<TextArray>,
) -> Vec<i64> {
    let t = type_arg(type_name).to_string();
    let p = required(payloads, "payloads").0;
    let k = required(partition_keys, "partition_keys");
    send_many(queue_name, &t, p, Some(k))
}

/// send(queue_name, type_name, payload jsonb, partition_key, headers jsonb):
/// a keyed event (partition_key may be NULL) with trace-context headers, a
/// JSON object of strings (`traceparent`, `tracestate`; 22023 otherwise,
/// 54000 over 1 kB), stored in ev_headers (NULL: none).
#[pg_extern(name = "send")]
fn send_headers_jsonb(
    queue_name: Option<&str>,
    type_name: Option<&str>,
    payload: Option<JsonbText>,
    partition_key: Option<&str>,
    headers: Option<JsonB>,
) -> i64 {
    let t = type_arg(type_name);
    let p = payload.map(|p| p.0);
    send_one_with(
        queue_name,
        Some(t),
        p.as_deref(),
        [partition_key, None, None, None],
        headers,
    )
}

/// send(queue_name, type_name, payload text, partition_key, headers jsonb).
#[pg_extern(name = "send")]
fn send_headers_text(
    queue_name: Option<&str>,
    type_name: Option<&str>,
    payload: Option<&str>,
    partition_key: Option<&str>,
    headers: Option<JsonB>,
) -> i64 {
    let t = type_arg(type_name);
    send_one_with(
        queue_name,
        Some(t),
        payload,
        [partition_key, None, None, None],
        headers,
    )
}

/// send_batch(queue_name, type_name, payloads jsonb[], partition_keys
/// text[], headers jsonb): as the keyed form (partition_keys may be NULL:
/// no keys), with one headers object for every event of the call.
#[pg_extern(name = "send_batch")]
fn send_batch_headers_jsonb(
    queue_name: Option<&str>,
    type_name: Option<&str>,
    payloads: Option<JsonbArray>,
    partition_keys: Option<TextArray>,
    headers: Option<JsonB>,
) -> Vec<i64> {
    let t = type_arg(type_name).to_string();
    let p = required(payloads, "payloads").0;
    send_many_with(queue_name, &t, p, partition_keys, headers)
}

/// send_batch(queue_name, type_name, payloads text[], partition_keys text[],
/// headers jsonb).
#[pg_extern(name = "send_batch")]
fn send_batch_headers_text(
    queue_name: Option<&str>,
    type_name: Option<&str>,
    payloads: Option<TextArray>,
    partition_keys: Option<TextArray>,
    headers: Option<JsonB>,
) -> Vec<i64> {
    let t = type_arg(type_name).to_string();
    let p = required(payloads, "payloads").0;
    send_many_with(queue_name, &t, p, partition_keys, headers)
}

/// insert_event(queue_name, ev_type, ev_data): PgQ's raw entry point.
#[pg_extern(name = "insert_event")]
fn insert_event3(queue_name: Option<&str>, ev_type: Option<&str>, ev_data: Option<&str>) -> i64 {
    send_one(queue_name, ev_type, ev_data, [None; 4])
}

/// insert_event(queue_name, ev_type, ev_data, ev_extra1, ev_extra2, ev_extra3, ev_extra4).
#[pg_extern(name = "insert_event")]
fn insert_event7(
    queue_name: Option<&str>,
    ev_type: Option<&str>,
    ev_data: Option<&str>,
    ev_extra1: Option<&str>,
    ev_extra2: Option<&str>,
    ev_extra3: Option<&str>,
    ev_extra4: Option<&str>,
) -> i64 {
    send_one(
        queue_name,
        ev_type,
        ev_data,
        [ev_extra1, ev_extra2, ev_extra3, ev_extra4],
    )
}

#[cfg(any(test, feature = "pg_test"))]
#[pg_schema]
mod tests {
    use crate::test_util::{count, one, run, sqlstate};
    use pgrx::prelude::*;

    /// Headers land in ev_headers both below SQL (the direct heap insert)
    /// and through the SQL INSERT a table with a trigger takes; NULL
    /// headers store NULL either way.
    #[pg_test]
    fn headers_stored_by_the_direct_and_the_sql_insert() {
        run("SELECT pgque.create_queue('hdr_direct'), pgque.create_queue('hdr_sql')");
        let table: String = one(
            "SELECT format('pgque.event_%s_%s', queue_id, queue_cur_table) FROM pgque.queue \
              WHERE queue_name = 'hdr_sql'",
        )
        .unwrap();
        run("CREATE FUNCTION pg_temp.noop() RETURNS trigger LANGUAGE plpgsql AS $$BEGIN RETURN NEW; END$$");
        run(&format!(
            "CREATE TRIGGER noop BEFORE INSERT ON {table} FOR EACH ROW EXECUTE FUNCTION pg_temp.noop()"
        ));
        for q in ["hdr_direct", "hdr_sql"] {
            run(&format!(
                "SELECT pgque.send('{q}', 't', 'a'::text, 'k', '{{\"traceparent\": \"00-a\"}}'), \
                        pgque.send('{q}', 't', '{{}}'::jsonb, NULL, NULL), \
                        pgque.send_batch('{q}', 't', ARRAY['b', 'c'], NULL, '{{\"traceparent\": \"00-b\"}}'), \
                        pgque.send_batch('{q}', 't', ARRAY['d'], ARRAY['k'], NULL)"
            ));
            let id: i32 = one(&format!(
                "SELECT queue_id FROM pgque.queue WHERE queue_name = '{q}'"
            ))
            .unwrap();
            let got: String = one(&format!(
                "SELECT string_agg(ev_data || '=' || coalesce(ev_headers->>'traceparent', '-'), ',' ORDER BY ev_id) \
                   FROM pgque.event_{id}"
            ))
            .unwrap();
            assert_eq!(got, "a=00-a,{}=-,b=00-b,c=00-b,d=-", "{q}");
        }
    }

    /// Bad headers: the SQLSTATE, and no event.
    #[pg_test]
    fn bad_headers_store_nothing() {
        run("SELECT pgque.create_queue('hdr_bad')");
        assert_eq!(
            sqlstate("SELECT pgque.send('hdr_bad', 't', 'a'::text, NULL, '[]')"),
            "22023"
        );
        assert_eq!(
            sqlstate(&format!(
                "SELECT pgque.send_batch('hdr_bad', 't', ARRAY['a'], NULL, '{{\"x\": \"{}\"}}')",
                "y".repeat(2000)
            )),
            "54000"
        );
        assert_eq!(count("SELECT count(*) FROM pgque.all_events('hdr_bad')"), 0);
    }
}
