/* The text grid and the gnuplot input of a timeline. Contract in
 * timeline.h. */
#include "axon/runtime/pipeline/schedule/timeline.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "axon/kernels/error.h"

#define TOKEN_MAX 32
#define GRID_MAX_COLS 4000

static const char g_letter[AX_OP_KINDS] = {'F', 'B', 'I', 'W', 'S'};

static void part_token(const ax_pipe_op *o, int U, char *buf, size_t len) {
  ax_pipe_op_text(o, U > 0 ? U : 1, buf, len);
}

void ax_pipe_slot_token(const ax_pipe_slot *s, int U, char *buf, size_t len) {
  char a[TOKEN_MAX], b[TOKEN_MAX];
  part_token(&s->op, U, a, sizeof a);
  if (s->next.kind < 0) {
    snprintf(buf, len, "%s", a);
    return;
  }
  part_token(&s->next, U, b, sizeof b);
  snprintf(buf, len, "%s+%s", a, b);
}

/* The slot's class for colours and letters: its kind, or AX_OP_KINDS for
 * a composite. */
static int slot_class(const ax_pipe_slot *s) {
  return s->next.kind >= 0 ? AX_OP_KINDS : s->op.kind;
}

static int check(const ax_pipe_slot *s, long n, int ranks, FILE *f) {
  if ((!s && n) || n < 0 || ranks < 1 || !f)
    return ax_seterr(AX_EINVAL, "timeline: bad arguments");
  for (long i = 0; i < n; i++)
    if (s[i].rank < 0 || s[i].rank >= ranks || !(s[i].end >= s[i].start) ||
        s[i].op.kind < 0 || s[i].op.kind >= AX_OP_KINDS)
      return ax_seterr(AX_EINVAL,
                       "timeline: slot %ld (rank %d, %g..%g) "
                       "is not on the grid",
                       i, s[i].rank, s[i].start, s[i].end);
  return AX_OK;
}

static double makespan(const ax_pipe_slot *s, long n) {
  double t = 0;
  for (long i = 0; i < n; i++)
    t = s[i].end > t ? s[i].end : t;
  return t;
}

