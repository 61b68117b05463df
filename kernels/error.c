#include "axon/kernels/error.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
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

/* A message of n bytes, more than tmp (cap bytes) holds: its start and its
 * end joined by " ... ", so that a nested error ("node: fn: node: fn: ...:
 * cause") keeps its cause. Without memory tmp keeps the start alone. */
static void keep_ends(char *tmp, size_t cap, size_t n, const char *fmt,
                      va_list ap) {
  static const char gap[] = " ... ";
  char *full = malloc(n + 1);
  if (!full)
    return;
  vsnprintf(full, n + 1, fmt, ap);
  size_t room = cap - 1 - (sizeof gap - 1), tail = room / 2;
  size_t head = room - tail;
  memcpy(tmp, full, head);
  memcpy(tmp + head, gap, sizeof gap - 1);
  memcpy(tmp + head + sizeof gap - 1, full + n - tail, tail);
  tmp[cap - 1] = '\0';
  free(full);
}

int ax_seterr(int err, const char *fmt, ...) {
  /* Formatted aside first: callers may pass ax_errmsg() itself as an
   * argument ("stage 2: %s"), which must not be overwritten while read. */
  char tmp[sizeof errmsg_buf];
  va_list ap, again;
  va_start(ap, fmt);
  va_copy(again, ap);
  int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
  va_end(ap);
  if (n >= (int)sizeof tmp)
    keep_ends(tmp, sizeof tmp, (size_t)n, fmt, again);
  va_end(again);
  memcpy(errmsg_buf, tmp, sizeof tmp);
  return err;
}

const char *ax_errmsg(void) { return errmsg_buf; }

void ax_clearerr(void) { errmsg_buf[0] = '\0'; }
