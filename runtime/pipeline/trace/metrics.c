/* Per-step metrics from trace events, the CSV log and the summary line. */
#include "axon/runtime/pipeline/trace/metrics.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "axon/kernels/error.h"

int ax_metrics_init(ax_step_metrics *m, long step, int K) {
  if (!m || K < 1 || K > AX_METRICS_MAX_STAGES)
    return ax_seterr(AX_EINVAL, "metrics: K=%d outside [1, %d]", K,
                     AX_METRICS_MAX_STAGES);
  memset(m, 0, sizeof *m);
  m->step = step;
  m->K = K;
  for (int s = 0; s < K; s++)
    m->live_stash[s] = -1;
  return AX_OK;
}

static int is_compute(const char *cat) {
  return strcmp(cat, "forward") == 0 || strcmp(cat, "backward") == 0 ||
         strcmp(cat, "recompute") == 0 || strcmp(cat, "weight") == 0;
}

typedef struct span {
  int64_t a, b;
} span;

static int cmp_span(const void *x, const void *y) {
  const span *p = x, *q = y;
  return (p->a > q->a) - (p->a < q->a);
}

int ax_metrics_from_events(ax_step_metrics *m, const ax_trace_event *ev,
                           size_t n, int64_t t0_us, int64_t t1_us) {
  if (!m || m->K < 1 || m->K > AX_METRICS_MAX_STAGES || (!ev && n))
    return ax_seterr(AX_EINVAL, "metrics: bad arguments (initialise with "
                                "ax_metrics_init)");
  if (t1_us <= t0_us)
    return ax_seterr(AX_EINVAL,
                     "metrics: empty window [%" PRId64 ", %" PRId64 "]", t0_us,
                     t1_us);
  span *sp = malloc((n ? n : 1) * sizeof *sp);
  if (!sp)
    return ax_seterr(AX_ENOMEM, "metrics: out of memory");
  double window = (double)(t1_us - t0_us), total = 0;
  for (int s = 0; s < m->K; s++) {
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
      const ax_trace_event *e = &ev[i];
      if (e->pid != s)
        continue;
      int64_t a = e->ts_us, b = e->ts_us + e->dur_us;
      if (b < t0_us || a > t1_us)
        continue;
      if (e->stash > m->live_stash[s])
        m->live_stash[s] = (int)e->stash;
      if (!is_compute(e->cat))
        continue;
      sp[k++] = (span){a < t0_us ? t0_us : a, b > t1_us ? t1_us : b};
    }
    qsort(sp, k, sizeof *sp, cmp_span);
    int64_t busy = 0, cur_a = 0, cur_b = 0;
    for (size_t i = 0; i < k; i++) {
      if (i == 0 || sp[i].a > cur_b) {
        busy += cur_b - cur_a;
        cur_a = sp[i].a;
        cur_b = sp[i].b;
      } else if (sp[i].b > cur_b) {
        cur_b = sp[i].b;
      }
    }
    busy += cur_b - cur_a;
    m->busy[s] = (double)busy / window;
    total += m->busy[s];
  }
  free(sp);
  m->bubble = 1.0 - total / m->K;
  m->wall_s = window / 1e6;
  if (m->samples > 0)
    m->samples_per_s = (double)m->samples / m->wall_s;
  return AX_OK;
}

struct ax_metrics_csv {
  FILE *f;
  int K, bad;
};

