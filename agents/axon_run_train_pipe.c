/* axon-run train's options of pipeline training over remote stages and of
 * its checkpoints (rows of the train command's table, axon_run_train.c),
 * and their checks against each other, before any agent starts. */
#include <limits.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "agents/axon_run.h"
#include "axon/kernels/error.h"
#include "axon/kernels/sum_tree.h"
#include "axon/runtime/pipeline/stage/stage_host.h"
#include "axon/runtime/pipeline/stage/staleness.h"
#include "axon/runtime/pipeline/state/freeze.h"

#define F(field) offsetof(axi_run_cli, field)
#define MAXS AX_PIPE_MAX_STAGES

/* Splits a comma-separated list of agent names (flag's value s) into list,
 * backed by buf (1024 bytes): the count, or -1 with a message when there
 * are more than AX_PIPE_MAX_STAGES names or the list does not fit. */
static int name_list(const char *flag, const char *s, char *buf,
                     const char **list) {
  if (snprintf(buf, 1024, "%s", s) >= 1024) {
    fprintf(stderr, "axon-run: %s: the list is too long\n", flag);
    return -1;
  }
  int k = 0;
  for (char *sv, *tok = strtok_r(buf, ",", &sv); tok;
       tok = strtok_r(NULL, ",", &sv)) {
    if (k == MAXS) {
      fprintf(stderr, "axon-run: %s: at most %d names\n", flag, MAXS);
      return -1;
    }
    list[k++] = tok;
  }
  return k;
}

/* --agents: stage s on the s-th; their count is K unless --stages says. */
static int set_agents(void *dst, const char *s) {
  axi_run_cli *r = dst;
  int k = name_list("--agents", s, r->agent_buf, r->agent_list);
  if (k < 0)
    return 2;
  r->pa.agents = r->agent_list;
  r->pa.nagents = k;
  if (!r->pa.K)
    r->pa.K = k;
  return 0;
}

static int set_spares(void *dst, const char *s) {
  axi_run_cli *r = dst;
  int k = name_list("--spares", s, r->spare_buf, r->spare_list);
  if (k < 0)
    return 2;
  r->pa.spares = r->spare_list;
  r->pa.nspares = k;
  return 0;
}

/* 0, or 2 after the library's message (rc: its parser's result). */
static int lib_parse(int rc) {
  if (rc == AX_OK)
    return 0;
  fprintf(stderr, "axon-run: %s\n", ax_errmsg());
  return 2;
}

static int set_mode(void *dst, const char *s) {
  axi_run_cli *r = dst;
  r->pa.mode_set = 1;
  return lib_parse((r->pa.mode = ax_pipe_mode_index(s)) < 0 ? AX_EINVAL
                                                            : AX_OK);
}

static int set_micro(void *dst, const char *s) {
  axi_run_cli *r = dst;
  r->pa.micro_set = 1;
  return axi_cli_i32("axon-run", "--microbatches", s, 1, 1 << 16, &r->pa.M) ? 0
                                                                            : 2;
}

static int set_recompute(void *dst, const char *s) {
  return lib_parse(
      ax_pipe_recompute_parse(s, &((axi_run_cli *)dst)->pa.recompute));
}

static int set_staleness(void *dst, const char *s) {
  return lib_parse(ax_staleness_parse(s, &((axi_run_cli *)dst)->pa.staleness));
}

/* --sum-order's values are ax_sum_order's, in its order. */
_Static_assert(AX_SUM_TREE == 0 && AX_SUM_CHAIN == 1 && AX_SUM_ORDERS == 2,
               "--sum-order tree|chain");

