/* The Chrome-trace JSON writer and a reader for its own output. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "axon/kernels/error.h"
#include "axon/runtime/pipeline/trace/trace-impl.h"

static void put_json_str(FILE *f, const char *s) {
  fputc('"', f);
  for (; *s; s++) {
    unsigned char c = (unsigned char)*s;
    if (c == '"' || c == '\\')
      fprintf(f, "\\%c", c);
    else if (c < 0x20)
      fprintf(f, "\\u%04x", c);
    else
      fputc(c, f);
  }
  fputc('"', f);
}

static void put_arg(FILE *f, int *first, const char *key, int64_t v) {
  if (v < 0)
    return;
  fprintf(f, "%s\"%s\":%" PRId64, *first ? "" : ",", key, v);
  *first = 0;
}

int ax_trace_write(const ax_trace *t, const char *path) {
  if (!t || !path)
    return ax_seterr(AX_EINVAL, "trace: NULL argument");
  ax_trace_event *ev = NULL;
  size_t n = 0;
  AX_TRY(ax_trace_events(t, &ev, &n));
  FILE *f = fopen(path, "w");
  if (!f) {
    free(ev);
    return ax_seterr(AX_EIO, "trace: cannot write %s: %s", path,
                     strerror(errno));
  }
  fprintf(f, "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n");
  int first = 1;
  pthread_mutex_lock((pthread_mutex_t *)&t->mu);
  for (size_t i = 0; i < t->n_labels; i++) {
    const axi_trace_label *l = &t->labels[i];
    fprintf(f,
            "%s{\"name\":\"%s\",\"ph\":\"M\",\"pid\":%d,\"tid\":%d,"
            "\"args\":{\"name\":",
            first ? "" : ",\n", l->tid < 0 ? "process_name" : "thread_name",
            l->pid, l->tid < 0 ? 0 : l->tid);
    put_json_str(f, l->name);
    fprintf(f, "}}");
    first = 0;
  }
  pthread_mutex_unlock((pthread_mutex_t *)&t->mu);
  for (size_t i = 0; i < n; i++) {
    const ax_trace_event *e = &ev[i];
    fprintf(f, "%s{\"name\":", first ? "" : ",\n");
    put_json_str(f, e->name);
    fprintf(f, ",\"cat\":");
    put_json_str(f, e->cat);
    fprintf(f,
            ",\"ph\":\"X\",\"pid\":%d,\"tid\":%d,\"ts\":%" PRId64
            ",\"dur\":%" PRId64 ",\"args\":{",
            e->pid, e->tid, e->ts_us, e->dur_us);
    int afirst = 1;
    put_arg(f, &afirst, "step", e->step);
    put_arg(f, &afirst, "micro", e->micro);
    put_arg(f, &afirst, "bytes", e->bytes);
    put_arg(f, &afirst, "stash", e->stash);
    put_arg(f, &afirst, "peer", e->peer);
    fprintf(f, "}}");
    first = 0;
  }
  fprintf(f, "\n]}\n");
  free(ev);
  int bad = ferror(f);
  if (fclose(f) != 0 || bad)
    return ax_seterr(AX_EIO, "trace: error writing %s", path);
  return AX_OK;
}

/* ---- the reader: one flat object per line, one nested "args" ---------- */

typedef struct obj {
  char name[AXI_TRACE_LABEL_MAX], cat[AX_TRACE_CAT_MAX], ph[4];
  char arg_name[AXI_TRACE_LABEL_MAX];
  int64_t pid, tid, ts, dur, step, micro, bytes, stash, peer;
} obj;

static void set_str(char *dst, size_t cap, const char *src) {
  size_t n = strlen(src);
  if (n >= cap)
    n = cap - 1;
  memcpy(dst, src, n);
  dst[n] = '\0';
}

static void skip_ws(const char **p) {
  while (**p == ' ' || **p == '\t' || **p == '\r' || **p == '\n')
    (*p)++;
}

/* Parses a JSON string at *p into dst (truncated to cap); -1 on error. */
static int parse_str(const char **p, char *dst, size_t cap) {
  size_t n = 0;
  if (**p != '"')
    return -1;
  for ((*p)++; **p && **p != '"'; (*p)++) {
    char c = **p;
    if (c == '\\') {
      (*p)++;
      char e = **p;
      if (e == 'u') {
        unsigned v;
        if (sscanf(*p + 1, "%4x", &v) != 1)
          return -1;
        c = (char)v;
        *p += 4;
      } else if (e == 'n') {
        c = '\n';
      } else if (e == 't') {
        c = '\t';
      } else if (e == '"' || e == '\\' || e == '/') {
        c = e;
      } else {
        return -1;
      }
    }
    if (n + 1 < cap)
      dst[n++] = c;
  }
  if (**p != '"')
    return -1;
  (*p)++;
  dst[n] = '\0';
  return 0;
}

