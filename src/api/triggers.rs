//! Table-change capture: the trigger functions `logutriga`, `sqltriga` and
//! `jsontriga`, with PgQ's trigger arguments and event formats (PgQ 3.5's
//! triggers/*.c: the same events for the same row changes), so a table's
//! INSERT / UPDATE / DELETE / TRUNCATE becomes an event in the same
//! transaction (the outbox pattern without application code).
//!
//! Arguments: the queue name first, then in any order `SKIP` (BEFORE trigger:
//! publish, and drop the row change), `backup` (an UPDATE's old row in ev_extra2),
//! `deny` (refuse the change), `ignore=col1,col2` (columns left out; an
//! UPDATE that changes only those publishes nothing), `pkey=col1,col2`
//! (instead of the primary key), `when=EXPR` (publish only when true), and
//! `ev_type=EXPR` / `ev_data=EXPR` / `ev_extra1..4=EXPR` (override a field;
//! EXPR is SQL over the row's columns). Columns named `_pgq_ev_type`,
//! `_pgq_ev_data`, `_pgq_ev_extra1..4` set those fields from the row.
//!
//! Events: ev_extra1 is `schema.table`; ev_type `I:pk1,pk2` / `U:..` / `D:..`
//! / `R` (logutriga), `I` / `U` / `D` / `R` (sqltriga), or
//! `{"op":"INSERT","table":[schema,table],"pkey":[...]}` (jsontriga); ev_data
//! the row urlencoded (`col=val&col2`, NULL without `=`), a partial SQL
//! statement, or a JSON object.
//!
//! The functions are SECURITY INVOKER, like PgQ's: the expressions run with
//! the rights of the role changing the table, and the event is written
//! through `pgque.insert_event`, so that role needs pgque_writer (as PgQ's
//! writers need insert_event). Each row costs one catalog query (the table's
//! name and primary key), one insert_event call, and one query per
//! expression argument.
use crate::error::{self, raise};
use crate::log;
use pgrx::datum::DatumWithOid;
use pgrx::heap_tuple::PgHeapTuple;
use pgrx::pg_sys;
use pgrx::prelude::*;
use pgrx::spi::SpiClient;
use pgrx::trigger_support::{PgTrigger, PgTriggerError};
use pgrx::AllocatedByPostgres;
use std::ffi::CStr;

/// Which of the three triggers: how a row is encoded.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Format {
    Urlenc,
    Sql,
    Json,
}

/// Indexes of the event fields (ev_type, ev_data, ev_extra1..4) and of
/// the `when=` condition in [`TgArgs::exprs`].
const EV_TYPE: usize = 0;
const EV_DATA: usize = 1;
const EV_EXTRA2: usize = 3;
const EV_WHEN: usize = 6;

/// A trigger's arguments after the queue name, parsed as PgQ parses them.
#[derive(Debug, Default, PartialEq)]
pub struct TgArgs {
    pub queue: String,
    pub skip: bool,
    pub backup: bool,
    pub deny: bool,
    pub ignore: Option<String>,
    pub pkey: Option<String>,
    /// ev_type, ev_data, ev_extra1..4, when: SQL expressions.
    pub exprs: [Option<String>; 7],
}

