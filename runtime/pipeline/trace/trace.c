/* Trace recording, names, and the flat byte encoding used to ship a
 * stage's events to the coordinator (JSON is in trace_json.c). */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "axon/kernels/clock.h"
#include "axon/kernels/error.h"
#include "axon/runtime/pipeline/trace/trace-impl.h"

#define LOCK(t) pthread_mutex_lock((pthread_mutex_t *)&(t)->mu)
#define UNLOCK(t) pthread_mutex_unlock((pthread_mutex_t *)&(t)->mu)

ax_trace *ax_trace_new(size_t max_events) {
  ax_trace *t = calloc(1, sizeof *t);
  if (!t)
    return NULL;
  pthread_mutex_init(&t->mu, NULL);
  t->max = max_events;
  return t;
}

void ax_trace_free(ax_trace *t) {
  if (!t)
    return;
  pthread_mutex_destroy(&t->mu);
  free(t->ev);
  free(t->labels);
  free(t);
}

static void copy_str(char *dst, size_t cap, const char *src) {
  size_t n = src ? strlen(src) : 0;
  if (n >= cap)
    n = cap - 1;
  if (n)
    memcpy(dst, src, n);
  dst[n] = '\0';
}

ax_trace_event ax_trace_event_make(const char *name, const char *cat, int pid,
                                   int tid, int64_t start_us, int64_t end_us) {
  ax_trace_event e;
  memset(&e, 0, sizeof e);
  copy_str(e.name, sizeof e.name, name);
  copy_str(e.cat, sizeof e.cat, cat);
  e.pid = pid;
  e.tid = tid;
  e.ts_us = start_us;
  e.dur_us = end_us > start_us ? end_us - start_us : 0;
  e.step = e.micro = e.bytes = e.stash = e.peer = -1;
  return e;
}

int axi_trace_add_locked(ax_trace *t, const ax_trace_event *ev) {
  if (t->max && t->n >= t->max) {
    t->dropped++;
    return AX_OK;
  }
  if (t->n == t->cap) {
    size_t cap = t->cap ? 2 * t->cap : 256;
    ax_trace_event *ne = realloc(t->ev, cap * sizeof *ne);
    if (!ne)
      return ax_seterr(AX_ENOMEM, "trace: out of memory");
    t->ev = ne;
    t->cap = cap;
  }
  t->ev[t->n] = *ev;
  /* Names copied from outside might lack their terminator. */
  t->ev[t->n].name[AX_TRACE_NAME_MAX - 1] = '\0';
  t->ev[t->n].cat[AX_TRACE_CAT_MAX - 1] = '\0';
  t->n++;
  return AX_OK;
}

int ax_trace_add(ax_trace *t, const ax_trace_event *ev) {
  if (!t || !ev)
    return ax_seterr(AX_EINVAL, "trace: NULL argument");
  LOCK(t);
  int rc = axi_trace_add_locked(t, ev);
  UNLOCK(t);
  return rc;
}

int ax_trace_record(ax_trace *t, const char *name, const char *cat, int pid,
                    int tid, int64_t start_us, int64_t end_us, int64_t step,
                    int64_t micro, int64_t bytes) {
  ax_trace_event e = ax_trace_event_make(name, cat, pid, tid, start_us, end_us);
  e.step = step;
  e.micro = micro;
  e.bytes = bytes;
  return ax_trace_add(t, &e);
}

int axi_trace_label_locked(ax_trace *t, int pid, int tid, const char *name) {
  for (size_t i = 0; i < t->n_labels; i++)
    if (t->labels[i].pid == pid && t->labels[i].tid == tid) {
      copy_str(t->labels[i].name, AXI_TRACE_LABEL_MAX, name);
      return AX_OK;
    }
  if (t->n_labels == t->cap_labels) {
    size_t cap = t->cap_labels ? 2 * t->cap_labels : 16;
    axi_trace_label *nl = realloc(t->labels, cap * sizeof *nl);
    if (!nl)
      return ax_seterr(AX_ENOMEM, "trace: out of memory");
    t->labels = nl;
    t->cap_labels = cap;
  }
  axi_trace_label *l = &t->labels[t->n_labels++];
  l->pid = pid;
  l->tid = tid;
  copy_str(l->name, AXI_TRACE_LABEL_MAX, name);
  return AX_OK;
}

static int set_label(ax_trace *t, int pid, int tid, const char *name) {
  if (!t || !name)
    return ax_seterr(AX_EINVAL, "trace: NULL argument");
  LOCK(t);
  int rc = axi_trace_label_locked(t, pid, tid, name);
  UNLOCK(t);
  return rc;
}

int ax_trace_name_process(ax_trace *t, int pid, const char *name) {
  return set_label(t, pid, -1, name);
}

int ax_trace_name_thread(ax_trace *t, int pid, int tid, const char *name) {
  if (tid < 0)
    return ax_seterr(AX_EINVAL, "trace: thread id %d must be >= 0", tid);
  return set_label(t, pid, tid, name);
}