static int parse_int(const char **p, int64_t *v) {
  char *end;
  errno = 0;
  long long x = strtoll(*p, &end, 10);
  if (end == *p || errno)
    return -1;
  *p = end;
  *v = x;
  return 0;
}

/* Parses {"key":value,...}; values are strings, integers or (nested = 0
 * only) an "args" object. */
static int parse_obj(const char **p, obj *o, int nested) {
  skip_ws(p);
  if (**p != '{')
    return -1;
  (*p)++;
  skip_ws(p);
  if (**p == '}') {
    (*p)++;
    return 0;
  }
  for (;;) {
    char key[32], sval[AXI_TRACE_LABEL_MAX];
    int64_t ival = 0;
    skip_ws(p);
    if (parse_str(p, key, sizeof key) < 0)
      return -1;
    skip_ws(p);
    if (**p != ':')
      return -1;
    (*p)++;
    skip_ws(p);
    if (**p == '{') {
      if (nested || strcmp(key, "args") != 0 || parse_obj(p, o, 1) < 0)
        return -1;
    } else if (**p == '"') {
      if (parse_str(p, sval, sizeof sval) < 0)
        return -1;
      if (nested && strcmp(key, "name") == 0)
        set_str(o->arg_name, sizeof o->arg_name, sval);
      else if (!nested && strcmp(key, "name") == 0)
        set_str(o->name, sizeof o->name, sval);
      else if (!nested && strcmp(key, "cat") == 0)
        set_str(o->cat, sizeof o->cat, sval);
      else if (!nested && strcmp(key, "ph") == 0)
        set_str(o->ph, sizeof o->ph, sval);
    } else {
      if (parse_int(p, &ival) < 0)
        return -1;
      struct {
        const char *k;
        int64_t *v;
        int nested;
      } keys[] = {{"pid", &o->pid, 0},     {"tid", &o->tid, 0},
                  {"ts", &o->ts, 0},       {"dur", &o->dur, 0},
                  {"step", &o->step, 1},   {"micro", &o->micro, 1},
                  {"bytes", &o->bytes, 1}, {"stash", &o->stash, 1},
                  {"peer", &o->peer, 1}};
      for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
        if (keys[i].nested == nested && strcmp(keys[i].k, key) == 0)
          *keys[i].v = ival;
    }
    skip_ws(p);
    if (**p == ',') {
      (*p)++;
      continue;
    }
    if (**p == '}') {
      (*p)++;
      return 0;
    }
    return -1;
  }
}

static int read_line(FILE *f, char **line, size_t *cap) {
  ssize_t n = getline(line, cap, f);
  return n < 0 ? -1 : 0;
}

int ax_trace_read(const char *path, ax_trace **out) {
  if (!path || !out)
    return ax_seterr(AX_EINVAL, "trace: NULL argument");
  *out = NULL;
  FILE *f = fopen(path, "r");
  if (!f)
    return ax_seterr(AX_EIO, "trace: cannot read %s: %s", path,
                     strerror(errno));
  ax_trace *t = ax_trace_new(0);
  char *line = NULL;
  size_t cap = 0;
  int rc = t ? AX_OK : ax_seterr(AX_ENOMEM, "trace: out of memory");
  long lineno = 0, saw_header = 0;
  while (rc == AX_OK && read_line(f, &line, &cap) == 0) {
    lineno++;
    const char *p = line;
    skip_ws(&p);
    if (*p == ',')
      p++;
    skip_ws(&p);
    if (strncmp(p, "{\"displayTimeUnit\"", 18) == 0) {
      saw_header = 1;
      continue;
    }
    if (*p == ']' || *p == '\0')
      continue;
    obj o;
    memset(&o, 0, sizeof o);
    o.step = o.micro = o.bytes = o.stash = o.peer = -1;
    if (parse_obj(&p, &o, 0) < 0) {
      rc = ax_seterr(AX_EFORMAT, "trace: %s:%ld: cannot parse the event", path,
                     lineno);
      break;
    }
    if (strcmp(o.ph, "M") == 0) {
      int is_proc = strcmp(o.name, "process_name") == 0;
      rc = axi_trace_label_locked(t, (int)o.pid, is_proc ? -1 : (int)o.tid,
                                  o.arg_name);
    } else if (strcmp(o.ph, "X") == 0) {
      ax_trace_event e = ax_trace_event_make(o.name, o.cat, (int)o.pid,
                                             (int)o.tid, o.ts, o.ts + o.dur);
      e.step = o.step;
      e.micro = o.micro;
      e.bytes = o.bytes;
      e.stash = o.stash;
      e.peer = o.peer;
      rc = axi_trace_add_locked(t, &e);
    }
  }
  free(line);
  fclose(f);
  if (rc == AX_OK && !saw_header)
    rc =
        ax_seterr(AX_EFORMAT, "trace: %s is not a trace written by axon", path);
  if (rc != AX_OK) {
    ax_trace_free(t);
    return rc;
  }
  *out = t;
  return AX_OK;
}
