/* axon-bench: measurements that are not tests.
 *
 *   axon-bench train ... (see axon-bench train --help)
 *   axon-bench rpc ...   (see axon-bench rpc --help)
 *   axon-bench dist ...  (see axon-bench dist --help)
 *   axon-bench pipe ...  (see axon-bench pipe --help)
 *   axon-bench gemm ...  (see axon-bench gemm --help)
 *   axon-bench split ... (see axon-bench split --help)
 *   axon-bench join ...  (see axon-bench join --help)
 *   axon-bench peak ...  (see axon-bench peak --help)
 *
 * Each command lives in its own file, agents/axon_bench_CMD.c. */
#include <stdio.h>
#include <string.h>

/* Provided by agents/axon_bench_train.c (training steps of one model). */
int ax_bench_train_main(int argc, char **argv);
/* Provided by agents/axon_bench_rpc.c when the RPC layer is built. */
__attribute__((weak)) int ax_bench_rpc_main(int argc, char **argv);
/* Provided by agents/axon_bench_dist.c (distributed autograd steps). */
__attribute__((weak)) int ax_bench_dist_main(int argc, char **argv);
/* Provided by agents/axon_bench_pipe.c (pipeline modes on synthetic stages). */
__attribute__((weak)) int ax_bench_pipe_main(int argc, char **argv);
/* Provided by agents/axon_bench_gemm.c (backend gemm against raw cuBLAS). */
__attribute__((weak)) int ax_bench_gemm_main(int argc, char **argv);
/* Provided by agents/axon_bench_split.c (split against fused backward). */
__attribute__((weak)) int ax_bench_split_main(int argc, char **argv);
/* Provided by agents/axon_bench_join.c (many idle agents on one host). */
__attribute__((weak)) int ax_bench_join_main(int argc, char **argv);
/* Provided by agents/axon_bench_peak.c (the CPU's multiply-add peak). */
__attribute__((weak)) int ax_bench_peak_main(int argc, char **argv);

int main(int argc, char **argv) {
  if (argc >= 2 && strcmp(argv[1], "train") == 0)
    return ax_bench_train_main(argc, argv);
  if (argc >= 2 && strcmp(argv[1], "rpc") == 0) {
    if (!ax_bench_rpc_main) {
      fprintf(stderr, "axon-bench: built without the RPC benchmark\n");
      return 2;
    }
    return ax_bench_rpc_main(argc - 1, argv + 1);
  }
  if (argc >= 2 && strcmp(argv[1], "dist") == 0) {
    if (!ax_bench_dist_main) {
      fprintf(stderr, "axon-bench: built without the dist benchmark\n");
      return 2;
    }
    return ax_bench_dist_main(argc - 1, argv + 1);
  }
  if (argc >= 2 && strcmp(argv[1], "pipe") == 0) {
    if (!ax_bench_pipe_main) {
      fprintf(stderr, "axon-bench: built without the pipe benchmark\n");
      return 2;
    }
    return ax_bench_pipe_main(argc - 1, argv + 1);
  }
  if (argc >= 2 && strcmp(argv[1], "gemm") == 0) {
    if (!ax_bench_gemm_main) {
      fprintf(stderr, "axon-bench: built without the gemm benchmark\n");
      return 2;
    }
    return ax_bench_gemm_main(argc - 1, argv + 1);
  }
  if (argc >= 2 && strcmp(argv[1], "split") == 0 && ax_bench_split_main)
    return ax_bench_split_main(argc - 1, argv + 1);
  if (argc >= 2 && strcmp(argv[1], "join") == 0 && ax_bench_join_main)
    return ax_bench_join_main(argc - 1, argv + 1);
  if (argc >= 2 && strcmp(argv[1], "peak") == 0 && ax_bench_peak_main)
    return ax_bench_peak_main(argc - 1, argv + 1);
  fprintf(
      argc >= 2 && strcmp(argv[1], "--help") == 0 ? stdout : stderr,
      "usage: axon-bench train|rpc|dist|pipe|gemm|split|join|peak [options]  "
      "(--help after the command "
      "for its options)\n");
  return argc >= 2 && strcmp(argv[1], "--help") == 0 ? 0 : 2;
}
