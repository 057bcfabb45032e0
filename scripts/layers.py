#!/usr/bin/env python3
"""The house rule of docs/design/layers.md, checked: dependencies point one way.

Builds the module graph of each product crate from every `crate::`, `super::`
and `self::` path (in `use` trees, inline paths and macro bodies alike, since
the scan reads the text with comments and string literals blanked), plus
paths through a child module's or an imported module's name. Then it fails
when

- a module reaches a module of a higher layer (LAYERS below),
- the graph has a cycle (each strongly connected component is printed with
  the edges that make it, file and line of each),
- product code names a test-only module (`#[cfg(test)]` / `cfg(any(test,
  ...))` modules are test code: they may import anything, nothing imports
  them outside tests).

Code under a test-only `#[cfg]` attribute is left out of the graph.

    python3 scripts/layers.py          # check; exit 1 with the findings
    python3 scripts/layers.py --graph  # also print every edge
    python3 scripts/layers.py --self-test
"""
from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass, field

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Each crate: its source dir, its root file, and its layers from the bottom
# up. A module's layer is that of the longest prefix listed; every module of
# the crate must match one. A module may import its own layer (no cycle) and
# any layer below; never one above.
CRATES = {
    "pgque": {
        "dir": "src",
        "root": "lib.rs",
        "layers": [
            # 0: what everything shares: settings, errors, shared memory and
            # the pool's rules for it, the commit-time wake-ups, pgque's own
            # locks, argument datums, jsonb text, materialized sets, header
            # checks and schema probes.
            ["crate::gucs", "crate::error", "crate::shmem", "crate::pool",
             "crate::wake", "crate::waiters", "crate::locks", "crate::datum", "crate::jsontext",
             "crate::materialize", "crate::headers"],
            # 1: the engines: the event log and the job log.
            ["crate::log", "crate::jobs::log"],
            # 2: the SQL API over them.
            ["crate::api", "crate::jobs", "crate::schedules", "crate::explorer"],
            # 3: what runs and reads everything: the worker, metrics, admin,
            # and the crate root that declares the modules and starts them.
            ["crate::worker", "crate::metrics", "crate::admin", "crate"],
        ],
    },
    "pgque-web": {
        "dir": "web/src",
        "root": "main.rs",
        "layers": [
            # 0: the HTML kit every page uses, and the database access.
            ["crate::html", "crate::db"],
            # 1: sign-in and the request guard.
            ["crate::auth", "crate::guard"],
            # 2: the pages and exports.
            ["crate::pages", "crate::charts", "crate::events", "crate::explorer",
             "crate::history", "crate::prom"],
            # 3: the server: routes and handlers.
            ["crate"],
        ],
    },
}


# ---- reading Rust text ----------------------------------------------------

def blank_comments_and_strings(src: str) -> str:
    """The source with comments, string and char literals replaced by spaces
    (newlines kept, so offsets and line numbers stay)."""
    out = list(src)
    i, n = 0, len(src)

    def blank(a: int, b: int) -> None:
        for k in range(a, min(b, n)):
            if out[k] != "\n":
                out[k] = " "

    while i < n:
        c = src[i]
        if src.startswith("//", i):
            j = src.find("\n", i)
            j = n if j < 0 else j
            blank(i, j)
            i = j
        elif src.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if src.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif src.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            blank(i, j)
            i = j
        elif (m := re.match(r'b?r(#*)"', src[i:i + 260])) and (i == 0 or not (src[i - 1].isalnum() or src[i - 1] == "_")):
            end = '"' + m.group(1)
            j = src.find(end, i + m.end())
            j = n if j < 0 else j + len(end)
            blank(i, j)
            i = j
        elif c == '"' or (c == "b" and src.startswith('b"', i) and (i == 0 or not (src[i - 1].isalnum() or src[i - 1] == "_"))):
            j = i + (2 if c == "b" else 1)
            while j < n and src[j] != '"':
                j += 2 if src[j] == "\\" else 1
            blank(i, j + 1)
            i = j + 1
        elif c == "'":
            # A char literal ('x', '\n', '\u{1F600}') or a lifetime ('a).
            m = re.match(r"'(\\u\{[0-9a-fA-F]+\}|\\.|[^\\'\n])'", src[i:i + 14])
            if m:
                blank(i, i + m.end())
                i += m.end()
            else:
                i += 1
        else:
            i += 1
    return "".join(out)


