#!/usr/bin/env python3
"""Drafts the statements an upgrade script needs, from two install scripts.

Compares the frozen install script of the old version with the freshly
generated one of the new version, statement by statement, and prints on
stdout what the new version adds or changes, as SQL to paste into
sql/pgque--OLD--NEW.sql:

  * new or changed functions   -> CREATE OR REPLACE FUNCTION (flagged when the
                                  return type changed: that needs DROP + CREATE
                                  + GRANT by hand);
  * new tables, indexes, types, views, sequences -> the CREATE statement;
  * changed tables, types, sequences -> a HAND-WRITE block showing both
                                  definitions (write the ALTER TABLE yourself);
  * changed indexes            -> DROP INDEX + CREATE INDEX;
  * changed views              -> CREATE OR REPLACE VIEW (flagged: only works
                                  when columns are only appended);
  * new grants, config dumps, other statements, changed DO blocks -> as is;
  * objects that are gone      -> flagged (an upgrade must DROP them).

With --upgrade EXISTING.sql, statements the existing upgrade script already
has (same text, CREATE OR REPLACE counted as CREATE) are left out, so after a
merge only what is still missing is printed. A hand-written change is marked
in the upgrade script by the comment line the draft prints with it,
`-- handled: table queue <fingerprint of the new definition>`, and is then
left out too, until the definition changes again.

With --check-symbols LIB.so, also checks that every C symbol the scripts name
('MODULE_PATHNAME', 'xxx_wrapper') is exported by the library: the frozen
0.1.0 script is loaded against the current library, so a renamed Rust
function breaks `CREATE EXTENSION pgque VERSION '0.1.0'`.

Usage (from the repository root):
  cargo pgrx schema pg18 --no-default-features --features pg18 -o /tmp/pgque-new.sql
  python3 scripts/upgrade_draft.py sql/archive/pgque--0.2.0.sql /tmp/pgque-new.sql \\
      --upgrade sql/pgque--0.2.0--0.3.0.sql
  python3 scripts/upgrade_draft.py --check-symbols target/debug/libpgque.so sql/archive/pgque--0.1.0.sql
  (and the same for every frozen script in sql/archive/)

Exit status: 0 when nothing is missing, 1 when the draft is not empty (or a
symbol is missing), 2 on usage errors. A summary goes to stderr.
"""
import argparse
import hashlib
import re
import subprocess
import sys


def split_statements(sql):
    """Splits SQL text into statements at top-level semicolons; keeps the
    text of each statement (comments included) and knows about quotes,
    dollar quotes and comments."""
    out, start, i, n = [], 0, 0, len(sql)
    while i < n:
        c = sql[i]
        if sql.startswith("--", i):
            j = sql.find("\n", i)
            i = n if j < 0 else j + 1
        elif sql.startswith("/*", i):
            depth, i = 1, i + 2
            while i < n and depth:
                if sql.startswith("/*", i):
                    depth, i = depth + 1, i + 2
                elif sql.startswith("*/", i):
                    depth, i = depth - 1, i + 2
                else:
                    i += 1
        elif c == "'" or c == '"':
            i += 1
            while i < n:
                if sql[i] == c:
                    if i + 1 < n and sql[i + 1] == c:
                        i += 2
                        continue
                    break
                i += 1
            i += 1
        elif c == "$":
            m = re.match(r"\$([A-Za-z_][A-Za-z_0-9]*)?\$", sql[i:])
            if m:
                tag = m.group(0)
                j = sql.find(tag, i + len(tag))
                i = n if j < 0 else j + len(tag)
            else:
                i += 1
        elif c == ";":
            out.append(sql[start : i + 1])
            start = i = i + 1
        else:
            i += 1
    rest = sql[start:]
    if strip_comments(rest).strip():
        out.append(rest)
    return out


