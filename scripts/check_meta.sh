#!/usr/bin/env bash
# META.json (PGXN) must carry Cargo.toml's version, in both places PGXN reads
# it (the distribution and provides.pgque): a release that bumps one and not
# the other publishes a wrong version. Run by make lint and make package.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
want=$(sed -n 's/^version = "\(.*\)"$/\1/p' "$ROOT/Cargo.toml" | head -1)
[ -n "$want" ] || { echo "check_meta.sh: no version in Cargo.toml" >&2; exit 1; }
[ -f "$ROOT/META.json" ] || { echo "check_meta.sh: no META.json" >&2; exit 1; }
python3 - "$ROOT/META.json" "$want" <<'PY'
import json, sys
path, want = sys.argv[1], sys.argv[2]
try:
    m = json.load(open(path))
except ValueError as e:
    sys.exit(f"check_meta.sh: META.json is not JSON: {e}")
got = {"version": m.get("version"),
       "provides.pgque.version": m.get("provides", {}).get("pgque", {}).get("version")}
bad = {k: v for k, v in got.items() if v != want}
if bad:
    sys.exit(f"check_meta.sh: META.json {bad} but Cargo.toml says {want}")
for k in ("name", "abstract", "maintainer", "license", "meta-spec", "provides"):
    if k not in m:
        sys.exit(f"check_meta.sh: META.json lacks required key {k}")
print(f"check_meta.sh: META.json version {want} matches Cargo.toml")
PY