/// Parses a trigger's arguments (queue name first). Exact spellings, as PgQ:
/// `SKIP`, `backup`, `deny`, `ignore=`, `pkey=`, `when=`, `ev_type=`,
/// `ev_data=`, `ev_extra1=` .. `ev_extra4=`.
pub fn parse_args(args: &[String]) -> Result<TgArgs, String> {
    let Some(queue) = args.first() else {
        return Err("a pgque trigger needs the queue name as its first argument".into());
    };
    let mut a = TgArgs {
        queue: queue.clone(),
        ..TgArgs::default()
    };
    const FIELDS: [(&str, usize); 7] = [
        ("ev_type=", 0),
        ("ev_data=", 1),
        ("ev_extra1=", 2),
        ("ev_extra2=", 3),
        ("ev_extra3=", 4),
        ("ev_extra4=", 5),
        ("when=", EV_WHEN),
    ];
    'next: for arg in &args[1..] {
        match arg.as_str() {
            "SKIP" => a.skip = true,
            "backup" => a.backup = true,
            "deny" => a.deny = true,
            _ if arg.starts_with("ignore=") => a.ignore = Some(arg["ignore=".len()..].to_string()),
            _ if arg.starts_with("pkey=") => a.pkey = Some(arg["pkey=".len()..].to_string()),
            _ => {
                for (prefix, i) in FIELDS {
                    if let Some(expr) = arg.strip_prefix(prefix) {
                        a.exprs[i] = Some(expr.to_string());
                        continue 'next;
                    }
                }
                return Err(format!(
                    "unknown trigger argument {arg:?}; known: SKIP, backup, deny, ignore=cols, pkey=cols, \
                     when=EXPR, ev_type=EXPR, ev_data=EXPR, ev_extra1..4=EXPR"
                ));
            }
        }
    }
    Ok(a)
}

/// PgQ's pgq_strlist_contains: `name` is an item of the comma (or space)
/// separated `list`.
pub fn strlist_contains(list: &str, name: &str) -> bool {
    let sep = |c: u8| c == b',' || c.is_ascii_whitespace();
    let l = list.as_bytes();
    let mut from = 0;
    while let Some(pos) = list[from..].find(name) {
        let p = from + pos;
        let end = p + name.len();
        let before_ok = p == 0 || sep(l[p - 1]);
        let after_ok = end >= l.len() || sep(l[end]);
        if before_ok && after_ok {
            return true;
        }
        from = p + name.len().max(1);
        if from > list.len() {
            break;
        }
    }
    false
}

/// PgQ's urlencoding: space as `+`, `[0-9A-Za-z_.-]` as they are, every other
/// byte as `%xx` (lower-case hex).
pub fn urlencode(out: &mut String, s: &str) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    for &b in s.as_bytes() {
        match b {
            b' ' => out.push('+'),
            b'0'..=b'9' | b'A'..=b'Z' | b'a'..=b'z' | b'_' | b'.' | b'-' => out.push(b as char),
            _ => {
                out.push('%');
                out.push(HEX[(b >> 4) as usize] as char);
                out.push(HEX[(b & 15) as usize] as char);
            }
        }
    }
}

/// PostgreSQL's quote_literal: `'...'` with `'` and `\` doubled, and an `E`
/// prefix when there is a backslash.
pub fn quote_literal(out: &mut String, s: &str) {
    if s.contains('\\') {
        out.push('E');
    }
    out.push('\'');
    for ch in s.chars() {
        if ch == '\'' || ch == '\\' {
            out.push(ch);
        }
        out.push(ch);
    }
    out.push('\'');
}

