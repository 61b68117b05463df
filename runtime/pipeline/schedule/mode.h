/* The pipeline mode table: every mode is defined here and nowhere else.
 *
 * A mode is one entry of the table (ax_pipe_mode_def): its name and unit,
 * when it updates, which weights its forward and backward use, what it
 * keeps per unit, its bounds, its closed-form time, its chunks and their
 * placement, whether its backward is split, and the function that writes
 * each agent's ordered list of actions. The coordinator's drivers and the
 * stages walk those lists (coord/coordinator.h, stage/stage_line-impl.h),
 * the stage host keeps and replays what the entry says
 * (stage/stage_host.h), the partitioner's memory model (partition.h) and
 * the timing model (formula.h, a simulation of these same lists) read the
 * entry; nothing else knows a mode by name.
 *
 * Adding a mode: an enum value below, its entry and action generator in
 * mode.c (or, for a longer generator, in a file of its own such as
 * mode_v.c with its declarations in mode_v-impl.h), its orders in
 * tests/test_schedule.c, and an oracle over agents: its reference in
 * tests/pipe_testutil.h (or its own, as tests/test_pipe_2bw.c) and a case in
 * tests/test_pipe_oracle.c or tests/test_pipe_newsched.c.
 *
 * Stages are 0-based: s in [0, K), d = K - 1 - s (the papers' d_k with
 * k = s + 1); a chunked mode has K v stages on its K agents. A UNIT is
 * what one forward carries and what one distributed autograd context
 * covers: a micro-batch (M per mini-batch) or a whole mini-batch
 * (ax_pipe_units returns 1 for those modes).
 *
 * Actions. F (forward of one unit), B (its whole backward), I and W (the
 * input-gradient and weight-gradient halves of B, for the modes with
 * `split`: zb-h1, zbv, v-half and v-min emit them instead of B, dualpipev
 * B for some units and I and W for the others) and STEP (update the
 * stage's weights with the gradients of mini-batch t's units, taken from
 * their contexts and summed in micro-batch order 0..U-1). Every mode has
 * one STEP per mini-batch on every stage; a flushed mode runs no action of
 * mini-batch t+1 on a stage before its STEP(t).
 *
 * Dependencies (ax_pipe_plan_deps), derived from the lists, never written
 * per mode: F(s,u) needs F(s-1,u); B(s,u) needs B(s+1,u) and I(s,u) needs
 * I(s+1,u); W and STEP follow only their own agent's earlier actions; an
 * agent runs its list in order. A mode with forward_lock (ddg and fr) also
 * makes stage 0's F(t) wait until every stage j finished the action its
 * list puts right before its own F(t) (the round t-1 is over).
 *
 * Thread safety: the table is constant; every function is reentrant. */
#ifndef AX_PIPELINE_MODE_H
#define AX_PIPELINE_MODE_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Indices into the table. */
typedef enum ax_pipe_mode {
  AX_MODE_SEQUENTIAL = 0,
  AX_MODE_GPIPE = 1,
  AX_MODE_1F1B = 2,
  AX_MODE_DDG = 3,
  AX_MODE_FR = 4,
  AX_MODE_PIPEDREAM = 5,
  AX_MODE_2BW = 6,
  AX_MODE_INTERLEAVED = 7,
  AX_MODE_ZBH1 = 8,
  AX_MODE_ZBV = 9,
  AX_MODE_DUALPIPEV = 10,
  AX_MODE_VHALF = 11,
  AX_MODE_VMIN = 12,
  AX_MODE_COUNT
} ax_pipe_mode;

/* Action kinds. */
enum {
  AX_OP_FWD = 0,
  AX_OP_BWD = 1,
  AX_OP_INPUT_GRAD = 2,  /* I: the input-gradient half of B */
  AX_OP_WEIGHT_GRAD = 3, /* W: the weight-gradient half of B */
  AX_OP_STEP = 4,
  AX_OP_KINDS
};

