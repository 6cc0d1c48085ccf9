#!/bin/sh
# browser_test.sh BUILD - a `mixprec report` page as a person sees it, in
# headless Chromium: three short real runs (float32, mixed_bfloat16,
# mixed_float16: a small MLP, 24 steps on Fashion-MNIST, diagnostics every
# step), their report loaded twice: as written (the console must stay
# silent: Chromium logs there any SVG attribute it cannot draw) and with
# tests/browser_check.js appended (every chart has its data marks, axis
# labels and a legend, drawn inside it). Leaves BUILD/browser/report.html
# and BUILD/browser/report.png (the whole page) for a person to look at.
# Needs chromium and the Fashion-MNIST files (make test-browser installs both).
set -u
build="$1"
cli="$build/mixprec"
chromium=${CHROMIUM:-chromium}
dir="$build/browser"
export MP_DISPATCH_CACHE=0
rm -rf "$dir" && mkdir -p "$dir" || exit 1
fail=0
t0=$(date +%s)

for policy in float32 mixed_bfloat16 mixed_float16; do
    "$cli" train --policy "$policy" --hidden 64 --epochs 3 --steps-per-epoch 8 \
        --batch-size 64 --validation-split 0.1 --quiet --run-dir "$dir/$policy" \
        --diagnostics 1 > "$dir/train.txt" 2>&1 ||
        { cat "$dir/train.txt"; echo "browser_test.sh: training $policy failed"; exit 1; }
done
"$cli" report "$dir/float32" "$dir/mixed_bfloat16" "$dir/mixed_float16" \
    -o "$dir/report.html" > "$dir/report.txt" 2>&1 ||
    { cat "$dir/report.txt"; echo "browser_test.sh: mixprec report did not exit 0"; exit 1; }

# browser PAGE OUT [WIDTH,HEIGHT] [--dump-dom | --screenshot=FILE]: its
# console (and the rest of its log) goes to OUT.log
browser() {
    page=$1 out=$2 size=$3
    shift 3
    timeout 120 "$chromium" --headless --no-sandbox --disable-gpu --no-first-run \
        --user-data-dir="$dir/profile" --hide-scrollbars --window-size="$size" \
        --enable-logging=stderr --v=0 "$@" "file://$(realpath "$page")" \
        > "$out" 2> "$out.log"
}
# the console: Chromium's log lines "INFO:CONSOLE...] "message", source: ..."
console() {
    if grep -q ':CONSOLE' "$1"; then
        echo "browser_test.sh: the console of $2 is not silent:"
        grep ':CONSOLE' "$1" | sed 's/^\[[^]]*\] /  /' | head -20
        fail=1
    fi
}

browser "$dir/report.html" "$dir/report.dom" 1100,900 --dump-dom ||
    { cat "$dir/report.dom.log"; echo "browser_test.sh: $chromium failed on the report"; exit 1; }
console "$dir/report.dom.log" report.html
charts=$(grep -o '<svg' "$dir/report.html" | wc -l)
[ "$(grep -o '<svg' "$dir/report.dom" | wc -l)" = "$charts" ] ||
    { echo "browser_test.sh: the browser's DOM does not hold the page's $charts charts"; fail=1; }

# the page with the check at the end of its body
sed 's#</body></html>##' "$dir/report.html" > "$dir/check.html"
{ echo '<script>'; cat tests/browser_check.js; echo '</script></body></html>'; } >> "$dir/check.html"
browser "$dir/check.html" "$dir/check.dom" 1100,900 --dump-dom ||
    { cat "$dir/check.dom.log"; echo "browser_test.sh: $chromium failed on the check"; exit 1; }
console "$dir/check.dom.log" "the checked page"
sed -n '/<pre id="mp-check">/,/<\/pre>/p' "$dir/check.dom" | sed '1d;$d' > "$dir/check.txt"
grep '^FAIL' "$dir/check.txt"
grep -q '^result ok$' "$dir/check.txt" ||
    { echo "browser_test.sh: the page check did not pass (BUILD/browser/check.txt)"; fail=1; }
grep -q "^charts $charts " "$dir/check.txt" ||
    { echo "browser_test.sh: the check saw $(sed -n 's/^charts //p' "$dir/check.txt") charts, the page has $charts"; fail=1; }

# the whole page as one picture
height=$(sed -n 's/^height \([0-9]*\)$/\1/p' "$dir/check.txt")
browser "$dir/report.html" "$dir/shot.out" "1100,${height:-6000}" --screenshot="$(realpath "$dir")/report.png"
console "$dir/shot.out.log" "the screenshot"
if [ "$(head -c 8 "$dir/report.png" 2>/dev/null | od -An -tx1 | tr -d ' \n')" != 89504e470d0a1a0a ] ||
    [ "$(wc -c < "$dir/report.png")" -lt 20000 ]; then
    echo "browser_test.sh: no screenshot at $dir/report.png"
    fail=1
fi
rm -rf "$dir/profile"
version=$("$chromium" --version 2>/dev/null | grep -o '[0-9][0-9.]*' | head -1)
if [ "$fail" = 0 ]; then
    echo "browser: $charts charts drawn in Chromium $version with labelled axes, legends and a silent console ($(($(date +%s) - t0)) s); look at $dir/report.png"
else
    echo "browser: FAILED (the page and the browser's logs are in $dir)"
fi
exit "$fail"
