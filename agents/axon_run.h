/* axon-run internals shared by its files: the commands (one file each,
 * their options described by tables that agents/axon_cli.h reads) and the
 * pipeline path of `train`. */
#ifndef AX_AXON_RUN_H
#define AX_AXON_RUN_H

#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

#include "agents/axon_cli.h"
#include "axon/kernels/device.h"
#include "axon/models/data/dataset.h"
#include "axon/runtime/autograd/plugin.h"
#include "axon/runtime/pipeline/coord/coordinator.h"
#include "axon/runtime/pipeline/coord/train.h"
#include "axon/runtime/pipeline/schedule/partition.h"
#include "axon/runtime/pipeline/schedule/verify.h"

typedef struct axi_run_pipe_args {
  const char *model, *model_config, *dataset, *data_config, *optim;
  int epochs, batch, eval_batch;
  long steps, eval_limit;
  uint64_t seed;
  ax_device device;
  int K, M, mode, recompute, local, agent_threads, quiet;
  int chunks;   /* stages per agent for chunked modes (--chunks) */
  int ahead;    /* --ahead: actions issued ahead per agent (0: default) */
  int replicas; /* --replicas R: R copies of the pipeline (K = agents / R) */
  int tensor_parallel; /* --tensor-parallel T: T agents per stage (K =
                          agents / (R T)) */
  int nagents;         /* names given with --agents */
  int zero;      /* --zero 1|2: optimizer state sharded over the replicas */
  int sum_order; /* --sum-order tree|chain (ax_sum_order) */
  int precision; /* --precision fp32|bf16 (ax_precision) */
  const char *optimizer_host;  /* --optimizer-host: every stage's optimizer
                                  there (started too with --local) */
  int staleness, stale_warmup; /* --staleness, --pipemare-warmup */
  double stale_gamma;          /* --pipemare-gamma (0: the default) */
  int emulate;     /* --emulate: every stage in this process (emulate.h) */
  int epoch_eval;  /* --eval-every-epoch: test accuracy after each epoch */
  long eval_every; /* --eval-every N: test accuracy every N steps */
  const char *const *agents; /* K names (--agents), or set by --local */
/* Pipelines of K agents a run needs: replicas x tensor-parallel members. */
#define AXR_PARTS(a)                                                           \
  (((a)->replicas > 1 ? (a)->replicas : 1) *                                   \
   ((a)->tensor_parallel > 1 ? (a)->tensor_parallel : 1))
  const char *master; /* --master HOST:PORT when joining agents */
  const char *listen; /* --listen HOST:PORT of the coordinator */
  /* --tls-ca/--tls-cert/--tls-key, --insecure of the coordinator node */
  const char *tls_ca, *tls_cert, *tls_key;
  int insecure;
  const char *partition, *trace, *csv;
  const char *const *plugins; /* --plugin files (absolute), for --local */
  int nplugins;
  /* Checkpoints (axon_run_ckpt.c): --checkpoint-dir, --checkpoint-every,
   * --checkpoint-to, --resume, --loss-log. */
  const char *ckpt_dir, *resume, *loss_log;
  const char *freeze_schedule; /* --freeze-schedule STEP:BLOCKS[:K],... */
  /* --schedule FILE: the lists the drivers walk, loaded and checked by
   * axi_run_cli_schedule (axon_run_schedule.c) */
  const char *schedule_file;
  ax_pipe_sched *schedule;
  int mode_set, micro_set; /* --mode, --microbatches given */
  long freeze_cache_mb;    /* --freeze-cache-mb (0: 1024; -1: none) */
  long ckpt_every;
  int ckpt_to_coord; /* --checkpoint-to coordinator */
  int ckpt_memory;   /* --checkpoint-in-memory */
  /* --spares: agents that replace lost stage agents, in order (with
   * --local, started too). */
  const char *const *spares;
  int nspares;
  int restarts; /* --restarts: lost agents waited for under their names */
  int elastic;  /* --elastic: a lost replica without a spare is dropped */
  /* axon-run probe (axon_run_probe.c): --iters, --bytes, --out */
  int probe, probe_iters;
  int64_t probe_bytes;
  const char *probe_out;
  /* axon-run plan (axon_run_plan.c): --modes, --mem-cap, --action-us;
   * --links (also for train's --partition balanced) */
  const char *plan_modes, *plan_links;
  int64_t plan_mem_cap; /* --mem-cap, per agent: train's fit too */
  /* The split the fit checked before any agent started (axon_run_fit.c),
   * which the run then uses (split_set). */
  int split[AX_PIPE_MAX_STAGES + 1], split_set;
  double plan_action_us, plan_compute_scale;
  /* axon-run generate (axon_run_gen.c): --checkpoint, --prompt,
   * --prompt-ids, --tokens, --temperature, --top-k (and --seed) */
  int gen, gen_tokens, gen_top_k;
  const char *gen_ckpt, *gen_prompt, *gen_prompt_ids;
  double gen_temperature;
} axi_run_pipe_args;