/* One action of a stage's list. STEP has micro 0. */
typedef struct ax_pipe_op {
  int kind;  /* AX_OP_* */
  int stage; /* 0-based */
  int batch; /* mini-batch t */
  int micro; /* unit within t (0 when a unit is a mini-batch) */
  /* 1: this action and the next one of the list are ONE composite action
   * (DualPipe's overlapped F&B: a forward of one unit and a backward, B or
   * I, of another, on the same rank). A composite starts when the
   * dependencies of both parts are met (ax_pipe_plan_deps gives the first
   * part the union) and its parts run back to back on the rank's thread;
   * hardware with separate compute and communication streams would overlap
   * their transfers. Text: "0F3+7B1" (schedule files). */
  int with_next;
} ax_pipe_op;

/* GPipe-style recompute option (--recompute), for modes with
 * recompute_ok. */
#define AX_RECOMPUTE_NEVER 0
#define AX_RECOMPUTE_ALWAYS 1
#define AX_RECOMPUTE_EXCEPT_LAST 2 /* every micro-batch but the last one */

enum { AX_UNIT_MICRO = 0, AX_UNIT_MINI = 1 };
enum {
  AX_WEIGHTS_CURRENT = 0, /* the live weights (unchanged since the forward) */
  AX_WEIGHTS_STASHED = 1, /* the version the unit's forward used */
  AX_WEIGHTS_LATEST = 2   /* the latest weights, forward replayed first */
};
enum {
  AX_FWD_LATEST = 0,         /* a forward uses the weights as they are */
  AX_FWD_DOUBLE_BUFFERED = 1 /* every unit of mini-batch t uses the weights
                                before update t-1 (PipeDream-2BW): at most
                                two versions live, the latest and a shadow */
};
enum { AX_KEEP_ACTIVATIONS = 0, AX_KEEP_INPUTS = 1 };
enum {
  AX_PLACE_LOOP = 0, /* stage i on agent i mod K */
  AX_PLACE_V = 1     /* two stages per agent: agent r has r and 2K-1-r */
};

typedef struct ax_pipe_mode_def {
  const char *name;    /* as on the command line */
  const char *summary; /* one line for --help */
  int unit;            /* AX_UNIT_* */
  int flush;           /* 1: the pipeline drains before each STEP */
  int fwd_weights;     /* AX_FWD_* */
  int bwd_weights;     /* AX_WEIGHTS_* */
  int keep;            /* AX_KEEP_*: what a unit keeps between F and B */
  int recompute_ok;    /* --recompute applies */
  int forward_lock;    /* ddg's and fr's forward locking (see above) */
  /* The most units stage s keeps at once (forwarded, not yet backwarded,
   * or, split, not yet through its W), with U units per mini-batch; K is
   * the run's STAGES (K v for a chunked mode). */
  int (*live_bound)(int K, int s, int U);
  /* Writes rank r's actions (of K ranks holding v stages each; v = 1 but
   * for chunked modes, and then rank r is stage r) for n mini-batches of U
   * units at out[*k...], advancing *k (the caller sized out with
   * ax_pipe_nops_chunks). */
  void (*actions)(int K, int v, int r, int U, long n, ax_pipe_op *out, long *k);
  /* Seconds per mini-batch for K equal ranks of v stages (t_f, t_b per
   * stage and unit), the closed form the timing simulation is checked
   * against: the makespan of one mini-batch for flushed modes, the
   * steady-state period otherwise. NULL: no closed form (the simulation
   * is the model). */
  double (*uniform_time)(int K, int v, int U, double t_f, double t_b,
                         int recompute);
  /* 1: every agent holds v > 1 stages (--chunks; 2 for a V); where stage
   * i goes is `placement`. The units must be a multiple of K when the
   * placement is a loop. */
  int chunked;
  /* 1: the backward runs as its input half I and weight half W (the layers'
   * split backward, models/module.h); the lists have I and W, not B. */
  int split;
  /* Chunked modes: which agent holds stage i (AX_PLACE_*). */
  int placement;
  /* The fewest units per mini-batch for each rank (dualpipev: 2, so M >=
   * 2K on K ranks); 0: no such rule. */
  int min_units_per_rank;
  /* Modes whose lists mix B with I and W (dualpipev): the W actions of rank
   * r of K per mini-batch of U units (every other backward is a B), so
   * ranks' lists differ in length. NULL: every backward of a split mode
   * is I and W, none of another mode's. */
  int (*weight_halves)(int K, int r, int U);
} ax_pipe_mode_def;

