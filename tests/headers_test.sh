#!/bin/sh
# headers_test.sh - every public header compiles when it is the only one a
# program includes (C11 with the project's warnings as errors; C++ too when
# a C++ compiler is there): the headers read like a manual, one at a time.
set -eu
cc=${CC:-cc}
n=0
for h in include/mixprec.h include/mixprec/*.h; do
    name=${h#include/}
    printf '#include <%s>\nint main(void) { return 0; }\n' "$name" |
        $cc -std=c11 -Wall -Wextra -Wpedantic -Werror -Iinclude -fsyntax-only -x c - ||
        { echo "headers: <$name> does not compile alone (C)" >&2; exit 1; }
    if command -v c++ >/dev/null 2>&1; then
        printf '#include <%s>\nint main() { return 0; }\n' "$name" |
            c++ -Wall -Wextra -Werror -Iinclude -fsyntax-only -x c++ - ||
            { echo "headers: <$name> does not compile alone (C++)" >&2; exit 1; }
    fi
    n=$((n + 1))
done
echo "headers: $n public headers compile alone"