/* The training batches as axon_run_pipe.c feeds them: batch and step are
 * ax_pipe_train's callbacks; seek gives the data position of global step
 * `step` (its epoch and the batches of it already used) and, with apply,
 * moves the data there. */
typedef struct axi_run_feed {
  ax_pipe_batch_fn batch;
  ax_pipe_step_fn step;
  int (*seek)(void *user, long step, int apply, long *epoch, long *in_epoch);
  void *user;
  /* Called after each training call with the run's steps done so far (may
   * be NULL); an error ends the run. */
  int (*segment)(void *user, long done);
  long every; /* also end a call at the multiples of this (0: none), e.g.
                 the epochs of --eval-every-epoch */
  /* After a failed training call: if a stage agent was lost and a spare
   * is left, builds the pipeline anew with the spare in its place (*p
   * replaced) and returns AX_OK; else returns the failure (may be NULL). */
  int (*rebuild)(void *user, int failure, ax_pipe **p);
  /* After a freeze replaced the pipeline by *p (--freeze-schedule; may be
   * NULL). */
  void (*repacked)(void *user, ax_pipe *p);
  /* After a failed training call: the names of the agents that are lost
   * (down, or another process now), at most max, waited for up to 5 s;
   * their count, 0 when none is (may be NULL). Before rebuild. */
  int (*lost)(void *user, const char **names, int max);
  /* --elastic (may be NULL): can_grow is -1 when no replica was dropped
   * or none is waited for, 0 while one is waited for, 1 once its agents
   * are all up again; grow then builds the pipeline anew with every
   * replica (*p replaced). */
  int (*can_grow)(void *user);
  int (*grow)(void *user, ax_pipe **p);
} axi_run_feed;

/* The agents of a pipeline run across failures (axon_run_agents.c): the
 * run's layout of every part's agents (cur: replica r's member t's K at
 * (r T + t) K ..), spares taking lost agents' places in it, replicas
 * dropped by --elastic, and the options' agents (the kept replicas'). */
typedef struct axi_run_agents {
  const axi_run_pipe_args *a;
  ax_node *node;
  ax_pipe_opts *o; /* its agents and replicas follow the kept replicas */
  const char **cur;
  const char *act[2 * AX_PIPE_MAX_STAGES]; /* o->agents */
  int n_agents, K, T, R;
  int next_spare, restarts; /* spares used, restarts taken */
  unsigned char dropped[AX_PIPE_MAX_REPLICAS];
  int lost_at[AX_PIPE_MAX_REPLICAS]; /* the agent that dropped replica r */
  /* each agent's incarnation when the pipeline was built: an agent down,
   * or another process now (restarted before the failure was handled),
   * is lost */
  uint64_t inc[2 * AX_PIPE_MAX_STAGES];
} axi_run_agents;
/* Sets g up for run a on node with options o, whose agents it lays out
 * from cur (every part's); _built notes the incarnations after a build. */
void axi_run_agents_init(axi_run_agents *g, const axi_run_pipe_args *a,
                         ax_node *node, ax_pipe_opts *o, const char **cur);
void axi_run_agents_built(axi_run_agents *g);
/* axi_run_feed's lost, rebuild (every lost agent replaced by a spare,
 * else its replica dropped with --elastic, else waited for with
 * --restarts; *p freed and built anew), can_grow and grow. */
int axi_run_agents_lost(axi_run_agents *g, const char **names, int max);
int axi_run_agents_rebuild(axi_run_agents *g, int failure, ax_pipe **p);
int axi_run_agents_can_grow(axi_run_agents *g);
int axi_run_agents_grow(axi_run_agents *g, ax_pipe **p);

/* The run's configuration as "key=value;..." (axon_run_config.c), as a
 * checkpoint records it. The keys before "mode" set the math of training
 * (the model and its settings, the data, the optimizer with its
 * learning-rate schedule, the global batch, the seed, the staleness
 * correction and the freeze schedule): a resume must repeat them. The rest
 * is the layout (mode, agents, chunks, micro-batches, recomputation,
 * partition) and the precision, which a resume may change: the mover cuts
 * the checkpoint's state for the new layout
 * (runtime/pipeline/state/state.h), and the state is f32 in either
 * precision (models/module.h). */
void axi_run_config(const axi_run_pipe_args *a, char *out, size_t len);
/* --resume dir's check that this run's configuration `now` repeats the
 * math of the checkpoint's `saved`: AX_EINVAL naming every key of the math
 * whose value differs (a key that an older checkpoint did not record is
 * not compared, except freeze: a run frozen on one side only differs). */
