/* Generation over real agents:
 *  - axon-run: a GPT trained for a few steps over two agents on a text
 *    file, its checkpoint continued by `axon-run generate` in one process,
 *    over two agents it starts (--local 2) and over three emulated stages
 *    (--emulate), sampled with the same seed: the same text each time
 *    (axon-run itself fails if a stage keeps a decoding session at the
 *    end); a run past the model's seq fails at that position, naming it;
 *  - the library over two agents of this test's world: a pipeline's
 *    decoder (runtime/pipeline/coord/decode.h) gives the logits of the
 *    same model in one net within 1e-5 call by call and samples the same
 *    tokens; ending it frees every stage's caches (the stages' session and
 *    byte counts fall to 0); zero live RRefs, contexts and calls on every
 *    node afterwards. */
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "axon/models/generate.h"
#include "axon/models/model.h"
#include "axon/runtime/pipeline/coord/decode.h"
#include "tests/gen_testutil.h"
#include "tests/harness.h"
#include "tests/mp_testutil.h"

#define NAGENTS 2
static const char *g_names[NAGENTS] = {"gen1", "gen2"};
static pid_t g_pids[NAGENTS];
static ax_node *g_drv;
static char g_tmp[64];

/* ---- through axon-run (before this process starts gRPC) ---------------- */

/* Runs `axon-run ARGS`, its standard output into out (the text), its
 * standard error into tmp/err (anew); the exit status. */