/// PostgreSQL's escape_json: a JSON string literal.
pub fn json_string(out: &mut String, s: &str) {
    out.push('"');
    for ch in s.chars() {
        match ch {
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
}

/// PostgreSQL's quote_identifier (quotes only when needed, keyword aware).
fn quote_ident(out: &mut String, s: &str) {
    let c = std::ffi::CString::new(s).expect("identifier without NUL");
    let q = unsafe { CStr::from_ptr(pg_sys::quote_identifier(c.as_ptr())) };
    out.push_str(&q.to_string_lossy());
}

/// A live column of the table.
struct Col {
    attnum: i32,
    name: String,
    typid: pg_sys::Oid,
    collation: pg_sys::Oid,
    magic: bool,
}

/// The row being logged and what we know of its table.
struct Ev<'t> {
    td: pg_sys::TupleDesc,
    cols: Vec<Col>,
    args: &'t TgArgs,
    op: u8,
    pkeys: Vec<String>,
    /// pkey= or the primary key, comma separated (ev_type's suffix).
    pkey_list: String,
    has_magic: bool,
}

impl Ev<'_> {
    fn is_pkey(&self, col: &Col) -> bool {
        if col.magic {
            return false;
        }
        match &self.args.pkey {
            Some(list) => strlist_contains(list, &col.name),
            None => self.pkeys.contains(&col.name),
        }
    }

    fn skip_col(&self, col: &Col) -> bool {
        col.magic
            || self
                .args
                .ignore
                .as_deref()
                .is_some_and(|l| strlist_contains(l, &col.name))
    }

    /// The column's text (its type's output function), None for NULL.
    fn text(&self, row: pg_sys::HeapTuple, col: &Col) -> Option<String> {
        unsafe {
            let p = pg_sys::SPI_getvalue(row, self.td, col.attnum);
            (!p.is_null()).then(|| CStr::from_ptr(p).to_string_lossy().into_owned())
        }
    }

    fn bin(&self, row: pg_sys::HeapTuple, col: &Col) -> Option<pg_sys::Datum> {
        let mut isnull = false;
        let d = unsafe { pg_sys::SPI_getbinval(row, self.td, col.attnum, &mut isnull) };
        (!isnull).then_some(d)
    }

    /// Whether an UPDATE left the column as it was: the type's equality
    /// operator, or (arrays, types without one) the text forms, as PgQ.
    fn unchanged(&self, old: pg_sys::HeapTuple, new: pg_sys::HeapTuple, col: &Col) -> bool {
        match (self.bin(old, col), self.bin(new, col)) {
            (None, None) => true,
            (Some(o), Some(n)) => unsafe {
                let tc = pg_sys::lookup_type_cache(
                    col.typid,
                    (pg_sys::TYPECACHE_EQ_OPR | pg_sys::TYPECACHE_EQ_OPR_FINFO) as i32,
                );
                let opr = (*tc).eq_opr;
                if opr != pg_sys::InvalidOid && opr != pg_sys::Oid::from(pg_sys::ARRAY_EQ_OP) {
                    pg_sys::FunctionCall2Coll(&mut (*tc).eq_opr_finfo, col.collation, o, n).value()
                        != 0
                } else {
                    self.text(old, col) == self.text(new, col)
                }
            },
            _ => false,
        }
    }

    /// `col=val&col2=val2` (a NULL as the name alone).
    fn urlenc_row(&self, row: pg_sys::HeapTuple, out: &mut String) {
        if self.op == b'R' {
            return;
        }
        let mut first = true;
        for col in self.cols.iter().filter(|c| !self.skip_col(c)) {
            if !first {
                out.push('&');
            }
            first = false;
            urlencode(out, &col.name);
            if let Some(v) = self.text(row, col) {
                out.push('=');
                urlencode(out, &v);
            }
        }
    }

    /// A JSON object of the row: booleans and integers as JSON, dates and
    /// timestamps as to_json writes them (ISO 8601), everything else as a
    /// string of its text form.
    fn json_row(&self, row: pg_sys::HeapTuple, out: &mut String) {
        if self.op == b'R' {
            out.push_str("{}");
            return;
        }
        out.push('{');
        let mut first = true;
        for col in self.cols.iter().filter(|c| !self.skip_col(c)) {
            if !first {
                out.push(',');
            }
            first = false;
            json_string(out, &col.name);
            out.push(':');
            let Some(d) = self.bin(row, col) else {
                out.push_str("null");
                continue;
            };
            match col.typid {
                pg_sys::BOOLOID => out.push_str(if d.value() != 0 { "true" } else { "false" }),
                pg_sys::INT2OID | pg_sys::INT4OID | pg_sys::INT8OID => {
                    out.push_str(&self.text(row, col).unwrap_or_default())
                }
                pg_sys::TIMESTAMPOID | pg_sys::TIMESTAMPTZOID | pg_sys::DATEOID => {
                    out.push('"');
                    out.push_str(&xsd_text(|| self.text(row, col).unwrap_or_default()));
                    out.push('"');
                }
                _ => json_string(out, &self.text(row, col).unwrap_or_default()),
            }
        }
        out.push('}');
    }

    fn encode_row(&self, fmt: Format, row: pg_sys::HeapTuple, out: &mut String) {
        match fmt {
            Format::Json => self.json_row(row, out),
            _ => self.urlenc_row(row, out),
        }
    }

    /// PgQ's pgq_is_interesting_change: an UPDATE is logged unless only
    /// ignored columns changed; changing a key column is refused.
    fn interesting(&self, old: pg_sys::HeapTuple, new: pg_sys::HeapTuple) -> bool {
        let mut ignored = 0;
        for col in &self.cols {
            let is_pk = self.is_pkey(col);
            if !is_pk && self.args.ignore.is_none() {
                continue;
            }
            if self.unchanged(old, new, col) {
                continue;
            }
            if is_pk {
                pk_update(col);
            }
            if self.skip_col(col) {
                ignored += 1;
                continue;
            }
            return true;
        }
        ignored == 0
    }

    /// sqltriga's ev_data; None when an UPDATE changed only ignored columns.
    fn sql(&self, tg: &pg_sys::TriggerData) -> Option<String> {
        let mut out = String::new();
        let key_eq = |out: &mut String, col: &Col, v: Option<String>| {
            let Some(v) = v else {
                raise(
                    error::WRONG_STATE,
                    format!(
                        "key column {:?} is NULL: the row cannot be addressed",
                        col.name
                    ),
                );
            };
            quote_ident(out, &col.name);
            out.push('=');
            quote_literal(out, &v);
        };
        let keys = |out: &mut String, row: pg_sys::HeapTuple| {
            let mut first = true;
            for col in self.cols.iter().filter(|c| self.is_pkey(c)) {
                if !first {
                    out.push_str(" and ");
                }
                first = false;
                key_eq(out, col, self.text(row, col));
            }
        };
        match self.op {
            b'I' => {
                let row = tg.tg_trigtuple;
                let cols: Vec<&Col> = self.cols.iter().filter(|c| !self.skip_col(c)).collect();
                out.push('(');
                for (i, col) in cols.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    quote_ident(&mut out, &col.name);
                }
                out.push_str(") values (");
                for (i, col) in cols.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    match self.text(row, col) {
                        Some(v) => quote_literal(&mut out, &v),
                        None => out.push_str("null"),
                    }
                }
                out.push(')');
            }
            b'U' => {
                let (old, new) = (tg.tg_trigtuple, tg.tg_newtuple);
                let mut any = false;
                let mut ignored = 0;
                for col in &self.cols {
                    if self.unchanged(old, new, col) {
                        continue;
                    }
                    if self.is_pkey(col) {
                        pk_update(col);
                    }
                    if self.skip_col(col) {
                        ignored += 1;
                        continue;
                    }
                    if any {
                        out.push(',');
                    }
                    any = true;
                    quote_ident(&mut out, &col.name);
                    out.push('=');
                    match self.text(new, col) {
                        Some(v) => quote_literal(&mut out, &v),
                        None => out.push_str("NULL"),
                    }
                }
                if !any {
                    if ignored > 0 {
                        return None;
                    }
                    // A no-op UPDATE: set the first key column to itself.
                    if let Some(col) = self.cols.iter().find(|c| self.is_pkey(c)) {
                        key_eq(&mut out, col, self.text(old, col));
                    }
                }
                out.push_str(" where ");
                keys(&mut out, old);
            }
            b'D' => keys(&mut out, tg.tg_trigtuple),
            _ => {}
        }
        Some(out)
    }
}

