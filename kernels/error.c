#include "kernels/error.h"

#include <stdarg.h>
#include <stdio.h>

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
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(errmsg_buf, sizeof errmsg_buf, fmt, ap);
  va_end(ap);
  return err;
}

const char *ax_errmsg(void) { return errmsg_buf; }

void ax_clearerr(void) { errmsg_buf[0] = '\0'; }