def strip_comments(s):
    """Removes -- and /* */ comments outside quotes; keeps everything else."""
    res, i, n = [], 0, len(s)
    while i < n:
        c = s[i]
        if s.startswith("--", i):
            j = s.find("\n", i)
            i = n if j < 0 else j
        elif s.startswith("/*", i):
            depth, i = 1, i + 2
            while i < n and depth:
                if s.startswith("/*", i):
                    depth, i = depth + 1, i + 2
                elif s.startswith("*/", i):
                    depth, i = depth - 1, i + 2
                else:
                    i += 1
            res.append(" ")
        elif c in "'\"":
            j = i + 1
            while j < n:
                if s[j] == c:
                    if j + 1 < n and s[j + 1] == c:
                        j += 2
                        continue
                    break
                j += 1
            res.append(s[i : j + 1])
            i = j + 1
        elif c == "$":
            m = re.match(r"\$([A-Za-z_][A-Za-z_0-9]*)?\$", s[i:])
            if m:
                tag = m.group(0)
                j = s.find(tag, i + len(tag))
                j = n if j < 0 else j + len(tag)
                res.append(s[i:j])
                i = j
            else:
                res.append(c)
                i += 1
        else:
            res.append(c)
            i += 1
    return "".join(res)


def normalize(stmt):
    """Comment-free, whitespace-collapsed text; CREATE OR REPLACE == CREATE."""
    s = re.sub(r"\s+", " ", strip_comments(stmt)).strip()
    s = re.sub(r"^CREATE OR REPLACE ", "CREATE ", s, flags=re.I)
    s = re.sub(r"\(\s+", "(", s)
    s = re.sub(r"\s+\)", ")", s)
    return s


def unquote_name(name):
    name = name.strip()
    parts = re.findall(r'"((?:[^"]|"")*)"|([^."]+)', name)
    names = [a.replace('""', '"') if a else b.lower() for a, b in parts]
    if len(names) > 1 and names[0] == "pgque":
        names = names[1:]
    return ".".join(names)


def top_level_args(s, open_at):
    """The text between the parenthesis at open_at and its match, and the
    index after the closing parenthesis."""
    depth, i = 0, open_at
    while i < len(s):
        if s[i] == "(":
            depth += 1
        elif s[i] == ")":
            depth -= 1
            if depth == 0:
                return s[open_at + 1 : i], i + 1
        elif s[i] in "'\"":
            q = s[i]
            i += 1
            while i < len(s) and s[i] != q:
                i += 1
        i += 1
    return s[open_at + 1 :], len(s)


def split_commas(s):
    parts, depth, cur = [], 0, ""
    for ch in s:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    if cur.strip():
        parts.append(cur)
    return parts


def arg_type(arg):
    a = re.split(r"\s+DEFAULT\s+|\s*=\s*", arg.strip(), maxsplit=1, flags=re.I)[0]
    a = re.sub(r"^(IN|OUT|INOUT|VARIADIC)\s+", "", a.strip(), flags=re.I)
    m = re.match(r'^("(?:[^"]|"")*"|[A-Za-z_][A-Za-z_0-9]*)\s+(.+)$', a)
    if m:  # "name" type
        a = m.group(2)
    return re.sub(r"\s+", " ", a).lower().replace("pgque.", "")


def classify(norm):
    """(kind, identity) of a normalized statement."""
    m = re.match(r"CREATE (?:OR REPLACE )?FUNCTION ([^(]+)\(", norm, re.I)
    if m:
        args, after = top_level_args(norm, m.end() - 1)
        types = [arg_type(a) for a in split_commas(args)]
        types = [t for t in types if not t.startswith("out ")]
        ret = re.match(r"\s*RETURNS\s+(.+?)\s+(?:LANGUAGE|SECURITY|SET|IMMUTABLE|STABLE|VOLATILE|STRICT|PARALLEL|COST|ROWS|AS)\b", norm[after:], re.I)
        return "function", f"{unquote_name(m.group(1))}({', '.join(types)})", (ret.group(1) if ret else "")
    m = re.match(r"CREATE (?:UNIQUE )?INDEX (?:IF NOT EXISTS )?(\S+)", norm, re.I)
    if m:
        return "index", unquote_name(m.group(1)), None
    m = re.match(r"CREATE (?:OR REPLACE )?(?:TEMP |UNLOGGED )?(TABLE|VIEW|SEQUENCE|TYPE|SCHEMA|ROLE) (?:IF NOT EXISTS )?([^ (]+)", norm, re.I)
    if m:
        return m.group(1).lower(), unquote_name(m.group(2)), None
    m = re.match(r"DO (\$[A-Za-z_0-9]*\$)", norm, re.I)
    if m:
        return "do", m.group(1), None
    return "statement", norm, None


