#!/bin/sh
# run.sh BUILD TEST... - runs every cmocka test program, then prints one
# closing line with the totals over all of them.
build="$1"; shift
export MP_CLI="$build/mixprec"
# The Python that runs tests/interop/mx_ml_dtypes.py: one with ml_dtypes
# (make ref-venv, or the Keras environment), else Debian's (then it skips).
if [ -z "${MP_PYTHON:-}" ]; then
    for py in build/venv-ref/bin/python build/venv-keras/bin/python /usr/bin/python3; do
        if [ -x "$py" ]; then export MP_PYTHON="$py"; break; fi
    done
fi
# Tests never read or write the user's kernel-choice cache.
export MP_DISPATCH_CACHE=0
passed=0; failed=0; skipped=0; broken=""
for t in "$@"; do
    out=$("$t" 2>&1); rc=$?
    printf '%s\n' "$out"
    p=$(printf '%s\n' "$out" | sed -n 's/^\[  PASSED  \] \([0-9]*\) test.*/\1/p' | awk '{s+=$1} END {print s+0}')
    f=$(printf '%s\n' "$out" | sed -n 's/^\[  FAILED  \] \([0-9]*\) test.*/\1/p' | awk '{s+=$1} END {print s+0}')
    s=$(printf '%s\n' "$out" | sed -n 's/^\[  SKIPPED \] \([0-9]*\) test.*/\1/p' | awk '{s+=$1} END {print s+0}')
    passed=$((passed + p)); failed=$((failed + f)); skipped=$((skipped + s))
    if [ "$rc" != 0 ] && [ "$f" = 0 ]; then failed=$((failed + 1)); broken="$broken $t"; fi
done
[ -n "$broken" ] && echo "crashed or exited non-zero:$broken"
echo "tests: $passed passed, $failed failed, $skipped skipped"
[ "$failed" = 0 ]