static int by_value(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* Columns for width 0: an action at the first quartile of the durations
 * (a STEP's moment or a short outlier does not count) holds the longest
 * token and a blank. */
static int auto_cols(const ax_pipe_slot *s, long n, int U, double t1) {
  double *d = malloc(sizeof *d * (size_t)(n + 1));
  size_t tl = 1;
  long k = 0;
  for (long i = 0; d && i < n; i++) {
    char tok[TOKEN_MAX];
    if (!(s[i].end > s[i].start))
      continue;
    d[k++] = s[i].end - s[i].start;
    ax_pipe_slot_token(&s[i], U, tok, sizeof tok);
    tl = strlen(tok) > tl ? strlen(tok) : tl;
  }
  if (d)
    qsort(d, (size_t)k, sizeof *d, by_value);
  double q = d && k ? d[k / 4] / (double)(tl + 1) : 0;
  free(d);
  double c = q > 0 ? ceil(t1 / q - 1e-9) : 1;
  return c > GRID_MAX_COLS ? GRID_MAX_COLS : c < 1 ? 1 : (int)c;
}

int ax_pipe_timeline_grid(const ax_pipe_slot *s, long n, int ranks, int U,
                          int width, FILE *f) {
  AX_TRY(check(s, n, ranks, f));
  if (width != 0 && width < 20)
    return ax_seterr(AX_EINVAL, "timeline: a grid needs 20 characters");
  int dig = snprintf(NULL, 0, "%d", ranks - 1), lw = dig + 7; /* "rank N |" */
  double t1 = makespan(s, n);
  int cols = width ? width - lw - 1 : auto_cols(s, n, U, t1);
  if (cols < 1)
    cols = 1;
  double q = t1 > 0 ? t1 / cols : 1;
  char *row = malloc((size_t)cols + 1);
  if (!row)
    return ax_seterr(AX_ENOMEM, "timeline: out of memory");
  for (int r = 0; r < ranks; r++) {
    memset(row, '.', (size_t)cols);
    row[cols] = 0;
    for (long i = 0; i < n; i++) {
      if (s[i].rank != r || !(s[i].end > s[i].start))
        continue;
      long c0 = lround(s[i].start / q), c1 = lround(s[i].end / q);
      c0 = c0 < cols ? c0 : cols - 1;
      c1 = c1 > cols ? cols : c1 <= c0 ? c0 + 1 : c1;
      char tok[TOKEN_MAX];
      ax_pipe_slot_token(&s[i], U, tok, sizeof tok);
      long w = c1 - c0, tl = (long)strlen(tok);
      if (w < tl + 1) { /* too narrow: the kind's letter */
        tok[0] =
            slot_class(&s[i]) == AX_OP_KINDS ? '+' : g_letter[s[i].op.kind];
        tl = 1;
      }
      for (long c = 0; c < w; c++)
        row[c0 + c] = c < tl ? tok[c] : ' ';
    }
    fprintf(f, "rank %*d |%s|\n", dig, r, row);
  }
  free(row);
  fprintf(f, "%*s0 .. %g, %g per column\n", lw, "", t1, q);
  return ferror(f) ? ax_seterr(AX_EIO, "timeline: write failed") : AX_OK;
}

/* Colours and legend names per class (kinds, then the composite). */
static const char *const g_colour[AX_OP_KINDS + 1] = {
    "#4e79a7", "#9c5fb5", "#f28e2b", "#59a14f", "#222222", "#2aa198"};
static const char *const g_name[AX_OP_KINDS + 1] = {"F", "B",    "I",
                                                    "W", "STEP", "F&B"};
#define IDLE_COLOUR "#e8e8e8"

int ax_pipe_timeline_gnuplot(const ax_pipe_slot *s, long n, int ranks, int U,
                             const ax_pipe_plot_opts *o, FILE *f) {
  AX_TRY(check(s, n, ranks, f));
  if (!o || !o->png)
    return ax_seterr(AX_EINVAL, "timeline: no output file");
  int W = o->width > 0 ? o->width : 900,
      H = o->height > 0 ? o->height : 60 * ranks + 120;
  double t1 = makespan(s, n);
  t1 = t1 > 0 ? t1 : 1;
  /* pixels per unit of time, about: the plot area without the margins */
  double ppt = (W - 180) / t1;
  int used[AX_OP_KINDS + 1] = {0};
  for (long i = 0; i < n; i++)
    used[slot_class(&s[i])] = 1;
  fprintf(f,
          "set terminal %s size %d,%d noenhanced font \",9\"\n"
          "set output \"%s\"\n",
          o->term ? o->term : "pngcairo", W, H, o->png);
  if (o->title)
    fprintf(f, "set title \"%s\"\n", o->title);
  fprintf(f,
          "set xlabel \"time%s%s%s\"\n"
          "set xrange [0:%g]\nset yrange [%g:%g]\n"
          "set ytics (",
          o->unit ? " (" : "", o->unit ? o->unit : "", o->unit ? ")" : "", t1,
          ranks - 0.5, -0.5);
  for (int r = 0; r < ranks; r++)
    fprintf(f, "%s\"rank %d\" %d", r ? ", " : "", r, r);
  fprintf(f, ")\nset key outside right top\nset style fill solid 1.0 "
             "border lc rgb \"#ffffff\"\nset grid xtics\n");
  /* data: one block per class, x, y, half width, half height */
  fprintf(f, "$idle << EOD\n");
  for (int r = 0; r < ranks; r++)
    fprintf(f, "%g %d %g 0.4\n", t1 / 2, r, t1 / 2);
  fprintf(f, "EOD\n");
  double gap = t1 / (W - 180); /* about a pixel between boxes */
  for (int k = 0; k <= AX_OP_KINDS; k++) {
    if (!used[k])
      continue;
    fprintf(f, "$c%d << EOD\n", k);
    for (long i = 0; i < n; i++) {
      double w = s[i].end - s[i].start;
      if (slot_class(&s[i]) == k)
        fprintf(f, "%.9g %d %.9g 0.4\n", (s[i].start + s[i].end) / 2, s[i].rank,
                (w > 3 * gap ? w - gap : w) / 2);
    }
    fprintf(f, "EOD\n");
  }
  long nl = 0;
  fprintf(f, "$labels << EOD\n");
  for (long i = 0; i < n; i++) {
    char tok[TOKEN_MAX];
    ax_pipe_slot_token(&s[i], U, tok, sizeof tok);
    if ((s[i].end - s[i].start) * ppt >= 5.5 * (double)strlen(tok) + 3) {
      fprintf(f, "%.9g %d %s\n", (s[i].start + s[i].end) / 2, s[i].rank, tok);
      nl++;
    }
  }
  fprintf(f,
          "EOD\nplot $idle using 1:2:3:4 with boxxyerror fc rgb \"%s\" "
          "title \"idle\"",
          IDLE_COLOUR);
  for (int k = 0; k <= AX_OP_KINDS; k++)
    if (used[k])
      fprintf(f,
              ", \\\n  $c%d using 1:2:3:4 with boxxyerror fc rgb \"%s\" "
              "title \"%s\"",
              k, g_colour[k], g_name[k]);
  if (nl)
    fprintf(f, ", \\\n  $labels using 1:2:3 with labels font \",7\" tc rgb "
               "\"#ffffff\" notitle");
  fprintf(f, "\n");
  return ferror(f) ? ax_seterr(AX_EIO, "timeline: write failed") : AX_OK;
}
