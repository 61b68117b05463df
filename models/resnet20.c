#include "models/model.h"
/* Placeholder until the vision layers land. */
static int d(const ax_config *c, ax_model_info *i) { return ax_seterr(AX_EUNSUPPORTED, "resnet20: not built yet"); }
static int b(const ax_config *c, int i, ax_module **o) { return AX_EUNSUPPORTED; }
const ax_model_def ax_model_resnet20 = {"resnet20", "", d, b};