int axi_run_same_config(const char *dir, const char *saved, const char *now);
/* Trains steps [start, total) of the run (axon_run_ckpt.c): from 0, or
 * after --resume from the checkpoint's step (*start), in segments that end
 * at the multiples of --checkpoint-every with a checkpoint after each and
 * after the last step, and at the multiples of feed->every; writes
 * --loss-log. *seconds: training time without
 * the checkpoints, *ckpt_s: the checkpoints' time. */
int axi_run_train(const axi_run_pipe_args *a, ax_pipe **p, long total,
                  const axi_run_feed *feed, long *start, double *seconds,
                  double *ckpt_s);
/* Whether a lost agent of run a recovers live from a replica, without a
 * rollback (--replicas R >= 2 of a flushed mode, with --spares,
 * --restarts or --elastic; runtime/pipeline/state/recover.h): its
 * pipelines keep their step boundaries (axon_run_ckpt.c). */
int axi_run_live(const axi_run_pipe_args *a);
/* The program and its commands: train (axon_run_train.c), eval and export
 * (axon_run_use.c), probe (axon_run_probe.c), plan (axon_run_plan.c),
 * generate (axon_run_gen.c), schedule (axon_run_schedule.c). */
extern const axi_cli_prog axi_run_prog;
extern const axi_cli_cmd axi_run_train_cmd, axi_run_eval_cmd,
    axi_run_export_cmd, axi_run_probe_cmd, axi_run_plan_cmd, axi_run_gen_cmd,
    axi_run_schedule_cmd;

/* What the options of train, probe and plan fill (one family: probe and
 * plan take train's options too). */
typedef struct axi_run_cli {
  ax_train_opts o;      /* the model, the data, the training */
  axi_run_pipe_args pa; /* pipeline training, probe's and plan's own */
  int threads, quiet;   /* --threads (0: every core), --quiet */
  /* The storage behind pa.agents (--agents), pa.spares and pa.plugins. */
  const char *agent_list[AX_PIPE_MAX_STAGES], *spare_list[AX_PIPE_MAX_STAGES];
  char agent_buf[1024], spare_buf[1024];
  const char *plugins[AX_PLUGIN_MAX];
  char plugin_path[AX_PLUGIN_MAX][4096];
} axi_run_cli;

/* The options of train's pipeline training and of its checkpoints
 * (axon_run_train_pipe.c), rows of the train command's table. */
extern const axi_cli_opt axi_run_pipe_opts[], axi_run_ckpt_opts[];

/* Parses the command line of command c (train, probe or plan) into r
 * from the defaults, then the checks every one of them needs (the
 * configuration keys, the settings defaulted by others). -1 when the
 * command goes on, else its exit status (axon_run_train.c). */
int axi_run_cli_parse(const axi_cli_cmd *c, int argc, char **argv,
                      axi_run_cli *r);
/* Whether r asks for pipeline training (--local, --stages, --agents or
 * --emulate). */
int axi_run_cli_pipe(const axi_run_cli *r);
/* The checks of the pipeline options against each other (for train and
 * probe): -1 when they hold, else 2 after a message. */
int axi_run_cli_check_pipe(axi_run_cli *r);
/* --schedule FILE: loads it into r->pa.schedule and takes its mode and
 * micro-batches (with --emulate and no --stages, its ranks as the
 * stages K), refusing what contradicts it (--mode, --microbatches,
 * the agents, --chunks, --freeze-schedule, a partition but uniform). -1
 * when it holds or there is none, else 2 after a message. */
int axi_run_cli_schedule(axi_run_cli *r);
/* Copies the training options into r->pa (the pipeline's paths read only
 * those) and sets this process's compute threads (1 unless --threads). */
void axi_run_cli_to_pipe(axi_run_cli *r);

/* AX_EINVAL naming the first --model-config, --optim or --data-config key
 * that the model, optimizer or data set does not read, with the keys it
 * does (axon_run_check.c). */
int axi_run_check_configs(const ax_train_opts *o);

/* Starts K agents named names[0..K) joining 127.0.0.1:port with `threads`
 * handler threads, each loading the plugins; pids[s] receives their pids.
 * AXON_PIN_AGENTS pins agent s to a core (axon_run_local.c). 0, or -1 with
 * a message on stderr. */
int axi_run_spawn_local(int K, const char *const *names, int port, int threads,
                        const char *const *plugins, int nplugins, pid_t *pids);
/* Reserves a loopback port (a bound socket kept open in *fd; close it once
 * the node listens). The port, or -1. */
int axi_run_reserve_port(int *fd);

