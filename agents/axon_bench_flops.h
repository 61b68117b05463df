/* The arithmetic of a training step, for axon-bench train's achieved
 * GFLOP/s and share of the CPU's peak. Internal to axon-bench. */
#ifndef AX_AXON_BENCH_FLOPS_H
#define AX_AXON_BENCH_FLOPS_H

#include "axon/models/config.h"

/* The GEMM floating-point operations (a multiply-add counts 2) of one
 * training step (forward, backward) of `model` configured by cfg on a batch
 * of `batch` examples, as axon_bench_flops.c derives them; 0 when the count
 * of that model is not known (only gpt's is) or cfg does not parse. */
double axi_bench_train_flops(const char *model, const ax_config *cfg,
                             int batch);

#endif