/// A key column changed: PgQ refuses it (the event could not address the row).
fn pk_update(col: &Col) -> ! {
    raise(
        error::FEATURE_NOT_SUPPORTED,
        format!(
            "primary key update not allowed: column {:?} is a key of a table with a pgque trigger",
            col.name
        ),
    )
}

/// Runs `text` with DateStyle set to XSD (ISO 8601 with a `T`), which is how
/// PgQ's jsontriga and to_json write dates and timestamps.
fn xsd_text(text: impl FnOnce() -> String) -> String {
    struct Restore(i32);
    impl Drop for Restore {
        fn drop(&mut self) {
            unsafe { pg_sys::DateStyle = self.0 };
        }
    }
    let _restore = Restore(unsafe { pg_sys::DateStyle });
    unsafe { pg_sys::DateStyle = pg_sys::USE_XSD_DATES as i32 };
    text()
}

/// The table's schema, name and primary key columns (in key order).
fn table_info(c: &mut SpiClient<'_>, relid: pg_sys::Oid) -> (String, String, Vec<String>) {
    let t = log::exec(
        c,
        "SELECT n.nspname::text, r.relname::text, \
                coalesce((SELECT array_agg(k.attname::text ORDER BY k.attnum) \
                            FROM pg_catalog.pg_index i \
                            JOIN pg_catalog.pg_attribute k ON k.attrelid = i.indexrelid \
                           WHERE i.indrelid = r.oid AND i.indisprimary \
                             AND k.attnum > 0 AND NOT k.attisdropped), '{}') \
           FROM pg_catalog.pg_class r JOIN pg_catalog.pg_namespace n ON n.oid = r.relnamespace \
          WHERE r.oid = $1",
        &[relid.into()],
    );
    let r = log::first_row(t).expect("the trigger's table");
    (
        log::col(&r, 1).unwrap(),
        log::col(&r, 2).unwrap(),
        log::col(&r, 3).unwrap_or_default(),
    )
}