/* Shared by plan, train and schedule (axon_run_fit.c). Optimizer buffers
 * per parameter of --optim's configuration (adamw 2, momentum 1). */
int axi_run_optim_copies(const char *cfg);
/* Every block of model def (configuration mcfg) profiled in this process on
 * a batch of `rows` rows of ds (a's seed and precision): `reps` timed runs
 * (1: one pass, untimed before it; enough for the bytes), into p[*n]. */
int axi_run_profile(const axi_run_pipe_args *a, const ax_model_def *def,
                    const ax_config *mcfg, ax_dataset *ds, int rows, int reps,
                    ax_block_profile *p, int *n);
/* The first block of every stage of run a into bounds (stages + 1
 * entries): the split its fit chose (split_set), else uniform, or
 * --partition balanced on the first batch of ld (each boundary weighed by
 * its --links link when given). */
int axi_run_split(const axi_run_pipe_args *a, const ax_model_def *def,
                  const ax_config *mcfg, ax_loader *ld, int n_blocks,
                  int *bounds);
/* Plan p's fit under a->plan_mem_cap bytes per agent (the verifier's check
 * 4, per rank: verify.h) for the model, data, batch, optimizer and
 * recompute of a, its stages split uniformly: the blocks' bytes profiled
 * here for one unit, summed per stage. The verifier's result; r (not NULL)
 * has the bytes per rank, or on a refusal its message. */
int axi_run_fit(const axi_run_pipe_args *a, const ax_pipe_plan *p,
                ax_pipe_verify_report *r);
/* "<what>fits the cap of N bytes per agent; peak bytes per rank: ..." */
void axi_run_fit_print(FILE *out, const char *what,
                       const ax_pipe_verify_report *r, int64_t cap);
/* train --mem-cap: before any agent is contacted, the fit of the plan the
 * run will use (the schedule file's, or its mode's for two mini-batches)
 * with the split it will use (kept in a->split), a line on stderr with the
 * peak bytes per rank. AX_OK (also without a cap, and for probe and
 * generate); on a refusal the verifier's message on stderr and its error. */
int axi_run_fit_train(axi_run_pipe_args *a);

/* Stages of the run: the agents, times --chunks for chunked modes. */
int axi_run_stages(const axi_run_pipe_args *a);
/* Says on stderr what the run trains how: the mode, the first block of
 * every stage (bounds), the replicas and tensor parallelism. */
void axi_run_announce(const axi_run_pipe_args *a, const int *bounds);
/* What a pipeline run recorded (axon_run_pipe.c): the steps done, with
 * `batch` samples each, and each one's loss and completion time. */
typedef struct axi_run_steps {
  long steps, batch;
  const double *loss, *done_at;
} axi_run_steps;
/* The trace of every stage (--trace) and the per-step metrics (--csv)
 * of pipeline p after the steps r, the first started at t0
 * (axon_run_report.c); failures are reported, not returned. */
void axi_run_write_outputs(const axi_run_pipe_args *a, ax_pipe *p,
                           const axi_run_steps *r, double t0);
/* The "summary:" line of the run (total steps trained here, test accuracy
 * acc and loss tl, spb the modelled seconds per batch or < 0 for none,
 * unit the data set's ax_dataset_token_unit) and the "stages:" line of
 * each stage's figures. */
void axi_run_summary(const axi_run_pipe_args *a, ax_pipe *p,
                     const axi_run_steps *r, const ax_pipe_stats *st,
                     long total, double acc, double tl, double spb,
                     const char *unit);
/* Prints " NAME_bits_per_UNIT=X" on stdout, the loss `nats` of a
 * language-model data set in bits per token, for the key=value lines
 * (summary:, epoch:, eval:); nothing when unit (ax_dataset_token_unit) is
 * NULL. */
void axi_run_print_bits(const char *name, double nats, const char *unit);

/* Runs `axon-run train` in pipeline mode; returns the exit status. */
int axi_run_pipe_main(axi_run_pipe_args *a);
/* axon-run generate over the stages on a->agents of the world of `node`
 * (axon_run_gen.c). */
int axi_run_gen_pipe(const axi_run_pipe_args *a, ax_node *node);
/* axon-run probe on the joined world of `node`: the agents' links. */
int axi_run_probe(const axi_run_pipe_args *a, ax_node *node);
/* axon-run plan: every mode and split predicted; no agents needed. */
int axi_run_plan(const axi_run_pipe_args *a);
/* The links between a->agents' neighbouring stages of mode m from
 * --links (lat_s[b], Bps[b], b < stages - 1); AX_OK with *have = 0 when
 * no file was given. */
int axi_run_stage_links(const axi_run_pipe_args *a, int m, double *lat_s,
                        double *Bps, int *have);

#endif