int ax_trace_get_name(const ax_trace *t, int pid, int tid, char *buf,
                      size_t len) {
  if (!t || !buf || len == 0)
    return ax_seterr(AX_EINVAL, "trace: NULL argument");
  int rc = AX_ENOTFOUND;
  LOCK(t);
  for (size_t i = 0; i < t->n_labels; i++)
    if (t->labels[i].pid == pid && t->labels[i].tid == (tid < 0 ? -1 : tid)) {
      copy_str(buf, len, t->labels[i].name);
      rc = AX_OK;
    }
  UNLOCK(t);
  return rc == AX_OK
             ? rc
             : ax_seterr(rc, "trace: no name for pid %d tid %d", pid, tid);
}

size_t ax_trace_count(const ax_trace *t) {
  if (!t)
    return 0;
  LOCK(t);
  size_t n = t->n;
  UNLOCK(t);
  return n;
}

size_t ax_trace_dropped(const ax_trace *t) {
  if (!t)
    return 0;
  LOCK(t);
  size_t n = t->dropped;
  UNLOCK(t);
  return n;
}

static int cmp_event(const void *a, const void *b) {
  const ax_trace_event *x = a, *y = b;
  if (x->ts_us != y->ts_us)
    return x->ts_us < y->ts_us ? -1 : 1;
  if (x->pid != y->pid)
    return x->pid < y->pid ? -1 : 1;
  return (x->tid > y->tid) - (x->tid < y->tid);
}

int ax_trace_events(const ax_trace *t, ax_trace_event **out, size_t *n) {
  if (!t || !out || !n)
    return ax_seterr(AX_EINVAL, "trace: NULL argument");
  *out = NULL;
  LOCK(t);
  *n = t->n;
  if (t->n) {
    *out = malloc(t->n * sizeof **out);
    if (*out)
      memcpy(*out, t->ev, t->n * sizeof **out);
  }
  UNLOCK(t);
  if (*n && !*out)
    return ax_seterr(AX_ENOMEM, "trace: out of memory");
  if (*n)
    qsort(*out, *n, sizeof **out, cmp_event);
  return AX_OK;
}

void ax_trace_clear(ax_trace *t) {
  if (!t)
    return;
  LOCK(t);
  t->n = 0;
  t->dropped = 0;
  UNLOCK(t);
}

void ax_trace_set_clock_offset(ax_trace *t, int64_t offset_us) {
  if (!t)
    return;
  LOCK(t);
  t->clock_offset_us = offset_us;
  UNLOCK(t);
}

/* ---- the flat encoding ---------------------------------------------------
 * "AXTR", u32 version (1), i64 clock offset, u32 labels, u32 events; each
 * label: i32 pid, i32 tid, u8 length, bytes; each event: u8 name length,
 * bytes, u8 category length, bytes, i32 pid, i32 tid, i64 ts, dur, step,
 * micro, bytes, stash, peer. Integers little-endian. */
#define MAGIC "AXTR"
#define VERSION 1u

static uint8_t *put_u64(uint8_t *p, uint64_t v) {
  for (int i = 0; i < 8; i++)
    *p++ = (uint8_t)(v >> (8 * i));
  return p;
}
static uint8_t *put_u32(uint8_t *p, uint32_t v) {
  for (int i = 0; i < 4; i++)
    *p++ = (uint8_t)(v >> (8 * i));
  return p;
}
static uint8_t *put_str(uint8_t *p, const char *s) {
  size_t n = strlen(s);
  *p++ = (uint8_t)n;
  memcpy(p, s, n);
  return p + n;
}

int ax_trace_encode(ax_trace *t, int clear, void **buf, size_t *len) {
  if (!t || !buf || !len)
    return ax_seterr(AX_EINVAL, "trace: NULL argument");
  LOCK(t);
  size_t size = 4 + 4 + 8 + 4 + 4;
  for (size_t i = 0; i < t->n_labels; i++)
    size += 9 + strlen(t->labels[i].name);
  for (size_t i = 0; i < t->n; i++)
    size += 2 + strlen(t->ev[i].name) + strlen(t->ev[i].cat) + 8 + 7 * 8;
  uint8_t *b = malloc(size), *p = b;
  if (!b) {
    UNLOCK(t);
    return ax_seterr(AX_ENOMEM, "trace: out of memory");
  }
  memcpy(p, MAGIC, 4);
  p = put_u32(p + 4, VERSION);
  p = put_u64(p, (uint64_t)t->clock_offset_us);
  p = put_u32(p, (uint32_t)t->n_labels);
  p = put_u32(p, (uint32_t)t->n);
  for (size_t i = 0; i < t->n_labels; i++) {
    p = put_u32(p, (uint32_t)t->labels[i].pid);
    p = put_u32(p, (uint32_t)t->labels[i].tid);
    p = put_str(p, t->labels[i].name);
  }
  for (size_t i = 0; i < t->n; i++) {
    const ax_trace_event *e = &t->ev[i];
    p = put_str(p, e->name);
    p = put_str(p, e->cat);
    p = put_u32(p, (uint32_t)e->pid);
    p = put_u32(p, (uint32_t)e->tid);
    int64_t v[7] = {e->ts_us, e->dur_us, e->step, e->micro,
                    e->bytes, e->stash,  e->peer};
    for (int k = 0; k < 7; k++)
      p = put_u64(p, (uint64_t)v[k]);
  }
  if (clear)
    t->n = t->dropped = 0;
  UNLOCK(t);
  *buf = b;
  *len = (size_t)(p - b);
  return AX_OK;
}