/// Evaluates an expression argument over the row: `SELECT (expr) FROM
/// (SELECT ($1).*)`, so the expression sees the row's columns by name. The
/// statement names the row type, so each (expression, table) has its own plan.
fn eval(
    c: &mut SpiClient<'_>,
    expr: &str,
    row: pg_sys::Datum,
    rowtype: pg_sys::Oid,
    is_when: bool,
) -> Option<String> {
    let arg = unsafe { DatumWithOid::new(row, rowtype) };
    if is_when {
        let sql = format!(
            "SELECT ({expr}) FROM (SELECT ($1).*) AS _pgq_row /* pgque trigger when=, row type {} */",
            u32::from(rowtype)
        );
        let t = log::exec(c, &sql, &[arg]);
        let kind = t.column_type_oid(1).ok().map(|o| o.value());
        if kind != Some(pg_sys::BOOLOID) {
            raise(
                error::INVALID_PARAMETER_VALUE,
                format!("when= must be a boolean expression: {expr}"),
            );
        }
        let r = log::first_row(t).expect("one row");
        return match log::col::<bool>(&r, 1) {
            None => raise(
                error::NULL_VALUE_NOT_ALLOWED,
                format!("when= gave NULL for this row: {expr}"),
            ),
            Some(true) => Some(String::new()),
            Some(false) => None,
        };
    }
    let sql = format!(
        "SELECT ({expr})::text FROM (SELECT ($1).*) AS _pgq_row /* pgque trigger field, row type {} */",
        u32::from(rowtype)
    );
    let t = log::exec(c, &sql, &[arg]);
    log::first_row(t).and_then(|r| log::col::<String>(&r, 1))
}

fn trigger_args(trigger: &pg_sys::Trigger) -> Vec<String> {
    (0..trigger.tgnargs as usize)
        .map(|i| unsafe {
            CStr::from_ptr(*trigger.tgargs.add(i))
                .to_string_lossy()
                .into_owned()
        })
        .collect()
}