def parse(path):
    text = open(path, encoding="utf-8").read()
    # psql meta-commands (\echo ... \quit): CREATE EXTENSION skips these lines.
    text = re.sub(r"(?m)^\\echo.*$", "", text)
    items = {}
    order = []
    for raw in split_statements(text):
        norm = normalize(raw)
        if not norm or norm.startswith("\\echo"):
            continue
        kind, ident, extra = classify(norm)
        key = (kind, ident)
        if key in items:  # e.g. two identical GRANTs: keep the first
            continue
        raw = re.sub(r"(?m)[ \t]+$", "", strip_comments(raw)).strip()
        items[key] = {"raw": raw, "norm": norm, "extra": extra}
        order.append(key)
    return items, order


def handled_marks(text):
    """The `-- handled: KIND NAME MARK` lines of an upgrade script, as
    (kind, name, mark) with MARK a fingerprint or `gone`. NAME is what this
    tool prints: a function's with its argument list, spaces and all
    (`function receive(text, text, integer) 1a2b3c4d5e`)."""
    return {(k.lower(), re.sub(r"\s+", " ", n.strip()), h)
            for k, n, h in re.findall(r"(?m)^\s*--\s*handled:\s*(\w+)\s+(.+?)\s+(\w+)\s*$", text)}


def digest(norm):
    """Short fingerprint of a statement: a `-- handled:` mark names the
    definition it was written for, so a later change is flagged again."""
    return hashlib.sha1(norm.encode()).hexdigest()[:10]


def or_replace(raw, what):
    return re.sub(r"^CREATE\s+(?:OR\s+REPLACE\s+)?" + what, "CREATE OR REPLACE " + what, raw, count=1, flags=re.I)


def symbols_of(path):
    text = open(path, encoding="utf-8").read()
    return set(re.findall(r"'MODULE_PATHNAME'\s*,\s*'([^']+)'", text))


