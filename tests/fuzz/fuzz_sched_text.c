/* libFuzzer harness: the schedule text parser
 * (runtime/pipeline/schedule/sched_text.h). Any bytes parse or are refused
 * with AX_EFORMAT or AX_EINVAL; a schedule that parses prints to a text
 * that parses back to the same text, and builds a plan of two
 * mini-batches. */
#include <stdlib.h>
#include <string.h>

#include "axon/runtime/pipeline/schedule/sched_text.h"
#include "tests/fuzz/fuzz_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size > 1 << 16)
    return 0;
  ax_pipe_sched *s = NULL, *b = NULL;
  int err = ax_pipe_sched_parse((const char *)data, size, "fuzz", &s);
  FUZZ_CHECK(err == AX_OK || err == AX_EFORMAT || err == AX_EINVAL ||
             err == AX_ENOMEM);
  if (err != AX_OK)
    return 0;
  char *t = NULL, *u = NULL;
  FUZZ_CHECK(ax_pipe_sched_text(s, &t) == AX_OK);
  FUZZ_CHECK(ax_pipe_sched_parse(t, strlen(t), "again", &b) == AX_OK);
  FUZZ_CHECK(ax_pipe_sched_text(b, &u) == AX_OK);
  FUZZ_CHECK(!strcmp(t, u));
  ax_pipe_plan *p = NULL;
  FUZZ_CHECK(ax_pipe_sched_plan(s, 2, &p) == AX_OK);
  ax_pipe_plan_free(p);
  free(t);
  free(u);
  ax_pipe_sched_free(s);
  ax_pipe_sched_free(b);
  return 0;
}