/* The entry of mode (NULL when out of range, with AX_EINVAL set). */
const ax_pipe_mode_def *ax_pipe_mode_get(int mode);
/* The index of a mode name, or -1 with ax_errmsg listing the valid modes
 * (AX_EINVAL). NULL is invalid. */
int ax_pipe_mode_index(const char *name);
/* The mode's name ("pipedream"), or "?" when out of range. */
const char *ax_pipe_mode_name(int mode);
/* "sequential|gpipe|..." (static). */
const char *ax_pipe_mode_list(void);

/* Units per mini-batch: M for micro-batch modes (M > 1), else 1. */
int ax_pipe_units(int mode, int M);
/* Whether the mode flushes (drains) the pipeline before each update. */
int ax_pipe_flushes(int mode);
/* The fewest micro-batches mode needs with K stages (2bw: K - 1, so the
 * shadow weights of a mini-batch exist before its first forward; K agents
 * for chunked modes: dualpipev 2K), else 1. */
int ax_pipe_min_units(int mode, int K);
/* The table's bound on the states stage s keeps (0 on a bad mode); K is
 * the run's stages (K v for a chunked mode), as the partitioner counts. */
int ax_pipe_live_bound(int mode, int K, int s, int M);
/* The bound on weight versions stage s holds (the live one included). */
int ax_pipe_version_bound(int mode, int K, int s, int M);
/* Whether B of unit `micro` (of U) replays its forward: the mode keeps only
 * inputs, or the recompute option says so. */
int ax_pipe_replays(int mode, int recompute, int U, int micro);

/* The stages per agent of a run: `chunks` (>= 2, default 2) for chunked
 * modes, 1 for the others. */
int ax_pipe_chunks(int mode, int chunks);
/* The agent (rank) of K that holds stage s in mode's placement. */
int ax_pipe_stage_rank(int mode, int K, int s);
/* Actions of one agent (rank) holding v stages, for n mini-batches, and
 * the same for v = 1: the length of every rank's list, or for a mode with
 * weight_halves (dualpipev) the most any rank's list may have. */
long ax_pipe_nops_chunks(int mode, int v, int M, long n);
long ax_pipe_nops(int mode, int M, long n);
/* The exact length of rank r's list (of K ranks of v stages each): as
 * ax_pipe_nops_chunks but for modes with weight_halves. 0 on a bad
 * argument. */
long ax_pipe_nops_rank(int mode, int K, int v, int r, int M, long n);
/* Fills ops with rank r's list (K ranks, v stages each; its length is
 * ax_pipe_nops_rank). AX_EINVAL on a bad mode, K < 1, r outside [0, K),
 * M < 1, n < 0, a unit count a chunked mode cannot split, fewer units than
 * its rank count needs (min_units_per_rank: dualpipev's M >= 2K; 2bw's
 * minimum is the coordinator's), or cap too small. */
int ax_pipe_schedule_chunks(int mode, int K, int v, int r, int M, long n,
                            ax_pipe_op *ops, long cap);
/* The same for single-chunk modes: stage s's list. */
int ax_pipe_schedule(int mode, int K, int s, int M, long n, ax_pipe_op *ops,
                     long cap);

/* The delay of stage s (of K, single-chunk modes) with M micro-batches:
 * the updates of the stage's weights between the version a unit's forward
 * uses and the update its gradient goes into, in the steady state (a unit
 * of mini-batch t whose forward uses version t - delay). Derived from the
 * stage's action list (the STEPs before a steady-state F) and the entry's
 * forward weights (double-buffered: version t - 1): pipedream, ddg and fr
 * d = K - 1 - s, 2bw 1, flushed modes 0. In these modes the backward of
 * the unit runs on version t, so the delay is also the number of updates
 * between its forward and its backward. The first units see
 * min(delay, t). -1 with AX_EINVAL on a bad argument. The staleness
 * corrections (staleness.h) read it. */
int ax_pipe_delay(int mode, int K, int s, int M);

/* An action as schedule text writes it into buf (returned): "0F3" (stage
 * 0's forward of unit 3; B, I and W alike), "STEP0" (stage 0's update).
 * With U > 0 units are numbered across mini-batches (t U + m), with U = 0
 * within their own. One op only: with_next is not read. */