/* A bounds-checked reader over the buffer. */
typedef struct rd {
  const uint8_t *p, *end;
  int bad;
} rd;

static uint64_t get_u(rd *r, int bytes) {
  uint64_t v = 0;
  if (r->end - r->p < bytes) {
    r->bad = 1;
    return 0;
  }
  for (int i = 0; i < bytes; i++)
    v |= (uint64_t)r->p[i] << (8 * i);
  r->p += bytes;
  return v;
}

static void get_str(rd *r, char *dst, size_t cap) {
  size_t n = (size_t)get_u(r, 1);
  if (r->bad || (size_t)(r->end - r->p) < n) {
    r->bad = 1;
    dst[0] = '\0';
    return;
  }
  size_t k = n < cap ? n : cap - 1;
  memcpy(dst, r->p, k);
  dst[k] = '\0';
  r->p += n;
}

int ax_trace_merge(ax_trace *dst, const void *buf, size_t len,
                   int64_t extra_offset_us) {
  if (!dst || (!buf && len))
    return ax_seterr(AX_EINVAL, "trace: NULL argument");
  rd r = {buf, (const uint8_t *)buf + len, 0};
  if (len < 24 || memcmp(buf, MAGIC, 4) != 0)
    return ax_seterr(AX_EFORMAT, "trace: not an encoded trace (%zu bytes)",
                     len);
  r.p += 4;
  uint32_t version = (uint32_t)get_u(&r, 4);
  int64_t off = (int64_t)get_u(&r, 8) + extra_offset_us;
  uint32_t nl = (uint32_t)get_u(&r, 4), ne = (uint32_t)get_u(&r, 4);
  if (version != VERSION)
    return ax_seterr(AX_EFORMAT, "trace: encoding version %u, expected %u",
                     version, VERSION);
  /* Each label takes >= 9 bytes and each event >= 66: reject impossible
   * counts before allocating. */
  if ((uint64_t)nl * 9 + (uint64_t)ne * 66 > (uint64_t)(r.end - r.p))
    return ax_seterr(AX_EFORMAT,
                     "trace: buffer too short for %u labels and "
                     "%u events",
                     nl, ne);
  axi_trace_label *labels = calloc(nl ? nl : 1, sizeof *labels);
  ax_trace_event *ev = calloc(ne ? ne : 1, sizeof *ev);
  if (!labels || !ev) {
    free(labels);
    free(ev);
    return ax_seterr(AX_ENOMEM, "trace: out of memory");
  }
  for (uint32_t i = 0; i < nl && !r.bad; i++) {
    labels[i].pid = (int32_t)get_u(&r, 4);
    labels[i].tid = (int32_t)get_u(&r, 4);
    get_str(&r, labels[i].name, sizeof labels[i].name);
  }
  for (uint32_t i = 0; i < ne && !r.bad; i++) {
    ax_trace_event *e = &ev[i];
    get_str(&r, e->name, sizeof e->name);
    get_str(&r, e->cat, sizeof e->cat);
    e->pid = (int32_t)get_u(&r, 4);
    e->tid = (int32_t)get_u(&r, 4);
    int64_t *v[7] = {&e->ts_us, &e->dur_us, &e->step, &e->micro,
                     &e->bytes, &e->stash,  &e->peer};
    for (int k = 0; k < 7; k++)
      *v[k] = (int64_t)get_u(&r, 8);
    e->ts_us += off;
  }
  int rc = AX_OK;
  if (r.bad || r.p != r.end)
    rc = ax_seterr(AX_EFORMAT, "trace: malformed encoded trace (%zu bytes)",
                   len);
  if (rc == AX_OK) {
    LOCK(dst);
    for (uint32_t i = 0; i < nl && rc == AX_OK; i++)
      rc = axi_trace_label_locked(dst, labels[i].pid, labels[i].tid,
                                  labels[i].name);
    for (uint32_t i = 0; i < ne && rc == AX_OK; i++)
      rc = axi_trace_add_locked(dst, &ev[i]);
    UNLOCK(dst);
  }
  free(labels);
  free(ev);
  return rc;
}
