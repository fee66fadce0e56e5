#!/usr/bin/env bash
# Prints the `swift test --filter` regular expression that selects the suites tagged `.postgres`, the ones
# Scripts/test.sh runs a second time on PostgreSQL. Needs the tests built (`swift build --build-tests`).
#
# SwiftPM 6.3's `swift test` has no tag filter (`--filter` takes regular expressions of test names only), so
# the names come from the source: every `@Suite(..., .tags(.postgres))` under Tests/<target>/, with the suite
# it is attached to (the type declared on the same line or the next declaration line) and the target from the
# directory. Renaming a suite renames its entry here; moving it to another target moves it too. The script
# stops with an error, and so does Scripts/test.sh, when
# - a `.postgres` tag is not on a top-level suite (a test function or a nested suite: its name would not be
#   `<target>.<suite>/` and the filter would miss it), or
# - a tagged suite matches no test in `swift test list` (it would silently run nothing on PostgreSQL), or
# - no suite is tagged at all.
# On success it also writes to stderr how many suites and tests the filter selects.
set -euo pipefail
cd "$(dirname "$0")/.."

suites=$(
    for directory in Tests/*/; do
        target=$(basename "$directory")
        find "$directory" -name '*.swift' -print0 | sort -z | while IFS= read -r -d '' file; do
            awk -v target="$target" '
                /^[[:space:]]*\/\// { next }
                /\.tags\([^)]*\.postgres/ { pending = 1; tagged = FNR }
                pending && match($0, /(struct|class|enum|actor|extension|func)[[:space:]]+[A-Za-z_][A-Za-z0-9_]*/) {
                    split(substr($0, RSTART, RLENGTH), declaration, /[[:space:]]+/)
                    if (declaration[1] == "func" || declaration[1] == "extension" || $0 ~ /^[[:space:]]/) {
                        print "ERROR\t" FILENAME ":" tagged ": the .postgres tag belongs on a top-level @Suite"
                    } else {
                        print target "\t" declaration[2]
                    }
                    pending = 0
                }
                END { if (pending) print "ERROR\t" FILENAME ":" tagged ": no declaration after the .postgres tag" }
            ' "$file"
        done
    done
)

if grep -q '^ERROR' <<<"$suites"; then
    grep '^ERROR' <<<"$suites" | cut -f2- | sed 's/^/postgres-suites.sh: /' >&2
    exit 1
fi
if [ -z "$suites" ]; then
    echo "postgres-suites.sh: no suite is tagged .postgres under Tests/" >&2
    exit 1
fi

if ! listing=$(swift test list --skip-build 2>/dev/null); then
    echo "postgres-suites.sh: 'swift test list --skip-build' failed (build the tests first)" >&2
    exit 1
fi
filter=""
total=0
count=0
while IFS=$'\t' read -r target suite; do
    matched=$(grep -c -E "^${target}\.${suite}/" <<<"$listing" || true)
    if [ "$matched" -eq 0 ]; then
        echo "postgres-suites.sh: the suite ${target}.${suite} is tagged .postgres but matches no test in" \
             "'swift test list' (build the tests first)" >&2
        exit 1
    fi
    total=$((total + matched))
    count=$((count + 1))
    filter+="${filter:+|}${target}\\.${suite}/"
done <<<"$suites"

echo "postgres-suites.sh: $count suites tagged .postgres, $total tests" >&2
echo "$filter"
