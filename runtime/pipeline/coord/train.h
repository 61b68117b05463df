/* Single-process training: the baseline every pipeline mode is compared
 * with. Runs a model from models/ on a data set from models/data/ with an
 * optimizer from models/optim.h, evaluates test accuracy every epoch, writes
 * the loss curve as CSV and reports progress. */
#ifndef AX_TRAIN_H
#define AX_TRAIN_H

#include <stdint.h>
#include <stdio.h>

#include "axon/kernels/device.h"

typedef struct ax_train_opts {
  const char *model;        /* "mlp", "resnet20", "bert" */
  const char *model_config; /* overrides of the model's defaults, or NULL */
  const char *dataset;      /* "fashion-mnist", "cifar10", "gcide", ... */
  const char *data_config;  /* data-set config, or NULL */
  const char *optim_config; /* models/optim.h keys, or NULL for defaults */
  int epochs;
  long max_steps; /* stop after this many steps (0 = no limit) */
  int batch;
  int eval_batch;
  long eval_limit; /* evaluate on at most this many test examples */
  uint64_t seed;
  ax_device device;
  const char *csv_path; /* loss curve (step,epoch,loss,lr,samples_per_s) */
  FILE *progress;       /* progress bar / log lines, or NULL for none */
} ax_train_opts;

typedef struct ax_train_report {
  long steps;
  double final_loss;    /* mean loss of the last epoch's steps */
  double test_accuracy; /* after the last epoch, in [0, 1] */
  double test_loss;     /* its mean loss (nats per token for a language
                           model's data set) */
  /* "byte" or "token" for a language-model data set
   * (ax_dataset_token_unit), NULL for others */
  const char *token_unit;
  double train_seconds; /* training time (evaluation excluded) */
  double samples_per_s;
  double *loss_curve; /* per-step losses (malloc'd; caller frees) */
  long n_loss;
} ax_train_report;

/* Defaults: mlp on fashion-mnist, 1 epoch, batch 64, AdamW lr 2e-3 cosine. */
ax_train_opts ax_train_defaults(void);

/* Trains; AX_OK or an error with ax_errmsg (unknown model, missing data
 * file, shape mismatch between model and data ...). */
int ax_train_local(const ax_train_opts *o, ax_train_report *rep);

/* Evaluates classification accuracy of net on a data set (first output's
 * argmax against the first labels). */
struct ax_net;
struct ax_dataset;
int ax_evaluate(struct ax_net *net, const struct ax_dataset *ds, int batch,
                long limit, int ignore_index, double *accuracy, double *loss);

/* A one-line progress bar: "[=====>    ] 42% 1234 samples/s loss 0.512
 * ETA 0:12". Rewrites the line in place on a terminal, prints a line every
 * few seconds otherwise. */
typedef struct ax_progress {
  FILE *out;
  int tty;
  double start, last_print;
  long total, done;
} ax_progress;
void ax_progress_start(ax_progress *p, FILE *out, long total);
void ax_progress_update(ax_progress *p, long done, double samples_per_s,
                        double loss, const char *prefix);
void ax_progress_end(ax_progress *p);

#endif
