#include "axon/kernels/error.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static _Thread_local char errmsg_buf[512];

const char *ax_strerror(int err) {
  switch (err) {
  case AX_OK:
    return "success";
#define AX_ERR_MSG_(name, msg)                                                 \
  case AX_E##name:                                                             \
    return msg;
    AX_ERRNO_MAP(AX_ERR_MSG_)
#undef AX_ERR_MSG_
  default:
    return "unknown error";
  }
}

const char *ax_errname(int err) {
  switch (err) {
  case AX_OK:
    return "AX_OK";
#define AX_ERR_NAME_(name, msg)                                                \
  case AX_E##name:                                                             \
    return "AX_E" #name;
    AX_ERRNO_MAP(AX_ERR_NAME_)
#undef AX_ERR_NAME_
  default:
    return "AX_E?";
  }
}

int ax_seterr(int err, const char *fmt, ...) {
  /* Formatted aside first: callers may pass ax_errmsg() itself as an
   * argument ("stage 2: %s"), which must not be overwritten while read. */
  char tmp[sizeof errmsg_buf];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(tmp, sizeof tmp, fmt, ap);
  va_end(ap);
  memcpy(errmsg_buf, tmp, sizeof tmp);
  return err;
}

const char *ax_errmsg(void) { return errmsg_buf; }

void ax_clearerr(void) { errmsg_buf[0] = '\0'; }
