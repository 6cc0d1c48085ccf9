#!/bin/sh
# install_test.sh - `make install` into a scratch prefix, then compile and run
# a program against the installed header and library through pkg-config,
# once dynamically and once statically.
set -eu
prefix=$(mktemp -d)
trap 'rm -rf "$prefix"' EXIT
make --no-print-directory install PREFIX="$prefix" >/dev/null
export PKG_CONFIG_PATH="$prefix/lib/pkgconfig"
cat > "$prefix/t.c" <<'C'
#include <mixprec.h>
#include <stdio.h>
int main(void)
{
    if (mp_f32_to_bf16(1.0f) != 0x3F80) return 1;
    printf("installed mixprec %s works\n", MP_VERSION_STRING);
    return 0;
}
C
cc -std=c11 -o "$prefix/t" "$prefix/t.c" $(pkg-config --cflags --libs mixprec) -Wl,-rpath,"$prefix/lib"
"$prefix/t"
cc -std=c11 -o "$prefix/ts" "$prefix/t.c" $(pkg-config --cflags mixprec) "$prefix/lib/libmixprec.a" \
    $(pkg-config --static --libs mixprec | sed 's/-lmixprec//')
"$prefix/ts"
"$prefix/bin/mixprec" --version
echo "install: 1 passed, 0 failed"
