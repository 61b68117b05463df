/* axon-run generate --checkpoint DIR|FILE --prompt TEXT --tokens N: text
 * from a checkpoint's model (models/generate.h). In one process the whole
 * model is one net with its key/value cache; with --local K, --agents or
 * --emulate (train's options) the model is split into K stages over
 * agents, each keeping its layers' caches (runtime/pipeline/coord/decode.h),
 * every new token flowing through them and sampled here. The same seed
 * gives the same text either way. */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agents/axon_run.h"
#include "axon/kernels/clock.h"
#include "axon/models/generate.h"
#include "axon/runtime/pipeline/coord/decode.h"
#include "axon/runtime/pipeline/state/state.h"

#define F(field) offsetof(axi_run_cli, field)

/* A run: the prompt's ids and how tokens are shown. */
typedef struct gen_job {
  const axi_run_pipe_args *a;
  int32_t *prompt;
  int n_prompt;
  int text; /* a byte-level model: the prompt's bytes in, text out;
               else ids */
  int shown;
} gen_job;

/* "1,2,3" into ids (malloc'd): the count, or -1 with a message. */
static int parse_ids(const char *s, int32_t **ids) {
  int n = 0, cap = 16;
  *ids = malloc((size_t)cap * sizeof **ids);
  for (const char *p = s; *ids && *p;) {
    char *end;
    long v = strtol(p, &end, 10);
    if (end == p || v < 0 || v > INT32_MAX || (*end && *end != ',')) {
      fprintf(stderr, "axon-run: --prompt-ids: '%s' is not a list of ids\n", s);
      break;
    }
    if (n == cap) {
      int32_t *m = realloc(*ids, (size_t)(cap *= 2) * sizeof **ids);
      if (!m)
        break;
      *ids = m;
    }
    (*ids)[n++] = (int32_t)v;
    p = *end ? end + 1 : end;
    if (!*p)
      return n;
  }
  free(*ids);
  *ids = NULL;
  return -1;
}

/* The prompt as the checkpoint's model reads it: 0, or 2 after a
 * message. */
static int prepare(gen_job *j, const ax_ckpt_info *info) {
  const axi_run_pipe_args *a = j->a;
  ax_config dc; /* byte-level: "text", or "tokens" with vocab=256 */
  int e = ax_config_parse(&dc, info->data_config);
  j->text = !strcmp(info->dataset, "text") ||
            (!strcmp(info->dataset, "tokens") && e == AX_OK &&
             ax_config_int(&dc, "vocab", 0, &e) == 256);
  if (j->text && a->gen_prompt) {
    j->n_prompt = (int)strlen(a->gen_prompt);
    j->prompt = malloc((size_t)(j->n_prompt + 1) * sizeof *j->prompt);
    for (int i = 0; j->prompt && i < j->n_prompt; i++)
      j->prompt[i] = (unsigned char)a->gen_prompt[i];
  } else if (a->gen_prompt_ids) {
    j->n_prompt = parse_ids(a->gen_prompt_ids, &j->prompt);
  } else {
    fprintf(stderr,
            "axon-run: %s was trained on %s: its tokens are no bytes, "
            "give --prompt-ids ID,ID,...\n",
            info->model, info->dataset);
    return 2;
  }
  if (!j->prompt || j->n_prompt < 1) {
    fprintf(stderr, "axon-run: generate needs a prompt of one token or "
                    "more\n");
    return 2;
  }
  return 0;
}

static void show(void *user, int32_t tok) {
  gen_job *j = user;
  if (j->text)
    putchar(tok & 0xff);
  else
    printf("%s%d", j->shown ? "," : "", tok);
  j->shown++;
  fflush(stdout);
}

/* Shows the prompt, generates and shows the new tokens from decode. */
static int run_gen(gen_job *j, ax_decode_fn decode, void *user) {
  const axi_run_pipe_args *a = j->a;
  ax_sampler s;
  AX_TRY(ax_sampler_init(&s, a->gen_temperature, a->gen_top_k, a->seed));
  for (int i = 0; i < j->n_prompt; i++)
    show(j, j->prompt[i]);
  double t0 = ax_clock_s();
  int err = ax_generate(decode, user, j->prompt, j->n_prompt, a->gen_tokens, &s,
                        NULL, show, j);
  double dt = ax_clock_s() - t0;
  putchar('\n');
  int made = j->shown - j->n_prompt;
  if (err == AX_OK)
    fprintf(stderr, "axon-run: %d tokens in %.3f s (%.1f tokens/s)\n", made, dt,
            dt > 0 ? made / dt : 0.0);
  if (err != AX_OK) { /* e.g. past the model's positions: no sliding window */
    char m[700];
    snprintf(m, sizeof m, "%s", ax_errmsg());
    err = ax_seterr(err, "%s (after %d new tokens)", m, made);
  }
  return err;
}

static int fail(int rc) {
  fprintf(stderr, "axon-run: %s: %s\n", ax_strerror(rc), ax_errmsg());
  return 1;
}

/* One process: the whole model as one net. */
static int gen_here(const axi_run_pipe_args *a) {
  ax_net *net = NULL;
  ax_ckpt_info info;
  int rc = ax_ckpt_load_net(a->gen_ckpt, a->device, &net, &info);
  if (rc != AX_OK)
    return fail(rc);
  gen_job j = {a};
  int st = prepare(&j, &info);
  ax_net_decoder d = {0};
  if (!st) {
    rc = ax_net_decoder_init(&d, net);
    if (rc == AX_OK)
      rc = run_gen(&j, ax_net_decode, &d);
    st = rc == AX_OK ? 0 : fail(rc);
  }
  ax_net_decoder_free(&d);
  ax_net_free(net);
  free(j.prompt);
  return st;
}