/// The three triggers' common body: checks how it was attached, builds the
/// event in `fmt` and writes it with pgque.insert_event; returns the row a
/// BEFORE trigger hands back (None: skip the change, or an AFTER trigger).
fn capture<'a>(
    trigger: &'a PgTrigger<'a>,
    fmt: Format,
) -> Result<Option<PgHeapTuple<'a, AllocatedByPostgres>>, PgTriggerError> {
    let tg = trigger.trigger_data();
    let event = tg.tg_event;
    let opmask = event & pg_sys::TRIGGER_EVENT_OPMASK;
    let is_row = event & pg_sys::TRIGGER_EVENT_ROW != 0;
    let after = event & pg_sys::TRIGGER_EVENT_TIMINGMASK == pg_sys::TRIGGER_EVENT_AFTER;
    let (op, op_str) = match opmask {
        pg_sys::TRIGGER_EVENT_INSERT => (b'I', "INSERT"),
        pg_sys::TRIGGER_EVENT_UPDATE => (b'U', "UPDATE"),
        pg_sys::TRIGGER_EVENT_DELETE => (b'D', "DELETE"),
        _ => (b'R', "TRUNCATE"),
    };
    // The row a BEFORE trigger returns to let the change happen.
    let passthrough = || {
        if after || !is_row {
            None
        } else if op == b'U' {
            trigger.new()
        } else {
            trigger.old().or_else(|| trigger.new())
        }
    };
    if unsafe { pg_sys::SessionReplicationRole } == pg_sys::SESSION_REPLICATION_ROLE_LOCAL as i32 {
        return Ok(passthrough());
    }
    if op == b'R' {
        if is_row {
            raise(
                error::INVALID_PARAMETER_VALUE,
                "a pgque TRUNCATE trigger must be FOR EACH STATEMENT",
            );
        }
    } else if !is_row {
        raise(
            error::INVALID_PARAMETER_VALUE,
            "a pgque INSERT / UPDATE / DELETE trigger must be FOR EACH ROW",
        );
    }
    let args = parse_args(&trigger_args(trigger.trigger()))
        .unwrap_or_else(|m| raise(error::INVALID_PARAMETER_VALUE, m));
    if op == b'R' {
        if args.ignore.is_some() || args.pkey.is_some() || args.backup {
            raise(
                error::INVALID_PARAMETER_VALUE,
                "ignore=, pkey= and backup do not apply to a TRUNCATE trigger",
            );
        }
        if args.exprs.iter().any(Option::is_some) {
            raise(
                error::INVALID_PARAMETER_VALUE,
                "expression arguments do not apply to a TRUNCATE trigger",
            );
        }
    }
    if args.skip && after {
        raise(
            error::INVALID_PARAMETER_VALUE,
            "SKIP works only in a BEFORE trigger",
        );
    }
    let rel = tg.tg_relation;
    let (relid, rowtype, td) = unsafe { ((*rel).rd_id, (*(*rel).rd_rel).reltype, (*rel).rd_att) };
    let skip = args.skip;
    Spi::connect_mut(|c| {
        let (schema, table, pkeys) = table_info(c, relid);
        let table_name = format!("{schema}.{table}");
        if args.deny {
            raise(
                error::WRONG_STATE,
                format!(
                    "Table '{table_name}' to queue '{}': change not allowed ({op_str})",
                    args.queue
                ),
            );
        }
        let pkey_list = args.pkey.clone().unwrap_or_else(|| pkeys.join(","));
        if (op == b'U' || op == b'D') && pkey_list.is_empty() {
            raise(
                error::WRONG_STATE,
                format!("Update/Delete on table without pkey: {table_name} (add a primary key or pass pkey=)"),
            );
        }
        let tdesc = unsafe { pgrx::PgTupleDesc::from_pg_unchecked(td) };
        let mut cols = Vec::new();
        for (i, a) in tdesc.iter().enumerate() {
            if a.attisdropped {
                continue;
            }
            let name = pgrx::name_data_to_str(&a.attname).to_string();
            cols.push(Col {
                attnum: i as i32 + 1,
                magic: name.starts_with("_pgq_ev_"),
                name,
                typid: a.atttypid,
                collation: a.attcollation,
            });
        }
        let ev = Ev {
            td,
            has_magic: cols.iter().any(|c| c.magic),
            cols,
            args: &args,
            op,
            pkeys,
            pkey_list,
        };
        // The row the event describes: the new one for INSERT / UPDATE.
        let row = if op == b'U' {
            tg.tg_newtuple
        } else {
            tg.tg_trigtuple
        };
        let mut fields: [Option<String>; 6] = [
            Some(String::new()),
            Some(String::new()),
            Some(table_name.clone()),
            None,
            None,
            None,
        ];
        let ty = fields[EV_TYPE].as_mut().unwrap();
        match fmt {
            Format::Urlenc => {
                ty.push(op as char);
                if op != b'R' {
                    ty.push(':');
                    ty.push_str(&ev.pkey_list);
                }
            }
            Format::Sql => ty.push(op as char),
            Format::Json => {
                ty.push_str(&format!("{{\"op\":\"{op_str}\",\"table\":["));
                json_string(ty, &schema);
                ty.push(',');
                json_string(ty, &table);
                ty.push_str("],\"pkey\":[");
                let keys: Vec<&str> = match &args.pkey {
                    Some(l) => l.split(',').collect(),
                    None => ev.pkeys.iter().map(String::as_str).collect(),
                };
                for (i, k) in keys.iter().enumerate() {
                    if i > 0 {
                        ty.push(',');
                    }
                    json_string(ty, k);
                }
                ty.push_str("]}");
            }
        }
        // PgQ 3.5 keeps a backup of UPDATEs only (the row before the change).
        if args.backup && op == b'U' {
            let mut b = String::new();
            ev.encode_row(fmt, tg.tg_trigtuple, &mut b);
            fields[EV_EXTRA2] = Some(b);
        }
        let wanted = match fmt {
            Format::Sql => match ev.sql(tg) {
                Some(s) => {
                    fields[EV_DATA] = Some(s);
                    true
                }
                None => false,
            },
            _ => {
                let wanted = op != b'U' || ev.interesting(tg.tg_trigtuple, tg.tg_newtuple);
                if wanted {
                    ev.encode_row(fmt, row, fields[EV_DATA].as_mut().unwrap());
                }
                wanted
            }
        };
        if !wanted {
            return;
        }
        if ev.has_magic {
            for col in ev.cols.iter().filter(|c| c.magic) {
                let i = match col.name.as_str() {
                    "_pgq_ev_type" => 0,
                    "_pgq_ev_data" => 1,
                    "_pgq_ev_extra1" => 2,
                    "_pgq_ev_extra2" => 3,
                    "_pgq_ev_extra3" => 4,
                    "_pgq_ev_extra4" => 5,
                    other => raise(
                        error::INVALID_PARAMETER_VALUE,
                        format!("unknown magic column {other:?}: known are _pgq_ev_type, _pgq_ev_data, _pgq_ev_extra1..4"),
                    ),
                };
                fields[i] = ev.text(row, col);
            }
        }
        if args.exprs.iter().any(Option::is_some) {
            let datum = unsafe { pg_sys::heap_copy_tuple_as_datum(row, td) };
            for (i, expr) in args.exprs.iter().enumerate() {
                let Some(expr) = expr else { continue };
                if i == EV_WHEN {
                    if eval(c, expr, datum, rowtype, true).is_none() {
                        return;
                    }
                } else {
                    fields[i] = eval(c, expr, datum, rowtype, false);
                }
            }
        }
        let [f0, f1, f2, f3, f4, f5] = &fields;
        log::exec(
            c,
            "SELECT pgque.insert_event($1, $2, $3, $4, $5, $6, $7)",
            &[
                args.queue.as_str().into(),
                f0.as_deref().into(),
                f1.as_deref().into(),
                f2.as_deref().into(),
                f3.as_deref().into(),
                f4.as_deref().into(),
                f5.as_deref().into(),
            ],
        );
    });
    if skip {
        return Ok(None);
    }
    Ok(passthrough())
}

