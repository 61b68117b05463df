/* axon-run: refuses configuration keys that nothing reads. Each parser runs
 * once with a key recorder (models/config.h) and every user-given key must
 * be among those it asked for. */
#include <stdio.h>

#include "agents/axon_run.h"
#include "axon/models/data/dataset.h"
#include "axon/models/model.h"
#include "axon/models/optim.h"

/* Runs the parser behind `what` on the user's config s, recording the keys
 * it reads, then checks s against them. */
static int check_one(const char *what, const char *s, const ax_train_opts *o) {
  ax_config user, cfg;
  ax_config_keys rec = {0};
  AX_TRY(ax_config_parse(&user, s));
  if (user.n == 0)
    return AX_OK;
  int rc = AX_OK;
  ax_config_record(&rec);
  if (what[0] == 'm') { /* model-config */
    const ax_model_def *def = ax_model_find(o->model);
    ax_model_info info;
    rc = def ? ax_model_config(def, s, &cfg) : AX_ENOTFOUND;
    if (rc == AX_OK)
      rc = ax_model_describe(def, &cfg, &info);
  } else if (what[0] == 'o') { /* optim */
    ax_optim_cfg oc;
    rc = ax_optim_cfg_parse(&user, &oc);
  } else { /* data-config: the test split is the smaller one */
    ax_dataset *ds = NULL;
    rc = ax_dataset_open(o->dataset, &user, AX_SPLIT_TEST, &ds);
    ax_dataset_close(ds);
  }
  ax_config_record(NULL);
  /* A parser that failed said why; unknown keys are the question here
   * only when it ran through. */
  return rc == AX_OK ? ax_config_check_known(&user, &rec, what) : rc;
}

int axi_run_check_configs(const ax_train_opts *o) {
  AX_TRY(check_one("model-config", o->model_config, o));
  AX_TRY(check_one("optim", o->optim_config, o));
  return check_one("data-config", o->data_config, o);
}
