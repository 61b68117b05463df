/* libFuzzer harness: the configuration and command-line parsers.
 *  - models/config.c: ax_config_parse, the typed getters, the format that
 *    must parse back to the same configuration;
 *  - the model, optimizer and data-set parsers behind --model-config,
 *    --optim and --data-config, run the way axon-run checks them
 *    (axi_run_check_configs, agents/axon_run_check.c: each parser with the key
 *    recorder, then unknown keys refused);
 *  - the option checks of axon-agent and axon-run (agents/axon_cli.h:
 *    ranged integers with K/M/G units, HOST:PORT) and the --device and
 *    --device-map parsers (kernels/device.h).
 *
 * Input: byte 0 picks the model (mlp, resnet20, bert, sleep) and the flag
 * ranges, the rest is split at newlines into model-config, optim,
 * data-config (of the "synthetic" data set) and one option value. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agents/axon_cli.h"
#include "agents/axon_run.h"
#include "axon/kernels/device.h"
#include "axon/models/config.h"
#include "tests/fuzz/fuzz_common.h"

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  /* The option checks print why they refuse; the fuzzer and the
   * sanitizers write to the descriptor, not to this stream. */
  FILE *null = fopen("/dev/null", "w");
  if (null)
    stderr = null;
  return 0;
}

/* Parses s; a configuration that parses formats to a string that parses
 * back to the same pairs, and its getters do not fail on it. */
static void config_roundtrip(const char *s) {
  ax_config c, d;
  if (ax_config_parse(&c, s) != AX_OK)
    return;
  char buf[AX_CONFIG_MAX * (32 + 128 + 2) + 1];
  ax_config_format(&c, buf, sizeof buf);
  FUZZ_CHECK(ax_config_parse(&d, buf) == AX_OK);
  FUZZ_CHECK(c.n == d.n);
  for (int i = 0; i < c.n; i++) {
    FUZZ_CHECK(!strcmp(c.key[i], d.key[i]) && !strcmp(c.val[i], d.val[i]));
    int err = AX_OK;
    int64_t list[8];
    ax_config_int(&c, c.key[i], 0, &err);
    ax_config_float(&c, c.key[i], 0, &err);
    int k = ax_config_ints(&c, c.key[i], list, 8, &err);
    FUZZ_CHECK(k >= -1 && k <= 8);
  }
}

static void cli(const char *s, uint8_t sel) {
  static const struct {
    int64_t lo, hi;
    int units;
  } r[] = {{1, 65535, 0},     {-1, 65535, 0},  {1, INT64_MAX, 1},
           {0, INT64_MAX, 0}, {1, 1 << 20, 0}, {INT64_MIN, INT64_MAX, 1}};
  int k = sel % (sizeof r / sizeof r[0]);
  int64_t v;
  if (axi_cli_int("fuzz", "--flag", s, r[k].lo, r[k].hi, r[k].units, &v))
    FUZZ_CHECK(v >= r[k].lo && v <= r[k].hi);
  int i32;
  if (axi_cli_i32("fuzz", "--flag", s, -1, 65535, &i32))
    FUZZ_CHECK(i32 >= -1 && i32 <= 65535);
  if (axi_cli_hostport("fuzz", "--listen", s, 1)) {
    const char *c = strrchr(s, ':');
    FUZZ_CHECK(c && c != s && atoi(c + 1) >= 1 && atoi(c + 1) <= 65535);
  }
  ax_device d;
  if (ax_device_parse(s, &d) == AX_OK)
    FUZZ_CHECK(d.type == AX_DEV_CPU || d.type == AX_DEV_CUDA);
  ax_device_map m;
  if (ax_device_map_parse(s, &m) == AX_OK)
    ax_device_map_check(&m);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1 || size > 4096)
    return 0;
  static const char *models[] = {"mlp", "resnet20", "bert", "sleep"};
  uint8_t sel = data[0];
  char *buf = malloc(size);
  FUZZ_CHECK(buf);
  memcpy(buf, data + 1, size - 1);
  buf[size - 1] = 0;
  char *line[4] = {"", "", "", ""};
  /* Split at newlines keeping empty fields (strsep, not strtok). */
  char *p = buf;
  for (int i = 0; i < 4 && p; i++)
    line[i] = strsep(&p, "\n");
  for (int i = 0; i < 3; i++)
    config_roundtrip(line[i]);
  ax_train_opts o;
  memset(&o, 0, sizeof o);
  o.model = models[sel % 4];
  o.model_config = line[0];
  o.optim_config = line[1];
  o.dataset = "synthetic";
  o.data_config = line[2];
  axi_run_check_configs(&o);
  cli(line[3], sel >> 2);
  free(buf);
  return 0;
}
