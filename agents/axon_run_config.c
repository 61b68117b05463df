/* The run's configuration that a checkpoint records, and the check on
 * --resume that it repeats the math of the run that wrote the checkpoint
 * (agents/axon_run.h). */
#include <stdio.h>
#include <string.h>

#include "agents/axon_run.h"
#include "axon/runtime/pipeline/stage/staleness.h"

void axi_run_config(const axi_run_pipe_args *a, char *out, size_t len) {
  snprintf(
      out, len,
      "model=%s;model_config=%s;dataset=%s;data_config=%s;optim=%s;"
      "batch=%d;seed=%llu;staleness=%s;mode=%s;agents=%d;chunks=%d;"
      "micro=%d;recompute=%d;partition=%s;precision=%s",
      a->model, a->model_config ? a->model_config : "", a->dataset,
      a->data_config ? a->data_config : "", a->optim ? a->optim : "", a->batch,
      (unsigned long long)a->seed, ax_staleness_name(a->staleness),
      ax_pipe_mode_name(a->mode), a->K, a->chunks, a->M, a->recompute,
      a->partition ? a->partition : "uniform", ax_precision_name(a->precision));
  size_t at = strlen(out); /* only with one: older checkpoints match */
  if (a->freeze_schedule && at < len)
    snprintf(out + at, len - at, ";freeze=%s", a->freeze_schedule);
  at = strlen(out); /* the layout's lists: a resume may change them */
  if (a->schedule_file && at < len)
    snprintf(out + at, len - at, ";schedule=%s", a->schedule_file);
}

static const char *const math_keys[] = {
    "model", "model_config", "dataset",   "data_config", "optim",
    "batch", "seed",         "staleness", "freeze"};

/* The value of key in "k=v;..." (length in *n), or NULL. */
static const char *value_of(const char *cfg, const char *key, size_t *n) {
  size_t kl = strlen(key);
  for (const char *p = cfg; *p;) {
    size_t l = strcspn(p, ";");
    if (l > kl && !strncmp(p, key, kl) && p[kl] == '=') {
      *n = l - kl - 1;
      return p + kl + 1;
    }
    p += l + (p[l] == ';');
  }
  return NULL;
}

int axi_run_same_config(const char *dir, const char *saved, const char *now) {
  char diff[1500] = "";
  size_t at = 0;
  for (size_t i = 0; i < sizeof math_keys / sizeof *math_keys; i++) {
    size_t ls = 0, ln = 0;
    const char *k = math_keys[i], *vs = value_of(saved, k, &ls),
               *vn = value_of(now, k, &ln);
    int freeze = !strcmp(k, "freeze");
    if ((!vs || !vn) && !(freeze && (vs || vn)))
      continue;
    if (vs && vn && ls == ln && !strncmp(vs, vn, ls))
      continue;
    at += (size_t)snprintf(diff + at, at < sizeof diff ? sizeof diff - at : 0,
                           "%s%s: checkpoint '%.*s', this run '%.*s'",
                           at ? "; " : "", k, (int)ls, vs ? vs : "", (int)ln,
                           vn ? vn : "");
  }
  size_t ls = 4, ln = 0; /* an older checkpoint's precision is fp32 */
  const char *vs = value_of(saved, "precision", &ls),
             *vn = value_of(now, "precision", &ln);
  vs = vs ? vs : "fp32";
  if (!diff[0] && vn && (ls != ln || strncmp(vs, vn, ln)))
    fprintf(stderr,
            "axon-run: --resume %s: the precision changes from %.*s to "
            "%.*s (the state is f32 in both)\n",
            dir, (int)ls, vs, (int)ln, vn);
  if (!diff[0])
    return AX_OK;
  return ax_seterr(AX_EINVAL,
                   "--resume %s: the math differs (%s); the model, data, "
                   "optimizer and its schedule, global batch, seed, "
                   "staleness correction and freeze schedule must match, "
                   "the layout may change",
                   dir, diff);
}