char *ax_pipe_op_text(const ax_pipe_op *o, int U, char *buf, size_t len);
/* The same for an action of a list: a composite's first part (with_next)
 * also writes its second, the next op of the list: "0F3+7B1". */
char *ax_pipe_action_text(const ax_pipe_op *o, int U, char *buf, size_t len);

/* ---- plans: every rank's list plus the dependencies ---------------------- */
/* A plan is what every consumer of a schedule reads (the coordinator's
 * drivers, the timing model, the verifier, the plots): a mode's generated
 * lists, or lists given as data (a schedule file). */
typedef struct ax_pipe_plan ax_pipe_plan;
#define AX_PIPE_PLAN_MAX_STAGES 64 /* ranks and stages of a plan */
/* The lists of K ranks (agents) holding v stages each (ax_pipe_chunks) for
 * n mini-batches; the stages are K v, stage i on rank
 * ax_pipe_stage_rank(mode, K, i) (i mod K but for a V). AX_EINVAL /
 * AX_ENOMEM. */
int ax_pipe_plan_new(int mode, int K, int v, int M, long n, ax_pipe_plan **out);
/* A plan from given lists: K ranks (1..AX_PIPE_MAX_STAGES) holding S
 * stages (K <= S <= AX_PIPE_MAX_STAGES), stage i on rank stage_rank[i]
 * (every rank holds at least one); U units per mini-batch. lists[r]
 * (len[r] actions) is rank r's list for ONE mini-batch, every batch field
 * 0; the plan repeats it for n mini-batches with batch = t. `mode` is the
 * table entry whose semantics the stages follow (the weights a backward
 * uses, what a unit keeps, the forward lock). Checked here: each action's
 * kind, stage (held by its rank) and micro (in [0, U)), and that a list's
 * last action does not open a composite; the rest (every unit's F and B
 * or I and W once, a W after its I, the order's freedom from deadlock) is
 * the verifier's (verify.h). AX_EINVAL with a message naming rank and
 * position / AX_ENOMEM. The lists are copied. */
int ax_pipe_plan_new_lists(int mode, int K, int S, const int *stage_rank, int U,
                           long n, const ax_pipe_op *const *lists,
                           const long *len, ax_pipe_plan **out);
void ax_pipe_plan_free(ax_pipe_plan *p); /* NULL-safe */
/* Rank r's list (borrowed) and its length. */
const ax_pipe_op *ax_pipe_plan_actions(const ax_pipe_plan *p, int r, long *n);
/* Its stage count (K v, or the S given). */
int ax_pipe_plan_stages(const ax_pipe_plan *p);
/* Its ranks, units per mini-batch, mini-batches, mode, and the rank that
 * holds stage s. */
int ax_pipe_plan_ranks(const ax_pipe_plan *p);
int ax_pipe_plan_units(const ax_pipe_plan *p);
long ax_pipe_plan_batches(const ax_pipe_plan *p);
int ax_pipe_plan_mode(const ax_pipe_plan *p);
int ax_pipe_plan_stage_rank(const ax_pipe_plan *p, int s);
/* The actions of OTHER stages that op waits for (at most S + 2) into
 * deps; returns their count. op must be an action of the plan (for the
 * first part of a composite, with_next, the union of both parts'). */
int ax_pipe_plan_deps(const ax_pipe_plan *p, const ax_pipe_op *op,
                      ax_pipe_op *deps);
/* Only those of op's dependencies that carry no data (the forward lock's):
 * the ones a stage cannot wait for itself, so a driver issuing actions
 * ahead (stage-driven execution) still waits for them. */
int ax_pipe_plan_lock_deps(const ax_pipe_plan *p, const ax_pipe_op *op,
                           ax_pipe_op *deps);
/* The same without a plan (builds one for op's prefix; for tests and
 * tools, O(op->batch)). Returns the count, or -1 on a bad argument. */
int ax_pipe_deps(int mode, int K, int M, const ax_pipe_op *op,
                 ax_pipe_op *deps);

#ifdef __cplusplus
}
#endif
#endif