def matching_brace(text: str, open_at: int) -> int:
    """Index just past the brace that closes the one at open_at."""
    depth = 0
    for k in range(open_at, len(text)):
        if text[k] == "{":
            depth += 1
        elif text[k] == "}":
            depth -= 1
            if depth == 0:
                return k + 1
    return len(text)


TEST_CFG = re.compile(r"#\[cfg\((?P<body>[^\]]*)\)\]")


def is_test_cfg(body: str) -> bool:
    """cfg(test) and cfg(any(test, ...)) gate test-only code; cfg(not(test))
    and cfg(all(..., test)) with a non-test alternative do not count."""
    body = body.replace(" ", "")
    return body == "test" or (body.startswith("any(") and "test" in re.split(r"[(),]", body)
                              and "not(test)" not in body)


def test_spans(text: str) -> list[tuple[int, int, str | None]]:
    """Spans of items under a test-only #[cfg]: (start, end, mod name or None).
    A `mod x;` declaration gives its name and no body."""
    spans = []
    for m in TEST_CFG.finditer(text):
        if not is_test_cfg(m.group("body")):
            continue
        k = m.end()
        # Further attributes (#[path = ...], #[pg_schema]) before the item.
        while True:
            a = re.match(r"\s*#\[[^\]]*\]", text[k:])
            if not a:
                break
            k += a.end()
        semi, brace = text.find(";", k), text.find("{", k)
        name = None
        mm = re.match(r"\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+(\w+)", text[k:])
        if mm:
            name = mm.group(1)
        if brace >= 0 and (semi < 0 or brace < semi):
            spans.append((m.start(), matching_brace(text, brace), name))
        else:
            spans.append((m.start(), semi + 1 if semi >= 0 else len(text), name))
    return spans


def expand_use_tree(tree: str) -> list[list[str]]:
    """`a::{b, c::{d, self}, e as f}` -> [[a,b], [a,c,d], [a,c], [a,e]]."""
    tree = re.sub(r"\s+", "", re.sub(r"\s+as\s+", "@", tree))

    def parse(s: str, prefix: list[str]) -> list[list[str]]:
        out = []
        for part in split_top(s):
            if not part:
                continue
            if "{" in part:
                head, rest = part.split("{", 1)
                body = rest[: rest.rfind("}")]
                out += parse(body, prefix + [x for x in head.split("::") if x])
            else:
                segs = [x for x in part.split("@")[0].split("::") if x]
                if segs and segs[-1] == "self":
                    segs = segs[:-1]
                out.append(prefix + segs)
        return out

    return parse(tree, [])


def split_top(s: str) -> list[str]:
    parts, depth, cur = [], 0, ""
    for ch in s:
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    parts.append(cur)
    return parts


# ---- the crate's modules -------------------------------------------------

@dataclass
class Module:
    path: str                 # crate::a::b
    file: str                 # relative to ROOT
    test: bool = False        # test-only
    children: set[str] = field(default_factory=set)


@dataclass
class Edge:
    src: str
    dst: str
    file: str
    line: int
    text: str