int axi_run_gen_pipe(const axi_run_pipe_args *a, ax_node *node) {
  ax_train_state w;
  ax_ckpt_info info;
  AX_TRY(ax_state_read(a->gen_ckpt, &w, &info));
  gen_job j = {a};
  if (prepare(&j, &info)) {
    ax_state_free(&w);
    free(j.prompt);
    return ax_seterr(AX_EINVAL, "the prompt (above)");
  }
  /* Sequential stages holding only the weights; no optimizer state. */
  ax_pipe_opts o = {.model = info.model,
                    .model_config = info.model_config,
                    .K = a->K,
                    .agents = a->agents,
                    .mode = AX_MODE_SEQUENTIAL,
                    .M = 1,
                    .optim_config = "opt=sgd,momentum=0",
                    .seed = info.seed,
                    .device = a->device,
                    .timeout_ms = 120000};
  ax_pipe *p = NULL;
  ax_pipe_decoder d = {0};
  int rc = ax_pipe_new(node, &o, &p);
  if (rc == AX_OK)
    rc = ax_state_load_weights(p, &w);
  ax_state_free(&w);
  if (rc == AX_OK)
    rc = ax_pipe_decoder_init(&d, p);
  if (rc == AX_OK) {
    fprintf(stderr, "axon-run: %s over %d stage(s)\n", info.model, a->K);
    rc = run_gen(&j, ax_pipe_decode, &d);
  }
  char msg[700];
  snprintf(msg, sizeof msg, "%s", rc != AX_OK ? ax_errmsg() : "");
  int end = d.p ? ax_pipe_decoder_end(&d) : AX_OK; /* the stages' caches */
  if (rc == AX_OK && end == AX_OK && (d.sessions || d.cache_bytes))
    end = ax_seterr(AX_ESTATE, "the stages keep %lld decoding sessions",
                    (long long)d.sessions);
  ax_pipe_free(p);
  free(j.prompt);
  if (rc != AX_OK)
    return ax_seterr(rc, "%s", msg);
  return end;
}

static int gen_main(int argc, char **argv) {
  static axi_run_cli r;
  int rc = axi_run_cli_parse(&axi_run_gen_cmd, argc, argv, &r);
  if (rc >= 0)
    return rc;
  if (!r.pa.gen_ckpt || r.pa.gen_tokens < 1 ||
      !(r.pa.gen_prompt || r.pa.gen_prompt_ids)) {
    fprintf(stderr, "axon-run: generate needs --checkpoint DIR|FILE, "
                    "--prompt TEXT or --prompt-ids ID,..., and --tokens N "
                    "(try --help)\n");
    return 2;
  }
  if (r.pa.replicas > 1 || r.pa.tensor_parallel > 1 || r.pa.freeze_schedule) {
    fprintf(stderr, "axon-run: generate splits the model into plain stages: "
                    "no --replicas, --tensor-parallel or --freeze-schedule\n");
    return 2;
  }
  r.pa.gen = 1;
  r.pa.mode = AX_MODE_SEQUENTIAL;
  if (!axi_run_cli_pipe(&r)) {
    axi_run_cli_to_pipe(&r);
    ax_cpu_set_threads(r.threads);
    return gen_here(&r.pa);
  }
  if ((rc = axi_run_cli_check_pipe(&r)) >= 0)
    return rc;
  axi_run_cli_to_pipe(&r);
  return axi_run_pipe_main(&r.pa);
}

static const axi_cli_opt g_gen_opts[] = {
    {"checkpoint", "DIR|FILE", AXI_CLI_STR, F(pa.gen_ckpt),
     .help = "a checkpoint's directory, or an exported model file"},
    {"prompt", "TEXT", AXI_CLI_STR, F(pa.gen_prompt),
     .help = "the prompt (byte-level text models: its bytes)"},
    {"prompt-ids", "ID,...", AXI_CLI_STR, F(pa.gen_prompt_ids),
     .help = "the prompt as token ids (models of token ids;\n"
             "the new tokens are printed as ids)"},
    {"tokens", "N", AXI_CLI_INT, F(pa.gen_tokens), 1, 1 << 20,
     .help = "new tokens to generate"},
    {"temperature", "T", AXI_CLI_DOUBLE, F(pa.gen_temperature), 0, 100,
     .help = "softmax temperature (default 0: greedy)"},
    {"top-k", "K", AXI_CLI_INT, F(pa.gen_top_k), 0, 1 << 30,
     .help = "sample among the K likeliest tokens (0: all)"},
    AXI_CLI_END};

static const axi_cli_opt *const g_gen_tables[] = {g_gen_opts, NULL};

const axi_cli_cmd axi_run_gen_cmd = {
    "generate",
    "--checkpoint DIR|FILE (--prompt TEXT | --prompt-ids ID,...)\n"
    "--tokens N [--temperature T] [--top-k K] [--seed S]\n"
    "[--local K | --stages K --agents A,B,... --master HOST:PORT |\n"
    "--stages K --emulate]",
    "Text from a checkpoint's model: the prompt, then N new tokens, each\n"
    "picked from the model's logits (greedy, or sampled with --temperature\n"
    "and --top-k from --seed: the same seed gives the same text), decoded\n"
    "with key/value caches. In one process, or split into stages over\n"
    "agents (train's --local, --agents, --emulate), each keeping its\n"
    "layers' caches.",
    g_gen_tables,
    &axi_run_train_cmd,
    0,
    gen_main};