const axi_cli_opt axi_run_pipe_opts[] = {
    {.help = "\nPipeline training over remote stages (one stage per agent):"},
    {"local", "K", AXI_CLI_INT, F(pa.local), 1, MAXS,
     .help = "start K axon-agent processes here (stage0..)"},
    {"stages", "K", AXI_CLI_INT, F(pa.K), 1, MAXS,
     .help = "stages, with --agents a,b,... and --master HOST:PORT"},
    {"agents", "A,B,...", AXI_CLI_FN, .fn = set_agents,
     .help = "running agents, stage s on the s-th"},
    {"master", "HOST:PORT", AXI_CLI_HOSTPORT, F(pa.master), 1,
     .help = "the agents' master (joining running agents)"},
    {"listen", "HOST:PORT", AXI_CLI_HOSTPORT, F(pa.listen), 0,
     .help = "this coordinator's address, for agents on other\n"
             "hosts (default 127.0.0.1:0)"},
    {"tls-ca", "FILE", AXI_CLI_STR, F(pa.tls_ca),
     .help = "mutual TLS: the CA (CN of the certificate:\n"
             "coordinator; AXON_TLS_CA/CERT/KEY)"},
    {"tls-cert", "FILE", AXI_CLI_STR, F(pa.tls_cert),
     .help = "mutual TLS: this coordinator's certificate"},
    {"tls-key", "FILE", AXI_CLI_STR, F(pa.tls_key),
     .help = "mutual TLS: its key"},
    {"insecure", NULL, AXI_CLI_FLAG, F(pa.insecure),
     .help = "allow a non-loopback --listen without credentials"},
    {"mode", "MODE", AXI_CLI_FN, .values_fn = ax_pipe_mode_list, .fn = set_mode,
     .help = "%s (pipedream)"},
    {"microbatches", "M", AXI_CLI_FN, .fn = set_micro,
     .help = "micro-batches per mini-batch of the modes with\n"
             "micro-batches (4)"},
    {"chunks", "V", AXI_CLI_INT, F(pa.chunks), 0, MAXS,
     .help = "interleaved: stages per agent (2)"},
    {"schedule", "FILE", AXI_CLI_STR, F(pa.schedule_file),
     .help = "run the lists of a schedule file (axon-run schedule;\n"
             "docs/MODES.md): its mode, micro-batches, stages"},
    {"recompute", "R", AXI_CLI_FN, .fn = set_recompute,
     .help = "gpipe: always|except-last|never (never)"},
    {"staleness", "S", AXI_CLI_FN, .fn = set_staleness,
     .help = "ddg/fr/pipedream/2bw: none|predict|pipemare (none;\n"
             "runtime/pipeline/stage/staleness.h)"},
    {"pipemare-gamma", "G", AXI_CLI_DOUBLE, F(pa.stale_gamma), 0, 1,
     AXI_CLI_OPEN_LO | AXI_CLI_OPEN_HI,
     .help = "pipemare: decay of the update average (0.9)"},
    {"pipemare-warmup", "N", AXI_CLI_INT, F(pa.stale_warmup), 0, 1 << 30,
     .help = "pipemare: updates until the step size is lr (0:\n"
             "lr / delay throughout)"},
    {"replicas", "R", AXI_CLI_INT, F(pa.replicas), 1, AX_PIPE_MAX_REPLICAS,
     .help = "pipeline x data parallel: R copies of a pipeline of\n"
             "K = agents / R stages, each on its shard of every\n"
             "batch, combining gradients at each update"},
    {"zero", "1|2", AXI_CLI_INT, F(pa.zero), 0, 2,
     .help = "with --replicas: shard the optimizer state and the\n"
             "averaged gradients over the replicas (ZeRO)"},
    {"sum-order", "O", AXI_CLI_CHOICE, F(pa.sum_order), .values = "tree|chain",
     .help = "gradient sums: tree (default: micro-batches and\n"
             "replicas in one fixed binary tree, the same bits\n"
             "for any replicas x micro-batches of a batch) or\n"
             "chain (in order; replicas' means averaged, ring)"},
    {"tensor-parallel", "T", AXI_CLI_INT, F(pa.tensor_parallel), 1,
     AX_PIPE_MAX_REPLICAS,
     .help = "every stage on T agents, its split layers (bert's\n"
             "attention heads and feed-forward) shared among\n"
             "them (Megatron); agents = replicas x T x stages"},
    {"optimizer-host", "A", AXI_CLI_STR, F(pa.optimizer_host),
     .help = "every stage's optimizer state and update on agent A\n"
             "(ZeRO-Offload; with --local, A is started too)"},
    {"freeze-schedule", "S", AXI_CLI_STR, F(pa.freeze_schedule),
     .help = "STEP:BLOCKS[:K],...: at global step STEP freeze the\n"
             "first BLOCKS blocks (run on this process, outputs\n"
             "cached) and re-pack the rest onto K agents per\n"
             "replica (default: fewer by the share frozen), the\n"
             "freed agents running more replicas (PipeTransformer)"},
    {"freeze-cache-mb", "N", AXI_CLI_LONG, F(pa.freeze_cache_mb), -1, 1L << 20,
     .help = "the frozen blocks' output cache (1024; -1: none)"},
    {"ahead", "N", AXI_CLI_INT, F(pa.ahead), 1, AX_PIPE_AHEAD_MAX,
     .help = "actions each agent gets before the first is\n"
             "answered: the stages wait for their inputs (8;\n"
             "1: coordinator-driven, a round trip per action)"},
    {"mem-cap", "BYTES", AXI_CLI_I64, F(pa.plan_mem_cap), 1, INT64_MAX,
     AXI_CLI_UNITS,
     .help = "the most memory of one agent, K/M/G suffixes: a\n"
             "run whose plan does not fit is refused before any\n"
             "agent starts (plan: picks among those that fit)"},
    {"partition", "P", AXI_CLI_STR, F(pa.partition),
     .help = "uniform|balanced (uniform)"},
    {"links", "FILE", AXI_CLI_STR, F(pa.plan_links),
     .help = "with balanced: each stage boundary weighed by its\n"
             "link (axon-run probe --out); plan: the links"},
    {"trace", "FILE", AXI_CLI_STR, F(pa.trace),
     .help = "Chrome-trace JSON of every forward, backward, send\n"
             "and receive of every stage"},
    {"agent-threads", "N", AXI_CLI_INT, F(pa.agent_threads), 1, 1024,
     .help = "handler threads of --local agents (4)"},
    {"emulate", NULL, AXI_CLI_FLAG, F(pa.emulate),
     .help = "with --stages K: no agents; this process hosts\n"
             "every stage (of every replica and tensor-parallel\n"
             "member) and runs the mode's exact math (the same\n"
             "action lists, weight versions and all-reduces), and\n"
             "reports the modelled time (the timing model fed\n"
             "with the measured per-stage costs)"},
    {"eval-every-epoch", NULL, AXI_CLI_FLAG, F(pa.epoch_eval),
     .help = "evaluate after every epoch (one train call per\n"
             "epoch: asynchronous modes drain at epoch ends)"},
    {"eval-every", "N", AXI_CLI_LONG, F(pa.eval_every), 1, LONG_MAX,
     .help = "evaluate every N steps instead (and after the\n"
             "last), an epoch: line each (asynchronous modes\n"
             "drain there)"},
    {.help = "  With a pipeline, --csv writes the per-step metrics (busy, "
             "bubble, ...)."},
    AXI_CLI_END};

