/* Progress bar for training loops. */
#include <stdio.h>
#include <unistd.h>

#include "axon/kernels/clock.h"
#include "axon/runtime/pipeline/coord/train.h"

void ax_progress_start(ax_progress *p, FILE *out, long total) {
  p->out = out;
  p->tty = out && isatty(fileno(out));
  p->start = p->last_print = ax_clock_s();
  p->total = total;
  p->done = 0;
}

void ax_progress_update(ax_progress *p, long done, double samples_per_s,
                        double loss, const char *prefix) {
  if (!p->out)
    return;
  double now = ax_clock_s();
  p->done = done;
  int final = done >= p->total;
  if (!final && now - p->last_print < (p->tty ? 0.2 : 5.0))
    return;
  p->last_print = now;
  double frac = p->total ? (double)done / (double)p->total : 1.0;
  double eta = frac > 0 ? (now - p->start) * (1.0 - frac) / frac : 0.0;
  char bar[31];
  int fill = (int)(frac * 30);
  for (int i = 0; i < 30; i++)
    bar[i] = i < fill ? '=' : (i == fill ? '>' : ' ');
  bar[30] = '\0';
  fprintf(p->out,
          "%s%s [%s] %3d%% %ld/%ld %.0f samples/s loss %.4f ETA %d:%02d%s",
          p->tty ? "\r" : "", prefix ? prefix : "", bar, (int)(frac * 100),
          done, p->total, samples_per_s, loss, (int)eta / 60, (int)eta % 60,
          p->tty ? "" : "\n");
  fflush(p->out);
}

void ax_progress_end(ax_progress *p) {
  if (p->out && p->tty)
    fputc('\n', p->out);
}