/// logutriga(queue_name, options...): the row urlencoded in ev_data, ev_type
/// `I:pkeys` / `U:pkeys` / `D:pkeys` / `R`, ev_extra1 the table (PgQ's format).
#[pg_trigger]
fn logutriga<'a>(
    trigger: &'a PgTrigger<'a>,
) -> Result<Option<PgHeapTuple<'a, AllocatedByPostgres>>, PgTriggerError> {
    capture(trigger, Format::Urlenc)
}

/// sqltriga(queue_name, options...): ev_data a partial SQL statement
/// (`(cols) values (...)`, `col='v' where pk='1'`, `pk='1'`), ev_type
/// `I` / `U` / `D` / `R`, ev_extra1 the table (PgQ's format).
#[pg_trigger]
fn sqltriga<'a>(
    trigger: &'a PgTrigger<'a>,
) -> Result<Option<PgHeapTuple<'a, AllocatedByPostgres>>, PgTriggerError> {
    capture(trigger, Format::Sql)
}

/// jsontriga(queue_name, options...): ev_data the row as a JSON object,
/// ev_type `{"op":..,"table":[..],"pkey":[..]}`, ev_extra1 the table (PgQ's).
#[pg_trigger]
fn jsontriga<'a>(
    trigger: &'a PgTrigger<'a>,
) -> Result<Option<PgHeapTuple<'a, AllocatedByPostgres>>, PgTriggerError> {
    capture(trigger, Format::Json)
}