def check_symbols(lib, scripts):
    out = subprocess.run(["nm", "-D", "--defined-only", lib], capture_output=True, text=True, check=True).stdout
    have = {line.split()[-1] for line in out.splitlines() if line.strip()}
    bad = 0
    for s in scripts:
        missing = sorted(symbols_of(s) - have)
        for sym in missing:
            print(f"MISSING SYMBOL {sym} (named by {s}) in {lib}", file=sys.stderr)
        bad += len(missing)
        print(f"{s}: {len(symbols_of(s))} C symbols, {len(missing)} missing from {lib}", file=sys.stderr)
    return bad


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("old", nargs="?", help="frozen install script of the old version")
    ap.add_argument("new", nargs="?", help="generated install script of the new version")
    ap.add_argument("--upgrade", help="existing upgrade script: leave out what it already has")
    ap.add_argument("--check-symbols", metavar="LIB", help="check the C symbols of the scripts against LIB")
    a = ap.parse_args()

    if a.check_symbols:
        scripts = [s for s in (a.old, a.new) if s]
        if not scripts:
            ap.error("--check-symbols needs at least one script")
        bad = check_symbols(a.check_symbols, scripts)
        if not a.new:
            return 1 if bad else 0
    if not (a.old and a.new):
        ap.error("need OLD and NEW scripts")

    old, _ = parse(a.old)
    new, order = parse(a.new)
    have, handled = set(), set()
    if a.upgrade:
        up, _ = parse(a.upgrade)
        have = {v["norm"] for v in up.values()}
        # A hand-written ALTER is marked in the upgrade script with a comment
        # line `-- handled: table queue` (kind and name as this tool prints them).
        text = open(a.upgrade, encoding="utf-8").read()
        handled = handled_marks(text)

    out, flags, counts = [], [], {}

    def emit(tag, key, sql):
        counts[tag] = counts.get(tag, 0) + 1
        out.append(f"-- {tag}: {key[0]} {key[1][:100]}\n{sql}\n")

    for key in order:
        n = new[key]
        o = old.get(key)
        if o and o["norm"] == n["norm"]:
            continue
        if n["norm"] in have or (key[0], key[1], digest(n["norm"])) in handled:
            continue
        kind = key[0]
        if kind == "function":
            sql = or_replace(n["raw"], "FUNCTION")
            if o and o["extra"] != n["extra"]:
                flags.append(f"function {key[1]}: return type {o['extra']!r} -> {n['extra']!r}")
                sql = (f"-- HAND-WRITE: the return type changed; CREATE OR REPLACE cannot do that:\n"
                       f"-- DROP FUNCTION pgque.{key[1]}; then CREATE, then its GRANT again; then mark it done with\n"
                       f"-- handled: function {key[1]} {digest(n['norm'])}\n{sql}")
            emit("CHANGED" if o else "NEW", key, sql)
        elif kind in ("table", "type", "sequence") and o:
            flags.append(f"{kind} {key[1]} changed")
            body = "\n".join("--   " + l for l in o["raw"].splitlines())
            emit("CHANGED", key, f"-- HAND-WRITE an ALTER {kind.upper()} for pgque.{key[1]}, then mark it done with\n"
                 f"-- handled: {kind} {key[1]} {digest(n['norm'])}\n-- Was:\n{body}\n-- Now:\n"
                 + "\n".join("--   " + l for l in n["raw"].splitlines()))
        elif kind == "index" and o:
            emit("CHANGED", key, f"DROP INDEX pgque.{key[1]};\n{n['raw']}")
        elif kind == "view" and o:
            flags.append(f"view {key[1]} changed (CREATE OR REPLACE VIEW only appends columns)")
            emit("CHANGED", key, or_replace(n["raw"], "VIEW"))
        elif kind == "do" and o:
            emit("CHANGED", key, n["raw"])
        else:
            if kind == "statement" and re.match(r"INSERT ", n["norm"], re.I):
                flags.append(f"seed row: {n['norm'][:80]} (only if the table is new)")
            emit("NEW" if not o else "CHANGED", key, n["raw"])

    for key in old:
        if key not in new and key[0] != "statement" and (key[0], key[1], "gone") not in handled:
            flags.append(f"{key[0]} {key[1]} is gone from the new script: the upgrade must DROP it")
            out.append(f"-- GONE: {key[0]} {key[1]}\n-- HAND-WRITE the DROP (and check nothing depends on it), then mark it done with\n"
                       f"-- handled: {key[0]} {key[1]} gone\n")
            counts["GONE"] = counts.get("GONE", 0) + 1

    print(f"-- draft: {a.old} -> {a.new}" + (f" (without what {a.upgrade} has)" if a.upgrade else ""))
    print("\n".join(out))
    summary = ", ".join(f"{v} {k.lower()}" for k, v in sorted(counts.items())) or "nothing"
    print(f"upgrade_draft: {summary}", file=sys.stderr)
    for f in flags:
        print(f"  HAND-WRITE: {f}", file=sys.stderr)
    return 1 if out else 0


def self_test():
    """The marks parse as the draft prints them (run by `make lint`)."""
    text = ("-- handled: table queue 0123456789\n"
            "  --  handled: function receive(text, text, integer) abcdef0123\n"
            "-- handled: function gone_one(text,  bigint[]) gone\n"
            "SELECT 1; -- handled: table not_a_mark 0000000000\n")
    got = handled_marks(text)
    want = {("table", "queue", "0123456789"),
            ("function", "receive(text, text, integer)", "abcdef0123"),
            ("function", "gone_one(text, bigint[])", "gone")}
    assert got == want, got
    norm = normalize("CREATE FUNCTION pgque.receive(queue_name text, consumer text, max_return integer DEFAULT 100) "
                     "RETURNS SETOF pgque.message LANGUAGE c AS 'MODULE_PATHNAME', 'receive_wrapper';")
    assert classify(norm)[:2] == ("function", "receive(text, text, integer)"), classify(norm)
    print("upgrade_draft.py self-test: ok")


if __name__ == "__main__":
    if sys.argv[1:] == ["--self-test"]:
        self_test()
        sys.exit(0)
    sys.exit(main())
