/* Schedules as data: a pipeline schedule written as text, parsed, printed
 * and turned into a plan (mode.h) that the coordinator runs like a mode's.
 *
 * The format (docs/MODES.md, "Schedules as data"). One flushed mini-batch:
 * each rank's ordered list of actions, which the runtime repeats for every
 * mini-batch. `#` starts a comment (to the end of the line); blank lines
 * are ignored; words are separated by spaces, tabs or carriage returns
 * (CRLF line ends read as LF); a UTF-8 byte-order mark at the start is
 * skipped (line 1's columns count after it). First the header, one
 * setting per line, each at most once, in any order:
 *   ranks K          the agents (1 .. AX_PIPE_PLAN_MAX_STAGES); required
 *   stages S         the stages (K .. AX_PIPE_PLAN_MAX_STAGES); default K,
 *                    2K with `placement v`, the list's length with an
 *                    explicit placement
 *   micro U          units (micro-batches) per mini-batch
 *                    (1 .. AX_PIPE_SCHED_MAX_UNITS); required
 *   placement loop   stage i on rank i mod K (the default)
 *   placement v      two stages per rank in a V: rank r holds r and
 *                    2K-1-r (S = 2K)
 *   placement R0 R1 ... the rank of every stage, in stage order
 *   update flushed   the update rule (the default, and the only one that
 *                    runs: an asynchronous mode's lists span mini-batches)
 *   mode NAME        the table entry (mode.h) whose stage semantics the
 *                    stages follow: the weights a backward uses, what a unit
 *                    keeps, whether --recompute applies. A flushed mode
 *                    whose unit count for U micro-batches is U, and one that
 *                    splits the backward when the lists have I or W.
 *                    Default: zb-h1 when the lists have I or W, else 1f1b
 *                    (flushed modes share the math: any order of the same
 *                    actions trains to the same bits).
 * Then one line per rank, in any order, every rank once:
 *   rank R: ACTION ACTION ...
 * An action is <stage><kind><micro>, kind F (forward), B (whole backward),
 * I (its input-gradient half) or W (its weight-gradient half): "0F3" is
 * stage 0's forward of micro-batch 3; "STEP<stage>" updates a stage's
 * weights ("STEP0"); "0F3+7B1" is one composite action (ax_pipe_op's
 * with_next: two actions of the rank, neither a STEP, started together).
 *
 * What the parser refuses, with NAME:LINE:COL (1-based; COL counts bytes)
 * and a message: a malformed header or action (AX_EFORMAT); a header after
 * the first rank line, a setting given twice, a missing `ranks` or `micro`,
 * a bad placement, a rank line missing, doubled or out of range, an
 * action on a stage its rank does not hold or a micro-batch out of range,
 * a unit of a stage missing its F, or its B (or both I and W), or having
 * one of them twice, a W before its I, B mixed with I or W for the same
 * unit and stage, an F after that unit's B (or I) on its stage, a STEP
 * missing or doubled, an action of a stage after its STEP, and a mode that
 * does not fit (AX_EINVAL). Deadlock freedom across ranks is the
 * verifier's (ax_pipe_sched_verify below, verify.h), which ax_pipe_new runs
 * on a run's schedule before any agent is contacted, and axon-run's
 * schedule --check and train --schedule with its full report (the cycle
 * and the grid).
 * Any bytes are safe to parse: the text is at most AX_PIPE_SCHED_MAX_BYTES,
 * numbers are bounded, nothing is read past `len`.
 *
 * Printing writes the same format, normalised: the header in the order
 * above (every setting, the mode named), then the ranks in order, one
 * space between actions; printing a parsed text gives the same text again.
 *
 * Threads: a schedule is immutable once made; every function is
 * reentrant. */
#ifndef AX_PIPELINE_SCHED_TEXT_H
#define AX_PIPELINE_SCHED_TEXT_H

#include <stddef.h>

#include "axon/runtime/pipeline/schedule/mode.h"
#include "axon/runtime/pipeline/schedule/verify.h"

#ifdef __cplusplus
extern "C" {
#endif

#define AX_PIPE_SCHED_MAX_BYTES (8 << 20) /* the longest text parsed */
#define AX_PIPE_SCHED_MAX_UNITS 1024      /* micro-batches per mini-batch */

typedef struct ax_pipe_sched ax_pipe_sched;

/* Parses text[0 .. len) (any bytes; NUL is refused like any stray byte),
 * naming it `name` in errors (NULL: "schedule"). AX_EFORMAT or AX_EINVAL
 * with "NAME:LINE:COL: message" / AX_ENOMEM. */
int ax_pipe_sched_parse(const char *text, size_t len, const char *name,
                        ax_pipe_sched **out);
/* Reads and parses the file at path (named by its path). AX_EIO when it
 * cannot be opened or read (the system's reason named: a directory, no such
 * file), AX_EFORMAT when larger than AX_PIPE_SCHED_MAX_BYTES (no more than
 * that plus one byte is read: /dev/zero ends cleanly), else the parser's
 * errors. */
int ax_pipe_sched_load(const char *path, ax_pipe_sched **out);
/* The schedule of mini-batch 0 of a built-in mode (ax_pipe_plan_new with
 * n = 1: K ranks, v chunks, M micro-batches), named by its mode.
 * AX_EUNSUPPORTED for a mode that does not flush (its lists span
 * mini-batches; ax_pipe_plan_text prints those), else plan_new's errors. */
int ax_pipe_sched_from_mode(int mode, int K, int v, int M, ax_pipe_sched **out);
/* A copy (AX_ENOMEM). */
int ax_pipe_sched_copy(const ax_pipe_sched *s, ax_pipe_sched **out);
void ax_pipe_sched_free(ax_pipe_sched *s); /* NULL-safe */

/* Its ranks K, stages S, units U, the rank of stage i (-1 out of range),
 * its mode (the table entry its stages follow), whether its lists have I
 * or W, and rank r's list (borrowed, batch fields 0). */
int ax_pipe_sched_ranks(const ax_pipe_sched *s);
int ax_pipe_sched_stages(const ax_pipe_sched *s);
int ax_pipe_sched_units(const ax_pipe_sched *s);
int ax_pipe_sched_stage_rank(const ax_pipe_sched *s, int i);
int ax_pipe_sched_mode(const ax_pipe_sched *s);
int ax_pipe_sched_split(const ax_pipe_sched *s);
const ax_pipe_op *ax_pipe_sched_actions(const ax_pipe_sched *s, int r,
                                        long *len);

/* The plan of n mini-batches (ax_pipe_plan_new_lists with the schedule's
 * mode, placement and lists). Its errors. */
int ax_pipe_sched_plan(const ax_pipe_sched *s, long n, ax_pipe_plan **out);

/* Verifies the plan of two of s's mini-batches (verify.h; r may be NULL):
 * what parsing does to every schedule and ax_pipe_new to a run's. */
int ax_pipe_sched_verify(const ax_pipe_sched *s, ax_pipe_verify_report *r);

/* The text of s (the format above), malloc'd NUL-terminated into *out
 * (the caller frees). AX_ENOMEM. */
int ax_pipe_sched_text(const ax_pipe_sched *s, char **out);
/* The text of a plan: for a flushed mode its first mini-batch (the format
 * above, which parses back to the same lists). For an asynchronous mode,
 * for viewing only, every mini-batch of the plan with global unit numbers
 * (t U + m) and the header `update async`, which the parser refuses (such
 * lists are not one mini-batch repeated). AX_ENOMEM. */
int ax_pipe_plan_text(const ax_pipe_plan *p, char **out);

#ifdef __cplusplus
}
#endif
#endif