const axi_cli_opt axi_run_ckpt_opts[] = {
    {.help = "\nCheckpoints (pipeline training; docs/CHECKPOINTS.md):"},
    {"checkpoint-dir", "DIR", AXI_CLI_STR, F(pa.ckpt_dir),
     .help = "save checkpoints under DIR (each stage on its own\n"
             "agent's disk, same path); one after the last step"},
    {"checkpoint-every", "N", AXI_CLI_LONG, F(pa.ckpt_every), 1, LONG_MAX,
     .help = "also every N steps (async modes drain there: the\n"
             "cut changes their trajectory at those steps)"},
    {"checkpoint-to", "W", AXI_CLI_CHOICE, F(pa.ckpt_to_coord),
     .values = "stages|coordinator",
     .help = "stages (default: each on its agent's disk) or\n"
             "coordinator (streamed to this host's DIR)"},
    {"checkpoint-in-memory", NULL, AXI_CLI_FLAG, F(pa.ckpt_memory),
     .help = "each checkpoint also in memory: every stage's\n"
             "state on its agent and on the next stage's agent,\n"
             "so a lost stage rolls back without a disk (the\n"
             "only copy without --checkpoint-dir)"},
    {"resume", "DIR", AXI_CLI_STR, F(pa.resume),
     .help = "continue from the newest checkpoint in DIR (or\n"
             "DIR/ckpt-N): the same model, data, optimizer,\n"
             "batch and seed on any layout (stages, partition,\n"
             "chunks, mode, replicas, tensor parallelism, zero);\n"
             "--steps and --epochs count from the start of the run"},
    {"loss-log", "FILE", AXI_CLI_STR, F(pa.loss_log),
     .help = "'step loss' per step, every bit (appends on resume)"},
    {"restarts", "N", AXI_CLI_INT, F(pa.restarts), 0, 1000000,
     .help = "up to N times, wait (60 s) for a lost stage agent to\n"
             "come back under its name (a restarted agent\n"
             "rejoins), then roll back as with --spares"},
    {"spares", "a,b", AXI_CLI_FN, .fn = set_spares,
     .help = "spare agents: a lost stage agent is replaced by the\n"
             "next spare, every stage rolls back to the newest\n"
             "checkpoint and training goes on (needs a checkpoint;\n"
             "with --replicas in a flushed mode the lost stage\n"
             "takes a live replica's state instead, no step lost;\n"
             "with --local the spares are started too)"},
    {"elastic", NULL, AXI_CLI_FLAG, F(pa.elastic),
     .help = "with --replicas in a flushed mode: a lost agent with\n"
             "no spare left drops its replica, the batch split\n"
             "over the replicas left (evenly, or the run ends);\n"
             "with --restarts the replica comes back once the\n"
             "agent rejoined"},
    AXI_CLI_END};