int ax_metrics_csv_open(const char *path, int K, ax_metrics_csv **out) {
  if (!path || !out || K < 1 || K > AX_METRICS_MAX_STAGES)
    return ax_seterr(AX_EINVAL, "metrics csv: need a path and 1 <= K <= %d",
                     AX_METRICS_MAX_STAGES);
  *out = NULL;
  ax_metrics_csv *w = calloc(1, sizeof *w);
  if (!w)
    return ax_seterr(AX_ENOMEM, "metrics csv: out of memory");
  if (!(w->f = fopen(path, "w"))) {
    free(w);
    return ax_seterr(AX_EIO, "metrics csv: cannot write %s: %s", path,
                     strerror(errno));
  }
  w->K = K;
  fprintf(w->f, "step,wall_s,samples,samples_per_s,loss,lr,bubble,"
                "coord_bytes");
  const char *cols[3] = {"busy", "peak_mem", "live_stash"};
  for (int c = 0; c < 3; c++)
    for (int s = 0; s < K; s++)
      fprintf(w->f, ",%s_%d", cols[c], s);
  fputc('\n', w->f);
  w->bad = fflush(w->f) != 0;
  *out = w;
  return AX_OK;
}

int ax_metrics_csv_row(ax_metrics_csv *w, const ax_step_metrics *m) {
  if (!w || !m)
    return ax_seterr(AX_EINVAL, "metrics csv: NULL argument");
  if (m->K != w->K)
    return ax_seterr(AX_EINVAL, "metrics csv: row has %d stages, header %d",
                     m->K, w->K);
  fprintf(w->f, "%ld,%.6f,%ld,%.3f,%.6g,%.6g,%.4f,%" PRId64, m->step, m->wall_s,
          m->samples, m->samples_per_s, m->loss, m->lr, m->bubble,
          m->coord_bytes);
  for (int s = 0; s < m->K; s++)
    fprintf(w->f, ",%.4f", m->busy[s]);
  for (int s = 0; s < m->K; s++)
    fprintf(w->f, ",%zu", m->peak_mem[s]);
  for (int s = 0; s < m->K; s++)
    fprintf(w->f, ",%d", m->live_stash[s]);
  fputc('\n', w->f);
  if (fflush(w->f) != 0 || ferror(w->f)) {
    w->bad = 1;
    return ax_seterr(AX_EIO, "metrics csv: write failed");
  }
  return AX_OK;
}

int ax_metrics_csv_close(ax_metrics_csv *w) {
  if (!w)
    return AX_OK;
  int bad = w->bad || ferror(w->f);
  bad |= fclose(w->f) != 0;
  free(w);
  return bad ? ax_seterr(AX_EIO, "metrics csv: write failed") : AX_OK;
}

/* Appends to buf at *used, never past len. */
static void app(char *buf, size_t len, size_t *used, const char *fmt, ...) {
  if (*used + 1 >= len)
    return;
  va_list ap;
  va_start(ap, fmt);
  int w = vsnprintf(buf + *used, len - *used, fmt, ap);
  va_end(ap);
  if (w > 0)
    *used += (size_t)w < len - *used ? (size_t)w : len - *used - 1;
}

char *ax_metrics_summary(const ax_step_metrics *m, char *buf, size_t len) {
  if (!buf || len == 0)
    return buf;
  buf[0] = '\0';
  if (!m || m->K < 1 || m->K > AX_METRICS_MAX_STAGES)
    return buf;
  size_t u = 0;
  app(buf, len, &u, "step %ld: %.1f samples/s, loss %.4f, bubble %.1f%%, busy ",
      m->step, m->samples_per_s, m->loss, 100.0 * m->bubble);
  for (int s = 0; s < m->K; s++)
    app(buf, len, &u, "%s%.0f%%", s ? "/" : "", 100.0 * m->busy[s]);
  app(buf, len, &u, ", peak MiB ");
  for (int s = 0; s < m->K; s++)
    app(buf, len, &u, "%s%.1f", s ? "/" : "",
        (double)m->peak_mem[s] / 1048576.0);
  app(buf, len, &u, ", stash ");
  for (int s = 0; s < m->K; s++)
    app(buf, len, &u, "%s%d", s ? "/" : "", m->live_stash[s]);
  app(buf, len, &u, ", coordinator %.2f MiB",
      (double)m->coord_bytes / 1048576.0);
  return buf;
}
