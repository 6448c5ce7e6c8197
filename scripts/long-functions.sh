#!/usr/bin/env bash
# Lists every function (methods, tests and nested functions included) longer than LIMIT lines
# (default 80) in the repository's tracked Rust files, longest first:
#
#   bash scripts/long-functions.sh            # LIMIT=60 bash scripts/long-functions.sh
#
# A function's length runs from the line of its `fn` to its closing brace (doc comments and
# attributes not counted). Braces are matched after removing comments, strings and character
# literals; closures are part of the function that holds them.
# Exit status: 0 when none is over the limit, 1 when some are, 2 on a usage error.
set -euo pipefail
cd "$(dirname "$0")/.."
limit="${LIMIT:-80}"
[[ "$limit" =~ ^[0-9]{1,4}$ ]] || { echo "long-functions: LIMIT is a line count" >&2; exit 2; }
mapfile -d '' files < <(git ls-files -z '*.rs')
program=$(cat <<'PY'
import re, sys

limit = int(sys.argv[1])
fn_re = re.compile(
    r'^\s*(?:pub(?:\([^)]*\))?\s+)?(?:default\s+)?(?:const\s+)?(?:async\s+)?(?:unsafe\s+)?'
    r'(?:extern\s+"[^"]*"\s+)?fn\s+([A-Za-z_][A-Za-z0-9_]*)')
char_re = re.compile(r"'(\\u\{[0-9a-fA-F]+\}|\\.|[^\\'])'")


def code_of(line, state):
    """The line without comments, strings and char literals; `state` carries an open
    block comment or string to the next line."""
    out, i, n = [], 0, len(line)
    while i < n:
        if state['in'] == 'block':
            j = line.find('*/', i)
            if j < 0:
                return ''.join(out)
            state['in'], i = None, j + 2
            continue
        if state['in'] == 'str':
            while i < n and line[i] != '"':
                i += 2 if line[i] == '\\' else 1
            if i >= n:
                return ''.join(out)
            state['in'], i = None, i + 1
            continue
        if line.startswith('//', i):
            break
        if line.startswith('/*', i):
            state['in'], i = 'block', i + 2
            continue
        raw = re.match(r'r(#*)"', line[i:]) if line[i] == 'r' and (i == 0 or not line[i - 1].isalnum()) else None
        if raw:
            end = line.find('"' + raw.group(1), i + raw.end())
            if end < 0:
                return ''.join(out)  # a raw string over several lines: rare, not followed
            i = end + 1 + len(raw.group(1))
            continue
        if line[i] == '"':
            state['in'], i = 'str', i + 1
            continue
        if line[i] == "'":
            m = char_re.match(line, i)
            if m:
                i = m.end()
                continue
        out.append(line[i])
        i += 1
    return ''.join(out)


found = []
for path in sys.argv[2:]:
    state = {'in': None}
    stack, depth, nest, pending = [], 0, 0, None
    for no, line in enumerate(open(path, encoding='utf-8'), 1):
        code = code_of(line.rstrip('\n'), state)
        m = fn_re.match(code)
        if m:
            pending, nest = (m.group(1), no), 0
        for ch in code:
            if ch in '([':
                nest += 1
            elif ch in ')]':
                nest -= 1
            elif ch == '{':
                depth += 1
                if pending:
                    stack.append((pending[0], pending[1], depth))
                    pending = None
            elif ch == '}':
                if stack and stack[-1][2] == depth:
                    name, start, _ = stack.pop()
                    if no - start + 1 > limit:
                        found.append((no - start + 1, f'{path}:{start}', name))
                depth -= 1
            elif ch == ';' and pending and nest == 0:
                pending = None  # a declaration without a body
for length, where, name in sorted(found, reverse=True):
    print(f'{length:5d}  {where}  {name}')
sys.exit(1 if found else 0)
PY
)
python3 -c "$program" "$limit" "${files[@]}"