#[cfg(test)]
mod pure_tests {
    use super::*;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn arguments_parse_as_pgq_does() {
        let a = parse_args(&s(&[
            "q",
            "SKIP",
            "backup",
            "ignore=a,b",
            "pkey=id",
            "when=x > 1",
            "ev_extra4=upper(name)",
            "ev_type='custom'",
        ]))
        .unwrap();
        assert_eq!(a.queue, "q");
        assert!(a.skip && a.backup && !a.deny);
        assert_eq!(a.ignore.as_deref(), Some("a,b"));
        assert_eq!(a.pkey.as_deref(), Some("id"));
        assert_eq!(a.exprs[EV_WHEN].as_deref(), Some("x > 1"));
        assert_eq!(a.exprs[5].as_deref(), Some("upper(name)"));
        assert_eq!(a.exprs[EV_TYPE].as_deref(), Some("'custom'"));
        assert!(parse_args(&[]).is_err());
        assert!(
            parse_args(&s(&["q", "skip"])).is_err(),
            "PgQ spells it SKIP"
        );
        assert!(parse_args(&s(&["q", "colname=1"])).is_err());
        assert!(parse_args(&s(&["q", "ev_extra5=1"])).is_err());
    }

    #[test]
    fn lists_match_whole_items() {
        assert!(strlist_contains("a,b,c", "b"));
        assert!(strlist_contains("a, b", "b"));
        assert!(strlist_contains("id", "id"));
        assert!(!strlist_contains("ida,bid", "id"));
        assert!(strlist_contains("ida,id", "id"));
        assert!(!strlist_contains("", "id"));
    }

    #[test]
    fn encodings_match_pgq() {
        let mut o = String::new();
        urlencode(&mut o, "a b&c=d/é_.-");
        assert_eq!(o, "a+b%26c%3dd%2f%c3%a9_.-");
        let mut o = String::new();
        quote_literal(&mut o, "it's");
        assert_eq!(o, "'it''s'");
        let mut o = String::new();
        quote_literal(&mut o, "a\\b");
        assert_eq!(o, "E'a\\\\b'");
        let mut o = String::new();
        json_string(&mut o, "a\"b\\c\n\u{1}");
        assert_eq!(o, "\"a\\\"b\\\\c\\n\\u0001\"");
    }
}