def scan_crate(name: str, cfg: dict, root: str = ROOT) -> tuple[dict[str, Module], list[Edge]]:
    base = os.path.join(root, cfg["dir"])
    modules: dict[str, Module] = {}
    texts: dict[str, tuple[str, str, list]] = {}

    def load(modpath: str, fpath: str, test: bool) -> None:
        rel = os.path.relpath(fpath, root)
        with open(fpath, encoding="utf-8") as f:
            raw = f.read()
        text = blank_comments_and_strings(raw)
        spans = test_spans(text)
        modules[modpath] = Module(modpath, rel, test)
        texts[modpath] = (text, raw, spans)
        is_dir_owner = os.path.basename(fpath) in ("mod.rs", "lib.rs", "main.rs")
        here = os.path.dirname(fpath) if is_dir_owner else os.path.splitext(fpath)[0]
        for m in re.finditer(r"^[ \t]*((?:#\[[^\]]*\]\s*)*)(?:pub(?:\([^)]*\))?\s+)?mod\s+(\w+)\s*;", text, re.M):
            attrs, child = m.group(1), m.group(2)
            pm = re.search(r'#\[path\s*=\s*"([^"]+)"\]', raw[m.start():m.end()])
            if pm:
                cfile = os.path.join(os.path.dirname(fpath) if is_dir_owner else os.path.dirname(fpath), pm.group(1))
            elif os.path.exists(os.path.join(here, child + ".rs")):
                cfile = os.path.join(here, child + ".rs")
            else:
                cfile = os.path.join(here, child, "mod.rs")
            ctest = test or any(a <= m.start() < b and nm == child for a, b, nm in spans) \
                or any(is_test_cfg(c.group("body")) for c in TEST_CFG.finditer(attrs))
            cpath = f"{modpath}::{child}"
            modules[modpath].children.add(child)
            load(cpath, cfile, ctest)
        # Inline modules (`mod tests { ... }`): part of this file; test ones
        # are skipped with the spans, others are rare enough to fold in.

    load("crate", os.path.join(base, cfg["root"]), False)

    edges: list[Edge] = []
    known = set(modules)

    def resolve(segs: list[str], here: str) -> str | None:
        """The module a path names: the longest known module prefix."""
        if not segs:
            return None
        cur: list[str]
        if segs[0] == "crate":
            cur, rest = ["crate"], segs[1:]
        elif segs[0] in ("super", "self"):
            cur, rest = here.split("::"), segs
            while rest and rest[0] in ("super", "self"):
                if rest[0] == "super":
                    cur = cur[:-1]
                rest = rest[1:]
            if not cur:
                return None
        else:
            return None
        best = "::".join(cur)
        for s in rest:
            cand = "::".join(cur + [s])
            if cand in known:
                cur.append(s)
                best = cand
            else:
                break
        return best

    # Macros: `#[macro_export]` ones live at the crate root by path but in
    # the module whose file defines them; a call (`crate::m!` or a bare `m!`
    # of a macro that this file does not define) is an edge to that module.
    macros: dict[str, set[str]] = {}
    for modpath, (text, _raw, spans) in texts.items():
        for mm in re.finditer(r"\bmacro_rules!\s*(\w+)", text):
            if not modules[modpath].test and not any(a <= mm.start() < b for a, b, _ in spans):
                macros.setdefault(mm.group(1), set()).add(modpath)

    for modpath, (text, raw, spans) in texts.items():
        mod = modules[modpath]
        if mod.test:
            continue
        file = mod.file

        def in_test(pos: int) -> bool:
            return any(a <= pos < b for a, b, _ in spans)

        def line_of(pos: int) -> int:
            return text.count("\n", 0, pos) + 1

        # Names that stand for modules here: children, and modules imported
        # by `use`.
        alias: dict[str, str] = {c: f"{modpath}::{c}" for c in mod.children}
        for um in re.finditer(r"\buse\s+([^;]+);", text):
            if in_test(um.start()):
                continue
            for segs in expand_use_tree(um.group(1)):
                if not segs:
                    continue
                if segs[0] in alias and segs[0] not in ("crate", "super", "self"):
                    segs = alias[segs[0]].split("::") + segs[1:]
                target = resolve(segs, modpath)
                if target is None:
                    continue
                lastseg = segs[-1]
                if target.endswith("::" + lastseg) or (lastseg in ("super", "self")):
                    alias[lastseg] = target
                # `use x as y;` of a module.
                am = re.search(r"\b" + re.escape(lastseg) + r"\s+as\s+(\w+)", um.group(1))
                if am and target.endswith("::" + lastseg):
                    alias[am.group(1)] = target
                if target != modpath:
                    edges.append(Edge(modpath, target, file, line_of(um.start()),
                                      raw.splitlines()[line_of(um.start()) - 1].strip()))
        # Inline paths.
        use_spans = [(u.start(), u.end()) for u in re.finditer(r"\buse\s+[^;]+;", text)]
        names = "|".join(sorted(set(["crate", "super", "self"]) | set(alias), key=len, reverse=True))
        for pm in re.finditer(r"(?<![\w:])(" + names + r")((?:\s*::\s*\w+)+)(!?)", text):
            if in_test(pm.start()) or any(a <= pm.start() < b for a, b in use_spans) or pm.group(3):
                continue
            segs = [pm.group(1)] + [s for s in re.split(r"\s*::\s*", pm.group(2)) if s]
            if segs[0] in alias and segs[0] not in ("crate", "super", "self"):
                if re.match(r"\w", text[pm.start() - 1:pm.start()] or " "):
                    continue
                segs = alias[segs[0]].split("::") + segs[1:]
            target = resolve(segs, modpath)
            if target and target != modpath:
                ln = line_of(pm.start())
                edges.append(Edge(modpath, target, file, ln, raw.splitlines()[ln - 1].strip()))
        own = {m.group(1) for m in re.finditer(r"\bmacro_rules!\s*(\w+)", text)}
        for cm in re.finditer(r"(?<![\w])((?:crate\s*::\s*)?)(\w+)!", text):
            name = cm.group(2)
            if name in ("macro_rules",) or in_test(cm.start()) or name not in macros:
                continue
            if not cm.group(1) and name in own:
                continue
            ln = line_of(cm.start())
            for target in sorted(macros[name]):
                if target != modpath:
                    edges.append(Edge(modpath, target, file, ln, raw.splitlines()[ln - 1].strip()))
    return modules, edges


