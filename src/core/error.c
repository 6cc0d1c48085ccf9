/* error.c - per-thread error messages behind mp_last_error(). */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "internal.h"

static _Thread_local char last_error[512];

/* Callers may pass mp_last_error() itself as an argument (wrapping a
 * lower-level message), so the message is formatted apart and then copied:
 * vsnprintf must not read the buffer it writes. */
mp_status mp_set_error(mp_status s, const char *fmt, ...)
{
    char buf[sizeof last_error];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    memcpy(last_error, buf, sizeof buf);
    return s;
}

const char *mp_last_error(void) { return last_error; }

void mp_clear_error(void) { last_error[0] = '\0'; }

const char *mp_status_name(mp_status s)
{
    switch (s) {
    case MP_OK:
        return "ok";
    case MP_ERR_INVALID:
        return "invalid argument";
    case MP_ERR_NOMEM:
        return "out of memory";
    case MP_ERR_IO:
        return "i/o error";
    case MP_ERR_FORMAT:
        return "bad format";
    case MP_ERR_UNSUPPORTED:
        return "unsupported";
    }
    return "unknown status";
}
