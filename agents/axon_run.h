/* axon-run internals shared by its files: the pipeline path of `train`. */
#ifndef AX_AXON_RUN_H
#define AX_AXON_RUN_H

#include <stdint.h>

#include "kernels/device.h"
#include "runtime/pipeline/train.h"

typedef struct axr_pipe_args {
  const char *model, *model_config, *dataset, *data_config, *optim;
  int epochs, batch, eval_batch;
  long steps, eval_limit;
  uint64_t seed;
  ax_device device;
  int K, M, mode, recompute, local, agent_threads, quiet;
  int chunks; /* stages per agent for chunked modes (--chunks) */
  const char *const *agents; /* K names (--agents), or set by --local */
  const char *master;        /* --master HOST:PORT when joining agents */
  const char *listen;        /* --listen HOST:PORT of the coordinator */
  /* --tls-ca/--tls-cert/--tls-key, --insecure of the coordinator node */
  const char *tls_ca, *tls_cert, *tls_key;
  int insecure;
  const char *partition, *trace, *csv;
  const char *const *plugins; /* --plugin files (absolute), for --local */
  int nplugins;
} axr_pipe_args;

/* AX_EINVAL naming the first --model-config, --optim or --data-config key
 * that the model, optimizer or data set does not read, with the keys it
 * does (axon_run_check.c). */
int axr_check_configs(const ax_train_opts *o);

/* Runs `axon-run train` in pipeline mode; returns the exit status. */
int axr_pipe_main(axr_pipe_args *a);

#endif