def layer_of(modpath: str, layers: list[list[str]]) -> int | None:
    best, best_len = None, -1
    for i, prefixes in enumerate(layers):
        for p in prefixes:
            if (modpath == p or modpath.startswith(p + "::")) and len(p) > best_len:
                best, best_len = i, len(p)
    return best


def sccs(nodes: list[str], adj: dict[str, set[str]]) -> list[list[str]]:
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]
    sys.setrecursionlimit(10000)

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(adj.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(nodes):
        if v not in index:
            visit(v)
    return out


def check(show_graph: bool = False, crates: dict | None = None, root: str = ROOT) -> list[str]:
    problems: list[str] = []
    for cname, cfg in (crates or CRATES).items():
        modules, edges = scan_crate(cname, cfg, root)
        layers = cfg["layers"]
        for m in sorted(modules):
            if not modules[m].test and layer_of(m, layers) is None:
                problems.append(f"{cname}: {m} ({modules[m].file}) is in no layer: add it to scripts/layers.py")
        seen = set()
        adj: dict[str, set[str]] = {}
        for e in edges:
            key = (e.src, e.dst, e.line)
            if key in seen:
                continue
            seen.add(key)
            if show_graph:
                print(f"{cname}: {e.src} -> {e.dst}   {e.file}:{e.line}")
            # A module's own descendants are part of it for the cycle check
            # when the parent only declares them; real uses count as edges.
            adj.setdefault(e.src, set()).add(e.dst)
            if modules.get(e.dst) and modules[e.dst].test:
                problems.append(f"{cname}: product code names test-only {e.dst}: {e.file}:{e.line}: {e.text}")
                continue
            ls, ld = layer_of(e.src, layers), layer_of(e.dst, layers)
            if ls is not None and ld is not None and ld > ls:
                problems.append(f"{cname}: {e.src} (layer {ls}) reaches up to {e.dst} (layer {ld}): "
                                f"{e.file}:{e.line}: {e.text}")
        for comp in sccs(list(modules), adj):
            members = set(comp)
            lines = [f"{cname}: cycle among {', '.join(comp)}:"]
            shown = set()
            for e in edges:
                if e.src in members and e.dst in members and (e.src, e.dst) not in shown:
                    shown.add((e.src, e.dst))
                    lines.append(f"    {e.src} -> {e.dst}   {e.file}:{e.line}: {e.text}")
            problems.append("\n".join(lines))
    return problems


# ---- self-test: the scanner on known snippets ------------------------------

def self_test() -> None:
    t = blank_comments_and_strings('let s = "crate::x {"; // crate::y\n/* crate::z */ crate::w::f(\'}\');')
    assert "crate::x" not in t and "crate::y" not in t and "crate::z" not in t and "crate::w" in t, t
    t = blank_comments_and_strings('r#"crate::a"# fn f<\'a>(x: &\'a str) { crate::b }')
    assert "crate::a" not in t and "crate::b" in t, t
    assert expand_use_tree("crate::{a::{b, self}, c as d}") == [["crate", "a", "b"], ["crate", "a"], ["crate", "c"]], \
        expand_use_tree("crate::{a::{b, self}, c as d}")
    assert is_test_cfg("test") and is_test_cfg('any(test, feature = "pg_test")') and not is_test_cfg("not(test)")
    spans = test_spans('fn a() {}\n#[cfg(test)]\nmod tests { use crate::x; fn f() { {} } }\nfn b() { crate::y }')
    assert len(spans) == 1 and spans[0][2] == "tests"
    # A crate made to break each rule once: every break is found, and the
    # same crate without them passes.
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        os.makedirs(os.path.join(d, "src", "eng"))
        files = {
            "lib.rs": "pub mod base;\npub mod eng;\npub mod api;\n#[cfg(test)]\nmod testkit;\n",
            "base.rs": "pub fn b() {}\n",
            "eng/mod.rs": "pub mod a;\npub mod b;\npub use a::x;\n",
            "eng/a.rs": "use super::b::y;\npub fn x() { y() }\n",
            "eng/b.rs": "pub fn y() { crate::base::b() }\n",
            "api.rs": "use crate::eng;\npub fn f() { eng::x(); crate::eng::b::y(); }\n",
            "testkit.rs": "pub fn t() {}\n",
        }
        for f, t in files.items():
            with open(os.path.join(d, "src", f), "w") as fh:
                fh.write(t)
        cfg = {"k": {"dir": "src", "root": "lib.rs",
                     "layers": [["crate::base"], ["crate::eng"], ["crate::api", "crate"]]}}
        assert check(crates=cfg, root=d) == [], check(crates=cfg, root=d)
        breaks = {
            "eng/b.rs": "pub fn y() { crate::base::b(); crate::api::f() }\n",  # up a layer
            "base.rs": "pub fn b() {}\nmacro_rules! m { () => {} }\n",
        }
        with open(os.path.join(d, "src", "eng/b.rs"), "w") as fh:
            fh.write(breaks["eng/b.rs"])
        found = "\n".join(check(crates=cfg, root=d))
        assert "crate::eng::b (layer 1) reaches up to crate::api (layer 2)" in found, found
        assert "cycle among" in found, found
        with open(os.path.join(d, "src", "eng/b.rs"), "w") as fh:
            fh.write("pub fn y() { crate::m!(); super::a::x() }\n")  # a cycle inside a layer
        with open(os.path.join(d, "src", "eng/a.rs"), "w") as fh:
            fh.write("use super::b::y;\npub fn x() { y() }\nmacro_rules! m { () => {} }\n")
        found = "\n".join(check(crates=cfg, root=d))
        assert "cycle among crate::eng::a, crate::eng::b" in found, found
        with open(os.path.join(d, "src", "api.rs"), "w") as fh:
            fh.write("pub fn f() { crate::testkit::t() }\n")  # product code naming a test module
        found = "\n".join(check(crates=cfg, root=d))
        assert "product code names test-only crate::testkit" in found, found
    print("layers.py self-test: ok")


def main() -> int:
    if "--self-test" in sys.argv:
        self_test()
        return 0
    problems = check("--graph" in sys.argv)
    if problems:
        print("\n".join(problems))
        print(f"layers: {len(problems)} problem(s); the rule and the layers: docs/design/layers.md")
        return 1
    print("layers: dependencies point one way (" + ", ".join(CRATES) + ")")
    return 0


if __name__ == "__main__":
    sys.exit(main())
