/* axon-run schedule: a mode's action lists as text (one rank per line), or
 * a schedule file parsed and printed again, normalised
 * (runtime/pipeline/schedule/sched_text.h; docs/MODES.md, "Schedules as
 * data"); and what train's --schedule FILE needs checked against the other
 * options before any agent starts. */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agents/axon_run.h"
#include "axon/runtime/pipeline/schedule/sched_text.h"

/* What schedule's options fill. */
typedef struct sched_cli {
  int mode, K, M, chunks;
  const char *file, *out;
} sched_cli;

static int set_mode(void *dst, const char *s) {
  sched_cli *u = dst;
  if ((u->mode = ax_pipe_mode_index(s)) >= 0)
    return 0;
  fprintf(stderr, "axon-run: %s\n", ax_errmsg());
  return 2;
}

static int fail(int rc) {
  fprintf(stderr, "axon-run: %s: %s\n", ax_strerror(rc), ax_errmsg());
  return 1;
}

/* The text of u's mode: its first mini-batch when it flushes, else K + 1
 * mini-batches to view (sched_text.h). */
static int mode_text(const sched_cli *u, char **out) {
  ax_pipe_plan *p = NULL;
  long n = ax_pipe_flushes(u->mode) ? 1 : u->K + 1;
  AX_TRY(ax_pipe_plan_new(u->mode, u->K, u->chunks, u->M, n, &p));
  int rc = ax_pipe_plan_text(p, out);
  ax_pipe_plan_free(p);
  return rc;
}

static int file_text(const char *path, char **out) {
  ax_pipe_sched *s = NULL;
  AX_TRY(ax_pipe_sched_load(path, &s));
  int rc = ax_pipe_sched_text(s, out);
  ax_pipe_sched_free(s);
  return rc;
}

static int schedule_main(int argc, char **argv) {
  sched_cli u = {.mode = -1, .M = 4};
  int rc =
      axi_cli_parse(&axi_run_prog, &axi_run_schedule_cmd, 2, argc, argv, &u);
  if (rc >= 0)
    return rc;
  if ((u.mode >= 0) == (u.file != NULL) || (u.mode >= 0 && u.K < 1)) {
    fprintf(stderr, "axon-run: schedule needs --mode M --stages K, or "
                    "--file FILE (try --help)\n");
    return 2;
  }
  char *text = NULL;
  rc = u.file ? file_text(u.file, &text) : mode_text(&u, &text);
  if (rc != AX_OK)
    return fail(rc);
  FILE *f = u.out ? fopen(u.out, "w") : stdout;
  int bad = !f || fputs(text, f) < 0;
  if (f && f != stdout)
    bad |= fclose(f) != 0;
  free(text);
  if (bad) {
    fprintf(stderr, "axon-run: cannot write %s\n", u.out ? u.out : "stdout");
    return 1;
  }
  return 0;
}

/* Why --schedule cannot run with pa (written into buf), or NULL. */
static const char *conflict(const axi_run_pipe_args *pa, const ax_pipe_sched *s,
                            char *buf, size_t len) {
  int parts = AXR_PARTS(pa), K = pa->local ? pa->local / parts : pa->K;
  int m = ax_pipe_sched_mode(s);
  if (pa->mode_set && pa->mode != m)
    snprintf(buf, len,
             "--mode %s contradicts the schedule, whose stages follow %s "
             "(its mode line, or by default zb-h1 with I or W, else 1f1b)",
             ax_pipe_mode_name(pa->mode), ax_pipe_mode_name(m));
  else if (pa->micro_set && ax_pipe_units(m, pa->M) != ax_pipe_sched_units(s))
    snprintf(buf, len, "--microbatches %d contradicts the schedule's micro %d",
             pa->M, ax_pipe_sched_units(s));
  else if (K != ax_pipe_sched_ranks(s))
    snprintf(buf, len,
             "the schedule has %d ranks, the run %d agents per "
             "pipeline",
             ax_pipe_sched_ranks(s), K);
  else if (pa->chunks)
    snprintf(buf, len,
             "--chunks with --schedule: the schedule places its "
             "stages");
  else if (pa->freeze_schedule)
    snprintf(buf, len,
             "--freeze-schedule re-splits the stages, which the "
             "schedule fixes");
  else if (strcmp(pa->partition, "uniform"))
    snprintf(buf, len,
             "--partition %s with --schedule: the schedule's "
             "stages are split uniformly",
             pa->partition);
  else
    return NULL;
  return buf;
}

int axi_run_cli_schedule(axi_run_cli *r) {
  axi_run_pipe_args *pa = &r->pa;
  if (!pa->schedule_file)
    return -1;
  ax_pipe_sched *s = NULL;
  if (ax_pipe_sched_load(pa->schedule_file, &s) != AX_OK) {
    fprintf(stderr, "axon-run: --schedule: %s\n", ax_errmsg());
    return 2;
  }
  char why[400];
  if (conflict(pa, s, why, sizeof why)) {
    fprintf(stderr, "axon-run: %s (%s)\n", why, pa->schedule_file);
    ax_pipe_sched_free(s);
    return 2;
  }
  pa->mode = ax_pipe_sched_mode(s);
  pa->M = ax_pipe_sched_units(s);
  pa->schedule = s; /* the process's until it exits */
  return -1;
}

#define F(field) offsetof(sched_cli, field)
static const axi_cli_opt g_sched_opts[] = {
    {"mode", "MODE", AXI_CLI_FN, .values_fn = ax_pipe_mode_list, .fn = set_mode,
     .help = "%s: print its lists"},
    {"stages", "K", AXI_CLI_INT, F(K), 1, AX_PIPE_PLAN_MAX_STAGES,
     .help = "with --mode: its ranks (agents)"},
    {"micro", "M", AXI_CLI_INT, F(M), 1, AX_PIPE_SCHED_MAX_UNITS,
     .help = "with --mode: micro-batches per mini-batch (4)"},
    {"chunks", "V", AXI_CLI_INT, F(chunks), 0, AX_PIPE_PLAN_MAX_STAGES,
     .help = "with --mode: stages per agent of a chunked mode (2)"},
    {"file", "FILE", AXI_CLI_STR, F(file),
     .help = "a schedule file: checked, printed normalised"},
    {"out", "FILE", AXI_CLI_STR, F(out),
     .help = "write the text there (default stdout)"},
    AXI_CLI_END};

static const axi_cli_opt *const g_sched_tables[] = {g_sched_opts, NULL};

const axi_cli_cmd axi_run_schedule_cmd = {
    "schedule",
    "--mode M --stages K [--micro M] [--chunks V] [--out FILE]\n"
    "| --file FILE [--out FILE]",
    "A pipeline schedule as text, one rank's actions per line (0F3: stage\n"
    "0's forward of micro-batch 3; B, I, W backwards; STEP0; 0F3+7B1 a\n"
    "composite): a mode's first mini-batch, which train --schedule runs\n"
    "once edited (an asynchronous mode prints K + 1 mini-batches to view,\n"
    "which do not run), or a file's, checked and normalised\n"
    "(docs/MODES.md, \"Schedules as data\").",
    g_sched_tables,
    NULL,
    2,
    schedule_main};