/* Fails with message `msg` (2) when `bad`; else -1. */
static int refuse(int bad, const char *msg) {
  if (bad)
    fprintf(stderr, "axon-run: %s\n", msg);
  return bad ? 2 : -1;
}

/* What checkpoints, spares and --emulate need, with or without a
 * pipeline. */
static int check_modes(const axi_run_pipe_args *pa, int pipe) {
  int ckpt = pa->ckpt_dir || pa->ckpt_memory;
  int rc = refuse(pipe && pa->emulate &&
                      (pa->local || pa->agents || pa->master ||
                       (pa->K < 1 && !pa->schedule_file)),
                  "--emulate needs --stages K (or --schedule FILE, its "
                  "ranks) and no --local, --agents or --master (no agents "
                  "take part)");
  if (rc < 0)
    rc = refuse(
        (pa->ckpt_dir || pa->resume || pa->ckpt_every || pa->ckpt_memory) &&
            !pipe,
        "checkpoints are for pipeline training (--local K or "
        "--stages K)");
  if (rc < 0)
    rc = refuse(pa->ckpt_every && !ckpt, "--checkpoint-every needs "
                                         "--checkpoint-dir or "
                                         "--checkpoint-in-memory");
  if (rc < 0)
    rc = refuse(pa->ckpt_memory && (!pa->ckpt_every || pa->emulate),
                "--checkpoint-in-memory needs --checkpoint-every N and "
                "agents (no --emulate)");
  if (rc < 0)
    rc = refuse(
        pa->elastic && (pa->replicas < 2 || !pipe || pa->emulate ||
                        !ax_pipe_flushes(pa->mode)),
        "--elastic needs --replicas R >= 2 (a lost replica's rows go to the "
        "others) in a flushed mode (they go on from the interrupted "
        "step's boundary, which a mode without a flush does not "
        "have)");
  /* With replicas of a flushed mode a lost stage takes its state from a
   * live replica (axon_run_ckpt.c), which needs no checkpoint. */
  if (rc < 0)
    rc = refuse((pa->nspares || pa->restarts) &&
                    ((!ckpt && !axi_run_live(pa)) || !pipe || pa->emulate),
                "--spares and --restarts need pipeline training over agents "
                "with --checkpoint-dir or --checkpoint-in-memory (a lost "
                "stage rolls back to the newest checkpoint), or --replicas "
                "R >= 2 in a flushed mode (it takes a replica's state)");
  return rc;
}