static int axon_run(const char *args, char *out, size_t len) {
  char bin[4096], cmd[8192];
  mt_bin_path("axon-run", bin, sizeof bin);
  snprintf(cmd, sizeof cmd, "%s %s 2>%s/err", bin, args, g_tmp);
  FILE *f = popen(cmd, "r");
  assert_non_null(f);
  size_t n = fread(out, 1, len - 1, f);
  out[n] = 0;
  int st = pclose(f);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void test_cli(void **state) {
  char corpus[128], cmd[1024];
  snprintf(corpus, sizeof corpus, "%s/corpus.txt", g_tmp);
  FILE *f = fopen(corpus, "w");
  assert_non_null(f);
  for (int i = 0; i < 200; i++)
    fprintf(f, "the agent %d holds a stage and the stage keeps a cache. ",
            i % 7);
  fclose(f);
  static char out[4096], one[4096], two[4096], emu[4096];
  snprintf(cmd, sizeof cmd,
           "train --model gpt --model-config "
           "layers=2,hidden=32,heads=4,ff=64,seq=32 --dataset text "
           "--data-config file=%s,seq=32 --local 2 --mode 1f1b --steps 12 "
           "--batch 8 --quiet --eval-limit 32 --checkpoint-dir %s/ck",
           corpus, g_tmp);
  assert_int_equal(axon_run(cmd, out, sizeof out), 0);
  const char *gen = "generate --checkpoint %s/ck --prompt 'the agent ' "
                    "--tokens 20 --temperature 0.9 --top-k 8 --seed %d %s";
  snprintf(cmd, sizeof cmd, gen, g_tmp, 5, "");
  assert_int_equal(axon_run(cmd, one, sizeof one), 0);
  snprintf(cmd, sizeof cmd, gen, g_tmp, 5, "--local 2");
  assert_int_equal(axon_run(cmd, two, sizeof two), 0);
  snprintf(cmd, sizeof cmd, gen, g_tmp, 5, "--stages 3 --emulate");
  assert_int_equal(axon_run(cmd, emu, sizeof emu), 0);
  fprintf(stderr, "  generated: [%s]\n", one);
  assert_int_equal(strlen(one), strlen("the agent ") + 20 + 1);
  assert_true(!strncmp(one, "the agent ", 10));
  assert_string_equal(one, two);
  assert_string_equal(one, emu);
  /* past the model's 32 positions the run fails, naming them, over the
   * agents as in one process */
  snprintf(cmd, sizeof cmd, gen, g_tmp, 5, "--tokens 30 --local 2");
  assert_int_equal(axon_run(cmd, out, sizeof out), 1);
  char err[4096] = "", path[128];
  snprintf(path, sizeof path, "%s/err", g_tmp);
  f = fopen(path, "r");
  assert_non_null(f);
  err[fread(err, 1, sizeof err - 1, f)] = 0;
  fclose(f);
  assert_non_null(strstr(err, "past the model's seq=32 positions (after 23 "
                              "new tokens)"));
}

/* ---- the library over this test's agents -------------------------------- */

#define CFG "layers=2,hidden=32,heads=4,ff=64,seq=48,vocab=64"

static void test_library(void **state) {
  const ax_model_def *def = ax_model_find("gpt");
  ax_config c;
  ax_model_info info;
  ax_net *net = NULL;
  AX_ASSERT_OK(ax_model_config(def, CFG, &c));
  AX_ASSERT_OK(ax_model_describe(def, &c, &info));
  AX_ASSERT_OK(ax_model_stage(def, &c, 0, info.n_blocks, AX_CPU, 3, &net));
  ax_pipe_opts o = {.model = "gpt",
                    .model_config = CFG,
                    .K = NAGENTS,
                    .agents = g_names,
                    .mode = AX_MODE_SEQUENTIAL,
                    .M = 1,
                    .optim_config = "opt=sgd,momentum=0",
                    .seed = 3,
                    .device = AX_CPU};
  ax_pipe *p = NULL;
  AX_ASSERT_OK(ax_pipe_new(g_drv, &o, &p));
  ax_pipe_decoder d;
  ax_net_decoder nd;
  AX_ASSERT_OK(ax_pipe_decoder_init(&d, p));
  AX_ASSERT_OK(ax_net_decoder_init(&nd, net));
  int32_t prompt[6] = {7, 31, 2, 60, 18, 44};
  int64_t pos = 0;
  for (int n = 6, i = 0; i < 4; i++, pos += n, n = 1) {
    ax_tensor *a = NULL, *b = NULL;
    AX_ASSERT_OK(ax_pipe_decode(&d, pos, &prompt[6 - n], n, &a));
    AX_ASSERT_OK(ax_net_decode(&nd, pos, &prompt[6 - n], n, &b));
    assert_int_equal(ax_tensor_numel(a), 64);
    assert_true(ax_test_close_ratio(ax_f32(a), ax_f32(b), 64, 1e-5, 1e-5) <= 1);
    ax_tensor_release(a);
    ax_tensor_release(b);
  }
  assert_int_equal(d.sessions, NAGENTS); /* one per stage */
  assert_true(d.cache_bytes > 0);
  gen_same_samples(&d, &nd, prompt, 6, 30, 20, 9);
  gen_end_all(&d);
  ax_net_decoder_free(&nd);
  ax_net_free(net);
  ax_pipe_free(p);
  AX_ASSERT_OK(dt_all_zero(g_drv, g_names, NAGENTS));
}

int main(void) {
  snprintf(g_tmp, sizeof g_tmp, "/tmp/axon_gen_XXXXXX");
  if (!mkdtemp(g_tmp))
    return 1;
  const struct CMUnitTest cli[] = {cmocka_unit_test(test_cli)};
  int failed = AX_TEST_MAIN(cli);
  static const char *const args[] = {"--threads", "2", NULL};
  if (mt_start("gencoord", g_names, NAGENTS, args, g_pids, &g_drv) != AX_OK)
    return 1;
  const struct CMUnitTest lib[] = {cmocka_unit_test(test_library)};
  failed += AX_TEST_MAIN(lib);
  mt_end(g_drv, g_pids, NAGENTS);
  char rm[128];
  snprintf(rm, sizeof rm, "rm -rf %s", g_tmp);
  if (!failed && system(rm) != 0)
    failed++;
  return failed;
}