/* The world of a pipeline: its agents, micro-batches, chunks, and what
 * --optimizer-host and --zero need. */
static int check_world(const axi_run_pipe_args *pa) {
  if (pa->local < 0 || pa->local > MAXS || pa->M < 1 || pa->chunks < 0 ||
      pa->chunks > MAXS ||
      (!pa->local && !pa->emulate &&
       (pa->K < 1 || pa->K > MAXS || !pa->agents || !pa->master))) {
    fprintf(stderr,
            "axon-run: a pipeline needs --local K (1..%d), or "
            "--stages K --agents a,b,... --master HOST:PORT; "
            "--microbatches >= 1; --chunks 0..%d\n",
            MAXS, MAXS);
    return 2;
  }
  int rc = refuse(pa->optimizer_host && (pa->zero || !*pa->optimizer_host),
                  "--optimizer-host needs an agent name; it keeps every "
                  "stage's optimizer state whole on that agent, so not with "
                  "--zero, which shards that state over the replicas");
  if (rc < 0)
    rc = refuse(pa->zero && pa->replicas < 2, "--zero needs --replicas R >= 2");
  return rc;
}

/* Replicas and tensor parallelism: K becomes the agents of one replica's
 * member (with --emulate, --stages K is that already: this process hosts
 * every part). */
static int check_parts(axi_run_pipe_args *pa) {
  if (AXR_PARTS(pa) <= 1)
    return -1;
  int R = AXR_PARTS(pa), total = pa->local ? pa->local : pa->nagents;
  if (pa->agents && pa->K == pa->nagents)
    pa->K = pa->nagents / R; /* --stages not given */
  char msg[512];
  snprintf(msg, sizeof msg,
           "--replicas R and --tensor-parallel T need R * T * K agents, at "
           "most %d (--local R*T*K, or --stages K --agents with R*T*K "
           "names; --stages K --emulate hosts them all here)",
           MAXS);
  int rc = refuse(total % R || (pa->agents && pa->K * R != total) ||
                      (pa->emulate && pa->K * R > MAXS),
                  msg);
  if (rc < 0)
    rc = refuse(pa->elastic && pa->zero,
                "--elastic drops a lost agent's replica and goes on with the "
                "others' state, but under --zero each replica holds the only "
                "copy of its shard of the optimizer state: use --spares or "
                "--restarts, which roll back to a checkpoint");
  return rc;
}

/* --freeze-schedule, the staleness correction and the partition. */
static int check_schedule(const axi_run_pipe_args *pa) {
  if (pa->freeze_schedule) {
    ax_freeze_point pts[16];
    int npts;
    if (ax_freeze_schedule_parse(pa->freeze_schedule, pts, 16, &npts) !=
        AX_OK) {
      fprintf(stderr, "axon-run: --freeze-schedule: %s\n", ax_errmsg());
      return 2;
    }
  }
  if (ax_staleness_check(pa->mode, pa->staleness,
                         pa->stale_gamma ? pa->stale_gamma : AX_PIPEMARE_GAMMA,
                         pa->stale_warmup) != AX_OK) {
    fprintf(stderr, "axon-run: %s\n", ax_errmsg());
    return 2;
  }
  return refuse(strcmp(pa->partition, "uniform") &&
                    strcmp(pa->partition, "balanced"),
                "--partition uniform|balanced");
}

int axi_run_cli_check_pipe(axi_run_cli *r) {
  int pipe = axi_run_cli_pipe(r), rc = -1;
  /* A schedule file gives the run its mode, which the checks of spares,
   * restarts and --elastic weigh (flushed or not), so it is loaded first;
   * loading it needs the agents per pipeline (check_parts). */
  if (pipe && (rc = check_world(&r->pa)) < 0 && (rc = check_parts(&r->pa)) < 0)
    rc = axi_run_cli_schedule(r);
  if (rc < 0)
    rc = check_modes(&r->pa, pipe);
  if (rc < 0 && pipe)
    rc = check_schedule(&r->pa);
  return rc;
}
